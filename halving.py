"""Successive halving over timestep-weighting profiles: live tournaments, grids of runs, and a
replay over recorded learning curves (sec:halving, app:halving, app:halving-robotics, app:search-settings).

Commands::

    python halving.py cifar                       # alpha in {-2,-1,0,1}, q+Z, rungs 200/400/800
    python halving.py cifar --rungs 20 40 80 --train.reward simclr
    python halving.py robot --alphas 0 .25 .5 1 --rungs 100 200 400 --train.env-id Walker2d-v5
    python halving.py cifar-grid --rewards edge simclr --seeds 1 2 3      # every run to the budget
    python halving.py cifar-grid --targets v x0 eps --estimators q+a q+Z explicit   # cells: profile x estimator
    python halving.py cifar-grid --alphas -1 0 1 --gs .5 1 2        # alpha x g (tab:scale)
    python halving.py cifar-grid --pack 12                         # 12 runs batched in one process, one GPU
    python halving.py robot-grid --env-ids Walker2d-v5 --alphas .5 1 --train.total-timesteps 1000000
    python halving.py cifar --ray-address auto --out-dir /shared/runs     # the same, on a Ray cluster
    python halving.py curves runs/acrobot_* --out acrobot.json      # run folders -> curves
    python halving.py replay acrobot.json walker.json --n-draw 1 2 3

Live tournaments (``cifar``, ``robot``)
    K candidate exponents (alpha of the 12-bin family for CIFAR; alpha_eps for FPO or alpha
    for FPO++ on robots) start from fresh model and optimiser states with a shared training
    seed, hence a shared validation bank. At each rung every surviving arm is trained up to the
    rung, ranked by the rung's pooled validation mean (for several seeds: the mean over the
    arm's seed replicates), and the best ``ceil(K/2)`` are kept; exact ties favour the smaller
    exponent (app:search-settings). Survivors continue from their own checkpoint (model,
    optimiser, RNG state and history), never from scratch, so a survivor's trajectory is the
    one an uninterrupted run of the same arm would have. The last rung is the full budget; if
    several arms reach it, the best one there wins. The generic rule (sec:halving) eliminates
    the worse half after ``2^i N`` steps in round i: ``--first-rung N`` builds the rungs
    ``N, 2N, 4N, ...`` below the full budget (the last entry of ``--rungs``) followed by it.
    CIFAR tournaments use the q+Z estimator (app:halving) and no validation early stopping
    (rungs are fixed). Every arm is a run folder under ``<out_dir>/<name>/arms/`` (metrics,
    checkpoints, samples), and ``<out_dir>/<name>/tournament.json`` records each rung's scores,
    the eliminations, every arm's peak, the failed arms and the cost. Re-running the same
    command continues an interrupted tournament from the arms' checkpoints.

Grids (``cifar-grid``, ``robot-grid``)
    A tournament with no cut: every (task, cell, seed) run trains to the trainer's own budget (CIFAR
    with its validation early stopping unless turned off). A robot cell is an exponent. A CIFAR cell
    is one weighting configuration of cifar_fpo.py: a profile, one entry of ``--alphas`` (the 12-bin
    family), ``--targets`` (eq:targets), ``--schedules`` (alpha_early:alpha_late:k0:k1, tab:dynamic),
    ``--etas`` (static softmax, fig:static), ``--rules`` (static-direct, online-ema, online-refit at
    the ``--train`` settings) or ``--refit-etas`` (full refit, tab:online-full), crossed with every
    scale of ``--gs`` (app:scale, tab:scale) and every estimator of ``--estimators`` (tab:sampling);
    with no profile axis given, the alphas -2 -1 0 1. A run folder is named
    ``<task>__<cell>__seed<seed>``, the cell being ``alpha<+a>`` or the trainer's weighting label
    (``x0``, ``schedule-3to-0.5@160-260``, ``static-softmax-eta0.5``, ...) with ``__g<g>`` and
    ``__<estimator>`` added when those axes are swept. ``grid.json`` holds every run and the
    per-cell table: each seed's peak (eq:peak) and final reward (the validation reward at the budget's
    last update), their mean and sample SD over seeds with n, and the failed and non-finite runs by
    name; with several estimators, ``paired`` holds the per-seed peak differences of the first
    estimator against each other one (tab:sampling: mean, SD, W/T/L at tolerance .003). ``grid.md`` holds the tables as
    Markdown. ``--pack K`` trains up to K CIFAR runs that can be batched together
    (cifar_fpo_pack.py: the same model, batch, draws, Euler steps, optimiser and validation
    banks; a grid's runs differ only in reward, weighting settings and seed, so all of them can) in
    one process on one device, every tensor with a leading run axis. Each packed run writes its own
    run folder as it would alone, equal to it to float32 rounding; a run that ends leaves its pack,
    and an interrupted pack keeps every run's last checkpoint, so re-running the command continues
    it, packed or not.

Arms as Ray tasks
    A segment of an arm (from its checkpoint up to a rung, or to the end for a grid) is one call of
    `run_segment` (fpo_utils/arms.py) with the trainer's ``main``. With Ray installed (``pip install
    -e '.[ray]'``) the segments of a rung are submitted together as Ray tasks, each reserving
    ``--gpus-per-arm`` (default one GPU when the arms train on a GPU) and ``--cpus-per-arm``; Ray
    places them on free resources of one machine (a local Ray started for the sweep) or of a cluster
    (``--ray-address`` or ``RAY_ADDRESS``). The driver waits for the rung, ranks, and submits the
    survivors' next segments. Without Ray, or with ``--no-ray``, the segments run one after another
    in this process. Each segment is a deterministic function of its arguments and of the arm's
    checkpoint, so the scores, the eliminations, the peaks and the cost do not depend on where or how
    many at once arms ran (on the CPU fix ``--threads`` so that every arm uses the same number of
    intra-op threads). Run folders must be on a filesystem every node reads and writes at the same path.

Faults
    A segment whose worker process dies (killed, out of memory, lost node) is re-run by Ray up to
    ``--max-retries`` times; the re-run continues from the arm's last checkpoint (the trainers'
    ``--resume``), so the arm's results equal an uninterrupted run's. A segment that raises (a
    deterministic error, not retried) or whose worker keeps dying marks its arm failed with the
    reason: the arm scores NaN at that rung and is eliminated, the tournament goes on with the
    rest, and ``failures`` lists it. A non-finite arm (status ``nonfinite``) is ranked last and
    listed in the same way, as the paper reports divergent runs.

Replay (``replay``, ``curves``)
    The same rule over learning curves already recorded: ``curves`` turns run folders of one task
    into a curves file, ``replay`` enumerates every seed draw and tie order and prints the selection
    probabilities, scores and costs (tab:halving-choice, tab:halving-budgets). The rules and the
    replay's cost are in fpo_utils/replay.py, importable with numpy alone.

Cost accounting
    Live tournaments: the cost is the sum, over every arm and seed replicate, of the number of
    updates it actually trained (an arm that fails early counts what it trained), divided by one
    full-run budget (the last rung). The CIFAR default gives
    ``C_SH4 = (4*200 + 2*(400-200) + (800-400))/800 = 2`` full-run equivalents against
    ``K * seeds = 4`` for exhaustive search (app:halving); ``cost_per_replicate`` divides by the
    number of seeds (the figure's per-replication cost).
"""

