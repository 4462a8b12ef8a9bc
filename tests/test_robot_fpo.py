"""Tests for robot_fpo.py: objectives against hand computations, tiny end-to-end runs, resume."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from dataclasses import replace

import numpy as np
import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
import robot_fpo as R  # noqa: E402
from fpo_utils.envs import env_out_size, env_out_views, make_envs, unpack_step  # noqa: E402
from fpo_utils.fast import GraphedSampler, GraphedStep, NumpySampler  # noqa: E402
from fpo_utils.runfolder import RunError, read_jsonl  # noqa: E402

GRID = np.arange(1, 11) / 10.0
TIME_KEYS = {"sps", "rollout_s", "update_s"}


# A robot run small enough for the CPU tests (also used by the halving tests).
TINY_ROBOT = dict(
    env_id="InvertedPendulum-v5",
    num_envs=4,
    num_steps=32,
    num_minibatches=2,
    update_epochs=2,
    num_draws=4,
    flow_steps=4,
    actor_hidden=16,
    actor_layers=2,
    critic_hidden=16,
    critic_layers=1,
    eval_every=2,
    eval_episodes=2,
    cuda=False,
    torch_threads=1,
)


def tiny_args(tmp_path, **kw) -> R.Args:
    base = dict(
        **TINY_ROBOT,
        runs_dir=str(tmp_path),
        run_name="run",
        seed=3,
    )
    base.update(kw)
    return replace(R.Args(), **base)


# ---------------------------------------------------------------------------- objectives


def ppo_np(r, a, rho):
    return np.minimum(r * a, np.clip(r, 1 - rho, 1 + rho) * a)


def spo_np(r, a, rho):
    return r * a - np.abs(a) * (r - 1) ** 2 / (2 * rho)


def test_fpo_loss_matches_hand_computation_weight_inside_exponent():
    t = np.array([[0.0, 0.5, 0.9], [0.3, 0.3, 0.7]])
    l_old = np.array([[0.40, 0.10, 0.05], [0.20, 0.30, 0.02]])
    l_new = np.array([[0.30, 0.15, 0.01], [0.25, 0.20, 0.01]])
    adv = np.array([1.5, -0.7])
    alpha_eps, rho = 0.5, 0.05
    # w(s) = s^(2(1-alpha_eps)) / mean over the grid {.1..1}: here s^1 / 0.55.
    w = (1 - t) / GRID.mean()
    d = (w * (l_old - l_new)).mean(1)
    expected = -ppo_np(np.exp(d), adv, rho).mean()
    loss, ratio, d_i = R.fpo_loss(*(torch.tensor(a) for a in (l_old, l_new, t, adv)), alpha_eps, rho)
    np.testing.assert_allclose(d_i.numpy(), d, rtol=1e-6)
    np.testing.assert_allclose(ratio.numpy(), np.exp(d), rtol=1e-6)
    assert loss.item() == pytest.approx(expected, rel=1e-6)
    # The same weights placed outside the exponent give a different objective (tab:placement).
    outside = -np.mean([np.mean(w[i] * ppo_np(np.exp(l_old[i] - l_new[i]), adv[i], rho)) for i in range(2)])
    assert abs(outside - expected) > 1e-3


def test_fpo_native_weight_is_plain_mean_and_weights_change_the_ratio():
    t = torch.tensor([[0.1, 0.8]])
    l_old, l_new, adv = torch.tensor([[0.5, 0.1]]), torch.tensor([[0.3, 0.2]]), torch.tensor([1.0])
    _, _, d1 = R.fpo_loss(l_old, l_new, t, adv, 1.0, 0.05)
    assert d1.item() == pytest.approx(((0.5 - 0.3) + (0.1 - 0.2)) / 2, rel=1e-6)
    _, _, d0 = R.fpo_loss(l_old, l_new, t, adv, 0.0, 0.05)
    norm = (GRID**2).mean()
    assert d0.item() == pytest.approx((0.9**2 * 0.2 + 0.2**2 * -0.1) / 2 / norm, rel=1e-5)


def fpopp_weight_np(t, alpha, lo=0.005, hi=0.995):
    p = 2 * (1 - alpha)
    mean = ((1 - lo) ** (p + 1) - (1 - hi) ** (p + 1)) / ((p + 1) * (hi - lo))
    return (1 - t) ** p / mean


@pytest.mark.parametrize("mode", ["aspo", "ppo", "spo"])
def test_fpopp_loss_matches_hand_computation(mode):
    t = np.array([[0.1, 0.6], [0.3, 0.95], [0.5, 0.2]])
    l_old = np.array([[0.8, 25.0], [1.2, 0.4], [14.0, 0.3]])
    l_new = np.array([[0.7, 1.0], [30.0, 0.5], [1.0, 0.35]])
    adv = np.array([0.9, -1.3, 2.0])
    alpha, rho = 0.5, 0.05
    lo = np.minimum(l_old, 20.0)
    ln = np.minimum(l_new, 20.0)
    r = np.exp(np.minimum(lo - ln, 10.0))
    a = np.broadcast_to(adv[:, None], r.shape)
    if mode == "ppo":
        p = ppo_np(r, a, rho)
    elif mode == "spo":
        p = spo_np(r, a, rho)
    else:
        p = np.where(a > 0, ppo_np(r, a, rho), spo_np(r, a, rho))
    expected = -(fpopp_weight_np(t, alpha) * p).mean()
    loss, ratio = R.fpopp_loss(*(torch.tensor(x) for x in (l_old, l_new, t, adv)), alpha, rho, mode)
    np.testing.assert_allclose(ratio.numpy(), r, rtol=1e-6)
    assert loss.item() == pytest.approx(expected, rel=1e-6)
    # Weight inside the exponent instead of multiplying the proxy is a different objective.
    w = fpopp_weight_np(t, alpha)
    r_in = np.exp(np.minimum(w * (lo - ln), 10.0))
    inside = -np.where(a > 0, ppo_np(r_in, a, rho), spo_np(r_in, a, rho)).mean()
    assert abs(inside - expected) > 1e-3


def test_aspo_is_ppo_for_positive_and_spo_for_nonpositive_advantages():
    g = torch.Generator().manual_seed(0)
    r = torch.exp(0.2 * torch.randn(200, generator=g, dtype=torch.float64))
    a = torch.randn(200, generator=g, dtype=torch.float64)
    a[:5] = 0.0
    aspo = R.trust_region_proxy(r, a, 0.05, "aspo")
    pos, nonpos = a > 0, a <= 0
    torch.testing.assert_close(aspo[pos], R.trust_region_proxy(r, a, 0.05, "ppo")[pos])
    torch.testing.assert_close(aspo[nonpos], R.trust_region_proxy(r, a, 0.05, "spo")[nonpos])
    np.testing.assert_allclose(aspo[nonpos].numpy(), spo_np(r.numpy(), a.numpy(), 0.05)[nonpos.numpy()])
    np.testing.assert_allclose(aspo[pos].numpy(), ppo_np(r.numpy(), a.numpy(), 0.05)[pos.numpy()])
    with pytest.raises(ValueError, match="trust_region"):
        R.trust_region_proxy(r, a, 0.05, "trpo")


def test_straight_through_clamp_value_and_identity_gradient():
    x = torch.tensor([3.0, 12.0, -40.0], requires_grad=True)
    y = R.straight_through_upper_clamp(x, 10.0)
    assert y.tolist() == [3.0, 10.0, -40.0]
    (y * torch.tensor([1.0, 2.0, 3.0])).sum().backward()
    assert x.grad.tolist() == [1.0, 2.0, 3.0]
    # Inside the FPO++ loss: a clamped difference still passes d r / d l_new = -r (SPO, A < 0).
    l_new = torch.tensor([[0.5]], dtype=torch.float64, requires_grad=True)
    l_old, t, adv, rho = torch.tensor([[15.0]], dtype=torch.float64), torch.tensor([[0.4]]), torch.tensor([-2.0]), 0.05
    loss, ratio = R.fpopp_loss(l_old, l_new, t, adv, 1.0, rho, "spo")
    assert ratio.item() == pytest.approx(math.exp(10.0))
    loss.backward()
    r = math.exp(10.0)
    # loss = -(rA - |A|(r-1)^2/(2 rho)), dr/dl_new = -r (identity through the clamp).
    expected = -(-2.0 - 2.0 * (r - 1) / rho) * (-r)
    assert l_new.grad.item() == pytest.approx(expected, rel=1e-9)


def test_fpopp_clamps_both_losses_whatever_the_advantage_sign():
    # Both losses are clamped at 20 for either sign of A (official FPO++: cfm_loss_clamp = 20, then
    # cfm_loss_clamp_negative_advantages_max = 20 where A < 0), so l_new = 30 counts as 20.
    l_old = torch.tensor([[1.0], [1.0]], dtype=torch.float64)
    l_new = torch.tensor([[30.0], [30.0]], dtype=torch.float64, requires_grad=True)
    t, adv = torch.tensor([[0.5], [0.5]]), torch.tensor([1.0, -1.0])
    _, ratio = R.fpopp_loss(l_old, l_new, t, adv, 1.0, 0.05, "spo")
    np.testing.assert_allclose(ratio.detach().numpy()[:, 0], [math.exp(-19.0), math.exp(-19.0)])


def test_fpopp_clamp_official_example_positive_advantage():
    # l_old = 15, l_new = 25, A = +1, t = .5: ratio exp(15 - 20) = exp(-5) = 6.74e-3 and no gradient
    # reaches l_new through the clamp (the unclamped value would give exp(-10)).
    l_old = torch.tensor([[15.0]], dtype=torch.float64)
    l_new = torch.tensor([[25.0]], dtype=torch.float64, requires_grad=True)
    t, adv = torch.tensor([[0.5]], dtype=torch.float64), torch.tensor([1.0], dtype=torch.float64)
    loss, ratio = R.fpopp_loss(l_old, l_new, t, adv, 1.0, 0.05, "aspo")
    assert ratio.item() == pytest.approx(math.exp(-5.0), rel=1e-12)
    assert ratio.item() == pytest.approx(6.74e-3, rel=1e-3)
    loss.backward()
    assert l_new.grad.item() == 0.0


def test_draw_losses_are_noise_and_velocity_residuals():
    torch.manual_seed(0)
    actor = R.FlowActor(3, 2, 8, 1, 4, 0.25).double()
    obs, x = torch.randn(5, 3, dtype=torch.float64), torch.randn(5, 2, dtype=torch.float64)
    t, eps = torch.rand(5, 4, dtype=torch.float64), torch.randn(5, 4, 2, dtype=torch.float64)
    x_t = (1 - t[..., None]) * eps + t[..., None] * x[:, None]
    v = actor(obs[:, None].expand(5, 4, 3), x_t, t)
    lv = ((v - (x[:, None] - eps)) ** 2).sum(-1)
    # l_eps = |x_t - t v - eps|^2 / d = t^2 |v - u|^2 / d (eq:targets); FPO++: |v-u|^2/sqrt(d).
    torch.testing.assert_close(R.draw_losses(actor, obs, x, t, eps, "fpo"), t**2 * lv / 2)
    torch.testing.assert_close(R.draw_losses(actor, obs, x, t, eps, "fpopp"), lv / math.sqrt(2))


def test_draw_times_and_numpy_sampler():
    torch.manual_seed(0)
    t, eps = R.sample_draws(500, 4, 3, "fpo", 0.005, 0.995, "cpu")
    k = t.double().numpy().ravel() * 10
    np.testing.assert_allclose(k, np.round(k), atol=1e-5)  # t on {0, .1, ..., .9}: s = 1 - t on {.1, ..., 1}
    assert sorted(set(np.round(k).astype(int))) == list(range(10)) and eps.shape == (500, 4, 3)
    t, _ = R.sample_draws(500, 4, 3, "fpopp", 0.005, 0.995, "cpu")
    assert t.min() >= 0.005 and t.max() <= 0.995
    actor = R.FlowActor(3, 2, 8, 2, 4, 0.25)
    obs, x0 = torch.randn(6, 3), torch.randn(6, 2)
    fast = NumpySampler(actor)(obs, x0, 5)
    np.testing.assert_allclose(fast.numpy(), actor.sample(obs, x0, 5).numpy(), atol=1e-4)


def test_numpy_sampler_is_bit_identical_to_the_plain_expression():
    # The buffered sampler must reproduce, bit for bit, the straightforward numpy Euler loop
    # (rollout actions, and hence runs, stay identical for a given seed).
    torch.manual_seed(1)
    for layers, n in ((3, 16), (1, 5)):
        actor = R.FlowActor(7, 3, 32, layers, 8, 0.25)
        s = NumpySampler(actor)
        lin = [m for m in actor.net if isinstance(m, torch.nn.Linear)]
        w = [m.weight.detach().numpy().T.copy() for m in lin]  # row-major, as a BLAS call sees them
        b = [m.bias.detach().numpy() for m in lin]
        rng = np.random.default_rng(layers)
        obs = (3 * rng.standard_normal((n, 7))).astype(np.float32)
        x0 = rng.standard_normal((n, 3)).astype(np.float32)
        x0_copy = x0.copy()
        steps, dt = 6, np.float32(1 / 6)
        freqs = actor.freqs.double().numpy()
        ang = (np.arange(steps) / steps)[:, None] * freqs
        time_terms = np.concatenate([np.cos(ang), np.sin(ang)], axis=1).astype(np.float32) @ w[0][10:]
        x = x0
        for k in range(steps):
            h = (obs @ w[0][:7] + b[0]) + x @ w[0][7:10] + time_terms[k]
            h = h / (1.0 + np.exp(-h))
            for wi, bi in zip(w[1:-1], b[1:-1]):
                h = h @ wi + bi
                h = h / (1.0 + np.exp(-h))
            x = x + dt * np.float32(0.25) * (h @ w[-1] + b[-1])
        got = s.sample_np(obs, x0, steps)
        assert got.dtype == np.float32
        np.testing.assert_array_equal(got, x)
        np.testing.assert_array_equal(x0, x0_copy)  # the caller's noise is not overwritten


def test_schedule_over_blocks_and_bad_args(tmp_path):
    a = tiny_args(tmp_path, alpha_early=1.0, alpha_late=0.5, k0=1, k1=3, block_size=100)
    assert R.current_alpha(a, 0) == 1.0
    assert R.current_alpha(a, 250) == pytest.approx(0.75)  # block 2, halfway through (1, 3)
    assert R.current_alpha(a, 10_000) == pytest.approx(0.5)
    assert R.current_alpha(tiny_args(tmp_path, objective="fpopp", alpha=0.3), 10_000) == 0.3
    for bad in (
        dict(num_envs=0),
        dict(t_min=0.5, t_max=0.4),
        dict(anneal_steps=-1),
        dict(env_id="InvertedPendulum-v9"),
    ):
        with pytest.raises(RunError):
            R.validate_args(tiny_args(tmp_path, **bad))
    with pytest.raises(RunError, match="continuous Box"):
        make_envs("CartPole-v1", 1, 0, "gymnasium")


# ---------------------------------------------------------------------------- end to end


def run_script(tmp_path, *flags):
    env = dict(os.environ, MUJOCO_GL="disable", PYTHONUNBUFFERED="1")
    cmd = [
        sys.executable,
        os.path.join(ROOT, "robot_fpo.py"),
        "--runs-dir",
        str(tmp_path),
        "--run-name",
        "e2e",
        "--no-cuda",
        "--torch-threads",
        "1",
        "--num-envs",
        "4",
        "--num-steps",
        "64",
        "--num-minibatches",
        "2",
        "--update-epochs",
        "2",
        "--num-draws",
        "4",
        "--flow-steps",
        "4",
        "--actor-hidden",
        "16",
        "--critic-hidden",
        "16",
        "--eval-every",
        "4",
        "--eval-episodes",
        "2",
        "--total-timesteps",
        "2048",
        *flags,
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    run = tmp_path / "e2e"
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    summary = json.loads((run / "summary.json").read_text())
    assert json.loads((run / "args.json").read_text())["env_id"] == flags[1]
    assert (run / "checkpoints" / "last.pt").exists() and (run / "curve.png").exists()
    return rows, summary


def test_end_to_end_mujoco_fpo(tmp_path):
    rows, summary = run_script(
        tmp_path, "--env-id", "InvertedPendulum-v5", "--objective", "fpo", "--alpha-eps", "0.5", "--keep-checkpoints"
    )
    assert summary["status"] == "finished" and summary["global_step"] == 2048 and summary["updates_done"] == 8
    kept = sorted(p.name for p in (tmp_path / "e2e" / "checkpoints").glob("update_*.pt"))
    assert kept == ["update_000004.pt", "update_000008.pt"]
    assert [r["update"] for r in rows] == list(range(9))
    evals = [r["eval_return"] for r in rows if "eval_return" in r]
    assert len(evals) == 3 and summary["peak"] == max(evals)
    assert all(r["alpha"] == 0.5 for r in rows)
    assert all(np.isfinite(r[k]) for r in rows[1:] for k in ("pg_loss", "v_loss", "ratio_mean", "clipfrac", "sps"))


@pytest.mark.parametrize("objective", ["fpo", "fpopp"])
def test_end_to_end_envpool_dm_control(tmp_path, objective):
    pytest.importorskip("envpool")
    rows, summary = run_script(
        tmp_path,
        "--env-id",
        "CartpoleSwingup-v1",
        "--objective",
        objective,
        "--alpha",
        "0.5",
        "--alpha-eps",
        "0.5",
        "--eval-every",
        "8",
        "--num-steps",
        "32",
        "--total-timesteps",
        "1024",
    )
    assert summary["status"] == "finished" and summary["global_step"] == 1024
    args = json.loads((tmp_path / "e2e" / "args.json").read_text())
    assert args["backend"] == "auto" and args["objective"] == objective
    last = rows[-1]
    assert 0.0 <= last["eval_return"] <= 1000.0  # DM Control: reward in [0, 1] per step, 1000 steps
    if objective == "fpopp":  # FPO++ evaluates from zero initial noise, and reports random initial noise next to it
        assert "eval_return_random" in last
    assert all(np.isfinite(r[k]) for r in rows[1:] for k in ("pg_loss", "v_loss", "ratio_mean"))


@pytest.mark.parametrize("env_id", ["InvertedPendulum-v5", "CartpoleSwingup-v1"])
def test_step_into_writes_what_step_returns(env_id):
    """The rollout's one-copy step (``step_into``) gives what ``step`` gives, episode ends included."""
    pytest.importorskip("envpool")
    a, b = (make_envs(env_id, 3, 11) for _ in range(2))
    a.reset(5), b.reset(5)
    out, gen, ends = torch.full((env_out_size(3, a.obs_dim),), float("nan")), torch.Generator().manual_seed(0), 0
    for _ in range(40 if env_id.startswith("Inverted") else 3):
        act = 2 * torch.rand(3, a.act_dim, generator=gen) - 1
        obs, rew, term, trunc, info = a.step(act)
        b.step_into(act, out)
        parts = env_out_views(out, 3, a.obs_dim)
        want = (
            obs,
            info["final_obs"],
            rew,
            term.float(),
            trunc.float(),
            info["episode_return"],
            info["episode_length"],
        )
        assert all(torch.equal(x, y) for x, y in zip(parts, want))
        o2, _, te2, tr2, _ = unpack_step(out, 3, a.obs_dim)
        assert torch.equal(o2, obs) and torch.equal(te2, term) and torch.equal(tr2, trunc)
        ends += int(term.sum() + trunc.sum())
    assert ends > 0 or not env_id.startswith("Inverted")  # the pendulum falls under random actions: resets covered


