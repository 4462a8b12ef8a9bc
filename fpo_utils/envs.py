"""Vectorised environments for robot_fpo.py behind one torch-facing interface.

Three backends give the same object (attributes ``num_envs``, ``obs_dim``, ``act_dim``,
``action_low``, ``action_high``, ``device``, ``route``; methods ``reset``, ``step``, ``close``):

* ``envpool``: envpool's C++ thread pool, for its gymnasium MuJoCo ids (``Walker2d-v5``, ...), its
  DeepMind Control ids (``WalkerRun-v1``, ``CartpoleSwingup-v1``, ...) and its CPU ports of MuJoCo
  Playground tasks (``SpotFlatTerrainJoystick-v1``, ``Go1JoystickFlatTerrain-v1``,
  ``G1JoystickFlatTerrain-v1``, ...).
* ``gymnasium``: gymnasium's in-process vector env, for any other continuous-action id (a user's
  own environment, registered or given as ``module:Name-v0``).
* ``playground``: MuJoCo Playground's DM Control suite and locomotion tasks (``CartpoleSwingup``,
  ``Go1JoystickFlatTerrain``, ...) on the GPU (``fpo_utils.playground_env``, imported only when asked for),
  on MJX or MuJoCo Warp physics (:func:`resolve_physics`).

``auto`` picks envpool for the ids envpool has (when it is installed), else gymnasium.

Dict observations are routed (:class:`ObsRoute`, ``fpo_utils.env_layout``): the actor reads some keys and the
critic others, by default ``state`` and ``privileged_state`` where a task has both (MuJoCo Playground's asymmetric
actor-critic: the critic also sees simulator quantities a robot cannot measure), else every key to
both (DM Control), in sorted order on envpool and playground and in the space's order on
gymnasium (as its FlattenObservation). An environment's observation is one flat vector, the actor's
keys then the critic's; ``route.obs_actor`` and ``route.obs_critic`` are their columns. A flat
observation is read whole by both.

``reset(seed)`` starts every environment afresh, environment i from seed ``seed + i``; the same
seed gives the same episodes. ``step(actions)`` takes a float32 tensor [N, act_dim] in [-1, 1]
(rescaled here to the action box) and returns ``(obs, reward, terminated, truncated, info)``:
obs float32 [N, obs_dim] (already the first observation of the next episode where one ended:
auto-reset in the same step), reward float32 [N], terminated / truncated bool [N], and ``info``
with float32 tensors ``final_obs`` [N, obs_dim] (the observation that ended the episode, equal to
obs where nothing ended), ``episode_return`` and ``episode_length`` [N] (of the episode that ended
at this step; meaningful where terminated or truncated). ``step_into(actions, out)`` does the same
step and writes all of it into one float32 tensor ``out`` of ``env_out_size(num_envs, obs_dim)``
elements on the environments' device (layout: ``env_out_views``; terminated / truncated as 0 / 1):
one copy per step, which is how a rollout on a GPU takes it.

``RunningMeanStd`` keeps the running observation / return statistics the trainer normalises with.
"""

from __future__ import annotations

import difflib
import gc
import importlib.util
import math
import os
from typing import Literal

import numpy as np
import torch

from fpo_utils.env_layout import ASYMMETRIC, ObsRoute, env_out_size, env_out_views, route_obs, unpack_step
from fpo_utils.runfolder import RunError

# Re-exported: the trainers and tests import these from here.
__all__ = [
    "ASYMMETRIC",
    "Backend",
    "EnvpoolVecEnv",
    "GymnasiumVecEnv",
    "ObsRoute",
    "RunningMeanStd",
    "env_out_size",
    "env_out_views",
    "env_settings",
    "make_envs",
    "normalize_obs",
    "observation_keys",
    "observation_space",
    "parse_reward_scales",
    "resolve_backend",
    "resolve_physics",
    "reward_terms",
    "route_obs",
    "segment_seed",
    "unpack_step",
]

Backend = Literal["auto", "envpool", "gymnasium", "playground"]
ENVPOOL_MODULES = ("envpool.mujoco.gym", "envpool.mujoco.dmc", "envpool.mujoco.playground")  # + Playground ports

