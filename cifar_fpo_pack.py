"""K image runs trained together: Algorithm 1 of cifar_fpo.py with a leading run axis on every tensor.

A variant of its reference: it imports cifar_fpo.py's pieces and swaps the update's tensors for batched
ones; nothing in cifar_fpo.py or fpo_utils/ imports it (halving.py's `cifar-grid --pack` does).

One update of a small run (the shipped 4.2M-parameter generator at batch 64) issues thousands of small
kernels. A pack trains K runs in one process on one device and issues each kernel once for all of
them: the K networks' parameters are stacked, (K, *shape), and the single-run functions
(`sample_images`, `velocity_losses`, `fpo_loss`, `update_values`) are mapped over the run axis with
`torch.func.vmap` through `torch.func.functional_call`. What that gains depends on the batched
kernels (benchmarks/README.md, "Packed runs": in FP32 on an H100, nothing yet).

A packed run computes what it computes alone, to float32 rounding (a batched kernel may add in
another order), because everything that makes a run itself stays per run:

* randomness: every draw comes from the run's own generators `make_generator(seed, purpose, k)`, drawn
  on the CPU in the single-run order (rollout latents; times, then noises; the fit batch);
* the weighting rule (q_k, a_k, coherence fits), the validation latents and history, the stopping
  rule, the update counter, checkpoints, metrics rows and the run folder, written by the same code as
  `cifar_fpo.train` (`record_validation`, `update_row`, `summary`), so checkpoints resume either way;
* Adam moments and step counts, the gradient-norm clip on each run's own global norm, and the check
  for non-finite values.

Runs may differ in everything the host decides for a run (seed, reward, weighting and its settings,
budget and `until`, stopping rule, checkpoint cadence, folder) and may sit at different updates; they
must share `SHARED`. A run leaves the pack when it ends (budget, `until`, stopping rule, non-finite
value, Ctrl-C) with its final checkpoint and summary written; the others go on as a smaller pack.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import os
import sys
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
from torch.func import functional_call, vmap
from torch.nn.attention import SDPBackend, sdpa_kernel

import cifar_fpo
from cifar_fpo import Args, Run, make_generator, sample_images, velocity_losses
from fpo_utils.cifar_graphs import eval_mode
from fpo_utils.devices import autocast_ctx, pick_device
from fpo_utils.runfolder import RunFolder
from fpo_utils.unet import velocity
from weighting import coherence_moments, draw_multipliers

# Settings every run of a pack shares: the shapes of the batched tensors and the constants applied to
# all runs at once. Everything else may differ from run to run.
SHARED = (
    "model",
    "convention",
    "device",
    "precision",
    "compile",
    "reuse_old_losses",
    "batch_size",
    "group_size",
    "mc_draws",
    "sample_steps",
    "learning_rate",
    "adam_betas",
    "adam_eps",
    "max_grad_norm",
    "clip_ratio",
    "log_ratio_clip",
    "adv_eps",
    "bins",
    "coherence_draws",
    "fit_batch_size",
    "val_every",
    "val_banks",
    "val_bank_size",
)
SHAPE = (3, 32, 32)
# Images (samples x draws) per chunk of the loss's forward and backward pass: the paper configuration's
# 64 x 4 per run gives 8 runs a chunk, about 32 GB of activations in FP32 for the shipped generator.
LOSS_IMAGES = 2048
# Images (bins x fit batch x draws, for every fitting run) per network call of a coherence fit, which
# needs no backward pass: the twelve bins of one paper-configuration run (12 x 64 x 4) in one call.
FIT_IMAGES = 3072


def check_packable(args_list: Sequence[Args]) -> None:
    """Raise a one-line ValueError unless the (resolved) runs can share one pack: the `SHARED` settings
    agree, the run names differ, and the precision can be packed on the device."""
    first = args_list[0]
    for args in args_list[1:]:
        diff = [
            f"{k}: {getattr(first, k)!r} vs {getattr(args, k)!r}"
            for k in SHARED
            if getattr(first, k) != getattr(args, k)
        ]
        if diff:
            raise ValueError(f"runs {first.run_name} and {args.run_name} cannot share a pack: {'; '.join(diff)}")
    names = [a.run_name for a in args_list]
    if len(set(names)) != len(names):
        raise ValueError(f"runs of a pack need distinct run names, got {names}")
    if first.precision == "bf16" and pick_device(first.device).type == "cuda":
        raise ValueError(
            "--precision bf16 cannot be packed on CUDA (the mapped attention's softmax backward refuses "
            "mixed bf16/FP32 gradients); use fp32 or tf32"
        )


def groups(args_list: Sequence[Args], size: int) -> List[List[int]]:
    """Indices of `args_list` in packs of at most `size` runs that share the `SHARED` settings, in order."""
    by_key: Dict[str, List[int]] = {}
    for i, args in enumerate(args_list):
        resolved = cifar_fpo.resolve_args(args)
        by_key.setdefault(repr([getattr(resolved, k) for k in SHARED]), []).append(i)
    return [ids[s : s + size] for ids in by_key.values() for s in range(0, len(ids), size)]


# ---------------------------------------------------------------------------------------------------
# The pack: stacked networks, Adam, and the runs' own bookkeeping
# ---------------------------------------------------------------------------------------------------
class Pack:
    """The runs of a pack in slot order, with their networks stacked along a leading run axis.

    Slot s holds `runs[s]`, `folders[s]` and row s of every stacked tensor. The parameters of all runs
    live in one (K, N) buffer `flat`; `params[name]` is its (K, *shape) view for one tensor of the
    network (a leaf of autograd), and its gradient is the matching view of `grad`, so the gradient
    clip and the Adam step are a few operations on whole buffers. `keep` drops the slots of runs that
    ended.
    """

    def __init__(self, runs: List[Run], folders: List[RunFolder]):
        net = runs[0].net
        if any(isinstance(m, torch.nn.Dropout) and m.p > 0 for m in net.modules()):
            raise ValueError("a pack needs a network without dropout (its masks would come from the global RNG)")
        if len(list(net.buffers())):
            raise ValueError("a pack needs a network without buffers; this one has some")
        self.runs, self.folders = list(runs), list(folders)
        self.args, self.device = runs[0].args, runs[0].device
        self.convention, self.autocast = runs[0].convention, runs[0].autocast
        self.template = copy.deepcopy(net).to("meta")  # functional_call's module: the structure, no values
        if not group_norm_maps(self.device):
            for m in self.template.modules():
                if type(m) is torch.nn.GroupNorm:
                    m.__class__ = WrittenOutGroupNorm
        self.shapes = {name: p.shape for name, p in net.named_parameters()}
        self.flat = torch.stack([flatten(r.net.parameters()) for r in runs])
        moments = [adam_moments(r.optimizer, r.net) for r in runs]
        self.exp_avg = torch.stack([m[0] for m in moments])
        self.exp_avg_sq = torch.stack([m[1] for m in moments])
        self.steps = np.array([m[2] for m in moments], dtype=np.float64)
        self.param_groups = [r.optimizer.state_dict()["param_groups"] for r in runs]
        self.val_latents = torch.stack([r.val_latents for r in runs])
        self.staging: Dict[str, torch.Tensor] = {}
        for r in runs:  # the pack holds the networks and Adam now
            r.net = r.fwd = r.old_net = r.sampler = r.optimizer = r.val_latents = None
        self._views()

    def _views(self):
        k = self.flat.shape[0]
        self.grad = torch.zeros_like(self.flat)
        self.params, at = {}, 0
        for name, shape in self.shapes.items():
            n = shape.numel()
            p = self.flat[:, at : at + n].view(k, *shape).requires_grad_(True)
            p.grad = self.grad[:, at : at + n].view(k, *shape)
            self.params[name], at = p, at + n

    def keep(self, slots: List[int]):
        """Keep only these slots (runs that ended leave the pack)."""
        if slots == list(range(len(self.runs))):
            return
        idx = torch.tensor(slots, dtype=torch.long, device=self.device)
        self.flat, self.exp_avg, self.exp_avg_sq = (t[idx] for t in (self.flat, self.exp_avg, self.exp_avg_sq))
        self.val_latents, self.steps = self.val_latents[idx], self.steps[slots]
        self.runs, self.folders, self.param_groups = (
            [xs[s] for s in slots] for xs in (self.runs, self.folders, self.param_groups)
        )
        self._views()

    # --- the network, one run's parameters at a time inside vmap ----------------------------------
    def _net(self, params):
        return lambda x, timestep: functional_call(self.template, params, (x, timestep))

    def vmap(self, fn, *args, differentiable: bool = False):
        """`fn` mapped over the run axis of every argument. Attention takes PyTorch's math kernel where
        the fused ones do not serve a mapped batch: on the CPU (no batched form) and under autograd
        (on CUDA the fused backward refuses the stride of a mapped batch's log-sum-exp)."""
        math_attention = differentiable or self.device.type == "cpu"
        with sdpa_kernel(SDPBackend.MATH) if math_attention else contextlib.nullcontext():
            return vmap(fn)(*args)

    def subset(self, slots: List[int]) -> Dict[str, torch.Tensor]:
        idx = torch.tensor(slots, dtype=torch.long, device=self.device)
        return {name: p.detach()[idx] for name, p in self.params.items()}

    @torch.no_grad()
    def sample(self, latents: torch.Tensor, params=None) -> torch.Tensor:
        """`sample_images` for every run: latents (K, n, 3, 32, 32) -> images of that shape."""
        steps, conv, autocast = self.args.sample_steps, self.convention, self.autocast
        with eval_mode(self.template):
            fn = lambda p, z: sample_images(self._net(p), z, steps, conv, autocast)  # noqa: E731
            return self.vmap(fn, self.params if params is None else params, latents)

    def losses(self, params, x, t, eps) -> torch.Tensor:
        """`velocity_losses` for every run: endpoints (K, n, ...), times (K, n, M), noises (K, n, M, ...)."""
        conv, autocast = self.convention, self.autocast
        fn = lambda p, x, t, e: velocity_losses(self._net(p), x, t, e, conv, autocast)  # noqa: E731
        return self.vmap(fn, params, x, t, eps, differentiable=True)

    # --- steps 6-8 per run: losses, objective, gradient; clip and Adam (torch.optim.Adam's arithmetic) -
    def objective(self, x, t, eps, adv, mult) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Each run's current and old losses on the same endpoints, times and noises, its clipped
        objective (`cifar_fpo.fpo_loss`) and that objective's gradient, left in `grad`. Runs go through
        in chunks of at most LOSS_IMAGES images, so the activations kept for the backward pass do not
        grow with K. Returns the objectives (K,), ratios (K, n) and current losses (K, n, M), detached."""
        args, k, n, m = self.args, *t.shape
        size = max(1, LOSS_IMAGES // (n * m))
        self.grad.zero_()
        out = []
        for a in range(0, k, size):
            runs = slice(a, a + size)
            params = self.params if size >= k else {name: p[runs] for name, p in self.params.items()}
            l_new = self.losses(params, x[runs], t[runs], eps[runs])
            if args.reuse_old_losses:
                l_old = l_new.detach()
            else:
                with torch.no_grad():
                    l_old = self.losses(params, x[runs], t[runs], eps[runs])
            loss, ratio = vmap(cifar_fpo.fpo_loss, in_dims=(0, 0, 0, 0, None, None))(
                l_old, l_new, adv[runs], mult[runs], args.clip_ratio, args.log_ratio_clip
            )
            with warnings.catch_warnings():  # the gradients are strided views of one buffer on purpose
                warnings.filterwarnings("ignore", message="grad and param do not obey the gradient layout contract")
                loss.sum().backward()  # each run's objective depends on its own parameters only
            out.append((loss.detach(), ratio.detach(), l_new.detach()))
        loss, ratio, l_new = (torch.cat(parts) for parts in zip(*out))
        return loss, ratio, l_new

    @torch.no_grad()
    def clip_grad_norm_(self, max_norm: float) -> torch.Tensor:
        """`torch.nn.utils.clip_grad_norm_` on each run's gradients; returns the K norms before clipping."""
        norms = torch.linalg.vector_norm(self.grad, dim=1)
        self.grad.mul_((max_norm / (norms + 1e-6)).clamp(max=1.0)[:, None])
        return norms

    @torch.no_grad()
    def adam_step(self):
        """One step of `torch.optim.Adam` (no weight decay) for every run, each with its own step count."""
        (b1, b2), lr, eps = self.args.adam_betas, self.args.learning_rate, self.args.adam_eps
        self.steps += 1
        self.exp_avg.lerp_(self.grad, 1 - b1)
        self.exp_avg_sq.mul_(b2).addcmul_(self.grad, self.grad, value=1 - b2)
        step_size = self._column(lr / (1 - b1**self.steps))
        denom = (self.exp_avg_sq.sqrt() / self._column(np.sqrt(1 - b2**self.steps))).add_(eps)
        self.flat.addcdiv_(self.exp_avg * -step_size, denom)

    def stage(self, name: str, tensors: List[torch.Tensor]) -> torch.Tensor:
        """The runs' CPU tensors stacked on the device. On CUDA they are stacked straight into a
        page-locked buffer kept for the next update (the update's host sync comes before that) and
        copied without blocking the host."""
        if self.device.type != "cuda":
            return torch.stack(tensors).to(self.device)
        shape = (len(tensors), *tensors[0].shape)
        if name not in self.staging or self.staging[name].shape != shape:
            self.staging[name] = torch.empty(shape, dtype=tensors[0].dtype, pin_memory=True)
        return torch.stack(tensors, out=self.staging[name]).to(self.device, non_blocking=True)

    def _column(self, values: np.ndarray) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.float32).view(-1, 1).to(self.device)

    # --- one run's state as `cifar_fpo.checkpoint` saves it ----------------------------------------
    def checkpoint(self, s: int):
        run, at, model, state = self.runs[s], 0, {}, {}
        for j, (name, shape) in enumerate(self.shapes.items()):
            n = shape.numel()
            model[name] = self.flat[s, at : at + n].view(shape).clone()
            if self.steps[s] > 0:  # torch's Adam holds no state before its first step
                m, v = (t[s, at : at + n].view(shape).clone() for t in (self.exp_avg, self.exp_avg_sq))
                state[j] = {"step": torch.tensor(float(self.steps[s])), "exp_avg": m, "exp_avg_sq": v}
            at += n
        optimizer = {"state": state, "param_groups": copy.deepcopy(self.param_groups[s])}
        parts = {"model": model, "optimizer": optimizer, "weighting": run.rule.state_dict()}
        self.folders[s].save_checkpoint({"k": run.k, **parts, "history": run.history, "status": run.status})


