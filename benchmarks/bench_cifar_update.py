"""Time one paper-configuration CIFAR update of Algorithm 1 (alg:cifar) on whatever device is present.

One update = 64 samples x 20 Euler steps with the frozen copy, old and current velocity losses on
4 draws per sample, one backward pass and one Adam step; the validation (4 banks x 128 images x 20
steps every 20 updates, app:cifar) is timed separately and amortised over 20 updates.

The network is the paper's U-Net layout (google/ddpm-cifar10-32 style, 35.7M parameters) with random
weights, so no download is needed; speed does not depend on the weights.

    python benchmarks/bench_cifar_update.py                       # all precisions
    python benchmarks/bench_cifar_update.py --precisions fp32 --updates 5

Prints ms/update (with amortised validation), achieved TFLOP/s and the device.
"""

from __future__ import annotations

import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Tuple

import torch
import tyro

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import cifar_fpo  # noqa: E402

PAPER_UNET = {
    "_class_name": "UNet2DModel",
    "sample_size": 32,
    "in_channels": 3,
    "out_channels": 3,
    "block_out_channels": [128, 256, 256, 256],
    "down_block_types": ["DownBlock2D", "AttnDownBlock2D", "DownBlock2D", "DownBlock2D"],
    "up_block_types": ["UpBlock2D", "UpBlock2D", "AttnUpBlock2D", "UpBlock2D"],
    "layers_per_block": 2,
    "attention_head_dim": None,
    "norm_num_groups": 32,
    "norm_eps": 1e-6,
    "act_fn": "silu",
    "flip_sin_to_cos": False,
    "freq_shift": 1,
    "downsample_padding": 0,
    "center_input_sample": False,
    "mid_block_scale_factor": 1,
    "time_embedding_type": "positional",
}


@dataclass
class Args:
    precisions: Tuple[str, ...] = ("fp32", "tf32", "bf16")
    """Precision modes to time (see cifar_fpo.Args.precision)."""
    updates: int = 10
    """Timed updates per mode (after 2 warm-up updates)."""
    reward: str = "red-patch"
    """Reward used in the timed updates (pixel-only by default, so no reward weights are needed)."""
    device: str = "auto"
    """Device: auto, cpu or cuda."""
    batch_size: int = 64
    """Samples per update (app:cifar)."""
    sample_steps: int = 20
    """Euler steps (app:cifar)."""


def forward_gflop(net, device) -> float:
    """GFLOP of one image's forward pass, counted by torch's FLOP counter."""
    from torch.utils.flop_counter import FlopCounterMode

    x = torch.randn(1, 3, 32, 32, device=device)
    t = torch.full((1,), 500.0, device=device)
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        net(x, t)
    return counter.get_total_flops() / 1e9


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def main(args: Args):
    device = cifar_fpo.pick_device(args.device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"cpu ({torch.get_num_threads()} threads)"
    with tempfile.TemporaryDirectory() as tmp:
        torch.manual_seed(0)
        net = cifar_fpo.UNet2D.from_config(PAPER_UNET)
        cifar_fpo.save_unet(net, tmp, dtype=torch.float32)
        gflop = forward_gflop(net.to(device), device)
        params = sum(p.numel() for p in net.parameters())
        del net
        # forward-equivalents per update: sampling n*S, old losses 4n, current fwd+bwd 3*4n,
        # validation 512*S every 20 updates
        n, s = args.batch_size, args.sample_steps
        fwd_equiv = n * s + 4 * n + 3 * 4 * n + 512 * s / 20
        rows = []
        for precision in args.precisions:
            run = cifar_fpo.setup(cifar_fpo.Args(model=tmp, reward=args.reward, device=str(device),
                                                 precision=precision, batch_size=n, sample_steps=s,
                                                 calib_bank_size=64, verbose=False, save_samples=False))
            for _ in range(2):
                cifar_fpo.train_step(run)
                run.k += 1
            sync(device)
            t0 = time.perf_counter()
            for _ in range(args.updates):
                cifar_fpo.train_step(run)
                run.k += 1
            sync(device)
            step_ms = (time.perf_counter() - t0) / args.updates * 1e3
            cifar_fpo.validate(run)
            sync(device)
            t0 = time.perf_counter()
            cifar_fpo.validate(run)
            sync(device)
            val_ms = (time.perf_counter() - t0) * 1e3
            total = step_ms + val_ms / 20
            tflops = fwd_equiv * gflop * 1e9 / (total / 1e3) / 1e12
            rows.append((precision, step_ms, val_ms, total, tflops))
            del run
            if device.type == "cuda":
                torch.cuda.empty_cache()
    print(f"\ndevice: {name}   torch {torch.__version__}   U-Net {params:,} params, {gflop:.2f} GFLOP/image fwd")
    print(f"update: batch {n} x {s} Euler steps, 4 draws, Adam; validation 512 x {s} steps every 20 updates")
    print(f"{'precision':>9} | {'update ms':>9} | {'validation ms':>13} | {'ms/update (amortised)':>21} | {'TFLOP/s':>7}")
    for p, a, v, t, f in rows:
        print(f"{p:>9} | {a:9.1f} | {v:13.1f} | {t:21.1f} | {f:7.1f}")


if __name__ == "__main__":
    main(tyro.cli(Args))