from __future__ import annotations

import json
import math
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Dict, List, Literal, Optional, Sequence, Tuple

import numpy as np
import tyro

import cifar_fpo
import cifar_fpo_pack as cifar_pack
import robot_fpo_fast as robot_trainer  # the trainer of every robot arm: robot_fpo.py's algorithm, fast phases
from fpo_utils.arms import Sweep, arm_resources, arm_state, connect_ray, run_info, run_segments
from fpo_utils.grids import (
    CIFAR_ALPHAS,
    FINAL,
    PROFILE_AXES,
    TIE_TOLERANCE,  # noqa: F401 (part of this tool's interface: the grid tables' tie tolerance)
    cifar_cells,
    grid_markdown,
    paired_estimators,
    peak_table,
    print_grid,
    run_peak,
)
from fpo_utils.replay import (
    FIRST_CUTS,
    HIGHLIGHT_CUT,
    REPLAY_DRAWS,
    SCORE_KEY,
    budget_table,
    choice_table,
    fmt_label,
    halving_rungs,
    keep_count,
    load_curves,
    rank_candidates,
    replay_sweep,
    runs_to_curves,
)
from fpo_utils.robot_bookkeeping import validate_args as validate_robot_args
from fpo_utils.runfolder import EXIT_BAD_INPUT, EXIT_INTERRUPTED, EXIT_IO, RunError, atomic_write_text, flag_values

CIFAR_RUNGS = (200, 400, 800)  # app:search-settings: keep 2 at 200, keep 1 at 400, winner to 800
CIFAR_SEED = 20260727  # app:search-settings (the second tournament of each reward uses 20260728)
TRAIN = {"cifar": cifar_fpo.main, "robot": robot_trainer.main}  # each trainer's entry point main(args)


# ---------------------------------------------------------------------------------------------
# Sweeps: what runs (where arms run: fpo_utils/arms.py's Sweep)
# ---------------------------------------------------------------------------------------------
def _cifar_defaults() -> cifar_fpo.Args:
    return cifar_fpo.Args(estimator="q+Z", early_stop=False)  # app:halving


def _robot_defaults() -> robot_trainer.Args:
    return robot_trainer.Args()


@dataclass
class CifarTournament(Sweep):
    """Live successive-halving tournament of cifar_fpo.py arms (app:halving, app:search-settings)."""

    alphas: Tuple[float, ...] = CIFAR_ALPHAS
    """Candidate exponents of the 12-bin family (app:search-settings: -2, -1, 0, 1)."""
    seeds: Tuple[int, ...] = (CIFAR_SEED,)
    """Training seeds shared by all arms. With several, every arm trains one replicate per seed and is
    ranked by the mean over its replicates (the paper runs one tournament per seed: 20260727, 20260728)."""
    rungs: Tuple[int, ...] = CIFAR_RUNGS
    """Updates at which the worse half goes; the last entry is the full budget (app:search-settings)."""
    first_rung: Optional[int] = None
    """If set, rungs become N, 2N, 4N, ... below the full budget (last entry of --rungs), then the budget."""
    train: cifar_fpo.Args = field(default_factory=_cifar_defaults)
    """Settings shared by every arm (reward, model, batch, learning rate, ...). The tournament sets
    weighting=fixed, alpha, target, seed, num_updates, until, resume, run_name, runs_dir and turns early
    stopping off; the estimator defaults to q+Z (app:halving)."""


