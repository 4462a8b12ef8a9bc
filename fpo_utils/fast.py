"""Fast paths for robot_fpo.py, chosen once at setup: none of them changes what is computed.

* :class:`NumpySampler`: the flow actor's Euler sampler as float32 NumPy for CPU rollouts (a
  rollout samples ``num_envs`` actions per step with ``flow_steps`` small MLP evaluations; NumPy's
  per-call cost is several times below torch's per-op dispatch at these sizes).
* :class:`GraphedCall`: a function of fixed tensors (a rollout step's policy half or bookkeeping
  half) captured once as a CUDA graph and replayed.
* :class:`GraphedSampler`: the Euler sampler captured per batch shape (evaluation).
* :class:`GraphedStep`: one minibatch step of the update (gather, losses, backward, gradient clip,
  fused optimiser step) captured once as a CUDA graph and replayed for every minibatch.
"""

from __future__ import annotations

import warnings
from typing import Callable

import numpy as np
import torch
import torch.nn as nn

from fpo_utils.envs import env_out_size, env_out_views


class NumpySampler:
    """float32 NumPy copy of a flow actor's MLP (``actor.net``: Linear/SiLU layers whose first layer
    reads ``[obs, x_t, cos/sin(freqs t)]``), refreshed from the actor with :meth:`refresh`.

    The first layer is split by input block, so the observation term is computed once per action
    and the time term once per Euler step; every intermediate lives in preallocated buffers.
    """

    def __init__(self, actor: nn.Module):
        self.actor = actor
        self._bufs: dict[int, list[np.ndarray]] = {}
        self.refresh()

    def refresh(self) -> None:
        actor = self.actor
        lin = [m for m in actor.net if isinstance(m, nn.Linear)]
        w = [m.weight.detach().cpu().float().numpy().T.copy() for m in lin]
        self.b = [m.bias.detach().cpu().float().numpy().copy() for m in lin]
        n_obs = w[0].shape[0] - actor.act_dim - actor.freqs.numel() * 2
        self.w_obs, self.w_x, self.w_t = (
            w[0][:n_obs],
            w[0][n_obs : n_obs + actor.act_dim],
            w[0][n_obs + actor.act_dim :],
        )
        self.w = w
        self.freqs = actor.freqs.detach().cpu().double().numpy()
        self.scale = np.float32(actor.output_scale)
        self._time_terms: dict[int, list[np.ndarray]] = {}

    def _time_term(self, steps: int) -> list[np.ndarray]:
        if steps not in self._time_terms:
            ang = (np.arange(steps) / steps)[:, None] * self.freqs
            emb = np.concatenate([np.cos(ang), np.sin(ang)], axis=1).astype(np.float32)
            self._time_terms[steps] = list(emb @ self.w_t)
        return self._time_terms[steps]

    def _buffers(self, n: int) -> list[np.ndarray]:
        if n not in self._bufs:
            self._bufs[n] = [np.empty((n, w.shape[1]), np.float32) for w in self.w] + [
                np.empty((n, self.w_x.shape[1]), np.float32)
            ]
        return self._bufs[n]

    def sample_np(self, obs: np.ndarray, x0: np.ndarray, steps: int) -> np.ndarray:
        """Euler samples (float32) for float32 ``obs`` (n, o) and initial noise ``x0`` (n, d); the
        arithmetic is that of ``x + dt * scale * (silu(h @ W + b) ...)`` step by step."""
        bufs = self._buffers(x0.shape[0])
        tmp = bufs[-1]
        base = np.dot(np.asarray(obs, np.float32), self.w_obs)
        base += self.b[0]
        x, c = np.array(x0, np.float32), np.float32(1.0 / steps) * self.scale
        for tt in self._time_term(steps):
            h = np.dot(x, self.w_x, out=bufs[0])
            np.add(base, h, out=h)
            h += tt
            _silu_(h, tmp)
            for w, b, out in zip(self.w[1:-1], self.b[1:-1], bufs[1:-2]):
                h = np.dot(h, w, out=out)
                h += b
                _silu_(h, tmp)
            v = np.dot(h, self.w[-1], out=bufs[-2])
            v += self.b[-1]
            v *= c
            x += v
        return x

    def __call__(self, obs: torch.Tensor, x0: torch.Tensor, steps: int) -> torch.Tensor:
        return torch.from_numpy(self.sample_np(obs.numpy(), x0.numpy(), steps))


def _silu_(h: np.ndarray, tmp: np.ndarray) -> None:
    """In-place SiLU ``h <- h / (1 + exp(-h))`` using the scratch array ``tmp`` (same shape)."""
    np.negative(h, out=tmp)
    np.exp(tmp, out=tmp)
    tmp += 1.0
    np.divide(h, tmp, out=h)