# The ids (all "-v1") that envpool 1.2.5 has and gymnasium does not, so that asking for one without envpool
# names the extra to install: its DeepMind Control tasks, and its MuJoCo Playground ports (also under
# "MuJoCoPlayground/"). A test checks this table against envpool's registry where envpool is installed.
ENVPOOL_DMC = """
    AcrobotSwingup AcrobotSwingupSparse BallInCupCatch CartpoleBalance CartpoleBalanceSparse CartpoleSwingup
    CartpoleSwingupSparse CartpoleThreePoles CartpoleTwoPoles CheetahRun DogFetch DogRun DogStand DogTrot
    DogWalk FingerSpin FingerTurnEasy FingerTurnHard FishSwim FishUpright HopperHop HopperStand HumanoidCMURun
    HumanoidCMUStand HumanoidCMUWalk HumanoidRun HumanoidRunPureState HumanoidStand HumanoidWalk LqrLqr21
    LqrLqr62 ManipulatorBringBall ManipulatorBringPeg ManipulatorInsertBall ManipulatorInsertPeg
    PendulumSwingup PointMassEasy PointMassHard QuadrupedEscape QuadrupedFetch QuadrupedRun QuadrupedWalk
    ReacherEasy ReacherHard StackerStack2 StackerStack4 SwimmerSwimmer15 SwimmerSwimmer6 WalkerRun WalkerStand
    WalkerWalk
""".split()
ENVPOOL_PLAYGROUND = """
    AeroCubeRotateZAxis AlohaHandOver AlohaSinglePegInsertion ApolloJoystickFlatTerrain BarkourJoystick
    BerkeleyHumanoidJoystickFlatTerrain BerkeleyHumanoidJoystickRoughTerrain G1JoystickFlatTerrain
    G1JoystickRoughTerrain Go1Footstand Go1Getup Go1Handstand Go1JoystickFlatTerrain Go1JoystickRoughTerrain
    H1InplaceGaitTracking H1JoystickGaitTracking LeapCubeReorient LeapCubeRotateZAxis Op3Joystick
    PandaOpenCabinet PandaPickCube PandaPickCubeCartesian PandaPickCubeOrientation PandaRobotiqPushCube
    SpotFlatTerrainJoystick SpotGetup SpotJoystickGaitTracking T1JoystickFlatTerrain T1JoystickRoughTerrain
""".split()
ENVPOOL_ONLY_IDS = frozenset(
    f"{prefix}{name}-v1" for prefix in ("", "MuJoCoPlayground/") for name in ENVPOOL_PLAYGROUND
) | frozenset(f"{name}-v1" for name in ENVPOOL_DMC)


def envpool_ids() -> list[str]:
    """The continuous-control ids envpool offers here (empty when envpool is not installed)."""
    if importlib.util.find_spec("envpool") is None:
        return []
    from envpool.registration import registry

    return sorted(k for k, spec in registry.specs.items() if spec[0] in ENVPOOL_MODULES)


def unknown_id(env_id: str, known: list[str], where: str) -> RunError:
    close = difflib.get_close_matches(env_id, known, n=3, cutoff=0.6)
    hint = f"did you mean {', '.join(close)}? " if close else ""
    return RunError(f"unknown env id {env_id!r}; {hint}expected {where}")


def resolve_backend(env_id: str, backend: Backend) -> str:
    """The backend that runs ``env_id``; a one-line RunError for an id no backend knows."""
    if backend not in ("auto", "envpool", "gymnasium", "playground"):
        raise RunError(f"--backend {backend!r} is not one of auto, envpool, gymnasium, playground")
    if backend == "playground":
        return backend
    if backend == "envpool" and importlib.util.find_spec("envpool") is None:
        raise RunError("the envpool backend needs envpool: pip install -e '.[envpool]'")
    pool_ids = envpool_ids()
    if backend in ("auto", "envpool") and env_id in pool_ids:
        return "envpool"
    if backend == "envpool":
        raise unknown_id(
            env_id, pool_ids, "envpool's MuJoCo, DM Control and Playground ids, e.g. CartpoleSwingup-v1, Walker2d-v5"
        )
    import gymnasium as gym

    if ":" not in env_id and env_id not in gym.registry:
        if env_id in ENVPOOL_ONLY_IDS and not pool_ids:
            raise RunError(f"env id {env_id!r} runs on envpool, which is not installed: pip install -e '.[envpool]'")
        raise unknown_id(
            env_id, sorted(set(pool_ids) | set(gym.registry)), "a gymnasium or envpool id, or module:Name-v0"
        )
    return "gymnasium"


def segment_seed(seed: int, update: int) -> int:
    """Environment seed of the segment starting at ``update`` (environment i gets this + i)."""
    return int(np.random.SeedSequence([seed, update]).generate_state(1)[0]) % (2**31 - 2**20)


