"""Grids of runs and their tables: the cells of a CIFAR grid, each run's peak (eq:peak), the per-cell
table of peaks and final rewards over seeds, the estimators paired by seed (tab:sampling) and the
grid's Markdown. halving.py trains the runs (``python halving.py cifar-grid`` / ``robot-grid``); this
module only reads what they recorded, with numpy alone."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from fpo_utils.replay import fmt_label

CIFAR_ALPHAS = (-2.0, -1.0, 0.0, 1.0)  # app:search-settings
FINAL = ("finished", "stopped", "nonfinite")  # statuses of a run that has ended
CIFAR_TARGETS = ("v", "x0", "eps")  # eq:targets
CIFAR_ESTIMATORS = ("q+a", "q+Z", "explicit")  # tab:sampling
CIFAR_RULES = ("static-direct", "online-ema", "online-refit")  # tab:online-full, at the --train settings
TIE_TOLERANCE = 0.003  # tab:sampling's W/T/L tie tolerance on paired peak differences
PROFILE_AXES = ("alphas", "targets", "schedules", "etas", "rules", "refit_etas")  # each entry is one profile


def _distinct(flag: str, values: Sequence[Any], allowed: Optional[Sequence[str]] = None, numbers=False) -> List[Any]:
    """`values` of the grid axis --`flag`, checked: distinct, each one of `allowed` or a finite number."""
    if len(set(values)) != len(values):
        raise ValueError(f"--{flag} {list(values)} must be distinct")
    for v in values:
        if allowed is not None and v not in allowed:
            raise ValueError(f"--{flag} {v!r} is not allowed: choose from {', '.join(allowed)}")
        if numbers and not math.isfinite(v):
            raise ValueError(f"--{flag} {v!r} is not allowed: give finite numbers")
    return list(values)


def _schedule(text: str) -> Dict[str, Any]:
    """`alpha_early:alpha_late:k0:k1` -> the trainer's schedule settings (app:schedules)."""
    parts = text.split(":")
    try:
        early, late, k0, k1 = float(parts[0]), float(parts[1]), int(parts[2]), int(parts[3])
        ok = len(parts) == 4 and math.isfinite(early) and math.isfinite(late) and 0 <= k0 <= k1
    except (ValueError, IndexError):
        ok = False
    if not ok:
        raise ValueError(
            f"--schedules {text!r} is not allowed: give alpha_early:alpha_late:k0:k1 with 0 <= k0 <= k1, "
            "e.g. -3:-0.5:160:260"
        )
    return {"weighting": "schedule", "alpha_early": early, "alpha_late": late, "k0": k0, "k1": k1}


def cifar_cells(spec, weighting_label: Callable[[Any], str]) -> List[Dict[str, Any]]:
    """The cells of a CIFAR grid `spec` (halving.py's CifarGrid) in order: every profile (alphas,
    targets, schedules, etas, rules, refit_etas, in that order), crossed with every g (--gs) and every
    estimator (--estimators); `weighting_label` is the trainer's name of a weighting (its Args -> text).
    Each cell is {"cell": its name in run folders, "alpha": the exponent label of a fixed-alpha profile
    else None, "settings": the trainer settings it sets}. A grid over alphas alone keeps the names
    `alpha<+a>`; g and the estimator join a name (`__g0.5`, `__q+Z`) only when they are swept."""
    given = [ax for ax in PROFILE_AXES if getattr(spec, ax)]
    alphas = list(spec.alphas) if spec.alphas or given else list(CIFAR_ALPHAS)
    profiles = []
    for a in _distinct("alphas", [float(a) for a in alphas], numbers=True):
        settings = {"weighting": "fixed", "target": None, "alpha": a}
        profiles.append((f"alpha{a:+g}", fmt_label(a), settings))
    for t in _distinct("targets", list(spec.targets), CIFAR_TARGETS):
        profiles.append((t, None, {"weighting": "fixed", "target": t}))
    for text in _distinct("schedules", list(spec.schedules)):
        profiles.append((None, None, _schedule(text)))
    for eta in _distinct("etas", [float(e) for e in spec.etas], numbers=True):
        profiles.append((None, None, {"weighting": "static-softmax", "eta": eta}))
    for rule in _distinct("rules", list(spec.rules), CIFAR_RULES):
        profiles.append((None, None, {"weighting": rule}))
    for eta in _distinct("refit-etas", [float(e) for e in spec.refit_etas], numbers=True):
        profiles.append((None, None, {"weighting": "online-refit", "refit_eta": eta}))
    gs = _distinct("gs", [float(g) for g in spec.gs], numbers=True)
    bad = [g for g in gs if g <= 0]
    if bad:
        raise ValueError(f"--gs {bad[0]:g} is not allowed: scales g must be > 0")
    estimators = _distinct("estimators", list(spec.estimators), CIFAR_ESTIMATORS)
    cells = []
    for name, alpha, settings in profiles:
        if name is None:  # the trainer's own label: static-softmax-eta1, online-refit-eta0.5, ...
            name = weighting_label(replace(spec.train, **settings, g=1.0, estimator="q+a"))
        for g in gs or [None]:
            for est in estimators or [None]:
                cell = name + ("" if g is None else f"__g{g:g}") + ("" if est is None else f"__{est}")
                extra = ({} if g is None else {"g": g}) | ({} if est is None else {"estimator": est})
                cells.append({"cell": cell, "alpha": alpha, "settings": {**settings, **extra}})
    return cells


