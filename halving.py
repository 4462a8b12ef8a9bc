"""Successive halving over timestep-weighting profiles: live tournaments and a replay over
recorded learning curves (sec:halving, app:halving, app:halving-robotics, app:search-settings).

Commands::

    python halving.py cifar                       # alpha in {-2,-1,0,1}, q+Z, rungs 200/400/800
    python halving.py cifar --rungs 20 40 80 --train.reward simclr
    python halving.py robot --alphas 0 .25 .5 1 --rungs 100 200 400 --train.env-id Walker2d-v5
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
    the eliminations, every arm's peak and the cost. Re-running the same command continues an
    interrupted tournament from the arms' checkpoints.

Parallel arms
    The arms of a rung run concurrently: by default one worker process per visible GPU (each
    sees a single GPU through ``CUDA_VISIBLE_DEVICES``), and on the CPU one arm after the other
    in this process; ``--processes P`` sets the number of workers (more than one on a GPU
    shares it). Each arm is a deterministic function of its own arguments, so the scores, the
    eliminations and the cost do not depend on the number of workers (on the CPU fix
    ``--threads`` so that every arm uses the same number of intra-op threads).

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

import concurrent.futures
import itertools
import json
import math
import os
import queue
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from fractions import Fraction
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import torch
import tyro

import cifar_fpo
import robot_fpo

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
# Live tournaments: arguments
# ---------------------------------------------------------------------------------------------
def _cifar_defaults() -> cifar_fpo.Args:
    return cifar_fpo.Args(estimator="q+Z", early_stop=False)  # app:halving


def _robot_defaults() -> robot_fpo.Args:
    return robot_fpo.Args()


@dataclass
class CifarTournament:
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
    name: Optional[str] = None
    """Tournament folder name under `out_dir`; default `halving__<reward>__<first seed>`."""
    out_dir: str = "runs"
    """Where tournament folders are written."""
    processes: Optional[int] = None
    """Arms trained at once: default one worker per visible GPU, and one arm at a time on the CPU."""
    threads: int = 0
    """torch intra-op threads per arm (0: leave torch's default)."""
    train: cifar_fpo.Args = field(default_factory=_cifar_defaults)
    """Settings shared by every arm (reward, model, batch, learning rate, ...). The tournament sets
    weighting=fixed, alpha, target, seed, num_updates, until, resume, run_name, runs_dir and turns early
    stopping off; the estimator defaults to q+Z (app:halving)."""


@dataclass
class RobotTournament:
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
    unit: str = "updates"
    """Unit of `rungs` and of the cost: `updates` or `steps` (environment steps; multiples of
    num_envs * num_steps)."""
    first_rung: Optional[int] = None
    """If set, rungs become N, 2N, 4N, ... below the full budget (last entry of --rungs), then the budget."""
    name: Optional[str] = None
    """Tournament folder name under `out_dir`; default `halving__<env>__<objective>__<first seed>`."""
    out_dir: str = "runs"
    """Where tournament folders are written."""
    processes: Optional[int] = None
    """Arms trained at once: default one worker per visible GPU (with --train.cuda), else one at a time."""
    threads: int = 0
    """torch intra-op threads per arm (0: leave the trainer's --train.torch-threads)."""
    train: robot_fpo.Args = field(default_factory=_robot_defaults)
    """Settings shared by every arm (environment, objective, rollout sizes, ...). The tournament sets
    the candidate exponent, seed, num_updates, resume, run_name and run_dir."""


# ---------------------------------------------------------------------------------------------
# Live tournaments: the two trainers
# ---------------------------------------------------------------------------------------------
def _trainer(spec) -> str:
    if isinstance(spec, CifarTournament):
        return "cifar"
    if isinstance(spec, RobotTournament):
        return "robot"
    raise ValueError(f"tournament spec of type {type(spec).__name__} is not one of CifarTournament, RobotTournament")


def _arm_name(alpha: float, seed: int) -> str:
    return f"alpha{float(alpha):+g}__seed{seed}"


def _check_spec(spec) -> Tuple[List[float], List[int], List[int], int, Any]:
    """Validate a tournament; return (alphas, seeds, rungs in updates, updates per unit, resolved args)."""
    trainer = _trainer(spec)
    alphas = [float(a) for a in spec.alphas]
    if not alphas or len(set(alphas)) != len(alphas) or not all(math.isfinite(a) for a in alphas):
        raise ValueError(f"--alphas {list(spec.alphas)} must be one or more distinct finite numbers")
    seeds = [int(s) for s in spec.seeds]
    if not seeds or len(set(seeds)) != len(seeds):
        raise ValueError(f"--seeds {list(spec.seeds)} must be one or more distinct integers")
    rungs = [int(r) for r in spec.rungs]
    if spec.first_rung is not None:
        if not rungs:
            raise ValueError("--first-rung needs the full budget as the last entry of --rungs")
        rungs = halving_rungs(int(spec.first_rung), rungs[-1])
    if not rungs or any(r < 1 for r in rungs) or any(b <= a for a, b in zip(rungs, rungs[1:])):
        raise ValueError(f"--rungs {rungs} must be strictly increasing positive integers (last = full budget)")
    if spec.processes is not None and spec.processes < 1:
        raise ValueError(f"--processes {spec.processes} must be >= 1")
    if spec.threads < 0:
        raise ValueError(f"--threads {spec.threads} must be >= 0")
    if trainer == "cifar":
        args = cifar_fpo.resolve_args(replace(spec.train, weighting="fixed", target=None, num_updates=rungs[-1],
                                              early_stop=False, seed=seeds[0]))
        bad = [r for r in rungs if r % args.val_every]
        if bad:
            raise ValueError(f"--rungs {bad} are not validation nodes; use multiples of --train.val-every {args.val_every}")
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
        raise ValueError(f"--rungs {bad} must fall on evaluation and checkpoint updates (multiples of "
                         f"--train.eval-every {args.eval_every} and --train.checkpoint-every {every})")
    if args.alpha_early is not None or args.alpha_late is not None:
        raise ValueError("--train.alpha-early/--train.alpha-late set a schedule; tournament candidates are fixed exponents")
    return alphas, seeds, upd, per, args


def _arm_args(trainer: str, base, alpha: float, seed: int, until: int, budget: int, arms_dir: Path, resume: bool):
    """The trainer arguments of one arm trained up to update `until`."""
    name = _arm_name(alpha, seed)
    if trainer == "cifar":
        return replace(base, weighting="fixed", target=None, alpha=float(alpha), seed=int(seed), early_stop=False,
                       num_updates=int(budget), until=int(until), resume=resume, run_name=name, runs_dir=str(arms_dir))
    exponent = {"alpha_eps": float(alpha)} if base.objective == "fpo" else {"alpha": float(alpha)}
    # total_timesteps is the full budget, so an annealed learning rate follows the same schedule
    # whether the arm runs straight through or is paused at rungs (robot_fpo anneals over it).
    return replace(base, **exponent, seed=int(seed), num_updates=int(until), resume=resume, run_name=name,
                   run_dir=str(arms_dir), total_timesteps=int(budget) * base.num_envs * base.num_steps)


def _read_jsonl(path: Path) -> List[Dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def arm_progress(trainer: str, folder: Path) -> Tuple[int, Optional[str], bool]:
    """(updates done, status, has checkpoint) of an arm's run folder."""
    ckpt = folder / "checkpoints" / ("last.pt" if trainer == "cifar" else "latest.pt")
    summary = folder / "summary.json"
    if not summary.exists():
        return 0, None, ckpt.exists()
    s = json.loads(summary.read_text())
    return int(s["updates_done"] if trainer == "cifar" else s["update"]), s.get("status"), ckpt.exists()


def arm_curve(trainer: str, folder: Path) -> Dict[int, float]:
    """Validation (CIFAR: pooled val_reward) or evaluation (robot: eval_return) value per update."""
    out: Dict[int, float] = {}
    for rec in _read_jsonl(folder / "metrics.jsonl"):
        if trainer == "cifar" and rec.get("kind") == "validation":
            out[int(rec["update"])] = float(rec["val_reward"])
        elif trainer == "robot" and rec.get("eval_return") is not None:
            out[int(rec["update"])] = float(rec["eval_return"])
    return out


# ---------------------------------------------------------------------------------------------
# Live tournaments: running arms in this process or in worker processes
# ---------------------------------------------------------------------------------------------
def _args_from_dict(trainer: str, d: Dict[str, Any]):
    cls = cifar_fpo.Args if trainer == "cifar" else robot_fpo.Args
    return cls(**{k: (tuple(v) if isinstance(v, list) else v) for k, v in d.items()})


def run_job(job: Dict[str, Any]) -> None:
    """Train one arm as described by ``job`` = {"trainer", "args" (a dict), "threads"}."""
    args = _args_from_dict(job["trainer"], job["args"])
    threads = int(job.get("threads", 0))
    old = torch.get_num_threads()
    if threads > 0:
        torch.set_num_threads(threads)
    try:
        if job["trainer"] == "cifar":
            cifar_fpo.main(args)
        else:
            if threads > 0:
                args = replace(args, torch_threads=threads)
            robot_fpo.main(args)
    finally:
        torch.set_num_threads(old)


def run_job_file(path: str) -> None:
    """Entry point of a worker process: run the job stored as JSON in ``path``."""
    run_job(json.loads(Path(path).read_text()))


def visible_gpus() -> List[str]:
    """Identifiers of the GPUs this process may use (for the workers' CUDA_VISIBLE_DEVICES)."""
    if not torch.cuda.is_available():
        return []
    n = torch.cuda.device_count()
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = [s.strip() for s in env.split(",") if s.strip()] if env else [str(i) for i in range(n)]
    return ids[:n]


def _wants_gpu(trainer: str, base) -> bool:
    if trainer == "cifar":
        return base.device == "auto" or base.device.startswith("cuda")
    return bool(base.cuda)


def _execute(jobs: List[Dict[str, Any]], processes: int, slots: List[Optional[str]], folder: Path) -> None:
    """Run jobs: in this process when ``processes == 1``, else in a pool of worker processes, each
    pinned to one entry of ``slots`` (a GPU id, or None for the CPU)."""
    if processes <= 1:
        for job in jobs:
            run_job(job)
        return
    (folder / "jobs").mkdir(parents=True, exist_ok=True)
    (folder / "logs").mkdir(parents=True, exist_ok=True)
    free: "queue.Queue[Optional[str]]" = queue.Queue()
    for s in slots[:processes]:
        free.put(s)

    def work(job):
        slot = free.get()
        try:
            name = job["args"]["run_name"]
            until = job["args"].get("until") or job["args"].get("num_updates")
            path = folder / "jobs" / f"{name}__to{until}.json"
            if slot is not None and job["trainer"] == "cifar":
                job = {**job, "args": {**job["args"], "device": "cuda"}}
            path.write_text(json.dumps(job, indent=2))
            env = dict(os.environ, PYTHONUNBUFFERED="1")
            env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in [env.get("PYTHONPATH")] if p])
            if slot is not None:
                env["CUDA_VISIBLE_DEVICES"] = slot
            code = "import sys, halving; halving.run_job_file(sys.argv[1])"
            log = folder / "logs" / f"{name}.log"
            with open(log, "a") as f:
                proc = subprocess.run([sys.executable, "-c", code, str(path)], env=env, stdout=f,
                                      stderr=subprocess.STDOUT)
            if proc.returncode != 0:
                tail = "\n".join(log.read_text().splitlines()[-15:])
                raise RuntimeError(f"arm {name} failed (exit {proc.returncode}); end of {log}:\n{tail}")
        finally:
            free.put(slot)

    with concurrent.futures.ThreadPoolExecutor(max_workers=processes) as pool:
        for fut in [pool.submit(work, job) for job in jobs]:
            fut.result()


