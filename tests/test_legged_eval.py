"""Command tracking of the legged joystick tasks (fpo_utils/legged.py): the columns against envpool's step info and
the task's own tracking rewards, closed forms on synthetic arrays, the evaluation of a task without a command left as
it was, and a tiny Spot run that logs the tracking errors beside eval_return."""

from __future__ import annotations

import json
import os
import sys
from dataclasses import asdict, replace
from types import SimpleNamespace

import numpy as np
import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_robot_fpo import strip_time, tiny_args  # noqa: E402

import robot_fpo as R  # noqa: E402
from fpo_utils import legged  # noqa: E402
from fpo_utils import robot_bookkeeping as book  # noqa: E402
from fpo_utils.env_layout import ObsRoute, route_obs  # noqa: E402
from fpo_utils.envs import envpool_ids, make_envs, normalize_obs  # noqa: E402
from fpo_utils.runfolder import RunError, read_jsonl  # noqa: E402

SPOT = "SpotFlatTerrainJoystick-v1"
# Playground's reward scales of the two tracking terms (info holds scale * exp(-error^2 / sigma)), sigma = 0.25.
SCALES = {SPOT: (1.5, 0.8), "Go1JoystickFlatTerrain-v1": (1.0, 0.5), "G1JoystickFlatTerrain-v1": (1.0, 0.75)}
CPU = torch.device("cpu")


def needs_task(env_id: str) -> None:
    if env_id not in envpool_ids():
        pytest.skip(f"envpool (with its Playground ports) is not installed here, so {env_id} cannot be made")


def spot_route(actor: str = "", critic: str = "") -> ObsRoute:
    import envpool

    return route_obs(envpool.make_spec(SPOT).observation_space, SPOT, actor, critic)


# ---------------------------------------------------------------------------- closed forms
def test_errors_are_zero_when_the_velocity_is_the_command_and_follow_the_closed_form():
    cmd = torch.tensor([[0.5, -0.3, 0.7], [3.0, 4.0, -1.0], [0.0, 0.0, 0.0]], dtype=torch.float64)
    lin, yaw = legged.tracking_errors(cmd, cmd.clone())
    assert lin.tolist() == [0.0, 0.0, 0.0] and yaw.tolist() == [0.0, 0.0, 0.0]
    lin, yaw = legged.tracking_errors(cmd, torch.zeros_like(cmd))
    torch.testing.assert_close(lin, torch.tensor([np.hypot(0.5, 0.3), 5.0, 0.0], dtype=torch.float64))
    torch.testing.assert_close(yaw, torch.tensor([0.7, 1.0, 0.0], dtype=torch.float64))


def test_tracker_averages_over_alive_steps_only():
    # A fake task laid out as Go1, privileged_state after state (48): the command at 48 + 45 (privileged_state
    # starts with a copy of state), the gyro at 48 + 48, the linear velocity at 48 + 57.
    route = ObsRoute({"privileged_state": 123, "state": 48}, ("state",), ("privileged_state",))
    envs = SimpleNamespace(env_id="Go1JoystickFlatTerrain-v1", route=route, num_envs=2)
    cols = legged.tracking_columns(envs)
    assert cols == [93, 94, 95, 105, 106, 98]
    tracker = legged.Tracker.of(envs)
    obs = torch.zeros(2, route.obs_dim)
    obs[:, 93:96] = torch.tensor([[3.0, 4.0, 2.0], [1.0, 0.0, 0.0]])  # errors (5, 2) and (1, 0) against v = 0
    tracker.add(obs, torch.tensor([True, True]))
    obs[0, 93:96] = 100.0  # environment 0 has finished: this step is not counted
    tracker.add(obs, torch.tensor([False, True]))
    m = tracker.metrics()
    assert m == {"eval_track_lin": (5 + 1 + 1) / 3, "eval_track_yaw": 2 / 3, "eval_track_len": 1.5}
    assert legged.eval_row(legged.eval_result(7.0, tracker), "_random") == {
        "eval_return_random": 7.0,
        **{f"{k}_random": v for k, v in m.items()},
    }


