"""Environment-only versus end-to-end FPO steps per second on the same vector environment.

Both measurements use the environments ``robot_fpo.py`` trains on (same id, number of
environments, sync/async vectorisation, action squashing) and the same process:

- environment-only: ``num_updates * num_steps`` vectorised steps with random actions;
- end-to-end: ``num_updates`` FPO iterations (``collect_rollout`` + ``update``), excluding
  evaluation and checkpoint writing.

With ``--repeats R`` the two measurements alternate R times (the simulator's speed drifts by
tens of percent between runs on a shared machine, so each end-to-end block is compared with the
environment-only block measured just before it); the reported ratio is the median of the R
ratios. The script prints both rates and the ratio (target: end-to-end >= 70% of
environment-only) and, in the JSON, the mean seconds per iteration spent in the rollout and in
the update, the rollout split into the flow sampler, the vector environment's ``step`` and the
rest (normalisation, bookkeeping, old losses, values and GAE), and whether the update replayed a
CUDA graph (``--cuda`` with ``--cuda-graph``, the default). Pin the cores with ``taskset`` to
measure a given core count, e.g.::

    taskset -c 0,1 python benchmarks/bench_robot_sps.py --torch-threads 1
    taskset -c 0-15 python benchmarks/bench_robot_sps.py --torch-threads 8
    taskset -c 0-15 python benchmarks/bench_robot_sps.py --torch-threads 1 --cuda          # CUDA graph
    taskset -c 0-15 python benchmarks/bench_robot_sps.py --torch-threads 4 --cuda --no-cuda-graph

The update is a stream of small matrix products: on a CPU whose other cores are busy, more
torch threads than free cores make it many times slower (OpenMP threads wait for each other).
"""

from __future__ import annotations

import json
import os
import statistics
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
    """measured iterations per repeat (after one warm-up iteration)"""
    repeats: int = 1
    """alternating environment-only / end-to-end measurement pairs (the ratio is their median)"""
    torch_threads: int = 0
    """``torch.set_num_threads`` (0 keeps the default)"""
    seed: int = 1
    """seed"""
    cuda: bool = False
    """run the networks of the end-to-end measurement on the GPU when one is present"""
    cuda_graph: bool = True
    """on the GPU, replay the update step as a CUDA graph (as ``robot_fpo.py --cuda-graph``)"""
    json_out: str = ""
    """optional path of a JSON file with the numbers"""


class Timed:
    """Wraps a callable and accumulates the wall time spent in it."""

    def __init__(self, fn):
        self.fn, self.total = fn, 0.0

    def __call__(self, *a, **k):
        t0 = time.perf_counter()
        try:
            return self.fn(*a, **k)
        finally:
            self.total += time.perf_counter() - t0


class EnvOnly:
    """The environment-only loop: the same vector environment stepped with random actions."""

    def __init__(self, args: robot_fpo.Args):
        self.args = args
        self.envs = robot_fpo.make_vec_env(args.env_id, args.num_envs, args.async_envs)
        space = self.envs.single_action_space
        self.low, self.high = space.low.astype(np.float64), space.high.astype(np.float64)
        self.d = int(np.prod(space.shape))
        self.rng = np.random.default_rng(args.seed)
        self.envs.reset(seed=robot_fpo.segment_seeds(args.seed, 0, args.num_envs))
        self.sps(args.num_steps)  # warm-up

    def sps(self, steps: int) -> float:
        n = self.args.num_envs
        t0 = time.perf_counter()
        for _ in range(steps):
            self.envs.step(robot_fpo.squash_action(self.rng.standard_normal((n, self.d)), self.low, self.high))
        return steps * n / (time.perf_counter() - t0)