# ---------------------------------------------------------------------------------------------
# Live tournaments: the procedure
# ---------------------------------------------------------------------------------------------
def _tournament_config(trainer, alphas, seeds, rungs_units, unit, args) -> Dict[str, Any]:
    train = {k: v for k, v in asdict(args).items()
             if k not in ("device", "cuda", "verbose", "save_samples", "run_name", "runs_dir", "run_dir", "until",
                          "resume", "seed", "alpha", "alpha_eps", "torch_threads")}
    return {"trainer": trainer, "alphas": alphas, "seeds": seeds, "rungs": rungs_units, "unit": unit, "train": train}


def run_tournament(spec) -> Dict[str, Any]:
    """Run (or continue) a live tournament; returns the content of its ``tournament.json``."""
    trainer = _trainer(spec)
    alphas, seeds, rungs, per, base = _check_spec(spec)
    unit = "updates" if trainer == "cifar" else spec.unit
    if spec.name is not None:
        name = spec.name
    elif trainer == "cifar":
        name = f"halving__{base.reward}__{seeds[0]}"
    else:
        name = f"halving__{base.env_id.replace('/', '_')}__{base.objective}__{seeds[0]}"
    folder = Path(spec.out_dir) / name
    arms_dir = folder / "arms"
    config = _tournament_config(trainer, alphas, seeds, [r * per for r in rungs], unit, base)
    config = json.loads(json.dumps(config))
    path = folder / "tournament.json"
    if path.exists():
        old = json.loads(path.read_text()).get("config")
        if old != config:
            raise ValueError(f"{folder} holds a different tournament; choose another --name or --out-dir")
    folder.mkdir(parents=True, exist_ok=True)

    gpus = visible_gpus() if _wants_gpu(trainer, base) else []
    processes = spec.processes or (len(gpus) if len(gpus) > 1 else 1)
    slots = [gpus[i % len(gpus)] for i in range(processes)] if gpus else [None] * processes
    budget = rungs[-1]
    t_start = time.time()
    result: Dict[str, Any] = {"config": config, "rounds": [], "status": "running"}

    def save():
        cifar_fpo.atomic_write_text(json.dumps(result, indent=2), path)

    save()
    alive = list(alphas)
    for i, rung in enumerate(rungs):
        final = i == len(rungs) - 1
        if len(alive) == 1 and not final:
            continue  # a lone survivor goes straight on to the full budget
        jobs = []
        for a in alive:
            for s in seeds:
                done, status, has_ckpt = arm_progress(trainer, arms_dir / _arm_name(a, s))
                if done >= rung or status == "nonfinite":
                    continue
                args = _arm_args(trainer, base, a, s, rung, budget, arms_dir, resume=has_ckpt)
                jobs.append({"trainer": trainer, "args": json.loads(json.dumps(asdict(args))), "threads": spec.threads})
        _execute(jobs, processes, slots, folder)
        per_seed = {}
        for a in alive:
            curves = [arm_curve(trainer, arms_dir / _arm_name(a, s)) for s in seeds]
            per_seed[a] = [c.get(rung, float("nan")) for c in curves]
        scores = {a: float(np.mean(v)) if all(math.isfinite(x) for x in v) else float("nan")
                  for a, v in per_seed.items()}
        ranking = rank_candidates(scores)
        finite = [a for a in ranking if math.isfinite(scores[a])]
        kept = finite[:1] if final else finite[:keep_count(len(alive))]
        result["rounds"].append({
            "rung": rung * per,
            "alive": [fmt_label(a) for a in alive],
            "scores": {fmt_label(a): scores[a] for a in alive},
            "per_seed": {fmt_label(a): per_seed[a] for a in alive},
            "ranking": [fmt_label(a) for a in ranking],
            "kept": [fmt_label(a) for a in kept],
            "eliminated": [fmt_label(a) for a in ranking if a not in kept],
        })
        save()
        alive = kept
        if not alive:
            break

    winner = alive[0] if alive else None
    arms, trained = {}, 0
    for a in alphas:
        reps = []
        for s in seeds:
            f = arms_dir / _arm_name(a, s)
            done, status, _ = arm_progress(trainer, f)
            curve = {k: v for k, v in arm_curve(trainer, f).items() if math.isfinite(v)}
            best = max(curve, key=lambda k: (curve[k], -k)) if curve else None
            reps.append({"seed": s, "run": str(f), "trained": done * per, "status": status,
                         "peak": curve[best] if curve else None, "peak_at": best * per if curve else None})
            trained += done
        peaks = [r["peak"] for r in reps]
        arms[fmt_label(a)] = {"peak": float(np.mean(peaks)) if None not in peaks else None, "replicates": reps}
    cost = trained / budget
    result.update({
        "status": "finished" if winner is not None else "failed",
        "winner": fmt_label(winner) if winner is not None else None,
        "winner_peak": arms[fmt_label(winner)]["peak"] if winner is not None else None,
        "arms": arms,
        "cost": {
            "trained": trained * per,
            "full_run": budget * per,
            "unit": unit,
            "C": cost,
            "cost_per_replicate": cost / len(seeds),
            "exhaustive": float(len(alphas) * len(seeds)),
            "fraction": cost / (len(alphas) * len(seeds)),
        },
        "run_info": {"processes": processes, "gpus": gpus, "wall_s": time.time() - t_start},
    })
    save()
    return result


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
    print(f"cost C = {c['trained']}/{c['full_run']} = {c['C']:g} full-run equivalents "
          f"(exhaustive {c['exhaustive']:g}; {100 * c['fraction']:.2f}%)" + (f"  -> {path}" if path else ""))


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
            raise ValueError(f"curve of candidate {a!r} has shape {np.shape(curves[a])}; expected (seeds, {steps.size})")
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