def observation_space(env_id: str, backend: Backend = "auto"):
    """The observation space the environments of ``env_id`` will have, read without building them
    (gymnasium: one environment, closed at once; playground: the task traced once, ``{key: shape}`` for a
    dict observation, None for a flat one)."""
    kind = resolve_backend(env_id, backend)
    if kind == "envpool":
        import envpool

        return envpool.make_spec(env_id).observation_space
    if kind == "gymnasium":
        env = _gym_env(env_id)
        space = env.observation_space
        env.close()
        return space
    return _playground().observation_space(env_id)


def observation_keys(env_id: str, backend: Backend = "auto", actor: str = "", critic: str = "") -> dict:
    """``{"obs_actor": keys, "obs_critic": keys}``: the keys (comma-separated; empty for a flat observation)
    that :func:`make_envs` routes for these flags, resolved before any environment is built."""
    kind = resolve_backend(env_id, backend)
    route = route_obs(observation_space(env_id, kind), env_id, actor, critic, sort_keys=kind != "gymnasium")
    return {"obs_actor": ",".join(route.actor), "obs_critic": ",".join(route.critic)}


def resolve_physics(env_id: str, backend: Backend = "auto", physics: str = "auto") -> str:
    """The physics ``--physics`` gives ``env_id``: on the playground backend ``jax`` (MJX) or ``warp`` (MuJoCo
    Warp), ``auto`` picked per task (``fpo_utils.playground_env.resolve_physics``); the other backends run
    MuJoCo's C library and take ``auto`` only (kept as it is)."""
    if resolve_backend(env_id, backend) == "playground":
        return _playground().resolve_physics(env_id, physics)
    if physics != "auto":
        raise RunError(
            f"--physics {physics!r} is for the playground backend (jax: MJX, warp: MuJoCo Warp); "
            f"{env_id} runs on MuJoCo's C library, so use --physics auto"
        )
    return physics


def env_settings(env_id: str, backend: Backend, obs_actor: str, obs_critic: str, physics: str) -> dict:
    """The environment flags as :func:`make_envs` will use them, resolved before any environment is built (for a
    run's args.json): ``obs_actor`` and ``obs_critic`` (:func:`observation_keys`) and ``physics``
    (:func:`resolve_physics`). A bad value is a one-line RunError."""
    return {
        **observation_keys(env_id, backend, obs_actor, obs_critic),
        "physics": resolve_physics(env_id, backend, physics),
    }


def _playground():
    if importlib.util.find_spec("fpo_utils.playground_env") is None:
        raise RunError("the playground backend (fpo_utils/playground_env.py) is not part of this checkout")
    from fpo_utils import playground_env

    return playground_env


def make_envs(
    env_id: str,
    num_envs: int,
    seed: int,
    backend: Backend = "auto",
    device: str | torch.device = "cpu",
    threads: int = 0,
    episode_length: int = 1000,
    obs_keys: tuple[str, str] = ("", ""),
    physics: str = "auto",
    random_start: bool = False,
    env_reset: str = "first",
    reward_scales: tuple[str, ...] = (),
):
    """``num_envs`` environments of ``env_id`` on the chosen backend (see the module docstring).

    ``threads`` is envpool's thread count (0: one per core, at most ``num_envs``);
    ``episode_length`` is the time limit of the playground backend (the others use the id's own);
    ``obs_keys`` the actor's and the critic's keys of a dict observation (``route_obs``);
    ``physics`` the playground backend's physics (:func:`resolve_physics`);
    ``random_start`` (playground only): every reset starts each episode at a random step of the time limit, so
    the first episodes end at spread-out times (the official FPO++ runner's ``init_at_random_ep_len``);
    ``env_reset`` (playground): an ended episode restarts from its cached first state with the task's info kept
    (``first``) or from the task's reset (``full``; ``fpo_utils/playground_env.py``);
    ``reward_scales`` (Playground tasks, on envpool or playground): ``TERM=WEIGHT`` items (:func:`parse_reward_scales`).
    """
    if num_envs < 1:
        raise RunError(f"num_envs must be at least 1, got {num_envs}")
    device = torch.device(device)
    kind = resolve_backend(env_id, backend)
    physics = resolve_physics(env_id, kind, physics)
    if random_start and kind != "playground":
        raise RunError(f"random_start needs the playground backend ({env_id!r} runs on {kind})")
    if env_reset != "first" and kind != "playground":
        raise RunError(f"env_reset {env_reset!r} needs the playground backend ({env_id!r} runs on {kind})")
    scales = parse_reward_scales(env_id, kind, reward_scales)
    if kind == "playground":
        args = (env_id, num_envs, seed, device, episode_length, physics, obs_keys, random_start, env_reset, scales)
        return _playground().PlaygroundVecEnv(*args)
    if kind == "envpool":
        return EnvpoolVecEnv(env_id, num_envs, seed, device, threads, obs_keys, scales)
    return GymnasiumVecEnv(env_id, num_envs, seed, device, obs_keys)