class EndToEnd:
    """FPO iterations (``collect_rollout`` + ``update``) with the rollout's time split up."""

    def __init__(self, args: robot_fpo.Args, device: torch.device):
        self.args = args
        torch.manual_seed(args.seed)
        self.state = robot_fpo.build_state(args, device)
        robot_fpo.reset_envs(self.state, args.seed)
        self.iterate()  # warm-up (and CUDA-graph capture)
        self.sampler = Timed(robot_fpo.NumpyFlowSampler.sample)
        self.env_step = Timed(self.state.envs.step)
        self.state.envs.step = self.env_step
        self.t_roll = self.t_upd = 0.0
        self.iterations = 0

    def iterate(self) -> tuple[float, float]:
        ta = time.perf_counter()
        batch = robot_fpo.collect_rollout(self.state, self.args)
        tb = time.perf_counter()
        robot_fpo.update(self.state, batch, self.args, robot_fpo.current_alpha(self.args, self.state.global_step))
        return tb - ta, time.perf_counter() - tb

    def sps(self, updates: int) -> float:
        original = robot_fpo.NumpyFlowSampler.sample
        robot_fpo.NumpyFlowSampler.sample = lambda s, *a, **k: self.sampler(s, *a, **k)
        try:
            t0 = time.perf_counter()
            for _ in range(updates):
                roll, upd = self.iterate()
                self.t_roll, self.t_upd = self.t_roll + roll, self.t_upd + upd
            dt = time.perf_counter() - t0
        finally:
            robot_fpo.NumpyFlowSampler.sample = original
        self.iterations += updates
        return updates * self.args.num_envs * self.args.num_steps / dt

    def breakdown(self) -> dict:
        """Mean seconds per iteration: rollout (sampler, environment steps, rest) and update."""
        k = self.iterations
        return {
            "rollout_s": self.t_roll / k, "update_s": self.t_upd / k,
            "rollout_sampler_s": self.sampler.total / k, "rollout_env_step_s": self.env_step.total / k,
            "rollout_other_s": (self.t_roll - self.sampler.total - self.env_step.total) / k,
            "cuda_graph": self.state.graph is not None,
        }


def main(b: BenchArgs) -> dict:
    if b.torch_threads > 0:
        torch.set_num_threads(b.torch_threads)
    if b.repeats < 1:
        raise ValueError(f"repeats={b.repeats}; must be >= 1")
    args = replace(
        robot_fpo.Args(), env_id=b.env_id, num_envs=b.num_envs, num_steps=b.num_steps,
        async_envs=b.async_envs, objective=b.objective, seed=b.seed, cuda=b.cuda, cuda_graph=b.cuda_graph,
        num_draws=b.num_draws, update_epochs=b.update_epochs, num_minibatches=b.num_minibatches,
    )
    device = torch.device("cuda" if b.cuda and torch.cuda.is_available() else "cpu")
    env_only, e2e = EnvOnly(args), EndToEnd(args, device)
    env_sps, e2e_sps = [], []
    for _ in range(b.repeats):
        env_sps.append(env_only.sps(b.num_updates * b.num_steps))
        e2e_sps.append(e2e.sps(b.num_updates))
    env_only.envs.close()
    e2e.state.envs.close()
    ratios = [e / v for e, v in zip(e2e_sps, env_sps)]
    env_med, e2e_med = statistics.median(env_sps), statistics.median(e2e_sps)
    out = {
        "env_id": b.env_id, "num_envs": b.num_envs, "num_steps": b.num_steps, "async_envs": b.async_envs,
        "objective": b.objective, "num_draws": b.num_draws, "update_epochs": b.update_epochs,
        "num_minibatches": b.num_minibatches, "device": str(device),
        "gpu": torch.cuda.get_device_name() if device.type == "cuda" else None,
        "cores": len(os.sched_getaffinity(0)), "torch_threads": torch.get_num_threads(),
        "actor": f"{args.actor_layers}x{args.actor_hidden}", "updates_per_repeat": b.num_updates, "repeats": b.repeats,
        "env_only_sps": env_med, "end_to_end_sps": e2e_med, "ratio": statistics.median(ratios),
        "ratios": ratios, "env_only_sps_all": env_sps, "end_to_end_sps_all": e2e_sps,
        "env_only_s_per_rollout": b.num_envs * b.num_steps / env_med, **e2e.breakdown(),
    }
    print(json.dumps(out))
    print(f"env-only {env_med:.0f} steps/s, end-to-end {e2e_med:.0f} steps/s, ratio {out['ratio']:.2f} "
          f"(median of {b.repeats}; device {device}, CUDA-graph update {'used' if out['cuda_graph'] else 'not used'})")
    if b.json_out:
        with open(b.json_out, "w") as f:
            json.dump(out, f, indent=2)
    return out


if __name__ == "__main__":
    main(tyro.cli(BenchArgs))
