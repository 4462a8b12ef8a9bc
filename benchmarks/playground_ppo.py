"""Playground's own PPO (Brax) on one of its tasks, with Playground's tuned settings for that task: the peer the
FPO++ legged runs are compared with.

It trains `brax.training.agents.ppo` with `mujoco_playground.config.locomotion_params.brax_ppo_config(ENV)` (or the
DM Control suite's) as Playground's own training script does, on the task the FPO++ runs train on
(`fpo_utils.playground_env.load_task`: MJX, Menagerie read offline, no domain randomisation). For G1 that is 200M
steps (202.3M: Brax rounds up to whole evaluations) of 8,192 environments x 20, discount 0.97, learning rate 3e-4,
clipping 0.2, entropy cost 0.005, networks 512-256-128, all environments reset after each of the 20 evaluations,
and an ended episode restarting from its cached first state (Playground's wrapper default; `--full-reset`: the
task's own reset).

The run folder holds
* `params.npz`: the normaliser, policy and value parameters and the environment steps they have trained, saved at
  every evaluation (G1: every 10.6M steps), so a stopped run loses at most one evaluation's steps;
* `metrics.jsonl`: one row per evaluation: `env_steps`, Brax's evaluation (`eval_return`: the mean first-episode
  return of 128 environments, sampled from the policy's Gaussian; `eval_length`; `term_NAME`: each reward term
  times its weight, summed over the episode, not times the control step), `sps`, and the `machine` it ran on;
* `args.json` (the command, the resolved PPO settings, the terms' weights, versions) and, at the end,
  `summary.json`.

`--resume` goes on from `params.npz` on another machine, with the evaluations at the same steps. Brax restores the
parameters and the normaliser, not Adam's moments, and restarts the environments (a new machine's seed is
`seed + evaluations done`). `--stop-after N` ends a call after N more evaluations, saved. `--table` prints the
evaluations in markdown, with the tracking terms' mean a step over their weight.

    python benchmarks/playground_ppo.py --run-dir runs/g1_ppo_s0                     # G1, Playground's settings
    python benchmarks/playground_ppo.py --run-dir runs/g1_ppo_s0 --resume            # on the next machine
    python benchmarks/playground_ppo.py --env-id Go1JoystickFlatTerrain --run-dir runs/go1_ppo_s0 \\
        --set num_timesteps=50_000_000 num_envs=4096                                 # Playground's, changed

The trained policy's deterministic action (the Gaussian's mean, then tanh), evaluated on envpool's port of the task
with the FPO++ runs' protocol (`load_policy` reads `params.npz`):

    python benchmarks/legged_baselines.py --tasks G1JoystickFlatTerrain-v1 --ppo runs/g1_ppo_s0/params.npz --response

Brax 0.14.2 calls `jax.device_put_replicated`, which JAX 0.10 removed; `_brax_on_this_jax` puts it back (the same
arrays, stacked along the device axis) where it is missing. Needs `pip install -e '.[playground]'`.
"""

from __future__ import annotations

import argparse
import functools
import importlib.metadata
import json
import math
import platform
import sys
import time
import zipfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from fpo_utils.envs import parse_reward_scales  # noqa: E402
from fpo_utils.runfolder import RunError, atomic_write  # noqa: E402

TABLE_TERMS = ("tracking_lin_vel", "tracking_ang_vel", "feet_phase")  # --table's columns, where the task has them


class _Stop(Exception):
    """Raised after `--stop-after` evaluations; the run folder is saved and `--resume` goes on."""


def _brax_on_this_jax():
    import jax
    import jax.numpy as jnp

    try:
        jax.device_put_replicated  # noqa: B018 (JAX >= 0.10 raises AttributeError here)
    except AttributeError:

        def device_put_replicated(x, devices):
            devices = list(devices)
            spec = jax.sharding.NamedSharding(jax.sharding.Mesh(devices, ("d",)), jax.sharding.PartitionSpec("d"))
            return jax.tree.map(lambda a: jax.device_put(jnp.stack([jnp.asarray(a)] * len(devices)), spec), x)

        jax.device_put_replicated = device_put_replicated


