"""The CIFAR alpha landscape and scale study from `halving.py cifar-grid` results.

Reads one or more grid.json files (a grid run in parts, e.g. a seed or a reward per part) and pools
their runs of the fixed 12-bin alpha family (q+a estimator) by (reward, g, alpha, seed); a later
file's run replaces an earlier one's. Writes:

* `landscape.png` / `landscape.md`: per reward, the mean per-run peak +- SD against alpha at g = 1
  (fig:image_landscape), with the paper's selected shape at g = 1 (tab:scale) marked;
* where a reward has at least two scales g with every shape of tab:scale that its g = 1 runs have:
  `scale.md`, the shape with the best mean peak at each such g and the maximum regret of keeping the
  g = 1 winner (tab:scale), and `scale_ranks.png`, the within-scale ranks of the shapes
  (fig:scale-ranks); a scale still missing shapes is named and left out, and every mean is over the
  seeds that all compared cells have. Where g = 1's shapes share more seeds than that, a second row
  and panel compare the scales whose every shape has all of those seeds;
* where a grid ran named targets: `targets.md`, the peaks of the x0, v and eps targets (eq:targets).
  In the 12-bin family x0 is alpha = 0 and v is alpha = 1, so their alpha runs fill those columns;
* where grids ran schedules or data-driven rules (g = 1, q+a): `rules.md`, each one's peak beside the
  x0 control (alpha 0, same seeds), the best fixed alpha, a schedule's two fixed end points and the
  paper's numbers (tab:dynamic, tab:online-full; fig:static gives static softmax only as a plot);
* where grids ran the q+Z and explicit estimators on the same profiles: `estimators.md`, the peak
  differences q+Z - explicit paired by (reward, profile, g, seed), mean +- SD and W/T/L at tolerance
  .003, beside tab:sampling;
* where the runs' folders still hold sample grids: `samples_s<seed>.jpg`, a corner of each run's last
  sample grid (one seed), per reward and weighting; a run without one gets a panel marked "no sample grid
  saved";
* `verdicts.json` / `verdicts.md`: every comparison above decided by one rule (RULE, `verdict`: a paired
  Student's t-test over seeds at 5%, two-sided, n - 1 degrees of freedom: a win or a loss where p < .05, else a
  tie; n/a under 3 pairs), with its t and p, the generated verdict text, and the peaks that are the untrained
  update-0 value; the blocks between `<!-- generated: NAME -->` and `<!-- end generated -->` are refilled from
  them on whichever page of `<out>` (`*.md`) holds them.

Tables show the diversity at the peak (`div_cos_at_peak`, `div_classes_at_peak`) where runs measured it and
"not measured" otherwise. Grids are grid.json files, their folders, or the raw-file tarballs:

    python benchmarks/plot_cifar_grid.py benchmarks/cifar_results/data/*.tar.gz --out benchmarks/cifar_results
"""

from __future__ import annotations

import json
import math
import re
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Sequence, Tuple

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import tyro  # noqa: E402
from results_data import require  # noqa: E402

# tab:scale, column g = 1: the shape with the best mean per-run validation peak on the seven-profile grid.
PAPER_G1_WINNER = {"auto-a35": -1.0, "mixed": -1.0, "edge": 0.0, "clip": -1.0, "simclr": -1.0, "digit7": -0.5}
# tab:scale: the winner at g = .5, .75, 1, 1.5, 2 and the maximum regret of keeping the g = 1 winner.
PAPER_SCALE = {
    "auto-a35": ((-1, -1, -1, -1, -1), 0.0),
    "mixed": ((-1, -1, -1, -0.5, -0.5), 0.1268),
    "edge": ((0, 0, 0, 0, 0), 0.0),
    "clip": ((-1, -1, -1, -1, -1), 0.0),
    "simclr": ((-1, -1, -1, -1, -1), 0.0),
    "digit7": ((0, -0.5, -0.5, 0, 0), 0.0248),
}
PAPER_GS = (0.5, 0.75, 1.0, 1.5, 2.0)
# tab:online-full (online coherence, EMA) and tab:dynamic: peak mean and sample SD over three seeds.
PAPER_RULES = {
    ("auto-a35", "online-ema"): (0.844915, 0.259461),
    ("mixed", "online-ema"): (0.542469, 0.175938),
    ("edge", "online-ema"): (0.960761, 0.008673),
    ("clip", "online-ema"): (0.328924, 0.044492),
    ("simclr", "online-ema"): (0.930397, 0.027878),
    ("mixed", "alpha-3"): (0.907879, 0.039289),
    ("mixed", "alpha-0.5"): (0.896055, 0.139030),
    ("mixed", "schedule-3to-0.5"): (0.987132, 0.007565),
}
# tab:sampling: profile-seed pairs, mean and SD of the peak difference q+Z - explicit, W/T/L.
PAPER_SAMPLING = {"auto-a35": (27, 0.05478, 0.15620, "13/5/9"), "edge": (27, 0.00796, 0.00538, "23/4/0")}
TIE_TOLERANCE = 0.003  # tab:sampling's W/T/L, as halving.py's grid tables (a test keeps the two in step)
SCALE_SHAPES = (-1.0, -0.5, 0.0, 0.5, 1.0, 1.5, 2.0)  # tab:scale's seven profiles

Peaks = Dict[str, Dict[float, Dict[float, Dict[int, float]]]]  # reward -> g -> alpha -> seed -> peak
Runs = List[Tuple[Path, dict]]  # (grid.json path, run record), as grid_runs reads them
Rules = Dict[str, Dict[str, Tuple[dict, Dict[int, float]]]]  # reward -> cell -> (settings, seed -> peak)


@dataclass
class Args:
    grids: tyro.conf.Positional[Tuple[str, ...]]
    """grid.json files of `halving.py cifar-grid` (or their folders)."""
    out: str = "."
    """Folder for the PNGs and tables (and the pages whose generated blocks are refilled)."""
    mark_blank: Tuple[str, ...] = ()
    """Existing sample montages whose empty panels (runs without a sample grid) are to be marked."""


def grid_files(paths: Tuple[str, ...], unpack: Path) -> List[str]:
    """The grid.json files of the given paths: a grid.json, a folder holding one, or a raw-file tarball
    (`data/*.tar.gz`), unpacked under `unpack` and read in the order of its grid.json paths."""
    out: List[str] = []
    for p in paths:
        if str(p).endswith((".tar.gz", ".tgz")):
            dest = unpack / Path(p).name.split(".t")[0]
            with tarfile.open(require(p)) as tar:
                tar.extractall(dest, filter="data")
            out += sorted(str(g) for g in dest.rglob("grid.json"))
        else:
            out.append(p)
    return out


def grid_runs(paths: Tuple[str, ...]) -> Runs:
    """(grid.json path, run record) for every run of the given grid.json files (or their folders)."""
    out = []
    for p in paths:
        path = Path(p) / "grid.json" if Path(p).is_dir() else Path(p)
        out += [(path, run) for run in json.loads(path.read_text())["runs"]]
    return out


def run_info(path: Path, run: dict) -> Dict[str, object]:
    """A run's peak update and, where its trainer measured them, the diversity of its validation images
    at the peak validation (`div_cos_at_peak`, `div_classes_at_peak` in summary.json, or the peak's
    validation row of metrics.jsonl); None where not measured."""
    info: Dict[str, object] = {"peak_update": run.get("peak_update"), "div_cos": None, "div_classes": None}
    for key, field in (("div_cos", "div_cos_at_peak"), ("div_classes", "div_classes_at_peak")):
        info[key] = run.get(field)
    folder = path.parent / "arms" / str(run.get("name", ""))
    summary = folder / "summary.json"
    if run.get("name") and summary.is_file():
        doc = json.loads(summary.read_text())
        if info["peak_update"] is None:
            info["peak_update"] = doc.get("peak_update")
        for key, field in (("div_cos", "div_cos_at_peak"), ("div_classes", "div_classes_at_peak")):
            if info[key] is None:
                info[key] = doc.get(field)
    metrics = folder / "metrics.jsonl"
    if run.get("name") and info["div_cos"] is None and metrics.is_file() and info["peak_update"] is not None:
        for line in metrics.read_text().splitlines():
            row = json.loads(line) if line.strip() else {}
            if row.get("kind") == "validation" and row.get("update") == info["peak_update"]:
                info["div_cos"] = row.get("val_div_cos", info["div_cos"])
                info["div_classes"] = row.get("val_div_classes", info["div_classes"])
    return info


def in_fixed_family(run: Dict) -> bool:
    """A run of the fixed alpha family (q+a, the x0 target) that has a peak."""
    s = run["settings"]
    fixed = s.get("weighting") == "fixed" and not s.get("target") and s.get("estimator", "q+a") == "q+a"
    return fixed and run.get("peak") is not None


def fixed_alpha_info(runs: Runs) -> Dict[str, Dict[float, Dict[float, Dict[int, Dict[str, object]]]]]:
    """reward -> g -> alpha -> seed -> run_info, over the runs fixed_alpha_peaks takes."""
    out: Dict[str, Dict[float, Dict[float, Dict[int, Dict[str, object]]]]] = {}
    for path, run in filter(lambda pr: in_fixed_family(pr[1]), runs):
        s = run["settings"]
        by_alpha = out.setdefault(run["task"], {}).setdefault(float(s.get("g", 1.0)), {})
        by_alpha.setdefault(float(s["alpha"]), {})[int(run["seed"])] = run_info(path, run)
    return out


