"""The flow actor's fused Triton kernels (fpo_utils/flow_triton.py) against the eager actor: on the CPU
through Triton's interpreter (a subprocess with TRITON_INTERPRET=1), on a GPU directly."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import robot_fpo as R
from fpo_utils.samplers import NumpySampler, fused_forward, fused_supported, pick_sampler

ROOT = Path(__file__).resolve().parents[1]
try:
    import triton  # noqa: F401

    HAS_TRITON = True
except ImportError:
    HAS_TRITON = False

# (obs, act, hidden, layers, embed, draws M, observations n): M = 1 (one observation per row), M that
# divides the block (the observation term once per observation), M = 3 (expanded to one per row).
CASES = [
    (6, 1, 32, 4, 8, 8, 24),
    (24, 6, 32, 4, 8, 8, 16),
    (17, 3, 16, 2, 8, 16, 9),
    (5, 2, 32, 3, 4, 3, 10),
    (5, 2, 64, 2, 8, 1, 70),
]

CHECK = r"""
import sys, torch
import robot_fpo as R
from fpo_utils import flow_triton as FT

dev, tol = sys.argv[1], float(sys.argv[2])
torch.backends.cuda.matmul.allow_tf32 = False
torch.manual_seed(0)
for o, d, h, layers, e, m, n in CASES:
    actor = R.FlowActor(o, d, h, layers, e, 0.25, 1.0).double().to(dev)
    obs = torch.randn(*((n, 1, o) if m > 1 else (n, o)), dtype=torch.float64, device=dev)
    shape = (n, m) if m > 1 else (n,)
    x, t = torch.randn(*shape, d, dtype=torch.float64, device=dev), torch.rand(*shape, dtype=torch.float64, device=dev)
    g = torch.randn_like(x)
    ref = actor(obs, x, t)
    (ref * g).sum().backward()
    grads = {k: p.grad.clone() for k, p in actor.named_parameters()}
    actor.zero_grad()
    actor.float()
    out = FT.actor_forward(actor, obs.float(), x.float(), t.float())
    assert out.shape == ref.shape and out.dtype == torch.float32, (out.shape, out.dtype)
    (out * g.float()).sum().backward()
    err = float((out.double() - ref).norm() / ref.norm())
    assert err < tol, ("forward", o, d, h, layers, m, err)
    for k, p in actor.named_parameters():
        gerr = float((p.grad.double() - grads[k]).norm() / grads[k].norm())
        assert gerr < tol, ("gradient", k, o, d, h, layers, m, gerr)
    o2, x0 = torch.randn(n, o, device=dev), torch.randn(n, d, device=dev)
    ref_s = actor.double().sample(o2.double(), x0.double(), 10)
    got = FT.FusedSampler(actor.float())(o2, x0, 10)
    serr = float((got.double() - ref_s).norm() / ref_s.norm())
    assert serr < tol, ("sampler", o, d, h, layers, serr)
print("checked", len(CASES))
"""


def run_check(device: str, tol: float, interpret: bool) -> str:
    env = dict(os.environ, PYTHONPATH=str(ROOT), TRITON_INTERPRET="1" if interpret else "0")
    code = f"CASES = {CASES!r}\n" + CHECK
    out = subprocess.run(
        [sys.executable, "-c", code, device, str(tol)], env=env, cwd=ROOT, capture_output=True, text=True, timeout=900
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


@pytest.mark.skipif(not HAS_TRITON, reason="needs Triton (its interpreter runs the kernels on the CPU)")
def test_fused_kernels_match_the_eager_actor_in_the_triton_interpreter():
    assert f"checked {len(CASES)}" in run_check("cpu", 1e-5, interpret=True)


@pytest.mark.skipif(not (HAS_TRITON and torch.cuda.is_available()), reason="needs a CUDA GPU and Triton")
def test_fused_kernels_match_the_eager_actor_on_gpu():
    assert f"checked {len(CASES)}" in run_check("cuda", 1e-5, interpret=False)


def test_fast_paths_are_chosen_once_by_shape_and_flag():
    fpo = R.PRESETS["fpo"]
    actor = R.FlowActor(6, 1, fpo.actor_hidden, fpo.actor_layers, fpo.time_embed_dim, 0.25)
    assert fused_supported(actor) == HAS_TRITON
    assert not fused_supported(R.FlowActor(6, 1, 24, 4, 8, 0.25))  # width not a power of two
    assert not fused_supported(R.FlowActor(6, 1, 32, 1, 8, 0.25))  # no hidden-to-hidden layer
    assert not fused_supported(R.FlowActor(6, 1, 64, 3, 8, 0.25))  # wider than the kernels are used for
    assert fused_forward(actor, False) is None
    assert isinstance(pick_sampler(actor, torch.device("cpu"), True, True, True), NumpySampler)
    if HAS_TRITON:
        from fpo_utils.flow_triton import actor_forward

        assert fused_forward(actor, True) is actor_forward
