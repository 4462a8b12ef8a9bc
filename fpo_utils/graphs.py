"""CUDA-graph pieces of the robot trainer's fast variant, and the fixed-address tensors they read and write.

* :class:`GraphedCall`: a function of fixed tensors (a rollout step's policy half or bookkeeping half) captured
  once as a CUDA graph and replayed.
* :class:`GraphedStep`: one minibatch step of the update (gather, losses, backward, gradient clip, fused optimiser
  step) captured once as a CUDA graph and replayed for every minibatch.
* :func:`rollout_tensors`: a rollout's buffers, allocated once, so a captured step finds them at the same
  addresses every time (``ENV_OUT``: the views of one environment step's flat output).
"""

from __future__ import annotations

import warnings
from typing import Callable

import torch

from fpo_utils.env_layout import env_out_size, env_out_views


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
