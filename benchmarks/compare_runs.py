"""Two runs of robot_fpo.py (or its fast variant) side by side, update by update: a same-seed check that a
numeric change (``--bf16``, a compiled or fused phase) leaves learning where the float32 reference has it.

    python benchmarks/compare_runs.py runs/spot_bf16 runs/spot_fp32 --upto 120 --out same_seed.png

Prints, for windows of updates, each run's mean of the logged statistics and their relative difference, then
the evaluations both runs made; --out draws the training return (running mean over 10 updates) and the
evaluations of both. Only updates both runs logged are compared.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np

KEYS = ("episodic_return", "episodic_length", "pg_loss", "v_loss", "clipfrac", "ratio_max", "grad_norm")


def load(run: Path) -> dict[int, dict]:
    """update -> the row metrics.jsonl logged for it (the last one where a resumed run logged it twice)."""
    path = run / "metrics.jsonl"
    if not path.is_file():
        raise SystemExit(f"error: no metrics.jsonl in {run}: pass a run folder")
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return {r["update"]: r for r in rows if "update" in r}


def finite(x) -> bool:  # as plot_robot_study.is_finite: a logged number, not a flag
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def windows(upto: int, n: int = 3) -> list[tuple[int, int]]:
    """n consecutive windows of updates covering 1..upto, each at least one update long."""
    edges = np.linspace(0, upto, n + 1).round().astype(int)
    return [(int(a) + 1, int(b)) for a, b in zip(edges[:-1], edges[1:]) if b > a]


def table(a: dict, b: dict, upto: int, names: tuple[str, str]) -> list[str]:
    lines = [f"| statistic | updates | {names[0]} | {names[1]} | relative difference |", "|---|---|---|---|---|"]
    for key in KEYS:
        for lo, hi in windows(upto):
            us = [u for u in range(lo, hi + 1) if u in a and u in b and finite(a[u].get(key)) and finite(b[u].get(key))]
            if not us:
                continue
            ma, mb = (float(np.mean([r[u][key] for u in us])) for r in (a, b))
            rel = (ma - mb) / abs(mb) if mb else float("nan")
            lines.append(f"| {key} | {lo}-{hi} | {ma:.4g} | {mb:.4g} | {rel:+.3f} |")
    lines += ["", f"| update | {names[0]} eval | {names[1]} eval |", "|---|---|---|"]
    for u in sorted(set(a) & set(b)):
        if u <= upto and finite(a[u].get("eval_return")) and finite(b[u].get("eval_return")):
            lines.append(f"| {u} | {a[u]['eval_return']:.3f} | {b[u]['eval_return']:.3f} |")
    return lines


def plot(a: dict, b: dict, upto: int, names: tuple[str, str], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax0, ax1) = plt.subplots(1, 2, figsize=(10, 3.8))
    for i, (r, name) in enumerate(zip((a, b), names)):
        us = [u for u in sorted(r) if u <= upto and finite(r[u].get("episodic_return"))]
        w = min(10, len(us))
        if w:
            mean = np.convolve([r[u]["episodic_return"] for u in us], np.ones(w) / w, mode="valid")
            ax0.plot(us[w - 1 :], mean, color=f"C{i}", lw=1.2, label=name)
        ev = [(u, r[u]["eval_return"]) for u in sorted(r) if u <= upto and finite(r[u].get("eval_return"))]
        if ev:
            ax1.plot(*zip(*ev), marker="o", color=f"C{i}", label=name)
    ax0.set(xlabel="update", ylabel="training return (mean of 10 updates)")
    ax1.set(xlabel="update", ylabel="evaluation return")
    ax0.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    print("wrote", out)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("run_a", type=Path)
    p.add_argument("run_b", type=Path)
    p.add_argument("--upto", type=int, default=0, help="compare updates 1..UPTO (0: the last both logged)")
    p.add_argument("--names", nargs=2, default=None, help="labels of the two runs (default: folder names)")
    p.add_argument("--out", type=Path, default=None, help="a PNG of both curves")
    a = p.parse_args()
    ra, rb = load(a.run_a), load(a.run_b)
    common = set(ra) & set(rb) - {0}
    if not common:
        raise SystemExit(f"error: {a.run_a} and {a.run_b} share no logged update after 0")
    upto = a.upto or max(common)
    if upto < 1:
        raise SystemExit(f"error: --upto {upto}: pass a positive update count (or 0 for all)")
    names = tuple(a.names or (a.run_a.name, a.run_b.name))
    print("\n".join(table(ra, rb, upto, names)))
    if a.out:
        plot(ra, rb, upto, names, a.out)


if __name__ == "__main__":
    main()