@dataclass
class RobotTournament(Sweep):
    """Live successive-halving tournament of robot_fpo_fast.py arms (FPO: alpha_eps, FPO++: alpha)."""

    alphas: Tuple[float, ...] = (0.0, 0.25, 0.5, 1.0)
    """Candidate exponents: alpha_eps for `--train.objective fpo`, alpha for `fpopp`
    (app:search-settings: Acrobot 0, .25, .5, 1; Walker .25, .5, 1, 1.25, 1.5; Spot 0, .5, 1, 1.5)."""
    seeds: Tuple[int, ...] = (901,)
    """Training seeds shared by all arms; an arm's score is the mean over its seed replicates
    (app:search-settings uses seeds 901-903)."""
    rungs: Tuple[int, ...] = (240, 480, 960)
    """Rungs in `unit`; the last entry is the full budget. Each must fall on an evaluation and a
    checkpoint update of the trainer (multiples of --train.eval-every and --train.checkpoint-every)."""
    unit: Literal["updates", "steps"] = "updates"
    """Unit of `rungs` and of the cost: updates, or environment steps (multiples of num_envs * num_steps)."""
    first_rung: Optional[int] = None
    """If set, rungs become N, 2N, 4N, ... below the full budget (last entry of --rungs), then the budget."""
    train: robot_trainer.Args = field(default_factory=_robot_defaults)
    """Settings shared by every arm (environment, objective, rollout sizes, ...). The tournament sets
    the candidate exponent, seed, num_updates, total_timesteps (the full budget), resume, run_name and runs_dir."""


@dataclass
class CifarGrid(Sweep):
    """Every (reward, cell, seed) cifar_fpo.py run to its full budget, and the per-cell table of peaks and
    final rewards. A cell is one weighting configuration: a profile (one entry of --alphas, --targets,
    --schedules, --etas, --rules or --refit-etas), crossed with every --gs and every --estimators."""

    alphas: Tuple[float, ...] = ()
    """Exponents of the 12-bin family (fixed weighting); default -2 -1 0 1 when no other profile axis is given."""
    targets: Tuple[str, ...] = ()
    """Named target profiles (fixed weighting, eq:targets): v, x0, eps."""
    schedules: Tuple[str, ...] = ()
    """Linear schedules alpha_early:alpha_late:k0:k1 (app:schedules, tab:dynamic), e.g. -3:-0.5:160:260."""
    etas: Tuple[float, ...] = ()
    """Static-softmax concentrations eta_norm (eq:static, fig:static: .25 .5 .75 1 1.25 1.5 2)."""
    rules: Tuple[str, ...] = ()
    """Data-driven rules at the --train settings (tab:online-full): static-direct, online-ema, online-refit."""
    refit_etas: Tuple[float, ...] = ()
    """Full-refit online concentrations eta_raw (app:online-analysis, tab:full-refit-summary)."""
    gs: Tuple[float, ...] = ()
    """Calibrated whole-loss scales g crossed with every profile (app:scale, tab:scale: .5 .75 1 1.5 2);
    default --train.g, not part of the run names."""
    estimators: Tuple[str, ...] = ()
    """Estimators crossed with every profile, paired by seed (tab:sampling): q+a, q+Z, explicit; default
    --train.estimator, not part of the run names."""
    seeds: Tuple[int, ...] = (20260724, 20260725, 20260726)
    """Training seeds (app:method-settings)."""
    rewards: Tuple[str, ...] = ()
    """Rewards (tasks) of the grid; default --train.reward."""
    train: cifar_fpo.Args = field(default_factory=cifar_fpo.Args)
    """Settings shared by every run (model, budget --train.num-updates, early stopping, estimator, ...); the
    grid sets the cell's weighting settings, reward, seed, resume, run_name and runs_dir."""
    pack: int = 1
    """Runs trained together as one pack: in one process on one device, batched (cifar_fpo_pack.py),
    each writing its own run folder as it would alone and equal to it to float32 rounding. Runs pack when
    they share the settings in cifar_pack.SHARED (model, batch and group sizes, draws, Euler steps,
    optimiser, validation banks, device, precision): all runs of one grid do, whatever their reward, cell
    and seed. fp32 or tf32 on CUDA (bf16 is refused there). A pack is one arm task (--gpus-per-arm,
    --cpus-per-arm). 1: every run in its own task."""


@dataclass
class RobotGrid(Sweep):
    """Every (environment, exponent, seed) robot_fpo_fast.py run to its full budget, and the per-run peak table."""

    alphas: Tuple[float, ...] = (0.0, 0.25, 0.5, 1.0)
    """Exponents: alpha_eps for `--train.objective fpo`, alpha for `fpopp`."""
    seeds: Tuple[int, ...] = (901, 902, 903)
    """Training seeds (app:search-settings)."""
    env_ids: Tuple[str, ...] = ()
    """Environments (tasks) of the grid; default --train.env-id."""
    train: robot_trainer.Args = field(default_factory=_robot_defaults)
    """Settings shared by every run (budget --train.total-timesteps, objective, rollout sizes, ...); the
    grid sets the exponent, env_id, seed, resume, run_name and runs_dir."""


def _trainer(spec) -> str:
    if isinstance(spec, (CifarTournament, CifarGrid)):
        return "cifar"
    if isinstance(spec, (RobotTournament, RobotGrid)):
        return "robot"
    raise ValueError(
        f"sweep spec of type {type(spec).__name__} is not one of CifarTournament, RobotTournament, CifarGrid, RobotGrid"
    )


