"""Run the official FPO code (akanazawa/fpo, JAX + MuJoCo Playground) at its default FpoConfig and log,
per training block, what robot_fpo.py logs per update: the likelihood ratio's extremes over the block's
minibatch steps, the stored actions' magnitude, the losses, and whether every parameter is still finite
(JAX does not stop at a NaN). Evaluations (128 episodes) at block 0, every EVAL_EVERY blocks and the end,
as robot_fpo.py's ``--eval-every``.

    PYTHONPATH=$PEERPATH python benchmarks/peer_fpo_logged.py BallInCup 61 SEED [EVAL_EVERY]

Writes $OUT/official_TASK_sSEED.json (rows per block) and prints one line per block. PEERPATH comes from
benchmarks/gpu_setup.sh (a bundle made with PEERS=../shared/peers).
"""

import json
import math
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from flow_policy import fpo, rollouts
from mujoco_playground import registry


def finite_params(agent) -> bool:
    leaves = jax.tree_util.tree_leaves(agent.params)
    return bool(all(bool(jnp.isfinite(x).all()) for x in leaves))


def block_row(i, tr, m, stats, seconds) -> dict:
    """One block's statistics: m holds (epochs, minibatches) arrays from training_step; stats are the
    observation statistics the block's update used."""
    m = {k: np.asarray(v, dtype=np.float64) for k, v in m.items()}
    x = np.abs(np.asarray(tr.action, dtype=np.float64))
    std = np.asarray(stats.std, dtype=np.float64)
    obs_norm = (np.asarray(tr.obs, dtype=np.float64) - np.asarray(stats.mean)) / std
    return {
        "update": i + 1,
        "train_reward": float(np.mean(np.asarray(tr.reward))),
        "action_abs_mean": float(x.mean()),
        "action_abs_max": float(x.max()),
        "ratio_max": float(m["policy_ratio_max"].max()),
        "ratio_min": float(m["policy_ratio_min"].min()),
        "ratio_mean": float(m["policy_ratio_mean"].mean()),
        "clipfrac": float(m["clipped_ratio_mean"].mean()),
        "pg_loss": float(m["policy_loss"].mean()),
        "pg_loss_max": float(m["policy_loss"].max()),
        "v_loss": float(m["v_loss"].mean()),
        "obs_std_min": float(std.min()),
        "obs_std_max": float(std.max()),
        "obs_norm_abs_max": float(np.abs(obs_norm).max()),
        "steps_nonfinite_loss": int((~np.isfinite(m["policy_loss"] + m["v_loss"])).sum()),
        "seconds": round(seconds, 3),
    }


def main() -> None:
    task, blocks, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    eval_every = int(sys.argv[4]) if len(sys.argv) > 4 else 7
    cfg = fpo.FpoConfig(num_timesteps=blocks * 983_040)
    env = registry.load(task, config=registry.get_default_config(task))
    agent = fpo.FpoState.init(prng=jax.random.key(seed), env=env, config=cfg)
    rs = rollouts.BatchedRolloutState.init(env, prng=jax.random.key(seed), num_envs=cfg.num_envs)

    def evaluate(k: int) -> float:
        key = jax.random.fold_in(agent.prng, k)
        e = rollouts.eval_policy(agent, prng=key, num_envs=128, max_episode_length=cfg.episode_length)
        return float(np.asarray(e.scalar_metrics["reward_mean"]))

    out = {"task": task, "seed": seed, "device": str(jax.devices()[0]), "rows": [], "evals": []}
    out["evals"].append({"update": 0, "eval_return": evaluate(0)})
    first_nonfinite = None
    for i in range(blocks):
        t = time.time()
        rs, tr = rs.rollout(agent, episode_length=cfg.episode_length, iterations_per_env=cfg.iterations_per_env)
        agent, m = agent.training_step(tr)
        jax.block_until_ready(jax.tree_util.tree_leaves(agent.params)[0])
        row = block_row(i, tr, m, agent.obs_stats, time.time() - t)
        row["params_finite"] = finite_params(agent)
        if not row["params_finite"] and first_nonfinite is None:
            first_nonfinite = i + 1
        if (i + 1) % eval_every == 0 or i + 1 == blocks:
            row["eval_return"] = evaluate(i + 1)
            out["evals"].append({"update": i + 1, "eval_return": row["eval_return"]})
        out["rows"].append(row)
        show = {k: row[k] for k in ("update", "ratio_max", "action_abs_max", "v_loss", "params_finite")}
        print(json.dumps(show | ({"eval": row["eval_return"]} if "eval_return" in row else {})), flush=True)
    out["first_nonfinite_update"] = first_nonfinite
    finite = [e["eval_return"] for e in out["evals"] if math.isfinite(e["eval_return"])]
    out["peak"] = max(finite) if finite else None
    path = os.path.join(os.environ.get("OUT", "/tmp"), f"official_{task}_s{seed}.json")
    with open(path, "w") as f:
        json.dump(out, f, indent=1)
    print(json.dumps({k: out[k] for k in ("task", "seed", "peak", "first_nonfinite_update")}), flush=True)


if __name__ == "__main__":
    main()
