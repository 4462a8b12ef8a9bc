"""Arithmetic of the CIFAR speed benchmarks (the timings themselves need a GPU)."""

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import bench_cifar_update  # noqa: E402
import bench_unet_floor  # noqa: E402


def test_update_forward_equivalents_match_the_paper_configuration():
    # app:cifar: 64 samples x 20 steps, 4 draws (forward + backward = 3), 512 x 20 validation per 20 updates
    assert sum(bench_unet_floor.FWD_EQUIV.values()) == 64 * 20 + 3 * 4 * 64 + 512 * 20 // 20 == 2560


def test_floor_and_kernels_only_update_from_timings():
    row = {"gflop": 10.0, "fwd_ms": {64: 4.0, 512: 16.0, 1024: 30.72}, "fwd_bwd_ms": 48.0, "train_batch": 256}
    out = bench_unet_floor.summarise(dict(row), peak=1000.0)
    # per-image forward: 62.5, 31.25, 30.0 us -> best 30 us -> 2560 x 30 us = 76.8 ms
    assert out["floor_ms"] == pytest.approx(2560 * 30.0e-3)
    assert out["best_tflops"] == pytest.approx(10.0e9 / 30.0e-6 / 1e12)
    assert out["best_peak_frac"] == pytest.approx(out["best_tflops"] / 1000.0)
    assert out["tflops"][64] == pytest.approx(10.0e9 / 62.5e-6 / 1e12)
    # fwd+bwd at 256 = 768 forward-equivalents in 48 ms
    assert out["fwd_bwd_tflops"] == pytest.approx(768 * 10.0e9 / 48e-3 / 1e12)
    assert out["kernels_only_update_ms"] == pytest.approx(20 * 4.0 + 48.0 + 16.0)


def test_kernels_only_update_rescales_the_training_batch():
    row = {"gflop": 1.0, "fwd_ms": {64: 1.0, 512: 8.0}, "fwd_bwd_ms": 12.0, "train_batch": 128}
    out = bench_unet_floor.summarise(dict(row), peak=None)
    assert out["kernels_only_update_ms"] == pytest.approx(20 * 1.0 + 24.0 + 8.0)
    assert out["best_peak_frac"] is None


def test_unknown_inductor_setting_is_rejected():
    with pytest.raises(ValueError, match="'fastest'.*default, coord, max-autotune"):
        bench_cifar_update.apply_inductor_setting("fastest")


def test_robot_update_benchmark_sets_inductor_values_and_refuses_unknown_keys():
    pytest.importorskip("triton", reason="bench_robot_update.py imports the Triton kernels")
    import bench_robot_update
    import torch._inductor.config as config

    with config.patch({"triton.enable_persistent_tma_matmul": False, "max_autotune_gemm_backends": "ATEN"}):
        bench_robot_update.set_inductor("triton.enable_persistent_tma_matmul=True")
        bench_robot_update.set_inductor("max_autotune_gemm_backends=TRITON")
        assert config.triton.enable_persistent_tma_matmul is True
        assert config.max_autotune_gemm_backends == "TRITON"
    for bad in ("no_such_setting=1", "triton.no_such=1", "max_autotune_gemm_backends"):
        with pytest.raises(ValueError, match="KEY a torch._inductor.config setting"):
            bench_robot_update.set_inductor(bad)


def test_robot_update_matrix_products_count_the_default_network():
    import bench_robot_floor

    # HalfCheetah: obs 17, action 6; 256 actions x 8 draws per minibatch; actor 3x64, critic 2x64, embedding 8
    shapes = bench_robot_floor.update_gemms(2048, 256, 17, 6, 8, 64, 3, 64, 2)
    assert shapes == [
        (256, 17, 64, False),
        (2048, 6, 64, False),
        (2048, 8, 64, False),
        (2048, 64, 64, True),
        (2048, 64, 64, True),
        (2048, 64, 6, True),
        (256, 17, 64, False),
        (256, 64, 64, True),
        (256, 64, 1, True),
    ]
    by_hand = 2 * 2 * (256 * 17 * 64 + 2048 * 6 * 64 + 2048 * 8 * 64 + 256 * 17 * 64) + 2 * 3 * (
        2 * 2048 * 64 * 64 + 2048 * 64 * 6 + 256 * 64 * 64 + 256 * 64
    )
    assert bench_robot_floor.gemm_flops(shapes) == by_hand