def _write_json(obj: Any, path: Path) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2))


# ---------------------------------------------------------------------------------------------
# Live tournaments and grids: the arms of the two trainers
# ---------------------------------------------------------------------------------------------
def _arm_name(alpha: float, seed: int, task: Optional[str] = None) -> str:
    name = f"alpha{float(alpha):+g}__seed{seed}"
    return f"{task.replace('/', '_')}__{name}" if task else name


def _check_common(spec, alphas_optional: bool = False) -> Tuple[List[float], List[int]]:
    alphas = [float(a) for a in spec.alphas]
    if (
        (not alphas and not alphas_optional)
        or len(set(alphas)) != len(alphas)
        or not all(math.isfinite(a) for a in alphas)
    ):
        raise ValueError(f"--alphas {list(spec.alphas)} must be one or more distinct finite numbers")
    seeds = [int(s) for s in spec.seeds]
    if not seeds or len(set(seeds)) != len(seeds):
        raise ValueError(f"--seeds {list(spec.seeds)} must be one or more distinct integers")
    if spec.threads < 0:
        raise ValueError(f"--threads {spec.threads} must be >= 0")
    if spec.max_retries < 0:
        raise ValueError(f"--max-retries {spec.max_retries} must be >= 0")
    if spec.gpus_per_arm is not None and spec.gpus_per_arm < 0:
        raise ValueError(f"--gpus-per-arm {spec.gpus_per_arm} must be >= 0")
    if spec.cpus_per_arm is not None and spec.cpus_per_arm <= 0:
        raise ValueError(f"--cpus-per-arm {spec.cpus_per_arm} must be > 0")
    return alphas, seeds


