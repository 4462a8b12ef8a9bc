"""Tests for robot_fpo.py (the plain reference): objectives against hand computations, tiny end-to-end runs, resume.
The fast variant (robot_fpo_fast.py) against it: tests/test_robot_fpo_fast.py."""

from __future__ import annotations

import importlib.util
import inspect
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
from fpo_utils import robot_bookkeeping as book  # noqa: E402
from fpo_utils.envs import make_envs  # noqa: E402
from fpo_utils.runfolder import NonFiniteLoss, RunError, read_jsonl  # noqa: E402
from weighting import fpo_weight_at, fpopp_weight  # noqa: E402

GRID = np.arange(1, 11) / 10.0
TIME_KEYS = {"sps", "rollout_s", "update_s", "eval_s"}


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
    w_t = fpo_weight_at(1.0 - torch.tensor(t), alpha_eps)
    np.testing.assert_allclose(w_t.numpy(), w, rtol=1e-12)
    torch.testing.assert_close(R.draw_weights(torch.tensor(t), R.Args(objective="fpo"), alpha_eps), w_t)
    d = (w * (l_old - l_new)).mean(1)
    expected = -ppo_np(np.exp(d), adv, rho).mean()
    loss, ratio, d_i = R.fpo_loss(*(torch.tensor(a) for a in (l_old, l_new)), w_t, torch.tensor(adv), rho)
    np.testing.assert_allclose(d_i.numpy(), d, rtol=1e-6)
    np.testing.assert_allclose(ratio.numpy(), np.exp(d), rtol=1e-6)
    assert loss.item() == pytest.approx(expected, rel=1e-6)
    # The same weights placed outside the exponent give a different objective (tab:placement).
    outside = -np.mean([np.mean(w[i] * ppo_np(np.exp(l_old[i] - l_new[i]), adv[i], rho)) for i in range(2)])
    assert abs(outside - expected) > 1e-3


def test_fpo_native_weight_is_plain_mean_and_weights_change_the_ratio():
    t = torch.tensor([[0.1, 0.8]])
    l_old, l_new, adv = torch.tensor([[0.5, 0.1]]), torch.tensor([[0.3, 0.2]]), torch.tensor([1.0])
    w1 = fpo_weight_at(1.0 - t, 1.0)
    torch.testing.assert_close(w1, torch.ones_like(t))  # alpha_eps = 1: every draw weighs one
    _, _, d1 = R.fpo_loss(l_old, l_new, w1, adv, 0.05)
    assert d1.item() == pytest.approx(((0.5 - 0.3) + (0.1 - 0.2)) / 2, rel=1e-6)
    _, _, d0 = R.fpo_loss(l_old, l_new, fpo_weight_at(1.0 - t, 0.0), adv, 0.05)
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
    w_t = fpopp_weight(torch.tensor(t), alpha, 0.005, 0.995)
    np.testing.assert_allclose(w_t.numpy(), fpopp_weight_np(t, alpha), rtol=1e-12)
    torch.testing.assert_close(R.draw_weights(torch.tensor(t), R.Args(objective="fpopp"), alpha), w_t)
    loss, ratio = R.fpopp_loss(*(torch.tensor(x) for x in (l_old, l_new)), w_t, torch.tensor(adv), rho, mode)
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
    with pytest.raises((KeyError, ValueError), match="trpo"):  # an unknown proxy is refused
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
    w = fpopp_weight(t, 1.0)
    assert w.item() == pytest.approx(1.0)  # alpha = 1: native weight
    loss, ratio = R.fpopp_loss(l_old, l_new, w, adv, rho, "spo")
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
    _, ratio = R.fpopp_loss(l_old, l_new, fpopp_weight(t, 1.0), adv, 0.05, "spo")
    np.testing.assert_allclose(ratio.detach().numpy()[:, 0], [math.exp(-19.0), math.exp(-19.0)])


def test_fpopp_clamp_official_example_positive_advantage():
    # l_old = 15, l_new = 25, A = +1, t = .5: ratio exp(15 - 20) = exp(-5) = 6.74e-3 and no gradient
    # reaches l_new through the clamp (the unclamped value would give exp(-10)).
    l_old = torch.tensor([[15.0]], dtype=torch.float64)
    l_new = torch.tensor([[25.0]], dtype=torch.float64, requires_grad=True)
    t, adv = torch.tensor([[0.5]], dtype=torch.float64), torch.tensor([1.0], dtype=torch.float64)
    loss, ratio = R.fpopp_loss(l_old, l_new, fpopp_weight(t, 1.0), adv, 0.05, "aspo")
    assert ratio.item() == pytest.approx(math.exp(-5.0), rel=1e-12)
    assert ratio.item() == pytest.approx(6.74e-3, rel=1e-3)
    loss.backward()
    assert l_new.grad.item() == 0.0