def test_robot_blocks_summary_leaves_the_first_block_out():
    import bench_robot_blocks

    row = bench_robot_blocks.summarise("ours", "AcrobotSwingup", 0, 20.0, [5.0, 1.0, 3.0, 2.0], [4.0, 0.5, 0.7, 0.6])
    assert row["first_block_s"] == 5.0 and row["block_s_median"] == 2.0 and row["rollout_s_median"] == 0.6
    assert row["startup_s"] == 9.0 and row["blocks_done"] == 4
    empty = bench_robot_blocks.summarise("official", "WalkerRun", 124, 3.0, [], [])
    assert empty["block_s_median"] is None and empty["startup_s"] is None


def test_landscape_pools_grid_parts_by_reward_alpha_and_seed(tmp_path):
    import plot_cifar_grid

    def run(alpha, seed, peak, weighting="fixed", target=None):
        s = {"weighting": weighting, "target": target, "alpha": alpha}
        return {"task": "edge", "settings": s, "seed": seed, "peak": peak}

    a = tmp_path / "a" / "grid.json"
    a.parent.mkdir()
    a.write_text(json.dumps({"runs": [run(0.0, 1, 0.5), run(0.0, 2, 0.7), run(1.0, 1, 0.2)]}))
    b = tmp_path / "b.json"  # a second part: a new seed, a repeated run (replaces), a target run and a failed run
    rows = [run(0.0, 3, 0.9), run(1.0, 1, 0.4), run(None, 1, 0.1, target="x0"), run(-1.0, 1, None)]
    b.write_text(json.dumps({"runs": rows}))
    data = plot_cifar_grid.fixed_alpha_peaks(plot_cifar_grid.grid_runs((str(a.parent), str(b))))
    assert data == {"edge": {1.0: {0.0: {1: 0.5, 2: 0.7, 3: 0.9}, 1.0: {1: 0.4}}}}
    m, sd = plot_cifar_grid.mean_sd(list(data["edge"][1.0][0.0].values()))
    assert m == pytest.approx(0.7) and sd == pytest.approx(0.2)
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "README.md").write_text("<!-- generated: peaks -->\nold\n<!-- end generated -->\n")
    plot_cifar_grid.main(plot_cifar_grid.Args(grids=(str(a), str(b)), out=str(tmp_path / "out")))
    readme = (tmp_path / "out" / "README.md").read_text()  # the best bold, the paper's shape starred
    assert "| edge (1-3) | **.700 +- .200** * | .400 |" in readme and "old" not in readme
    table = (tmp_path / "out" / "landscape.md").read_text()
    assert "| edge | 0 | 3 | 0.7000 +- 0.2000 | 1, 2, 3 | 0 |" in table
    assert "| edge | 1 | 1 | 0.4000 | 1 | 0 |" in table
    assert (tmp_path / "out" / "landscape.png").stat().st_size > 1000
    assert not (tmp_path / "out" / "scale.md").exists()  # one scale only


def test_scale_winners_regret_and_ranks_follow_tab_scale():
    import plot_cifar_grid

    # mean peaks (alpha rows -1, 0, 1; g columns .5, 1, 2); seed pairs average to them
    means = {-1.0: (0.5, 0.8, 0.6), 0.0: (0.7, 0.9, 0.5), 1.0: (0.6, 0.1, 0.9)}
    by_g = {g: {a: {1: m[j] - 0.01, 2: m[j] + 0.01} for a, m in means.items()} for j, g in enumerate((0.5, 1.0, 2.0))}
    by_g[2.0][1.5] = {1: 1.0}  # a shape the g = 1 runs lack is left out
    by_g[0.75] = {1.0: {1: 1.0}}  # a scale without every shape is left out (and listed)
    s = plot_cifar_grid.scale_summary(by_g)
    assert s["alphas"] == [-1.0, 0.0, 1.0]
    assert s["gs"] == [0.5, 1.0, 2.0] and s["incomplete"] == [0.75]
    assert s["winners"] == {0.5: 0.0, 1.0: 0.0, 2.0: 1.0}
    assert s["regret"] == pytest.approx(0.9 - 0.5)  # keeping alpha 0 at g = 2
    assert s["ranks"].tolist() == [[3, 2, 2], [1, 1, 3], [2, 3, 1]] and s["seeds"] == [1, 2]
    by_g[1.0][1.0][3] = 5.0  # a seed only g = 1 has is left out: alpha 1 would win there
    assert plot_cifar_grid.scale_summary(by_g)["winners"][1.0] == 0.0
    by_g[0.5] = {a: {3: 0.5} for a in means}  # no seed in every cell: no comparison
    assert "winners" not in plot_cifar_grid.scale_summary(by_g)
    del by_g[0.5], by_g[2.0]  # one complete scale: nothing to compare
    assert "winners" not in plot_cifar_grid.scale_summary(by_g)


