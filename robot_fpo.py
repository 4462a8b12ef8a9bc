"""FPO and FPO++ flow policies trained from scratch on MuJoCo / DeepMind Control tasks.

A CleanRL-style trainer (compare ``ppo_continuous_action.py``): a flow policy (MLP on the normalised observation,
the noisy action and a time embedding; Euler sampling), a critic, GAE, vectorised environments (envpool, gymnasium
or MuJoCo Playground: fpo_utils/envs.py). ``--objective fpo`` (eq:fpo-objective): weights INSIDE the exponent;
``--objective fpopp`` (eq:fpopp-objective): per-draw ratios, weights AFTER the exponential. ``t = 0`` noise, ``t = 1``
action, ``x_t = (1 - t) eps + t x``, ``u = x - eps``; x is stored, the environment gets tanh(x) (or x clipped).
Episodes run on across updates; a checkpoint holds the environments' state where the backend gives it (Playground),
so ``--resume`` is exact (CPU); elsewhere a resumed run restarts its environments. Ctrl-C stops at a checkpoint.
Results and tuning history: benchmarks/robot_results/README.md.

    python robot_fpo.py --env-id CartpoleSwingup-v1 --objective fpopp --alpha 0.5
    python robot_fpo.py --preset fpo --env-id WalkerRun-v1 --alpha-eps 0.5
"""

from __future__ import annotations

import copy
import math
import time
from dataclasses import asdict, dataclass, field, replace
from functools import partial
from typing import Literal

import numpy as np
import torch
import torch.nn as nn

from fpo_utils.envs import RunningMeanStd, env_settings, make_envs, normalize_obs, resolve_backend, segment_seed
from fpo_utils.fast import GraphedCall, GraphedStep, chunks, fused_forward, pick_sampler, rollout_tensors, unrolls
from fpo_utils.runfolder import NonFiniteLoss, RunError, RunFolder, cli
from weighting import fpo_weight_at, fpopp_weight, linear_schedule

FPO_GRID_SIZE = 10  # s in {0.1, ..., 1.0}, app:robotics


@dataclass
class Args:
    """Flags. ``--preset`` picks a named set of defaults, later flags override: ``default`` (CPU scale: 64 environments
    x 64 steps), ``fpo`` (the official FPO configuration, app:robotics; one update is one block of 983,040 steps),
    ``fpopp`` (the official FPO++ defaults) or ``fpopp-locomotion`` (their Spot velocity task, 1,024 envs x 96 steps).
    What each takes from the official codes, and where it differs: benchmarks/robot_results/README.md."""

    preset: Literal["default", "fpo", "fpopp", "fpopp-locomotion"] = "default"  # named set of defaults (PRESETS)
    runs_dir: str = "runs"  # parent folder of the run folders
    run_name: str = ""  # run folder name (default ``<env>__<objective>__<alpha>__<preset>__<seed>``)
    seed: int = 1  # seed of the experiment
    resume: bool = False  # continue the run in ``runs/<run_name>`` from its checkpoint
    track: bool = False  # also send the scalars to Weights & Biases
    cuda: bool = True  # use the GPU for the networks when one is present
    cuda_graph: bool = True  # on CUDA, replay each rollout step's torch work and each minibatch step as captured graphs
    tf32: bool = True  # TF32 matrix products on CUDA (JAX's default on GPUs, so the official FPO code's)
    compile: bool = False  # with the captured minibatch step, ``torch.compile`` its losses first (fpo preset)
    fused: bool = False  # on CUDA, the flow MLP and its Euler sampler as Triton kernels (fpo preset)
    scan_rollout: bool = False  # Playground: the rollout's steps as one JAX scan with a JAX sampler (fpo preset)
    torch_threads: int = 1  # ``torch.set_num_threads`` (0 keeps torch's default)
    torch_deterministic: bool = True  # sets ``torch.backends.cudnn.deterministic``

    # Environment
    env_id: str = "HalfCheetah-v5"  # an envpool id (``WalkerRun-v1``, ...), a gymnasium id or a Playground task
    backend: Literal["auto", "envpool", "gymnasium", "playground"] = "auto"  # auto: envpool if it has the id
    num_envs: int = 64  # parallel environments
    env_threads: int = 0  # envpool threads (0: one per core this process may use)
    episode_length: int = 1000  # time limit of the playground backend (the others use the id's own limit)
    physics: Literal["auto", "jax", "warp"] = "auto"  # playground: MJX (jax) or MuJoCo Warp; auto: per task, measured
    obs_actor: str = ""  # dict observations: the actor's keys, comma-separated ("": the task's, e.g. state)
    obs_critic: str = ""  # dict observations: the critic's keys ("": privileged_state if present, else the actor's)
    norm_obs: bool = True  # running observation normalisation (app:robotics)
    obs_stats: Literal["step", "update"] = "step"  # statistics updated each step (CleanRL) or once per update (FPO)
    norm_reward: bool = True  # divide rewards by the running std of the discounted return (CleanRL)
    reward_scale: float = 1.0  # multiply rewards by this (official FPO: 10)

    # Algorithm
    objective: Literal["fpo", "fpopp"] = "fpo"  # actor objective: FPO (eq:fpo-objective) or FPO++ (eq:fpopp-objective)
    total_timesteps: int = 1_000_000  # environment steps of the run
    num_updates: int = 0  # stop after this many updates in total (0: total_timesteps // batch size)
    num_steps: int = 64  # rollout length per environment per update
    learning_rate: float = 6e-4  # Adam(W) learning rate
    anneal_lr: bool = True  # anneal the learning rate linearly over total_timesteps to a floor of 5%
    anneal_steps: int = 0  # environment steps of the anneal (0: total_timesteps)
    weight_decay: float = 0.0  # decoupled weight decay (AdamW)
    adam_eps: float = 1e-5  # Adam epsilon
    gamma: float = 0.99  # discount factor
    gae_lambda: float = 0.95  # GAE lambda
    gae_unroll: int = 0  # 0: GAE over the rollout; k: per minibatch over unrolls of k steps, current critic (FPO)
    num_minibatches: int = 16  # minibatches per epoch
    update_epochs: int = 4  # epochs over each rollout
    norm_adv: bool = True  # normalise advantages: per minibatch (FPO, --gae-unroll), else over the rollout
    clip_coef: float = 0.05  # trust-region width rho (0.05 in both official codes)
    vf_coef: float = 0.25  # coefficient of the value loss (mean squared error)
    max_grad_norm: float = 0.5  # global gradient-norm clip (<= 0 disables)

    # Flow policy
    num_draws: int = 8  # (t, eps) draws M per stored action
    flow_steps: int = 10  # Euler steps of the sampler
    actor_hidden: int = 64  # width of the flow MLP
    actor_layers: int = 3  # hidden layers of the flow MLP
    critic_hidden: int = 64  # width of the value MLP
    critic_layers: int = 2  # hidden layers of the value MLP
    critic_act: Literal["tanh", "silu"] = "tanh"  # activation of the value MLP
    time_embed_dim: int = 8  # sinusoidal time-embedding size (even)
    time_embed_base: float = math.pi  # time-embedding frequencies base * 2^k (official FPO: 1)
    init: Literal["torch", "lecun"] = "torch"  # Linear weights: torch's default, or lecun-uniform, zero biases (FPO)
    output_scale: float = 0.25  # scale on the velocity output (official FPO: 0.25, FPO++: 1.0)
    action_squash: Literal["clip", "tanh"] = "tanh"  # the env gets tanh(x) (official FPO) or x clipped to [-1, 1]
    action_bound: float = 3.0  # clamp sampled x to [-b, b] before it is stored (<= 0 disables): bounded old losses
    actor_ema: float = 0.0  # decay of an EMA copy of the actor used for evaluation (0 disables; official FPO++: 0.95)
    ema_warmup: int = 500  # updates before the EMA starts averaging (before: it copies the actor)

    # Timestep weighting and schedules
    alpha_eps: float = 1.0  # FPO exponent: w(s) proportional to s^(2(1-alpha_eps)); 1 is native (app:robotics)
    alpha: float = 1.0  # FPO++ exponent: w(t) proportional to (1-t)^(2(1-alpha)); 1 is native (app:robotics)
    alpha_early: float | None = None  # schedule start value of the objective's exponent (app:schedules)
    alpha_late: float | None = None  # schedule end value of the objective's exponent
    k0: float = 12.0  # schedule start, in training blocks (robotics A20/W5 schedules: 12)
    k1: float = 36.0  # schedule end, in training blocks (robotics A20/W5 schedules: 36)
    block_size: int = 983_040  # environment steps per training block (app:robotics); indexes schedules

    # FPO++ specifics
    trust_region: Literal["aspo", "ppo", "spo"] = "aspo"  # FPO++ per-draw trust-region proxy
    loss_clamp: float = 20.0  # FPO++ upper clamp on both losses (and again on the current loss where A < 0)
    ratio_log_clamp: float = 10.0  # FPO++ straight-through upper clamp on l_old - l_theta
    adv_clamp: float = 100.0  # FPO++ clamp on the normalised advantages
    t_min: float = 0.005  # FPO++ lower flow time (app:robotics)
    t_max: float = 0.995  # FPO++ upper flow time (app:robotics)
    fpopp_action_noise: float = 0.02  # std of the Gaussian noise FPO++ adds to training actions (0 disables)

    # Evaluation and checkpoints
    eval_every: int = 10  # evaluate every this many updates (and at update 0 and the last)
    eval_episodes: int = 5  # fixed-seed evaluation episodes
    eval_seed: int = 10_000  # seed of the evaluation episodes
    eval_init: Literal["native", "zero", "random"] = "native"  # evaluation's initial noise (native: FPO random)
    checkpoint_every: int = 0  # checkpoint every this many updates (0: eval_every)
    restart_every: int = 0  # restart every environment (fresh episodes) every this many updates (0: never)
    keep_checkpoints: bool = False  # also keep every checkpoint as checkpoints/update_NNNNNN.pt


