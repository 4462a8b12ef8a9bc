"""Pretrain a CIFAR-10 flow-matching generator in the convention of the paper's checkpoint.

The paper fine-tunes the public checkpoint ``FrankCCCCC/cfm-cifar10-32`` (app:cifar). This script
trains a network of that family (``cifar_fpo.UNet2D``, the diffusers ``UNet2DModel`` layout with an
``AttnDownBlock2D``/``AttnUpBlock2D`` level) with conditional flow matching, and saves it in that
checkpoint's convention, so the result goes through exactly ``load_unet`` + ``velocity(..., "sigma")``:

- linear path ``x_sigma = sigma * noise + (1 - sigma) * x`` with ``sigma ~ U(0, 1)`` (``sigma = 1 - t``);
- the network sees ``timestep = 1000 * sigma`` and regresses ``noise - x`` (mean squared error);
- random horizontal flips; AdamW with linear warm-up; an exponential moving average (EMA) of
  the weights is what gets saved (fp16 safetensors + ``config.json`` with ``fpo_convention``).

Presets (``--preset``; later flags override): ``small`` is the 4.2M-parameter stand-in shipped in
``weights/cfm-cifar10-small``; ``paper`` is the paper's layout (35,746,307 parameters, 328 tensors) with
torchcfm's CIFAR-10 recipe (batch 128, lr 2e-4, 5,000 warm-up steps, clip 1, EMA 0.9999, dropout 0.1 while
training; the saved config.json has dropout 0, the training value is under ``_fpo_pretrain``).

Training stops after ``--max-steps`` or ``--max-minutes`` (whichever comes first), or at SIGTERM/SIGINT
(the finished steps are saved, exit 130), and continues with ``--resume`` from ``train_state.pt``. That
file holds the step, images seen, random state and data order, and, by ``--state-format``:

- ``full``: the fp32 model, EMA and Adam state (paper layout: 572.6 MB). A resumed run is bit for bit the
  uninterrupted one (on the same device and software).
- ``portable`` (paper layout: 143.4 MB, what crosses from one rented machine to the next): the EMA in
  fp16 (71.5 MB; the saved weights are fp16 too) and the model as an fp16 offset from that fp16 EMA
  (71.5 MB; model - EMA is small, so the model comes back to within fp16 precision of the offset, far
  finer than fp16 weights). Adam's moments are left out (``--portable-moments none``): a resume restarts
  them at zero and ramps the learning rate up again over ``--rewarmup-steps``. ``--portable-moments bf16``
  keeps them in bf16 (+143.3 MB). ``--reset-optimizer`` restarts the moments from any state, to measure
  what that costs.

``--eval-every N`` appends a row to ``quality.jsonl`` every N steps and at the end: the classifier-feature
Frechet distance of ``--eval-samples`` EMA samples (``--sample-steps`` Euler steps, bf16 autocast on CUDA)
against the CIFAR-10 test set, their class histogram, the mean training loss since the previous row, and
wall/train seconds (the functions of ``scripts/evaluate_generator.py``). On CUDA it keeps the uint8 dataset
on the GPU, augments there, and uses bf16 autocast, channels-last memory and ``torch.compile``.

Examples (the command for the shipped small weights is in ``weights/cfm-cifar10-small/README.md``; the
paper layout's, lease by lease, in ``benchmarks/pretrain_results/README.md``)::

    python scripts/pretrain_cfm.py --data /path/to/cifar10 --out-dir weights/cfm-cifar10-small
    python scripts/pretrain_cfm.py --preset paper --data /path/to/cifar10 --eval-every 10000 --state-format portable
"""

from __future__ import annotations

import json
import math
import pathlib
import signal
import sys
import time
from dataclasses import asdict, dataclass
from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from cifar10 import load_cifar10  # noqa: E402
from evaluate_generator import CLASSES, features_and_classes, frechet_distance, generate, to_tensor  # noqa: E402

