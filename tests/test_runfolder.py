"""The run-folder contract (fpo_utils/runfolder.py), on tiny payloads."""

import errno
import json
import os
import random
import signal
from dataclasses import dataclass
from typing import Literal, Optional

import numpy as np
import pytest
import torch

from fpo_utils import runfolder
from fpo_utils.runfolder import (
    CHECKPOINT,
    EXIT_BAD_FILE,
    EXIT_BAD_INPUT,
    EXIT_INTERRUPTED,
    EXIT_IO,
    EXIT_NONFINITE,
    RunError,
    RunFolder,
    check_choices,
    cli,
    read_jsonl,
)


def strict_loads(line):
    def refuse(name):
        raise ValueError(f"non-standard JSON constant {name}")

    return json.loads(line, parse_constant=refuse)


def folder_bytes(path):
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


def make_run(tmp_path, steps=2, **config):
    """A finished tiny run: args.json, two metric rows, one checkpoint, a summary."""
    config = {"alpha": 0.0, "num_updates": 10, **config}
    with RunFolder(tmp_path, "r", config, resume=False, may_change=("num_updates",)) as rf:
        for k in range(steps):
            rf.log({"update": k, "loss": 0.5 / (k + 1)}, step=k)
        rf.save_checkpoint({"k": steps})
        rf.write_summary({"status": "finished", "updates_done": steps})
    return rf.path


def test_metrics_are_strict_json_and_reach_tensorboard(tmp_path):
    with RunFolder(tmp_path, "r", {"lr": 1e-3}, resume=False) as rf:
        rf.log(
            {
                "update": 0,
                "loss": float("nan"),
                "reward": float("inf"),
                "x": np.float32(2.5),
                "q": np.array([0.25, 0.75]),
                "ok": True,
            },
            step=0,
            tags={"loss": "losses/loss"},
        )
        rf.log({"update": 1, "loss": 0.25, "reward": 1.0}, step=1, tags={"loss": "losses/loss"})
    lines = (rf.path / "metrics.jsonl").read_text().splitlines()
    rows = [strict_loads(line) for line in lines]
    assert rows[0] == {"update": 0, "loss": None, "reward": None, "x": 2.5, "q": [0.25, 0.75], "ok": True}
    assert rows[1]["loss"] == 0.25
    events = list(rf.path.glob("events.out.tfevents.*"))
    assert len(events) == 1
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(rf.path))
    acc.Reload()
    assert {"losses/loss", "charts/reward", "charts/x"} <= set(acc.Tags()["scalars"])
    # non-finite values are left out of TensorBoard, finite ones kept with their step
    assert [(e.step, e.value) for e in acc.Scalars("losses/loss")] == [(1, 0.25)]
    assert json.loads((rf.path / "args.json").read_text()) == {"lr": 1e-3}


def test_a_folder_with_a_checkpoint_is_never_written_over(tmp_path):
    path = make_run(tmp_path)
    before = folder_bytes(path)
    with pytest.raises(RunError) as err:
        with RunFolder(tmp_path, "r", {"alpha": 0.0, "num_updates": 10}, resume=False):
            pass
    assert err.value.code == EXIT_BAD_INPUT
    msg = str(err.value)
    assert "\n" not in msg and str(path) in msg and "--resume" in msg and "--run-name" in msg
    assert folder_bytes(path) == before


def test_resume_refuses_changed_settings_and_accepts_the_budget(tmp_path):
    path = make_run(tmp_path)
    with pytest.raises(RunError) as err:
        RunFolder(tmp_path, "r", {"alpha": -2.0, "num_updates": 10, "preset": "paper"}, resume=True)
    msg = str(err.value)
    assert "\n" not in msg
    assert "alpha: 0.0 -> -2.0" in msg and "preset: (unset) -> 'paper'" in msg
    with RunFolder(tmp_path, "r", {"alpha": 0.0, "num_updates": 20}, resume=True, may_change=("num_updates",)) as rf:
        assert rf.resuming
        assert rf.load_checkpoint()["k"] == 2
    assert json.loads((path / "args.json").read_text())["num_updates"] == 20