# fmt: off
PRESETS = {
    "default": Args(),
    # Official FpoConfig (app:robotics): 2048 envs x 480 steps = one block, 16 x 32 minibatches, 61 blocks.
    "fpo": Args(
        preset="fpo", env_id="WalkerRun-v1", num_envs=2048, num_steps=480, num_minibatches=32, update_epochs=16,
        total_timesteps=60_000_000, learning_rate=3e-4, anneal_lr=False, adam_eps=1e-8, gamma=0.995,
        norm_reward=False, reward_scale=10.0, max_grad_norm=0.0, vf_coef=0.25, gae_unroll=30, obs_stats="update",
        actor_hidden=32, actor_layers=4, critic_hidden=256, critic_layers=5, critic_act="silu", init="lecun",
        time_embed_base=1.0, action_bound=0.0, eval_every=7, eval_episodes=128,
        compile=True, fused=True, scan_rollout=True,
    ),
    # Official FPO++ defaults; environment count and rollout length are this project's.
    "fpopp": Args(
        preset="fpopp", objective="fpopp", env_id="CartpoleSwingup-v1", num_envs=1024, num_steps=32,
        num_minibatches=4, update_epochs=16, total_timesteps=150 * 1024 * 32, learning_rate=1e-4, anneal_lr=False,
        weight_decay=1e-4, adam_eps=1e-8, norm_reward=False, num_draws=16, flow_steps=64, vf_coef=1.0,
        max_grad_norm=1.0, output_scale=1.0, action_bound=0.0, actor_ema=0.95, eval_every=15, eval_episodes=32,
    ),
}
# Official FPO++ Spot velocity task (app:robotics): FPO++ defaults, 32 epochs, 32 draws, value coef .5, actor 3 x 256,
# critic 3 x 768, 1,500 updates of 4,096 envs x 24 steps; here 1,024 x 96 (the same 98,304 steps, for 16 CPU cores).
PRESETS["fpopp-locomotion"] = replace(
    PRESETS["fpopp"], preset="fpopp-locomotion", env_id="SpotFlatTerrainJoystick-v1", num_envs=1024, num_steps=96,
    update_epochs=32, total_timesteps=1500 * 4096 * 24, num_draws=32, vf_coef=0.5, actor_hidden=256, critic_hidden=768,
    critic_layers=3, critic_act="silu", eval_every=50, eval_episodes=10,
)
# Settings --resume accepts with a new value (with --anneal-lr, total_timesteps moves the lr horizon).
MAY_CHANGE = (
    "total_timesteps", "num_updates", "resume", "track", "cuda", "cuda_graph", "compile", "fused", "scan_rollout",
    "tf32", "torch_threads", "env_threads", "keep_checkpoints", "runs_dir",
)
# fmt: on


# ---------------------------------------------------------------- Environments
def squash(x: torch.Tensor, mode: str) -> torch.Tensor:
    """The flow's action in [-1, 1] (the env rescales it to its box): tanh(x) or x clipped."""
    return torch.tanh(x) if mode == "tanh" else x.clamp(-1.0, 1.0)


