"""How fast does one GPU run a pretraining step of the paper-layout generator, and where does the time go?

One step of `scripts/pretrain_cfm.py --preset paper` (batch 128: flips, the flow-matching loss under bf16
autocast, backward, gradient clipping, AdamW, the EMA update), on random images, timed for a few variants, each
after its own warm-up:

- `compiled`: what pretrain_cfm.py does (torch.compile default mode, AdamW's foreach kernels);
- `compiled+fused`: the same compiled network with AdamW(fused=True) (one kernel for the whole update);
- `eager+fused`: no compilation, fused AdamW;
- `graphs+fused`: torch.compile's reduce-overhead mode (the forward and backward replayed as CUDA graphs), fused
  AdamW.

Besides steps per second, each variant's `network` time (forward and backward alone, no optimiser, clipping or
EMA) shows how much of a step the network is. Results go to stdout and, after each variant, to --json.

    python benchmarks/bench_pretrain_step.py --json bench_pretrain_step.json
    python benchmarks/bench_pretrain_step.py --variants compiled compiled+fused --steps 100
    python benchmarks/bench_pretrain_step.py --quick       # checks the script on a CPU (small layout, eager)

Needs a CUDA GPU, but for --quick.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import pretrain_cfm as pc  # noqa: E402

from fpo_utils import unet as cf  # noqa: E402

VARIANTS = ("compiled", "compiled+fused", "eager+fused", "graphs+fused")


def sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn, steps: int, device) -> float:
    """Seconds per call of fn, after synchronising before and after `steps` calls."""
    sync(device)
    t = time.perf_counter()
    for _ in range(steps):
        fn()
    sync(device)
    return (time.perf_counter() - t) / steps


def run_variant(name: str, steps: int, warmup: int, device, preset: str = "paper", batch: int = 0) -> dict:
    args = pc.PRESETS[preset]
    batch = batch or args.batch_size
    config = pc.unet_config(args)
    torch.manual_seed(0)
    net = cf.UNet2D.from_config({**config, "dropout": args.dropout}).to(device, memory_format=torch.channels_last)
    ema = cf.UNet2D.from_config(config).to(device, memory_format=torch.channels_last).eval().requires_grad_(False)
    params, ema_params = list(net.parameters()), list(ema.parameters())
    opt = torch.optim.AdamW(params, lr=args.lr, weight_decay=0.0, fused=name.endswith("+fused"))
    mode = "reduce-overhead" if name.startswith("graphs") else "default"
    model = net if name.startswith("eager") else torch.compile(net, mode=mode)
    graphs = name.startswith("graphs")
    data = torch.randint(0, 256, (4096, 3, 32, 32), dtype=torch.uint8, device=device)
    autocast = torch.autocast("cuda", dtype=torch.bfloat16, enabled=device.type == "cuda")

    def network() -> torch.Tensor:
        x = pc.augment(data[torch.randint(0, len(data), (batch,), device=device)])
        x = x.contiguous(memory_format=torch.channels_last)
        if graphs:
            torch.compiler.cudagraph_mark_step_begin()
        with autocast:
            loss = pc.cfm_loss(model, x, torch.randn_like(x), torch.rand(x.shape[0], device=device))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        return loss

    def step() -> None:
        network()
        torch.nn.utils.clip_grad_norm_(params, args.grad_clip)
        opt.step()
        with torch.no_grad():
            torch._foreach_lerp_(ema_params, params, 1.0 - args.ema_decay)

    t0 = time.perf_counter()
    for _ in range(warmup):
        step()
    sync(device)
    setup = time.perf_counter() - t0
    per_step = timed(step, steps, device)
    per_network = timed(network, steps, device)
    cuda = device.type == "cuda"
    return dict(
        variant=name,
        setup_s=round(setup, 1),
        step_ms=round(per_step * 1e3, 2),
        steps_per_s=round(1 / per_step, 2),
        network_ms=round(per_network * 1e3, 2),
        rest_ms=round((per_step - per_network) * 1e3, 2),
        peak_mem_gib=round(torch.cuda.max_memory_allocated(device) / 2**30, 2) if cuda else None,
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS), help="what to time")
    p.add_argument("--steps", type=int, default=200, help="timed steps per variant")
    p.add_argument("--warmup", type=int, default=20, help="untimed steps first (compilation included)")
    p.add_argument("--json", type=Path, default=None, help="write the rows here after each variant")
    p.add_argument("--quick", action="store_true", help="CPU check: small layout, batch 8, eager+fused, 2 steps")
    a = p.parse_args()
    if a.quick:
        device, preset, batch, variants, a.steps, a.warmup = torch.device("cpu"), "small", 8, ["eager+fused"], 2, 1
    elif not torch.cuda.is_available():
        sys.exit("error: bench_pretrain_step.py needs a CUDA GPU (none is visible); --quick runs on a CPU")
    else:
        device, preset, batch, variants = torch.device("cuda"), "paper", 0, a.variants
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True  # as pretrain_cfm.py
        torch.backends.cudnn.benchmark = True
    rows = []
    for name in variants:
        torch._dynamo.reset()
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        rows.append(run_variant(name, a.steps, a.warmup, device, preset, batch))
        print(json.dumps(rows[-1]), flush=True)
        if a.json:
            card = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
            out = dict(device=card, torch=torch.__version__, preset=preset, rows=rows)
            a.json.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