def reward_terms(env_id: str, backend: Backend = "auto") -> tuple[str, ...]:
    """The reward terms whose weights ``--reward-scales`` may set: a MuJoCo Playground task's
    ``reward_config.scales`` on the playground backend, its envpool port's ``<term>_scale`` settings on envpool;
    empty for any other task."""
    kind = resolve_backend(env_id, backend)
    if kind == "playground":
        return _playground().reward_terms(env_id)
    if kind != "envpool":
        return ()
    import envpool
    from envpool.registration import registry

    if registry.specs[env_id][0] != "envpool.mujoco.playground":
        return ()
    fields = envpool.make_spec(env_id).config._fields
    return tuple(f.removesuffix("_scale") for f in fields if f.endswith("_scale") and f != "action_scale")


def parse_reward_scales(env_id: str, backend: Backend, items) -> tuple[tuple[str, float], ...]:
    """``--reward-scales TERM=WEIGHT ...`` as sorted ``(term, weight)`` pairs, each term one of the task's
    (:func:`reward_terms`); the task's own weight stays for every other term. A bad item is a one-line RunError."""
    if not items:
        return ()
    terms, pairs = reward_terms(env_id, backend), {}
    if not terms:
        raise RunError(
            f"--reward-scales {' '.join(items)}: {env_id} has no reward terms to weigh (a Playground task has)"
        )
    for item in items:
        term, sep, value = item.partition("=")
        try:
            weight = float(value) if sep else math.nan
        except ValueError:
            weight = math.nan
        if not math.isfinite(weight):
            raise RunError(f"--reward-scales {item!r}: write TERM=WEIGHT with a finite number, e.g. action_rate=-0.01")
        if term not in terms:
            raise RunError(f"--reward-scales {item!r}: {env_id} has no term {term!r}; its terms: {', '.join(terms)}")
        if term in pairs:
            raise RunError(f"--reward-scales {item!r}: {term} is given twice")
        pairs[term] = weight
    return tuple(sorted(pairs.items()))


class _Base:
    """Shared bookkeeping: action rescaling, episode returns and lengths, numpy -> torch."""

    def _setup(self, action_space, obs_dim: int, num_envs: int, device: torch.device) -> None:
        if (
            not hasattr(action_space, "low")
            or getattr(action_space, "dtype", None) is None
            or not np.issubdtype(action_space.dtype, np.floating)
        ):
            raise RunError(f"env id {self.env_id!r} has action space {action_space}; a continuous Box is required")
        self.num_envs, self.obs_dim, self.device = num_envs, obs_dim, device
        self.act_dim = int(np.prod(action_space.shape))
        self._low = np.asarray(action_space.low, np.float64).reshape(-1)
        self._high = np.asarray(action_space.high, np.float64).reshape(-1)
        self.action_low = torch.as_tensor(self._low, dtype=torch.float32)
        self.action_high = torch.as_tensor(self._high, dtype=torch.float32)
        self._ret, self._len = np.zeros(num_envs), np.zeros(num_envs, np.int64)
        # Host buffers: the step output in the flat layout and the actions, page-locked when the
        # trainer is on a GPU so that each step is one copy each way.
        pin = device.type == "cuda"
        self._host = torch.zeros(env_out_size(num_envs, obs_dim), pin_memory=pin)
        self._host_parts = env_out_views(self._host.numpy(), num_envs, obs_dim)
        self._act_host = torch.zeros(num_envs, self.act_dim, pin_memory=pin)

    def _to_box(self, actions: torch.Tensor) -> np.ndarray:
        self._act_host.copy_(actions.detach().reshape(self.num_envs, self.act_dim))
        a = self._act_host.numpy().astype(np.float64)
        return self._low + 0.5 * (np.clip(a, -1.0, 1.0) + 1.0) * (self._high - self._low)

    def _out(self, obs, reward, term, trunc, final_obs) -> torch.Tensor:
        """Episode bookkeeping; the step output written into the flat host buffer, which is returned."""
        reward = np.asarray(reward, np.float64)
        self._ret += reward
        self._len += 1
        for part, value in zip(self._host_parts, (obs, final_obs, reward, term, trunc, self._ret, self._len)):
            part[...] = value
        done = np.logical_or(term, trunc)
        self._ret[done], self._len[done] = 0.0, 0
        return self._host

    def step(self, actions: torch.Tensor) -> tuple:
        host = self._step_host(actions)
        return unpack_step(
            host.to(self.device) if self.device.type != "cpu" else host.clone(), self.num_envs, self.obs_dim
        )

    def step_into(self, actions: torch.Tensor, out: torch.Tensor) -> None:
        out.copy_(self._step_host(actions))

    def _t(self, x) -> torch.Tensor:
        return torch.as_tensor(np.asarray(x, np.float32), device=self.device)

    def state_dict(self) -> None:
        """None: these backends cannot give their simulators' state, so a resumed run restarts them."""
        return None


