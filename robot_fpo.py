"""FPO and FPO++ flow policies trained from scratch on gymnasium / DM Control tasks.

A single-file, CleanRL-style trainer (compare with CleanRL's ``ppo_continuous_action.py``):
a flow policy (MLP on the normalised observation, the noisy action and a time embedding,
sampled with Euler steps), a value network, GAE, running observation normalisation and
vectorised gymnasium environments. Two actor objectives are selected with ``--objective``:

``fpo`` (eq:fpo-objective)
    Noise-target residual ``l_eps = |eps_hat - eps|^2 / d`` on the discrete noise grid
    ``s = 1 - t in {0.1, ..., 1.0}``. The timestep weight sits INSIDE the exponent:
    ``D_i = 1/M sum_m w_alpha_eps(s_im) (l_eps,old - l_eps,theta)``, ``r_i = exp(D_i)``,
    PPO clip. ``--alpha-eps 1`` is the native FPO objective.

``fpopp`` (eq:fpopp-objective)
    Per-draw velocity loss ``l = |v - u|^2 / sqrt(d)`` with the native loss clamps
    (old and current loss <= 20), a straight-through upper clamp on the
    loss difference, per-draw ratios, and the ASPO trust region (PPO where A > 0, SPO where
    A <= 0). The weight ``w_alpha(t)`` multiplies the per-draw proxy AFTER exponentiation.
    Flow time ``t ~ U[0.005, 0.995]``; evaluation integrates from zero initial noise (and,
    for reference, from random noise). ``--alpha 1`` is the native FPO++ objective.

The weight placement is the point of the comparison (tab:placement): moving the weight across
the exponential changes the objective.

Conventions: ``t = 0`` is noise and ``t = 1`` is the action; ``x_t = (1 - t) eps + t x``,
velocity target ``u = x - eps``. By default the environment receives ``tanh(x)`` rescaled to
the action bounds and the unsquashed ``x`` (clamped to ``--action-bound``) is stored for the
flow losses (FPO reference); ``--action-squash clip`` sends ``x`` clipped to [-1, 1] instead.

Scales. The FPO reference setting (MuJoCo Playground: 2048 environments, 983,040-step
"blocks", 60M steps) and the FPO++ one (Isaac Lab) do not fit gymnasium's CPU simulators.
The defaults below are tuned for gymnasium MuJoCo on a CPU or one GPU (64 environments,
CleanRL-like rollouts and minibatches). ``--block-size`` keeps the paper's block of 983,040
environment steps; it is used only to index alpha schedules (app:schedules).

Defaults versus the reference codes (gymnasium-scale choices are marked *):
FPO reference values kept: 8 draws per action stored with the old losses at rollout time,
losses averaged over draws before ``exp`` with no clamp, PPO clip 0.05, 10 Euler steps from
N(0, I), ``tanh`` actions, running observation normalisation, velocity output scaled by 0.25,
SiLU flow MLP. Changed: * 64 environments x 64 steps, 16 minibatches x 4 epochs (reference:
2048 x 30, 32 x 16); * Adam lr 6e-4 (reference: 3e-4, which moved the policy too little per
update at this batch size) annealed over the run; * the sampled
pre-tanh action clamped to [-3, 3] before it is stored (``--action-bound``); * gamma 0.99
and reward scaling by the running return std (reference: 0.995 and x10); * gradient clip 0.5;
* flow MLP 3 x 64, critic 2 x 64 tanh (reference: 4 x 32, 5 x 256). FPO++ shares these defaults; its reference values (16 draws,
64 Euler steps, AdamW lr 1e-4 with weight decay 1e-4, gradient clip 1.0) are reachable with
``--num-draws``, ``--flow-steps``, ``--learning-rate``, ``--weight-decay``, ``--max-grad-norm``;
its actor EMA is not implemented.

Stability on HalfCheetah-v5 / Walker2d-v5. With 16 environments, 4 minibatches, a constant
learning rate and unbounded stored actions, FPO's ratio exp(D) overflowed after 300-420k steps
while the stored pre-tanh actions drifted to |x| ~ 25 (tanh saturates, so nothing pulls them
back, and the flow losses of such actions are huge). The defaults keep the objectives exactly as
written and stabilise the surrounding machinery: the stored action is clamped to [-3, 3] (the
environment action box is still reachable, tanh(3) = 0.995), the batch is 4x larger, and the
learning rate is annealed. At lr 3e-4 FPO stayed finite to 1M steps on both tasks but barely
learned (HalfCheetah peak 284); at lr 6e-4 HalfCheetah-v5 (alpha_eps = 1) reaches 729 +- 395 at 1M
steps over three seeds (peak 920 +- 87; Gaussian PPO: 1442 +- 46), while Walker2d-v5 stays at
329 +- 119 (PPO: 2288 +- 572). Larger learning rates
(1e-3, 2e-3, with 2 epochs) learn even faster in 250k-step runs, but over 1M-step schedules
the policy drifted onto the action bound and single updates ran away (ratio ~1e22): all four
1M-step runs at 2e-3 went non-finite. ``--target-kl`` (early stopping) and ``--anneal-steps`` (a shorter lr decay) are
available for such settings. Results and every trial: ``benchmarks/robot_results/README.md``.
InvertedPendulum-v5 is solved faster with the smaller batch
(``benchmarks/learn_inverted_pendulum.sh`` passes its settings explicitly).

Speed. Rollout actions are sampled by a float32 numpy copy of the flow MLP (64 small
batches per rollout; cheaper than torch dispatch). With the networks on a GPU the update's
minibatch step (gather, both losses, backward, gradient clip, fused AdamW) is captured once as
a CUDA graph and replayed for every minibatch (``--cuda-graph``): at the defaults it takes
0.026 s per 4096-step batch on an H200 instead of 0.25 s eager, and end-to-end throughput on
16 cores reaches 70-76% of the environment-only rate. On CPU nothing changes.

Run folder ``runs/<run_name>/``: ``args.json``, ``metrics.jsonl`` (one row per update: SPS,
episodic returns, losses, ratio statistics, clip fraction, current alpha, and evaluation
returns every ``--eval-every`` updates), ``summary.json`` (status, peak evaluation return
(eq:peak) and its step) and ``checkpoints/latest.pt``. A non-finite loss or gradient ends the
run with status ``nonfinite`` and leaves the last good checkpoint in place (the paper reports
such runs, e.g. Walker at alpha_eps = 0).

Reproducibility and ``--resume``. Checkpoints are written at update boundaries every
``--checkpoint-every`` updates (atomically: temporary file + ``os.replace``). They hold the
networks, the optimiser, the observation / reward normaliser statistics and the torch, numpy
and python RNG states. Simulator state is not stored: instead, at every checkpoint boundary
(and at the start) all environments are reset with seeds derived from ``(seed, update)``, in
an uninterrupted run as well as after a resume. Partial episodes at a boundary are treated as
truncated (bootstrapped from the value of the last observation). A resumed run therefore
reproduces the uninterrupted run's metrics exactly on CPU, provided it resumes from a
checkpoint at a multiple of ``--checkpoint-every`` (a run stopped early by ``--num-updates``
at another update reseeds its environments when continued).

Example::

    python robot_fpo.py --env-id HalfCheetah-v5 --objective fpo --alpha-eps 0.5
    python robot_fpo.py --env-id dm_control/cartpole-swingup-v0 --objective fpopp --alpha 0.5
"""

from __future__ import annotations

import json
import math
import os
import random
import shutil
import sys
import time
import warnings
from dataclasses import asdict, dataclass
from typing import Literal

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import tyro

from weighting import fpo_weight_at, fpopp_weight, linear_schedule

FPO_GRID_SIZE = 10  # s in {0.1, ..., 1.0}, app:robotics


