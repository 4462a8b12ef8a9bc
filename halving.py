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
    `run_segment`. With Ray installed (``pip install -e '.[ray]'``) the segments of a rung are
    submitted together as Ray tasks, each reserving ``--gpus-per-arm`` (default one GPU when the
    arms train on a GPU) and ``--cpus-per-arm``; Ray places them on free resources of one machine
    (a local Ray started for the sweep) or of a cluster (``--ray-address`` or ``RAY_ADDRESS``).
    The driver waits for the rung, ranks, and submits the survivors' next segments. Without Ray,
    or with ``--no-ray``, the segments run one after another in this process. Each segment is a
    deterministic function of its arguments and of the arm's checkpoint, so the scores, the
    eliminations, the peaks and the cost do not depend on where or how many at once arms ran (on
    the CPU fix ``--threads`` so that every arm uses the same number of intra-op threads).
    Run folders must be on a filesystem every node reads and writes at the same path.

Faults
    A segment whose worker process dies (killed, out of memory, lost node) is re-run by Ray up to
    ``--max-retries`` times; the re-run continues from the arm's last checkpoint (the trainers'
    ``--resume``), so the arm's results equal an uninterrupted run's. A segment that raises (a
    deterministic error, not retried) or whose worker keeps dying marks its arm failed with the
    reason: the arm scores NaN at that rung and is eliminated, the tournament goes on with the
    rest, and ``failures`` lists it. A non-finite arm (status ``nonfinite``) is ranked last and
    listed in the same way, as the paper reports divergent runs.

Replay (``replay``, function `replay`)
    ``curves`` maps each candidate to an array (seeds, evaluations) of validation rewards or
    returns at the evaluation points ``steps`` (the last point is the full budget H; missing
    evaluations may be NaN). For ``n`` in the requested draw sizes every one of the ``S^n``
    ordered seed draws with replacement is enumerated, the same draw for every candidate
    (app:search-settings). At the cuts ``X, 2X, 4X, ... < 100%`` of H the replay uses the last
    evaluation at or before the cut, ranks the candidates still in by the mean over the drawn
    seeds of each seed's peak observed so far, and keeps ``ceil(K/2)``; the survivors are
    ranked by the same statistic at the full budget. Exact ties are averaged over candidate
    orderings: the outcome is the average, over all K! orderings of the candidate list, of the
    procedure that breaks every tie (in every round) by position in that ordering. The selection
    probability pi(alpha) averages over draws and orderings; the selected score is
    ``sum_alpha pi(alpha) Pbar(alpha)`` with ``Pbar(alpha)`` the mean over all S seeds of each
    seed's full-budget peak (app:halving-robotics), and the oracle is ``max_alpha Pbar(alpha)``.
    Repeated runs of one candidate and seed are averaged pointwise before peaks are taken
    (``curves`` does this when converting run folders).

