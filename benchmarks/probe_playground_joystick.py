"""Build and step MuJoCo Playground's legged joystick tasks offline, with envpool's asset wheels as Menagerie.

The task is built by the Playground backend's ``load_task`` (``fpo_utils/playground_env.py``), which points
Playground's Menagerie folder at the robot's folder in envpool's installed asset wheels and turns Playground's
git clone into an error, so no task is fetched. Prints one JSON line: build and compile times, observation keys
and sizes, action size, and environment steps per second of a jitted ``lax.scan`` (best of ``--repeats`` after
the compile). Example (CPU, network blocked):

    MUJOCO_GL=disable JAX_PLATFORMS=cpu unshare -rn python benchmarks/probe_playground_joystick.py \
        --env Go1JoystickFlatTerrain --impl jax --num-envs 64 --steps 100
"""

import argparse
import json
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from fpo_utils.playground_env import load_task  # noqa: E402


def describe(tree) -> dict:
    if isinstance(tree, dict):
        return {k: list(v.shape) for k, v in tree.items()}
    return list(tree.shape)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--env", default="Go1JoystickFlatTerrain")
    parser.add_argument("--impl", default="jax", choices=["jax", "warp"])
    parser.add_argument("--num-envs", type=int, default=64)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--actions", default="random", choices=["zero", "random"])
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()

    t0 = time.perf_counter()
    env = load_task(args.env, args.impl)
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