def strip_time(rows):
    return [{k: v for k, v in r.items() if k not in TIME_KEYS} for r in rows]


def read_rows(path):
    return read_jsonl(path)


@pytest.mark.parametrize("objective", ["fpo", "fpopp"])
def test_kill_and_resume_reproduces_uninterrupted_run(tmp_path, objective):
    # envpool cannot save its simulators' state, so a resumed run restarts its environments: with restarts
    # at the checkpoints (every 2 updates) the uninterrupted run restarts at the same points.
    full = tiny_args(tmp_path / "a", objective=objective, num_updates=4, restart_every=2)
    R.main(full)
    ref = read_rows(tmp_path / "a" / "run" / "metrics.jsonl")

    part = tiny_args(tmp_path / "b", objective=objective, num_updates=2, restart_every=2)
    R.main(part)
    ckpt = tmp_path / "b" / "run" / "checkpoints" / "last.pt"
    shutil.copy(ckpt, tmp_path / "saved.pt")
    R.main(replace(part, num_updates=3, resume=True))
    # Simulate a kill after update 3 was logged but before its checkpoint replaced update 2's.
    shutil.copy(tmp_path / "saved.pt", ckpt)
    summary = R.main(replace(part, num_updates=4, resume=True))
    got = read_rows(tmp_path / "b" / "run" / "metrics.jsonl")
    assert [r["update"] for r in got] == [0, 1, 2, 3, 4]
    assert strip_time(got) == strip_time(ref)
    assert summary["status"] == "finished" and summary["updates_done"] == 4