@dataclass
class Args:
    exp_name: str = "robot_fpo"
    """the name of this experiment (used in the default run name)"""
    run_name: str = ""
    """folder name under ``--run-dir``; default ``<env>__<exp_name>__<objective>__<seed>``"""
    run_dir: str = "runs"
    """parent folder of the run folders"""
    seed: int = 1
    """seed of the experiment"""
    torch_deterministic: bool = True
    """sets ``torch.backends.cudnn.deterministic``"""
    cuda: bool = True
    """use the GPU for the networks when one is present"""
    torch_threads: int = 1
    """``torch.set_num_threads`` for this process (0 keeps torch's default); the networks are
    small, and one thread is fastest on a busy or small CPU"""
    cuda_graph: bool = True
    """on the GPU, capture the minibatch step of the update (gather, actor and critic losses,
    backward, gradient clip, fused AdamW step) as one CUDA graph and replay it for every
    minibatch; the small networks make the eager update launch-bound. Used when the networks are
    on CUDA and ``--target-kl`` is 0 (early stopping needs a host read per step); ignored on CPU"""

    # Environment
    env_id: str = "HalfCheetah-v5"
    """any continuous-action gymnasium id, e.g. ``Walker2d-v5`` or ``dm_control/walker-run-v0``"""
    num_envs: int = 64
    """the number of parallel environments (64: a larger batch than CleanRL's 2048 steps, closer to
    the reference's; with 16 the HalfCheetah/Walker2d runs went non-finite at 300-420k steps, and
    64 environments also amortise the per-step sampling cost, see benchmarks/bench_robot_sps.py)"""
    async_envs: bool = False
    """step environments in subprocesses (``AsyncVectorEnv``) instead of in-process"""
    norm_obs: bool = True
    """running observation normalisation (app:robotics)"""
    norm_reward: bool = True
    """scale rewards by the running std of the discounted return (CleanRL; gymnasium scale)"""

    # Algorithm
    objective: Literal["fpo", "fpopp"] = "fpo"
    """actor objective: FPO (eq:fpo-objective) or FPO++ (eq:fpopp-objective)"""
    total_timesteps: int = 1_000_000
    """total environment steps of the run"""
    num_updates: int = 0
    """stop after this many updates in total (0: ``total_timesteps // batch size``)"""
    learning_rate: float = 6e-4
    """Adam learning rate (FPO reference: 3e-4 with far larger batches). At 1M steps, 6e-4
    reached 729 +- 395 on HalfCheetah-v5 over three seeds (3e-4, one seed: 7, peak 284);
    1e-3 and 2e-3 learn faster early but collapsed or went non-finite over 1M-step schedules.
    See benchmarks/robot_results/README.md"""
    anneal_lr: bool = True
    """linearly anneal the learning rate over ``total_timesteps`` to a floor of 5% (as CleanRL
    anneals); together with the larger batch and ``--action-bound`` it kept the 1M-step
    HalfCheetah/Walker2d runs finite"""
    anneal_steps: int = 0
    """environment steps over which ``--anneal-lr`` decays the learning rate to its floor, after
    which it stays there (0: ``total_timesteps``)"""
    weight_decay: float = 0.0
    """decoupled weight decay (AdamW); the FPO++ reference uses 1e-4"""
    num_steps: int = 64
    """rollout length per environment per update"""
    gamma: float = 0.99
    """discount factor"""
    gae_lambda: float = 0.95
    """GAE lambda"""
    num_minibatches: int = 16
    """minibatches per epoch (16 x 256 samples at the defaults; 4 minibatches barely moved the
    policy on HalfCheetah: clip fraction ~0 and much slower learning)"""
    update_epochs: int = 4
    """epochs over each rollout (2 epochs halve the update's compute; at lr 2e-3 they learned as
    fast as 4 in 250k-step HalfCheetah-v5 runs, at lr 1e-3 with 8 minibatches much slower)"""
    norm_adv: bool = True
    """normalise advantages (per minibatch for FPO, over the whole rollout for FPO++)"""
    clip_coef: float = 0.05
    """trust-region width rho (0.05 in both reference codes)"""
    vf_coef: float = 0.5
    """value loss coefficient"""
    max_grad_norm: float = 0.5
    """global gradient-norm clip (<= 0 disables)"""
    target_kl: float = 0.0
    """early stopping of the update (CleanRL's ``--target-kl``, checked before every minibatch
    step): when a minibatch's approximate KL ``mean((r - 1) - log r)`` over its ratios exceeds
    this, that step and the rest of the update are skipped (<= 0 disables). The objective is
    unchanged. At 0.05 it never fired in healthy phases, but it did not prevent the slow
    collapse of lr-1e-3 runs either (it only stops the runaway step: no non-finite losses)"""

    # Flow policy
    num_draws: int = 8
    """(t, eps) draws M per stored action (FPO reference: 8; FPO++: 16)"""
    flow_steps: int = 10
    """Euler steps of the sampler (FPO reference: 10; FPO++ uses 64)"""
    actor_hidden: int = 64
    """width of the flow MLP"""
    actor_layers: int = 3
    """hidden layers of the flow MLP"""
    critic_hidden: int = 64
    """width of the value MLP"""
    critic_layers: int = 2
    """hidden layers of the value MLP"""
    time_embed_dim: int = 8
    """sinusoidal time-embedding size (even)"""
    output_scale: float = 0.25
    """scale on the velocity output (FPO reference)"""

    # Timestep weighting and schedules
    alpha_eps: float = 1.0
    """FPO exponent: w(s) proportional to s^(2(1-alpha_eps)); 1 is native (app:robotics)"""
    alpha: float = 1.0
    """FPO++ exponent: w(t) proportional to (1-t)^(2(1-alpha)); 1 is native (app:robotics)"""
    alpha_early: float | None = None
    """schedule start value of the objective's exponent (with ``--alpha-late``)"""
    alpha_late: float | None = None
    """schedule end value of the objective's exponent (app:schedules)"""
    k0: float = 12.0
    """schedule start, in training blocks (robotics A20/W5 schedules: 12)"""
    k1: float = 36.0
    """schedule end, in training blocks (robotics A20/W5 schedules: 36)"""
    block_size: int = 983_040
    """environment steps per training block (app:robotics); only indexes schedules"""

    # FPO++ specifics
    trust_region: Literal["aspo", "ppo", "spo"] = "aspo"
    """FPO++ per-draw trust-region proxy"""
    loss_clamp: float = 20.0
    """FPO++ upper clamp on both the old and the current loss (and again on the current loss where A < 0)"""
    ratio_log_clamp: float = 10.0
    """FPO++ straight-through upper clamp on l_old - l_theta"""
    adv_clamp: float = 100.0
    """FPO++ clamp on the normalised advantages"""
    t_min: float = 0.005
    """FPO++ lower flow time (app:robotics)"""
    t_max: float = 0.995
    """FPO++ upper flow time (app:robotics)"""
    action_squash: Literal["clip", "tanh"] = "tanh"
    """how the flow's action x meets the action box: ``tanh`` sends ``tanh(x)`` rescaled to the
    bounds (FPO reference); ``clip`` sends x clipped to [-1, 1] and rescaled (as a Gaussian PPO
    policy's actions are clipped). Either way the stored x is only clamped to
    ``[-action_bound, action_bound]``. ``clip`` with bound 1.5 learned much less on HalfCheetah-v5
    (-262 vs 77 at 246k steps, lr 3e-4)"""
    action_bound: float = 3.0
    """clamp the sampled action x to [-b, b] before it is stored and sent to the environment
    (<= 0 disables). tanh(3) = 0.995, so the reachable action box is unchanged, but stored
    actions (and hence the old flow losses) stay bounded; without it the pre-tanh actions
    drifted to |x| ~ 25 on HalfCheetah/Walker2d and exp(D) overflowed. With tanh the policy can
    drift towards the bound without any change in return: at lr 1e-3 every stored action of a
    HalfCheetah-v5 run sat on the bound after 160k steps; a bound of 2 delayed but did not
    remove such collapses"""
    fpopp_action_noise: float = 0.02
    """std of Gaussian noise FPO++ adds to training actions (0 disables)"""

    # Evaluation, logging, checkpoints
    eval_every: int = 10
    """evaluate every this many updates (and at updates 0 and last)"""
    eval_episodes: int = 5
    """fixed-seed evaluation episodes"""
    eval_seed: int = 10_000
    """first seed of the evaluation episodes"""
    eval_init: Literal["native", "zero", "random"] = "native"
    """initial noise of evaluation sampling; native: random for FPO, zero for FPO++"""
    checkpoint_every: int = 0
    """checkpoint (and reseed environments) every this many updates (0: ``eval_every``); keep
    ``checkpoint_every * num_steps`` above the episode length (1000 on the MuJoCo tasks) so that
    full episodes are seen and reported as ``episodic_return``"""
    resume: bool = False
    """continue from ``runs/<run_name>/checkpoints/latest.pt`` when it exists"""
    keep_checkpoints: bool = False
    """also keep every checkpoint as ``checkpoints/update_NNNNNN.pt`` (e.g. for ``diagnostics.py robot-phases``)"""


