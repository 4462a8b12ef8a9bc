"""The pretraining curve of scripts/pretrain_cfm.py from its quality.jsonl files, one or more (one a lease).

    python benchmarks/plot_pretrain.py --out benchmarks/pretrain_results/curve.png   # every lease's file
    python benchmarks/plot_pretrain.py run_a/quality.jsonl run_b/quality.jsonl --out ab.png

Without files it reads benchmarks/pretrain_results/data/lease<N>/quality.jsonl for every N, in order. Rows of
all files are joined by step (a step in two files keeps the later file's row); a row's lease is its file's folder
name. Draws the classifier-feature Frechet distance and the training loss against steps (PNG), prints the page's
table (step, images, Frechet distance, largest/smallest class share, loss, lease) and whether the curve has
flattened: the Frechet distance at the last row is less than 5% better (lower) than at the start of the last
fifth of the steps (linearly interpolated between rows; undecided while no row lies that early).
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

from results_data import require

LEASES = Path(__file__).resolve().parent / "pretrain_results" / "data"
FLAT_GAIN = 0.05  # "flattened": less than 5% better ...
LAST_PART = 0.2  # ... over the last fifth of the steps


def load(paths: list[str]) -> list[dict]:
    """The rows of every file, each with its file's folder name as "lease", one row a step, by step."""
    rows = {}
    for p in paths:
        path = require(p)
        for line in path.read_text().splitlines():
            if line.strip():
                row = json.loads(line)
                rows[row["step"]] = {**row, "lease": path.parent.name}
    return [rows[s] for s in sorted(rows)]


def interpolate(steps: list[int], values: list[float], at: float) -> float:
    for (s0, v0), (s1, v1) in zip(zip(steps, values), zip(steps[1:], values[1:])):
        if s0 <= at <= s1:
            return v0 + (v1 - v0) * (at - s0) / (s1 - s0)
    raise ValueError(f"step {at} is outside {steps[0]}..{steps[-1]}")


def flattened(rows: list[dict]) -> tuple[bool | None, str]:
    """Whether the Frechet distance improved by less than FLAT_GAIN over the last LAST_PART of the steps."""
    steps, fd = [r["step"] for r in rows], [r["frechet"] for r in rows]
    if not rows:
        return None, "no rows"
    cut = (1 - LAST_PART) * steps[-1]
    if len(rows) < 2 or cut < steps[0]:
        return None, f"undecided: no row at or before step {cut:.0f} (the start of the last fifth)"
    start = interpolate(steps, fd, cut)
    gain = (start - fd[-1]) / start
    verdict = gain < FLAT_GAIN
    return verdict, (
        f"{'flattened' if verdict else 'still improving'}: Frechet {start:.3f} at step {cut:.0f} -> {fd[-1]:.3f} at "
        f"step {steps[-1]} ({100 * gain:.1f}% better; flattened means < {100 * FLAT_GAIN:.0f}%)"
    )


def table(rows: list[dict]) -> str:
    lines = [
        "| step | images | Frechet distance | largest / smallest class share | loss | lease |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        loss = f"{r['loss']:.4f}" if r.get("loss") is not None else "-"
        shares = f"{r['largest_class_share']:.3f} / {r['smallest_class_share']:.3f}"
        lines.append(
            f"| {r['step']:,} | {r['images_seen']:,} | {r['frechet']:.3f} | {shares} | {loss} | {r['lease']} |"
        )
    return "\n".join(lines)


def plot(rows: list[dict], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_fd, ax_loss) = plt.subplots(1, 2, figsize=(10, 3.8))
    for lease in dict.fromkeys(r["lease"] for r in rows):
        part = [r for r in rows if r["lease"] == lease]
        ax_fd.plot([r["step"] for r in part], [r["frechet"] for r in part], "o-", label=lease)
        with_loss = [r for r in part if r.get("loss") is not None]
        ax_loss.plot([r["step"] for r in with_loss], [r["loss"] for r in with_loss], "o-", label=lease)
    ax_fd.set(xlabel="step", ylabel="classifier-feature Frechet distance", yscale="log", title="sample quality")
    ax_loss.set(xlabel="step", ylabel="training loss (mean since the previous row)", title="flow-matching loss")
    for ax in (ax_fd, ax_loss):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("files", nargs="*", help="quality.jsonl files, in lease order (default: every lease's)")
    p.add_argument("--out", default="pretrain_curve.png", help="where the PNG goes")
    a = p.parse_args(argv)
    if not a.files:
        leases = sorted(LEASES.glob("lease*/quality.jsonl"), key=lambda f: int(re.sub(r"\D", "", f.parent.name) or 0))
        a.files = [str(f) for f in leases]
        if not a.files:
            raise SystemExit(f"error: no {LEASES}/lease<N>/quality.jsonl; python benchmarks/results_data.py fetch")
    rows = load(a.files)
    if not rows:
        raise SystemExit(f"error: no rows in {' '.join(a.files)}")
    plot(rows, Path(a.out))
    print(table(rows))
    print(f"\ncurve: {a.out}")
    print(flattened(rows)[1])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