def test_the_update_runs_the_weighting_a_reader_edits(tmp_path, monkeypatch):
    # Both losses take the per-draw weights as an input (no exponent of their own), and the update gets them from
    # R.draw_weights: an edit there is what one update trains with.
    for loss in (R.fpo_loss, R.fpopp_loss):
        params = inspect.signature(loss).parameters
        assert list(params)[:3] == ["l_old", "l_new", "w"] and not [p for p in params if "alpha" in p], loss
    args = tiny_args(tmp_path, alpha_eps=0.5)
    torch.manual_seed(0)
    state = R.build_state(args, torch.device("cpu"))
    R.reset_envs(state, args.seed)
    batch = R.collect_rollout(state, args)
    state.envs.close()
    actor_before = [p.detach().clone() for p in state.actor.parameters()]
    seen = []

    def zero_weights(t, a, alpha):  # D_i = 0 for every action: ratio exactly one, no policy gradient
        seen.append((tuple(t.shape), a.objective, alpha))
        return torch.zeros_like(t)

    monkeypatch.setattr(R, "draw_weights", zero_weights)
    stats = R.update(state, batch, args, 0.5)
    assert seen == [((args.num_envs * args.num_steps, args.num_draws), "fpo", 0.5)]
    for key in ("ratio_mean", "ratio_min", "ratio_max"):
        assert stats[key] == pytest.approx(1.0, abs=1e-6), key
    assert stats["clipfrac"] == 0.0 and stats["pg_loss"] != 0.0  # -mean(A) per minibatch, A not all zero
    for p, q in zip(state.actor.parameters(), actor_before):
        torch.testing.assert_close(p, q, rtol=0, atol=0)  # zero weights: the actor does not move
    monkeypatch.undo()  # the shipped weighting: the actor moves and later minibatches see ratios away from one
    stats = R.update(state, batch, args, 0.5)
    assert max(abs(stats["ratio_min"] - 1.0), abs(stats["ratio_max"] - 1.0)) > 1e-4
    assert any(not torch.equal(p, q) for p, q in zip(state.actor.parameters(), actor_before))


def tensors_of(opt) -> list[torch.Tensor]:
    return [t.detach().clone() for t in book.optimiser_tensors(opt)]


def test_a_step_with_an_overflowing_ratio_changes_nothing(tmp_path):
    # exp(D) overflows float32 past D = 88.7: the loss or gradient is not finite. The step leaves parameters and
    # optimiser state (moments, step count) exactly as they were and says so; a finite step moves them.
    args = tiny_args(tmp_path)
    torch.manual_seed(0)
    state = R.build_state(args, torch.device("cpu"))
    state.envs.close()
    obs, x = torch.randn(16, 4), torch.randn(16, 1)
    t, eps = R.sample_draws(16, 4, 1, "fpo", 0.0, 1.0, "cpu")
    adv = torch.randn(16)

    def step(shift: float):  # shift: added to D through the old losses
        l_new = R.draw_losses(state.actor, obs[:, state.obs_actor], x, t, eps, "fpo")
        loss, ratio, _ = R.fpo_loss(l_new.detach() + shift, l_new, torch.ones_like(t), adv, args.clip_coef)
        v_loss = (state.critic(obs) ** 2).mean()
        return R.gradient_step(state, loss, v_loss, ratio, args)

    fresh = tensors_of(state.optimizer)
    row = step(100.0)  # the very first step overflows: the optimiser state it creates restarts from zero
    assert row[-1] == 1.0 and not math.isfinite(float(row[0]) + float(row[6]))
    for a, b in zip(book.optimiser_tensors(state.optimizer), fresh):
        assert torch.equal(a, b)
    assert all(not v.any() for p in state.actor.parameters() for v in state.optimizer.state[p].values())
    assert step(0.0)[-1] == 0.0 and any(not torch.equal(a, b) for a, b in zip(state.actor.parameters(), fresh))
    before = tensors_of(state.optimizer)
    for shift in (100.0, float("nan")):
        assert step(shift)[-1] == 1.0
        for a, b in zip(book.optimiser_tensors(state.optimizer), before):
            assert torch.equal(a, b)
    assert step(80.0)[-1] == 0.0  # exp(80) is finite: taken, as official FPO takes it


