"""benchmarks/playground_ppo.py, Playground's own PPO (Brax) as the legged runs' peer: a tiny CartpoleBalance run
stopped after one evaluation and resumed keeps Brax's evaluation schedule; the saved policy acts as Brax's own
deterministic policy; a G1 policy whose mean is zero evaluates as standing still in legged_baselines.py --ppo;
bad settings are one-line errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
pytest.importorskip("mujoco_playground", reason="the playground extra is not installed: pip install -e '.[playground]'")
import playground_ppo as P  # noqa: E402

from fpo_utils.runfolder import RunError  # noqa: E402

SCRIPT = ROOT / "benchmarks" / "playground_ppo.py"
# Brax's schedule for this budget: num_evals 4 -> 3 epochs, each ceil(1536 / (3 x 128 x 10)) = 1 training step of
# 128 environment steps (batch 8 x unroll 4 x 4 minibatches) per reset, 10 resets an evaluation (the task's
# Playground setting, checked below): 1,280 steps an evaluation, 3,840 in all.
TINY = "num_timesteps=1536 num_envs=8 batch_size=8 num_minibatches=4 unroll_length=4 num_updates_per_batch=1"
TINY = [*TINY.split(), "num_evals=4", "num_eval_envs=2", "episode_length=30"]


def ppo(run_dir: Path, *extra: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, str(SCRIPT), "--env-id", "CartpoleBalance", "--run-dir", str(run_dir), "--set", *TINY]
    env = dict(os.environ, MUJOCO_GL="disable", JAX_PLATFORMS="cpu")
    return subprocess.run([*cmd, *extra], capture_output=True, text=True, env=env, timeout=900)


def steps(run_dir: Path) -> list[int]:
    return [json.loads(line)["env_steps"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def resumed(tmp_path_factory):
    """One tiny run: stopped after its first evaluation, resumed to the end, then resumed once more."""
    run_dir = tmp_path_factory.mktemp("ppo") / "cartpole"
    first = ppo(run_dir, "--stop-after", "1")
    assert first.returncode == 0, first.stderr[-2000:]
    at_stop = SimpleNamespace(steps=steps(run_dir), saved=P.load_params(run_dir / "params.npz")[1]["env_steps"])
    second = ppo(run_dir, "--resume")
    assert second.returncode == 0, second.stderr[-2000:]
    rows = (run_dir / "metrics.jsonl").read_text()
    third = ppo(run_dir, "--resume")
    return SimpleNamespace(run_dir=run_dir, first=first, at_stop=at_stop, second=second, rows=rows, third=third)


@pytest.mark.slow
def test_a_stopped_run_resumes_on_brax_schedule_and_a_finished_one_stays(resumed):
    assert P.ppo_config("CartpoleBalance").num_resets_per_eval == 10  # the schedule above assumes it
    assert "stopped after 1 evaluations" in resumed.first.stdout
    assert resumed.at_stop.steps == [0, 1280] and resumed.at_stop.saved == 1280
    assert steps(resumed.run_dir) == [0, 1280, 2560, 3840]
    rows = [json.loads(line) for line in resumed.rows.splitlines()]
    assert all(np.isfinite(r["eval_return"]) and r["eval_length"] == 30 for r in rows)
    # Playground's per-term episode sums, unweighted: CartpoleBalance's "upright" is at most 1 a step.
    assert all(0 < r["term_upright"] <= 30 for r in rows)
    assert P.load_params(resumed.run_dir / "params.npz")[1]["env_steps"] == 3840
    assert json.loads((resumed.run_dir / "summary.json").read_text())["env_steps"] == 3840
    resume_args = json.loads((resumed.run_dir / "args_resume_1280.json").read_text())
    assert resume_args["resume"] and resume_args["ppo"]["num_timesteps"] == 1536
    assert P.table(resumed.run_dir).splitlines()[-1].startswith("| 3,840 | ")
    assert "done (3840 environment steps)" in resumed.third.stdout
    assert (resumed.run_dir / "metrics.jsonl").read_text() == resumed.rows


@pytest.mark.slow
def test_the_saved_policy_is_brax_deterministic_policy(resumed):
    import jax
    from brax.training.agents.ppo import networks as ppo_networks

    path = resumed.run_dir / "params.npz"
    params, meta = P.load_params(path)
    policy, _ = P.load_policy(path)
    nets = P.networks(meta["obs_sizes"], meta["action_size"], meta["network_factory"])
    act = ppo_networks.make_inference_fn(nets)((params[0], params[1]), deterministic=True)
    obs = np.random.default_rng(0).normal(0, 2, (16, meta["obs_sizes"])).astype(np.float32)
    want = np.asarray(act(obs, jax.random.PRNGKey(0))[0])
    mean = policy(obs)
    np.testing.assert_allclose(np.tanh(mean), want, atol=1e-6)
    assert mean.shape == (16, meta["action_size"]) and mean.std(0).min() > 0  # it reads its observation


def test_the_table_gives_each_tracking_term_a_step_over_its_weight(tmp_path):
    weights = {"tracking_lin_vel": 1.0, "tracking_ang_vel": 0.75, "feet_phase": 0.0}  # a term weighed 0: no column
    (tmp_path / "args.json").write_text(json.dumps({"term_weights": weights}))
    row = dict(env_steps=10_485_760, eval_return=12.345, eval_length=400.0, term_feet_phase=0.0)
    row.update(term_tracking_lin_vel=1.0 * 0.6 * 400, term_tracking_ang_vel=0.75 * 0.5 * 400)
    (tmp_path / "metrics.jsonl").write_text(json.dumps(row) + "\n")
    head, _, line = P.table(tmp_path).splitlines()
    assert head == "| environment steps | evaluation | episode, steps | tracking_lin_vel | tracking_ang_vel |"
    assert line == "| 10,485,760 | 12.35 | 400 | 0.600 | 0.500 |"


@pytest.mark.slow
def test_bad_settings_are_one_line_errors(tmp_path):
    for item, named in [("nope=1", "num_eval_envs"), ("num_envs=many", "num_envs"), ("learning_rate=inf", "finite")]:
        with pytest.raises(RunError, match=named):
            P.ppo_config("CartpoleBalance", [item])
    with pytest.raises(RunError, match="'Nope'"):
        P.ppo_config("Nope")
    assert P.ppo_config("CartpoleBalance", ["num_eval_envs=3"]).num_eval_envs == 3
    (tmp_path / "params.npz").write_bytes(b"")
    out = ppo(tmp_path)
    assert out.returncode == 2 and "pass --resume" in out.stderr.strip().splitlines()[-1]
    out = ppo(tmp_path, "--resume")
    assert out.returncode != 0 and "not a params.npz" in out.stderr.strip().splitlines()[-1]


@pytest.mark.slow
def test_a_ppo_policy_whose_mean_is_zero_evaluates_as_standing_still(tmp_path):
    import jax
    from legged_baselines import baselines, ppo_rows

    from fpo_utils.envs import envpool_ids
    from fpo_utils.playground_env import load_task, menagerie_for

    task = "G1JoystickFlatTerrain"
    try:
        menagerie_for(task)
    except RunError as err:
        pytest.skip(str(err))
    if f"{task}-v1" not in envpool_ids():
        pytest.skip(f"envpool (with its Playground ports) is not installed here, so {task}-v1 cannot be made")
    env = load_task(task, "jax")
    sizes = P.observation_sizes(env)
    factory = dict(P.ppo_config(task).network_factory)
    norm, policy, value = P.template(sizes, env.action_size, factory)
    last = sorted(policy["params"])[-1]  # the output layer: zero weights and bias, so the mean is 0 everywhere
    policy["params"][last] = jax.tree.map(np.zeros_like, policy["params"][last])
    meta = dict(env_id=task, obs_sizes=sizes, action_size=env.action_size, network_factory=factory)
    P.save_params(tmp_path / "params.npz", (norm, policy, value), 0, meta)
    rows = ppo_rows(f"{task}-v1", tmp_path / "params.npz", episodes=2, seed=0, terms=True, response=True)
    stand = next(r for r in baselines(f"{task}-v1", 2, 0) if r["policy"] == "standing")
    assert rows[0]["policy"] == "ppo, 0 steps" and rows[0]["act_abs"] == 0.0
    for key in ("eval_return", "eval_track_lin", "eval_track_yaw", "eval_track_len"):
        assert rows[0][key] == pytest.approx(stand[key], abs=1e-9)
    with pytest.raises(SystemExit, match="not Go1JoystickFlatTerrain-v1"):
        ppo_rows("Go1JoystickFlatTerrain-v1", tmp_path / "params.npz", episodes=2, seed=0)


@pytest.mark.slow
def test_a_policy_of_dict_observations_reads_its_own_key_through_its_normaliser(tmp_path):
    # As G1's: the actor reads "state", the critic "privileged_state"; random weights and statistics, so that a
    # policy that skipped the normaliser or read the other key would act otherwise than Brax's.
    import jax
    from brax.training.agents.ppo import networks as ppo_networks

    sizes, n = {"privileged_state": 11, "state": 7}, 3
    factory = dict(P.ppo_config("G1JoystickFlatTerrain").network_factory)
    norm, policy, value = P.template(sizes, n, factory)
    rng = np.random.default_rng(1)
    policy = jax.tree.map(lambda a: rng.normal(0, 1 / np.sqrt(a.shape[0]), a.shape).astype(np.float32), policy)
    mean = {k: rng.normal(0, 1, m).astype(np.float32) for k, m in sizes.items()}
    std = {k: rng.uniform(0.5, 2, m).astype(np.float32) for k, m in sizes.items()}
    norm = norm.replace(mean=mean, std=std)
    meta = dict(env_id="G1JoystickFlatTerrain", obs_sizes=sizes, action_size=n, network_factory=factory)
    P.save_params(tmp_path / "params.npz", (norm, policy, value), 5, meta)
    act = ppo_networks.make_inference_fn(P.networks(sizes, n, factory))((norm, policy), deterministic=True)
    obs = {k: rng.normal(0, 2, (6, m)).astype(np.float32) for k, m in sizes.items()}
    got, meta = P.load_policy(tmp_path / "params.npz")
    want = np.asarray(act(obs, jax.random.PRNGKey(0))[0])
    assert 0.05 < np.abs(want).mean() < 0.95  # neither near 0 nor saturated, so the comparison sees every input
    np.testing.assert_allclose(np.tanh(got(obs["state"])), want, atol=1e-5)
    assert meta["env_steps"] == 5