def cell_info(runs: Runs) -> Dict[Tuple[str, str, int], Dict[str, object]]:
    """(reward, cell, seed) -> run_info for every run with a peak (a later file's run replaces an earlier's)."""
    return {
        (run["task"], str(run.get("cell")), int(run["seed"])): run_info(path, run)
        for path, run in runs
        if run.get("peak") is not None
    }


def update0_peaks(runs: Runs) -> List[Tuple[str, str, int, float]]:
    """(reward, cell, seed, peak) of the runs whose peak is the update-0 validation: the untrained
    generator's reward, never bettered by training."""
    found = {}
    for path, run in runs:
        if run.get("peak") is not None and run_info(path, run)["peak_update"] == 0:
            found[(run["task"], str(run.get("cell")), int(run["seed"]))] = float(run["peak"])
    return [(r, c, k, v) for (r, c, k), v in sorted(found.items())]


def fixed_alpha_peaks(runs: Runs) -> Peaks:
    """reward -> g -> alpha -> seed -> per-run peak, over the runs of the fixed alpha family (q+a) that
    have a peak."""
    out: Peaks = {}
    for _, run in filter(lambda pr: in_fixed_family(pr[1]), runs):
        s = run["settings"]
        by_alpha = out.setdefault(run["task"], {}).setdefault(float(s.get("g", 1.0)), {})
        by_alpha.setdefault(float(s["alpha"]), {})[int(run["seed"])] = float(run["peak"])
    return out


def target_peaks(runs: Runs, data: Peaks) -> Dict[str, Dict[str, Dict[int, float]]]:
    """reward -> target (x0, v, eps) -> seed -> per-run peak at g = 1; x0 and v are taken from the alpha
    0 and 1 runs of `data` unless a grid ran them as named targets."""
    out: Dict[str, Dict[str, Dict[int, float]]] = {}
    for reward, by_g in data.items():
        for target, alpha in (("x0", 0.0), ("v", 1.0)):
            if alpha in by_g.get(1.0, {}):
                out.setdefault(reward, {})[target] = dict(by_g[1.0][alpha])
    for _, run in runs:
        s = run["settings"]
        if not s.get("target") or float(s.get("g", 1.0)) != 1.0 or run.get("peak") is None:
            continue
        by_seed = out.setdefault(run["task"], {}).setdefault(s["target"], {})
        by_seed[int(run["seed"])] = float(run["peak"])
    return out


def rule_peaks(runs: Runs) -> Rules:
    """reward -> cell -> (settings, seed -> peak) over the runs of schedules and data-driven rules at
    g = 1 with the q+a estimator that have a peak."""
    out: Rules = {}
    for _, run in runs:
        s = run["settings"]
        if s.get("weighting") == "fixed" or float(s.get("g", 1.0)) != 1.0 or s.get("estimator", "q+a") != "q+a":
            continue
        if run.get("peak") is not None:
            cell = out.setdefault(run["task"], {}).setdefault(run["cell"], (s, {}))
            cell[1][int(run["seed"])] = float(run["peak"])
    return out


def estimator_pairs(runs: Runs) -> Dict[str, List[Tuple[str, int, float, float]]]:
    """reward -> [(profile, seed, q+Z peak, explicit peak)] over the (profile, g, seed) pairs where both
    estimators' runs have a peak; the profile is the run's cell without its estimator."""
    peaks: Dict[Tuple[str, str, int], Dict[str, float]] = {}
    for _, run in runs:
        est = run["settings"].get("estimator")
        if est in ("q+Z", "explicit") and run.get("peak") is not None:
            key = (run["task"], run["cell"].rsplit("__", 1)[0], int(run["seed"]))
            peaks.setdefault(key, {})[est] = float(run["peak"])
    out: Dict[str, List[Tuple[str, int, float, float]]] = {}
    for (reward, profile, seed), by_est in sorted(peaks.items()):
        if len(by_est) == 2:
            out.setdefault(reward, []).append((profile, seed, by_est["q+Z"], by_est["explicit"]))
    return out


def mean_sd(values: List[float]) -> Tuple[float, float]:
    m = sum(values) / len(values)
    sd = math.sqrt(sum((v - m) ** 2 for v in values) / (len(values) - 1)) if len(values) > 1 else float("nan")
    return m, sd


def bare(text: str) -> str:
    """Numbers without leading zeros (.958 +- .004, -.0057), as the pages' tables write them; 10.5 stays."""
    return re.sub(r"(?<![\d.])0\.", ".", text)


def pm(values: List[float], sign: str = "", digits: int = 4, lead: bool = True) -> str:
    """'mean +- SD' of the values (the mean alone for one value); sign "+" writes the mean's sign; without
    ``lead``, no leading zeros (.958 +- .004, as the pages' tables write them)."""
    m, sd = mean_sd(values)
    text = f"{m:{sign}.{digits}f}" + ("" if math.isnan(sd) else f" +- {sd:.{digits}f}")
    return text if lead else bare(text)


LEVEL = 0.05  # two-sided significance level of the paired t-test
MIN_PAIRS = 3  # with fewer pairs a comparison has no verdict
NONE_DECIDED = "no comparison decided (fewer than 3 pairs)"
RULE = (
    "Every comparison is a paired difference over seeds: runs with the same seed are paired (where a comparison"
    " pools several profiles or shapes, each (profile, seed) is a pair). The n differences go through a paired"
    " Student's t-test at 5%, two-sided: t = mean / SE (SE = sample SD of the differences / sqrt(n)) against"
    " Student's t with n - 1 degrees of freedom. Where p < .05 the comparison is a win (mean above 0) or a loss"
    " (below); otherwise it is a tie. With fewer than 3 pairs there is no verdict (n/a). Differences that are all"
    " 0 are a tie (p = 1); equal nonzero differences (SD 0) are a win or a loss with p = 0 and no finite t (t"
    " null in verdicts.json)."
)


def beta_fraction(a: float, b: float, x: float) -> float:
    """The continued fraction of the incomplete beta function (modified Lentz), which converges fast for
    x < (a + 1) / (a + b + 2)."""
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 100_000):
        for num in (
            m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
            -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1)),
        ):
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + num / c
            c = c if abs(c) > tiny else tiny
            h *= c * d
        if abs(c * d - 1.0) < 1e-16:
            return h
    raise ArithmeticError(f"incomplete beta fraction did not converge at a={a}, b={b}, x={x}")


def incomplete_beta(a: float, b: float, x: float, y: float) -> float:
    """The regularized incomplete beta function I_x(a, b), given x and y = 1 - x (each exact, so that neither is
    rounded as 1 minus the other)."""
    if x <= 0.0 or y <= 0.0:
        return 0.0 if x <= 0.0 else 1.0
    if x > (a + 1) / (a + b + 2):
        return 1.0 - incomplete_beta(b, a, y, x)
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log(y)
    return math.exp(log_front) * beta_fraction(a, b, x) / a


def t_two_sided(t: float, df: float) -> float:
    """P(|T| >= |t|) for Student's t with df degrees of freedom: I_{df / (df + t^2)}(df / 2, 1 / 2)."""
    return incomplete_beta(df / 2, 0.5, df / (df + t * t), t * t / (df + t * t))


def t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with df degrees of freedom."""
    half = t_two_sided(t, df) / 2
    return 1.0 - half if t >= 0 else half


def t_critical(df: float, level: float = LEVEL) -> float:
    """The t beyond which a two-sided test at `level` decides: P(|T| >= t) = level, by bisection."""
    lo, hi = 0.0, 1.0
    while t_two_sided(hi, df) > level:
        lo, hi = hi, 2 * hi
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if t_two_sided(mid, df) > level else (lo, mid)
        if hi - lo < 1e-13 * hi:
            break
    return (lo + hi) / 2


def verdict(diffs: Sequence[float]) -> Tuple[str, float, float, float | None, float | None]:
    """(verdict, mean, SE, t, p) of paired differences A - B under RULE: a paired Student's t-test at LEVEL,
    two-sided, n - 1 degrees of freedom: "win" (A above B) or "loss" where p < LEVEL, else "tie"; "n/a" with
    fewer than MIN_PAIRS pairs (t and p None). Differences all 0: a tie with p = 1; all equal and nonzero (SD 0):
    a win or a loss with p = 0; t is None for both (not finite)."""
    n = len(diffs)
    m = sum(diffs) / n if n else float("nan")
    se = math.sqrt(sum((d - m) ** 2 for d in diffs) / (n - 1) / n) if n > 1 else float("nan")
    if n < MIN_PAIRS:
        return "n/a", m, se, None, None
    if all(d == diffs[0] for d in diffs) or se == 0:
        return ("tie", m, 0.0, None, 1.0) if m == 0 else ("win" if m > 0 else "loss", m, 0.0, None, 0.0)
    t = m / se
    p = t_two_sided(t, n - 1)
    return ("win" if t > 0 else "loss") if p < LEVEL else "tie", m, se, t, p


def paired(a: Dict[int, float], b: Dict[int, float]) -> List[float]:
    """a[seed] - b[seed] over the seeds both have, in seed order."""
    return [a[k] - b[k] for k in sorted(a) if k in b]


def tested_row(diffs: Sequence[float]) -> Dict[str, object]:
    """n, mean, SE, t, p and verdict of paired differences (verdict), with None for what is not finite."""
    v, m, se, t, p = verdict(diffs)
    return {"n": len(diffs), "mean": None if math.isnan(m) else m, "se": None if math.isnan(se) else se, "t": t,
            "p": p, "verdict": v}  # fmt: skip


def summary_word(row: Dict[str, object]) -> str:
    """A comparison's verdict with its t and p for a summary line, or NONE_DECIDED."""
    return NONE_DECIDED if row["verdict"] == "n/a" else verdict_cell(row)


