"""What every vector-environment backend shares (``fpo_utils.envs``, ``fpo_utils.playground_env``): the routing of
dict observations to the actor and the critic (:class:`ObsRoute`, :func:`route_obs`) and the layout of a step's
outputs in one flat buffer (:func:`env_out_size`, :func:`env_out_views`, :func:`unpack_step`). The views work on
NumPy arrays, torch tensors and JAX arrays alike.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from fpo_utils.runfolder import RunError

ASYMMETRIC = ("state", "privileged_state")  # MuJoCo Playground's actor and critic keys (its PPO's defaults)


@dataclass(frozen=True)
class ObsRoute:
    """Which keys of a dict observation the actor and the critic read, and where they sit in the flat
    observation the environments return: the actor's keys in their order, then the critic's unless they
    are the actor's (then the critic reads the actor's columns). ``sizes`` maps each key to its flat size;
    a flat observation has none, ``flat_dim`` columns and no keys."""

    sizes: dict = field(default_factory=dict)
    actor: tuple[str, ...] = ()
    critic: tuple[str, ...] = ()
    flat_dim: int = 0

    @property
    def columns(self) -> tuple[str, ...]:
        return self.actor + (() if self.critic == self.actor else self.critic)

    @property
    def obs_dim(self) -> int:
        return sum(self.sizes[k] for k in self.columns) if self.sizes else self.flat_dim

    @property
    def obs_actor(self) -> slice:
        """The actor's columns of the flat observation."""
        return slice(0, sum(self.sizes[k] for k in self.actor) if self.sizes else self.flat_dim)

    @property
    def obs_critic(self) -> slice:
        """The critic's columns (the actor's where it reads the same keys)."""
        return self.obs_actor if self.critic == self.actor else slice(self.obs_actor.stop, self.obs_dim)

    @property
    def actor_dim(self) -> int:
        return self.obs_actor.stop - self.obs_actor.start

    @property
    def critic_dim(self) -> int:
        return self.obs_critic.stop - self.obs_critic.start

    def flatten(self, obs) -> np.ndarray:
        """[N, obs_dim] float32 from a batch of observations (an array, or a dict of arrays)."""
        if not self.sizes:
            return np.asarray(obs, np.float32).reshape(len(obs), -1)
        n = len(obs[self.columns[0]])
        return np.concatenate([np.asarray(obs[k], np.float32).reshape(n, -1) for k in self.columns], axis=1)


def _keys(value: str, sizes: dict, flag: str, env_id: str) -> tuple[str, ...]:
    keys = tuple(k.strip() for k in value.split(",") if k.strip())
    for k in keys:
        if k not in sizes:
            raise RunError(f"{flag} {k!r} is not an observation key of {env_id}; allowed: {', '.join(sorted(sizes))}")
    if len(set(keys)) < len(keys):
        raise RunError(f"{flag} {value!r} names a key twice; allowed: {', '.join(sorted(sizes))}")
    return keys


def route_obs(space, env_id: str, actor: str = "", critic: str = "", sort_keys: bool = True) -> ObsRoute:
    """The :class:`ObsRoute` of an observation space (a Box, a dict of Boxes, or None: flat, width unknown)
    for ``--obs-actor`` / ``--obs-critic`` (comma-separated keys; empty: the task's default, see the module
    docstring; "every key" in sorted order, or in the space's with ``sort_keys=False``, as gymnasium's
    FlattenObservation). A key the observation lacks is a one-line RunError naming it and the keys allowed."""
    if space is None or not hasattr(space, "keys"):
        if actor or critic:
            raise RunError(
                f"--obs-actor {actor!r} / --obs-critic {critic!r}: {env_id} has a flat observation, "
                "without keys; leave both empty"
            )
        return ObsRoute(flat_dim=0 if space is None else int(np.prod(space.shape)))
    sizes = {k: int(np.prod(space[k].shape)) for k in space.keys()}
    both = all(k in sizes for k in ASYMMETRIC)
    every = tuple(sorted(sizes) if sort_keys else sizes)
    actor_keys = _keys(actor, sizes, "--obs-actor", env_id) or (ASYMMETRIC[:1] if both else every)
    critic_keys = _keys(critic, sizes, "--obs-critic", env_id) or (ASYMMETRIC[1:] if both else actor_keys)
    return ObsRoute(sizes, actor_keys, critic_keys)


# ---------------------------------------------------------------- The flat step output
def env_out_size(num_envs: int, obs_dim: int) -> int:
    """Elements of the flat step output: obs, final_obs, reward, terminated, truncated, episode_return,
    episode_length."""
    return num_envs * (2 * obs_dim + 5)


def env_out_views(flat, num_envs: int, obs_dim: int) -> tuple:
    """The seven parts of a flat step output (a tensor or a NumPy array), as views:
    obs [N, obs_dim], final_obs [N, obs_dim], then reward, terminated, truncated, episode_return,
    episode_length [N] (terminated / truncated as 0 / 1)."""
    n, o = num_envs, obs_dim
    ends = np.cumsum([0, n * o, n * o, n, n, n, n, n])
    parts = [flat[a:b] for a, b in zip(ends[:-1], ends[1:])]
    return (parts[0].reshape(n, o), parts[1].reshape(n, o), *parts[2:])


def unpack_step(flat, num_envs: int, obs_dim: int) -> tuple:
    """``(obs, reward, terminated, truncated, info)``, the return of ``step``, from a flat step output."""
    obs, final_obs, reward, term, trunc, ep_ret, ep_len = env_out_views(flat, num_envs, obs_dim)
    return (
        obs,
        reward,
        term > 0.5,
        trunc > 0.5,
        {"final_obs": final_obs, "episode_return": ep_ret, "episode_length": ep_len},
    )
