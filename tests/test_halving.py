"""Successive halving (halving.py; the rule and the replay in fpo_utils/replay.py, the grid tables in
fpo_utils/grids.py, the arms' runner in fpo_utils/arms.py): the rule, tiny live tournaments on the CPU,
and the replay against selection probabilities and costs computed by hand."""

import json
import math
import os
import random
import subprocess
import sys
from dataclasses import replace
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from jsonl_records import read_jsonl, strip_times  # noqa: E402
from test_robot_fpo import TINY_ROBOT  # noqa: E402

import cifar_fpo  # noqa: E402
import halving  # noqa: E402
import robot_fpo_fast  # noqa: E402  (halving trains the robot arms with the fast variant)
from fpo_utils import arms, grids  # noqa: E402
from fpo_utils import replay as R  # noqa: E402

RUNGS = (2, 4, 8)


def run_cli(args, cwd, check=True):
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    proc = subprocess.run(
        [sys.executable, str(ROOT / "halving.py"), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"halving.py failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


# ------------------------------------------------------------------------------------------------
# the rule
# ------------------------------------------------------------------------------------------------
def test_help_lists_the_commands(tmp_path):
    out = run_cli(["--help"], cwd=tmp_path).stdout
    for cmd in ("cifar", "robot", "cifar-grid", "robot-grid", "replay", "curves"):
        assert cmd in out


def imported_by(module: str) -> set:
    """The modules a fresh interpreter holds after `import module` (run from the repository root)."""
    code = f"import json, sys; import {module}; print(json.dumps(sorted(sys.modules)))"
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return set(json.loads(proc.stdout))


@pytest.mark.parametrize("module", ["fpo_utils.replay", "fpo_utils.grids"])
def test_replay_and_grid_tables_import_with_numpy_alone(module):
    loaded = imported_by(module)
    assert module in loaded and "numpy" in loaded
    assert not loaded & {"torch", "cifar_fpo", "cifar_fpo_pack", "robot_fpo", "robot_fpo_fast", "halving"}


def test_the_arms_runner_imports_no_trainer_and_no_tool():
    loaded = imported_by("fpo_utils.arms")
    assert "fpo_utils.arms" in loaded
    assert not loaded & {"cifar_fpo", "cifar_fpo_pack", "robot_fpo", "robot_fpo_fast", "halving", "diagnostics"}


def test_keep_half_rounded_up_and_rung_schedules():
    assert [R.keep_count(k) for k in (1, 2, 3, 4, 5, 11)] == [1, 1, 2, 2, 3, 6]
    assert R.halving_rungs(200, 800) == [200, 400, 800]  # app:search-settings
    assert R.halving_rungs(100, 1000) == [100, 200, 400, 800, 1000]  # 2^i N, then the full budget
    assert R.cut_fractions(0.2) == pytest.approx([0.2, 0.4, 0.8])
    assert R.cut_fractions(0.25) == [0.25, 0.5]  # 100% is not a cut
    assert R.cut_fractions(0.5) == [0.5]
    assert R.cut_fractions(None) == []
    with pytest.raises(ValueError, match="first_cut"):
        R.cut_fractions(1.5)


def test_ranking_ties_favour_the_smaller_exponent_and_failures_go_last():
    scores = {1.0: 0.5, -1.0: 0.5, 0.0: 0.7, -2.0: float("nan"), 0.5: 0.5}
    assert R.rank_candidates(scores) == [0.0, -1.0, 0.5, 1.0, -2.0]


# ------------------------------------------------------------------------------------------------
# live CIFAR tournaments on a tiny model
# ------------------------------------------------------------------------------------------------
def tournament(train, out_dir, **kw):
    spec = halving.CifarTournament(rungs=RUNGS, out_dir=str(out_dir), name="t", ray=False, threads=1, train=train, **kw)
    return halving.run_tournament(spec)


@pytest.fixture(scope="module")
def tour1(tiny_train, tmp_path_factory):
    out = tmp_path_factory.mktemp("tour1")
    return tournament(tiny_train, out), out / "t"


@pytest.mark.slow
def test_cifar_tournament_costs_two_full_runs(tour1):
    res, folder = tour1
    assert json.loads((folder / "tournament.json").read_text()) == json.loads(json.dumps(res))
    cost = res["cost"]
    # C_SH4 = (4*200 + 2*(400-200) + (800-400))/800 = 2 (app:halving), here with rungs 2/4/8
    assert cost["trained"] == 4 * 2 + 2 * (4 - 2) + (8 - 4) == 16
    assert cost["full_run"] == 8
    assert cost["C"] == 2.0 and cost["exhaustive"] == 4.0 and cost["fraction"] == 0.5
    # every arm's own summary agrees with the accounting: two stop at 2, one at 4, the winner reaches 8
    done = sorted(
        json.loads((Path(a["replicates"][0]["run"]) / "summary.json").read_text())["updates_done"]
        for a in res["arms"].values()
    )
    assert done == [2, 2, 4, 8]
    assert res["config"]["train"]["estimator"] == "q+Z"


@pytest.mark.slow
def test_cifar_eliminations_follow_the_recorded_validation_means(tour1):
    res, folder = tour1
    alive = ["-2", "-1", "0", "1"]
    for rung, rnd in zip(RUNGS, res["rounds"]):
        assert rnd["rung"] == rung and rnd["alive"] == alive
        # the rung's pooled validation mean, read straight from each arm's metrics.jsonl
        vals = {}
        for a in alive:
            recs = read_jsonl(folder / "arms" / f"alpha{float(a):+g}__seed{halving.CIFAR_SEED}" / "metrics.jsonl")
            vals[a] = [r["val_reward"] for r in recs if r["kind"] == "validation" and r["update"] == rung][0]
        assert rnd["scores"] == vals
        keep = math.ceil(len(alive) / 2) if rung != RUNGS[-1] else 1
        expect = sorted(alive, key=lambda a: (-vals[a], float(a)))[:keep]
        assert rnd["kept"] == expect
        alive = expect
    assert res["winner"] == alive[0]
    winner = res["arms"][res["winner"]]
    assert winner["peak"] >= res["rounds"][-1]["scores"][res["winner"]]  # the peak includes the last node


@pytest.mark.slow
def test_survivor_continuation_equals_one_uninterrupted_run(tour1, tmp_path):
    res, folder = tour1
    arm = Path(res["arms"][res["winner"]]["replicates"][0]["run"])
    args = cifar_fpo.Args(**json.loads((arm / "args.json").read_text()))
    straight = replace(args, runs_dir=str(tmp_path), run_name="straight", until=None, resume=False)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the tournament ran its arms with --threads 1
    try:
        cifar_fpo.main(straight)
    finally:
        torch.set_num_threads(threads)
    assert strip_times(read_jsonl(arm / "metrics.jsonl")) == strip_times(
        read_jsonl(tmp_path / "straight/metrics.jsonl")
    )
    a = torch.load(arm / "checkpoints/last.pt", weights_only=False)
    b = torch.load(tmp_path / "straight/checkpoints/last.pt", weights_only=False)
    assert a["k"] == b["k"] == RUNGS[-1]
    for key in a["model"]:
        assert torch.equal(a["model"][key], b["model"][key]), key
    sa, sb = a["optimizer"]["state"], b["optimizer"]["state"]
    assert sa.keys() == sb.keys()
    for i in sa:
        for key in sa[i]:
            assert torch.equal(torch.as_tensor(sa[i][key]), torch.as_tensor(sb[i][key])), (i, key)


@pytest.mark.slow
def test_rerun_continues_and_other_settings_are_refused(tour1, tiny_train):
    res, folder = tour1
    stamp = (folder / "arms" / f"alpha-2__seed{halving.CIFAR_SEED}" / "metrics.jsonl").stat().st_mtime_ns
    again = tournament(tiny_train, folder.parent)  # every arm already reached its rung
    assert again["rounds"] == res["rounds"] and again["cost"] == res["cost"]
    assert (folder / "arms" / f"alpha-2__seed{halving.CIFAR_SEED}" / "metrics.jsonl").stat().st_mtime_ns == stamp
    with pytest.raises(ValueError, match="different tournament"):
        tournament(replace(tiny_train, learning_rate=1e-2), folder.parent)


@pytest.mark.slow
def test_exact_ties_in_a_live_tournament_keep_the_smaller_exponents(tiny_train, tmp_path):
    # learning rate 0: no arm moves, so every rung is an exact tie between all arms
    spec = halving.CifarTournament(
        alphas=(1.0, -1.0, 0.0),
        rungs=(2, 4),
        out_dir=str(tmp_path),
        name="tie",
        ray=False,
        threads=1,
        train=replace(tiny_train, learning_rate=0.0),
    )
    res = halving.run_tournament(spec)
    first, last = res["rounds"]
    assert len(set(first["scores"].values())) == 1
    assert first["kept"] == ["-1", "0"] and first["eliminated"] == ["1"]
    assert last["kept"] == ["-1"] and res["winner"] == "-1"
    assert res["cost"]["C"] == (3 * 2 + 2 * (4 - 2)) / 4


@pytest.mark.slow
def test_a_failing_arm_is_marked_failed_and_the_tournament_goes_on(tiny_train, tmp_path):
    # a corrupt checkpoint in one arm's run folder: its segment raises, the other arms go on
    bad = tmp_path / "f/arms" / f"alpha+1__seed{halving.CIFAR_SEED}"
    (bad / "checkpoints").mkdir(parents=True)
    (bad / "checkpoints/last.pt").write_bytes(b"not a checkpoint")
    spec = halving.CifarTournament(
        alphas=(1.0, -1.0, 0.0), rungs=(2, 4), out_dir=str(tmp_path), name="f", ray=False, threads=1, train=tiny_train
    )
    res = halving.run_tournament(spec)
    first, last = res["rounds"]
    assert math.isnan(first["scores"]["1"]) and first["ranking"][-1] == "1" and "1" in first["eliminated"]
    assert list(first["failed"]) == [bad.name] and first["failed"][bad.name]
    assert sorted(first["kept"]) == ["-1", "0"] and res["status"] == "finished" and res["winner"] in ("-1", "0")
    assert res["failures"] == [
        {"alpha": "1", "seed": halving.CIFAR_SEED, "rung": 2, "reason": first["failed"][bad.name]}
    ]
    assert res["arms"]["1"]["replicates"][0]["failed"] == first["failed"][bad.name]
    assert res["cost"]["trained"] == 2 * 2 + 2 * (4 - 2)  # the failed arm trained nothing
    assert json.loads((tmp_path / "f/tournament.json").read_text())["failures"] == res["failures"]


@pytest.mark.slow
def test_cifar_grid_writes_the_per_run_peak_table(tiny_train, tmp_path):
    spec = halving.CifarGrid(
        alphas=(0.0, -1.0),
        seeds=(5, 6),
        rewards=("red-patch", "mixed-texture"),
        out_dir=str(tmp_path),
        name="g",
        ray=False,
        threads=1,
        train=replace(tiny_train, num_updates=4),
    )
    res = halving.run_grid(spec)
    assert len(res["runs"]) == 8 and res["failures"] == [] and res["cost"]["C"] == 8.0
    for r in res["runs"]:
        args = json.loads((Path(r["run"]) / "args.json").read_text())
        assert (args["reward"], args["alpha"], args["seed"]) == (r["task"], float(r["alpha"]), r["seed"])
        vals = {
            x["update"]: x["val_reward"]
            for x in read_jsonl(Path(r["run"]) / "metrics.jsonl")
            if x.get("kind") == "validation"
        }
        assert sorted(vals) == [0, 2, 4] and r["trained"] == 4 and r["status"] == "finished"
        best = max(vals.values())
        assert r["peak"] == best and r["peak_update"] == min(k for k, v in vals.items() if v == best)  # eq:peak
    assert [(row["task"], row["alpha"]) for row in res["table"]] == [
        ("red-patch", "0"),
        ("red-patch", "-1"),
        ("mixed-texture", "0"),
        ("mixed-texture", "-1"),
    ]
    for row in res["table"]:
        peaks = [r["peak"] for r in res["runs"] if (r["task"], r["alpha"]) == (row["task"], row["alpha"])]
        assert row["peaks"] == {"5": peaks[0], "6": peaks[1]} and row["n"] == 2
        assert row["mean"] == pytest.approx(np.mean(peaks)) and row["sd"] == pytest.approx(np.std(peaks, ddof=1))
    # the names and the config of a grid over alphas alone are those of grids written before other axes
    assert sorted(Path(r["run"]).name for r in res["runs"]) == sorted(
        f"{t}__alpha{a:+g}__seed{s}" for t in ("red-patch", "mixed-texture") for a in (0.0, -1.0) for s in (5, 6)
    )
    assert sorted(res["config"]) == ["alphas", "budget", "seeds", "tasks", "train", "trainer"]
    md = (tmp_path / "g/grid.md").read_text().splitlines()
    assert md[0] == "| Task | alpha | n | Peak mean ± SD | Final (4) mean ± SD | seed 5 | seed 6 | Notes |"
    row = res["table"][1]
    assert md[3] == (
        f"| red-patch | -1 | 2 | {row['mean']:.6f} ± {row['sd']:.6f} | {row['final_mean']:.6f} ± "
        f"{row['final_sd']:.6f} | {row['peaks']['5']:.6f} | {row['peaks']['6']:.6f} |  |"
    )


def own_numbers(folder: Path, budget: int):
    """A run folder's peak (eq:peak) and final reward at the budget, read from its own metrics.jsonl."""
    vals = {x["update"]: x["val_reward"] for x in read_jsonl(folder / "metrics.jsonl") if x.get("kind") == "validation"}
    return max(vals.values()), vals.get(budget)


@pytest.mark.slow
def test_cifar_grid_over_targets_and_estimators(tiny_train, tmp_path):
    spec = halving.CifarGrid(
        targets=("x0", "v"),
        estimators=("q+a", "q+Z"),
        seeds=(5, 6),
        out_dir=str(tmp_path),
        name="te",
        ray=False,
        threads=1,
        train=replace(tiny_train, num_updates=4),
    )
    # one run cannot start (a corrupt checkpoint): it is listed as failed by name, the others go on
    bad = tmp_path / "te/arms/red-patch__v__q+Z__seed6"
    (bad / "checkpoints").mkdir(parents=True)
    (bad / "checkpoints/last.pt").write_bytes(b"not a checkpoint")
    res = halving.run_grid(spec)
    names = [f"red-patch__{t}__{e}__seed{s}" for t in ("x0", "v") for e in ("q+a", "q+Z") for s in (5, 6)]
    assert [Path(r["run"]).name for r in res["runs"]] == names
    assert sorted(p.name for p in (tmp_path / "te/arms").iterdir()) == sorted(names)
    for r in res["runs"]:
        args = json.loads((Path(r["run"]) / "args.json").read_text()) if r["name"] != bad.name else None
        if args is not None:
            t, e = r["cell"].split("__")
            assert (args["weighting"], args["target"], args["estimator"], args["seed"]) == ("fixed", t, e, r["seed"])
    assert [f["name"] for f in res["failures"]] == [bad.name] and res["failures"][0]["failed"]
    assert [row["cell"] for row in res["table"]] == ["x0__q+a", "x0__q+Z", "v__q+a", "v__q+Z"]
    for row in res["table"]:
        seeds = (5,) if row["cell"] == "v__q+Z" else (5, 6)
        own = {s: own_numbers(tmp_path / "te/arms" / f"red-patch__{row['cell']}__seed{s}", 4) for s in seeds}
        if row["cell"] == "v__q+Z":
            assert row["failed_runs"] == [bad.name] and row["failed"] == [6] and row["n"] == 1 and row["sd"] is None
        else:
            assert row["failed_runs"] == [] and row["n"] == 2
        peaks, finals = [p for p, _ in own.values()], [f for _, f in own.values()]
        assert row["peaks"] == {str(s): p for s, (p, _) in own.items()}
        assert row["mean"] == pytest.approx(sum(peaks) / len(peaks))
        assert row["final_mean"] == pytest.approx(sum(finals) / len(finals)) and row["final_n"] == len(finals)
        if len(peaks) == 2:
            sd = abs(peaks[0] - peaks[1]) / math.sqrt(2)  # the sample SD (ddof 1) of two numbers
            assert row["sd"] == pytest.approx(sd) and row["final_sd"] == pytest.approx(
                abs(finals[0] - finals[1]) / 2**0.5
            )
    # paired by seed: q+a minus q+Z over the (profile, seed) pairs where both ran
    pairs = [
        own_numbers(tmp_path / "te/arms" / f"red-patch__{t}__q+a__seed{s}", 4)[0]
        - own_numbers(tmp_path / "te/arms" / f"red-patch__{t}__q+Z__seed{s}", 4)[0]
        for t, s in (("x0", 5), ("x0", 6), ("v", 5))
    ]
    (paired,) = res["paired"]
    assert (paired["estimator"], paired["versus"], paired["n"]) == ("q+Z", "q+a", 3)
    assert paired["mean"] == pytest.approx(np.mean(pairs)) and paired["sd"] == pytest.approx(np.std(pairs, ddof=1))
    tol = grids.TIE_TOLERANCE
    wtl = (sum(d > tol for d in pairs), sum(abs(d) <= tol for d in pairs), sum(d < -tol for d in pairs))
    assert (paired["wins"], paired["ties"], paired["losses"]) == wtl
    md = (tmp_path / "te/grid.md").read_text()
    assert "| Task | Cell | n |" in md and f"failed: {bad.name}" in md and "q+a - q+Z" in md
    assert json.loads((tmp_path / "te/grid.json").read_text()) == json.loads(json.dumps(res))

    # re-running continues: finished runs are left alone, the failed one trains once its folder is fixed
    done = tmp_path / "te/arms/red-patch__x0__q+a__seed5/metrics.jsonl"
    stamp = done.stat().st_mtime_ns
    (bad / "checkpoints/last.pt").unlink()
    again = halving.run_grid(spec)
    assert done.stat().st_mtime_ns == stamp and again["failures"] == []
    row = [r for r in again["table"] if r["cell"] == "v__q+Z"][0]
    assert row["n"] == 2 and row["peaks"]["6"] == own_numbers(bad, 4)[0]
    assert again["paired"][0]["n"] == 4
    with pytest.raises(ValueError, match="different grid"):
        halving.run_grid(replace(spec, estimators=("q+a", "explicit")))


@pytest.mark.slow
def test_cifar_grid_over_schedules_etas_rules_and_scales_in_packs(tiny_train, tmp_path):
    spec = halving.CifarGrid(
        schedules=("-1:0.5:1:3",),
        etas=(0.5,),
        rules=("online-ema",),
        refit_etas=(2.0,),
        gs=(0.5, 2.0),
        seeds=(5,),
        out_dir=str(tmp_path),
        ray=False,
        threads=1,
        pack=4,
        train=replace(tiny_train, num_updates=2, refit_every=1),
    )
    res = halving.run_grid(spec)
    assert [p.name for p in tmp_path.iterdir()] == ["grid__red-patch__schedules__etas__rules__refit-etas__gs__5"]
    folder = next(tmp_path.iterdir())  # the default name says which axes the grid sweeps
    profiles = ["schedule-1to0.5@1-3", "static-softmax-eta0.5", "online-ema-kappa300-uniform", "online-refit-eta2"]
    cells = [f"{p}__g{g:g}" for p in profiles for g in (0.5, 2.0)]
    assert [row["cell"] for row in res["table"]] == cells and res["failures"] == []
    assert res["run_info"]["pack"] == 4
    for r in res["runs"]:
        args = json.loads((Path(r["run"]) / "args.json").read_text())
        assert Path(r["run"]).name == f"red-patch__{r['cell']}__seed5" and args["g"] == r["settings"]["g"]
        assert args["weighting"] == r["settings"]["weighting"] and r["status"] == "finished"
        assert r["peak"] == own_numbers(Path(r["run"]), 2)[0] and r["final"] == own_numbers(Path(r["run"]), 2)[1]
    sched = json.loads((folder / "arms" / f"red-patch__{cells[0]}__seed5/args.json").read_text())
    assert (sched["alpha_early"], sched["alpha_late"], sched["k0"], sched["k1"]) == (-1.0, 0.5, 1, 3)
    row = res["table"][0]
    assert row["n"] == 1 and row["sd"] is None and row["mean"] == res["runs"][0]["peak"]


@pytest.mark.parametrize(
    "flags, says",
    [
        (["--targets", "x1"], "--targets 'x1' is not allowed: choose from v, x0, eps"),
        (["--estimators", "q+b"], "--estimators 'q+b' is not allowed: choose from q+a, q+Z, explicit"),
        (["--rules", "fixed"], "--rules 'fixed' is not allowed: choose from static-direct, online-ema, online-refit"),
        (["--schedules", "-3:-1"], "--schedules '-3:-1' is not allowed: give alpha_early:alpha_late:k0:k1"),
        (["--gs", "0"], "--gs 0 is not allowed: scales g must be > 0"),
    ],
)
def test_a_bad_grid_axis_value_is_a_one_line_error(tiny_train, tmp_path, flags, says):
    with pytest.raises(ValueError) as err:
        halving.run_grid(halving.CifarGrid(**{flags[0][2:]: (tyro_value(flags[1]),)}, out_dir=str(tmp_path)))
    assert says in str(err.value) and "\n" not in str(err.value)
    assert not list(tmp_path.iterdir())  # nothing written


def tyro_value(text):
    try:
        return float(text)
    except ValueError:
        return text


def test_a_bad_grid_axis_value_on_the_command_line(tmp_path):
    proc = run_cli(["cifar-grid", "--targets", "v", "noise", "--no-ray"], cwd=tmp_path, check=False)
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
        "error: --targets 'noise' is not allowed: choose from v, x0, eps"
    ]
    assert not list(tmp_path.iterdir())


def test_without_ray_arms_run_in_this_process(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # as if Ray were not installed: `import ray` fails
    assert arms.connect_ray(halving.CifarTournament()) == (None, False)
    assert arms.connect_ray(halving.CifarTournament(ray=False)) == (None, False)
    with pytest.raises(ValueError, match="needs Ray"):
        arms.connect_ray(halving.CifarTournament(ray_address="auto"))


def test_an_arm_reserves_its_threads():
    robot = replace(robot_fpo_fast.Args(), torch_threads=1, env_threads=3, cuda=False)
    assert arms.arm_resources(halving.RobotGrid(), "robot", robot, None) == {"num_cpus": 3.0, "num_gpus": 0.0}
    assert arms.arm_resources(halving.RobotGrid(threads=4), "robot", robot, None)["num_cpus"] == 4.0
    assert arms.arm_resources(halving.CifarGrid(), "cifar", cifar_fpo.Args(device="cpu"), None)["num_cpus"] == 1.0
    spec = halving.CifarGrid(threads=2, cpus_per_arm=6, gpus_per_arm=0.25)
    assert arms.arm_resources(spec, "cifar", cifar_fpo.Args(), None) == {"num_cpus": 6.0, "num_gpus": 0.25}


def test_bad_tournament_settings_raise(tiny_train, tmp_path):
    with pytest.raises(ValueError, match="val-every"):
        halving.run_tournament(halving.CifarTournament(rungs=(3, 6), out_dir=str(tmp_path), train=tiny_train))
    with pytest.raises(ValueError, match="strictly increasing"):
        halving.run_tournament(halving.CifarTournament(rungs=(4, 2), out_dir=str(tmp_path), train=tiny_train))
    with pytest.raises(ValueError, match="distinct"):
        halving.run_tournament(halving.CifarTournament(alphas=(0.0, 0.0), out_dir=str(tmp_path), train=tiny_train))
    with pytest.raises(ValueError, match="--cpus-per-arm 0"):
        halving.run_tournament(
            halving.CifarTournament(rungs=(2,), cpus_per_arm=0, out_dir=str(tmp_path), train=tiny_train)
        )
    with pytest.raises(ValueError, match="--gpus-per-arm -1"):
        halving.run_grid(halving.CifarGrid(gpus_per_arm=-1, out_dir=str(tmp_path), train=tiny_train))
    assert not list(tmp_path.iterdir())  # nothing written


def test_robot_tournament(tmp_path):
    train = replace(robot_fpo_fast.Args(), **TINY_ROBOT)
    # rungs in environment steps: 2 and 4 updates of 4 x 32 steps
    spec = halving.RobotTournament(
        alphas=(1.0, 0.5),
        seeds=(3,),
        rungs=(256, 512),
        unit="steps",
        out_dir=str(tmp_path),
        name="r",
        ray=False,
        train=train,
    )
    res = halving.run_tournament(spec)
    assert res["cost"]["trained"] == 2 * 256 + 256 and res["cost"]["C"] == 1.5
    rnd = res["rounds"][0]
    vals = {}
    for a in ("1", "0.5"):
        rows = read_jsonl(tmp_path / "r/arms" / f"alpha{float(a):+g}__seed3" / "metrics.jsonl")
        vals[a] = [r["eval_return"] for r in rows if r["update"] == 2 and "eval_return" in r][0]
    assert rnd["scores"] == vals
    assert rnd["kept"] == [sorted(vals, key=lambda a: (-vals[a], float(a)))[0]] == [res["winner"]]
    arm = json.loads((tmp_path / "r/arms" / f"alpha{float(res['winner']):+g}__seed3" / "args.json").read_text())
    assert arm["alpha_eps"] == float(res["winner"]) and arm["objective"] == "fpo"
    with pytest.raises(ValueError, match="multiples"):
        halving.run_tournament(replace(spec, rungs=(100, 512)))


# ------------------------------------------------------------------------------------------------
# replay
# ------------------------------------------------------------------------------------------------
STEPS = [0, 25, 50, 100]
# first cut 60% -> target 60 -> the last evaluation at or before it is step 50 (index 2).
# Early peaks (max over steps 0..50): A = [1, 4, 3], B = [2, 2, 2]; full peaks A = [6, 5, 4], B = [9, 8, 10].
A = [[0, 1, 0.5, 6], [0, 4, 1, 5], [3, 0, 0, 4]]
B = [[0, 0, 2, 9], [2, 0, 0, 8], [0, 2, 1, 10]]


def test_replay_two_candidates_by_hand():
    # n = 1: A's early peak beats B's on seeds 1 and 2 -> pi(A) = 2/3
    r1 = R.replay({"A": A, "B": B}, STEPS, 1, 0.6)
    assert r1["cuts"] == [{"target": 0.6, "step": 50.0}]
    assert r1["probabilities_exact"] == {"A": "2/3", "B": "1/3"}
    assert r1["pbar"] == {"A": 5.0, "B": 9.0}
    assert r1["selected_score"] == pytest.approx(2 / 3 * 5 + 1 / 3 * 9)
    assert r1["oracle"] == 9.0 and r1["oracle_candidate"] == "B"
    assert r1["draw_range"] == [5.0, 9.0]
    # cost per replicate: the eliminated arm stops at step 50 (not 60), the survivor runs to 100
    assert r1["cost"] == pytest.approx((50 + 100) / 100)
    assert r1["exhaustive_cost"] == 2 and r1["fraction"] == pytest.approx(0.75)
    # n = 2: nine ordered draws; A - B early differences per seed are (-1, +2, +1). A wins (0,1), (1,0),
    # (1,1), (1,2), (2,1), (2,2); (0,2) and (2,0) are exact ties (means 2 = 2), each split 1/2.
    r2 = R.replay({"A": A, "B": B}, STEPS, 2, 0.6)
    assert r2["draws"] == 9
    assert r2["probabilities_exact"] == {"A": "7/9", "B": "2/9"}
    assert r2["selected_score"] == pytest.approx(7 / 9 * 5 + 2 / 9 * 9)
    assert r2["cost"] == pytest.approx(2 * 1.5) and r2["exhaustive_cost"] == 4
    # exhaustive search ranks the drawn full peaks: B (9, 8, 10) beats A (6, 5, 4) in every draw
    full = R.replay({"A": A, "B": B}, STEPS, 2, None)
    assert full["probabilities_exact"] == {"A": "0", "B": "1"} and full["cost"] == 4 and full["fraction"] == 1


def test_replay_three_candidates_two_rounds_by_hand():
    steps = [0, 10, 20, 40, 80]
    # first cut 25%: cuts at 20 and 40; three candidates -> keep 2 at 20, keep 1 at 40
    c = {
        "x": [[0, 3, 0, 0, 0], [0, 1, 0, 0, 9]],  # early peak 3 | 1; at 40 still 3 | 1
        "y": [[0, 2, 0, 5, 5], [0, 2, 0, 0, 0]],  # early 2 | 2; at 40: 5 | 2
        "z": [[0, 1, 0, 0, 9], [0, 3, 0, 4, 4]],  # early 1 | 3; at 40: 1 | 4
    }
    r = R.replay(c, steps, 1, 0.25)
    assert [k["step"] for k in r["cuts"]] == [20.0, 40.0]
    # seed 0: keep x, y at 20; y (5) beats x (3) at 40 -> y.  seed 1: keep z, y; z (4) beats y (2) -> z.
    assert r["probabilities_exact"] == {"x": "0", "y": "1/2", "z": "1/2"}
    # cost per replicate: one stops at 20, one at 40, one runs to 80 -> (20 + 40 + 80) / 80
    assert r["cost"] == pytest.approx(140 / 80)
    # n = 2 draws (0,1) and (1,0): early means x 2, y 2, z 2 -> a three-way tie; keeping two of three
    # by candidate ordering, then ranking at 40 (x 2, y 3.5, z 2.5)
    r2 = R.replay(c, steps, 2, 0.25)
    # per ordering of (x, y, z), the first two listed are kept; y wins whenever kept (4 orderings of 6),
    # otherwise {x, z} -> z. So each mixed draw gives y 2/3, z 1/3; draws (0,0) -> y, (1,1) -> z.
    assert r2["probabilities_exact"] == {
        "x": "0",
        "y": str(Fraction(1 + 2 * Fraction(2, 3), 4)),
        "z": str(Fraction(1 + 2 * Fraction(1, 3), 4)),
    }


def test_replay_ties_are_averaged_over_whole_orderings():
    # x and y tie for the second place at the cut, z leads; z then ties with the survivor at the full
    # budget. Each ordering breaks both ties, so z wins only when listed before x and y: 1/3 each.
    steps = [0, 50, 100]
    c = {"x": [[0, 1, 5]], "y": [[0, 1, 5]], "z": [[0, 2, 5]]}
    r = R.replay(c, steps, 1, 0.5)
    assert r["probabilities_exact"] == {"x": "1/3", "y": "1/3", "z": "1/3"}
    same = R.replay({"p": [[1, 2, 3]], "q": [[1, 2, 3]]}, steps, 1, 0.5)
    assert same["probabilities_exact"] == {"p": "1/2", "q": "1/2"}


@pytest.mark.parametrize("seed", range(4))
def test_replay_does_not_depend_on_the_candidate_order(seed):
    rng = np.random.default_rng(seed)
    labels = ["-2", "-1", "0", "1", "2"][: 3 + seed % 3]
    curves = {a: rng.integers(0, 4, size=(3, 6)).astype(float) for a in labels}  # small integers: many ties
    steps = [0, 1, 2, 4, 6, 8]
    ref = R.replay(curves, steps, 2, 0.25)
    shuffler = random.Random(seed)
    for _ in range(3):
        order = labels[:]
        shuffler.shuffle(order)
        other = R.replay({a: curves[a] for a in order}, steps, 2, 0.25)
        assert other["probabilities_exact"] == {a: ref["probabilities_exact"][a] for a in order}
        assert other["selected_score"] == pytest.approx(ref["selected_score"], abs=1e-12)
        assert other["draw_range"] == ref["draw_range"] and other["cost"] == ref["cost"]
    assert sum(Fraction(p) for p in ref["probabilities_exact"].values()) == 1


def test_replay_cost_matches_the_papers_fpo_entries():
    # tab:halving-budgets / tab:halving-choice, n = 3, 244 blocks. With an evaluation every 3 blocks the
    # cost definition gives every Acrobot (K = 4) and Walker (K = 5) entry.
    steps = list(range(0, 244, 3)) + [244]
    expect = {
        4: {0.1: 4.1803, 0.2: 5.3607, 0.4: 7.7582, None: 12.0},
        5: {0.1: 5.3607, 0.2: 7.7582, 0.4: 10.7582, None: 15.0},
    }
    for k, table in expect.items():
        curves = {str(i): np.random.default_rng(i).random((1, len(steps))) for i in range(k)}
        for cut, c in table.items():
            r = R.replay(curves, steps, 3, cut)
            assert round(r["cost"], 4) == c, (k, cut)
    r = R.replay({str(i): np.zeros((1, len(steps))) + i for i in range(4)}, steps, 3, 0.2)
    assert round(100 * r["fraction"], 4) == 44.6721  # Acrobot search / exhaustive at 20%
    assert r["cost_per_replicate"] == pytest.approx(4 * r["fraction"])  # C_fig = C / n = K f


def test_replay_bad_input():
    with pytest.raises(ValueError, match="before the first evaluation"):
        R.replay({"a": [[1, 2]], "b": [[2, 1]]}, [10, 100], 1, 0.05)
    with pytest.raises(ValueError, match="same positive number"):
        R.replay({"a": [[1, 2]], "b": [[2, 1], [1, 1]]}, [0, 1], 1, 0.5)
    with pytest.raises(ValueError, match="expected"):
        R.replay({"a": [[1, 2, 3]]}, [0, 1], 1, 0.5)
    with pytest.raises(ValueError, match="strictly increasing"):
        R.replay({"a": [[1, 2]]}, [1, 1], 1, 0.5)
    with pytest.raises(ValueError, match="n_draw"):
        R.replay({"a": [[1, 2]]}, [0, 1], 0, 0.5)
    with pytest.raises(ValueError, match="first_cut"):
        R.replay({"a": [[1, 2]]}, [0, 1], 1, 0.0)


# ------------------------------------------------------------------------------------------------
# run folders -> curves -> replay tables
# ------------------------------------------------------------------------------------------------
def write_cifar_run(folder, alpha, seed, values):
    folder.mkdir(parents=True)
    (folder / "args.json").write_text(
        json.dumps({"reward": "auto-a35", "weighting": "fixed", "alpha": alpha, "target": None, "seed": seed})
    )
    recs = [{"kind": "calibration", "update": -1, "c_x0": 0.1}]
    for k, v in zip((0, 20, 40), values):
        recs.append({"kind": "validation", "update": k, "val_reward": v})
        recs.append({"kind": "update", "update": k, "loss": 0.0})
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))