class Report:
    """Every comparison the report makes (verdicts.json, verdicts.md) and the generated text blocks that
    replace the marked blocks of the report's pages."""

    def __init__(self) -> None:
        self.rows: List[Dict[str, object]] = []
        self.blocks: Dict[str, List[str]] = {}

    def compare(self, section: str, reward: str, a: str, b: str, diffs: Sequence[float], pairs: str = "seed"):
        row = {"section": section, "reward": reward, "a": a, "b": b, "pairs": pairs, **tested_row(diffs)}
        self.rows.append(row)
        return row

    def add(self, block: str, *lines: str) -> None:
        self.blocks.setdefault(block, []).extend(lines)


def p_text(p: float | None) -> str:
    """A p-value in three decimals ('0.023'), below .001 in two digits ('4.1e-05'), '0' for 0, '' for None."""
    return "" if p is None else "0" if p == 0 else f"{p:.3f}" if p >= 0.001 else f"{p:.1e}"


def test_text(row: Dict[str, object]) -> str:
    """'t = +2.63, p = 0.023' for a decided comparison row ('SD 0, p = 0' where t is not finite); '' for n/a."""
    if row["p"] is None:
        return ""
    return ("SD 0" if row["t"] is None else f"t = {row['t']:+.2f}") + f", p = {p_text(row['p'])}"


def verdict_cell(row: Dict[str, object]) -> str:
    """'win (t = +2.63, p = 0.023)' for a comparison row: its verdict with t and p beside it; 'n/a' alone."""
    test = test_text(row)
    return f"{row['verdict']} ({test})" if test else str(row["verdict"])


def diff_text(row: Dict[str, object]) -> str:
    """'+0.0071 +- 0.0027 (SE, n = 12), win (t = +2.63, p = 0.023)' for a comparison row."""
    if row["mean"] is None:
        return "no pairs, n/a"
    se = "" if row["se"] is None else f" +- {row['se']:.4f}"
    return f"{row['mean']:+.4f}{se} (SE, n = {row['n']}), {verdict_cell(row)}"


def claim(row: Dict[str, object], words: Dict[str, str]) -> str:
    """The word a claim takes from a comparison's verdict (`words`: verdict -> word), or NONE_DECIDED."""
    return words.get(str(row["verdict"]), NONE_DECIDED)


def names(values: Sequence[float]) -> str:
    return ", ".join(f"{v:g}" for v in values) if values else "none"


def tied_ranks(by_alpha: Dict[float, Dict[int, float]], alphas: Sequence[float], seeds: Sequence[int]) -> List[int]:
    """Per shape, 1 + the number of shapes that beat it under the verdict rule (a paired t-test over `seeds`, p <
    .05): shapes that no other shape separates share rank 1."""
    sub = {a: {k: by_alpha[a][k] for k in seeds} for a in alphas}
    return [1 + sum(verdict(paired(sub[b], sub[a]))[0] == "win" for b in alphas if b != a) for a in alphas]


def scale_summary(by_g: Dict[float, Dict[float, Dict[int, float]]]) -> Dict[str, object]:
    """Over tab:scale's shapes that the g = 1 runs have (all runs' if there is no g = 1), the scales
    that have every one of them (the others are listed under "incomplete"), and the seeds that every
    such cell has (so each mean is over the same seeds): the winner (best mean peak) at each g, the
    maximum regret of keeping the g = 1 winner, the within-scale ranks by mean (1 = best) and the ranks
    under the verdict rule (tied_ranks), as (alphas, gs) arrays."""
    ref = set(by_g[1.0]) if 1.0 in by_g else set().union(*map(set, by_g.values()))
    alphas = sorted(ref & set(SCALE_SHAPES))
    gs = sorted(g for g in by_g if set(alphas) <= set(by_g[g]))
    incomplete = sorted(set(by_g) - set(gs))
    cells = [set(by_g[g][a]) for g in gs for a in alphas]
    seeds = sorted(set.intersection(*cells)) if cells else []
    if len(gs) < 2 or not alphas or not seeds:
        return {"gs": gs, "alphas": alphas, "incomplete": incomplete, "seeds": seeds}
    means = np.array([[np.mean([by_g[g][a][k] for k in seeds]) for g in gs] for a in alphas])
    winners = {g: alphas[int(np.argmax(means[:, j]))] for j, g in enumerate(gs)}
    regret = 0.0
    if 1.0 in by_g:
        keep = alphas.index(winners[1.0])
        regret = float(max(means[:, j].max() - means[keep, j] for j in range(len(gs))))
    ranks = np.argsort(np.argsort(-means, axis=0), axis=0) + 1
    tied = np.array([tied_ranks(by_g[g], alphas, seeds) for g in gs]).T
    return {
        "tied_ranks": tied,
        "gs": gs,
        "alphas": alphas,
        "incomplete": incomplete,
        "seeds": seeds,
        "means": means,
        "winners": winners,
        "regret": regret,
        "ranks": ranks,
    }


def div_text(infos: Sequence[Dict[str, object]], missing: str = "not measured") -> Tuple[str, str]:
    """(mean cosine diversity, mean number of classes) over the runs that measured them, with their count
    where not every run did; `missing` where none did."""
    out = []
    for key, fmt in (("div_cos", ".3f"), ("div_classes", ".1f")):
        vals = [float(i[key]) for i in infos if i.get(key) is not None]
        if not vals:
            out.append(missing)
            continue
        text = f"{sum(vals) / len(vals):{fmt}}"
        out.append(text if len(vals) == len(infos) else f"{text} ({len(vals)} of {len(infos)})")
    return out[0], out[1]


def update0_text(infos: Dict[int, Dict[str, object]]) -> str:
    """The seeds whose peak is the untrained update-0 validation."""
    return ", ".join(str(k) for k in sorted(infos) if infos[k].get("peak_update") == 0)


def landscape_verdicts(data: Peaks, report: Report) -> Dict[str, Dict[str, object]]:
    """Per reward at g = 1: the best mean alpha, and every alpha against it and against the paper's
    selected shape (tab:scale), paired by seed."""
    out: Dict[str, Dict[str, object]] = {}
    for reward in sorted(r for r in data if 1.0 in data[r]):
        runs = data[reward][1.0]
        means = {a: mean_sd(list(runs[a].values()))[0] for a in runs}
        best = max(means, key=means.get)
        paper = PAPER_G1_WINNER.get(reward)
        vs_best, vs_paper = {}, {}
        for a in sorted(runs):
            if a != best:
                vs_best[a] = report.compare(
                    "landscape", reward, f"alpha {a:g}", f"alpha {best:g} (best)", paired(runs[a], runs[best])
                )
            if paper is not None and paper in runs and a != paper:
                vs_paper[a] = report.compare(
                    "landscape", reward, f"alpha {a:g}", f"alpha {paper:g} (paper)", paired(runs[a], runs[paper])
                )
        out[reward] = {"best": best, "means": means, "paper": paper, "vs_best": vs_best, "vs_paper": vs_paper}
    return out


