"""Time one paper-configuration CIFAR update of Algorithm 1 (alg:cifar) on whatever device is present.

One update = 64 samples x 20 Euler steps, old and current velocity losses on 4 draws per sample, one
backward pass and one Adam step; the validation (4 banks x 128 images x 20 steps every 20 updates,
app:cifar) is timed separately and amortised over 20 updates. Every mode runs the same code path,
the loop of `cifar_fpo.train` (with a run folder that writes nothing) and `cifar_fpo.validate`.

Modes: `fp32`, `tf32`, `bf16` (eager, `--precision`), and `tf32+compile`, `bf16+compile` (the fast
path: `--compile --reuse-old-losses`, the old losses taken from the current forward). `peer-<precision>` is
the naive baseline: diffusers' own `UNet2DModel` run eagerly through Algorithm 1 as written (frozen
copy, separate old-loss forward, 128-image validation chunks); `peer-tf32+compile` and `peer-bf16+compile`
are the fair peers: the same, with both diffusers networks through `torch.compile` (and cuDNN autotuning),
as a user of diffusers would speed it up. The peer modes need diffusers installed (on a GPU machine without
a package index: `DIFFUSERS=1 ROBOT=0 bash benchmarks/gpu_bundle.sh DIR`). Each mode's "vs peer" column
is the ms/update of the peer of the same precision and compilation divided by the mode's; when that peer
was not measured, the eager peer of the same precision, else the fastest peer (the column names it).

`--model paper` (the default) times the paper's U-Net layout (google/ddpm-cifar10-32 style, 35.7M
parameters): the trained weights in weights/cfm-cifar10-35m when they are there, else random weights, so
no download is needed; speed does not depend on the weights. `--model` also takes a diffusers folder or a
Hugging Face repo id (e.g. weights/cfm-cifar10-small).

    python benchmarks/bench_cifar_update.py                                  # eager modes
    python benchmarks/bench_cifar_update.py --modes peer-tf32 tf32 bf16+compile --breakdown
    python benchmarks/bench_cifar_update.py --modes bf16+compile peer-bf16+compile tf32+compile peer-tf32+compile
    python benchmarks/bench_cifar_update.py --modes fp32 --updates 5 --device cpu

Prints ms/update (with amortised validation), achieved TFLOP/s (forward-equivalents actually
computed: 3 per backward image, 4n fewer forwards when the old losses are reused), the share of
the card's dense bf16 peak, and the device. `--json PATH` also writes the rows.
"""

from __future__ import annotations

import copy
import json
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Optional, Tuple

import torch
import tyro

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import cifar_fpo  # noqa: E402
from fpo_utils import cifar_graphs  # noqa: E402
from fpo_utils.devices import pick_device  # noqa: E402
from fpo_utils.unet import WEIGHTS_NAMES, resolve_model  # noqa: E402
from fpo_utils.unet import model_folder as unet_folder  # noqa: E402

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

# Dense (no sparsity) bf16 tensor-core peaks in TFLOP/s, from the vendors' data sheets.
DENSE_BF16_PEAK = {
    "H100 80GB HBM3": 989.4,
    "H100 SXM": 989.4,
    "H100 PCIe": 756.5,
    "H100 NVL": 835.5,
    "H200": 989.4,
    "A100": 312.0,
}
INDUCTOR_SETTINGS = ("default", "coord", "max-autotune")
MODES = (
    "fp32",
    "tf32",
    "bf16",
    "tf32+compile",
    "bf16+compile",
    "peer-fp32",
    "peer-tf32",
    "peer-bf16",
    "peer-tf32+compile",
    "peer-bf16+compile",
)
ROOT = Path(__file__).resolve().parents[1]
PAPER_WEIGHTS = ROOT / "weights" / "cfm-cifar10-35m"  # the paper layout pretrained by scripts/pretrain_cfm.py


