"""Devices and numeric precision of the image trainer and its tools."""

from __future__ import annotations

import contextlib

import torch

PRECISIONS = ("fp32", "tf32", "bf16")


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"--device {name!r} requested but CUDA is not available; use cpu or auto")
    if name != "cpu" and not name.startswith("cuda"):
        raise ValueError(f"--device {name!r} is not one of auto, cpu, cuda, cuda:N")
    return torch.device(name)


def to_device(x: torch.Tensor, device) -> torch.Tensor:
    """Copy a CPU tensor to `device`; to CUDA through pinned memory without blocking the host."""
    device = torch.device(device)
    if device.type == "cuda":
        return x.pin_memory().to(device, non_blocking=True)
    return x.to(device)


def set_precision(precision: str):
    """Matmul precision for the network; returns the autocast dtype (or None). `fp32` is strict FP32
    (app:cifar), `tf32` TF32 matmuls and convolutions, `bf16` bf16 autocast for the network only."""
    if precision not in PRECISIONS:
        raise ValueError(f"--precision {precision!r} is not one of {', '.join(PRECISIONS)}")
    tf32 = precision in ("tf32", "bf16")
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    torch.set_float32_matmul_precision("high" if tf32 else "highest")
    return torch.bfloat16 if precision == "bf16" else None


def autocast_ctx(dtype, device):
    """bf16 autocast on the network when `dtype` is set (see `set_precision`), otherwise a no-op context."""
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=torch.device(device).type, dtype=dtype)