def test_scale_study_adds_the_scales_that_have_all_of_g1s_seeds(tmp_path):
    import plot_cifar_grid

    # seed 1 at every scale (alpha 1 wins); seeds 2 and 3 only at g = 1 and 2, where alpha 0 wins on the mean
    peaks = {1: {0.0: 0.5, 1.0: 0.6}, 2: {0.0: 0.9, 1.0: 0.6}, 3: {0.0: 0.9, 1.0: 0.6}}
    by_g = {
        g: {a: {k: peaks[k][a] for k in (1, 2, 3) if g != 0.5 or k == 1} for a in (0.0, 1.0)} for g in (0.5, 1.0, 2.0)
    }
    first, wider = plot_cifar_grid.scale_summaries(by_g)
    assert first["gs"] == [0.5, 1.0, 2.0] and first["seeds"] == [1] and first["winners"][1.0] == 1.0
    assert wider["gs"] == [1.0, 2.0] and wider["seeds"] == [1, 2, 3] and wider["winners"] == {1.0: 0.0, 2.0: 0.0}
    by_g[2.0][1.0].pop(3)  # g = 2 lacks a seed of g = 1: only g = 1 is left, nothing to compare
    assert len(plot_cifar_grid.scale_summaries(by_g)) == 1
    by_g[0.5] = by_g[2.0] = by_g[1.0]  # every scale has every seed: one study
    assert [s["seeds"] for s in plot_cifar_grid.scale_summaries(by_g)] == [[1, 2, 3]]
    runs = [
        {"task": "edge", "settings": {"weighting": "fixed", "alpha": a, "g": g}, "seed": k, "peak": peaks[k][a]}
        for g in (0.5, 1.0, 2.0)
        for a in (0.0, 1.0)
        for k in (1, 2, 3)
        if g != 0.5 or k == 1
    ]
    (tmp_path / "grid.json").write_text(json.dumps({"runs": runs}))
    plot_cifar_grid.main(plot_cifar_grid.Args(grids=(str(tmp_path / "grid.json"),), out=str(tmp_path / "out")))
    table = (tmp_path / "out" / "scale.md").read_text()
    assert "| edge | this code | 1 | 1 | - | 1 | - | 1 | 0.0000 |" in table
    assert "| edge | this code | 1, 2, 3 | - | - | 0 | - | 0 | 0.0000 |" in table


def test_targets_table_takes_x0_and_v_from_alpha_runs_and_samples_the_lowest_seed(tmp_path):
    import plot_cifar_grid
    from PIL import Image

    def run(cell, seed, peak, g=1.0):
        s = {"weighting": "fixed", "g": g}
        if cell == "eps":
            s.update(target="eps", alpha=None)
        else:
            s.update(target=None, alpha=float(cell[5:]))
        return {"task": "mixed", "cell": cell, "settings": s, "seed": seed, "peak": peak, "name": f"{cell}_{seed}"}

    rows = [run("alpha+0", 1, 0.8), run("alpha+0", 2, 0.6), run("alpha+1", 1, 0.5)]
    rows += [run("eps", 1, 0.1), run("eps", 2, 0.9, g=2.0)]  # eps at g = 2 is not the eps target of eq:targets
    grid = tmp_path / "grid.json"
    grid.write_text(json.dumps({"runs": rows}))
    for name, updates in (("alpha+0_2", (20, 40)), ("alpha+0_1", (20,)), ("eps_1", (60,))):
        (tmp_path / "arms" / name / "samples").mkdir(parents=True)
        for u in updates:
            Image.new("RGB", (274, 274)).save(tmp_path / "arms" / name / "samples" / f"update_{u:05d}.png")
    runs = plot_cifar_grid.grid_runs((str(grid),))
    data = plot_cifar_grid.fixed_alpha_peaks(runs)
    peaks = plot_cifar_grid.target_peaks(runs, data)
    assert peaks == {"mixed": {"x0": {1: 0.8, 2: 0.6}, "v": {1: 0.5}, "eps": {1: 0.1}}}
    samples = plot_cifar_grid.last_samples(runs)
    assert samples == {
        "mixed": {
            "alpha+0": (1, tmp_path / "arms/alpha+0_1/samples/update_00020.png"),
            "eps": (1, tmp_path / "arms/eps_1/samples/update_00060.png"),
        }
    }
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "README.md").write_text("<!-- generated: targets_table -->\n<!-- end generated -->\n")
    plot_cifar_grid.main(plot_cifar_grid.Args(grids=(str(grid),), out=str(tmp_path / "out")))
    assert "| mixed (1-2) | **.700 +- .141** | .500 | .100 |" in (tmp_path / "out" / "README.md").read_text()
    table = (tmp_path / "out" / "targets.md").read_text()
    assert "| mixed | 0.7000 +- 0.1414 (n=2) | 0.5000 (n=1) | 0.1000 (n=1) | x0 |" in table
    assert (tmp_path / "out" / "samples_s1.jpg").stat().st_size > 1000  # named by its one seed
    assert not (tmp_path / "out" / "samples.jpg").exists()