@dataclass
class Args:
    modes: Tuple[str, ...] = ("fp32", "tf32", "bf16")
    """Modes to time, in order: fp32, tf32, bf16, tf32+compile, bf16+compile, peer-fp32, peer-tf32, peer-bf16,
    peer-tf32+compile, peer-bf16+compile."""
    model: str = "paper"
    """The network: paper (the paper's layout: weights/cfm-cifar10-35m if there, else random weights), or a
    diffusers folder or Hugging Face repo id."""
    updates: int = 10
    """Timed updates per mode (after `warmup` updates)."""
    warmup: int = 3
    """Untimed updates first (the compiled modes compile and capture here)."""
    reward: str = "red-patch"
    """Reward used in the timed updates (pixel-only by default, so no reward weights are needed)."""
    device: str = "auto"
    """Device: auto, cpu or cuda."""
    batch_size: int = 64
    """Samples per update (app:cifar)."""
    sample_steps: int = 20
    """Euler steps (app:cifar)."""
    breakdown: bool = False
    """Also time the parts on their own: rollout sampling, loss forward+backward, Adam step."""
    json: Optional[str] = None
    """Write the table rows (and the device) to this JSON file."""
    inductor: str = "default"
    """Compiler setting of the compiled modes: default, coord (coordinate-descent tuning of generated
    kernels, 1x1 convolutions as matrix products) or max-autotune (Triton templates benchmarked against
    cuDNN/cuBLAS per shape; slow to compile)."""


def apply_inductor_setting(name: str):
    """Set torch inductor's global options for one of INDUCTOR_SETTINGS (before anything compiles)."""
    if name not in INDUCTOR_SETTINGS:
        raise ValueError(f"inductor setting {name!r} is not one of {', '.join(INDUCTOR_SETTINGS)}")
    import torch._inductor.config as ind

    if name == "coord":
        ind.coordinate_descent_tuning = True
        ind.conv_1x1_as_mm = True
    elif name == "max-autotune":
        ind.max_autotune = True


class DiffusersNet(torch.nn.Module):
    """diffusers' UNet2DModel behind the `net(x, timestep) -> tensor` call of cifar_fpo."""

    def __init__(self, model):
        super().__init__()
        self.model = model
        self.config = dict(model.config)

    def forward(self, x, timestep):
        return self.model(x, timestep).sample


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


class NullFolder:
    """The run-folder calls `cifar_fpo.train` makes, doing nothing: the benchmark times updates only."""

    stop_requested = False

    def log(self, *args, **kwargs):
        pass

    save_checkpoint = plot_curve = save_images = log

    def write_summary(self, summary):
        return summary

    def progress(self, total, initial=0, unit="update"):
        from tqdm import tqdm

        return tqdm(total=total, initial=initial, disable=True)


def make_run(mode: str, folder: str, args: Args, device):
    """A cifar_fpo Run for one mode; peer modes swap in diffusers' UNet2DModel through Algorithm 1 as written,
    eager or (`+compile`) with the network and its frozen copy through torch.compile."""
    peer = mode.startswith("peer-")
    precision = mode.split("+")[0].replace("peer-", "")
    compiled = mode.endswith("+compile")
    never = 10**9  # validation only at update 0 (in the warm-up), no checkpoints: both are timed apart
    run = cifar_fpo.setup(
        cifar_fpo.Args(
            model=folder,
            reward=args.reward,
            device=str(device),
            precision=precision,
            compile=compiled and not peer,
            reuse_old_losses=compiled and not peer,
            batch_size=args.batch_size,
            sample_steps=args.sample_steps,
            calib_bank_size=64,
            verbose=False,
            save_samples=False,
            val_every=never,
            checkpoint_every=never,
            early_stop=False,
        )
    )
    if peer:
        from diffusers import UNet2DModel

        net = DiffusersNet(UNet2DModel.from_pretrained(folder).to(device)).train()
        old = copy.deepcopy(net).eval().requires_grad_(False)
        if compiled:  # in place (Module.compile): the loop's load_state_dict into the frozen copy still works
            torch.backends.cudnn.benchmark = True
            net.compile(dynamic=False)
            old.compile(dynamic=False)
        run.net = run.fwd = net
        run.old_net = old
        run.sampler = cifar_graphs.eval_sampler(
            cifar_fpo.sample_images, net, net, args.sample_steps, run.convention, run.autocast
        )
        run.optimizer = torch.optim.Adam(net.parameters(), lr=run.args.learning_rate, betas=(0.9, 0.999), eps=1e-8)
    return run