def test_columns_follow_the_routing_and_none_without_a_command_or_privileged_state():
    pytest.importorskip("envpool")
    needs_task(SPOT)
    default = spot_route()  # state (81) then privileged_state (167)
    assert legged.tracking_columns(SimpleNamespace(env_id=SPOT, route=default)) == [159, 160, 161, 171, 172, 164]
    swapped = spot_route("privileged_state", "state")
    assert legged.tracking_columns(SimpleNamespace(env_id=SPOT, route=swapped)) == [78, 79, 80, 90, 91, 83]
    alias = SimpleNamespace(env_name="MuJoCoPlayground/" + SPOT, route=default)  # Playground's attribute name
    assert legged.tracking_columns(alias) == [159, 160, 161, 171, 172, 164]
    assert legged.tracking_columns(SimpleNamespace(env_id=SPOT, route=spot_route("state", "state"))) is None
    assert legged.tracking_columns(SimpleNamespace(env_id="CartpoleSwingup-v1", route=ObsRoute(flat_dim=5))) is None
    assert legged.command_velocity(SimpleNamespace(env_id="Walker2d-v5", route=default), torch.zeros(1, 9)) is None


# ---------------------------------------------------------------------------- against envpool's step info
@pytest.mark.parametrize("env_id", list(SCALES))
def test_extraction_matches_envpool_info_and_the_tasks_tracking_rewards(env_id):
    pytest.importorskip("envpool")
    needs_task(env_id)
    import envpool

    pool = envpool.make_gymnasium(env_id, num_envs=3, seed=5, num_threads=1)
    envs = SimpleNamespace(env_id=env_id, route=route_obs(pool.observation_space, env_id))
    rng = np.random.default_rng(0)
    pool.reset()
    checked = 0
    for _ in range(12):  # small actions: no robot falls this soon, so every step is a live one
        obs, _, term, trunc, info = pool.step(0.2 * rng.uniform(-1, 1, (3, *pool.action_space.shape)))
        assert not (term | trunc).any()
        cmd, vel = legged.command_velocity(envs, torch.as_tensor(envs.route.flatten(obs)))
        np.testing.assert_array_equal(cmd.numpy(), info["command"].astype(np.float32))
        lin, yaw = legged.tracking_errors(cmd, vel)
        # By hand from the raw privileged_state: Playground's layout (velocity after the state copy's 81 + 9 columns
        # for Spot).
        if env_id == SPOT:
            p = obs["privileged_state"].astype(np.float32).astype(np.float64)
            c = info["command"].astype(np.float32).astype(np.float64)
            np.testing.assert_allclose(lin.numpy(), np.hypot(*(c[:, :2] - p[:, 90:92]).T), rtol=0, atol=1e-12)
            np.testing.assert_allclose(yaw.numpy(), np.abs(c[:, 2] - p[:, 83]), rtol=0, atol=1e-12)
        w_lin, w_yaw = SCALES[env_id]  # the task's rewards from the same errors (float32 observations: ~1e-6)
        rewards = w_lin * np.exp(-(lin.numpy() ** 2) / 0.25), w_yaw * np.exp(-(yaw.numpy() ** 2) / 0.25)
        np.testing.assert_allclose(rewards[0], info["reward_tracking_lin_vel"], rtol=0, atol=1e-5)
        np.testing.assert_allclose(rewards[1], info["reward_tracking_ang_vel"], rtol=0, atol=1e-5)
        checked += 1
    pool.close()
    assert checked == 12


# ---------------------------------------------------------------------------- tasks without a command
def evaluate_before(state, envs, args, init: str) -> float:
    """robot_fpo.evaluate as it was before the tracking errors (the reference for the unchanged behaviour)."""
    gen = torch.Generator(device="cpu").manual_seed(args.eval_seed)
    sample = (state.ema if state.ema is not None else state.actor).sample
    obs, n, d = envs.reset(args.eval_seed), envs.num_envs, envs.act_dim
    total, finished = torch.zeros(n, dtype=torch.float64), torch.zeros(n, dtype=torch.bool)
    while not bool(finished.all()):
        o = normalize_obs(obs.to(state.device), state.obs_rms)
        x0 = (torch.zeros(n, d) if init == "zero" else torch.randn(n, d, generator=gen)).to(state.device)
        x = sample(o[:, state.obs_actor], x0, args.flow_steps).to(state.device)
        obs, reward, term, trunc, _ = envs.step(R.squash(x, args.action_squash))
        total += torch.where(finished, 0.0, reward.cpu().double())
        finished |= (term | trunc).cpu()
    return float(total.mean())


def test_evaluate_without_a_command_returns_the_same_plain_float(tmp_path):
    args = tiny_args(tmp_path, objective="fpopp")
    torch.manual_seed(args.seed)
    state = R.build_state(args, CPU)
    envs = book.task_envs(args, args.eval_episodes, args.eval_seed, CPU)
    for init in ("zero", "random"):
        got, want = R.evaluate(state, envs, args, init), evaluate_before(state, envs, args, init)
        assert type(got) is float and got == want
        assert legged.eval_row(got) == {"eval_return": want}
    envs.close()
    state.envs.close()