def test_nonfinite_loss_ends_run_and_keeps_last_good_checkpoint(tmp_path, monkeypatch):
    calls = {"n": 0}
    real = R.fpo_loss

    def flaky(*a, **k):
        calls["n"] += 1
        loss, ratio, d = real(*a, **k)
        return (loss * float("inf") if calls["n"] > 4 else loss), ratio, d

    monkeypatch.setattr(R, "fpo_loss", flaky)  # 4 minibatch steps per update: the 2nd update fails
    args = tiny_args(tmp_path, num_updates=4, checkpoint_every=1)
    summary = R.main(args)
    assert summary["status"] == "nonfinite" and summary["updates_done"] == 1
    ckpt = torch.load(tmp_path / "run" / "checkpoints" / "last.pt", weights_only=False)
    assert ckpt["update"] == 1
    rows = read_rows(tmp_path / "run" / "metrics.jsonl")
    assert rows[-1]["nonfinite"] is True


def test_action_squash_maps_into_the_box():
    x = torch.tensor([[0.0, 3.0], [-0.5, -10.0]], dtype=torch.float64)
    torch.testing.assert_close(R.squash(x, "tanh"), torch.tanh(x))
    torch.testing.assert_close(R.squash(x, "clip"), torch.tensor([[0.0, 1.0], [-0.5, -1.0]], dtype=torch.float64))
    envs = make_envs("Pendulum-v1", 2, 0, "gymnasium")  # box [-2, 2]: [-1, 1] is rescaled to it
    np.testing.assert_allclose(envs._to_box(torch.tensor([[-1.0], [0.5]])), [[-2.0], [1.0]])
    envs.close()


