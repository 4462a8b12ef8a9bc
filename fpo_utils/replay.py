"""The successive-halving rule and its replay over recorded learning curves (sec:halving,
app:halving-robotics, app:search-settings), importable with numpy alone.

The rule: at a rung (or cut) where ``k`` candidates are in, keep the best ``ceil(k/2)`` (`keep_count`);
rungs double from the first (`halving_rungs`, `cut_fractions`). halving.py applies it to live arms;
`replay` applies it to curves already recorded, and `runs_to_curves` turns run folders into them.

Replay (``python halving.py replay``, function `replay`)
    ``curves`` maps each candidate to an array (seeds, evaluations) of validation rewards or
    returns at the evaluation points ``steps`` (the last point is the full budget H; missing
    evaluations may be NaN). For ``n`` in the requested draw sizes every one of the ``S^n``
    ordered seed draws with replacement is enumerated, the same draw for every candidate
    (app:search-settings). At the cuts ``X, 2X, 4X, ... < 100%`` of H the replay uses the last
    evaluation at or before the cut, ranks the candidates still in by the mean over the drawn
    seeds of each seed's peak observed so far, and keeps ``ceil(K/2)``; the survivors are
    ranked by the same statistic at the full budget. Exact ties are averaged over candidate
    orderings: the outcome is the average, over all K! orderings of the candidate list, of the
    procedure that breaks every tie (in every round) by position in that ordering. The selection
    probability pi(alpha) averages over draws and orderings; the selected score is
    ``sum_alpha pi(alpha) Pbar(alpha)`` with ``Pbar(alpha)`` the mean over all S seeds of each
    seed's full-budget peak (app:halving-robotics), and the oracle is ``max_alpha Pbar(alpha)``.
    Repeated runs of one candidate and seed are averaged pointwise before peaks are taken
    (`runs_to_curves` does this when converting run folders).

Cost of a replay
    ``C = sum_{alpha,i} T_alpha,i / H`` exactly as in app:halving-robotics, where
    ``i`` runs over the ``n`` seeds of a draw, ``T`` is the step of the evaluation used at the
    cut that eliminated the candidate (the last evaluation at or before the cut, not the cut
    itself) and ``H`` for the final survivors. Exhaustive search costs ``K n``; ``fraction`` is
    ``C / (K n)`` (the table's search/exhaustive column) and ``cost_per_replicate = C / n``
    (the figure's ``C_fig``). The number of candidates alive at each cut does not depend on the
    draw, so neither does C. The paper's cost column needs its recorded evaluation grid: with an
    evaluation every three 244-block units, this definition gives 4.1803, 5.3607, 7.7582 and 12
    (K=4) and 5.3607, 7.7582, 10.7582 and 15 (K=5) for first cuts 10, 20, 40% and full search,
    the paper's Acrobot and Walker entries of tab:halving-budgets; Spot's entries need its own
    checkpoint grid, which the paper does not give.
"""

from __future__ import annotations

import itertools
import json
import math
from fractions import Fraction
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

FIRST_CUTS = (2.0, 5.0, 10.0, 15.0, 20.0, 25.0, 30.0, 40.0, 50.0)  # app:search-settings, percent
HIGHLIGHT_CUT = 20.0  # tab:halving-choice reports the 20% first cut
REPLAY_DRAWS = (3,)  # tab:halving-choice and tab:halving-budgets use n = 3
SCORE_KEY = {"cifar": "val_reward", "robot": "eval_return"}  # the metrics field a run is ranked by


# ---------------------------------------------------------------------------------------------
# The halving rule
# ---------------------------------------------------------------------------------------------
def keep_count(k: int) -> int:
    """Number of candidates kept at a rung when ``k`` are in: ``ceil(k/2)``."""
    if k < 1:
        raise ValueError(f"candidate count {k} must be >= 1")
    return (k + 1) // 2


def rank_candidates(scores: Mapping[float, float]) -> List[float]:
    """Exponents ordered best first by score; exact ties favour the smaller exponent
    (app:search-settings) and non-finite scores (failed arms) come last."""

    def key(a):
        s = scores[a]
        return (0, -s, a) if math.isfinite(s) else (1, 0.0, a)

    return sorted(scores, key=key)


