"""The verdict rule of the CIFAR report (benchmarks/plot_cifar_grid.py) and the report's generated parts."""

import json
import math
import sys
from pathlib import Path
from statistics import NormalDist

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import plot_cifar_grid  # noqa: E402


def test_t_distribution_matches_its_closed_forms():
    cdf, crit = plot_cifar_grid.t_cdf, plot_cifar_grid.t_critical
    for t in (-30.0, -2.5, -0.3, 0.0, 0.7, 4.0, 100.0):
        assert cdf(t, 1) == pytest.approx(0.5 + math.atan(t) / math.pi, abs=1e-13)  # Cauchy
        assert cdf(t, 2) == pytest.approx(0.5 + t / (2 * math.sqrt(2 + t * t)), abs=1e-13)
    # the 5% two-sided critical values: df 1 tan(pi * .475); df 2 solves t / sqrt(2 + t^2) = .95
    assert crit(1) == pytest.approx(math.tan(math.pi * 0.475), rel=1e-10) and crit(1) == pytest.approx(
        12.7062, abs=1e-4
    )
    assert crit(2) == pytest.approx(0.95 * math.sqrt(2 / (1 - 0.95**2)), rel=1e-10) and round(crit(2), 4) == 4.3027
    assert round(crit(3), 4) == 3.1824 and round(crit(4), 4) == 2.7764 and round(crit(11), 4) == 2.2010
    assert crit(10**7) == pytest.approx(NormalDist().inv_cdf(0.975), abs=1e-5) and round(crit(10**7), 5) == 1.95996
    assert plot_cifar_grid.t_two_sided(crit(3), 3) == pytest.approx(0.05, rel=1e-10)


def test_t_distribution_matches_scipy():
    stats = pytest.importorskip("scipy.stats", reason="scipy is not installed (the report itself does not need it)")
    for df in (1, 2, 3, 4, 5, 7, 11, 15, 30, 100, 1000):
        for t in (0.0, 0.05, 0.5, 1.0, 1.96, 2.5, 3.2, 4.3, 8.0, 40.0):
            assert plot_cifar_grid.t_cdf(t, df) == pytest.approx(stats.t.cdf(t, df), abs=1e-9)
            assert plot_cifar_grid.t_cdf(-t, df) == pytest.approx(stats.t.cdf(-t, df), abs=1e-9)
            assert plot_cifar_grid.t_two_sided(t, df) == pytest.approx(2 * stats.t.sf(t, df), abs=1e-9)
        assert plot_cifar_grid.t_critical(df) == pytest.approx(stats.t.ppf(0.975, df), rel=1e-9)


def test_t_distribution_matches_mpmath_at_high_precision():
    mpmath = pytest.importorskip("mpmath", reason="mpmath is not installed")
    mpmath.mp.dps = 40
    for df in (1, 2, 3, 4, 10, 100, 1000, 10000):
        for t in (0.01, 0.3, 1.0, 2.0, 3.5, 10.0, 300.0):
            x = mpmath.mpf(df) / (df + mpmath.mpf(t) ** 2)
            exact = float(mpmath.betainc(mpmath.mpf(df) / 2, 0.5, 0, x, regularized=True))
            assert plot_cifar_grid.t_two_sided(t, df) == pytest.approx(exact, rel=1e-10, abs=1e-12)