@pytest.mark.slow
def test_a_run_without_a_command_logs_what_it_did_before(tmp_path):
    args = tiny_args(tmp_path, objective="fpopp", num_updates=2, eval_every=1)
    R.main(replace(args, run_name="now"))
    R.main(replace(args, run_name="before"), evaluator=evaluate_before)
    now, before = (read_jsonl(tmp_path / name / "metrics.jsonl") for name in ("now", "before"))
    assert strip_time(now) == strip_time(before)
    assert [list(r) for r in now] == [list(r) for r in before]  # the same keys in the same order
    assert list(now[0]) == ["update", "global_step", "alpha", "eval_return", "eval_return_random", "eval_s"]
    assert not any(k.startswith("eval_track") for r in now for k in r)


@pytest.mark.parametrize(
    "objective, eval_init, other, want",
    [
        ("fpo", "native", True, ("random",)),
        ("fpo", "zero", True, ("zero",)),
        ("fpopp", "native", True, ("zero", "random")),
        ("fpopp", "random", True, ("random", "zero")),
        ("fpopp", "native", False, ("zero",)),
        ("fpopp", "random", False, ("random",)),
        ("fpo", "native", False, ("random",)),
    ],
)
def test_eval_inits_puts_eval_returns_noise_first(objective, eval_init, other, want):
    args = SimpleNamespace(objective=objective, eval_init=eval_init, eval_other=other)
    assert book.eval_inits(args) == want


def test_an_fpopp_run_from_random_noise_logs_the_zero_noise_return_beside_it(tmp_path):
    args = tiny_args(tmp_path, objective="fpopp", num_updates=1, eval_every=1, eval_init="random")
    R.main(args)
    rows = read_jsonl(tmp_path / args.run_name / "metrics.jsonl")
    assert [k for k in rows[0] if k.startswith("eval_return")] == ["eval_return", "eval_return_zero"]
    assert rows[0]["eval_return"] != rows[0]["eval_return_zero"]


# ---------------------------------------------------------------------------- a tiny Spot run
def test_tiny_spot_run_logs_tracking_errors_beside_eval_return(tmp_path):
    pytest.importorskip("envpool")
    needs_task(SPOT)  # one evaluation episode is 1,000 steps: ~3 s on one CPU core with these networks
    tiny = dict(num_envs=2, num_steps=4, num_minibatches=1, update_epochs=1, num_draws=2, flow_steps=2)
    nets = dict(actor_hidden=16, critic_hidden=16, critic_layers=1)
    where = dict(cuda=False, torch_threads=1, env_threads=1, runs_dir=str(tmp_path), run_name="spot")
    args = replace(R.PRESETS["fpopp-locomotion"], **tiny, **nets, **where, num_updates=1, eval_episodes=1)
    R.main(args)
    rows = read_jsonl(tmp_path / "spot" / "metrics.jsonl")
    evals = [r for r in rows if "eval_return" in r]
    assert [r["update"] for r in evals] == [0, 1]
    for r in evals:
        for suffix in ("", "_random"):
            lin, yaw, length = (r[f"{k}{suffix}"] for k in legged.TRACK_KEYS)
            assert 0.0 <= lin < 5.0 and 0.0 <= yaw < 5.0 and 1.0 <= length <= 1000.0
    keys = list(evals[0])
    assert keys[keys.index("eval_return") :] == ["eval_return", *legged.TRACK_KEYS, "eval_return_random"] + [
        f"{k}_random" for k in legged.TRACK_KEYS
    ] + ["eval_s"]
    assert json.loads((tmp_path / "spot" / "summary.json").read_text())["status"] == "finished"
    event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    acc = event_accumulator.EventAccumulator(str(tmp_path / "spot")).Reload()
    assert {"charts/eval_return", "charts/eval_track_lin", "charts/eval_track_yaw"} <= set(acc.Tags()["scalars"])


