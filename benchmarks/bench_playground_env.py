"""Environment steps per second of the Playground backend (fpo_utils/playground_env.py) on one GPU.

For each task, at `--num-envs` environments, `--steps` vectorised steps each (480 x 2,048 = one
block of the FPO preset):

- `check`: the DLPack hand-over against host copies (largest difference; 0 expected), once with
  fresh action tensors and once with a reused action buffer written by a CUDA graph;
- `env_only`: zero actions from torch through the adapter (dispatch + hand-over + physics);
- `eager_policy` / `graph_policy`: a stand-in flow policy in torch (the FPO preset's actor
  shape: MLP 4 x 32, 10 Euler steps) sampling every action, eager or replayed as one CUDA graph;
- `jax_loop`: the jitted step called from Python with a JAX action (no torch at all);
- `jax_scan`: `--steps` steps inside one `lax.scan` (no per-step dispatch: the physics floor).

Compilation is timed separately. Prints a table, writes JSON to --out.
Usage: python benchmarks/bench_playground_env.py --tasks AcrobotSwingup WalkerRun --physics jax warp --out env.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.nn as nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


class StandInPolicy(nn.Module):
    """A flow policy of the FPO preset's size: velocity MLP 4 x 32 on (obs, x_t, t), Euler steps."""

    def __init__(self, obs_dim: int, act_dim: int, hidden: int = 32, layers: int = 4, steps: int = 10):
        super().__init__()
        mods, n_in = [], obs_dim + act_dim + 1
        for _ in range(layers):
            mods += [nn.Linear(n_in, hidden), nn.SiLU()]
            n_in = hidden
        self.net, self.out, self.steps = nn.Sequential(*mods), nn.Linear(hidden, act_dim), steps

    @torch.no_grad()
    def forward(self, obs: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        dt = 1.0 / self.steps
        for k in range(self.steps):
            t = torch.full_like(x[:, :1], k * dt)
            x = x + dt * self.out(self.net(torch.cat([obs, x, t], dim=1)))
        return torch.tanh(x)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn, steps: int, device: torch.device) -> float:
    fn()  # warm-up
    sync(device)
    t0 = time.perf_counter()
    for _ in range(steps):
        fn()
    sync(device)
    return time.perf_counter() - t0


