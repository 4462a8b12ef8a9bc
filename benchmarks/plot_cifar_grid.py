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
* where the runs' folders still hold sample grids: `samples.jpg`, a corner of each run's last sample
  grid (one seed), per reward and weighting.

    python benchmarks/plot_cifar_grid.py runs/cifar/*/grid.json --out benchmarks/cifar_results
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Tuple

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import tyro  # noqa: E402

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
    """Folder for the PNGs and tables."""


def grid_runs(paths: Tuple[str, ...]) -> Runs:
    """(grid.json path, run record) for every run of the given grid.json files (or their folders)."""
    out = []
    for p in paths:
        path = Path(p) / "grid.json" if Path(p).is_dir() else Path(p)
        out += [(path, run) for run in json.loads(path.read_text())["runs"]]
    return out


def fixed_alpha_peaks(runs: Runs) -> Peaks:
    """reward -> g -> alpha -> seed -> per-run peak, over the runs of the fixed alpha family (q+a) that
    have a peak."""
    out: Peaks = {}
    for _, run in runs:
        s = run["settings"]
        if s.get("weighting") != "fixed" or s.get("target") or s.get("estimator", "q+a") != "q+a":
            continue
        if run.get("peak") is None:
            continue
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


def pm(values: List[float], sign: str = "") -> str:
    """'mean +- SD' of the values (the mean alone for one value); sign "+" writes the mean's sign."""
    m, sd = mean_sd(values)
    return f"{m:{sign}.4f}" + ("" if math.isnan(sd) else f" +- {sd:.4f}")


def scale_summary(by_g: Dict[float, Dict[float, Dict[int, float]]]) -> Dict[str, object]:
    """Over tab:scale's shapes that the g = 1 runs have (all runs' if there is no g = 1), the scales
    that have every one of them (the others are listed under "incomplete"), and the seeds that every
    such cell has (so each mean is over the same seeds): the winner (best mean peak) at each g, the
    maximum regret of keeping the g = 1 winner, and the within-scale ranks (1 = best) as an (alphas,
    gs) array."""
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
    return {
        "gs": gs,
        "alphas": alphas,
        "incomplete": incomplete,
        "seeds": seeds,
        "means": means,
        "winners": winners,
        "regret": regret,
        "ranks": ranks,
    }


def write_landscape(data: Peaks, out: Path) -> None:
    rewards = sorted(r for r in data if 1.0 in data[r])
    fig, axes = plt.subplots(1, len(rewards), figsize=(4.2 * len(rewards), 3.4), squeeze=False)
    lines = ["| reward | alpha | n | peak mean +- SD | seeds | paper's g = 1 shape (tab:scale) |", "|---" * 6 + "|"]
    for ax, reward in zip(axes[0], rewards):
        runs = data[reward][1.0]
        alphas = sorted(runs)
        stats = [mean_sd(list(runs[a].values())) for a in alphas]
        sds = [0 if math.isnan(s) else s for _, s in stats]
        ax.errorbar(alphas, [m for m, _ in stats], yerr=sds, marker="o", capsize=3)
        if reward in PAPER_G1_WINNER:
            ax.axvline(PAPER_G1_WINNER[reward], color="gray", ls="--", label="paper's g = 1 shape")
            ax.legend(fontsize=8)
        n = sorted({len(runs[a]) for a in alphas})
        ax.set_title(f"{reward} (n = {'-'.join(map(str, n))} seeds)")
        ax.set(xlabel="alpha (smaller: more high-noise emphasis)", ylabel="per-run validation peak")
        for a, (m, s) in zip(alphas, stats):
            seeds = ", ".join(str(k) for k in sorted(runs[a]))
            sd = "" if math.isnan(s) else f" +- {s:.4f}"
            paper = PAPER_G1_WINNER.get(reward)
            paper = "" if paper is None else f"{paper:g}"
            lines.append(f"| {reward} | {a:g} | {len(runs[a])} | {m:.4f}{sd} | {seeds} | {paper} |")
    fig.tight_layout()
    fig.savefig(out / "landscape.png", dpi=110)
    plt.close(fig)
    (out / "landscape.md").write_text("\n".join(lines) + "\n")
    print(f"wrote {out / 'landscape.png'} {out / 'landscape.md'}")


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


def write_scale(data: Peaks, out: Path) -> None:
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
    fig, axes = plt.subplots(1, len(panels), figsize=(3.6 * len(panels), 3.6), squeeze=False)
    lines = ["| reward | source | seeds | " + " | ".join(f"g = {g:g}" for g in PAPER_GS) + " | max regret |"]
    lines.append("|---" * (len(PAPER_GS) + 4) + "|")
    for ax, (reward, s) in zip(axes[0], panels):
        cells = [f"{s['winners'][g]:g}" if g in s["winners"] else "-" for g in PAPER_GS]
        seeds = ", ".join(map(str, s["seeds"]))
        lines.append(f"| {reward} | this code | {seeds} | " + " | ".join(cells) + f" | {s['regret']:.4f} |")
        if reward in PAPER_SCALE and s is summaries[reward][-1]:
            won, regret = PAPER_SCALE[reward]
            lines.append(f"| {reward} | paper | n = 3 | " + " | ".join(f"{a:g}" for a in won) + f" | {regret:.4f} |")
        ax.imshow(s["ranks"], cmap="viridis_r", aspect="auto")
        for (i, j), r in np.ndenumerate(s["ranks"]):
            dark = r > (len(s["alphas"]) + 1) / 2  # viridis_r: the low ranks are dark
            ax.text(j, i, str(r), ha="center", va="center", color="w" if dark else "k", fontsize=8)
        ax.set_xticks(range(len(s["gs"])), [f"{g:g}" for g in s["gs"]])
        ax.set_yticks(range(len(s["alphas"])), [f"{a:g}" for a in s["alphas"]])
        title = f"{reward}, n = {len(s['seeds'])}: rank within scale"
        ax.set(title=title, xlabel="scale g", ylabel="alpha")
    fig.tight_layout()
    fig.savefig(out / "scale_ranks.png", dpi=110)
    plt.close(fig)
    (out / "scale.md").write_text("\n".join(lines) + "\n")
    print(f"wrote {out / 'scale_ranks.png'} {out / 'scale.md'}")


def write_targets(peaks: Dict[str, Dict[str, Dict[int, float]]], out: Path) -> None:
    rewards = sorted(r for r in peaks if "eps" in peaks[r])
    if not rewards:
        return
    lines = ["| reward | x0 (alpha 0) | v (alpha 1) | eps | best |", "|---" * 5 + "|"]
    for reward in rewards:
        cells, means = [], {}
        for target in ("x0", "v", "eps"):
            runs = peaks[reward].get(target)
            if not runs:
                cells.append("-")
                continue
            means[target] = mean_sd(list(runs.values()))[0]
            cells.append(f"{pm(list(runs.values()))} (n={len(runs)})")
        lines.append(f"| {reward} | " + " | ".join(cells) + f" | {max(means, key=means.get)} |")
    (out / "targets.md").write_text("\n".join(lines) + "\n")
    print(f"wrote {out / 'targets.md'}")


def paper_key(settings: dict) -> str:
    """A rule's name in PAPER_RULES: its weighting, or `schedule<early>to<late>` for a linear path."""
    if settings["weighting"] == "schedule":
        return f"schedule{float(settings['alpha_early']):g}to{float(settings['alpha_late']):g}"
    return settings["weighting"]


def write_rules(rules: Rules, data: Peaks, out: Path) -> None:
    """rules.md: per reward, the x0 control, the best fixed alpha, each schedule's end points, and every
    schedule and rule: peak mean +- SD, the paired difference from x0 over the seeds both have, the paper's
    number where it gives one."""
    if not rules:
        return
    lines = ["| reward | weighting | n | peak mean +- SD | minus x0, paired (seeds) | paper (n = 3) |"]
    lines.append("|---" * 6 + "|")
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
        rows = [
            (f"alpha{a:+g}", f" ({', '.join(dict.fromkeys(n))})", fixed[a], f"alpha{a:+g}")
            for a, n in sorted(notes.items())
        ]
        rows += [(cell, "", peaks, paper_key(settings)) for cell, (settings, peaks) in rules[reward].items()]
        for label, note, peaks, key in rows:
            paired = [peaks[s] - x0[s] for s in peaks if s in x0]
            diff = f"{mean_sd(paired)[0]:+.4f} ({len(paired)})" if paired and peaks is not x0 else ""
            paper = PAPER_RULES.get((reward, key))
            paper = "" if paper is None else f"{paper[0]:.4f} +- {paper[1]:.4f}"
            values = list(peaks.values())
            lines.append(f"| {reward} | {label}{note} | {len(values)} | {pm(values)} | {diff} | {paper} |")
    (out / "rules.md").write_text("\n".join(lines) + "\n")
    print(f"wrote {out / 'rules.md'}")


def write_estimators(pairs: Dict[str, List[Tuple[str, int, float, float]]], out: Path) -> None:
    """estimators.md: per reward, the paired peak differences q+Z - explicit (mean +- SD, W/T/L with
    tolerance TIE_TOLERANCE) beside tab:sampling, then every pair."""
    if not pairs:
        return
    lines = ["| reward | pairs | q+Z - explicit | W/T/L | paper: pairs | paper: q+Z - explicit | paper: W/T/L |"]
    lines.append("|---" * 7 + "|")
    for reward, rows in pairs.items():
        diffs = [q - e for _, _, q, e in rows]
        wtl = [sum(d > TIE_TOLERANCE for d in diffs), sum(abs(d) <= TIE_TOLERANCE for d in diffs)]
        wtl.append(len(diffs) - sum(wtl))
        paper = PAPER_SAMPLING.get(reward)
        paper = ["", "", ""] if paper is None else [str(paper[0]), f"{paper[1]:+.5f} +- {paper[2]:.5f}", paper[3]]
        ours = [str(len(diffs)), pm(diffs, "+"), "/".join(map(str, wtl))]
        lines.append(f"| {reward} | " + " | ".join(ours + paper) + " |")
    lines += ["", "| reward | profile | seed | q+Z | explicit | difference |", "|---" * 6 + "|"]
    for reward, rows in pairs.items():
        lines += [f"| {reward} | {p} | {s} | {q:.4f} | {e:.4f} | {q - e:+.4f} |" for p, s, q, e in rows]
    (out / "estimators.md").write_text("\n".join(lines) + "\n")
    print(f"wrote {out / 'estimators.md'}")


def last_samples(runs: Runs) -> Dict[str, Dict[str, Path]]:
    """reward -> cell -> the last sample grid of the run with the lowest seed whose folder has one; the
    run folders are found beside each grid.json (arms/NAME/samples)."""
    found: Dict[str, Dict[str, Tuple[int, Path]]] = {}
    for path, run in runs:
        name, cell = run.get("name"), run.get("cell")
        if not name or not cell:
            continue
        grids = sorted((path.parent / "arms" / name / "samples").glob("*.png"))
        old = found.setdefault(run["task"], {}).get(cell)
        if grids and (old is None or int(run["seed"]) < old[0]):
            found[run["task"]][cell] = (int(run["seed"]), grids[-1])
    return {r: {c: v[1] for c, v in cells.items()} for r, cells in found.items() if cells}


def write_samples(samples: Dict[str, Dict[str, Path]], out: Path, corner: int = 3) -> None:
    """A corner x corner block of images from each run's last sample grid (8 images a row with 2-pixel
    padding, as `RunFolder.save_images` writes it)."""
    if not samples:
        return
    from PIL import Image

    def order(cell: str) -> Tuple[int, float, str]:
        return (0, float(cell[5:]), "") if cell.startswith("alpha") else (1, 0.0, cell)

    cells = sorted({c for by_cell in samples.values() for c in by_cell}, key=order)
    rewards = sorted(samples)
    fig, axes = plt.subplots(len(rewards), len(cells), figsize=(1.2 * len(cells), 1.35 * len(rewards)), squeeze=False)
    for i, reward in enumerate(rewards):
        for j, cell in enumerate(cells):
            ax = axes[i][j]
            ax.set_xticks([])
            ax.set_yticks([])
            if cell in samples[reward]:
                image = Image.open(samples[reward][cell]).convert("RGB")
                side = (image.width - 2) // 8 * corner + 2  # each image with its padding: (width - 2) / 8
                ax.imshow(image.crop((0, 0, side, side)), interpolation="nearest")
            ax.set_title(cell.replace("alpha", "a "), fontsize=8)
            if j == 0:
                ax.set_ylabel(reward, fontsize=9)
    fig.tight_layout()
    fig.savefig(out / "samples.jpg", dpi=100, pil_kwargs={"quality": 85})
    plt.close(fig)
    print(f"wrote {out / 'samples.jpg'}")


def main(args: Args) -> None:
    runs = grid_runs(args.grids)
    data = fixed_alpha_peaks(runs)
    if not data:
        raise SystemExit(f"error: no fixed-alpha runs with a peak in {', '.join(args.grids)}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    write_landscape(data, out)
    write_scale(data, out)
    write_targets(target_peaks(runs, data), out)
    write_rules(rule_peaks(runs), data, out)
    write_estimators(estimator_pairs(runs), out)
    write_samples(last_samples(runs), out)


if __name__ == "__main__":
    main(tyro.cli(Args))
