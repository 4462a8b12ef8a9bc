"""halving.py's arms as Ray tasks (real Ray, CPU, tiny runs): a tournament on a local Ray and on a
simulated two-node cluster gives the in-process result; a worker killed during a rung is retried
from the arm's checkpoint with no change to the result; a worker that keeps dying marks its arm
failed; a robot grid writes the per-run peak table."""

import json
import math
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

ray = pytest.importorskip("ray")

from jsonl_records import read_jsonl  # noqa: E402
from test_robot_fpo import TINY_ROBOT  # noqa: E402

import halving  # noqa: E402
import robot_fpo_fast  # noqa: E402  (halving trains the robot arms with the fast variant)

RUNGS = (2, 4, 8)
# robot arms need robot_fpo.py on the shared run folder (runs_dir, checkpoints/last.pt, env_threads)
WORKER_ENV = {"env_vars": {"PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}}


def tournament(train, out_dir, **kw):
    spec = halving.CifarTournament(rungs=RUNGS, out_dir=str(out_dir), name="t", threads=1, train=train, **kw)
    return halving.run_tournament(spec)


@pytest.fixture(scope="module")
def reference(tiny_train, tmp_path_factory):
    """The tournament run one arm after another in this process."""
    res = tournament(tiny_train, tmp_path_factory.mktemp("in_process"), ray=False)
    assert res["run_info"]["executor"] == "in-process" and not res["failures"]
    return res


def assert_same_result(res, ref):
    assert res["rounds"] == ref["rounds"]  # scores, rankings and eliminations at every rung
    assert res["cost"] == ref["cost"]
    assert res["winner"] == ref["winner"] and res["winner_peak"] == ref["winner_peak"]
    for a, arm in ref["arms"].items():
        assert res["arms"][a]["peak"] == arm["peak"]
        assert [r["trained"] for r in res["arms"][a]["replicates"]] == [r["trained"] for r in arm["replicates"]]
    assert res["failures"] == [] and res["status"] == "finished"


def pid_lines(folder):
    """{segment: [(host, pid, node)]} from the pid files the segments wrote."""
    return {
        p.name: [tuple(line.split()) for line in p.read_text().splitlines()]
        for p in sorted((folder / "workers").iterdir())
    }


class Killer(threading.Thread):
    """Kill (SIGKILL) the worker process of each attempt of the segments whose pid file ends with
    `suffix`, as soon as the attempt has written its line, up to `times` kills."""

    def __init__(self, folder, suffix, times=1):
        super().__init__(daemon=True)
        self.folder, self.suffix, self.times = Path(folder), suffix, times
        self.killed, self.stop = [], threading.Event()

    def run(self):
        while not self.stop.is_set() and len(self.killed) < self.times:
            for p in (self.folder / "workers").glob(f"*{self.suffix}"):
                for line in p.read_text().splitlines(keepends=True):
                    pid = int(line.split()[1])
                    if line.endswith("\n") and pid not in self.killed and len(self.killed) < self.times:
                        os.kill(pid, signal.SIGKILL)
                        self.killed.append(pid)
            time.sleep(0.02)


@pytest.fixture(scope="module")
def local_ray():
    ray.shutdown()
    ray.init(num_cpus=2, include_dashboard=False, runtime_env=WORKER_ENV)
    yield
    ray.shutdown()


@pytest.mark.slow
def test_tournament_on_a_local_ray_equals_the_in_process_run(local_ray, reference, tiny_train, tmp_path):
    res = tournament(tiny_train, tmp_path)
    assert res["run_info"]["executor"] == "ray" and res["run_info"]["num_cpus"] == 1
    assert_same_result(res, reference)
    # one segment per arm and rung, each run by a Ray worker (not this process)
    segments = pid_lines(tmp_path / "t")
    assert len(segments) == 4 + 2 + 1
    assert all(len(v) == 1 and int(v[0][1]) != os.getpid() for v in segments.values())


@pytest.mark.slow
def test_a_killed_worker_is_retried_from_the_checkpoint_and_the_result_is_unchanged(
    local_ray, reference, tiny_train, tmp_path
):
    killer = Killer(tmp_path / "t", suffix=f"__to{RUNGS[-1]}")  # the winner's segment from rung 4 to 8
    killer.start()
    try:
        res = tournament(tiny_train, tmp_path, max_retries=2)
    finally:
        killer.stop.set()
        killer.join()
    assert len(killer.killed) == 1
    (attempts,) = [v for k, v in pid_lines(tmp_path / "t").items() if k.endswith(f"__to{RUNGS[-1]}")]
    assert [int(a[1]) for a in attempts][0] == killer.killed[0] and len(attempts) == 2
    assert_same_result(res, reference)
    winner = Path(res["arms"][res["winner"]]["replicates"][0]["run"])
    assert json.loads((winner / "summary.json").read_text())["updates_done"] == RUNGS[-1]
    # the resumed arm's metrics hold each validation node once, as an uninterrupted run's do
    vals = [r["update"] for r in read_jsonl(winner / "metrics.jsonl") if r.get("val_reward") is not None]
    assert vals == [0, 2, 4, 6, 8]


@pytest.mark.slow
def test_an_arm_whose_worker_keeps_dying_is_marked_failed(local_ray, tiny_train, tmp_path):
    spec = halving.CifarTournament(
        alphas=(1.0, -1.0), rungs=(2, 4), out_dir=str(tmp_path), name="d", threads=1, max_retries=1, train=tiny_train
    )
    killer = Killer(tmp_path / "d", suffix="alpha+1__seed20260727__to2", times=2)  # both attempts
    killer.start()
    try:
        res = halving.run_tournament(spec)
    finally:
        killer.stop.set()
        killer.join()
    assert len(killer.killed) == 2
    first = res["rounds"][0]
    assert math.isnan(first["scores"]["1"]) and first["kept"] == ["-1"] and res["winner"] == "-1"
    reason = first["failed"]["alpha+1__seed20260727"]
    assert "retries" in reason and res["failures"][0]["alpha"] == "1" and res["failures"][0]["reason"] == reason
    assert res["status"] == "finished" and res["arms"]["-1"]["replicates"][0]["trained"] == 4


@pytest.mark.slow
def test_robot_grid_on_a_local_ray(local_ray, tmp_path):
    train = replace(robot_fpo_fast.Args(), **{**TINY_ROBOT, "eval_every": 8}, total_timesteps=2048, env_threads=1)
    spec = halving.RobotGrid(alphas=(1.0, 0.5), seeds=(3, 4), out_dir=str(tmp_path), name="g", train=train)
    res = halving.run_grid(spec)
    assert res["run_info"]["executor"] == "ray" and res["run_info"]["num_cpus"] == 1
    assert (
        res["failures"] == []
        and len(res["runs"]) == 4
        and res["cost"] == {"trained": 4 * 16, "full_run": 16, "C": 4.0, "runs": 4}
    )
    for r in res["runs"]:
        args = json.loads((Path(r["run"]) / "args.json").read_text())
        assert (args["alpha_eps"], args["seed"]) == (float(r["alpha"]), r["seed"]) and r["trained"] == 16
        evals = [
            row["eval_return"]
            for row in read_jsonl(Path(r["run"]) / "metrics.jsonl")
            if row.get("eval_return") is not None
        ]
        assert len(evals) == 3 and r["peak"] == max(evals)  # eq:peak over the evaluations at 0, 8, 16
    for row in res["table"]:
        peaks = [r["peak"] for r in res["runs"] if r["alpha"] == row["alpha"]]
        assert row["n"] == 2 and row["mean"] == pytest.approx(np.mean(peaks))
        assert row["sd"] == pytest.approx(np.std(peaks, ddof=1))
    md = (tmp_path / "g/grid.md").read_text()
    assert md.count("| InvertedPendulum-v5 |") == 2 and f"{res['table'][0]['mean']:.6f}" in md
    assert json.loads((tmp_path / "g/grid.json").read_text()) == json.loads(json.dumps(res))
    again = halving.run_grid(spec)  # every run has ended: nothing to train, the same table
    assert again["table"] == res["table"]


@pytest.mark.slow
def test_the_command_line_joins_a_running_ray_through_ray_address(local_ray, tiny_train, tmp_path):
    t = tiny_train
    flags = [
        "--train.model",
        t.model,
        "--train.reward",
        t.reward,
        "--train.device",
        "cpu",
        "--train.batch-size",
        "4",
        "--train.group-size",
        "2",
        "--train.mc-draws",
        "2",
        "--train.sample-steps",
        "2",
        "--train.val-every",
        "2",
        "--train.val-banks",
        "1",
        "--train.val-bank-size",
        "4",
        "--train.calib-bank-size",
        "8",
        "--train.fit-batch-size",
        "4",
        "--train.num-updates",
        "2",
        "--train.no-verbose",
        "--train.no-save-samples",
    ]
    address = ray.get_runtime_context().gcs_address
    cmd = [
        sys.executable,
        str(ROOT / "halving.py"),
        "cifar-grid",
        "--alphas",
        "0",
        "1",
        "--seeds",
        "1",
        "--threads",
        "1",
        "--out-dir",
        str(tmp_path),
        "--name",
        "g",
        "--ray-address",
        address,
        *flags,
    ]
    proc = subprocess.run(
        cmd, cwd=tmp_path, capture_output=True, text=True, timeout=300, env=dict(os.environ, PYTHONUNBUFFERED="1")
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    res = json.loads((tmp_path / "g/grid.json").read_text())
    assert res["run_info"]["executor"] == "ray" and [r["status"] for r in res["runs"]] == ["finished", "finished"]
    assert "| red-patch | 1 | 1 |" in proc.stdout and (tmp_path / "g/grid.md").read_text() in proc.stdout + "\n"
    assert ray.is_initialized()  # the command left the Ray it joined running


@pytest.mark.slow
def test_tournament_on_a_two_node_cluster_equals_the_in_process_run(reference, tiny_train, tmp_path):
    from ray.cluster_utils import Cluster

    ray.shutdown()
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    try:
        cluster.add_node(num_cpus=1)
        ray.init(address=cluster.address, runtime_env=WORKER_ENV)
        res = tournament(tiny_train, tmp_path)
        assert res["run_info"]["nodes"] == 2
        assert_same_result(res, reference)
        nodes = {line[2] for lines in pid_lines(tmp_path / "t").values() for line in lines}
        assert len(nodes) == 2  # the segments ran on both nodes
    finally:
        ray.shutdown()
        cluster.shutdown()