Cost accounting
    Live tournaments: the cost is the sum, over every arm and seed replicate, of the number of
    updates it actually trained (an arm that fails early counts what it trained), divided by one
    full-run budget (the last rung). The CIFAR default gives
    ``C_SH4 = (4*200 + 2*(400-200) + (800-400))/800 = 2`` full-run equivalents against
    ``K * seeds = 4`` for exhaustive search (app:halving); ``cost_per_replicate`` divides by the
    number of seeds (the figure's per-replication cost).
    Replay: ``C = sum_{alpha,i} T_alpha,i / H`` exactly as in app:halving-robotics, where
    ``i`` runs over the ``n`` seeds of a draw, ``T`` is the step of the evaluation used at the
    cut that eliminated the candidate (the last evaluation at or before the cut, not the cut
    itself) and ``H`` for the final survivors. Exhaustive search costs ``K n``; ``fraction`` is
    ``C / (K n)`` (the table's search/exhaustive column) and ``cost_per_replicate = C / n``
    (the figure's ``C_fig``). The number of candidates alive at each cut does not depend on the
    draw, so neither does C. The paper's cost column needs its recorded evaluation grid: with an
    evaluation every three 244-block units, this definition gives 4.1803, 5.3607, 7.7582 and 12
    (K=4) and 5.3607, 7.7582, 10.7582 and 15 (K=5) for first cuts 10, 20, 40% and full search,
    the paper's Acrobot and Walker entries of tab:halving-budgets; Spot's entries need its own
    checkpoint grid, which the paper does not give.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import socket
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from fractions import Fraction
from pathlib import Path
from typing import Any, Dict, List, Literal, Mapping, Optional, Sequence, Tuple

import numpy as np
import torch
import tyro

import cifar_fpo
import robot_fpo
import cifar_fpo_pack as cifar_pack
from fpo_utils.runfolder import (
    CHECKPOINT,
    EXIT_BAD_INPUT,
    EXIT_INTERRUPTED,
    EXIT_IO,
    RunError,
    atomic_write_text,
    flag_values,
    read_jsonl,
)

ROOT = Path(__file__).resolve().parent
CIFAR_ALPHAS = (-2.0, -1.0, 0.0, 1.0)  # app:search-settings
CIFAR_RUNGS = (200, 400, 800)  # app:search-settings: keep 2 at 200, keep 1 at 400, winner to 800
CIFAR_SEED = 20260727  # app:search-settings (the second tournament of each reward uses 20260728)
FIRST_CUTS = (2.0, 5.0, 10.0, 15.0, 20.0, 25.0, 30.0, 40.0, 50.0)  # app:search-settings, percent
HIGHLIGHT_CUT = 20.0  # tab:halving-choice reports the 20% first cut
REPLAY_DRAWS = (3,)  # tab:halving-choice and tab:halving-budgets use n = 3


# ---------------------------------------------------------------------------------------------
# The halving rule
# ---------------------------------------------------------------------------------------------
def keep_count(k: int) -> int:
    """Number of candidates kept at a rung when ``k`` are in: ``ceil(k/2)``."""
    if k < 1:
        raise ValueError(f"candidate count {k} must be >= 1")
    return (k + 1) // 2


def rank_candidates(scores: Mapping[float, float]) -> List[float]:
    """Exponents ordered best first by score; exact ties favour the smaller exponent
    (app:search-settings) and non-finite scores (failed arms) come last."""

    def key(a):
        s = scores[a]
        return (0, -s, a) if math.isfinite(s) else (1, 0.0, a)

    return sorted(scores, key=key)


def halving_rungs(first: int, budget: int) -> List[int]:
    """The generic schedule: ``first, 2 first, 4 first, ...`` strictly below ``budget``, then ``budget``."""
    if first < 1 or budget < 1:
        raise ValueError(f"first rung {first} and budget {budget} must be >= 1")
    rungs, r = [], first
    while r < budget:
        rungs.append(r)
        r *= 2
    return rungs + [budget]


def cut_fractions(first_cut: Optional[float]) -> List[float]:
    """Cut targets ``X, 2X, 4X, ... < 1`` as fractions of the full budget (none for exhaustive)."""
    if first_cut is None:
        return []
    if not (isinstance(first_cut, (int, float)) and 0 < first_cut <= 1):
        raise ValueError(f"first_cut={first_cut!r} must be a fraction in (0, 1] (or None for exhaustive search)")
    out, x = [], float(first_cut)
    while x < 1.0 - 1e-12:
        out.append(x)
        x *= 2
    return out


def fmt_label(a: float) -> str:
    """Short text form of an exponent: -2, 0, 0.25."""
    return f"{float(a):g}"


# ---------------------------------------------------------------------------------------------
# Sweeps: where arms run
# ---------------------------------------------------------------------------------------------
def _cifar_defaults() -> cifar_fpo.Args:
    return cifar_fpo.Args(estimator="q+Z", early_stop=False)  # app:halving


def _robot_defaults() -> robot_fpo.Args:
    return robot_fpo.Args()


@dataclass
class Sweep:
    """Where a sweep's arms run and where their run folders go (shared by tournaments and grids)."""

    name: Optional[str] = None
    """Sweep folder name under `out_dir` (default from the task and the first seed)."""
    out_dir: str = "runs"
    """Where sweep folders are written. On a cluster: a directory every node can read and write at the
    same path (a shared filesystem), since any node may continue an arm from its checkpoint there."""
    ray: bool = True
    """Run arms as Ray tasks when Ray is installed; `--no-ray` runs them one after another in this
    process (same results)."""
    ray_address: Optional[str] = None
    """Ray cluster to join (`auto`, `<head ip>:6379`, `ray://<head ip>:10001`); default the RAY_ADDRESS
    environment variable, else a local Ray on this machine. The repository must sit at the same path
    on every node (it goes on the workers' PYTHONPATH)."""
    gpus_per_arm: Optional[float] = None
    """GPUs an arm reserves (Ray's num_gpus; 0.25 puts four arms on a GPU). Default: 1 when the arms
    train on a GPU and the cluster has GPUs, else 0."""
    cpus_per_arm: Optional[float] = None
    """CPUs an arm reserves (Ray's num_cpus), so that arms do not oversubscribe a node. Default: the
    arm's torch threads (at least 1); for robots the larger of those and --train.env-threads (set the
    latter: its default 0 gives every arm one envpool thread per core of the node)."""
    threads: int = 0
    """torch intra-op threads per arm (0: leave the trainer's default; fix it for results that do not
    depend on where an arm ran)."""
    max_retries: int = 3
    """Times Ray re-runs a segment whose worker process died (each retry resumes from the arm's last
    checkpoint). A segment that raises, or dies more often, marks its arm failed."""


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
    """Live successive-halving tournament of robot_fpo.py arms (FPO: alpha_eps, FPO++: alpha)."""

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
    train: robot_fpo.Args = field(default_factory=_robot_defaults)
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
    """Every (environment, exponent, seed) robot_fpo.py run to its full budget, and the per-run peak table."""

    alphas: Tuple[float, ...] = (0.0, 0.25, 0.5, 1.0)
    """Exponents: alpha_eps for `--train.objective fpo`, alpha for `fpopp`."""
    seeds: Tuple[int, ...] = (901, 902, 903)
    """Training seeds (app:search-settings)."""
    env_ids: Tuple[str, ...] = ()
    """Environments (tasks) of the grid; default --train.env-id."""
    train: robot_fpo.Args = field(default_factory=_robot_defaults)
    """Settings shared by every run (budget --train.total-timesteps, objective, rollout sizes, ...); the
    grid sets the exponent, env_id, seed, resume, run_name and runs_dir."""


# ---------------------------------------------------------------------------------------------
# Sweeps: one arm segment (a Ray task, or a call in this process)
# ---------------------------------------------------------------------------------------------
SCORE_KEY = {"cifar": "val_reward", "robot": "eval_return"}  # the metrics field an arm is ranked by


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


def arm_state(folder: Path, score_key: str) -> Dict[str, Any]:
    """What an arm's run folder says: updates done, status and stop reason (summary.json), whether it
    holds a checkpoint, and its evaluation curve {update: value of `score_key`} (metrics.jsonl)."""
    folder = Path(folder)
    summary = folder / "summary.json"
    s = json.loads(summary.read_text()) if summary.exists() else {}
    curve = {
        int(r["update"]): float(r[score_key])
        for r in read_jsonl(folder / "metrics.jsonl")
        if r.get(score_key) is not None
    }
    return {
        "run": str(folder),
        "updates_done": int(s.get("updates_done") or 0),
        "status": s.get("status"),
        "stop_reason": s.get("stop_reason"),
        "has_checkpoint": (folder / CHECKPOINT).exists(),
        "curve": curve,
    }


class ArmInterrupted(Exception):
    """A segment stopped early by SIGINT/SIGTERM (its arm checkpointed): Ray re-runs it from there."""


def run_segment(trainer: str, args, threads: int = 0, pid_file: Optional[str] = None) -> Dict[str, Any]:
    """Train one arm segment and return the arm's state (`arm_state`).

    `args` are the trainer's Args for the segment's end (CIFAR: `until`; robots: `num_updates`). The
    segment continues from the run folder's checkpoint when there is one, so a segment re-run after
    its worker died resumes where the arm's last checkpoint left it. `pid_file` gets one line
    "host pid node" per attempt (Ray retries show up as extra lines)."""
    folder = Path(args.runs_dir) / args.run_name
    _note_worker(pid_file)
    args = replace(args, resume=(folder / CHECKPOINT).exists())
    old = torch.get_num_threads()
    if threads > 0:
        torch.set_num_threads(threads)
    try:
        if trainer == "cifar":
            cifar_fpo.main(args)
        else:
            robot_fpo.main(replace(args, torch_threads=threads) if threads > 0 else args)
    finally:
        torch.set_num_threads(old)
    state = arm_state(folder, SCORE_KEY[trainer])
    if state["status"] == "interrupted":
        raise ArmInterrupted(f"{args.run_name} interrupted at update {state['updates_done']}")
    return state


def run_pack_segment(trainer: str, args_list, threads: int = 0, pid_file: Optional[str] = None) -> Dict[str, Any]:
    """Train the CIFAR arms of one pack together in this process (cifar_fpo_pack.py), each continued
    from its run folder's checkpoint as `run_segment` continues one arm; arms that already ended are left
    out. Returns {"states": {arm: state}, "failed": {arm: reason}}: an arm that cannot start (a corrupt
    checkpoint, say) is failed and the others train."""
    _note_worker(pid_file)
    todo = []
    for args in args_list:
        folder = Path(args.runs_dir) / args.run_name
        if arm_state(folder, SCORE_KEY[trainer])["status"] not in FINAL:
            todo.append(replace(args, resume=(folder / CHECKPOINT).exists()))
    failed: Dict[str, str] = {}
    old = torch.get_num_threads()
    if threads > 0:
        torch.set_num_threads(threads)
    try:
        if todo:
            cifar_pack.main(todo, failures=failed)
    finally:
        torch.set_num_threads(old)
    states = {
        a.run_name: arm_state(Path(a.runs_dir) / a.run_name, SCORE_KEY[trainer])
        for a in args_list
        if a.run_name not in failed
    }
    stopped = [f"{name} at update {s['updates_done']}" for name, s in states.items() if s["status"] == "interrupted"]
    if stopped:
        raise ArmInterrupted(f"pack interrupted: {', '.join(stopped)}")
    return {"states": states, "failed": failed}


def _note_worker(pid_file: Optional[str]) -> None:
    """Append "host pid node" to `pid_file` (one line per attempt: Ray retries show up as extra lines)."""
    if pid_file:
        node = "-"
        if "ray" in sys.modules and sys.modules["ray"].is_initialized():
            node = sys.modules["ray"].get_runtime_context().get_node_id()
        Path(pid_file).parent.mkdir(parents=True, exist_ok=True)
        with open(pid_file, "a") as f:
            f.write(f"{socket.gethostname()} {os.getpid()} {node}\n")


def _reason(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0] if text else ''}".strip()


def _connect(spec):
    """The `ray` module connected to a cluster (joined, or started here on this machine), or None to
    run arms in this process. Returns (ray or None, whether this call started it)."""
    if not spec.ray:
        return None, False
    try:
        import ray
    except ImportError:
        if spec.ray_address:
            raise ValueError(f"--ray-address {spec.ray_address} needs Ray: pip install -e '.[ray]'") from None
        return None, False
    if ray.is_initialized():
        return ray, False
    path = os.pathsep.join([str(ROOT)] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else []))
    kw: Dict[str, Any] = {"runtime_env": {"env_vars": {"PYTHONPATH": path}}}
    if not (spec.ray_address or os.environ.get("RAY_ADDRESS")):
        kw["include_dashboard"] = False  # a local Ray for this sweep only
    ray.init(address=spec.ray_address, **kw)
    return ray, True


def _resources(spec, trainer: str, base, ray) -> Dict[str, float]:
    """Ray resources of one arm (see `Sweep.gpus_per_arm`, `Sweep.cpus_per_arm`)."""
    gpus = spec.gpus_per_arm
    if gpus is None:
        wants = (base.device == "auto" or base.device.startswith("cuda")) if trainer == "cifar" else base.cuda
        gpus = 1.0 if wants and ray is not None and ray.cluster_resources().get("GPU", 0) > 0 else 0.0
    cpus = spec.cpus_per_arm
    if cpus is None:
        cpus = float(max(1, spec.threads or (base.torch_threads if trainer == "robot" else 1)))
        if trainer == "robot":  # envpool steps on its own threads while the arm's torch threads wait
            cpus = max(cpus, float(base.env_threads))
    if ray is not None:
        have = ray.cluster_resources()
        if cpus > have.get("CPU", 0) or gpus > have.get("GPU", 0):
            print(
                f"warning: an arm needs {cpus:g} CPUs and {gpus:g} GPUs, the Ray cluster has {have.get('CPU', 0):g} "
                f"and {have.get('GPU', 0):g}: arms wait until nodes that large join",
                file=sys.stderr,
                flush=True,
            )
    return {"num_cpus": float(cpus), "num_gpus": float(gpus)}


def _run_segments(jobs: List[Dict[str, Any]], spec, ray, resources: Dict[str, float]):
    """Run segments {"key", "trainer", "args", "pid_file"} as Ray tasks (all submitted at once, Ray
    places them as resources free up) or one after another here. A pack job also names its "arms" and
    holds their args as a list (`run_pack_segment`). Returns ({arm: arm state}, {arm: failure reason})."""
    results: Dict[str, Dict[str, Any]] = {}
    failures: Dict[str, str] = {}

    def done(job, result):
        packed = result if "arms" in job else {"states": {job["key"]: result}, "failed": {}}
        for key, state in packed["states"].items():
            results[key] = state
            print(f"  {key}: {state['status']} at update {state['updates_done']}", flush=True)
        for key, reason in packed["failed"].items():
            failed(job, reason, [key])

    def failed(job, reason, keys=None):
        for key in keys or job.get("arms", [job["key"]]):
            failures[key] = reason
            print(f"  {key}: FAILED ({reason})", flush=True)

    if ray is None:
        for job in jobs:
            segment = run_pack_segment if "arms" in job else run_segment
            try:
                done(job, segment(job["trainer"], job["args"], spec.threads, job["pid_file"]))
            except ArmInterrupted:
                raise KeyboardInterrupt from None  # Ctrl-C here: stop the sweep (re-run to continue)
            except Exception as err:  # a failing arm does not stop the sweep
                failed(job, _reason(err))
        return results, failures
    import halving as module  # so that workers import run_segment by name, also when this file is __main__

    options = dict(max_retries=spec.max_retries, retry_exceptions=[module.ArmInterrupted], **resources)
    tasks = {False: ray.remote(module.run_segment).options(**options)}
    tasks[True] = ray.remote(module.run_pack_segment).options(**options)
    refs = {
        tasks["arms" in job].remote(job["trainer"], job["args"], spec.threads, job["pid_file"]): job for job in jobs
    }
    pending = list(refs)
    try:
        while pending:
            ready, pending = ray.wait(pending, num_returns=1)
            job = refs[ready[0]]
            try:
                done(job, ray.get(ready[0]))
            except ray.exceptions.RayTaskError as err:  # the trainer raised
                failed(job, _reason(getattr(err, "cause", None) or err))
            except ray.exceptions.RayError as err:  # the worker died more than max_retries times, ...
                failed(job, f"{_reason(err)} (after {spec.max_retries} retries)")
    except KeyboardInterrupt:
        for ref in pending:
            ray.cancel(ref)
        raise
    return results, failures


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
    robot_fpo.validate_args(args)
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


def _peak(state: Dict[str, Any]) -> Tuple[Optional[float], Optional[int]]:
    """eq:peak: the best finite evaluation of a run and its update (the earliest on ties)."""
    curve = {k: v for k, v in state["curve"].items() if math.isfinite(v)}
    if not curve:
        return None, None
    best = max(curve, key=lambda k: (curve[k], -k))
    return curve[best], best


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
    ray, started = _connect(spec)
    try:
        resources = _resources(spec, trainer, base, ray)
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
                            "trainer": trainer,
                            "pid_file": str(folder / "workers" / f"{arm}__to{rung * per}"),
                            "args": _arm_args(trainer, base, a, s, rung, budget, arms_dir),
                        }
                    )
            print(f"rung {rung * per} {unit}: {len(jobs)} segment(s) of {len(alive)} candidate(s)", flush=True)
            done, failed = _run_segments(jobs, spec, ray, resources)
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
                peak, at = _peak(st)
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
                "run_info": _run_info(ray, resources, t_start),
            }
        )
        _write_json(result, path)
        return result
    finally:
        if started:
            ray.shutdown()


