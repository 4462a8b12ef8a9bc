"""Algorithm 1 of the paper: FPO fine-tuning of a flow-matching image generator with
timestep-weighted ELBO losses (alg:cifar, app:cifar).

The first part of this file is the generator: a compact U-Net whose parameter names and
arithmetic match diffusers' ``UNet2DModel`` for the block types used by CIFAR-10 checkpoints,
so a diffusers folder (``config.json`` + ``diffusion_pytorch_model.safetensors``) loads with
``strict=True`` without diffusers installed. The second part is the training algorithm.
"""

from __future__ import annotations

import contextlib
import copy
import json
import math
import os
import random
import re
import socket
import sys
import time
import urllib.parse
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import tyro

from rewards import PIXEL_REWARDS, REWARDS, make_reward
from weighting import (
    ESTIMATORS,
    alpha_profile,
    calibration_S,
    coherence_from_moments,
    coherence_moments,
    draw_multipliers,
    ema_coherence,
    ema_moments_update,
    estimator_plan,
    linear_schedule,
    online_ema_profile,
    profile_probs,
    refit_profile,
    sample_bin_times,
    static_direct,
    static_softmax,
    target_profile,
)

# ---------------------------------------------------------------------------------------------
# Generator: a diffusers-compatible UNet2DModel
# ---------------------------------------------------------------------------------------------

# Defaults of diffusers' UNet2DModel; a config.json only lists what was set when it was saved,
# so any key it leaves out must take exactly these values.
UNET_DEFAULTS: dict = {
    "sample_size": None,
    "in_channels": 3,
    "out_channels": 3,
    "center_input_sample": False,
    "time_embedding_type": "positional",
    "time_embedding_dim": None,
    "freq_shift": 0,
    "flip_sin_to_cos": True,
    "down_block_types": ["DownBlock2D", "AttnDownBlock2D", "AttnDownBlock2D", "AttnDownBlock2D"],
    "mid_block_type": "UNetMidBlock2D",
    "up_block_types": ["AttnUpBlock2D", "AttnUpBlock2D", "AttnUpBlock2D", "UpBlock2D"],
    "block_out_channels": [224, 448, 672, 896],
    "layers_per_block": 2,
    "mid_block_scale_factor": 1.0,
    "downsample_padding": 1,
    "downsample_type": "conv",
    "upsample_type": "conv",
    "dropout": 0.0,
    "act_fn": "silu",
    "attention_head_dim": 8,
    "norm_num_groups": 32,
    "attn_norm_num_groups": None,
    "norm_eps": 1e-5,
    "resnet_time_scale_shift": "default",
    "add_attention": True,
    "class_embed_type": None,
    "num_class_embeds": None,
    "num_train_timesteps": None,
}
# The only values these keys may take (anything else changes the network in ways not built here).
_FIXED_KEYS = {
    "time_embedding_type": ("positional",),
    "mid_block_type": ("UNetMidBlock2D", None),
    "downsample_type": ("conv",),
    "upsample_type": ("conv",),
    "act_fn": ("silu", "swish"),
    "resnet_time_scale_shift": ("default",),
    "class_embed_type": (None,),
    "num_class_embeds": (None,),
}
DOWN_BLOCKS = ("DownBlock2D", "AttnDownBlock2D")
UP_BLOCKS = ("UpBlock2D", "AttnUpBlock2D")
# How flow time enters a checkpoint; see `velocity`.
CONVENTIONS = ("sigma", "t")
CONVENTION_KEY = "fpo_convention"
TIMESTEP_SCALE = 1000.0  # FlowMatchEulerDiscreteScheduler: 1000 training timesteps (app:cifar)
WEIGHTS_NAMES = (
    "diffusion_pytorch_model.safetensors",
    "diffusion_pytorch_model.fp16.safetensors",
    "diffusion_pytorch_model.bin",
    "diffusion_pytorch_model.fp16.bin",
)


def check_unet_config(config: dict) -> dict:
    """Validate a diffusers ``UNet2DModel`` config and return it completed with the defaults.

    Keys starting with ``_`` (``_class_name``, ``_diffusers_version``, ...), ``sample_size``,
    ``num_train_timesteps``, this project's ``fpo_convention`` and unknown keys set to ``None`` do
    not change the network and are kept as they are. Every setting that would need a layer not
    implemented here, and every other unknown key, raises.
    """
    cls_name = config.get("_class_name", "UNet2DModel")
    if cls_name != "UNet2DModel":
        raise ValueError(f"_class_name={cls_name!r} is not supported; only 'UNet2DModel' configs load")
    # Options added to diffusers later default to None (= off); any other unknown key may change the maths.
    unknown = sorted(
        k for k in config
        if not k.startswith("_") and k not in UNET_DEFAULTS and k != CONVENTION_KEY and config[k] is not None
    )
    if unknown:
        raise ValueError(f"unknown UNet2DModel config keys {unknown}; allowed: {sorted(UNET_DEFAULTS)}")
    cfg = {**UNET_DEFAULTS, **config}
    for key, allowed in _FIXED_KEYS.items():
        if cfg[key] not in allowed:
            raise ValueError(f"{key}={cfg[key]!r} is not supported; allowed: {list(allowed)}")
    for key, allowed in (("down_block_types", DOWN_BLOCKS), ("up_block_types", UP_BLOCKS)):
        for b in cfg[key]:
            if b not in allowed:
                raise ValueError(f"{key} entry {b!r} is not supported; allowed: {list(allowed)}")
    n = len(cfg["block_out_channels"])
    if not (len(cfg["down_block_types"]) == len(cfg["up_block_types"]) == n) or n < 1:
        raise ValueError(
            f"down_block_types, up_block_types and block_out_channels need one equal length >= 1, got "
            f"{len(cfg['down_block_types'])}, {len(cfg['up_block_types'])}, {n}"
        )
    if cfg["norm_num_groups"] is None:
        raise ValueError("norm_num_groups=None is not supported; give an integer number of groups")
    if int(cfg["layers_per_block"]) < 1:
        raise ValueError(f"layers_per_block={cfg['layers_per_block']} must be >= 1")
    conv = cfg.get(CONVENTION_KEY, "sigma")
    if conv not in CONVENTIONS:
        raise ValueError(f"{CONVENTION_KEY}={conv!r} is not supported; allowed: {list(CONVENTIONS)}")
    return cfg


def timestep_embedding(t: torch.Tensor, dim: int, flip_sin_to_cos: bool, freq_shift: float) -> torch.Tensor:
    """Sinusoidal embedding of (possibly fractional) timesteps ``t`` of shape (N,), in float32.

    Frequencies are ``exp(-ln(10000) k / (dim/2 - freq_shift))`` for ``k < dim/2``; the output is
    ``[sin, cos]``, or ``[cos, sin]`` when ``flip_sin_to_cos``, zero-padded to an odd ``dim``.
    """
    half = dim // 2
    freqs = torch.exp(-math.log(10000.0) * torch.arange(half, dtype=torch.float32, device=t.device) / (half - freq_shift))
    arg = t.float()[:, None] * freqs[None, :]
    emb = torch.cat([torch.cos(arg), torch.sin(arg)] if flip_sin_to_cos else [torch.sin(arg), torch.cos(arg)], dim=-1)
    return F.pad(emb, (0, 1)) if dim % 2 else emb


class TimestepMLP(nn.Module):
    """Two-layer SiLU MLP on the sinusoidal embedding (diffusers ``TimestepEmbedding``)."""

    def __init__(self, dim_in: int, dim: int):
        super().__init__()
        self.linear_1 = nn.Linear(dim_in, dim)
        self.linear_2 = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_2(F.silu(self.linear_1(x)))


class ResnetBlock(nn.Module):
    """GroupNorm-SiLU-conv, add projected time embedding, GroupNorm-SiLU-dropout-conv, plus a
    (1x1-projected when the width changes) shortcut, all divided by ``output_scale``."""

    def __init__(self, c_in: int, c_out: int, c_emb: int, groups: int, eps: float, dropout: float,
                 output_scale: float = 1.0):
        super().__init__()
        self.norm1 = nn.GroupNorm(groups, c_in, eps=eps)
        self.conv1 = nn.Conv2d(c_in, c_out, 3, padding=1)
        self.time_emb_proj = nn.Linear(c_emb, c_out)
        self.norm2 = nn.GroupNorm(groups, c_out, eps=eps)
        self.dropout = nn.Dropout(dropout)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, padding=1)
        self.conv_shortcut = nn.Conv2d(c_in, c_out, 1) if c_in != c_out else None
        self.output_scale = output_scale

    def forward(self, x: torch.Tensor, emb: torch.Tensor) -> torch.Tensor:
        h = self.conv1(F.silu(self.norm1(x)))
        h = h + self.time_emb_proj(F.silu(emb))[:, :, None, None]
        h = self.conv2(self.dropout(F.silu(self.norm2(h))))
        skip = x if self.conv_shortcut is None else self.conv_shortcut(x)
        return (skip + h) / self.output_scale


