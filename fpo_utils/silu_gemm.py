"""The flow actor's MLP in bfloat16 with SiLU folded into its matrix products (a candidate; imports Triton).

With ``--bf16`` and compiled losses, a Spot minibatch step (``fpopp-locomotion``: 786,432 draw rows through a
3 x 256 SiLU MLP) spends about 43% of its GPU time in elementwise kernels: SiLU and its backward each read and
write a (rows x 256) activation. Here the products do that work as they load or store their tiles:

* forward, layer l: ``z_l = silu(z_{l-1}) @ W_l^T + b_l`` (SiLU applied to the tile as it is loaded; layer 1
  reads the input rows, the last layer returns float32); only the pre-activations ``z`` are stored, in bf16;
* backward: ``dz_{l-1} = (dz_l @ W_l) * silu'(z_{l-1})`` (the derivative applied to the tile before it is
  stored) and ``dW_l = dz_l^T @ silu(z_{l-1})``, ``db_l = sum(dz_l)`` summed over row ranges in float32.

What it computes is autocast's bf16 actor (``robot_fpo_fast.bf16_forward``): bf16 operands, float32
accumulation, bf16 activations; the gradients are accumulated in float32 and not rounded to bf16 on the way.
``tests/test_silu_gemm.py`` compares both with the eager float32 actor (on the CPU through Triton's
interpreter, ``TRITON_INTERPRET=1``).
"""

from __future__ import annotations

import os

import torch
import torch.nn as nn
import triton
import triton.language as tl

from fpo_utils.mlp_layers import mlp_layers
from fpo_utils.runfolder import RunError

BM = 64  # rows of a tile
SPLIT_ROWS = 8192  # rows whose weight-gradient share one program sums (a multiple of BM)
F32 = os.environ.get("TRITON_INTERPRET") == "1"  # the CPU interpreter multiplies bf16 bits as integers


def why_not(actor: nn.Module) -> str:
    """Why these kernels cannot compute ``actor`` (one line), or "": Linear layers with biases alternating with
    SiLU, ending in a Linear."""
    try:
        layers = mlp_layers(actor, "the bf16 SiLU kernels", ("silu",))
    except RunError as err:
        return str(err)
    if len(layers) % 2 == 0 or any(isinstance(m, nn.Linear) != (i % 2 == 0) for i, m in enumerate(layers)):
        return "the bf16 SiLU kernels take Linear layers alternating with SiLU, ending in a Linear"
    if any(m.bias is None for m in layers[::2]):
        return "the bf16 SiLU kernels take Linear layers with biases"
    return ""


def _tile(n: int, most: int) -> int:
    """A power of two of at least 16 and at most ``most`` covering ``n`` where it can."""
    return min(most, max(16, 1 << (n - 1).bit_length()))


@triton.jit
def _silu(x):
    return x * tl.sigmoid(x)


@triton.jit
def _silu_grad(z):
    s = tl.sigmoid(z)
    return s * (1.0 + z * (1.0 - s))