def test_rules_table_pairs_each_rule_with_the_x0_control_and_shows_a_paths_end_points(tmp_path):
    import plot_cifar_grid

    def run(cell, settings, seed, peak, g=1.0):
        return {"task": "mixed", "cell": cell, "settings": {**settings, "g": g}, "seed": seed, "peak": peak}

    def fixed(a):
        return f"alpha{a:+g}", {"weighting": "fixed", "target": None, "alpha": a}

    path = {"weighting": "schedule", "alpha_early": -3.0, "alpha_late": -0.5, "k0": 160, "k1": 260}
    rows = [run(*fixed(0.0), 1, 0.5), run(*fixed(0.0), 2, 0.7), run(*fixed(-3.0), 1, 0.6), run(*fixed(-1.0), 1, 0.9)]
    rows += [run("schedule-3to-0.5@160-260", path, 1, 0.8), run("schedule-3to-0.5@160-260", path, 2, 0.6)]
    rows += [run("online-ema-kappa300-uniform", {"weighting": "online-ema"}, 2, 0.75)]
    rows += [run("static-softmax-eta1", {"weighting": "static-softmax", "eta": 1.0}, 1, 0.1, g=2.0)]  # not g = 1
    grid = tmp_path / "grid.json"
    grid.write_text(json.dumps({"runs": rows}))
    runs = plot_cifar_grid.grid_runs((str(grid),))
    rules = plot_cifar_grid.rule_peaks(runs)
    assert list(rules["mixed"]) == ["schedule-3to-0.5@160-260", "online-ema-kappa300-uniform"]
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "README.md").write_text("<!-- generated: rules_table -->\n<!-- end generated -->\n")
    plot_cifar_grid.main(plot_cifar_grid.Args(grids=(str(grid),), out=str(tmp_path / "out")))
    readme = (tmp_path / "out" / "README.md").read_text()  # static and online rules only, the paper's below
    assert "| online EMA (kappa 300, uniform start) | **.7500 (1)** | +.0500 |" in readme
    assert "| paper: online coherence (n = 3) | .542 +- .176 |  |" in readme and "schedule" not in readme
    table = (tmp_path / "out" / "rules.md").read_text().splitlines()[4:]  # after the verdict rule and the header
    nm = "| not measured | not measured |"  # no diversity in these runs
    assert table == [
        "| mixed | alpha-3 (path end) | 1 | 0.6000 | +0.1000 (1) |  | n/a | 0.9079 +- 0.0393 " + nm,
        "| mixed | alpha-1 (best fixed) | 1 | 0.9000 | +0.4000 (1) |  | n/a |  " + nm,
        "| mixed | alpha+0 (x0 control) | 2 | 0.6000 +- 0.1414 |  |  |  |  " + nm,
        "| mixed | schedule-3to-0.5@160-260 | 2 | 0.7000 +- 0.1414 | +0.1000 (2) | 0.2000 | n/a | 0.9871 +- 0.0076 "
        + nm,
        "| mixed | online-ema-kappa300-uniform | 1 | 0.7500 | +0.0500 (1) |  | n/a | 0.5425 +- 0.1759 " + nm,
    ]


