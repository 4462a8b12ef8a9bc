"""The fpo preset's two GPU hot spots without environments, on synthetic batches of a task's shapes.

- update: one update of the `fpo` preset (16 epochs x 32 minibatches of 1,024 unrolls x 30 steps x
  8 draws), or of `--preset fpopp-locomotion` (32 epochs x 4 minibatches of 24,576 transitions x 32
  draws), replayed as one captured minibatch step, in each of `--variants` (eager losses, `compile`d,
  the `fused` Triton MLP, the `bf16` actor, the `split` first layer: the observation's share once per
  observation, not per draw; joined with +); seconds per update (median of
  `--repeats`), the first update (capture, compilation) apart, and a profile of the minibatch step's
  kernels for each compiled variant;
- sampler: the rollout's Euler sampler for 2,048 environments (10 steps of the 4 x 32 MLP): eager
  `actor.sample`, the same captured as a CUDA graph, and the fused Triton kernel (`FusedSampler`)
  called directly and captured; microseconds per call, and each one's error against float64.

    python benchmarks/bench_robot_update.py --tasks AcrobotSwingup:6:1 WalkerRun:24:6 --out $OUT/update
    python benchmarks/bench_robot_update.py --preset fpopp-locomotion --tasks Spot:81:12 --skip sampler \
        --variants eager compile bf16 compile+bf16 --out $OUT/spot

`--compile-mode` and `--inductor KEY=VALUE` (torch._inductor.config) change how the compiled variants are
compiled, e.g. Triton matrix-product templates only, so that SiLU and its derivative fuse into them:

    python benchmarks/bench_robot_update.py --preset fpopp-locomotion --tasks Spot:81:12 --skip sampler \
        --variants compile+bf16+split --compile-mode max-autotune-no-cudagraphs \
        --inductor max_autotune_gemm_backends=TRITON --out $OUT/spot_triton
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import replace
from functools import partial
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import robot_fpo as R  # noqa: E402
import robot_fpo_fast as F  # noqa: E402
from fpo_utils.flow_triton import FusedSampler  # noqa: E402
from fpo_utils.robot_bookkeeping import chunks  # noqa: E402
from fpo_utils.samplers import GraphedSampler, fused_forward  # noqa: E402


def split_forward(actor, obs, x_t, t, bf16: bool = False):
    """FlowActor.forward with the observation's share of the first layer computed once per observation (it
    broadcasts over the draws) instead of once per draw row; the same function up to float rounding."""
    first, o = actor.net[0], obs.shape[-1]
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16):
        ang = t.unsqueeze(-1) * actor.freqs
        rest = torch.cat([x_t, torch.cos(ang), torch.sin(ang)], dim=-1)
        h = torch.nn.functional.linear(rest, first.weight[:, o:], first.bias)
        h = h + torch.nn.functional.linear(obs, first.weight[:, :o])
        return (actor.net[1:](h) * actor.output_scale).float()


def make_state(args: F.Args, o: int, d: int, dev, split: bool = False) -> F.State:
    actor = R.FlowActor(
        o, d, args.actor_hidden, args.actor_layers, args.time_embed_dim, args.output_scale, args.time_embed_base
    ).to(dev)
    if fused_forward(actor, args.fused):  # the Triton forward, as robot_fpo_fast.build_state installs it
        actor.forward = partial(fused_forward(actor, True), actor)
    if args.bf16:
        actor.forward = partial(F.bf16_forward, actor)
    if split:  # a candidate, measured here before any trainer uses it
        actor.forward = partial(split_forward, actor, bf16=args.bf16)
    critic = R.Critic(o, args.critic_hidden, args.critic_layers, args.critic_act).to(dev)
    opt = torch.optim.AdamW(
        [*actor.parameters(), *critic.parameters()],
        lr=args.learning_rate,
        eps=args.adam_eps,
        weight_decay=0.0,
        fused=True,
    )
    zeros = torch.zeros(1, o, device=dev), torch.zeros(1, dtype=torch.float64, device=dev)
    return F.State(None, actor, critic, opt, None, None, dev, *zeros)


def make_batch(state: R.State, args: R.Args, o: int, d: int, dev) -> dict:
    if not args.gae_unroll:
        return make_flat_batch(state, args, o, d, dev)
    n, k, m = args.num_envs * args.num_steps // args.gae_unroll, args.gae_unroll, args.num_draws
    g = torch.Generator(device=dev).manual_seed(0)
    r = lambda *s: torch.randn(*s, device=dev, generator=g)  # noqa: E731
    obs, x = r(n, k, o), r(n, k, d)
    t = torch.randint(0, R.FPO_GRID_SIZE, (n, k, m), device=dev, generator=g).float() / R.FPO_GRID_SIZE
    eps = r(n, k, m, d)
    with torch.no_grad():
        l_old = torch.cat(
            [
                R.draw_losses(
                    state.actor,
                    obs[s].flatten(0, 1),
                    x[s].flatten(0, 1),
                    t[s].flatten(0, 1),
                    eps[s].flatten(0, 1),
                    "fpo",
                ).view(-1, k, m)
                for s in chunks(n, 2048)
            ]
        )
    flag = lambda p: (torch.rand(n, k, device=dev, generator=g) < p).float()  # noqa: E731
    return {
        "obs": obs,
        "x": x,
        "t": t,
        "eps": eps,
        "l_old": l_old,
        "rew": r(n, k),
        "disc": args.gamma * (1 - flag(1e-3)),
        "trunc": flag(1e-3),
        "boot": r(n, o),
    }


def make_flat_batch(state: R.State, args: R.Args, o: int, d: int, dev) -> dict:
    """A batch of transitions (GAE done over the rollout: advantages and returns stored), as FPO++ trains."""
    n, g = args.num_envs * args.num_steps, torch.Generator(device=dev).manual_seed(0)
    obs, x = torch.randn(n, o, device=dev, generator=g), torch.randn(n, d, device=dev, generator=g)
    t = args.t_min + (args.t_max - args.t_min) * torch.rand(n, args.num_draws, device=dev, generator=g)
    eps = torch.randn(n, args.num_draws, d, device=dev, generator=g)
    with torch.no_grad():
        l_old = torch.cat([R.draw_losses(state.actor, obs[s], x[s], t[s], eps[s], args.objective) for s in chunks(n)])
    adv, returns = torch.randn(n, device=dev, generator=g), torch.randn(n, device=dev, generator=g)
    return {"obs": obs, "x": x, "t": t, "eps": eps, "l_old": l_old, "adv": adv, "returns": returns}


def time_update(args: R.Args, o: int, d: int, repeats: int, split: bool = False) -> dict:
    dev = torch.device("cuda")
    torch.manual_seed(0)
    state = make_state(args, o, d, dev, split)
    batch = make_batch(state, args, o, d, dev)
    t0 = time.perf_counter()
    F.update(state, batch, args, 1.0)  # capture (and compilation) happen here
    first = time.perf_counter() - t0
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        stats = F.update(state, batch, args, 1.0)  # ends with the update's one host read
        times.append(time.perf_counter() - t0)
    steps = args.update_epochs * args.num_minibatches
    return {
        "compile": args.compile,
        "fused": args.fused,
        "bf16": args.bf16,
        "update_s": statistics.median(times),
        "all_s": times,
        "first_s": first,
        "ms_per_minibatch": 1e3 * statistics.median(times) / steps,
        "pg_loss": stats["pg_loss"],
        "v_loss": stats["v_loss"],
    }


def profile_step(args: R.Args, o: int, d: int, path: Path, split: bool = False) -> None:
    """Kernel table of 5 minibatch steps run outside any graph (eager or compiled losses)."""
    dev = torch.device("cuda")
    state = make_state(args, o, d, dev, split)
    batch = make_batch(state, args, o, d, dev)
    src = R.update_source(batch, args, 1.0)
    losses = lambda s, idx: R.minibatch_losses(state, s, idx, args)  # noqa: E731
    losses = torch.compile(losses, dynamic=False) if args.compile else losses
    n, mb = src["obs"].shape[0], src["obs"].shape[0] // args.num_minibatches
    for _ in range(3):
        R.gradient_step(state, *losses(src, torch.randperm(n, device=dev)[:mb]), args)
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            R.gradient_step(state, *losses(src, torch.randperm(n, device=dev)[:mb]), args)
        torch.cuda.synchronize()
    path.write_text(prof.key_averages().table(sort_by="cuda_time_total", row_limit=30, max_name_column_width=70))


def time_samplers(args: R.Args, o: int, d: int, n: int, calls: int = 200) -> dict:
    dev = torch.device("cuda")
    torch.manual_seed(0)
    actor = R.FlowActor(
        o, d, args.actor_hidden, args.actor_layers, args.time_embed_dim, args.output_scale, args.time_embed_base
    ).to(dev)
    obs, x0 = torch.randn(n, o, device=dev), torch.randn(n, d, device=dev)
    ref = actor.double().sample(obs.double(), x0.double(), args.flow_steps)
    actor.float()
    fused = FusedSampler(actor)

    def captured(fn):
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            fn()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = fn()
        return lambda: (graph.replay(), out)[1]

    graphed = GraphedSampler(actor)
    variants = {
        "eager": lambda: actor.sample(obs, x0, args.flow_steps),
        "graphed": lambda: graphed(obs, x0, args.flow_steps),
        "fused": lambda: fused(obs, x0, args.flow_steps),
    }
    variants["fused_graphed"] = captured(variants["fused"])
    out = {}
    for name, fn in variants.items():
        for _ in range(5):
            y = fn()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        start.record()
        for _ in range(calls):
            y = fn()
        end.record()
        torch.cuda.synchronize()
        host = (time.perf_counter() - t0) / calls
        err = float((y.double() - ref).norm() / ref.norm())
        out[name] = {
            "us_per_call": 1e6 * start.elapsed_time(end) / 1e3 / calls,
            "host_us_per_call": 1e6 * host,
            "rel_err_vs_float64": err,
        }
    return out


def time_rollout(task: str, repeats: int, compile: bool = True, quick: bool = False) -> dict:
    """One block's rollout (480 steps of 2,048 Playground environments) in the trainer, with its parts
    timed apart: the environment alone, the two captured halves alone, and the whole, for the fused and
    the eager sampler inside the captured policy half; then again after one compiled update."""
    from fpo_utils.graphs import GraphedCall
    from fpo_utils.samplers import pick_sampler

    args = replace(
        F.PRESETS["fpo"], env_id=task, backend="playground", compile=compile, scan_rollout=False
    )  # the per-step path
    dev = torch.device("cuda")
    torch.manual_seed(0)
    state = F.build_state(args, dev)
    R.reset_envs(state, 0)
    r, T, out = state.roll, args.num_steps, {}

    def clock(fn, n=repeats):
        ts = []
        for _ in range(n):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            fn()
            torch.cuda.synchronize()
            ts.append(time.perf_counter() - t0)
        return round(statistics.median(ts), 4)

    def env_only():
        for _ in range(T):
            state.envs.step_into(r["action"], r["env_in"])

    def halves_only():
        r["k"].zero_()
        for _ in range(T):
            state.act()
            state.record()

    for name in ("fused", "eager")[: 1 if quick else 2]:
        if name == "eager":
            state.sampler = pick_sampler(state.actor, dev, False, in_graph=True, fused=False)  # actor.sample
            state.act = GraphedCall(lambda: F.policy_half(state, args), state.act.touched)
        out[f"env_only_s_{name}"] = clock(env_only)
        out[f"halves_only_s_{name}"] = clock(halves_only)
        out[f"rollout_s_{name}"] = clock(lambda: F.collect_rollout(state, args))
    if quick:
        out.update(rollout_timeline(state, args))
        return out
    batch = F.collect_rollout(state, args)
    F.update(state, batch, args, 1.0)
    out["update_s_first"] = clock(lambda: F.update(state, batch, args, 1.0), 1)
    out["update_s"] = clock(lambda: F.update(state, batch, args, 1.0))
    out["rollout_s_eager_after_update"] = clock(lambda: F.collect_rollout(state, args))
    out["env_only_s_after_update"] = clock(env_only)
    return out


def rollout_timeline(state: F.State, args: F.Args) -> dict:
    """One rollout under the profiler: wall time, the time the GPU runs any kernel (union of kernel
    intervals, XLA's and torch's), torch's own kernel time, and the ten longest idle gaps."""
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        t0 = time.perf_counter()
        F.collect_rollout(state, args)
        torch.cuda.synchronize()
        wall = time.perf_counter() - t0
    ev = sorted(
        (
            (e.time_range.start, e.time_range.end, e.name)
            for e in prof.events()
            if e.device_type == torch.autograd.DeviceType.CUDA and e.time_range.end > e.time_range.start
        ),
        key=lambda x: x[0],
    )
    busy, gaps, cur_s, cur_e = 0.0, [], None, None
    for s_, e_, _ in ev:
        if cur_e is None or s_ > cur_e:
            if cur_e is not None:
                busy += cur_e - cur_s
                gaps.append(s_ - cur_e)
            cur_s, cur_e = s_, e_
        else:
            cur_e = max(cur_e, e_)
    busy += (cur_e - cur_s) if cur_e is not None else 0.0
    torch_like = (
        "triton_",
        "_euler",
        "_mlp",
        "void at::",
        "at::",
        "Memcpy",
        "Memset",
        "void cutlass",
        "sm90",
        "sm80",
        "cublas",
        "std::",
    )
    ours = sum(e_ - s_ for s_, e_, n in ev if n.startswith(torch_like))
    span = (ev[-1][1] - ev[0][0]) if ev else 0.0
    per_name: dict = {}
    for s_, e_, n in ev:
        per_name[n[:60]] = per_name.get(n[:60], 0.0) + e_ - s_
    top = sorted(per_name.items(), key=lambda kv: -kv[1])[:12]
    return {
        "profiled_wall_s": round(wall, 4),
        "kernel_span_s": round(span / 1e6, 4),
        "gpu_busy_s": round(busy / 1e6, 4),
        "torch_kernel_s": round(ours / 1e6, 4),
        "kernels": len(ev),
        "idle_gaps_s": round(sum(gaps) / 1e6, 4),
        "largest_gaps_us": [round(g, 1) for g in sorted(gaps)[-10:]],
        "top_kernels_ms": [(n, round(v / 1e3, 1)) for n, v in top],
    }