def _check_spec(spec) -> Tuple[List[float], List[int], List[int], int, Any]:
    """Validate a tournament; return (alphas, seeds, rungs in updates, updates per unit, resolved args)."""
    trainer = _trainer(spec)
    alphas, seeds = _check_common(spec)
    rungs = [int(r) for r in spec.rungs]
    if spec.first_rung is not None:
        if not rungs:
            raise ValueError("--first-rung needs the full budget as the last entry of --rungs")
        rungs = halving_rungs(int(spec.first_rung), rungs[-1])
    if not rungs or any(r < 1 for r in rungs) or any(b <= a for a, b in zip(rungs, rungs[1:])):
        raise ValueError(f"--rungs {rungs} must be strictly increasing positive integers (last = full budget)")
    if trainer == "cifar":
        args = cifar_fpo.resolve_args(
            replace(spec.train, weighting="fixed", target=None, num_updates=rungs[-1], early_stop=False, seed=seeds[0])
        )
        bad = [r for r in rungs if r % args.val_every]
        if bad:
            raise ValueError(
                f"--rungs {bad} are not validation nodes; use multiples of --train.val-every {args.val_every}"
            )
        return alphas, seeds, rungs, 1, args
    args = spec.train
    validate_robot_args(args)
    if spec.unit not in ("updates", "steps"):
        raise ValueError(f"--unit {spec.unit!r} is not one of updates, steps")
    per = args.num_envs * args.num_steps if spec.unit == "steps" else 1
    if any(r % per for r in rungs):
        raise ValueError(f"--rungs {rungs} in steps must be multiples of num_envs*num_steps = {per}")
    upd = [r // per for r in rungs]
    every = args.checkpoint_every or args.eval_every
    bad = [r for r, u in zip(rungs, upd) if u % args.eval_every or u % every]
    if bad:
        raise ValueError(
            f"--rungs {bad} must fall on evaluation and checkpoint updates (multiples of "
            f"--train.eval-every {args.eval_every} and --train.checkpoint-every {every})"
        )
    if args.alpha_early is not None or args.alpha_late is not None:
        raise ValueError("--train.alpha-early/--train.alpha-late set a schedule; candidates are fixed exponents")
    return alphas, seeds, upd, per, args


def _arm_args(
    trainer: str,
    base,
    alpha: float,
    seed: int,
    until: Optional[int],
    budget: Optional[int],
    arms_dir: Path,
    task: Optional[str] = None,
):
    """The trainer arguments of one arm trained up to update `until` of a `budget`-update run (None: the
    run's own budget, for grids); `task` sets the reward (CIFAR) or environment (robots)."""
    name = _arm_name(alpha, seed, task)
    if trainer == "cifar":
        a = replace(
            base,
            weighting="fixed",
            target=None,
            alpha=float(alpha),
            seed=int(seed),
            until=until,
            resume=False,
            run_name=name,
            runs_dir=str(arms_dir),
        )
        if budget is not None:
            a = replace(a, num_updates=int(budget), early_stop=False)
        return replace(a, reward=task) if task else a
    exponent = {"alpha_eps": float(alpha)} if base.objective == "fpo" else {"alpha": float(alpha)}
    a = replace(base, **exponent, seed=int(seed), resume=False, run_name=name, runs_dir=str(arms_dir))
    if budget is not None:
        # total_timesteps is the full budget, so an annealed learning rate follows the same schedule
        # whether the arm runs straight through or is paused at rungs (robot_fpo anneals over it).
        a = replace(a, num_updates=int(until), total_timesteps=int(budget) * base.num_envs * base.num_steps)
    return replace(a, env_id=task) if task else a


def _sweep_config(trainer: str, args, **kw) -> Dict[str, Any]:
    """What defines a sweep's results (the settings of every arm, less the per-arm and placement ones)."""
    train = {
        k: v
        for k, v in asdict(args).items()
        if k
        not in (
            "device",
            "cuda",
            "verbose",
            "save_samples",
            "run_name",
            "runs_dir",
            "until",
            "resume",
            "seed",
            "alpha",
            "alpha_eps",
            "torch_threads",
            "env_threads",
            "reward",
            "env_id",
            "track",
            "wandb_project_name",
            "wandb_entity",
        )
    }
    return json.loads(json.dumps({"trainer": trainer, **kw, "train": train}))


def _open_sweep(spec, kind: str, name: str, config: Dict[str, Any]) -> Tuple[Path, Path]:
    folder = Path(spec.out_dir).absolute() / name  # absolute: workers elsewhere write to the same place
    path = folder / f"{kind}.json"
    if path.exists() and json.loads(path.read_text()).get("config") != config:
        raise ValueError(f"{folder} holds a different {kind}; choose another --name or --out-dir")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise RunError(f"cannot create {folder}: {err.strerror}; choose another --out-dir", EXIT_IO) from err
    return folder, path


# ---------------------------------------------------------------------------------------------
# Live tournaments: the procedure
# ---------------------------------------------------------------------------------------------
def run_tournament(spec) -> Dict[str, Any]:
    """Run (or continue) a live tournament; returns the content of its ``tournament.json``."""
    trainer = _trainer(spec)
    if isinstance(spec, (CifarGrid, RobotGrid)):
        raise ValueError("run_tournament takes a CifarTournament or RobotTournament; grids go to run_grid")
    alphas, seeds, rungs, per, base = _check_spec(spec)
    unit = "updates" if trainer == "cifar" else spec.unit
    if spec.name is not None:
        name = spec.name
    elif trainer == "cifar":
        name = f"halving__{base.reward}__{seeds[0]}"
    else:
        name = f"halving__{base.env_id.replace('/', '_')}__{base.objective}__{seeds[0]}"
    config = _sweep_config(
        trainer,
        base,
        alphas=alphas,
        seeds=seeds,
        rungs=[r * per for r in rungs],
        unit=unit,
        task=base.reward if trainer == "cifar" else base.env_id,
    )
    folder, path = _open_sweep(spec, "tournament", name, config)
    arms_dir = folder / "arms"
    ray, started = connect_ray(spec)
    try:
        resources = arm_resources(spec, trainer, base, ray)
        score_key = SCORE_KEY[trainer]
        budget = rungs[-1]
        t_start = time.time()
        result: Dict[str, Any] = {"config": config, "rounds": [], "status": "running"}
        _write_json(result, path)
        failures: Dict[Tuple[float, int], Dict[str, Any]] = {}
        alive = list(alphas)
        for i, rung in enumerate(rungs):
            final = i == len(rungs) - 1
            if len(alive) == 1 and not final:
                continue  # a lone survivor goes straight on to the full budget
            states, jobs = {}, []
            for a in alive:
                for s in seeds:
                    arm = _arm_name(a, s)
                    states[arm] = arm_state(arms_dir / arm, score_key)
                    if states[arm]["updates_done"] >= rung or states[arm]["status"] == "nonfinite":
                        continue
                    jobs.append(
                        {
                            "key": arm,
                            "train": TRAIN[trainer],
                            "score_key": score_key,
                            "pid_file": str(folder / "workers" / f"{arm}__to{rung * per}"),
                            "args": _arm_args(trainer, base, a, s, rung, budget, arms_dir),
                        }
                    )
            print(f"rung {rung * per} {unit}: {len(jobs)} segment(s) of {len(alive)} candidate(s)", flush=True)
            done, failed = run_segments(jobs, spec, ray, resources)
            states.update(done)
            for arm, st in states.items():  # a diverged arm is reported with the failures, as the paper does
                if st["status"] == "nonfinite" and arm not in failed:
                    failed[arm] = f"non-finite ({st['stop_reason']})"
            for a in alive:
                for s in seeds:
                    if _arm_name(a, s) in failed:
                        failures[(a, s)] = {
                            "alpha": fmt_label(a),
                            "seed": s,
                            "rung": rung * per,
                            "reason": failed[_arm_name(a, s)],
                        }
            per_seed = {
                a: [
                    float("nan") if (a, s) in failures else states[_arm_name(a, s)]["curve"].get(rung, float("nan"))
                    for s in seeds
                ]
                for a in alive
            }
            scores = {
                a: float(np.mean(v)) if all(math.isfinite(x) for x in v) else float("nan") for a, v in per_seed.items()
            }
            ranking = rank_candidates(scores)
            finite = [a for a in ranking if math.isfinite(scores[a])]
            kept = finite[:1] if final else finite[: keep_count(len(alive))]
            result["rounds"].append(
                {
                    "rung": rung * per,
                    "alive": [fmt_label(a) for a in alive],
                    "scores": {fmt_label(a): scores[a] for a in alive},
                    "per_seed": {fmt_label(a): per_seed[a] for a in alive},
                    "ranking": [fmt_label(a) for a in ranking],
                    "kept": [fmt_label(a) for a in kept],
                    "eliminated": [fmt_label(a) for a in ranking if a not in kept],
                    "failed": {
                        _arm_name(a, s): failed[_arm_name(a, s)]
                        for a in alive
                        for s in seeds
                        if _arm_name(a, s) in failed
                    },
                }
            )
            _write_json(result, path)
            alive = kept
            if not alive:
                break

        winner = alive[0] if alive else None
        arms, trained = {}, 0
        for a in alphas:
            reps = []
            for s in seeds:
                st = arm_state(arms_dir / _arm_name(a, s), score_key)
                peak, at = run_peak(st)
                failure = failures.get((a, s))
                reps.append(
                    {
                        "seed": s,
                        "run": st["run"],
                        "trained": st["updates_done"] * per,
                        "status": st["status"],
                        "peak": peak,
                        "peak_at": at * per if at is not None else None,
                        "failed": failure["reason"] if failure else None,
                    }
                )
                trained += st["updates_done"]
            peaks = [r["peak"] for r in reps]
            arms[fmt_label(a)] = {"peak": float(np.mean(peaks)) if None not in peaks else None, "replicates": reps}
        cost = trained / budget
        result.update(
            {
                "status": "finished" if winner is not None else "failed",
                "winner": fmt_label(winner) if winner is not None else None,
                "winner_peak": arms[fmt_label(winner)]["peak"] if winner is not None else None,
                "arms": arms,
                "failures": list(failures.values()),
                "cost": {
                    "trained": trained * per,
                    "full_run": budget * per,
                    "unit": unit,
                    "C": cost,
                    "cost_per_replicate": cost / len(seeds),
                    "exhaustive": float(len(alphas) * len(seeds)),
                    "fraction": cost / (len(alphas) * len(seeds)),
                },
                "run_info": run_info(ray, resources, t_start),
            }
        )
        _write_json(result, path)
        return result
    finally:
        if started:
            ray.shutdown()


def print_tournament(result: Dict[str, Any], path: Optional[Path] = None) -> None:
    """Human-readable summary of a tournament.json."""
    unit = result["config"]["unit"]
    for r in result["rounds"]:
        scores = "  ".join(f"{a}: {r['scores'][a]:.6f}" for a in r["ranking"])
        print(f"rung {r['rung']:>8} {unit}: {scores}  -> keep {', '.join(r['kept']) or 'none'}")
    c = result["cost"]
    print(f"winner alpha={result['winner']}  peak {result['winner_peak']}")
    for a, arm in result["arms"].items():
        budget = max(rep["trained"] for rep in arm["replicates"])
        print(f"  alpha={a:>6}  trained {budget:>8} {unit}  peak {arm['peak']}")
    for f in result.get("failures", []):
        print(f"  FAILED alpha={f['alpha']} seed {f['seed']} at rung {f['rung']}: {f['reason']}")
    print(
        f"cost C = {c['trained']}/{c['full_run']} = {c['C']:g} full-run equivalents "
        f"(exhaustive {c['exhaustive']:g}; {100 * c['fraction']:.2f}%)" + (f"  -> {path}" if path else "")
    )


# ---------------------------------------------------------------------------------------------
# Grids: every arm to its full budget, and the per-run peak table
# ---------------------------------------------------------------------------------------------
def run_grid(spec) -> Dict[str, Any]:
    """Run (or continue) a grid: every (task, cell, seed) arm to the trainer's full budget. Writes
    ``grid.json`` (every run and the per-cell table) and ``grid.md`` (the table) and returns the former."""
    trainer = _trainer(spec)
    if not isinstance(spec, (CifarGrid, RobotGrid)):
        raise ValueError("run_grid takes a CifarGrid or RobotGrid; tournaments go to run_tournament")
    alphas, seeds = _check_common(spec, alphas_optional=trainer == "cifar")
    pack = getattr(spec, "pack", 1)
    if isinstance(pack, bool) or not isinstance(pack, int) or pack < 1:
        raise ValueError(f"--pack {pack!r} is not allowed: give the runs per pack, a whole number >= 1 (1: no packs)")
    base = spec.train
    axes: Dict[str, Any] = {}
    if trainer == "cifar":
        tasks = list(spec.rewards) or [base.reward]
        cells = cifar_cells(spec, cifar_fpo.weighting_label)
        alphas = list(dict.fromkeys(c["settings"]["alpha"] for c in cells if c["alpha"] is not None))
        base = cifar_fpo.resolve_args(replace(base, weighting="fixed", target=None, seed=seeds[0], reward=tasks[0]))
        for c in cells:  # every cell's settings checked before anything is written
            cifar_fpo.resolve_args(replace(base, **c["settings"], run_name=None))
        budget = base.num_updates
        if pack > 1:
            cifar_pack.check_packable([base])  # e.g. a precision a pack does not take on this device
        axes = {ax: list(getattr(spec, ax)) for ax in PROFILE_AXES[1:] + ("gs", "estimators") if getattr(spec, ax)}
    else:
        tasks = list(spec.env_ids) or [base.env_id]
        validate_robot_args(base)
        if base.alpha_early is not None or base.alpha_late is not None:
            raise ValueError("--train.alpha-early/--train.alpha-late set a schedule; grid exponents are fixed")
        budget = base.num_updates or max(1, base.total_timesteps // (base.num_envs * base.num_steps))
        cells = [{"cell": f"alpha{a:+g}", "alpha": fmt_label(a), "exponent": a} for a in alphas]
    if len(set(tasks)) != len(tasks):
        raise ValueError(f"tasks {tasks} must be distinct")
    name = (
        spec.name
        or "grid__"
        + "+".join(t.replace("/", "_") for t in tasks)
        + (f"__{base.objective}" if trainer == "robot" else "")
        + "".join(f"__{ax.replace('_', '-')}" for ax in axes)  # e.g. __targets__estimators; none for alphas alone
        + f"__{seeds[0]}"
    )
    # a grid over alphas alone keeps the config (and so continues the folders) of grids written before other axes
    config = _sweep_config(trainer, base, alphas=alphas, seeds=seeds, tasks=tasks, budget=budget, **axes)
    folder, path = _open_sweep(spec, "grid", name, config)
    arms_dir = folder / "arms"
    ray, started = connect_ray(spec)

    def arm_name(t: str, c: Dict[str, Any], s: int) -> str:
        return f"{t.replace('/', '_')}__{c['cell']}__seed{s}"

    def arm_args(t: str, c: Dict[str, Any], s: int):
        if trainer == "robot":
            return _arm_args(trainer, base, c["exponent"], s, None, None, arms_dir, t)
        return replace(
            base,
            **c["settings"],
            reward=t,
            seed=int(s),
            until=None,
            resume=False,
            run_name=arm_name(t, c, s),
            runs_dir=str(arms_dir),
        )

    try:
        resources = arm_resources(spec, trainer, base, ray)
        t_start = time.time()
        grid = [(t, c, s) for t in tasks for c in cells for s in seeds]
        jobs = []
        for t, c, s in grid:
            arm = arm_name(t, c, s)
            st = arm_state(arms_dir / arm, SCORE_KEY[trainer])
            if st["status"] in FINAL:
                continue
            jobs.append(
                {
                    "key": arm,
                    "train": TRAIN[trainer],
                    "score_key": SCORE_KEY[trainer],
                    "pid_file": str(folder / "workers" / arm),
                    "args": arm_args(t, c, s),
                }
            )
        print(f"grid {name}: {len(jobs)} of {len(grid)} run(s) to train", flush=True)
        if pack > 1 and jobs:
            jobs = _pack_jobs(jobs, pack, folder)
            print(f"  in {len(jobs)} pack(s) of up to {pack} runs", flush=True)
        _, failed = run_segments(jobs, spec, ray, resources)
        runs, trained = [], 0
        for t, c, s in grid:
            arm = arm_name(t, c, s)
            st = arm_state(arms_dir / arm, SCORE_KEY[trainer])
            peak, at = run_peak(st)
            final = st["curve"].get(budget)
            trained += st["updates_done"]
            runs.append(
                {
                    "task": t,
                    "cell": c["cell"],
                    "alpha": c["alpha"],
                    **({"settings": c["settings"]} if trainer == "cifar" else {}),
                    "seed": s,
                    "run": st["run"],
                    "name": arm,
                    "status": st["status"],
                    "stop_reason": st["stop_reason"],
                    "trained": st["updates_done"],
                    "peak": peak,
                    "peak_update": at,
                    "final": final if final is not None and math.isfinite(final) else None,
                    "failed": failed.get(arm),
                }
            )
        result = {
            "config": config,
            "status": "finished",
            "runs": runs,
            "table": peak_table(runs, seeds),
            "failures": [
                {k: r[k] for k in ("task", "cell", "alpha", "seed", "name", "failed")} for r in runs if r["failed"]
            ],
            "cost": {"trained": trained, "full_run": budget, "C": trained / budget, "runs": len(grid)},
            "run_info": {**run_info(ray, resources, t_start), "pack": pack},
        }
        if trainer == "cifar" and len(spec.estimators) > 1:
            result["paired"] = paired_estimators(runs, list(spec.estimators))
        _write_json(result, path)
        (folder / "grid.md").write_text(grid_markdown(result))
        return result
    finally:
        if started:
            ray.shutdown()


def _pack_jobs(jobs: List[Dict[str, Any]], size: int, folder: Path) -> List[Dict[str, Any]]:
    """The grid's arm jobs in packs of at most `size` arms that can be batched together (cifar_pack.groups)."""
    packs = []
    for ids in cifar_pack.groups([job["args"] for job in jobs], size):
        arms = [jobs[i]["key"] for i in ids]
        args = [jobs[i]["args"] for i in ids]
        pid_file = str(folder / "workers" / f"pack__{arms[0]}")
        job = {"key": arms[0], "arms": arms, "train": cifar_pack.main, "score_key": SCORE_KEY["cifar"]}
        packs.append({**job, "args": args, "pid_file": pid_file})
    return packs


# ---------------------------------------------------------------------------------------------
# Replay over recorded curves (fpo_utils/replay.py) and the command line
# ---------------------------------------------------------------------------------------------
@dataclass
class ReplayArgs:
    """Replay successive halving over recorded curves (app:halving-robotics, tab:halving-choice,
    tab:halving-budgets)."""

    curves: tyro.conf.Positional[Tuple[str, ...]]
    """Curves JSON files, one task each (written by `python halving.py curves`)."""
    n_draw: Tuple[int, ...] = REPLAY_DRAWS
    """Seeds per draw n; all S^n ordered draws with replacement are enumerated (paper: 1, 2, 3; tables: 3)."""
    first_cuts: Tuple[float, ...] = FIRST_CUTS
    """First-cut grid X in percent of the full budget (app:search-settings), plus exhaustive search."""
    highlight: float = HIGHLIGHT_CUT
    """First cut (percent) of the choice table (tab:halving-choice uses 20%)."""
    native: Optional[str] = None
    """Native candidate label for the Delta column; default the file's `native` entry (1 when present)."""
    out: Optional[str] = None
    """Also write every replay result to this JSON file."""


@dataclass
class CurvesArgs:
    """Convert cifar_fpo.py / robot_fpo.py run folders of one task into a replay curves file."""

    runs: tyro.conf.Positional[Tuple[str, ...]]
    """Run folders, or folders holding run folders (searched recursively)."""
    out: str = "curves.json"
    """Output JSON file."""
    unit: str = "updates"
    """Evaluation axis: `updates`, or `steps` (robot environment steps)."""
    task: Optional[str] = None
    """Task name stored in the file (default: the reward, or the environment and objective)."""
    until: Optional[float] = None
    """Keep only evaluations at or before this point (in `unit`): a common budget for runs cut at different points."""


def run_replay(cli: ReplayArgs) -> Dict[str, Any]:
    """The `replay` command: sweep every file over the first-cut grid and print both tables."""
    if not cli.curves:
        raise ValueError("replay needs one or more curves JSON files (write them with `python halving.py curves`)")
    tasks = [load_curves(p) for p in cli.curves]
    results: Dict[str, Any] = {}
    for n in cli.n_draw:
        sweeps, choice = [], []
        for data in tasks:
            sweep = replay_sweep(data, n, sorted(set(cli.first_cuts) | {cli.highlight}))
            native = cli.native if cli.native is not None else data.get("native")
            if native is not None and native not in data["curves"]:
                raise ValueError(f"--native {native!r} is not a candidate of {data['task']}: {list(data['curves'])}")
            hl = [r for r in sweep if r["first_cut_pct"] == cli.highlight and "skipped" not in r]
            if hl:
                choice.append((data["task"], native, hl[0]))
            sweeps.append((data["task"], [r for r in sweep if r["first_cut_pct"] in set(cli.first_cuts) | {None}]))
            results.setdefault(data["task"], {})[f"n={n}"] = sweep
        print(f"\n== n = {n}: first cut {cli.highlight:g}% (tab:halving-choice) ==")
        print(choice_table(choice) if choice else "(no task has an evaluation at or before that cut)")
        print(f"\n== n = {n}: first-cut budgets (tab:halving-budgets) ==")
        print(budget_table(sweeps))
    if cli.out:
        Path(cli.out).write_text(json.dumps(results, indent=2))
    return results


def _parse_with_preset(cls, argv: List[str]):
    """`--train.preset NAME` picks the trainer's named defaults for every arm (flags given after it
    override), as `--preset` does for the trainer itself."""
    names = flag_values(argv, "train.preset")
    trainer = cifar_fpo if cls in (CifarTournament, CifarGrid) else robot_trainer
    if names[-1] not in trainer.PRESETS:
        raise RunError(f"--train.preset {names[-1]!r} is not one of {', '.join(trainer.PRESETS)}")
    train = trainer.PRESETS[names[-1]]
    if cls is CifarTournament:
        train = replace(train, estimator="q+Z", early_stop=False)  # app:halving, as _cifar_defaults
    return tyro.cli(cls, default=replace(cls(), train=train), args=argv)


def main(argv: Optional[Sequence[str]] = None) -> Any:
    commands = {
        "cifar": CifarTournament,
        "robot": RobotTournament,
        "cifar-grid": CifarGrid,
        "robot-grid": RobotGrid,
        "replay": ReplayArgs,
        "curves": CurvesArgs,
    }
    argv = list(sys.argv[1:] if argv is None else argv)
    for value in flag_values(argv[1:], "pack") if argv and argv[0] == "cifar-grid" else []:
        if not value.isdigit() or int(value) < 1:
            raise ValueError(
                f"--pack {value!r} is not allowed: give the runs per pack, a whole number >= 1 (1: no packs)"
            )
    if argv and argv[0] in ("cifar", "robot", "cifar-grid", "robot-grid") and flag_values(argv[1:], "train.preset"):
        cmd = _parse_with_preset(commands[argv[0]], argv[1:])
    else:
        cmd = tyro.extras.subcommand_cli_from_dict(commands, description=__doc__.split("\n\n")[0], args=argv)
    if isinstance(cmd, (CifarTournament, RobotTournament)):
        result = run_tournament(cmd)
        print_tournament(result)
        return result
    if isinstance(cmd, (CifarGrid, RobotGrid)):
        result = run_grid(cmd)
        print_grid(result)
        return result
    if isinstance(cmd, ReplayArgs):
        return run_replay(cmd)
    data = runs_to_curves(cmd.runs, cmd.unit, cmd.task, cmd.until)
    Path(cmd.out).write_text(json.dumps(data, indent=2))
    print(
        f"{data['task']}: {len(data['curves'])} candidates x {len(data['seeds'])} seeds x "
        f"{len(data['steps'])} evaluations -> {cmd.out}"
    )
    return data


if __name__ == "__main__":
    try:
        main()
    except RunError as err:  # e.g. an unwritable --out-dir
        print(f"error: {err}", file=sys.stderr)
        sys.exit(err.code)
    except ValueError as err:  # bad input: one line naming the value and what is allowed
        print(f"error: {err}", file=sys.stderr)
        sys.exit(EXIT_BAD_INPUT)
    except KeyboardInterrupt:
        print("error: interrupted; run the same command again to continue from the arms' checkpoints", file=sys.stderr)
        sys.exit(EXIT_INTERRUPTED)