def test_estimator_pairs_match_profile_scale_and_seed_and_count_ties_at_the_tolerance(tmp_path):
    import plot_cifar_grid

    import halving

    def run(profile, est, seed, peak):
        s = {"weighting": "fixed", "target": None, "alpha": 0.0, "estimator": est}
        done = {"status": "finished", "failed": None}
        return {"task": "edge", "cell": f"{profile}__{est}", "settings": s, "seed": seed, "peak": peak, **done}

    rows = [run("alpha+0", "q+Z", 1, 0.905), run("alpha+0", "explicit", 1, 0.9)]  # +.005: a win
    rows += [run("alpha+0", "q+Z", 2, 0.802), run("alpha+0", "explicit", 2, 0.8)]  # +.002: a tie
    rows += [run("alpha+0__g2", "q+Z", 1, 0.7), run("alpha+0__g2", "explicit", 1, 0.71)]  # -.01: a loss
    rows += [run("alpha-1", "q+Z", 1, 0.5), run("alpha-1", "explicit", 2, 0.4)]  # different seeds: no pair
    rows += [
        {"task": "edge", "cell": "alpha+0", "settings": {"weighting": "fixed", "alpha": 0.0}, "seed": 1, "peak": 0}
    ]
    grid = tmp_path / "grid.json"
    grid.write_text(json.dumps({"runs": rows}))
    pairs = plot_cifar_grid.estimator_pairs(plot_cifar_grid.grid_runs((str(grid),)))
    assert pairs == {"edge": [("alpha+0", 1, 0.905, 0.9), ("alpha+0", 2, 0.802, 0.8), ("alpha+0__g2", 1, 0.7, 0.71)]}
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "README.md").write_text("<!-- generated: estimators_table -->\n<!-- end generated -->\n")
    plot_cifar_grid.main(plot_cifar_grid.Args(grids=(str(grid),), out=str(tmp_path / "out")))
    row = "| edge | 3 (alpha 0, alpha+0__g2; 2 seeds) | -.0010 +- .0079 | 1/1/1 | 27 | +0.00796 +- 0.00538 | 23/4/0 |"
    assert row in (tmp_path / "out" / "README.md").read_text()
    table = (tmp_path / "out" / "estimators.md").read_text()
    assert "| edge | 3 | -0.0010 +- 0.0079 | 1/1/1 | 27 | +0.00796 +- 0.00538 | 23/4/0 |" in table
    assert "| edge | alpha+0__g2 | 1 | 0.7000 | 0.7100 | -0.0100 |" in table
    # the grid's own table (halving.py) of the same runs counts alike
    (row,) = halving.paired_estimators([r for r in rows if "estimator" in r["settings"]], ["q+Z", "explicit"])
    assert (row["n"], row["wins"], row["ties"], row["losses"]) == (3, 1, 1, 1)
    assert plot_cifar_grid.TIE_TOLERANCE == halving.TIE_TOLERANCE


def _run(folder: Path, rows: list[dict]) -> Path:
    folder.mkdir(parents=True)
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows) + "\n")  # a blank line too
    return folder


def test_compare_runs_averages_shared_updates_per_window_and_lists_shared_evaluations(tmp_path):
    import compare_runs

    a = _run(tmp_path / "a", [{"update": u, "episodic_return": 2.0 * u, "eval_return": 10.0 + u} for u in range(0, 7)])
    b = _run(
        tmp_path / "b",
        [{"update": u, "episodic_return": 1.0 * u} for u in range(0, 9)]
        + [
            {"update": 3, "eval_return": 5.0}  # a second row for update 3 (a resumed run): the last one counts
        ],
    )
    ra, rb = compare_runs.load(a), compare_runs.load(b)
    assert compare_runs.windows(6) == [(1, 2), (3, 4), (5, 6)]
    lines = compare_runs.table(ra, rb, 6, ("x", "y"))
    # updates 3-4: update 3's last row in b has no return, so update 4 alone, in both runs: 8 against 4
    assert "| episodic_return | 3-4 | 8 | 4 | +1.000 |" in lines
    assert "| episodic_return | 1-2 | 3 | 1.5 | +1.000 |" in lines
    assert [ln for ln in lines if ln.startswith("| 3 |")] == ["| 3 | 13.000 | 5.000 |"]
    assert not any(k in "".join(lines) for k in ("pg_loss", "| 0 |"))  # absent statistics, update 0's missing eval
    with pytest.raises(SystemExit, match="share no logged update"):
        sys.argv = ["compare_runs.py", str(a), str(_run(tmp_path / "c", [{"update": 0}]))]
        compare_runs.main()