def ppo_config(env_id: str, overrides=()):
    """Playground's PPO settings for `env_id`, with `overrides`: KEY=VALUE strings, each key one of its settings or
    a number or flag of `ppo.train` that they leave at Brax's default (`num_eval_envs=128`, ...)."""
    import inspect

    from brax.training.agents.ppo import train as ppo
    from mujoco_playground import registry
    from mujoco_playground.config import dm_control_suite_params, locomotion_params

    if env_id in registry.locomotion.ALL_ENVS:
        cfg = locomotion_params.brax_ppo_config(env_id)
    elif env_id in registry.dm_control_suite.ALL_ENVS:
        cfg = dm_control_suite_params.brax_ppo_config(env_id)
    else:
        raise RunError(f"--env-id {env_id!r}: not one of Playground's locomotion or DM Control tasks")
    defaults = {k: p.default for k, p in inspect.signature(ppo.train).parameters.items()}
    known = {k: v for k, v in defaults.items() if type(v) in (bool, int, float)}
    known.update((k, v) for k, v in cfg.items() if k != "network_factory")
    for item in overrides:
        key, sep, text = item.partition("=")
        if not sep or key not in known:
            raise RunError(f"--set {item!r}: write KEY=VALUE with KEY one of {', '.join(sorted(known))}")
        old = known[key]
        try:
            value = (text.lower() in ("1", "true")) if isinstance(old, bool) else type(old)(float(text))
        except ValueError:
            raise RunError(f"--set {item!r}: {key} takes a number like {old!r}") from None
        if not math.isfinite(value):
            raise RunError(f"--set {item!r}: {key} must be finite")
        cfg[key] = value
    return cfg


def networks_factory(obs_size, action_size, preprocess_observations_fn, factory):
    """`ppo.train`'s network factory: Brax's networks with Playground's layer sizes and observation keys."""
    from brax.training.agents.ppo import networks as ppo_networks

    return ppo_networks.make_ppo_networks(
        obs_size, action_size, preprocess_observations_fn=preprocess_observations_fn, **factory
    )


def observation_sizes(env):
    """The size of each of `env`'s observations ({key: n}, or n for a flat observation), read without a reset."""
    from fpo_utils.playground_env import reset_shapes

    obs = reset_shapes(env)
    return {k: int(v.shape[-1]) for k, v in obs.items()} if isinstance(obs, dict) else int(obs.shape[-1])


def networks(obs_sizes, action_size: int, factory: dict):
    """Brax's PPO networks as `ppo.train` builds them for observations of `obs_sizes` ({key: n}, or n for a
    flat observation), normalised by running statistics."""
    from brax.training.acme import running_statistics

    shapes = {k: (n,) for k, n in obs_sizes.items()} if isinstance(obs_sizes, dict) else (obs_sizes,)
    return networks_factory(shapes, action_size, running_statistics.normalize, factory)


def template(obs_sizes, action_size: int, factory: dict):
    """(normaliser, policy, value) parameters of the right structure: what `params.npz` is read into."""
    import jax
    import jax.numpy as jnp
    from brax.training.acme import running_statistics, specs

    nets = networks(obs_sizes, action_size, factory)
    key_p, key_v = jax.random.split(jax.random.PRNGKey(0))
    spec = functools.partial(specs.Array, dtype=jnp.dtype("float32"))
    obs = {k: spec((n,)) for k, n in obs_sizes.items()} if isinstance(obs_sizes, dict) else spec((obs_sizes,))
    return running_statistics.init_state(obs), nets.policy_network.init(key_p), nets.value_network.init(key_v)


def save_params(path: Path, params, env_steps: int, meta: dict) -> None:
    """`params` (a `ppo.train` triple) with `env_steps` and `meta`, written whole or not at all."""
    import jax

    leaves = jax.tree_util.tree_flatten_with_path(jax.device_get(params))[0]
    arrays = {jax.tree_util.keystr(p): np.asarray(v) for p, v in leaves}

    def write(tmp: Path) -> None:
        with open(tmp, "wb") as f:  # a file object: np.savez would add ".npz" to a path
            np.savez(f, meta=json.dumps(dict(meta, env_steps=int(env_steps))), **arrays)

    atomic_write(path, write)


def load_params(path: Path):
    """(params, meta) from `save_params`'s file; a file of another shape is a one-line RunError."""
    import jax

    try:
        data = np.load(path)
        meta = json.loads(str(data["meta"]))
        like = template(meta["obs_sizes"], meta["action_size"], meta["network_factory"])
    except (OSError, EOFError, KeyError, ValueError, zipfile.BadZipFile) as err:
        raise RunError(f"{path}: not a params.npz of benchmarks/playground_ppo.py ({err})") from None
    paths, treedef = jax.tree_util.tree_flatten_with_path(like)
    keys = [jax.tree_util.keystr(p) for p, _ in paths]
    missing = [k for k in keys if k not in data.files]
    if missing or any(data[k].shape != np.shape(v) for k, (_, v) in zip(keys, paths) if k in data.files):
        raise RunError(f"{path}: its arrays do not fit {meta['env_id']}'s networks (first missing: {missing[:1]})")
    return jax.tree_util.tree_unflatten(treedef, [data[k] for k in keys]), meta


