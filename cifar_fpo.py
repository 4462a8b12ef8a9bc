"""Algorithm 1 of the paper: FPO fine-tuning of a flow-matching image generator with timestep-weighted
ELBO losses (alg:cifar, app:cifar).

Read top to bottom: the settings (`Args`, `PRESETS`), the pieces an update uses (the Euler sampler,
advantages, the velocity loss, the clipped objective), `setup`, then `train`, whose loop is Algorithm 1
with its steps numbered, followed by validation and stopping, and `main`. The weighting rules are in
weighting.py; the network in fpo_utils/unet.py, the fast mode (--compile) in fpo_utils/cifar_graphs.py,
the logged numbers and the curve in fpo_utils/cifar_metrics.py, the run folder in fpo_utils/runfolder.py.

    python cifar_fpo.py --preset quick                  # a few minutes on a CPU
    python cifar_fpo.py --alpha -2                      # the paper's settings (app:cifar)
"""

from __future__ import annotations

import copy
import math
import random
import time
from dataclasses import dataclass, replace
from typing import Any, Dict, List, Literal, Optional, Tuple

import numpy as np
import torch

from fpo_utils import cifar_graphs
from fpo_utils.cifar_metrics import TAGS, plot_validation, update_line, update_row, update_values
from fpo_utils.devices import PRECISIONS, autocast_ctx, pick_device, set_precision, to_device  # noqa: F401
from fpo_utils.runfolder import RunFolder, cli, resume_mode
from fpo_utils.settings import check_at_least, check_divisible, check_finite, check_literals, subset
from fpo_utils.unet import (  # noqa: F401  (load_unet, save_unet, UNet2D are this module's public API too)
    CONVENTIONS,
    DEFAULT_MODEL,
    UNet2D,
    load_unet,
    resolve_model,
    save_unet,
    velocity,
)
from rewards import diversity_row, make_diversity_features, make_reward
from weighting import WeightingRule, coherence_moments, draw_multipliers, sample_bin_times