class SelfAttention(nn.Module):
    """Residual multi-head self-attention over the pixels of a feature map, with a GroupNorm on
    the input (diffusers ``Attention`` as built for the U-Net's attention blocks)."""

    def __init__(self, channels: int, head_dim: int, groups: int, eps: float, output_scale: float = 1.0):
        super().__init__()
        self.heads = channels // head_dim
        if self.heads < 1:
            raise ValueError(f"attention_head_dim={head_dim} must be <= the attention width {channels}")
        inner = self.heads * head_dim
        self.group_norm = nn.GroupNorm(groups, channels, eps=eps)
        self.to_q = nn.Linear(channels, inner)
        self.to_k = nn.Linear(channels, inner)
        self.to_v = nn.Linear(channels, inner)
        self.to_out = nn.ModuleList([nn.Linear(inner, channels), nn.Dropout(0.0)])
        self.output_scale = output_scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, c, hgt, wid = x.shape
        h = self.group_norm(x.reshape(n, c, hgt * wid)).transpose(1, 2)  # (N, HW, C)
        q, k, v = (proj(h).view(n, hgt * wid, self.heads, -1).transpose(1, 2) for proj in (self.to_q, self.to_k, self.to_v))
        h = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(n, hgt * wid, -1)
        h = self.to_out[0](h).transpose(1, 2).reshape(n, c, hgt, wid)
        return (h + x) / self.output_scale


class Downsample(nn.Module):
    """Stride-2 3x3 conv; with ``padding=0`` the input is first padded by one on the right/bottom."""

    def __init__(self, channels: int, padding: int):
        super().__init__()
        self.padding = padding
        self.conv = nn.Conv2d(channels, channels, 3, stride=2, padding=padding)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(F.pad(x, (0, 1, 0, 1)) if self.padding == 0 else x)


class Upsample(nn.Module):
    """Nearest-neighbour 2x upsampling followed by a 3x3 conv."""

    def __init__(self, channels: int):
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(F.interpolate(x, scale_factor=2.0, mode="nearest"))


class DownBlock(nn.Module):
    """``DownBlock2D`` (``attn=False``) or ``AttnDownBlock2D`` (``attn=True``): resnets (each
    followed by attention) and an optional downsampler; returns every intermediate for the skips."""

    def __init__(self, c_in, c_out, c_emb, layers, attn, head_dim, groups, eps, dropout, downsample, pad):
        super().__init__()
        self.attentions = nn.ModuleList(SelfAttention(c_out, head_dim, groups, eps) for _ in range(layers)) if attn else None
        self.resnets = nn.ModuleList(
            ResnetBlock(c_in if i == 0 else c_out, c_out, c_emb, groups, eps, dropout) for i in range(layers)
        )
        self.downsamplers = nn.ModuleList([Downsample(c_out, pad)]) if downsample else None

    def forward(self, x, emb):
        skips = []
        for i, resnet in enumerate(self.resnets):
            x = resnet(x, emb)
            if self.attentions is not None:
                x = self.attentions[i](x)
            skips.append(x)
        if self.downsamplers is not None:
            x = self.downsamplers[0](x)
            skips.append(x)
        return x, skips


class UpBlock(nn.Module):
    """``UpBlock2D`` / ``AttnUpBlock2D``: each resnet takes the running features concatenated with
    one skip (popped last-first), optionally followed by attention; then an optional upsampler."""

    def __init__(self, c_in, c_prev, c_out, c_emb, layers, attn, head_dim, groups, eps, dropout, upsample):
        super().__init__()
        self.attentions = nn.ModuleList(SelfAttention(c_out, head_dim, groups, eps) for _ in range(layers)) if attn else None
        self.resnets = nn.ModuleList(
            ResnetBlock(
                (c_prev if i == 0 else c_out) + (c_in if i == layers - 1 else c_out), c_out, c_emb, groups, eps, dropout
            )
            for i in range(layers)
        )
        self.upsamplers = nn.ModuleList([Upsample(c_out)]) if upsample else None

    def forward(self, x, skips, emb):
        for i, resnet in enumerate(self.resnets):
            x = resnet(torch.cat([x, skips.pop()], dim=1), emb)
            if self.attentions is not None:
                x = self.attentions[i](x)
        if self.upsamplers is not None:
            x = self.upsamplers[0](x)
        return x


class MidBlock(nn.Module):
    """``UNetMidBlock2D``: resnet, attention, resnet; every residual sum is divided by
    ``mid_block_scale_factor`` (both the resnets' and the attention's)."""

    def __init__(self, c, c_emb, head_dim, groups, attn_groups, eps, dropout, scale, attn):
        super().__init__()
        self.attentions = nn.ModuleList([SelfAttention(c, head_dim, attn_groups, eps, scale)]) if attn else None
        self.resnets = nn.ModuleList(ResnetBlock(c, c, c_emb, groups, eps, dropout, scale) for _ in range(2))

    def forward(self, x, emb):
        x = self.resnets[0](x, emb)
        if self.attentions is not None:
            x = self.attentions[0](x)
        return self.resnets[1](x, emb)


class UNet2D(nn.Module):
    """Unconditional U-Net with the parameter names and maths of diffusers' ``UNet2DModel``.

    Supports down blocks ``DownBlock2D``/``AttnDownBlock2D``, up blocks ``UpBlock2D``/
    ``AttnUpBlock2D``, a positional time embedding, the ``UNetMidBlock2D`` mid block (or none),
    conv down/upsampling and SiLU; other settings raise ``ValueError`` in ``check_unet_config``.
    ``net(x, timestep)`` maps images (N, C, H, W) and timesteps (a scalar or shape (N,), in the
    checkpoint's own units, e.g. 0..1000) to an output of the input's shape. Unlike diffusers,
    Python-number timesteps are not truncated to integers.
    """

    def __init__(self, config: dict):
        super().__init__()
        cfg = check_unet_config(config)
        self.config = cfg
        ch = [int(c) for c in cfg["block_out_channels"]]
        groups, eps, drop = int(cfg["norm_num_groups"]), float(cfg["norm_eps"]), float(cfg["dropout"])
        layers, pad = int(cfg["layers_per_block"]), int(cfg["downsample_padding"])
        c_emb = cfg["time_embedding_dim"] or 4 * ch[0]
        hd = cfg["attention_head_dim"]  # None means one head spanning all channels

        self.conv_in = nn.Conv2d(cfg["in_channels"], ch[0], 3, padding=1)
        self.time_embedding = TimestepMLP(ch[0], c_emb)
        self.down_blocks, self.up_blocks = nn.ModuleList(), nn.ModuleList()  # diffusers' registration order
        for i, kind in enumerate(cfg["down_block_types"]):
            c_in, c_out = ch[max(i - 1, 0)], ch[i]
            self.down_blocks.append(
                DownBlock(c_in, c_out, c_emb, layers, kind == "AttnDownBlock2D", hd or c_out, groups, eps, drop,
                          i < len(ch) - 1, pad)
            )
        self.mid_block = None
        if cfg["mid_block_type"] is not None:
            attn_groups = cfg["attn_norm_num_groups"] or groups
            scale, attn = float(cfg["mid_block_scale_factor"]), bool(cfg["add_attention"])
            self.mid_block = MidBlock(ch[-1], c_emb, hd or ch[-1], groups, attn_groups, eps, drop, scale, attn)
        rch = ch[::-1]
        for i, kind in enumerate(cfg["up_block_types"]):
            c_prev, c_out, c_in = rch[max(i - 1, 0)], rch[i], rch[min(i + 1, len(ch) - 1)]
            self.up_blocks.append(
                UpBlock(c_in, c_prev, c_out, c_emb, layers + 1, kind == "AttnUpBlock2D", hd or c_out, groups, eps, drop,
                        i < len(ch) - 1)
            )
        self.conv_norm_out = nn.GroupNorm(groups, ch[0], eps=eps)
        self.conv_out = nn.Conv2d(ch[0], cfg["out_channels"], 3, padding=1)

    @classmethod
    def from_config(cls, config: dict) -> "UNet2D":
        """Build a randomly initialised network from a diffusers ``config.json`` dict."""
        return cls(config)

    @property
    def convention(self) -> str:
        """How flow time enters this network (``"sigma"`` or ``"t"``, see `velocity`)."""
        return self.config.get(CONVENTION_KEY, "sigma")

    def forward(self, x: torch.Tensor, timestep: torch.Tensor | float) -> torch.Tensor:
        cfg = self.config
        if cfg["center_input_sample"]:
            x = 2 * x - 1.0
        t = torch.as_tensor(timestep, device=x.device).reshape(-1).float()
        t = t * torch.ones(x.shape[0], device=x.device)
        emb = timestep_embedding(t, self.conv_in.out_channels, cfg["flip_sin_to_cos"], cfg["freq_shift"])
        emb = self.time_embedding(emb.to(self.conv_in.weight.dtype))
        h = self.conv_in(x)
        skips = [h]
        for block in self.down_blocks:
            h, s = block(h, emb)
            skips += s
        if self.mid_block is not None:
            h = self.mid_block(h, emb)
        for block in self.up_blocks:
            h = block(h, skips, emb)
        return self.conv_out(F.silu(self.conv_norm_out(h)))


