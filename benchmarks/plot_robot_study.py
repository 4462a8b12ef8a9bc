"""Tables and PNGs of a robot study run by benchmarks/robot_study.sh (our run folders in DIR/runs,
the official FPO runner's JSONs in DIR/peer, logs in DIR/logs).

    python benchmarks/plot_robot_study.py DIR [--out benchmarks/robot_results/study]

Each run's alpha, seed, task, objective and backend come from its args.json. A block is 983,040
environment steps (app:robotics): block = global_step / block_size (one update at the fpo preset).
Writes to --out:
- vs_official_TASK.png: the official evaluation curve beside our alpha_eps = 1 FPO runs;
- alpha_study_TASK.png: per alpha_eps the mean curve over seeds (evaluation points every seed has),
  each run thin, mean peak +- std and the paper's 244-block number in the legend;
- fpopp_ENV.png (FPO++ runs, x = update), fpopp_ENV_train.png (their training return: episodes that
  ended in an update's rollout, running mean over 10 updates), envpool_ENV.png (envpool FPO runs, x = block);
- fpopp_ENV_track.png and a table in study.md (legged runs): the evaluation's command-tracking errors, the
  table at every --table-every updates and the last evaluation;
- a training-rollouts table in study.md (FPO++ runs that log their ended episodes): the episodes ended per
  update, their mean length and return, means over the 10 updates ending at every --table-every updates;
- study.json, study.md: per (task, objective, backend) the runs (updates done / asked, status,
  peak (eq:peak) and its block, final evaluation, divergence events), per alpha the mean +- std of
  the peaks (numpy's std, ddof 0) over seeds, and the official runs (peak, median s per block).
A missing or partial file is skipped with a printed note; unfinished runs are kept, marked.
"""

from __future__ import annotations

import argparse
import ast
import json
import math
import re
from collections import defaultdict
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

BLOCK = 983_040  # environment steps per training block (app:robotics)
# Figure robotics / fig:robotics-dynamic: final return of fixed-alpha_eps FPO, 244-block cohort
PAPER = {"AcrobotSwingup": {1.0: 163.6, 0.25: 184.5, 0.5: 193.5}, "WalkerRun": {1.0: 713.3, 0.5: 760.2}}
PAPER_BLOCKS = 244
# the per-update table of legged runs: column title, metrics.jsonl key, number format
TRACK_COLUMNS = (
    ("eval, x0 = 0", "eval_return", ".2f"),
    ("velocity error (m/s)", "eval_track_lin", ".3f"),
    ("yaw error (rad/s)", "eval_track_yaw", ".3f"),
    ("episode length", "eval_track_len", ".0f"),
    ("eval, random x0", "eval_return_random", ".2f"),
    ("velocity error, random x0", "eval_track_lin_random", ".3f"),
    ("training episode length", "episodic_length", ".0f"),  # that update's finished training episodes
)
ROLLOUT_KEYS = ("episodes", "episodic_length", "episodic_return")  # per update: ended, their mean length and return
SEED_LS = ("-", "--", ":", "-.")  # line styles of the seeds within one alpha, in the order the runs sort
NOTES: list[str] = []


def note(msg: str) -> None:
    NOTES.append(msg)
    print("note:", msg)


def read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as err:
        note(f"skipped {path}: {type(err).__name__}")
        return None


def read_rows(path: Path) -> list[dict]:
    rows = []
    try:
        lines = path.read_text().splitlines()
    except OSError:
        note(f"{path} missing")
        return rows
    for i, line in enumerate(lines):
        try:
            rows.append(json.loads(line))
        except ValueError:
            note(f"{path}: line {i + 1} unreadable, skipped")  # e.g. a row cut by the stop
    return rows