def halving_rungs(first: int, budget: int) -> List[int]:
    """The generic schedule: ``first, 2 first, 4 first, ...`` strictly below ``budget``, then ``budget``."""
    if first < 1 or budget < 1:
        raise ValueError(f"first rung {first} and budget {budget} must be >= 1")
    rungs, r = [], first
    while r < budget:
        rungs.append(r)
        r *= 2
    return rungs + [budget]


def cut_fractions(first_cut: Optional[float]) -> List[float]:
    """Cut targets ``X, 2X, 4X, ... < 1`` as fractions of the full budget (none for exhaustive)."""
    if first_cut is None:
        return []
    if not (isinstance(first_cut, (int, float)) and 0 < first_cut <= 1):
        raise ValueError(f"first_cut={first_cut!r} must be a fraction in (0, 1] (or None for exhaustive search)")
    out, x = [], float(first_cut)
    while x < 1.0 - 1e-12:
        out.append(x)
        x *= 2
    return out


def fmt_label(a: float) -> str:
    """Short text form of an exponent: -2, 0, 0.25."""
    return f"{float(a):g}"


# ---------------------------------------------------------------------------------------------
# Replay over recorded curves
# ---------------------------------------------------------------------------------------------
def _running_peaks(curves: Mapping[Any, Any], steps: Sequence[float]) -> Tuple[List[Any], np.ndarray, np.ndarray]:
    """Validate the replay input; return (labels, running peaks (K, S, E), steps)."""
    labels = list(curves)
    if len(labels) < 1:
        raise ValueError("curves is empty; give at least one candidate")
    steps = np.asarray(steps, dtype=np.float64)
    if steps.ndim != 1 or steps.size < 1 or not np.all(np.isfinite(steps)) or np.any(np.diff(steps) <= 0):
        raise ValueError(f"steps {steps.tolist()} must be a strictly increasing list of finite numbers")
    arrays = []
    for a in labels:
        x = np.asarray(curves[a], dtype=np.float64)
        if x.ndim == 1:
            x = x[None, :]
        if x.ndim != 2 or x.shape[1] != steps.size:
            raise ValueError(
                f"curve of candidate {a!r} has shape {np.shape(curves[a])}; expected (seeds, {steps.size})"
            )
        arrays.append(x)
    n_seeds = {x.shape[0] for x in arrays}
    if len(n_seeds) != 1 or 0 in n_seeds:
        raise ValueError(f"candidates have {sorted(n_seeds)} seeds; all need the same positive number (paired draws)")
    x = np.stack(arrays)  # (K, S, E)
    if np.any(np.isinf(x)):
        raise ValueError("curves hold infinite values; use NaN for missing evaluations")
    peaks = np.fmax.accumulate(np.where(np.isnan(x), -np.inf, x), axis=2)
    if not np.all(np.isfinite(peaks[:, :, -1])):
        bad = [labels[k] for k in range(len(labels)) if not np.all(np.isfinite(peaks[k, :, -1]))]
        raise ValueError(f"candidates {bad} have a seed without any finite evaluation")
    return labels, peaks, steps


def _select(scores: np.ndarray, cuts: Sequence[int], priority: Sequence[int]) -> Tuple[int, bool]:
    """One halving run on drawn-mean peaks ``scores`` (K, E): cut at evaluation indices ``cuts``,
    then rank at the last index. Ties are broken by ``priority`` (lower first). Returns the
    winner and whether any tie decided a selection."""
    alive = list(range(scores.shape[0]))
    tie = False
    for j in cuts:
        if len(alive) == 1:
            break
        keep = keep_count(len(alive))
        order = sorted(alive, key=lambda c: (-scores[c, j], priority[c]))
        tie |= bool(scores[order[keep - 1], j] == scores[order[keep], j])
        alive = order[:keep]
    order = sorted(alive, key=lambda c: (-scores[c, -1], priority[c]))
    if len(order) > 1:
        tie |= bool(scores[order[0], -1] == scores[order[1], -1])
    return order[0], tie


