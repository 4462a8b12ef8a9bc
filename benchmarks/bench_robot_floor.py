"""The best end-to-end / environment-only steps-per-second ratio robot_fpo.py could reach on this CPU.

`bench_robot_sps.py` measures the ratio; this script bounds it. One FPO iteration is a rollout
(the simulator plus one Euler-sampled action per environment step) followed by the update. The
update cannot cost less than its matrix products: per minibatch, the flow MLP's forward and backward
over `minibatch x num_draws` rows and the critic's over `minibatch` rows, repeated for
`num_minibatches x update_epochs` steps. The script times

- `env`: the vectorised environments stepped with random actions (as the environment-only rate);
- `sampler`: the rollout's numpy Euler sampler alone (`num_steps` calls on `num_envs` rows);
- `gemms`: exactly the update's matrix products with torch (`torch.mm`, forward, weight gradients
  and input gradients), nothing else: no activations, losses, clipping or optimiser;

and prints `ceiling = env / (env + sampler + gemms)`, the ratio of an implementation whose update
is free except for its matrix products. If the ceiling is below a target, no implementation of the
same algorithm and network sizes reaches that target on this machine with torch's matrix products.

    taskset -c 0,1 python benchmarks/bench_robot_floor.py --threads 1 2
    taskset -c 0-15 python benchmarks/bench_robot_floor.py --threads 1 4 8 16
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass
from typing import Optional, Tuple

import numpy as np
import torch
import tyro

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import robot_fpo  # noqa: E402
from fpo_utils.envs import make_envs  # noqa: E402
from fpo_utils.samplers import NumpySampler  # noqa: E402


@dataclass
class Args:
    env_id: str = "HalfCheetah-v5"
    """gymnasium id of the task"""
    threads: Tuple[int, ...] = (1, 2)
    """torch thread counts for the matrix-product timing"""
    num_envs: int = robot_fpo.Args.num_envs
    """parallel environments (robot_fpo.py's default)"""
    num_steps: int = robot_fpo.Args.num_steps
    """rollout length per environment"""
    num_minibatches: int = robot_fpo.Args.num_minibatches
    """minibatches per epoch"""
    update_epochs: int = robot_fpo.Args.update_epochs
    """epochs per update"""
    num_draws: int = robot_fpo.Args.num_draws
    """(t, eps) draws per action"""
    flow_steps: int = robot_fpo.Args.flow_steps
    """Euler steps per action"""
    reps: int = 3
    """repetitions of each timing (the fastest is kept)"""
    seed: int = 1
    """seed"""
    json_out: Optional[str] = None
    """optional path of a JSON file with the numbers"""


def update_gemms(
    n_rows: int,
    n_actions: int,
    obs_dim: int,
    act_dim: int,
    embed_dim: int,
    hidden: int,
    actor_layers: int,
    critic_hidden: int,
    critic_layers: int,
):
    """(m, k, n, needs_input_grad) of every matrix product in one minibatch step."""
    first = [(n_actions, obs_dim, hidden, False), (n_rows, act_dim, hidden, False), (n_rows, embed_dim, hidden, False)]
    actor = first + [(n_rows, hidden, hidden, True)] * (actor_layers - 1) + [(n_rows, hidden, act_dim, True)]
    critic = (
        [(n_actions, obs_dim, critic_hidden, False)]
        + [(n_actions, critic_hidden, critic_hidden, True)] * (critic_layers - 1)
        + [(n_actions, critic_hidden, 1, True)]
    )
    return actor + critic


def gemm_flops(shapes) -> int:
    """FLOPs of one minibatch step: forward and weight gradient always, input gradient where needed."""
    return sum(2 * m * k * n * (3 if grad_in else 2) for m, k, n, grad_in in shapes)


def time_gemms(shapes, steps: int, threads: int, reps: int) -> float:
    torch.set_num_threads(threads)
    mats = [(torch.randn(m, k), torch.randn(k, n), torch.randn(m, n), g) for m, k, n, g in shapes]

    def step():
        for x, w, y, grad_in in mats:
            torch.mm(x, w)
            torch.mm(x.t(), y)
            if grad_in:
                torch.mm(y, w.t())

    for _ in range(5):
        step()
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(steps):
            step()
        best = min(best, time.perf_counter() - t0)
    return best


def main(args: Args) -> dict:
    r = robot_fpo.Args()
    envs = make_envs(args.env_id, args.num_envs, args.seed)
    obs_dim, act_dim = envs.obs_dim, envs.act_dim
    rng = np.random.default_rng(args.seed)
    envs.reset(args.seed)
    env_s = float("inf")
    for _ in range(args.reps + 1):  # the first pass warms up
        t0 = time.perf_counter()
        for _ in range(args.num_steps):
            envs.step(torch.from_numpy(rng.uniform(-1.0, 1.0, (args.num_envs, act_dim)).astype(np.float32)))
        env_s = min(env_s, time.perf_counter() - t0)
    envs.close()

    torch.manual_seed(args.seed)
    actor = robot_fpo.FlowActor(obs_dim, act_dim, r.actor_hidden, r.actor_layers, r.time_embed_dim, r.output_scale)
    sampler = NumpySampler(actor)
    obs = rng.standard_normal((args.num_envs, obs_dim)).astype(np.float32)
    x0 = rng.standard_normal((args.num_envs, act_dim)).astype(np.float32)
    sampler_s = float("inf")
    for _ in range(args.reps + 1):
        t0 = time.perf_counter()
        for _ in range(args.num_steps):
            sampler.sample_np(obs, x0, args.flow_steps)
        sampler_s = min(sampler_s, time.perf_counter() - t0)

    batch = args.num_envs * args.num_steps
    n_actions = batch // args.num_minibatches
    shapes = update_gemms(
        n_actions * args.num_draws,
        n_actions,
        obs_dim,
        act_dim,
        r.time_embed_dim,
        r.actor_hidden,
        r.actor_layers,
        r.critic_hidden,
        r.critic_layers,
    )
    steps = args.num_minibatches * args.update_epochs
    flops = gemm_flops(shapes) * steps
    out = {
        "env_id": args.env_id,
        "cores": len(os.sched_getaffinity(0)),
        "batch": batch,
        "env_s": env_s,
        "sampler_s": sampler_s,
        "update_gemm_gflop": flops / 1e9,
        "rows": [],
    }
    print(
        f"{args.env_id}: {batch} steps per iteration, {out['cores']} cores; env {env_s:.3f} s, "
        f"sampler {sampler_s:.3f} s, update matrix products {flops / 1e9:.2f} GFLOP"
    )
    print("| torch threads | update matrix products s | GFLOP/s | ceiling on the ratio |")
    print("| --- | --- | --- | --- |")
    for th in args.threads:
        g = time_gemms(shapes, steps, th, args.reps)
        ceiling = env_s / (env_s + sampler_s + g)
        out["rows"].append({"threads": th, "gemm_s": g, "gflops": flops / g / 1e9, "ceiling": ceiling})
        print(f"| {th} | {g:.3f} | {flops / g / 1e9:.1f} | {ceiling:.2f} |")
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(out, f, indent=1)
    return out


if __name__ == "__main__":
    main(tyro.cli(Args))
