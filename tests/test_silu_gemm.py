"""The bf16 MLP with SiLU folded into its products (fpo_utils/silu_gemm.py): against the same rounding done in
float64 by torch, and against the eager float32 actor; on the CPU through Triton's interpreter (a subprocess
with TRITON_INTERPRET=1), on a GPU directly."""

from __future__ import annotations

import pytest
import torch
from triton_check import HAS_TRITON, run_check

import robot_fpo as R

# (obs, act, hidden, layers, embed, draws, observations): rows that do not fill a tile, an output narrower
# than 16, hidden widths of 16 to 256, one hidden-to-hidden layer or none.
CASES = [(10, 3, 32, 3, 4, 4, 50), (61, 12, 256, 3, 8, 8, 40), (7, 2, 16, 1, 4, 1, 33), (20, 12, 64, 2, 8, 8, 70)]

CHECK = r"""
import sys, torch
import robot_fpo as R
from fpo_utils import silu_gemm as S

dev, tol = sys.argv[1], float(sys.argv[2])
r = lambda v: v.to(torch.bfloat16).double()
silu = lambda z: z * torch.sigmoid(z)

def emulate(x, ws, bs, gy):  # the kernels' roundings in float64: bf16 operands, bf16 pre-activations
    reads, L = [x.double()], len(ws)
    for i, (w, b) in enumerate(zip(ws, bs)):
        z = r(reads[-1] if i == 0 else silu(reads[-1])) @ r(w).T + b.double()
        reads.append(z if i == L - 1 else r(z))
    y, g, dws, dbs = reads.pop(), gy.double(), [None] * L, [None] * L
    for i in range(L - 1, -1, -1):
        dws[i], dbs[i] = r(g).T @ r(reads[i] if i == 0 else silu(reads[i])), g.sum(0)
        if i > 0:
            s = torch.sigmoid(reads[i])
            g = r((r(g) @ r(ws[i])) * s * (1 + reads[i] * (1 - s)))
    return y, dws, dbs

rel = lambda a, b: float((a.double() - b.double()).norm() / b.double().norm())
torch.manual_seed(0)
for o, d, h, layers, e, m, n in CASES:
    actor = R.FlowActor(o, d, h, layers, e, 0.25).to(dev)
    assert S.why_not(actor) == ""
    lin = actor.net[::2]
    x, gy = torch.randn(n * m, o + d + e, device=dev), torch.randn(n * m, d, device=dev)
    y = S.silu_mlp_op(x, [q.weight for q in lin], [q.bias for q in lin])[0]
    (y * gy).sum().backward()
    ey, edw, edb = emulate(x, [q.weight.detach() for q in lin], [q.bias.detach() for q in lin], gy)
    assert y.dtype == torch.float32 and rel(y, ey) < tol, ("forward", o, d, h, layers, rel(y, ey))
    for i, q in enumerate(lin):
        assert rel(q.weight.grad, edw[i]) < tol, ("weight gradient", i, h, rel(q.weight.grad, edw[i]))
        assert rel(q.bias.grad, edb[i]) < tol, ("bias gradient", i, h, rel(q.bias.grad, edb[i]))
    actor.zero_grad()
    obs = torch.randn(*((n, 1, o) if m > 1 else (n, o)), device=dev)
    shape = (n, m) if m > 1 else (n,)
    xt, t = torch.randn(*shape, d, device=dev), torch.rand(*shape, device=dev)
    g = torch.randn_like(xt)
    ref = R.FlowActor.forward(actor, obs, xt, t)
    (ref * g).sum().backward()
    grads = {k: p.grad.clone() for k, p in actor.named_parameters()}
    actor.zero_grad()
    out = S.actor_forward(actor, obs, xt, t)
    (out * g).sum().backward()
    assert out.shape == ref.shape and rel(out, ref) < 0.05, ("actor", o, d, h, layers, rel(out, ref))
    for k, p in actor.named_parameters():
        assert rel(p.grad, grads[k]) < 0.08, ("actor gradient", k, h, rel(p.grad, grads[k]))
actor = R.FlowActor(10, 3, 32, 2, 4, 0.25).to(dev)  # compiled, the op is one node with its own backward
obs, xt, t = torch.randn(9, 1, 10, device=dev), torch.randn(9, 4, 3, device=dev), torch.rand(9, 4, device=dev)
loss = lambda: S.actor_forward(actor, obs, xt, t).square().sum()
loss().backward()
eager = [p.grad.clone() for p in actor.parameters()]
actor.zero_grad()
torch.compile(loss)().backward()
assert all(torch.equal(p.grad, g) for p, g in zip(actor.parameters(), eager)), "compiled gradients differ"
print("checked", len(CASES))
"""


@pytest.mark.skipif(not HAS_TRITON, reason="needs Triton (its interpreter runs the kernels on the CPU)")
def test_silu_kernels_match_their_rounding_and_the_actor_in_the_triton_interpreter():
    assert f"checked {len(CASES)}" in run_check(f"CASES = {CASES!r}\n" + CHECK, "cpu", 4e-4, interpret=True)


@pytest.mark.skipif(not (HAS_TRITON and torch.cuda.is_available()), reason="needs a CUDA GPU and Triton")
def test_silu_kernels_match_their_rounding_and_the_actor_on_gpu():
    assert f"checked {len(CASES)}" in run_check(f"CASES = {CASES!r}\n" + CHECK, "cuda", 4e-4, interpret=False)


@pytest.mark.skipif(not HAS_TRITON, reason="the module imports Triton")
def test_silu_kernels_refuse_other_actors_in_one_line():
    from fpo_utils.silu_gemm import why_not

    tanh = R.FlowActor(6, 2, 32, 2, 4, 0.25)
    tanh.net[1] = torch.nn.Tanh()
    assert why_not(tanh) == "the bf16 SiLU kernels cannot mirror actor.net[1] (Tanh); it mirrors Linear, SiLU layers"
    nobias = R.FlowActor(6, 2, 32, 2, 4, 0.25)
    nobias.net[2] = torch.nn.Linear(32, 32, bias=False)
    assert why_not(nobias) == "the bf16 SiLU kernels take Linear layers with biases"
    assert why_not(R.FlowActor(6, 2, 32, 2, 4, 0.25)) == ""


@pytest.mark.skipif(not HAS_TRITON, reason="the module imports Triton")
def test_silu_kernels_refuse_inputs_that_need_a_gradient():
    from fpo_utils.runfolder import RunError
    from fpo_utils.silu_gemm import actor_forward

    actor, x_t = R.FlowActor(6, 2, 32, 2, 4, 0.25), torch.randn(3, 2, requires_grad=True)
    with pytest.raises(RunError, match="^the bf16 SiLU kernels give gradients for the weights only"):
        actor_forward(actor, torch.randn(3, 6), x_t, torch.rand(3))