def load_policy(path: Path):
    """The saved policy as `f(state_obs) -> x`: the Gaussian's mean before the tanh, from the raw `state` columns
    (numpy in, numpy out). Its deterministic action is tanh(x), which is Brax's `deterministic=True` action."""
    import jax
    import jax.numpy as jnp

    params, meta = load_params(path)
    sizes, n = meta["obs_sizes"], meta["action_size"]
    nets = networks(sizes, n, meta["network_factory"])
    key = meta["network_factory"].get("policy_obs_key", "state")

    @jax.jit
    def mean(obs):  # the other keys' columns (the critic's) are zeros: the policy reads only its own
        if isinstance(sizes, dict):
            obs = {k: obs if k == key else jnp.zeros((obs.shape[0], m)) for k, m in sizes.items()}
        return nets.policy_network.apply(params[0], params[1], obs)[..., :n]

    return lambda obs: np.asarray(mean(jnp.asarray(obs, jnp.float32))), meta


def table(run: Path) -> str:
    """The run folder's evaluations in markdown: environment steps, return, episode length and, for each term of
    TABLE_TERMS the task weighs, its mean a step divided by its weight (for the tracking terms, 1 is perfect)."""
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    weights = json.loads((run / "args.json").read_text()).get("term_weights", {})
    terms = [t for t in TABLE_TERMS if f"term_{t}" in rows[0] and weights.get(t)]
    lines = ["| environment steps | evaluation | episode, steps | " + " | ".join(terms) + " |"]
    lines.append("|---" * (3 + len(terms)) + "|")
    for r in rows:
        means = [f"{r[f'term_{t}'] / weights[t] / max(r['eval_length'], 1):.3f}" for t in terms]
        cells = [f"{r['env_steps']:,}", f"{r['eval_return']:.2f}", f"{r['eval_length']:.0f}", *means]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--env-id", default="G1JoystickFlatTerrain", help="a Playground task")
    parser.add_argument("--run-dir", type=Path, required=True, help="the run folder (params.npz, metrics.jsonl)")
    parser.add_argument("--seed", type=int, default=0, help="Brax's seed (a resumed call adds its evaluations)")
    parser.add_argument("--resume", action="store_true", help="go on from the run folder's params.npz")
    parser.add_argument("--set", nargs="+", default=[], help="Playground's PPO settings changed, KEY=VALUE")
    parser.add_argument("--full-reset", action="store_true", help="an ended episode restarts with the task's reset")
    parser.add_argument("--reward-scales", nargs="+", default=[], help="reward terms' weights, TERM=WEIGHT")
    parser.add_argument("--stop-after", type=int, default=0, help="stop after N more evaluations (0: at the end)")
    parser.add_argument("--table", action="store_true", help="print the run folder's evaluations and exit")
    return parser