@dataclass
class Grown:  # a trainer's Args that gained ``fast`` after the run in the folder started
    alpha: float = 0.0
    num_updates: int = 10
    fast: bool = False


def test_resume_accepts_a_setting_added_since_at_its_default_only(tmp_path):
    path = make_run(tmp_path)  # args.json: alpha, num_updates
    with pytest.raises(RunError, match=r"fast: \(unset\) -> True"):
        RunFolder(tmp_path, "r", Grown(fast=True), resume=True)
    with pytest.raises(RunError, match=r"alpha: 0.0 -> 1.0"):
        RunFolder(tmp_path, "r", Grown(alpha=1.0), resume=True)
    with pytest.raises(RunError, match=r"fast: \(unset\) -> False"):  # a plain mapping has no defaults to go by
        RunFolder(tmp_path, "r", {"alpha": 0.0, "num_updates": 10, "fast": False}, resume=True)
    with RunFolder(tmp_path, "r", Grown(num_updates=20), resume=True, may_change=("num_updates",)) as rf:
        assert rf.load_checkpoint()["k"] == 2
    assert json.loads((path / "args.json").read_text()) == {"alpha": 0.0, "num_updates": 20, "fast": False}


def test_fresh_start_clears_a_failed_start_and_a_failure_leaves_no_folder(tmp_path):
    # a killed start: rows and args but no checkpoint
    with pytest.raises(RuntimeError):
        with RunFolder(tmp_path, "r", {"a": 1}, resume=False) as rf:
            rf.log({"kind": "calibration", "update": -1}, step=0)
            raise RuntimeError("killed")
    assert not (tmp_path / "r").exists()
    # leftovers of a start killed with SIGKILL (no cleanup ran) are cleared by the next start
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "metrics.jsonl").write_text('{"kind": "calibration", "update": -1}\n')
    with RunFolder(tmp_path, "r", {"a": 1}, resume="or-start") as rf:  # no checkpoint: starts fresh
        assert not rf.resuming
        rf.log({"kind": "calibration", "update": -1}, step=0)
        rf.save_checkpoint({})
    assert len(read_jsonl(tmp_path / "r" / "metrics.jsonl")) == 1


def test_resume_without_a_checkpoint_names_the_folder_and_the_runs_there(tmp_path):
    for name in ("alpha-2__s1", "alpha0__s1", "edge"):
        with RunFolder(tmp_path, name, {"a": 1}, resume=False) as rf:
            rf.save_checkpoint({})
    (tmp_path / "started-only").mkdir()  # a folder without a checkpoint is not offered
    with pytest.raises(RunError) as err:
        RunFolder(tmp_path, "alpha-2_s1", {"a": 1}, resume=True)  # a typo
    msg = str(err.value)
    assert err.value.code == EXIT_BAD_FILE and "\n" not in msg and str(tmp_path / "alpha-2_s1") in msg
    assert msg.index("alpha-2__s1") < msg.index("alpha0__s1") and "edge" in msg and "started-only" not in msg
    assert not (tmp_path / "alpha-2_s1").exists()  # nothing was started
    with pytest.raises(RunError, match="no run there has a checkpoint"):
        RunFolder(tmp_path / "empty", "r", {}, resume=True)
    with RunFolder(tmp_path, "alpha0__s1", {"a": 1}, resume="or-start") as rf:  # or-start continues a checkpoint
        assert rf.resuming


def test_atomic_write_fsyncs_the_file_then_renames_then_fsyncs_the_folder(tmp_path, monkeypatch):
    events, real_replace = [], os.replace

    def fsync(fd):
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))

    def replace(src, dst):
        events.append(("replace", str(dst)))
        real_replace(src, dst)

    monkeypatch.setattr(runfolder.os, "fsync", fsync)
    monkeypatch.setattr(runfolder.os, "replace", replace)
    target = tmp_path / "sub" / "state.pt"
    runfolder.atomic_write(target, lambda tmp: tmp.write_bytes(b"new"))
    assert target.read_bytes() == b"new" and not list(tmp_path.rglob("*.tmp"))
    assert events == [("fsync", str(target) + ".tmp"), ("replace", str(target)), ("fsync", str(target.parent))]


