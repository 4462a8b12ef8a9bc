"""BallInCup native FPO: stability of robot_fpo_fast.py beside the official code, from the raw study tarballs.

    python benchmarks/plot_ballincup_stability.py --out benchmarks/robot_results/ballincup_stability

Reads (paths relative to the repository root):
  ballincup/data/study.tar.gz                          ours and the official code, seeds 0-3 (an earlier call)
  ballincup_stability/data/call1_*.tar.gz              the official code logged per block (benchmarks/
                                                       peer_fpo_logged.py) and ours before the skip, seeds 2, 5, 9
  ballincup_stability/data/call2_ours_skip_*.tar.gz    ours with non-finite steps skipped, seeds 0-9

Writes stability.md (one row per run), stability.json and stability.png (evaluation curves; the ratio's
maximum per update). A run *collapsed* when its last evaluation is below half its peak.
"""

from __future__ import annotations

import argparse
import io
import json
import math
import re
import tarfile
from pathlib import Path

from results_data import require

ROOT = Path(__file__).resolve().parent / "robot_results"
SOURCES = [
    ("ballincup/data/study.tar.gz", "earlier call (4 x H200)"),
    ("ballincup_stability/data/call1_official_logged_and_ours_before.tar.gz", "call 1 (2 x H200)"),
    ("ballincup_stability/data/call2_ours_skip_seeds0-9.tar.gz", "call 2 (4 x H200)"),
]


def members(path: Path):
    with tarfile.open(path) as tar:
        for m in tar.getmembers():
            if m.isfile():
                yield m.name, tar.extractfile(m).read()


def ours_run(rows: list[dict]) -> dict:
    evals = [(r["update"], r["eval_return"]) for r in rows if r.get("eval_return") is not None]
    steps = [r for r in rows if "ratio_max" in r]
    return {
        "evals": evals,
        "nonfinite": any(r.get("nonfinite") for r in rows),
        "skipped_steps": sum(r.get("skipped_steps", 0) for r in steps),
        "ratio_max": [(r["update"], r["ratio_max"]) for r in steps],
        "x_max": max((r["action_abs_max"] for r in steps if r.get("action_abs_max") is not None), default=None),
    }


def official_logged(d: dict) -> dict:
    rows = d["rows"]
    return {
        "evals": [(e["update"], e["eval_return"]) for e in d["evals"]],
        "nonfinite": d["first_nonfinite_update"] is not None,
        "skipped_steps": None,
        "ratio_max": [(r["update"], r["ratio_max"]) for r in rows],
        "x_max": max(r["action_abs_max"] for r in rows),
    }


def official_plain(d: dict) -> dict:  # benchmarks' run_official_fpo.py: evaluations only
    evals = [(0, d["eval0"])] + [(e["block"], e["reward"]) for e in d["evals"]] + [(len(d["iters"]), d["eval_end"])]
    finite = all(math.isfinite(r["train_reward"]) for r in d["iters"])
    return {"evals": evals, "nonfinite": not finite, "skipped_steps": None, "ratio_max": [], "x_max": None}


def load() -> list[dict]:
    runs = []
    for rel, call in SOURCES:
        metrics = {}
        for name, data in members(require(ROOT / rel)):
            m = re.search(r"runs/BallInCup_(?:ae1\.0_)?s(\d)/metrics\.jsonl$", name)
            if m:
                rows = [json.loads(line) for line in io.StringIO(data.decode()) if line.strip()]
                metrics[int(m.group(1))] = rows
            m = re.search(r"peer/(official|fpo_peer)_BallInCup_s(\d)\.json$", name)
            if m:
                d = json.loads(data)
                run = official_logged(d) if m.group(1) == "official" else official_plain(d)
                runs.append({"code": "official", "seed": int(m.group(2)), "call": call, **run})
        skip = "skip" in rel
        for seed, rows in sorted(metrics.items()):
            code = "ours, non-finite steps skipped" if skip else "ours, before"
            runs.append({"code": code, "seed": seed, "call": call, **ours_run(rows)})
    for r in runs:
        values = [v for _, v in r["evals"] if v is not None and math.isfinite(v)]
        r["peak"], r["last"] = max(values), values[-1]
        r["last_update"] = r["evals"][-1][0]
        r["collapsed"] = r["last"] < 0.5 * r["peak"]
        r["ratio_peak"] = max((v for _, v in r["ratio_max"]), default=None)
    return sorted(runs, key=lambda r: (r["code"], r["call"], r["seed"]))


