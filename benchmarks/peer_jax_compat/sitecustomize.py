"""Put this folder first on the official FPO runner's PYTHONPATH (benchmarks/gpu_setup.sh does): the
runner's pinned MJX (mujoco-mjx 3.3.7) calls ``jnp.clip(x, a_min=...)``, keywords that JAX removed in
0.10, so tasks that reach that code (FishSwim's fluid forces) fail on a newer JAX. This maps the old
keywords onto the new ones; nothing else changes."""

import jax.numpy as jnp

_clip = jnp.clip


def clip(x, min=None, max=None, *, a_min=None, a_max=None, **kw):  # noqa: A002 (JAX's own argument names)
    return _clip(x, a_min if min is None else min, a_max if max is None else max, **kw)


jnp.clip = clip
