"""The flow actor's MLP as fused Triton kernels (robot_fpo.py's GPU fast path; imports Triton).

The actor (robot_fpo.py ``FlowActor``) is an MLP of width H on ``[obs, x_t, cos/sin(freqs t)]`` with
SiLU activations. At the ``fpo`` preset one minibatch evaluates it on 245,760 rows (30,720 samples
x 8 draws) and a rollout step samples it 10 times for 2,048 environments: in torch every layer and
every activation is a kernel that writes its (rows x H) result to memory. Here a program takes a
block of rows through every layer with the activations in registers:

* :func:`flow_mlp`: the velocity ``v`` of rows ``(x_t, t)`` whose first-layer observation term
  ``base`` (one row per observation, shared by its M draws) torch computes; a ``torch.library``
  custom op with its own backward (which recomputes the forward in registers and writes per-block
  partial weight gradients that torch sums), so autograd and ``torch.compile`` treat it as one node;
* :class:`FusedSampler`: all Euler steps of ``actor.sample`` in one kernel.

Matrix products run in TF32 when asked (``tf32``; JAX's default on GPUs), else in float32. Both
paths compute the eager actor's function; tests compare them with it (on the CPU through Triton's
interpreter, ``TRITON_INTERPRET=1``).
"""

from __future__ import annotations

import torch
import torch.nn as nn
import triton
import triton.language as tl

from fpo_utils.mlp_layers import mlp_layers
from fpo_utils.runfolder import RunError

BLOCK = 64  # rows per program; a multiple of the draws per observation for the fused observation term


def pow2(n: int, least: int = 16) -> int:
    return max(least, 1 << (max(n, 1) - 1).bit_length())


def why_not_kernels(actor: nn.Module) -> str:
    """Why these kernels cannot compute ``actor`` (one line), or "" where they can: Linear layers with biases
    alternating with SiLU, at least one hidden-to-hidden layer, every hidden layer of one power-of-two width of
    at least 16."""
    try:
        layers = mlp_layers(actor, "the Triton kernels", ("silu",))
    except RunError as err:
        return str(err)
    if any(isinstance(m, nn.Linear) != (i % 2 == 0) for i, m in enumerate(layers)) or len(layers) % 2 == 0:
        return "the Triton kernels take an MLP of Linear layers alternating with SiLU, ending in a Linear"
    lin = layers[::2]
    if len(lin) < 3:
        return f"the Triton kernels take at least one hidden-to-hidden layer; actor.net has {len(lin)} Linear layers"
    if any(m.bias is None for m in lin):
        return "the Triton kernels take Linear layers with biases"
    h = lin[0].out_features
    if h < 16 or h & (h - 1) or any(m.in_features != h or m.out_features != h for m in lin[1:-1]):
        return f"the Triton kernels take hidden layers of one power-of-two width of at least 16; actor.net has {h}"
    return ""


@triton.jit
def _silu_grad(pre):
    s = tl.sigmoid(pre)
    return s * (1.0 + pre * (1.0 - s))