def replay(
    curves: Mapping[Any, Any], steps: Sequence[float], n_draw: int, first_cut: Optional[float]
) -> Dict[str, Any]:
    """Successive-halving replay over recorded curves (app:halving-robotics, app:search-settings).

    Args:
        curves: candidate -> array (seeds, evaluations); row i of every candidate is the same
            training seed. NaN marks a missing evaluation.
        steps: the evaluation points (increasing); the last one is the full budget H.
        n_draw: seeds per draw n; all S^n ordered draws with replacement are enumerated.
        first_cut: first cut X as a fraction of H (cuts X, 2X, 4X, ... < 1), or None for
            exhaustive search (every candidate trained to H, ranked there).

    Returns a dict with the selection ``probabilities`` (floats) and ``probabilities_exact``
    (fractions as text), ``pbar`` (mean full-budget peak per candidate), ``selected_score`` =
    sum_alpha pi(alpha) Pbar(alpha), ``oracle`` = max_alpha Pbar(alpha) and its ``oracle_candidate``,
    ``draw_range`` (smallest and largest Pbar of a selected candidate over draws), the ``cuts``
    used (target fraction and evaluation step), ``cost`` C, ``cost_per_replicate`` C/n,
    ``exhaustive_cost`` K n and ``fraction`` C/(K n). See the module docstring for the rules.
    """
    labels, peaks, steps = _running_peaks(curves, steps)
    if not (isinstance(n_draw, (int, np.integer)) and n_draw >= 1):
        raise ValueError(f"n_draw={n_draw!r} must be an integer >= 1")
    k, s, _ = peaks.shape
    if s**n_draw > 2_000_000:
        raise ValueError(f"{s}^{n_draw} draws is too many to enumerate; use a smaller n_draw")
    horizon = steps[-1]
    cuts, cut_info = [], []
    for frac in cut_fractions(first_cut):
        target = frac * horizon
        idx = np.nonzero(steps <= target + 1e-9 * max(abs(horizon), 1.0))[0]
        if idx.size == 0:
            raise ValueError(f"cut at {100 * frac:g}% = {target:g} lies before the first evaluation at {steps[0]:g}")
        cuts.append(int(idx[-1]))
        cut_info.append({"target": frac, "step": float(steps[idx[-1]])})

    # cost: the number alive at each cut is fixed by K, so it does not depend on the draw
    alive, spent = k, 0.0
    for j in cuts:
        if alive == 1:
            break
        keep = keep_count(alive)
        spent += (alive - keep) * steps[j]
        alive = keep
    spent += alive * horizon
    cost = n_draw * spent / horizon

    pbar = peaks[:, :, -1].mean(axis=1)
    counts = [Fraction(0)] * k
    lo, hi = math.inf, -math.inf
    perms = None
    for draw in itertools.product(range(s), repeat=n_draw):
        scores = peaks[:, list(draw), :].mean(axis=1)  # (K, E): mean over drawn seeds of the peaks so far
        winner, tie = _select(scores, cuts, list(range(k)))
        if not tie:
            outcome = {winner: Fraction(1)}
        else:
            if perms is None:
                perms = list(itertools.permutations(range(k)))
            tally: Dict[int, int] = {}
            for order in perms:
                priority = [0] * k
                for pos, c in enumerate(order):
                    priority[c] = pos
                w, _ = _select(scores, cuts, priority)
                tally[w] = tally.get(w, 0) + 1
            outcome = {w: Fraction(n, len(perms)) for w, n in tally.items()}
        for w, p in outcome.items():
            counts[w] += p
            lo, hi = min(lo, float(pbar[w])), max(hi, float(pbar[w]))
    total = s**n_draw
    probs = [c / total for c in counts]
    selected = float(sum(float(p) * float(pbar[i]) for i, p in enumerate(probs)))
    best = int(np.argmax(pbar))
    return {
        "candidates": labels,
        "n_draw": int(n_draw),
        "draws": total,
        "first_cut": None if first_cut is None else float(first_cut),
        "cuts": cut_info,
        "probabilities": {a: float(p) for a, p in zip(labels, probs)},
        "probabilities_exact": {a: str(p) for a, p in zip(labels, probs)},
        "pbar": {a: float(v) for a, v in zip(labels, pbar)},
        "selected_score": selected,
        "oracle": float(pbar[best]),
        "oracle_candidate": labels[best],
        "draw_range": [lo, hi],
        "cost": float(cost),
        "cost_per_replicate": float(cost / n_draw),
        "exhaustive_cost": float(k * n_draw),
        "fraction": float(cost / (k * n_draw)),
    }