@dataclass
class Args:
    # --- run -------------------------------------------------------------------------------------
    preset: Literal["paper", "quick"] = "paper"
    """Defaults: `paper` (app:cifar) or `quick` (a CPU demonstration of a few minutes); flags override."""
    seed: int = 20260724
    """Training seed (app:method-settings uses 20260724-20260726); fixes every random draw."""
    run_name: Optional[str] = None
    """Folder under `runs_dir`; default `<reward>__<weighting and value>__<preset>__<seed>`."""
    runs_dir: str = "runs"
    """Where run folders are written."""
    resume: bool = False
    """Continue `runs_dir/run_name` from its checkpoint; the result equals an uninterrupted run's."""
    resume_or_start: bool = False
    """Continue `runs_dir/run_name` if it has a checkpoint, else start it (for queues of runs)."""
    device: str = "auto"
    """auto (CUDA when available), cpu, cuda or cuda:N."""
    precision: Literal["fp32", "tf32", "bf16"] = "fp32"
    """fp32 (app:cifar), tf32 matmuls, or bf16 autocast of the network; the objective stays FP32."""
    compile: bool = False
    """Fast path: torch.compile, the sampler as one CUDA graph, cuDNN autotuning, fused Adam."""
    reuse_old_losses: bool = False
    """l_old from the current forward, detached, not a frozen copy: exact here; refused for a net with dropout."""
    track: bool = False
    """Also send the scalars to Weights & Biases (pip install wandb)."""
    wandb_project_name: str = "fpo"
    """Weights & Biases project."""
    wandb_entity: Optional[str] = None
    """Weights & Biases team or user."""

    # --- model and reward ------------------------------------------------------------------------
    model: str = DEFAULT_MODEL
    """Generator: a diffusers folder or a Hugging Face repo id (default: the shipped stand-in)."""
    convention: Optional[Literal["sigma", "t"]] = None
    """Network time convention (fpo_utils/unet.py `velocity`); default: the model's config, else sigma."""
    reward: Literal[
        "auto-a35", "mixed", "edge", "clip", "simclr", "digit7", "red-patch", "mixed-texture", "digit7-structure"
    ] = "auto-a35"
    """Reward (app:rewards); red-patch, mixed-texture and digit7-structure need no model."""
    classifier_path: Optional[str] = None
    """CIFAR-10 classifier weights for auto-a35/mixed (default: the shipped stand-in)."""
    simclr_path: Optional[str] = None
    """SimCLR encoder + prototypes for the simclr reward (default: the shipped stand-in)."""
    clip_model: str = "ViT-B-32"
    """OpenCLIP architecture for the clip and digit7 rewards."""
    clip_pretrained: Optional[str] = None
    """OpenCLIP pretrained tag or weights file for the clip and digit7 rewards (required for them)."""

    # --- weighting (sec:theory, app:discrete-alpha, app:methods, app:schedules) -------------------
    weighting: Literal["fixed", "schedule", "static-softmax", "static-direct", "online-ema", "online-refit"] = "fixed"
    """Weighting rule (weighting.WeightingRule)."""
    alpha: float = 0.0
    """fixed: exponent of the 12-bin power family (eq:discrete-alpha); 0 = x0, 1 = velocity."""
    target: Optional[Literal["v", "x0", "eps"]] = None
    """fixed: a named target profile instead of alpha (eq:targets)."""
    g: float = 1.0
    """Whole-loss scale multiplier g of a(q, g) (eq:calibration)."""
    estimator: Literal["q+a", "q+Z", "explicit"] = "q+a"
    """q+a (sample from q, scale by a(q,g)), q+Z (scale by mean w; app:halving), explicit (app:sampling)."""
    bins: int = 12
    """Number of time bins B (app:discrete-alpha)."""
    alpha_early: float = -3.0
    """schedule: start exponent (app:schedules; Mixed -3)."""
    alpha_late: float = -0.5
    """schedule: end exponent (app:schedules; Mixed -.5)."""
    k0: int = 160
    """schedule: update where alpha starts moving (app:schedules)."""
    k1: int = 260
    """schedule: update where alpha reaches alpha_late (app:schedules)."""
    eta: float = 1.0
    """static-softmax: concentration eta_norm (eq:static; grid .25-2)."""
    online_kappa: float = 300.0
    """online-ema: concentration on raw coherence (eq:online)."""
    online_decay: float = 0.8
    """online-ema: EMA decay of the coherence moments (app:online-analysis)."""
    online_init: Literal["uniform", "x0"] = "uniform"
    """online-ema: starting profile (uniform; x0 for the Digit7 variant)."""
    refit_eta: float = 1.0
    """online-refit: concentration eta_raw on raw coherence (app:online-analysis)."""
    refit_every: int = 20
    """online-refit: replace the profile every this many updates (app:online-analysis)."""
    coherence_draws: int = 4
    """Time/noise draws per endpoint and bin in a coherence fit (app:method-settings)."""

    # --- Algorithm 1 (alg:cifar, app:cifar) ------------------------------------------------------
    batch_size: int = 64
    """Generated samples per update n (app:cifar)."""
    group_size: int = 16
    """Contiguous advantage groups G (app:cifar); batch_size must be a multiple."""
    mc_draws: int = 4
    """Monte Carlo (t, eps) pairs M per sample (app:cifar)."""
    sample_steps: int = 20
    """Euler steps of the generation ODE from t=0 to t=1 (app:cifar)."""
    num_updates: int = 800
    """Maximum number of updates (app:cifar)."""
    learning_rate: float = 1e-5
    """Adam learning rate (app:cifar)."""
    adam_betas: Tuple[float, float] = (0.9, 0.999)
    """Adam betas (app:cifar)."""
    adam_eps: float = 1e-8
    """Adam epsilon (app:cifar)."""
    max_grad_norm: float = 0.5
    """Global gradient-norm clip (app:cifar)."""
    clip_ratio: float = 0.08
    """PPO ratio clip rho (app:cifar)."""
    log_ratio_clip: float = 20.0
    """Clamp c of the log surrogate D_i before exponentiation (eq:rl-mc, app:cifar)."""
    adv_eps: float = 1e-6
    """epsilon_A in the group advantage denominator (app:cifar)."""

    # --- validation, stopping, outputs -----------------------------------------------------------
    val_every: int = 20
    """Validate every this many updates, including update 0 (app:cifar)."""
    val_banks: int = 4
    """Number of fixed validation latent banks (app:cifar)."""
    val_bank_size: int = 128
    """Latents per validation bank (app:cifar)."""
    calib_bank_size: int = 512
    """Examples in the frozen calibration bank (eq:calibration, app:cifar)."""
    fit_batch_size: int = 64
    """Endpoints per coherence fit batch of the static and online rules (app:method-settings)."""
    early_stop: bool = True
    """Stop on a validation plateau or degradation (app:cifar; the rule: `should_stop`)."""
    min_updates_before_stop: int = 200
    """No stopping before this many updates (app:cifar)."""
    stop_patience: int = 10
    """Plateau: validation nodes without a gain above stop_min_delta."""
    stop_min_delta: float = 1e-3
    """Plateau: smallest validation gain that counts as an improvement."""
    stop_degrade_frac: float = 0.5
    """Degradation: fraction of the gain (peak - initial) given back."""
    stop_degrade_nodes: int = 3
    """Degradation: consecutive validation nodes below the threshold."""
    until: Optional[int] = None
    """Pause (status `paused`) once this many updates are done; continue with --resume."""
    checkpoint_every: Optional[int] = None
    """Checkpoint every this many updates (default: every validation node)."""
    save_samples: bool = True
    """Write a PNG grid of validation samples at each validation node."""
    verbose: bool = True
    """Print one status line per update."""