@pytest.mark.slow
def test_reward_scales_weigh_a_term_on_envpool_and_a_run_keeps_them(tmp_path):
    """--reward-scales on envpool's G1: action_rate weighted -0.01 (Go1's weight; G1's own is 0) lowers the first
    step's reward by 0.01 x 0.02 s x sum_j a_j^2 (the last actions start at 0: 29 joints at 0.5, 1.45e-3) and the
    next steps' by nothing (the same action again). A tiny run records the weights in args.json and resumes with
    them; a resume with other weights is refused, and a bad item is one line before any run folder exists."""
    g1 = "G1JoystickFlatTerrain-v1"
    needs_task(g1)
    rewards = []
    for scales in ((), ("action_rate=-0.01",)):
        envs = make_envs(g1, 2, 3, "envpool", threads=1, reward_scales=scales)
        envs.reset(3)
        rewards.append(torch.stack([envs.step(torch.full((2, 29), 0.5))[1] for _ in range(3)]))
        envs.close()
    want = torch.tensor([[-0.01 * 0.02 * 29 * 0.25] * 2, [0.0] * 2, [0.0] * 2])
    torch.testing.assert_close(rewards[1] - rewards[0], want, rtol=0, atol=1e-6)
    tiny = dict(num_envs=2, num_steps=4, num_minibatches=1, update_epochs=1, num_draws=2, flow_steps=2)
    nets = dict(actor_hidden=16, critic_hidden=16, critic_layers=1)
    where = dict(cuda=False, torch_threads=1, env_threads=1, runs_dir=str(tmp_path), run_name="g1")
    costs = ("action_rate=-0.01", "torques=-0.0002")
    args = replace(R.PRESETS["fpopp-locomotion"], env_id=g1, **tiny, **nets, **where, num_updates=1, eval_episodes=1)
    R.main(replace(args, reward_scales=costs))
    assert json.loads((tmp_path / "g1" / "args.json").read_text())["reward_scales"] == list(costs)
    with pytest.raises(RunError, match=r"reward_scales: \['action_rate=-0.01', 'torques=-0.0002'\] -> \[\]"):
        R.main(replace(args, resume=True, num_updates=2))
    R.main(replace(args, resume=True, num_updates=2, reward_scales=costs))
    assert [r["update"] for r in read_jsonl(tmp_path / "g1" / "metrics.jsonl")] == [0, 1, 2]
    with pytest.raises(RunError, match="^--reward-scales 'action_rate': write TERM=WEIGHT"):
        R.main(replace(args, run_name="bad", reward_scales=("action_rate",)))
    with pytest.raises(RunError, match="'torques=1': torques is given twice"):
        R.main(replace(args, run_name="bad", reward_scales=("torques=-1", "torques=1")))
    assert not (tmp_path / "bad").exists()


def test_the_fast_variant_evaluates_the_same_tracking_errors():
    pytest.importorskip("envpool")
    needs_task(SPOT)
    import robot_fpo_fast as F

    tiny = dict(num_envs=1, eval_episodes=1, flow_steps=2, actor_hidden=16, critic_hidden=16, critic_layers=1)
    args = replace(R.PRESETS["fpopp-locomotion"], **tiny, cuda=False, torch_threads=1, env_threads=1)
    fast_args = F.Args(**asdict(args))
    torch.manual_seed(args.seed)
    state = F.build_state(fast_args, CPU)  # on the CPU: the NumPy sampler, checked against the actor's
    envs = book.task_envs(args, 1, args.eval_seed, CPU)
    fast, ref = F.evaluate(state, envs, fast_args, "zero"), R.evaluate(state, envs, args, "zero")
    assert set(fast.metrics) == set(ref.metrics) == set(legged.TRACK_KEYS)
    for k in legged.TRACK_KEYS:  # the samplers agree to float32 rounding; a fallen robot would differ by far more
        assert fast.metrics[k] == pytest.approx(ref.metrics[k], rel=1e-3, abs=1e-3)
    envs.close()
    state.envs.close()


