"""Copies of the flow actor's Euler sampler ``FlowActor.sample(obs, x0, steps)`` for a rollout, chosen once at
setup (:func:`pick_sampler`). Each computes what ``actor.sample`` computes, or refuses at construction in one
line naming what it cannot mirror; :func:`check_sampler` probes one against ``actor.sample`` on a small batch,
which catches what no check of module types sees (an edited ``forward``, another time embedding).

* :class:`NumpySampler`: float32 NumPy for CPU rollouts (a rollout samples ``num_envs`` actions per step with
  ``flow_steps`` small MLP evaluations; NumPy's per-call cost is several times below torch's per-op dispatch at
  these sizes). Mirrors Linear layers and SiLU, Tanh, ReLU and GELU activations.
* :class:`GraphedSampler`: ``actor.sample`` captured per batch shape as a CUDA graph (evaluation).
* ``fpo_utils.flow_triton.FusedSampler``: all Euler steps as one Triton kernel (SiLU actors of width 16 or 32,
  :func:`why_not_fused`).
"""

from __future__ import annotations

import importlib.util
import math
from typing import Callable

import numpy as np
import torch
import torch.nn as nn

from fpo_utils.mlp_layers import mlp_layers
from fpo_utils.runfolder import RunError

Sampler = Callable[[torch.Tensor, torch.Tensor, int], torch.Tensor]  # (obs, x0, steps) -> x


def _numpy_activations() -> tuple[str, ...]:
    exact_gelu = ("gelu",) if importlib.util.find_spec("scipy") is not None else ()  # erf
    return ("silu", "tanh", "relu", "gelu_tanh", *exact_gelu)


def why_not_numpy(actor: nn.Module) -> str:
    """Why :class:`NumpySampler` cannot mirror ``actor`` (one line), or "" where it can."""
    try:
        mlp_layers(actor, "the NumPy sampler", _numpy_activations())
    except RunError as err:
        return str(err)
    return ""


