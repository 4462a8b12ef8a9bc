"""The image trainer's fast mode (``--compile``), chosen once when a run is built.

`choose` returns the objects the training loop calls, so the loop itself has no fast/slow branches:

* ``fwd``: the network as the loss calls it (``torch.compile`` with ``compile``);
* ``sampler(latents)``: the trainer's Euler sampler in evaluation mode with the current parameters,
  replayed as one CUDA graph per batch size with ``compile`` on CUDA;
* ``fused_adam``: one kernel for the whole Adam step (CUDA with ``compile``).

This module computes nothing of its own: it receives the sampler it speeds up,
``sample(net, latents, steps, convention, autocast)`` (``cifar_fpo.sample_images``), so editing the
trainer's sampler changes what both paths run. Without ``compile`` it returns the network and that
sampler as they are.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Callable, Dict, Tuple

import torch
import torch.nn as nn

Sample = Callable[..., torch.Tensor]  # sample(net, latents, steps, convention, autocast) -> images


@contextlib.contextmanager
def eval_mode(net: nn.Module):
    """Evaluation mode inside the block, the previous mode afterwards."""
    was_training = net.training
    net.eval()
    try:
        yield net
    finally:
        net.train(was_training)


def eval_sampler(sample: Sample, fwd, net: nn.Module, steps: int, convention: str, autocast=None):
    """`sample` as a closure over the network that samples in evaluation mode (CPU or uncaptured CUDA)."""

    @torch.no_grad()
    def sampler(latents: torch.Tensor) -> torch.Tensor:
        with eval_mode(net):
            return sample(fwd, latents, steps, convention, autocast)

    return sampler


class GraphSampler:
    """`sample` for a fixed network, captured once per batch size as a CUDA graph and replayed.

    All Euler steps become one graph launch, so a small batch no longer waits on the CPU to launch
    hundreds of kernels per step. The graph reads the network's parameters in place and therefore
    follows every optimiser step (parameters must keep their storage: `load_state_dict` and in-place
    optimisers do). Sampling runs in evaluation mode; outputs are copied out of the graph's buffers.
    `fwd` is the module to call (e.g. the compiled network), `net` the module whose mode is switched.
    """

    def __init__(
        self, sample: Sample, fwd, net: nn.Module, steps: int, convention: str, autocast=None, warmup: int = 2
    ):
        self.sample, self.fwd, self.net, self.steps = sample, fwd, net, steps
        self.convention, self.autocast, self.warmup = convention, autocast, warmup
        self.graphs: Dict[Tuple[int, ...], Tuple[Any, torch.Tensor, torch.Tensor]] = {}

    def _run(self, latents: torch.Tensor) -> torch.Tensor:
        return self.sample(self.fwd, latents, self.steps, self.convention, self.autocast)

    def _capture(self, latents: torch.Tensor):
        static_in = latents.clone()
        side = torch.cuda.Stream(latents.device)
        side.wait_stream(torch.cuda.current_stream(latents.device))
        with torch.cuda.stream(side):  # warm-up (compiles) outside the capture
            for _ in range(self.warmup):
                self._run(static_in)
        torch.cuda.current_stream(latents.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_out = self._run(static_in)
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


@dataclass
class FastPaths:
    fwd: nn.Module
    sampler: Callable[[torch.Tensor], torch.Tensor]
    fused_adam: bool


def choose(
    net: nn.Module,
    device: torch.device,
    sample: Sample,
    *,
    compile: bool,
    steps: int,
    convention: str,
    autocast=None,
) -> FastPaths:
    """Pick the objects the loop calls (see the module docstring); also sets cuDNN autotuning with
    `compile` (shapes are fixed in a run, so timing the algorithms once per shape pays off)."""
    torch.backends.cudnn.benchmark = bool(compile)
    cuda_fast = bool(compile and device.type == "cuda")
    fwd = torch.compile(net, dynamic=False) if compile else net
    sampler = (
        GraphSampler(sample, fwd, net, steps, convention, autocast)
        if cuda_fast
        else eval_sampler(sample, fwd, net, steps, convention, autocast)
    )
    return FastPaths(fwd=fwd, sampler=sampler, fused_adam=cuda_fast)