def model_folder(model: str, tmp: str) -> str:
    """The folder `--model` names: for paper, weights/cfm-cifar10-35m when its weights are there, else random
    weights of the paper layout saved in `tmp`."""
    if model == "paper":
        if (PAPER_WEIGHTS / WEIGHTS_NAMES[0]).is_file():
            return str(PAPER_WEIGHTS)
        torch.manual_seed(0)
        cifar_fpo.save_unet(cifar_fpo.UNet2D.from_config(PAPER_UNET), tmp, dtype=torch.float32)
        return tmp
    return str(unet_folder(resolve_model(model)))


def peer_for(mode: str, measured: dict) -> Optional[str]:
    """The peer mode whose ms/update `mode`'s "vs peer" divides: the peer of the same precision and compilation,
    else the eager peer of the same precision, else the fastest peer measured (None when no peer was)."""
    key = mode.replace("peer-", "")
    for name in (f"peer-{key}", f"peer-{key.split('+')[0]}"):
        if name in measured:
            return name
    peers = [m for m in measured if m.startswith("peer-")]
    return min(peers, key=measured.get) if peers else None


def run_updates(run, n: int):
    """n updates of Algorithm 1 through the loop of `cifar_fpo.train`."""
    run.args = replace(run.args, until=run.k + n)
    cifar_fpo.train(run, NullFolder())


def time_breakdown(run, args: Args, device, reps: int = 5):
    """ms of: one rollout sampling call, one loss forward+backward, one Adam step."""
    n, m = args.batch_size, run.args.mc_draws
    lat = torch.randn(n, 3, 32, 32, device=device)
    x = run.sampler(lat)
    t = torch.rand(n, m, device=device)
    eps = torch.randn(n, m, 3, 32, 32, device=device)

    def timed(fn):
        fn()
        sync(device)
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        sync(device)
        return (time.perf_counter() - t0) / reps * 1e3

    def loss_step():
        run.optimizer.zero_grad(set_to_none=True)
        cifar_fpo.velocity_losses(run.fwd, x, t, eps, run.convention, run.autocast).mean().backward()

    sample_ms = timed(lambda: run.sampler(lat))
    loss_ms = timed(loss_step)
    adam_ms = timed(run.optimizer.step)
    return sample_ms, loss_ms, adam_ms


