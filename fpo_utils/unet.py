"""The generator: a compact U-Net whose parameter names and arithmetic match diffusers'
``UNet2DModel`` for the block types of CIFAR-10 checkpoints, so a diffusers folder (``config.json`` +
``diffusion_pytorch_model.safetensors``) loads with ``strict=True`` without diffusers installed; its
velocity convention (`velocity`); loading, saving and locating checkpoints. The Euler sampler and the
flow-matching loss that use it are Algorithm 1's own, in cifar_fpo.py.
"""

from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

# The stand-in CIFAR-10 generator shipped in weights/ (scripts/pretrain_cfm.py made it).
DEFAULT_MODEL = str(Path(__file__).resolve().parents[1] / "weights" / "cfm-cifar10-small")


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
        k
        for k in config
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
    freqs = torch.exp(
        -math.log(10000.0) * torch.arange(half, dtype=torch.float32, device=t.device) / (half - freq_shift)
    )
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

    def __init__(
        self, c_in: int, c_out: int, c_emb: int, groups: int, eps: float, dropout: float, output_scale: float = 1.0
    ):
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
        q, k, v = (
            proj(h).view(n, hgt * wid, self.heads, -1).transpose(1, 2) for proj in (self.to_q, self.to_k, self.to_v)
        )
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
        self.attentions = (
            nn.ModuleList(SelfAttention(c_out, head_dim, groups, eps) for _ in range(layers)) if attn else None
        )
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
        self.attentions = (
            nn.ModuleList(SelfAttention(c_out, head_dim, groups, eps) for _ in range(layers)) if attn else None
        )
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
                DownBlock(
                    c_in,
                    c_out,
                    c_emb,
                    layers,
                    kind == "AttnDownBlock2D",
                    hd or c_out,
                    groups,
                    eps,
                    drop,
                    i < len(ch) - 1,
                    pad,
                )
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
                UpBlock(
                    c_in,
                    c_prev,
                    c_out,
                    c_emb,
                    layers + 1,
                    kind == "AttnUpBlock2D",
                    hd or c_out,
                    groups,
                    eps,
                    drop,
                    i < len(ch) - 1,
                )
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


def model_folder(path: str | os.PathLike) -> Path:
    """The folder holding config.json: ``path`` itself or its ``unet/`` subfolder (pipelines)."""
    path = Path(path)
    for folder in (path, path / "unet"):
        if (folder / "config.json").is_file():
            return folder
    raise _bad_file(
        f"no config.json in {str(path)!r} or {str(path / 'unet')!r}; expected a diffusers UNet2DModel folder"
    )


def _rename_legacy_attention(state: dict) -> dict:
    """Map the pre-0.14 diffusers attention names (query/key/value/proj_attn) to the current ones."""
    names = {"query": "to_q", "key": "to_k", "value": "to_v", "proj_attn": "to_out.0"}
    pattern = re.compile(r"^(.*attentions\.\d+)\.(query|key|value|proj_attn)\.(weight|bias)$")
    out = {}
    for k, v in state.items():
        m = pattern.match(k)
        out[f"{m[1]}.{names[m[2]]}.{m[3]}" if m else k] = v
    return out