def _run_info(ray, resources: Dict[str, float], t_start: float) -> Dict[str, Any]:
    info: Dict[str, Any] = {"executor": "in-process" if ray is None else "ray", "wall_s": time.time() - t_start}
    if ray is not None:
        info.update(resources, nodes=sum(1 for n in ray.nodes() if n.get("Alive")))
    return info


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
FINAL = ("finished", "stopped", "nonfinite")  # statuses of a run that has ended


CIFAR_TARGETS = ("v", "x0", "eps")  # eq:targets
CIFAR_ESTIMATORS = ("q+a", "q+Z", "explicit")  # tab:sampling
CIFAR_RULES = ("static-direct", "online-ema", "online-refit")  # tab:online-full, at the --train settings
TIE_TOLERANCE = 0.003  # tab:sampling's W/T/L tie tolerance on paired peak differences
PROFILE_AXES = ("alphas", "targets", "schedules", "etas", "rules", "refit_etas")  # each entry is one profile


def _distinct(flag: str, values: Sequence[Any], allowed: Optional[Sequence[str]] = None, numbers=False) -> List[Any]:
    """`values` of the grid axis --`flag`, checked: distinct, each one of `allowed` or a finite number."""
    if len(set(values)) != len(values):
        raise ValueError(f"--{flag} {list(values)} must be distinct")
    for v in values:
        if allowed is not None and v not in allowed:
            raise ValueError(f"--{flag} {v!r} is not allowed: choose from {', '.join(allowed)}")
        if numbers and not math.isfinite(v):
            raise ValueError(f"--{flag} {v!r} is not allowed: give finite numbers")
    return list(values)