def test_verdict_is_a_paired_t_test_at_five_percent():
    verdict = plot_cifar_grid.verdict
    # a clear win: mean .011, SD .001, SE .001 / sqrt(3), t = 19.05, df 2: p = 1 - t / sqrt(2 + t^2)
    v, m, se, t, p = verdict([0.010, 0.011, 0.012])
    assert v == "win" and m == pytest.approx(0.011) and se == pytest.approx(0.001 / math.sqrt(3))
    assert t == pytest.approx(0.011 / (0.001 / math.sqrt(3))) and p == pytest.approx(1 - t / math.sqrt(2 + t * t))
    assert verdict([-0.010, -0.011, -0.012])[0] == "loss"  # the mirror of the win
    assert verdict([0.011, -0.009, 0.001])[0] == "tie"  # mean .001, SD .01
    # diffs 1, 2, 3: mean 2 is beyond twice its SE (1 / sqrt(3)), a win under a 2-SE rule, but t = 2 sqrt(3) =
    # 3.46 is under df 2's 4.30: p = 1 - t / sqrt(2 + t^2) = .074, a tie
    v, m, se, t, p = verdict([1.0, 2.0, 3.0])
    assert m > 2 * se and v == "tie"
    assert t == pytest.approx(2 * math.sqrt(3)) and p == pytest.approx(1 - math.sqrt(12 / 14)) and p > 0.05
    # the same with four pairs (df 3: 3.18) and twelve (df 11: 2.20) decides where |t| passes the critical value
    assert verdict([1.0, 2.0, 3.0, 2.0])[0] == "win"  # t = 4.90
    assert verdict([1.0, 3.0, -1.0, 5.0])[0] == "tie"  # t = 1.55
    # p < .05 exactly at the critical value's side: a mean just inside and just outside it
    c = plot_cifar_grid.t_critical(3)
    sd_diffs = [-1.0, 1.0, -1.0, 1.0]  # SD 2 / sqrt(3), SE 1 / sqrt(3) over 4 pairs
    assert verdict([d + 1.001 * c / math.sqrt(3) for d in sd_diffs])[0] == "win"
    assert verdict([d + 0.999 * c / math.sqrt(3) for d in sd_diffs])[0] == "tie"


def test_verdict_edge_cases_have_no_verdict_or_no_finite_t():
    verdict = plot_cifar_grid.verdict
    v, m, se, t, p = verdict([])  # zero pairs
    assert v == "n/a" and math.isnan(m) and math.isnan(se) and t is None and p is None
    v, m, se, t, p = verdict([0.5])  # one pair
    assert v == "n/a" and m == 0.5 and math.isnan(se) and t is None and p is None
    v, m, se, t, p = verdict([0.30, 0.31])  # two pairs, however clear: no verdict
    assert v == "n/a" and m == pytest.approx(0.305) and se > 0 and t is None and p is None
    assert verdict([0.0, 0.0, 0.0]) == ("tie", 0.0, 0.0, None, 1.0)  # identical runs: a tie, not a win
    v, m, se, t, p = verdict([0.01, 0.01, 0.01])  # a constant nonzero difference: SD 0
    assert (v, se, t, p) == ("win", 0.0, None, 0.0) and m == pytest.approx(0.01)
    assert verdict([-0.1] * 4)[::3] == ("loss", None) and verdict([-0.1] * 4)[4] == 0.0


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
    # alpha 0 beats alpha 1 at every seed by .1; alpha -1 is within noise of alpha 0. Alpha -1 minus alpha 1 (.14,
    # .06, .09) lies beyond 2 SE (a win under a 2-SE rule) but has t = 4.14 < 4.30 (df 2): alpha 1 ranks 2, not 3
    by_alpha = {-1.0: {1: 0.90, 2: 0.80, 3: 0.85}, 0.0: {1: 0.86, 2: 0.84, 3: 0.86}, 1.0: {1: 0.76, 2: 0.74, 3: 0.76}}
    assert plot_cifar_grid.tied_ranks(by_alpha, [-1.0, 0.0, 1.0], [1, 2, 3]) == [1, 1, 2]
    by_alpha[-1.0] = {1: 0.92, 2: 0.78, 3: 0.85}  # a wider spread: alpha 0 still beats alpha 1, -1 ties both
    assert plot_cifar_grid.tied_ranks(by_alpha, [-1.0, 0.0, 1.0], [1, 2, 3]) == [1, 1, 2]
    assert plot_cifar_grid.tied_ranks(by_alpha, [-1.0, 0.0, 1.0], [1, 2]) == [1, 1, 1]  # two seeds: no verdicts


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
    assert line == "mixed (n = 1): no comparison decided (fewer than 3 pairs)"  # though the best mean moves
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


def fixed_run(reward, alpha, seed, peak):
    s = {"weighting": "fixed", "target": None, "alpha": alpha}
    return {"task": reward, "cell": f"alpha{alpha:+g}", "settings": s, "seed": seed, "peak": peak}