def velocity(net: nn.Module, x_t: torch.Tensor, t: torch.Tensor | float, convention: str | None = None) -> torch.Tensor:
    """Data-minus-noise velocity estimate ``v ~ x - eps`` at flow time ``t`` (t=0 noise, t=1 data,
    ``x_t = (1-t) eps + t x``).

    Conventions (``None`` reads the network's stored ``fpo_convention``, default ``"sigma"``):

    - ``"sigma"``: the checkpoint is a diffusers flow-matching model as trained with
      ``FlowMatchEulerDiscreteScheduler`` (e.g. ``FrankCCCCC/cfm-cifar10-32``, app:cifar): its input
      is ``x_sigma = sigma*noise + (1-sigma)*x`` with ``sigma = 1-t``, its timestep is ``1000*sigma``
      and its output estimates ``noise - x``; so ``v = -net(x_t, 1000*(1-t))``.
    - ``"t"``: timestep ``1000*t`` and the output already is ``x - noise``: ``v = net(x_t, 1000*t)``.
    """
    convention = convention or getattr(net, "convention", "sigma")
    t = torch.as_tensor(t, device=x_t.device, dtype=torch.float32)
    if convention == "sigma":
        return -net(x_t, TIMESTEP_SCALE * (1.0 - t))
    if convention == "t":
        return net(x_t, TIMESTEP_SCALE * t)
    raise ValueError(f"convention={convention!r} is not supported; allowed: {list(CONVENTIONS)}")


def _model_folder(path: str | os.PathLike) -> Path:
    """The folder holding config.json: ``path`` itself or its ``unet/`` subfolder (pipelines)."""
    path = Path(path)
    for folder in (path, path / "unet"):
        if (folder / "config.json").is_file():
            return folder
    raise ValueError(f"no config.json in {str(path)!r} or {str(path / 'unet')!r}; expected a diffusers UNet2DModel folder")


def _rename_legacy_attention(state: dict) -> dict:
    """Map the pre-0.14 diffusers attention names (query/key/value/proj_attn) to the current ones."""
    names = {"query": "to_q", "key": "to_k", "value": "to_v", "proj_attn": "to_out.0"}
    pattern = re.compile(r"^(.*attentions\.\d+)\.(query|key|value|proj_attn)\.(weight|bias)$")
    out = {}
    for k, v in state.items():
        m = pattern.match(k)
        out[f"{m[1]}.{names[m[2]]}.{m[3]}" if m else k] = v
    return out


def load_unet(path: str | os.PathLike, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32) -> UNet2D:
    """Load a diffusers ``UNet2DModel`` folder (``config.json`` + ``diffusion_pytorch_model``
    ``.safetensors`` or ``.bin``; a pipeline folder's ``unet/`` also works) into `UNet2D`, strictly.
    The network is returned in eval mode on ``device`` in ``dtype``."""
    folder = _model_folder(path)
    config = json.loads((folder / "config.json").read_text())
    net = UNet2D.from_config(config)
    files = [folder / n for n in WEIGHTS_NAMES if (folder / n).is_file()]
    if not files:
        raise ValueError(f"no weights in {str(folder)!r}; expected one of {list(WEIGHTS_NAMES)}")
    if files[0].suffix == ".safetensors":
        from safetensors.torch import load_file

        state = load_file(str(files[0]))
    else:
        state = torch.load(files[0], map_location="cpu", weights_only=True)
    net.load_state_dict(_rename_legacy_attention(state), strict=True)
    return net.to(device=device, dtype=dtype).eval()


def save_unet(net: UNet2D, folder: str | os.PathLike, dtype: torch.dtype = torch.float16, **extra_config) -> Path:
    """Write ``net`` as a diffusers folder: ``config.json`` (with ``fpo_convention`` and any
    ``extra_config`` entries) and ``diffusion_pytorch_model.safetensors`` in ``dtype``."""
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    config = {"_class_name": "UNet2DModel", **net.config, CONVENTION_KEY: net.convention, **extra_config}
    check_unet_config(config)
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    state = {k: v.detach().to("cpu", dtype).contiguous() for k, v in net.state_dict().items()}
    save_file(state, str(folder / WEIGHTS_NAMES[0]), metadata={"format": "pt"})
    return folder


def _hub_reachable(timeout: float = 3.0) -> bool:
    """Whether the Hugging Face hub answers a TCP connection within ``timeout`` seconds."""
    if os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes"):
        return False
    url = urllib.parse.urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    try:
        socket.create_connection((url.hostname, url.port or (443 if url.scheme == "https" else 80)), timeout=timeout).close()
        return True
    except OSError:
        return False


def resolve_model(model: str) -> str:
    """Local folder for ``model``: an existing folder as is; else a Hugging Face repo id
    ``owner/name``, looked up as ``./weights/<name>`` (next to this file or in the working
    directory) and otherwise downloaded with ``huggingface_hub`` when the hub is reachable."""
    if Path(model).expanduser().is_dir():
        return str(Path(model).expanduser())
    if not re.fullmatch(r"[\w.-]+/[\w.-]+", model) or model.startswith((".", "/", "~")):
        raise ValueError(
            f"model folder {model!r} does not exist (give a diffusers folder or a Hugging Face repo id owner/name)"
        )
    name = model.split("/")[1]
    for root in (Path(__file__).resolve().parent, Path.cwd()):
        folder = root / "weights" / name
        if (folder / "config.json").is_file() or (folder / "unet" / "config.json").is_file():
            return str(folder)
    hint = f"download {model} into ./weights/{name} (config.json + diffusion_pytorch_model.safetensors)"
    if not _hub_reachable():
        raise ValueError(f"{model!r} is neither a local folder nor reachable on the Hugging Face hub; {hint}")
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        raise ValueError(f"{model!r} needs huggingface_hub (pip install huggingface_hub) or a local copy; {hint}") from None
    files = ["config.json", "diffusion_pytorch_model.safetensors"]
    patterns = files + [f"unet/{f}" for f in files]
    return snapshot_download(repo_id=model, allow_patterns=patterns)


# ---------------------------------------------------------------------------------------------
# Algorithm 1
# ---------------------------------------------------------------------------------------------
DEFAULT_MODEL = str(Path(__file__).resolve().parent / "weights" / "cfm-cifar10-small")
# ---------------------------------------------------------------------------------------------
# Arguments
# ---------------------------------------------------------------------------------------------
WEIGHTINGS = ("fixed", "schedule", "static-softmax", "static-direct", "online-ema", "online-refit")
TARGETS = ("v", "x0", "eps")
PRECISIONS = ("fp32", "tf32", "bf16")

# Values a preset fills in for every field left at None. "paper" is app:cifar exactly; "quick" is a
# small CPU demonstration (fewer, smaller batches, fewer sampling steps, a larger learning rate) that
# shows the validation reward moving within minutes on a laptop-class CPU.
PRESETS = {
    "paper": dict(
        batch_size=64,  # app:cifar
        group_size=16,  # app:cifar
        mc_draws=4,  # app:cifar
        sample_steps=20,  # app:cifar
        num_updates=800,  # app:cifar
        learning_rate=1e-5,  # app:cifar
        val_every=20,  # app:cifar
        val_banks=4,  # app:cifar
        val_bank_size=128,  # app:cifar
        calib_bank_size=512,  # app:cifar (eq:calibration bank)
        fit_batch_size=64,  # app:method-settings (online fit batch)
        min_updates_before_stop=200,  # app:cifar
    ),
    "quick": dict(
        batch_size=32,
        group_size=16,
        mc_draws=4,
        sample_steps=10,
        num_updates=12,
        learning_rate=1e-4,
        val_every=3,
        val_banks=1,
        val_bank_size=64,
        calib_bank_size=32,
        fit_batch_size=32,
        min_updates_before_stop=12,
    ),
}


