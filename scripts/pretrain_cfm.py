"""Pretrain the small stand-in CIFAR-10 flow-matching generator shipped in ``weights/``.

The paper fine-tunes the public checkpoint ``FrankCCCCC/cfm-cifar10-32`` (app:cifar). This script
trains a smaller network of the same family (``cifar_fpo.UNet2D``, the diffusers ``UNet2DModel``
layout with an ``AttnDownBlock2D``/``AttnUpBlock2D`` level) with conditional flow matching, and
saves it in that checkpoint's convention, so ``python cifar_fpo.py`` can run out of the box and
the shipped model goes through exactly ``load_unet`` + ``velocity(..., "sigma")``:

- linear path ``x_sigma = sigma * noise + (1 - sigma) * x`` with ``sigma ~ U(0, 1)`` (``sigma = 1 - t``);
- the network sees ``timestep = 1000 * sigma`` and regresses ``noise - x`` (mean squared error);
- random horizontal flips; AdamW with linear warm-up; an exponential moving average (EMA) of
  the weights is what gets saved (fp16 safetensors + ``config.json`` with ``fpo_convention``).

Training stops after ``--max-steps`` or ``--max-minutes`` (whichever comes first) and can be
continued with ``--resume`` from the ``train_state.pt`` it writes (model, EMA, optimiser, step,
random state). On CUDA it keeps the uint8 dataset on the GPU, augments there, and uses bf16
autocast, channels-last memory and ``torch.compile``.

Example (the command for the shipped weights is in ``weights/cfm-cifar10-small/README.md``)::

    python scripts/pretrain_cfm.py --data /path/to/cifar10 --out-dir weights/cfm-cifar10-small
"""

from __future__ import annotations

import json
import math
import pathlib
import sys
import time
from dataclasses import asdict, dataclass

import numpy as np
import torch
import torch.nn.functional as F
import tyro

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from cifar10 import load_cifar10  # noqa: E402

from fpo_utils import unet as cf  # noqa: E402


@dataclass
class Args:
    data: str = "data/cifar10"
    """folder with cifar-10-batches-py pickles or train.zip (see scripts/cifar10.py)"""
    out_dir: str = "weights/cfm-cifar10-small"
    """where config.json, diffusion_pytorch_model.safetensors (EMA, fp16), samples.png and train_state.pt go"""
    block_out_channels: tuple[int, ...] = (32, 64, 128, 128)
    """U-Net widths per resolution level (32, 16, 8, 4 pixels for four levels)"""
    layers_per_block: int = 1
    """residual layers per down block (up blocks get one more, as in diffusers)"""
    attention_level: int = 1
    """level whose down block (and mirrored up block) has self-attention (AttnDownBlock2D/AttnUpBlock2D)"""
    norm_num_groups: int = 8
    """GroupNorm groups"""
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
    resume: bool = False
    """continue from out_dir/train_state.pt"""
    save_state: bool = True
    """write out_dir/train_state.pt (fp32 model, EMA and optimiser) next to the weights for --resume"""
    seed: int = 0
    """random seed"""
    device: str = "auto"
    """auto (CUDA when available), cpu or cuda[:N]"""
    compile: bool = True
    """torch.compile the network (CUDA only)"""
    bf16: bool = True
    """bf16 autocast for the network (CUDA only); the loss and the optimiser stay fp32"""
    num_samples: int = 64
    """images in the final samples.png grid (0 to skip)"""
    sample_steps: int = 20
    """Euler steps for samples.png (the paper samples with 20, app:cifar)"""
    eval_images: int = 2048
    """training images for the final fixed-draw loss of the EMA weights"""


def unet_config(args: Args) -> dict:
    """diffusers UNet2DModel config of the generator (google/ddpm-cifar10-32-style settings)."""
    n = len(args.block_out_channels)
    if not 0 <= args.attention_level < n:
        raise ValueError(f"attention_level={args.attention_level} must be in [0, {n - 1}] for {n} levels")
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
    Image.fromarray(grid).save(path)