def test_verdicts_json_is_strict_and_tables_give_t_and_p(tmp_path):
    # alpha 1 is exactly .25 below alpha 0 at every seed (exact binary values): SD 0, a loss with p = 0 and no t
    rows = [fixed_run("edge", 0.0, k, peak) for k, peak in ((1, 0.5), (2, 0.75), (3, 0.625))]
    rows += [fixed_run("edge", 1.0, k, peak) for k, peak in ((1, 0.25), (2, 0.5), (3, 0.375))]
    rows += [fixed_run("edge", -1.0, k, peak) for k, peak in ((1, 0.52), (2, 0.70), (3, 0.64))]
    (tmp_path / "grid.json").write_text(json.dumps({"runs": rows}))
    out = tmp_path / "out"
    plot_cifar_grid.main(plot_cifar_grid.Args(grids=(str(tmp_path / "grid.json"),), out=str(out)))

    def refuse(name):
        raise ValueError(f"non-finite {name} in verdicts.json")

    doc = json.loads((out / "verdicts.json").read_text(), parse_constant=refuse)
    assert doc["rule"] == plot_cifar_grid.RULE and "t-test" in doc["rule"] and "2 SE" not in doc["rule"]
    assert doc["level"] == 0.05 and doc["min_pairs"] == 3
    (row,) = [r for r in doc["comparisons"] if r["a"] == "alpha 1" and r["b"] == "alpha 0 (best)"]
    assert (row["verdict"], row["t"], row["p"], row["se"], row["n"]) == ("loss", None, 0.0, 0.0, 3)
    (row,) = [r for r in doc["comparisons"] if r["a"] == "alpha -1" and r["b"] == "alpha 0 (best)"]
    d = [0.52 - 0.5, 0.70 - 0.75, 0.64 - 0.625]
    t = (sum(d) / 3) / (math.sqrt(sum((x - sum(d) / 3) ** 2 for x in d) / 2) / math.sqrt(3))
    assert (
        row["verdict"] == "tie"
        and row["t"] == pytest.approx(t)
        and row["p"] == pytest.approx(1 - abs(t) / math.sqrt(2 + t * t))
    )
    table = (out / "landscape.md").read_text()
    assert f"| tie (t = {t:+.2f}, p = {row['p']:.3f}) |" in table and "| loss (SD 0, p = 0) |" in table
    verdicts = (out / "verdicts.md").read_text()
    assert "| A - B | SE | t | p | verdict |" in verdicts and "| -0.2500 | 0.0000 |  | 0 | loss |" in verdicts


def test_summary_with_no_decided_comparison_says_so(tmp_path):
    # two seeds: every comparison is n/a, so no claim is made either way
    rows = [fixed_run(r, a, k, 0.9 - 0.3 * a + 0.01 * k) for r in ("edge", "mixed") for a in (0.0, 1.0) for k in (1, 2)]
    eps = {"weighting": "fixed", "target": "eps"}
    rows += [{"task": "edge", "cell": "eps", "settings": eps, "seed": k, "peak": 0.1} for k in (1, 2)]
    (tmp_path / "grid.json").write_text(json.dumps({"runs": rows}))
    out = tmp_path / "out"
    out.mkdir()
    page = "# a page\n<!-- generated: summary -->\nold\n<!-- end generated -->\n"
    page += "<!-- generated: landscape -->\n<!-- end generated -->\n"
    (out / "standin.md").write_text(page)  # the generated blocks live on a page other than README.md
    (out / "notes.md").write_text("no generated blocks\n")
    plot_cifar_grid.main(plot_cifar_grid.Args(grids=(str(tmp_path / "grid.json"),), out=str(out)))
    text = (out / "standin.md").read_text()
    none = plot_cifar_grid.NONE_DECIDED
    assert none == "no comparison decided (fewer than 3 pairs)" and "\nold\n" not in text
    (landscape,) = [line for line in text.splitlines() if line.startswith("| a. alpha landscape")]
    assert f"alpha >= 1 against the best: {none}" in landscape and "below the best in" not in landscape
    (targets,) = [line for line in text.splitlines() if line.startswith("| c. targets")]
    assert f"x0 > v > eps (both steps wins) {none}" in targets and "holds" not in targets
    low = [line for line in text.splitlines() if "Low-noise emphasis" in line]
    assert len(low) == 2 and all(line.endswith(f": {none}.") for line in low)
    assert "**holds**" not in text and "**differs**" not in text and "**partly**" not in text
    assert (out / "notes.md").read_text() == "no generated blocks\n"