def run_peak(state: Dict[str, Any]) -> Tuple[Optional[float], Optional[int]]:
    """eq:peak: the best finite evaluation of a run and its update (the earliest on ties)."""
    curve = {k: v for k, v in state["curve"].items() if math.isfinite(v)}
    if not curve:
        return None, None
    best = max(curve, key=lambda k: (curve[k], -k))
    return curve[best], best


def _mean_sd(vals: Sequence[float]) -> Tuple[Optional[float], Optional[float]]:
    """Mean and sample SD (ddof 1) of `vals`; None where undefined."""
    return (float(np.mean(vals)) if vals else None, float(np.std(vals, ddof=1)) if len(vals) > 1 else None)


def peak_table(runs: Sequence[Dict[str, Any]], seeds: Sequence[int]) -> List[Dict[str, Any]]:
    """Per (task, cell): each seed's per-run peak (eq:peak) and final reward (the validation reward at the
    budget's last update; missing for a run that stopped earlier), then the mean and sample SD over seeds.
    Peaks average the runs that ended (finished, early-stopped or non-finite; a non-finite run keeps the
    peak it reached), as the paper reports them; runs that failed (raised, or their worker kept dying)
    are listed by name, not averaged, and non-finite runs are listed by name too. `mean`, `sd` and `n`
    are the peak's; `final_mean`, `final_sd` and `final_n` the final reward's."""
    rows: Dict[Tuple[str, str], Dict[str, Any]] = {}
    for r in runs:
        row = rows.setdefault(
            (r["task"], r["cell"]),
            {
                "task": r["task"],
                "cell": r["cell"],
                "alpha": r["alpha"],
                **({"settings": r["settings"]} if "settings" in r else {}),
                "peaks": {},
                "finals": {},
                "nonfinite": [],
                "failed": [],
                "nonfinite_runs": [],
                "failed_runs": [],
            },
        )
        if r["failed"] or r["status"] not in FINAL or r["peak"] is None:
            row["failed"].append(r["seed"])
            row["failed_runs"].append(r.get("name", Path(r["run"]).name))
            continue
        row["peaks"][str(r["seed"])] = r["peak"]
        if r.get("final") is not None:
            row["finals"][str(r["seed"])] = r["final"]
        if r["status"] == "nonfinite":
            row["nonfinite"].append(r["seed"])
            row["nonfinite_runs"].append(r.get("name", Path(r["run"]).name))
    out = []
    for row in rows.values():
        peaks = [row["peaks"][str(s)] for s in seeds if str(s) in row["peaks"]]
        finals = [row["finals"][str(s)] for s in seeds if str(s) in row["finals"]]
        mean, sd = _mean_sd(peaks)
        final_mean, final_sd = _mean_sd(finals)
        row.update(n=len(peaks), mean=mean, sd=sd, final_n=len(finals), final_mean=final_mean, final_sd=final_sd)
        out.append(row)
    return out