@dataclass
class Args:
    # --- run -------------------------------------------------------------------------------
    preset: str = "paper"
    """Settings bundle for every field left unset below: `paper` (app:cifar: batch 64, 20 Euler steps,
    800 updates, lr 1e-5, 4x128 validation images every 20 updates) or `quick` (a CPU demonstration of a few
    minutes: batch 32, 10 steps, 12 updates, lr 1e-4, 64 validation images every 3 updates)."""
    seed: int = 20260724
    """Training seed (app:method-settings uses 20260724-20260726). It fixes the rollouts, the
    auxiliary (t, eps) draws, the calibration bank and the validation latent banks."""
    run_name: Optional[str] = None
    """Folder name under `runs_dir`; default `<reward>__<weighting>__<seed>`."""
    runs_dir: str = "runs"
    """Where run folders are written."""
    resume: bool = False
    """Continue the run in `runs_dir/run_name` from its last checkpoint (model, optimiser, weighting
    state, validation history, RNG states). The resumed metrics equal an uninterrupted run's."""
    device: str = "auto"
    """`auto` (CUDA when available), `cpu`, `cuda` or `cuda:N`."""
    precision: str = "fp32"
    """`fp32` (app:cifar, strict FP32 matmuls), `tf32` (TF32 matmuls and convolutions), or `bf16`
    (bf16 autocast for the network only). Log-ratios, clipping, advantages and Adam stay FP32."""
    compile: bool = False
    """Fast path: `torch.compile` the network and, on CUDA, replay the whole Euler sampler as one CUDA
    graph per batch size (rollouts and validation), with cuDNN autotuning and a fused Adam step. The
    numerics are those of `--precision`; `--precision bf16 --compile` is the fast mode of
    benchmarks/README.md. The first updates pay a one-off compilation (about two minutes for the
    paper's U-Net; cached on disk for later runs)."""
    reuse_old_losses: Optional[bool] = None
    """Take the old losses l_old from the current model's forward pass (detached) instead of a second
    forward pass of the frozen copy. With one gradient step per rollout (alg:cifar) theta_old = theta
    when both are computed, so the values are the same and 4n forward passes per update are saved.
    Default: on with `--compile`, off otherwise (Algorithm 1 exactly as written)."""

    # --- model and reward --------------------------------------------------------------------
    model: str = DEFAULT_MODEL
    """Generator: a local diffusers folder (config.json + safetensors) or a Hugging Face repo id such as
    `FrankCCCCC/cfm-cifar10-32` (downloaded only when the hub is reachable). Default: the shipped
    CIFAR-10 stand-in generator."""
    convention: Optional[str] = None
    """Network time/output convention: `sigma` (timestep = 1000 (1-t), output negated; the convention of
    FrankCCCCC/cfm-cifar10-32, app:cifar) or `t` (timestep = 1000 t, output is the velocity). Default:
    the value stored in the model's config.json, else `sigma`."""
    reward: str = "auto-a35"
    """Reward (app:rewards): auto-a35, mixed, edge, clip, simclr, digit7; pixel-only test rewards
    red-patch and digit7-structure need no model."""
    classifier_path: Optional[str] = None
    """CIFAR-10 classifier weights for auto-a35/mixed (default: the shipped stand-in)."""
    simclr_path: Optional[str] = None
    """SimCLR encoder + prototypes for the simclr reward (default: the shipped stand-in)."""
    clip_model: str = "ViT-B-32"
    """OpenCLIP architecture for the clip and digit7 rewards."""
    clip_pretrained: Optional[str] = None
    """OpenCLIP pretrained tag or local weights file for the clip and digit7 rewards (required for them)."""

    # --- weighting (sec:theory, app:discrete-alpha, app:methods, app:schedules) -----------------
    weighting: str = "fixed"
    """fixed | schedule | static-softmax | static-direct | online-ema | online-refit."""
    alpha: float = 0.0
    """Exponent of the 12-bin power family (eq:discrete-alpha): 0 = x0 target, 1 = velocity, smaller =
    more high-noise emphasis. Used by `fixed` unless `target` is given."""
    target: Optional[str] = None
    """Named target profile for `fixed`: v, x0 or eps (eq:targets). Overrides `alpha`."""
    g: float = 1.0
    """Whole-loss scale multiplier g of a(q, g) (eq:calibration)."""
    estimator: str = "q+a"
    """q+a (sample bins from q, scale by a(q,g); default), q+Z (scale by Z = mean w; app:halving) or
    explicit (uniform times, each draw weighted by w; app:sampling)."""
    bins: int = 12
    """Number of time bins B (app:discrete-alpha)."""
    alpha_early: float = -3.0
    """Schedule start exponent (app:schedules; Mixed uses -3)."""
    alpha_late: float = -0.5
    """Schedule end exponent (app:schedules; Mixed uses -.5)."""
    k0: int = 160
    """Schedule: update where alpha starts moving (app:schedules; Mixed 160)."""
    k1: int = 260
    """Schedule: update where alpha reaches alpha_late (app:schedules; Mixed 260)."""
    eta: float = 1.0
    """Static-softmax concentration eta_norm (eq:static; grid .25-2)."""
    online_kappa: float = 300.0
    """Online EMA concentration on raw coherence (eq:online)."""
    online_decay: float = 0.8
    """Online EMA decay of the coherence moments (app:online-analysis)."""
    online_init: str = "uniform"
    """Online EMA starting profile: uniform (five-reward comparison) or x0 (Digit7 variant)."""
    refit_eta: float = 1.0
    """Full-refit concentration eta_raw on raw coherence (app:online-analysis)."""
    refit_every: int = 20
    """Full-refit: replace the profile every this many updates from the pooled window (app:online-analysis)."""
    coherence_draws: int = 4
    """Time/noise draws per endpoint and bin when measuring output coherence (app:method-settings)."""

    # --- Algorithm 1 (alg:cifar, app:cifar); None = from the preset --------------------------
    batch_size: Optional[int] = None
    """Generated samples per update n (paper 64)."""
    group_size: Optional[int] = None
    """Contiguous advantage groups G (paper 16); batch_size must be a multiple."""
    mc_draws: Optional[int] = None
    """Monte Carlo (t, eps) pairs M per sample (paper 4)."""
    sample_steps: Optional[int] = None
    """Euler steps of the generation ODE from t=0 to t=1 (paper 20)."""
    num_updates: Optional[int] = None
    """Maximum number of updates (paper 800)."""
    learning_rate: Optional[float] = None
    """Adam learning rate (paper 1e-5)."""
    adam_betas: Tuple[float, float] = (0.9, 0.999)
    """Adam betas (app:cifar)."""
    adam_eps: float = 1e-8
    """Adam epsilon (app:cifar)."""
    max_grad_norm: float = 0.5
    """Global gradient-norm clip (app:cifar)."""
    clip_ratio: float = 0.08
    """PPO ratio clip rho: r is clipped to [1-rho, 1+rho] (app:cifar)."""
    log_ratio_clip: float = 20.0
    """Clamp c of the log surrogate D_i before exponentiation (eq:rl-mc, app:cifar)."""
    adv_eps: float = 1e-6
    """epsilon_A in the group advantage denominator (app:cifar)."""

    # --- validation, stopping, outputs --------------------------------------------------------
    val_every: Optional[int] = None
    """Validate every this many updates, including update 0 (paper 20)."""
    val_banks: Optional[int] = None
    """Number of fixed validation latent banks (paper 4)."""
    val_bank_size: Optional[int] = None
    """Latents per validation bank (paper 128)."""
    calib_bank_size: Optional[int] = None
    """Examples in the frozen calibration bank (paper 512, eq:calibration)."""
    fit_batch_size: Optional[int] = None
    """Endpoints per coherence fit batch for static/online rules (paper 64)."""
    early_stop: bool = True
    """Validation-based stopping (app:cifar), only once `min_updates_before_stop` updates are done.
    Plateau: the best validation reward has not improved by more than `stop_min_delta` for
    `stop_patience` consecutive validation nodes. Degradation: the validation reward has stayed below
    `peak - stop_degrade_frac * (peak - initial)` for `stop_degrade_nodes` consecutive nodes
    (i.e. it has given back that fraction of the run's gain). The rule is this project's reading of
    "stopping for plateau or degradation after a minimum of 200"; the paper gives no formula."""
    min_updates_before_stop: Optional[int] = None
    """No stopping before this many updates (paper 200)."""
    stop_patience: int = 10
    """Plateau patience in validation nodes (10 nodes = 200 updates at the paper cadence)."""
    stop_min_delta: float = 1e-3
    """Smallest validation gain that counts as an improvement for the plateau rule."""
    stop_degrade_frac: float = 0.5
    """Degradation rule: fraction of the gain (peak - initial) given back."""
    stop_degrade_nodes: int = 3
    """Degradation rule: consecutive validation nodes below the threshold."""
    until: Optional[int] = None
    """Pause (status `paused`, checkpoint written) once this many updates are done, e.g. at a halving rung;
    continue later with `--resume` and a larger `--until` (or none). Default: run to `num_updates`."""
    checkpoint_every: Optional[int] = None
    """Checkpoint every this many updates (default: every validation node)."""
    save_samples: bool = True
    """Write a PNG grid of validation samples at each validation node."""
    verbose: bool = True
    """Print one status line per update."""


