"""Same parameters, same batch, one whole update: the official FPO code (JAX) against robot_fpo.py (torch).

Builds the official ``FpoState`` and our networks at ``--preset fpo`` for a BallInCup-sized problem (8 observations,
2 actions) with small sizes (64 envs x 60 steps, unrolls of 30, 4 minibatches of 32 unrolls, 2 epochs), copies the
official initial parameters into ours through the exact reparametrisation, feeds one synthetic batch to both whole
updates (official: obs-statistics update, then its minibatch loop, step by step; ours: ``make_batch`` and
``update`` with the official minibatch permutation) and compares the parameters after every minibatch step.

The two conventions: official flow time ``t_off`` (1 = noise) is ours ``t = 1 - t_off``; the official network's
velocity points to the noise, ours to the data (last layer: sign flip); the time embedding
``[cos(2^k t_off), sin(2^k t_off)]`` is ours ``[cos(2^k t), sin(2^k t)]`` after a fixed 2 x 2 reflection of the
first layer's embedding columns. Mode ``official`` runs the official code as it is; mode ``aligned`` evaluates the
official embedding at ``1 - t_off`` instead, so the embedding columns map one to one (Adam is elementwise, so it is
not invariant under the reflection: only ``aligned`` can agree to float32 rounding).

    python benchmarks/compare_official_update.py --out /tmp/compare_official_update.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import sys
import time
import types
from dataclasses import replace
from pathlib import Path
from unittest import mock

import numpy as np
import torch
import torch.nn as nn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
import robot_fpo  # noqa: E402
from fpo_utils.envs import RunningMeanStd  # noqa: E402
from fpo_utils.runfolder import NonFiniteLoss  # noqa: E402

DEFAULT_PEER = "../shared/peers/fpo_playground/src"  # relative to the repository root (or the working folder)
OBS_DIM, ACT_DIM = 8, 2  # BallInCup
SIZES = dict(num_envs=64, unroll_length=30, num_minibatches=4, batch_size=32, num_updates_per_batch=2)
OBS_MEAN = np.array([0.0, 0.1, 0.0, -0.2, 0.0, 0.0, 0.0, 0.0], np.float32)  # positions, then velocities
OBS_SCALE = np.array([0.2, 0.3, 0.2, 0.3, 1.5, 2.0, 1.5, 2.0], np.float32)


# ---------------------------------------------------------------- Loading the official code
def resolve_peer(peer: str) -> Path:
    p = Path(peer)
    return p if p.is_absolute() or p.exists() else ROOT / p


def peer_missing(peer: str) -> str:
    """Why the official code cannot be loaded ('' when it can)."""
    pkg = resolve_peer(peer) / "flow_policy"
    if not (pkg / "fpo.py").is_file():
        return f"official FPO code not found at {pkg} (pass --peer)"
    try:
        import jax  # noqa: F401
        import jax_dataclasses  # noqa: F401
        import mujoco_playground  # noqa: F401
        import optax  # noqa: F401
    except ImportError as err:
        return f"the official code needs {err.name} (pip install jax-dataclasses playground optax)"
    return ""


def load_official(peer: str):
    """(fpo, rollouts) of the official package. Two stand-ins, nothing else changes: wandb (imported by rollouts.py
    for logging only) when it is not installed, and, on Python < 3.12, rollouts.py's PEP 695 type parameters
    rewritten as typing.Generic / Protocol[...] (same classes and functions, older syntax)."""
    import importlib.util

    src = resolve_peer(peer)
    if str(src) not in sys.path:
        sys.path.insert(0, str(src))
    if "wandb" not in sys.modules and importlib.util.find_spec("wandb") is None:
        wandb, sdk, run = (types.ModuleType(n) for n in ("wandb", "wandb.sdk", "wandb.sdk.wandb_run"))
        wandb.Histogram, run.Run, wandb.sdk, sdk.wandb_run = object, object, sdk, run
        sys.modules.update({"wandb": wandb, "wandb.sdk": sdk, "wandb.sdk.wandb_run": run})
    if sys.version_info < (3, 12) and "flow_policy.rollouts" not in sys.modules:
        import flow_policy

        path = src / "flow_policy" / "rollouts.py"
        text = path.read_text()
        for old, new in (
            (r"class TransitionStruct\[TActionInfo\]:", "class TransitionStruct(Generic[TActionInfo]):"),
            (r"class AgentState\[TActionInfo\]\(Protocol\):", "class AgentState(Protocol[TActionInfo]):"),
            (r"def rollout\[TActionInfo\]\(", "def rollout("),
        ):
            text, n = re.subn(old, new, text)
            if n != 1:
                raise SystemExit(f"{path}: expected one '{old}', found {n}")
        text = text.replace("from typing import Protocol, Self", "from typing import Generic, Protocol, Self, TypeVar")
        run_import = "from wandb.sdk.wandb_run import Run\n"
        text = text.replace(run_import, run_import + "\nTActionInfo = TypeVar('TActionInfo')\n", 1)
        module = types.ModuleType("flow_policy.rollouts")
        module.__file__, module.__package__ = str(path), "flow_policy"
        sys.modules["flow_policy.rollouts"] = module
        exec(compile(text, str(path), "exec"), module.__dict__)
        flow_policy.rollouts = module
    from flow_policy import fpo, rollouts

    return fpo, rollouts


class StubEnv:
    """What FpoState reads from an environment: its sizes."""

    observation_size, action_size = OBS_DIM, ACT_DIM


@contextlib.contextmanager
def time_embedding(fpo, mode: str):
    """``aligned``: the official embedding evaluated at ``1 - t_off`` (= ours at ``t``), for this block only."""
    import jax

    original = fpo.FpoState.embed_timestep
    if mode == "aligned":
        fpo.FpoState.embed_timestep = lambda self, t: original(self, 1.0 - t)
    jax.clear_caches()  # no trace of the other embedding may be reused
    try:
        yield
    finally:
        fpo.FpoState.embed_timestep = original
        jax.clear_caches()


# ---------------------------------------------------------------- The two parametrisations
def our_args() -> robot_fpo.Args:
    return replace(
        robot_fpo.PRESETS["fpo"],
        num_envs=SIZES["num_envs"],
        num_steps=SIZES["num_minibatches"] * SIZES["batch_size"] * SIZES["unroll_length"] // SIZES["num_envs"],
        num_minibatches=SIZES["num_minibatches"],
        update_epochs=SIZES["num_updates_per_batch"],
        cuda=False,
    )


def check_architectures(fpo_state, args: robot_fpo.Args) -> dict:
    """Layer shapes of both codes (official (in, out) against torch's (out, in)) must agree."""
    actor, critic = build_networks(args)
    shapes = {}
    for name, off, ours in (("actor", fpo_state.params.policy, actor), ("critic", fpo_state.params.value, critic)):
        off_shapes = [tuple(w.shape) for w, _ in off]
        our_shapes = [tuple(m.weight.shape[::-1]) for m in ours.net if isinstance(m, nn.Linear)]
        acts = {type(m).__name__ for m in ours.net if not isinstance(m, nn.Linear)}
        if off_shapes != our_shapes or acts != {"SiLU"}:
            raise SystemExit(f"{name}: official layers {off_shapes}, ours {our_shapes} with {acts}")
        shapes[name] = off_shapes
    return shapes


def build_networks(args: robot_fpo.Args):
    embed = (args.time_embed_dim, args.output_scale, args.time_embed_base)
    actor = robot_fpo.FlowActor(OBS_DIM, ACT_DIM, args.actor_hidden, args.actor_layers, *embed)
    critic = robot_fpo.Critic(OBS_DIM, args.critic_hidden, args.critic_layers, args.critic_act)
    return actor, critic


def official_to_ours(params, mode: str, embed_dim: int) -> dict[str, np.ndarray]:
    """Official parameters -> ours, in torch layout, keyed ``actor.<layer>.weight`` ...: transposed weights; the
    actor's last layer negated (velocity toward the data); in mode ``official`` the embedding rows of the first
    layer reflected, ``W'_cos = cos(a) W_cos + sin(a) W_sin``, ``W'_sin = sin(a) W_cos - cos(a) W_sin``, a = 2^k
    (cos(a t_off) = cos(a (1 - t)) expanded). The reflection is its own inverse."""
    out = {}
    for net, layers in (("actor", params.policy), ("critic", params.value)):
        layers = [(np.array(w, np.float64), np.array(b, np.float64)) for w, b in layers]
        if net == "actor":
            w0 = layers[0][0]
            if mode == "official":
                half, first = embed_dim // 2, OBS_DIM + ACT_DIM
                a = 2.0 ** np.arange(half)
                cos_rows, sin_rows = w0[first : first + half].copy(), w0[first + half : first + embed_dim].copy()
                w0[first : first + half] = np.cos(a)[:, None] * cos_rows + np.sin(a)[:, None] * sin_rows
                w0[first + half : first + embed_dim] = np.sin(a)[:, None] * cos_rows - np.cos(a)[:, None] * sin_rows
            layers[-1] = (-layers[-1][0], -layers[-1][1])
        for i, (w, b) in enumerate(layers):
            out[f"{net}.{i}.weight"], out[f"{net}.{i}.bias"] = w.T.astype(np.float32), b.astype(np.float32)
    return out


def our_params(state) -> dict[str, np.ndarray]:
    out = {}
    for net, module in (("actor", state.actor), ("critic", state.critic)):
        for i, lin in enumerate(m for m in module.net if isinstance(m, nn.Linear)):
            out[f"{net}.{i}.weight"] = lin.weight.detach().numpy().copy()
            out[f"{net}.{i}.bias"] = lin.bias.detach().numpy().copy()
    return out


def build_ours(args: robot_fpo.Args, params: dict[str, np.ndarray]) -> robot_fpo.State:
    """Our State (no environments) with ``params``, the fpo preset's optimiser and batch-variance statistics."""
    actor, critic = build_networks(args)
    with torch.no_grad():
        for net, module in (("actor", actor), ("critic", critic)):
            for i, lin in enumerate(m for m in module.net if isinstance(m, nn.Linear)):
                lin.weight.copy_(torch.from_numpy(params[f"{net}.{i}.weight"]))
                lin.bias.copy_(torch.from_numpy(params[f"{net}.{i}.bias"]))
    optimizer = torch.optim.AdamW(
        list(actor.parameters()) + list(critic.parameters()),
        lr=args.learning_rate,
        eps=args.adam_eps,
        weight_decay=args.weight_decay,
    )
    rms = RunningMeanStd((OBS_DIM,), "cpu", batch_var=args.obs_stats == "update")
    zeros = torch.zeros(args.num_envs, OBS_DIM)
    return robot_fpo.State(None, actor, critic, optimizer, rms, None, torch.device("cpu"), zeros, zeros.double())


def split_embedding(params: dict) -> dict:
    """The actor's first-layer weight split into its time-embedding columns and the rest."""
    out, first = dict(params), OBS_DIM + ACT_DIM
    w = out.pop("actor.0.weight")
    out["actor.0.weight"], out["actor_embed.0.weight"] = w[:, :first], w[:, first:]
    return out


def compare(off: dict, ours: dict) -> dict:
    """Largest absolute difference and ||diff|| / ||official|| over all tensors, per network, and over the actor's
    time-embedding columns (``actor_embed``; ``actor`` excludes them)."""
    off, ours, out = split_embedding(off), split_embedding(ours), {}
    for net in ("actor.", "actor_embed", "critic", ""):
        keys = [k for k in off if k.startswith(net)]
        diff = np.concatenate([(ours[k].astype(np.float64) - off[k]).ravel() for k in keys])
        ref = np.concatenate([off[k].astype(np.float64).ravel() for k in keys])
        out[net.rstrip(".") or "all"] = {
            "max_abs": float(np.nanmax(np.abs(diff))) if np.isfinite(diff).any() else float("nan"),
            "rel_l2": float(np.linalg.norm(diff) / np.linalg.norm(ref)),
            "n_over_1e-5": int((~(np.abs(diff) <= 1e-5)).sum()),  # Adam turns a gradient ~eps (1e-8) into ~lr
            "nonfinite_official": int((~np.isfinite(ref)).sum()),
            "nonfinite_ours": int(sum((~np.isfinite(ours[k])).sum() for k in keys)),
        }
    return out


# ---------------------------------------------------------------- The batch
def make_transitions(fpo, rollouts, fpo_state, seed: int, x_abs_max: float = 0.0):
    """One rollout's transitions (T, B, ...) as the official rollout stores them: raw observations, next
    observations (the final one where an episode ended), pre-tanh actions x, rewards, time-limit truncations,
    discounts (0 after a termination), (eps, t_off) draws on the official grid and the initial per-draw losses from
    the official code with the pre-update statistics. ``x_abs_max`` > 0 rescales x to that largest |x|."""
    import jax.numpy as jnp

    cfg, rng = fpo_state.config, np.random.default_rng(seed)
    T, B, M = cfg.iterations_per_env, cfg.num_envs, cfg.n_samples_per_action
    traj = (OBS_MEAN + OBS_SCALE * rng.standard_normal((T + 1, B, OBS_DIM))).astype(np.float32)
    truncation = np.zeros((T, B), np.float32)
    truncation[rng.integers(0, T, B // 3), np.arange(B // 3)] = 1.0  # a third of the envs hit their time limit
    discount = (rng.random((T, B)) > 0.01).astype(np.float32)  # a few terminations
    done = (truncation > 0) | (discount == 0)
    next_obs = traj[1:].copy()
    next_obs[done] = (OBS_MEAN + OBS_SCALE * rng.standard_normal((int(done.sum()), OBS_DIM))).astype(np.float32)
    x = rng.standard_normal((T, B, ACT_DIM)).astype(np.float32)
    if x_abs_max > 0:
        x *= x_abs_max / np.abs(x).max()
    eps = rng.standard_normal((T, B, M, ACT_DIM)).astype(np.float32)
    grid = np.asarray(fpo_state.get_schedule().t_current)
    t_off = grid[rng.integers(0, cfg.flow_steps, (T, B, M, 1))]
    obs = jnp.asarray(traj[:-1])
    obs_norm = (obs - fpo_state.obs_stats.mean) / fpo_state.obs_stats.std  # what sample_action used
    l0 = fpo_state._compute_cfm_loss(obs_norm, jnp.asarray(x), eps=jnp.asarray(eps), t=jnp.asarray(t_off))
    return rollouts.TransitionStruct(
        obs=obs,
        next_obs=jnp.asarray(next_obs),
        action=jnp.asarray(x),
        action_info=fpo.FpoActionInfo(loss_eps=jnp.asarray(eps), loss_t=jnp.asarray(t_off), initial_cfm_loss=l0),
        reward=jnp.asarray((rng.random((T, B)) < 0.2).astype(np.float32)),
        truncation=jnp.asarray(truncation),
        discount=jnp.asarray(discount),
    )


def with_initial_loss(tr, l0):
    import jax_dataclasses as jdc

    return jdc.replace(tr, action_info=jdc.replace(tr.action_info, initial_cfm_loss=l0))


def our_batch(state, args, tr, cfg) -> tuple[dict, float]:
    """Our batch from the same transitions, made by ``make_batch`` (obs_stats update, gae_unroll) with the official
    (t = 1 - t_off, eps) draws; its l_old is then replaced by the official initial losses (the same batch), after
    measuring how far ours were from them."""
    T, B, M = cfg.iterations_per_env, cfg.num_envs, cfg.n_samples_per_action
    f = lambda a: torch.from_numpy(np.array(a))  # noqa: E731
    t = 1.0 - f(tr.action_info.loss_t).reshape(T * B, M)
    eps = f(tr.action_info.loss_eps).reshape(T * B, M, ACT_DIM)
    rms = state.obs_rms
    obs_buf, final_buf = rms.normalize(f(tr.obs)), rms.normalize(f(tr.next_obs))  # stored with the old statistics
    rew_buf = f(tr.reward) * args.reward_scale
    term_buf, trunc_buf, x_buf = 1.0 - f(tr.discount), f(tr.truncation), f(tr.action)
    with mock.patch.object(robot_fpo, "sample_draws", lambda *a, **k: (t, eps)):
        batch = robot_fpo.make_batch(
            state, args, obs_buf, x_buf, final_buf, rew_buf, term_buf, trunc_buf, torch.zeros(3)
        )
    l0 = f(tr.action_info.initial_cfm_loss).reshape(T * B, M)
    l_old = robot_fpo.unrolls(l0, T, args.gae_unroll) if args.gae_unroll else l0
    l_old_diff = float((batch["l_old"] - l_old).abs().max())
    batch["l_old"] = l_old
    return batch, l_old_diff


def official_perms(tr, fpo_state) -> list[np.ndarray]:
    """The official minibatch permutation of each epoch: the key schedule of training_step (step_prng =
    fold_in(prng, steps), steps counting minibatch steps), checked against prepare_minibatches on unroll-tagged
    transitions."""
    import jax
    import jax.numpy as jnp
    import jax_dataclasses as jdc

    cfg = fpo_state.config
    T, B, k, nmb, bs = cfg.iterations_per_env, cfg.num_envs, cfg.unroll_length, cfg.num_minibatches, cfg.batch_size
    unroll_id = (np.arange(B)[None, :] * (T // k) + np.arange(T)[:, None] // k).astype(np.float32)  # (T, B)
    tagged = jdc.replace(tr, reward=jnp.asarray(unroll_id))  # each row carries its unroll's index
    perms = []
    for epoch in range(cfg.num_updates_per_batch):
        key = jax.random.fold_in(fpo_state.prng, epoch * nmb)
        perm = np.asarray(jax.random.permutation(key, nmb * bs))
        mbs = tagged.prepare_minibatches(key, nmb, bs)
        got = np.asarray(mbs.reward)[:, 0, :].reshape(-1)  # (minibatch, first step, unroll)
        assert np.array_equal(got, perm), "official permutation not reproduced"
        perms.append(perm)
    return perms


# ---------------------------------------------------------------- The two whole updates
def run_official(fpo_state, tr, mode: str, embed_dim: int, step_fn) -> tuple[list[dict], list[dict], object]:
    """training_step, step by step: obs-statistics update, then per epoch the minibatches of
    prepare_minibatches(fold_in(prng, steps)), each a ``_step_minibatch``. -> (params mapped to ours, metrics)."""
    import jax
    import jax_dataclasses as jdc

    cfg = fpo_state.config
    state = jdc.replace(fpo_state, obs_stats=fpo_state.obs_stats.update(tr.obs))
    params, metrics = [], []
    for _ in range(cfg.num_updates_per_batch):
        step_prng = jax.random.fold_in(state.prng, state.steps)
        mbs = tr.prepare_minibatches(step_prng, cfg.num_minibatches, cfg.batch_size)
        for j in range(cfg.num_minibatches):
            state, m = step_fn(state, jax.tree.map(lambda a: a[j], mbs), jax.random.fold_in(step_prng, 0))
            params.append(official_to_ours(state.params, mode, embed_dim))
            metrics.append({k: float(v) for k, v in m.items()})
    return params, metrics, state


def run_ours(state, batch, args, perms) -> tuple[list[dict], list[list[float]], str]:
    """robot_fpo.update with the official permutations; parameters recorded after each gradient_step."""
    params, rows, perm_iter = [], [], iter(perms)
    gradient_step = robot_fpo.gradient_step

    def recording_step(*a, **k):
        row = gradient_step(*a, **k)
        params.append(our_params(state))
        rows.append(row.tolist())
        return row

    def official_perm(n, device=None, **_):
        perm = next(perm_iter)
        if len(perm) != n:  # not unrolls (--gae-unroll 0): no official order to follow
            perm = np.random.default_rng(0).permutation(n)
        return torch.from_numpy(perm.astype(np.int64))

    error = ""
    with (
        mock.patch.object(robot_fpo, "gradient_step", recording_step),
        mock.patch.object(torch, "randperm", official_perm),
    ):
        try:
            robot_fpo.update(state, batch, args, robot_fpo.current_alpha(args, 0))
        except NonFiniteLoss as err:
            error = str(err)
    return params, rows, error


def scenario(fpo, rollouts, ctx, name, mode, seed, x_abs_max=0.0, shrink_updates=0, overflow=False) -> dict:
    """One batch through both whole updates from the same parameters; per-step comparison."""
    import jax.numpy as jnp
    import jax_dataclasses as jdc

    args, embed_dim = ctx["args"], ctx["fpo_state"].config.timestep_embed_dim
    fpo_state = ctx["fpo_state"]
    start = official_to_ours(fpo_state.params, mode, embed_dim)
    ours = build_ours(args, start)
    n = fpo_state.config.iterations_per_env * fpo_state.config.num_envs
    if shrink_updates:  # statistics as after ``shrink_updates`` earlier updates: batch-variance std shrunk
        count = shrink_updates * n
        std = OBS_SCALE * np.sqrt(n / count)
        stats = fpo_state.obs_stats
        prior = jdc.replace(stats, count=jnp.float32(count), mean=jnp.asarray(OBS_MEAN), std=jnp.asarray(std))
        fpo_state = jdc.replace(fpo_state, obs_stats=prior)
        ours.obs_rms.count.fill_(float(count))
        ours.obs_rms.mean.copy_(torch.from_numpy(OBS_MEAN).double())
        ours.obs_rms.var.copy_(torch.from_numpy(std).double() ** 2)
    tr = make_transitions(fpo, rollouts, fpo_state, seed, x_abs_max)
    batch, l_old_diff = our_batch(ours, args, tr, fpo_state.config)
    overflow_at = None
    if overflow:  # one transition's initial losses so large that exp(mean l0 - mean l) overflows in float32
        s0, b0 = 7, 5
        tr = with_initial_loss(tr, tr.action_info.initial_cfm_loss.at[s0, b0].add(200.0))
        T, B, M = fpo_state.config.iterations_per_env, fpo_state.config.num_envs, fpo_state.config.n_samples_per_action
        l0 = torch.from_numpy(np.array(tr.action_info.initial_cfm_loss)).reshape(T * B, M)
        batch["l_old"] = robot_fpo.unrolls(l0, T, args.gae_unroll)
        overflow_at = (s0, b0)
    perms = official_perms(tr, fpo_state)
    off_params, off_metrics, off_final = run_official(fpo_state, tr, mode, embed_dim, ctx["step_fn"])
    our_p, our_rows, error = run_ours(ours, batch, args, perms)
    steps = []
    for k, (po, pu, m, r) in enumerate(zip(off_params, our_p, off_metrics, our_rows)):
        moved = max(float(np.abs(po[key] - start[key]).max()) for key in po)
        steps.append(
            {
                "step": k + 1,
                "params": compare(po, pu),
                "official_moved_max_abs": moved,
                "official": {key: m[key] for key in ("policy_loss", "v_loss", "policy_ratio_mean", "policy_ratio_max")},
                "ours": {
                    "policy_loss": r[0],
                    "v_loss": r[1] * args.vf_coef,
                    "policy_ratio_mean": r[2],
                    "policy_ratio_max": r[4],
                    "grad_norm": r[6],
                },
                "official_ratio_min": m["policy_ratio_min"],
                "ours_ratio_min": r[3],
            }
        )
    out = {
        "scenario": name,
        "mode": mode,
        "x_abs_max": float(np.abs(np.asarray(tr.action)).max()),
        "obs_norm_abs_max": float(batch["obs"].abs().max()),
        "l_old_max_abs_diff_ours_vs_official": l_old_diff,
        "initial_loss_max": float(np.asarray(tr.action_info.initial_cfm_loss).max()),
        "ours_error": error,
        "steps": steps,
    }
    if overflow_at is not None:
        cfg = fpo_state.config
        u = overflow_at[1] * (cfg.iterations_per_env // cfg.unroll_length) + overflow_at[0] // cfg.unroll_length
        out["overflow_row_minibatch_step"] = int(np.nonzero(perms[0] == u)[0][0] // cfg.batch_size) + 1
    if ctx.get("check_training_step"):  # the step-by-step loop reproduces the official jitted training_step
        ts_state, _ = fpo_state.training_step(tr)
        ts = official_to_ours(ts_state.params, mode, embed_dim)
        out["loop_vs_training_step_max_abs"] = compare(ts, official_to_ours(off_final.params, mode, embed_dim))["all"][
            "max_abs"
        ]
    return out


def forward_checks(fpo, ctx, mode: str, seed: int = 0) -> dict:
    """Same (obs, x, eps, t): velocity (ours = -official) and per-draw CFM losses, normal and large x."""
    import jax.numpy as jnp
    from flow_policy import networks

    fpo_state, args = ctx["fpo_state"], ctx["args"]
    ours = build_ours(args, official_to_ours(fpo_state.params, mode, fpo_state.config.timestep_embed_dim))
    rng, n, m = np.random.default_rng(seed), 512, fpo_state.config.n_samples_per_action
    obs = rng.standard_normal((n, OBS_DIM)).astype(np.float32) * 3
    eps = rng.standard_normal((n, m, ACT_DIM)).astype(np.float32)
    t_off = np.asarray(fpo_state.get_schedule().t_current)[rng.integers(0, 10, (n, m, 1))]
    out = {}
    for label, scale in (("normal", 1.0), ("large_x", 40.0)):
        x = rng.standard_normal((n, ACT_DIM)).astype(np.float32) * scale
        x_t = t_off * eps + (1.0 - t_off) * x[:, None]
        obs_b = np.broadcast_to(obs[:, None], (n, m, OBS_DIM))
        v_off = networks.flow_mlp_fwd(fpo_state.params.policy, obs_b, x_t, fpo_state.embed_timestep(jnp.asarray(t_off)))
        v_off = np.asarray(v_off) * fpo_state.config.policy_mlp_output_scale
        l_off = np.asarray(fpo_state._compute_cfm_loss(obs, x, eps=eps, t=t_off))
        t = torch.from_numpy(1.0 - t_off[..., 0])
        with torch.no_grad():
            v_ours = ours.actor(torch.from_numpy(obs_b.copy()), torch.from_numpy(x_t), t).numpy()
            l_ours = robot_fpo.draw_losses(
                ours.actor, *map(torch.from_numpy, (obs, x)), t, torch.from_numpy(eps), "fpo"
            )
        out[label] = {
            "velocity_max_abs_diff": float(np.abs(v_ours + v_off).max()),
            "velocity_max_abs": float(np.abs(v_off).max()),
            "loss_max_abs_diff": float(np.abs(l_ours.numpy() - l_off).max()),
            "loss_max_rel_diff": float((np.abs(l_ours.numpy() - l_off) / np.maximum(np.abs(l_off), 1e-6)).max()),
        }
    return out


def setup(peer: str, seed: int = 0) -> dict:
    """The official state at FpoConfig defaults with SIZES, its jitted minibatch step, and our args."""
    import jax

    fpo, rollouts = load_official(peer)
    cfg = fpo.FpoConfig(**SIZES)
    fpo_state = fpo.FpoState.init(prng=jax.random.key(seed), env=StubEnv(), config=cfg)
    args = our_args()
    return {
        "fpo": fpo,
        "rollouts": rollouts,
        "fpo_state": fpo_state,
        "args": args,
        "architectures": check_architectures(fpo_state, args),
    }


def official_gradient_clipping(peer: str) -> list[str]:
    """Lines of the official fpo.py that clip gradients or build the optimiser (none clip gradients)."""
    text = (resolve_peer(peer) / "flow_policy" / "fpo.py").read_text().splitlines()
    pattern = re.compile(r"clip_by_global_norm|clip_by_block_rms|optax\.clip|optax\.chain|optax\.\w*adam")
    return [line.strip() for line in text if pattern.search(line)]


SCENARIOS = {
    "normal": {},
    "large_x": {"x_abs_max": 40.0},  # |x| max as in the failing BallInCup runs
    "shrunk_std": {"shrink_updates": 50},  # statistics as after 50 updates: normalised obs ~7x larger
    "large_x_shrunk_std": {"x_abs_max": 40.0, "shrink_updates": 50},
    "overflow": {"overflow": True},
}


def run_mode(ctx: dict, mode: str, scenarios: list[str], seed: int = 0) -> tuple[dict, list[dict]]:
    """Forward checks and the scenarios' whole updates with the official embedding ``mode``."""
    import jax

    with time_embedding(ctx["fpo"], mode):
        ctx["step_fn"] = jax.jit(lambda s, mb, p: s._step_minibatch(mb, p))
        forward, rows = forward_checks(ctx["fpo"], ctx, mode, seed), []
        for name in scenarios:
            t0 = time.perf_counter()
            rows.append(scenario(ctx["fpo"], ctx["rollouts"], ctx, name, mode, seed + 1, **SCENARIOS[name]))
            rows[-1]["seconds"] = round(time.perf_counter() - t0, 2)
    return forward, rows


def run_all(peer: str, seed: int, scenarios: list[str], modes: list[str], check_training_step: bool) -> dict:
    ctx = setup(peer, seed)
    ctx["check_training_step"] = check_training_step
    result = {
        "sizes": SIZES,
        "our_args": {k: getattr(ctx["args"], k) for k in ("num_envs", "num_steps", "num_minibatches", "update_epochs")},
        "architectures": ctx["architectures"],
        "official_optimizer_lines": official_gradient_clipping(peer),
        "forward": {},
        "scenarios": [],
    }
    for mode in modes:
        result["forward"][mode], rows = run_mode(ctx, mode, scenarios, seed)
        result["scenarios"] += rows
    return result


def print_table(result: dict) -> None:
    print("architectures (official (in, out)):", json.dumps(result["architectures"]))
    print("official optimiser / clipping lines:", result["official_optimizer_lines"])
    for mode, rows in result["forward"].items():
        for label, r in rows.items():
            print(
                f"forward [{mode:8s} {label:8s}] |v_ours + v_off| max {r['velocity_max_abs_diff']:.2e} "
                f"(|v| max {r['velocity_max_abs']:.2f}); per-draw loss max abs diff {r['loss_max_abs_diff']:.2e} "
                f"rel {r['loss_max_rel_diff']:.2e}"
            )
    for s in result["scenarios"]:
        head = f"\n== {s['scenario']} [{s['mode']}]  |x|max {s['x_abs_max']:.1f}"
        head += f"  |obs_norm|max {s['obs_norm_abs_max']:.1f}"
        head += f"  l_old ours-official max {s['l_old_max_abs_diff_ours_vs_official']:.2e}"
        if "loop_vs_training_step_max_abs" in s:
            head += f"  loop-vs-training_step {s['loop_vs_training_step_max_abs']:.1e}"
        print(head + (f"  ours: {s['ours_error']}" if s["ours_error"] else ""))
        if "overflow_row_minibatch_step" in s:
            print(f"   overflowing row is in minibatch step {s['overflow_row_minibatch_step']}")
        print(
            " step | max|dp|: embed    actor    critic | n>1e-5 | rel_l2  | moved   | ratio mean off / ours | "
            "ratio max off / ours | pg loss off / ours    | NaN off/ours"
        )
        for st in s["steps"]:
            p, o, u = st["params"], st["official"], st["ours"]
            cells = [
                f" {st['step']:4d}",
                f"{p['actor_embed']['max_abs']:.2e} {p['actor']['max_abs']:.2e} {p['critic']['max_abs']:.2e}",
                f"{p['all']['n_over_1e-5']:6d}",
                f"{p['all']['rel_l2']:.1e}",
                f"{st['official_moved_max_abs']:.1e}",
                f"{o['policy_ratio_mean']:10.4g} {u['policy_ratio_mean']:10.4g}",
                f"{o['policy_ratio_max']:9.4g} {u['policy_ratio_max']:9.4g}",
                f"{o['policy_loss']:10.3e} {u['policy_loss']:10.3e}",
                f"{p['all']['nonfinite_official']}/{p['all']['nonfinite_ours']}",
            ]
            print(" | ".join(cells))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--peer", default=DEFAULT_PEER, help="folder holding the official flow_policy package")
    parser.add_argument("--out", default="", help="write the results as JSON here")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--modes", default="official,aligned", help="official and/or aligned (see the docstring)")
    parser.add_argument("--scenarios", default="normal,large_x,shrunk_std,large_x_shrunk_std,overflow")
    parser.add_argument("--no-training-step-check", action="store_true", help="skip the jitted training_step check")
    cli = parser.parse_args()
    why = peer_missing(cli.peer)
    if why:
        raise SystemExit(why)
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    result = run_all(cli.peer, cli.seed, cli.scenarios.split(","), cli.modes.split(","), not cli.no_training_step_check)
    result["seconds"] = round(time.perf_counter() - t0, 1)
    print_table(result)
    if cli.out:
        Path(cli.out).write_text(json.dumps(result, indent=1, allow_nan=True))
        print(f"\nwrote {cli.out} ({result['seconds']} s)")


if __name__ == "__main__":
    main()
