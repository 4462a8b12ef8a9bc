"""The verdict rule of the CIFAR report (benchmarks/plot_cifar_grid.py) and the report's generated parts."""

import json
import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import plot_cifar_grid  # noqa: E402


def test_verdict_rule_closed_form_cases():
    # a clear win: mean .011, SD .001, SE .001 / sqrt(3) = .00058, far under .011 / 2
    v, m, se = plot_cifar_grid.verdict([0.010, 0.011, 0.012])
    assert v == "win" and m == pytest.approx(0.011) and se == pytest.approx(0.001 / math.sqrt(3))
    # a tie: mean .001, SD .01, SE .0058 > .001 / 2
    assert plot_cifar_grid.verdict([0.011, -0.009, 0.001])[0] == "tie"
    # a loss, the mirror of the win
    assert plot_cifar_grid.verdict([-0.010, -0.011, -0.012])[0] == "loss"
    # diffs 0 and 4: mean 2, SE 2 (SD 2.83 / sqrt(2)); 2 is not beyond 2 * 2: a tie
    assert plot_cifar_grid.verdict([0.0, 4.0])[0] == "tie"
    # n/a with one pair (and with none)
    v, m, se = plot_cifar_grid.verdict([0.5])
    assert v == "n/a" and m == 0.5 and math.isnan(se)
    assert plot_cifar_grid.verdict([])[0] == "n/a"
    # identical runs: a tie, not a win
    assert plot_cifar_grid.verdict([0.0, 0.0, 0.0])[0] == "tie"


def test_pairing_uses_the_seeds_both_sides_have():
    assert plot_cifar_grid.paired({1: 0.5, 2: 0.7, 3: 0.9}, {2: 0.6, 3: 0.6, 4: 0.1}) == pytest.approx([0.1, 0.3])


def test_montage_panel_titles_are_short_and_keep_leading_digits():
    title = plot_cifar_grid.panel_title
    assert title("alpha-0.5") == "a -0.5"
    assert title("static-softmax-eta0.25") == "eta .25"
    assert title("static-softmax-eta10.5") == "eta 10.5"
    assert title("online-ema-kappa300-uniform") == "online EMA"
    assert title("schedule-3to-0.5@160-260") == "path -3 to -0.5"
    assert title("alpha+0.5__explicit") == "a +0.5 explicit"


def test_montage_columns_put_each_alphas_estimators_after_it():
    cells = ["alpha+0.5", "online-ema", "alpha-2__q+Z", "alpha+0.5__explicit", "alpha-2", "alpha-2__explicit"]
    order = ["alpha-2", "alpha-2__explicit", "alpha-2__q+Z", "alpha+0.5", "alpha+0.5__explicit", "online-ema"]
    assert plot_cifar_grid.sample_cells(cells) == order


def test_tied_ranks_share_a_rank_unless_a_shape_wins():
    # alpha 0 beats alpha 1 at every seed by .1; alpha -1 is within noise of alpha 0
    by_alpha = {-1.0: {1: 0.90, 2: 0.80, 3: 0.85}, 0.0: {1: 0.86, 2: 0.84, 3: 0.86}, 1.0: {1: 0.76, 2: 0.74, 3: 0.76}}
    assert plot_cifar_grid.tied_ranks(by_alpha, [-1.0, 0.0, 1.0], [1, 2, 3]) == [1, 1, 3]


def test_report_writes_verdicts_fills_the_readme_and_reads_diversity(tmp_path):
    def run(alpha, seed, peak, peak_update=100, **extra):
        s = {"weighting": "fixed", "target": None, "alpha": alpha}
        name = f"edge__alpha{alpha:+g}__seed{seed}"
        return {"task": "edge", "cell": f"alpha{alpha:+g}", "settings": s, "seed": seed, "peak": peak,
                "peak_update": peak_update, "name": name, **extra}  # fmt: skip

    rows = [run(0.0, k, 0.9 + 0.001 * k) for k in (1, 2, 3)]
    rows += [run(1.0, k, 0.5 + 0.002 * k, peak_update=0 if k == 1 else 100) for k in (1, 2, 3)]
    grid = tmp_path / "grid.json"
    grid.write_text(json.dumps({"runs": rows}))
    summary = tmp_path / "arms" / "edge__alpha+0__seed1" / "summary.json"
    summary.parent.mkdir(parents=True)
    summary.write_text(json.dumps({"peak_update": 100, "div_cos_at_peak": 0.25, "div_classes_at_peak": 3}))
    out = tmp_path / "out"
    out.mkdir()
    (out / "README.md").write_text("text\n<!-- generated: update0 -->\nold\n<!-- end generated -->\nmore\n")
    plot_cifar_grid.main(plot_cifar_grid.Args(grids=(str(grid),), out=str(out)))
    doc = json.loads((out / "verdicts.json").read_text())
    (row,) = [r for r in doc["comparisons"] if r["a"] == "alpha 1" and r["b"] == "alpha 0 (best)"]
    assert row["verdict"] == "loss" and row["n"] == 3
    table = (out / "landscape.md").read_text()
    assert "| edge | 0 | 3 |" in table and "| 0.250 (1 of 3) | 3.0 (1 of 3) |" in table
    assert "| 1 | not measured | not measured |" in table  # alpha 1: seed 1 peaked at update 0, no diversity
    readme = (out / "README.md").read_text()
    assert "edge alpha+1 seed 1 (0.5020)" in readme and "old" not in readme and readme.endswith("more\n")