@pytest.mark.slow
def test_the_playground_backend_gives_the_same_columns():
    """Go1 on the Playground backend (CPU JAX; the shape of tests/test_playground_env.py's Go1, so one compile serves
    both): the command columns equal the task's own command and the errors give its tracking rewards."""
    pytest.importorskip("mujoco_playground")
    from fpo_utils.playground_env import PlaygroundVecEnv, menagerie_for
    from fpo_utils.runfolder import RunError

    try:
        menagerie_for("Go1JoystickFlatTerrain")
    except RunError as err:
        pytest.skip(str(err))
    envs = PlaygroundVecEnv("Go1JoystickFlatTerrain", 4, seed=0, device=CPU, episode_length=5, physics="auto")
    envs.reset(3)
    rng = np.random.default_rng(0)
    for _ in range(4):  # within the 5-step episodes: no reset
        _, _, _, _, info = envs.step(torch.tensor(0.2 * rng.uniform(-1, 1, (4, 12)), dtype=torch.float32))
        inner = envs._unpack_state(envs._state)  # the task's state after the step
        cmd, vel = legged.command_velocity(envs, info["final_obs"])
        np.testing.assert_array_equal(cmd.numpy(), np.asarray(inner.info["command"]))
        lin, yaw = legged.tracking_errors(cmd, vel)
        metrics = {k: np.asarray(v) for k, v in inner.metrics.items()}  # Go1's scales: 1.0 and 0.5
        rewards = np.exp(-(lin.numpy() ** 2) / 0.25), 0.5 * np.exp(-(yaw.numpy() ** 2) / 0.25)
        np.testing.assert_allclose(rewards[0], metrics["reward/tracking_lin_vel"], rtol=0, atol=1e-6)
        np.testing.assert_allclose(rewards[1], metrics["reward/tracking_ang_vel"], rtol=0, atol=1e-6)
    envs.close()


# ---------------------------------------------------------------------------- a checkpoint's live and EMA actors
@pytest.mark.slow
def test_checkpoint_rows_evaluate_the_live_actor_and_its_ema_copy(tmp_path):
    """benchmarks/legged_baselines.py --checkpoint: a checkpoint whose live actor outputs no velocity (last layer
    zeroed: from x0 = 0 it stands) and whose EMA copy is the untrained actor gives the standing row and the
    untrained rows of the same evaluation."""
    pytest.importorskip("envpool")
    needs_task(SPOT)
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    import legged_baselines as LB

    base = {(r["policy"], r["init"]): r for r in LB.baselines(SPOT, episodes=1, seed=3, threads=1)}
    _, state = LB.new_state(SPOT, 1, 3, 1)
    payload = {k: None if getattr(state, k) is None else getattr(state, k).state_dict() for k in book.PARTS}
    last = max(k for k in payload["actor"] if k.endswith(".weight"))  # net.6: the output layer
    for k in (last, last.replace("weight", "bias")):
        payload["actor"][k] = torch.zeros_like(payload["actor"][k])
    path = tmp_path / "last.pt"
    torch.save({**payload, "envs": None, "update": 7, "global_step": 0, "peak": (0.0, 0, -1)}, path)
    rows = {(r["policy"], r["init"]): r for r in LB.checkpoint_rows(SPOT, path, episodes=1, seed=3, threads=1)}
    assert set(rows) == {(f"{p}, update 7", i) for p in ("live", "ema") for i in ("zero", "random")}
    keys = ("eval_return", *legged.TRACK_KEYS)
    assert [rows["live, update 7", "zero"][k] for k in keys] == [base["standing", "-"][k] for k in keys]
    for init in ("zero", "random"):
        assert [rows["ema, update 7", init][k] for k in keys] == [base["untrained", init][k] for k in keys]
    assert rows["live, update 7", "random"]["eval_return"] != base["untrained", "random"]["eval_return"]
    with pytest.raises(SystemExit, match="does not fit G1JoystickFlatTerrain-v1"):
        LB.checkpoint_rows("G1JoystickFlatTerrain-v1", path, episodes=1, seed=3, threads=1)


# ---------------------------------------------------------------------------- where a return comes from
@pytest.mark.slow
def test_reward_terms_add_up_to_the_return_and_count_first_episodes_only():
    """legged_baselines.py --terms: each reward term summed over the first episodes (times the 0.02 s control step)
    adds up to the evaluation's return. A G1 at its home pose falls in every episode, so its termination term is
    exactly Playground's -100 x 0.02 per episode, and the same evaluation without terms gives the same numbers."""
    pytest.importorskip("envpool")
    g1 = "G1JoystickFlatTerrain-v1"
    needs_task(g1)
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    import legged_baselines as LB

    rows = LB.baselines(g1, episodes=3, seed=1, threads=1, terms=True)
    plain = LB.baselines(g1, episodes=3, seed=1, threads=1)
    for row, before in zip(rows, plain):
        terms = {k: v for k, v in row.items() if k.startswith("term_")}
        assert {"term_tracking_lin_vel", "term_feet_phase", "term_termination"} <= set(terms)
        assert sum(terms.values()) == pytest.approx(row["eval_return"], abs=1e-6)
        assert [row[k] for k in ("eval_return", *legged.TRACK_KEYS)] == [
            before[k] for k in ("eval_return", *legged.TRACK_KEYS)
        ]
    standing = rows[0]
    assert standing["policy"] == "standing" and standing["eval_track_len"] < 1000
    assert standing["term_termination"] == pytest.approx(-2.0, abs=1e-9)
    assert 0 < standing["term_tracking_lin_vel"] < 1.0 * 0.02 * standing["eval_track_len"]  # exp(.) <= 1 a step