class WrittenOutGroupNorm(torch.nn.GroupNorm):
    """GroupNorm in elementary operations, for a device whose group_norm kernel vmap cannot map (the CPU
    kernel of PyTorch 2.11: "NYI: querying is_contiguous inside of vmap ..."; 2.13 maps it)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        g = x.reshape(x.shape[0], self.num_groups, -1)
        mean, var = g.mean(-1, keepdim=True), g.var(-1, unbiased=False, keepdim=True)
        y = ((g - mean) * torch.rsqrt(var + self.eps)).reshape(x.shape)
        shape = (1, -1) + (1,) * (x.dim() - 2)
        return y * self.weight.view(shape) + self.bias.view(shape)


@functools.lru_cache(maxsize=None)
def group_norm_maps(device: torch.device) -> bool:
    """Whether vmap maps torch's group_norm on this device as a pack calls it: 3-d and 4-d inputs per run, with
    each run's weight and bias, laid out channels-last as the CPU's convolutions return them (PyTorch 2.11's
    CPU kernel then asks for the layout, which vmap cannot answer), without and with autograd."""
    norm = torch.nn.functional.group_norm
    try:
        for shape in ((2, 2, 8, 16), (2, 2, 8, 4, 4)):
            last = (0, 1, *range(3, len(shape)), 2)  # channels last in memory, same logical shape
            x = torch.randn([shape[i] for i in last], device=device).permute(*torch.argsort(torch.tensor(last)))
            w = torch.ones(shape[0], shape[2], device=device, requires_grad=True)
            with torch.no_grad():
                vmap(lambda x, w, b: norm(x, 4, w, b))(x, w, w)
            vmap(lambda x, w, b: norm(x, 4, w, b))(x, w, w).sum().backward()
    except RuntimeError:
        return False
    return True


@functools.lru_cache(maxsize=None)
def _threads() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1))


def per_run(fn, items: list) -> list:
    """[fn(item) for item in items] on a few CPU threads (torch's random functions release the GIL).
    Each run draws from its own generators, so the order in which the runs are served changes nothing."""
    return list(_threads().map(fn, items))


def flatten(tensors) -> torch.Tensor:
    return torch.cat([t.detach().reshape(-1) for t in tensors])


def adam_moments(optimizer: torch.optim.Optimizer, net: torch.nn.Module) -> Tuple[torch.Tensor, torch.Tensor, float]:
    """A run's Adam state as flat moments and its step count (zeros and 0 before its first step)."""
    params = list(net.parameters())
    states = [optimizer.state.get(p, {}) for p in params]
    if not states[0]:
        zeros = torch.zeros_like(flatten(params))
        return zeros, zeros.clone(), 0.0
    m = flatten(s["exp_avg"] for s in states)
    v = flatten(s["exp_avg_sq"] for s in states)
    return m, v, float(states[0]["step"])


# ---------------------------------------------------------------------------------------------------
# Rewards, validation and coherence fits for every run at once
# ---------------------------------------------------------------------------------------------------
def score(runs: List[Run], x: torch.Tensor) -> torch.Tensor:
    """Rewards (K, n) of the runs' images (K, n, 3, 32, 32): one call per distinct reward (each image
    is scored on its own, so batching images of several runs does not change their rewards)."""
    out = torch.empty(x.shape[:2], device=x.device)
    by_reward: Dict[str, List[int]] = {}
    for s, run in enumerate(runs):
        a = run.args
        key = repr((a.reward, a.classifier_path, a.simclr_path, a.clip_model, a.clip_pretrained))
        by_reward.setdefault(key, []).append(s)
    with torch.no_grad():
        for slots in by_reward.values():
            idx = torch.tensor(slots, dtype=torch.long, device=x.device)
            out[idx] = runs[slots[0]].reward_fn(x[idx].flatten(0, 1)).float().view(len(slots), -1)
    return out


@torch.no_grad()
def validate(pack: Pack, chunk: int = 128) -> Tuple[List[float], torch.Tensor, List[Dict[str, float]]]:
    """`cifar_fpo.validate` for every run: its validation latents in the same 128-image chunks; returns
    each run's mean reward, its first 64 images and the sample diversity of its own images (the
    diversity models are the same for every run: one call per chunk for all runs)."""
    rewards, images, feats = [], None, []
    diversity = pack.runs[0].diversity
    for s in range(0, pack.val_latents.shape[1], chunk):
        x = pack.sample(pack.val_latents[:, s : s + chunk])
        rewards.append(score(pack.runs, x).cpu())
        if diversity is not None:
            f, c = (t.cpu().unflatten(0, x.shape[:2]) for t in diversity(x.flatten(0, 1)))
            feats.append((f, c))
        if images is None:
            images = x[:, :64].cpu()
    rows = [cifar_fpo.diversity_row([(f[j], c[j]) for f, c in feats]) for j in range(len(pack.runs))]
    return [float(r.mean()) for r in torch.cat(rewards, dim=1)], images, rows


@torch.no_grad()
def fit_coherence(pack: Pack, slots: List[int]) -> List[Tuple[np.ndarray, np.ndarray, float]]:
    """`cifar_fpo.fit_coherence` after update k for the runs in `slots` at once, each drawing from its
    own generator (seed, "fit", k + 1) in the single-run order: latents, then per bin times and noises.
    The bins go through the network together, up to FIT_IMAGES images per call, and their moments are
    reduced on the device (in float64, as alone)."""
    args, device, runs = pack.args, pack.device, [pack.runs[s] for s in slots]
    n, m, bins, k = args.fit_batch_size, args.coherence_draws, args.bins, len(slots)
    gens = [make_generator(r.args.seed, "fit", r.k + 1) for r in runs]
    params = pack.subset(slots)
    x = pack.sample(torch.stack([torch.randn((n, *SHAPE), generator=g) for g in gens]).to(device), params)
    rewards = score(runs, x)
    adv = cifar_fpo.group_advantages(rewards.view(-1), args.group_size, args.adv_eps).view(k, 1, n, 1, 1, 1, 1)

    def bin_draws(g: torch.Generator) -> Tuple[torch.Tensor, torch.Tensor]:
        ts, noises = [], []
        for b in range(bins):
            ts.append(((b + torch.rand((n, m), generator=g)) / bins).float())
            noises.append(torch.randn((n, m, *SHAPE), generator=g))
        return torch.stack(ts), torch.stack(noises)

    draws = per_run(bin_draws, gens)
    per_call = max(1, FIT_IMAGES // (k * n * m))
    us, vs = [], []
    fn = lambda p, a, b: velocity(pack._net(p), a, b, pack.convention)  # noqa: E731
    for b0 in range(0, bins, per_call):
        t = torch.stack([d[0][b0 : b0 + per_call] for d in draws]).to(device)  # (k, nb, n, m)
        eps = torch.stack([d[1][b0 : b0 + per_call] for d in draws]).to(device)  # (k, nb, n, m, 3, 32, 32)
        nb = t.shape[1]
        xe = x[:, None, :, None].expand_as(eps)
        tt = t.view(k, nb, n, m, 1, 1, 1)
        x_t = ((1 - tt) * eps + tt * xe).view(k, nb * n * m, *SHAPE)
        with autocast_ctx(pack.autocast, device):
            v = pack.vmap(fn, params, x_t, t.view(k, -1))
        z = -2.0 * adv * (v.float().view_as(eps) - (xe - eps)) / float(np.prod(SHAPE))
        u_b, v_b = coherence_moments(z.reshape(k, nb, n * m, -1))
        us.append(u_b)
        vs.append(v_b)
    us, vs = torch.cat(us, dim=1).cpu().numpy(), torch.cat(vs, dim=1).cpu().numpy()
    return [(us[j], vs[j], float(rewards[j].mean())) for j in range(k)]


# ---------------------------------------------------------------------------------------------------
# The loop: `cifar_fpo.train` for every run of the pack
# ---------------------------------------------------------------------------------------------------
def _say(run: Run):
    return lambda line: print(f"{run.args.run_name}: {line}", flush=True)


def _leave(pack: Pack, ended: List[int], summaries: Dict[str, Any]):
    """Runs that ended: their final checkpoint (none after a non-finite value) and summary, written as
    `cifar_fpo.train` ends a run; then they leave the pack."""
    for s in ended:
        run, rf = pack.runs[s], pack.folders[s]
        if run.status != "nonfinite":
            pack.checkpoint(s)
        summaries[run.args.run_name] = cifar_fpo.summary(run, rf)
        rf.close()
    pack.keep([s for s in range(len(pack.runs)) if s not in ended])


def _before_update(pack: Pack, summaries: Dict[str, Any]):
    """What `cifar_fpo.train` does before update k, for every run: the validation node (all runs of the
    pack are sampled at once when any run is at one), the checkpoint, the end of the budget, Ctrl-C."""
    due = [s for s, r in enumerate(pack.runs) if r.k % r.args.val_every == 0 and r.k not in validated(r)]
    vals, images, diversity = validate(pack) if due else (None, None, None)
    signal = next((rf for rf in pack.folders if rf.stop_requested), None)
    ended = []
    for s, (run, rf) in enumerate(zip(pack.runs, pack.folders)):
        args, k = run.args, run.k
        if s in due and cifar_fpo.record_validation(run, rf, vals[s], images[s], _say(run), diversity[s]):
            ended.append(s)
            continue
        if k % args.checkpoint_every == 0:
            pack.checkpoint(s)
        end = args.num_updates if args.until is None else min(args.until, args.num_updates)
        if k >= end:
            finished = k >= args.num_updates
            run.status, run.stop_reason = (
                ("finished", "max updates") if finished else ("paused", f"paused at update {k}")
            )
            ended.append(s)
        elif signal is not None:  # Ctrl-C / SIGTERM: every run stops between updates
            run.status, run.stop_reason = "interrupted", f"{signal.signal_name} at update {k}"
            ended.append(s)
    _leave(pack, ended, summaries)


def validated(run: Run) -> set:
    return {h["update"] for h in run.history}


def update(pack: Pack, summaries: Dict[str, Any]):
    """Update k of Algorithm 1 for every run of the pack (each at its own k), steps numbered as in
    `cifar_fpo.train`."""
    args, device, runs = pack.args, pack.device, pack.runs
    n, m, k = args.batch_size, args.mc_draws, len(runs)
    t0 = time.perf_counter()
    # 2: theta_old = theta: the old losses below are taken before any parameter changes
    # 3: each run's weighting at its update k
    plans = [r.rule.plan(r.k) for r in runs]
    # 4: rollouts, rewards and group advantages; each run's latents from its own generator
    latents = per_run(lambda r: torch.randn((n, *SHAPE), generator=make_generator(r.args.seed, "rollout", r.k)), runs)
    x = pack.sample(pack.stage("latents", latents))
    rewards = score(runs, x)
    adv = cifar_fpo.group_advantages(rewards.view(-1), args.group_size, args.adv_eps).view(k, n)
    # 5: M (t, eps) draws per sample from each run's own generator, and their multipliers
    draws = per_run(
        lambda rp: cifar_fpo.draw_times_and_noise(
            rp[1], n, m, make_generator(rp[0].args.seed, "draws", rp[0].k), SHAPE, "cpu"
        ),
        list(zip(runs, plans)),
    )
    t, eps = pack.stage("t", [d[0] for d in draws]), pack.stage("eps", [d[1] for d in draws])
    mult = torch.stack([draw_multipliers(plan, d[0]).float() for plan, d in zip(plans, draws)]).to(device)
    # 6-7: current and old losses on the same endpoints, times and noises; each run's clipped objective
    # 8: and its gradient, clipped on the run's own norm; one host sync for every run's numbers
    loss, ratio, l_new = pack.objective(x, t, eps, adv, mult)
    grad_norm = pack.clip_grad_norm_(args.max_grad_norm)
    values = vmap(cifar_fpo.update_values, in_dims=(0, 0, 0, 0, 0, None))(
        rewards, loss, ratio, l_new, grad_norm, args.clip_ratio
    ).tolist()
    rows = [cifar_fpo.update_row(r.k, v, r.rule, plan) for r, v, plan in zip(runs, values, plans)]
    pack.adam_step()  # a run with a non-finite value leaves the pack below, without saving this state
    # online rules: one fit batch after update k, deployed at update k+1 (eq:online)
    fit = [s for s, (r, (_, finite)) in enumerate(zip(runs, rows)) if finite and r.rule.wants_fit(r.k)]
    for s, (u, v, fit_reward) in zip(fit, fit_coherence(pack, fit) if fit else []):
        rows[s][0].update(fit_reward=fit_reward, **runs[s].rule.observe(runs[s].k, u, v))
    seconds, ended = time.perf_counter() - t0, []
    for s, (run, rf, (metrics, finite)) in enumerate(zip(runs, pack.folders, rows)):
        metrics.update(time_s=seconds, unix_time=time.time())
        rf.log(metrics, step=run.k, tags=cifar_fpo.TAGS)
        if not finite:
            run.status, run.stop_reason = "nonfinite", f"non-finite loss/reward/gradient at update {run.k}"
            ended.append(s)
            continue
        run.k += 1
        if run.args.verbose:
            _say(run)(cifar_fpo.update_line(metrics))
    _leave(pack, ended, summaries)


def train(pack: Pack) -> Dict[str, Dict[str, Any]]:
    """Every run of the pack from its own run.k to its own end; returns {run_name: summary}."""
    summaries: Dict[str, Any] = {}
    while pack.runs:
        _before_update(pack, summaries)
        if pack.runs:
            update(pack, summaries)
    return summaries


def main(args_list: Sequence[Args], failures: Optional[Dict[str, str]] = None) -> List[Dict[str, Any]]:
    """Run (or resume, with each run's --resume) the runs of `args_list` as one pack, each in its own
    `runs_dir/run_name` as `cifar_fpo.main` would; returns their summaries in order. With `failures`,
    a run that cannot start (a refused folder, a corrupt checkpoint, ...) is left out and its reason
    recorded there under its run name; without, it stops the pack before any training."""
    args_list = [cifar_fpo.resolve_args(a) for a in args_list]
    check_packable(args_list)
    runs, folders = [], []
    try:
        for args in args_list:
            rf = None
            try:
                rf = cifar_fpo.open_folder(args)
                rf.__enter__()
                runs.append(cifar_fpo.start(args, rf))
                folders.append(rf)
            except Exception as err:
                if rf is not None and rf not in folders:
                    rf.__exit__(type(err), err, err.__traceback__)  # a failed start leaves no folder
                if failures is None:
                    raise
                failures[args.run_name] = f"{type(err).__name__}: {(str(err).splitlines() or [''])[0]}"
        summaries = train(Pack(runs, folders)) if runs else {}
    finally:  # in reverse order, so that each folder restores the signal handlers it found
        error = sys.exc_info()
        for run, rf in reversed(list(zip(runs, folders))):
            rf.__exit__(*(error if run.status == "running" else (None, None, None)))
    for run in runs:
        s = summaries[run.args.run_name]
        print(f"done: {run.args.run_name} status {s['status']} ({s['stop_reason']}), peak {s['peak']}", flush=True)
    return [summaries[r.args.run_name] for r in runs]