def test_kept_checkpoints_are_whole_copies(tmp_path):
    with RunFolder(tmp_path, "r", {}, resume=False) as rf:
        rf.save_checkpoint({"k": 1}, keep_as="update_000001.pt")
        rf.save_checkpoint({"k": 2}, keep_as="update_000002.pt")
        rf.save_checkpoint({"k": 3})
    ckpts = tmp_path / "r" / "checkpoints"
    loaded = {p.name: torch.load(p, weights_only=False)["k"] for p in ckpts.glob("*.pt")}
    assert loaded == {"last.pt": 3, "update_000001.pt": 1, "update_000002.pt": 2}


def test_failed_checkpoint_write_keeps_the_previous_one(tmp_path, monkeypatch):
    path = make_run(tmp_path)
    good = (path / CHECKPOINT).read_bytes()
    real_save = torch.save

    def disk_full(obj, f, *a, **k):
        real_save(obj, f)  # a partial file exists when the disk fills
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(runfolder.torch, "save", disk_full)
    with RunFolder(tmp_path, "r", {"alpha": 0.0, "num_updates": 10}, resume=True) as rf:
        with pytest.raises(RunError) as err:
            rf.save_checkpoint({"k": 99})
    assert err.value.code == EXIT_IO and "No space left on device" in str(err.value)
    assert (path / CHECKPOINT).read_bytes() == good
    assert not list(path.rglob("*.tmp"))