@pytest.mark.slow
def test_reward_terms_under_other_weights_add_the_new_term_and_change_nothing_else(monkeypatch, capsys):
    """legged_baselines.py --terms --reward-scales action_rate=-0.01 on G1 (whose own weight is 0 and whose steps are
    not clipped): the same episodes, so each row's return is the plain return plus the new term, which is 0 for the
    standing robot (its action never changes) and negative for the untrained actor; a bad weight exits in one line."""
    pytest.importorskip("envpool")
    g1 = "G1JoystickFlatTerrain-v1"
    needs_task(g1)
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    import legged_baselines as LB

    plain = LB.baselines(g1, episodes=2, seed=1, threads=1, terms=True)
    weighed = LB.baselines(g1, episodes=2, seed=1, threads=1, terms=True, scales=["action_rate=-0.01"])
    for row, before in zip(weighed, plain):
        assert before["term_action_rate"] == 0.0
        assert row["eval_return"] == pytest.approx(before["eval_return"] + row["term_action_rate"], abs=1e-6)
        assert [row[k] for k in legged.TRACK_KEYS] == [before[k] for k in legged.TRACK_KEYS]
    assert weighed[0]["term_action_rate"] == 0.0 and weighed[2]["term_action_rate"] < -0.01
    monkeypatch.setattr(sys, "argv", ["legged_baselines.py", "--tasks", g1, "--reward-scales", "action_rate=-x"])
    with pytest.raises(SystemExit):
        LB.main()
    assert "error: --reward-scales 'action_rate=-x': write TERM=WEIGHT" in capsys.readouterr().err


@pytest.mark.slow
def test_reward_terms_add_up_on_a_task_that_clips_each_steps_reward_at_zero():
    """legged_baselines.py --terms on Go1, whose task clips each step's reward at 0: the terms and ``term_clip``
    (what the clip added) add up to the return; the untrained actor from random x0 makes negative steps that the
    clip lifts, and the standing robot (it stays up) none."""
    pytest.importorskip("envpool")
    go1 = "Go1JoystickFlatTerrain-v1"
    needs_task(go1)
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    import legged_baselines as LB

    rows = LB.baselines(go1, episodes=2, seed=1, threads=1, terms=True)
    for row in rows:
        terms = {k: v for k, v in row.items() if k.startswith("term_")}
        assert sum(terms.values()) == pytest.approx(row["eval_return"], abs=1e-6)
    standing, random = rows[0], rows[2]
    assert (standing["policy"], random["init"]) == ("standing", "random")
    assert standing["term_clip"] == 0 and random["term_clip"] > 0.1


def test_first_episodes_count_each_environment_up_to_its_first_end_in_numpy_and_torch():
    """legged_baselines.FirstEpisodes, the mask behind --terms and --response: a step counts while its environment's
    first episode lasts, the ending step included; a reset starts the count again."""
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    import legged_baselines as LB

    done = [[0, 0, 1], [1, 0, 0], [0, 0, 1], [1, 1, 0]]  # env 0 ends at steps 1 and 3, env 1 at 3, env 2 at 0
    want = [[1, 1, 1], [1, 1, 0], [0, 1, 0], [0, 1, 0]]
    first = LB.FirstEpisodes(SimpleNamespace(reset=lambda seed: seed, num_envs=3))
    assert first.num_envs == 3  # everything else passes through
    for kind in (np.array, torch.tensor):
        for _ in range(2):
            assert first.reset(7) == 7
            got = [first.first(kind(np.array(d, dtype=bool))) for d in done]
            assert [list(np.asarray(g, dtype=int)) for g in got] == want