def resolve_args(args: Args) -> Args:
    """Fill preset values and check every argument; a bad value raises a one-line ValueError."""
    if args.preset not in PRESETS:
        raise ValueError(f"--preset {args.preset!r} is not one of {sorted(PRESETS)}")
    values = {k: (getattr(args, k) if getattr(args, k) is not None else v) for k, v in PRESETS[args.preset].items()}
    args = replace(args, **values)
    if args.checkpoint_every is None:
        args = replace(args, checkpoint_every=args.val_every)
    if args.weighting not in WEIGHTINGS:
        raise ValueError(f"--weighting {args.weighting!r} is not one of {', '.join(WEIGHTINGS)}")
    if args.reward not in REWARDS + PIXEL_REWARDS:
        raise ValueError(f"--reward {args.reward!r} is not one of {', '.join(REWARDS + PIXEL_REWARDS)}")
    if args.target is not None and args.target not in TARGETS:
        raise ValueError(f"--target {args.target!r} is not one of {', '.join(TARGETS)}")
    if args.estimator not in ESTIMATORS:
        raise ValueError(f"--estimator {args.estimator!r} is not one of {', '.join(ESTIMATORS)}")
    if args.precision not in PRECISIONS:
        raise ValueError(f"--precision {args.precision!r} is not one of {', '.join(PRECISIONS)}")
    if args.online_init not in ("uniform", "x0"):
        raise ValueError(f"--online-init {args.online_init!r} is not one of uniform, x0")
    for name in ("alpha", "alpha_early", "alpha_late", "g", "eta", "online_kappa", "refit_eta", "learning_rate"):
        if not math.isfinite(getattr(args, name)):
            raise ValueError(f"--{name.replace('_', '-')} is {getattr(args, name)}; a finite number is required")
    if args.g <= 0:
        raise ValueError(f"--g {args.g} must be > 0")
    for name in ("batch_size", "group_size", "mc_draws", "sample_steps", "val_every", "val_banks",
                 "val_bank_size", "calib_bank_size", "fit_batch_size", "bins", "checkpoint_every", "refit_every"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} {getattr(args, name)} must be >= 1")
    if args.num_updates < 0:
        raise ValueError(f"--num-updates {args.num_updates} must be >= 0")
    if args.group_size < 2:
        raise ValueError(f"--group-size {args.group_size} must be >= 2 (the group SD uses G-1)")
    if args.batch_size % args.group_size:
        raise ValueError(f"--batch-size {args.batch_size} is not divisible by --group-size {args.group_size}")
    if args.fit_batch_size % args.group_size:
        raise ValueError(f"--fit-batch-size {args.fit_batch_size} is not divisible by --group-size {args.group_size}")
    if not 0 < args.clip_ratio < 1:
        raise ValueError(f"--clip-ratio {args.clip_ratio} must be in (0, 1)")
    if args.weighting == "schedule" and args.k1 < args.k0:
        raise ValueError(f"--k1 {args.k1} must be >= --k0 {args.k0}")
    if args.reuse_old_losses is None:
        args = replace(args, reuse_old_losses=args.compile)
    if args.run_name is None:
        args = replace(args, run_name=f"{args.reward}__{args.weighting}__{args.seed}")
    return args


# ---------------------------------------------------------------------------------------------
# Small helpers: seeding, sampling, losses (the pieces diagnostics.py and halving.py reuse)
# ---------------------------------------------------------------------------------------------
# Every random draw comes from a generator seeded by (seed, purpose, update), so a run is a pure
# function of its arguments and a resumed run repeats the uninterrupted one exactly.
PURPOSES = {"rollout": 1, "draws": 2, "validation": 3, "calibration": 4, "fit": 5}


def make_generator(seed: int, purpose: str, k: int = 0, device="cpu") -> torch.Generator:
    """A torch.Generator seeded from (seed, purpose, k) with a fixed integer hash."""
    value = (seed * 1_000_003 + PURPOSES[purpose] * 10_007 + k) % (2**63 - 1)
    gen = torch.Generator(device=torch.device(device))
    gen.manual_seed(value)
    return gen


@torch.no_grad()
def sample_images(net, latents: torch.Tensor, steps: int, convention: str, autocast=None) -> torch.Tensor:
    """Euler integration of the generation ODE from noise (t=0) to data (t=1) on a uniform grid."""
    x = latents
    dt = 1.0 / steps
    for j in range(steps):
        t = torch.full((x.shape[0],), j * dt, device=x.device, dtype=x.dtype)
        with autocast_ctx(autocast, x.device):
            v = velocity(net, x, t, convention)
        x = x + dt * v.float()
    return x.clamp(-1.0, 1.0)


def autocast_ctx(dtype, device):
    """bf16 autocast on the network when requested, otherwise a no-op context."""
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=torch.device(device).type, dtype=dtype)