import rewards  # noqa: E402
from fpo_utils import unet as cf  # noqa: E402
from fpo_utils.devices import pick_device  # noqa: E402
from fpo_utils.runfolder import EXIT_BAD_FILE, RunError, atomic_write, atomic_write_text, cli, read_jsonl  # noqa: E402
from fpo_utils.settings import check_at_least  # noqa: E402

STATE, QUALITY = "train_state.pt", "quality.jsonl"
EVAL_BATCH = 1000  # images per sampling / classifier batch of the quality rows


@dataclass
class Args:
    preset: Literal["small", "paper"] = "small"
    """named set of defaults (PRESETS): small (the shipped 4.2M stand-in) or paper (the 35.7M layout of app:cifar)"""
    data: str = "data/cifar10"
    """folder with cifar-10-batches-py pickles or train.zip/test.zip (see scripts/cifar10.py)"""
    out_dir: str = "weights/cfm-cifar10-small"
    """where config.json, diffusion_pytorch_model.safetensors (EMA, fp16), samples.png, quality.jsonl and
    train_state.pt go"""
    block_out_channels: tuple[int, ...] = (32, 64, 128, 128)
    """U-Net widths per resolution level (32, 16, 8, 4 pixels for four levels)"""
    layers_per_block: int = 1
    """residual layers per down block (up blocks get one more, as in diffusers)"""
    attention_level: int = 1
    """level whose down block (and mirrored up block) has self-attention (AttnDownBlock2D/AttnUpBlock2D)"""
    norm_num_groups: int = 8
    """GroupNorm groups"""
    dropout: float = 0.0
    """dropout in the residual blocks while training; the saved config.json has 0 (sampling, fine-tuning)"""
    batch_size: int = 256
    """images per optimisation step"""
    lr: float = 3e-4
    """AdamW peak learning rate (constant after warm-up)"""
    warmup_steps: int = 1000
    """linear learning-rate warm-up steps"""
    weight_decay: float = 0.0
    """AdamW weight decay"""
    grad_clip: float = 1.0
    """global gradient-norm clip"""
    ema_decay: float = 0.9999
    """EMA decay of the saved weights; early on min(ema_decay, (1+step)/(10+step)) is used"""
    max_steps: int = 1_000_000
    """stop after this many optimisation steps in total (including resumed ones)"""
    max_minutes: float = 60.0
    """stop training after this much wall time in this invocation (setup and compilation included)"""
    save_every_minutes: float = 2.0
    """write the EMA weights and train_state.pt this often"""
    log_every: int = 200
    """print the running loss every this many steps"""
    eval_every: int = 0
    """append a quality row (Frechet distance, class histogram, loss) to quality.jsonl every this many steps
    and at the end (0: never)"""
    eval_samples: int = 10_000
    """EMA samples per quality row, compared with the whole CIFAR-10 test set"""
    resume: bool = False
    """continue from out_dir/train_state.pt (either --state-format)"""
    save_state: bool = True
    """write out_dir/train_state.pt next to the weights for --resume"""
    state_format: Literal["full", "portable"] = "full"
    """train_state.pt as fp32 model, EMA and Adam state (full), or fp16 EMA + fp16 model offset (portable)"""
    portable_moments: Literal["none", "bf16"] = "none"
    """Adam's moments in a portable state: left out (none; a resume restarts them) or kept in bf16"""
    reset_optimizer: bool = False
    """on --resume, restart Adam's moments at zero (with --rewarmup-steps) even when the state has them"""
    rewarmup_steps: int = 500
    """after a resume that restarts Adam's moments, ramp the learning rate up again over this many steps"""
    seed: int = 0
    """random seed"""
    device: str = "auto"
    """auto (CUDA when available), cpu or cuda[:N]"""
    compile: bool = True
    """torch.compile the network (CUDA only)"""
    compile_mode: Literal["default", "reduce-overhead", "max-autotune"] = "default"
    """torch.compile mode (reduce-overhead: CUDA graphs; max-autotune: also tuned kernels, slow to compile)"""
    bf16: bool = True
    """bf16 autocast for the network (CUDA only); the loss and the optimiser stay fp32"""
    num_samples: int = 64
    """images in the final samples.png grid (0 to skip)"""
    sample_steps: int = 20
    """Euler steps for samples.png and the quality rows (the paper samples with 20, app:cifar)"""
    eval_images: int = 2048
    """training images for the final fixed-draw loss of the EMA weights (0 to skip)"""