def set_inductor(item: str) -> None:
    """Set one torch._inductor.config value from KEY=VALUE (VALUE a Python literal, else a string)."""
    import ast

    import torch._inductor.config as config

    key, eq, text = item.partition("=")
    *parents, leaf = key.split(".")
    obj = config
    for part in parents:
        obj = getattr(obj, part, None)
    if not eq or obj is None or not hasattr(obj, leaf):
        raise ValueError(f"--inductor {item!r}: expected KEY=VALUE with KEY a torch._inductor.config setting")
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        value = text
    setattr(obj, leaf, value)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tasks", nargs="+", default=["AcrobotSwingup:6:1", "WalkerRun:24:6"], help="NAME:obs_dim:act_dim")
    p.add_argument("--preset", default="fpo", choices=["fpo", "fpopp-locomotion"], help="the update's settings")
    p.add_argument("--variants", nargs="+", default=["eager", "compile", "fused", "compile+fused"])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--skip", nargs="*", default=[], help="parts to leave out: update, profile, sampler")
    p.add_argument(
        "--rollout", nargs="*", default=[], help="Playground tasks whose in-trainer rollout to time (needs playground)"
    )
    p.add_argument("--rollout-quick", action="store_true", help="only the fused sampler's timings, no update")
    p.add_argument(
        "--rollout-no-compile", action="store_true", help="the update between the rollout timings without torch.compile"
    )
    p.add_argument("--compile-mode", default=None, help="torch.compile mode for the compiled update (default: torch's)")
    p.add_argument(
        "--inductor",
        nargs="*",
        default=[],
        metavar="KEY=VALUE",
        help="torch._inductor.config settings for the compiled variants, e.g. max_autotune_gemm_backends=TRITON",
    )
    p.add_argument("--out", type=Path, default=Path("bench_update"))
    return p