@triton.jit
def _first_layer(
    base,
    x,
    t,
    freqs,
    wx,
    wt,
    rows,
    R,
    M: tl.constexpr,
    D: tl.constexpr,
    DP: tl.constexpr,
    E: tl.constexpr,
    EP: tl.constexpr,
    H: tl.constexpr,
    PREC: tl.constexpr,
):
    """Pre-activation of layer 0 for ``rows``, and its x and embedding inputs (zero-padded)."""
    hc, dc, ec = tl.arange(0, H), tl.arange(0, DP), tl.arange(0, EP)
    rm = rows < R
    xin = tl.load(x + rows[:, None] * D + dc[None, :], mask=rm[:, None] & (dc[None, :] < D), other=0.0)
    tt = tl.load(t + rows, mask=rm, other=0.0)
    f = tl.load(freqs + ec % (E // 2), mask=ec < E, other=0.0)
    ang = tt[:, None] * f[None, :]
    emb = tl.where((ec < E // 2)[None, :], tl.cos(ang), tl.sin(ang))  # zero where ec >= E (f = 0 there)
    w_x = tl.load(wx + hc[None, :] * D + dc[:, None], mask=dc[:, None] < D, other=0.0)  # (DP, H) = W_x^T
    w_t = tl.load(wt + hc[None, :] * E + ec[:, None], mask=ec[:, None] < E, other=0.0)  # (EP, H) = W_t^T
    pre = tl.load(base + (rows // M)[:, None] * H + hc[None, :], mask=rm[:, None], other=0.0)
    pre += tl.dot(xin, w_x, input_precision=PREC) + tl.dot(emb, w_t, input_precision=PREC)
    return pre, xin, emb


@triton.jit
def _hidden(a, wh, bh, j: tl.constexpr, H: tl.constexpr, PREC: tl.constexpr):
    """Pre-activation of hidden layer j + 1 from the activation ``a`` of layer j."""
    hc = tl.arange(0, H)
    w = tl.load(wh + j * H * H + hc[None, :] * H + hc[:, None])  # (H_in, H_out) = W_j^T
    return tl.dot(a, w, input_precision=PREC) + tl.load(bh + j * H + hc)[None, :]


@triton.jit
def _forward_to(pre0, wh, bh, K: tl.constexpr, H: tl.constexpr, PREC: tl.constexpr):
    """(pre-activation of layer K, activation of layer K - 1), recomputed from layer 0; K >= 1."""
    a = pre0 * tl.sigmoid(pre0)
    pre = _hidden(a, wh, bh, 0, H, PREC)
    for j in tl.static_range(1, K):
        a = pre * tl.sigmoid(pre)
        pre = _hidden(a, wh, bh, j, H, PREC)
    return pre, a


@triton.jit
def _mlp_fwd(
    base,
    x,
    t,
    freqs,
    wx,
    wt,
    wh,
    bh,
    wo,
    bo,
    v,
    R,
    scale,
    M: tl.constexpr,
    D: tl.constexpr,
    DP: tl.constexpr,
    E: tl.constexpr,
    EP: tl.constexpr,
    H: tl.constexpr,
    NH: tl.constexpr,
    BLOCK: tl.constexpr,
    PREC: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    hc, dc = tl.arange(0, H), tl.arange(0, DP)
    pre, _, _ = _first_layer(base, x, t, freqs, wx, wt, rows, R, M, D, DP, E, EP, H, PREC)
    a = pre * tl.sigmoid(pre)
    for j in tl.static_range(NH):
        pre = _hidden(a, wh, bh, j, H, PREC)
        a = pre * tl.sigmoid(pre)
    w_o = tl.load(wo + dc[None, :] * H + hc[:, None], mask=dc[None, :] < D, other=0.0)  # (H, DP) = W_o^T
    out = (tl.dot(a, w_o, input_precision=PREC) + tl.load(bo + dc, mask=dc < D, other=0.0)[None, :]) * scale
    tl.store(v + rows[:, None] * D + dc[None, :], out, mask=(rows < R)[:, None] & (dc[None, :] < D))


@triton.jit
def _mlp_bwd(
    gv,
    base,
    x,
    t,
    freqs,
    wx,
    wt,
    wh,
    bh,
    wo,
    gbase,
    p_wx,
    p_wt,
    p_wh,
    p_bh,
    p_wo,
    p_bo,
    R,
    n,
    scale,
    M: tl.constexpr,
    D: tl.constexpr,
    DP: tl.constexpr,
    E: tl.constexpr,
    EP: tl.constexpr,
    H: tl.constexpr,
    NH: tl.constexpr,
    BLOCK: tl.constexpr,
    PREC: tl.constexpr,
):
    pid = tl.program_id(0)
    rows = pid * BLOCK + tl.arange(0, BLOCK)
    hc, dc, ec = tl.arange(0, H), tl.arange(0, DP), tl.arange(0, EP)
    rm = rows < R
    g = tl.load(gv + rows[:, None] * D + dc[None, :], mask=rm[:, None] & (dc[None, :] < D), other=0.0) * scale
    pre0, xin, emb = _first_layer(base, x, t, freqs, wx, wt, rows, R, M, D, DP, E, EP, H, PREC)
    pre_last, _ = _forward_to(pre0, wh, bh, NH, H, PREC)
    a_last = pre_last * tl.sigmoid(pre_last)
    # Output layer: v = scale (a W_o^T + b_o).
    tl.store(p_wo + pid * DP * H + dc[:, None] * H + hc[None, :], tl.dot(tl.trans(g), a_last, input_precision=PREC))
    tl.store(p_bo + pid * DP + dc, tl.sum(g, axis=0))
    w_o = tl.load(wo + dc[:, None] * H + hc[None, :], mask=dc[:, None] < D, other=0.0)  # (DP, H) = W_o
    ga = tl.dot(g, w_o, input_precision=PREC)  # gradient at the last activation
    for j in tl.static_range(NH - 1, -1, -1):  # hidden layer j + 1, from the last down
        pre, a_prev = _forward_to(pre0, wh, bh, j + 1, H, PREC)
        gpre = ga * _silu_grad(pre)
        tl.store(
            p_wh + (pid * NH + j) * H * H + hc[:, None] * H + hc[None, :],
            tl.dot(tl.trans(gpre), a_prev, input_precision=PREC),
        )
        tl.store(p_bh + (pid * NH + j) * H + hc, tl.sum(gpre, axis=0))
        w = tl.load(wh + j * H * H + hc[:, None] * H + hc[None, :])  # (H_out, H_in) = W_j
        ga = tl.dot(gpre, w, input_precision=PREC)
    gpre = ga * _silu_grad(pre0)
    tl.store(p_wx + pid * H * DP + hc[:, None] * DP + dc[None, :], tl.dot(tl.trans(gpre), xin, input_precision=PREC))
    tl.store(p_wt + pid * H * EP + hc[:, None] * EP + ec[None, :], tl.dot(tl.trans(gpre), emb, input_precision=PREC))
    # The observation term: one row per observation, summed over its M draws (BLOCK is a multiple of M).
    per_obs = tl.sum(tl.reshape(gpre, (BLOCK // M, M, H)), axis=1)
    obs_rows = pid * (BLOCK // M) + tl.arange(0, BLOCK // M)
    tl.store(gbase + obs_rows[:, None] * H + hc[None, :], per_obs, mask=(obs_rows < n)[:, None])


def _dims(base, x, wt, wh):
    (R, D), (n, H), E = x.shape, base.shape, wt.shape[1]
    return dict(M=R // n, D=D, DP=pow2(D), E=E, EP=pow2(E), H=H, NH=wh.shape[0], BLOCK=BLOCK)


@torch.library.custom_op("fpo_utils::flow_mlp", mutates_args=())
def flow_mlp(
    base: torch.Tensor,
    x: torch.Tensor,
    t: torch.Tensor,
    freqs: torch.Tensor,
    wx: torch.Tensor,
    wt: torch.Tensor,
    wh: torch.Tensor,
    bh: torch.Tensor,
    wo: torch.Tensor,
    bo: torch.Tensor,
    scale: float,
    tf32: bool,
) -> torch.Tensor:
    """Velocity rows (R, D) of the MLP for ``x`` (R, D), ``t`` (R,), with layer 0's observation term ``base``
    (n, H) shared by consecutive groups of M = R / n rows; weights as nn.Linear stores them
    (``wx`` (H, D), ``wt`` (H, E), ``wh`` (NH >= 1, H, H), ``wo`` (D, H)); output times ``scale``."""
    v = torch.empty_like(x)
    _mlp_fwd[(triton.cdiv(x.shape[0], BLOCK),)](
        base,
        x,
        t,
        freqs,
        wx,
        wt,
        wh,
        bh,
        wo,
        bo,
        v,
        x.shape[0],
        scale,
        PREC="tf32" if tf32 else "ieee",
        **_dims(base, x, wt, wh),
    )
    return v


@flow_mlp.register_fake
def _(base, x, t, freqs, wx, wt, wh, bh, wo, bo, scale, tf32):
    return torch.empty_like(x)


@torch.library.custom_op("fpo_utils::flow_mlp_backward", mutates_args=())
def flow_mlp_backward(
    gv: torch.Tensor,
    base: torch.Tensor,
    x: torch.Tensor,
    t: torch.Tensor,
    freqs: torch.Tensor,
    wx: torch.Tensor,
    wt: torch.Tensor,
    wh: torch.Tensor,
    bh: torch.Tensor,
    wo: torch.Tensor,
    scale: float,
    tf32: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients of :func:`flow_mlp` (base, wx, wt, wh, bh, wo, bo) for the output gradient ``gv``."""
    dims = _dims(base, x, wt, wh)
    blocks, H, DP, EP, NH = triton.cdiv(x.shape[0], BLOCK), dims["H"], dims["DP"], dims["EP"], dims["NH"]
    z = lambda *s: torch.empty(blocks, *s, device=x.device, dtype=torch.float32)  # noqa: E731
    gbase, p_wx, p_wt, p_wh, p_bh, p_wo, p_bo = (
        torch.empty_like(base),
        z(H, DP),
        z(H, EP),
        z(NH, H, H),
        z(NH, H),
        z(DP, H),
        z(DP),
    )
    _mlp_bwd[(blocks,)](
        gv.contiguous(),
        base,
        x,
        t,
        freqs,
        wx,
        wt,
        wh,
        bh,
        wo,
        gbase,
        p_wx,
        p_wt,
        p_wh,
        p_bh,
        p_wo,
        p_bo,
        x.shape[0],
        base.shape[0],
        scale,
        PREC="tf32" if tf32 else "ieee",
        **dims,
    )
    D, E = dims["D"], dims["E"]
    return (
        gbase,
        p_wx.sum(0)[:, :D].contiguous(),
        p_wt.sum(0)[:, :E].contiguous(),
        p_wh.sum(0)[:NH].contiguous(),
        p_bh.sum(0)[:NH].contiguous(),
        p_wo.sum(0)[:D].contiguous(),
        p_bo.sum(0)[:D].contiguous(),
    )


@flow_mlp_backward.register_fake
def _(gv, base, x, t, freqs, wx, wt, wh, bh, wo, scale, tf32):
    return tuple(torch.empty_like(a) for a in (base, wx, wt, wh, bh, wo)) + (gv.new_empty(gv.shape[1]),)


def _setup_context(ctx, inputs, output):
    ctx.save_for_backward(*inputs[:10])
    ctx.scale, ctx.tf32 = inputs[10], inputs[11]


def _backward(ctx, gv):
    base, x, t, freqs, wx, wt, wh, bh, wo, _ = ctx.saved_tensors
    gbase, gwx, gwt, gwh, gbh, gwo, gbo = flow_mlp_backward(
        gv, base, x, t, freqs, wx, wt, wh, bh, wo, ctx.scale, ctx.tf32
    )
    return gbase, None, None, None, gwx, gwt, gwh, gbh, gwo, gbo, None, None


flow_mlp.register_autograd(_backward, setup_context=_setup_context)


def actor_forward(actor: nn.Module, obs: torch.Tensor, x_t: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """``actor(obs, x_t, t)`` through :func:`flow_mlp`, for actors the kernels compute (:func:`why_not_kernels`):
    obs (..., o) broadcasting against x_t (..., d); an observation shared by the draws of dimension -2 (obs
    ``(..., 1, o)``) has its term computed once."""
    lin = [m for m in actor.net if isinstance(m, nn.Linear)]
    first, o, d, lead = lin[0], obs.shape[-1], actor.act_dim, x_t.shape[:-1]
    w = first.weight
    m = x_t.shape[-2] if obs.dim() == x_t.dim() >= 2 and obs.shape[-2] == 1 else 1
    if m > 1 and (BLOCK % m or m & (m - 1)):
        m = 1
    obs = obs.expand(*lead[:-1], 1, o) if m > 1 else obs.expand(*lead, o)
    base = nn.functional.linear(obs, w[:, :o], first.bias).reshape(-1, w.shape[0])
    wh, bh = torch.stack([m_.weight for m_ in lin[1:-1]]), torch.stack([m_.bias for m_ in lin[1:-1]])
    v = flow_mlp(
        base,
        x_t.reshape(-1, d).float().contiguous(),
        t.reshape(-1).float().contiguous(),
        actor.freqs,
        w[:, o : o + d].contiguous(),
        w[:, o + d :].contiguous(),
        wh,
        bh,
        lin[-1].weight.contiguous(),
        lin[-1].bias,
        float(actor.output_scale),
        torch.backends.cuda.matmul.allow_tf32,
    )
    return v.view(*lead, d)


@triton.jit
def _euler(
    obs,
    x0,
    out,
    w0,
    b0,
    freqs,
    wh,
    bh,
    wo,
    bo,
    n,
    c,
    O: tl.constexpr,  # noqa: E741  (observation width, beside D and E)
    OP: tl.constexpr,
    D: tl.constexpr,
    DP: tl.constexpr,
    E: tl.constexpr,
    EP: tl.constexpr,
    H: tl.constexpr,
    NH: tl.constexpr,
    STEPS: tl.constexpr,
    BLOCK: tl.constexpr,
    PREC: tl.constexpr,
):
    # One program: BLOCK rows through all STEPS Euler steps, every activation in registers.
    rows = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    hc, oc, dc, ec = tl.arange(0, H), tl.arange(0, OP), tl.arange(0, DP), tl.arange(0, EP)
    rm = rows[:, None] < n
    IN: tl.constexpr = O + D + E
    # First layer split by input block: W0 is (H, O + D + E), row-major.
    w_obs = tl.load(w0 + hc[None, :] * IN + oc[:, None], mask=oc[:, None] < O, other=0.0)  # (OP, H)
    w_x = tl.load(w0 + hc[None, :] * IN + O + dc[:, None], mask=dc[:, None] < D, other=0.0)  # (DP, H)
    w_t = tl.load(w0 + hc[None, :] * IN + O + D + ec[:, None], mask=ec[:, None] < E, other=0.0)  # (EP, H)
    f = tl.load(freqs + ec % (E // 2), mask=ec < E, other=0.0)
    w_o = tl.load(wo + dc[None, :] * H + hc[:, None], mask=dc[None, :] < D, other=0.0)  # (H, DP)
    b_o = tl.load(bo + dc, mask=dc < D, other=0.0)
    o = tl.load(obs + rows[:, None] * O + oc[None, :], mask=rm & (oc[None, :] < O), other=0.0)
    base = tl.dot(o, w_obs, input_precision=PREC) + tl.load(b0 + hc)[None, :]
    x = tl.load(x0 + rows[:, None] * D + dc[None, :], mask=rm & (dc[None, :] < D), other=0.0)
    for k in tl.static_range(STEPS):
        ang = f * (k / STEPS)
        emb = tl.where(ec < E // 2, tl.cos(ang), tl.sin(ang))
        h = base + tl.sum(emb[:, None] * w_t, axis=0)[None, :] + tl.dot(x, w_x, input_precision=PREC)
        h = h * tl.sigmoid(h)
        for j in tl.static_range(NH):
            w = tl.load(wh + j * H * H + hc[None, :] * H + hc[:, None])  # layer j's W^T (H, H)
            h = tl.dot(h, w, input_precision=PREC) + tl.load(bh + j * H + hc)[None, :]
            h = h * tl.sigmoid(h)
        x = x + c * (tl.dot(h, w_o, input_precision=PREC) + b_o[None, :])
    tl.store(out + rows[:, None] * D + dc[None, :], x, mask=rm & (dc[None, :] < D))


class FusedSampler:
    """``actor.sample(obs, x0, steps)`` as one Triton kernel: every Euler step of the whole MLP for a
    block of rows, activations in registers (the eager sampler runs ~10 kernels per Euler step).

    For actors the kernels can compute (:func:`why_not_kernels`; a one-line RunError for any other). Reads the
    actor's parameters in place at every call, so optimiser steps and checkpoint loads need nothing; capturable
    in a CUDA graph.
    """

    BLOCK, WARPS = 64, 4  # rows per program, warps per program

    def __init__(self, actor: nn.Module):
        reason = why_not_kernels(actor)
        if reason:
            raise RunError(reason)
        lin = [m for m in actor.net if isinstance(m, nn.Linear)]
        self.actor, self.first, self.hidden, self.last = actor, lin[0], lin[1:-1], lin[-1]

    @torch.no_grad()
    def __call__(self, obs: torch.Tensor, x0: torch.Tensor, steps: int) -> torch.Tensor:
        a, (n, o) = self.actor, obs.shape
        d, e, h = a.act_dim, a.freqs.numel() * 2, self.first.out_features
        obs, x0 = obs.float().contiguous(), x0.float().contiguous()
        out = torch.empty_like(x0)
        wh, bh = torch.stack([m.weight for m in self.hidden]), torch.stack([m.bias for m in self.hidden])
        _euler[(triton.cdiv(n, self.BLOCK),)](
            obs,
            x0,
            out,
            self.first.weight,
            self.first.bias,
            a.freqs,
            wh,
            bh,
            self.last.weight,
            self.last.bias,
            n,
            a.output_scale / steps,
            O=o,
            OP=pow2(o),
            D=d,
            DP=pow2(d),
            E=e,
            EP=pow2(e),
            H=h,
            NH=len(self.hidden),
            STEPS=steps,
            BLOCK=self.BLOCK,
            PREC="tf32" if torch.backends.cuda.matmul.allow_tf32 else "ieee",
            num_warps=self.WARPS,
        )
        return out