# ----------------------------------------------------------------------------------------
# Environments
# ----------------------------------------------------------------------------------------


def make_env(env_id: str):
    """Return a thunk building one environment with a flat Box observation."""

    def thunk():
        if env_id.startswith("dm_control/"):
            os.environ.setdefault("MUJOCO_GL", "disable")
            import shimmy  # noqa: F401  (registers dm_control/* ids)

            gym.register_envs(shimmy)
        env = gym.make(env_id)
        if not isinstance(env.action_space, gym.spaces.Box):
            raise ValueError(f"env_id={env_id!r} has action space {env.action_space}; a continuous Box is required")
        if isinstance(env.observation_space, gym.spaces.Dict):
            env = gym.wrappers.FlattenObservation(env)
        return env

    return thunk


def make_vec_env(env_id: str, num_envs: int, async_envs: bool = False) -> gym.vector.VectorEnv:
    """Vectorised environments that report the final observation of an episode in the same step."""
    kw = {"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP}
    fns = [make_env(env_id) for _ in range(num_envs)]
    if async_envs:
        return gym.vector.AsyncVectorEnv(fns, **kw)
    return gym.vector.SyncVectorEnv(fns, **kw)


def segment_seeds(seed: int, update: int, n: int) -> list[int]:
    """Environment seeds for the segment starting at ``update`` (deterministic in (seed, update))."""
    base = int(np.random.SeedSequence([seed, update]).generate_state(1)[0])
    return [(base + i) % (2**31 - 1) for i in range(n)]


def squash_action(x: np.ndarray, low: np.ndarray, high: np.ndarray, mode: str = "tanh") -> np.ndarray:
    """Map the flow's action to the box: ``low + (g(x) + 1)(high - low)/2`` with g = tanh or clip to [-1, 1]."""
    if mode not in ("tanh", "clip"):
        raise ValueError(f"action_squash={mode!r}; allowed: 'clip', 'tanh'")
    g = np.tanh(x) if mode == "tanh" else np.clip(x, -1.0, 1.0)
    return low + 0.5 * (g + 1.0) * (high - low)


class RunningMeanStd:
    """Running mean / variance with the parallel (Chan et al.) update, as in CleanRL's wrappers."""

    def __init__(self, shape=()):
        self.mean = np.zeros(shape, np.float64)
        self.var = np.ones(shape, np.float64)
        self.count = 1e-4

    def update(self, x: np.ndarray) -> None:
        bm, bv, bc = x.mean(0), x.var(0), x.shape[0]
        delta = bm - self.mean
        tot = self.count + bc
        self.mean = self.mean + delta * bc / tot
        m2 = self.var * self.count + bv * bc + delta**2 * self.count * bc / tot
        self.var = m2 / tot
        self.count = tot

    def state_dict(self) -> dict:
        return {"mean": self.mean.copy(), "var": self.var.copy(), "count": self.count}

    def load_state_dict(self, d: dict) -> None:
        self.mean, self.var, self.count = np.array(d["mean"]), np.array(d["var"]), float(d["count"])


def normalize_obs(obs: np.ndarray, rms: RunningMeanStd | None) -> np.ndarray:
    """``clip((obs - mean)/sqrt(var + 1e-8), -10, 10)`` as float32 (identity without statistics)."""
    if rms is None:
        return obs.astype(np.float32)
    return np.clip((obs - rms.mean) / np.sqrt(rms.var + 1e-8), -10.0, 10.0).astype(np.float32)


# ----------------------------------------------------------------------------------------
# Networks
# ----------------------------------------------------------------------------------------


def mlp(n_in: int, hidden: int, layers: int, n_out: int, act=nn.SiLU) -> nn.Sequential:
    mods, d = [], n_in
    for _ in range(layers):
        mods += [nn.Linear(d, hidden), act()]
        d = hidden
    mods.append(nn.Linear(d, n_out))
    return nn.Sequential(*mods)


class FlowActor(nn.Module):
    """Velocity field ``v(obs, x_t, t)``: an MLP on [obs, x_t, sinusoidal embedding of t]."""

    def __init__(self, obs_dim: int, act_dim: int, hidden: int, layers: int, embed_dim: int, output_scale: float):
        super().__init__()
        if embed_dim % 2:
            raise ValueError(f"time_embed_dim={embed_dim} must be even")
        self.act_dim = act_dim
        self.output_scale = output_scale
        self.register_buffer("freqs", math.pi * 2.0 ** torch.arange(embed_dim // 2, dtype=torch.float32))
        self.net = mlp(obs_dim + act_dim + embed_dim, hidden, layers, act_dim)

    def forward(self, obs: torch.Tensor, x_t: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        """obs (..., o), x_t (..., d), t (...) -> velocity (..., d).

        The first layer acts on the concatenation [obs, x_t, emb(t)]; it is applied block by
        block, so ``obs`` may have singleton dimensions that broadcast against ``x_t`` (e.g.
        (n, 1, o) against (n, M, d): the observation term is then computed once per action,
        not once per draw).
        """
        ang = t.unsqueeze(-1) * self.freqs
        first = self.net[0]
        o, d = obs.shape[-1], self.act_dim
        w = first.weight
        h = nn.functional.linear(obs, w[:, :o]) + nn.functional.linear(x_t, w[:, o : o + d])
        h = h + nn.functional.linear(torch.cat([torch.cos(ang), torch.sin(ang)], dim=-1), w[:, o + d :], first.bias)
        return self.net[1:](h) * self.output_scale

    @torch.no_grad()
    def sample(self, obs: torch.Tensor, x0: torch.Tensor, steps: int) -> torch.Tensor:
        """Euler integration of dx/dt = v from t=0 (noise x0) to t=1 on a uniform grid."""
        x, dt = x0, 1.0 / steps
        for k in range(steps):
            t = torch.full(x.shape[:-1], k * dt, device=x.device)
            x = x + dt * self(obs, x, t)
        return x


class NumpyFlowSampler:
    """CPU/numpy (float32) copy of a FlowActor's weights for fast small-batch Euler sampling.

    A rollout samples one action per environment per step, i.e. ``flow_steps`` MLP
    evaluations on a batch of ``num_envs`` rows; numpy does this several times faster than
    torch's per-op dispatch. The first layer is split by input block, so the observation
    term is computed once per action and the time-embedding term once per Euler step.
    The losses that train the policy are always computed in torch.
    """

    def __init__(self, actor: FlowActor):
        lin = [m for m in actor.net if isinstance(m, nn.Linear)]
        w = [m.weight.detach().cpu().float().numpy().T.copy() for m in lin]
        self.b = [m.bias.detach().cpu().float().numpy().copy() for m in lin]
        n_obs = w[0].shape[0] - actor.act_dim - actor.freqs.numel() * 2
        self.w_obs, self.w_x, self.w_t = w[0][:n_obs], w[0][n_obs : n_obs + actor.act_dim], w[0][n_obs + actor.act_dim :]
        self.w = w
        self.freqs = actor.freqs.detach().cpu().double().numpy()
        self.scale = np.float32(actor.output_scale)
        self._time_terms: dict[int, list[np.ndarray]] = {}
        self._bufs: dict[int, list[np.ndarray]] = {}

    def _time_term(self, steps: int) -> list[np.ndarray]:
        if steps not in self._time_terms:
            ang = (np.arange(steps) / steps)[:, None] * self.freqs
            emb = np.concatenate([np.cos(ang), np.sin(ang)], axis=1).astype(np.float32)
            self._time_terms[steps] = list(emb @ self.w_t)
        return self._time_terms[steps]

    def _buffers(self, n: int) -> list[np.ndarray]:
        if n not in self._bufs:
            width = self.w_x.shape[1]
            self._bufs[n] = [np.empty((n, w.shape[1]), np.float32) for w in self.w] + [np.empty((n, width), np.float32)]
        return self._bufs[n]

    def sample(self, obs: np.ndarray, x0: np.ndarray, steps: int) -> np.ndarray:
        """Euler samples (float64) for float32 ``obs`` (n, o) and initial noise ``x0`` (n, d).

        Every intermediate lives in preallocated float32 buffers (``np.dot`` with ``out=``, which
        has less call overhead than ``@``, and in-place operations); the arithmetic, and hence
        every bit of the result, is that of the plain expression ``x + dt * scale * (silu(h @ W + b) ...)``.
        """
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
        return x.astype(np.float64)


def _silu_(h: np.ndarray, tmp: np.ndarray) -> None:
    """In-place SiLU ``h <- h / (1 + exp(-h))`` using the scratch array ``tmp`` (same shape)."""
    np.negative(h, out=tmp)
    np.exp(tmp, out=tmp)
    tmp += 1.0
    np.divide(h, tmp, out=h)


class Critic(nn.Module):
    def __init__(self, obs_dim: int, hidden: int, layers: int):
        super().__init__()
        self.net = mlp(obs_dim, hidden, layers, 1, act=nn.Tanh)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.net(obs).squeeze(-1)


# ----------------------------------------------------------------------------------------
# Flow losses and objectives
# ----------------------------------------------------------------------------------------


def sample_draws(n: int, m: int, d: int, objective: str, t_min: float, t_max: float, device) -> tuple[torch.Tensor, torch.Tensor]:
    """(t, eps) draws per stored action: FPO t on {0, .1, ..., .9} (s = 1-t on {.1,...,1}), FPO++ t ~ U[t_min, t_max]."""
    if objective == "fpo":
        t = torch.randint(0, FPO_GRID_SIZE, (n, m), device=device).float() / FPO_GRID_SIZE
    else:
        t = t_min + (t_max - t_min) * torch.rand(n, m, device=device)
    return t, torch.randn(n, m, d, device=device)


def draw_losses(actor: FlowActor, obs: torch.Tensor, x: torch.Tensor, t: torch.Tensor, eps: torch.Tensor, objective: str) -> torch.Tensor:
    """Per-draw flow losses (n, M) at ``x_t = (1-t) eps + t x``.

    FPO: noise-target residual ``|eps_hat - eps|^2 / d`` with ``eps_hat = x_t - t v``.
    FPO++: velocity residual ``|v - u|^2 / sqrt(d)`` with ``u = x - eps``.
    """
    n, m, d = eps.shape
    tt = t.unsqueeze(-1)
    x_t = (1.0 - tt) * eps + tt * x.unsqueeze(1)
    v = actor(obs.unsqueeze(1), x_t, t)  # the observation broadcasts over the M draws
    if objective == "fpo":
        eps_hat = x_t - tt * v
        return ((eps_hat - eps) ** 2).mean(-1)
    u = x.unsqueeze(1) - eps
    return ((v - u) ** 2).sum(-1) / math.sqrt(d)


def ppo_surrogate(ratio: torch.Tensor, adv: torch.Tensor, clip_coef: float) -> torch.Tensor:
    """PPO maximisation surrogate ``min(r A, clip(r, 1-rho, 1+rho) A)`` (elementwise)."""
    return torch.minimum(ratio * adv, ratio.clamp(1.0 - clip_coef, 1.0 + clip_coef) * adv)


def spo_surrogate(ratio: torch.Tensor, adv: torch.Tensor, clip_coef: float) -> torch.Tensor:
    """SPO maximisation surrogate ``r A - |A| (r - 1)^2 / (2 rho)`` (elementwise)."""
    return ratio * adv - adv.abs() * (ratio - 1.0) ** 2 / (2.0 * clip_coef)


def trust_region_proxy(ratio: torch.Tensor, adv: torch.Tensor, clip_coef: float, mode: str) -> torch.Tensor:
    """FPO++ per-draw proxy: ``ppo``, ``spo`` or ``aspo`` (PPO where A > 0, SPO where A <= 0)."""
    if mode == "ppo":
        return ppo_surrogate(ratio, adv, clip_coef)
    if mode == "spo":
        return spo_surrogate(ratio, adv, clip_coef)
    if mode == "aspo":
        return torch.where(adv > 0, ppo_surrogate(ratio, adv, clip_coef), spo_surrogate(ratio, adv, clip_coef))
    raise ValueError(f"trust_region={mode!r}; allowed: 'aspo', 'ppo', 'spo'")


def straight_through_upper_clamp(x: torch.Tensor, upper: float) -> torch.Tensor:
    """Forward ``min(x, upper)``; backward the identity (straight-through)."""
    return x - (x - x.clamp(max=upper)).detach()


def fpo_loss(
    l_old: torch.Tensor, l_new: torch.Tensor, t: torch.Tensor, adv: torch.Tensor, alpha_eps: float, clip_coef: float,
    w: torch.Tensor | None = None,
):
    """FPO actor loss (eq:fpo-objective); weight inside the exponent.

    ``D_i = mean_m w_alpha_eps(1 - t_im) (l_old - l_new)_im``, ``r_i = exp(D_i)``,
    ``L = -mean_i min(r_i A_i, clip(r_i, 1-rho, 1+rho) A_i)``. No clamp on D (FPO reference).
    ``w`` optionally passes the weights ``w_alpha_eps(1 - t)`` computed beforehand (the update
    computes them once for the whole batch). Returns (loss, ratio (n,), D (n,)).
    """
    if w is None:
        w = fpo_weight_at(1.0 - t, alpha_eps)
    d_i = (w * (l_old - l_new)).mean(-1)
    ratio = torch.exp(d_i)
    return -ppo_surrogate(ratio, adv, clip_coef).mean(), ratio, d_i


def fpopp_loss(
    l_old: torch.Tensor,
    l_new: torch.Tensor,
    t: torch.Tensor,
    adv: torch.Tensor,
    alpha: float,
    clip_coef: float,
    mode: str = "aspo",
    loss_clamp: float = 20.0,
    ratio_log_clamp: float = 10.0,
    t_min: float = 0.005,
    t_max: float = 0.995,
    w: torch.Tensor | None = None,
):
    """FPO++ actor loss (eq:fpopp-objective); weight outside the per-draw proxy.

    ``l_old <- min(l_old, c)`` and ``l_new <- min(l_new, c)`` (both, always), then
    ``l_new <- min(l_new, c)`` again where ``A < 0`` (the official FPO++ code's second clamp,
    ``cfm_loss_clamp_negative_advantages_max``, has the same bound 20 by default);
    ``r_im = exp(C_STE(l_old - l_new))``; ``L = -1/(nM) sum w_alpha(t_im) P_TR(r_im, A_i)``.
    ``adv`` is the already normalised and clamped advantage; ``w`` optionally passes the weights
    ``w_alpha(t)`` computed beforehand. Returns (loss, ratio (n, M)).
    """
    a = adv.unsqueeze(-1).expand_as(l_new)
    l_old_c = l_old.clamp(max=loss_clamp)
    l_new_c = l_new.clamp(max=loss_clamp)
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
    early = fixed if args.alpha_early is None else args.alpha_early
    late = fixed if args.alpha_late is None else args.alpha_late
    return float(linear_schedule(global_step // args.block_size, early, late, args.k0, args.k1))


# ----------------------------------------------------------------------------------------
# Training state, rollout, update, evaluation
# ----------------------------------------------------------------------------------------


@dataclass
class State:
    """Everything that evolves during training."""

    envs: gym.vector.VectorEnv
    actor: FlowActor
    critic: Critic
    optimizer: torch.optim.Optimizer
    obs_rms: RunningMeanStd | None
    ret_rms: RunningMeanStd | None
    device: torch.device
    next_obs: np.ndarray | None = None
    ret_acc: np.ndarray | None = None
    ep_ret: np.ndarray | None = None
    ep_len: np.ndarray | None = None
    update: int = 0
    global_step: int = 0
    peak_return: float = -math.inf
    peak_step: int = -1
    peak_update: int = -1
    graph: GraphedUpdate | None = None  # the captured update step (--cuda-graph), built on first use


def reset_envs(state: State, seed: int) -> None:
    """Start fresh episodes in every environment, seeded from (seed, update)."""
    n = state.envs.num_envs
    obs, _ = state.envs.reset(seed=segment_seeds(seed, state.update, n))
    state.next_obs = obs.astype(np.float64)
    state.ret_acc = np.zeros(n)
    state.ep_ret = np.zeros(n)
    state.ep_len = np.zeros(n, dtype=np.int64)


def collect_rollout(state: State, args: Args) -> dict:
    """Run ``num_steps`` vectorised steps; return the batch with draws, old losses and GAE.

    Observations are normalised at collection time (statistics updated first, as CleanRL's
    wrapper does) and stored normalised, so the stored old losses and the first recomputation
    use identical inputs. On truncation the reward is bootstrapped with ``gamma V(final_obs)``
    and the episode is cut; on termination it is cut without bootstrap.
    """
    envs, dev, actor, critic = state.envs, state.device, state.actor, state.critic
    n, T = envs.num_envs, args.num_steps
    low, high = envs.single_action_space.low.astype(np.float64), envs.single_action_space.high.astype(np.float64)
    d = int(np.prod(envs.single_action_space.shape))
    obs_buf = np.zeros((T, n, int(np.prod(envs.single_observation_space.shape))), np.float32)
    act_buf = np.zeros((T, n, d), np.float32)
    rew_buf = np.zeros((T, n), np.float32)
    done_buf = np.zeros((T, n), np.float32)
    boot_idx, boot_obs = [], []
    episodes = []
    sampler = NumpyFlowSampler(actor)
    for step in range(T):
        if state.obs_rms is not None:
            state.obs_rms.update(state.next_obs)
        o = normalize_obs(state.next_obs, state.obs_rms)
        obs_buf[step] = o
        x0 = torch.randn(n, d).numpy()
        x_np = sampler.sample(o, x0, args.flow_steps)
        if args.objective == "fpopp" and args.fpopp_action_noise > 0:
            x_np = x_np + args.fpopp_action_noise * torch.randn(n, d).numpy()
        if args.action_bound > 0:  # bounded stored actions (and old losses); the box is applied below
            x_np = np.clip(x_np, -args.action_bound, args.action_bound)
        x_np = x_np.astype(np.float32)
        act_buf[step] = x_np
        next_obs, reward, term, trunc, info = envs.step(squash_action(x_np.astype(np.float64), low, high, args.action_squash))
        reward = np.asarray(reward, np.float64)
        state.ep_ret += reward
        state.ep_len += 1
        done = np.logical_or(term, trunc)
        if state.ret_rms is not None:
            state.ret_acc = state.ret_acc * args.gamma + reward
            state.ret_rms.update(state.ret_acc)
            reward = np.clip(reward / np.sqrt(state.ret_rms.var + 1e-8), -10.0, 10.0)
        rew_buf[step] = reward
        done_buf[step] = done
        for i in np.nonzero(done)[0]:
            episodes.append((float(state.ep_ret[i]), int(state.ep_len[i])))
            if trunc[i] and not term[i]:
                boot_idx.append((step, i))
                boot_obs.append(np.asarray(info["final_obs"][i], np.float64))
            state.ep_ret[i], state.ep_len[i], state.ret_acc[i] = 0.0, 0, 0.0
        state.next_obs = np.asarray(next_obs, np.float64)
    state.global_step += T * n

    with torch.no_grad():
        obs_t = torch.as_tensor(obs_buf, device=dev)
        values = critic(obs_t).cpu().numpy()
        next_value = critic(torch.as_tensor(normalize_obs(state.next_obs, state.obs_rms), device=dev)).cpu().numpy()
        if boot_idx:
            bo = torch.as_tensor(normalize_obs(np.stack(boot_obs), state.obs_rms), device=dev)
            bv = critic(bo).cpu().numpy()
            for (s, i), v in zip(boot_idx, bv):
                rew_buf[s, i] += args.gamma * v
        # Old per-draw losses, computed once in a batch with the rollout's (unchanged) policy.
        flat_obs = obs_t.reshape(T * n, -1)
        flat_x = torch.as_tensor(act_buf, device=dev).reshape(T * n, d)
        t, eps = sample_draws(T * n, args.num_draws, d, args.objective, args.t_min, args.t_max, dev)
        l_old = draw_losses(actor, flat_obs, flat_x, t, eps, args.objective)

    adv = np.zeros((T, n), np.float32)
    last = np.zeros(n, np.float32)
    for s in reversed(range(T)):
        nv = next_value if s == T - 1 else values[s + 1]
        nonterm = 1.0 - done_buf[s]
        delta = rew_buf[s] + args.gamma * nv * nonterm - values[s]
        last = delta + args.gamma * args.gae_lambda * nonterm * last
        adv[s] = last
    returns = adv + values
    return {
        "obs": flat_obs,
        "x": flat_x,
        "t": t,
        "eps": eps,
        "l_old": l_old,
        "adv": torch.as_tensor(adv.reshape(-1), device=dev),
        "returns": torch.as_tensor(returns.reshape(-1), device=dev),
        "episodes": episodes,
        "action_abs_mean": float(np.abs(act_buf).mean()),
        "action_abs_max": float(np.abs(act_buf).max()),
    }


class NonFiniteLoss(RuntimeError):
    """Raised when an update produces a non-finite loss or gradient."""


STAT_KEYS = ("pg_loss", "v_loss", "ratio_mean", "ratio_min", "ratio_max", "clipfrac", "grad_norm")
BATCH_KEYS = ("obs", "x", "t", "eps", "l_old", "returns")


def draw_weights(t: torch.Tensor, args: Args, alpha: float) -> torch.Tensor:
    """Timestep weights of the stored draws, computed once per update (they depend on t only).

    FPO: ``w_alpha_eps(1 - t)`` (eq:fpo-objective); FPO++: ``w_alpha(t)`` (eq:fpopp-objective).
    """
    if args.objective == "fpo":
        return fpo_weight_at(1.0 - t, alpha)
    return fpopp_weight(t, alpha, args.t_min, args.t_max)


def minibatch_losses(state: State, src: dict, idx: torch.Tensor, args: Args, alpha: float):
    """Actor and critic losses of the minibatch ``idx`` of ``src`` (the batch plus ``adv``, ``w``).

    Returns (pg_loss, v_loss, ratio). FPO normalises the advantages per minibatch; FPO++
    receives them already normalised over the rollout.
    """
    adv = src["adv"][idx]
    t, w = src["t"][idx], src["w"][idx]
    l_new = draw_losses(state.actor, src["obs"][idx], src["x"][idx], t, src["eps"][idx], args.objective)
    if args.objective == "fpo":
        if args.norm_adv:
            adv = (adv - adv.mean()) / (adv.std() + 1e-8)
        pg_loss, ratio, _ = fpo_loss(src["l_old"][idx], l_new, t, adv, alpha, args.clip_coef, w=w)
    else:
        pg_loss, ratio = fpopp_loss(
            src["l_old"][idx], l_new, t, adv, alpha, args.clip_coef,
            args.trust_region, args.loss_clamp, args.ratio_log_clamp, args.t_min, args.t_max, w=w,
        )
    v_loss = 0.5 * ((state.critic(src["obs"][idx]) - src["returns"][idx]) ** 2).mean()
    return pg_loss, v_loss, ratio


def gradient_step(state: State, params: list, pg_loss, v_loss, ratio, args: Args, max_norm: float) -> torch.Tensor:
    """Backward pass, global gradient-norm clip and optimiser step; returns the step's statistics
    (pg_loss, v_loss, ratio mean / min / max, clip fraction, gradient norm) as a (7,) tensor.

    No host synchronisation: the same code runs eagerly and inside the CUDA graph.
    """
    loss = pg_loss + args.vf_coef * v_loss
    state.optimizer.zero_grad(set_to_none=True)
    loss.backward()
    gn = nn.utils.clip_grad_norm_(params, max_norm, foreach=True)
    state.optimizer.step()
    with torch.no_grad():
        r = ratio.detach()
        return torch.stack([
            pg_loss.detach(), v_loss.detach(), r.mean(), r.min(), r.max(),
            ((r - 1.0).abs() > args.clip_coef).float().mean(), gn.to(r.dtype),
        ]).float()


class GraphedUpdate:
    """The minibatch step of :func:`update` captured once as a CUDA graph and replayed.

    Static device tensors hold the whole batch (refilled with ``copy_`` at every update; their
    shapes are fixed by the arguments), the minibatch indices of every step of the update
    (``steps x minibatch``, filled from the same ``torch.randperm`` calls as the eager loop), a
    step counter and a ``(steps, 7)`` statistics table. One replay gathers the minibatch in row
    ``counter`` of the index table, computes both losses, back-propagates, clips the gradient
    norm, takes the fused AdamW step and writes its statistics into row ``counter`` before
    incrementing it. The learning rate lives in a device tensor that the optimiser reads inside
    the graph (``--anneal-lr`` keeps writing a float into the param group; it is copied into the
    tensor before the replays). The graph reads the parameters, gradients and optimiser moments
    at fixed addresses, so it must be rebuilt when the optimiser state is replaced
    (:func:`load_checkpoint` drops it).
    """

    def __init__(self, state: State, src: dict, args: Args, alpha: float, steps: int, mb: int):
        dev = state.device
        self.key = graph_key(args, src["obs"].shape[0], steps, mb)
        self.src = {k: torch.empty_like(v) for k, v in src.items()}
        self.idx = torch.zeros(steps, mb, dtype=torch.long, device=dev)
        self.counter = torch.zeros(1, dtype=torch.long, device=dev)
        self.stats = torch.zeros(steps, len(STAT_KEYS), device=dev)
        self.lr = torch.tensor(float(state.optimizer.param_groups[0]["lr"]), dtype=torch.float32, device=dev)
        self.graph: torch.cuda.CUDAGraph | None = None
        self.args, self.alpha = args, alpha

    def _step(self, state: State, params: list, max_norm: float) -> None:
        idx = self.idx.index_select(0, self.counter).view(-1)
        pg_loss, v_loss, ratio = minibatch_losses(state, self.src, idx, self.args, self.alpha)
        row = gradient_step(state, params, pg_loss, v_loss, ratio, self.args, max_norm)
        self.stats.index_copy_(0, self.counter, row.unsqueeze(0))
        self.counter.add_(1)

    def capture(self, state: State, params: list, max_norm: float) -> None:
        """Warm up on a side stream, capture one step, and restore every tensor the warm-up touched.

        Needs valid contents in the static buffers (the current batch and indices). The warm-up
        steps change the parameters and the optimiser moments; both are restored in place
        afterwards (moments that did not exist yet are zeroed, which is their initial value), so
        capturing leaves the training state exactly as it was.
        """
        opt = state.optimizer
        if len(opt.param_groups) != 1:
            raise ValueError(f"{len(opt.param_groups)} optimiser param groups; the CUDA graph update expects 1")
        group = opt.param_groups[0]
        with torch.no_grad():
            saved_params = [p.detach().clone() for p in params]
            saved_moments = {p: {k: v.clone() for k, v in opt.state[p].items()} for p in params if opt.state.get(p)}
        lr, capturable = group["lr"], group["capturable"]
        group["lr"], group["capturable"] = self.lr, True  # a tensor lr and a capture-safe step
        try:
            side = torch.cuda.Stream(device=state.device)
            side.wait_stream(torch.cuda.current_stream(state.device))
            with torch.cuda.stream(side), warnings.catch_warnings():
                warnings.simplefilter("ignore")  # "capturable=True but step() runs without capture"
                for _ in range(3):
                    self.counter.zero_()
                    self._step(state, params, max_norm)
            torch.cuda.current_stream(state.device).wait_stream(side)
            opt.zero_grad(set_to_none=True)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                self._step(state, params, max_norm)
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

    def run(self, state: State, src: dict, perms: list[torch.Tensor], params: list, max_norm: float) -> torch.Tensor:
        """Copy the batch and the minibatch indices in, replay one step per row; return the stats table."""
        steps, mb = self.idx.shape
        per_epoch = steps // len(perms)
        for k, v in src.items():
            self.src[k].copy_(v)
        for e, perm in enumerate(perms):
            self.idx[e * per_epoch : (e + 1) * per_epoch].copy_(perm[: per_epoch * mb].view(per_epoch, mb))
        self.lr.fill_(float(state.optimizer.param_groups[0]["lr"]))
        if self.graph is None:
            self.capture(state, params, max_norm)
        self.counter.zero_()
        for _ in range(steps):
            self.graph.replay()
        return self.stats


def graph_key(args: Args, n: int, steps: int, mb: int) -> tuple:
    """Everything a captured update step depends on besides tensor contents."""
    return (n, steps, mb, args.objective, args.norm_adv, args.clip_coef, args.vf_coef, args.max_grad_norm,
            args.trust_region, args.loss_clamp, args.ratio_log_clamp, args.t_min, args.t_max)


def uses_cuda_graph(state: State, args: Args) -> bool:
    """Whether :func:`update` replays a CUDA graph: ``--cuda-graph``, networks on CUDA, no ``--target-kl``."""
    return args.cuda_graph and state.device.type == "cuda" and args.target_kl <= 0


def update(state: State, batch: dict, args: Args, alpha: float) -> dict:
    """``update_epochs`` passes of minibatch gradient steps on the actor and critic losses.

    One optimiser and one backward pass per minibatch serve both networks (the losses share
    no parameters, so this equals separate steps). Statistics stay on the device as tensors
    and are read once at the end of the update; a non-finite loss or gradient norm anywhere
    in the update raises :class:`NonFiniteLoss` then (the caller discards the update, so the
    last checkpoint stays the last good state). The timestep weights of the stored draws are
    computed once per update. On CUDA (``--cuda-graph``, no ``--target-kl``) every minibatch
    step is a replay of one captured graph (:class:`GraphedUpdate`); the indices come from the
    same ``torch.randperm`` calls, so both paths take the same steps.
    """
    n = batch["obs"].shape[0]
    mb = n // args.num_minibatches
    steps = args.update_epochs * args.num_minibatches
    adv_all = batch["adv"]
    if args.objective == "fpopp":
        if args.norm_adv:
            adv_all = (adv_all - adv_all.mean()) / (adv_all.std() + 1e-8)
        adv_all = adv_all.clamp(-args.adv_clamp, args.adv_clamp)
    src = {k: batch[k] for k in BATCH_KEYS}
    src["adv"], src["w"] = adv_all, draw_weights(batch["t"], args, alpha)
    params = [p for group in state.optimizer.param_groups for p in group["params"]]
    max_norm = args.max_grad_norm if args.max_grad_norm > 0 else float("inf")
    stopped = None  # approximate KL that ended the update early (--target-kl)
    if uses_cuda_graph(state, args):
        key = graph_key(args, n, steps, mb)
        if state.graph is None or state.graph.key != key:
            state.graph = GraphedUpdate(state, src, args, alpha, steps, mb)
        state.graph.alpha = alpha  # enters the step only through the weights in src["w"]
        perms = [torch.randperm(n, device=state.device) for _ in range(args.update_epochs)]
        table = state.graph.run(state, src, perms, params, max_norm)
    else:
        rows = []  # per minibatch: pg_loss, v_loss, ratio mean, min, max, clip fraction, grad norm
        for _ in range(args.update_epochs):
            if stopped is not None:
                break
            perm = torch.randperm(n, device=state.device)
            for start in range(0, mb * args.num_minibatches, mb):
                idx = perm[start : start + mb]
                pg_loss, v_loss, ratio = minibatch_losses(state, src, idx, args, alpha)
                if args.target_kl > 0:
                    with torch.no_grad():
                        r = ratio.detach().double()
                        kl = float(((r - 1.0) - torch.log(r)).mean())
                    if not kl <= args.target_kl:  # also stops on nan
                        stopped = kl
                        break
                rows.append(gradient_step(state, params, pg_loss, v_loss, ratio, args, max_norm))
        if stopped is not None and math.isnan(stopped):
            raise NonFiniteLoss(f"non-finite ratio at update {state.update}")
        table = torch.stack(rows) if rows else None
    out = {"minibatch_steps": 0 if table is None else table.shape[0], "early_stop_kl": stopped}
    if table is None:
        return out
    stats = table.cpu().numpy().astype(np.float64)  # one host sync (plus the KL checks)
    if not np.isfinite(stats[:, [0, 1, 6]]).all():
        bad = "loss" if not np.isfinite(stats[:, :2]).all() else "gradient norm"
        raise NonFiniteLoss(f"non-finite {bad} at update {state.update}")
    out.update({k: float(stats[:, c].mean()) for c, k in enumerate(STAT_KEYS)})
    out["ratio_min"] = float(stats[:, 3].min())
    out["ratio_max"] = float(stats[:, 4].max())
    return out


def evaluate(
    actor: FlowActor, obs_rms: RunningMeanStd | None, env_id: str, episodes: int, seed: int, flow_steps: int, init: str,
    action_squash: str = "clip",
) -> float:
    """Mean return of ``episodes`` fixed-seed episodes (one per environment, seeds seed+i).

    ``init`` is ``zero`` (start the Euler sampler at x0 = 0) or ``random`` (x0 ~ N(0, I)
    from a generator seeded with ``seed``, so evaluation never touches the training RNG).
    Observation statistics are frozen during evaluation.
    """
    if init not in ("zero", "random"):
        raise ValueError(f"init={init!r}; allowed: 'zero', 'random'")
    envs = gym.vector.SyncVectorEnv([make_env(env_id) for _ in range(episodes)], autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    low, high = envs.single_action_space.low.astype(np.float64), envs.single_action_space.high.astype(np.float64)
    d = int(np.prod(envs.single_action_space.shape))
    gen = torch.Generator(device="cpu").manual_seed(seed)
    sampler = NumpyFlowSampler(actor)
    obs, _ = envs.reset(seed=[seed + i for i in range(episodes)])
    total, finished = np.zeros(episodes), np.zeros(episodes, dtype=bool)
    while not finished.all():
        o = normalize_obs(np.asarray(obs, np.float64), obs_rms)
        x0 = torch.zeros(episodes, d) if init == "zero" else torch.randn(episodes, d, generator=gen)
        x = sampler.sample(o, x0.numpy(), flow_steps)
        obs, r, term, trunc, _ = envs.step(squash_action(x, low, high, action_squash))
        total += np.where(finished, 0.0, r)
        finished |= np.logical_or(term, trunc)
    envs.close()
    return float(total.mean())


# ----------------------------------------------------------------------------------------
# Checkpoints and run folder
# ----------------------------------------------------------------------------------------


def save_checkpoint(path: str, state: State) -> None:
    """Atomic checkpoint: write to a temporary file, then ``os.replace``."""
    ckpt = {
        "actor": state.actor.state_dict(),
        "critic": state.critic.state_dict(),
        "optimizer": state.optimizer.state_dict(),
        "obs_rms": state.obs_rms.state_dict() if state.obs_rms else None,
        "ret_rms": state.ret_rms.state_dict() if state.ret_rms else None,
        "update": state.update,
        "global_step": state.global_step,
        "peak": (state.peak_return, state.peak_step, state.peak_update),
        "rng_torch": torch.get_rng_state(),
        "rng_cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
        "rng_numpy": np.random.get_state(),
        "rng_python": random.getstate(),
    }
    tmp = path + ".tmp"
    torch.save(ckpt, tmp)
    os.replace(tmp, path)


def load_checkpoint(path: str, state: State) -> None:
    """Restore a :func:`save_checkpoint` file into ``state`` (the optimiser state is replaced, so
    a captured CUDA graph is dropped and rebuilt at the next update)."""
    ckpt = torch.load(path, map_location=state.device, weights_only=False)
    state.graph = None
    state.actor.load_state_dict(ckpt["actor"])
    state.critic.load_state_dict(ckpt["critic"])
    state.optimizer.load_state_dict(ckpt["optimizer"])
    if state.obs_rms is not None and ckpt["obs_rms"] is not None:
        state.obs_rms.load_state_dict(ckpt["obs_rms"])
    if state.ret_rms is not None and ckpt["ret_rms"] is not None:
        state.ret_rms.load_state_dict(ckpt["ret_rms"])
    state.update, state.global_step = int(ckpt["update"]), int(ckpt["global_step"])
    state.peak_return, state.peak_step, state.peak_update = ckpt["peak"]
    # RNG states are CPU byte tensors; map_location may have moved them to the GPU.
    torch.set_rng_state(ckpt["rng_torch"].cpu())
    if ckpt["rng_cuda"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([s.cpu() for s in ckpt["rng_cuda"]])
    np.random.set_state(ckpt["rng_numpy"])
    random.setstate(ckpt["rng_python"])


def write_json_atomic(path: str, obj) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=2)
    os.replace(tmp, path)


def truncate_metrics(path: str, last_update: int) -> None:
    """Drop metric rows written after the checkpoint being resumed (e.g. by a killed run)."""
    if not os.path.exists(path):
        return
    with open(path) as f:
        rows = [ln for ln in f if ln.strip() and json.loads(ln)["update"] <= last_update]
    with open(path + ".tmp", "w") as f:
        f.writelines(rows)
    os.replace(path + ".tmp", path)


def validate_args(args: Args) -> None:
    if args.objective not in ("fpo", "fpopp"):
        raise ValueError(f"objective={args.objective!r}; allowed: 'fpo', 'fpopp'")
    if args.trust_region not in ("aspo", "ppo", "spo"):
        raise ValueError(f"trust_region={args.trust_region!r}; allowed: 'aspo', 'ppo', 'spo'")
    for name in ("num_envs", "num_steps", "num_minibatches", "update_epochs", "num_draws", "flow_steps", "eval_every", "eval_episodes", "block_size"):
        if getattr(args, name) < 1:
            raise ValueError(f"{name}={getattr(args, name)}; must be >= 1")
    if (args.num_envs * args.num_steps) < args.num_minibatches:
        raise ValueError(f"num_minibatches={args.num_minibatches}; must be <= num_envs*num_steps={args.num_envs * args.num_steps}")
    if not 0.0 <= args.t_min < args.t_max < 1.0:
        raise ValueError(f"t_min={args.t_min}, t_max={args.t_max}; need 0 <= t_min < t_max < 1")
    if args.action_squash not in ("clip", "tanh"):
        raise ValueError(f"action_squash={args.action_squash!r}; allowed: 'clip', 'tanh'")
    if not math.isfinite(args.action_bound):
        raise ValueError(f"action_bound={args.action_bound}; must be a finite number (<= 0 disables the clamp)")
    if args.anneal_steps < 0:
        raise ValueError(f"anneal_steps={args.anneal_steps}; must be >= 0 (0: total_timesteps)")
    if args.clip_coef <= 0:
        raise ValueError(f"clip_coef={args.clip_coef}; must be > 0")
    if args.k1 <= args.k0 and (args.alpha_early is not None or args.alpha_late is not None):
        raise ValueError(f"k1={args.k1}; must be > k0={args.k0}")


def build_state(args: Args, device: torch.device) -> State:
    """Environments, networks, optimiser and normalisers for ``args`` (seed torch first)."""
    envs = make_vec_env(args.env_id, args.num_envs, args.async_envs)
    obs_dim = int(np.prod(envs.single_observation_space.shape))
    act_dim = int(np.prod(envs.single_action_space.shape))
    actor = FlowActor(obs_dim, act_dim, args.actor_hidden, args.actor_layers, args.time_embed_dim, args.output_scale).to(device)
    critic = Critic(obs_dim, args.critic_hidden, args.critic_layers).to(device)
    # One optimiser over both networks; the fused kernel does the whole step in one call.
    optimizer = torch.optim.AdamW(
        list(actor.parameters()) + list(critic.parameters()), lr=args.learning_rate, eps=1e-5, weight_decay=args.weight_decay,
        fused=True,
    )
    return State(
        envs, actor, critic, optimizer,
        RunningMeanStd((obs_dim,)) if args.norm_obs else None,
        RunningMeanStd(()) if args.norm_reward else None,
        device,
    )


def default_run_name(args: Args) -> str:
    return args.run_name or f"{args.env_id.replace('/', '_')}__{args.exp_name}__{args.objective}__{args.seed}"


def main(args: Args) -> dict:
    """Train (or continue with ``--resume``) until ``num_updates``; return ``summary.json``'s content."""
    validate_args(args)
    run_dir = os.path.join(args.run_dir, default_run_name(args))
    ckpt_dir = os.path.join(run_dir, "checkpoints")
    os.makedirs(ckpt_dir, exist_ok=True)
    ckpt_path = os.path.join(ckpt_dir, "latest.pt")
    metrics_path = os.path.join(run_dir, "metrics.jsonl")
    batch_size = args.num_envs * args.num_steps
    num_updates = args.num_updates or max(1, args.total_timesteps // batch_size)
    ckpt_every = args.checkpoint_every or args.eval_every
    eval_init = args.eval_init if args.eval_init != "native" else ("random" if args.objective == "fpo" else "zero")

    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.backends.cudnn.deterministic = args.torch_deterministic
    if args.torch_threads > 0:
        torch.set_num_threads(args.torch_threads)
    device = torch.device("cuda" if torch.cuda.is_available() and args.cuda else "cpu")

    state = build_state(args, device)
    actor, optimizer = state.actor, state.optimizer

    resumed = args.resume and os.path.exists(ckpt_path)
    if resumed:
        load_checkpoint(ckpt_path, state)
        truncate_metrics(metrics_path, state.update)
    else:
        write_json_atomic(os.path.join(run_dir, "args.json"), asdict(args))
        open(metrics_path, "w").close()

    def log(row: dict) -> None:
        with open(metrics_path, "a") as f:
            f.write(json.dumps(row) + "\n")

    def summary(status: str) -> dict:
        s = {
            "status": status, "env_id": args.env_id, "objective": args.objective,
            "update": state.update, "global_step": state.global_step,
            "peak_eval_return": state.peak_return if state.peak_update >= 0 else None,
            "peak_step": state.peak_step, "peak_update": state.peak_update, "device": str(device),
        }
        write_json_atomic(os.path.join(run_dir, "summary.json"), s)
        return s

    def do_eval(row: dict) -> None:
        ret = evaluate(actor, state.obs_rms, args.env_id, args.eval_episodes, args.eval_seed, args.flow_steps, eval_init, args.action_squash)
        row["eval_return"] = ret
        if args.objective == "fpopp":
            other = "random" if eval_init == "zero" else "zero"
            row[f"eval_return_{other}"] = evaluate(actor, state.obs_rms, args.env_id, args.eval_episodes, args.eval_seed, args.flow_steps, other, args.action_squash)
        if ret > state.peak_return:  # eq:peak: max over this run's evaluations
            state.peak_return, state.peak_step, state.peak_update = ret, state.global_step, state.update
        print(f"update={state.update} step={state.global_step} eval_return={ret:.2f} peak={state.peak_return:.2f}", flush=True)

    if not resumed:
        row = {"update": 0, "global_step": 0, "alpha": current_alpha(args, 0)}
        do_eval(row)
        log(row)
        save_checkpoint(ckpt_path, state)

    status = "running"
    need_reset = True
    while state.update < num_updates:
        if need_reset or state.update % ckpt_every == 0:
            reset_envs(state, args.seed)
            need_reset = False
        alpha = current_alpha(args, state.global_step)
        if args.anneal_lr:
            # The horizon is total_timesteps (not --num-updates), so a run continued in pieces
            # follows the same schedule as an uninterrupted one; the floor keeps lr > 0.
            frac = state.update / max(1, (args.anneal_steps or args.total_timesteps) // batch_size)
            optimizer.param_groups[0]["lr"] = args.learning_rate * max(1.0 - frac, 0.05)
        t0 = time.perf_counter()
        batch = collect_rollout(state, args)
        t1 = time.perf_counter()
        try:
            stats = update(state, batch, args, alpha)
        except NonFiniteLoss as e:
            print(str(e), flush=True)
            log({"update": state.update + 1, "global_step": state.global_step, "nonfinite": True, "alpha": alpha})
            status = "nonfinite"
            break
        t2 = time.perf_counter()
        state.update += 1
        eps_ret = [r for r, _ in batch["episodes"]]
        row = {
            "update": state.update, "global_step": state.global_step, "alpha": alpha,
            "lr": optimizer.param_groups[0]["lr"],
            "sps": batch_size / (t2 - t0), "rollout_s": t1 - t0, "update_s": t2 - t1,
            "episodic_return": float(np.mean(eps_ret)) if eps_ret else None,
            "episodic_length": float(np.mean([ln for _, ln in batch["episodes"]])) if eps_ret else None,
            "episodes": len(eps_ret), "action_abs_mean": batch["action_abs_mean"], "action_abs_max": batch["action_abs_max"], **stats,
        }
        if state.update % args.eval_every == 0 or state.update == num_updates:
            do_eval(row)
        log(row)
        if state.update % ckpt_every == 0 or state.update == num_updates:
            save_checkpoint(ckpt_path, state)
            if args.keep_checkpoints:
                keep = os.path.join(ckpt_dir, f"update_{state.update:06d}.pt")
                shutil.copyfile(ckpt_path, keep + ".tmp")
                os.replace(keep + ".tmp", keep)
            summary("running")
    if status != "nonfinite":
        status = "completed"
    state.envs.close()
    return summary(status)


if __name__ == "__main__":
    try:
        main(tyro.cli(Args))
    except ValueError as err:  # bad input: one line naming the value and what is allowed
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