def main() -> None:
    p = build_parser()
    a = p.parse_args()
    for item in a.inductor:
        try:
            set_inductor(item)
        except ValueError as err:
            p.error(str(err))
    a.out.mkdir(parents=True, exist_ok=True)
    if a.compile_mode:
        import functools

        F.torch.compile = functools.partial(torch.compile, mode=a.compile_mode)
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    base = F.PRESETS[a.preset]
    unknown = [v for v in a.variants if not set(v.split("+")) <= {"eager", "compile", "fused", "bf16", "split"}]
    if unknown:
        p.error(f"--variants {unknown}: each is eager or compile, fused, bf16, split joined with +")
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "inductor": a.inductor, "tasks": {}}
    for task in a.rollout:
        result[f"rollout_{task}"] = time_rollout(task, a.repeats, not a.rollout_no_compile, a.rollout_quick)
        print(task, "rollout", json.dumps(result[f"rollout_{task}"]), flush=True)
    for spec in a.tasks:
        name, o, d = spec.split(":")
        o, d = int(o), int(d)
        res = result["tasks"][name] = {}
        if "sampler" not in a.skip:
            res["sampler"] = time_samplers(base, o, d, base.num_envs)
            print(name, "sampler", json.dumps(res["sampler"]), flush=True)
        for variant in a.variants:
            flags = {f: f in variant.split("+") for f in ("compile", "fused", "bf16")}
            args, split = replace(base, **flags), "split" in variant.split("+")
            if "update" not in a.skip:
                res[f"update_{variant}"] = time_update(args, o, d, a.repeats, split)
                print(name, "update", variant, json.dumps(res[f"update_{variant}"]), flush=True)
            if "profile" not in a.skip and args.compile:
                path = a.out / f"profile_{name}_{variant.replace('+', '_')}.txt"  # compile_bf16, not compile+bf16
                profile_step(args, o, d, path, split)
        (a.out / "update.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
