"""Environment-only versus end-to-end steps per second of robot_fpo.py, side by side in one run.

Both measurements use the same environments (``fpo_utils.envs.make_envs``: same id, backend,
number of environments and envpool threads) in the same process:

- environment-only: ``num_updates * num_steps`` vectorised steps with uniform random actions in
  [-1, 1] through the trainer's environment object (the raw ``envpool`` rate, without the torch
  hand-over, is reported beside it for envpool ids);
- end-to-end: ``num_updates`` iterations of the trainer (``collect_rollout`` + ``update``), after
  one warm-up iteration (and CUDA-graph capture); evaluation, checkpoints and the environment
  restarts at checkpoint boundaries are not counted;
- evaluation (``--eval-runs N``): N times the trainer's evaluation at one evaluation point (for FPO++
  from x0 = 0 and from random x0, as robot_fpo.py logs both), on its own evaluation environments.

With ``--repeats R`` the two alternate R times and the reported ratio is the median of the R
ratios (a shared machine's speed drifts between runs). Target (issue: CPU path): end-to-end >= 70%
of environment-only on 16 cores. Settings come from a robot_fpo.py preset plus the overrides below.
Examples (pin cores with taskset to measure a given count)::

    # target: ratio >= 0.70
    taskset -c 0-15 python benchmarks/bench_robot_sps.py --env-id HalfCheetah-v5 --num-envs 2048 --cuda
    taskset -c 0-15 python benchmarks/bench_robot_sps.py --env-id CartpoleSwingup-v1 --num-envs 2048 --cuda
    taskset -c 0,1 python benchmarks/bench_robot_sps.py --env-id InvertedPendulum-v5 --num-envs 16
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from dataclasses import dataclass, replace
from typing import Literal

import torch
import tyro

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import robot_fpo  # noqa: E402
import robot_fpo_fast  # noqa: E402
from fpo_utils.envs import EnvpoolVecEnv, env_out_size  # noqa: E402
from fpo_utils.robot_bookkeeping import eval_inits, task_envs, validate_args  # noqa: E402


@dataclass
class BenchArgs:
    preset: Literal["default", "fpo", "fpopp", "fpopp-locomotion"] = "default"
    """robot_fpo.py preset whose settings are benchmarked"""
    env_id: str = "HalfCheetah-v5"
    """task id"""
    backend: Literal["auto", "envpool", "gymnasium", "playground"] = "auto"
    """environment backend (as robot_fpo.py --backend)"""
    num_envs: int = 0
    """parallel environments (0: the preset's)"""
    num_steps: int = 0
    """rollout length per environment (0: the preset's)"""
    objective: Literal["", "fpo", "fpopp"] = ""
    """objective of the end-to-end run (empty: the preset's)"""
    env_threads: int = 0
    """envpool threads (0: one per core)"""
    num_updates: int = 5
    """measured iterations per repeat"""
    repeats: int = 1
    """alternating environment-only / end-to-end measurement pairs"""
    torch_threads: int = 1
    """torch.set_num_threads (0 keeps the default)"""
    seed: int = 1
    """seed"""
    cuda: bool = False
    """networks on the GPU when one is present (rollout sampler on the GPU, CUDA-graph update)"""
    cuda_graph: bool = True
    """on the GPU, replay the update step as a CUDA graph"""
    compile: bool | None = None
    """torch.compile the update's losses (None: the preset's)"""
    bf16: bool = False
    """the trained actor's products in bfloat16 (robot_fpo_fast.py --bf16)"""
    eval_runs: int = 0
    """also time this many evaluation points (0: none)"""
    eval_episodes: int = 0
    """evaluation episodes (0: the preset's)"""
    json_out: str = ""
    """optional path of a JSON file with the numbers"""


class Timed:
    """Wraps a callable and accumulates the wall time spent in it."""

    def __init__(self, fn):
        self.fn, self.total = fn, 0.0

    def __getattr__(self, name):  # e.g. the sampler's refresh()
        return getattr(self.fn, name)

    def __call__(self, *a, **k):
        t0 = time.perf_counter()
        try:
            return self.fn(*a, **k)
        finally:
            self.total += time.perf_counter() - t0


def env_only_sps(envs, step, steps: int, gen: torch.Generator) -> tuple[float, float | None]:
    """(steps/s through the environment object's ``step_into``, as the rollout steps it; raw envpool
    steps/s or None)."""
    n, d = envs.num_envs, envs.act_dim
    actions = [(2 * torch.rand(n, d, generator=gen) - 1).to(envs.device) for _ in range(8)]
    out = torch.empty(env_out_size(n, envs.obs_dim), device=envs.device)
    t0 = time.perf_counter()
    for k in range(steps):
        step(actions[k % 8], out)
    sps = steps * n / (time.perf_counter() - t0)
    if not isinstance(envs, EnvpoolVecEnv):
        return sps, None
    boxed = [envs._to_box(a).astype("float32") for a in actions]
    t0 = time.perf_counter()
    for k in range(steps):
        envs._pool.step(boxed[k % 8])  # envpool's own next-step auto-reset; no torch hand-over
    return sps, steps * n / (time.perf_counter() - t0)


def main(b: BenchArgs) -> dict:
    if b.torch_threads > 0:
        torch.set_num_threads(b.torch_threads)
    base = robot_fpo_fast.PRESETS[b.preset]
    over = dict(num_envs=b.num_envs, num_steps=b.num_steps, objective=b.objective, eval_episodes=b.eval_episodes)
    over = {k: v for k, v in over.items() if v}
    args = replace(
        base,
        env_id=b.env_id,
        backend=b.backend,
        env_threads=b.env_threads,
        seed=b.seed,
        cuda=b.cuda,
        cuda_graph=b.cuda_graph,
        compile=base.compile if b.compile is None else b.compile,
        bf16=b.bf16,
        **over,
    )
    validate_args(args)
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = args.tf32  # as robot_fpo.main does
    device = torch.device("cuda" if b.cuda and torch.cuda.is_available() else "cpu")
    torch.manual_seed(b.seed)
    state = robot_fpo_fast.build_state(args, device)
    robot_fpo.reset_envs(state, args.seed)
    env_step = Timed(state.envs.step_into)
    state.envs.step_into = env_step
    state.act = policy = Timed(state.act)  # the policy half of each rollout step (graphed on CUDA): host time

    def iterate() -> tuple[float, float]:
        ta = time.perf_counter()
        batch = robot_fpo_fast.collect_rollout(state, args)
        tb = time.perf_counter()
        robot_fpo_fast.update(state, batch, args, robot_fpo.current_alpha(args, state.global_step))
        if device.type == "cuda":
            torch.cuda.synchronize()
        return tb - ta, time.perf_counter() - tb

    t_warm = time.perf_counter()
    iterate()  # warm-up (and CUDA-graph capture)
    t_warm = time.perf_counter() - t_warm
    env_step.total = policy.total = 0.0
    gen = torch.Generator().manual_seed(b.seed)
    env_sps, raw_sps, e2e_sps, t_roll, t_upd = [], [], [], 0.0, 0.0
    for _ in range(b.repeats):
        sps, raw = env_only_sps(state.envs, env_step.fn, b.num_updates * args.num_steps, gen)
        env_sps.append(sps)
        raw_sps.append(raw)
        robot_fpo.reset_envs(state, args.seed)  # the env-only steps left episodes mid-way: restart them
        t0 = time.perf_counter()
        for _ in range(b.num_updates):
            roll, upd = iterate()
            t_roll, t_upd = t_roll + roll, t_upd + upd
        e2e_sps.append(b.num_updates * args.num_envs * args.num_steps / (time.perf_counter() - t0))
    eval_s = []
    if b.eval_runs:  # one evaluation point as robot_fpo.main makes it: FPO++ logs both initial noises
        eval_envs = task_envs(args, args.eval_episodes, args.eval_seed, device)
        for _ in range(b.eval_runs):
            t0 = time.perf_counter()
            for init in eval_inits(args):
                robot_fpo_fast.evaluate(state, eval_envs, args, init)
            eval_s.append(time.perf_counter() - t0)
        eval_envs.close()
    state.envs.close()
    k = b.num_updates * b.repeats
    ratios = [e / v for e, v in zip(e2e_sps, env_sps)]
    out = {
        "preset": b.preset,
        "env_id": b.env_id,
        "backend": type(state.envs).__name__,
        "num_envs": args.num_envs,
        "num_steps": args.num_steps,
        "objective": args.objective,
        "update_epochs": args.update_epochs,
        "num_minibatches": args.num_minibatches,
        "num_draws": args.num_draws,
        "device": str(device),
        "gpu": torch.cuda.get_device_name() if device.type == "cuda" else None,
        "cores": len(os.sched_getaffinity(0)),
        "env_threads": getattr(state.envs, "_threads", None),
        "torch_threads": torch.get_num_threads(),
        "updates_per_repeat": b.num_updates,
        "repeats": b.repeats,
        "env_only_sps": statistics.median(env_sps),
        "end_to_end_sps": statistics.median(e2e_sps),
        "ratio": statistics.median(ratios),
        "raw_envpool_sps": raw_sps[0] and statistics.median(raw_sps),
        "ratios": ratios,
        "env_only_sps_all": env_sps,
        "end_to_end_sps_all": e2e_sps,
        "rollout_s": t_roll / k,
        "update_s": t_upd / k,
        "rollout_policy_s": policy.total / k,
        "rollout_env_step_s": env_step.total / k,
        "warmup_s": t_warm,
        "cuda_graph": state.graph is not None,
        "compile": args.compile,
        "bf16": args.bf16,
        "eval_episodes": args.eval_episodes if b.eval_runs else None,
        "eval_s": statistics.median(eval_s) if eval_s else None,
        "eval_s_all": eval_s,
    }
    print(json.dumps(out))
    print(
        f"{b.env_id} x {args.num_envs}: env-only {out['env_only_sps']:.0f} steps/s, "
        f"end-to-end {out['end_to_end_sps']:.0f} steps/s, ratio {out['ratio']:.2f} "
        f"(device {device}, rollout {out['rollout_s']:.3f} s, update {out['update_s']:.3f} s)"
        + (f", evaluation point {out['eval_s']:.2f} s" if eval_s else "")
    )
    if b.json_out:
        with open(b.json_out, "w") as f:
            json.dump(out, f, indent=2)
    return out


if __name__ == "__main__":
    main(tyro.cli(BenchArgs))