def test_action_bound_clamps_stored_actions(tmp_path):
    args = tiny_args(tmp_path, action_bound=0.2)
    torch.manual_seed(0)
    state = R.build_state(args, torch.device("cpu"))
    R.reset_envs(state, args.seed)
    x = R.collect_rollout(state, args)["x"]
    state.envs.close()
    # Euler samples start from N(0, I): most exceed 0.2 in magnitude and must sit on the bound.
    assert x.abs().max().item() == pytest.approx(0.2)
    assert (x.abs() >= 0.2 - 1e-6).float().mean().item() > 0.5
    with pytest.raises(RunError, match="action_bound"):
        R.validate_args(replace(args, action_bound=float("nan")))


def test_anneal_steps_sets_the_lr_horizon(tmp_path):
    batch = 4 * 32
    args = tiny_args(
        tmp_path, num_updates=4, eval_every=4, total_timesteps=100 * batch, anneal_steps=2 * batch, learning_rate=1e-3
    )
    R.main(args)
    lrs = [r["lr"] for r in read_rows(tmp_path / "run" / "metrics.jsonl")[1:]]
    # lr = lr0 * max(1 - k / (anneal_steps / batch), 0.05) before update k = 0, 1, 2, 3.
    np.testing.assert_allclose(lrs, [1e-3, 0.5e-3, 0.05e-3, 0.05e-3])