# A preset is a named set of defaults; "paper" is app:cifar exactly, "quick" a small CPU demonstration
# (fewer and smaller batches, fewer sampling steps, a larger learning rate).
# fmt: off
PRESETS = {
    "paper": Args(),
    "quick": Args(preset="quick", batch_size=32, group_size=16, mc_draws=4, sample_steps=10, num_updates=12,
                  learning_rate=1e-4, val_every=3, val_banks=1, val_bank_size=64, calib_bank_size=32,
                  fit_batch_size=32, min_updates_before_stop=12),
}
# Settings --resume accepts with a new value; any other difference is refused.
MAY_CHANGE = (
    "num_updates", "until", "device", "verbose", "save_samples", "track", "wandb_project_name", "wandb_entity",
    "checkpoint_every", "runs_dir", "run_name", "resume", "resume_or_start",
)
# fmt: on


def weighting_label(args: Args) -> str:
    """The weighting and its value for run names, e.g. alpha-2, x0, static-softmax-eta1."""
    label = {
        "fixed": args.target or f"alpha{args.alpha:g}",
        "schedule": f"schedule{args.alpha_early:g}to{args.alpha_late:g}@{args.k0}-{args.k1}",
        "static-softmax": f"static-softmax-eta{args.eta:g}",
        "static-direct": "static-direct",
        "online-ema": f"online-ema-kappa{args.online_kappa:g}-{args.online_init}",
        "online-refit": f"online-refit-eta{args.refit_eta:g}",
    }[args.weighting]
    return label + ("" if args.g == 1 else f"-g{args.g:g}") + ("" if args.estimator == "q+a" else f"-{args.estimator}")


def resolve_args(args: Args) -> Args:
    """Check every argument (a bad value raises a one-line ValueError) and fill the derived defaults."""
    check_literals(args)  # every Literal field holds one of its choices
    check_finite(args, ("alpha", "alpha_early", "alpha_late", "g", "eta", "online_kappa", "refit_eta", "learning_rate"))
    if args.g <= 0:
        raise ValueError(f"--g {args.g} must be > 0")
    check_at_least(args, ("batch_size", "group_size", "mc_draws", "sample_steps"), 1)
    check_at_least(args, ("val_every", "val_banks", "val_bank_size", "calib_bank_size", "fit_batch_size"), 1)
    check_at_least(args, ("bins", "refit_every", "coherence_draws"), 1)
    check_at_least(args, ("num_updates",), 0)
    if args.group_size < 2:
        raise ValueError(f"--group-size {args.group_size} must be >= 2 (the group SD uses G-1)")
    check_divisible(args, ("batch_size", "fit_batch_size"), by="group_size")
    if not 0 < args.clip_ratio < 1:
        raise ValueError(f"--clip-ratio {args.clip_ratio} must be in (0, 1)")
    if args.weighting == "schedule" and args.k1 < args.k0:
        raise ValueError(f"--k1 {args.k1} must be >= --k0 {args.k0}")
    args = replace(args, checkpoint_every=args.checkpoint_every or args.val_every)
    check_at_least(args, ("checkpoint_every",), 1)
    if args.run_name is None:
        args = replace(args, run_name=f"{args.reward}__{weighting_label(args)}__{args.preset}__{args.seed}")
    return args


# ---------------------------------------------------------------------------------------------------
# The pieces an update uses
# ---------------------------------------------------------------------------------------------------
# Every random draw comes from a generator seeded by (seed, purpose, update), so a run is a pure
# function of its arguments and a resumed run repeats the uninterrupted one exactly.
PURPOSES = {"rollout": 1, "draws": 2, "validation": 3, "calibration": 4, "fit": 5}


def make_generator(seed: int, purpose: str, k: int = 0, device="cpu") -> torch.Generator:
    """A torch.Generator seeded from (seed, purpose, k) with a fixed integer hash."""
    value = (seed * 1_000_003 + PURPOSES[purpose] * 10_007 + k) % (2**63 - 1)
    gen = torch.Generator(device=torch.device(device))
    gen.manual_seed(value)
    return gen