class EnvpoolVecEnv(_Base):
    """envpool's pool in synchronous mode. envpool resets an environment one step after its episode
    ends; here it is reset at once (``reset(env_ids)``), so every step returns live observations.
    A pool draws its episodes from the seed it was made with, so ``reset(seed)`` with a new seed
    rebuilds the pool (fast for MuJoCo ids; DM Control ids compile their model per environment)."""

    def __init__(
        self,
        env_id: str,
        num_envs: int,
        seed: int,
        device: torch.device,
        threads: int = 0,
        obs_keys=("", ""),
        scales=(),
    ):
        import envpool

        self.env_id, self._envpool = env_id, envpool
        self._scales = {f"{term}_scale": weight for term, weight in scales}  # parse_reward_scales' pairs
        self._threads = min(num_envs, threads if threads > 0 else len(os.sched_getaffinity(0)))
        self._pool, self._seed, self._fresh = None, None, False
        self.route = route_obs(envpool.make_spec(env_id).observation_space, env_id, *obs_keys)
        self._make(num_envs, seed)
        self._setup(self._pool.action_space, self.route.obs_dim, num_envs, device)

    def _make(self, num_envs: int, seed: int) -> None:
        if self._pool is not None:  # free the old pool before the new one is built
            self._pool.close()
            self._pool = None
            gc.collect()
        self._pool = self._envpool.make(
            self.env_id,
            env_type="gymnasium",
            num_envs=num_envs,
            seed=int(seed),
            num_threads=self._threads,
            **self._scales,
        )
        self._seed, self._fresh = int(seed), True

    def reset(self, seed: int) -> torch.Tensor:
        if not (self._fresh and int(seed) == self._seed):
            self._make(self.num_envs, seed)
        self._fresh = False
        obs, _ = self._pool.reset()
        self._ret[:], self._len[:] = 0.0, 0
        return self._t(self.route.flatten(obs))

    def _step_host(self, actions: torch.Tensor) -> torch.Tensor:
        obs, reward, term, trunc, _ = self._pool.step(self._to_box(actions).astype(np.float32))
        obs = self.route.flatten(obs)
        final = obs
        done = np.nonzero(np.logical_or(term, trunc))[0]
        if len(done):
            final = obs.copy()
            new, _ = self._pool.reset(done.astype(np.int32))
            obs[done] = self.route.flatten(new)
        return self._out(obs, reward, term, trunc, final)

    def close(self) -> None:
        self._pool.close()


def _gym_env(env_id: str):
    """``gym.make(env_id)``; a dict observation with entries other than Boxes is flattened by gymnasium
    (one-hot for discrete entries), a dict of Boxes is kept for :func:`route_obs`."""
    import gymnasium as gym

    try:
        env = gym.make(env_id)
    except (gym.error.Error, ModuleNotFoundError, AttributeError) as err:
        raise RunError(f"env id {env_id!r} could not be made: {str(err).splitlines()[0]}") from None
    space = env.observation_space
    if isinstance(space, gym.spaces.Dict) and not all(isinstance(s, gym.spaces.Box) for s in space.values()):
        env = gym.wrappers.FlattenObservation(env)
    return env


def _batch(items: list):
    """Per-environment observations (arrays, or dicts of arrays) as one batch."""
    return {k: np.stack([x[k] for x in items]) for k in items[0]} if isinstance(items[0], dict) else np.stack(items)


