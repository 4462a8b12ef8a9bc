"""Dict observations routed to the actor and the critic (fpo_utils/envs.py: ObsRoute), and FPO++ on a
legged robot (envpool's CPU port of MuJoCo Playground's Spot joystick task, the fpopp-locomotion preset)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from collections import OrderedDict
from dataclasses import asdict, replace

import gymnasium as gym
import numpy as np
import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from test_robot_fpo import TINY_ROBOT, strip_time  # noqa: E402

import robot_fpo as R  # noqa: E402
from fpo_utils.envs import make_envs, observation_keys, route_obs  # noqa: E402
from fpo_utils.runfolder import RunError, read_jsonl  # noqa: E402

Box = gym.spaces.Box
SPOT = "SpotFlatTerrainJoystick-v1"  # envpool: dict observation, state 81, privileged_state 167; 12 actions


def envpool_has(env_id: str) -> bool:
    if importlib.util.find_spec("envpool") is None:
        return False
    import envpool

    return env_id in envpool.list_all_envs()


needs_envpool = pytest.mark.skipif(
    not envpool_has(SPOT),
    reason=f"needs envpool with its MuJoCo Playground ports ({SPOT}): pip install -e '.[envpool]'",
)


def box(*shape):
    return Box(-np.inf, np.inf, shape, np.float64)


PLAYGROUND_LIKE = gym.spaces.Dict({"state": box(81), "privileged_state": box(167)})
DMC_LIKE = gym.spaces.Dict({"velocity": box(9), "orientations": box(14), "height": box()})


# ---------------------------------------------------------------------------- the route, without environments


def test_default_routes_per_task_family():
    r = route_obs(PLAYGROUND_LIKE, "Spot")  # asymmetric actor-critic: state / privileged_state
    want = (("state",), ("privileged_state",), 248, 81, 167)
    assert (r.actor, r.critic, r.obs_dim, r.actor_dim, r.critic_dim) == want
    assert (r.obs_actor, r.obs_critic) == (slice(0, 81), slice(81, 248))
    r = route_obs(DMC_LIKE, "WalkerRun")  # every key in sorted order, the critic reads the actor's columns
    assert r.actor == r.critic == ("height", "orientations", "velocity") and r.obs_dim == 24
    assert r.obs_actor == r.obs_critic == slice(0, 24)
    # gymnasium keeps a space's own key order (as its FlattenObservation did): the same vector as gymnasium's flatten.
    ordered = gym.spaces.Dict(OrderedDict([("velocity", box(2)), ("height", box())]))
    r = route_obs(ordered, "dm_control/walker-run-v0", sort_keys=False)
    assert r.actor == r.critic == ("velocity", "height") and route_obs(ordered, "id").actor == ("height", "velocity")
    sample = ordered.sample()
    flat = r.flatten({k: np.asarray(v)[None] for k, v in sample.items()})[0]
    np.testing.assert_allclose(flat, gym.spaces.flatten(ordered, sample).astype(np.float32))
    r = route_obs(box(17), "HalfCheetah")  # flat: no keys, both read everything
    assert (r.actor, r.critic, r.obs_dim, r.obs_actor, r.obs_critic) == ((), (), 17, slice(0, 17), slice(0, 17))


def test_overrides_choose_keys_and_flatten_puts_them_in_their_columns():
    obs = {"state": np.full((2, 81), 1.0), "privileged_state": np.full((2, 167), 2.0)}
    r = route_obs(PLAYGROUND_LIKE, "Spot", actor="privileged_state", critic="state, privileged_state")
    assert (r.actor, r.critic, r.obs_dim) == (("privileged_state",), ("state", "privileged_state"), 167 + 248)
    flat = r.flatten(obs)
    assert flat.dtype == np.float32 and flat.shape == (2, 415)
    assert (flat[:, r.obs_actor] == 2.0).all()
    critic = flat[:, r.obs_critic]
    assert (critic[:, :81] == 1.0).all() and (critic[:, 81:] == 2.0).all()
    # The actor's keys alone on an asymmetric task: the critic keeps privileged_state.
    r = route_obs(PLAYGROUND_LIKE, "Spot", actor="state")
    assert r.critic == ("privileged_state",) and (r.flatten(obs)[:, r.obs_critic] == 2.0).all()
    # Keys given in an order: the columns follow it; on a task without privileged keys the critic follows the actor.
    r = route_obs(DMC_LIKE, "WalkerRun", actor="velocity,height")
    assert r.actor == r.critic == ("velocity", "height") and r.obs_dim == 10
    dmc = {"velocity": np.arange(18.0).reshape(2, 9), "orientations": np.zeros((2, 14)), "height": np.array([7.0, 8.0])}
    np.testing.assert_array_equal(r.flatten(dmc), np.concatenate([dmc["velocity"], [[7.0], [8.0]]], axis=1))


@pytest.mark.parametrize(
    "space,actor,critic,wanted",
    [
        (PLAYGROUND_LIKE, "stat", "", ["--obs-actor 'stat'", "allowed: privileged_state, state"]),
        (PLAYGROUND_LIKE, "", "state,priv", ["--obs-critic 'priv'", "allowed: privileged_state, state"]),
        (PLAYGROUND_LIKE, "state,state", "", ["names a key twice", "allowed: privileged_state, state"]),
        (box(17), "state", "", ["--obs-actor 'state'", "flat observation", "leave both empty"]),
        (None, "", "privileged_state", ["--obs-critic 'privileged_state'", "flat observation"]),
    ],
)
def test_bad_keys_are_one_line_errors_naming_what_is_allowed(space, actor, critic, wanted):
    with pytest.raises(RunError) as err:
        route_obs(space, "Task-v1", actor, critic)
    message = str(err.value)
    assert "\n" not in message and all(w in message for w in wanted), message


# ---------------------------------------------------------------------------- through gymnasium and the trainer


class TwoKeyEnv(gym.Env):
    """A dict observation whose values are known: ``state`` = t (3 entries), ``privileged_state`` = 100 + j + t
    (5 entries, j = 0..4) at step t of an episode; episodes are cut after 4 steps (TimeLimit)."""

    observation_space = gym.spaces.Dict({"state": box(3), "privileged_state": box(5)})
    action_space = Box(-1.0, 1.0, (2,), np.float32)

    def _obs(self):
        return {"state": np.full(3, float(self.t)), "privileged_state": 100.0 + np.arange(5) + self.t}

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._obs(), {}

    def step(self, action):
        self.t += 1
        return self._obs(), float(np.abs(action).sum()), False, False, {}


TWO_KEY = "TwoKeyObs-v0"
if TWO_KEY not in gym.registry:
    gym.register(TWO_KEY, entry_point=TwoKeyEnv, max_episode_steps=4)


def test_gymnasium_dict_observations_are_routed_final_observation_included():
    envs = make_envs(TWO_KEY, 2, 0, "gymnasium")
    assert (envs.obs_dim, envs.route.obs_actor, envs.route.obs_critic) == (8, slice(0, 3), slice(3, 8))
    obs = envs.reset(0)
    for t in range(1, 5):
        obs, _, term, trunc, info = envs.step(torch.zeros(2, 2))
    # Step 4 ends the episode: the final observation is t = 4, the new one t = 0, both routed.
    assert bool(trunc.all()) and not bool(term.any())
    torch.testing.assert_close(info["final_obs"][:, :3], torch.full((2, 3), 4.0))
    torch.testing.assert_close(info["final_obs"][:, 3:], 104.0 + torch.arange(5.0).expand(2, 5))
    torch.testing.assert_close(obs, torch.tensor([0.0] * 3 + [100.0, 101, 102, 103, 104]).expand(2, 8))
    envs.close()
    assert observation_keys(TWO_KEY, "gymnasium") == {"obs_actor": "state", "obs_critic": "privileged_state"}


def two_key_args(tmp_path, **kw) -> R.Args:
    tiny = {**TINY_ROBOT, "env_id": TWO_KEY, "backend": "gymnasium", "num_steps": 8, "eval_every": 1}
    return replace(R.Args(), **tiny, runs_dir=str(tmp_path), run_name="run", seed=3, **kw)


def test_actor_and_critic_read_their_columns_with_their_own_statistics(tmp_path):
    args = replace(two_key_args(tmp_path), objective="fpopp")
    state = R.build_state(args, torch.device("cpu"))
    assert state.actor.net[0].in_features == 3 + 2 + args.time_embed_dim and state.critic.net[0].in_features == 5
    R.reset_envs(state, args.seed)
    batch = R.collect_rollout(state, args)
    # 8 steps of 4-step episodes: every environment saw t = 0, 1, 2, 3 twice, so each column's statistics are
    # those of its own values (t, or 100 + j + t) pooled with the initial pseudo-count p at mean 0, variance 1.
    n, p = 8 * args.num_envs, 1e-4
    m = torch.cat([torch.full((3,), 1.5), 101.5 + torch.arange(5.0)]).double()  # per-column means of the data
    mean = n * m / (n + p)
    var = (p * (1 + mean**2) + n * (1.25 + (m - mean) ** 2)) / (n + p)  # 1.25: the variance of t
    torch.testing.assert_close(state.obs_rms.mean, mean, rtol=1e-9, atol=0)
    torch.testing.assert_close(state.obs_rms.var, var, rtol=1e-6, atol=0)
    # The stored observations are normalised per column: the critic's near +-1.3 like the actor's, not near 100.
    assert batch["obs"].shape == (8 * args.num_envs, 8) and float(batch["obs"].abs().max()) < 2.0
    # The critic reads only its columns, the actor only its own.
    obs = batch["obs"][:4].clone()
    moved = obs.clone()
    moved[:, :3] += 5.0
    torch.testing.assert_close(state.critic(moved), state.critic(obs))
    assert not torch.allclose(state.critic(obs), state.critic(obs + 5.0))
    x, tt, eps = batch["x"][:4], batch["t"][:4], batch["eps"][:4]
    torch.testing.assert_close(batch["l_old"][:4], R.draw_losses(state.actor, obs[:, :3], x, tt, eps, "fpopp"))
    state.envs.close()


def test_keys_reach_args_json_and_the_networks_and_resume_is_exact(tmp_path):
    args = two_key_args(tmp_path / "a", objective="fpopp", obs_critic="state,privileged_state", num_updates=2)
    R.main(args)
    saved = json.loads((tmp_path / "a" / "run" / "args.json").read_text())
    assert (saved["obs_actor"], saved["obs_critic"]) == ("state", "state,privileged_state")
    ckpt = torch.load(tmp_path / "a" / "run" / "checkpoints" / "last.pt", weights_only=False)
    assert ckpt["critic"]["net.0.weight"].shape[1] == 8 and ckpt["actor"]["net.0.weight"].shape[1] == 3 + 2 + 8
    assert ckpt["obs_rms"]["mean"].shape == (3 + 8,)
    # In pieces, through --resume: the same rows (the keys, resolved, are part of the settings).
    part = two_key_args(tmp_path / "b", objective="fpopp", obs_critic="state,privileged_state", num_updates=1)
    R.main(part)
    R.main(replace(part, num_updates=2, resume=True))
    rows = [read_jsonl(tmp_path / folder / "run" / "metrics.jsonl") for folder in "ab"]
    timeless = [strip_time(x) for x in rows]
    assert timeless[0] == timeless[1] and len(timeless[0]) == 3
    with pytest.raises(RunError, match="obs_critic"):
        R.main(replace(part, obs_critic="privileged_state", num_updates=3, resume=True))


def test_flat_tasks_keep_their_observation(tmp_path):
    args = replace(R.Args(), **TINY_ROBOT, runs_dir=str(tmp_path), run_name="flat", num_updates=1)
    R.main(args)
    saved = json.loads((tmp_path / "flat" / "args.json").read_text())
    assert (saved["obs_actor"], saved["obs_critic"]) == ("", "")
    with pytest.raises(RunError, match="flat observation"):
        R.main(replace(args, run_name="keys", obs_actor="state"))
    assert not (tmp_path / "keys").exists()


# ---------------------------------------------------------------------------- FPO++ on Spot (envpool)


def test_locomotion_preset_follows_the_official_velocity_configuration():
    p = R.PRESETS["fpopp-locomotion"]
    assert (p.objective, p.env_id, p.obs_actor, p.obs_critic) == ("fpopp", SPOT, "", "")
    # Official FPO++ Spot: 4,096 envs x 24 steps per update, 32 epochs x 4 minibatches, 32 draws, 1,500 updates.
    assert (p.num_envs, p.num_steps) == (4096, 24) and p.total_timesteps // (p.num_envs * p.num_steps) == 1500
    assert (p.update_epochs, p.num_minibatches, p.num_draws, p.flow_steps, p.vf_coef) == (32, 4, 32, 64, 0.5)
    official = (1e-4, 1e-4, False, 1.0, 0.99, 0.95)  # AdamW lr and weight decay, constant lr, clip, gamma, lambda
    assert (p.learning_rate, p.weight_decay, p.anneal_lr, p.max_grad_norm, p.gamma, p.gae_lambda) == official
    assert (p.actor_hidden, p.actor_layers, p.critic_hidden, p.critic_layers) == (256, 3, 768, 3)
    assert (p.actor_ema, p.ema_warmup, p.eval_every, p.eval_episodes, p.eval_init) == (0.95, 500, 50, 10, "native")
    clamps = (0.05, 20.0, 10.0, 100.0, 0.02)  # trust region, both losses, log-ratio, advantages; action noise std
    assert (p.clip_coef, p.loss_clamp, p.ratio_log_clamp, p.adv_clamp, p.fpopp_action_noise) == clamps
    assert not p.norm_reward and p.norm_obs and p.output_scale == 1.0


@needs_envpool
def test_spot_observations_are_the_pools_state_and_privileged_state():
    import envpool

    # DM Control through envpool: every key to both networks, in sorted order (envpool's own: orientations first).
    every = "height,orientations,velocity"
    assert observation_keys("WalkerRun-v1") == {"obs_actor": every, "obs_critic": every}
    assert observation_keys(SPOT) == {"obs_actor": "state", "obs_critic": "privileged_state"}
    envs = make_envs(SPOT, 2, 7, threads=1)
    raw = envpool.make(SPOT, env_type="gymnasium", num_envs=2, seed=7, num_threads=1)
    assert (envs.obs_dim, envs.act_dim, envs.route.actor_dim, envs.route.critic_dim) == (248, 12, 81, 167)
    got, (want, _) = envs.reset(7), raw.reset()
    for _ in range(2):
        np.testing.assert_array_equal(got[:, :81].numpy(), want["state"].astype(np.float32))
        np.testing.assert_array_equal(got[:, 81:].numpy(), want["privileged_state"].astype(np.float32))
        got, (want, *_) = envs.step(torch.zeros(2, 12))[0], raw.step(np.zeros((2, 12), np.float32))
    envs.close()
    raw.close()


@pytest.mark.slow
@needs_envpool
def test_spot_fpopp_end_to_end_on_the_cpu(tmp_path):
    """The fpopp-locomotion preset on Spot, tiny: 2 environments x 8 steps, 2 updates, small networks."""
    small = ["--num-envs", "2", "--num-steps", "8", "--num-updates", "2", "--eval-every", "2", "--eval-episodes", "1"]
    small += ["--update-epochs", "2", "--num-draws", "4", "--flow-steps", "4", "--actor-hidden", "16"]
    small += ["--critic-hidden", "16", "--env-threads", "1", "--torch-threads", "1", "--no-cuda"]
    cmd = [sys.executable, os.path.join(ROOT, "robot_fpo.py"), "--preset", "fpopp-locomotion", *small]
    env = dict(os.environ, MUJOCO_GL="disable", PYTHONUNBUFFERED="1")
    cmd += ["--runs-dir", str(tmp_path)]
    out = subprocess.run([*cmd, "--run-name", "spot"], capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    run = tmp_path / "spot"
    saved = json.loads((run / "args.json").read_text())
    assert (saved["env_id"], saved["preset"], saved["objective"]) == (SPOT, "fpopp-locomotion", "fpopp")
    assert (saved["obs_actor"], saved["obs_critic"]) == ("state", "privileged_state")
    rows = read_jsonl(run / "metrics.jsonl")
    assert [r["update"] for r in rows] == [0, 1, 2] and rows[-1]["global_step"] == 32
    assert all(np.isfinite(r[k]) for r in rows[1:] for k in ("pg_loss", "v_loss", "ratio_mean", "grad_norm"))
    assert all("eval_return" in r and "eval_return_random" in r for r in (rows[0], rows[-1]))  # zero noise + random
    ckpt = torch.load(run / "checkpoints" / "last.pt", weights_only=False)
    assert ckpt["actor"]["net.0.weight"].shape[1] == 81 + 12 + 8  # state, the noisy action, the time embedding
    assert ckpt["critic"]["net.0.weight"].shape[1] == 167  # privileged_state
    assert ckpt["obs_rms"]["mean"].shape == (81 + 167,) and ckpt["ema"] is not None
    assert json.loads((run / "summary.json").read_text())["status"] == "finished"
    # A key Spot does not have: one line naming it and the keys allowed, no run folder.
    bad = subprocess.run([*cmd, "--run-name", "bad", "--obs-actor", "stat"], capture_output=True, text=True, env=env)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1, bad.stderr
    assert "'stat'" in bad.stderr and "allowed: privileged_state, state" in bad.stderr
    assert not (tmp_path / "bad").exists()


@pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU (routed columns through the captured and fused paths)"
)
@pytest.mark.parametrize("fused", [False, True])
def test_routed_columns_through_the_captured_and_fused_paths_on_gpu(tmp_path, fused):
    """The actor's column slice feeds robot_fpo_fast's captured rollout steps and Triton sampler as it feeds the
    reference's rollout (float32 products on both sides)."""
    import robot_fpo_fast as F

    args = replace(two_key_args(tmp_path), objective="fpopp", cuda=True, tf32=False)
    fast = F.Args(**{**asdict(args), "fused": fused, "cuda_graph": True})
    torch.backends.cuda.matmul.allow_tf32 = False
    out = []
    for module, a in ((R, args), (F, fast)):
        torch.manual_seed(0)
        state = module.build_state(a, torch.device("cuda"))
        R.reset_envs(state, a.seed)
        torch.manual_seed(1)
        batch = module.collect_rollout(state, a)
        out.append({k: v.clone() for k, v in batch.items() if torch.is_tensor(v)})
        stats = module.update(state, batch, a, 1.0)
        assert np.isfinite([stats["pg_loss"], stats["v_loss"]]).all()
        state.envs.close()
    for key in out[0]:
        torch.testing.assert_close(out[1][key], out[0][key], rtol=1e-4, atol=1e-5, msg=key)