def paired_estimators(runs: Sequence[Dict[str, Any]], estimators: List[str]) -> List[Dict[str, Any]]:
    """tab:sampling: per task and estimator after the first, the peak differences (the first estimator
    minus this one, as the table's q - explicit) over the (profile, g, seed) pairs where both runs have a
    peak; mean and sample SD, n and wins/ties/losses of the first with tie tolerance TIE_TOLERANCE."""
    peaks = {
        (r["task"], r["settings"]["estimator"], r["cell"].rsplit("__", 1)[0], r["seed"]): r["peak"]
        for r in runs
        if not r["failed"] and r["peak"] is not None and r["status"] in FINAL
    }
    out = []
    for task in dict.fromkeys(r["task"] for r in runs):
        for est in estimators[1:]:
            diffs = [
                peaks[(task, estimators[0], prof, seed)] - v
                for (t, e, prof, seed), v in peaks.items()
                if t == task and e == est and (task, estimators[0], prof, seed) in peaks
            ]
            mean, sd = _mean_sd(diffs)
            out.append(
                {
                    "task": task,
                    "estimator": est,
                    "versus": estimators[0],
                    "n": len(diffs),
                    "mean": mean,
                    "sd": sd,
                    "wins": sum(d > TIE_TOLERANCE for d in diffs),
                    "ties": sum(abs(d) <= TIE_TOLERANCE for d in diffs),
                    "losses": sum(d < -TIE_TOLERANCE for d in diffs),
                }
            )
    return out


def _pm(mean: Optional[float], sd: Optional[float]) -> str:
    return "-" if mean is None else f"{mean:.6f}" + ("" if sd is None else f" ± {sd:.6f}")


def grid_markdown(result: Dict[str, Any]) -> str:
    """The per-cell table of a grid as Markdown: one row per (task, cell), the peak's and the final
    reward's mean ± SD over seeds, then one column per seed (its peak)."""
    seeds, budget = result["config"]["seeds"], result["config"]["budget"]
    only_alphas = all(row["alpha"] is not None and "__" not in row["cell"] for row in result["table"])
    head = ["Task", "alpha" if only_alphas else "Cell", "n", "Peak mean ± SD"]
    head += [f"Final ({budget}) mean ± SD"] + [f"seed {s}" for s in seeds] + ["Notes"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in result["table"]:
        final = _pm(row["final_mean"], row["final_sd"]) + (
            f" (n={row['final_n']})" if row["final_n"] != row["n"] else ""
        )
        cells = [f"{row['peaks'][str(s)]:.6f}" if str(s) in row["peaks"] else "failed" for s in seeds]
        notes = "; ".join(
            ([f"non-finite: {', '.join(row['nonfinite_runs'])}"] if row["nonfinite_runs"] else [])
            + ([f"failed: {', '.join(row['failed_runs'])}"] if row["failed_runs"] else [])
        )
        label = row["alpha"] if only_alphas else row["cell"]
        lines.append(
            "| "
            + " | ".join([row["task"], label, str(row["n"]), _pm(row["mean"], row["sd"]), final] + cells + [notes])
            + " |"
        )
    text = "\n".join(lines) + (
        f"\n\nPeak: the best evaluation of a run (eq:peak); final: the validation reward at update {budget} "
        "(the budget); mean and sample SD over seeds.\n"
    )
    if result.get("paired"):
        rows = [
            [
                p["task"],
                f"{p['versus']} - {p['estimator']}",
                str(p["n"]),
                _pm(p["mean"], p["sd"]),
                f"{p['wins']}/{p['ties']}/{p['losses']}",
            ]
            for p in result["paired"]
        ]
        text += "\nPaired by seed (tab:sampling; W/T/L with tie tolerance " + f"{TIE_TOLERANCE:g}):\n\n"
        text += "| Task | Peak difference | Pairs | Mean ± SD | W/T/L |\n|---|---|---|---|---|\n"
        text += "".join("| " + " | ".join(r) + " |\n" for r in rows)
    for f in result["failures"]:
        text += f"\nFailed: {f['name']}: {f['failed']}"
    return text + ("\n" if result["failures"] else "")


def print_grid(result: Dict[str, Any]) -> None:
    print(grid_markdown(result))
    c = result["cost"]
    print(f"{c['runs']} runs, {c['trained']} updates = {c['C']:g} full runs")
