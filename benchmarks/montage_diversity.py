"""Sample diversity of the CIFAR report's early runs, read back from its sample montages.

The landscape runs (items a and c) ran before the trainer logged `val_div_cos`, and their tarballs keep
no sample grid. What is left of their last validation images is the 3 x 3 corner of each run's grid in the
report's montages (`samples*.jpg`, JPEG, drawn by `plot_cifar_grid.write_samples`). This script cuts those
nine images back out (the panel boxes come from the same layout code), measures their mean pairwise
SimCLR cosine distance and predicted classes (`rewards.sample_diversity`) and writes
`montage_diversity.md`:

* a calibration on runs that logged the statistic and kept their last sample grid: their grids are drawn
  into montages of the same layout, cut out and measured the same way, beside the `val_div_cos` that the
  trainer logged at the same validation (over all of its images, four banks of 128);
* per montage panel: the run's reward, weighting, seed, peak, last update and its nine-image diversity.

    python benchmarks/montage_diversity.py benchmarks/cifar_results/data/*.tar.gz --out benchmarks/cifar_results
"""

from __future__ import annotations

import json
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Tuple

import numpy as np
import torch
import tyro
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import plot_cifar_grid as pcg  # noqa: E402

from rewards import make_diversity_features, sample_diversity  # noqa: E402

# The report's montages: file -> reward -> the seed whose runs it shows (benchmarks/cifar_results/standin.md).
MONTAGES = {
    "samples.jpg": {"auto-a35": 20260725, "edge": 20260724, "mixed": 20260724, "simclr": 20260724},
    "samples_s20260725.jpg": {"auto-a35": 20260726, "edge": 20260725, "mixed": 20260725, "simclr": 20260725},
    "samples_s20260726.jpg": {"edge": 20260726, "mixed": 20260726, "simclr": 20260726},
}
ALPHAS = ("alpha-3", "alpha-2", "alpha-1", "alpha-0.5", "alpha+0", "alpha+0.5", "alpha+1", "alpha+1.5", "alpha+2")
CORNER = 3


@dataclass
class Args:
    grids: tyro.conf.Positional[Tuple[str, ...]]
    """Raw-file tarballs (or grid.json files) with the montages' runs and the calibration runs."""
    out: str = "."
    """Folder holding the montages; montage_diversity.md is written there."""


def panel_boxes(rewards: List[str], cells: List[str]) -> Dict[Tuple[str, str], Tuple[float, ...]]:
    """(reward, cell) -> the pixel box (left, top, right, bottom) of the panel's image in a montage that
    write_samples draws with these rows and columns."""
    fig, axes = pcg.sample_axes(rewards, cells, lambda r, c: np.zeros((34 * CORNER + 2,) * 2 + (3,), np.uint8))
    fig.canvas.draw()
    height = fig.get_size_inches()[1] * fig.dpi
    boxes = {}
    for i, r in enumerate(rewards):
        for j, c in enumerate(cells):
            b = axes[i][j].get_window_extent()
            boxes[(r, c)] = (b.x0, height - b.y1, b.x1, height - b.y0)
    pcg.plt.close(fig)
    return boxes


def cut(montage, box) -> List[np.ndarray]:
    """The CORNER x CORNER images (32 x 32 x 3, uint8) of one panel, resampled back to the grid's pixels;
    empty for a blank panel (a run without a sample grid)."""
    side = 34 * CORNER + 2
    a = np.asarray(montage.transform((side, side), Image.EXTENT, box, Image.BILINEAR))
    if a.mean() > 245:
        return []
    return [a[2 + 34 * u : 34 + 34 * u, 2 + 34 * v : 34 + 34 * v] for u in range(CORNER) for v in range(CORNER)]


def measure(images: List[np.ndarray], features) -> Tuple[float, int]:
    """(mean pairwise SimCLR cosine distance, distinct predicted classes) of uint8 images."""
    x = torch.tensor(np.stack(images)).permute(0, 3, 1, 2).float() / 127.5 - 1
    return sample_diversity(*features(x))


def arms(runs: pcg.Runs) -> Dict[str, Path]:
    """run name -> its folder (arms/NAME beside its grid.json); a later grid's run replaces an earlier one's."""
    return {run["name"]: path.parent / "arms" / run["name"] for path, run in runs if run.get("name")}