def replay(curves: Mapping[Any, Any], steps: Sequence[float], n_draw: int, first_cut: Optional[float]) -> Dict[str, Any]:
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
    if s ** n_draw > 2_000_000:
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
    total = s ** n_draw
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
    rows = _read_jsonl(folder / "metrics.jsonl")
    if "env_id" in args:  # robot_fpo.py
        scheduled = args.get("alpha_early") is not None or args.get("alpha_late") is not None
        exponent = args["alpha_eps"] if args["objective"] == "fpo" else args["alpha"]
        label = "schedule" if scheduled else fmt_label(exponent)
        key = "global_step" if unit == "steps" else "update"
        curve = {float(r[key]): float(r["eval_return"]) for r in rows if r.get("eval_return") is not None}
        task = f"{args['env_id']} {args['objective']}"
    elif "reward" in args:  # cifar_fpo.py
        if unit != "updates":
            raise ValueError(f"unit {unit!r}: CIFAR runs count updates only")
        if args["weighting"] == "fixed":
            label = args["target"] if args.get("target") else fmt_label(args["alpha"])
        else:
            label = args["weighting"]
        curve = {float(r["update"]): float(r["val_reward"]) for r in rows if r.get("kind") == "validation"}
        task = args["reward"]
    else:
        raise ValueError(f"{folder}/args.json is neither a cifar_fpo.py nor a robot_fpo.py run")
    if not curve:
        raise ValueError(f"{folder} has no evaluation records in metrics.jsonl")
    return {"task": task, "label": label, "seed": int(args["seed"]), "curve": curve, "folder": str(folder)}