def main() -> None:
    parser = build_parser()
    opts = parser.parse_args()
    if opts.table:
        if not (opts.run_dir / "metrics.jsonl").is_file():
            parser.error(f"--table: {opts.run_dir} has no metrics.jsonl")
        print(table(opts.run_dir))
        return
    try:
        cfg = ppo_config(opts.env_id, opts.set)
        scales = parse_reward_scales(opts.env_id, "playground", opts.reward_scales)
    except RunError as err:
        parser.error(str(err))
    if opts.stop_after < 0:
        parser.error(f"--stop-after {opts.stop_after}: must be >= 0 (0: run to the end)")
    run = opts.run_dir
    saved = run / "params.npz"
    if saved.exists() and not opts.resume:
        parser.error(f"--run-dir {run} holds a run (params.npz); pass --resume to go on, or pick a new folder")
    run.mkdir(parents=True, exist_ok=True)

    _brax_on_this_jax()
    import jax
    from brax.training.agents.ppo import train as ppo
    from mujoco_playground import registry, wrapper

    from fpo_utils.playground_env import load_task

    # The evaluations' spacing in environment steps, as ppo.train derives it from the whole budget.
    evals = max(cfg.num_evals - 1, 1)
    per_step = cfg.batch_size * cfg.unroll_length * cfg.num_minibatches * cfg.action_repeat
    per_eval = math.ceil(cfg.num_timesteps / (evals * per_step * max(cfg.num_resets_per_eval, 1)))
    per_eval *= per_step * max(cfg.num_resets_per_eval, 1)
    done_steps, restore = 0, None
    if opts.resume and saved.exists():
        try:
            restore, meta = load_params(saved)
        except RunError as err:
            parser.error(f"--resume: {err}")
        done_steps = meta["env_steps"]
        if meta["env_id"] != opts.env_id or meta["per_eval"] != per_eval:
            parser.error(f"--resume: {saved} is {meta['env_id']} every {meta['per_eval']} steps, not this command's")
    done_evals = done_steps // per_eval
    if done_evals >= evals:
        print(f"{run}: done ({done_steps} environment steps)")
        return

    env = load_task(opts.env_id, "jax", scales)
    factory = dict(cfg.get("network_factory", {}))
    sizes = observation_sizes(env)
    meta = dict(env_id=opts.env_id, obs_sizes=sizes, action_size=env.action_size, network_factory=factory)
    meta.update(per_eval=per_eval, reward_scales=scales, full_reset=opts.full_reset)
    machine = f"{platform.node()} {jax.devices()[0].device_kind} x{jax.local_device_count()}"
    settings = cfg.to_dict()
    versions = {k: importlib.metadata.version(k) for k in ("brax", "jax", "playground", "mujoco-mjx")}
    weights = dict(registry.get_default_config(opts.env_id).get("reward_config", {}).get("scales", {}), **dict(scales))
    (run / ("args.json" if not done_steps else f"args_resume_{done_steps}.json")).write_text(
        json.dumps(
            dict(vars(opts), run_dir=str(run), ppo=settings, term_weights=weights, versions=versions, machine=machine),
            indent=2,
        )
    )
    logged = set()
    if (run / "metrics.jsonl").exists():
        logged = {json.loads(line)["env_steps"] for line in (run / "metrics.jsonl").read_text().splitlines()}
    seen = {"evals": 0}

    def keep_params(step, make_policy, params):  # before each evaluation: save what has trained
        if step > 0:
            save_params(saved, params, done_steps + step, meta)

    def log_eval(step, metrics):  # after each evaluation: one row, unless this step's row is there
        total = done_steps + step
        if total not in logged:
            row = dict(env_steps=total, eval_return=float(metrics["eval/episode_reward"]))
            row["eval_length"] = float(metrics.get("eval/avg_episode_length", float("nan")))
            for k, v in metrics.items():
                if k.startswith("eval/episode_reward/") and not k.endswith("_std"):
                    row["term_" + k.rsplit("/", 1)[1]] = float(v)
            row.update(sps=float(metrics.get("training/sps", float("nan"))), time=round(time.time(), 1))
            row["machine"] = machine
            with open(run / "metrics.jsonl", "a") as f:
                f.write(json.dumps(row) + "\n")
            logged.add(total)
            print(f"steps {total:,}: eval {row['eval_return']:.3f}, length {row['eval_length']:.0f}", flush=True)
        if step > 0:
            seen["evals"] += 1
            if opts.stop_after and seen["evals"] >= opts.stop_after and done_evals + seen["evals"] < evals:
                raise _Stop

    train_kw = {k: v for k, v in settings.items() if k not in ("network_factory", "num_timesteps", "num_evals")}
    left = evals - done_evals
    try:
        ppo.train(
            environment=env,
            num_timesteps=left * per_eval,
            num_evals=left + 1,
            network_factory=functools.partial(networks_factory, factory=factory),
            wrap_env_fn=functools.partial(wrapper.wrap_for_brax_training, full_reset=opts.full_reset),
            seed=opts.seed + done_evals,
            restore_params=restore,
            progress_fn=log_eval,
            policy_params_fn=keep_params,
            **train_kw,
        )
    except _Stop:
        print(f"{run}: stopped after {opts.stop_after} evaluations, saved; --resume goes on", flush=True)
        return
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    (run / "summary.json").write_text(json.dumps(dict(env_steps=rows[-1]["env_steps"], last=rows[-1]), indent=2))
    print(f"{run}: done, {rows[-1]['env_steps']:,} environment steps")


if __name__ == "__main__":
    main()