# ---------------------------------------------------------------------------------------------
# Run folders -> curves
# ---------------------------------------------------------------------------------------------
def _read_jsonl(path: Path) -> List[Dict[str, Any]]:
    """Rows of a metrics.jsonl file (the run folder's format, read here without its torch-side module)."""
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def _run_folders(paths: Sequence[str]) -> List[Path]:
    out = []
    for p in paths:
        p = Path(p)
        if (p / "metrics.jsonl").is_file() and (p / "args.json").is_file():
            out.append(p)
        elif p.is_dir():
            found = sorted(q.parent for q in p.rglob("metrics.jsonl") if (q.parent / "args.json").is_file())
            if not found:
                raise ValueError(f"{str(p)!r} holds no run folder (args.json + metrics.jsonl)")
            out.extend(found)
        else:
            raise ValueError(f"{str(p)!r} is not a run folder or a folder of run folders")
    return out


def read_run(folder: Path, unit: str = "updates") -> Dict[str, Any]:
    """Task, candidate label, seed and evaluation curve {step: value} of a cifar_fpo.py or
    robot_fpo.py run folder, from its args.json and metrics.jsonl."""
    if unit not in ("updates", "steps"):
        raise ValueError(f"unit {unit!r} is not one of updates, steps")
    args = json.loads((folder / "args.json").read_text())
    if "env_id" in args:  # robot_fpo.py
        trainer = "robot"
        scheduled = args.get("alpha_early") is not None or args.get("alpha_late") is not None
        exponent = args["alpha_eps"] if args["objective"] == "fpo" else args["alpha"]
        label = "schedule" if scheduled else fmt_label(exponent)
        task = f"{args['env_id']} {args['objective']}"
    elif "reward" in args:  # cifar_fpo.py
        trainer = "cifar"
        if unit != "updates":
            raise ValueError(f"unit {unit!r}: CIFAR runs count updates only")
        if args["weighting"] == "fixed":
            label = args["target"] if args.get("target") else fmt_label(args["alpha"])
        else:
            label = args["weighting"]
        task = args["reward"]
    else:
        raise ValueError(f"{folder}/args.json is neither a cifar_fpo.py nor a robot_fpo.py run")
    key, score = ("global_step" if unit == "steps" else "update"), SCORE_KEY[trainer]
    curve = {float(r[key]): float(r[score]) for r in _read_jsonl(folder / "metrics.jsonl") if r.get(score) is not None}
    if not curve:
        raise ValueError(f"{folder} has no evaluation records in metrics.jsonl")
    return {"task": task, "label": label, "seed": int(args["seed"]), "curve": curve, "folder": str(folder)}


def runs_to_curves(
    paths: Sequence[str], unit: str = "updates", task: Optional[str] = None, until: Optional[float] = None
) -> Dict[str, Any]:
    """Collect run folders of one task into the replay's input.

    Runs are grouped by candidate (exponent, target or weighting rule) and seed; repeated runs
    of one candidate and seed are averaged pointwise over the evaluations they share
    (app:halving-robotics). The evaluation grid is the union of all runs' points up to `until`
    (all of them by default); a point a run did not record is NaN. Every candidate needs the same seeds.
    """
    runs = [read_run(f, unit) for f in _run_folders(paths)]
    if until is not None:  # a common budget for runs that were cut at different points
        for r in runs:
            r["curve"] = {st: v for st, v in r["curve"].items() if st <= until}
    tasks = sorted({r["task"] for r in runs})
    if len(tasks) != 1:
        raise ValueError(f"runs of several tasks {tasks}; convert one task at a time")
    groups: Dict[Tuple[str, int], List[Dict[float, float]]] = {}
    for r in runs:
        groups.setdefault((r["label"], r["seed"]), []).append(r["curve"])
    labels = sorted({lab for lab, _ in groups}, key=_label_key)
    seeds = sorted({s for _, s in groups})
    missing = [f"{lab}/seed {s}" for lab in labels for s in seeds if (lab, s) not in groups]
    if missing:
        raise ValueError(f"candidates need the same seeds; missing runs: {', '.join(missing)}")
    steps = sorted({st for curves in groups.values() for c in curves for st in c})
    table = {}
    for lab in labels:
        rows = []
        for s in seeds:
            row = []
            for st in steps:
                vals = [c[st] for c in groups[(lab, s)] if st in c]
                row.append(float(np.mean(vals)) if vals else None)
            rows.append(row)
        table[lab] = rows
    native = "1" if "1" in labels else None
    return {
        "task": task or tasks[0],
        "unit": unit,
        "steps": steps,
        "seeds": seeds,
        "native": native,
        "runs": {lab: sum(len(groups[(lab, s)]) for s in seeds) for lab in labels},
        "curves": table,
    }