# ---------------------------------------------------------------------------- how wide the actions are
@pytest.mark.slow
def test_action_spread_of_a_known_sampler_and_of_an_untrained_flow():
    """legged_baselines.action_spread: a sampler x = 0.5 x0 + (the state's first columns) has a spread of 0.5 at
    each state and the states' own std across them; an untrained G1 actor keeps its noise (spread near 1) and
    hardly follows the state, and the standing policy has neither."""
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    import legged_baselines as LB

    obs = torch.randn(300, 5, generator=torch.Generator().manual_seed(1))
    out = LB.action_spread(lambda o, x0, steps: 0.5 * x0 + o[:, :2], obs, act_dim=2, steps=8, draws=64)
    assert out["spread_x"] == pytest.approx(0.5, abs=0.02)
    assert out["state_x"] == pytest.approx(float(obs[:, :2].std(0).mean()), abs=1e-6)
    assert 0.2 < out["spread_a"] < out["spread_x"]  # tanh narrows
    pytest.importorskip("envpool")
    g1 = "G1JoystickFlatTerrain-v1"
    needs_task(g1)
    standing, untrained, _ = LB.baselines(g1, episodes=2, seed=1, threads=1, spread=True)
    assert standing["spread_x"] == 0 and standing["state_x"] == 0
    assert 0.9 < untrained["spread_x"] < 1.1 and untrained["state_x"] < 0.05
    assert "| spread x | spread a | state x |" in LB.markdown([standing, untrained])


# ---------------------------------------------------------------------------- how the velocity follows the command
def test_command_response_fits_stretch_means_and_skips_dead_and_short_stretches():
    """legged_baselines.command_response: a velocity of half the command plus a yaw swing of whole periods gives
    slope 0.5 and correlation 1 on every axis, the swing's RMS (1/sqrt 2), and none of the steps after an episode's
    end or of a stretch shorter than 1 s (both hold values that would spoil every number)."""
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    import legged_baselines as LB

    T, N = 300, 3
    cmd, alive = torch.zeros(T, N, 3, dtype=torch.float64), torch.zeros(T, N, dtype=torch.bool)
    cmd[:160, 0], cmd[160:, 0] = torch.tensor([0.4, -0.2, 0.8]), torch.tensor([0.1, 0.3, -0.6])  # stretches 160, 140
    cmd[:, 1] = torch.tensor([-0.5, 0.2, 0.3])
    cmd[:, 2] = torch.tensor([9.0, 9.0, 9.0])
    alive[:, 0], alive[:120, 1], alive[:30, 2] = True, True, True  # env 2: one stretch of 30 steps, too short
    vel = 0.5 * cmd
    swing = torch.sin(2 * torch.pi * torch.arange(T, dtype=torch.float64) / 20)  # whole periods in every stretch
    vel[..., 2] += swing[:, None]
    vel[120:, 1] = 100.0  # after env 1's first episode
    out = LB.command_response(cmd, vel, alive)
    assert out["resp_steps"] == 300 + 120
    for axis in LB.AXES:
        assert out[f"resp_{axis}_slope"] == pytest.approx(0.5, abs=1e-9)
        assert out[f"resp_{axis}_corr"] == pytest.approx(1.0, abs=1e-9)
    c = torch.cat([cmd[:, 0], cmd[:120, 1]])
    assert out["resp_yaw_still"] == pytest.approx(float(c[:, 2].abs().mean()), abs=1e-9)
    assert out["resp_yaw_err"] == pytest.approx(0.5 * out["resp_yaw_still"], abs=1e-9)
    assert out["resp_yaw_swing"] == pytest.approx(2**-0.5, abs=1e-9)
    assert out["resp_vx_swing"] == pytest.approx(0.0, abs=1e-9)
    # the step-to-step change: only within a stretch (env 0: 0-159 and 160-299; env 1: 0-119), never across a jump
    change = torch.cat([swing[1:160] - swing[:159], swing[161:] - swing[160:-1], swing[1:120] - swing[:119]])
    assert out["resp_yaw_step"] == pytest.approx(float(change.pow(2).mean().sqrt()), abs=1e-12)
    assert out["resp_vx_step"] == pytest.approx(0.0, abs=1e-12)


def test_action_change_counts_pairs_of_steps_inside_an_episode_only():
    """legged_baselines.action_change: mean |a| over the first-episode steps, and the RMS of the change between two
    steps that both belong to it (a step after the episode's end holds a value that would spoil both)."""
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    import legged_baselines as LB

    act = torch.tensor([[[0.5, -0.5], [1.0, 1.0]], [[0.5, 0.5], [9.0, 9.0]], [[-0.5, 0.5], [9.0, 9.0]]])
    alive = torch.tensor([[True, True], [True, False], [True, False]])  # env 1: one step
    out = LB.action_change(act, alive)
    assert out["act_abs"] == pytest.approx((6 * 0.5 + 2 * 1.0) / 8)
    assert out["act_step"] == pytest.approx(((1.0 + 1.0) / 4) ** 0.5)  # changes (0, 1) and (-1, 0)