def _schedule(text: str) -> Dict[str, Any]:
    """`alpha_early:alpha_late:k0:k1` -> the trainer's schedule settings (app:schedules)."""
    parts = text.split(":")
    try:
        early, late, k0, k1 = float(parts[0]), float(parts[1]), int(parts[2]), int(parts[3])
        ok = len(parts) == 4 and math.isfinite(early) and math.isfinite(late) and 0 <= k0 <= k1
    except (ValueError, IndexError):
        ok = False
    if not ok:
        raise ValueError(
            f"--schedules {text!r} is not allowed: give alpha_early:alpha_late:k0:k1 with 0 <= k0 <= k1, "
            "e.g. -3:-0.5:160:260"
        )
    return {"weighting": "schedule", "alpha_early": early, "alpha_late": late, "k0": k0, "k1": k1}


def cifar_cells(spec: CifarGrid) -> List[Dict[str, Any]]:
    """The cells of a CIFAR grid in order: every profile (alphas, targets, schedules, etas, rules,
    refit_etas, in that order), crossed with every g (--gs) and every estimator (--estimators).
    Each cell is {"cell": its name in run folders, "alpha": the exponent label of a fixed-alpha profile
    else None, "settings": the trainer settings it sets}. A grid over alphas alone keeps the names
    `alpha<+a>`; g and the estimator join a name (`__g0.5`, `__q+Z`) only when they are swept."""
    given = [ax for ax in PROFILE_AXES if getattr(spec, ax)]
    alphas = list(spec.alphas) if spec.alphas or given else list(CIFAR_ALPHAS)
    profiles = []
    for a in _distinct("alphas", [float(a) for a in alphas], numbers=True):
        settings = {"weighting": "fixed", "target": None, "alpha": a}
        profiles.append((f"alpha{a:+g}", fmt_label(a), settings))
    for t in _distinct("targets", list(spec.targets), CIFAR_TARGETS):
        profiles.append((t, None, {"weighting": "fixed", "target": t}))
    for text in _distinct("schedules", list(spec.schedules)):
        profiles.append((None, None, _schedule(text)))
    for eta in _distinct("etas", [float(e) for e in spec.etas], numbers=True):
        profiles.append((None, None, {"weighting": "static-softmax", "eta": eta}))
    for rule in _distinct("rules", list(spec.rules), CIFAR_RULES):
        profiles.append((None, None, {"weighting": rule}))
    for eta in _distinct("refit-etas", [float(e) for e in spec.refit_etas], numbers=True):
        profiles.append((None, None, {"weighting": "online-refit", "refit_eta": eta}))
    gs = _distinct("gs", [float(g) for g in spec.gs], numbers=True)
    bad = [g for g in gs if g <= 0]
    if bad:
        raise ValueError(f"--gs {bad[0]:g} is not allowed: scales g must be > 0")
    estimators = _distinct("estimators", list(spec.estimators), CIFAR_ESTIMATORS)
    cells = []
    for name, alpha, settings in profiles:
        if name is None:  # the trainer's own label: static-softmax-eta1, online-refit-eta0.5, ...
            name = cifar_fpo.weighting_label(replace(spec.train, **settings, g=1.0, estimator="q+a"))
        for g in gs or [None]:
            for est in estimators or [None]:
                cell = name + ("" if g is None else f"__g{g:g}") + ("" if est is None else f"__{est}")
                extra = ({} if g is None else {"g": g}) | ({} if est is None else {"estimator": est})
                cells.append({"cell": cell, "alpha": alpha, "settings": {**settings, **extra}})
    return cells


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
        cells = cifar_cells(spec)
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
        robot_fpo.validate_args(base)
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
    ray, started = _connect(spec)

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
        resources = _resources(spec, trainer, base, ray)
        t_start = time.time()
        grid = [(t, c, s) for t in tasks for c in cells for s in seeds]
        jobs = []
        for t, c, s in grid:
            arm = arm_name(t, c, s)
            st = arm_state(arms_dir / arm, SCORE_KEY[trainer])
            if st["status"] in FINAL:
                continue
            jobs.append(
                {"key": arm, "trainer": trainer, "pid_file": str(folder / "workers" / arm), "args": arm_args(t, c, s)}
            )
        print(f"grid {name}: {len(jobs)} of {len(grid)} run(s) to train", flush=True)
        if pack > 1 and jobs:
            jobs = _pack_jobs(jobs, pack, folder)
            print(f"  in {len(jobs)} pack(s) of up to {pack} runs", flush=True)
        _, failed = _run_segments(jobs, spec, ray, resources)
        runs, trained = [], 0
        for t, c, s in grid:
            arm = arm_name(t, c, s)
            st = arm_state(arms_dir / arm, SCORE_KEY[trainer])
            peak, at = _peak(st)
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
            "run_info": {**_run_info(ray, resources, t_start), "pack": pack},
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
        packs.append({"key": arms[0], "arms": arms, "trainer": "cifar", "args": args, "pid_file": pid_file})
    return packs