def calibration(folders: Dict[str, Path], features, tmp: Path) -> List[Tuple[float, float]]:
    """(nine-image diversity from a drawn montage, logged val_div_cos) for every run whose folder has a last
    sample grid and logged the statistic at that validation."""
    runs = []
    for name, folder in sorted(folders.items()):
        grids = sorted((folder / "samples").glob("*.png"))
        if not grids or not (folder / "metrics.jsonl").is_file():
            continue
        rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines() if line]
        logged = [r for r in rows if r.get("kind") == "validation" and "val_div_cos" in r]
        if logged and f"update_{logged[-1]['update']:05d}.png" == grids[-1].name:
            runs.append((grids[-1], logged[-1]["val_div_cos"]))
    rewards, cells = sorted(MONTAGES["samples.jpg"]), list(ALPHAS) + ["eps"]
    boxes, per = panel_boxes(rewards, cells), len(rewards) * len(cells)
    pairs = []
    for k in range(0, len(runs), per):
        chunk = runs[k : k + per]
        samples: Dict[str, Dict[str, Tuple[int, Path]]] = {r: {} for r in rewards}
        for i, (grid, _) in enumerate(chunk):
            samples[rewards[i // len(cells)]][cells[i % len(cells)]] = (0, grid)
        montage = Image.open(pcg.write_samples(samples, tmp)).convert("RGB")
        for i, (_, logged) in enumerate(chunk):
            images = cut(montage, boxes[(rewards[i // len(cells)], cells[i % len(cells)])])
            pairs.append((measure(images, features)[0], logged))
    return pairs


def ranks(x: np.ndarray) -> np.ndarray:
    return np.argsort(np.argsort(x)).astype(float)


def calibration_text(pairs: List[Tuple[float, float]]) -> List[str]:
    if len(pairs) < 3:
        return ["No calibration: fewer than three runs with a logged statistic and their last sample grid."]
    cut_, logged = np.array(pairs).T
    spearman = np.corrcoef(ranks(cut_), ranks(logged))[0, 1]
    err = np.abs(cut_ - logged)
    lines = [
        f"Calibration on {len(pairs)} runs that logged `val_div_cos` and kept the grid of that validation: "
        f"Spearman {spearman:.3f}, Pearson {np.corrcoef(cut_, logged)[0, 1]:.3f}, mean difference "
        f"{np.mean(cut_ - logged):+.3f}, absolute difference median {np.median(err):.3f}, 90th percentile "
        f"{np.percentile(err, 90):.3f}, max {err.max():.3f}.",
        "",
        "| logged val_div_cos | runs | logged range | montage (nine images) range |",
        "|---|---|---|---|",
    ]
    for lo, hi in ((0, 0.06), (0.06, 0.15), (0.15, 0.3), (0.3, 2.0)):
        m = (logged >= lo) & (logged < hi)
        if m.any():
            lines.append(
                f"| {lo:g} to {hi:g} | {m.sum()} | {logged[m].min():.3f}-{logged[m].max():.3f} | "
                f"{cut_[m].min():.3f}-{cut_[m].max():.3f} |"
            )
    return lines


def montage_rows(out: Path, folders: Dict[str, Path], features) -> List[str]:
    """One table row per non-blank panel of the report's montages found in `out`."""
    lines = [
        "| montage | reward | weighting | seed | peak (update) | last update | diversity (cos, 9 images) | classes |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, seeds in MONTAGES.items():
        path = out / name
        if not path.is_file():
            continue
        montage = Image.open(path).convert("RGB")
        columns, rows = montage.width // pcg.PANEL_PIXELS[0], montage.height // pcg.PANEL_PIXELS[1]
        cells = list(ALPHAS) + ["eps"] if columns == 10 else list(ALPHAS)
        rewards = sorted(seeds)
        if columns != len(cells) or rows != len(rewards):
            raise SystemExit(f"error: {path} is {montage.size} pixels, not {len(cells)} x {len(rewards)} panels")
        boxes = panel_boxes(rewards, cells)
        for r in rewards:
            for c in cells:
                images = cut(montage, boxes[(r, c)])
                run = f"{r}__{c}__seed{seeds[r]}"
                if not images:
                    continue
                if run not in folders:
                    raise SystemExit(f"error: {path} shows {run}, which none of the given grids has")
                s = json.loads((folders[run] / "summary.json").read_text())
                cos, classes = measure(images, features)
                lines.append(
                    f"| {name} | {r} | {c.replace('alpha', 'alpha ')} | {seeds[r]} | {s['peak']:.3f} "
                    f"({s['peak_update']}) | {s['updates_done']} | {cos:.3f} | {classes} |"
                )
    return lines


def main(args: Args) -> None:
    out = Path(args.out)
    features = make_diversity_features("cpu")
    with tempfile.TemporaryDirectory() as unpack:
        folders = arms(pcg.grid_runs(tuple(pcg.grid_files(args.grids, Path(unpack)))))
        pairs = calibration(folders, features, Path(unpack))
        table = montage_rows(out, folders, features)
    text = [
        "# Sample diversity read from the sample montages",
        "",
        "Generated by `python benchmarks/montage_diversity.py benchmarks/cifar_results/data/*.tar.gz --out "
        "benchmarks/cifar_results`. Each panel's nine images (the corner of the run's last validation grid, "
        "after JPEG) are cut out and measured like the trainer's `val_div_cos` and `val_div_classes`; nine "
        "images hold at most nine classes. The tarballs are on the `results-data` branch: "
        "`python benchmarks/results_data.py fetch benchmarks/cifar_results` puts them there.",
        "",
        *calibration_text(pairs),
        "",
        *table,
    ]
    (out / "montage_diversity.md").write_text("\n".join(text) + "\n")
    print(f"wrote {out / 'montage_diversity.md'}: {len(pairs)} calibration runs, {len(table) - 2} panels")


if __name__ == "__main__":
    main(tyro.cli(Args))