@pytest.mark.slow
def test_run_folders_convert_to_curves_and_replay_prints_the_tables(tmp_path):
    runs = tmp_path / "runs"
    write_cifar_run(runs / "m1_s1", -1.0, 1, [0, 0.5, 0.6])
    write_cifar_run(runs / "m1_s2", -1.0, 2, [0, 0.25, 0.9])
    write_cifar_run(runs / "m1_s3", -1.0, 3, [0, 0.2, 0.4])
    write_cifar_run(runs / "p1_s1", 1.0, 1, [0, 0.4, 0.8])
    write_cifar_run(runs / "p1_s2a", 1.0, 2, [0, 0.1, 0.7])  # two runs of one seed: averaged pointwise
    write_cifar_run(runs / "p1_s2b", 1.0, 2, [0, 0.5, 0.5])
    write_cifar_run(runs / "p1_s3", 1.0, 3, [0, 0.1, 0.3])
    run_cli(["curves", "runs", "--out", "c.json"], cwd=tmp_path)
    data = json.loads((tmp_path / "c.json").read_text())
    assert data["steps"] == [0, 20, 40] and data["seeds"] == [1, 2, 3] and data["native"] == "1"
    np.testing.assert_allclose(data["curves"]["1"][1], [0, 0.3, 0.6])
    run_cli(["curves", "runs", "--until", "20", "--out", "c20.json"], cwd=tmp_path)  # a common budget
    cut = json.loads((tmp_path / "c20.json").read_text())
    assert cut["steps"] == [0, 20] and cut["curves"]["1"][1] == [0, 0.3]
    # first cut 50% of 40 -> step 20. Early peaks -1: (.5, .25, .2), 1: (.4, .3, .1) -> pi(1) = 1/3.
    # Pbar(-1) = (.6+.9+.4)/3, Pbar(1) = (.8+.6+.3)/3; selected = 2/3 Pbar(-1) + 1/3 Pbar(1).
    out = run_cli(
        ["replay", "c.json", "--n-draw", "1", "--first-cuts", "50", "--highlight", "50", "--out", "r.json"],
        cwd=tmp_path,
    ).stdout
    pm, pp = (0.6 + 0.9 + 0.4) / 3, (0.8 + 0.6 + 0.3) / 3
    sel = 2 / 3 * pm + 1 / 3 * pp
    assert "-1: 2/3; 1: 1/3" in out
    assert f"{sel:.6f}" in out and f"{pm:.6f}" in out and f"{sel - pp:+.6f}" in out
    assert "Full search" in out and f"{sel:.2f}" in out and "1.5000" in out  # C = (20 + 40)/40
    res = json.loads((tmp_path / "r.json").read_text())["auto-a35"]["n=1"]
    assert res[0]["probabilities_exact"] == {"-1": "2/3", "1": "1/3"} and res[-1]["first_cut_pct"] is None


def test_robot_run_folder_reads_its_exponent_and_steps(tmp_path):
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "args.json").write_text(
        json.dumps(
            {
                "env_id": "Acrobot",
                "objective": "fpo",
                "alpha_eps": 0.5,
                "alpha": 1.0,
                "seed": 901,
                "alpha_early": None,
                "alpha_late": None,
            }
        )
    )
    rows = [
        {"update": 0, "global_step": 0, "eval_return": 1.0},
        {"update": 1, "global_step": 512},
        {"update": 2, "global_step": 1024, "eval_return": 3.0},
    ]
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    run = R.read_run(folder, unit="steps")
    assert run["label"] == "0.5" and run["seed"] == 901 and run["curve"] == {0.0: 1.0, 1024.0: 3.0}
    assert R.read_run(folder)["curve"] == {0.0: 1.0, 2.0: 3.0}
