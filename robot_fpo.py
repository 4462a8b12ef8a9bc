"""FPO and FPO++ flow policies trained from scratch on MuJoCo / DeepMind Control tasks: the plain reference.

In plain torch, in the order it runs: flags, networks (a flow policy sampled by Euler steps, a critic), the two
objectives and their timestep weights (FPO: inside the exponent, eq:fpo-objective; FPO++: after the per-draw
exponential, eq:fpopp-objective), rollout, GAE, the minibatch loop, evaluation, main. ``t = 0`` is noise, ``t = 1``
the action. robot_fpo_fast.py runs this loop with captured, fused and scanned phases (same results, faster).

    python robot_fpo.py --env-id CartpoleSwingup-v1 --objective fpopp --alpha 0.5
    python robot_fpo.py --preset fpo --env-id WalkerRun-v1 --alpha-eps 0.5
"""

from __future__ import annotations

import copy
import math
import time
from dataclasses import dataclass, field, replace
from typing import Literal

import torch
import torch.nn as nn

from fpo_utils import legged  # command tracking of the legged joystick tasks
from fpo_utils import robot_bookkeeping as book  # argument checks, checkpoints, statistics rows
from fpo_utils.envs import RunningMeanStd, env_settings, normalize_obs, segment_seed
from fpo_utils.runfolder import NonFiniteLoss, RunFolder, cli, resume_mode
from weighting import fpo_weight_at, fpopp_weight, linear_schedule

FPO_GRID_SIZE = 10  # s in {0.1, ..., 1.0}, app:robotics


@dataclass
class Args:
    """Flags; ``--preset`` sets PRESETS' defaults, later flags override (sources: benchmarks/robot_results/README.md)"""

    preset: Literal["default", "fpo", "fpopp", "fpopp-locomotion"] = "default"  # named set of defaults (PRESETS)
    runs_dir: str = "runs"  # parent folder of the run folders
    run_name: str = ""  # run folder name (default ``<env>__<objective>__<alpha>__<preset>__<seed>``)
    seed: int = 1  # seed of the experiment
    resume: bool = False  # continue the run in ``runs/<run_name>`` from its checkpoint
    resume_or_start: bool = False  # continue the run if it has a checkpoint, else start it (queues of runs)
    track: bool = False  # also send the scalars to Weights & Biases
    cuda: bool = True  # use the GPU for the networks when one is present
    tf32: bool = True  # TF32 matrix products on CUDA (JAX's default on GPUs, so the official FPO code's)
    torch_threads: int = 1  # ``torch.set_num_threads`` (0 keeps torch's default)
    torch_deterministic: bool = True  # sets ``torch.backends.cudnn.deterministic``
    # Environment
    env_id: str = "HalfCheetah-v5"  # an envpool id (``WalkerRun-v1``, ...), a gymnasium id or a Playground task
    backend: Literal["auto", "envpool", "gymnasium", "playground"] = "auto"  # auto: envpool if it has the id
    num_envs: int = 64  # parallel environments
    env_threads: int = 0  # envpool threads (0: one per core this process may use)
    episode_length: int = 1000  # time limit of the playground backend (the others use the id's own limit)
    random_start: bool = False  # playground: training episodes start at random points of the limit (official FPO++)
    env_reset: Literal["first", "full"] = "first"  # playground: ended episodes restart from the first state, or reset
    physics: Literal["auto", "jax", "warp"] = "auto"  # playground: MJX (jax) or MuJoCo Warp; auto: per task, measured
    reward_scales: tuple[str, ...] = ()  # Playground tasks: reward terms' weights, TERM=WEIGHT (e.g. action_rate=-0.01)
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
    eval_other: bool = True  # FPO++: also evaluate from the other initial noise (eval_return_random, or _zero)
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
# critic 3 x 768, 1,500 updates of 4,096 envs x 24 steps (earlier versions here: 1,024 x 96, the same 98,304 steps).
PRESETS["fpopp-locomotion"] = replace(
    PRESETS["fpopp"], preset="fpopp-locomotion", env_id="SpotFlatTerrainJoystick-v1", num_envs=4096, num_steps=24,
    update_epochs=32, total_timesteps=1500 * 4096 * 24, num_draws=32, vf_coef=0.5, actor_hidden=256, critic_hidden=768,
    critic_layers=3, critic_act="silu", eval_every=50, eval_episodes=10,
)
# Settings --resume may change (total_timesteps moves --anneal-lr's horizon; evaluations draw no training randomness).
MAY_CHANGE = (
    "total_timesteps", "num_updates", "resume", "track", "cuda", "tf32", "torch_threads", "env_threads",
    "keep_checkpoints", "runs_dir", "eval_every", "checkpoint_every", "env_reset", "eval_other", "resume_or_start",
)
# fmt: on