class GraphSampler:
    """`sample_images` for a fixed network, captured once per batch size as a CUDA graph and replayed.

    All 20 Euler steps become one graph launch, so a small batch no longer waits on the CPU to launch
    hundreds of kernels per step. The graph reads the network's parameters in place and therefore
    follows every optimiser step (parameters must keep their storage: `load_state_dict` and in-place
    optimisers do). Sampling runs in evaluation mode; outputs are copied out of the graph's buffers.
    `fwd` is the module to call (e.g. the compiled network), `net` the module whose mode is switched.
    """

    def __init__(self, fwd, net: nn.Module, steps: int, convention: str, autocast=None, warmup: int = 2):
        self.fwd, self.net, self.steps, self.convention, self.autocast = fwd, net, steps, convention, autocast
        self.warmup = warmup
        self.graphs: Dict[Tuple[int, ...], Tuple[Any, torch.Tensor, torch.Tensor]] = {}

    def _capture(self, latents: torch.Tensor):
        static_in = latents.clone()
        side = torch.cuda.Stream(latents.device)
        side.wait_stream(torch.cuda.current_stream(latents.device))
        with torch.cuda.stream(side):  # warm-up (compiles) outside the capture
            for _ in range(self.warmup):
                sample_images(self.fwd, static_in, self.steps, self.convention, self.autocast)
        torch.cuda.current_stream(latents.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_out = sample_images(self.fwd, static_in, self.steps, self.convention, self.autocast)
        return graph, static_in, static_out

    @torch.no_grad()
    def __call__(self, latents: torch.Tensor) -> torch.Tensor:
        with eval_mode(self.net):
            key = tuple(latents.shape)
            if key not in self.graphs:
                self.graphs[key] = self._capture(latents)
            graph, static_in, static_out = self.graphs[key]
            static_in.copy_(latents)
            graph.replay()
            return static_out.clone()


@contextlib.contextmanager
def eval_mode(net: nn.Module):
    """Evaluation mode inside the block, the previous mode afterwards."""
    was_training = net.training
    net.eval()
    try:
        yield net
    finally:
        net.train(was_training)


def eval_sampler(fwd, net: nn.Module, steps: int, convention: str, autocast=None):
    """A plain `sample_images` closure that samples in evaluation mode (CPU or uncaptured CUDA)."""

    @torch.no_grad()
    def sample(latents: torch.Tensor) -> torch.Tensor:
        with eval_mode(net):
            return sample_images(fwd, latents, steps, convention, autocast)

    return sample


def group_advantages(rewards: torch.Tensor, group_size: int, eps: float = 1e-6) -> torch.Tensor:
    """GRPO advantages over contiguous groups: (R - mean_G) / (s_G + eps), s_G with G-1 (app:cifar)."""
    r = rewards.float().view(-1, group_size)
    mean = r.mean(dim=1, keepdim=True)
    sd = r.std(dim=1, unbiased=True, keepdim=True)
    return ((r - mean) / (sd + eps)).view(-1)


def velocity_losses(net, x: torch.Tensor, t: torch.Tensor, eps: torch.Tensor, convention: str,
                    autocast=None) -> torch.Tensor:
    """Per-dimension velocity losses l_v = |v - u|^2 / d for endpoints x (n,C,H,W), times t (n,M) and
    noises eps (n,M,C,H,W); returns (n, M) in FP32 (eq:path, eq:targets)."""
    n, m = t.shape
    xe = x.unsqueeze(1).expand_as(eps)
    tt = t.view(n, m, 1, 1, 1)
    x_t = (1.0 - tt) * eps + tt * xe
    u = xe - eps
    with autocast_ctx(autocast, x.device):
        v = velocity(net, x_t.reshape(n * m, *x.shape[1:]), t.reshape(n * m), convention)
    v = v.float().view_as(u)
    return (v - u).pow(2).flatten(2).mean(dim=2)


def fpo_loss(l_old: torch.Tensor, l_new: torch.Tensor, adv: torch.Tensor, multipliers,
             clip_ratio: float = 0.08, log_ratio_clip: float = 20.0):
    """The clipped ELBO-surrogate objective of eq:rl-mc and eq:rl-ppo.

    D_i = 1/M sum_m c_im (l_old,im - l_theta,im), r_i = exp(clip(D_i, -c, c)),
    L = -mean_i min(r_i A_i, clip(r_i, 1-rho, 1+rho) A_i).
    `multipliers` c_im is the calibration scalar a_k for every draw with the sampling estimators
    (q+a, q+Z) and a_k w(t_im) with the explicit one (a float or an (n, M) tensor).
    Returns (loss, ratio) in FP32.
    """
    d = (multipliers * (l_old.float() - l_new.float())).mean(dim=1)
    ratio = torch.exp(d.clamp(-log_ratio_clip, log_ratio_clip))
    unclipped = ratio * adv
    clipped = ratio.clamp(1.0 - clip_ratio, 1.0 + clip_ratio) * adv
    return -torch.minimum(unclipped, clipped).mean(), ratio


def to_device(x: torch.Tensor, device) -> torch.Tensor:
    """Copy a CPU tensor to `device`; to CUDA through pinned memory without blocking the host, so the
    host keeps queueing work while the GPU is still busy (the values are identical)."""
    device = torch.device(device)
    if device.type == "cuda":
        return x.pin_memory().to(device, non_blocking=True)
    return x.to(device)


def draw_times_and_noise(plan, n: int, m: int, gen: torch.Generator, shape, device):
    """M auxiliary (t, eps) pairs per endpoint: t from the plan's bin law, eps ~ N(0, I).
    Drawn on the CPU, so a run's draws do not depend on the device."""
    t = sample_bin_times(plan.q, n * m, generator=gen).view(n, m).float()
    eps = torch.randn((n, m, *shape), generator=gen)
    return to_device(t, device), to_device(eps, device)


# ---------------------------------------------------------------------------------------------
# Weighting state: the profile w_k and its sampling plan at update k
# ---------------------------------------------------------------------------------------------
@torch.no_grad()
def fit_coherence(net, reward_fn, args: Args, gen: torch.Generator, device, convention, autocast=None):
    """Output-signal moments per bin for one fit batch (eq:coherence, app:methods).

    Generates `fit_batch_size` endpoints in groups, scores them, computes group advantages, and for each
    bin b draws `coherence_draws` times uniformly inside the bin (and Gaussian noises) per endpoint.
    The signals z = -2 A (v_theta - u)/d of a bin give the pairwise moments (U_b, V_b). Returns
    (U, V) as float64 numpy arrays of shape (bins,) and the fit batch's mean reward.
    """
    n, shape = args.fit_batch_size, (3, 32, 32)
    latents = torch.randn((n, *shape), generator=gen).to(device)
    x = sample_images(net, latents, args.sample_steps, convention, autocast)
    rewards = reward_fn(x).float()
    adv = group_advantages(rewards, args.group_size, args.adv_eps)
    d = float(np.prod(shape))
    us, vs = [], []
    for b in range(args.bins):
        m = args.coherence_draws
        t = ((b + torch.rand((n, m), generator=gen)) / args.bins).float()
        eps = torch.randn((n, m, *shape), generator=gen)
        t, eps = t.to(device), eps.to(device)
        xe = x.unsqueeze(1).expand_as(eps)
        tt = t.view(n, m, 1, 1, 1)
        x_t = (1 - tt) * eps + tt * xe
        with autocast_ctx(autocast, device):
            v = velocity(net, x_t.reshape(n * m, *shape), t.reshape(-1), convention).float().view_as(eps)
        z = (-2.0 * adv.view(n, 1, 1, 1, 1) * (v - (xe - eps)) / d).reshape(n * m, -1)
        u_b, v_b = coherence_moments(z.double().cpu())
        us.append(float(u_b))
        vs.append(float(v_b))
    return np.array(us), np.array(vs), float(rewards.mean())


def initial_profile(args: Args) -> np.ndarray:
    """The profile w_0 (mean-one over bins) before any data-driven rule has run."""
    if args.weighting == "fixed":
        if args.target is not None:
            return target_profile(args.target, args.bins)
        return alpha_profile(args.alpha, args.bins)
    if args.weighting == "schedule":
        return alpha_profile(linear_schedule(0, args.alpha_early, args.alpha_late, args.k0, args.k1), args.bins)
    if args.weighting == "online-ema" and args.online_init == "uniform":
        return np.ones(args.bins)
    if args.weighting in ("online-ema", "online-refit"):
        return target_profile("x0", args.bins)  # app:method-settings, app:online-analysis
    raise ValueError(f"--weighting {args.weighting!r} has no data-free initial profile")


def current_alpha(args: Args, k: int) -> Optional[float]:
    """The exponent in force at update k (None for data-driven profiles)."""
    if args.weighting == "fixed" and args.target is None:
        return float(args.alpha)
    if args.weighting == "schedule":
        return float(linear_schedule(k, args.alpha_early, args.alpha_late, args.k0, args.k1))
    return None


# ---------------------------------------------------------------------------------------------
# The run: setup, one update, validation, checkpoints
# ---------------------------------------------------------------------------------------------
@dataclass
class Run:
    """Everything one training run holds between updates (see `setup`)."""

    args: Args
    device: torch.device
    net: torch.nn.Module
    old_net: torch.nn.Module
    optimizer: torch.optim.Optimizer
    reward_fn: Any
    convention: str
    autocast: Any
    fwd: Any  # the network as called in the hot path (the compiled module with --compile)
    sampler: Any  # latents -> images with the current parameters, evaluation mode
    bank_losses: np.ndarray  # (N, B) frozen calibration bank, eq:calibration
    q_ref: np.ndarray  # q_x0, the scale anchor
    c_x0: float
    profile: np.ndarray  # w_k, mean-one over bins
    weighting_state: Dict[str, Any]
    val_latents: torch.Tensor
    history: List[Dict[str, float]]  # validation nodes: {"update", "val_reward"}
    k: int = 0  # next update to run
    status: str = "running"
    stop_reason: Optional[str] = None
    folder: Optional[Path] = None


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"--device {name!r} requested but CUDA is not available; use cpu or auto")
    if name != "cpu" and not name.startswith("cuda"):
        raise ValueError(f"--device {name!r} is not one of auto, cpu, cuda, cuda:N")
    return torch.device(name)


def set_precision(precision: str):
    """Matmul precision for the network; returns the autocast dtype (or None)."""
    tf32 = precision in ("tf32", "bf16")
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    torch.set_float32_matmul_precision("high" if tf32 else "highest")
    return torch.bfloat16 if precision == "bf16" else None


def set_fast_kernels(on: bool):
    """With --compile: let cuDNN time its convolution algorithms once per shape and keep the fastest
    (shapes are fixed in a run, so this pays off after the first call)."""
    torch.backends.cudnn.benchmark = bool(on)


@torch.no_grad()
def build_calibration_bank(net, args: Args, device, convention, autocast=None) -> np.ndarray:
    """The frozen coupled bank L_ib of eq:calibration at the initial model.

    N = calib_bank_size endpoints are generated by the initial model. Example i keeps one Gaussian noise
    and one in-bin offset u_i for all bins (t_ib = (b + u_i)/B), so its B losses are coupled.
    """
    gen = make_generator(args.seed, "calibration")
    n, shape, chunk = args.calib_bank_size, (3, 32, 32), 128
    out = []
    for s in range(0, n, chunk):
        c = min(chunk, n - s)
        latents = torch.randn((c, *shape), generator=gen).to(device)
        x = sample_images(net, latents, args.sample_steps, convention, autocast)
        eps = torch.randn((c, 1, *shape), generator=gen).to(device).expand(c, args.bins, *shape)
        offset = torch.rand((c, 1), generator=gen)
        t = ((torch.arange(args.bins).view(1, -1) + offset) / args.bins).float().to(device)
        eps = eps.contiguous()
        for j in range(0, c, 32):  # 32 endpoints x B bins per forward keeps the memory modest
            out.append(velocity_losses(net, x[j:j + 32], t[j:j + 32], eps[j:j + 32], convention,
                                       autocast).double().cpu())
    return torch.cat(out).numpy()