@torch.no_grad()
def sample_images(net, latents: torch.Tensor, steps: int, convention: str, autocast=None) -> torch.Tensor:
    """Euler integration of the generation ODE dx/dt = v_theta(x, t) from noise x_0 = latents (t=0) to data
    (t=1) on a uniform grid: x <- x + v_theta(x, j/S) / S for j = 0..S-1 (S = steps), then clamped to [-1, 1]."""
    x = latents
    dt = 1.0 / steps
    for j in range(steps):
        t = torch.full((x.shape[0],), j * dt, device=x.device, dtype=x.dtype)
        with autocast_ctx(autocast, x.device):
            v = velocity(net, x, t, convention)
        x = x + dt * v.float()
    return x.clamp(-1.0, 1.0)


def group_advantages(rewards: torch.Tensor, group_size: int, eps: float = 1e-6) -> torch.Tensor:
    """GRPO advantages over contiguous groups: (R - mean_G) / (s_G + eps), s_G with G-1 (app:cifar)."""
    r = rewards.float().view(-1, group_size)
    mean = r.mean(dim=1, keepdim=True)
    sd = r.std(dim=1, unbiased=True, keepdim=True)
    return ((r - mean) / (sd + eps)).view(-1)


def draw_times_and_noise(plan, n: int, m: int, gen: torch.Generator, shape, device):
    """M auxiliary (t, eps) pairs per endpoint: t from the plan's bin law, eps ~ N(0, I); drawn on the
    CPU, so a run's draws do not depend on the device."""
    t = sample_bin_times(plan.q, n * m, generator=gen).view(n, m).float()
    eps = torch.randn((n, m, *shape), generator=gen)
    return to_device(t, device), to_device(eps, device)


def velocity_losses(
    net, x: torch.Tensor, t: torch.Tensor, eps: torch.Tensor, convention: str, autocast=None
) -> torch.Tensor:
    """Step 6's per-dimension velocity losses (eq:path, eq:targets) of endpoints x (n,C,H,W), times t (n,M) and
    noises eps (n,M,C,H,W): x_t = (1-t) eps + t x, u = x - eps, l_v = |v_theta(x_t, t) - u|^2 / d, d = C H W.
    Returns (n, M) in FP32; only the network runs under `autocast`."""
    n, m = t.shape
    xe = x.unsqueeze(1).expand_as(eps)
    tt = t.view(n, m, 1, 1, 1)
    x_t = (1.0 - tt) * eps + tt * xe
    u = xe - eps
    with autocast_ctx(autocast, x.device):
        v = velocity(net, x_t.reshape(n * m, *x.shape[1:]), t.reshape(n * m), convention)
    v = v.float().view_as(u)
    return (v - u).pow(2).flatten(2).mean(dim=2)


def fpo_loss(
    l_old: torch.Tensor,
    l_new: torch.Tensor,
    adv: torch.Tensor,
    multipliers,
    clip_ratio: float = 0.08,
    log_ratio_clip: float = 20.0,
):
    """The clipped ELBO-surrogate objective of eq:rl-mc and eq:rl-ppo.

    D_i = 1/M sum_m c_im (l_old,im - l_theta,im), r_i = exp(clip(D_i, -c, c)),
    L = -mean_i min(r_i A_i, clip(r_i, 1-rho, 1+rho) A_i).
    `multipliers` c_im is a_k for every draw with the sampling estimators (q+a, q+Z) and a_k w(t_im)
    with the explicit one (a float or an (n, M) tensor). Returns (loss, ratio) in FP32.
    """
    d = (multipliers * (l_old.float() - l_new.float())).mean(dim=1)
    ratio = torch.exp(d.clamp(-log_ratio_clip, log_ratio_clip))
    unclipped = ratio * adv
    clipped = ratio.clamp(1.0 - clip_ratio, 1.0 + clip_ratio) * adv
    return -torch.minimum(unclipped, clipped).mean(), ratio


