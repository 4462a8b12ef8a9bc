"""Time a grid of CIFAR runs (alphas x seeds, paper update settings) on the GPUs of one machine.

The grid goes through `halving.py cifar-grid` (every arm a Ray task reserving 1/`--arms-per-gpu` of
a GPU; without Ray, or with `--no-ray`, one arm after another). By default every arm runs at once:
ceil(arms / GPUs) arms share each GPU. The network is the paper's U-Net layout with random weights
(no download; speed does not depend on the weights) unless `--model` names a generator folder.

    python benchmarks/bench_cifar_grid.py                                   # 4 alphas x 3 seeds x 800
    python benchmarks/bench_cifar_grid.py --updates 60                      # a timing sample
    CUDA_VISIBLE_DEVICES=0 python benchmarks/bench_cifar_grid.py --updates 60   # the same on one GPU

Prints the wall time, the start-up share (process start, compilation, CUDA-graph capture), the
steady-state throughput in updates per second over all arms (from the per-update timestamps in
each arm's metrics.jsonl, while every arm was running) and the grid time this throughput implies
for `--full-updates` per arm. `--json PATH` writes the same numbers.
"""

from __future__ import annotations

import json
import math
import shutil
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
from bench_cifar_update import PAPER_UNET  # noqa: E402

import cifar_fpo  # noqa: E402
import halving  # noqa: E402


@dataclass
class Args:
    alphas: Tuple[float, ...] = (-2.0, -1.0, 0.0, 1.0)
    """Exponents of the 12-bin family (app:search-settings)."""
    seeds: Tuple[int, ...] = (20260724, 20260725, 20260726)
    """Training seeds (app:method-settings)."""
    updates: int = 800
    """Updates per arm in this run (a multiple of the validation cadence, 20)."""
    full_updates: int = 800
    """Updates per arm of the grid whose time is extrapolated (app:cifar: 800)."""
    arms_per_gpu: Optional[int] = None
    """Arms sharing one GPU (each reserves 1/N of it); default: every arm at once, ceil(arms / GPUs)."""
    ray: bool = True
    """Arms as Ray tasks on a local Ray (`--no-ray`: one after another in this process)."""
    precision: str = "bf16"
    """--precision of every arm."""
    compile: bool = True
    """--compile --reuse-old-losses of every arm (the fast path)."""
    model: Optional[str] = None
    """Generator folder; default: the paper's U-Net layout with random weights."""
    reward: str = "red-patch"
    """Reward (pixel-only by default, so no reward weights are needed)."""
    out_dir: Optional[str] = None
    """Keep the arms' folders here (default: a temporary folder, removed afterwards)."""
    json: Optional[str] = None
    """Write the numbers to this JSON file."""


def steady_throughput(arms_dir: Path) -> Tuple[float, float, float]:
    """(updates per second over all arms while every arm ran, window start, window end)."""
    stamps = []
    for metrics in arms_dir.glob("*/metrics.jsonl"):
        recs = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
        stamps.append(sorted(r["unix_time"] for r in recs if r.get("kind") == "update"))
    start = max(s[0] for s in stamps)  # every arm has finished its first update
    end = min(s[-1] for s in stamps)  # no arm has finished yet
    done = sum(sum(1 for x in s if start < x <= end) for s in stamps)
    return done / max(end - start, 1e-9), start, end


def main(args: Args):
    tmp = Path(tempfile.mkdtemp())
    try:
        model = args.model
        if model is None:
            torch.manual_seed(0)
            model = str(tmp / "paper_unet")
            cifar_fpo.save_unet(cifar_fpo.UNet2D.from_config(PAPER_UNET), model, dtype=torch.float32)
        out = Path(args.out_dir) if args.out_dir else tmp / "runs"
        arms = len(args.alphas) * len(args.seeds)
        train = replace(
            cifar_fpo.Args(),
            model=model,
            reward=args.reward,
            precision=args.precision,
            compile=args.compile,
            reuse_old_losses=args.compile,
            estimator="q+a",
            early_stop=False,
            num_updates=args.updates,
            verbose=False,
            save_samples=False,
        )
        gpus = torch.cuda.device_count()
        per_gpu = args.arms_per_gpu or (math.ceil(arms / gpus) if gpus else 1)
        spec = halving.CifarGrid(
            alphas=args.alphas,
            seeds=args.seeds,
            name="grid",
            out_dir=str(out),
            ray=args.ray,
            gpus_per_arm=1.0 / per_gpu if gpus else 0.0,
            train=train,
        )
        t0 = time.time()
        halving.run_grid(spec)
        wall = time.time() - t0
        rate, start, end = steady_throughput(out / "grid" / "arms")
        startup = start - t0
        implied = startup + arms * args.full_updates / rate
        result = {
            "device": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())],
            "gpus": gpus,
            "arms": arms,
            "arms_per_gpu": per_gpu,
            "ray": args.ray,
            "updates": args.updates,
            "precision": args.precision,
            "compile": args.compile,
            "wall_s": wall,
            "startup_s": startup,
            "steady_updates_per_s": rate,
            "steady_ms_per_update": 1e3 / rate,
            "full_updates": args.full_updates,
            "implied_full_grid_s": implied,
        }
        print(json.dumps(result, indent=2))
        print(
            f"\n{arms} arms x {args.updates} updates on {gpus} GPU(s), {per_gpu} per GPU: "
            f"{wall:.0f} s wall, {startup:.0f} s start-up, {rate:.2f} updates/s steady "
            f"({1e3 / rate:.0f} ms per update); {arms} x {args.full_updates} updates -> ~{implied / 60:.1f} min"
        )
        if args.json:
            Path(args.json).write_text(json.dumps(result, indent=2))
        return result
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main(tyro.cli(Args))