def _mean_sd(vals: Sequence[float]) -> Tuple[Optional[float], Optional[float]]:
    """Mean and sample SD (ddof 1) of `vals`; None where undefined."""
    return (float(np.mean(vals)) if vals else None, float(np.std(vals, ddof=1)) if len(vals) > 1 else None)


def peak_table(runs: Sequence[Dict[str, Any]], seeds: Sequence[int]) -> List[Dict[str, Any]]:
    """Per (task, cell): each seed's per-run peak (eq:peak) and final reward (the validation reward at the
    budget's last update; missing for a run that stopped earlier), then the mean and sample SD over seeds.
    Peaks average the runs that ended (finished, early-stopped or non-finite; a non-finite run keeps the
    peak it reached), as the paper reports them; runs that failed (raised, or their worker kept dying)
    are listed by name, not averaged, and non-finite runs are listed by name too. `mean`, `sd` and `n`
    are the peak's; `final_mean`, `final_sd` and `final_n` the final reward's."""
    rows: Dict[Tuple[str, str], Dict[str, Any]] = {}
    for r in runs:
        row = rows.setdefault(
            (r["task"], r["cell"]),
            {
                "task": r["task"],
                "cell": r["cell"],
                "alpha": r["alpha"],
                **({"settings": r["settings"]} if "settings" in r else {}),
                "peaks": {},
                "finals": {},
                "nonfinite": [],
                "failed": [],
                "nonfinite_runs": [],
                "failed_runs": [],
            },
        )
        if r["failed"] or r["status"] not in FINAL or r["peak"] is None:
            row["failed"].append(r["seed"])
            row["failed_runs"].append(r.get("name", Path(r["run"]).name))
            continue
        row["peaks"][str(r["seed"])] = r["peak"]
        if r.get("final") is not None:
            row["finals"][str(r["seed"])] = r["final"]
        if r["status"] == "nonfinite":
            row["nonfinite"].append(r["seed"])
            row["nonfinite_runs"].append(r.get("name", Path(r["run"]).name))
    out = []
    for row in rows.values():
        peaks = [row["peaks"][str(s)] for s in seeds if str(s) in row["peaks"]]
        finals = [row["finals"][str(s)] for s in seeds if str(s) in row["finals"]]
        mean, sd = _mean_sd(peaks)
        final_mean, final_sd = _mean_sd(finals)
        row.update(n=len(peaks), mean=mean, sd=sd, final_n=len(finals), final_mean=final_mean, final_sd=final_sd)
        out.append(row)
    return out


def paired_estimators(runs: Sequence[Dict[str, Any]], estimators: List[str]) -> List[Dict[str, Any]]:
    """tab:sampling: per task and estimator after the first, the peak differences (the first estimator
    minus this one, as the table's q - explicit) over the (profile, g, seed) pairs where both runs have a
    peak; mean and sample SD, n and wins/ties/losses of the first with tie tolerance TIE_TOLERANCE."""
    peaks = {
        (r["task"], r["settings"]["estimator"], r["cell"].rsplit("__", 1)[0], r["seed"]): r["peak"]
        for r in runs
        if not r["failed"] and r["peak"] is not None and r["status"] in FINAL
    }
    out = []
    for task in dict.fromkeys(r["task"] for r in runs):
        for est in estimators[1:]:
            diffs = [
                peaks[(task, estimators[0], prof, seed)] - v
                for (t, e, prof, seed), v in peaks.items()
                if t == task and e == est and (task, estimators[0], prof, seed) in peaks
            ]
            mean, sd = _mean_sd(diffs)
            out.append(
                {
                    "task": task,
                    "estimator": est,
                    "versus": estimators[0],
                    "n": len(diffs),
                    "mean": mean,
                    "sd": sd,
                    "wins": sum(d > TIE_TOLERANCE for d in diffs),
                    "ties": sum(abs(d) <= TIE_TOLERANCE for d in diffs),
                    "losses": sum(d < -TIE_TOLERANCE for d in diffs),
                }
            )
    return out