# ---------------------------------------------------------------- Networks
def mlp(n_in: int, hidden: int, layers: int, n_out: int, act=nn.SiLU) -> nn.Sequential:
    sizes = [n_in] + [hidden] * layers
    blocks = [m for a, b in zip(sizes, sizes[1:]) for m in (nn.Linear(a, b), act())]
    return nn.Sequential(*blocks, nn.Linear(sizes[-1], n_out))


class FlowActor(nn.Module):
    """Velocity field ``v(obs, x_t, t)``: an MLP on [obs, x_t, cos(freqs t), sin(freqs t)], times output_scale."""

    def __init__(self, obs_dim, act_dim, hidden, layers, embed_dim, output_scale, embed_base=math.pi):
        super().__init__()
        if embed_dim % 2:
            raise ValueError(f"time_embed_dim={embed_dim} must be even")
        self.act_dim, self.output_scale = act_dim, output_scale
        self.register_buffer("freqs", embed_base * 2.0 ** torch.arange(embed_dim // 2, dtype=torch.float32))
        self.net = mlp(obs_dim + act_dim + embed_dim, hidden, layers, act_dim)

    def forward(self, obs: torch.Tensor, x_t: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        """obs (..., o), x_t (..., d), t (...) -> velocity (..., d); obs may broadcast against x_t."""
        ang = t.unsqueeze(-1) * self.freqs
        obs = obs.expand(*x_t.shape[:-1], obs.shape[-1])
        return self.net(torch.cat([obs, x_t, torch.cos(ang), torch.sin(ang)], dim=-1)) * self.output_scale

    @torch.no_grad()
    def sample(self, obs: torch.Tensor, x0: torch.Tensor, steps: int) -> torch.Tensor:
        """Euler steps of dx/dt = v(obs, x, t) from t = 0 (the noise x0 (n, d)) to t = 1."""
        x = x0
        for k in range(steps):
            x = x + self(obs, x, torch.full(x.shape[:-1], k / steps, device=x.device)) / steps
        return x


class Critic(nn.Module):  # a value MLP on its columns ``cols`` of the observation (privileged ones where there are)
    def __init__(self, obs_dim: int, hidden: int, layers: int, act: str = "tanh", cols: slice = slice(None)):
        super().__init__()
        self.cols, self.net = cols, mlp(obs_dim, hidden, layers, 1, act=nn.Tanh if act == "tanh" else nn.SiLU)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.net(obs[..., self.cols]).squeeze(-1)


def squash(x: torch.Tensor, mode: str) -> torch.Tensor:
    """The flow's action in [-1, 1] (the env rescales it to its box): tanh(x) or x clipped."""
    return torch.tanh(x) if mode == "tanh" else x.clamp(-1.0, 1.0)


# ---------------------------------------------------------------- The two objectives and their timestep weights
def sample_draws(n: int, m: int, d: int, objective: str, t_min: float, t_max: float, device):
    """(t, eps) draws per stored action: FPO t on {0, .1, ..., .9} (s = 1 - t), FPO++ t ~ U[t_min, t_max]."""
    if objective == "fpo":
        t = torch.randint(0, FPO_GRID_SIZE, (n, m), device=device).float() / FPO_GRID_SIZE
    else:
        t = t_min + (t_max - t_min) * torch.rand(n, m, device=device)
    return t, torch.randn(n, m, d, device=device)


def draw_losses(actor: FlowActor, obs, x, t, eps, objective: str) -> torch.Tensor:
    """Per-draw flow losses (n, M) at ``x_t = (1-t) eps + t x``: FPO ``|eps_hat - eps|^2 / d`` with
    ``eps_hat = x_t - t v``; FPO++ ``|v - u|^2 / sqrt(d)`` with ``u = x - eps``."""
    d, tt = eps.shape[-1], t.unsqueeze(-1)
    x_t = (1.0 - tt) * eps + tt * x.unsqueeze(1)
    v = actor(obs.unsqueeze(1), x_t, t)  # the observation broadcasts over the M draws
    if objective == "fpo":
        return ((x_t - tt * v - eps) ** 2).mean(-1)
    return ((v - (x.unsqueeze(1) - eps)) ** 2).sum(-1) / math.sqrt(d)


def draw_weights(t: torch.Tensor, args: Args, alpha: float) -> torch.Tensor:
    """The timestep weight of every draw (weighting.py): FPO ``w_alpha_eps(s = 1 - t)`` on the 10-point grid,
    FPO++ ``w_alpha(t)`` on [t_min, t_max]; both mean one under their draw law, so alpha = 1 weights all draws 1."""
    if args.objective == "fpo":
        return fpo_weight_at(1.0 - t, alpha)
    return fpopp_weight(t, alpha, args.t_min, args.t_max)


def ppo_surrogate(ratio: torch.Tensor, adv: torch.Tensor, clip_coef: float) -> torch.Tensor:
    """PPO maximisation surrogate ``min(r A, clip(r, 1-rho, 1+rho) A)`` (elementwise)."""
    return torch.minimum(ratio * adv, ratio.clamp(1.0 - clip_coef, 1.0 + clip_coef) * adv)


def spo_surrogate(ratio: torch.Tensor, adv: torch.Tensor, clip_coef: float) -> torch.Tensor:
    """SPO maximisation surrogate ``r A - |A| (r - 1)^2 / (2 rho)`` (elementwise)."""
    return ratio * adv - adv.abs() * (ratio - 1.0) ** 2 / (2.0 * clip_coef)


def trust_region_proxy(ratio: torch.Tensor, adv: torch.Tensor, clip_coef: float, mode: str) -> torch.Tensor:
    """FPO++ per-draw proxy: ``ppo``, ``spo`` or ``aspo`` (PPO where A > 0, SPO where A <= 0)."""
    ppo, spo = ppo_surrogate(ratio, adv, clip_coef), spo_surrogate(ratio, adv, clip_coef)
    return {"ppo": ppo, "spo": spo, "aspo": torch.where(adv > 0, ppo, spo)}[mode]


def straight_through_upper_clamp(x: torch.Tensor, upper: float) -> torch.Tensor:
    """Forward ``min(x, upper)``; backward the identity (straight-through)."""
    return x - (x - x.clamp(max=upper)).detach()


def fpo_loss(l_old, l_new, w, adv, clip_coef: float):
    """FPO actor loss (eq:fpo-objective), the weights INSIDE the exponent: ``D_i = mean_m w_im (l_old - l_new)_im``,
    ``r_i = exp(D_i)`` (D unclamped, as official FPO), ``L = -mean_i min(r_i A_i, clip(r_i, 1 +- rho) A_i)``.
    Returns (loss, ratio (n,), D (n,))."""
    d_i = (w * (l_old - l_new)).mean(-1)
    ratio = torch.exp(d_i)
    return -ppo_surrogate(ratio, adv, clip_coef).mean(), ratio, d_i


def fpopp_loss(l_old, l_new, w, adv, clip_coef: float, mode="aspo", loss_clamp=20.0, ratio_log_clamp=10.0):
    """FPO++ actor loss (eq:fpopp-objective), the weights AFTER the exponential: both losses clamped at c (official
    FPO++ clamps the current one again where A < 0, ``cfm_loss_clamp_negative_advantages_max``, also 20: the same);
    ``r_im = exp(C_STE(l_old - l_new))``; ``L = -1/(nM) sum w_im P_TR(r_im, A_i)``, ``adv`` normalised and clamped."""
    a = adv.unsqueeze(-1).expand_as(l_new)
    l_old_c, l_new_c = l_old.clamp(max=loss_clamp), l_new.clamp(max=loss_clamp)
    ratio = torch.exp(straight_through_upper_clamp(l_old_c - l_new_c, ratio_log_clamp))
    return -(w * trust_region_proxy(ratio, a, clip_coef, mode)).mean(), ratio


def current_alpha(args: Args, global_step: int) -> float:
    """The objective's exponent at this step: fixed, or the linear schedule over training blocks."""
    fixed = args.alpha_eps if args.objective == "fpo" else args.alpha
    if args.alpha_early is None and args.alpha_late is None:
        return float(fixed)
    early, late = (fixed if v is None else v for v in (args.alpha_early, args.alpha_late))
    return float(linear_schedule(global_step // args.block_size, early, late, args.k0, args.k1))


# ---------------------------------------------------------------- Training state, rollout and GAE
@dataclass
class State:  # everything that evolves during training, and what a checkpoint holds
    envs: object
    actor: FlowActor
    critic: Critic
    optimizer: torch.optim.Optimizer
    obs_rms: RunningMeanStd | None  # observation statistics (--norm-obs)
    ret_rms: RunningMeanStd | None  # statistics of the discounted return (--norm-reward)
    device: torch.device
    obs: torch.Tensor  # the environments' current observations (raw)
    ret_acc: torch.Tensor  # each environment's running discounted return (float64)
    ema: FlowActor | None = None  # the evaluated EMA copy of the actor (--actor-ema)
    obs_actor: slice = field(default_factory=lambda: slice(None))  # the actor's columns (the critic's: critic.cols)
    update: int = 0
    global_step: int = 0
    peak: tuple = (-math.inf, -1, -1)  # eq:peak: the best evaluation so far, its global step, its update


def reset_envs(state: State, seed: int) -> None:  # fresh episodes everywhere, seeded from (seed, update)
    state.obs.copy_(state.envs.reset(segment_seed(seed, state.update)))
    state.ret_acc.zero_()


def unrolls(a: torch.Tensor, T: int, k: int) -> torch.Tensor:
    """Rows (T * n, ...) in time-major order -> (n * T / k, k, ...): unrolls of k steps of one environment."""
    a = a.reshape(T // k, k, -1, *a.shape[1:])
    return a.movedim(2, 0).reshape(-1, k, *a.shape[3:])


def collect_rollout(state: State, args: Args) -> dict:
    """``num_steps`` vectorised steps, each storing the normalised observation and the sampled x -> the batch."""
    envs, actor, dev, rms = state.envs, state.actor, state.device, state.obs_rms
    n, T, d = envs.num_envs, args.num_steps, envs.act_dim
    noise = torch.randn(T, n, d, device=dev)  # the flow's initial noise, one draw per step and environment
    noisy = args.objective == "fpopp" and args.fpopp_action_noise > 0  # FPO++'s noise on the training actions
    act_noise = torch.randn(T, n, d, device=dev) if noisy else None
    obs_buf, final_buf = (torch.zeros(T, n, state.obs.shape[1], device=dev) for _ in range(2))
    x_buf = torch.zeros(T, n, d, device=dev)
    rew_buf, term_buf, trunc_buf = (torch.zeros(T, n, device=dev) for _ in range(3))
    ep = torch.zeros(3, dtype=torch.float64, device=dev)  # finished episodes: return sum, length sum, count
    obs = state.obs
    for step in range(T):
        if rms is not None and args.obs_stats == "step":
            rms.update(obs)
        o = normalize_obs(obs, rms)
        x = actor.sample(o[:, state.obs_actor], noise[step], args.flow_steps)
        if noisy:
            x = x + args.fpopp_action_noise * act_noise[step]
        if args.action_bound > 0:  # bounded stored actions (and old losses)
            x = x.clamp(-args.action_bound, args.action_bound)
        obs_buf[step], x_buf[step] = o, x
        obs, reward, term, trunc, info = envs.step(squash(x, args.action_squash))
        done = (term | trunc).double()
        ep += torch.stack([info["episode_return"].double(), info["episode_length"].double(), done]) @ done
        reward = reward.double() * args.reward_scale
        if state.ret_rms is not None:  # scale by the running std of the discounted return (CleanRL)
            state.ret_acc.mul_(args.gamma).add_(reward)
            state.ret_rms.update(state.ret_acc)
            reward = (reward / torch.sqrt(state.ret_rms.var + 1e-8)).clamp(-10.0, 10.0)
            state.ret_acc.mul_(1.0 - done)
        rew_buf[step], term_buf[step], trunc_buf[step] = reward.float(), term.float(), trunc.float()
        final_buf[step] = normalize_obs(info["final_obs"], rms)
    state.obs.copy_(obs)
    state.global_step += T * n
    return make_batch(state, args, obs_buf, x_buf, final_buf, rew_buf, term_buf, trunc_buf, ep)


@torch.no_grad()
def make_batch(state: State, args: Args, obs_buf, x_buf, final_buf, rew_buf, term_buf, trunc_buf, ep) -> dict:
    """The rollout's buffers (T, n, ...) -> the batch: (t, eps) draws, their old losses and GAE (``--gae-unroll``:
    unrolls, whose GAE each minibatch computes); a truncated episode bootstraps with ``gamma V(final obs)``."""
    actor, critic, rms, dev, (T, n, d) = state.actor, state.critic, state.obs_rms, state.device, x_buf.shape
    flat_obs, flat_x, cols = obs_buf.reshape(T * n, -1), x_buf.reshape(T * n, d), state.obs_actor
    # The old per-draw losses, once for the batch, with the rollout's (unchanged) policy.
    t, eps = sample_draws(T * n, args.num_draws, d, args.objective, args.t_min, args.t_max, dev)
    l_old = torch.cat(
        [draw_losses(actor, flat_obs[s, cols], flat_x[s], t[s], eps[s], args.objective) for s in book.chunks(T * n)]
    )
    if args.obs_stats == "update" and rms is not None:  # official FPO: new statistics from this rollout's
        mean, std = rms.mean.clone(), rms.var.sqrt()  # observations, then every stored one renormalised with them
        raw_obs, raw_final = (b.reshape(T * n, -1).double() * std + mean for b in (obs_buf, final_buf))
        rms.update(raw_obs)
        flat_obs, final_buf = rms.normalize(raw_obs), rms.normalize(raw_final).reshape(T, n, -1)
    batch = {"obs": flat_obs, "x": flat_x, "t": t, "eps": eps, "l_old": l_old}
    if not args.gae_unroll:  # GAE over the rollout with its critic
        values = torch.cat([critic(flat_obs[s]) for s in book.chunks(T * n)]).reshape(T, n)
        next_value = critic(normalize_obs(state.obs, rms))
        final_v = torch.cat([critic(final_buf.reshape(T * n, -1)[s]) for s in book.chunks(T * n)]).reshape(T, n)
        boot = args.gamma * trunc_buf * (1 - term_buf) * final_v
        nonterm = 1.0 - torch.maximum(term_buf, trunc_buf)
        delta = rew_buf + boot + args.gamma * torch.cat([values[1:], next_value[None]]) * nonterm - values
        adv, last = torch.zeros(T, n, device=dev), torch.zeros(n, device=dev)
        for s in reversed(range(T)):
            adv[s] = last = delta[s] + args.gamma * args.gae_lambda * nonterm[s] * last
        batch.update(adv=adv.reshape(-1), returns=(adv + values).reshape(-1))
    else:  # unrolls of gae_unroll steps of one environment; GAE follows in each minibatch
        rows = {"rew": rew_buf, "disc": args.gamma * (1 - term_buf), "trunc": trunc_buf, "boot": final_buf}
        batch.update({key: v.reshape(T * n, *v.shape[2:]) for key, v in rows.items()})
        batch = {key: unrolls(v, T, args.gae_unroll) for key, v in batch.items()}
        batch["boot"] = batch["boot"][:, -1]  # the observation after each unroll's last step (before any reset)
    return {**batch, **book.episode_stats(ep, x_buf)}


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
BATCH_KEYS = ("obs", "x", "t", "eps", "l_old", "adv", "returns")
UNROLL_KEYS = ("obs", "x", "t", "eps", "l_old", "rew", "disc", "trunc", "boot")


def update_source(batch: dict, args: Args, alpha: float) -> dict:
    """What the minibatches are cut from: the batch's training tensors, the timestep weight ``w`` of every draw
    (``draw_weights``), and for FPO++ the advantages normalised over the rollout."""
    src = {k: batch[k] for k in (UNROLL_KEYS if args.gae_unroll else BATCH_KEYS)}
    src["w"] = draw_weights(batch["t"], args, alpha)
    if args.objective == "fpopp" and args.norm_adv and not args.gae_unroll:
        src["adv"] = (src["adv"] - src["adv"].mean()) / (src["adv"].std() + 1e-8)
    return src


def minibatch_losses(state: State, src: dict, idx: torch.Tensor, args: Args):
    """(pg_loss, v_loss, ratio) of minibatch ``idx`` of ``src``; advantages normalised per minibatch (FPO,
    ``--gae-unroll``: from the current critic) or over the rollout (FPO++, in ``update_source``)."""
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
        pg_loss, ratio, _ = fpo_loss(b["l_old"], l_new, b["w"], adv, args.clip_coef)
    else:
        adv = adv.clamp(-args.adv_clamp, args.adv_clamp)
        clamps = (args.trust_region, args.loss_clamp, args.ratio_log_clamp)
        pg_loss, ratio = fpopp_loss(b["l_old"], l_new, b["w"], adv, args.clip_coef, *clamps)
    return pg_loss, v_loss, ratio


def gradient_step(state: State, pg_loss, v_loss, ratio, args: Args) -> torch.Tensor:
    """Backward, gradient clip, optimiser step -> the STAT_KEYS row (8,), left on the device; a step whose loss or
    gradient is not finite (``exp(D)`` overflows float32 past D = 88.7) is skipped and counted (book.finite_step)."""
    params = [p for g in state.optimizer.param_groups for p in g["params"]]
    state.optimizer.zero_grad(set_to_none=True)
    loss = pg_loss + args.vf_coef * v_loss
    loss.backward()
    gn = nn.utils.clip_grad_norm_(params, args.max_grad_norm if args.max_grad_norm > 0 else float("inf"), foreach=True)
    ok = book.finite_step(state.optimizer, loss)
    with torch.no_grad():
        r = ratio.detach()
        clipfrac = ((r - 1.0).abs() > args.clip_coef).float().mean()
        row = [pg_loss.detach(), v_loss.detach(), r.mean(), r.min(), r.max(), clipfrac, gn.to(r.dtype), ~ok]
        return torch.stack([v.to(r.dtype) for v in row]).float()


def update(state: State, batch: dict, args: Args, alpha: float) -> dict:
    """``update_epochs`` x ``num_minibatches`` gradient steps on the batch -> the update's statistics."""
    src = update_source(batch, args, alpha)
    n = src["obs"].shape[0]  # transitions, or unrolls with --gae-unroll
    mb, rows = n // args.num_minibatches, []
    for _ in range(args.update_epochs):
        perm = torch.randperm(n, device=state.device)
        for start in range(0, mb * args.num_minibatches, mb):
            rows.append(gradient_step(state, *minibatch_losses(state, src, perm[start : start + mb], args), args))
    return book.update_stats(torch.stack(rows), state.update)


@torch.no_grad()
def evaluate(state: State, envs, args: Args, init: str, sample=None) -> float:
    """Mean first-episode return of the evaluation environments (seeds ``eval_seed + i``), frozen statistics, the EMA
    actor if any; ``init`` zero: x0 = 0, random: x0 from ``eval_seed``; legged tasks add tracking errors (legged.py)."""
    gen = torch.Generator(device="cpu").manual_seed(args.eval_seed)
    sample = sample or (state.ema if state.ema is not None else state.actor).sample
    obs, n, d = envs.reset(args.eval_seed), envs.num_envs, envs.act_dim
    total, finished = torch.zeros(n, dtype=torch.float64), torch.zeros(n, dtype=torch.bool)
    tracker = legged.Tracker.of(envs)  # records nothing for a task without a command
    while not bool(finished.all()):
        o = normalize_obs(obs.to(state.device), state.obs_rms)
        x0 = (torch.zeros(n, d) if init == "zero" else torch.randn(n, d, generator=gen)).to(state.device)
        x = sample(o[:, state.obs_actor], x0, args.flow_steps).to(state.device)
        obs, reward, term, trunc, info = envs.step(squash(x, args.action_squash))
        total += torch.where(finished, 0.0, reward.cpu().double())
        tracker.add(info["final_obs"], ~finished)
        finished |= (term | trunc).cpu()
    return legged.eval_result(float(total.mean()), tracker)


# ---------------------------------------------------------------- Setup, checkpoints and main
def build_state(args: Args, device: torch.device) -> State:
    """Environments, networks, optimiser and normalisers for ``args`` (seed torch first)."""
    envs = book.task_envs(args, args.num_envs, segment_seed(args.seed, 0), device, args.random_start)
    obs_dim, act_dim, route = envs.obs_dim, envs.act_dim, envs.route
    embed = (args.time_embed_dim, args.output_scale, args.time_embed_base)
    actor = FlowActor(route.actor_dim, act_dim, args.actor_hidden, args.actor_layers, *embed).to(device)
    value_mlp = (args.critic_hidden, args.critic_layers, args.critic_act)
    critic = Critic(route.critic_dim, *value_mlp, route.obs_critic).to(device)
    for m in (m for net in (actor, critic) for m in net.modules() if isinstance(m, nn.Linear) and args.init == "lecun"):
        nn.init.uniform_(m.weight, -math.sqrt(3.0 / m.in_features), math.sqrt(3.0 / m.in_features))
        nn.init.zeros_(m.bias)
    params = list(actor.parameters()) + list(critic.parameters())  # one optimiser; the networks share nothing
    lr, eps, wd = args.learning_rate, args.adam_eps, args.weight_decay
    optimizer = torch.optim.AdamW(params, lr=lr, eps=eps, weight_decay=wd)
    ema = copy.deepcopy(actor).requires_grad_(False) if args.actor_ema > 0 else None
    # Per-column statistics: the actor's and the critic's columns each have their own (the official two normalisers).
    obs_rms = RunningMeanStd((obs_dim,), device, args.obs_stats == "update") if args.norm_obs else None
    ret_rms = RunningMeanStd((), device) if args.norm_reward else None
    obs = torch.zeros(args.num_envs, obs_dim, device=device)
    ret_acc = torch.zeros(args.num_envs, dtype=torch.float64, device=device)
    return State(envs, actor, critic, optimizer, obs_rms, ret_rms, device, obs, ret_acc, ema, route.obs_actor)


def main(
    args: Args, build=build_state, rollout=collect_rollout, learn=update, evaluator=evaluate, may_change=MAY_CHANGE
) -> dict:
    """Train (or continue with ``--resume``) until ``num_updates``; return ``summary.json``'s content.
    robot_fpo_fast.py passes its own phases ``build``, ``rollout``, ``learn`` and ``evaluator`` (same signatures)."""
    book.validate_args(args)
    args = replace(args, **env_settings(args.env_id, args.backend, args.obs_actor, args.obs_critic, args.physics))
    batch_size = args.num_envs * args.num_steps
    num_updates = args.num_updates or max(1, args.total_timesteps // batch_size)
    ckpt_every = args.checkpoint_every or args.eval_every
    rf = RunFolder(args.runs_dir, book.default_run_name(args), args, resume_mode(args), may_change, args.track)
    device = book.seed_and_device(args)  # seeds torch and numpy; threads, TF32, the device
    with rf:
        state = build(args, device)
        eval_envs = book.task_envs(args, args.eval_episodes, args.eval_seed, device)
        curve = ([], [])

        def summary(status: str, reason: str = "") -> dict:  # summary.json, with the peak (eq:peak)
            return rf.write_summary(book.summary_row(state, args, status, reason))

        def do_eval(row: dict) -> None:  # also eval_s, the evaluation's seconds
            t, inits = time.perf_counter(), book.eval_inits(args)
            row.update(legged.eval_row(evaluator(state, eval_envs, args, inits[0])))  # + eval_track_* if legged
            for other in inits[1:]:  # FPO++ (unless --no-eval-other): eval_return_random (or _zero) too
                row.update(legged.eval_row(evaluator(state, eval_envs, args, other), f"_{other}"))
            row["eval_s"] = time.perf_counter() - t
            if row["eval_return"] > state.peak[0]:  # eq:peak: max over this run's evaluations
                state.peak = (row["eval_return"], state.global_step, state.update)
            curve[0].append(state.global_step), curve[1].append(row["eval_return"])
            rf.plot_curve(*curve, "environment steps", "evaluation return")
            print(f"update={state.update} eval_return={row['eval_return']:.2f} peak={state.peak[0]:.2f}")

        restored = rf.resuming and book.load_checkpoint(rf.load_checkpoint(map_location="cpu"), state)
        if not restored:  # fresh episodes everywhere, seeded from (seed, update)
            reset_envs(state, args.seed)
        if rf.resuming:  # drop the rows after the checkpoint; the evaluation curve so far
            curve = book.resumed_curve(rf, state.update)
        else:
            row = {"update": 0, "global_step": 0, "alpha": current_alpha(args, 0)}
            do_eval(row)
            rf.log(row, 0, book.TAGS)
            rf.save_checkpoint(book.checkpoint_payload(state))
        summary("running")
        status, reason = "finished", ""
        bar = rf.progress(num_updates, state.update)
        while state.update < num_updates:
            alpha = current_alpha(args, state.global_step)
            if args.anneal_lr:  # horizon total_timesteps, so a run continued in pieces follows one schedule
                frac = state.update / max(1, (args.anneal_steps or args.total_timesteps) // batch_size)
                state.optimizer.param_groups[0]["lr"] = args.learning_rate * max(1.0 - frac, 0.05)
            t0 = time.perf_counter()
            batch = rollout(state, args)
            t1 = time.perf_counter()
            try:
                stats = learn(state, batch, args, alpha)
            except NonFiniteLoss as err:
                print(str(err), flush=True)
                row = {"update": state.update + 1, "global_step": state.global_step, "nonfinite": True, "alpha": alpha}
                rf.log(row, state.global_step, book.TAGS)
                status, reason = "nonfinite", str(err)
                break
            t2 = time.perf_counter()
            state.update += 1
            if state.ema is not None:  # copy until the warm-up ends, then average
                for pe, pa in zip(state.ema.parameters(), state.actor.parameters()):
                    pe.data.lerp_(pa.data, 1.0 - args.actor_ema if state.update > args.ema_warmup else 1.0)
            row = dict(update=state.update, global_step=state.global_step, alpha=alpha, **stats)
            row.update(lr=state.optimizer.param_groups[0]["lr"], sps=batch_size / (t2 - t0))
            row.update(rollout_s=t1 - t0, update_s=t2 - t1, **{k: batch[k] for k in book.EPISODE_KEYS})
            if state.update % args.eval_every == 0 or state.update == num_updates:
                do_eval(row)
            rf.log(row, state.global_step, book.TAGS)
            bar.update(1)
            if args.restart_every and state.update % args.restart_every == 0:
                reset_envs(state, args.seed)  # before the checkpoint, so a resumed run starts the same episodes
            if state.update % ckpt_every == 0 or state.update == num_updates:
                keep = f"update_{state.update:06d}.pt" if args.keep_checkpoints else None
                rf.save_checkpoint(book.checkpoint_payload(state), keep_as=keep)
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