def test_update_statistics_leave_out_skipped_steps_and_end_when_all_are():
    row = [0.5, 2.0, 1.0, 0.9, 1.1, 0.1, 3.0, 0.0]
    bad = [math.inf, 2.0, math.inf, 0.0, math.inf, 0.5, math.nan, 1.0]
    stats = book.update_stats(torch.tensor([row, bad, row]), 4)
    assert stats["skipped_steps"] == 1 and stats["minibatch_steps"] == 3
    assert stats["pg_loss"] == 0.5 and stats["ratio_max"] == pytest.approx(1.1) and stats["grad_norm"] == 3.0
    with pytest.raises(NonFiniteLoss, match="non-finite loss at update 5"):
        book.update_stats(torch.tensor([bad, bad]), 4)
    huge = row[:6] + [math.inf, 0.0]  # finite gradients whose norm overflows: taken, as official FPO takes them
    assert book.update_stats(torch.tensor([row, huge]), 4)["grad_norm"] == math.inf


def test_an_update_with_one_overflowing_action_skips_its_minibatches_and_trains_on(tmp_path):
    args = tiny_args(tmp_path)
    torch.manual_seed(0)
    state = R.build_state(args, torch.device("cpu"))
    R.reset_envs(state, args.seed)
    batch = R.collect_rollout(state, args)
    state.envs.close()
    batch["l_old"][5] += 200.0  # one stored action's D_i overflows whatever the actor does
    stats = R.update(state, batch, args, 1.0)
    assert stats["skipped_steps"] == args.update_epochs  # its minibatch, once per epoch
    assert stats["minibatch_steps"] == args.update_epochs * args.num_minibatches
    assert all(math.isfinite(v) for k, v in stats.items())
    assert all(torch.isfinite(t).all() for t in book.optimiser_tensors(state.optimizer))


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


def test_draw_times():
    torch.manual_seed(0)
    t, eps = R.sample_draws(500, 4, 3, "fpo", 0.005, 0.995, "cpu")
    k = t.double().numpy().ravel() * 10
    np.testing.assert_allclose(k, np.round(k), atol=1e-5)  # t on {0, .1, ..., .9}: s = 1 - t on {.1, ..., 1}
    assert sorted(set(np.round(k).astype(int))) == list(range(10)) and eps.shape == (500, 4, 3)
    t, _ = R.sample_draws(500, 4, 3, "fpopp", 0.005, 0.995, "cpu")
    assert t.min() >= 0.005 and t.max() <= 0.995


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
            book.validate_args(tiny_args(tmp_path, **bad))
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


@pytest.mark.slow
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


def strip_time(rows):
    return [{k: v for k, v in r.items() if k not in TIME_KEYS} for r in rows]


def read_rows(path):
    return read_jsonl(path)


@pytest.mark.slow
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


@pytest.mark.slow
def test_resume_may_change_the_evaluation_cadence_and_training_is_unchanged(tmp_path):
    # Evaluations draw no training randomness: a run continued with evaluations every update trains exactly as
    # one evaluated every second update (restarts at update 2, where the first part checkpoints, as envpool needs).
    full = tiny_args(tmp_path / "a", num_updates=4, restart_every=2)
    R.main(full)
    part = tiny_args(tmp_path / "b", num_updates=2, restart_every=2)
    R.main(part)
    R.main(replace(part, num_updates=4, resume=True, eval_every=1, checkpoint_every=1))
    ref, got = (read_rows(tmp_path / f / "run" / "metrics.jsonl") for f in "ab")

    def train(rows):  # each row without its evaluation and timing
        return [{k: v for k, v in r.items() if not k.startswith("eval")} for r in strip_time(rows)]

    assert train(got) == train(ref) and [r["update"] for r in got] == [0, 1, 2, 3, 4]
    assert ["eval_return" in r for r in got] == [True, False, True, True, True]
    assert ["eval_return" in r for r in ref] == [True, False, True, False, True]
    assert all(r["eval_s"] > 0 for r in got if "eval_return" in r)