def _pm(mean: Optional[float], sd: Optional[float]) -> str:
    return "-" if mean is None else f"{mean:.6f}" + ("" if sd is None else f" ± {sd:.6f}")


def grid_markdown(result: Dict[str, Any]) -> str:
    """The per-cell table of a grid as Markdown: one row per (task, cell), the peak's and the final
    reward's mean ± SD over seeds, then one column per seed (its peak)."""
    seeds, budget = result["config"]["seeds"], result["config"]["budget"]
    only_alphas = all(row["alpha"] is not None and "__" not in row["cell"] for row in result["table"])
    head = ["Task", "alpha" if only_alphas else "Cell", "n", "Peak mean ± SD"]
    head += [f"Final ({budget}) mean ± SD"] + [f"seed {s}" for s in seeds] + ["Notes"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in result["table"]:
        final = _pm(row["final_mean"], row["final_sd"]) + (
            f" (n={row['final_n']})" if row["final_n"] != row["n"] else ""
        )
        cells = [f"{row['peaks'][str(s)]:.6f}" if str(s) in row["peaks"] else "failed" for s in seeds]
        notes = "; ".join(
            ([f"non-finite: {', '.join(row['nonfinite_runs'])}"] if row["nonfinite_runs"] else [])
            + ([f"failed: {', '.join(row['failed_runs'])}"] if row["failed_runs"] else [])
        )
        label = row["alpha"] if only_alphas else row["cell"]
        lines.append(
            "| "
            + " | ".join([row["task"], label, str(row["n"]), _pm(row["mean"], row["sd"]), final] + cells + [notes])
            + " |"
        )
    text = "\n".join(lines) + (
        f"\n\nPeak: the best evaluation of a run (eq:peak); final: the validation reward at update {budget} "
        "(the budget); mean and sample SD over seeds.\n"
    )
    if result.get("paired"):
        rows = [
            [
                p["task"],
                f"{p['versus']} - {p['estimator']}",
                str(p["n"]),
                _pm(p["mean"], p["sd"]),
                f"{p['wins']}/{p['ties']}/{p['losses']}",
            ]
            for p in result["paired"]
        ]
        text += "\nPaired by seed (tab:sampling; W/T/L with tie tolerance " + f"{TIE_TOLERANCE:g}):\n\n"
        text += "| Task | Peak difference | Pairs | Mean ± SD | W/T/L |\n|---|---|---|---|---|\n"
        text += "".join("| " + " | ".join(r) + " |\n" for r in rows)
    for f in result["failures"]:
        text += f"\nFailed: {f['name']}: {f['failed']}"
    return text + ("\n" if result["failures"] else "")


def print_grid(result: Dict[str, Any]) -> None:
    print(grid_markdown(result))
    c = result["cost"]
    print(f"{c['runs']} runs, {c['trained']} updates = {c['C']:g} full runs")


# ---------------------------------------------------------------------------------------------
# Replay over recorded curves
# ---------------------------------------------------------------------------------------------
def _running_peaks(curves: Mapping[Any, Any], steps: Sequence[float]) -> Tuple[List[Any], np.ndarray, np.ndarray]:
    """Validate the replay input; return (labels, running peaks (K, S, E), steps)."""
    labels = list(curves)
    if len(labels) < 1:
        raise ValueError("curves is empty; give at least one candidate")
    steps = np.asarray(steps, dtype=np.float64)
    if steps.ndim != 1 or steps.size < 1 or not np.all(np.isfinite(steps)) or np.any(np.diff(steps) <= 0):
        raise ValueError(f"steps {steps.tolist()} must be a strictly increasing list of finite numbers")
    arrays = []
    for a in labels:
        x = np.asarray(curves[a], dtype=np.float64)
        if x.ndim == 1:
            x = x[None, :]
        if x.ndim != 2 or x.shape[1] != steps.size:
            raise ValueError(
                f"curve of candidate {a!r} has shape {np.shape(curves[a])}; expected (seeds, {steps.size})"
            )
        arrays.append(x)
    n_seeds = {x.shape[0] for x in arrays}
    if len(n_seeds) != 1 or 0 in n_seeds:
        raise ValueError(f"candidates have {sorted(n_seeds)} seeds; all need the same positive number (paired draws)")
    x = np.stack(arrays)  # (K, S, E)
    if np.any(np.isinf(x)):
        raise ValueError("curves hold infinite values; use NaN for missing evaluations")
    peaks = np.fmax.accumulate(np.where(np.isnan(x), -np.inf, x), axis=2)
    if not np.all(np.isfinite(peaks[:, :, -1])):
        bad = [labels[k] for k in range(len(labels)) if not np.all(np.isfinite(peaks[k, :, -1]))]
        raise ValueError(f"candidates {bad} have a seed without any finite evaluation")
    return labels, peaks, steps


def _select(scores: np.ndarray, cuts: Sequence[int], priority: Sequence[int]) -> Tuple[int, bool]:
    """One halving run on drawn-mean peaks ``scores`` (K, E): cut at evaluation indices ``cuts``,
    then rank at the last index. Ties are broken by ``priority`` (lower first). Returns the
    winner and whether any tie decided a selection."""
    alive = list(range(scores.shape[0]))
    tie = False
    for j in cuts:
        if len(alive) == 1:
            break
        keep = keep_count(len(alive))
        order = sorted(alive, key=lambda c: (-scores[c, j], priority[c]))
        tie |= bool(scores[order[keep - 1], j] == scores[order[keep], j])
        alive = order[:keep]
    order = sorted(alive, key=lambda c: (-scores[c, -1], priority[c]))
    if len(order) > 1:
        tie |= bool(scores[order[0], -1] == scores[order[1], -1])
    return order[0], tie


def replay(
    curves: Mapping[Any, Any], steps: Sequence[float], n_draw: int, first_cut: Optional[float]
) -> Dict[str, Any]:
    """Successive-halving replay over recorded curves (app:halving-robotics, app:search-settings).

    Args:
        curves: candidate -> array (seeds, evaluations); row i of every candidate is the same
            training seed. NaN marks a missing evaluation.
        steps: the evaluation points (increasing); the last one is the full budget H.
        n_draw: seeds per draw n; all S^n ordered draws with replacement are enumerated.
        first_cut: first cut X as a fraction of H (cuts X, 2X, 4X, ... < 1), or None for
            exhaustive search (every candidate trained to H, ranked there).

    Returns a dict with the selection ``probabilities`` (floats) and ``probabilities_exact``
    (fractions as text), ``pbar`` (mean full-budget peak per candidate), ``selected_score`` =
    sum_alpha pi(alpha) Pbar(alpha), ``oracle`` = max_alpha Pbar(alpha) and its ``oracle_candidate``,
    ``draw_range`` (smallest and largest Pbar of a selected candidate over draws), the ``cuts``
    used (target fraction and evaluation step), ``cost`` C, ``cost_per_replicate`` C/n,
    ``exhaustive_cost`` K n and ``fraction`` C/(K n). See the module docstring for the rules.
    """
    labels, peaks, steps = _running_peaks(curves, steps)
    if not (isinstance(n_draw, (int, np.integer)) and n_draw >= 1):
        raise ValueError(f"n_draw={n_draw!r} must be an integer >= 1")
    k, s, _ = peaks.shape
    if s**n_draw > 2_000_000:
        raise ValueError(f"{s}^{n_draw} draws is too many to enumerate; use a smaller n_draw")
    horizon = steps[-1]
    cuts, cut_info = [], []
    for frac in cut_fractions(first_cut):
        target = frac * horizon
        idx = np.nonzero(steps <= target + 1e-9 * max(abs(horizon), 1.0))[0]
        if idx.size == 0:
            raise ValueError(f"cut at {100 * frac:g}% = {target:g} lies before the first evaluation at {steps[0]:g}")
        cuts.append(int(idx[-1]))
        cut_info.append({"target": frac, "step": float(steps[idx[-1]])})

    # cost: the number alive at each cut is fixed by K, so it does not depend on the draw
    alive, spent = k, 0.0
    for j in cuts:
        if alive == 1:
            break
        keep = keep_count(alive)
        spent += (alive - keep) * steps[j]
        alive = keep
    spent += alive * horizon
    cost = n_draw * spent / horizon

    pbar = peaks[:, :, -1].mean(axis=1)
    counts = [Fraction(0)] * k
    lo, hi = math.inf, -math.inf
    perms = None
    for draw in itertools.product(range(s), repeat=n_draw):
        scores = peaks[:, list(draw), :].mean(axis=1)  # (K, E): mean over drawn seeds of the peaks so far
        winner, tie = _select(scores, cuts, list(range(k)))
        if not tie:
            outcome = {winner: Fraction(1)}
        else:
            if perms is None:
                perms = list(itertools.permutations(range(k)))
            tally: Dict[int, int] = {}
            for order in perms:
                priority = [0] * k
                for pos, c in enumerate(order):
                    priority[c] = pos
                w, _ = _select(scores, cuts, priority)
                tally[w] = tally.get(w, 0) + 1
            outcome = {w: Fraction(n, len(perms)) for w, n in tally.items()}
        for w, p in outcome.items():
            counts[w] += p
            lo, hi = min(lo, float(pbar[w])), max(hi, float(pbar[w]))
    total = s**n_draw
    probs = [c / total for c in counts]
    selected = float(sum(float(p) * float(pbar[i]) for i, p in enumerate(probs)))
    best = int(np.argmax(pbar))
    return {
        "candidates": labels,
        "n_draw": int(n_draw),
        "draws": total,
        "first_cut": None if first_cut is None else float(first_cut),
        "cuts": cut_info,
        "probabilities": {a: float(p) for a, p in zip(labels, probs)},
        "probabilities_exact": {a: str(p) for a, p in zip(labels, probs)},
        "pbar": {a: float(v) for a, v in zip(labels, pbar)},
        "selected_score": selected,
        "oracle": float(pbar[best]),
        "oracle_candidate": labels[best],
        "draw_range": [lo, hi],
        "cost": float(cost),
        "cost_per_replicate": float(cost / n_draw),
        "exhaustive_cost": float(k * n_draw),
        "fraction": float(cost / (k * n_draw)),
    }


# ---------------------------------------------------------------------------------------------
# Run folders -> curves
# ---------------------------------------------------------------------------------------------
def _run_folders(paths: Sequence[str]) -> List[Path]:
    out = []
    for p in paths:
        p = Path(p)
        if (p / "metrics.jsonl").is_file() and (p / "args.json").is_file():
            out.append(p)
        elif p.is_dir():
            found = sorted(q.parent for q in p.rglob("metrics.jsonl") if (q.parent / "args.json").is_file())
            if not found:
                raise ValueError(f"{str(p)!r} holds no run folder (args.json + metrics.jsonl)")
            out.extend(found)
        else:
            raise ValueError(f"{str(p)!r} is not a run folder or a folder of run folders")
    return out


def read_run(folder: Path, unit: str = "updates") -> Dict[str, Any]:
    """Task, candidate label, seed and evaluation curve {step: value} of a cifar_fpo.py or
    robot_fpo.py run folder, from its args.json and metrics.jsonl."""
    if unit not in ("updates", "steps"):
        raise ValueError(f"unit {unit!r} is not one of updates, steps")
    args = json.loads((folder / "args.json").read_text())
    if "env_id" in args:  # robot_fpo.py
        trainer = "robot"
        scheduled = args.get("alpha_early") is not None or args.get("alpha_late") is not None
        exponent = args["alpha_eps"] if args["objective"] == "fpo" else args["alpha"]
        label = "schedule" if scheduled else fmt_label(exponent)
        task = f"{args['env_id']} {args['objective']}"
    elif "reward" in args:  # cifar_fpo.py
        trainer = "cifar"
        if unit != "updates":
            raise ValueError(f"unit {unit!r}: CIFAR runs count updates only")
        if args["weighting"] == "fixed":
            label = args["target"] if args.get("target") else fmt_label(args["alpha"])
        else:
            label = args["weighting"]
        task = args["reward"]
    else:
        raise ValueError(f"{folder}/args.json is neither a cifar_fpo.py nor a robot_fpo.py run")
    key, score = ("global_step" if unit == "steps" else "update"), SCORE_KEY[trainer]
    curve = {float(r[key]): float(r[score]) for r in read_jsonl(folder / "metrics.jsonl") if r.get(score) is not None}
    if not curve:
        raise ValueError(f"{folder} has no evaluation records in metrics.jsonl")
    return {"task": task, "label": label, "seed": int(args["seed"]), "curve": curve, "folder": str(folder)}


def runs_to_curves(
    paths: Sequence[str], unit: str = "updates", task: Optional[str] = None, until: Optional[float] = None
) -> Dict[str, Any]:
    """Collect run folders of one task into the replay's input.

    Runs are grouped by candidate (exponent, target or weighting rule) and seed; repeated runs
    of one candidate and seed are averaged pointwise over the evaluations they share
    (app:halving-robotics). The evaluation grid is the union of all runs' points up to `until`
    (all of them by default); a point a run did not record is NaN. Every candidate needs the same seeds.
    """
    runs = [read_run(f, unit) for f in _run_folders(paths)]
    if until is not None:  # a common budget for runs that were cut at different points
        for r in runs:
            r["curve"] = {st: v for st, v in r["curve"].items() if st <= until}
    tasks = sorted({r["task"] for r in runs})
    if len(tasks) != 1:
        raise ValueError(f"runs of several tasks {tasks}; convert one task at a time")
    groups: Dict[Tuple[str, int], List[Dict[float, float]]] = {}
    for r in runs:
        groups.setdefault((r["label"], r["seed"]), []).append(r["curve"])
    labels = sorted({lab for lab, _ in groups}, key=_label_key)
    seeds = sorted({s for _, s in groups})
    missing = [f"{lab}/seed {s}" for lab in labels for s in seeds if (lab, s) not in groups]
    if missing:
        raise ValueError(f"candidates need the same seeds; missing runs: {', '.join(missing)}")
    steps = sorted({st for curves in groups.values() for c in curves for st in c})
    table = {}
    for lab in labels:
        rows = []
        for s in seeds:
            row = []
            for st in steps:
                vals = [c[st] for c in groups[(lab, s)] if st in c]
                row.append(float(np.mean(vals)) if vals else None)
            rows.append(row)
        table[lab] = rows
    native = "1" if "1" in labels else None
    return {
        "task": task or tasks[0],
        "unit": unit,
        "steps": steps,
        "seeds": seeds,
        "native": native,
        "runs": {lab: sum(len(groups[(lab, s)]) for s in seeds) for lab in labels},
        "curves": table,
    }


def _label_key(label: str):
    try:
        return (0, float(label), "")
    except ValueError:
        return (1, 0.0, label)


def load_curves(path: str) -> Dict[str, Any]:
    """Read a curves JSON file ({"steps", "curves": {label: [[...], ...]}, ...}); null -> NaN."""
    data = json.loads(Path(path).read_text())
    if "steps" not in data or "curves" not in data:
        raise ValueError(f"{path} lacks 'steps' or 'curves'; write it with `python halving.py curves`")
    data["curves"] = {
        str(k): np.array([[np.nan if v is None else v for v in row] for row in rows], dtype=np.float64)
        for k, rows in data["curves"].items()
    }
    data.setdefault("task", Path(path).stem)
    return data


def replay_sweep(data: Dict[str, Any], n_draw: int, first_cuts: Sequence[float]) -> List[Dict[str, Any]]:
    """`replay` at every first cut (percent) that lies on or after the first evaluation, then exhaustive."""
    out = []
    for pct in first_cuts:
        if not 0 < pct <= 100:
            raise ValueError(f"first cut {pct}% must be in (0, 100]")
        frac = pct / 100.0
        steps = data["steps"]
        if frac * steps[-1] < steps[0] - 1e-9 * abs(steps[-1]):
            out.append({"first_cut_pct": pct, "skipped": f"before the first evaluation at {steps[0]:g}"})
            continue
        out.append({"first_cut_pct": pct, **replay(data["curves"], steps, n_draw, frac)})
    out.append({"first_cut_pct": None, **replay(data["curves"], data["steps"], n_draw, None)})
    return out


def _prob_text(res: Dict[str, Any]) -> str:
    parts = [(a, p) for a, p in res["probabilities_exact"].items() if p != "0"]
    return "; ".join(f"{a}: {p}" for a, p in sorted(parts, key=lambda t: _label_key(t[0])))


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]

    def line(r):
        return "  ".join(str(x).rjust(w) if i else str(x).ljust(w) for i, (x, w) in enumerate(zip(r, widths)))

    return "\n".join([line(header), "  ".join("-" * w for w in widths)] + [line(r) for r in rows])