class GraphedStep:
    """``step_fn(src, idx) -> stats row`` (losses, backward, optimiser step) captured as one CUDA graph.

    Static device tensors hold the batch ``src`` (refilled with ``copy_`` at every update), the
    minibatch indices of every step of the update (``steps x mb``), a step counter and a
    ``(steps, k)`` statistics table. One replay gathers the indices in row ``counter``, runs
    ``step_fn`` and writes its statistics into that row. The learning rate lives in a device tensor
    the optimiser reads inside the graph. The graph reads parameters, gradients and optimiser
    moments at fixed addresses: rebuild it when the optimiser state is replaced.
    """

    def __init__(self, step_fn: Callable, src: dict, steps: int, mb: int, n_stats: int, optimizer, key: tuple):
        dev = next(iter(src.values())).device
        self.step_fn, self.optimizer, self.key = step_fn, optimizer, key
        self.params = [p for g in optimizer.param_groups for p in g["params"]]
        self.src = {k: torch.empty_like(v) for k, v in src.items()}
        self.idx = torch.zeros(steps, mb, dtype=torch.long, device=dev)
        self.counter = torch.zeros(1, dtype=torch.long, device=dev)
        self.stats = torch.zeros(steps, n_stats, device=dev)
        self.lr = torch.tensor(float(optimizer.param_groups[0]["lr"]), dtype=torch.float32, device=dev)
        self.graph: torch.cuda.CUDAGraph | None = None

    def _step(self) -> None:
        idx = self.idx.index_select(0, self.counter).view(-1)
        row = self.step_fn(self.src, idx)
        self.stats.index_copy_(0, self.counter, row.unsqueeze(0))
        self.counter.add_(1)

    def capture(self) -> None:
        """Warm up on a side stream, capture one step, and restore every tensor the warm-up touched
        (parameters and optimiser moments, in place), so capturing leaves training state unchanged."""
        opt, params, dev = self.optimizer, self.params, self.idx.device
        if len(opt.param_groups) != 1:
            raise ValueError(f"{len(opt.param_groups)} optimiser param groups; the CUDA graph update expects 1")
        group = opt.param_groups[0]
        with torch.no_grad():
            saved_params = [p.detach().clone() for p in params]
            saved_moments = {p: {k: v.clone() for k, v in opt.state[p].items()} for p in params if opt.state.get(p)}
        lr, capturable = group["lr"], group["capturable"]
        group["lr"], group["capturable"] = self.lr, True  # a tensor lr and a capture-safe step
        try:
            side = torch.cuda.Stream(device=dev)
            side.wait_stream(torch.cuda.current_stream(dev))
            with torch.cuda.stream(side), warnings.catch_warnings():
                warnings.simplefilter("ignore")  # "capturable=True but step() runs without capture"
                for _ in range(3):
                    self.counter.zero_()
                    self._step()
            torch.cuda.current_stream(dev).wait_stream(side)
            opt.zero_grad(set_to_none=True)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                self._step()
            self.graph = graph
        finally:
            group["lr"], group["capturable"] = lr, capturable
            with torch.no_grad():
                for p, v in zip(params, saved_params):
                    p.copy_(v)
                for p in params:
                    for k, v in opt.state.get(p, {}).items():
                        if p in saved_moments:
                            v.copy_(saved_moments[p][k])
                        elif torch.is_tensor(v):
                            v.zero_()
            self.counter.zero_()

    def run(self, src: dict, perms: list[torch.Tensor]) -> torch.Tensor:
        """Copy the batch and the minibatch indices in, replay one step per row; return the stats table."""
        steps, mb = self.idx.shape
        per_epoch = steps // len(perms)
        for k, v in src.items():
            self.src[k].copy_(v)
        for e, perm in enumerate(perms):
            self.idx[e * per_epoch : (e + 1) * per_epoch].copy_(perm[: per_epoch * mb].view(per_epoch, mb))
        self.lr.fill_(float(self.optimizer.param_groups[0]["lr"]))
        if self.graph is None:
            self.capture()
        self.counter.zero_()
        for _ in range(steps):
            self.graph.replay()
        return self.stats


