"""The arms of a sweep (halving.py's tournaments and grids): where they run and how one segment trains.

A segment of an arm (from its checkpoint up to a rung, or to the end for a grid) is one call of
`run_segment` with the trainer's entry point (``main(args)``) passed in; `run_pack_segment` trains
several CIFAR arms batched in one process. `run_segments` runs a list of segments one after another
here, or submits them together as Ray tasks (`connect_ray` joins or starts Ray) that Ray places on free
resources of one machine or a cluster. Each segment continues from its run folder's checkpoint, so a
segment re-run after its worker died resumes where the arm's last checkpoint left it, and the results
do not depend on where or how many at once arms ran. Nothing here imports a trainer: Ray workers
import this module and the trainer's module by name.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch

from fpo_utils.grids import FINAL
from fpo_utils.runfolder import CHECKPOINT, read_jsonl

ROOT = Path(__file__).resolve().parents[1]  # the repository: Ray workers get it on their PYTHONPATH


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


# ---------------------------------------------------------------------------------------------
# One arm segment (a Ray task, or a call in this process)
# ---------------------------------------------------------------------------------------------
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


def run_segment(
    train: Callable[[Any], Any], args, score_key: str, threads: int = 0, pid_file: Optional[str] = None
) -> Dict[str, Any]:
    """Train one arm segment with the trainer's entry point `train` (``main(args)``) and return the arm's
    state (`arm_state`, ranked by `score_key`).

    `args` are the trainer's Args for the segment's end (CIFAR: `until`; robots: `num_updates`). The
    segment continues from the run folder's checkpoint when there is one, so a segment re-run after
    its worker died resumes where the arm's last checkpoint left it. A trainer that sets its own torch
    threads (robots: `torch_threads`) gets `threads` there too. `pid_file` gets one line
    "host pid node" per attempt (Ray retries show up as extra lines)."""
    folder = Path(args.runs_dir) / args.run_name
    _note_worker(pid_file)
    args = replace(args, resume=(folder / CHECKPOINT).exists())
    if threads > 0 and "torch_threads" in args.__dataclass_fields__:
        args = replace(args, torch_threads=threads)
    old = torch.get_num_threads()
    if threads > 0:
        torch.set_num_threads(threads)
    try:
        train(args)
    finally:
        torch.set_num_threads(old)
    state = arm_state(folder, score_key)
    if state["status"] == "interrupted":
        raise ArmInterrupted(f"{args.run_name} interrupted at update {state['updates_done']}")
    return state


def run_pack_segment(
    train_pack: Callable[..., Any], args_list, score_key: str, threads: int = 0, pid_file: Optional[str] = None
) -> Dict[str, Any]:
    """Train the CIFAR arms of one pack together in this process with the pack trainer's entry point
    `train_pack` (cifar_fpo_pack.main(args_list, failures=...)), each continued from its run folder's
    checkpoint as `run_segment` continues one arm; arms that already ended are left out. Returns
    {"states": {arm: state}, "failed": {arm: reason}}: an arm that cannot start (a corrupt checkpoint,
    say) is failed and the others train."""
    _note_worker(pid_file)
    todo = []
    for args in args_list:
        folder = Path(args.runs_dir) / args.run_name
        if arm_state(folder, score_key)["status"] not in FINAL:
            todo.append(replace(args, resume=(folder / CHECKPOINT).exists()))
    failed: Dict[str, str] = {}
    old = torch.get_num_threads()
    if threads > 0:
        torch.set_num_threads(threads)
    try:
        if todo:
            train_pack(todo, failures=failed)
    finally:
        torch.set_num_threads(old)
    states = {
        a.run_name: arm_state(Path(a.runs_dir) / a.run_name, score_key) for a in args_list if a.run_name not in failed
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


# ---------------------------------------------------------------------------------------------
# Where segments run: Ray tasks, or one after another in this process
# ---------------------------------------------------------------------------------------------
def connect_ray(spec: Sweep):
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


def arm_resources(spec: Sweep, trainer: str, base, ray) -> Dict[str, float]:
    """Ray resources of one arm of a `trainer` ("cifar" or "robot") with settings `base` (see
    `Sweep.gpus_per_arm`, `Sweep.cpus_per_arm`)."""
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


def run_segments(
    jobs: List[Dict[str, Any]], spec: Sweep, ray, resources: Dict[str, float]
) -> Tuple[Dict[str, Dict[str, Any]], Dict[str, str]]:
    """Run segments {"key", "train", "score_key", "args", "pid_file"} as Ray tasks (all submitted at
    once, Ray places them as resources free up) or one after another here. A pack job also names its
    "arms", holds their args as a list and the pack trainer's entry point as "train" (`run_pack_segment`).
    Returns ({arm: arm state}, {arm: failure reason})."""
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

    def call(job):
        return job["train"], job["args"], job["score_key"], spec.threads, job["pid_file"]

    if ray is None:
        for job in jobs:
            segment = run_pack_segment if "arms" in job else run_segment
            try:
                done(job, segment(*call(job)))
            except ArmInterrupted:
                raise KeyboardInterrupt from None  # Ctrl-C here: stop the sweep (re-run to continue)
            except Exception as err:  # a failing arm does not stop the sweep
                failed(job, _reason(err))
        return results, failures
    options = dict(max_retries=spec.max_retries, retry_exceptions=[ArmInterrupted], **resources)
    tasks = {False: ray.remote(run_segment).options(**options), True: ray.remote(run_pack_segment).options(**options)}
    refs = {tasks["arms" in job].remote(*call(job)): job for job in jobs}
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


def run_info(ray, resources: Dict[str, float], t_start: float) -> Dict[str, Any]:
    """Where a sweep ran: the executor, its wall time and (on Ray) the arm's resources and live nodes."""
    info: Dict[str, Any] = {"executor": "in-process" if ray is None else "ray", "wall_s": time.time() - t_start}
    if ray is not None:
        info.update(resources, nodes=sum(1 for n in ray.nodes() if n.get("Alive")))
    return info