@torch.no_grad()
def fit_coherence(net, reward_fn, args: Args, gen: torch.Generator, device, convention, autocast=None):
    """Output-signal moments per bin for one fit batch (eq:coherence, app:methods).

    Generates `fit_batch_size` endpoints, scores them, takes group advantages, and for each bin b draws
    `coherence_draws` times inside the bin (and Gaussian noises) per endpoint. The signals
    z = -2 A (v_theta - u)/d of a bin give its pairwise moments (U_b, V_b). Returns U, V (float64 numpy,
    shape (bins,)) and the fit batch's mean reward.
    """
    n, shape = args.fit_batch_size, (3, 32, 32)
    latents = torch.randn((n, *shape), generator=gen).to(device)
    x = sample_images(net, latents, args.sample_steps, convention, autocast)
    rewards = reward_fn(x).float()
    adv = group_advantages(rewards, args.group_size, args.adv_eps)
    us, vs = [], []
    for b in range(args.bins):
        m = args.coherence_draws
        t = ((b + torch.rand((n, m), generator=gen)) / args.bins).float()
        eps = torch.randn((n, m, *shape), generator=gen)
        t, eps = t.to(device), eps.to(device)
        xe = x.unsqueeze(1).expand_as(eps)
        x_t = (1 - t.view(n, m, 1, 1, 1)) * eps + t.view(n, m, 1, 1, 1) * xe
        with autocast_ctx(autocast, device):
            v = velocity(net, x_t.reshape(n * m, *shape), t.reshape(-1), convention).float().view_as(eps)
        z = (-2.0 * adv.view(n, 1, 1, 1, 1) * (v - (xe - eps)) / float(np.prod(shape))).reshape(n * m, -1)
        u_b, v_b = coherence_moments(z.double().cpu())
        us.append(float(u_b))
        vs.append(float(v_b))
    return np.array(us), np.array(vs), float(rewards.mean())


@torch.no_grad()
def build_calibration_bank(net, args: Args, device, convention, autocast=None) -> np.ndarray:
    """The frozen coupled bank L_ib of eq:calibration at the initial model: N = calib_bank_size
    endpoints; example i keeps one Gaussian noise and one in-bin offset u_i for all bins
    (t_ib = (b + u_i)/B), so its B losses are coupled."""
    gen = make_generator(args.seed, "calibration")
    n, shape, chunk = args.calib_bank_size, (3, 32, 32), 128
    out = []
    for s in range(0, n, chunk):
        c = min(chunk, n - s)
        latents = torch.randn((c, *shape), generator=gen).to(device)
        x = sample_images(net, latents, args.sample_steps, convention, autocast)
        eps = torch.randn((c, 1, *shape), generator=gen).to(device).expand(c, args.bins, *shape).contiguous()
        offset = torch.rand((c, 1), generator=gen)
        t = ((torch.arange(args.bins).view(1, -1) + offset) / args.bins).float().to(device)
        for j in range(0, c, 32):  # 32 endpoints x B bins per forward keeps the memory modest
            out.append(
                velocity_losses(net, x[j : j + 32], t[j : j + 32], eps[j : j + 32], convention, autocast).double().cpu()
            )
    return torch.cat(out).numpy()


def check_reuse_old_losses(net: torch.nn.Module) -> None:
    """--reuse-old-losses takes l_old from step 6's forward of theta (train mode), detached, for the frozen
    copy's (eval mode): the same values only when theta_old = theta there (one gradient step per rollout, as
    this loop takes) and the two modes compute the same function. Refuses a network where they do not."""
    for name, m in net.named_modules():
        if (isinstance(m, torch.nn.Dropout) and m.p > 0) or isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
            raise ValueError(
                f"--reuse-old-losses needs a network whose train and eval modes agree, but {name} is {m}; "
                "use a model with dropout 0 and no batch norm, or leave the flag off (a frozen copy)"
            )


@dataclass
class Run:
    """Everything one training run holds between updates (see `setup`)."""

    args: Args
    device: torch.device
    net: torch.nn.Module
    fwd: Any  # the network as step 6 calls it (compiled with --compile)
    old_net: Optional[torch.nn.Module]  # theta_old: a frozen copy (None with --reuse-old-losses)
    sampler: Any  # latents -> images: `sample_images` in eval mode (one CUDA graph with --compile on CUDA)
    optimizer: torch.optim.Optimizer
    reward_fn: Any
    convention: str
    autocast: Any
    rule: WeightingRule  # w_k, its plan (q_k, a_k) and the calibration bank
    val_latents: torch.Tensor
    history: List[Dict[str, float]]  # validation nodes: {"update", "val_reward", "val_div_cos", "val_div_classes"}
    k: int = 0  # next update to run
    status: str = "running"
    stop_reason: Optional[str] = None
    diversity: Any = None  # images -> (SimCLR features, predicted classes) (rewards.make_diversity_features)


