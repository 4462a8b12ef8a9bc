"""Diagnostics of timestep-weighted flow-matching RL: gradient geometry across noise bins, output
coherence, local reward response, and heatmaps (app:gradients, app:cifar-gradients,
app:robotics-new-geometry, app:mechanisms, app:approved-heatmaps).

Commands (``python diagnostics.py <command> --help`` for the options of each)::

    gram          CIFAR: per-bin parameter gradients of the diagnostic surrogate at a checkpoint,
                  within/cross-batch cosines, the raw Gram decomposition W = K + N, S, RMS,
                  block summaries and the paired control; writes .npz + .json + heatmap PNGs.
    robot-gram    The same statistics for a robot_fpo.py checkpoint (forced r = 1).
    robot-phases  Average robot-gram results within seed, then across seeds, over phase windows.
    coherence     Output coherence c_b per bin (the statistic static softmax uses, eq:coherence).
    response      Local reward response M, C, O, DD over Fourier bands and amplitudes.
    heatmap       Re-render one matrix of a saved result as a PNG.
    atlas         A grid of heatmap panels (rows = profiles, columns = checkpoints or phases).

Storage conventions. Bins are stored in increasing flow time (bin 0 is the noisiest, t = 0 is
noise); heatmaps reverse this so the clean end sits at the upper left and the noisy end at the
lower right (app:approved-heatmaps). A gradient vector is the flattened gradient of all trainable
parameters of the network (CIFAR: the U-Net; robots: the actor).

The Gram statistics (fpo_utils/gram.py, with the memory layout of the streamed gradient Gram) and
the heatmaps (fpo_utils/heatmaps.py) import without the trainers; this file measures checkpoints.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch
import tyro

import cifar_fpo
from fpo_utils.devices import PRECISIONS, pick_device, set_precision
from fpo_utils.gram import (
    block_summary,
    default_memory_bytes,
    gram_statistics,
    paired_control_cosines,
    phase_average,
    streamed_gram,
    summarise,
)
from fpo_utils.heatmaps import cifar_labels, save_atlas, save_heatmap
from fpo_utils.runfolder import RunError, strict
from fpo_utils.unet import DEFAULT_MODEL, UNet2D, load_unet, resolve_model
from rewards import make_reward
from weighting import WeightingRule, coherence_from_moments

# ---------------------------------------------------------------------------------------------
# Constants
# ---------------------------------------------------------------------------------------------
CIFAR_BINS = 12  # app:cifar-gradients: twelve time bins
CIFAR_BATCHES = 4  # app:cifar-gradients: four independent on-policy batches
CIFAR_DRAWS_PER_BIN = 64  # app:cifar-gradients: 64 draws per bin
DIAG_RATIO_CLIP = 0.08  # app:cifar-gradients: clip(r, .92, 1.08)
DIAG_LOG_CLIP = 20.0  # app:cifar-gradients: clip((L_old - L_new)/d, -20, 20)
ROBOT_BATCHES = 8  # app:robotics-new-geometry: eight fresh on-policy batches
ROBOT_BINS = 10  # FPO: the 10-point s grid; FPO++: ten bins (app:robotics-new-geometry)
# app:mechanisms: spatial Fourier bands (cycles/pixel) and amplitudes (in [0, 1] image units)
BANDS = {"coarse": (0.0, 0.08), "middle": (0.08, 0.22), "fine": (0.22, math.inf)}
AMPLITUDES = (2 / 255, 4 / 255, 8 / 255)
RESPONSE_ANCHORS = 256  # app:mechanisms: 256 anchors from the pretrained model
# app:robotics-new-geometry: phase windows (inclusive)
PHASES = {
    "fpo": ("block", ((20, 20), (60, 60), (122, 122))),
    "fpopp": ("update", ((0, 400), (500, 900), (1000, 1499))),
    "fpopp-cartpole": ("update", ((0, 40), (50, 90), (100, 149))),
}
PHASE_NAMES = ("early", "middle", "late")
MATRICES = ("C_cross", "C_within", "C_fluct", "C_paired", "W", "K", "N")


# ---------------------------------------------------------------------------------------------
# CIFAR: checkpoints, diagnostic batches and per-bin gradients (app:cifar-gradients)
# ---------------------------------------------------------------------------------------------
def _generator(seed: int, *keys: int) -> torch.Generator:
    value = int(seed) % (2**63 - 1)
    for k in keys:
        value = (value * 1_000_003 + int(k) + 1) % (2**63 - 1)
    return torch.Generator().manual_seed(value)


def run_alpha(run_args: Dict[str, Any], k: int) -> Optional[float]:
    """The exponent a cifar_fpo run (its args.json) had in force at update k; None for other rules."""
    keys = ("alpha", "target", "alpha_early", "alpha_late", "k0", "k1")
    return WeightingRule(run_args.get("weighting", "fixed"), **{n: run_args[n] for n in keys if n in run_args}).alpha(k)


def load_cifar_checkpoint(checkpoint: str, device) -> Tuple[UNet2D, Dict[str, Any]]:
    """Load a generator to measure: a cifar_fpo run folder (its ``checkpoints/last.pt``), a
    checkpoint file inside a run folder, or a diffusers model folder (an initial generator).
    Returns the network (fp32, eval mode) and metadata (update k, alpha, reward, run args)."""
    path = Path(checkpoint)
    if path.is_dir() and (path / "checkpoints" / "last.pt").is_file():
        path = path / "checkpoints" / "last.pt"
    if path.is_file():
        folder = path.parent.parent
        if not (folder / "args.json").is_file():
            raise ValueError(f"checkpoint {str(path)!r} has no run folder with args.json next to checkpoints/")
        run_args = json.loads((folder / "args.json").read_text())
        net = load_unet(resolve_model(run_args["model"]), device=device)
        ckpt = torch.load(path, map_location=device, weights_only=False)
        net.load_state_dict(ckpt["model"])
        meta = {
            "source": str(path),
            "run": folder.name,
            "k": int(ckpt.get("k", 0)),
            "run_args": run_args,
            "alpha": run_alpha(run_args, int(ckpt.get("k", 0))),
        }
        return net.eval(), meta
    try:
        net = load_unet(resolve_model(str(checkpoint)), device=device)
    except (ValueError, RunError):
        raise ValueError(
            f"--checkpoint {checkpoint!r} is neither a cifar_fpo run folder, a checkpoint file, "
            f"nor a diffusers model folder"
        ) from None
    return net.eval(), {"source": str(checkpoint), "run": Path(checkpoint).name, "k": 0, "run_args": {}, "alpha": None}


@dataclass
class DiagBatch:
    """One on-policy diagnostic batch: endpoints and per-bin (t, eps) draws (bins, n, M)."""

    latents: torch.Tensor
    x: torch.Tensor
    rewards: torch.Tensor
    adv: torch.Tensor
    t: torch.Tensor
    eps: torch.Tensor


def draw_bin_draws(n_bins: int, n: int, m: int, gen: torch.Generator, shape=(3, 32, 32)):
    """Equal-bin draws: for every bin b, ``t = (b + U)/n_bins`` with U ~ U[0,1) and eps ~ N(0, I)."""
    t = (torch.arange(n_bins).view(-1, 1, 1) + torch.rand((n_bins, n, m), generator=gen)) / n_bins
    eps = torch.randn((n_bins, n, m, *shape), generator=gen)
    return t.float(), eps


def make_cifar_batches(
    net,
    reward_fn,
    convention: str,
    n_batches: int,
    batch_size: int,
    group_size: int,
    draws_per_endpoint: int,
    n_bins: int,
    sample_steps: int,
    seed: int,
    device,
    autocast=None,
    adv_eps: float = 1e-6,
    control: bool = True,
) -> List[DiagBatch]:
    """``n_batches`` independent on-policy batches, plus (``control``) the paired control: batch 0's
    initial noise, endpoints, raw rewards and group advantages with freshly drawn times and
    corruption noises (app:cifar-gradients)."""
    out = []
    for i in range(n_batches):
        gen = _generator(seed, 1, i)
        latents = torch.randn((batch_size, 3, 32, 32), generator=gen).to(device)
        x = cifar_fpo.sample_images(net, latents, sample_steps, convention, autocast)
        with torch.no_grad():
            rewards = reward_fn(x).float()
        adv = cifar_fpo.group_advantages(rewards, group_size, adv_eps)
        t, eps = draw_bin_draws(n_bins, batch_size, draws_per_endpoint, _generator(seed, 2, i))
        out.append(DiagBatch(latents, x, rewards, adv, t.to(device), eps.to(device)))
    if control:
        t, eps = draw_bin_draws(n_bins, batch_size, draws_per_endpoint, _generator(seed, 2, n_batches))
        b0 = out[0]
        out.append(DiagBatch(b0.latents, b0.x, b0.rewards, b0.adv, t.to(device), eps.to(device)))
    return out


def cifar_grad_fn(
    net,
    batches: Sequence[DiagBatch],
    n_bins: int,
    convention: str,
    autocast=None,
    old_net=None,
    clip_ratio: float = DIAG_RATIO_CLIP,
    log_clip: float = DIAG_LOG_CLIP,
    ratio_dev: Optional[Dict[int, float]] = None,
):
    """``k -> grads`` of the equal-bin, unweighted diagnostic loss of batch ``k // n_bins``, bin
    ``k % n_bins``: ``r = exp(clip(D, -20, 20))`` with D the draw-mean per-dimension loss difference
    (old minus current), ``l_b = -mean min(r A, clip(r, .92, 1.08) A)`` (app:cifar-gradients;
    cifar_fpo.fpo_loss with unit multipliers). Without ``old_net`` the old policy is the measured
    checkpoint itself, so r = 1 as at the first step of an update. ``ratio_dev`` collects
    max |r - 1| per batch."""
    params = [p for p in net.parameters() if p.requires_grad]

    def grad(k: int):
        i, b = divmod(k, n_bins)
        bt = batches[i]
        l_new = cifar_fpo.velocity_losses(net, bt.x, bt.t[b], bt.eps[b], convention, autocast)
        if old_net is None:
            l_old = l_new.detach()
        else:
            with torch.no_grad():
                l_old = cifar_fpo.velocity_losses(old_net, bt.x, bt.t[b], bt.eps[b], convention, autocast)
        loss, ratio = cifar_fpo.fpo_loss(l_old, l_new, bt.adv, 1.0, clip_ratio, log_clip)
        if ratio_dev is not None:
            ratio_dev[i] = max(ratio_dev.get(i, 0.0), float((ratio.detach() - 1).abs().max()))
        return torch.autograd.grad(loss, params, allow_unused=True)

    return grad, params


# ---------------------------------------------------------------------------------------------
# Result files: .npz (matrices) + .json (scalars, metadata) next to the PNGs
# ---------------------------------------------------------------------------------------------
def write_result(out: Path, name: str, arrays: Dict[str, np.ndarray], info: Dict[str, Any]) -> Tuple[Path, Path]:
    out.mkdir(parents=True, exist_ok=True)
    npz, js = out / f"{name}.npz", out / f"{name}.json"
    np.savez_compressed(npz, **{k: np.asarray(v) for k, v in arrays.items()})
    js.write_text(json.dumps(strict(info), indent=2) + "\n")
    return npz, js


def read_result(path: Union[str, Path]) -> Tuple[Dict[str, np.ndarray], Dict[str, Any]]:
    """Arrays and metadata of a result written by `write_result` (give the .npz, .json or stem)."""
    p = Path(path)
    stem = p.with_suffix("") if p.suffix in (".npz", ".json") else p
    npz, js = stem.with_suffix(".npz"), stem.with_suffix(".json")
    if not npz.is_file():
        raise ValueError(f"result {str(path)!r}: no {npz.name} found; expected a diagnostics .npz/.json pair")
    with np.load(npz) as data:
        arrays = {k: data[k] for k in data.files}
    info = json.loads(js.read_text()) if js.is_file() else {}
    return arrays, info


def _fmt(x) -> str:
    return "none" if x is None else f"{x:g}"


# ---------------------------------------------------------------------------------------------
# Commands
# ---------------------------------------------------------------------------------------------
@dataclass
class Gram:
    """CIFAR gradient geometry at a checkpoint (app:cifar-gradients)."""

    checkpoint: str
    """A cifar_fpo run folder, a checkpoint file in one (runs/<name>/checkpoints/last.pt), or a diffusers
    model folder (measures that generator as the initial policy)."""
    alpha: Optional[float] = None
    """Training exponent to record in titles/metadata (default: read from the run's args.json). The
    diagnostic objective itself is equal-bin and unweighted."""
    reward: Optional[str] = None
    """Reward (default: the run's reward, else auto-a35)."""
    batches: int = CIFAR_BATCHES
    """Independent on-policy batches B (app:cifar-gradients: 4)."""
    bins: int = CIFAR_BINS
    """Time bins (app:cifar-gradients: 12)."""
    draws_per_bin: int = CIFAR_DRAWS_PER_BIN
    """(t, eps) draws per bin and batch, spread evenly over the endpoints (app:cifar-gradients: 64);
    must be a multiple of batch_size."""
    batch_size: int = 64
    """Endpoints per batch (app:cifar: 64)."""
    group_size: int = 16
    """Advantage group size (app:cifar: 16)."""
    sample_steps: Optional[int] = None
    """Euler sampling steps (default: the run's, else 20)."""
    control: bool = True
    """Also measure the paired control (batch 0's endpoints, noise, rewards, advantages; new draws)."""
    old_checkpoint: Optional[str] = None
    """Optional old policy for the ratio (default: the measured checkpoint itself, so r = 1)."""
    seed: int = 0
    """Seed of the diagnostic batches and draws."""
    device: str = "auto"
    """auto, cpu, cuda or cuda:N."""
    precision: str = "fp32"
    """fp32, tf32 or bf16 (network autocast only); the Gram is accumulated in float64."""
    grad_memory_gb: Optional[float] = None
    """Memory budget of the gradient buffer (default: 40% of free GPU memory, 2 GB on CPU)."""
    out: Optional[str] = None
    """Output folder (default: <run>/diagnostics/gram_k<update>, or diagnostics/<model name>)."""
    name: Optional[str] = None
    """Label used in titles (default: the run or model folder name)."""


def _check_positive(**values):
    for k, v in values.items():
        if v is None or v < 1:
            raise ValueError(f"--{k.replace('_', '-')} {v} must be >= 1")


def run_gram(cmd: Gram) -> Dict[str, Any]:
    """Compute and write the CIFAR gram diagnostics; returns the JSON summary."""
    _check_positive(
        batches=cmd.batches,
        bins=cmd.bins,
        draws_per_bin=cmd.draws_per_bin,
        batch_size=cmd.batch_size,
        group_size=cmd.group_size,
    )
    if cmd.batches < 2:
        raise ValueError(f"--batches {cmd.batches} must be >= 2 (cross-batch cosines need two batches)")
    if cmd.draws_per_bin % cmd.batch_size:
        raise ValueError(f"--draws-per-bin {cmd.draws_per_bin} must be a multiple of --batch-size {cmd.batch_size}")
    if cmd.batch_size % cmd.group_size or cmd.group_size < 2:
        raise ValueError(f"--batch-size {cmd.batch_size} must be a multiple of --group-size {cmd.group_size} (>= 2)")
    t0 = time.perf_counter()
    device = pick_device(cmd.device)
    if cmd.precision not in PRECISIONS:
        raise ValueError(f"--precision {cmd.precision!r} is not one of {', '.join(PRECISIONS)}")
    autocast = set_precision(cmd.precision)
    net, meta = load_cifar_checkpoint(cmd.checkpoint, device)
    run_args = meta["run_args"]
    convention = run_args.get("convention") or getattr(net, "convention", None) or "sigma"
    reward = cmd.reward or run_args.get("reward") or "auto-a35"
    steps = cmd.sample_steps or run_args.get("sample_steps") or 20
    alpha = cmd.alpha if cmd.alpha is not None else meta["alpha"]
    reward_fn = make_reward(
        reward,
        device=device,
        classifier_path=run_args.get("classifier_path"),
        simclr_path=run_args.get("simclr_path"),
        clip_model=run_args.get("clip_model", "ViT-B-32"),
        clip_pretrained=run_args.get("clip_pretrained"),
    )
    old_net = None
    if cmd.old_checkpoint:
        old_net, _ = load_cifar_checkpoint(cmd.old_checkpoint, device)
        old_net.requires_grad_(False)
    batches = make_cifar_batches(
        net,
        reward_fn,
        convention,
        cmd.batches,
        cmd.batch_size,
        cmd.group_size,
        cmd.draws_per_bin // cmd.batch_size,
        cmd.bins,
        steps,
        cmd.seed,
        device,
        autocast,
        control=cmd.control,
    )
    t_sample = time.perf_counter() - t0
    ratio_dev: Dict[int, float] = {}
    net.train()
    grad, params = cifar_grad_fn(net, batches, cmd.bins, convention, autocast, old_net, ratio_dev=ratio_dev)
    memory = int(cmd.grad_memory_gb * 1024**3) if cmd.grad_memory_gb else default_memory_bytes(device)
    gram, layout = streamed_gram(grad, params, len(batches) * cmd.bins, memory, device)
    stats = gram_statistics(gram[: cmd.batches * cmd.bins, : cmd.batches * cmd.bins], cmd.batches, cmd.bins)
    c_paired = paired_control_cosines(gram, cmd.batches, cmd.bins)[0] if cmd.control else None
    elapsed = time.perf_counter() - t0

    name = cmd.name or meta["run"]
    if cmd.out:
        out = Path(cmd.out)
    elif run_args:
        out = Path(meta["source"]).parent.parent / "diagnostics" / f"gram_k{meta['k']:05d}"
    else:
        out = Path("diagnostics") / name
    summary = summarise(stats, c_paired)
    info = {
        "command": "gram",
        "checkpoint": meta["source"],
        "name": name,
        "k": meta["k"],
        "alpha": alpha,
        "reward": reward,
        "batches": cmd.batches,
        "bins": cmd.bins,
        "draws_per_bin": cmd.draws_per_bin,
        "batch_size": cmd.batch_size,
        "group_size": cmd.group_size,
        "sample_steps": steps,
        "seed": cmd.seed,
        "control": cmd.control,
        "device": str(device),
        "precision": cmd.precision,
        "batch_reward_mean": [float(b.rewards.mean()) for b in batches[: cmd.batches]],
        "ratio_max_dev": [ratio_dev.get(i, 0.0) for i in range(len(batches))],
        "ratio_outside_clip": any(v > DIAG_RATIO_CLIP for v in ratio_dev.values()),
        "layout": layout,
        "time_s": elapsed,
        "sampling_time_s": t_sample,
        **summary,
    }
    arrays = {
        k: stats[k] for k in ("C_within", "C_cross", "W", "K", "N", "C_fluct", "within_counts", "cross_counts", "norms")
    }
    arrays["gram"] = gram
    arrays["bin_edges"] = np.linspace(0.0, 1.0, cmd.bins + 1)
    if c_paired is not None:
        arrays["C_paired"] = c_paired
    write_result(out, "gram", arrays, info)
    labels = cifar_labels(cmd.bins)
    tag = f"{name} k={meta['k']} alpha={_fmt(alpha)}"
    save_heatmap(out / "cross.png", stats["C_cross"], labels, f"{tag}: cross-batch cosine")
    save_heatmap(out / "within.png", stats["C_within"], labels, f"{tag}: within-batch cosine")
    save_heatmap(out / "fluct.png", stats["C_fluct"], labels, f"{tag}: fluctuation correlation")
    if c_paired is not None:
        save_heatmap(out / "paired.png", c_paired, labels, f"{tag}: paired control")
    print(
        f"gram {name} k={meta['k']} alpha={_fmt(alpha)}: "
        f"mean off-diagonal cross {summary['C_cross']['offdiag_mean']:.4f} "
        f"within {summary['C_within']['offdiag_mean']:.4f}  S {summary['S']:.4f}  RMS {summary['rms']:.4g}  "
        f"{elapsed:.1f}s ({layout['passes']} pass(es)) -> {out}",
        flush=True,
    )
    return info


@dataclass
class Coherence:
    """Output coherence c_b per bin at a checkpoint (eq:coherence; cifar_fpo.fit_coherence)."""

    checkpoint: str
    """A cifar_fpo run folder, checkpoint file or diffusers model folder."""
    reward: Optional[str] = None
    """Reward (default: the run's reward, else auto-a35)."""
    batches: int = 4
    """Fit batches whose moments (U_b, V_b) are averaged before c_b = max(U,0)/(V+delta)."""
    fit_batch_size: int = 64
    """Endpoints per fit batch (app:method-settings: 64)."""
    group_size: int = 16
    """Advantage group size (app:method-settings: 16)."""
    draws: int = 4
    """(t, eps) draws per endpoint and bin (app:method-settings: 4)."""
    bins: int = CIFAR_BINS
    """Time bins."""
    sample_steps: Optional[int] = None
    """Euler steps (default: the run's, else 20)."""
    seed: int = 0
    """Seed of the fit batches."""
    device: str = "auto"
    """auto, cpu, cuda or cuda:N."""
    out: Optional[str] = None
    """Output folder (default: next to the checkpoint's run, or diagnostics/<model name>)."""


def run_coherence(cmd: Coherence) -> Dict[str, Any]:
    _check_positive(batches=cmd.batches, fit_batch_size=cmd.fit_batch_size, draws=cmd.draws, bins=cmd.bins)
    if cmd.draws < 2 and cmd.fit_batch_size < 2:
        raise ValueError("--draws and --fit-batch-size give fewer than 2 signals per bin; need >= 2")
    device = pick_device(cmd.device)
    net, meta = load_cifar_checkpoint(cmd.checkpoint, device)
    run_args = meta["run_args"]
    convention = run_args.get("convention") or getattr(net, "convention", None) or "sigma"
    reward = cmd.reward or run_args.get("reward") or "auto-a35"
    fit_args = cifar_fpo.resolve_args(
        replace(
            cifar_fpo.Args(),
            reward=reward,
            fit_batch_size=cmd.fit_batch_size,
            batch_size=cmd.fit_batch_size,
            group_size=cmd.group_size,
            coherence_draws=cmd.draws,
            bins=cmd.bins,
            sample_steps=cmd.sample_steps or run_args.get("sample_steps") or 20,
        )
    )
    reward_fn = make_reward(
        reward, device=device, classifier_path=run_args.get("classifier_path"), simclr_path=run_args.get("simclr_path")
    )
    us, vs, rs = [], [], []
    for i in range(cmd.batches):
        u, v, r = cifar_fpo.fit_coherence(net, reward_fn, fit_args, _generator(cmd.seed, 3, i), device, convention)
        us.append(u), vs.append(v), rs.append(r)
    U, V = np.mean(us, axis=0), np.mean(vs, axis=0)
    c = coherence_from_moments(U, V)
    out = (
        Path(cmd.out)
        if cmd.out
        else (
            Path(meta["source"]).parent.parent / "diagnostics" / f"coherence_k{meta['k']:05d}"
            if run_args
            else Path("diagnostics") / meta["run"]
        )
    )
    info = {
        "command": "coherence",
        "checkpoint": meta["source"],
        "k": meta["k"],
        "reward": reward,
        "batches": cmd.batches,
        "fit_batch_size": cmd.fit_batch_size,
        "draws": cmd.draws,
        "coherence": c,
        "U": U,
        "V": V,
        "fit_reward_mean": float(np.mean(rs)),
    }
    write_result(
        out, "coherence", {"coherence": c, "U": U, "V": V, "U_batches": np.array(us), "V_batches": np.array(vs)}, info
    )
    print(
        "coherence c_b (b0 noisy .. b%d clean): %s -> %s" % (cmd.bins - 1, " ".join(f"{x:.4f}" for x in c), out),
        flush=True,
    )
    return info


# ---------------------------------------------------------------------------------------------
# Local reward response (app:mechanisms)
# ---------------------------------------------------------------------------------------------
def band_mask(size: int, lo: float, hi: float) -> torch.Tensor:
    """Boolean (size, size) mask of 2D FFT frequencies with lo <= |f| < hi (radial, cycles/pixel).
    The constant (f = 0) term is excluded, so every band perturbation has zero mean."""
    f = torch.fft.fftfreq(size)
    radius = torch.sqrt(f.view(-1, 1) ** 2 + f.view(1, -1) ** 2)
    return (radius >= lo) & (radius < hi) & (radius > 0)


def band_noise(n: int, band: str, gen: torch.Generator, size: int = 32, channels: int = 3) -> torch.Tensor:
    """``n`` random perturbation directions limited to a Fourier band (BANDS), each channel
    independently, scaled to unit max-abs (so ``amplitude * band_noise`` has L_inf = amplitude)."""
    if band not in BANDS:
        raise ValueError(f"band {band!r} is not one of {', '.join(BANDS)}")
    lo, hi = BANDS[band]
    white = torch.randn((n, channels, size, size), generator=gen, dtype=torch.float64)
    spec = torch.fft.fft2(white) * band_mask(size, lo, hi)
    d = torch.fft.ifft2(spec).real
    return d / d.flatten(1).abs().amax(dim=1).clamp_min(1e-12).view(-1, 1, 1, 1)


def response_stats(d_plus: np.ndarray, d_minus: np.ndarray) -> Dict[str, float]:
    """M, C, O, DD of app:mechanisms from reward changes d+- of shape (anchors, directions):
    statistics are averaged over directions within an anchor, then over anchors.
    ``M = E[(max(-d+,0) + max(-d-,0))/2]``, ``C = E[(d+ + d-)/2]``, ``O = E max(d+, d-, 0)``,
    ``DD = P(d+ < 0, d- < 0)``."""
    dp, dm = np.asarray(d_plus, dtype=np.float64), np.asarray(d_minus, dtype=np.float64)
    if dp.shape != dm.shape:
        raise ValueError(f"d_plus shape {dp.shape} != d_minus shape {dm.shape}")
    if dp.ndim == 1:
        dp, dm = dp[:, None], dm[:, None]
    per = {
        "M": (np.maximum(-dp, 0) + np.maximum(-dm, 0)) / 2,
        "C": (dp + dm) / 2,
        "O": np.maximum(np.maximum(dp, dm), 0),
        "DD": ((dp < 0) & (dm < 0)).astype(np.float64),
    }
    return {k: float(v.mean(axis=1).mean()) for k, v in per.items()}


@torch.no_grad()
def local_response(
    reward_fn,
    anchors: torch.Tensor,
    bands: Sequence[str] = tuple(BANDS),
    amplitudes: Sequence[float] = AMPLITUDES,
    directions: int = 1,
    seed: int = 0,
    chunk: int = 256,
) -> Dict[str, Dict[str, Dict[str, float]]]:
    """``{band: {amplitude: {M, C, O, DD}}}`` for anchors (N,3,32,32) in [-1,1]. Amplitudes are in
    [0,1] image units (2/255 = two grey levels), i.e. x +- 2 a delta with max|delta| = 1 in the
    [-1,1] representation; perturbed images are clipped to the valid range."""
    base = torch.cat([reward_fn(anchors[s : s + chunk]).double().cpu() for s in range(0, len(anchors), chunk)])
    out: Dict[str, Dict[str, Dict[str, float]]] = {}
    for bi, band in enumerate(bands):
        delta = band_noise(len(anchors) * directions, band, _generator(seed, 4, bi)).float().to(anchors.device)
        delta = delta.view(len(anchors), directions, *anchors.shape[1:])
        out[band] = {}
        for amp in amplitudes:
            dp, dm = np.zeros((len(anchors), directions)), np.zeros((len(anchors), directions))
            for k in range(directions):
                for s in range(0, len(anchors), chunk):
                    x = anchors[s : s + chunk]
                    d = 2.0 * amp * delta[s : s + chunk, k]
                    dp[s : s + chunk, k] = (
                        reward_fn((x + d).clamp(-1, 1)).double().cpu() - base[s : s + chunk]
                    ).numpy()
                    dm[s : s + chunk, k] = (
                        reward_fn((x - d).clamp(-1, 1)).double().cpu() - base[s : s + chunk]
                    ).numpy()
            out[band][f"{amp * 255:g}/255"] = response_stats(dp, dm)
    return out


@dataclass
class Response:
    """Local reward response of a reward on anchors generated by a model (app:mechanisms)."""

    checkpoint: str = DEFAULT_MODEL
    """Generator of the anchors: diffusers model folder (default: the shipped stand-in), run folder or checkpoint."""
    reward: str = "auto-a35"
    """Reward to probe."""
    anchors: int = RESPONSE_ANCHORS
    """Generated anchor images (app:mechanisms: 256)."""
    directions: int = 1
    """Random band-limited directions per anchor, band and amplitude (averaged within an anchor)."""
    sample_steps: int = 20
    """Euler steps for the anchors."""
    seed: int = 0
    """Seed of anchors and directions."""
    device: str = "auto"
    """auto, cpu, cuda or cuda:N."""
    out: str = "diagnostics/response"
    """Output folder."""


def run_response(cmd: Response) -> Dict[str, Any]:
    _check_positive(anchors=cmd.anchors, directions=cmd.directions, sample_steps=cmd.sample_steps)
    device = pick_device(cmd.device)
    net, meta = load_cifar_checkpoint(cmd.checkpoint, device)
    convention = meta["run_args"].get("convention") or getattr(net, "convention", None) or "sigma"
    reward_fn = make_reward(cmd.reward, device=device)
    latents = torch.randn((cmd.anchors, 3, 32, 32), generator=_generator(cmd.seed, 5)).to(device)
    anchors = torch.cat(
        [
            cifar_fpo.sample_images(net, latents[s : s + 256], cmd.sample_steps, convention)
            for s in range(0, cmd.anchors, 256)
        ]
    )
    res = local_response(reward_fn, anchors, directions=cmd.directions, seed=cmd.seed)
    info = {
        "command": "response",
        "checkpoint": meta["source"],
        "reward": cmd.reward,
        "anchors": cmd.anchors,
        "directions": cmd.directions,
        "response": res,
    }
    names = [(b, a) for b in res for a in res[b]]
    arr = np.array([[res[b][a][s] for s in ("M", "C", "O", "DD")] for b, a in names])
    write_result(Path(cmd.out), "response", {"table": arr, "rows": np.array([f"{b} {a}" for b, a in names])}, info)
    for b, a in names:
        r = res[b][a]
        print(f"{b:7s} {a:7s} M {r['M']:+.5f}  C {r['C']:+.5f}  O {r['O']:+.5f}  DD {r['DD']:.3f}")
    return info


# ---------------------------------------------------------------------------------------------
# Robots (app:robotics-new-geometry)
# ---------------------------------------------------------------------------------------------
def robot_bins(objective: str, n_bins: int = ROBOT_BINS, t_min: float = 0.005, t_max: float = 0.995) -> np.ndarray:
    """Bin edges in flow time t (ascending; bin 0 noisiest). FPO: its native grid, one bin per value
    t = 1 - s with s in {1, .9, ..., .1} (edges are the grid values; a bin holds exactly one t).
    FPO++: ``n_bins`` equal bins over its flow-time support [t_min, t_max] (this project's choice)."""
    if objective == "fpo":
        return np.arange(ROBOT_BINS + 1) / ROBOT_BINS
    if objective == "fpopp":
        return np.linspace(t_min, t_max, n_bins + 1)
    raise ValueError(f"objective {objective!r} is not one of fpo, fpopp")


def robot_labels(objective: str, edges: np.ndarray) -> List[str]:
    """Noise-coefficient labels sigma = 1 - t: FPO the grid value, FPO++ the bin midpoint."""
    if objective == "fpo":
        return [f"{1 - t:.1f}" for t in edges[:-1]]
    return [f"{1 - (a + b) / 2:.2f}" for a, b in zip(edges[:-1], edges[1:])]


def robot_gradients(
    actor, obs, x, adv, edges: np.ndarray, objective: str, draws: int, gen: torch.Generator, chunk: int = 65536
):
    """``k -> grads`` of the forced r = 1 diagnostic for one batch: bin b's gradient of
    ``1/(N M) sum_n A_n sum_m l(t_nm, eps_nm)`` with t in bin b (FPO: the grid value; FPO++: uniform
    in the bin), l = robot_fpo.draw_losses of the objective, unweighted and unclipped
    (app:robotics-new-geometry). This is the loss gradient at r = 1 (the negative ascent direction).
    Draws are made once, so the function is deterministic in k."""
    import robot_fpo

    n, d = x.shape
    nb = len(edges) - 1
    if objective == "fpo":
        ts = [torch.full((n, draws), float(edges[b])) for b in range(nb)]
    else:
        ts = [
            float(edges[b]) + float(edges[b + 1] - edges[b]) * torch.rand((n, draws), generator=gen) for b in range(nb)
        ]
    eps = [torch.randn((n, draws, d), generator=gen) for _ in range(nb)]
    params = [p for p in actor.parameters() if p.requires_grad]
    dev = x.device

    def grad(b: int):
        total = [torch.zeros_like(p) for p in params]
        for s in range(0, n, chunk):
            sl = slice(s, min(n, s + chunk))
            loss_draws = robot_fpo.draw_losses(actor, obs[sl], x[sl], ts[b][sl].to(dev), eps[b][sl].to(dev), objective)
            loss = (adv[sl].view(-1, 1) * loss_draws).sum() / (n * draws)
            for acc, g in zip(total, torch.autograd.grad(loss, params, allow_unused=True)):
                if g is not None:
                    acc += g
        return total

    return grad, params


@dataclass
class RobotGram:
    """Robot gradient geometry at a robot_fpo.py checkpoint (app:robotics-new-geometry)."""

    checkpoint: str
    """A robot_fpo run folder (its checkpoints/last.pt) or a checkpoint file inside one."""
    batches: int = ROBOT_BATCHES
    """Fresh on-policy batches (app:robotics-new-geometry: 8)."""
    bins: int = ROBOT_BINS
    """FPO++ bins over [t_min, t_max] (FPO always uses its 10-point grid)."""
    draws: int = 0
    """(t, eps) draws per transition and bin (0: the run's num_draws)."""
    num_steps: int = 0
    """Rollout length per environment of each batch (0: the run's num_steps)."""
    seed: int = 0
    """Seed of the diagnostic rollouts and draws."""
    device: str = "cpu"
    """cpu or cuda."""
    out: Optional[str] = None
    """Output folder (default: <run>/diagnostics/robot_gram_u<update>)."""


def run_robot_gram(cmd: RobotGram) -> Dict[str, Any]:
    os.environ.setdefault("MUJOCO_GL", "disable")
    import robot_fpo
    from fpo_utils.robot_bookkeeping import load_checkpoint

    if cmd.batches < 2:
        raise ValueError(f"--batches {cmd.batches} must be >= 2 (cross-batch cosines need two batches)")
    path = Path(cmd.checkpoint)
    if path.is_dir():
        path = path / "checkpoints" / "last.pt"
    folder = path.parent.parent
    if not path.is_file() or not (folder / "args.json").is_file():
        raise ValueError(
            f"--checkpoint {cmd.checkpoint!r}: expected a robot_fpo run folder with args.json and checkpoints/last.pt"
        )
    t0 = time.perf_counter()
    raw = json.loads((folder / "args.json").read_text())
    rargs = replace(robot_fpo.Args(), **{k: v for k, v in raw.items() if k in robot_fpo.Args.__dataclass_fields__})
    if cmd.num_steps:
        rargs = replace(rargs, num_steps=cmd.num_steps)
    device = torch.device(cmd.device)
    state = robot_fpo.build_state(rargs, device)
    load_checkpoint(str(path), state)
    update, global_step = state.update, state.global_step
    for rms in (state.obs_rms, state.ret_rms):  # statistics stay fixed while the diagnostic collects rollouts
        if rms is not None:
            rms.frozen = True
    edges = robot_bins(rargs.objective, cmd.bins, rargs.t_min, rargs.t_max)
    nb = len(edges) - 1
    draws = cmd.draws or rargs.num_draws
    grads = []
    for i in range(cmd.batches):
        torch.manual_seed(cmd.seed * 1009 + i)
        state.update = 1_000_000 + cmd.seed * 1000 + i  # fresh environment seeds per batch
        robot_fpo.reset_envs(state, rargs.seed)
        batch = robot_fpo.collect_rollout(state, rargs)
        obs, x, adv = batch["obs"][..., state.obs_actor], batch["x"], batch["adv"]  # the actor's columns
        if rargs.objective == "fpo":  # first training minibatch, advantages standardised within it
            mb = max(2, obs.shape[0] // rargs.num_minibatches)
            idx = torch.randperm(obs.shape[0], generator=_generator(cmd.seed, 6, i))[:mb].to(device)
            obs, x, adv = obs[idx], x[idx], adv[idx]
            if rargs.norm_adv:
                adv = (adv - adv.mean()) / (adv.std() + 1e-8)
        else:  # the complete rollout, standardised, clamped to +-adv_clamp
            if rargs.norm_adv:
                adv = (adv - adv.mean()) / (adv.std() + 1e-8)
            adv = adv.clamp(-rargs.adv_clamp, rargs.adv_clamp)
        grads.append(
            robot_gradients(state.actor, obs, x, adv, edges, rargs.objective, draws, _generator(cmd.seed, 7, i))
        )
    state.envs.close()
    params = grads[0][1]
    gram, layout = streamed_gram(lambda k: grads[k // nb][0](k % nb), params, cmd.batches * nb, 1 << 30, device)
    # bins whose gradient vanishes in every batch (FPO's s = 1 bin) are inactive and dropped
    sq = np.diag(gram).reshape(cmd.batches, nb)
    active = np.nonzero((sq > 0).any(axis=0))[0]
    idx = np.concatenate([i * nb + active for i in range(cmd.batches)])
    stats = gram_statistics(gram[np.ix_(idx, idx)], cmd.batches, len(active))
    summary = summarise(stats)
    labels = [robot_labels(rargs.objective, edges)[b] for b in active]
    alpha = robot_fpo.current_alpha(rargs, global_step)
    out = Path(cmd.out) if cmd.out else folder / "diagnostics" / f"robot_gram_u{update:06d}"
    info = {
        "command": "robot-gram",
        "checkpoint": str(path),
        "run": folder.name,
        "env_id": rargs.env_id,
        "objective": rargs.objective,
        "seed": rargs.seed,
        "update": update,
        "global_step": global_step,
        "block": global_step // rargs.block_size,
        "alpha": alpha,
        "profile": _profile_label(rargs),
        "batches": cmd.batches,
        "draws": draws,
        "active_bins": active,
        "labels": labels,
        "layout": layout,
        "time_s": time.perf_counter() - t0,
        **summary,
    }
    arrays = {
        k: stats[k] for k in ("C_within", "C_cross", "W", "K", "N", "C_fluct", "within_counts", "cross_counts", "norms")
    }
    arrays.update(gram=gram, bin_edges=edges, active_bins=active)
    write_result(out, "robot_gram", arrays, info)
    tag = f"{rargs.env_id} {rargs.objective} {info['profile']} u={update}"
    save_heatmap(out / "cross.png", stats["C_cross"], labels, f"{tag}: cross-batch cosine")
    save_heatmap(out / "within.png", stats["C_within"], labels, f"{tag}: within-batch cosine")
    print(
        f"robot-gram {tag}: mean off-diagonal cross {summary['C_cross']['offdiag_mean']:.4f} within "
        f"{summary['C_within']['offdiag_mean']:.4f}  S {summary['S']:.4f} -> {out}",
        flush=True,
    )
    return info


def _profile_label(rargs) -> str:
    base = rargs.alpha_eps if rargs.objective == "fpo" else rargs.alpha
    if rargs.alpha_early is None and rargs.alpha_late is None:
        return f"alpha={base:g}"
    early = base if rargs.alpha_early is None else rargs.alpha_early
    late = base if rargs.alpha_late is None else rargs.alpha_late
    return f"alpha={early:g}->{late:g}"


@dataclass
class RobotPhases:
    """Phase-averaged robot heatmaps from robot-gram results (app:robotics-new-geometry)."""

    results: Tuple[str, ...]
    """robot_gram.npz files (or their folders) of many checkpoints, seeds and profiles."""
    matrix: str = "C_cross"
    """Matrix to average: C_cross or C_within."""
    windows: Optional[str] = None
    """Phase windows 'lo-hi,lo-hi,...' (inclusive); default by objective: FPO blocks 20/60/122,
    FPO++ iterations 0-400/500-900/1000-1499."""
    unit: Optional[str] = None
    """Position of a checkpoint in a window: block or update (default: by objective)."""
    cartpole: bool = False
    """Use the Cartpole FPO++ windows 0-40/50-90/100-149."""
    out: str = "diagnostics/robot_phases"
    """Output folder: phases.npz, phases.json, atlas.png."""


def parse_windows(text: str) -> List[Tuple[float, float]]:
    out = []
    for part in text.split(","):
        try:
            lo, hi = (float(v) for v in part.strip().split("-"))
        except ValueError:
            raise ValueError(
                f"--windows {text!r}: expected 'lo-hi,lo-hi,...' with numbers, e.g. 0-400,500-900"
            ) from None
        if hi < lo:
            raise ValueError(f"--windows {text!r}: window {part!r} has hi < lo")
        out.append((lo, hi))
    return out


def run_robot_phases(cmd: RobotPhases) -> Dict[str, Any]:
    if cmd.matrix not in ("C_cross", "C_within", "C_fluct"):
        raise ValueError(f"--matrix {cmd.matrix!r} is not one of C_cross, C_within, C_fluct")
    if cmd.unit is not None and cmd.unit not in ("block", "update"):
        raise ValueError(f"--unit {cmd.unit!r} is not one of block, update")
    records, labels, objective = [], None, None
    for r in cmd.results:
        p = Path(r)
        arrays, info = read_result(p / "robot_gram.npz" if p.is_dir() else p)
        objective = objective or info["objective"]
        if labels is None:
            labels = info["labels"]
        elif info["labels"] != labels:
            raise ValueError(f"result {r!r} has bins {info['labels']}, others {labels}; phase averages need equal bins")
        records.append(
            {
                "seed": info["seed"],
                "block": info["block"],
                "update": info["update"],
                "profile": info.get("profile", ""),
                "matrix": arrays[cmd.matrix],
            }
        )
    if not records:
        raise ValueError("--results is empty; give robot_gram.npz files")
    default = PHASES["fpopp-cartpole" if cmd.cartpole else objective]
    unit = cmd.unit or default[0]
    windows = parse_windows(cmd.windows) if cmd.windows else list(default[1])
    profiles = sorted({r["profile"] for r in records})
    panels, table = [], {}
    names = [
        f"{PHASE_NAMES[i] if i < len(PHASE_NAMES) else i} {unit} {lo:g}-{hi:g}" for i, (lo, hi) in enumerate(windows)
    ]
    arrays = {}
    for prof in profiles:
        res = phase_average([r for r in records if r["profile"] == prof], windows, key=unit)
        panels.append(
            [
                (r["matrix"], f"{prof} {names[i]} ({r['seeds']} seeds)") if r["matrix"] is not None else None
                for i, r in enumerate(res)
            ]
        )
        table[prof] = [
            {
                "phase": names[i],
                "seeds": r["seeds"],
                "checkpoints": r["checkpoints"],
                **(block_summary(r["matrix"]) if r["matrix"] is not None else {}),
            }
            for i, r in enumerate(res)
        ]
        for i, r in enumerate(res):
            if r["matrix"] is not None:
                arrays[f"{prof}|{i}"] = r["matrix"]
    out = Path(cmd.out)
    write_result(
        out,
        "phases",
        arrays,
        {
            "command": "robot-phases",
            "matrix": cmd.matrix,
            "unit": unit,
            "windows": windows,
            "labels": labels,
            "phases": table,
        },
    )
    save_atlas(out / "atlas.png", panels, labels, profiles, names, title=f"{objective} {cmd.matrix}: phase averages")
    return {"phases": table}


# ---------------------------------------------------------------------------------------------
# Re-rendering saved results
# ---------------------------------------------------------------------------------------------
def _labels_of(arrays, info) -> List[str]:
    if "labels" in info:
        return list(info["labels"])
    return cifar_labels(arrays["C_cross"].shape[0])


@dataclass
class Heatmap:
    """Render one matrix of a saved gram / robot-gram result as a PNG."""

    result: str
    """A gram.npz / robot_gram.npz file (or the .json next to it)."""
    matrix: str = "C_cross"
    """C_cross, C_within, C_fluct or C_paired."""
    out: Optional[str] = None
    """PNG path (default: <matrix>.png next to the result)."""
    title: Optional[str] = None
    """Panel title (default: name, checkpoint update and alpha)."""


def run_heatmap(cmd: Heatmap) -> Path:
    arrays, info = read_result(cmd.result)
    if cmd.matrix not in arrays or cmd.matrix not in ("C_cross", "C_within", "C_fluct", "C_paired"):
        raise ValueError(
            f"--matrix {cmd.matrix!r} is not in the result; available: "
            f"{', '.join(k for k in arrays if k.startswith('C_'))}"
        )
    name, k = info.get("name", info.get("run", "")), info.get("k", info.get("update"))
    title = cmd.title or f"{name} k={k} alpha={_fmt(info.get('alpha'))}: {cmd.matrix}"
    out = Path(cmd.out) if cmd.out else Path(cmd.result).with_name(f"{cmd.matrix}.png")
    return save_heatmap(out, arrays[cmd.matrix], _labels_of(arrays, info), title)


@dataclass
class Atlas:
    """A grid of heatmaps from saved results: rows = profiles (alpha), columns = checkpoints."""

    results: Tuple[str, ...]
    """gram.npz / robot_gram.npz files."""
    matrix: str = "C_cross"
    """C_cross, C_within, C_fluct or C_paired."""
    out: str = "diagnostics/atlas.png"
    """PNG path."""
    title: str = ""
    """Figure title."""


def run_atlas(cmd: Atlas) -> Path:
    if not cmd.results:
        raise ValueError("--results is empty; give gram.npz files")
    loaded = [read_result(r) for r in cmd.results]
    rows: Dict[str, List] = {}
    labels = None
    for arrays, info in loaded:
        if cmd.matrix not in arrays:
            raise ValueError(
                f"--matrix {cmd.matrix!r} missing in a result; available: "
                f"{', '.join(k for k in arrays if k.startswith('C_'))}"
            )
        prof = info.get("profile") or f"alpha={_fmt(info.get('alpha'))}"
        pos = info.get("k", info.get("update", 0))
        rows.setdefault(prof, []).append(
            (pos, arrays[cmd.matrix], f"{info.get('name', info.get('run', ''))} k={pos} {prof}")
        )
        labels = labels or _labels_of(arrays, info)
    names = sorted(rows)
    cols = sorted({p for v in rows.values() for p, _, _ in v})
    grid = [[next(((m, t) for p, m, t in rows[r] if p == c), None) for c in cols] for r in names]
    return save_atlas(cmd.out, grid, labels, names, [f"k={c}" for c in cols], title=cmd.title)


def _commands():
    return {
        "gram": (Gram, run_gram),
        "robot-gram": (RobotGram, run_robot_gram),
        "robot-phases": (RobotPhases, run_robot_phases),
        "coherence": (Coherence, run_coherence),
        "response": (Response, run_response),
        "heatmap": (Heatmap, run_heatmap),
        "atlas": (Atlas, run_atlas),
    }


def main(argv: Optional[Sequence[str]] = None):
    """Parse ``argv`` into one of the commands and run it."""
    cmds = _commands()
    cmd = tyro.extras.subcommand_cli_from_dict(
        {name: cls for name, (cls, _) in cmds.items()}, args=argv, description=__doc__.split("\n\n")[0]
    )
    runner = {cls: fn for cls, fn in cmds.values()}[type(cmd)]
    return runner(cmd)


if __name__ == "__main__":
    try:
        main()
    except ValueError as err:  # bad input: one line naming the value and what is allowed
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
