"""benchmarks/robot_study.sh (detached queues, status, packing) on a plan of shell one-liners, and
benchmarks/plot_robot_study.py on a small synthetic study folder."""

import json
import math
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
STUDY = ROOT / "benchmarks" / "robot_study.sh"
PLOT = ROOT / "benchmarks" / "plot_robot_study.py"
BLOCK = 983_040
ENV = {**os.environ, "PYTHON": sys.executable}  # the script's helpers run with this interpreter, not PATH's python3
KW = {"capture_output": True, "text": True, "timeout": 60}


def study(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(STUDY), *map(str, args)], capture_output=True, text=True, env=ENV, timeout=60)


def test_queues_run_in_order_survive_failures_and_pack_without_checkpoints(tmp_path):
    plan = tmp_path / "plan"
    plan.write_text(
        "# two queues\n\n"
        "gpu1 first echo dev=$CUDA_VISIBLE_DEVICES run=$RUN_DIR peer=$PEER_OUT; pwd\n"
        "gpu1 broken false\n"
        "gpu1 after mkdir -p $RUN_DIR/after/checkpoints && echo w > $RUN_DIR/after/checkpoints/last.pt"
        ' && echo w > $RUN_DIR/after/events.out.tfevents.1 && echo \'{"update": 7, "eval_return": 3.5}\''
        " > $RUN_DIR/after/metrics.jsonl\n"
        "  # an indented comment\n"
        'cpu slow sleep 1; echo "dev=[${CUDA_VISIBLE_DEVICES-unset}] $STUDY_PROBE"; exit 7\n'
    )
    d = tmp_path / "st"
    env = {**ENV, "STUDY_PROBE": "passed-through"}  # the caller's environment reaches the commands
    env.pop("CUDA_VISIBLE_DEVICES", None)
    r = subprocess.run(
        ["bash", str(STUDY), "start", str(d), str(plan)], capture_output=True, text=True, env=env, timeout=30
    )
    assert r.returncode == 0, r.stderr
    assert "queue gpu1" in r.stdout and "queue cpu" in r.stdout
    assert (d / "plan.txt").read_text() == plan.read_text() and "nproc" in (d / "machine.txt").read_text()
    r = study("wait", d, 20)
    assert "all queues done" in r.stdout, r.stdout
    codes = {n: (d / "done" / n).read_text().strip() for n in ("first", "broken", "after", "slow")}
    assert codes == {"first": "0", "broken": "1", "after": "0", "slow": "7"}
    assert all((d / "started" / n).exists() for n in codes)
    first = (d / "logs" / "first.log").read_text()
    assert f"dev=1 run={d}/runs peer={d}/peer" in first and str(ROOT) in first
    assert "dev=[unset] passed-through" in (d / "logs" / "slow.log").read_text()
    status = study("status", d).stdout.splitlines()
    assert len(status) == 4
    assert "exit 1" in status[1] and "exit 7" in status[3]
    assert "update 7" in status[2] and "eval 3.5" in status[2]
    assert study("start", d, plan).returncode == 2  # a DIR holding a study is refused

    dest = tmp_path / "dest"
    assert study("collect", d, dest).returncode == 0
    with tarfile.open(dest / "study.tar.gz") as tar:
        names = set(tar.getnames())
    assert {
        "st/plan.txt",
        "st/machine.txt",
        "st/logs/first.log",
        "st/done/slow",
        "st/runs/after/metrics.jsonl",
    } <= names
    assert not any("checkpoints" in n or "tfevents" in n for n in names)

    # larger than a part: numbered parts that join into the same archive
    r = subprocess.run(
        ["bash", str(STUDY), "collect", str(d), str(dest)],
        capture_output=True,
        text=True,
        env={**ENV, "STUDY_PART_BYTES": "300"},
        timeout=30,
    )
    assert r.returncode == 0, r.stderr
    parts = sorted(dest.glob("study.tar.gz.*"))
    assert len(parts) >= 2 and parts[0].name == "study.tar.gz.00" and not (dest / "study.tar.gz").exists()
    joined = tmp_path / "joined.tar.gz"
    joined.write_bytes(b"".join(p.read_bytes() for p in parts))
    assert all(p.stat().st_size <= 300 for p in parts)
    with tarfile.open(joined) as tar:
        assert set(tar.getnames()) == names