def setup(args: Args, folder: Optional[Path] = None) -> Run:
    """Build the generator, its frozen copy, Adam, the reward, the calibration bank and the validation
    latents. With `args.resume` and a checkpoint in `folder`, restore the saved state."""
    args = resolve_args(args)
    device = pick_device(args.device)
    autocast = set_precision(args.precision)
    set_fast_kernels(args.compile)
    torch.manual_seed(args.seed)
    np.random.seed(args.seed % (2**32))
    random.seed(args.seed)

    path = resolve_model(args.model)
    net = load_unet(path, device=device, dtype=torch.float32)
    convention = args.convention or getattr(net, "convention", None) or "sigma"
    if convention not in CONVENTIONS:
        raise ValueError(f"--convention {convention!r} is not one of {', '.join(CONVENTIONS)}")
    old_net = copy.deepcopy(net).eval().requires_grad_(False)
    net.train()
    fused = bool(args.compile and device.type == "cuda")  # one kernel for the whole Adam step
    optimizer = torch.optim.Adam(net.parameters(), lr=args.learning_rate, betas=tuple(args.adam_betas),
                                 eps=args.adam_eps, weight_decay=0.0, fused=fused or None)  # app:cifar
    fwd = torch.compile(net, dynamic=False) if args.compile else net
    if args.compile and device.type == "cuda":
        sampler = GraphSampler(fwd, net, args.sample_steps, convention, autocast)
    else:
        sampler = eval_sampler(fwd, net, args.sample_steps, convention, autocast)
    reward_fn = make_reward(args.reward, device=device, classifier_path=args.classifier_path,
                            simclr_path=args.simclr_path, clip_model=args.clip_model,
                            clip_pretrained=args.clip_pretrained)
    vgen = make_generator(args.seed, "validation")
    val_latents = torch.randn((args.val_banks * args.val_bank_size, 3, 32, 32), generator=vgen).to(device)

    ckpt = None
    if folder is not None and args.resume:
        ckpt_path = folder / "checkpoints" / "last.pt"
        if not ckpt_path.exists():
            raise ValueError(f"--resume: no checkpoint at {ckpt_path}")
        ckpt = torch.load(ckpt_path, map_location="cpu", weights_only=False)  # RNG states must stay on the CPU

    if ckpt is not None:
        bank = ckpt["bank_losses"]
    else:
        bank = build_calibration_bank(net, args, device, convention, autocast)
    q_ref = profile_probs(target_profile("x0", args.bins))
    c_x0 = float(calibration_S(bank, q_ref))

    run = Run(args=args, device=device, net=net, old_net=old_net, optimizer=optimizer, reward_fn=reward_fn,
              convention=convention, autocast=autocast, fwd=fwd, sampler=sampler, bank_losses=bank, q_ref=q_ref, c_x0=c_x0,
              profile=np.ones(args.bins), weighting_state={}, val_latents=val_latents, history=[], folder=folder)
    if ckpt is not None:
        restore_checkpoint(run, ckpt)
        if ckpt["status"] in ("finished", "stopped", "nonfinite") and run.k >= args.num_updates:
            run.status = ckpt["status"]
    else:
        init_weighting(run)
    if device.type == "cuda":
        torch.cuda.empty_cache()  # hand the set-up's large temporary batches back (concurrent runs share a GPU)
    return run


def init_weighting(run: Run):
    """The initial profile; static rules measure output coherence once at the initial checkpoint."""
    args = run.args
    if args.weighting in ("static-softmax", "static-direct"):
        gen = make_generator(args.seed, "fit", 0)
        u, v, _ = fit_coherence(run.net, run.reward_fn, args, gen, run.device, run.convention, run.autocast)
        c = coherence_from_moments(u, v)
        run.weighting_state["coherence"] = c.tolist()
        run.profile = static_softmax(c, args.eta) if args.weighting == "static-softmax" else static_direct(c)
    else:
        run.profile = initial_profile(args)
    if args.weighting == "online-ema":
        run.weighting_state["ema"] = None
    if args.weighting == "online-refit":
        run.weighting_state["window"] = []


def refresh_weighting(run: Run, k: int):
    """Set the profile in force at update k (schedules move alpha; online rules deploy last fit)."""
    args = run.args
    if args.weighting == "schedule":
        run.profile = alpha_profile(current_alpha(args, k), args.bins)


def after_update_weighting(run: Run, k: int) -> Dict[str, float]:
    """Online rules: fit on one fresh batch after update k and deploy at update k+1 (eq:online)."""
    args = run.args
    if args.weighting not in ("online-ema", "online-refit"):
        return {}
    gen = make_generator(args.seed, "fit", k + 1)
    u, v, fit_reward = fit_coherence(run.net, run.reward_fn, args, gen, run.device, run.convention, run.autocast)
    if args.weighting == "online-ema":
        state = ema_moments_update(run.weighting_state["ema"], u, v, decay=args.online_decay)
        run.weighting_state["ema"] = state
        c_hat = ema_coherence(state)
        run.profile = online_ema_profile(c_hat, kappa=args.online_kappa)
        return {"fit_reward": fit_reward, "coherence": [float(x) for x in c_hat]}
    window = run.weighting_state["window"]
    window.append((u.tolist(), v.tolist()))
    window[:] = window[-20:]  # the latest 20 completed fit batches (app:online-analysis)
    if (k + 1) % args.refit_every == 0:
        uu = np.mean([w[0] for w in window], axis=0)
        vv = np.mean([w[1] for w in window], axis=0)
        c = np.clip(coherence_from_moments(uu, vv), 0.0, 1.0)
        run.profile = refit_profile(c, args.refit_eta)
        window.clear()  # the window resets after each refresh
        return {"fit_reward": fit_reward, "coherence": [float(x) for x in c]}
    return {"fit_reward": fit_reward}


def train_step(run: Run) -> Dict[str, Any]:
    """One outer update of Algorithm 1 (alg:cifar). Returns the update's metrics."""
    args, net, device, k = run.args, run.net, run.device, run.k
    t0 = time.perf_counter()
    # 2: theta_old <- sg(theta): a frozen evaluation-mode copy. With --reuse-old-losses the copy is
    # never needed: nothing changes theta between here and the old losses, so theta_old = theta.
    reuse = bool(args.reuse_old_losses)
    if not reuse:
        run.old_net.load_state_dict(net.state_dict())
    # 3: weighting at update k
    refresh_weighting(run, k)
    plan = estimator_plan(run.profile, args.estimator, bank_losses=run.bank_losses, q_ref=run.q_ref, g=args.g)
    # 4: rollouts from the old policy, rewards, group advantages (all detached)
    gen = make_generator(args.seed, "rollout", k)
    latents = to_device(torch.randn((args.batch_size, 3, 32, 32), generator=gen), device)
    if reuse:
        x = run.sampler(latents)
    else:
        x = sample_images(run.old_net, latents, args.sample_steps, run.convention, run.autocast)
    with torch.no_grad():
        rewards = run.reward_fn(x).float()
    adv = group_advantages(rewards, args.group_size, args.adv_eps)
    # 5: M paired (t, eps) draws per sample and the old losses
    dgen = make_generator(args.seed, "draws", k)
    t, eps = draw_times_and_noise(plan, args.batch_size, args.mc_draws, dgen, (3, 32, 32), device)
    mult = draw_multipliers(plan, t).float()  # a_k, or a_k w(t) for the explicit estimator
    if not reuse:
        with torch.no_grad():
            l_old = velocity_losses(run.old_net, x, t, eps, run.convention, run.autocast)
    # 6-7: current losses on the same endpoints, times and noises; D_i, r_i, clipped objective
    l_new = velocity_losses(run.fwd, x, t, eps, run.convention, run.autocast)
    if reuse:
        l_old = l_new.detach()
    loss, ratio = fpo_loss(l_old, l_new, adv, mult, args.clip_ratio, args.log_ratio_clip)
    # 8: backward and the gradient-norm clip are queued before any value is read back, so the GPU
    # never waits for the host; a non-finite loss or gradient skips the Adam step below.
    run.optimizer.zero_grad(set_to_none=True)
    loss.backward()
    grad_norm = torch.nn.utils.clip_grad_norm_(net.parameters(), args.max_grad_norm)
    r = ratio.detach()
    values = torch.stack([rewards.mean(), rewards.std(), loss.detach(), r.mean(), (r - 1).abs().max(),
                          ((r - 1).abs() > args.clip_ratio).float().mean(), l_new.detach().mean(),
                          torch.isfinite(rewards).all().float(), grad_norm.float()]).tolist()  # one host sync
    metrics = {
        "update": k,
        "train_reward_mean": values[0],
        "train_reward_std": values[1],
        "loss": values[2],
        "ratio_mean": values[3],
        "ratio_max_dev": values[4],
        "clip_frac": values[5],
        "velocity_loss": values[6],
        "alpha": current_alpha(args, k),
        "a_k": float(plan.scale),
        "q": [round(float(v), 6) for v in plan.q],
        "grad_norm": values[8],
    }
    if not (math.isfinite(values[2]) and values[7] == 1.0):
        metrics["grad_norm"] = float("nan")
        return metrics
    if not math.isfinite(values[8]):
        return metrics
    # one gradient-clipped Adam step
    run.optimizer.step()
    metrics.update(after_update_weighting(run, k))
    metrics["time_s"] = time.perf_counter() - t0
    return metrics


@torch.no_grad()
def validate(run: Run, chunk: Optional[int] = None) -> Tuple[float, torch.Tensor]:
    """Mean reward of the current model over the fixed validation latent banks (app:cifar).
    Images are generated `chunk` at a time (default 128; all banks at once with --compile)."""
    chunk = chunk or (run.val_latents.shape[0] if run.args.compile else 128)
    images, rewards = [], []
    for s in range(0, run.val_latents.shape[0], chunk):
        x = run.sampler(run.val_latents[s:s + chunk])
        rewards.append(run.reward_fn(x).float().cpu())
        if not images:
            images.append(x[:64].cpu())
    return float(torch.cat(rewards).mean()), images[0]