def write_landscape(data: Peaks, info, out: Path, report: Report) -> None:
    found = landscape_verdicts(data, report)
    rewards = list(found)
    fig, axes = plt.subplots(1, len(rewards), figsize=(4.2 * len(rewards), 3.9), squeeze=False, sharey=True)
    head = "| reward | alpha | n | peak mean +- SD | seeds | paper's g = 1 shape (tab:scale) | minus best, paired |"
    head += " vs best | minus paper's shape, paired | vs paper's shape | peak at update 0 (seeds) | diversity (cos) |"
    lines = [head + " classes |", "|---" * 13 + "|"]
    for ax, reward in zip(axes[0], rewards):
        runs, v = data[reward][1.0], found[reward]
        alphas = sorted(runs)
        stats = [mean_sd(list(runs[a].values())) for a in alphas]
        sds = [0 if math.isnan(s) else s for _, s in stats]
        n = sorted({len(runs[a]) for a in alphas})
        lost = [a != v["best"] and v["vs_best"][a]["verdict"] == "loss" for a in alphas]

        def draw(target, with_label):
            target.errorbar(alphas, [m for m, _ in stats], yerr=sds, color="C0", capsize=3, zorder=1)
            for a, (m, _), low in zip(alphas, stats, lost):
                face = "white" if low else "C0"
                target.plot([a], [m], "o", mfc=face, mec="C0", zorder=2)
            if reward in PAPER_G1_WINNER:
                label = "paper's g = 1 shape" if with_label else None
                target.axvline(PAPER_G1_WINNER[reward], color="gray", ls="--", label=label)

        draw(ax, True)
        ax.plot([], [], "o", color="C0", label="ties the best (or is it)")
        ax.plot([], [], "o", mfc="white", mec="C0", label="below the best (loss)")
        ax.legend(fontsize=7, loc="lower left")
        ax.set_ylim(0, 1.02)
        means = [m for m, _ in stats]
        if max(means) - min(means) < 0.1:  # a narrow landscape: magnified in an inset, axis marked
            lo, hi = min(m - s for (m, _), s in zip(stats, sds)), max(m + s for (m, _), s in zip(stats, sds))
            pad = (hi - lo) * 0.1 or 0.005  # one point and no spread: a small fixed window
            inset = ax.inset_axes([0.5, 0.3, 0.47, 0.4])
            draw(inset, False)
            inset.set_ylim(lo - pad, hi + pad)
            inset.set_title(f"zoom: y {lo - pad:.3f} to {hi + pad:.3f}", fontsize=7)
            inset.tick_params(labelsize=6)
        ax.set_title(f"{reward} (n = {'-'.join(map(str, n))} seeds)")
        ax.set(xlabel="alpha (smaller: more high-noise emphasis)")
        for a, (m, s) in zip(alphas, stats):
            seeds = ", ".join(str(k) for k in sorted(runs[a]))
            sd = "" if math.isnan(s) else f" +- {s:.4f}"
            paper = "" if v["paper"] is None else f"{v['paper']:g}"
            best = v["vs_best"].get(a)
            vs_best = ["", "best"] if best is None else [diff_text(best).split(" (")[0], verdict_cell(best)]
            pap = v["vs_paper"].get(a)
            if pap is None:
                vs_pap = ["", "paper's shape" if v["paper"] == a else ""]
            else:
                vs_pap = [diff_text(pap).split(" (")[0], verdict_cell(pap)]
            infos = info.get(reward, {}).get(1.0, {}).get(a, {})
            cells = [reward, f"{a:g}", str(len(runs[a])), f"{m:.4f}{sd}", seeds, paper, *vs_best, *vs_pap]
            cells += [update0_text(infos), *div_text(list(infos.values()))]
            lines.append("| " + " | ".join(cells) + " |")
    axes[0][0].set_ylabel("per-run validation peak\n(mean over seeds; bars: sample SD)")
    fig.suptitle(
        "Peak against alpha at g = 1. Bars: sample SD over seeds. Open markers: below the best alpha under the"
        " paired t-test (p < .05, two-sided)",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(out / "landscape.png", dpi=110)
    plt.close(fig)
    (out / "landscape.md").write_text(f"{RULE}\n\n" + "\n".join(lines) + "\n")
    print(f"wrote {out / 'landscape.png'} {out / 'landscape.md'}")
    landscape_text(data, found, report)
    peak_table(data, found, report)


def peak_table(data: Peaks, found: Dict[str, Dict[str, object]], report: Report) -> None:
    """The pages' landscape table: one row a reward, the peak's mean +- sample SD over seeds per alpha."""
    alphas = sorted({a for reward in found for a in data[reward][1.0]})
    lines = ["| alpha (seeds) | " + " | ".join(f"{a:g}" for a in alphas) + " |", "|---" * (len(alphas) + 1) + "|"]
    for reward, v in found.items():
        runs = data[reward][1.0]
        n = sorted({len(runs[a]) for a in runs})
        cells = [f"{reward} ({'-'.join(map(str, n))})"]
        for a in alphas:
            if a not in runs:
                cells.append("")
                continue
            cell = pm(list(runs[a].values()), digits=3, lead=False)
            cell = f"**{cell}**" if a == v["best"] else cell
            cells.append(cell + (" *" if a == v["paper"] else ""))
        lines.append("| " + " | ".join(cells) + " |")
    report.add("peaks", *lines)


def tested(alphas: Sequence[float], rows: Dict[float, Dict[str, object]]) -> str:
    """'-1 (t = -2.10, p = 0.127), 0.5 (...)': the alphas, each with the t and p of its comparison row."""
    return ", ".join(f"{a:g}" + (f" ({test_text(rows[a])})" if test_text(rows[a]) else "") for a in alphas) or "none"


def landscape_text(data: Peaks, found: Dict[str, Dict[str, object]], report: Report) -> None:
    low_lost, low_all, plateau_tied, plateau_all, papers = 0, 0, 0, 0, []
    for reward, v in found.items():
        best, means, paper, rows = v["best"], v["means"], v["paper"], v["vs_best"]
        tied = [a for a, r in rows.items() if r["verdict"] == "tie"]
        lost = [a for a, r in rows.items() if r["verdict"] == "loss"]
        na = [a for a, r in rows.items() if r["verdict"] == "n/a"]
        low = [a for a in sorted(means) if a >= 1 and a != best]
        low_lost += sum(a in lost for a in low)
        low_all += sum(a not in na for a in low)
        high = [a for a in sorted(means) if a <= 0.5 and a != best]
        plateau_tied += sum(a in tied for a in high)
        plateau_all += sum(a not in na for a in high)
        lines = [
            f"- **{reward}**: best mean alpha {best:g} ({means[best]:.4f}). Tied with it: alpha {tested(tied, rows)};"
        ]
        lines[-1] += f" below it (loss): alpha {tested(lost, rows)}" + (f"; n/a: alpha {names(na)}." if na else ".")
        if paper is None or paper not in means:
            text = "no paper shape to compare"
        elif paper == best:
            word = "**holds**" if len(na) < len(rows) else NONE_DECIDED
            text = f"the paper's g = 1 shape ({paper:g}) is the best mean here: {word}"
        else:
            word = claim(rows[paper], {"tie": "**holds** (tie)", "loss": "**differs**", "win": "**holds**"})
            text = f"the paper's g = 1 shape ({paper:g}) against the best: {diff_text(rows[paper])}: {word}"
        papers.append(f"{reward} {'best' if paper == best else verdict_cell(rows[paper]) if paper in rows else 'n/a'}")
        lost_low = [a for a in low if a in lost]
        word = "**holds**" if len(lost_low) == len(low) else "**partly**" if lost_low else "**differs**"
        word = word if any(a not in na for a in low) else NONE_DECIDED
        lines.append(
            f"  Low-noise emphasis (alpha >= 1) below the best at alpha {names(lost_low)} of {names(low)}: {word}."
        )
        high_lost = [a for a in high if a in lost]
        word = ("**holds**" if not high_lost else "**partly**") if any(a not in na for a in high) else NONE_DECIDED
        lines.append(
            f"  High-noise side and x0 (alpha <= 0.5): tied with the best at {names([a for a in high if a in tied])},"
            f" below it at {names(high_lost)}: {word}. {text[0].upper()}{text[1:]}."
        )
        report.add("landscape", *lines)
    low_text = f"alpha >= 1 below the best in {low_lost} of {low_all} (reward, alpha) cells" if low_all else None
    high_text = f"alpha <= 0.5 tied with the best in {plateau_tied} of {plateau_all}" if plateau_all else None
    report.add(
        "summary_landscape",
        f"{low_text or 'alpha >= 1 against the best: ' + NONE_DECIDED}; "
        f"{high_text or 'alpha <= 0.5 against the best: ' + NONE_DECIDED}; paper's g = 1 shape against the best: "
        + ", ".join(papers),
    )


def scale_summaries(by_g: Dict[float, Dict[float, Dict[int, float]]]) -> List[Dict[str, object]]:
    """The scale study over every complete scale (scale_summary) and, where the g = 1 shapes share more
    seeds than it could use, a second one over the scales whose every shape has all of those seeds."""
    first = scale_summary(by_g)
    if 1.0 not in by_g or len(first["gs"]) < 2 or not first["alphas"]:
        return [first]
    g1_seeds = set.intersection(*(set(by_g[1.0][a]) for a in first["alphas"]))
    wider = [g for g in first["gs"] if all(g1_seeds <= set(by_g[g][a]) for a in first["alphas"])]
    if len(g1_seeds) <= len(first["seeds"]) or len(wider) < 2:
        return [first]
    return [first, scale_summary({g: by_g[g] for g in wider})]


def write_scale(data: Peaks, info, out: Path, report: Report) -> None:
    summaries = {r: scale_summaries(data[r]) for r in sorted(data) if len(data[r]) > 1}
    for r, (s, *_) in summaries.items():
        if s["incomplete"]:
            short = ", ".join(f"{g:g}" for g in s["incomplete"])
            print(f"{r}: g = {short} left out of the scale study (not every shape of tab:scale has run)")
        if len(s["gs"]) > 1 and not s["seeds"]:
            print(f"{r}: no seed has run every shape at every complete scale")
    panels = [(r, s) for r, ss in summaries.items() for s in ss if "winners" in s]
    if not panels:
        return
    fig, axes = plt.subplots(1, len(panels), figsize=(3.9 * len(panels), 4.1), squeeze=False)
    lines = ["| reward | source | seeds | " + " | ".join(f"g = {g:g}" for g in PAPER_GS) + " | max regret |"]
    lines.append("|---" * (len(PAPER_GS) + 4) + "|")
    checks = [
        "| reward | seeds | g | best mean shape | tied with the best | paper's shape | paper's shape minus best |"
    ]
    checks[-1] += " g = 1 winner minus best | best shape's diversity (cos) | classes |"
    checks.append("|---" * 10 + "|")
    for ax, (reward, s) in zip(axes[0], panels):
        cells = [f"{s['winners'][g]:g}" if g in s["winners"] else "-" for g in PAPER_GS]
        seeds = ", ".join(map(str, s["seeds"]))
        lines.append(f"| {reward} | this code | {seeds} | " + " | ".join(cells) + f" | {s['regret']:.4f} |")
        if reward in PAPER_SCALE and s is summaries[reward][-1]:
            won, regret = PAPER_SCALE[reward]
            lines.append(f"| {reward} | paper | n = 3 | " + " | ".join(f"{a:g}" for a in won) + f" | {regret:.4f} |")
        scale_checks(reward, s, data[reward], info.get(reward, {}), checks, report)
        tied, n = s["tied_ranks"], len(s["seeds"])
        ax.set(title=f"{reward}, n = {n} seed{'s' * (n != 1)}", xlabel="scale g", ylabel="alpha")
        ax.set_xticks(range(len(s["gs"])), [f"{g:g}" for g in s["gs"]])
        ax.set_yticks(range(len(s["alphas"])), [f"{a:g}" for a in s["alphas"]])
        if n < MIN_PAIRS:  # the rule needs three pairs: no shape beats another, and no rank is shown
            ax.imshow(np.zeros(tied.shape), cmap="Greys", aspect="auto", vmin=0, vmax=1)
            text = f"{n} seed{'s' * (n != 1)}: no ranks\n(the rule needs {MIN_PAIRS})"
            ax.text(0.5, 0.5, text, ha="center", transform=ax.transAxes)
            continue
        ax.imshow(tied, cmap="viridis_r", aspect="auto", vmin=1, vmax=len(s["alphas"]))
        for (i, j), r in np.ndenumerate(tied):
            shared = int((tied[:, j] == r).sum()) > 1
            dark = r > (len(s["alphas"]) + 1) / 2  # viridis_r: the low ranks are dark
            ax.text(
                j, i, f"={r}" if shared else str(r), ha="center", va="center", color="w" if dark else "k", fontsize=8
            )
    fig.suptitle(
        "Rank within each scale = 1 + shapes that beat it (paired t-test by seed, p < .05); '=r': rank shared (tied)",
        fontsize=8,
    )
    fig.tight_layout()
    fig.savefig(out / "scale_ranks.png", dpi=110)
    plt.close(fig)
    text = "\n".join(lines) + "\n\nPer scale, under the verdict rule (paired by seed over the seeds above):\n\n"
    (out / "scale.md").write_text(f"{RULE}\n\n" + text + "\n".join(checks) + "\n")
    print(f"wrote {out / 'scale_ranks.png'} {out / 'scale.md'}")


def scale_checks(reward: str, s: Dict[str, object], by_g, info, checks: List[str], report: Report) -> None:
    """Per scale of one scale summary: the shapes tied with the best mean, the paper's shape (tab:scale),
    the g = 1 winner against the best and the best shape's diversity at its peaks (info: g -> alpha -> seed
    -> run_info); then the attainable reward at each g against g = 1."""
    seeds, alphas = s["seeds"], s["alphas"]
    paper = dict(zip(PAPER_GS, PAPER_SCALE[reward][0])) if reward in PAPER_SCALE else {}
    keep = s["winners"].get(1.0)
    sub = {g: {a: {k: by_g[g][a][k] for k in seeds} for a in alphas} for g in s["gs"]}
    tag = f"n = {len(seeds)}"
    moved, paper_words, keep_words = [], [], []
    for g in s["gs"]:
        best = s["winners"][g]
        tied = [a for a in alphas if a != best and verdict(paired(sub[g][a], sub[g][best]))[0] == "tie"]
        cells = [reward, ", ".join(map(str, seeds)), f"{g:g}", f"{best:g}", names(tied)]
        p = paper.get(g)
        if p is None or float(p) not in sub[g]:
            cells += ["", ""]
        elif float(p) == best:
            cells += [f"{p:g}", "the best"]
            paper_words.append(f"g {g:g}: best")
        else:
            row = report.compare(
                "scale",
                reward,
                f"alpha {p:g} (paper) at g {g:g}, {tag}",
                f"alpha {best:g} (best)",
                paired(sub[g][float(p)], sub[g][best]),
            )
            cells += [f"{p:g}", diff_text(row)]
            paper_words.append(f"g {g:g}: {verdict_cell(row)}")
        if keep is None or keep == best:
            cells.append("the best" if keep is not None else "")
            keep_words.append("best")
        else:
            row = report.compare(
                "scale",
                reward,
                f"alpha {keep:g} (g = 1 winner) at g {g:g}, {tag}",
                f"alpha {best:g} (best)",
                paired(sub[g][keep], sub[g][best]),
            )
            cells.append(diff_text(row))
            keep_words.append(verdict_cell(row))
            moved += [g] if row["verdict"] == "loss" else []
        cells += div_text([info[g][best][k] for k in seeds if k in info.get(g, {}).get(best, {})])
        checks.append("| " + " | ".join(cells) + " |")
    if keep is None:
        return
    word = "**differs**" if moved else NONE_DECIDED if len(seeds) < MIN_PAIRS else "**holds**"
    report.add(
        "scale",
        f"- **{reward}** ({tag} seeds, g = {names(s['gs'])}): best mean shape per g "
        + ", ".join(f"{s['winners'][g]:g}" for g in s["gs"])
        + f". Keeping g = 1's winner ({keep:g}) against each g's best: {', '.join(keep_words)}: the preferred shape"
        f" moves with scale at g = {names(moved)}: stability {word}. The paper's shape per g (tab:scale) against"
        f" the best: {'; '.join(paper_words)}.",
    )
    report.add(
        "summary_scale",
        f"{reward} ({tag}): {NONE_DECIDED}"
        if len(seeds) < MIN_PAIRS
        else f"{reward} ({tag}): g = 1 winner {keep:g} kept at every g: {word.strip('*')};"
        f" paper's shape: {'; '.join(paper_words)}",
    )
    if 1.0 not in s["gs"]:
        return
    low = [a for a in alphas if a <= 0.5]
    attain = []
    for g in s["gs"]:
        if g == 1.0:
            continue
        diffs = [by_g[g][a][k] - by_g[1.0][a][k] for a in low for k in seeds]
        row = report.compare(
            "scale", reward, f"g {g:g}, alpha {names(low)}, {tag}", "g 1", diffs, pairs="(shape, seed)"
        )
        attain.append(f"g = {g:g} {diff_text(row)}")
    report.add(
        "scale",
        f"  Attainable reward against g = 1, paired by (shape, seed) over alpha {names(low)}: "
        + "; ".join(attain)
        + ".",
    )


def write_targets(peaks: Dict[str, Dict[str, Dict[int, float]]], info, cells, out: Path, report: Report) -> None:
    rewards = sorted(r for r in peaks if "eps" in peaks[r])
    if not rewards:
        return
    head = "| reward | x0 (alpha 0) | v (alpha 1) | eps | best | x0 - v, paired | v - eps, paired | x0 - eps, paired |"
    lines = [head + " diversity (cos) x0 / v / eps | classes x0 / v / eps |", "|---" * 10 + "|"]
    orders, decided, words = 0, 0, []
    table = ["| reward (seeds) | x0 (alpha 0) | v (alpha 1) | eps | diversity at the peak (cos) x0 / v / eps |"]
    table.append("|---" * 5 + "|")
    for reward in rewards:
        row, means = [], {}
        for target in ("x0", "v", "eps"):
            runs = peaks[reward].get(target)
            if not runs:
                row.append("-")
                continue
            means[target] = mean_sd(list(runs.values()))[0]
            row.append(f"{pm(list(runs.values()))} (n={len(runs)})")
        row.append(max(means, key=means.get))
        verdicts, tests = [], []
        for a, b in (("x0", "v"), ("v", "eps"), ("x0", "eps")):
            if a in peaks[reward] and b in peaks[reward]:
                r = report.compare("targets", reward, a, b, paired(peaks[reward][a], peaks[reward][b]))
                row.append(diff_text(r))
                verdicts.append(r["verdict"])
                tests.append(verdict_cell(r))
            else:
                row.append("-")
                verdicts.append("n/a")
                tests.append("n/a")
        fixed = info.get(reward, {}).get(1.0, {})
        divs = [list(fixed.get(0.0, {}).values()), list(fixed.get(1.0, {}).values())]
        divs.append([i for (r, c, _), i in cells.items() if r == reward and c == "eps"])
        texts = [div_text(d) for d in divs]
        row += [" / ".join(t[0] for t in texts), " / ".join(t[1] for t in texts)]
        lines.append(f"| {reward} | " + " | ".join(row) + " |")
        table.append(target_row(reward, peaks[reward], max(means, key=means.get), texts))
        orders += verdicts[:2] == ["win", "win"]
        decided += any(v != "n/a" for v in verdicts[:2])
        words.append(f"{reward}: x0 - v {tests[0]}, v - eps {tests[1]}")
    word = "**holds**" if orders == len(rewards) else f"**holds on {orders} of {len(rewards)} rewards**"
    word, count = (word, f"on {orders} of {len(rewards)} rewards") if decided else (NONE_DECIDED, NONE_DECIDED)
    report.add("targets", f"- x0 above v above eps under the rule {count} ({'; '.join(words)}): {word}.")
    report.add("targets_table", *table)
    report.add("summary_targets", f"x0 > v > eps (both steps wins) {count} ({'; '.join(words)})")
    (out / "targets.md").write_text(f"{RULE}\n\n" + "\n".join(lines) + "\n")
    print(f"wrote {out / 'targets.md'}")


def target_row(reward: str, runs: Dict[str, Dict[int, float]], best: str, divs) -> str:
    """The pages' targets row: mean +- sample SD of the peak per target (the best in bold), diversity."""
    cells = []
    for target in ("x0", "v", "eps"):
        peaks = list(runs.get(target, {}).values())
        cell = pm(peaks, digits=3, lead=False) if peaks else "-"
        cells.append(f"**{cell}**" if target == best else cell)
    n = sorted({len(r) for r in runs.values()})
    return f"| {reward} ({'-'.join(map(str, n))}) | " + " | ".join(cells) + f" | {' / '.join(d[0] for d in divs)} |"


def paper_key(settings: dict) -> str:
    """A rule's name in PAPER_RULES: its weighting, or `schedule<early>to<late>` for a linear path."""
    if settings["weighting"] == "schedule":
        return f"schedule{float(settings['alpha_early']):g}to{float(settings['alpha_late']):g}"
    return settings["weighting"]


def write_rules(rules: Rules, data: Peaks, cells, info, out: Path, report: Report) -> None:
    """rules.md: per reward, the x0 control, the best fixed alpha, each schedule's end points, and every
    schedule and rule: peak mean +- SD, the paired difference from x0 over the seeds both have with its SE
    and verdict, the paper's number where it gives one, and the diversity at the peak where measured."""
    if not rules:
        return
    lines = ["| reward | weighting | n | peak mean +- SD | minus x0, paired (seeds) | SE | vs x0 | paper (n = 3) |"]
    lines[-1] += " diversity (cos) | classes |"
    lines.append("|---" * 10 + "|")
    table: Dict[str, Dict[str, Tuple[List[float], str]]] = {}  # rule cell -> reward -> (peaks, minus x0)
    for reward in sorted(rules):
        fixed = data.get(reward, {}).get(1.0, {})
        x0 = fixed.get(0.0, {})
        notes = {0.0: ["x0 control"]} if x0 else {}
        if fixed:
            notes.setdefault(max(fixed, key=lambda a: mean_sd(list(fixed[a].values()))[0]), []).append("best fixed")
        for settings, _ in rules[reward].values():
            if settings["weighting"] == "schedule":
                for end in (float(settings["alpha_early"]), float(settings["alpha_late"])):
                    if end in fixed:
                        notes.setdefault(end, []).append("path end")
        fixed_info = info.get(reward, {}).get(1.0, {})
        rows = [
            (f"alpha{a:+g}", f" ({', '.join(dict.fromkeys(n))})", fixed[a], f"alpha{a:+g}", fixed_info.get(a, {}))
            for a, n in sorted(notes.items())
        ]
        for cell, (settings, peaks) in rules[reward].items():
            rule_info = {k: i for (r, c, k), i in cells.items() if r == reward and c == cell}
            rows.append((cell, "", peaks, paper_key(settings), rule_info))
        for label, note, peaks, key, infos in rows:
            diff, se, vs = "", "", ""
            if peaks is not x0 and any(s in x0 for s in peaks):
                d = paired(peaks, x0)
                row = report.compare("rules", reward, label, "x0 (alpha 0)", d)
                diff = f"{row['mean']:+.4f} ({len(d)})"
                se, vs = ("" if row["se"] is None else f"{row['se']:.4f}"), verdict_cell(row)
            paper = PAPER_RULES.get((reward, key))
            paper = "" if paper is None else f"{paper[0]:.4f} +- {paper[1]:.4f}"
            values = list(peaks.values())
            cos, classes = div_text(list(infos.values()))
            cols = [reward, f"{label}{note}", str(len(values)), pm(values), diff, se, vs, paper, cos, classes]
            lines.append("| " + " | ".join(cols) + " |")
            if key in ("static-softmax", "online-ema"):
                table.setdefault(label, {})[reward] = (values, diff.split(" (")[0])
        rules_text(reward, rules[reward], fixed, report)
    (out / "rules.md").write_text(f"{RULE}\n\n" + "\n".join(lines) + "\n")
    print(f"wrote {out / 'rules.md'}")
    rules_table(table, report)


def rule_label(cell: str) -> str:
    """static-softmax-eta0.75 -> static softmax eta .75; online-ema-kappa300-uniform -> online EMA (kappa 300,
    uniform start)."""
    if cell.startswith("static-softmax-eta"):
        return "static softmax eta " + cell[len("static-softmax-eta") :].lstrip("0")
    m = re.fullmatch(r"online-ema-kappa([\d.]+)-(\w+)", cell)
    return f"online EMA (kappa {m.group(1)}, {m.group(2)} start)" if m else cell


def rules_table(table: Dict[str, Dict[str, Tuple[List[float], str]]], report: Report) -> None:
    """The pages' rules table: per static or online rule and reward, the peak's mean +- SD (the best mean
    of each reward in bold) and its mean paired difference from x0, then the paper's online numbers."""
    rewards = sorted({r for by in table.values() for r in by})
    if not rewards:
        return
    best = {r: max((c for c in table if r in table[c]), key=lambda c: mean_sd(table[c][r][0])[0]) for r in rewards}
    lines = ["| weighting | " + " | ".join(f"{r} (seeds) | minus x0" for r in rewards) + " |"]
    lines.append("|---" * (1 + 2 * len(rewards)) + "|")
    static = "static-softmax-eta"
    eta = lambda c: float(c[len(static) :]) if c.startswith(static) else 0.0  # noqa: E731
    for cell in sorted(table, key=lambda c: (not c.startswith(static), eta(c))):
        cols = [rule_label(cell)]
        for r in rewards:
            values, diff = table[cell].get(r, ([], ""))
            if not values:
                cols += ["", ""]
                continue
            text = pm(values, lead=False) + f" ({len(values)})"
            cols += [f"**{text}**" if best[r] == cell else text, bare(diff)]
        lines.append("| " + " | ".join(cols) + " |")
    cols = ["paper: online coherence (n = 3)"]
    for r in rewards:
        p = PAPER_RULES.get((r, "online-ema"))
        cols += ["" if p is None else bare(f"{p[0]:.3f} +- {p[1]:.3f}"), ""]
    lines.append("| " + " | ".join(cols) + " |")
    report.add("rules_table", *lines)


def rules_text(reward: str, rules, fixed: Dict[float, Dict[int, float]], report: Report) -> None:
    """The paper's claims on static softmax (fig:static), online rules (app:online-analysis) and paths
    (tab:dynamic), each decided by the verdict rule."""
    x0 = fixed.get(0.0, {})
    best = max(fixed, key=lambda a: mean_sd(list(fixed[a].values()))[0]) if fixed else None
    static = {s["eta"]: p for s, p in rules.values() if s["weighting"] == "static-softmax"}
    summary = []
    if static and best is not None:
        by = {eta: tested_row(paired(p, fixed[best])) for eta, p in static.items()}
        groups = {w: [e for e in sorted(by) if by[e]["verdict"] == w] for w in ("win", "tie", "loss", "n/a")}
        top = max(static, key=lambda e: mean_sd(list(static[e].values()))[0])
        row = report.compare(
            "rules",
            reward,
            f"static softmax eta {top:g} (best mean eta)",
            f"alpha {best:g} (best fixed)",
            paired(static[top], fixed[best]),
        )
        word = claim(row, {"tie": "**holds**", "win": "**holds**", "loss": "**differs**"})
        eta_max = max(static)
        text = f"- **{reward}, static softmax** against the best fixed alpha ({best:g}): etas above it"
        text += f" {tested(groups['win'], by)}, tied {tested(groups['tie'], by)}, below {tested(groups['loss'], by)}"
        text += (f"; n/a {names(groups['n/a'])}" if groups["n/a"] else "") + ". The best mean eta"
        text += f" ({top:g}): {diff_text(row)}: matching the best fixed alpha (fig:static) {word}."
        if eta_max != top:
            more = report.compare(
                "rules",
                reward,
                f"static softmax eta {eta_max:g}",
                f"static softmax eta {top:g} (best mean eta)",
                paired(static[eta_max], static[top]),
            )
            shown = claim(more, {"loss": "**holds**", "tie": "**not shown** (tie)", "win": "**differs**"})
            text += (
                f" The most concentrated eta ({eta_max:g}) against the best eta: {diff_text(more)}: more concentration"
            )
            text += f" is not uniformly better: {shown}."
        report.add("rules", text)
        summary.append((row, f"{reward}: best static eta vs best fixed alpha {summary_word(row)}"))
    for settings, peaks in rules.values():
        if settings["weighting"] == "online-ema" and x0:
            row = report.compare("rules", reward, "online EMA", "x0 (alpha 0)", paired(peaks, x0))
            below = claim(row, {"loss": "**holds**", "tie": "**not shown** (tie)", "win": "**differs**"})
            text = f"- **{reward}, online EMA** minus x0: {diff_text(row)}"
            text += (
                f"; the online peak below its x0 control (app:online-analysis): {below}."
                if reward == "auto-a35"
                else "."
            )
            report.add("rules", text)
            summary.append((row, f"{reward}: online EMA vs x0 {summary_word(row)}"))
        if settings["weighting"] == "schedule":
            ends = [float(settings["alpha_early"]), float(settings["alpha_late"])]
            parts = []
            for end in ends:
                if end in fixed:
                    row = report.compare(
                        "rules",
                        reward,
                        f"path {ends[0]:g} -> {ends[1]:g}",
                        f"fixed alpha {end:g}",
                        paired(peaks, fixed[end]),
                    )
                    above = claim(row, {"win": "**holds**", "tie": "**not shown** (tie)", "loss": "**differs**"})
                    parts.append(
                        f"minus fixed {end:g}: {diff_text(row)}; the path above fixed {end:g} (tab:dynamic): {above}"
                    )
                    summary.append((row, f"{reward}: path vs fixed {end:g} {summary_word(row)}"))
            report.add("rules", f"- **{reward}, path {ends[0]:g} -> {ends[1]:g}**: " + ". ".join(parts) + ".")
    if summary and all(row["verdict"] == "n/a" for row, _ in summary):
        report.add("summary_rules", f"{reward}: {NONE_DECIDED}")
    elif summary:
        report.add("summary_rules", "; ".join(text for _, text in summary))


def write_estimators(
    pairs: Dict[str, List[Tuple[str, int, float, float]]], data: Peaks, cells, out: Path, report: Report
) -> None:
    """estimators.md: per reward, the paired peak differences q+Z - explicit over every (profile, seed) pair
    (mean +- SD, the verdict rule's SE and verdict, and W/T/L with tolerance TIE_TOLERANCE as tab:sampling
    counts them) beside tab:sampling, with each estimator's diversity at the peak where measured (cells:
    cell_info); per profile over its seeds; q+Z against the q+a runs of the same profile and seed; then
    every pair."""

    def infos(reward: str, rows, est: str) -> List[Dict[str, object]]:
        return [cells.get((reward, f"{p}__{est}", k), {}) for p, k, *_ in rows]

    def div_pair(reward: str, rows, missing: str = "not measured") -> List[str]:
        (qc, qn), (ec, en) = (div_text(infos(reward, rows, est), missing) for est in ("q+Z", "explicit"))
        return [f"{qc} / {ec}", f"{qn} / {en}"]

    if not pairs:
        return
    lines = ["| reward | pairs | q+Z - explicit | W/T/L | paper: pairs | paper: q+Z - explicit | paper: W/T/L | SE |"]
    lines[-1] += " verdict |"
    lines.append("|---" * 9 + "|")
    per_profile = ["| reward | profile | q+Z - explicit over seeds | q+Z - q+a over seeds |", "|---" * 4 + "|"]
    summary, table = [], ["| reward | pairs | q+Z - explicit (mean +- SD) | W/T/L at .003 | paper: pairs | paper |"]
    table[0] += " paper W/T/L | diversity at the peak (cos) q+Z / explicit | classes q+Z / explicit |"
    table.append("|---" * 9 + "|")
    for reward, rows in pairs.items():
        diffs = [q - e for _, _, q, e in rows]
        wtl = [sum(d > TIE_TOLERANCE for d in diffs), sum(abs(d) <= TIE_TOLERANCE for d in diffs)]
        wtl.append(len(diffs) - sum(wtl))
        paper = PAPER_SAMPLING.get(reward)
        paper = ["", "", ""] if paper is None else [str(paper[0]), f"{paper[1]:+.5f} +- {paper[2]:.5f}", paper[3]]
        row = report.compare("estimators", reward, "q+Z", "explicit", diffs, pairs="(profile, seed)")
        ours = [str(len(diffs)), pm(diffs, "+"), "/".join(map(str, wtl))]
        se = "" if row["se"] is None else f"{row['se']:.4f}"
        lines.append(f"| {reward} | " + " | ".join(ours + paper + [se, verdict_cell(row)]) + " |")
        names = {p: profile_alpha(p) for p, *_ in rows}  # fixed alphas by value, other profiles by name
        alphas = sorted(a for a in names.values() if not math.isnan(a))
        parts = [f"alpha {', '.join(f'{a:g}' for a in alphas)}"] if alphas else []
        profiles = ", ".join(parts + sorted(p for p, a in names.items() if math.isnan(a)))
        seeds = len({k for _, k, *_ in rows})
        row_cells = [f"{len(diffs)} ({profiles}; {seeds} seeds)", pm(diffs, "+", lead=False)]
        row_cells += ["/".join(map(str, wtl)), *paper, *div_pair(reward, rows)]
        table.append(f"| {reward} | " + " | ".join(row_cells) + " |")
        qa_all = []
        for profile in dict.fromkeys(p for p, *_ in rows):
            sub = [(k, q, e) for p, k, q, e in rows if p == profile]
            r1 = report.compare(
                "estimators", reward, f"q+Z at {profile}", f"explicit at {profile}", [q - e for _, q, e in sub]
            )
            qa = data.get(reward, {}).get(1.0, {}).get(profile_alpha(profile), {})
            qd = [q - qa[k] for k, q, _ in sub if k in qa]
            qa_all += qd
            r2 = report.compare("estimators", reward, f"q+Z at {profile}", f"q+a at {profile}", qd) if qd else None
            per_profile.append(f"| {reward} | {profile} | {diff_text(r1)} | {diff_text(r2) if r2 else '-'} |")
        text = f"- **{reward}**: q+Z minus explicit over {len(diffs)} (profile, seed) pairs: {diff_text(row)}"
        text += f" (W/T/L at the paper's .003: {'/'.join(map(str, wtl))}; paper {paper[2] or '-'})."
        if reward == "edge":
            word = claim(row, {"win": "**holds**", "tie": "**not shown** (tie)", "loss": "**differs**"})
            text += f" Edge improves under q+Z (tab:sampling): {word}."
        if qa_all:
            r3 = report.compare("estimators", reward, "q+Z", "q+a", qa_all, pairs="(profile, seed)")
            text += f" q+Z minus the q+a runs of item a at the same profile and seed: {diff_text(r3)}."
        report.add("estimators", text)
        if row["verdict"] == "n/a":
            summary.append(f"{reward}: q+Z vs explicit: {NONE_DECIDED} ({len(diffs)} pairs)")
        else:
            mean = f"{row['mean']:+.4f} +- {row['se']:.4f} SE, {len(diffs)} pairs, {test_text(row)}"
            summary.append(f"{reward}: q+Z vs explicit {row['verdict']} ({mean})")
    lines += ["", "Per profile, paired by seed:", ""] + per_profile
    lines += ["", "| reward | profile | seed | q+Z | explicit | difference | diversity (cos) q+Z / explicit |"]
    lines[-1] += " classes q+Z / explicit |"
    lines.append("|---" * 8 + "|")
    for reward, rows in pairs.items():
        for p, k, q, e in rows:
            cos, classes = div_pair(reward, [(p, k)], missing="-")
            lines.append(f"| {reward} | {p} | {k} | {q:.4f} | {e:.4f} | {q - e:+.4f} | {cos} | {classes} |")
    report.add("summary_estimators", "; ".join(summary))
    report.add("estimators_table", *table)
    (out / "estimators.md").write_text(f"{RULE}\n\n" + "\n".join(lines) + "\n")
    print(f"wrote {out / 'estimators.md'}")


def profile_alpha(profile: str) -> float:
    """The fixed alpha of a profile cell such as `alpha-2`, or nan for any other profile."""
    try:
        return float(profile[5:]) if profile.startswith("alpha") and "__" not in profile else float("nan")
    except ValueError:
        return float("nan")


def at_g1(run: dict) -> bool:
    """A run of a landscape cell: a grid cell at scale g = 1."""
    return bool(run.get("cell")) and float(run["settings"].get("g", 1.0)) == 1.0


def last_samples(runs: Runs) -> Dict[str, Dict[str, Tuple[int, Path]]]:
    """reward -> cell -> (seed, the last sample grid) of the run with the lowest seed whose folder has one, for
    the cells at g = 1 (the landscape's); the run folders are found beside each grid.json (arms/NAME/samples)."""
    found: Dict[str, Dict[str, Tuple[int, Path]]] = {}
    for path, run in runs:
        name, cell = run.get("name"), run.get("cell")
        if not name or not at_g1(run):
            continue
        grids = sorted((path.parent / "arms" / name / "samples").glob("*.png"))
        old = found.setdefault(run["task"], {}).get(cell)
        if grids and (old is None or int(run["seed"]) < old[0]):
            found[run["task"]][cell] = (int(run["seed"]), grids[-1])
    return {r: cells for r, cells in found.items() if cells}


def write_summary(runs: Runs, report: Report) -> None:
    """The summary table of the report: each item's runs (with a peak, a rerun counted once) and its
    generated verdicts."""
    kinds: Dict[str, set] = {}
    for _, run in runs:
        s = run["settings"]
        if run.get("peak") is None:
            continue
        g, est = float(s.get("g", 1.0)), s.get("estimator", "q+a")
        if est != "q+a":
            kind = "estimators"
        elif s.get("target"):
            kind = "targets" if g == 1.0 else ""
        elif s.get("weighting") == "fixed":
            kind = "landscape" if g == 1.0 else "scale"
        else:
            kind = "rules" if g == 1.0 else ""
        kinds.setdefault(kind, set()).add((run["task"], run.get("cell"), run["seed"]))
    items = [
        ("a. alpha landscape", "fig:image_landscape", "landscape"),
        ("c. targets", "eq:targets", "targets"),
        ("b. scale", "tab:scale, fig:scale-ranks", "scale"),
        ("d. paths and rules", "tab:dynamic, fig:static, tab:online-full", "rules"),
        ("e. estimators", "tab:sampling", "estimators"),
    ]
    head = ["| item | paper | runs | result (verdict rule: paired t-test, p < .05) |", "|---|---|---|---|"]
    rows = {}
    for item, paper, kind in items:
        result = "; ".join(report.blocks.get(f"summary_{kind}", [])) or "not run"
        rows[kind] = f"| {item} | {paper} | {len(kinds.get(kind, ()))} | {result} |"
    report.add("summary", *head, *rows.values())
    report.add("summary_scale_rules", *head, rows["scale"], rows["rules"])


NO_SAMPLES = "no sample\ngrid saved"
NOT_RUN = "not run\nat this seed"
PANEL_PIXELS = (120, 135)  # a montage panel: 1.2 x 1.35 inches (sample_axes) at 100 dpi (write_samples)


def sample_cells(cells) -> List[str]:
    """The montage's column order: the alphas ascending (each alpha's estimator cells, alpha-2__q+Z, after
    it), then named cells."""

    def order(cell: str) -> Tuple[int, float, str]:
        alpha, _, estimator = cell.partition("__")
        return (0, float(alpha[5:]), estimator) if cell.startswith("alpha") else (1, 0.0, cell)

    return sorted(set(cells), key=order)


def panel_title(cell: str) -> str:
    """A cell's name short enough for a montage panel: alpha-0.5 -> "a -0.5", static-softmax-eta0.25 ->
    "eta .25", online-ema-kappa300-uniform -> "online EMA", schedule-3to-0.5@160-260 -> "path -3 to -0.5",
    alpha+0.5__explicit -> "a +0.5 explicit"."""
    if "__" in cell:
        return " ".join(panel_title(part) for part in cell.split("__"))
    if cell.startswith("schedule"):
        return "path " + cell[8:].split("@")[0].replace("to", " to ")
    if cell.startswith("static-softmax-eta"):
        return "eta " + bare(cell[18:])
    if cell.startswith("online-ema"):
        return "online EMA"
    return cell.replace("alpha", "a ")


def sample_axes(rewards: Sequence[str], cells: Sequence[str], image):
    """The montage's figure: one panel a (reward, cell), `image(reward, cell)` drawn in it (None: a panel
    marked NO_SAMPLES; a string: a panel marked with it); tight layout. Returns (figure, axes[row][column])."""
    fig, axes = plt.subplots(len(rewards), len(cells), figsize=(1.2 * len(cells), 1.35 * len(rewards)), squeeze=False)
    for i, reward in enumerate(rewards):
        for j, cell in enumerate(cells):
            ax = axes[i][j]
            ax.set_xticks([])
            ax.set_yticks([])
            picture = image(reward, cell)
            if picture is None or isinstance(picture, str):
                text = NO_SAMPLES if picture is None else picture
                ax.text(0.5, 0.5, text, ha="center", va="center", fontsize=7, color="gray", transform=ax.transAxes)
            else:
                ax.imshow(picture, interpolation="nearest")
            ax.set_title(panel_title(cell), fontsize=8)
            if j == 0:
                ax.set_ylabel(reward, fontsize=9)
    fig.tight_layout()
    return fig, axes


def write_samples(
    samples: Dict[str, Dict[str, Tuple[int, Path]]], out: Path, corner: int = 3, ran: Dict[str, set] | None = None
) -> Path:
    """A corner x corner block of images from each run's last sample grid (8 images a row with 2-pixel
    padding, as `RunFolder.save_images` writes it); a run without a sample grid gets a marked panel, and so
    does a cell that `ran` (reward -> the cells that have runs at these seeds) says no run of that reward
    has. The file is named by the panels' seeds, `samples_s<seed>[-<seed>...].jpg`, so that montages of
    other seeds stay as they are."""
    from PIL import Image

    def image(reward: str, cell: str):
        if cell not in samples[reward]:
            return NOT_RUN if ran is not None and cell not in ran.get(reward, ()) else None
        grid = Image.open(samples[reward][cell][1]).convert("RGB")
        side = (grid.width - 2) // 8 * corner + 2  # each image with its padding: (width - 2) / 8
        return grid.crop((0, 0, side, side))

    seeds = sorted({seed for by_cell in samples.values() for seed, _ in by_cell.values()})
    cells = sample_cells(c for by_cell in samples.values() for c in by_cell)
    fig, _ = sample_axes(sorted(samples), cells, image)
    path = out / f"samples_s{'-'.join(str(s) for s in seeds)}.jpg"
    fig.savefig(path, dpi=100, pil_kwargs={"quality": 85})
    plt.close(fig)
    print(f"wrote {path}")
    return path


def mark_blank_panels(path: Path, panel: Tuple[int, int] = PANEL_PIXELS) -> List[Tuple[int, int]]:
    """Marks the empty panels of a sample montage that write_samples drew before it marked them (panels of
    `panel` pixels, 1.2 x 1.35 inches at 100 dpi): a panel whose middle is plain white gets NO_SAMPLES.
    Returns the (row, column) of each marked panel."""
    from PIL import Image

    image = Image.open(path).convert("RGB")
    cols, rows = image.width // panel[0], image.height // panel[1]
    pixels = np.asarray(image).astype(int)
    marked = []
    for i in range(rows):
        for j in range(cols):
            y, x = i * panel[1] + panel[1] // 2, j * panel[0] + panel[0] // 2
            middle = pixels[y - 25 : y + 25, x - 25 : x + 25]
            if middle.min() > 240:
                marked.append((i, j))
    if not marked:
        return marked
    fig = plt.figure(figsize=(image.width / 100, image.height / 100), dpi=100)
    ax = fig.add_axes((0, 0, 1, 1))
    ax.imshow(image, interpolation="nearest")
    ax.set_axis_off()
    for i, j in marked:
        x, y = j * panel[0] + panel[0] // 2, i * panel[1] + panel[1] // 2 + 8
        ax.text(x, y, NO_SAMPLES, ha="center", va="center", fontsize=7, color="gray")
    fig.savefig(path, dpi=100, pil_kwargs={"quality": 90})
    plt.close(fig)
    print(
        f"marked {len(marked)} empty panel(s) in {path}: " + ", ".join(f"row {i + 1} column {j + 1}" for i, j in marked)
    )
    return marked


def write_update0(runs: Runs, report: Report) -> None:
    found = update0_peaks(runs)
    text = "; ".join(f"{r} {c.replace('__', ' ')} seed {k} ({v:.4f})" for r, c, k, v in found) or "none"
    report.add(
        "update0", f"{len(found)} run(s) peaked at update 0, the untrained generator's validation reward: {text}."
    )


def write_verdicts(report: Report, out: Path) -> None:
    """verdicts.json (every comparison, strict JSON: what is not finite is null) and verdicts.md (the rule, the
    generated text, every comparison)."""
    doc = {"rule": RULE, "level": LEVEL, "min_pairs": MIN_PAIRS, "comparisons": report.rows}
    (out / "verdicts.json").write_text(json.dumps(doc, indent=1, allow_nan=False) + "\n")
    lines = ["# Verdicts", "", RULE, ""]
    for name, block in report.blocks.items():
        lines += [f"## {name}", "", *block, ""]
    lines += [
        "## every comparison",
        "",
        "| section | reward | A | B | pairs | n | A - B | SE | t | p | verdict |",
        "|---" * 11 + "|",
    ]
    for r in report.rows:
        m = "" if r["mean"] is None else f"{r['mean']:+.4f}"
        se = "" if r["se"] is None else f"{r['se']:.4f}"
        t = "" if r["t"] is None else f"{r['t']:+.2f}"
        lines.append(
            f"| {r['section']} | {r['reward']} | {r['a']} | {r['b']} | {r['pairs']} | {r['n']} | {m} | {se}"
            f" | {t} | {p_text(r['p'])} | {r['verdict']} |"
        )
    (out / "verdicts.md").write_text("\n".join(lines) + "\n")
    print(f"wrote {out / 'verdicts.json'} {out / 'verdicts.md'}")


def fill_pages(out: Path, report: Report) -> List[Path]:
    """Replaces every `<!-- generated: NAME -->` ... `<!-- end generated -->` block of every page (`*.md`) of the
    report's folder with the generated block NAME (`rule` is the verdict rule), whichever page holds it. Returns
    the pages that hold a generated block."""
    blocks = {"rule": [RULE], **report.blocks}
    filled = []
    for path in sorted(out.glob("*.md")):
        text, done = path.read_text(), []

        def fill(match: "re.Match[str]") -> str:
            name = match.group(1)
            if name not in blocks:
                return match.group(0)
            done.append(name)
            return f"<!-- generated: {name} -->\n" + "\n".join(blocks[name]) + "\n<!-- end generated -->"

        new = re.sub(r"<!-- generated: (\S+) -->\n.*?<!-- end generated -->", fill, text, flags=re.S)
        if "<!-- generated: " not in text:
            continue
        if new != text:
            path.write_text(new)
        filled.append(path)
        print(f"filled {path}: {', '.join(done) or 'no block of this report'}")
    return filled


def main(args: Args) -> None:
    with tempfile.TemporaryDirectory() as unpack:
        report(Args(grids=tuple(grid_files(args.grids, Path(unpack))), out=args.out, mark_blank=args.mark_blank))


def report(args: Args) -> None:
    runs = grid_runs(args.grids)
    data = fixed_alpha_peaks(runs)
    if not data:
        raise SystemExit(f"error: no fixed-alpha runs with a peak in {', '.join(args.grids)}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rep, info, cells = Report(), fixed_alpha_info(runs), cell_info(runs)
    write_landscape(data, info, out, rep)
    write_targets(target_peaks(runs, data), info, cells, out, rep)
    write_scale(data, info, out, rep)
    write_rules(rule_peaks(runs), data, cells, info, out, rep)
    write_estimators(estimator_pairs(runs), data, cells, out, rep)
    write_update0(runs, rep)
    write_summary(runs, rep)
    samples = last_samples(runs)
    if samples:
        ran: Dict[str, set] = {}  # the cells each reward has runs of at the montage's seeds
        seeds = {seed for by_cell in samples.values() for seed, _ in by_cell.values()}
        for run in (run for _, run in runs if at_g1(run) and int(run["seed"]) in seeds):
            ran.setdefault(run["task"], set()).add(run["cell"])
        write_samples(samples, out, ran=ran)
    for path in args.mark_blank:
        mark_blank_panels(Path(path))
    write_verdicts(rep, out)
    fill_pages(out, rep)


if __name__ == "__main__":
    main(tyro.cli(Args))
