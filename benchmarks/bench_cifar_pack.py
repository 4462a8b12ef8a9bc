"""Grid throughput of packed CIFAR runs (cifar_fpo_pack.py) against one run alone, on one device.

K runs of Algorithm 1 at the paper configuration's shapes (64 samples x 20 Euler steps, 4 draws per
sample, one Adam step; the validation, 4 x 128 images x 20 steps every 20 updates, is timed apart and
amortised over 20 updates, as in bench_cifar_update.py) are trained as one pack for each K in
`--packs`, and one run through the single-run loop of `cifar_fpo.train`. The runs of a pack differ in
seed and alpha, as a grid's do. Throughput is run-updates per second: K x updates / time. Every row is
timed in this process on this device after `--warmup` untimed updates.

The network is the shipped 4.2M-parameter stand-in (the generator a grid of stand-in runs trains) or
`--network paper`, the paper's 35.7M-parameter U-Net layout with random weights (speed does not depend
on the weights).

    python benchmarks/bench_cifar_pack.py --json pack.json               # K = 1, 4, 8, 16, 32
    python benchmarks/bench_cifar_pack.py --packs 8 32 --precision bf16 --compile
    python benchmarks/bench_cifar_pack.py --quick                          # tiny sizes: checks the script on a CPU

Prints one row per mode (ms per update of the whole pack, validation ms, ms per run-update amortised,
run-updates per second and the ratio to the run alone); `--json PATH` writes the rows. A K that does
not fit in memory (or a setting a pack does not take) is reported and skipped.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Optional, Tuple

import torch
import tyro

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
from bench_cifar_update import PAPER_UNET, NullFolder, run_updates, sync  # noqa: E402

import cifar_fpo  # noqa: E402
import cifar_fpo_pack as cifar_pack  # noqa: E402
from fpo_utils.devices import pick_device  # noqa: E402

ALPHAS = (-2.0, -1.0, 0.0, 1.0)  # the grid's exponents, cycled over a pack's runs


@dataclass
class Args:
    packs: Tuple[int, ...] = (1, 4, 8, 16, 32)
    """Pack sizes K to time."""
    updates: int = 5
    """Timed updates per mode (after `warmup` updates)."""
    warmup: int = 2
    """Untimed updates first."""
    network: str = "standin"
    """standin (the shipped 4.2M-parameter generator) or paper (the paper's U-Net layout, random weights)."""
    reward: str = "red-patch"
    """Reward (pixel-only by default, so no reward weights are needed)."""
    device: str = "auto"
    """Device: auto, cpu or cuda."""
    precision: str = "fp32"
    """--precision of every run: fp32 (the paper's), tf32 or bf16."""
    compile: bool = False
    """--compile --reuse-old-losses of every run (alone: its fast mode; a pack: cuDNN autotuning, reused losses)."""
    batch_size: int = 64
    """Samples per update (app:cifar)."""
    sample_steps: int = 20
    """Euler steps (app:cifar)."""
    quick: bool = False
    """Tiny sizes for a check of the script on a CPU: K = 1, 2; batch 4, 2 steps, 2 draws, 8 validation images."""
    json: Optional[str] = None
    """Write the rows (and the device) to this JSON file."""


def run_args(args: Args, model: str, device, seed: int, alpha: float) -> cifar_fpo.Args:
    never = 10**9  # validation only at update 0, no checkpoints: both are timed apart
    base = cifar_fpo.Args(
        model=model,
        reward=args.reward,
        device=str(device),
        precision=args.precision,
        compile=args.compile,
        reuse_old_losses=args.compile,
        batch_size=args.batch_size,
        sample_steps=args.sample_steps,
        calib_bank_size=64,
        verbose=False,
        save_samples=False,
        val_every=never,
        checkpoint_every=never,
        early_stop=False,
        seed=seed,
        alpha=alpha,
    )
    if args.quick:
        base = replace(base, group_size=2, mc_draws=2, val_banks=1, val_bank_size=8, calib_bank_size=8)
    return base


def timed(fn, device) -> float:
    sync(device)
    t0 = time.perf_counter()
    fn()
    sync(device)
    return time.perf_counter() - t0


def time_alone(args: Args, model: str, device) -> dict:
    """One run through `cifar_fpo.train` (the single-run path)."""
    run = cifar_fpo.setup(run_args(args, model, device, 20260724, ALPHAS[0]))
    run_updates(run, args.warmup)  # validates at update 0 on the way
    step_s = timed(lambda: run_updates(run, args.updates), device) / args.updates
    val_s = timed(lambda: cifar_fpo.validate(run), device)
    return row("alone", 1, step_s, val_s)


def time_pack(args: Args, model: str, device, k: int) -> dict:
    """K runs as one pack through `cifar_pack.update` and `cifar_pack.validate`."""
    settings = [run_args(args, model, device, 20260724 + i, ALPHAS[i % len(ALPHAS)]) for i in range(k)]
    cifar_pack.check_packable([replace(cifar_fpo.resolve_args(a), run_name=f"run{i}") for i, a in enumerate(settings)])
    runs = [cifar_fpo.setup(a) for a in settings]
    pack = cifar_pack.Pack(runs, [NullFolder() for _ in runs])
    cifar_pack.validate(pack)
    for _ in range(args.warmup):
        cifar_pack.update(pack, {})
    step_s = timed(lambda: [cifar_pack.update(pack, {}) for _ in range(args.updates)], device) / args.updates
    val_s = timed(lambda: cifar_pack.validate(pack), device)
    return row("pack", k, step_s, val_s)


def row(mode: str, k: int, step_s: float, val_s: float) -> dict:
    per_update = step_s + val_s / 20  # the validation every 20 updates, amortised
    return {
        "mode": mode,
        "K": k,
        "update_ms": 1e3 * step_s,
        "validation_ms": 1e3 * val_s,
        "ms_per_run_update": 1e3 * per_update / k,
        "run_updates_per_s": k / per_update,
    }


def main(args: Args):
    if args.network not in ("standin", "paper"):
        raise ValueError(f"--network {args.network!r} is not one of standin, paper")
    if args.quick:
        args = replace(args, packs=(1, 2), updates=2, warmup=1, batch_size=4, sample_steps=2)
    device = pick_device(args.device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"cpu ({torch.get_num_threads()} threads)"
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        model = cifar_fpo.DEFAULT_MODEL
        if args.network == "paper":
            torch.manual_seed(0)
            model = tmp
            cifar_fpo.save_unet(cifar_fpo.UNet2D.from_config(PAPER_UNET), model, dtype=torch.float32)
        params = sum(p.numel() for p in cifar_fpo.load_unet(model).parameters())
        for mode, k in [("alone", 1)] + [("pack", k) for k in args.packs]:
            try:
                r = time_alone(args, model, device) if mode == "alone" else time_pack(args, model, device, k)
                rows.append(r)
                print(f"{mode} K={k}: {r['run_updates_per_s']:.2f} run-updates/s", flush=True)
            except torch.OutOfMemoryError:
                print(f"{mode} K={k}: out of memory, skipped", flush=True)
            except ValueError as err:  # a setting a pack does not take
                print(f"{mode} K={k}: skipped ({err})", flush=True)
            if device.type == "cuda":
                torch.cuda.empty_cache()
    alone = next((r["run_updates_per_s"] for r in rows if r["mode"] == "alone"), None)
    for r in rows:
        r["vs_alone"] = r["run_updates_per_s"] / alone if alone else None
    print(f"\ndevice: {name}   torch {torch.__version__}   network {args.network} ({params:,} parameters)")
    print(
        f"update: batch {args.batch_size} x {args.sample_steps} Euler steps, Adam, precision {args.precision}"
        f"{', compile' if args.compile else ''}; validation every 20 updates, amortised"
    )
    print(
        f"{'mode':>5} | {'K':>3} | {'update ms':>9} | {'validation ms':>13} | {'ms / run-update':>15} | "
        f"{'run-updates/s':>13} | {'vs alone':>8}"
    )
    for r in rows:
        vs = f"{r['vs_alone']:.2f}x" if r["vs_alone"] else "-"
        print(
            f"{r['mode']:>5} | {r['K']:>3} | {r['update_ms']:9.1f} | {r['validation_ms']:13.1f} | "
            f"{r['ms_per_run_update']:15.2f} | {r['run_updates_per_s']:13.2f} | {vs:>8}"
        )
    if args.json:
        result = {"device": name, "torch": torch.__version__, "network": args.network, "params": params}
        Path(args.json).write_text(json.dumps({**result, "args": vars(args), "rows": rows}, indent=2))
    return rows


if __name__ == "__main__":
    try:
        main(tyro.cli(Args))
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