def bench_task(
    task: str, n: int, steps: int, device: torch.device, check_only: bool = False, physics: str = "jax"
) -> dict:
    import jax
    import jax.numpy as jnp
    import numpy as np

    from fpo_utils.playground_env import PlaygroundVecEnv

    t0 = time.perf_counter()
    env = PlaygroundVecEnv(task, n, seed=0, device=device, physics=physics)
    row = {
        "task": task,
        "physics": physics,
        "num_envs": n,
        "steps": steps,
        "make_s": round(time.perf_counter() - t0, 2),
        "compile_s": round(env.compile_s, 2),
        "obs_dim": env.obs_dim,
        "act_dim": env.act_dim,
    }
    policy = StandInPolicy(env.obs_dim, env.act_dim).to(device)

    # Hand-over check: at every step, what torch reads through DLPack (and computes on at once, on
    # its own stream) equals a host copy of the same JAX output, and JAX received the torch actions.
    # Then the same actions replayed through host copies alone: equal unless the physics itself is
    # not bitwise deterministic on this device (scatter-adds in contacts can reorder).
    def check(reuse_buffer: bool) -> dict:
        g = torch.Generator(device=device).manual_seed(0)
        acts = [torch.rand(n, env.act_dim, device=device, generator=g) * 2 - 1 for _ in range(20)]
        buf = torch.empty(n, env.act_dim, device=device)
        env.reset(5)
        state, hand, sumrel, act, outs = env._state, 0.0, 0.0, 0.0, []
        for a in acts:
            if reuse_buffer:
                buf.copy_(a * 1.0)  # written on torch's stream just before the hand-over
                a = buf
            ja_ = env.to_jax(a)
            state, packed = env._step_fn(state, ja_)
            t = env.to_torch(packed)
            total = (t * 1.0).sum()  # torch computes on it at once
            host = np.array(packed)
            hand = max(hand, float((t.cpu() - torch.from_numpy(host)).abs().max()))
            ref = float(host.astype(np.float64).sum())
            sumrel = max(sumrel, abs(float(total) - ref) / max(1.0, abs(ref)))  # float32 sum: ~1e-6
            act = max(act, float(np.abs(np.array(ja_) - a.cpu().numpy()).max()))
            outs.append(host)
        env._state = None
        runs = []
        for _ in range(2):
            env.reset(5)
            st, worst = env._state, 0.0
            for a, h in zip(acts, outs):
                st, packed = env._step_fn(st, jax.device_put(jnp.asarray(a.cpu().numpy()), env._jax_device))
                worst = max(worst, float(np.abs(np.array(packed) - h).max()))
            runs.append(worst)
        env._state = st
        return {
            "handover_maxdiff": hand,
            "torch_sum_reldiff": sumrel,
            "action_maxdiff": act,
            "host_replay_maxdiff": runs,
        }

    row["check_fresh"] = check(False)
    row["check_reused_buffer"] = check(True)
    if check_only:
        return row

    env.reset(0)
    zeros = torch.zeros(n, env.act_dim, device=device)
    row["env_only_s"] = timed(lambda: env.step(zeros), steps, device)

    state = {"obs": env.reset(0)}

    def eager():
        a = policy(state["obs"], torch.randn(n, env.act_dim, device=device))
        state["obs"] = env.step(a)[0]

    row["eager_policy_s"] = timed(eager, steps, device)

    if device.type == "cuda":
        static_obs, static_x = torch.zeros(n, env.obs_dim, device=device), torch.randn(n, env.act_dim, device=device)
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):
                policy(static_obs, static_x)
        torch.cuda.current_stream().wait_stream(s)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_act = policy(static_obs, static_x)
        state["obs"] = env.reset(0)

        def graphed():
            static_obs.copy_(state["obs"])
            static_x.normal_()
            graph.replay()
            state["obs"] = env.step(static_act)[0]

        row["graph_policy_s"] = timed(graphed, steps, device)

    # JAX alone: the same jitted step from a Python loop, and a whole block inside one scan.
    env.reset(0)
    ja = jnp.zeros((n, env.act_dim), jnp.float32, device=env._jax_device)
    box = {"s": env._state}

    def jax_step():
        box["s"], packed = env._step_fn(box["s"], ja)
        box["p"] = packed

    jax_step()
    box["p"].block_until_ready()
    t1 = time.perf_counter()
    for _ in range(steps):
        jax_step()
    box["p"].block_until_ready()
    row["jax_loop_s"] = time.perf_counter() - t1

    def scan_block(flat):
        def body(c, _):
            c = env._env.step(c, ja)
            return c, c.reward

        return jax.lax.scan(body, env._unpack_state(flat), (), length=steps)

    scan = jax.jit(scan_block)
    t1 = time.perf_counter()
    s2, r = scan(box["s"])
    r.block_until_ready()
    row["jax_scan_compile_s"] = round(time.perf_counter() - t1, 2)
    t1 = time.perf_counter()
    s2, r = scan(box["s"])
    r.block_until_ready()
    row["jax_scan_s"] = time.perf_counter() - t1
    env._state = None
    env.close()
    for k in [k for k in row if k.endswith("_s") and k not in ("make_s", "compile_s", "jax_scan_compile_s")]:
        row[k[:-2] + "_sps"] = round(n * steps / row[k])
        row[k] = round(row[k], 4)
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tasks", nargs="+", default=["AcrobotSwingup", "WalkerRun"])
    p.add_argument("--num-envs", type=int, default=2048)
    p.add_argument("--steps", type=int, default=480)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--out", default="")
    p.add_argument("--check-only", action="store_true", help="only the hand-over and replay checks")
    p.add_argument("--physics", nargs="+", default=["jax"], choices=["jax", "warp"], help="MJX and/or MuJoCo Warp")
    args = p.parse_args()
    device = torch.device(args.device)
    from importlib.metadata import version

    import jax
    import mujoco

    meta = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "jax": jax.__version__,
        "torch": torch.__version__,
        "mujoco": mujoco.__version__,
        "playground": version("playground"),
        "XLA_FLAGS": os.environ.get("XLA_FLAGS", ""),
    }
    rows = []
    for task in args.tasks:
        for physics in args.physics:
            rows.append(bench_task(task, args.num_envs, args.steps, device, args.check_only, physics))
            print(json.dumps(rows[-1]), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=1)
    if args.check_only:
        return
    cols = ["env_only", "eager_policy", "graph_policy", "jax_loop", "jax_scan"]
    print(
        f"\n{meta}\n| task | physics | compile s | " + " | ".join(f"{c} steps/s" for c in cols) + " | hand-over diff |"
    )
    print("|---" * (len(cols) + 4) + "|")
    checks = [(c, k) for c in ("check_fresh", "check_reused_buffer") for k in ("handover_maxdiff", "action_maxdiff")]
    for r in rows:
        print(
            f"| {r['task']} | {r['physics']} | {r['compile_s']} | "
            + " | ".join(f"{r.get(c + '_sps', '-'):,}" if c + "_sps" in r else "-" for c in cols)
            + f" | {max(r[c][k] for c, k in checks)} |"
        )


if __name__ == "__main__":
    main()
