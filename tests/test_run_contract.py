"""The run-folder contract through both trainers' command lines: what a user meets when a run
folder already exists, a checkpoint is damaged, or the output directory cannot be written."""

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

ROOT = Path(__file__).resolve().parents[1]
ROBOT_TINY = [
    "--env-id",
    "InvertedPendulum-v5",
    "--num-envs",
    "8",
    "--num-steps",
    "32",
    "--num-minibatches",
    "2",
    "--update-epochs",
    "1",
    "--num-draws",
    "2",
    "--flow-steps",
    "2",
    "--eval-every",
    "4",
    "--eval-episodes",
    "1",
    "--no-cuda",
    "--backend",
    "gymnasium",
]


def robot(cwd, *flags):
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", MUJOCO_GL="disable")
    return subprocess.run(
        [sys.executable, str(ROOT / "robot_fpo.py"), *ROBOT_TINY, *flags],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def folder_bytes(path):
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


def one_line(proc):
    err = proc.stderr.strip()
    assert len(err.splitlines()) == 1 and err.startswith("error: "), proc.stderr
    return err


@pytest.mark.slow
def test_robot_run_folder_is_not_overwritten_and_resume_checks_settings(tmp_path):
    first = robot(tmp_path, "--total-timesteps", "2048", "--run-name", "r")
    assert first.returncode == 0, first.stderr
    folder = tmp_path / "runs" / "r"
    before = folder_bytes(folder)
    rows = len((folder / "metrics.jsonl").read_text().splitlines())
    # the same command with a smaller budget used to replace the metrics and the checkpoint silently
    again = robot(tmp_path, "--total-timesteps", "512", "--run-name", "r")
    err = one_line(again)
    assert again.returncode == 2 and "runs/r" in err and "--resume" in err and "--run-name" in err
    assert folder_bytes(folder) == before
    # resume with another setting is refused, naming it with both values; the budget may change
    changed = robot(tmp_path, "--total-timesteps", "4096", "--run-name", "r", "--resume", "--alpha-eps", "0.5")
    assert changed.returncode == 2 and "alpha_eps: 1.0 -> 0.5" in one_line(changed)
    assert folder_bytes(folder) == before
    longer = robot(tmp_path, "--total-timesteps", "4096", "--run-name", "r", "--resume")
    assert longer.returncode == 0, longer.stderr
    assert len((folder / "metrics.jsonl").read_text().splitlines()) > rows
    assert json.loads((folder / "args.json").read_text())["total_timesteps"] == 4096


@pytest.mark.slow
def test_robot_truncated_checkpoint_is_a_bad_file_error(tmp_path):
    assert robot(tmp_path, "--total-timesteps", "1024", "--run-name", "r").returncode == 0
    ckpt = tmp_path / "runs" / "r" / "checkpoints" / "last.pt"
    ckpt.write_bytes(ckpt.read_bytes()[:500])
    proc = robot(tmp_path, "--total-timesteps", "2048", "--run-name", "r", "--resume")
    assert proc.returncode == 4 and "last.pt" in one_line(proc)


@pytest.mark.slow
def test_default_robot_run_names_do_not_collide(tmp_path):
    runs = [("--alpha-eps", "1"), ("--alpha-eps", "0.5"), ("--objective", "fpopp", "--alpha", "0.5")]
    for flags in runs:
        proc = robot(tmp_path, "--total-timesteps", "256", *flags)
        assert proc.returncode == 0, proc.stderr
    names = sorted(p.name for p in (tmp_path / "runs").iterdir())
    assert len(names) == 3 and all("InvertedPendulum-v5" in n for n in names), names


@pytest.mark.parametrize("trainer", [pytest.param("robot", marks=pytest.mark.slow), "cifar"])
def test_unwritable_output_directory_is_one_line_and_exit_5(tmp_path, trainer):
    blocker = tmp_path / "not_a_folder"
    blocker.write_text("a file where the runs directory should be")
    if trainer == "robot":
        proc = robot(tmp_path, "--total-timesteps", "256", "--runs-dir", str(blocker / "runs"))
    else:
        env = dict(os.environ, OMP_NUM_THREADS="1")
        proc = subprocess.run(
            [
                sys.executable,
                str(ROOT / "cifar_fpo.py"),
                "--preset",
                "quick",
                "--reward",
                "red-patch",
                "--device",
                "cpu",
                "--runs-dir",
                str(blocker / "runs"),
            ],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
    assert proc.returncode == 5 and str(blocker) in one_line(proc)


def test_sweeps_take_the_trainers_presets(monkeypatch):
    import cifar_fpo
    import halving
    import robot_fpo_fast

    parsed = []
    monkeypatch.setattr(halving, "run_grid", lambda cmd: parsed.append(cmd) or {})
    monkeypatch.setattr(halving, "print_grid", lambda result: None)
    halving.main(["cifar-grid", "--train.preset", "quick", "--train.batch-size", "4"])
    halving.main(["robot-grid", "--train.preset", "fpo", "--train.seed", "5"])
    quick, fpo = parsed[0].train, parsed[1].train
    assert quick == replace(cifar_fpo.PRESETS["quick"], batch_size=4)
    assert fpo == replace(robot_fpo_fast.PRESETS["fpo"], seed=5)
    with pytest.raises(Exception, match="--train.preset 'huge' is not one of"):
        halving.main(["cifar", "--train.preset", "huge"])


def test_missing_reward_weights_are_one_line_and_leave_no_folder(tmp_path):
    """rewards.py's weights folder set to an empty path: the run stops before training with one line naming the
    file and how to point at another, exit 4 (a missing file), and no run folder."""
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", FPO_WEIGHTS_DIR=str(tmp_path / "empty"))
    cmd = [sys.executable, str(ROOT / "cifar_fpo.py"), "--preset", "quick", "--runs-dir", str(tmp_path / "runs")]
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    err = one_line(proc)
    assert proc.returncode == 4
    assert str(tmp_path / "empty" / "cifar10-classifier.safetensors") in err and "FPO_WEIGHTS_DIR" in err
    assert not any((tmp_path / "runs").glob("*/checkpoints"))


@pytest.mark.parametrize("trainer", ["robot", "cifar"])
def test_resume_of_a_run_that_does_not_exist_is_exit_4_naming_the_runs_there(tmp_path, trainer):
    name = "pendulum_s" if trainer == "robot" else "auto_s"
    (tmp_path / "runs" / f"{name}1" / "checkpoints").mkdir(parents=True)
    (tmp_path / "runs" / f"{name}1" / "checkpoints" / "last.pt").write_bytes(b"")
    if trainer == "robot":
        proc = robot(tmp_path, "--total-timesteps", "512", "--run-name", f"{name}2", "--resume")
    else:
        cmd = [sys.executable, str(ROOT / "cifar_fpo.py"), "--preset", "quick", "--device", "cpu"]
        env = dict(os.environ, OMP_NUM_THREADS="1")
        proc = subprocess.run(
            [*cmd, "--resume", "--run-name", f"{name}2"], cwd=tmp_path, env=env, capture_output=True, text=True
        )
    err = one_line(proc)
    assert proc.returncode == 4 and f"runs/{name}2" in err and f"{name}1" in err and "--resume-or-start" in err
    assert not (tmp_path / "runs" / f"{name}2").exists()


@pytest.mark.slow
def test_resume_or_start_starts_a_run_then_continues_it(tmp_path):
    for budget in ("256", "512"):
        proc = robot(tmp_path, "--total-timesteps", budget, "--run-name", "r", "--resume-or-start")
        assert proc.returncode == 0, proc.stderr
    summary = json.loads((tmp_path / "runs" / "r" / "summary.json").read_text())
    assert summary["status"] == "finished" and summary["global_step"] == 512, summary