def fmt(v, spec=".0f"):
    return "-" if v is None else (f"{v:.2g}" if spec == "g" else format(v, spec))


def table(runs: list[dict]) -> str:
    head = "| code | call | seed | peak | last evaluation (update) | collapsed | ended non-finite | skipped steps "
    head += "| ratio max | stored abs(x) max |\n|---|---|---|---|---|---|---|---|---|---|\n"
    lines = []
    for r in runs:
        cells = [r["code"], r["call"], r["seed"], fmt(r["peak"]), f"{fmt(r['last'])} ({r['last_update']})"]
        cells += ["yes" if r["collapsed"] else "no", "yes" if r["nonfinite"] else "no"]
        cells += [fmt(r["skipped_steps"], "d"), fmt(r["ratio_peak"], "g"), fmt(r["x_max"], ".1f")]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    return head + "\n".join(lines) + "\n"


def counts(runs: list[dict]) -> str:
    out = []
    for code in sorted({r["code"] for r in runs}):
        rs = [r for r in runs if r["code"] == code]
        peaks = sorted(r["peak"] for r in rs)
        med = peaks[len(peaks) // 2] if len(peaks) % 2 else (peaks[len(peaks) // 2 - 1] + peaks[len(peaks) // 2]) / 2
        names = lambda key: ", ".join(f"s{r['seed']}" for r in rs if r[key]) or "none"  # noqa: E731
        out.append(
            f"- {code}: {len(rs)} runs; peak median {med:.1f} (range {peaks[0]:.1f}-{peaks[-1]:.1f}); "
            f"ended non-finite: {names('nonfinite')}; collapsed: {names('collapsed')}"
        )
    return "\n".join(out) + "\n"


def plot(runs: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.2))
    styles = {"official": "tab:gray", "ours, before": "tab:red", "ours, non-finite steps skipped": "tab:blue"}
    for r in runs:
        c = styles[r["code"]]
        if r["code"] != "ours, before":  # identical to the skipped run until the step it could not take
            a.plot(*zip(*r["evals"]), color=c, alpha=0.6, lw=1)
        if r["ratio_max"] and r["call"].startswith("call 1"):
            b.semilogy(*zip(*r["ratio_max"]), color=c, alpha=0.7, lw=1)
    for k, c in styles.items():
        (a if k != "ours, before" else b).plot([], [], color=c, label=k)
    a.set(xlabel="update (block)", ylabel="evaluation return (128 episodes)", title="BallInCup, every run")
    a.legend(fontsize=8)
    b.axhline(math.exp(88.7), color="k", ls=":", lw=1)
    b.text(1, math.exp(88.7) / 1e4, "float32 exp overflows", fontsize=8)
    b.set(xlabel="update (block)", ylabel="largest ratio of the update", title="seeds 2, 5, 9 (call 1): ratio maximum")
    b.plot([], [], color=styles["official"], label="official")
    b.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, default=ROOT / "ballincup_stability")
    out = p.parse_args().out
    runs = load()
    out.mkdir(parents=True, exist_ok=True)
    md = "# BallInCup native FPO, every run\n\n(generated by benchmarks/plot_ballincup_stability.py)\n\n"
    md += "A run collapsed when its last evaluation is below half its peak.\n\n" + counts(runs) + "\n" + table(runs)
    (out / "stability.md").write_text(md)
    keep = [{k: v for k, v in r.items() if k != "ratio_max"} for r in runs]
    (out / "stability.json").write_text(json.dumps(keep, indent=1))
    plot(runs, out / "stability.png")
    print(counts(runs), end="")


if __name__ == "__main__":
    main()