PRESETS = {
    "small": Args(),
    # The paper's generator (app:cifar; SPEC.md: 35,746,307 parameters, 328 tensors) trained with the recipe of
    # torchcfm's examples/images/cifar10/train_cifar10.py, the paper's checkpoint's recipe being undocumented.
    "paper": Args(
        preset="paper",
        out_dir="runs/cfm-cifar10-35m",  # git-ignored; the finished weights are copied to weights/cfm-cifar10-35m
        block_out_channels=(128, 256, 256, 256),  # app:cifar
        layers_per_block=2,  # app:cifar: two residual layers per block
        attention_level=1,  # app:cifar: attention at the second down level and its mirrored up level
        norm_num_groups=32,  # app:cifar: 32-group normalisation
        dropout=0.1,  # torchcfm UNetModelWrapper(dropout=0.1)
        batch_size=128,  # torchcfm --batch_size 128
        lr=2e-4,  # torchcfm --lr 2e-4
        warmup_steps=5000,  # torchcfm --warmup 5000
        grad_clip=1.0,  # torchcfm --grad_clip 1.0
        ema_decay=0.9999,  # torchcfm --ema_decay 0.9999 (the early-step ramp is this script's)
        weight_decay=0.0,  # torchcfm: torch.optim.Adam, no weight decay
        max_steps=400_000,  # torchcfm --total_steps 400001
        eval_every=10_000,  # this project's: ~40 s per row on one H100, about every 5 minutes of training
    ),
}


def unet_config(args: Args) -> dict:
    """diffusers UNet2DModel config of the generator as saved (dropout 0; google/ddpm-cifar10-32-style settings)."""
    n = len(args.block_out_channels)
    if not 0 <= args.attention_level < n:
        raise ValueError(f"--attention-level {args.attention_level} must be in [0, {n - 1}] for {n} levels")
    down = ["AttnDownBlock2D" if i == args.attention_level else "DownBlock2D" for i in range(n)]
    up = ["AttnUpBlock2D" if n - 1 - i == args.attention_level else "UpBlock2D" for i in range(n)]
    return dict(
        sample_size=32,
        in_channels=3,
        out_channels=3,
        block_out_channels=list(args.block_out_channels),
        layers_per_block=args.layers_per_block,
        down_block_types=down,
        up_block_types=up,
        attention_head_dim=None,
        norm_num_groups=args.norm_num_groups,
        norm_eps=1e-6,
        flip_sin_to_cos=False,
        freq_shift=1,
        downsample_padding=0,
        center_input_sample=False,
        dropout=0.0,
        fpo_convention="sigma",
    )