def load_unet(
    path: str | os.PathLike, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32
) -> UNet2D:
    """Load a diffusers ``UNet2DModel`` folder (``config.json`` + ``diffusion_pytorch_model``
    ``.safetensors`` or ``.bin``; a pipeline folder's ``unet/`` also works) into `UNet2D`, strictly.
    The network is returned in eval mode on ``device`` in ``dtype``."""
    folder = model_folder(path)
    try:
        config = json.loads((folder / "config.json").read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise _bad_file(f"{folder / 'config.json'} is not a readable JSON file ({type(err).__name__})") from None
    net = UNet2D.from_config(config)
    files = [folder / n for n in WEIGHTS_NAMES if (folder / n).is_file()]
    if not files:
        raise _bad_file(_no_weights_message(folder))
    try:
        if files[0].suffix == ".safetensors":
            from safetensors.torch import load_file

            state = load_file(str(files[0]))
        else:
            state = torch.load(files[0], map_location="cpu", weights_only=True)
    except Exception as err:  # truncated or corrupt file: safetensors, pickle and zip raise different types
        raise _bad_file(
            f"{files[0]} is truncated or corrupt ({type(err).__name__}); download or save it again"
        ) from None
    try:
        net.load_state_dict(_rename_legacy_attention(state), strict=True)
    except RuntimeError as err:
        first = str(err).strip().splitlines()
        raise _bad_file(
            f"{files[0]} does not match its config.json: {first[1].strip() if len(first) > 1 else first[0]}"
        ) from None
    return net.to(device=device, dtype=dtype).eval()


def _no_weights_message(folder: Path) -> str:
    """Why a folder with a config.json cannot load; for a ``weights/<name>`` folder (whose weights file this
    repository keeps on its results-data branch) also the command that fetches it."""
    message = f"no weights in {str(folder)!r}; expected one of {list(WEIGHTS_NAMES)}"
    model = folder.parent if folder.name == "unet" else folder
    if model.parent.name == "weights":
        message += f"; fetch them with: python benchmarks/results_data.py fetch weights/{model.name}"
    return message


def _bad_file(message: str) -> Exception:
    """A missing or corrupt model file: RunError with the bad-file exit code (one line on the CLI)."""
    from fpo_utils.runfolder import EXIT_BAD_FILE, RunError

    return RunError(message, code=EXIT_BAD_FILE)


def save_unet(net: UNet2D, folder: str | os.PathLike, dtype: torch.dtype = torch.float16, **extra_config) -> Path:
    """Write ``net`` as a diffusers folder: ``config.json`` (with ``fpo_convention`` and any
    ``extra_config`` entries, which override the network's own config) and
    ``diffusion_pytorch_model.safetensors`` in ``dtype``. Each file is written to a temporary name,
    flushed and renamed (`fpo_utils.runfolder.atomic_write`), so a crash leaves the old file or the new one."""
    from safetensors.torch import save_file

    from fpo_utils.runfolder import atomic_write, atomic_write_text

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    config = {"_class_name": "UNet2DModel", **net.config, CONVENTION_KEY: net.convention, **extra_config}
    check_unet_config(config)
    state = {k: v.detach().to("cpu", dtype).contiguous() for k, v in net.state_dict().items()}
    atomic_write(folder / WEIGHTS_NAMES[0], lambda tmp: save_file(state, str(tmp), metadata={"format": "pt"}))
    atomic_write_text(folder / "config.json", json.dumps(config, indent=2) + "\n")
    return folder


def resolve_model(model: str) -> str:
    """Local folder for ``model``: an existing folder as is; else a Hugging Face repo id
    ``owner/name``, looked up as ``./weights/<name>`` (next to this file or in the working
    directory) and otherwise through ``huggingface_hub.snapshot_download``, which reads its local cache
    (also with ``HF_HUB_OFFLINE=1``), honours proxy settings, and downloads what the cache lacks."""
    if Path(model).expanduser().is_dir():
        return str(Path(model).expanduser())
    if not re.fullmatch(r"[\w.-]+/[\w.-]+", model) or model.startswith((".", "/", "~")):
        raise ValueError(
            f"model folder {model!r} does not exist (give a diffusers folder or a Hugging Face repo id owner/name)"
        )
    name = model.split("/")[1]
    for root in (Path(__file__).resolve().parents[1], Path.cwd()):
        folder = root / "weights" / name
        if (folder / "config.json").is_file() or (folder / "unet" / "config.json").is_file():
            return str(folder)
    hint = f"download {model} into ./weights/{name} (config.json + diffusion_pytorch_model.safetensors)"
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        raise ValueError(
            f"{model!r} needs huggingface_hub (pip install huggingface_hub) or a local copy; {hint}"
        ) from None
    files = ["config.json", "diffusion_pytorch_model.safetensors"]
    patterns = files + [f"unet/{f}" for f in files]
    try:
        return snapshot_download(repo_id=model, allow_patterns=patterns)
    except Exception as err:  # offline with no cached copy, no such repo, no network, a proxy refusing, ...
        raise ValueError(
            f"{model!r} is neither a local folder nor in the Hugging Face cache, and the hub did not serve it"
            f" ({type(err).__name__}); {hint}"
        ) from None