class NumpySampler:
    """float32 NumPy copy of a flow actor's Euler sampler, refreshed from the actor with :meth:`refresh`.

    Reads ``actor.net`` (:func:`fpo_utils.mlp_layers.mlp_layers`: Linear layers and SiLU, Tanh, ReLU or GELU
    activations; a RunError naming any other module), ``actor.freqs``, ``actor.output_scale`` and
    ``actor.act_dim``. The first layer is split by input block, so the observation term is computed once per
    action and the time term once per Euler step; every intermediate lives in preallocated buffers.
    """

    def __init__(self, actor: nn.Module):
        self.actor = actor
        self.refresh()

    def refresh(self) -> None:
        """Take the actor's current weights (and layers: a RunError if they can no longer be mirrored)."""
        actor = self.actor
        self.layers = mlp_layers(actor, "the NumPy sampler", _numpy_activations())
        lin = [m for m in self.layers if isinstance(m, nn.Linear)]
        w = [m.weight.detach().cpu().float().numpy().T.copy() for m in lin]
        self.b = [
            np.zeros(m.out_features, np.float32) if m.bias is None else m.bias.detach().cpu().float().numpy().copy()
            for m in lin
        ]
        n_obs = w[0].shape[0] - actor.act_dim - actor.freqs.numel() * 2
        self.w_obs, self.w_x, self.w_t = (
            w[0][:n_obs],
            w[0][n_obs : n_obs + actor.act_dim],
            w[0][n_obs + actor.act_dim :],
        )
        self.w = w
        # after the first Linear: ("linear", index) or ("act", name), in order
        self.ops, k = [], 0
        for m in self.layers[1:]:
            if isinstance(m, nn.Linear):
                k += 1
                self.ops.append(("linear", k))
            else:
                self.ops.append(("act", m))
        self.freqs = actor.freqs.detach().cpu().float().numpy()
        self.scale = np.float32(actor.output_scale)
        self._time_terms: dict[int, list[np.ndarray]] = {}
        self._bufs: dict[int, list[tuple[np.ndarray, np.ndarray]]] = {}
        if "gelu" in self.layers:
            from scipy.special import erf

            self._erf = erf

    def _time_term(self, steps: int) -> list[np.ndarray]:
        if steps not in self._time_terms:  # as FlowActor.sample: float32 angles (k / steps) * freqs
            ang = (np.arange(steps, dtype=np.float32) / np.float32(steps))[:, None] * self.freqs
            emb = np.concatenate([np.cos(ang), np.sin(ang)], axis=1).astype(np.float32)
            self._time_terms[steps] = list(emb @ self.w_t)
        return self._time_terms[steps]

    def _buffers(self, n: int) -> list[tuple[np.ndarray, np.ndarray]]:
        """Per Linear layer: its output and a scratch array of the same shape (one per width, shared)."""
        if n not in self._bufs:
            scratch = {w.shape[1]: np.empty((n, w.shape[1]), np.float32) for w in self.w}
            self._bufs[n] = [(np.empty((n, w.shape[1]), np.float32), scratch[w.shape[1]]) for w in self.w]
        return self._bufs[n]

    def _activate(self, name: str, h: np.ndarray, tmp: np.ndarray) -> None:
        """``h <- act(h)`` in place, ``tmp`` a scratch array of h's shape."""
        if name == "silu":  # h / (1 + exp(-h))
            np.negative(h, out=tmp)
            np.exp(tmp, out=tmp)
            tmp += 1.0
            np.divide(h, tmp, out=h)
        elif name == "tanh":
            np.tanh(h, out=h)
        elif name == "relu":
            np.maximum(h, 0.0, out=h)
        elif name == "gelu":  # h (1 + erf(h / sqrt 2)) / 2
            np.multiply(h, np.float32(1.0 / math.sqrt(2.0)), out=tmp)
            self._erf(tmp, out=tmp)
            tmp += 1.0
            h *= tmp
            h *= np.float32(0.5)
        elif name == "gelu_tanh":  # h (1 + tanh(sqrt(2 / pi) (h + 0.044715 h^3))) / 2
            np.multiply(h, h, out=tmp)
            tmp *= np.float32(0.044715)
            tmp += 1.0
            tmp *= h
            tmp *= np.float32(math.sqrt(2.0 / math.pi))
            np.tanh(tmp, out=tmp)
            tmp += 1.0
            h *= tmp
            h *= np.float32(0.5)
        else:
            raise AssertionError(name)

    def sample_np(self, obs: np.ndarray, x0: np.ndarray, steps: int) -> np.ndarray:
        """Euler samples (float32) for float32 ``obs`` (n, o) and initial noise ``x0`` (n, d): ``steps`` times
        ``x <- x + scale / steps * net([obs, x, cos(freqs t), sin(freqs t)])`` at ``t = k / steps``."""
        if obs.shape[1] != self.w_obs.shape[0]:
            raise ValueError(f"obs has {obs.shape[1]} columns; the actor reads {self.w_obs.shape[0]}")
        bufs = self._buffers(x0.shape[0])
        base = np.dot(np.asarray(obs, np.float32), self.w_obs)
        base += self.b[0]
        x, c = np.array(x0, np.float32), np.float32(1.0 / steps) * self.scale
        for tt in self._time_term(steps):
            h, tmp = bufs[0]
            np.dot(x, self.w_x, out=h)
            np.add(base, h, out=h)
            h += tt
            for kind, op in self.ops:
                if kind == "act":
                    self._activate(op, h, tmp)
                else:
                    out, tmp = bufs[op]
                    h = np.dot(h, self.w[op], out=out)
                    h += self.b[op]
            h *= c
            x += h
        return x

    def __call__(self, obs: torch.Tensor, x0: torch.Tensor, steps: int) -> torch.Tensor:
        return torch.from_numpy(self.sample_np(obs.cpu().numpy(), x0.cpu().numpy(), steps))


class GraphedSampler:
    """``actor.sample(obs, x0, steps)`` captured once per batch shape as a CUDA graph and replayed.

    A rollout step samples with ``flow_steps`` evaluations of a small MLP: a few hundred kernel
    launches whose host cost exceeds the GPU work. The graph reads the actor's parameters in place
    (optimiser steps and checkpoint loads write them in place), so it never needs recapturing.
    """

    def __init__(self, actor: nn.Module):
        self.actor, self.key, self.graph = actor, None, None

    def __call__(self, obs: torch.Tensor, x0: torch.Tensor, steps: int) -> torch.Tensor:
        key = (tuple(obs.shape), tuple(x0.shape), steps, obs.device)
        if self.key != key:
            self.obs, self.x0 = obs.clone(), x0.clone()
            side = torch.cuda.Stream(device=obs.device)
            side.wait_stream(torch.cuda.current_stream(obs.device))
            with torch.cuda.stream(side):
                for _ in range(2):  # warm-up outside the capture
                    self.actor.sample(self.obs, self.x0, steps)
            torch.cuda.current_stream(obs.device).wait_stream(side)
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph):
                self.out = self.actor.sample(self.obs, self.x0, steps)
            self.key = key
        self.obs.copy_(obs)
        self.x0.copy_(x0)
        self.graph.replay()
        return self.out.clone()