def _label_key(label: str):
    try:
        return (0, float(label), "")
    except ValueError:
        return (1, 0.0, label)


def load_curves(path: str) -> Dict[str, Any]:
    """Read a curves JSON file ({"steps", "curves": {label: [[...], ...]}, ...}); null -> NaN."""
    data = json.loads(Path(path).read_text())
    if "steps" not in data or "curves" not in data:
        raise ValueError(f"{path} lacks 'steps' or 'curves'; write it with `python halving.py curves`")
    data["curves"] = {
        str(k): np.array([[np.nan if v is None else v for v in row] for row in rows], dtype=np.float64)
        for k, rows in data["curves"].items()
    }
    data.setdefault("task", Path(path).stem)
    return data


def replay_sweep(data: Dict[str, Any], n_draw: int, first_cuts: Sequence[float]) -> List[Dict[str, Any]]:
    """`replay` at every first cut (percent) that lies on or after the first evaluation, then exhaustive."""
    out = []
    for pct in first_cuts:
        if not 0 < pct <= 100:
            raise ValueError(f"first cut {pct}% must be in (0, 100]")
        frac = pct / 100.0
        steps = data["steps"]
        if frac * steps[-1] < steps[0] - 1e-9 * abs(steps[-1]):
            out.append({"first_cut_pct": pct, "skipped": f"before the first evaluation at {steps[0]:g}"})
            continue
        out.append({"first_cut_pct": pct, **replay(data["curves"], steps, n_draw, frac)})
    out.append({"first_cut_pct": None, **replay(data["curves"], data["steps"], n_draw, None)})
    return out


def _prob_text(res: Dict[str, Any]) -> str:
    parts = [(a, p) for a, p in res["probabilities_exact"].items() if p != "0"]
    return "; ".join(f"{a}: {p}" for a, p in sorted(parts, key=lambda t: _label_key(t[0])))


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]

    def line(r):
        return "  ".join(str(x).rjust(w) if i else str(x).ljust(w) for i, (x, w) in enumerate(zip(r, widths)))

    return "\n".join([line(header), "  ".join("-" * w for w in widths)] + [line(r) for r in rows])


def choice_table(entries: Sequence[Tuple[str, Optional[str], Dict[str, Any]]]) -> str:
    """tab:halving-choice: per task (name, native label, replay result) the native, selected and
    oracle scores, selected minus native and the gap, then the selection probabilities."""
    top, bottom = [], []
    for task, native, res in entries:
        nat = res["pbar"].get(native) if native is not None else None
        delta = f"{res['selected_score'] - nat:+.6f}" if nat is not None else "-"
        top.append(
            [
                task,
                f"{nat:.6f}" if nat is not None else "-",
                f"{res['selected_score']:.6f}",
                f"{res['oracle']:.6f}",
                delta,
                f"{res['oracle'] - res['selected_score']:.6f}",
            ]
        )
        bottom.append([task, _prob_text(res), str(res["oracle_candidate"]), f"{100 * res['fraction']:.4f}%"])
    return (
        _table(["Task", "Native", "Selected", "Oracle", "Delta", "Gap"], top)
        + "\n\n"
        + _table(["Task", "Exponent: probability", "Oracle exponent", "Search / exhaustive"], bottom)
    )


def budget_table(entries: Sequence[Tuple[str, List[Dict[str, Any]]]]) -> str:
    """tab:halving-budgets: per task and first cut the selected score, the exact draw range and C."""
    rows = []
    for task, sweep in entries:
        for res in sweep:
            cut = "Full search" if res["first_cut_pct"] is None else f"{res['first_cut_pct']:g}%"
            if "skipped" in res:
                rows.append([task, cut, "-", res["skipped"], "-"])
                continue
            lo, hi = res["draw_range"]
            rows.append([task, cut, f"{res['selected_score']:.2f}", f"[{lo:.2f}, {hi:.2f}]", f"{res['cost']:.4f}"])
    return _table(["Task", "First cut", "Selected score", "Exact draw range", "C"], rows)