def should_stop(history: List[Dict[str, float]], args: Args) -> Optional[str]:
    """The validation stopping rule documented on `Args.early_stop`; returns a reason or None."""
    if not args.early_stop or not history or history[-1]["update"] < args.min_updates_before_stop:
        return None
    vals = [h["val_reward"] for h in history]
    initial, peak = vals[0], max(vals)
    best_idx = max(range(len(vals)), key=lambda i: (vals[i], -i))
    # degradation: below peak - frac*(peak - initial) for `degrade_nodes` consecutive nodes
    gain = peak - initial
    if gain > 0 and len(vals) >= args.stop_degrade_nodes:
        threshold = peak - args.stop_degrade_frac * gain
        if all(v < threshold for v in vals[-args.stop_degrade_nodes:]):
            return "degradation"
    # plateau: no improvement larger than min_delta over the last `patience` nodes
    if len(vals) - 1 - best_idx >= args.stop_patience:
        earlier_best = max(vals[: best_idx + 1])
        recent = vals[best_idx + 1:]
        if max(recent) <= earlier_best + args.stop_min_delta:
            return "plateau"
    return None


def atomic_save(obj, path: Path):
    """torch.save to a temporary file and rename it over `path` (never a half-written checkpoint)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)


def atomic_write_text(text: str, path: Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def save_checkpoint(run: Run, path: Path):
    """Model, optimiser, weighting state, validation history, calibration bank, RNG states, step."""
    atomic_save({
        "k": run.k,
        "model": run.net.state_dict(),
        "optimizer": run.optimizer.state_dict(),
        "profile": np.asarray(run.profile).tolist(),
        "weighting_state": run.weighting_state,
        "history": run.history,
        "bank_losses": run.bank_losses,
        "status": run.status,
        "rng": {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate(),
                "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None},
    }, path)


def restore_checkpoint(run: Run, ckpt: Dict[str, Any]):
    run.net.load_state_dict(ckpt["model"])
    run.optimizer.load_state_dict(ckpt["optimizer"])
    run.profile = np.asarray(ckpt["profile"], dtype=np.float64)
    run.weighting_state = ckpt["weighting_state"]
    run.history = list(ckpt["history"])
    run.k = int(ckpt["k"])
    torch.set_rng_state(ckpt["rng"]["torch"])
    np.random.set_state(ckpt["rng"]["numpy"])
    random.setstate(ckpt["rng"]["python"])
    if ckpt["rng"].get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(ckpt["rng"]["cuda"])


def save_grid(images: torch.Tensor, path: Path, nrow: int = 8):
    """Save images in [-1,1] (N,3,H,W) as one PNG grid."""
    from PIL import Image

    x = ((images.clamp(-1, 1) + 1) * 127.5).round().byte().permute(0, 2, 3, 1).numpy()
    n, h, w, _ = x.shape
    rows = (n + nrow - 1) // nrow
    grid = np.full((rows * (h + 2) + 2, nrow * (w + 2) + 2, 3), 255, dtype=np.uint8)
    for i in range(n):
        r, c = divmod(i, nrow)
        grid[2 + r * (h + 2): 2 + r * (h + 2) + h, 2 + c * (w + 2): 2 + c * (w + 2) + w] = x[i]
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(grid).save(path)


class MetricsLog:
    """Append-only JSON-lines log. On resume, records after the checkpoint are dropped so the file
    ends exactly where the restored state begins (the re-run writes them again)."""

    def __init__(self, path: Path, resume_at: Optional[int] = None, validated: Sequence[int] = ()):
        self.path = path
        if resume_at is not None and path.exists():
            kept = []
            for line in path.read_text().splitlines():
                if not line.strip():
                    continue
                rec = json.loads(line)
                kind, k = rec.get("kind"), rec.get("update", -1)
                if kind == "calibration" or (kind == "update" and k < resume_at) or (kind == "validation" and k in validated):
                    kept.append(line)
            atomic_write_text("".join(line + "\n" for line in kept), path)

    def write(self, record: Dict[str, Any]):
        with open(self.path, "a") as f:
            f.write(json.dumps(record) + "\n")


def write_summary(run: Run):
    """summary.json: the per-run peak (eq:peak), its update, status and stop reason."""
    hist = run.history
    peak = max(hist, key=lambda h: h["val_reward"]) if hist else None
    summary = {
        "run_name": run.args.run_name,
        "status": run.status,
        "stop_reason": run.stop_reason,
        "updates_done": run.k,
        "peak_val_reward": peak["val_reward"] if peak else None,
        "peak_update": peak["update"] if peak else None,
        "initial_val_reward": hist[0]["val_reward"] if hist else None,
        "final_val_reward": hist[-1]["val_reward"] if hist else None,
        "c_x0": run.c_x0,
        "validation": hist,
    }
    atomic_write_text(json.dumps(summary, indent=2), run.folder / "summary.json")
    return summary


def train(run: Run, until: Optional[int] = None) -> Dict[str, Any]:
    """Run updates k = run.k .. min(until, num_updates) - 1 with validation, stopping and checkpoints.

    Validation node k measures the model after k updates (k = 0 is the initial model). `until` lets a
    caller (e.g. halving.py) stop at a rung and continue later from the same Run or its checkpoint.
    """
    args, folder = run.args, run.folder
    end = args.num_updates if until is None else min(until, args.num_updates)
    log = MetricsLog(folder / "metrics.jsonl", resume_at=run.k if args.resume else None,
                    validated=[h["update"] for h in run.history])
    ckpt_path = folder / "checkpoints" / "last.pt"
    while True:
        k = run.k
        if k % args.val_every == 0 and not any(h["update"] == k for h in run.history):
            val, images = validate(run)
            run.history.append({"update": k, "val_reward": val})
            log.write({"kind": "validation", "update": k, "val_reward": val})
            if args.save_samples:
                save_grid(images, folder / "samples" / f"update_{k:05d}.png")
            if args.verbose:
                print(f"[validation] update {k:4d}  val_reward {val:.4f}  peak {max(h['val_reward'] for h in run.history):.4f}", flush=True)
            if not math.isfinite(val):
                run.status, run.stop_reason = "nonfinite", "non-finite validation reward"
                break
            reason = should_stop(run.history, args)
            if reason is not None:
                run.status, run.stop_reason = "stopped", reason
                save_checkpoint(run, ckpt_path)
                break
        if k % args.checkpoint_every == 0:
            save_checkpoint(run, ckpt_path)
        if k >= end:
            if k >= args.num_updates:
                run.status, run.stop_reason = "finished", "max updates"
            else:
                run.status, run.stop_reason = "paused", f"paused at update {k}"
            break
        metrics = train_step(run)
        finite = all(math.isfinite(metrics[key]) for key in ("loss", "train_reward_mean", "grad_norm"))
        log.write({"kind": "update", **metrics, "unix_time": time.time()})
        if not finite:
            # the paper records such runs as events: keep the last good checkpoint, do not save this state
            run.status, run.stop_reason = "nonfinite", f"non-finite loss/reward/gradient at update {k}"
            if args.verbose:
                print(f"[stop] {run.stop_reason}", flush=True)
            break
        run.k = k + 1
        if args.verbose:
            print(f"update {k:4d}  reward {metrics['train_reward_mean']:.4f}  loss {metrics['loss']:+.5f}  "
                  f"|r-1|max {metrics['ratio_max_dev']:.4f}  clip {metrics['clip_frac']:.2f}  "
                  f"gnorm {metrics['grad_norm']:.3f}  a_k {metrics['a_k']:.3f}  {metrics['time_s']:.2f}s", flush=True)
    if run.status != "nonfinite":
        save_checkpoint(run, ckpt_path)
    return write_summary(run)


def main(args: Args) -> Dict[str, Any]:
    args = resolve_args(args)
    folder = Path(args.runs_dir) / args.run_name
    if folder.exists() and (folder / "checkpoints" / "last.pt").exists() and not args.resume:
        raise ValueError(f"run folder {folder} already has a checkpoint; pass --resume or another --run-name")
    folder.mkdir(parents=True, exist_ok=True)
    run = setup(args, folder)
    atomic_write_text(json.dumps(asdict(run.args), indent=2), folder / "args.json")
    print(f"run {folder}  device {run.device}  model {args.model}  reward {args.reward}  "
          f"weighting {args.weighting}  C_x0 = S(q_x0) = {run.c_x0:.8f}", flush=True)
    with open(folder / "metrics.jsonl", "a") as f:
        if not args.resume:
            f.write(json.dumps({"kind": "calibration", "update": -1, "c_x0": run.c_x0,
                                "bank_size": int(run.bank_losses.shape[0])}) + "\n")
    summary = train(run, until=args.until)
    print(f"done: status {summary['status']} ({summary['stop_reason']}), peak {summary['peak_val_reward']} "
          f"at update {summary['peak_update']}", flush=True)
    return summary


if __name__ == "__main__":
    try:
        main(tyro.cli(Args))
    except ValueError as err:  # bad input: one line naming the value and what is allowed
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