def test_one_seed_scale_study_has_no_verdict_and_montage_keeps_g1(tmp_path):
    from PIL import Image

    def run(alpha, g, peak):
        cell = f"alpha{alpha:+g}" + ("" if g == 1 else f"__g{g:g}")
        s = {"weighting": "fixed", "target": None, "alpha": alpha, "g": g}
        return {"task": "mixed", "cell": cell, "settings": s, "seed": 7, "peak": peak, "peak_update": 100,
                "name": f"mixed__{cell}__seed7", "div_cos_at_peak": 0.1 + alpha, "div_classes_at_peak": 4}  # fmt: skip

    # one seed; alpha 0 has the best peak at g = 1, alpha -.5 at g = 2
    rows = [run(a, 1.0, 0.8 + 0.01 * a) for a in (-1.0, -0.5, 0.0)]
    rows += [run(a, 2.0, 0.8 - 0.01 * (a + 0.5) ** 2) for a in (-1.0, -0.5, 0.0)]
    (tmp_path / "grid.json").write_text(json.dumps({"runs": rows}))
    for r in rows:  # every run saved a sample grid: 8 images of 4 pixels a row, 2-pixel padding
        (tmp_path / "arms" / r["name"] / "samples").mkdir(parents=True)
        Image.new("RGB", (50, 50), (200, 30, 30)).save(tmp_path / "arms" / r["name"] / "samples" / "update_00100.png")
    out = tmp_path / "out"
    plot_cifar_grid.main(plot_cifar_grid.Args(grids=(str(tmp_path / "grid.json"),), out=str(out)))
    (line,) = [t for t in (out / "verdicts.md").read_text().splitlines() if t.startswith("mixed (n = 1)")]
    assert "kept at every g: n/a" in line  # one seed: no verdict, though the best mean moves
    rows = (out / "scale.md").read_text().splitlines()
    assert rows[-1].startswith("| mixed | 7 | 2 | -0.5 |") and rows[-1].endswith("| -0.400 | 4.0 |")  # best at g = 2
    montage = Image.open(out / "samples_s7.jpg")  # named by its one seed
    assert montage.width == pytest.approx(3 * 120, abs=4)  # three g = 1 cells, the g = 2 cells left out


def test_estimators_report_the_diversity_at_each_estimators_peak(tmp_path):
    def run(cell, est, seed, peak, div=None):
        s = {"weighting": "fixed", "target": None, "alpha": 0.0, "estimator": est}
        extra = {} if div is None else {"div_cos_at_peak": div, "div_classes_at_peak": 2}
        return {"task": "edge", "cell": cell, "settings": s, "seed": seed, "peak": peak, "peak_update": 100,
                "name": f"edge__{cell}__seed{seed}", **extra}  # fmt: skip

    rows = [run("alpha+0", "q+a", k, 0.9) for k in (1, 2)]
    rows += [run("alpha+0__q+Z", "q+Z", 1, 0.91, div=0.2), run("alpha+0__q+Z", "q+Z", 2, 0.92)]
    rows += [run("alpha+0__explicit", "explicit", 1, 0.90, div=0.4), run("alpha+0__explicit", "explicit", 2, 0.9)]
    (tmp_path / "grid.json").write_text(json.dumps({"runs": rows}))
    out = tmp_path / "out"
    plot_cifar_grid.main(plot_cifar_grid.Args(grids=(str(tmp_path / "grid.json"),), out=str(out)))
    table = (out / "estimators.md").read_text()
    assert "| edge | alpha+0 | 1 | 0.9100 | 0.9000 | +0.0100 | 0.200 / 0.400 | 2.0 / 2.0 |" in table
    assert "| edge | alpha+0 | 2 | 0.9200 | 0.9000 | +0.0200 | - / - | - / - |" in table
    verdicts = (out / "verdicts.md").read_text()
    assert "| 0.200 (1 of 2) / 0.400 (1 of 2) | 2.0 (1 of 2) / 2.0 (1 of 2) |" in verdicts