# ---------------------------------------------------------------------------- CUDA graph


def two_states(args, device):
    """Two identical training states and one rollout batch collected by the first."""
    states = []
    for _ in range(2):
        torch.manual_seed(0)
        states.append(R.build_state(args, device))
    a, b = states
    R.reset_envs(a, args.seed)
    batch = R.collect_rollout(a, args)
    for s in states:
        s.envs.close()
    return a, b, batch


def assert_same_networks(a, b, **tol):
    for p, q in zip(
        list(a.actor.parameters()) + list(a.critic.parameters()),
        list(b.actor.parameters()) + list(b.critic.parameters()),
    ):
        torch.testing.assert_close(p, q, **tol)


def test_cuda_graph_flag_is_a_no_op_on_cpu(tmp_path):
    args = tiny_args(tmp_path)
    a, b, batch = two_states(args, torch.device("cpu"))
    assert not R.uses_cuda_graph(b, replace(args, cuda_graph=True))
    for seed in (1, 2):
        torch.manual_seed(seed)
        sa = R.update(a, batch, replace(args, cuda_graph=False), 1.0)
        torch.manual_seed(seed)
        sb = R.update(b, batch, replace(args, cuda_graph=True), 1.0)
        assert sa == sb and sa["minibatch_steps"] == 4
    assert a.graph is None and b.graph is None
    assert_same_networks(a, b, rtol=0, atol=0)


@pytest.mark.parametrize("objective,gae_unroll", [("fpo", 0), ("fpopp", 0), ("fpo", 8)])
def test_graphed_step_replayed_eagerly_takes_the_eager_steps(tmp_path, monkeypatch, objective, gae_unroll):
    # The graph's step (index table, device step counter, statistics table), with each replay
    # run eagerly on the CPU instead of captured, must take exactly the eager loop's steps.
    args = tiny_args(tmp_path, objective=objective, alpha_eps=0.5, alpha=0.5, gae_unroll=gae_unroll)
    a, b, batch = two_states(args, torch.device("cpu"))
    replays = []

    def fake_capture(self):
        def replay():
            replays.append(int(self.counter))
            self._step()

        self.graph = type("EagerReplay", (), {"replay": staticmethod(replay)})()

    monkeypatch.setattr(GraphedStep, "capture", fake_capture)
    for seed in (1, 2):
        torch.manual_seed(seed)
        sa = R.update(a, batch, args, 0.5)
        monkeypatch.setattr(R, "uses_cuda_graph", lambda state, args: True)
        torch.manual_seed(seed)
        sb = R.update(b, batch, args, 0.5)
        monkeypatch.undo()
        monkeypatch.setattr(GraphedStep, "capture", fake_capture)
        assert sa == sb
    assert replays == [0, 1, 2, 3] * 2  # one replay per minibatch step, the counter reset per update
    assert_same_networks(a, b, rtol=0, atol=0)


@pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU (compares the CUDA-graph update with the eager one)"
)
@pytest.mark.parametrize(
    "objective,gae_unroll,compile",
    [("fpo", 0, False), ("fpopp", 0, False), ("fpo", 8, False), ("fpo", 8, True), ("fpopp", 0, True)],
)
def test_cuda_graph_update_matches_eager_update_on_gpu(tmp_path, objective, gae_unroll, compile):
    # Both sides use the fused flow MLP (--fused); the graphed side optionally compiles its losses.
    args = tiny_args(
        tmp_path,
        objective=objective,
        cuda=True,
        alpha_eps=0.5,
        alpha=0.5,
        gae_unroll=gae_unroll,
        compile=compile,
        fused=True,
    )
    dev = torch.device("cuda")
    a, b, batch = two_states(args, dev)
    eager, graphed = replace(args, cuda_graph=False), replace(args, cuda_graph=True)
    ckpt = str(tmp_path / "b.pt")
    for k in range(3):
        if k == 1:  # an annealed learning rate reaches the captured optimiser step
            for s in (a, b):
                s.optimizer.param_groups[0]["lr"] *= 0.5
        if k == 2:  # a resume replaces the optimiser state: the graph is rebuilt
            torch.save(R.checkpoint_payload(b), ckpt)
            R.load_checkpoint(ckpt, b)
            assert b.graph is None
        torch.cuda.manual_seed(k)
        sa = R.update(a, batch, eager, 0.5)
        torch.cuda.manual_seed(k)
        sb = R.update(b, batch, graphed, 0.5)
        assert a.graph is None and b.graph is not None and b.graph.graph is not None
        assert sa["minibatch_steps"] == sb["minibatch_steps"] == 4
        for key in R.STAT_KEYS:
            assert sb[key] == pytest.approx(sa[key], rel=1e-4, abs=1e-5), key
        assert_same_networks(a, b, rtol=1e-5, atol=1e-5)
    assert isinstance(b.optimizer.param_groups[0]["lr"], float) and not b.optimizer.param_groups[0]["capturable"]


# ---------------------------------------------------------------------------- presets, errors, signals