def is_finite(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def strict(x):
    """``x`` with non-finite numbers as None (study.json is strict JSON)."""
    if isinstance(x, dict):
        return {k: strict(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [strict(v) for v in x]
    return None if isinstance(x, float) and not math.isfinite(x) else x


def fnum(x) -> str:
    return "-" if x is None else f"{x:.4g}" if isinstance(x, float) else str(x)


def load_run(folder: Path) -> dict | None:
    args = read_json(folder / "args.json")
    if args is None:
        return None
    summary = read_json(folder / "summary.json") if (folder / "summary.json").exists() else None
    rows = [r for r in read_rows(folder / "metrics.jsonl") if isinstance(r.get("update"), int)]
    objective = args.get("objective", "fpo")
    backend = args.get("backend", "auto")
    if backend == "auto" and folder.name.startswith("envpool_"):
        backend = "envpool"
    if backend == "playground" and args.get("physics") == "warp":
        backend = "playground-warp"  # MuJoCo Warp physics: its own group, beside MJX's
    early, late = args.get("alpha_early"), args.get("alpha_late")
    alpha = (
        f"{early}->{late}"
        if early is not None
        else float(args.get("alpha_eps" if objective == "fpo" else "alpha", 1.0))
    )
    if args.get("restart_every"):  # runs that restart their environments are their own group
        alpha = f"{alpha}, restarts every {args['restart_every']}"
    bs = args.get("block_size") or BLOCK
    batch = args.get("num_envs", 1) * args.get("num_steps", 1)
    asked = args.get("num_updates") or max(1, args.get("total_timesteps", 0) // batch)
    evals = [
        (r["update"], r.get("global_step", r["update"] * batch) / bs, float(r["eval_return"]))
        for r in rows
        if is_finite(r.get("eval_return"))
    ]
    events = [
        f"nonfinite at block {fnum(r.get('global_step', 0) / bs)} (update {r['update']})"
        for r in rows
        if r.get("nonfinite")
    ]
    events += [
        f"non-finite evaluation at block {fnum(r.get('global_step', 0) / bs)} (update {r['update']})"
        for r in rows
        if "eval_return" in r and not is_finite(r["eval_return"])
    ]
    done = max([r["update"] for r in rows if not r.get("nonfinite")], default=0)
    status = "no summary"
    if summary is not None:
        status, done = summary.get("status", "?"), summary.get("updates_done", done)
        if status == "nonfinite" and not events:
            events.append(f"nonfinite at block {fnum(summary.get('global_step', 0) / bs)} (summary)")
    peak = max(evals, key=lambda e: e[2]) if evals else None
    train = [(r["update"], float(r["episodic_return"])) for r in rows if is_finite(r.get("episodic_return"))]
    rollouts = [  # the training rollouts' ended episodes: count, mean length and return (None: none ended)
        {"update": r["update"], **{k: float(r[k]) if is_finite(r.get(k)) else None for k in ROLLOUT_KEYS}}
        for r in rows
        if is_finite(r.get("episodes"))
    ]
    track = [  # legged tasks: evaluations with command-tracking errors (fpo_utils/legged.py); None: not logged
        {k: r[k] if is_finite(r.get(k)) else None for _, k, _ in TRACK_COLUMNS} | {"update": r["update"]}
        for r in rows
        if is_finite(r.get("eval_track_lin")) and is_finite(r.get("eval_track_yaw"))
    ]
    return {
        "run": folder.name,
        "task": args.get("env_id", "?"),
        "objective": objective,
        "backend": backend,
        "alpha": alpha,
        "seed": args.get("seed"),
        "updates_done": done,
        "updates_asked": asked,
        "status": status,
        "blocks_asked": asked * batch / bs,
        "evals": [{"update": u, "block": b, "return": v} for u, b, v in evals],
        "peak": peak[2] if peak else None,
        "peak_block": peak[1] if peak else None,
        "peak_update": peak[0] if peak else None,
        "final_eval": evals[-1][2] if evals else None,
        "events": events,
        "track": track,  # one dict a tracked evaluation: "update" and TRACK_COLUMNS' keys
        "train": train,  # (update, mean return of the episodes that ended in that update's rollout)
        "rollouts": rollouts,  # one dict an update that logged its episodes: "update" and ROLLOUT_KEYS
    }


def load_official(d: Path) -> list[dict]:
    """Official runs: DIR/peer/fpo_peer_TASK_sSEED.json, else the evaluations printed in
    DIR/logs/official_TASK_sSEED.log (a run that has not finished)."""
    out, seen = [], set()
    for p in sorted((d / "peer").glob("fpo_peer_*_s*.json")):
        j = read_json(p)
        if j is None:
            continue
        task, seed = p.stem[len("fpo_peer_") :].rsplit("_s", 1)
        try:
            blocks = len(j.get("iters", []))
            pts = ([(0, j["eval0"])] if "eval0" in j else []) + [(e["block"], e["reward"]) for e in j.get("evals", [])]
            pts = sorted(pts + ([(blocks, j["eval_end"])] if "eval_end" in j else []), key=lambda p: p[0])
            totals = [it["total_s"] for it in j.get("iters", [])[1:]]
            out.append(
                {
                    "task": task,
                    "seed": int(seed),
                    "run": p.name,
                    "status": "finished",
                    "blocks": blocks,
                    "points": pts,
                    "s_per_block": float(np.median(totals)) if totals else None,
                }
            )
        except (KeyError, TypeError, ValueError, AttributeError) as err:
            note(f"skipped {p}: {type(err).__name__} {err}")
            continue
        seen.add((task, int(seed)))
    for p in sorted((d / "logs").glob("official_*_s*.log")):
        task, seed = p.stem[len("official_") :].rsplit("_s", 1)
        if not seed.isdigit() or (task, int(seed)) in seen:
            continue
        pts = []
        for line in p.read_text(errors="replace").splitlines():
            if line.startswith("eval {"):
                try:
                    e = ast.literal_eval(re.sub(r"-?\b(nan|inf)\b", "None", line[5:]))
                    pts.append((e["block"], e["reward"]))
                except (ValueError, SyntaxError, KeyError):
                    note(f"{p}: unreadable line {line[:60]!r}")
        note(f"official {task} seed {seed}: no JSON, {len(pts)} evaluations from its log (unfinished)")
        out.append(
            {
                "task": task,
                "seed": int(seed),
                "run": p.name,
                "status": "unfinished (log)",
                "blocks": max([b for b, _ in pts], default=0),
                "points": pts,
                "s_per_block": None,
            }
        )
    for o in out:
        bad = [b for b, v in o["points"] if not is_finite(v)]
        o["points"] = [(b, float(v)) for b, v in o["points"] if is_finite(v)]
        best = max(o["points"], key=lambda p: p[1]) if o["points"] else None
        o.update(
            peak=best[1] if best else None,
            peak_block=best[0] if best else None,
            final_eval=o["points"][-1][1] if o["points"] else None,
            events=[f"non-finite evaluation at block {b}" for b in bad],
        )
    return out


def mean_curve(runs: list[dict], key: str) -> tuple[list, list]:
    """Mean over runs at the evaluation points every run has."""
    common = set.intersection(*[{e[key] for e in r["evals"]} for r in runs]) if runs else set()
    xs = sorted(common)
    return xs, [float(np.mean([next(e["return"] for e in r["evals"] if e[key] == x) for r in runs])) for x in xs]


def by_alpha(runs: list[dict], task: str, objective: str) -> list[dict]:
    groups = defaultdict(list)
    for r in runs:
        groups[r["alpha"]].append(r)
    out = []
    for a in sorted(groups, key=lambda a: (isinstance(a, str), 0.0 if isinstance(a, str) else a, str(a))):
        peaks = [r["peak"] for r in groups[a] if r["peak"] is not None]
        paper = PAPER.get(task, {}).get(a) if objective == "fpo" else None
        out.append(
            {
                "alpha": a,
                "n": len(peaks),
                "updates_done": [min(r["updates_done"] for r in groups[a]), max(r["updates_done"] for r in groups[a])],
                "peak_mean": float(np.mean(peaks)) if peaks else None,
                "peak_std": float(np.std(peaks)) if peaks else None,
                "paper": paper,
                "runs": groups[a],
            }
        )
    return out


def save(fig, path: Path) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print("wrote", path)


def plot(path: Path, title: str, xlabel: str, lines: list[tuple], ylabel: str = "evaluation return") -> None:
    """lines: (xs, ys, style dict)."""
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for xs, ys, kw in lines:
        ax.plot(xs, ys, **kw)
    ax.set(xlabel=xlabel, ylabel=ylabel, title=title)
    if any("label" in kw for *_, kw in lines):
        ax.legend(fontsize=7)
    save(fig, path)


def plot_track(path: Path, title: str, tracked: list[tuple]) -> None:
    """The evaluation's mean |command - velocity|, linear and yaw, per run (tracked: (plot keywords, run))."""
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    for kw, r in tracked:
        us = [t["update"] for t in r["track"]]
        for ax, key in zip(axes, ("eval_track_lin", "eval_track_yaw")):
            ax.plot(us, [t[key] for t in r["track"]], marker="o", ms=3, **kw)
    axes[0].set(xlabel="update", ylabel="mean |command_xy - v_xy| (m/s)", title=f"{title}: linear")
    axes[1].set(xlabel="update", ylabel="mean |command_yaw - w_z| (rad/s)", title="yaw")
    axes[0].legend(fontsize=7)
    save(fig, path)


def train_curve(run: dict, width: int = 10) -> tuple[list, list]:
    """The training return as a running mean over `width` updates (rows that had finished episodes)."""
    us, vs = zip(*run["train"])
    width = min(width, len(vs))
    return list(us[width - 1 :]), list(np.convolve(vs, np.ones(width) / width, mode="valid"))


def track_table(runs: list[dict], every: int) -> list[str]:
    """study.md lines: each run's tracked evaluations at updates divisible by `every`, and its last one."""
    md = ["| run | update | " + " | ".join(t for t, _, _ in TRACK_COLUMNS) + " |"]
    md.append("|" + "---|" * (2 + len(TRACK_COLUMNS)))
    for r in runs:
        last = r["track"][-1]["update"]
        for row in (t for t in r["track"] if t["update"] % every == 0 or t["update"] == last):
            cells = ["-" if row[k] is None else format(row[k], f) for _, k, f in TRACK_COLUMNS]
            md.append(f"| {r['run']} | {row['update']} | " + " | ".join(cells) + " |")
    return md + [""]


def rollout_table(runs: list[dict], every: int, width: int = 10) -> list[str]:
    """study.md lines: each run's training rollouts at updates divisible by `every`, and its last: the episodes
    ended per update, their mean length and their mean return, each averaged over the `width` updates ending there
    (length and return over those updates in which an episode ended)."""
    md = [f"Training rollouts, means over the {width} updates ending at the row's update:", ""]
    md += ["| run | update | episodes ended per update | episode length | training return |", "|---|---|---|---|---|"]
    for r in (r for r in runs if r["rollouts"]):
        last = r["rollouts"][-1]["update"]
        for u in (t["update"] for t in r["rollouts"] if t["update"] % every == 0 or t["update"] == last):
            window = [t for t in r["rollouts"] if u - width < t["update"] <= u]
            cells = []
            for key, f in zip(ROLLOUT_KEYS, (",.0f", ".1f", ".3f")):
                vals = [t[key] for t in window if t[key] is not None]
                cells.append(format(np.mean(vals), f) if vals else "-")
            md.append(f"| {r['run']} | {u} | " + " | ".join(cells) + " |")
    return md + [""]


def xy(run: dict, key: str) -> tuple[list, list]:
    return [e[key] for e in run["evals"]], [e["return"] for e in run["evals"]]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("dir", type=Path)
    p.add_argument("--out", type=Path, default=Path(__file__).parent / "robot_results" / "study")
    p.add_argument("--table-every", type=int, default=250, help="legged runs' table: every N updates, and the last")
    p.add_argument("--title", help="study.md's first heading (default: 'Robot study: DIR')")
    a = p.parse_args()
    if a.table_every < 1:
        raise SystemExit(f"error: --table-every {a.table_every} must be a positive number of updates")
    if not (a.dir / "runs").is_dir() and not (a.dir / "peer").is_dir():
        raise SystemExit(f"error: {a.dir} holds neither runs/ nor peer/ (give the study's DIR)")
    a.out.mkdir(parents=True, exist_ok=True)
    runs = []
    for f in sorted((a.dir / "runs").glob("*")):
        try:
            r = load_run(f) if f.is_dir() else None
        except (KeyError, TypeError, ValueError, AttributeError, ZeroDivisionError) as err:
            note(f"skipped {f}: {type(err).__name__} {err}")
            r = None
        runs += [r] if r is not None else []
    official = load_official(a.dir)
    groups = defaultdict(list)
    for r in runs:
        groups[(r["task"], r["objective"], r["backend"])].append(r)
    for o in official:
        groups.setdefault((o["task"], "fpo", "playground"), [])
    out = {"dir": str(a.dir), "groups": [], "notes": NOTES}
    md = [f"# {a.title or f'Robot study: {a.dir}'}", ""]
    for (task, obj, backend), rs in sorted(groups.items()):
        offs = [o for o in official if o["task"] == task] if (obj, backend) == ("fpo", "playground") else []
        budget = max([r["blocks_asked"] for r in rs] + [o["blocks"] for o in offs], default=0)
        alphas = by_alpha(rs, task, obj)
        g = {
            "task": task,
            "objective": obj,
            "backend": backend,
            "block_budget": budget,
            "runs": [{k: v for k, v in r.items() if k not in ("evals", "train", "track", "rollouts")} for r in rs],
            "by_alpha": [{k: v for k, v in s.items() if k != "runs"} for s in alphas],
            "official": [{k: v for k, v in o.items() if k != "points"} for o in offs],
        }
        if any(s["paper"] is not None for s in alphas):
            g["paper_note"] = f"paper: {PAPER_BLOCKS}-block cohort; here: {fnum(budget)} blocks"
        out["groups"].append(g)
        md += [
            f"## {task}, {obj}, {backend}",
            "",
            "| run | alpha | seed | updates done / asked | status | peak | peak block | final eval | events |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        md += [
            f"| {r['run']} | {r['alpha']} | {r['seed']} | {r['updates_done']} / {r['updates_asked']} | {r['status']} "
            f"| {fnum(r['peak'])} | {fnum(r['peak_block'])} (update {r['peak_update']}) | {fnum(r['final_eval'])} "
            f"| {'; '.join(r['events']) or '-'} |"
            for r in rs
        ]

        def notes(o: dict) -> str:
            return (
                "; ".join(o["events"] + ([f"median {o['s_per_block']:.3g} s/block"] if o["s_per_block"] else [])) or "-"
            )

        md += [
            f"| official {o['run']} | 1.0 | {o['seed']} | {'' if o['s_per_block'] else '>= '}{o['blocks']} blocks "
            f"| {o['status']} | {fnum(o['peak'])} | {fnum(o['peak_block'])} | {fnum(o['final_eval'])} "
            f"| {notes(o)} |"
            for o in offs
        ]
        head = "| alpha | n | updates done | peak mean +- std | paper (244 blocks) |"  # peaks of unequal budgets show
        md += ["", head, "|---|---|---|---|---|"] if alphas else []
        md += [
            f"| {s['alpha']} | {s['n']} | {'-'.join(map(str, sorted(set(s['updates_done']))))} "
            f"| {fnum(s['peak_mean'])} +- {fnum(s['peak_std'])} | {fnum(s['paper'])} |"
            for s in alphas
        ]
        if obj == "fpopp" and all(r["train"] for r in rs):  # compared where every run of the group got to
            upto = min(r["train"][-1][0] for r in rs)
            md += ["", f"| alpha | n | training return, updates {max(1, upto - 9)}-{upto}: mean +- std over seeds |"]
            md += ["|---|---|---|"]
            for s in alphas:
                last = [np.mean([v for u, v in r["train"] if upto - 10 < u <= upto]) for r in s["runs"]]
                md.append(f"| {s['alpha']} | {len(last)} | {fnum(np.mean(last))} +- {fnum(np.std(last))} |")
        if "paper_note" in g:
            md += ["", g["paper_note"]]
        md.append("")

        if obj == "fpopp":

            def style(i, j, r, **kw):  # colour by alpha, line style by seed within the alpha
                label = f"alpha {alphas[i]['alpha']}, seed {r['seed']}"
                return {"color": f"C{i}", "ls": SEED_LS[j % len(SEED_LS)], "label": label, **kw}

            lines = [
                (*xy(r, "update"), style(i, j, r, marker="o", ms=4))
                for i, s in enumerate(alphas)
                for j, r in enumerate(s["runs"])
            ]
            plot(a.out / f"fpopp_{task}.png", f"{task}, FPO++ ({backend})", "update", lines)
            lines = [  # the training return, a running mean over 10 updates
                (*train_curve(r), style(i, j, r, lw=1))
                for i, s in enumerate(alphas)
                for j, r in enumerate(s["runs"])
                if r["train"]
            ]
            ylabel = "training return (finished episodes, mean of 10 updates)"
            plot(a.out / f"fpopp_{task}_train.png", f"{task}, FPO++ ({backend})", "update", lines, ylabel)
            tracked = [(style(i, j, r), r) for i, s in enumerate(alphas) for j, r in enumerate(s["runs"]) if r["track"]]
            if tracked:
                plot_track(a.out / f"fpopp_{task}_track.png", f"{task}, FPO++ ({backend})", tracked)
                md += track_table([r for _, r in tracked], a.table_every)
            if any(r["rollouts"] for r in rs):
                md += rollout_table(rs, a.table_every)
        elif backend != "playground":
            lines = [
                (
                    *xy(r, "block"),
                    {"marker": "o", "color": f"C{i}", "label": f"alpha_eps {s['alpha']}, seed {r['seed']}"},
                )
                for i, s in enumerate(alphas)
                for r in s["runs"]
            ]
            plot(a.out / f"{backend}_{task}.png", f"{task}, FPO ({backend})", "block (983,040 steps)", lines)
        else:
            lines = []
            for i, s in enumerate(alphas):
                c = f"C{i}"
                lines += [(*xy(r, "block"), {"color": c, "lw": 0.8, "alpha": 0.4}) for r in s["runs"]]
                paper = f"; paper {s['paper']}" if s["paper"] is not None else ""
                peak = f"peak {fnum(s['peak_mean'])} +- {fnum(s['peak_std'])} (n={s['n']}){paper}"
                lines.append(
                    (
                        *mean_curve(s["runs"], "block"),
                        {
                            "color": c,
                            "lw": 2.5,
                            "marker": "o",
                            "ms": 3,
                            "label": f"alpha_eps {s['alpha']}: {peak}",
                        },
                    )
                )
            if rs:
                plot(
                    a.out / f"alpha_study_{task}.png",
                    f"{task} alpha_eps study, {fnum(budget)} blocks asked (paper: {PAPER_BLOCKS})",
                    "block (983,040 steps)",
                    lines,
                )
            if offs:
                lines = []
                for o in offs:
                    lines.append(
                        (
                            [b for b, _ in o["points"]],
                            [v for _, v in o["points"]],
                            {
                                "marker": "s",
                                "ls": "--",
                                "color": f"C{o['seed'] % 10}",
                                "lw": 2,
                                "label": f"official, seed {o['seed']} ({o['status']})",
                            },
                        )
                    )
                seeds = {o["seed"] for o in offs}
                for r in (r for s in alphas if s["alpha"] == 1.0 for r in s["runs"]):
                    hi = r["seed"] in seeds
                    lines.append(
                        (
                            *xy(r, "block"),
                            {
                                "marker": "o",
                                "ms": 3,
                                "lw": 2.2 if hi else 0.8,
                                "alpha": 1 if hi else 0.5,
                                "color": f"C{r['seed'] % 10}" if isinstance(r["seed"], int) else None,
                                "label": f"robot_fpo.py, seed {r['seed']} ({r['status']})",
                            },
                        )
                    )
                plot(
                    a.out / f"vs_official_{task}.png",
                    f"{task}, native FPO (alpha_eps 1) beside the official code",
                    "block (983,040 steps)",
                    lines,
                )
    if NOTES:
        md += ["## Notes", ""] + [f"- {n}" for n in NOTES]
    (a.out / "study.json").write_text(json.dumps(strict(out), indent=1, default=str, allow_nan=False) + "\n")
    (a.out / "study.md").write_text("\n".join(md) + "\n")
    print("wrote", a.out / "study.json", a.out / "study.md")


if __name__ == "__main__":
    main()