def choice_table(entries: Sequence[Tuple[str, Optional[str], Dict[str, Any]]]) -> str:
    """tab:halving-choice: per task (name, native label, replay result) the native, selected and
    oracle scores, selected minus native and the gap, then the selection probabilities."""
    top, bottom = [], []
    for task, native, res in entries:
        nat = res["pbar"].get(native) if native is not None else None
        delta = f"{res['selected_score'] - nat:+.6f}" if nat is not None else "-"
        top.append(
            [
                task,
                f"{nat:.6f}" if nat is not None else "-",
                f"{res['selected_score']:.6f}",
                f"{res['oracle']:.6f}",
                delta,
                f"{res['oracle'] - res['selected_score']:.6f}",
            ]
        )
        bottom.append([task, _prob_text(res), str(res["oracle_candidate"]), f"{100 * res['fraction']:.4f}%"])
    return (
        _table(["Task", "Native", "Selected", "Oracle", "Delta", "Gap"], top)
        + "\n\n"
        + _table(["Task", "Exponent: probability", "Oracle exponent", "Search / exhaustive"], bottom)
    )


def budget_table(entries: Sequence[Tuple[str, List[Dict[str, Any]]]]) -> str:
    """tab:halving-budgets: per task and first cut the selected score, the exact draw range and C."""
    rows = []
    for task, sweep in entries:
        for res in sweep:
            cut = "Full search" if res["first_cut_pct"] is None else f"{res['first_cut_pct']:g}%"
            if "skipped" in res:
                rows.append([task, cut, "-", res["skipped"], "-"])
                continue
            lo, hi = res["draw_range"]
            rows.append([task, cut, f"{res['selected_score']:.2f}", f"[{lo:.2f}, {hi:.2f}]", f"{res['cost']:.4f}"])
    return _table(["Task", "First cut", "Selected score", "Exact draw range", "C"], rows)


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
    trainer = cifar_fpo if cls in (CifarTournament, CifarGrid) else robot_fpo
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