@pytest.mark.slow
def test_sps_benchmark_times_the_evaluation_points_it_is_asked_for(tmp_path):
    pytest.importorskip("envpool")
    import bench_robot_sps

    small = dict(preset="fpopp", env_id="InvertedPendulum-v5", num_envs=4, num_steps=8, num_updates=1)
    out = bench_robot_sps.main(bench_robot_sps.BenchArgs(**small, eval_runs=2, eval_episodes=2))
    assert len(out["eval_s_all"]) == 2 and all(t > 0 for t in out["eval_s_all"])
    assert out["eval_s"] == pytest.approx(sum(out["eval_s_all"]) / 2) and out["eval_episodes"] == 2
    out = bench_robot_sps.main(bench_robot_sps.BenchArgs(**small))
    assert (out["eval_s"], out["eval_s_all"], out["eval_episodes"]) == (None, [], None)


def test_montage_diversity_cuts_each_panels_nine_images_back_out_of_the_jpeg(tmp_path):
    import montage_diversity as md
    import numpy as np
    import plot_cifar_grid
    from PIL import Image

    rng = np.random.default_rng(0)
    colours, samples = {}, {"edge": {}, "mixed": {}}
    for reward, cell in (("edge", "alpha+0"), ("edge", "alpha+1"), ("mixed", "alpha+0")):
        c = rng.integers(0, 256, (64, 3))  # one flat colour a tile of an 8 x 8 grid with 2-pixel padding
        grid = np.full((274, 274, 3), 255, np.uint8)
        for i in range(64):
            y, x = 2 + 34 * (i // 8), 2 + 34 * (i % 8)
            grid[y : y + 32, x : x + 32] = c[i]
        path = tmp_path / f"{reward}_{cell}.png"
        Image.fromarray(grid).save(path)
        colours[(reward, cell)], samples[reward][cell] = c, (7, path)
    montage = Image.open(plot_cifar_grid.write_samples(samples, tmp_path)).convert("RGB")
    boxes = md.panel_boxes(["edge", "mixed"], ["alpha+0", "alpha+1"])
    for key, c in colours.items():
        tiles = md.cut(montage, boxes[key])
        assert len(tiles) == 9
        for k, tile in enumerate(tiles):  # row-major 3 x 3 corner of the grid
            centre = tile[8:24, 8:24].reshape(-1, 3).mean(0)
            assert np.abs(centre - c[8 * (k // 3) + k % 3]).max() < 16, (key, k)
    assert md.cut(montage, boxes[("mixed", "alpha+1")]) == []  # the panel of a run without a grid
    assert "Spearman 1.000" in md.calibration_text([(0.1, 0.1), (0.2, 0.25), (0.4, 0.5)])[0]


def test_pretrain_step_benchmark_quick_times_a_step_and_its_network(tmp_path, monkeypatch):
    import bench_pretrain_step
    import torch

    out = tmp_path / "step.json"
    monkeypatch.setattr(sys, "argv", ["bench_pretrain_step.py", "--quick", "--json", str(out)])
    bench_pretrain_step.main()
    rows = json.loads(out.read_text())
    assert rows["device"] == "cpu" and rows["preset"] == "small"
    (row,) = rows["rows"]
    assert row["variant"] == "eager+fused" and row["step_ms"] > 0 and row["network_ms"] > 0
    assert row["rest_ms"] == pytest.approx(row["step_ms"] - row["network_ms"], abs=0.02)
    assert row["steps_per_s"] == pytest.approx(1000 / row["step_ms"], rel=0.01)
    if not torch.cuda.is_available():  # without --quick a CPU gets one line naming what is missing
        monkeypatch.setattr(sys, "argv", ["bench_pretrain_step.py"])
        with pytest.raises(SystemExit) as e:
            bench_pretrain_step.main()
        assert "needs a CUDA GPU" in str(e.value) and "\n" not in str(e.value)