def main(args: Args) -> dict:
    t_start = time.time()
    if args.device == "auto":
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    else:
        device = torch.device(args.device)
    cuda = device.type == "cuda"
    out = pathlib.Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(args.seed)
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
        torch.backends.cudnn.benchmark = True

    images, _ = load_cifar10(args.data, "train")
    data = torch.from_numpy(images).permute(0, 3, 1, 2).contiguous().to(device)  # uint8 (N, 3, 32, 32)
    n_data = data.shape[0]
    print(f"data: {n_data} images from {args.data} in {time.time() - t_start:.1f}s", flush=True)

    net = cf.UNet2D.from_config(unet_config(args)).to(device)
    ema = cf.UNet2D.from_config(unet_config(args)).to(device).eval().requires_grad_(False)
    ema.load_state_dict(net.state_dict())
    opt = torch.optim.AdamW(net.parameters(), lr=args.lr, betas=(0.9, 0.999), weight_decay=args.weight_decay)
    step, seen, train_seconds = 0, 0, 0.0
    state_path = out / "train_state.pt"
    if args.resume:
        state = torch.load(state_path, map_location=device, weights_only=False)
        if state["unet_config"] != unet_config(args):
            raise ValueError(
                f"--resume: {state_path} was trained with a different architecture: {state['unet_config']}"
            )
        net.load_state_dict(state["model"])
        ema.load_state_dict(state["ema"])
        opt.load_state_dict(state["optimizer"])
        step, seen, train_seconds = state["step"], state["images_seen"], state["train_seconds"]
        torch.set_rng_state(state["cpu_rng"])
        if cuda and state.get("cuda_rng") is not None:
            torch.cuda.set_rng_state(state["cuda_rng"])
        print(f"resumed from {state_path} at step {step}", flush=True)
    n_params = sum(p.numel() for p in net.parameters())
    print(f"UNet2D: {n_params:,} parameters, config {json.dumps(unet_config(args))}", flush=True)

    if cuda:
        net, ema = net.to(memory_format=torch.channels_last), ema.to(memory_format=torch.channels_last)
    model = net
    autocast = torch.autocast("cuda", dtype=torch.bfloat16, enabled=cuda and args.bf16)
    if cuda and args.compile:
        compiled = torch.compile(net)
        try:  # compile now (forward and backward) and fall back to eager mode if that fails
            x = augment(data[: args.batch_size]).contiguous(memory_format=torch.channels_last)
            with autocast:
                cfm_loss(compiled, x, torch.randn_like(x), torch.rand(x.shape[0], device=device)).backward()
            model = compiled
            print(f"compiled in {time.time() - t_start:.0f}s since start", flush=True)
        except Exception as e:  # noqa: BLE001
            print(f"torch.compile failed ({type(e).__name__}: {e}); training in eager mode", flush=True)
        opt.zero_grad(set_to_none=True)
    params, ema_params = list(net.parameters()), list(ema.parameters())

    def save(final: bool = False) -> None:
        info = dict(steps=step, images_seen=seen, epochs=seen / n_data, train_seconds=round(train_seconds, 1))
        cf.save_unet(ema, out, dtype=torch.float16, _fpo_pretrain=info)
        if args.save_state:
            torch.save(
                dict(
                    model=net.state_dict(),
                    ema=ema.state_dict(),
                    optimizer=opt.state_dict(),
                    step=step,
                    images_seen=seen,
                    train_seconds=train_seconds,
                    unet_config=unet_config(args),
                    args=asdict(args),
                    cpu_rng=torch.get_rng_state(),
                    cuda_rng=torch.cuda.get_rng_state() if cuda else None,
                ),
                state_path,
            )
        print(f"saved {'final ' if final else ''}EMA weights at step {step} to {out}", flush=True)

    perm, pos = torch.randperm(n_data, device=device), 0
    loss_sum, loss_n, t_save, t_loop = torch.zeros((), device=device), 0, time.time(), time.time()
    start_step = step
    while step < args.max_steps and time.time() - t_start < args.max_minutes * 60:
        if pos + args.batch_size > n_data:
            perm, pos = torch.randperm(n_data, device=device), 0
        x = augment(data[perm[pos : pos + args.batch_size]])
        pos += args.batch_size
        if cuda:
            x = x.contiguous(memory_format=torch.channels_last)
        noise, sigma = torch.randn_like(x), torch.rand(x.shape[0], device=device)
        for group in opt.param_groups:
            group["lr"] = args.lr * min(1.0, (step + 1) / max(args.warmup_steps, 1))
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
        loss_n += 1
        if step % args.log_every == 0 or step == start_step + 1:
            mean = loss_sum.item() / loss_n
            loss_sum.zero_()
            loss_n = 0
            elapsed = time.time() - t_start
            print(
                f"step {step} epoch {seen / n_data:.2f} loss {mean:.4f} (mean since last line) {elapsed:.0f}s",
                flush=True,
            )
        if time.time() - t_save > args.save_every_minutes * 60:
            train_seconds += time.time() - t_loop
            t_loop = t_save = time.time()
            save()
    train_seconds += time.time() - t_loop
    save(final=True)

    # Everything below reads the saved folder back, i.e. what users of the shipped weights get.
    saved = cf.load_unet(out, device=device)
    g = torch.Generator(device="cpu").manual_seed(12345)
    idx = torch.randperm(n_data, generator=g)[: args.eval_images].to(device)
    x = data[idx].float() / 127.5 - 1.0
    noise = torch.randn(x.shape, generator=g).to(device)
    sigma = torch.rand(x.shape[0], generator=g).to(device)
    with torch.no_grad():
        chunks = [slice(i, i + 256) for i in range(0, len(x), 256)]
        final_loss = sum(cfm_loss(saved, x[c], noise[c], sigma[c]).item() * len(x[c]) for c in chunks) / len(x)
    if args.num_samples > 0:
        save_grid(euler_samples(saved, args.num_samples, args.sample_steps, args.seed, device), out / "samples.png")
    summary = dict(
        steps=step,
        epochs=round(seen / n_data, 2),
        train_seconds=round(train_seconds, 1),
        wall_seconds=round(time.time() - t_start, 1),
        final_ema_loss=round(final_loss, 5),
        parameters=n_params,
        device=torch.cuda.get_device_name(device) if cuda else "cpu",
    )
    print("summary " + json.dumps(summary), flush=True)
    (out / "train_summary.json").write_text(json.dumps({**summary, "args": asdict(args)}, indent=2) + "\n")
    return summary


if __name__ == "__main__":
    main(tyro.cli(Args))