def cfm_loss(net, x: torch.Tensor, noise: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
    """Flow-matching loss in the "sigma" convention: input sigma*noise + (1-sigma)*x at timestep
    1000*sigma, target noise - x (mean over all elements)."""
    s = sigma[:, None, None, None]
    out = net(s * noise + (1 - s) * x, cf.TIMESTEP_SCALE * sigma)
    return F.mse_loss(out.float(), noise - x)


def augment(batch_u8: torch.Tensor) -> torch.Tensor:
    """uint8 (B, 3, H, W) -> float in [-1, 1] with random horizontal flips."""
    x = batch_u8.float() / 127.5 - 1.0
    flip = torch.rand(x.shape[0], device=x.device) < 0.5
    return torch.where(flip[:, None, None, None], x.flip(3), x)


@torch.no_grad()
def euler_samples(net, n: int, steps: int, seed: int, device) -> torch.Tensor:
    """Images from the flow ODE, t = 0 (noise) -> 1 (data), through `velocity` (fpo_utils/unet.py)."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    x = torch.randn(n, 3, 32, 32, generator=g).to(device)
    for j in range(steps):
        x = x + cf.velocity(net, x, torch.full((n,), j / steps, device=device)) / steps
    return x.clamp(-1, 1)


def save_grid(images: torch.Tensor, path: pathlib.Path, nrow: int = 8, pad: int = 2) -> None:
    from PIL import Image

    x = ((images.float().cpu() + 1) * 127.5).round().clamp(0, 255).to(torch.uint8).permute(0, 2, 3, 1).numpy()
    n, h, w, _ = x.shape
    rows = math.ceil(n / nrow)
    grid = np.full((rows * (h + pad) + pad, nrow * (w + pad) + pad, 3), 255, np.uint8)
    for i, img in enumerate(x):
        r, c = divmod(i, nrow)
        grid[pad + r * (h + pad) : pad + r * (h + pad) + h, pad + c * (w + pad) : pad + c * (w + pad) + w] = img
    Image.fromarray(grid).save(path, format="PNG")


def pack_weights(net, ema, opt, state_format: str, moments: str) -> dict:
    """The weights and optimiser part of train_state.pt (see the module docstring for the two formats)."""
    if state_format == "full":
        return dict(format="full", model=net.state_dict(), ema=ema.state_dict(), optimizer=opt.state_dict())
    ema16 = {k: v.detach().to("cpu", torch.float16).contiguous() for k, v in ema.state_dict().items()}
    model = net.state_dict()
    offset16 = {k: (model[k].detach().to("cpu", torch.float32) - ema16[k].float()).half() for k in ema16}
    if not all(torch.isfinite(v).all() for v in [*ema16.values(), *offset16.values()]):
        raise RunError("a weight or its offset from the EMA overflows fp16; use --state-format full")
    packed = dict(format="portable", ema16=ema16, offset16=offset16, moments=None)
    if moments == "bf16":
        packed["moments"] = {
            i: {"step": s["step"], **{k: s[k].to("cpu", torch.bfloat16) for k in ("exp_avg", "exp_avg_sq")}}
            for i, s in opt.state_dict()["state"].items()
        }
    return packed


def unpack_weights(state: dict, net, ema, opt, reset_optimizer: bool) -> bool:
    """Load `pack_weights`' output (either format) into net, ema and opt; whether Adam's moments came back."""
    if state.get("format", "full") == "full":
        net.load_state_dict(state["model"])
        ema.load_state_dict(state["ema"])
        opt_state = state["optimizer"]
    else:
        ema16, offset16 = state["ema16"], state["offset16"]
        ema.load_state_dict({k: v.float() for k, v in ema16.items()})
        net.load_state_dict({k: v.float() + offset16[k].float() for k, v in ema16.items()})
        opt_state = None
        if state["moments"] is not None:
            groups = opt.state_dict()["param_groups"]
            moments = {
                i: {k: v.float() if k != "step" else v for k, v in m.items()} for i, m in state["moments"].items()
            }
            opt_state = {"state": moments, "param_groups": groups}
    if opt_state is None or reset_optimizer:
        return False
    opt.load_state_dict(opt_state)
    return True


@torch.no_grad()
def quality(ema, clf, test_features: np.ndarray, args: Args, device, autocast) -> dict:
    """Frechet distance to the test set and class histogram of args.eval_samples EMA samples (fixed latents)."""
    t0 = time.time()
    with autocast:
        samples = generate(ema, args.eval_samples, args.sample_steps, args.seed, EVAL_BATCH, device, ema.convention)
    features, classes = features_and_classes(clf, samples.float(), EVAL_BATCH)
    hist = np.bincount(classes, minlength=len(CLASSES)) / len(classes)
    return dict(
        frechet=round(frechet_distance(features, test_features), 4),
        class_histogram={c: round(float(p), 5) for c, p in zip(CLASSES, hist)},
        largest_class_share=round(float(hist.max()), 5),
        smallest_class_share=round(float(hist.min()), 5),
        eval_samples=args.eval_samples,
        sample_steps=args.sample_steps,
        eval_seconds=round(time.time() - t0, 1),
    )


def main(args: Args) -> dict:
    t_start = time.time()
    check_at_least(args, ["eval_every", "rewarmup_steps", "eval_images", "num_samples"], 0)
    check_at_least(args, ["batch_size", "log_every", "sample_steps", "layers_per_block"], 1)
    if args.eval_every and args.eval_samples < 2:
        raise ValueError(f"--eval-samples {args.eval_samples} must be >= 2 for a Frechet distance")
    if not 0.0 <= args.dropout < 1.0:
        raise ValueError(f"--dropout {args.dropout} must be in [0, 1)")
    device = pick_device(args.device)
    cuda = device.type == "cuda"
    config = unet_config(args)
    out = pathlib.Path(args.out_dir)
    state_path = out / STATE
    state = None
    if args.resume:
        if not state_path.is_file():
            raise RunError(f"--resume: no {state_path}; start without --resume or give its --out-dir", EXIT_BAD_FILE)
        state = torch.load(state_path, map_location="cpu", weights_only=False)
        old = {"dropout": 0.0, **state["unet_config"]}  # states written before dropout was a flag lack the key
        if old != config:
            keys = sorted(k for k in {**config, **old} if config.get(k) != old.get(k))
            raise RunError(
                f"--resume: {state_path} holds another architecture ({', '.join(f'{k}={old.get(k)}' for k in keys)});"
                " give the flags (or --preset) it was trained with"
            )
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(args.seed)
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
        torch.backends.cudnn.benchmark = True

    images, _ = load_cifar10(args.data, "train")
    data = torch.from_numpy(images).permute(0, 3, 1, 2).contiguous().to(device)  # uint8 (N, 3, 32, 32)
    n_data = data.shape[0]
    if args.batch_size > n_data:
        raise ValueError(f"--batch-size {args.batch_size} is larger than the {n_data} training images")
    print(f"data: {n_data} images from {args.data} in {time.time() - t_start:.1f}s", flush=True)
    clf = test_features = None
    if args.eval_every:  # the test set's classifier features, once per process
        clf = rewards.load_classifier(None, device=device)
        test_features, _ = features_and_classes(clf, to_tensor(load_cifar10(args.data, "test")[0], device))

    net = cf.UNet2D.from_config({**config, "dropout": args.dropout}).to(device)
    ema = cf.UNet2D.from_config(config).to(device).eval().requires_grad_(False)
    ema.load_state_dict(net.state_dict())
    opt = torch.optim.AdamW(net.parameters(), lr=args.lr, betas=(0.9, 0.999), weight_decay=args.weight_decay)
    step, seen, train_seconds, rewarm_from = 0, 0, 0.0, None
    perm, pos = torch.randperm(n_data, device=device), 0
    if state is not None:
        moments_back = unpack_weights(state, net, ema, opt, args.reset_optimizer)
        step, seen, train_seconds = state["step"], state["images_seen"], state["train_seconds"]
        rewarm_from = state.get("rewarm_from") if moments_back else step
        torch.set_rng_state(state["cpu_rng"])
        if cuda and state.get("cuda_rng") is not None:
            torch.cuda.set_rng_state(state["cuda_rng"], device)
        if "perm" in state:
            if len(state["perm"]) != n_data:
                raise RunError(
                    f"--resume: {state_path} was trained on {len(state['perm'])} images, --data has {n_data}"
                )
            perm, pos = state["perm"].long().to(device), state["pos"]
        fmt = state.get("format", "full")
        adam = "restored" if moments_back else f"restarted (learning rate re-warmed over {args.rewarmup_steps} steps)"
        print(f"resumed from {state_path} ({fmt}) at step {step}; Adam's moments {adam}", flush=True)
    n_params = sum(p.numel() for p in net.parameters())
    print(f"UNet2D: {n_params:,} parameters, config {json.dumps(config)}, dropout {args.dropout}", flush=True)

    if cuda:
        net, ema = net.to(memory_format=torch.channels_last), ema.to(memory_format=torch.channels_last)
    model = net
    autocast = torch.autocast("cuda", dtype=torch.bfloat16, enabled=cuda and args.bf16)
    graphs = cuda and args.compile and args.compile_mode == "reduce-overhead"
    if cuda and args.compile:
        compiled = torch.compile(net, mode=args.compile_mode)
        try:  # compile now (forward and backward) and fall back to eager mode if that fails
            cpu_rng, cuda_rng = torch.get_rng_state(), torch.cuda.get_rng_state(device)
            x = augment(data[: args.batch_size]).contiguous(memory_format=torch.channels_last)
            with autocast:
                cfm_loss(compiled, x, torch.randn_like(x), torch.rand(x.shape[0], device=device)).backward()
            torch.set_rng_state(cpu_rng)  # the warm-up draws leave the run's random stream as it was
            torch.cuda.set_rng_state(cuda_rng, device)
            model = compiled
            print(f"compiled ({args.compile_mode}) in {time.time() - t_start:.0f}s since start", flush=True)
        except Exception as e:  # noqa: BLE001
            print(f"torch.compile failed ({type(e).__name__}: {e}); training in eager mode", flush=True)
            graphs = False
        opt.zero_grad(set_to_none=True)
    params, ema_params = list(net.parameters()), list(ema.parameters())

    def info() -> dict:
        return dict(
            steps=step,
            images_seen=seen,
            epochs=seen / n_data,
            train_seconds=round(train_seconds, 1),
            dropout=args.dropout,
            preset=args.preset,
        )

    def save(final: bool = False) -> None:
        cf.save_unet(ema, out, dtype=torch.float16, _fpo_pretrain=info())
        if args.save_state:
            snapshot = dict(
                **pack_weights(net, ema, opt, args.state_format, args.portable_moments),
                step=step,
                images_seen=seen,
                train_seconds=train_seconds,
                rewarm_from=rewarm_from,
                perm=perm.int().cpu(),
                pos=pos,
                unet_config=config,
                args=asdict(args),
                cpu_rng=torch.get_rng_state(),
                cuda_rng=torch.cuda.get_rng_state(device) if cuda else None,
            )
            atomic_write(state_path, lambda tmp: torch.save(snapshot, tmp))
        print(f"saved {'final ' if final else ''}EMA weights at step {step} to {out}", flush=True)

    rows = read_jsonl(out / QUALITY)
    last_row_step = rows[-1]["step"] if rows else None

    def write_quality() -> None:
        nonlocal q_sum, q_n, last_row_step
        row = dict(step=step, images_seen=seen, epochs=round(seen / n_data, 3))
        row.update(quality(ema, clf, test_features, args, device, autocast))
        row.update(loss=q_sum.item() / q_n if q_n else None, loss_steps=q_n, train_seconds=round(train_seconds, 1))
        row["wall_seconds"] = round(time.time() - t_start, 1)
        q_sum.zero_()
        q_n, last_row_step = 0, step
        text = (out / QUALITY).read_text() if (out / QUALITY).exists() else ""
        atomic_write_text(out / QUALITY, text + json.dumps(row) + "\n")
        share = row["largest_class_share"]
        print(f"quality at step {step}: Frechet {row['frechet']:.3f}, largest class {share:.3f}", flush=True)

    stop: list[str] = []  # the signal that asked to stop (SIGTERM/SIGINT): finish the step, save, exit 130

    def on_signal(signum, frame) -> None:
        stop.append(signal.Signals(signum).name)

    handlers = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    loss_sum, loss_n, q_sum, q_n = torch.zeros((), device=device), 0, torch.zeros((), device=device), 0
    t_save = t_loop = time.time()
    start_step = step
    try:
        while step < args.max_steps and time.time() - t_start < args.max_minutes * 60 and not stop:
            if pos + args.batch_size > n_data:
                perm, pos = torch.randperm(n_data, device=device), 0
            x = augment(data[perm[pos : pos + args.batch_size]])
            pos += args.batch_size
            if cuda:
                x = x.contiguous(memory_format=torch.channels_last)
            noise, sigma = torch.randn_like(x), torch.rand(x.shape[0], device=device)
            lr = args.lr * min(1.0, (step + 1) / max(args.warmup_steps, 1))
            if rewarm_from is not None:  # Adam's moments restarted at step rewarm_from
                lr *= min(1.0, (step - rewarm_from + 1) / max(args.rewarmup_steps, 1))
            for group in opt.param_groups:
                group["lr"] = lr
            if graphs:
                torch.compiler.cudagraph_mark_step_begin()
            with autocast:
                loss = cfm_loss(model, x, noise, sigma)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, args.grad_clip)
            opt.step()
            decay = min(args.ema_decay, (1 + step) / (10 + step))
            with torch.no_grad():
                torch._foreach_lerp_(ema_params, params, 1.0 - decay)
            step += 1
            seen += x.shape[0]
            loss_sum += loss.detach()
            q_sum += loss.detach()
            loss_n += 1
            q_n += 1
            if step % args.log_every == 0 or step == start_step + 1:
                mean = loss_sum.item() / loss_n
                loss_sum.zero_()
                loss_n = 0
                elapsed = time.time() - t_start
                line = f"step {step} epoch {seen / n_data:.2f} loss {mean:.4f} (mean since last line) {elapsed:.0f}s"
                print(line, flush=True)
            if args.eval_every and step % args.eval_every == 0:
                train_seconds += time.time() - t_loop
                write_quality()
                t_loop = time.time()
            if time.time() - t_save > args.save_every_minutes * 60:
                train_seconds += time.time() - t_loop
                save()
                t_loop = t_save = time.time()
        train_seconds += time.time() - t_loop
        save(final=True)
        if stop:
            print(f"{stop[0]}: stopped at step {step}, state saved to {state_path}; continue with --resume", flush=True)
        elif args.eval_every and last_row_step != step:
            write_quality()
    finally:
        for s, h in handlers.items():
            signal.signal(s, h)
    summary = dict(
        status="interrupted" if stop else "finished",
        steps=step,
        epochs=round(seen / n_data, 2),
        train_seconds=round(train_seconds, 1),
        wall_seconds=round(time.time() - t_start, 1),
        parameters=n_params,
        device=torch.cuda.get_device_name(device) if cuda else "cpu",
    )
    if not stop:  # everything below reads the saved folder back, i.e. what users of the saved weights get
        saved = cf.load_unet(out, device=device)
        if args.eval_images:
            g = torch.Generator(device="cpu").manual_seed(12345)
            idx = torch.randperm(n_data, generator=g)[: args.eval_images].to(device)
            x = data[idx].float() / 127.5 - 1.0
            noise = torch.randn(x.shape, generator=g).to(device)
            sigma = torch.rand(x.shape[0], generator=g).to(device)
            with torch.no_grad():
                chunks = [slice(i, i + 256) for i in range(0, len(x), 256)]
                loss = sum(cfm_loss(saved, x[c], noise[c], sigma[c]).item() * len(x[c]) for c in chunks) / len(x)
            summary["final_ema_loss"] = round(loss, 5)
        if args.num_samples > 0:
            grid = euler_samples(saved, args.num_samples, args.sample_steps, args.seed, device)
            atomic_write(out / "samples.png", lambda tmp: save_grid(grid, tmp))
    print("summary " + json.dumps(summary), flush=True)
    atomic_write_text(out / "train_summary.json", json.dumps({**summary, "args": asdict(args)}, indent=2) + "\n")
    return summary


if __name__ == "__main__":
    cli(main, Args, presets=PRESETS)