def write_run(runs: Path, name: str, args: dict, rows: list[dict], summary: dict | None) -> None:
    f = runs / name
    f.mkdir(parents=True)
    (f / "args.json").write_text(json.dumps(args))
    (f / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    if summary is not None:
        (f / "summary.json").write_text(json.dumps(summary))


FPO_ARGS = {
    "env_id": "AcrobotSwingup",
    "objective": "fpo",
    "backend": "playground",
    "alpha": 1.0,
    "num_envs": 2048,
    "num_steps": 480,
    "num_updates": 0,
    "total_timesteps": 60_000_000,
    "block_size": BLOCK,
}


def evals(values: dict[int, float]) -> list[dict]:
    rows = []
    for u in range(max(values) + 1):
        row = {"update": u, "global_step": u * BLOCK, "pg_loss": 0.1}
        if u in values:
            row["eval_return"] = values[u]
        rows.append(row)
    return rows


TOTALS = [30.0] + [1.0] * 10 + [2.0] * 9  # 20 blocks; the first is slow (compilation)


@pytest.fixture
def synthetic(tmp_path):
    d = tmp_path / "study"
    runs = d / "runs"
    fin = {"status": "finished", "updates_done": 61}
    write_run(
        runs,
        "AcrobotSwingup_ae1_s0",
        {**FPO_ARGS, "alpha_eps": 1.0, "seed": 0},
        evals({0: 2.0, 7: 5.0, 14: 4.0, 61: 3.0}),
        fin,
    )
    write_run(
        runs,
        "AcrobotSwingup_ae1_s1",
        {**FPO_ARGS, "alpha_eps": 1.0, "seed": 1},
        evals({0: 2.0, 7: 9.0, 14: 6.0, 61: 8.0}),
        fin,
    )
    write_run(
        runs,
        "AcrobotSwingup_ae0.5_s0",
        {**FPO_ARGS, "alpha_eps": 0.5, "seed": 0},
        evals({0: 2.0, 7: 10.0, 14: 12.0}) + [{"update": 15, "global_step": 15 * BLOCK, "eval_return": None}],
        {"status": "interrupted", "updates_done": 14},
    )  # a non-finite evaluation is logged as null
    # diverged in update 9 after its block-7 evaluation
    rows = evals({0: 2.0, 7: 20.0}) + [
        {"update": 8, "global_step": 8 * BLOCK, "pg_loss": 0.2},
        {"update": 9, "global_step": 9 * BLOCK, "nonfinite": True},
    ]
    write_run(
        runs,
        "AcrobotSwingup_ae0.5_s1",
        {**FPO_ARGS, "alpha_eps": 0.5, "seed": 1},
        rows,
        {"status": "nonfinite", "updates_done": 8},
    )
    (runs / "AcrobotSwingup_ae0.5_s1" / "metrics.jsonl").open("a").write('{"update": 9, "glo')  # a cut row
    (runs / "broken").mkdir()  # no args.json: skipped with a note
    (d / "peer").mkdir()
    (d / "logs").mkdir()
    official = {
        "eval0": 1.5,
        "evals": [{"block": 6, "reward": 4.0}, {"block": 13, "reward": 30.0}],
        "eval_end": 25.0,
        "iters": [{"i": i, "rollout_s": 0.2, "total_s": s} for i, s in enumerate(TOTALS)],
    }
    (d / "peer" / "fpo_peer_AcrobotSwingup_s0.json").write_text(json.dumps(official))
    (d / "logs" / "official_AcrobotSwingup_s1.log").write_text(
        "{'i': 0}\neval {'block': 6, 'reward': 3.25, 's': 1.0}\neval {'block': 13, 'reward': 7.5, 's': 1.0}\n"
        "eval {'block': 20, 'reward': nan, 's': 1.0}\n"
    )
    return d


def test_stop_signals_the_running_lines_and_starts_no_more(tmp_path):
    trainer = tmp_path / "trainer.py"  # stands in for a trainer: on SIGTERM it saves and exits 0
    trainer.write_text(
        "import signal, sys, time\n"
        "def stop(*_):\n"
        "    open(sys.argv[1], 'w').write('saved'); sys.exit(0)\n"
        "signal.signal(signal.SIGTERM, stop)\n"
        "open(sys.argv[1] + '.up', 'w').write('up')\n"
        "time.sleep(60)\n"
    )
    saved = tmp_path / "saved"
    plan = tmp_path / "plan"
    plan.write_text(
        f"gpu0 train export X=1; {sys.executable} {trainer} {saved}\n"
        f"gpu0 next touch {tmp_path / 'next_ran'}\n"
        "cpu other sleep 60\n"
    )
    d = tmp_path / "st"
    assert study("start", d, plan).returncode == 0
    for _ in range(100):  # until the stand-in trainer has installed its handler
        if Path(f"{saved}.up").exists():
            break
        time.sleep(0.1)
    r = study("stop", d, 20)
    assert "all queues done" in r.stdout, r.stdout
    assert saved.read_text() == "saved"
    assert (d / "done" / "train").read_text().strip() == "0"
    assert (d / "done" / "other").read_text().strip() == "143"  # sleep, killed by the signal
    assert not (tmp_path / "next_ran").exists() and not (d / "started" / "next").exists()
    assert "skipped" in [line for line in r.stdout.splitlines() if " next " in line][0]
    assert study("stop", d).returncode == 2  # SECONDS is required


def test_study_tables_and_pngs(synthetic, tmp_path):
    out = tmp_path / "out"
    r = subprocess.run(
        [sys.executable, str(PLOT), str(synthetic), "--out", str(out)], capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, r.stderr
    assert "note:" in r.stdout  # the folder without args.json and the cut row
    for png in ("vs_official_AcrobotSwingup.png", "alpha_study_AcrobotSwingup.png"):
        assert (out / png).stat().st_size > 1000
    s = json.loads((out / "study.json").read_text())
    assert len(s["groups"]) == 1
    g = s["groups"][0]
    assert (g["task"], g["objective"], g["backend"], g["block_budget"]) == ("AcrobotSwingup", "fpo", "playground", 61)
    runs = {r["run"]: r for r in g["runs"]}
    assert set(runs) == {
        "AcrobotSwingup_ae1_s0",
        "AcrobotSwingup_ae1_s1",
        "AcrobotSwingup_ae0.5_s0",
        "AcrobotSwingup_ae0.5_s1",
    }
    assert (runs["AcrobotSwingup_ae1_s0"]["peak"], runs["AcrobotSwingup_ae1_s0"]["peak_block"]) == (5.0, 7)
    assert runs["AcrobotSwingup_ae1_s1"]["final_eval"] == 8.0
    assert (runs["AcrobotSwingup_ae0.5_s0"]["updates_done"], runs["AcrobotSwingup_ae0.5_s0"]["updates_asked"]) == (
        14,
        61,
    )
    assert runs["AcrobotSwingup_ae0.5_s0"]["status"] == "interrupted"
    div = runs["AcrobotSwingup_ae0.5_s1"]
    assert div["status"] == "nonfinite" and div["events"] == ["nonfinite at block 9 (update 9)"] and div["peak"] == 20.0
    assert runs["AcrobotSwingup_ae1_s0"]["events"] == []
    alphas = {a["alpha"]: a for a in g["by_alpha"]}
    assert alphas[1.0]["n"] == 2 and alphas[1.0]["peak_mean"] == pytest.approx(7.0)
    assert alphas[1.0]["peak_std"] == pytest.approx(np.std([5.0, 9.0])) == pytest.approx(2.0)
    assert alphas[0.5]["peak_mean"] == pytest.approx(16.0) and alphas[0.5]["peak_std"] == pytest.approx(4.0)
    assert (alphas[1.0]["paper"], alphas[0.5]["paper"]) == (163.6, 193.5)
    assert (alphas[1.0]["updates_done"], alphas[0.5]["updates_done"]) == ([61, 61], [8, 14])  # unequal budgets show
    assert g["paper_note"] == "paper: 244-block cohort; here: 61 blocks"
    off = {o["seed"]: o for o in g["official"]}
    assert (off[0]["peak"], off[0]["peak_block"], off[0]["blocks"], off[0]["final_eval"]) == (30.0, 13, 20, 25.0)
    assert off[0]["s_per_block"] == pytest.approx(1.0) != np.median(TOTALS)  # the first block left out
    assert (off[1]["peak"], off[1]["status"]) == (7.5, "unfinished (log)")
    assert off[1]["events"] == ["non-finite evaluation at block 20"] and off[0]["events"] == []
    assert runs["AcrobotSwingup_ae0.5_s0"]["events"] == ["non-finite evaluation at block 15 (update 15)"]
    assert runs["AcrobotSwingup_ae0.5_s0"]["peak"] == 12.0
    md = (out / "study.md").read_text()
    assert "paper: 244-block cohort; here: 61 blocks" in md and "nonfinite at block 9" in md
    assert "| 0.5 | 2 | 8-14 | 16 +- 4 |" in md and "| 1.0 | 2 | 61 | 7 +- 2 |" in md
    assert all(math.isfinite(a["peak_mean"]) for a in g["by_alpha"])


def test_fpopp_and_envpool_runs_get_their_own_plots(tmp_path):
    d = tmp_path / "study"
    common = {"num_updates": 0, "block_size": BLOCK, "seed": 0, "alpha_eps": 1.0}
    write_run(
        d / "runs",
        "CartpoleSwingup-v1_fpopp_a0.5_s0",
        {
            **common,
            "env_id": "CartpoleSwingup-v1",
            "objective": "fpopp",
            "backend": "envpool",
            "alpha": 0.5,
            "num_envs": 1024,
            "num_steps": 32,
            "total_timesteps": 150 * 1024 * 32,
        },
        [
            {"update": 0, "global_step": 0, "eval_return": 1.0},
            {"update": 1, "global_step": 32768, "episodic_return": 1.0},
            {"update": 2, "global_step": 2 * 32768, "episodic_return": 3.0},
            {"update": 15, "global_step": 15 * 32768, "eval_return": 4.0},
        ],
        None,
    )
    write_run(
        d / "runs",
        "envpool_WalkerRun-v1_ae1_s0",
        {
            **common,
            "env_id": "WalkerRun-v1",
            "objective": "fpo",
            "backend": "auto",
            "alpha": 1.0,
            "num_envs": 2048,
            "num_steps": 480,
            "total_timesteps": 60_000_000,
        },
        evals({0: 1.0, 7: 2.0}),
        {"status": "running", "updates_done": 7},
    )
    write_run(d / "runs", "WalkerRun_warp_s0", {**FPO_ARGS, **common, "physics": "warp"}, evals({0: 3.0}), None)
    out = tmp_path / "out"
    r = subprocess.run(
        [sys.executable, str(PLOT), str(d), "--out", str(out)], capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, r.stderr
    assert (out / "fpopp_CartpoleSwingup-v1.png").exists() and (out / "envpool_WalkerRun-v1.png").exists()
    assert (out / "fpopp_CartpoleSwingup-v1_train.png").exists()  # the training return beside the evaluation
    assert "training return, updates 1-2" in (out / "study.md").read_text()
    assert "| 0.5 | 1 | 2 +- 0 |" in (out / "study.md").read_text()  # mean of the returns up to update 2
    groups = {
        (g["task"], g["objective"], g["backend"]): g for g in json.loads((out / "study.json").read_text())["groups"]
    }
    pp = groups[("CartpoleSwingup-v1", "fpopp", "envpool")]["runs"][0]
    assert (pp["alpha"], pp["updates_asked"], pp["status"], pp["peak"]) == (0.5, 150, "no summary", 4.0)
    assert groups[("WalkerRun-v1", "fpo", "envpool")]["runs"][0]["updates_done"] == 7
    warp = groups[("AcrobotSwingup", "fpo", "playground-warp")]  # MuJoCo Warp runs apart from MJX's
    assert [r["peak"] for r in warp["runs"]] == [3.0] and (out / "playground-warp_AcrobotSwingup.png").exists()


def test_legged_runs_get_their_tracking_errors_plotted_and_tabled(tmp_path):
    d = tmp_path / "study"
    args = {
        "env_id": "SpotFlatTerrainJoystick",
        "objective": "fpopp",
        "backend": "playground",
        "alpha": 1.0,
        "seed": 3,
        "num_envs": 4096,
        "num_steps": 24,
        "num_updates": 0,
        "total_timesteps": 1500 * 4096 * 24,
    }
    track = {0: (35.0, 0.64, 0.43), 25: (34.0, 0.5, 0.3), 50: (46.5, 0.15, 0.11)}
    rows = [
        {"update": u, "global_step": u * 98304, "eval_return": ev, "eval_track_lin": lin, "eval_track_yaw": yaw}
        for u, (ev, lin, yaw) in track.items()
    ]
    rows[-1] |= {"eval_track_len": 987.6, "eval_return_random": 40.123, "episodic_length": 912.4}
    rows[-1] |= {"episodes": 50, "episodic_return": 5.0}
    # training rollouts 41-49: u episodes of 2u steps and return u / 10; none ended in update 45
    rollouts = [dict(update=u, episodes=u, episodic_length=2 * u, episodic_return=u / 10) for u in range(41, 50)]
    rollouts[4] = {"update": 45, "episodes": 0}
    rows[-1:-1] = rollouts
    write_run(d / "runs", "spot_a1_s3", args, rows, None)
    write_run(d / "runs", "cartpole", {**args, "env_id": "CartpoleSwingup-v1"}, evals({0: 1.0, 7: 2.0}), None)
    out, kw = tmp_path / "out", {"capture_output": True, "text": True, "timeout": 120}
    r = subprocess.run([sys.executable, str(PLOT), str(d), "--out", str(out)], **kw)
    assert r.returncode == 0, r.stderr
    md = (out / "study.md").read_text()
    # every 250 updates (update 0) and the last evaluation; values not logged show as "-"
    assert "| spot_a1_s3 | 0 | 35.00 | 0.640 | 0.430 | - | - | - | - |" in md
    assert "| spot_a1_s3 | 50 | 46.50 | 0.150 | 0.110 | 988 | 40.12 | - | 912 |" in md
    assert "| spot_a1_s3 | 25 |" not in md
    # the last update's training rollouts, means over updates 41-50 (length and return where episodes ended)
    assert "| spot_a1_s3 | 50 | 41 | 181.4 | 4.556 |" in md
    assert (out / "fpopp_SpotFlatTerrainJoystick_track.png").exists()
    assert md.startswith(f"# Robot study: {d}\n")
    r = subprocess.run(
        [sys.executable, str(PLOT), str(d), "--out", str(out), "--table-every", "25", "--title", "Spot, seed 3"], **kw
    )
    assert r.returncode == 0, r.stderr
    md = (out / "study.md").read_text()
    assert "| spot_a1_s3 | 25 | 34.00 | 0.500 | 0.300 | - |" in md and md.startswith("# Spot, seed 3\n")
    r = subprocess.run([sys.executable, str(PLOT), str(d), "--out", str(out), "--table-every", "0"], **kw)
    assert r.returncode != 0 and "--table-every 0 must be a positive" in r.stderr
    assert not (out / "fpopp_CartpoleSwingup-v1_track.png").exists()  # no tracking errors logged: no plot


def test_plot_refuses_a_folder_that_is_not_a_study(tmp_path):
    r = subprocess.run([sys.executable, str(PLOT), str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "neither runs/ nor peer/" in r.stderr


@pytest.mark.slow
def test_runs_collected_with_checkpoints_resume_on_another_machine(tmp_path):
    # A run stopped at update 2, collected with its checkpoint (CHECKPOINTS=1), restored into another study folder
    # and resumed there: with environment restarts at the checkpoints (every 2 updates) it logs exactly what the
    # uninterrupted run logs, although its checkpoint travelled without the environments' state.
    sys.path.insert(0, str(ROOT))
    sys.path.insert(0, str(ROOT / "tests"))
    from dataclasses import replace

    import torch
    from test_robot_fpo import strip_time, tiny_args

    import robot_fpo as R
    from fpo_utils.runfolder import read_jsonl

    full = tiny_args(tmp_path / "a", num_updates=4, restart_every=2)
    R.main(full)
    d = tmp_path / "st"
    (d / "runs").mkdir(parents=True)
    (d / "plan.txt").write_text("cpu run true\n")
    part = tiny_args(d / "runs", num_updates=2, restart_every=2)
    R.main(part)
    ck = d / "runs" / "run" / "checkpoints" / "last.pt"
    payload = torch.load(ck, weights_only=False)  # as a Playground run's: its simulators' state, which cannot travel
    torch.save({**payload, "envs": {"sim": {"arrays": [torch.zeros(50_000)]}, "obs_in": None, "ret_acc": None}}, ck)
    r = subprocess.run(
        ["bash", str(STUDY), "collect", str(d), str(tmp_path / "dest")],
        capture_output=True,
        text=True,
        env={**ENV, "CHECKPOINTS": "1", "STUDY_PART_BYTES": "20000"},
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    assert len(list((tmp_path / "dest").glob("study.tar.gz.*"))) >= 2  # parts join on restore
    other = tmp_path / "other"
    r = study("restore", tmp_path / "dest", other)
    assert r.returncode == 0 and "unpack: 1 run(s): run" in r.stdout, r.stderr
    ckpt = torch.load(other / "runs" / "run" / "checkpoints" / "last.pt", weights_only=False)
    assert ckpt["envs"] is None and ckpt["update"] == 2
    assert study("restore", tmp_path / "dest", other).returncode != 0  # never over an existing run folder
    summary = R.main(replace(part, runs_dir=str(other / "runs"), num_updates=4, resume=True))
    assert summary["status"] == "finished" and summary["updates_done"] == 4
    got, want = (read_jsonl(p / "run" / "metrics.jsonl") for p in (other / "runs", tmp_path / "a"))
    assert [row["update"] for row in got] == [0, 1, 2, 3, 4]
    assert strip_time(got) == strip_time(want)


def test_collect_fails_when_the_checkpoints_asked_for_cannot_be_packed(tmp_path):
    # CHECKPOINTS=1 with an interpreter that cannot pack them (here one that always fails): the runs are still
    # collected, but the call exits non-zero and says why, instead of handing back a study without checkpoints.
    d = tmp_path / "st"
    (d / "runs" / "run" / "checkpoints").mkdir(parents=True)
    (d / "runs" / "run" / "metrics.jsonl").write_text('{"update": 0}\n')
    (d / "runs" / "run" / "checkpoints" / "last.pt").write_bytes(b"x")
    (d / "plan.txt").write_text("cpu run true\n")
    env = {**ENV, "CHECKPOINTS": "1", "PYTHON": "false"}
    r = subprocess.run(["bash", str(STUDY), "collect", str(d), str(tmp_path / "dest")], **KW, env=env)
    assert r.returncode == 4 and "packing the checkpoints with false failed" in r.stderr
    with tarfile.open(tmp_path / "dest" / "study.tar.gz") as tar:
        assert "st/runs/run/metrics.jsonl" in tar.getnames()
    r = subprocess.run(["bash", str(STUDY), "collect", str(d), str(tmp_path / "dest")], **KW, env=ENV)
    assert r.returncode == 0, r.stderr  # without CHECKPOINTS=1 nothing is asked of the interpreter


def test_restore_of_a_missing_folder_says_how_to_fetch_it(tmp_path):
    r = study("restore", ROOT / "benchmarks" / "robot_results" / "legged" / "data" / "partNONE", tmp_path / "x")
    assert r.returncode == 2 and "results_data.py fetch" in r.stderr


def plan_commands(script: str):
    """(plan file, run name, argv) of every call of ``script`` in the plan lines of benchmarks/."""
    import shlex

    def ends(t: str) -> bool:  # a shell operator or redirection after the call's arguments
        return t in (";", "&&", "||", "|", "&") or t.startswith((">", "<", "2>")) or t.endswith(")")

    for plan in sorted((ROOT / "benchmarks").rglob("plan*.txt")):
        for line in plan.read_text().splitlines():
            if not line.strip() or line.lstrip().startswith("#") or f"{script} " not in line:
                continue
            _, name, command = line.split(None, 2)
            tokens = shlex.split(command.replace(";", " ; ").replace("&", " & ").replace(" &  & ", " && "))
            for i, t in enumerate(tokens):
                if t == script or t.endswith("/" + script):
                    argv = []
                    for a in tokens[i + 1 :]:
                        if ends(a):
                            break
                        argv.append(a)
                    yield plan.relative_to(ROOT), name, argv


def test_every_plan_line_of_the_update_benchmark_parses():
    pytest.importorskip("triton", reason="bench_robot_update.py imports the Triton kernels")
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import bench_robot_update
    import torch._inductor.config as config

    lines = list(plan_commands("bench_robot_update.py"))
    assert any("--inductor" in argv for _, _, argv in lines)
    for plan, name, argv in lines:
        a = bench_robot_update.build_parser().parse_args([os.path.expandvars(x) for x in argv])
        saved = config.get_config_copy()
        try:  # each KEY=VALUE names a setting (ValueError otherwise)
            for item in a.inductor:
                bench_robot_update.set_inductor(item)
        finally:
            config.load_config(saved)
        assert a.preset in ("fpo", "fpopp-locomotion"), f"{plan} {name}"


@pytest.mark.parametrize("script", ["robot_fpo_fast.py", "robot_fpo.py", "bench_robot_sps.py", "halving.py"])
def test_every_plan_line_parses_with_its_script(script, monkeypatch):
    # A flag a script does not take (or takes in another form) fails a line on the GPU machine, where the plan's
    # other lines run on without it; here it fails at once.
    sys.path.insert(0, str(ROOT))
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import tyro

    import robot_fpo as R
    import robot_fpo_fast as F
    from fpo_utils.runfolder import cli

    monkeypatch.setenv("RUN_DIR", "/tmp/runs")
    lines = list(plan_commands(script))
    assert lines or script == "robot_fpo.py"
    for plan, name, argv in lines:
        argv = [os.path.expandvars(a) for a in argv]
        if script == "halving.py":  # the grid or tournament it would run, not run
            import halving

            seen = []
            for fn in ("run_grid", "run_tournament"):
                monkeypatch.setattr(halving, fn, lambda cmd, seen=seen: seen.append(cmd) or {})
            for fn in ("print_grid", "print_tournament"):
                monkeypatch.setattr(halving, fn, lambda result: None)
            halving.main(argv)
            assert len(seen) == 1, f"{plan} {name}: {argv}"
            continue
        if script == "bench_robot_sps.py":
            import bench_robot_sps

            tyro.cli(bench_robot_sps.BenchArgs, args=argv)  # SystemExit on a flag it does not take
            continue
        trainer = F if script == "robot_fpo_fast.py" else R
        seen = []
        with pytest.raises(SystemExit) as done:
            cli(lambda a: seen.append(a) or {"status": "finished"}, trainer.Args, trainer.PRESETS, argv=argv)
        assert done.value.code == 0 and len(seen) == 1, f"{plan} {name}: {argv}"


@pytest.mark.slow
def test_a_ppo_run_folder_travels_whole_beside_the_runs_with_checkpoints(tmp_path):
    # benchmarks/playground_ppo.py resumes from its run folder's params.npz; restore copies such a folder as it is,
    # and a folder with neither params.npz nor a checkpoint stays behind.
    d = tmp_path / "st"
    (d / "plan.txt").parent.mkdir(parents=True)
    (d / "plan.txt").write_text("gpu2 g1_ppo_s0 true\n")
    ppo, bare = d / "runs" / "g1_ppo_s0", d / "runs" / "nothing_to_resume"
    for run in (ppo, bare):
        run.mkdir(parents=True)
        (run / "args.json").write_text("{}")
        (run / "metrics.jsonl").write_text('{"env_steps": 0, "eval_return": 1.5}\n')
    (ppo / "params.npz").write_bytes(bytes(range(256)) * 40)
    r = subprocess.run(
        ["bash", str(STUDY), "collect", str(d), str(tmp_path / "dest")], env={**ENV, "CHECKPOINTS": "1"}, **KW
    )
    assert r.returncode == 0, r.stderr
    r = study("restore", tmp_path / "dest", tmp_path / "other")
    assert r.returncode == 0 and "unpack: 1 run(s): g1_ppo_s0" in r.stdout, r.stderr
    got = tmp_path / "other" / "runs"
    assert sorted(p.name for p in got.iterdir()) == ["g1_ppo_s0"]
    assert (got / "g1_ppo_s0" / "params.npz").read_bytes() == (ppo / "params.npz").read_bytes()
    assert (got / "g1_ppo_s0" / "metrics.jsonl").read_text() == (ppo / "metrics.jsonl").read_text()
    assert not (got / "g1_ppo_s0" / "checkpoints").exists()


def test_every_plan_line_of_playground_ppo_parses_and_names_a_task_with_settings():
    pytest.importorskip("mujoco_playground", reason="the playground extra is not installed")
    sys.path.insert(0, str(ROOT))
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import playground_ppo

    lines = list(plan_commands("playground_ppo.py"))
    assert lines, "no plan line runs benchmarks/playground_ppo.py"
    for plan, name, argv in lines:
        a = playground_ppo.build_parser().parse_args(argv)
        assert a.resume and a.run_dir.name == name, f"{plan} {name}: resumes into a folder named as the run"
        playground_ppo.ppo_config(a.env_id, a.set)  # RunError for an unknown task or setting