def test_presets_resolve_and_args_json_records_every_value(tmp_path):
    import tyro

    fpo = tyro.cli(R.Args, default=R.PRESETS["fpo"], args=["--seed", "4"])
    # Official FPO FpoConfig: 2048 envs x 480 steps = 983,040 (one block per update), 16 x 32 minibatches.
    assert fpo.num_envs * fpo.num_steps == 983_040 == fpo.block_size
    assert fpo.num_envs * fpo.num_steps // fpo.num_minibatches == 30_720
    assert (fpo.update_epochs, fpo.learning_rate, fpo.gamma, fpo.reward_scale, fpo.max_grad_norm, fpo.seed) == (
        16,
        3e-4,
        0.995,
        10.0,
        0.0,
        4,
    )
    assert fpo.total_timesteps // (fpo.num_envs * fpo.num_steps) == 61 and fpo.eval_episodes == 128
    assert fpo.compile and fpo.fused and not (R.Args().compile or R.Args().fused)  # GPU fast paths: fpo preset only
    fpopp = R.PRESETS["fpopp"]
    assert (fpopp.objective, fpopp.learning_rate, fpopp.weight_decay, fpopp.num_draws, fpopp.flow_steps) == (
        "fpopp",
        1e-4,
        1e-4,
        16,
        64,
    )
    assert (
        fpopp.update_epochs,
        fpopp.num_minibatches,
        fpopp.gamma,
        fpopp.vf_coef,
        fpopp.max_grad_norm,
        fpopp.actor_ema,
    ) == (16, 4, 0.99, 1.0, 1.0, 0.95)
    # A tiny run from the fpo preset: args.json holds every resolved field, the preset's included.
    small = dict(
        env_id="InvertedPendulum-v5",
        num_envs=4,
        num_steps=30,
        num_minibatches=2,
        update_epochs=1,
        num_draws=2,
        flow_steps=2,
        actor_hidden=8,
        critic_hidden=8,
        eval_every=1,
        eval_episodes=1,
        num_updates=1,
        cuda=False,
        runs_dir=str(tmp_path),
    )
    summary = R.main(replace(fpo, **small))
    folder = tmp_path / "InvertedPendulum-v5__fpo__alpha_eps1.0__fpo__4"
    saved = json.loads((folder / "args.json").read_text())
    assert set(saved) == set(R.Args.__dataclass_fields__)
    assert saved["preset"] == "fpo" and saved["reward_scale"] == 10.0 and saved["critic_act"] == "silu"
    assert saved["critic_layers"] == 5 and saved["gae_unroll"] == 30 and summary["status"] == "finished"


def run_cli(tmp_path, *flags):
    env = dict(os.environ, MUJOCO_GL="disable")
    return subprocess.run(
        [sys.executable, os.path.join(ROOT, "robot_fpo.py"), "--runs-dir", str(tmp_path / "runs"), "--no-cuda", *flags],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )


def test_bad_input_is_one_line_and_leaves_no_folder(tmp_path):
    out = run_cli(tmp_path, "--env-id", "Walker2d-v9")
    assert out.returncode == 2 and out.stderr.count("\n") == 1, out.stderr
    assert "Walker2d-v9" in out.stderr and "Walker2d-v5" in out.stderr  # close matches
    out = run_cli(tmp_path, "--env-id", "InvertedPendulum-v5", "--num-envs", "0")
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "num_envs" in out.stderr, out.stderr
    out = run_cli(tmp_path, "--env-id", "InvertedPendulum-v5", "--backend", "envpol")
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "envpool" in out.stderr, out.stderr
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def test_missing_backend_is_a_one_line_error(monkeypatch):
    import importlib.util

    import fpo_utils.envs as E

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name.startswith(("envpool", "fpo_utils.playground")) else real(name, *a),
    )
    with pytest.raises(RunError, match=r"pip install -e '\.\[envpool\]'"):
        E.make_envs("CartpoleSwingup-v1", 2, 0, "envpool")
    with pytest.raises(RunError, match="playground"):
        E.make_envs("CartpoleSwingup", 2, 0, "playground")
    assert E.resolve_backend("InvertedPendulum-v5", "auto") == "gymnasium"  # auto falls back without envpool


def test_sigint_stops_at_a_checkpoint_and_resume_reproduces_the_run(tmp_path, monkeypatch):
    import signal

    full = tiny_args(tmp_path / "a", num_updates=4, restart_every=2)  # restarts at the checkpoints (envpool)
    R.main(full)
    ref = read_rows(tmp_path / "a" / "run" / "metrics.jsonl")
    real, calls = R.collect_rollout, {"n": 0}

    def interrupted(state, args):  # Ctrl-C during the first update's rollout
        calls["n"] += 1
        if calls["n"] == 1:
            os.kill(os.getpid(), signal.SIGINT)
        return real(state, args)

    monkeypatch.setattr(R, "collect_rollout", interrupted)
    part = tiny_args(tmp_path / "b", num_updates=4, restart_every=2)
    summary = R.main(part)
    assert summary["status"] == "interrupted" and summary["updates_done"] == 2  # the next checkpoint boundary
    monkeypatch.setattr(R, "collect_rollout", real)
    with pytest.raises(RunError, match="already holds a checkpoint"):
        R.main(part)
    with pytest.raises(RunError, match="learning_rate"):
        R.main(replace(part, resume=True, learning_rate=1e-3))
    assert R.main(replace(part, resume=True))["status"] == "finished"
    assert strip_time(read_rows(tmp_path / "b" / "run" / "metrics.jsonl")) == strip_time(ref)


def test_nonfinite_run_exits_3_through_the_cli(tmp_path, monkeypatch):
    from fpo_utils.runfolder import cli

    real = R.fpo_loss
    monkeypatch.setattr(R, "fpo_loss", lambda *a, **k: (lambda out: (out[0] * float("nan"), *out[1:]))(real(*a, **k)))
    argv = [
        "--env-id",
        "InvertedPendulum-v5",
        "--num-envs",
        "4",
        "--num-steps",
        "16",
        "--num-minibatches",
        "2",
        "--update-epochs",
        "1",
        "--num-updates",
        "2",
        "--eval-episodes",
        "1",
        "--no-cuda",
        "--runs-dir",
        str(tmp_path),
        "--run-name",
        "nan",
    ]
    with pytest.raises(SystemExit) as exit_info:
        cli(R.main, R.Args, R.PRESETS, argv=argv)
    assert exit_info.value.code == 3
    rows = (tmp_path / "nan" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(r)["update"] for r in rows] == [0, 1] and json.loads(rows[-1])["nonfinite"] is True
    assert json.loads((tmp_path / "nan" / "summary.json").read_text())["status"] == "nonfinite"