FUSED_WIDTHS = (16, 32)


def why_not_fused(actor: nn.Module) -> str:
    """Why ``--fused`` does not use the Triton kernels of ``fpo_utils.flow_triton`` for this flow actor (one
    line), or "" where it does: Triton installed, what the kernels compute (Linear and SiLU layers alternating,
    at least one hidden layer, equal power-of-two widths: ``flow_triton.why_not_kernels``), and width 16 or 32.
    The kernels keep whole (64 x width) tiles in registers; they were measured faster than torch at width 32 (the
    fpo preset), while a width-64 run with them (and compiled losses) updated 6x slower for a reason not isolated
    (benchmarks/robot_results/README.md), so wider actors keep torch's path, which computes the same function."""
    if importlib.util.find_spec("triton") is None:
        return "the Triton kernels need Triton, which is not installed"
    from fpo_utils.flow_triton import why_not_kernels

    reason = why_not_kernels(actor)
    if reason:
        return reason
    h = actor.net[0].out_features
    if h not in FUSED_WIDTHS:
        return f"the Triton kernels are used at widths 16 and 32 (measured faster there); this actor's is {h}"
    return ""


def fused_supported(actor: nn.Module) -> bool:
    """Whether ``--fused`` uses the Triton kernels for this actor (:func:`why_not_fused` says why not)."""
    return not why_not_fused(actor)


def fused_forward(actor: nn.Module, wanted: bool):
    """``flow_triton.actor_forward`` (``(actor, obs, x_t, t) -> v``) if ``wanted`` and the actor is
    supported, else None (the actor's own forward)."""
    if not (wanted and fused_supported(actor)):
        return None
    from fpo_utils.flow_triton import actor_forward

    return actor_forward


def pick_sampler(actor: nn.Module, device: torch.device, graphs: bool, in_graph: bool, fused: bool) -> Sampler:
    """The Euler sampler ``(obs, x0, steps) -> x`` for ``actor``, chosen once. On the CPU :class:`NumpySampler`,
    or ``actor.sample`` where it cannot mirror the actor (:func:`why_not_numpy`); on CUDA the Triton
    ``FusedSampler`` if ``fused`` and it applies (:func:`why_not_fused`), else ``actor.sample`` inside a captured
    rollout step (``in_graph``) or :class:`GraphedSampler` on its own (with ``graphs``). Every choice computes
    what ``actor.sample`` computes."""
    if device.type != "cuda":
        return NumpySampler(actor) if not why_not_numpy(actor) else actor.sample
    if fused and fused_supported(actor):
        from fpo_utils.flow_triton import FusedSampler

        return FusedSampler(actor)
    return GraphedSampler(actor) if graphs and not in_graph else actor.sample


def check_sampler(
    sampler: Sampler,
    actor: nn.Module,
    obs_dim: int,
    act_dim: int,
    steps: int,
    device: torch.device | str,
    tol: float = 1e-4,
    rows: int = 64,
) -> float:
    """A setup-time probe: ``sampler`` and ``actor.sample`` on the same ``rows`` random observations and noises
    (fixed seed, the actor's current weights); a one-line RunError where they differ by more than ``tol``
    (largest absolute difference), which catches a sampler that no longer mirrors an edited actor (its forward,
    its time embedding). Returns the difference. Run it once the weights are set (a zero output layer would
    hide a difference)."""
    device = torch.device(device)
    g = torch.Generator().manual_seed(0)
    obs = torch.randn(rows, obs_dim, generator=g).to(device)
    x0 = torch.randn(rows, act_dim, generator=g).to(device)
    if hasattr(sampler, "refresh"):
        sampler.refresh()
    with torch.no_grad():
        want = actor.sample(obs, x0, steps).float().cpu()
        got = sampler(obs, x0, steps).float().cpu()
    name = getattr(sampler, "__qualname__", type(sampler).__name__)
    if got.shape != want.shape:
        raise RunError(f"the sampler {name} returned shape {tuple(got.shape)}; FlowActor.sample {tuple(want.shape)}")
    err = float((got - want).abs().max())
    if not err <= tol:  # NaN fails too
        raise RunError(
            f"the sampler {name} differs from FlowActor.sample by {err:.3g} (tolerance {tol:g}) on a probe batch: "
            "it does not mirror the actor (an edited forward or time embedding?)"
        )
    return err