def time_mode(mode: str, folder: str, args: Args, device, gflop: float, peak: Optional[float]):
    """Set up one mode, warm it up, and time updates and one validation; `peak` is the card's dense
    bf16 TFLOP/s (None when unknown)."""
    n, s = args.batch_size, args.sample_steps
    t_setup = time.perf_counter()
    run = make_run(mode, folder, args, device)
    reuse = bool(run.args.reuse_old_losses)
    # forward-equivalents actually computed per update: sampling n*S, old losses 4n (unless
    # reused), current losses forward+backward 3*4n, validation 512*S every 20 updates
    fwd_equiv = n * s + (0 if reuse else 4 * n) + 3 * 4 * n + 512 * s / 20
    run_updates(run, args.warmup)
    cifar_fpo.validate(run)
    sync(device)
    warm_s = time.perf_counter() - t_setup
    t0 = time.perf_counter()
    run_updates(run, args.updates)
    sync(device)
    step_ms = (time.perf_counter() - t0) / args.updates * 1e3
    t0 = time.perf_counter()
    cifar_fpo.validate(run)
    sync(device)
    val_ms = (time.perf_counter() - t0) * 1e3
    total = step_ms + val_ms / 20
    tflops = fwd_equiv * gflop * 1e9 / (total / 1e3) / 1e12
    row = {
        "mode": mode,
        "update_ms": step_ms,
        "validation_ms": val_ms,
        "ms_per_update": total,
        "tflops": tflops,
        "peak_frac": tflops / peak if peak else None,
        "setup_warmup_s": warm_s,
    }
    if args.breakdown:
        row["sample_ms"], row["loss_fwd_bwd_ms"], row["adam_ms"] = time_breakdown(run, args, device)
    print(
        f"{mode}: {total:.1f} ms/update ({step_ms:.1f} + {val_ms:.0f}/20), setup+warm-up {warm_s:.0f} s"
        + (
            f", sample {row['sample_ms']:.1f} ms, loss fwd+bwd {row['loss_fwd_bwd_ms']:.1f} ms, "
            f"Adam {row['adam_ms']:.1f} ms"
            if args.breakdown
            else ""
        ),
        flush=True,
    )
    return row


def main(args: Args):
    bad = [m for m in args.modes if m not in MODES]
    if bad:
        raise ValueError(f"--modes {bad} not in {', '.join(MODES)}")
    apply_inductor_setting(args.inductor)
    device = pick_device(args.device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"cpu ({torch.get_num_threads()} threads)"
    peak = next((v for k, v in DENSE_BF16_PEAK.items() if k in name), None)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = model_folder(args.model, tmp)
        net = cifar_fpo.load_unet(folder)
        gflop = forward_gflop(net.to(device), device)
        params = sum(p.numel() for p in net.parameters())
        del net
        n, s = args.batch_size, args.sample_steps
        for mode in args.modes:
            if mode.startswith("peer-"):
                try:
                    import diffusers  # noqa: F401
                except ImportError:
                    print(f"skip {mode}: diffusers is not installed", flush=True)
                    continue
            try:
                rows.append(time_mode(mode, folder, args, device, gflop, peak))
            except Exception as err:  # report and go on with the other modes
                print(f"FAILED {mode}: {type(err).__name__}: {err}", flush=True)
            if device.type == "cuda":
                torch.cuda.empty_cache()
    ms = {r["mode"]: r["ms_per_update"] for r in rows}
    for r in rows:
        r["peer"] = peer_for(r["mode"], ms)
        r["vs_peer"] = ms[r["peer"]] / r["ms_per_update"] if r["peer"] else None
    print(
        f"\ndevice: {name}   torch {torch.__version__}   U-Net {params:,} params, {gflop:.2f} GFLOP/image fwd   "
        f"inductor: {args.inductor}"
    )
    print(f"update: batch {n} x {s} Euler steps, 4 draws, Adam; validation 512 x {s} steps every 20 updates")
    print(
        f"{'mode':>17} | {'update ms':>9} | {'validation ms':>13} | {'ms/update (amortised)':>21} | "
        f"{'TFLOP/s':>7} | {'% bf16 peak':>11} | vs peer"
    )
    for r in rows:
        frac = f"{100 * r['peak_frac']:.1f}" if r["peak_frac"] is not None else "-"
        vs = f"{r['vs_peer']:.2f}x ({r['peer']})" if r["vs_peer"] else "-"
        print(
            f"{r['mode']:>17} | {r['update_ms']:9.1f} | {r['validation_ms']:13.1f} | {r['ms_per_update']:21.1f} | "
            f"{r['tflops']:7.1f} | {frac:>11} | {vs}"
        )
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {"device": name, "torch": torch.__version__, "gflop": gflop, "params": params, "rows": rows}, indent=2
            )
        )
    return rows


if __name__ == "__main__":
    try:
        main(tyro.cli(Args))
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