def runs_to_curves(paths: Sequence[str], unit: str = "updates", task: Optional[str] = None) -> Dict[str, Any]:
    """Collect run folders of one task into the replay's input.

    Runs are grouped by candidate (exponent, target or weighting rule) and seed; repeated runs
    of one candidate and seed are averaged pointwise over the evaluations they share
    (app:halving-robotics). The evaluation grid is the union of all runs' points; a point a run
    did not record is NaN. Every candidate needs the same seeds.
    """
    runs = [read_run(f, unit) for f in _run_folders(paths)]
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
    return {"task": task or tasks[0], "unit": unit, "steps": steps, "seeds": seeds, "native": native,
            "runs": {lab: sum(len(groups[(lab, s)]) for s in seeds) for lab in labels}, "curves": table}


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
    data["curves"] = {str(k): np.array([[np.nan if v is None else v for v in row] for row in rows], dtype=np.float64)
                      for k, rows in data["curves"].items()}
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
        top.append([task, f"{nat:.6f}" if nat is not None else "-", f"{res['selected_score']:.6f}",
                    f"{res['oracle']:.6f}", delta, f"{res['oracle'] - res['selected_score']:.6f}"])
        bottom.append([task, _prob_text(res), str(res["oracle_candidate"]), f"{100 * res['fraction']:.4f}%"])
    return (_table(["Task", "Native", "Selected", "Oracle", "Delta", "Gap"], top) + "\n\n"
            + _table(["Task", "Exponent: probability", "Oracle exponent", "Search / exhaustive"], bottom))


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
    """Replay successive halving over recorded curves (app:halving-robotics, tab:halving-choice, tab:halving-budgets)."""

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


def main(argv: Optional[Sequence[str]] = None) -> Any:
    cmd = tyro.extras.subcommand_cli_from_dict(
        {"cifar": CifarTournament, "robot": RobotTournament, "replay": ReplayArgs, "curves": CurvesArgs},
        description=__doc__.split("\n\n")[0], args=argv)
    if isinstance(cmd, (CifarTournament, RobotTournament)):
        result = run_tournament(cmd)
        print_tournament(result)
        return result
    if isinstance(cmd, ReplayArgs):
        return run_replay(cmd)
    data = runs_to_curves(cmd.runs, cmd.unit, cmd.task)
    Path(cmd.out).write_text(json.dumps(data, indent=2))
    print(f"{data['task']}: {len(data['curves'])} candidates x {len(data['seeds'])} seeds x "
          f"{len(data['steps'])} evaluations -> {cmd.out}")
    return data


if __name__ == "__main__":
    try:
        main()
    except ValueError as err:  # bad input: one line naming the value and what is allowed
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