@pytest.mark.slow
def test_response_rows_leave_the_evaluation_unchanged_and_see_a_standing_spot_ignore_its_command():
    """legged_baselines.py --response: the evaluation's numbers are those without it, and Spot at its home pose
    (it stays up, it does not move) follows no command: slope near 0, error near not moving's."""
    pytest.importorskip("envpool")
    needs_task(SPOT)
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    import legged_baselines as LB

    rows = LB.baselines(SPOT, episodes=2, seed=1, threads=1, response=True)
    plain = LB.baselines(SPOT, episodes=2, seed=1, threads=1)
    keys = ("eval_return", *legged.TRACK_KEYS)
    for row, before in zip(rows, plain):
        assert [row[k] for k in keys] == [before[k] for k in keys]
        assert 0 < row["resp_steps"] <= 2 * row["eval_track_len"]
    standing = rows[0]
    assert standing["policy"] == "standing" and standing["resp_steps"] > 1000
    assert standing["act_abs"] == 0 and standing["act_step"] == 0  # the action 0 at every step
    assert standing["resp_yaw_step"] < 0.05  # a robot at rest: its yaw rate barely changes from step to step
    for axis in ("vx", "yaw"):
        assert abs(standing[f"resp_{axis}_slope"]) < 0.1
        assert standing[f"resp_{axis}_err"] == pytest.approx(standing[f"resp_{axis}_still"], abs=0.05)
    assert "| vx slope |" in LB.markdown(rows)


# ---------------------------------------------------------------------------- smoothed actions (--action-filter)
def test_smoothed_actions_follow_the_filter_and_restart_from_zero_where_an_episode_ends():
    """legged_baselines.Smoothed: the task receives b a_prev + (1 - b) a, a_prev = 0 at the first step, again 0
    for an environment whose episode ended a step earlier, and again after a reset; b = 0 passes the actions."""
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    import legged_baselines as LB

    got, ends = [], iter([[False, False], [False, True], [False, False], [False, False]])

    def step(a):
        got.append(a.clone())
        done = torch.tensor(next(ends))
        return None, None, done, torch.zeros(2, dtype=torch.bool), {}

    envs = LB.Smoothed(SimpleNamespace(step=step, reset=lambda seed: seed, num_envs=2), 0.5)
    assert envs.num_envs == 2 and envs.reset(3) == 3  # everything else passes through
    ones = torch.ones(2, 1)
    for _ in range(3):
        envs.step(ones)
    assert [g[:, 0].tolist() for g in got] == [[0.5, 0.5], [0.75, 0.75], [0.875, 0.5]]  # env 1 ended at step 2
    envs.reset(3)
    envs.step(-ones)
    assert got[-1][:, 0].tolist() == [-0.5, -0.5]
    got.clear()
    ends = iter([[False, False]] * 2)
    plain = LB.Smoothed(SimpleNamespace(step=step, reset=lambda seed: seed), 0.0)
    for a in (ones, -2 * ones):
        plain.step(a)
    assert [g[:, 0].tolist() for g in got] == [[1.0, 1.0], [-2.0, -2.0]]


@pytest.mark.slow
def test_a_filtered_evaluation_records_the_smoothed_actions_and_a_bad_filter_is_one_line(tmp_path):
    """--action-filter on envpool's Spot: the untrained actor's actions, smoothed, change less from step to step
    than without it (its x0 = 0 actions are near constant, so the random-x0 row shows it), the row says the filter,
    and --action-filter 1 ends in one line that names the value and the range."""
    import subprocess

    pytest.importorskip("envpool")
    needs_task(SPOT)
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    import legged_baselines as LB

    plain = {r["init"]: r for r in LB.baselines(SPOT, episodes=2, seed=1, threads=1, response=True)[1:]}
    smooth = {r["init"]: r for r in LB.baselines(SPOT, episodes=2, seed=1, threads=1, response=True, smooth=0.8)[1:]}
    assert smooth["random"]["action_filter"] == 0.8 and "action_filter" not in plain["random"]
    assert smooth["random"]["act_step"] < 0.5 * plain["random"]["act_step"]
    cmd = [sys.executable, os.path.join(ROOT, "benchmarks", "legged_baselines.py"), "--action-filter", "1"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert out.returncode == 2 and "--action-filter 1.0: must be in [0, 1)" in out.stderr.strip().splitlines()[-1]