class GymnasiumVecEnv(_Base):
    """gymnasium's SyncVectorEnv with same-step auto-reset; dict observations are routed (:class:`ObsRoute`)."""

    def __init__(self, env_id: str, num_envs: int, seed: int, device: torch.device, obs_keys=("", "")):
        import gymnasium as gym

        self.env_id = env_id
        self._envs = gym.vector.SyncVectorEnv(
            [lambda: _gym_env(env_id) for _ in range(num_envs)], autoreset_mode=gym.vector.AutoresetMode.SAME_STEP
        )
        space = self._envs.single_action_space
        if not isinstance(space, gym.spaces.Box):
            self._envs.close()
        self.route = route_obs(self._envs.single_observation_space, env_id, *obs_keys, sort_keys=False)
        self._setup(space, self.route.obs_dim, num_envs, device)

    def reset(self, seed: int) -> torch.Tensor:
        obs, _ = self._envs.reset(seed=[int(seed) + i for i in range(self.num_envs)])
        self._ret[:], self._len[:] = 0.0, 0
        return self._t(self.route.flatten(obs))

    def _step_host(self, actions: torch.Tensor) -> torch.Tensor:
        obs, reward, term, trunc, info = self._envs.step(self._to_box(actions))
        obs = self.route.flatten(obs)
        final = obs
        done = np.nonzero(np.logical_or(term, trunc))[0]
        if len(done):
            final = obs.copy()
            final[done] = self.route.flatten(_batch([info["final_obs"][i] for i in done]))
        return self._out(obs, reward, term, trunc, final)

    def close(self) -> None:
        self._envs.close()


class RunningMeanStd:
    """Running mean / variance (parallel update, as CleanRL's wrappers), float64 on the device.
    ``normalize`` gives ``clip((x - mean) / sqrt(var + 1e-8), -10, 10)`` as float32; ``frozen``
    statistics ignore ``update`` (evaluation, diagnostics). ``batch_var=True`` follows the official
    FPO code's ``RunningStats``: the mean is a running mean, but the variance is the latest batch's
    sum of ``(x - old mean)(x - new mean)`` over the total count (so it shrinks as the count grows),
    clipped to [1e-12, 1e12], and ``normalize`` gives ``(x - mean) / sqrt(var)`` unclipped."""

    def __init__(self, shape=(), device="cpu", batch_var: bool = False):
        self.batch_var = batch_var
        self.mean = torch.zeros(shape, dtype=torch.float64, device=device)
        self.var = torch.ones(shape, dtype=torch.float64, device=device)
        self.count = torch.tensor(1e-4, dtype=torch.float64, device=device)
        self.frozen = False

    def update(self, x: torch.Tensor) -> None:
        """Fold the batch ``x`` (rows = samples) into the statistics, in place (a captured CUDA graph
        may hold these tensors)."""
        if self.frozen:
            return
        x = x.double()
        if self.batch_var:
            tot = self.count + x.shape[0]
            new_mean = self.mean + (x - self.mean).sum(0) / tot
            self.var.copy_(((x - self.mean) * (x - new_mean)).sum(0).div(tot).clamp(1e-12, 1e12))
            self.mean.copy_(new_mean)
            self.count.copy_(tot)
            return
        bm, bv, bc = x.mean(0), x.var(0, unbiased=False), x.shape[0]
        delta, tot = bm - self.mean, self.count + bc
        self.var.copy_((self.var * self.count + bv * bc + delta**2 * self.count * bc / tot) / tot)
        self.mean.add_(delta * bc / tot)
        self.count.copy_(tot)

    def normalize(self, x: torch.Tensor) -> torch.Tensor:
        if self.batch_var:
            return ((x.double() - self.mean) / torch.sqrt(self.var)).float()
        return ((x.double() - self.mean) / torch.sqrt(self.var + 1e-8)).clamp(-10.0, 10.0).float()

    def state_dict(self) -> dict:
        return {k: getattr(self, k).detach().cpu().clone() for k in ("mean", "var", "count")}

    def load_state_dict(self, d: dict) -> None:
        for k in ("mean", "var", "count"):  # in place: the tensors keep their addresses
            getattr(self, k).copy_(torch.as_tensor(d[k], dtype=torch.float64))


def normalize_obs(obs: torch.Tensor, rms: RunningMeanStd | None) -> torch.Tensor:
    return obs.float() if rms is None else rms.normalize(obs)
