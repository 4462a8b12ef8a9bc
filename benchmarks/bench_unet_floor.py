"""How fast can one GPU run the paper's U-Net? Kernel throughput at the batch sizes of one CIFAR update.

One paper-configuration update (alg:cifar, app:cifar) runs the U-Net at three shapes: the rollout
sampler at batch 64 (20 Euler steps), the current losses forward+backward at batch 256 (64 samples x
4 draws), and the validation at batch 512 (512 images x 20 steps every 20 updates = one batch-512
forward per update, amortised). This script times exactly those kernels with nothing else around
them, in the fast mode's numerics (bf16 autocast, `torch.compile`, forwards replayed as CUDA graphs so
no launch overhead is counted), for a few compiler settings:

- `default`: `torch.compile(net, dynamic=False)`, as `cifar_fpo.py --compile` does;
- `coord`: the same plus inductor's coordinate-descent tuning of its generated kernels and 1x1
  convolutions lowered to matrix products;
- `max-autotune`: inductor's max-autotune without its own CUDA graphs (it benchmarks Triton templates
  against cuDNN/cuBLAS for every convolution and matrix product; slow to compile).

From the timings it prints two numbers per setting:

- `kernels-only update`: 20 x fwd(64) + fwd+bwd(256) + fwd(512), i.e. what one update costs when
  the GPU does nothing but the network (no sampler arithmetic, losses, Adam or host work);
- `floor`: 2,560 forward-equivalents (1,280 sampling + 768 for the losses' forward and backward +
  512 validation) at the best per-image forward time measured at any batch size, i.e. the update's
  cost if every forward and backward ran as efficiently as the best large-batch forward.

    python benchmarks/bench_unet_floor.py                       # all settings, one process each
    python benchmarks/bench_unet_floor.py --configs default --batches 64 512 1024

Needs a CUDA GPU.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Tuple

import torch
import tyro

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench_cifar_update import DENSE_BF16_PEAK, INDUCTOR_SETTINGS, PAPER_UNET, apply_inductor_setting, forward_gflop  # noqa: E402

import cifar_fpo  # noqa: E402

CONFIGS = INDUCTOR_SETTINGS
FWD_EQUIV = {"sampling": 64 * 20, "losses": 3 * 4 * 64, "validation": 512}  # per update, app:cifar


@dataclass
class Args:
    configs: Tuple[str, ...] = CONFIGS
    """Compiler settings to time, each in its own process: default, coord, max-autotune."""
    batches: Tuple[int, ...] = (64, 512, 1024)
    """Forward batch sizes to time (64 and 512 are needed for the update estimate)."""
    train_batch: int = 256
    """Batch of the forward+backward timing (64 samples x 4 draws in the paper's update)."""
    reps: int = 30
    """Timed repetitions per shape (after warm-up)."""
    timeout: int = 420
    """Seconds allowed per setting (compile included) before it is reported as timed out."""
    json: Optional[str] = None
    """Write all rows to this JSON file."""
    worker: Optional[str] = None
    """(internal) time this one setting in this process and print its JSON row."""


def compile_net(net: torch.nn.Module, config: str):
    apply_inductor_setting(config)
    return torch.compile(net, dynamic=False)


def time_forward(fwd, b: int, reps: int, device) -> float:
    """ms of one batch-`b` forward (eval mode, no grad, bf16 autocast), replayed as a CUDA graph."""
    x = torch.randn(b, 3, 32, 32, device=device)
    t = torch.rand(b, device=device) * 1000.0
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        with torch.cuda.stream(side):
            for _ in range(3):
                fwd(x, t)
        torch.cuda.current_stream(device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fwd(x, t)
    for _ in range(3):
        graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        graph.replay()
    end.record()
    torch.cuda.synchronize(device)
    return start.elapsed_time(end) / reps


def time_forward_backward(fwd, net, b: int, reps: int, device) -> float:
    """ms of one batch-`b` forward + backward in training mode (as the current losses run)."""
    x = torch.randn(b, 3, 32, 32, device=device)
    t = torch.rand(b, device=device) * 1000.0
    target = torch.randn(b, 3, 32, 32, device=device)

    def step():
        net.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = fwd(x, t)
        (out.float() - target).square().mean().backward()

    for _ in range(3):
        step()
    torch.cuda.synchronize(device)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        step()
    end.record()
    torch.cuda.synchronize(device)
    return start.elapsed_time(end) / reps


def worker(config: str, args: Args) -> dict:
    device = torch.device("cuda")
    torch.backends.cudnn.benchmark = True
    torch.manual_seed(0)
    net = cifar_fpo.UNet2D.from_config(PAPER_UNET).to(device)
    gflop = forward_gflop(net, device)
    fwd = compile_net(net, config)
    t0 = time.perf_counter()
    net.eval()
    fwd_ms = {b: time_forward(fwd, b, args.reps, device) for b in args.batches}
    net.train()
    fb_ms = time_forward_backward(fwd, net, args.train_batch, args.reps, device)
    wall = time.perf_counter() - t0
    return {
        "config": config,
        "gflop": gflop,
        "fwd_ms": fwd_ms,
        "fwd_bwd_ms": fb_ms,
        "train_batch": args.train_batch,
        "wall_s": wall,
    }


def summarise(row: dict, peak: Optional[float]) -> dict:
    g = row["gflop"]
    us = {b: ms * 1e3 / b for b, ms in row["fwd_ms"].items()}  # microseconds per image forward
    fb_us = row["fwd_bwd_ms"] * 1e3 / (3 * row["train_batch"])  # per forward-equivalent
    best = min(us.values())
    row["tflops"] = {b: g * 1e9 / (u * 1e-6) / 1e12 for b, u in us.items()}
    row["fwd_bwd_tflops"] = g * 1e9 / (fb_us * 1e-6) / 1e12
    if 64 in row["fwd_ms"] and 512 in row["fwd_ms"]:
        fb256 = fb_us * 3 * 256 / 1e3
        row["kernels_only_update_ms"] = 20 * row["fwd_ms"][64] + fb256 + row["fwd_ms"][512]
    row["floor_ms"] = sum(FWD_EQUIV.values()) * best / 1e3
    row["best_tflops"] = g * 1e9 / (best * 1e-6) / 1e12
    row["best_peak_frac"] = row["best_tflops"] / peak if peak else None
    return row


def main(args: Args):
    if args.worker is not None:
        print("ROW " + json.dumps(worker(args.worker, args)), flush=True)
        return
    if not torch.cuda.is_available():
        raise SystemExit("error: this benchmark needs a CUDA GPU")
    bad = [c for c in args.configs if c not in CONFIGS]
    if bad:
        raise SystemExit(f"error: --configs {bad} not in {', '.join(CONFIGS)}")
    name = torch.cuda.get_device_name(0)
    peak = next((v for k, v in DENSE_BF16_PEAK.items() if k in name), None)
    rows = []
    for config in args.configs:
        cmd = [
            sys.executable,
            __file__,
            "--worker",
            config,
            "--batches",
            *map(str, args.batches),
            "--train-batch",
            str(args.train_batch),
            "--reps",
            str(args.reps),
        ]
        t0 = time.perf_counter()
        try:
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
        except subprocess.TimeoutExpired:
            print(f"{config}: timed out after {args.timeout} s", flush=True)
            continue
        line = next((ln for ln in out.stdout.splitlines() if ln.startswith("ROW ")), None)
        if line is None:
            print(f"{config}: FAILED\n{out.stderr[-2000:]}", flush=True)
            continue
        row = json.loads(line[4:])
        row["fwd_ms"] = {int(k): v for k, v in row["fwd_ms"].items()}
        row["process_s"] = time.perf_counter() - t0
        rows.append(summarise(row, peak))
        r = rows[-1]
        print(
            f"{config}: "
            + ", ".join(f"fwd b{b} {ms:.2f} ms ({r['tflops'][b]:.0f} TFLOP/s)" for b, ms in r["fwd_ms"].items())
            + f", fwd+bwd b{r['train_batch']} {r['fwd_bwd_ms']:.2f} ms ({r['fwd_bwd_tflops']:.0f} TFLOP/s), "
            f"process {r['process_s']:.0f} s",
            flush=True,
        )
    print(f"\ndevice: {name}   torch {torch.__version__}   bf16 autocast, CUDA-graph forwards")
    print(
        "| setting | fwd b64 ms | fwd b512 ms | fwd+bwd b256 ms | best fwd TFLOP/s (% peak) "
        "| kernels-only update ms | floor ms |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        frac = f" ({100 * r['best_peak_frac']:.0f}%)" if r["best_peak_frac"] else ""
        print(
            f"| {r['config']} | {r['fwd_ms'].get(64, float('nan')):.2f} | {r['fwd_ms'].get(512, float('nan')):.2f} | "
            f"{r['fwd_bwd_ms'] * 256 / r['train_batch']:.2f} | {r['best_tflops']:.0f}{frac} | "
            f"{r.get('kernels_only_update_ms', float('nan')):.1f} | {r['floor_ms']:.1f} |"
        )
    if args.json:
        Path(args.json).write_text(json.dumps({"device": name, "torch": torch.__version__, "rows": rows}, indent=1))


if __name__ == "__main__":
    main(tyro.cli(Args))
