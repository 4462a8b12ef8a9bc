"""PNGs of the Playground-backend learning runs in benchmarks/robot_results/playground/learn_acrobot:

- acrobot_vs_official.png: evaluation return per block, robot_fpo.py (native FPO, alpha_eps 1,
  seed 0) beside the official FPO code (seed 0), same GPU, same call;
- acrobot_alpha_study.png: mean evaluation curve over seeds per alpha_eps, each run thin, with
  each run's peak (eq:peak) and the paper's 244-block numbers in the legend.

    python benchmarks/plot_playground_results.py [DIR]
"""

from __future__ import annotations

import ast
import json
import sys
from collections import defaultdict
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

PAPER_ACROBOT = {1.0: 163.6, 0.5: 193.5, 0.25: 184.5}  # Figure robotics, fixed alpha_eps, 244 blocks


def our_evals(run: Path) -> tuple[list[int], list[float]]:
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    ev = [(r["update"], r["eval_return"]) for r in rows if r.get("eval_return") is not None]
    return [u for u, _ in ev], [v for _, v in ev]


def official_evals(log: Path, eval0: float | None) -> tuple[list[int], list[float]]:
    pts = [(0, eval0)] if eval0 is not None else []
    for line in log.read_text().splitlines():
        if line.startswith("eval {"):
            d = ast.literal_eval(line[5:])
            pts.append((d["block"], d["reward"]))
    return [b for b, _ in pts], [r for _, r in pts]


def main() -> None:
    d = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent / "robot_results" / "playground"
    learn = d / "learn_acrobot"
    # The official code's block-0 evaluation (seed 0) is printed only at its end; take it from the
    # 6-block timing run of the same code and seed.
    eval0 = json.loads((d / "blocks" / "fpo_peer_AcrobotSwingup_s0.json").read_text()).get("eval0")

    fig, ax = plt.subplots(figsize=(6, 4))
    x, y = our_evals(learn / "AcrobotSwingup_ae1_s0")
    ax.plot(x, y, "o-", label="robot_fpo.py, Playground backend (seed 0)")
    x, y = official_evals(learn / "official_AcrobotSwingup_s0.log", eval0)
    ax.plot(x, y, "s-", label="official FPO code (seed 0)")
    ax.set(xlabel="block (983,040 steps)", ylabel="evaluation return (128 episodes)",
           title="AcrobotSwingup, native FPO, 7 runs sharing one H200 for 300 s")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(d / "acrobot_vs_official.png", dpi=110)

    runs = defaultdict(list)
    for run in sorted(learn.glob("AcrobotSwingup_ae*_s*")):
        a = float(run.name.split("_ae")[1].split("_s")[0])
        runs[a].append(our_evals(run))
    fig, ax = plt.subplots(figsize=(6, 4))
    for i, a in enumerate(sorted(runs, reverse=True)):
        c = f"C{i}"
        for x, y in runs[a]:
            ax.plot(x, y, color=c, alpha=0.35, lw=1)
        n = min(len(y) for _, y in runs[a])
        mean = np.mean([y[:n] for _, y in runs[a]], axis=0)
        peaks = ", ".join(f"{max(y):.2f}" for _, y in runs[a])
        ax.plot(runs[a][0][0][:n], mean, "o-", color=c,
                label=f"alpha_eps {a:g}: peaks {peaks} (paper, 244 blocks: {PAPER_ACROBOT[a]})")
    ax.set(xlabel="block (983,040 steps)", ylabel="evaluation return (128 episodes)",
           title="AcrobotSwingup alpha study, 2 seeds, stopped at block 14 of 61")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(d / "acrobot_alpha_study.png", dpi=110)
    print("wrote", d / "acrobot_vs_official.png", d / "acrobot_alpha_study.png")


if __name__ == "__main__":
    main()