def test_actor_ema_copies_during_warmup_then_averages(tmp_path):
    args = tiny_args(tmp_path, objective="fpopp", actor_ema=0.9, ema_warmup=1, num_updates=2, eval_every=1)
    R.main(args)
    first = tiny_args(tmp_path / "one", objective="fpopp", actor_ema=0.9, ema_warmup=1, num_updates=1, eval_every=1)
    R.main(first)
    c1 = torch.load(tmp_path / "one" / "run" / "checkpoints" / "last.pt", weights_only=False)
    c2 = torch.load(tmp_path / "run" / "checkpoints" / "last.pt", weights_only=False)
    for k in c1["actor"]:  # update 1 (warm-up): the EMA is the actor; update 2: 0.9 EMA + 0.1 actor
        torch.testing.assert_close(c1["ema"][k], c1["actor"][k])
        torch.testing.assert_close(c2["ema"][k], 0.9 * c1["actor"][k] + 0.1 * c2["actor"][k])


def test_unrolls_and_unroll_gae_closed_forms():
    a = torch.arange(8)  # T = 4 steps x n = 2 environments, time-major
    assert R.unrolls(a, 4, 2).tolist() == [[0, 2], [4, 6], [1, 3], [5, 7]]  # unrolls of one environment each
    g = 0.9
    rew, values, boot = torch.tensor([[1.0, 2.0, 3.0]]), torch.tensor([[0.5, -1.0, 2.0]]), torch.tensor([4.0])
    disc, none = torch.full((1, 3), g), torch.zeros(1, 3)
    vs, adv = R.unroll_gae(rew, disc, none, values, boot, 1.0)  # lambda = 1: Monte Carlo returns, bootstrapped
    mc = torch.tensor([[1 + g * 2 + g**2 * 3 + g**3 * 4, 2 + g * 3 + g**2 * 4, 3 + g * 4]])
    torch.testing.assert_close(vs, mc)
    torch.testing.assert_close(adv, mc - values)
    vs, adv = R.unroll_gae(rew, disc, none, values, boot, 0.0)  # lambda = 0: one-step TD targets
    td = rew + g * torch.tensor([[-1.0, 2.0, 4.0]])
    torch.testing.assert_close(vs, td)
    torch.testing.assert_close(adv, rew + g * torch.tensor([[td[0, 1], td[0, 2], 4.0]]) - values)
    term = torch.tensor([[g, 0.0, g]])  # terminated at step 1; truncated (time limit) at step 2
    vs, adv = R.unroll_gae(rew, term, torch.tensor([[0.0, 0.0, 1.0]]), values, boot, 1.0)
    torch.testing.assert_close(vs, torch.tensor([[1 + g * 2, 2.0, 2.0]]))  # nothing flows back past either
    torch.testing.assert_close(adv, torch.tensor([[1 + g * 2 - 0.5, 3.0, 0.0]]))


def test_unroll_gae_matches_the_step_by_step_recursion():
    torch.manual_seed(0)
    m, k, lam = 16, 30, 0.95
    rew, values, boot = torch.randn(m, k), torch.randn(m, k), torch.randn(m)
    disc = 0.99 * (torch.rand(m, k) > 0.1).float()  # some terminations
    trunc = (torch.rand(m, k) > 0.9).float()  # some time limits
    vs, adv = R.unroll_gae(rew, disc, trunc, values, boot, lam)
    mask = 1.0 - trunc
    nxt = torch.cat([values[:, 1:], boot[:, None]], 1)
    acc, ref = torch.zeros(m), torch.zeros(m, k)
    for s in reversed(range(k)):  # brax's recursion, written out
        acc = (rew[:, s] + disc[:, s] * nxt[:, s] - values[:, s]) * mask[:, s] + disc[:, s] * lam * mask[:, s] * acc
        ref[:, s] = acc + values[:, s]
    torch.testing.assert_close(vs, ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(
        adv, (rew + disc * torch.cat([ref[:, 1:], boot[:, None]], 1) - values) * mask, rtol=1e-5, atol=1e-5
    )


def test_sampler_is_euler_over_the_forward_pass():
    torch.manual_seed(0)
    actor = R.FlowActor(5, 2, 16, 3, 8, 0.25)
    obs, x0, steps = torch.randn(7, 5), torch.randn(7, 2), 6
    x = x0
    with torch.no_grad():
        for k in range(steps):
            x = x + actor(obs, x, torch.full((7,), k / steps)) / steps
    torch.testing.assert_close(actor.sample(obs, x0, steps), x, rtol=1e-5, atol=1e-6)


def test_gae_unroll_end_to_end_and_resume(tmp_path):
    args = tiny_args(tmp_path, gae_unroll=8, num_updates=4)  # 4 envs x 32 steps = 16 unrolls of 8, 2 minibatches
    summary = R.main(args)
    assert summary["status"] == "finished"
    rows = read_rows(tmp_path / "run" / "metrics.jsonl")
    assert all(np.isfinite(r[k]) for r in rows[1:] for k in ("pg_loss", "v_loss", "ratio_mean"))
    with pytest.raises(RunError, match="gae_unroll"):
        R.validate_args(replace(args, gae_unroll=5))


@pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU (compares the captured sampler with the eager one)"
)
def test_graphed_sampler_matches_eager_sampler_on_gpu():
    torch.manual_seed(0)
    actor = R.FlowActor(5, 2, 16, 2, 8, 0.25).cuda()
    sampler = GraphedSampler(actor)
    for k in range(3):
        obs, x0 = torch.randn(7, 5, device="cuda"), torch.randn(7, 2, device="cuda")
        torch.testing.assert_close(sampler(obs, x0, 4), actor.sample(obs, x0, 4), rtol=0, atol=0)
        with torch.no_grad():  # parameters change in place (as an optimiser step does): no recapture needed
            for p in actor.parameters():
                p.add_(0.01 * torch.randn_like(p))
    assert sampler.key == ((7, 5), (7, 2), 4, obs.device)


@pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU (compares the captured rollout steps with eager ones)"
)
@pytest.mark.parametrize("objective,gae_unroll", [("fpo", 0), ("fpopp", 0), ("fpo", 8)])
def test_graphed_rollout_matches_eager_rollout_on_gpu(tmp_path, objective, gae_unroll):
    # The eager sampler in both (the fused one is compared with it in test_flow_triton.py).
    args = tiny_args(tmp_path, objective=objective, cuda=True, gae_unroll=gae_unroll, action_bound=1.5, fused=False)
    out = []
    for graph in (False, True):
        a = replace(args, cuda_graph=graph)
        torch.manual_seed(0)
        state = R.build_state(a, torch.device("cuda"))
        R.reset_envs(state, a.seed)
        assert isinstance(state.act, R.GraphedCall) == graph
        torch.manual_seed(1)
        batches = []
        for _ in range(2):  # the second rollout replays the captured graphs and continues the episodes
            batch = R.collect_rollout(state, a)
            batches.append({k: v.clone() if torch.is_tensor(v) else v for k, v in batch.items()})
        out.append((batches, state.obs_rms.state_dict(), state.ret_rms.state_dict(), state.global_step))
        state.envs.close()
    (eager, rms_e, ret_e, gs_e), (graphed, rms_g, ret_g, gs_g) = out
    assert gs_e == gs_g == 2 * args.num_envs * args.num_steps
    for be, bg in zip(eager, graphed):
        assert be.keys() == bg.keys()
        for key in be:
            if torch.is_tensor(be[key]):
                torch.testing.assert_close(bg[key], be[key], rtol=1e-6, atol=1e-6, msg=key)
            else:
                assert bg[key] == pytest.approx(be[key], rel=1e-6), key
    for e, g in ((rms_e, rms_g), (ret_e, ret_g)):
        for key in e:
            torch.testing.assert_close(g[key], e[key], rtol=1e-9, atol=1e-9)


def test_batch_var_statistics_follow_the_official_running_stats():
    # The official FPO RunningStats: running mean, variance = this batch's sum of
    # (x - old mean)(x - new mean) over the total count, clipped; normalise without a clip.
    from fpo_utils.envs import RunningMeanStd

    rng = np.random.default_rng(0)
    a, b = rng.normal(2.0, 3.0, (50, 3)), rng.normal(-1.0, 0.5, (30, 3))
    rms = RunningMeanStd((3,), "cpu", batch_var=True)
    count, mean = 1e-4, np.zeros(3)
    for x in (a, b):
        rms.update(torch.as_tensor(x))
        new_count = count + len(x)
        new_mean = mean + (x - mean).sum(0) / new_count
        var = np.clip(((x - mean) * (x - new_mean)).sum(0) / new_count, 1e-12, 1e12)
        count, mean = new_count, new_mean
    np.testing.assert_allclose(rms.mean.numpy(), mean, rtol=1e-12)
    np.testing.assert_allclose(rms.var.numpy(), var, rtol=1e-12)
    twice = RunningMeanStd((3,), "cpu", batch_var=True)
    twice.update(torch.as_tensor(a))
    first = twice.var.clone()
    twice.update(torch.as_tensor(a))  # the same batch again: same mean, half the variance (count 2n)
    torch.testing.assert_close(twice.var, first / 2, rtol=1e-5, atol=0)
    big = torch.full((1, 3), 1e6, dtype=torch.float64)
    np.testing.assert_allclose(
        rms.normalize(big).numpy(), ((1e6 - mean) / np.sqrt(var))[None].astype(np.float32), rtol=1e-6
    )


def test_obs_stats_per_update_renormalises_the_batch(tmp_path):
    args = tiny_args(tmp_path, obs_stats="update", gae_unroll=8)
    torch.manual_seed(0)
    state = R.build_state(args, torch.device("cpu"))
    R.reset_envs(state, args.seed)
    assert state.obs_rms.batch_var
    batch = R.collect_rollout(state, args)
    n_rows = args.num_envs * args.num_steps
    assert float(state.obs_rms.count) == pytest.approx(n_rows + 1e-4)  # one update, from this rollout
    obs = batch["obs"].reshape(n_rows, -1)  # unrolls of 8 steps: the rows in another order
    torch.testing.assert_close(obs.mean(0), torch.zeros(obs.shape[1]), atol=1e-4, rtol=0)  # first rollout: its own mean
    # the first rollout sampled with mean 0, std 1 (raw observations); l_old belongs to those
    again = R.draw_losses(
        state.actor, batch["obs"][:2, 0], batch["x"][:2, 0], batch["t"][:2, 0], batch["eps"][:2, 0], "fpo"
    )
    assert not torch.allclose(again, batch["l_old"][:2, 0])
    summary = R.main(replace(args, num_updates=2, run_name="e2e"))
    assert summary["status"] == "finished"


def test_lecun_init_and_time_embedding_base(tmp_path):
    args = tiny_args(tmp_path, init="lecun", time_embed_base=1.0)
    state = R.build_state(args, torch.device("cpu"))
    for net in (state.actor, state.critic):
        for m in net.modules():
            if isinstance(m, torch.nn.Linear):
                bound = math.sqrt(3.0 / m.in_features)
                top = float(m.weight.detach().abs().max())
                assert 0.8 * bound < top <= bound
                assert float(m.bias.detach().abs().max()) == 0.0
    torch.testing.assert_close(state.actor.freqs, 2.0 ** torch.arange(4, dtype=torch.float32))
    default = R.build_state(tiny_args(tmp_path), torch.device("cpu"))
    torch.testing.assert_close(default.actor.freqs, math.pi * 2.0 ** torch.arange(4, dtype=torch.float32))