def setup(args: Args, rf: Optional[RunFolder] = None) -> Run:
    """Build the generator, its frozen copy theta_old, the fast mode, Adam, the reward, the validation latents
    and the weighting rule (with the calibration bank and, for static rules, the initial fit); or, when `rf`
    holds a checkpoint, restore the run from it."""
    args = resolve_args(args)
    device = pick_device(args.device)
    autocast = set_precision(args.precision)
    torch.manual_seed(args.seed)
    np.random.seed(args.seed % (2**32))
    random.seed(args.seed)
    net = load_unet(resolve_model(args.model), device=device, dtype=torch.float32).train()
    convention = args.convention or getattr(net, "convention", None) or "sigma"
    if args.reuse_old_losses:
        check_reuse_old_losses(net)
    old_net = None if args.reuse_old_losses else copy.deepcopy(net).eval().requires_grad_(False)
    # --compile: the network compiled, `sample_images` captured as one CUDA graph (fpo_utils/cifar_graphs.py)
    paths = cifar_graphs.choose(
        net,
        device,
        sample_images,
        compile=args.compile,
        steps=args.sample_steps,
        convention=convention,
        autocast=autocast,
    )
    optimizer = torch.optim.Adam(
        net.parameters(),
        lr=args.learning_rate,
        betas=tuple(args.adam_betas),
        eps=args.adam_eps,
        weight_decay=0.0,
        fused=paths.fused_adam or None,
    )  # app:cifar
    reward_fn = make_reward(
        args.reward, device=device, **subset(args, "classifier_path", "simclr_path", "clip_model", "clip_pretrained")
    )
    vgen = make_generator(args.seed, "validation")
    val_latents = torch.randn((args.val_banks * args.val_bank_size, 3, 32, 32), generator=vgen).to(device)
    rule = WeightingRule(
        args.weighting,
        **subset(args, "bins", "alpha", "target", "alpha_early", "alpha_late", "k0", "k1", "eta", "online_kappa"),
        **subset(args, "online_decay", "online_init", "refit_eta", "refit_every", "estimator", "g"),
    )
    parts = (net, paths.fwd, old_net, paths.sampler, optimizer, reward_fn, convention, autocast, rule, val_latents)
    run = Run(args, device, *parts, history=[], diversity=make_diversity_features(device))
    if rf is not None and rf.resuming:
        ckpt = rf.load_checkpoint(map_location="cpu")  # also restores every RNG state
        net.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
        rule.load_state_dict(ckpt["weighting"])
        run.history, run.k = list(ckpt["history"]), int(ckpt["k"])
    else:
        rule.bank_losses = build_calibration_bank(net, args, device, convention, autocast)
        if rule.wants_fit(-1):  # static rules measure output coherence once on the initial model
            u, v, _ = fit_coherence(
                net, reward_fn, args, make_generator(args.seed, "fit", 0), device, convention, autocast
            )
            rule.observe(-1, u, v)
    if device.type == "cuda":
        torch.cuda.empty_cache()  # hand the set-up's large temporary batches back (concurrent runs share a GPU)
    return run


@torch.no_grad()
def validate(run: Run, chunk: Optional[int] = None) -> Tuple[float, torch.Tensor, Dict[str, float]]:
    """Mean reward of the current model over the fixed validation latent banks (app:cifar); images are
    generated `chunk` at a time (default 128; all banks at once with --compile). Also returns the first
    64 images and the sample diversity of all the banks' images together (`diversity_row`)."""
    chunk = chunk or (run.val_latents.shape[0] if run.args.compile else 128)
    images, rewards, feats = [], [], []
    for s in range(0, run.val_latents.shape[0], chunk):
        x = run.sampler(run.val_latents[s : s + chunk])
        rewards.append(run.reward_fn(x).float().cpu())
        if run.diversity is not None:
            feats.append([f.cpu() for f in run.diversity(x)])
        if not images:
            images.append(x[:64].cpu())
    return float(torch.cat(rewards).mean()), images[0], diversity_row(feats)


def should_stop(history: List[Dict[str, float]], args: Args) -> Optional[str]:
    """Validation-based stopping (app:cifar), once `min_updates_before_stop` updates are done; returns
    a reason or None. Plateau: the best validation reward has not improved by more than
    `stop_min_delta` for `stop_patience` nodes. Degradation: the reward has stayed below
    `peak - stop_degrade_frac * (peak - initial)` for `stop_degrade_nodes` consecutive nodes. This is
    the project's reading of "stopping for plateau or degradation after a minimum of 200"; the paper
    gives no formula."""
    if not args.early_stop or not history or history[-1]["update"] < args.min_updates_before_stop:
        return None
    vals = [h["val_reward"] for h in history]
    initial, peak = vals[0], max(vals)
    best_idx = max(range(len(vals)), key=lambda i: (vals[i], -i))
    gain = peak - initial
    if gain > 0 and len(vals) >= args.stop_degrade_nodes:
        threshold = peak - args.stop_degrade_frac * gain
        if all(v < threshold for v in vals[-args.stop_degrade_nodes :]):
            return "degradation"
    if len(vals) - 1 - best_idx >= args.stop_patience:
        if max(vals[best_idx + 1 :]) <= max(vals[: best_idx + 1]) + args.stop_min_delta:
            return "plateau"
    return None