# ---------------------------------------------------------------- Networks
def mlp(n_in: int, hidden: int, layers: int, n_out: int, act=nn.SiLU) -> nn.Sequential:
    sizes = [n_in] + [hidden] * layers
    return nn.Sequential(
        *[m for a, b in zip(sizes, sizes[1:]) for m in (nn.Linear(a, b), act())], nn.Linear(sizes[-1], n_out)
    )


class FlowActor(nn.Module):
    """Velocity field ``v(obs, x_t, t)``: an MLP on [obs, x_t, sinusoidal embedding of t]."""

    def __init__(self, obs_dim, act_dim, hidden, layers, embed_dim, output_scale, embed_base=math.pi):
        super().__init__()
        if embed_dim % 2:
            raise ValueError(f"time_embed_dim={embed_dim} must be even")
        self.act_dim, self.output_scale = act_dim, output_scale
        self.fast_forward = None  # set in build_state
        self.register_buffer("freqs", embed_base * 2.0 ** torch.arange(embed_dim // 2, dtype=torch.float32))
        self.net = mlp(obs_dim + act_dim + embed_dim, hidden, layers, act_dim)

    def forward(self, obs: torch.Tensor, x_t: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        """obs (..., o), x_t (..., d), t (...) -> velocity (..., d); obs may broadcast against x_t."""
        if self.fast_forward is not None:  # the same function as fused Triton kernels (--fused, CUDA)
            return self.fast_forward(self, obs, x_t, t)
        ang, first, o, d = t.unsqueeze(-1) * self.freqs, self.net[0], obs.shape[-1], self.act_dim
        w = first.weight
        h = nn.functional.linear(obs, w[:, :o]) + nn.functional.linear(x_t, w[:, o : o + d])
        h = h + nn.functional.linear(torch.cat([torch.cos(ang), torch.sin(ang)], dim=-1), w[:, o + d :], first.bias)
        return self.net[1:](h) * self.output_scale

    @torch.no_grad()
    def sample(self, obs: torch.Tensor, x0: torch.Tensor, steps: int) -> torch.Tensor:
        """Euler steps of dx/dt = v from t = 0 (noise x0 (n, d)) to 1; obs and time terms computed once."""
        first, o, d = self.net[0], obs.shape[-1], self.act_dim
        ang = (torch.arange(steps, device=x0.device) / steps).unsqueeze(-1) * self.freqs
        time_term = nn.functional.linear(torch.cat([torch.cos(ang), torch.sin(ang)], -1), first.weight[:, o + d :])
        base = nn.functional.linear(obs, first.weight[:, :o], first.bias) + time_term.unsqueeze(1)  # (steps, n, h)
        x, w_x = x0, first.weight[:, o : o + d].t()
        for k in range(steps):
            x = torch.add(x, self.net[1:](torch.addmm(base[k], x, w_x)), alpha=self.output_scale / steps)
        return x


class Critic(nn.Module):  # a value MLP on its columns ``cols`` of the observation (privileged ones where there are)
    def __init__(self, obs_dim: int, hidden: int, layers: int, act: str = "tanh", cols: slice = slice(None)):
        super().__init__()
        self.cols, self.net = cols, mlp(obs_dim, hidden, layers, 1, act=nn.Tanh if act == "tanh" else nn.SiLU)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.net(obs[..., self.cols]).squeeze(-1)


# ---------------------------------------------------------------- The two objectives
def sample_draws(n: int, m: int, d: int, objective: str, t_min: float, t_max: float, device):
    """(t, eps) draws per stored action: FPO t on {0, .1, ..., .9} (s = 1 - t on {.1, ..., 1}), FPO++ t ~ U[t_min,
    t_max]."""
    if objective == "fpo":
        t = torch.randint(0, FPO_GRID_SIZE, (n, m), device=device).float() / FPO_GRID_SIZE
    else:
        t = t_min + (t_max - t_min) * torch.rand(n, m, device=device)
    return t, torch.randn(n, m, d, device=device)


def draw_losses(
    actor: FlowActor, obs: torch.Tensor, x: torch.Tensor, t: torch.Tensor, eps: torch.Tensor, objective: str
) -> torch.Tensor:
    """Per-draw flow losses (n, M) at ``x_t = (1-t) eps + t x``: FPO ``|eps_hat - eps|^2 / d`` with
    ``eps_hat = x_t - t v``; FPO++ ``|v - u|^2 / sqrt(d)`` with ``u = x - eps``."""
    n, m, d = eps.shape
    tt = t.unsqueeze(-1)
    x_t = (1.0 - tt) * eps + tt * x.unsqueeze(1)
    v = actor(obs.unsqueeze(1), x_t, t)  # the observation broadcasts over the M draws
    if objective == "fpo":
        return ((x_t - tt * v - eps) ** 2).mean(-1)
    return ((v - (x.unsqueeze(1) - eps)) ** 2).sum(-1) / math.sqrt(d)


def ppo_surrogate(ratio: torch.Tensor, adv: torch.Tensor, clip_coef: float) -> torch.Tensor:
    """PPO maximisation surrogate ``min(r A, clip(r, 1-rho, 1+rho) A)`` (elementwise)."""
    return torch.minimum(ratio * adv, ratio.clamp(1.0 - clip_coef, 1.0 + clip_coef) * adv)


def spo_surrogate(ratio: torch.Tensor, adv: torch.Tensor, clip_coef: float) -> torch.Tensor:
    """SPO maximisation surrogate ``r A - |A| (r - 1)^2 / (2 rho)`` (elementwise)."""
    return ratio * adv - adv.abs() * (ratio - 1.0) ** 2 / (2.0 * clip_coef)


def trust_region_proxy(ratio: torch.Tensor, adv: torch.Tensor, clip_coef: float, mode: str) -> torch.Tensor:
    """FPO++ per-draw proxy: ``ppo``, ``spo`` or ``aspo`` (PPO where A > 0, SPO where A <= 0)."""
    if mode in ("ppo", "spo"):
        return (ppo_surrogate if mode == "ppo" else spo_surrogate)(ratio, adv, clip_coef)
    if mode == "aspo":
        return torch.where(adv > 0, ppo_surrogate(ratio, adv, clip_coef), spo_surrogate(ratio, adv, clip_coef))
    raise ValueError(f"trust_region={mode!r}; allowed: 'aspo', 'ppo', 'spo'")


def straight_through_upper_clamp(x: torch.Tensor, upper: float) -> torch.Tensor:
    """Forward ``min(x, upper)``; backward the identity (straight-through)."""
    return x - (x - x.clamp(max=upper)).detach()


def fpo_loss(l_old, l_new, t, adv, alpha_eps: float, clip_coef: float, w: torch.Tensor | None = None):
    """FPO actor loss (eq:fpo-objective): ``D_i = mean_m w_alpha_eps(1 - t_im) (l_old - l_new)_im``,
    ``r_i = exp(D_i)`` (D unclamped, as official FPO), ``L = -mean_i min(r_i A_i, clip(r_i, 1 +- rho) A_i)``;
    ``w``: precomputed weights. Returns (loss, ratio (n,), D (n,))."""
    if w is None:
        w = fpo_weight_at(1.0 - t, alpha_eps)
    d_i = (w * (l_old - l_new)).mean(-1)
    ratio = torch.exp(d_i)
    return -ppo_surrogate(ratio, adv, clip_coef).mean(), ratio, d_i


def fpopp_loss(
    l_old,
    l_new,
    t,
    adv,
    alpha: float,
    clip_coef: float,
    mode: str = "aspo",
    loss_clamp: float = 20.0,
    ratio_log_clamp: float = 10.0,
    t_min: float = 0.005,
    t_max: float = 0.995,
    w: torch.Tensor | None = None,
):
    """FPO++ actor loss (eq:fpopp-objective): both losses clamped at c, the current one again where A < 0
    (official FPO++: ``cfm_loss_clamp_negative_advantages_max``, also 20); ``r_im = exp(C_STE(l_old -
    l_new))``; ``L = -1/(nM) sum w_alpha(t_im) P_TR(r_im, A_i)``, ``adv`` already normalised and clamped."""
    a = adv.unsqueeze(-1).expand_as(l_new)
    l_old_c, l_new_c = l_old.clamp(max=loss_clamp), l_new.clamp(max=loss_clamp)
    l_new_c = torch.where(a < 0, l_new_c.clamp(max=loss_clamp), l_new_c)
    ratio = torch.exp(straight_through_upper_clamp(l_old_c - l_new_c, ratio_log_clamp))
    if w is None:
        w = fpopp_weight(t, alpha, t_min, t_max)
    return -(w * trust_region_proxy(ratio, a, clip_coef, mode)).mean(), ratio


def current_alpha(args: Args, global_step: int) -> float:
    """The objective's exponent at this step: fixed, or the linear schedule over training blocks."""
    fixed = args.alpha_eps if args.objective == "fpo" else args.alpha
    if args.alpha_early is None and args.alpha_late is None:
        return float(fixed)
    early, late = (fixed if v is None else v for v in (args.alpha_early, args.alpha_late))
    return float(linear_schedule(global_step // args.block_size, early, late, args.k0, args.k1))


def draw_weights(t: torch.Tensor, args: Args, alpha: float) -> torch.Tensor:
    """Timestep weights of the stored draws: FPO ``w_alpha_eps(1 - t)``, FPO++ ``w_alpha(t)``."""
    return fpo_weight_at(1.0 - t, alpha) if args.objective == "fpo" else fpopp_weight(t, alpha, args.t_min, args.t_max)


# ---------------------------------------------------------------- Training state (all that evolves), rollout + GAE
@dataclass
class State:
    envs: object
    actor: FlowActor
    critic: Critic
    optimizer: torch.optim.Optimizer
    obs_rms: RunningMeanStd | None
    ret_rms: RunningMeanStd | None
    device: torch.device
    sampler: object  # (obs, x0, steps) -> x in the rollout (fpo_utils.fast.pick_sampler)
    eval_sampler: object  # the same for the evaluated actor (the EMA copy if any)
    roll: dict  # the rollout's tensors (buffers, the environment's outputs, step counter ``k``), fixed addresses
    ema: FlowActor | None = None  # the evaluated EMA copy of the actor (--actor-ema)
    act: object = None  # () -> None: rollout step k before the environment (policy_half, graphed on CUDA)
    record: object = None  # () -> None: rollout step k after the environment (record_half, graphed on CUDA)
    update: int = 0
    global_step: int = 0
    peak: tuple = (-math.inf, -1, -1)  # eq:peak: the best evaluation so far, its global step, its update
    graph: GraphedStep | None = None  # the captured minibatch step (--cuda-graph), built on first use
    scan: object = None  # (roll, T) -> None: the rollout's T steps as one JAX program (--scan-rollout)
    obs_actor: slice = field(default_factory=lambda: slice(None))  # the actor's columns (the critic's: critic.cols)


def reset_envs(state: State, seed: int) -> None:  # fresh episodes everywhere, seeded from (seed, update)
    state.roll["obs_in"].copy_(state.envs.reset(segment_seed(seed, state.update)))
    state.roll["ret_acc"].zero_()


def policy_half(state: State, args: Args) -> None:
    """Rollout step k before the environment: statistics, normalised observation and sampled x (stored at
    k), squashed action ``roll["action"]``. Fixed tensors only, in place: on CUDA one captured graph."""
    r, k = state.roll, state.roll["k"]
    if state.obs_rms is not None and args.obs_stats == "step":
        state.obs_rms.update(r["obs_in"])
    o = normalize_obs(r["obs_in"], state.obs_rms)
    x = state.sampler(o[:, state.obs_actor], r["noise"].index_select(0, k)[0], args.flow_steps).to(o.device)
    if args.objective == "fpopp" and args.fpopp_action_noise > 0:
        x = x + args.fpopp_action_noise * r["act_noise"].index_select(0, k)[0]
    if args.action_bound > 0:  # bounded stored actions (and old losses)
        x = x.clamp(-args.action_bound, args.action_bound)
    r["obs"].index_copy_(0, k, o[None])
    r["x"].index_copy_(0, k, x[None])
    r["action"].copy_(squash(x, args.action_squash))


def record_half(state: State, args: Args) -> None:
    """Rollout step k after the environment (its outputs copied into ``roll[ENV_OUT]``): finished
    episodes' sums, the reward (scaled, normalised by the running return std), the buffers at k; k += 1."""
    r, k = state.roll, state.roll["k"]
    done = torch.maximum(r["term_in"], r["trunc_in"]).double()
    r["ep"].add_(torch.stack([r["ep_ret_in"].double(), r["ep_len_in"].double(), done]) @ done)
    reward = r["rew_in"].double() * args.reward_scale
    if state.ret_rms is not None:
        r["ret_acc"].mul_(args.gamma).add_(reward)
        state.ret_rms.update(r["ret_acc"])
        reward = (reward / torch.sqrt(state.ret_rms.var + 1e-8)).clamp(-10.0, 10.0)
        r["ret_acc"].mul_(1.0 - done)
    for key, v in (
        ("rew", reward.float()),
        ("term", r["term_in"]),
        ("trunc", r["trunc_in"]),
        ("final", normalize_obs(r["final_in"], state.obs_rms)),
    ):
        r[key].index_copy_(0, k, v[None])
    k.add_(1)


def collect_rollout(state: State, args: Args) -> dict:
    """``num_steps`` vectorised steps -> the batch (normalised observations, draws, old losses, GAE; a
    truncated episode bootstraps with ``gamma V(final obs)``). It views the buffers: use it before the next."""
    envs, dev, actor, critic, r = state.envs, state.device, state.actor, state.critic, state.roll
    n, T, d = envs.num_envs, args.num_steps, envs.act_dim
    r["noise"].normal_()
    if args.objective == "fpopp" and args.fpopp_action_noise > 0:
        r["act_noise"].normal_()
    for key in ("ep", "k"):  # finished episodes' sums, the step counter
        r[key].zero_()
    if hasattr(state.sampler, "refresh"):  # the NumPy copy of the actor takes the current weights
        state.sampler.refresh()
    if state.scan is not None:  # the same steps, one XLA program (fpo_utils/playground_env.py: ScanRollout)
        state.scan(r, T)
    else:
        for _ in range(T):
            state.act()
            envs.step_into(r["action"], r["env_in"])  # one copy of the step's outputs; r[ENV_OUT] are its parts
            state.record()
    state.global_step += T * n
    obs_buf, act_buf, final_buf, rew_buf, term_buf, trunc_buf, ep = (
        r[k] for k in ("obs", "x", "final", "rew", "term", "trunc", "ep")
    )

    with torch.no_grad():
        flat_obs, flat_x, cols = obs_buf.reshape(T * n, -1), act_buf.reshape(T * n, d), state.obs_actor
        # Old per-draw losses, once for the batch with the rollout's (unchanged) policy.
        t, eps = sample_draws(T * n, args.num_draws, d, args.objective, args.t_min, args.t_max, dev)
        l_old = torch.cat(
            [draw_losses(actor, flat_obs[s, cols], flat_x[s], t[s], eps[s], args.objective) for s in chunks(T * n)]
        )
        if args.obs_stats == "update" and state.obs_rms is not None:  # official FPO: new statistics from this
            rms = state.obs_rms  # rollout's observations, then every stored observation renormalised with them
            mean, std = rms.mean.clone(), rms.var.sqrt()
            raw_obs, raw_final = (b.reshape(T * n, -1).double() * std + mean for b in (obs_buf, final_buf))
            rms.update(raw_obs)
            flat_obs, final_buf = rms.normalize(raw_obs), rms.normalize(raw_final).reshape(T, n, -1)
        batch = {"obs": flat_obs, "x": flat_x, "t": t, "eps": eps, "l_old": l_old}
        if not args.gae_unroll:  # GAE over the rollout with its critic
            values = torch.cat([critic(flat_obs[s]) for s in chunks(T * n)]).reshape(T, n)
            next_value = critic(normalize_obs(r["obs_in"], state.obs_rms))
            final_v = torch.cat([critic(final_buf.reshape(T * n, -1)[s]) for s in chunks(T * n)]).reshape(T, n)
            boot = args.gamma * trunc_buf * (1 - term_buf) * final_v
            nonterm = 1.0 - torch.maximum(term_buf, trunc_buf)
            delta = rew_buf + boot + args.gamma * torch.cat([values[1:], next_value[None]]) * nonterm - values
            adv, last = torch.zeros(T, n, device=dev), torch.zeros(n, device=dev)
            for s in reversed(range(T)):
                adv[s] = last = delta[s] + args.gamma * args.gae_lambda * nonterm[s] * last
            batch.update(adv=adv.reshape(-1), returns=(adv + values).reshape(-1))
    ep_n, (ep_ret, ep_len) = int(ep[2]), (ep[:2] / max(float(ep[2]), 1.0)).tolist()
    if args.gae_unroll:  # unrolls of gae_unroll steps of one environment; GAE follows in each minibatch
        rows = {"rew": rew_buf, "disc": args.gamma * (1 - term_buf), "trunc": trunc_buf, "boot": final_buf}
        batch.update({key: v.reshape(T * n, *v.shape[2:]) for key, v in rows.items()})
        batch = {key: unrolls(v, T, args.gae_unroll) for key, v in batch.items()}
        batch["boot"] = batch["boot"][:, -1]  # the observation after each unroll's last step (before any reset)
    return {
        **batch,
        "episodes": ep_n,
        "episodic_return": ep_ret if ep_n else None,
        "episodic_length": ep_len if ep_n else None,
        "action_abs_mean": float(act_buf.abs().mean()),
        "action_abs_max": float(act_buf.abs().max()),
    }


def unroll_gae(rew, disc, trunc, values, boot_value, lam: float):
    """(value targets, advantages) over unrolls (m, k), brax's form (``disc``: gamma, 0 after a termination;
    no TD error at time limits). ``acc_s = delta_s + c_s acc_{s+1}`` as one product with ``C[s, j] = c_s..c_{j-1}``."""
    mask, k = 1.0 - trunc, rew.shape[1]
    deltas = (rew + disc * torch.cat([values[:, 1:], boot_value[:, None]], 1) - values) * mask
    c = torch.cat([torch.ones_like(mask[:, :1]), (disc * lam * mask)[:, :-1]], 1)  # c[:, j] = c_{j-1}
    ones = torch.ones(k, k, dtype=torch.bool, device=rew.device)
    prod = torch.where(ones.triu(1), c[:, None, :], 1.0).cumprod(2) * ones.triu()  # zero below the diagonal
    vs = (prod @ deltas.unsqueeze(-1)).squeeze(-1) + values
    return vs, (rew + disc * torch.cat([vs[:, 1:], boot_value[:, None]], 1) - values) * mask


# ---------------------------------------------------------------- The update
STAT_KEYS = ("pg_loss", "v_loss", "ratio_mean", "ratio_min", "ratio_max", "clipfrac", "grad_norm")
BATCH_KEYS = ("obs", "x", "t", "eps", "l_old", "adv", "returns")
UNROLL_KEYS = ("obs", "x", "t", "eps", "l_old", "rew", "disc", "trunc", "boot")


def minibatch_losses(state: State, src: dict, idx: torch.Tensor, args: Args):
    """(pg_loss, v_loss, ratio) of minibatch ``idx`` of ``src``; advantages normalised per minibatch (FPO,
    ``--gae-unroll``: from the current critic) or over the rollout (FPO++)."""
    b = {k: v[idx] for k, v in src.items()}
    if args.gae_unroll:
        values = state.critic(b["obs"])  # (m, k)
        with torch.no_grad():
            vs, adv = unroll_gae(b["rew"], b["disc"], b["trunc"], values, state.critic(b["boot"]), args.gae_lambda)
        v_loss = (((vs - values) * (1.0 - b["trunc"])) ** 2).mean()  # no value target at time-limit steps
        b, adv = {k: v.flatten(0, 1) for k, v in b.items() if k != "boot"}, adv.flatten()
    else:
        adv, v_loss = b["adv"], ((state.critic(b["obs"]) - b["returns"]) ** 2).mean()
    if args.norm_adv and (args.objective == "fpo" or args.gae_unroll):
        adv = (adv - adv.mean()) / (adv.std() + 1e-8)
    l_new = draw_losses(state.actor, b["obs"][..., state.obs_actor], b["x"], b["t"], b["eps"], args.objective)
    if args.objective == "fpo":
        pg_loss, ratio, _ = fpo_loss(b["l_old"], l_new, b["t"], adv, 1.0, args.clip_coef, w=b["w"])
    else:
        adv = adv.clamp(-args.adv_clamp, args.adv_clamp)
        clamps = (args.trust_region, args.loss_clamp, args.ratio_log_clamp, args.t_min, args.t_max)
        pg_loss, ratio = fpopp_loss(b["l_old"], l_new, b["t"], adv, 1.0, args.clip_coef, *clamps, w=b["w"])
    return pg_loss, v_loss, ratio


def gradient_step(state: State, pg_loss, v_loss, ratio, args: Args) -> torch.Tensor:
    """Backward, gradient clip, optimiser step -> the STAT_KEYS row (7,); no host sync (eager = graphed)."""
    params = [p for g in state.optimizer.param_groups for p in g["params"]]
    state.optimizer.zero_grad(set_to_none=True)
    (pg_loss + args.vf_coef * v_loss).backward()
    gn = nn.utils.clip_grad_norm_(params, args.max_grad_norm if args.max_grad_norm > 0 else float("inf"), foreach=True)
    state.optimizer.step()
    with torch.no_grad():
        r = ratio.detach()
        clipfrac = ((r - 1.0).abs() > args.clip_coef).float().mean()
        row = [pg_loss.detach(), v_loss.detach(), r.mean(), r.min(), r.max(), clipfrac, gn.to(r.dtype)]
        return torch.stack(row).float()


def uses_cuda_graph(state: State, args: Args) -> bool:
    return args.cuda_graph and state.device.type == "cuda"


def update(state: State, batch: dict, args: Args, alpha: float) -> dict:
    """``update_epochs`` x ``num_minibatches`` gradient steps (on CUDA: replays of one captured graph fed by
    the same ``torch.randperm`` calls); a non-finite loss or gradient raises :class:`NonFiniteLoss`."""
    n = batch["obs"].shape[0]  # transitions, or unrolls with --gae-unroll
    mb, steps = n // args.num_minibatches, args.update_epochs * args.num_minibatches
    src = {k: batch[k] for k in (UNROLL_KEYS if args.gae_unroll else BATCH_KEYS)}
    src["w"] = draw_weights(batch["t"], args, alpha)
    if args.objective == "fpopp" and args.norm_adv and not args.gae_unroll:
        src["adv"] = (src["adv"] - src["adv"].mean()) / (src["adv"].std() + 1e-8)
    if uses_cuda_graph(state, args):
        key = (n, steps, mb)
        if state.graph is None or state.graph.key != key:
            losses = lambda s, idx: minibatch_losses(state, s, idx, args)  # noqa: E731
            losses = torch.compile(losses, dynamic=False) if args.compile else losses  # fused kernels, then captured
            step_fn = lambda s, idx: gradient_step(state, *losses(s, idx), args)  # noqa: E731
            state.graph = GraphedStep(step_fn, src, steps, mb, len(STAT_KEYS), state.optimizer, key)
        table = state.graph.run(src, [torch.randperm(n, device=state.device) for _ in range(args.update_epochs)])
    else:
        rows = []
        for _ in range(args.update_epochs):
            perm = torch.randperm(n, device=state.device)
            for start in range(0, mb * args.num_minibatches, mb):
                rows.append(gradient_step(state, *minibatch_losses(state, src, perm[start : start + mb], args), args))
        table = torch.stack(rows)
    stats = table.cpu().numpy().astype(np.float64)  # the update's one host read
    if not np.isfinite(stats[:, [0, 1, 6]]).all():
        what = "loss" if not np.isfinite(stats[:, :2]).all() else "gradient norm"
        raise NonFiniteLoss(f"non-finite {what} at update {state.update + 1}")
    out = {"minibatch_steps": stats.shape[0], **{k: float(stats[:, c].mean()) for c, k in enumerate(STAT_KEYS)}}
    out["ratio_min"], out["ratio_max"] = float(stats[:, 3].min()), float(stats[:, 4].max())
    return out


@torch.no_grad()
def evaluate(state: State, envs, args: Args, init: str) -> float:
    """Mean first-episode return over the evaluation environments (seeds ``eval_seed + i``), frozen statistics,
    the EMA actor if any; ``init`` zero: x0 = 0, random: x0 from a generator seeded with ``eval_seed``."""
    gen = torch.Generator(device="cpu").manual_seed(args.eval_seed)
    if hasattr(state.eval_sampler, "refresh"):
        state.eval_sampler.refresh()
    obs, n, d = envs.reset(args.eval_seed), envs.num_envs, envs.act_dim
    total, finished = torch.zeros(n, dtype=torch.float64), torch.zeros(n, dtype=torch.bool)
    while not bool(finished.all()):
        o = normalize_obs(obs.to(state.device), state.obs_rms)
        x0 = (torch.zeros(n, d) if init == "zero" else torch.randn(n, d, generator=gen)).to(state.device)
        x = state.eval_sampler(o[:, state.obs_actor], x0, args.flow_steps).to(state.device)
        obs, reward, term, trunc, _ = envs.step(squash(x, args.action_squash))
        total += torch.where(finished, 0.0, reward.cpu().double())
        finished |= (term | trunc).cpu()
    return float(total.mean())


# ---------------------------------------------------------------- Setup, checkpoints and main
def validate_args(args: Args) -> None:
    positive = "num_envs num_steps num_minibatches update_epochs num_draws flow_steps eval_every eval_episodes"
    for name in positive.split() + ["block_size", "episode_length"]:
        if getattr(args, name) < 1:
            raise RunError(f"{name} must be at least 1, got {getattr(args, name)}")
    steps, unroll = args.num_envs * args.num_steps, args.gae_unroll
    schedule = (args.alpha_early, args.alpha_late) != (None, None)
    for bad, message in (
        (steps < args.num_minibatches, f"num_minibatches={args.num_minibatches}: at most num_envs x num_steps"),
        (not 0 <= args.t_min < args.t_max < 1, f"t_min={args.t_min}, t_max={args.t_max}: need 0 <= t_min < t_max < 1"),
        (not math.isfinite(args.action_bound), f"action_bound={args.action_bound}: must be finite (<= 0 disables)"),
        (args.clip_coef <= 0, f"clip_coef={args.clip_coef}: must be > 0"),
        (args.anneal_steps < 0, f"anneal_steps={args.anneal_steps}: must be >= 0"),
        (args.restart_every < 0, f"restart_every={args.restart_every}: must be >= 0 (0: never)"),
        (not 0.0 <= args.actor_ema < 1.0, f"actor_ema={args.actor_ema}: must be in [0, 1)"),
        (unroll < 0 or unroll and args.num_steps % unroll, f"gae_unroll={unroll}: must divide num_steps"),
        (unroll and steps // unroll % args.num_minibatches, "num_minibatches must divide the unrolls"),
        (schedule and args.k1 <= args.k0, f"k1={args.k1}: must be > k0={args.k0}"),
    ):
        if bad:
            raise RunError(message)
    resolve_backend(args.env_id, args.backend)  # unknown id: one line with close matches, before any folder


def task_envs(args: Args, num_envs: int, seed: int, device: torch.device):  # actor / critic observation keys routed
    where, keys = (args.backend, device, args.env_threads, args.episode_length), (args.obs_actor, args.obs_critic)
    return make_envs(args.env_id, num_envs, seed, *where, keys, args.physics)


def build_state(args: Args, device: torch.device) -> State:
    """Environments, networks, optimiser and normalisers for ``args`` (seed torch first)."""
    envs = task_envs(args, args.num_envs, segment_seed(args.seed, 0), device)
    obs_dim, act_dim, route = envs.obs_dim, envs.act_dim, envs.route
    embed = (args.time_embed_dim, args.output_scale, args.time_embed_base)
    actor = FlowActor(route.actor_dim, act_dim, args.actor_hidden, args.actor_layers, *embed).to(device)
    value_mlp = (args.critic_hidden, args.critic_layers, args.critic_act)
    critic = Critic(route.critic_dim, *value_mlp, route.obs_critic).to(device)
    for m in (m for net in (actor, critic) for m in net.modules() if isinstance(m, nn.Linear) and args.init == "lecun"):
        nn.init.uniform_(m.weight, -math.sqrt(3.0 / m.in_features), math.sqrt(3.0 / m.in_features))
        nn.init.zeros_(m.bias)
    # One optimiser over both networks (they share no parameters); the fused kernel does the step in one call.
    params = list(actor.parameters()) + list(critic.parameters())
    lr, eps, wd = args.learning_rate, args.adam_eps, args.weight_decay
    optimizer = torch.optim.AdamW(params, lr=lr, eps=eps, weight_decay=wd, fused=True)
    actor.fast_forward = fused_forward(actor, args.fused and device.type == "cuda")  # the EMA copy keeps it
    ema = copy.deepcopy(actor).requires_grad_(False) if args.actor_ema > 0 else None
    evaluated, graphs = ema if ema is not None else actor, args.cuda_graph and device.type == "cuda"
    # Per-column statistics: the actor's and the critic's columns each have their own (the official two normalisers).
    obs_rms = RunningMeanStd((obs_dim,), device, args.obs_stats == "update") if args.norm_obs else None
    ret_rms = RunningMeanStd((), device) if args.norm_reward else None
    sampler = pick_sampler(actor, device, graphs, True, args.fused)
    eval_sampler = pick_sampler(evaluated, device, graphs, False, args.fused)
    roll = rollout_tensors(args.num_envs, args.num_steps, obs_dim, act_dim, device)
    state = State(envs, actor, critic, optimizer, obs_rms, ret_rms, device, sampler, eval_sampler, roll, ema)
    state.obs_actor = route.obs_actor
    state.act, state.record = partial(policy_half, state, args), partial(record_half, state, args)
    if graphs:  # each half replays as one captured graph; capturing restores what its warm-up touched

        def touched() -> list:
            return [*roll.values(), *[v for m in (obs_rms, ret_rms) if m for v in vars(m).values()]]

        state.act, state.record = GraphedCall(state.act, touched), GraphedCall(state.record, touched)
    if args.scan_rollout and hasattr(envs, "scan_rollout"):  # Playground; None where statistics move during a rollout
        noise = args.fpopp_action_noise if args.objective == "fpopp" else 0.0
        squash_args = (args.action_squash, args.action_bound, args.reward_scale, noise)
        state.scan = envs.scan_rollout(actor, obs_rms, ret_rms, args.flow_steps, *squash_args)
    return state


PARTS = ("actor", "critic", "optimizer", "ema", "obs_rms", "ret_rms")  # what a checkpoint holds, with the counters


def checkpoint_payload(state: State) -> dict:
    envs = state.envs.state_dict()  # None where the backend cannot give its simulator state
    return {
        **{k: None if getattr(state, k) is None else getattr(state, k).state_dict() for k in PARTS},
        "envs": envs and {"sim": envs, **{k: state.roll[k].cpu() for k in ("obs_in", "ret_acc")}},
        **{k: getattr(state, k) for k in ("update", "global_step", "peak")},
    }


def load_checkpoint(ckpt, state: State) -> bool:
    """Restore a checkpoint (a path or a loaded payload) into ``state``; a captured graph is dropped.
    Returns whether the environments' state was restored too (else they need a restart)."""
    ckpt = ckpt if isinstance(ckpt, dict) else torch.load(ckpt, map_location="cpu", weights_only=False)
    state.graph = None
    for key in PARTS:
        if getattr(state, key) is not None and ckpt.get(key) is not None:
            getattr(state, key).load_state_dict(ckpt[key])
    state.update, state.global_step, state.peak = int(ckpt["update"]), int(ckpt["global_step"]), tuple(ckpt["peak"])
    if ckpt.get("envs") is None:
        return False
    state.envs.load_state_dict(ckpt["envs"]["sim"])
    for k in ("obs_in", "ret_acc"):
        state.roll[k].copy_(ckpt["envs"][k])
    return True


def default_run_name(args: Args) -> str:
    fixed = args.alpha_early is None and args.alpha_late is None
    value = current_alpha(args, 0) if fixed else f"{args.alpha_early}to{args.alpha_late}"
    env = args.env_id.replace("/", "_").replace(":", "_")
    alpha = "alpha_eps" if args.objective == "fpo" else "alpha"
    return args.run_name or f"{env}__{args.objective}__{alpha}{value}__{args.preset}__{args.seed}"


TAGS = {k: f"losses/{k}" for k in STAT_KEYS + ("lr", "minibatch_steps")}
EPISODE_KEYS = ("episodic_return", "episodic_length", "episodes", "action_abs_mean", "action_abs_max")


def main(args: Args) -> dict:
    """Train (or continue with ``--resume``) until ``num_updates``; return ``summary.json``'s content."""
    validate_args(args)
    args = replace(args, **env_settings(args.env_id, args.backend, args.obs_actor, args.obs_critic, args.physics))
    batch_size = args.num_envs * args.num_steps
    num_updates = args.num_updates or max(1, args.total_timesteps // batch_size)
    ckpt_every = args.checkpoint_every or args.eval_every
    eval_init = args.eval_init if args.eval_init != "native" else ("random" if args.objective == "fpo" else "zero")
    rf = RunFolder(args.runs_dir, default_run_name(args), asdict(args), args.resume, MAY_CHANGE, args.track)
    torch.manual_seed(args.seed)
    np.random.seed(args.seed)
    torch.backends.cudnn.deterministic = args.torch_deterministic
    if args.torch_threads > 0:
        torch.set_num_threads(args.torch_threads)
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = args.tf32
    device = torch.device("cuda" if torch.cuda.is_available() and args.cuda else "cpu")
    with rf:
        state = build_state(args, device)
        eval_envs = task_envs(args, args.eval_episodes, args.eval_seed, device)
        curve = ([], [])

        def summary(status: str, reason: str = "") -> dict:  # eq:peak: the best evaluation, its update and step
            peak = dict(peak=state.peak[0] if state.peak[2] >= 0 else None, peak_update=state.peak[2])
            where = dict(
                global_step=state.global_step, env_id=args.env_id, objective=args.objective, device=str(device)
            )
            row = dict(status=status, updates_done=state.update, **peak, peak_step=state.peak[1], stop_reason=reason)
            return rf.write_summary({**row, **where})

        def do_eval(row: dict) -> None:
            row["eval_return"] = evaluate(state, eval_envs, args, eval_init)
            if args.objective == "fpopp":
                other = "random" if eval_init == "zero" else "zero"
                row[f"eval_return_{other}"] = evaluate(state, eval_envs, args, other)
            if row["eval_return"] > state.peak[0]:  # eq:peak: max over this run's evaluations
                state.peak = (row["eval_return"], state.global_step, state.update)
            curve[0].append(state.global_step)
            curve[1].append(row["eval_return"])
            rf.plot_curve(*curve, "environment steps", "evaluation return")
            at = f"update={state.update} step={state.global_step}"
            print(f"{at} eval_return={row['eval_return']:.2f} peak={state.peak[0]:.2f}")

        restored = rf.resuming and load_checkpoint(rf.load_checkpoint(map_location="cpu"), state)
        if not restored:  # fresh episodes everywhere, seeded from (seed, update)
            reset_envs(state, args.seed)
        if rf.resuming:
            rf.truncate_metrics(lambda r: r["update"] <= state.update)
            evals = [r for r in rf.read_metrics() if r.get("eval_return") is not None]
            curve = ([r["global_step"] for r in evals], [r["eval_return"] for r in evals])
        else:
            row = {"update": 0, "global_step": 0, "alpha": current_alpha(args, 0)}
            do_eval(row)
            rf.log(row, 0, TAGS)
            rf.save_checkpoint(checkpoint_payload(state))
        summary("running")
        status, reason = "finished", ""
        bar = rf.progress(num_updates, state.update)
        while state.update < num_updates:
            alpha = current_alpha(args, state.global_step)
            if args.anneal_lr:  # horizon total_timesteps, so a run continued in pieces follows one schedule
                frac = state.update / max(1, (args.anneal_steps or args.total_timesteps) // batch_size)
                state.optimizer.param_groups[0]["lr"] = args.learning_rate * max(1.0 - frac, 0.05)
            t0 = time.perf_counter()
            batch = collect_rollout(state, args)
            t1 = time.perf_counter()
            try:
                stats = update(state, batch, args, alpha)
            except NonFiniteLoss as err:
                print(str(err), flush=True)
                rf.log(
                    {"update": state.update + 1, "global_step": state.global_step, "nonfinite": True, "alpha": alpha},
                    state.global_step,
                    TAGS,
                )
                status, reason = "nonfinite", str(err)
                break
            t2 = time.perf_counter()
            state.update += 1
            if state.ema is not None:  # copy until the warm-up ends, then average
                for pe, pa in zip(state.ema.parameters(), state.actor.parameters()):
                    pe.data.lerp_(pa.data, 1.0 - args.actor_ema if state.update > args.ema_warmup else 1.0)
            row = {
                "update": state.update,
                "global_step": state.global_step,
                "alpha": alpha,
                "lr": state.optimizer.param_groups[0]["lr"],
                "sps": batch_size / (t2 - t0),
                "rollout_s": t1 - t0,
                "update_s": t2 - t1,
                **{k: batch[k] for k in EPISODE_KEYS},
                **stats,
            }
            if state.update % args.eval_every == 0 or state.update == num_updates:
                do_eval(row)
            rf.log(row, state.global_step, TAGS)
            bar.update(1)
            if args.restart_every and state.update % args.restart_every == 0:
                reset_envs(state, args.seed)  # before the checkpoint, so a resumed run starts the same episodes
            if state.update % ckpt_every == 0 or state.update == num_updates:
                rf.save_checkpoint(checkpoint_payload(state))
                if args.keep_checkpoints:
                    torch.save(checkpoint_payload(state), rf.path / "checkpoints" / f"update_{state.update:06d}.pt")
                summary("running")
                if rf.stop_requested and state.update < num_updates:  # a checkpoint boundary: exact resume
                    status, reason = "interrupted", f"{rf.signal_name} at update {state.update}"
                    break
        bar.close()
        state.envs.close()
        eval_envs.close()
        return summary(status, reason or ("num_updates reached" if status == "finished" else ""))


if __name__ == "__main__":
    cli(main, Args, presets=PRESETS)