class GraphedCall:
    """``fn()``, a function without arguments that reads and writes fixed tensors in place (its
    inputs are copied in, its outputs read, at the same addresses every time), captured once as a
    CUDA graph and replayed by each call.

    Capturing runs ``fn`` for real on a side stream first (lazy cuBLAS set-up must not happen inside
    a capture); every tensor ``touched()`` lists is restored afterwards, so capturing changes nothing.
    """

    def __init__(self, fn: Callable[[], None], touched: Callable[[], list]):
        self.fn, self.touched, self.graph = fn, touched, None

    def __call__(self) -> None:
        if self.graph is None:
            tensors = [t for t in self.touched() if torch.is_tensor(t)]
            saved = [t.clone() for t in tensors]
            dev = tensors[0].device
            side = torch.cuda.Stream(device=dev)
            side.wait_stream(torch.cuda.current_stream(dev))
            with torch.cuda.stream(side):
                self.fn()
            torch.cuda.current_stream(dev).wait_stream(side)
            for t, v in zip(tensors, saved):
                t.copy_(v)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):  # recorded, not run
                self.fn()
            self.graph = graph
        self.graph.replay()


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


def fused_supported(actor: nn.Module) -> bool:
    """Whether ``--fused`` uses the Triton kernels of ``fpo_utils.flow_triton`` for this flow actor: Triton
    is installed, SiLU activations, at least one hidden layer, width 16 or 32. The kernels compute any
    power-of-two width but keep whole (64 x width) tiles in registers; they were measured faster than
    torch at width 32 (the fpo preset), while a width-64 run with them (and compiled losses) updated 6x
    slower for a reason not isolated (benchmarks/robot_results/README.md), so wider actors keep torch's path."""
    import importlib.util

    lin = [m for m in actor.net if isinstance(m, nn.Linear)]
    h = lin[0].out_features
    return (
        importlib.util.find_spec("triton") is not None
        and len(lin) >= 3
        and h in (16, 32)
        and all(isinstance(m, nn.SiLU) for m in actor.net if not isinstance(m, nn.Linear))
        and all(m.in_features == m.out_features == h for m in lin[1:-1])
    )


def fused_forward(actor: nn.Module, wanted: bool):
    """``flow_triton.actor_forward`` (``(actor, obs, x_t, t) -> v``) if ``wanted`` and the actor is
    supported, else None (the actor's own forward)."""
    if not (wanted and fused_supported(actor)):
        return None
    from fpo_utils.flow_triton import actor_forward

    return actor_forward


def pick_sampler(actor: nn.Module, device: torch.device, graphs: bool, in_graph: bool, fused: bool):
    """The Euler sampler ``(obs, x0, steps) -> x`` for ``actor``, chosen once: :class:`NumpySampler` on
    the CPU; on CUDA the Triton ``FusedSampler`` if ``fused`` and it applies, else ``actor.sample``
    inside a captured rollout step (``in_graph``) or :class:`GraphedSampler` on its own (with graphs)."""
    if device.type != "cuda":
        return NumpySampler(actor)
    if fused and fused_supported(actor):
        from fpo_utils.flow_triton import FusedSampler

        return FusedSampler(actor)
    return GraphedSampler(actor) if graphs and not in_graph else actor.sample


def unrolls(a: torch.Tensor, T: int, k: int) -> torch.Tensor:
    """Rows (T * n, ...) in time-major order -> (n * T / k, k, ...): unrolls of k steps of one environment."""
    a = a.reshape(T // k, k, -1, *a.shape[1:])
    return a.movedim(2, 0).reshape(-1, k, *a.shape[3:])


def chunks(n: int, size: int = 65536) -> list[slice]:
    """Row slices for no-grad passes over a whole batch (983,040 rows x draws at the fpo preset)."""
    return [slice(i, min(i + size, n)) for i in range(0, n, size)]


ENV_OUT = ("obs_in", "final_in", "rew_in", "term_in", "trunc_in", "ep_ret_in", "ep_len_in")  # views of "env_in"


def rollout_tensors(n: int, T: int, o: int, d: int, dev) -> dict:
    """The fixed tensors of a rollout of T steps of n environments (obs o, action d), for robot_fpo.py.
    ``env_in`` takes a step's outputs (``envs.step_into``); the ENV_OUT entries are its parts."""
    z = lambda *shape, dtype=torch.float32: torch.zeros(*shape, dtype=dtype, device=dev)  # noqa: E731
    env_in = z(env_out_size(n, o))
    return {
        "obs": z(T, n, o),
        "final": z(T, n, o),
        "x": z(T, n, d),
        "rew": z(T, n),
        "term": z(T, n),
        "trunc": z(T, n),
        "noise": z(T, n, d),
        "act_noise": z(T, n, d),
        "action": z(n, d),
        "ret_acc": z(n, dtype=torch.float64),
        "ep": z(3, dtype=torch.float64),
        "k": z(1, dtype=torch.long),
        "env_in": env_in,
        **dict(zip(ENV_OUT, env_out_views(env_in, n, o))),
    }
