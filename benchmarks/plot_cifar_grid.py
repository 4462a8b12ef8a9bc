"""The CIFAR alpha landscape from `halving.py cifar-grid` results: mean per-run peak +- SD against alpha.

Reads one or more grid.json files (a grid run in parts, e.g. a seed or a reward per part), pools their
runs of the fixed 12-bin alpha family by (reward, alpha, seed) (a later file's run replaces an earlier
one's), and writes one panel per reward (`landscape.png`) and the same numbers as a Markdown table
(`landscape.md`). The paper's selected shape at g = 1 (tab:scale) is marked on each panel.

    python benchmarks/plot_cifar_grid.py runs/grids/*/grid.json --out benchmarks/cifar_results
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
import tyro  # noqa: E402

# tab:scale, column g = 1: the shape with the best mean per-run validation peak on the seven-profile grid.
PAPER_G1_WINNER = {"auto-a35": -1.0, "mixed": -1.0, "edge": 0.0, "clip": -1.0, "simclr": -1.0, "digit7": -0.5}


@dataclass
class Args:
    grids: tyro.conf.Positional[Tuple[str, ...]]
    """grid.json files of `halving.py cifar-grid` (or their folders)."""
    out: str = "."
    """Folder for landscape.png and landscape.md."""


def fixed_alpha_peaks(paths: Tuple[str, ...]) -> Dict[str, Dict[float, Dict[int, float]]]:
    """reward -> alpha -> seed -> per-run peak, over the runs of the fixed alpha family that have a peak."""
    out: Dict[str, Dict[float, Dict[int, float]]] = {}
    for p in paths:
        path = Path(p) / "grid.json" if Path(p).is_dir() else Path(p)
        for run in json.loads(path.read_text())["runs"]:
            s = run["settings"]
            if s.get("weighting") != "fixed" or s.get("target") or run.get("peak") is None:
                continue
            out.setdefault(run["task"], {}).setdefault(float(s["alpha"]), {})[int(run["seed"])] = float(run["peak"])
    return out


def mean_sd(values: List[float]) -> Tuple[float, float]:
    m = sum(values) / len(values)
    sd = math.sqrt(sum((v - m) ** 2 for v in values) / (len(values) - 1)) if len(values) > 1 else float("nan")
    return m, sd


def main(args: Args) -> None:
    data = fixed_alpha_peaks(args.grids)
    if not data:
        raise SystemExit(f"error: no fixed-alpha runs with a peak in {', '.join(args.grids)}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rewards = sorted(data)
    fig, axes = plt.subplots(1, len(rewards), figsize=(4.2 * len(rewards), 3.4), squeeze=False)
    lines = ["| reward | alpha | n | peak mean +- SD | seeds | paper's g = 1 shape (tab:scale) |", "|---" * 6 + "|"]
    for ax, reward in zip(axes[0], rewards):
        alphas = sorted(data[reward])
        stats = [mean_sd(list(data[reward][a].values())) for a in alphas]
        sds = [0 if math.isnan(s) else s for _, s in stats]
        ax.errorbar(alphas, [m for m, _ in stats], yerr=sds, marker="o", capsize=3)
        if reward in PAPER_G1_WINNER:
            ax.axvline(PAPER_G1_WINNER[reward], color="gray", ls="--", label="paper's g = 1 shape")
            ax.legend(fontsize=8)
        n = sorted({len(data[reward][a]) for a in alphas})
        ax.set_title(f"{reward} (n = {'-'.join(map(str, n))} seeds)")
        ax.set(xlabel="alpha (smaller: more high-noise emphasis)", ylabel="per-run validation peak")
        for a, (m, s) in zip(alphas, stats):
            seeds = ", ".join(str(k) for k in sorted(data[reward][a]))
            sd = "" if math.isnan(s) else f" +- {s:.4f}"
            paper = PAPER_G1_WINNER.get(reward)
            paper = "" if paper is None else f"{paper:g}"
            lines.append(f"| {reward} | {a:g} | {len(data[reward][a])} | {m:.4f}{sd} | {seeds} | {paper} |")
    fig.tight_layout()
    fig.savefig(out / "landscape.png", dpi=110)
    (out / "landscape.md").write_text("\n".join(lines) + "\n")
    print(f"wrote {out / 'landscape.png'} {out / 'landscape.md'}")


if __name__ == "__main__":
    main(tyro.cli(Args))