def checkpoint(run: Run, rf: RunFolder):
    """checkpoints/last.pt: the update counter, model, Adam, weighting state and validation history."""
    parts = {"model": run.net.state_dict(), "optimizer": run.optimizer.state_dict(), "weighting": run.rule.state_dict()}
    rf.save_checkpoint({"k": run.k, **parts, "history": run.history, "status": run.status})


def summary(run: Run, rf: RunFolder) -> Dict[str, Any]:
    """summary.json: status, updates done, the per-run peak (eq:peak), where it was and the sample diversity
    of the validation node that set it."""
    hist = run.history
    best = max(hist, key=lambda h: h["val_reward"]) if hist else None
    return rf.write_summary(
        {
            "run_name": run.args.run_name,
            "status": run.status,
            "stop_reason": run.stop_reason,
            "updates_done": run.k,
            "peak": best["val_reward"] if best else None,
            "peak_update": best["update"] if best else None,
            "div_cos_at_peak": best.get("val_div_cos") if best else None,
            "div_classes_at_peak": best.get("val_div_classes") if best else None,
            "initial_val_reward": hist[0]["val_reward"] if hist else None,
            "final_val_reward": hist[-1]["val_reward"] if hist else None,
            "c_x0": run.rule.c_ref,
            "validation": hist,
        }
    )


def record_validation(
    run: Run, rf: RunFolder, val: float, images: torch.Tensor, say, diversity: Optional[Dict[str, float]] = None
) -> bool:
    """Validation node run.k: history, metrics row (with the sample diversity from `validate`), curve and
    samples; returns True (and sets the status) when the run ends here, on a non-finite reward or by the
    stopping rule."""
    args, k = run.args, run.k
    run.history.append({"update": k, "val_reward": val, **(diversity or {})})
    rf.log({"kind": "validation", **run.history[-1]}, step=k, tags=TAGS)
    vals = [h["val_reward"] for h in run.history]
    if getattr(rf, "path", None) is not None:  # a benchmark's stand-in folder writes nothing
        plot_validation(rf.path, run.history, args.reward)
    if args.save_samples:
        rf.save_images(images, f"update_{k:05d}")
    if args.verbose:
        div = "  ".join(f"{key[4:]} {v:.4g}" for key, v in (diversity or {}).items())
        say(f"[validation] update {k:4d}  val_reward {val:.4f}  peak {max(vals):.4f}  {div}".rstrip())
    if not math.isfinite(val):
        run.status, run.stop_reason = "nonfinite", "non-finite validation reward"
        return True
    reason = should_stop(run.history, args)
    if reason is not None:
        run.status, run.stop_reason = "stopped", reason
    return reason is not None