@pytest.mark.slow
def test_resume_may_drop_the_second_evaluation_and_the_rest_is_unchanged(tmp_path):
    # FPO++ evaluates from x0 = 0 and from random x0; a run continued with --no-eval-other evaluates from x0 = 0
    # alone, with the same eval_return, and trains exactly as before (evaluations draw no training randomness).
    full = tiny_args(tmp_path / "a", objective="fpopp", num_updates=4, restart_every=2)
    R.main(full)
    part = tiny_args(tmp_path / "b", objective="fpopp", num_updates=2, restart_every=2)
    R.main(part)
    R.main(replace(part, num_updates=4, resume=True, eval_other=False))
    ref, got = (strip_time(read_rows(tmp_path / f / "run" / "metrics.jsonl")) for f in "ab")
    assert [r["update"] for r in got] == [0, 1, 2, 3, 4]
    assert [sorted(r) for r in got[:3]] == [sorted(r) for r in ref[:3]] and got[:3] == ref[:3]
    assert [("eval_return" in r, "eval_return_random" in r) for r in ref[3:]] == [(False, False), (True, True)]
    assert [("eval_return" in r, "eval_return_random" in r) for r in got[3:]] == [(False, False), (True, False)]
    assert got[3:] == [{k: v for k, v in r.items() if k != "eval_return_random"} for r in ref[3:]]
    assert json.loads((tmp_path / "b" / "run" / "args.json").read_text())["eval_other"] is False


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
        book.validate_args(replace(args, action_bound=float("nan")))


def test_anneal_steps_sets_the_lr_horizon(tmp_path):
    batch = 4 * 32
    args = tiny_args(
        tmp_path, num_updates=4, eval_every=4, total_timesteps=100 * batch, anneal_steps=2 * batch, learning_rate=1e-3
    )
    R.main(args)
    lrs = [r["lr"] for r in read_rows(tmp_path / "run" / "metrics.jsonl")[1:]]
    # lr = lr0 * max(1 - k / (anneal_steps / batch), 0.05) before update k = 0, 1, 2, 3.
    np.testing.assert_allclose(lrs, [1e-3, 0.5e-3, 0.05e-3, 0.05e-3])


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
    fast_flags = {"cuda_graph", "compile", "fused", "scan_rollout"}  # robot_fpo_fast.Args only
    assert not fast_flags & set(R.Args.__dataclass_fields__)
    assert all(not fast_flags & set(vars(p)) for p in R.PRESETS.values())
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
    out = run_cli(tmp_path, "--env-id", "InvertedPendulum-v5", "--backend", "envpol")
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "envpool" in out.stderr, out.stderr
    # the same checks in process (the command line turns each RunError into its one line, as above)
    for kw, says in [({"num_envs": 0}, "num_envs"), ({"random_start": True}, "--random-start needs the playground")]:
        with pytest.raises(RunError) as err:
            R.main(tiny_args(tmp_path / "runs", env_id="InvertedPendulum-v5", **kw))
        assert says in str(err.value) and "\n" not in str(err.value) and err.value.code == 2
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
    for env_id in ("CartpoleSwingup-v1", "MuJoCoPlayground/Go1JoystickFlatTerrain-v1"):  # the README's examples
        with pytest.raises(RunError) as err:
            E.resolve_backend(env_id, "auto")
        want = f"env id {env_id!r} runs on envpool, which is not installed: pip install -e '.[envpool]'"
        assert str(err.value) == want
    with pytest.raises(RunError, match="unknown env id 'CartpoleSwingup-v9'"):  # not an envpool id: the usual hint
        E.resolve_backend("CartpoleSwingup-v9", "auto")


@pytest.mark.skipif(importlib.util.find_spec("envpool") is None, reason="needs envpool to read its registry")
def test_envpool_only_ids_are_what_envpool_has_and_gymnasium_lacks():
    import gymnasium as gym

    import fpo_utils.envs as E

    only = {i for i in E.envpool_ids() if i not in gym.registry}
    assert only <= E.ENVPOOL_ONLY_IDS and not E.ENVPOOL_ONLY_IDS & set(gym.registry)
    if "G1JoystickFlatTerrain-v1" in only:  # with the Playground ports' asset wheels: every id, none more
        assert only == E.ENVPOOL_ONLY_IDS


@pytest.mark.slow
def test_sigint_stops_at_a_checkpoint_and_resume_reproduces_the_run(tmp_path):
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

    part = tiny_args(tmp_path / "b", num_updates=4, restart_every=2)
    summary = R.main(part, rollout=interrupted)  # main's phases are its arguments
    assert calls["n"] >= 1
    assert summary["status"] == "interrupted" and summary["updates_done"] == 2  # the next checkpoint boundary
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


@pytest.mark.slow
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
        book.validate_args(replace(args, gae_unroll=5))


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