@triton.jit
def _bf16(x, F32: tl.constexpr):
    """float32 -> bf16, rounded to nearest even (with F32, by hand: the interpreter truncates)."""
    if F32:
        bits = x.to(tl.uint32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        r = bits.to(tl.float32, bitcast=True).to(tl.bfloat16)
    else:
        r = x.to(tl.bfloat16, fp_downcast_rounding="rtne")
    return r


@triton.jit
def _dot(a, b, F32: tl.constexpr):
    """a @ b (b in bf16) of a rounded to bf16, summed in float32 (with F32, as float32 products of those values)."""
    a = _bf16(a.to(tl.float32), F32)
    if F32:
        r = tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    else:
        r = tl.dot(a, b)
    return r


@triton.jit
def _forward(a, w, b, c, M, N, K, ACT: tl.constexpr, LAST: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
             BK: tl.constexpr, F32: tl.constexpr):  # fmt: skip
    """c (M, N) = act(a) (M, K) @ w (N, K)^T + b (N,): bf16 operands, float32 sums."""
    rm = tl.program_id(0) * BM + tl.arange(0, BM)
    rn = tl.program_id(1) * BN + tl.arange(0, BN)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(0, K, BK):
        rk = k0 + tl.arange(0, BK)
        x = tl.load(a + rm[:, None] * K + rk[None, :], mask=(rm[:, None] < M) & (rk[None, :] < K), other=0.0)
        x = x.to(tl.float32)
        if ACT:
            x = _silu(x)
        wt = tl.load(w + rn[None, :] * K + rk[:, None], mask=(rn[None, :] < N) & (rk[:, None] < K), other=0.0)
        acc += _dot(x, wt, F32)
    acc += tl.load(b + rn, mask=rn < N, other=0.0)[None, :]
    if not LAST:  # the hidden pre-activations are stored in bf16, the output in float32
        acc = _bf16(acc, F32)
    tl.store(c + rm[:, None] * N + rn[None, :], acc, mask=(rm[:, None] < M) & (rn[None, :] < N))


@triton.jit
def _input_grad(g, w, z, c, M, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, F32: tl.constexpr):
    """c (M, K) = (g (M, N) @ w (N, K)) * silu'(z (M, K)), stored in bf16."""
    rm = tl.program_id(0) * BM + tl.arange(0, BM)
    rk = tl.program_id(1) * BK + tl.arange(0, BK)
    acc = tl.zeros((BM, BK), dtype=tl.float32)
    for n0 in range(0, N, BN):
        rn = n0 + tl.arange(0, BN)
        gt = tl.load(g + rm[:, None] * N + rn[None, :], mask=(rm[:, None] < M) & (rn[None, :] < N), other=0.0)
        wt = tl.load(w + rn[:, None] * K + rk[None, :], mask=(rn[:, None] < N) & (rk[None, :] < K), other=0.0)
        acc += _dot(gt, wt, F32)
    mask = (rm[:, None] < M) & (rk[None, :] < K)
    zt = tl.load(z + rm[:, None] * K + rk[None, :], mask=mask, other=0.0).to(tl.float32)
    dz = _bf16(acc * _silu_grad(zt), F32)
    tl.store(c + rm[:, None] * K + rk[None, :], dz, mask=mask)


@triton.jit
def _weight_grad(g, z, pw, pb, M, N, K, ACT: tl.constexpr, ROWS: tl.constexpr, BM: tl.constexpr,
                 BN: tl.constexpr, BK: tl.constexpr, F32: tl.constexpr):  # fmt: skip
    """Over rows [s ROWS, (s + 1) ROWS): pw[s] (N, K) = g^T @ act(z) and, in the programs of the first column
    block, pb[s] (N,) = the column sums of g; both float32."""
    pn, pk, s = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    rn = pn * BN + tl.arange(0, BN)
    rk = pk * BK + tl.arange(0, BK)
    acc = tl.zeros((BN, BK), dtype=tl.float32)
    col = tl.zeros((BN,), dtype=tl.float32)
    for m0 in range(s * ROWS, s * ROWS + ROWS, BM):
        rm = m0 + tl.arange(0, BM)
        gt = tl.load(g + rm[:, None] * N + rn[None, :], mask=(rm[:, None] < M) & (rn[None, :] < N), other=0.0)
        zt = tl.load(z + rm[:, None] * K + rk[None, :], mask=(rm[:, None] < M) & (rk[None, :] < K), other=0.0)
        zt = zt.to(tl.float32)
        if ACT:
            zt = _silu(zt)
        gt = gt.to(tl.float32)
        acc += _dot(tl.trans(gt), _bf16(zt, F32), F32)
        col += tl.sum(gt, axis=0)
    tl.store(pw + s * N * K + rn[:, None] * K + rk[None, :], acc, mask=(rn[:, None] < N) & (rk[None, :] < K))
    tl.store(pb + s * N + rn, col, mask=(rn < N) & (pk == 0))


def _bf16_weights(ws: list[torch.Tensor]) -> list[torch.Tensor]:
    return [w.to(torch.bfloat16).contiguous() for w in ws]


@torch.library.custom_op("fpo_utils::silu_mlp", mutates_args=())
def silu_mlp_op(x: torch.Tensor, ws: list[torch.Tensor], bs: list[torch.Tensor]) -> list[torch.Tensor]:
    """[y (R, out) float32, z_1 ... z_L (R, hidden) bf16] for input rows ``x`` (R, in) and nn.Linear weights
    ``ws`` and biases ``bs`` (float32), SiLU between the layers."""
    x, outs, M = x.contiguous(), [], x.shape[0]
    for i, (w, b) in enumerate(zip(_bf16_weights(ws), bs)):
        N, K = w.shape
        last = i == len(ws) - 1
        c = torch.empty(M, N, device=x.device, dtype=torch.float32 if last else torch.bfloat16)
        BN = _tile(N, 256)
        grid = (triton.cdiv(M, BM), triton.cdiv(N, BN))
        a = x if i == 0 else outs[-1]
        _forward[grid](
            a, w, b.float().contiguous(), c, M, N, K, ACT=i > 0, LAST=last, BM=BM, BN=BN, BK=64, F32=F32, num_warps=8
        )
        outs.append(c)
    return [outs[-1], *outs[:-1]]


@silu_mlp_op.register_fake
def _(x, ws, bs):
    M = x.shape[0]
    hidden = [x.new_empty(M, w.shape[0], dtype=torch.bfloat16) for w in ws[:-1]]
    return [x.new_empty(M, ws[-1].shape[0], dtype=torch.float32), *hidden]


@torch.library.custom_op("fpo_utils::silu_mlp_backward", mutates_args=())
def silu_mlp_backward(
    gy: torch.Tensor, x: torch.Tensor, ws: list[torch.Tensor], zs: list[torch.Tensor]
) -> list[torch.Tensor]:
    """[dW_1 ... dW_L+1, db_1 ... db_L+1] (float32) of :func:`silu_mlp_op` for the output gradient ``gy``."""
    M, ws16 = x.shape[0], _bf16_weights(ws)
    reads = [x.contiguous(), *zs]  # what each layer reads (before the SiLU, after the first layer)
    g, dws, dbs = gy.contiguous(), [], []
    for i in range(len(ws) - 1, -1, -1):
        N, K = ws[i].shape
        BN, BK, S = _tile(N, 128), _tile(K, 128), triton.cdiv(M, SPLIT_ROWS)
        pw = torch.empty(S, N, K, device=x.device, dtype=torch.float32)
        pb = torch.empty(S, N, device=x.device, dtype=torch.float32)
        grid = (triton.cdiv(N, BN), triton.cdiv(K, BK), S)
        _weight_grad[grid](
            g, reads[i], pw, pb, M, N, K, ACT=i > 0, ROWS=SPLIT_ROWS, BM=BM, BN=BN, BK=BK, F32=F32, num_warps=8
        )
        dws.append(pw.sum(0))
        dbs.append(pb.sum(0))
        if i > 0:
            c = torch.empty(M, K, device=x.device, dtype=torch.bfloat16)
            BK = _tile(K, 256)
            grid = (triton.cdiv(M, BM), triton.cdiv(K, BK))
            _input_grad[grid](g, ws16[i], zs[i - 1], c, M, N, K, BM=BM, BN=_tile(N, 64), BK=BK, F32=F32, num_warps=8)
            g = c
    return [*dws[::-1], *dbs[::-1]]


@silu_mlp_backward.register_fake
def _(gy, x, ws, zs):
    return [torch.empty_like(w, dtype=torch.float32) for w in ws] + [
        w.new_empty(w.shape[0], dtype=torch.float32) for w in ws
    ]


def _setup_context(ctx, inputs, output):
    x, ws, _ = inputs
    ctx.save_for_backward(x, *ws, *output[1:])
    ctx.layers = len(ws)


def _backward(ctx, grads):
    x, *rest = ctx.saved_tensors
    ws, zs = rest[: ctx.layers], rest[ctx.layers :]
    out = silu_mlp_backward(grads[0], x, list(ws), list(zs))
    return None, out[: ctx.layers], out[ctx.layers :]


silu_mlp_op.register_autograd(_backward, setup_context=_setup_context)


def actor_forward(actor, obs: torch.Tensor, x_t: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """FlowActor.forward through these kernels: the same input rows, the MLP in bf16, the output float32. They give
    no gradient for the inputs, so inputs that need one are refused."""
    if torch.is_grad_enabled() and any(v.requires_grad for v in (obs, x_t, t)):
        raise RunError("the bf16 SiLU kernels give gradients for the weights only; an input requires one")
    ang = t.unsqueeze(-1) * actor.freqs
    obs = obs.expand(*x_t.shape[:-1], obs.shape[-1])
    x = torch.cat([obs, x_t, torch.cos(ang), torch.sin(ang)], dim=-1).to(torch.bfloat16)  # as the kernels round it
    lin = actor.net[::2]
    y = silu_mlp_op(x.reshape(-1, x.shape[-1]), [m.weight for m in lin], [m.bias for m in lin])[0]
    return y.reshape(*x.shape[:-1], y.shape[-1]) * actor.output_scale