def train(run: Run, rf: RunFolder) -> Dict[str, Any]:
    """Updates k = run.k .. min(until, num_updates) - 1 of Algorithm 1 (alg:cifar), with validation,
    stopping and checkpoints. Validation node k measures the model after k updates (k = 0: the initial
    model). Returns the summary."""
    args, net, device, rule, conv, autocast = run.args, run.net, run.device, run.rule, run.convention, run.autocast
    end = args.num_updates if args.until is None else min(args.until, args.num_updates)
    bar = rf.progress(total=end, initial=min(run.k, end))
    say = bar.write if not bar.disable else lambda line: print(line, flush=True)  # keeps a terminal's bar intact
    while True:
        k = run.k
        if k % args.val_every == 0 and not any(h["update"] == k for h in run.history):
            val, images, diversity = validate(run)
            if record_validation(run, rf, val, images, say, diversity):
                break
        if k % args.checkpoint_every == 0:
            checkpoint(run, rf)
        if k >= end:
            run.status, run.stop_reason = (
                ("finished", "max updates") if k >= args.num_updates else ("paused", f"paused at update {k}")
            )
            break
        if rf.stop_requested:  # Ctrl-C / SIGTERM: stop between updates; the checkpoint below keeps update k-1
            run.status, run.stop_reason = "interrupted", f"{rf.signal_name} at update {k}"
            break

        # ---- Algorithm 1, update k ----------------------------------------------------------------
        t0 = time.perf_counter()
        # 2: theta_old <- sg(theta): the frozen copy takes theta (no copy with --reuse-old-losses: see step 6)
        if run.old_net is not None:
            run.old_net.load_state_dict(net.state_dict())
        # 3: the weighting at update k: bin law q_k and calibrated scale a_k
        plan = rule.plan(k)
        # 4: rollouts from the old policy (`sample_images`), rewards, group advantages (all detached)
        latents = to_device(
            torch.randn((args.batch_size, 3, 32, 32), generator=make_generator(args.seed, "rollout", k)), device
        )
        x = run.sampler(latents)
        with torch.no_grad():
            rewards = run.reward_fn(x).float()
        adv = group_advantages(rewards, args.group_size, args.adv_eps)
        # 5: M paired (t, eps) draws per sample, their multipliers (a_k, or a_k w(t) for the explicit estimator)
        t, eps = draw_times_and_noise(
            plan, args.batch_size, args.mc_draws, make_generator(args.seed, "draws", k), (3, 32, 32), device
        )
        mult = draw_multipliers(plan, t).float()
        # 6: current and old losses on the same endpoints, times and noises; --reuse-old-losses takes l_old
        # from the current forward, detached: the same values, as theta_old = theta until step 8's Adam step
        l_new = velocity_losses(run.fwd, x, t, eps, conv, autocast)
        with torch.no_grad():
            l_old = l_new.detach() if run.old_net is None else velocity_losses(run.old_net, x, t, eps, conv, autocast)
        # 7: D_i, r_i = exp(D_i) and the PPO-clipped objective (eq:rl-mc, eq:rl-ppo)
        loss, ratio = fpo_loss(l_old, l_new, adv, mult, args.clip_ratio, args.log_ratio_clip)
        # 8: backward and the gradient-norm clip are queued before any value is read back, so the GPU never
        # waits for the host; a non-finite loss, reward or gradient skips the Adam step
        run.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(net.parameters(), args.max_grad_norm)
        values = update_values(rewards, loss, ratio, l_new, grad_norm, args.clip_ratio).tolist()  # one host sync
        metrics, finite = update_row(k, values, rule, plan)
        if finite:
            run.optimizer.step()
            # online rules: fit on one fresh batch after update k, deployed at update k+1 (eq:online)
            if rule.wants_fit(k):
                gen = make_generator(args.seed, "fit", k + 1)
                u, v, fit_reward = fit_coherence(net, run.reward_fn, args, gen, device, conv, autocast)
                metrics.update(fit_reward=fit_reward, **rule.observe(k, u, v))
        metrics.update(time_s=time.perf_counter() - t0, unix_time=time.time())
        rf.log(metrics, step=k, tags=TAGS)
        if not finite:  # recorded as an event (app:cifar): keep the last good checkpoint, do not save this state
            run.status, run.stop_reason = "nonfinite", f"non-finite loss/reward/gradient at update {k}"
            break
        run.k = k + 1
        bar.update(1)
        if args.verbose:
            say(update_line(metrics))
    bar.close()
    if run.status != "nonfinite":
        checkpoint(run, rf)
    return summary(run, rf)


def open_folder(args: Args) -> RunFolder:
    """The run folder of resolved `args`: a fresh one, or the folder `--resume` continues."""
    tracking = subset(args, "track", "wandb_project_name", "wandb_entity")
    return RunFolder(args.runs_dir, args.run_name, args, resume_mode(args), may_change=MAY_CHANGE, **tracking)


def start(args: Args, rf: RunFolder) -> Run:
    """`setup`, then the metrics file: a fresh run logs its calibration row, a resumed run drops the rows
    written after its checkpoint (the re-run writes them again)."""
    run = setup(args, rf)
    print(
        f"run {rf.path}  device {run.device}  model {args.model}  reward {args.reward}  weighting "
        f"{weighting_label(args)}  C_x0 = S(q_x0) = {run.rule.c_ref:.8f}",
        flush=True,
    )
    if rf.resuming:
        done = {h["update"] for h in run.history}
        rf.truncate_metrics(
            lambda r: (
                r["kind"] == "calibration"
                or (r["kind"] == "update" and r["update"] < run.k)
                or (r["kind"] == "validation" and r["update"] in done)
            )
        )
    else:
        bank_size = int(run.rule.bank_losses.shape[0])
        calibration = {"kind": "calibration", "update": -1, "c_x0": run.rule.c_ref, "bank_size": bank_size}
        rf.log(calibration, step=0, tags=TAGS)
    return run


def main(args: Args) -> Dict[str, Any]:
    """Run (or resume) one training run in `runs_dir/run_name`; returns its summary."""
    args = resolve_args(args)
    with open_folder(args) as rf:
        result = train(start(args, rf), rf)
    print(
        f"done: status {result['status']} ({result['stop_reason']}), peak {result['peak']} "
        f"at update {result['peak_update']}",
        flush=True,
    )
    return result


if __name__ == "__main__":
    cli(main, Args, presets=PRESETS)