def test_truncated_checkpoint_is_one_line_error(tmp_path):
    path = make_run(tmp_path)
    data = (path / CHECKPOINT).read_bytes()
    (path / CHECKPOINT).write_bytes(data[: len(data) // 2])
    rf = RunFolder(tmp_path, "r", {"alpha": 0.0, "num_updates": 10}, resume=True)
    with pytest.raises(RunError) as err:
        rf.load_checkpoint()
    assert err.value.code == EXIT_BAD_FILE and "\n" not in str(err.value) and "last.pt" in str(err.value)


def test_checkpoint_restores_every_rng(tmp_path):
    with RunFolder(tmp_path, "r", {}, resume=False) as rf:
        random.seed(1), np.random.seed(2), torch.manual_seed(3)
        rf.save_checkpoint({"k": 0})
        first = (random.random(), np.random.rand(), torch.rand(1).item())
        rf.load_checkpoint()
        again = (random.random(), np.random.rand(), torch.rand(1).item())
    assert first == again


def test_unwritable_output_directory(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    with pytest.raises(RunError) as err:
        with RunFolder(blocker / "runs", "r", {}, resume=False):
            pass
    assert err.value.code == EXIT_IO and "\n" not in str(err.value)
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        if os.access(ro, os.W_OK):
            pytest.skip("this user can write to a read-only folder (root); the file-in-the-way case above ran")
        with pytest.raises(RunError) as err:
            with RunFolder(ro, "r", {}, resume=False):
                pass
        assert err.value.code == EXIT_IO
    finally:
        ro.chmod(0o755)


def test_signals_set_a_flag_and_a_second_one_stops_at_once(tmp_path):
    previous = signal.getsignal(signal.SIGINT)
    with RunFolder(tmp_path, "r", {}, resume=False) as rf:
        rf.save_checkpoint({})
        os.kill(os.getpid(), signal.SIGTERM)
        assert rf.stop_requested and rf.signal_name == "SIGTERM"
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
    assert signal.getsignal(signal.SIGINT) is previous


def test_an_exception_after_a_checkpoint_marks_the_summary(tmp_path):
    with pytest.raises(KeyboardInterrupt):
        with RunFolder(tmp_path, "r", {}, resume=False) as rf:
            rf.save_checkpoint({})
            rf.write_summary({"status": "running", "updates_done": 3})
            raise KeyboardInterrupt
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert summary["status"] == "interrupted" and summary["updates_done"] == 3


def test_curve_images_and_quiet_progress(tmp_path, capsys):
    with RunFolder(tmp_path, "r", {}, resume=False) as rf:
        curve = rf.plot_curve([0, 20, 40], [0.1, float("nan"), 0.3], "update", "validation reward")
        grid = rf.save_images(torch.zeros(3, 3, 4, 4), "update_00000", nrow=2)
        bar = rf.progress(total=5)
        bar.update(1)
        bar.close()
    assert curve.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    from PIL import Image

    assert Image.open(grid).size == (2 * 6 + 2, 2 * 6 + 2)
    assert capsys.readouterr().err == ""  # stderr is not a terminal under pytest


@dataclass
class Toy:
    mode: Literal["a", "b"] = "a"
    maybe: Optional[Literal["x", "y"]] = None
    n: int = 1
    preset: Literal["small", "big"] = "small"


def test_closed_choices_are_one_line_errors():
    check_choices(Toy, ["--mode", "b", "--maybe=y"])
    with pytest.raises(RunError, match=r"^--mode 'bogus' is not one of a, b$"):
        check_choices(Toy, ["--mode", "bogus"])
    with pytest.raises(RunError, match=r"--maybe 'z' is not one of x, y"):
        check_choices(Toy, ["--maybe=z"])


@pytest.mark.parametrize(
    "status,code", [("finished", 0), ("paused", 0), ("nonfinite", EXIT_NONFINITE), ("interrupted", EXIT_INTERRUPTED)]
)
def test_cli_exit_codes_follow_the_status(status, code):
    with pytest.raises(SystemExit) as ex:
        cli(lambda args: {"status": status}, Toy, argv=[])
    assert ex.value.code == code


def test_cli_presets_and_errors(capsys):
    presets = {"small": Toy(n=1, preset="small"), "big": Toy(n=64, preset="big")}
    seen = []
    with pytest.raises(SystemExit) as ex:
        cli(
            lambda args: seen.append(args) or {"status": "finished"},
            Toy,
            presets,
            argv=["--preset", "big", "--mode", "b"],
        )
    assert ex.value.code == 0 and seen[0] == Toy(mode="b", n=64, preset="big")
    for argv, code in ((["--preset", "huge"], EXIT_BAD_INPUT), (["--mode", "c"], EXIT_BAD_INPUT)):
        with pytest.raises(SystemExit) as ex:
            cli(lambda args: {}, Toy, presets, argv=argv)
        err = capsys.readouterr().err
        assert ex.value.code == code and err.startswith("error: ") and err.count("\n") == 1

    def corrupt(args):
        raise RunError("checkpoint x is unreadable", EXIT_BAD_FILE)

    with pytest.raises(SystemExit) as ex:
        cli(corrupt, Toy, argv=[])
    assert ex.value.code == EXIT_BAD_FILE and capsys.readouterr().err == "error: checkpoint x is unreadable\n"


def test_track_sends_the_scalars_to_weights_and_biases_offline(tmp_path, monkeypatch):
    pytest.importorskip("wandb", reason="--track needs wandb (the track extra)")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")
    with RunFolder(tmp_path / "runs", "tracked", {"alpha": 0.5}, resume=False, track=True) as rf:
        rf.log({"update": 0, "reward": 0.25}, step=0)
        rf.log({"update": 1, "reward": 0.5}, step=1)
        assert rf._wandb is not None and rf._wandb.config["alpha"] == 0.5 and rf._wandb.name == "tracked"
    runs = list((tmp_path / "wandb").glob("offline-run-*"))
    assert len(runs) == 1 and list(runs[0].glob("*.wandb")), list((tmp_path / "wandb").rglob("*"))
