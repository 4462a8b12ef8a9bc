"""Device and speed settings of the image trainer, chosen once when a run is built.

`choose` returns the objects the training loop calls, so the loop itself has no fast/slow branches:

* ``fwd``: the network as the hot path calls it (``torch.compile`` with ``--compile``);
* ``sampler(latents)``: the Euler sampler in evaluation mode with the current parameters, replayed
  as one CUDA graph per batch size with ``--compile`` on CUDA;
* ``old_losses``: step 2 (``sync``, theta_old <- sg(theta)) and step 5 (the old losses) of
  Algorithm 1, either on a frozen copy (as written) or taken from the current forward, detached
  (``--reuse-old-losses``; exact with one gradient step per rollout);
* ``fused_adam``: one kernel for the whole Adam step (CUDA with ``--compile``).

The default (FP32, no compile, frozen copy) is Algorithm 1 exactly as written.
"""

from __future__ import annotations

import contextlib
import copy
from dataclasses import dataclass
from typing import Any, Callable, Dict, Tuple

import torch
import torch.nn as nn

from fpo_utils.unet import sample_images, velocity_losses

def eval_mode(net: nn.Module):
    """Evaluation mode inside the block, the previous mode afterwards."""
    was_training = net.training
    net.eval()
    try:
        yield net
    finally:
        net.train(was_training)


def eval_sampler(fwd, net: nn.Module, steps: int, convention: str, autocast=None):
    """A plain `sample_images` closure that samples in evaluation mode (CPU or uncaptured CUDA)."""

    @torch.no_grad()
    def sample(latents: torch.Tensor) -> torch.Tensor:
        with eval_mode(net):
            return sample_images(fwd, latents, steps, convention, autocast)

    return sample


class GraphSampler:
    """`sample_images` for a fixed network, captured once per batch size as a CUDA graph and replayed.

    All Euler steps become one graph launch, so a small batch no longer waits on the CPU to launch
    hundreds of kernels per step. The graph reads the network's parameters in place and therefore
    follows every optimiser step (parameters must keep their storage: `load_state_dict` and in-place
    optimisers do). Sampling runs in evaluation mode; outputs are copied out of the graph's buffers.
    `fwd` is the module to call (e.g. the compiled network), `net` the module whose mode is switched.
    """

    def __init__(self, fwd, net: nn.Module, steps: int, convention: str, autocast=None, warmup: int = 2):
        self.fwd, self.net, self.steps, self.convention, self.autocast = fwd, net, steps, convention, autocast
        self.warmup = warmup
        self.graphs: Dict[Tuple[int, ...], Tuple[Any, torch.Tensor, torch.Tensor]] = {}

    def _capture(self, latents: torch.Tensor):
        static_in = latents.clone()
        side = torch.cuda.Stream(latents.device)
        side.wait_stream(torch.cuda.current_stream(latents.device))
        with torch.cuda.stream(side):  # warm-up (compiles) outside the capture
            for _ in range(self.warmup):
                sample_images(self.fwd, static_in, self.steps, self.convention, self.autocast)
        torch.cuda.current_stream(latents.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_out = sample_images(self.fwd, static_in, self.steps, self.convention, self.autocast)
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


class FrozenCopyLosses:
    """Algorithm 1 as written: `sync()` copies theta into a frozen evaluation-mode copy theta_old
    (step 2); calling it computes the old losses on that copy without gradients (step 5)."""

    def __init__(self, net: nn.Module, convention: str, autocast=None):
        self.net = copy.deepcopy(net).eval().requires_grad_(False)
        self.source, self.convention, self.autocast = net, convention, autocast

    def sync(self):
        self.net.load_state_dict(self.source.state_dict())

    @torch.no_grad()
    def __call__(self, l_new: torch.Tensor, x, t, eps) -> torch.Tensor:
        return velocity_losses(self.net, x, t, eps, self.convention, self.autocast)


class ReusedLosses:
    """The old losses taken from the current forward, detached: nothing changes theta between step 2
    and the old losses, so theta_old = theta and the values are the same, without 4n extra forwards."""

    def sync(self):
        pass

    def __call__(self, l_new: torch.Tensor, x, t, eps) -> torch.Tensor:
        return l_new.detach()


@dataclass
class FastPaths:
    fwd: nn.Module
    sampler: Callable[[torch.Tensor], torch.Tensor]
    old_losses: Any  # FrozenCopyLosses | ReusedLosses
    fused_adam: bool


def choose(
    net: nn.Module,
    device: torch.device,
    *,
    compile: bool,
    reuse_old_losses: bool,
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
        GraphSampler(fwd, net, steps, convention, autocast)
        if cuda_fast
        else eval_sampler(fwd, net, steps, convention, autocast)
    )
    old = ReusedLosses() if reuse_old_losses else FrozenCopyLosses(net, convention, autocast)
    return FastPaths(fwd=fwd, sampler=sampler, old_losses=old, fused_adam=cuda_fast)
