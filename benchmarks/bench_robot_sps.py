"""Environment-only versus end-to-end FPO steps per second on the same vector environment.

Both measurements use the environments ``robot_fpo.py`` trains on (same id, number of
environments, sync/async vectorisation, action squashing) and the same process:

- environment-only: ``num_updates * num_steps`` vectorised steps with random actions;
- end-to-end: ``num_updates`` FPO iterations (``collect_rollout`` + ``update``), excluding
  evaluation and checkpoint writing.

The script prints both rates and their ratio (target: end-to-end >= 70% of environment-only)
and, in the JSON, the mean seconds per iteration spent in the rollout and in the update.
Pin the cores with ``taskset`` to measure a given core count, e.g.::

    taskset -c 0,1 python benchmarks/bench_robot_sps.py --torch-threads 1
    taskset -c 0-15 python benchmarks/bench_robot_sps.py --torch-threads 8

The update is a stream of small matrix products: on a CPU whose other cores are busy, more
torch threads than free cores make it many times slower (OpenMP threads wait for each other).
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass, replace

import numpy as np
import torch
import tyro

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import robot_fpo  # noqa: E402


@dataclass
class BenchArgs:
    env_id: str = "HalfCheetah-v5"
    """gymnasium id of the benchmarked task"""
    num_envs: int = robot_fpo.Args.num_envs
    """parallel environments (as ``robot_fpo.py --num-envs``; default: its default)"""
    num_steps: int = 64
    """rollout length per environment (as ``robot_fpo.py --num-steps``)"""
    async_envs: bool = False
    """use ``AsyncVectorEnv`` (one subprocess per environment)"""
    objective: str = "fpo"
    """objective of the end-to-end run: fpo or fpopp"""
    num_draws: int = 8
    """(t, eps) draws per action (as ``robot_fpo.py --num-draws``)"""
    update_epochs: int = robot_fpo.Args.update_epochs
    """epochs per update (as ``robot_fpo.py --update-epochs``)"""
    num_minibatches: int = robot_fpo.Args.num_minibatches
    """minibatches per epoch (as ``robot_fpo.py --num-minibatches``)"""
    num_updates: int = 10
    """measured iterations (after one warm-up iteration)"""
    torch_threads: int = 0
    """``torch.set_num_threads`` (0 keeps the default)"""
    seed: int = 1
    """seed"""
    cuda: bool = False
    """run the networks of the end-to-end measurement on the GPU when one is present"""
    json_out: str = ""
    """optional path of a JSON file with the numbers"""


def env_only_sps(args: robot_fpo.Args, steps: int) -> float:
    envs = robot_fpo.make_vec_env(args.env_id, args.num_envs, args.async_envs)
    low, high = envs.single_action_space.low.astype(np.float64), envs.single_action_space.high.astype(np.float64)
    d = int(np.prod(envs.single_action_space.shape))
    rng = np.random.default_rng(args.seed)
    envs.reset(seed=robot_fpo.segment_seeds(args.seed, 0, args.num_envs))
    for _ in range(args.num_steps):  # warm-up
        envs.step(robot_fpo.squash_action(rng.standard_normal((args.num_envs, d)), low, high))
    t0 = time.perf_counter()
    for _ in range(steps):
        envs.step(robot_fpo.squash_action(rng.standard_normal((args.num_envs, d)), low, high))
    dt = time.perf_counter() - t0
    envs.close()
    return steps * args.num_envs / dt


def end_to_end_sps(args: robot_fpo.Args, updates: int, device: torch.device) -> tuple[float, float, float]:
    """End-to-end steps/s, and the mean seconds per iteration spent in the rollout and the update."""
    torch.manual_seed(args.seed)
    state = robot_fpo.build_state(args, device)
    robot_fpo.reset_envs(state, args.seed)
    batch = robot_fpo.collect_rollout(state, args)  # warm-up
    robot_fpo.update(state, batch, args, robot_fpo.current_alpha(args, 0))
    t_roll = t_upd = 0.0
    t0 = time.perf_counter()
    for _ in range(updates):
        ta = time.perf_counter()
        batch = robot_fpo.collect_rollout(state, args)
        tb = time.perf_counter()
        robot_fpo.update(state, batch, args, robot_fpo.current_alpha(args, state.global_step))
        t_roll, t_upd = t_roll + tb - ta, t_upd + time.perf_counter() - tb
    dt = time.perf_counter() - t0
    state.envs.close()
    return updates * args.num_envs * args.num_steps / dt, t_roll / updates, t_upd / updates


def main(b: BenchArgs) -> dict:
    if b.torch_threads > 0:
        torch.set_num_threads(b.torch_threads)
    args = replace(
        robot_fpo.Args(), env_id=b.env_id, num_envs=b.num_envs, num_steps=b.num_steps,
        async_envs=b.async_envs, objective=b.objective, seed=b.seed, cuda=b.cuda,
        num_draws=b.num_draws, update_epochs=b.update_epochs, num_minibatches=b.num_minibatches,
    )
    env_sps = env_only_sps(args, b.num_updates * b.num_steps)
    device = torch.device("cuda" if b.cuda and torch.cuda.is_available() else "cpu")
    e2e_sps, rollout_s, update_s = end_to_end_sps(args, b.num_updates, device)
    out = {
        "env_id": b.env_id, "num_envs": b.num_envs, "num_steps": b.num_steps, "async_envs": b.async_envs,
        "objective": b.objective, "num_draws": b.num_draws, "update_epochs": b.update_epochs, "num_minibatches": b.num_minibatches, "device": str(device), "cores": len(os.sched_getaffinity(0)), "torch_threads": torch.get_num_threads(),
        "actor": f"{args.actor_layers}x{args.actor_hidden}",
        "env_only_sps": env_sps, "end_to_end_sps": e2e_sps, "ratio": e2e_sps / env_sps,
        "env_only_s_per_rollout": b.num_envs * b.num_steps / env_sps, "rollout_s": rollout_s, "update_s": update_s,
    }
    print(json.dumps(out))
    print(f"env-only {env_sps:.0f} steps/s, end-to-end {e2e_sps:.0f} steps/s, ratio {e2e_sps / env_sps:.2f}")
    if b.json_out:
        with open(b.json_out, "w") as f:
            json.dump(out, f, indent=2)
    return out


if __name__ == "__main__":
    main(tyro.cli(BenchArgs))
