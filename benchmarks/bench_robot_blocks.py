"""Seconds per training block at the FPO preset: robot_fpo_fast.py on the Playground backend beside the
official FPO code, on the same GPU, one after the other in one run of this script.

A block is 983,040 environment steps plus one update (16 epochs x 32 minibatches), as in the
official FpoConfig. For each task, each side runs `--blocks` blocks from scratch (seed 0):

- ours:     python robot_fpo_fast.py --preset fpo --backend playground --env-id TASK --num-updates B
            (evaluations only at the start and the end); block time = rollout_s + update_s of
            metrics.jsonl;
- official: python run_official_fpo.py TASK B 0 (its runner in ../shared/peers); block time = its
            per-iteration total_s (rollout + training step).

Reported: the median block time after the first (compilation and CUDA-graph capture land in the
first block and the start-up), the first block, and the start-up (wall time before the first
block, with environment compilation and the first evaluation). Writes blocks.json and blocks.md
to --out.

    python benchmarks/bench_robot_blocks.py --tasks AcrobotSwingup WalkerRun --blocks 6 4 \\
        --ours-pythonpath /tmp/so --peer-pythonpath /tmp/sp:PEERS/fpo_playground/src:PEERS/wandb_stub \\
        --peer-script PEERS/run_official_fpo.py --out $OUT
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run(cmd: list[str], pythonpath: str, log: Path, timeout: float, **extra: str) -> tuple[int, float]:
    env = dict(os.environ, PYTHONUNBUFFERED="1", MUJOCO_GL="disable", **extra)
    env["PYTHONPATH"] = ":".join(p for p in (pythonpath, env.get("PYTHONPATH", "")) if p)
    t0 = time.perf_counter()
    with open(log, "w") as f:
        try:
            rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, timeout=timeout, cwd=ROOT).returncode
        except subprocess.TimeoutExpired:
            rc = 124
    return rc, time.perf_counter() - t0


def ours(task: str, blocks: int, args) -> dict:
    name = f"blocks_{task}"
    cmd = [
        sys.executable,
        "robot_fpo_fast.py",
        "--preset",
        "fpo",
        "--backend",
        "playground",
        "--env-id",
        task,
        "--seed",
        "0",
        "--num-updates",
        str(blocks),
        "--eval-every",
        "100000",
        "--runs-dir",
        str(args.out / "runs"),
        "--run-name",
        name,
        *args.ours_flags.split(),
    ]
    rc, wall = run(cmd, args.ours_pythonpath, args.out / f"ours_{task}.log", args.timeout)
    path = args.out / "runs" / name / "metrics.jsonl"
    rows = [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []
    it = [r for r in rows if r.get("update", 0) >= 1 and "rollout_s" in r]
    return summarise("ours", task, rc, wall, [r["rollout_s"] + r["update_s"] for r in it], [r["rollout_s"] for r in it])


def official(task: str, blocks: int, args) -> dict:
    cmd = [sys.executable, args.peer_script, task, str(blocks), "0"]
    rc, wall = run(cmd, args.peer_pythonpath, args.out / f"official_{task}.log", args.timeout, OUT=str(args.out))
    path = args.out / f"fpo_peer_{task}_s0.json"
    data = json.loads(path.read_text()) if path.exists() else {"iters": []}
    row = summarise(
        "official", task, rc, wall, [i["total_s"] for i in data["iters"]], [i["rollout_s"] for i in data["iters"]]
    )
    row["init_s"] = data.get("init_s")
    return row


def summarise(side: str, task: str, rc: int, wall: float, block_s: list[float], rollout_s: list[float]) -> dict:
    after = block_s[1:]
    return {
        "side": side,
        "task": task,
        "rc": rc,
        "wall_s": round(wall, 1),
        "blocks_done": len(block_s),
        "first_block_s": round(block_s[0], 3) if block_s else None,
        "block_s_median": round(statistics.median(after), 3) if after else None,
        "rollout_s_median": round(statistics.median(rollout_s[1:]), 3) if len(rollout_s) > 1 else None,
        "startup_s": round(wall - sum(block_s), 1) if block_s else None,
        "block_s": [round(x, 3) for x in block_s],
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tasks", nargs="+", default=["AcrobotSwingup", "WalkerRun"])
    p.add_argument("--blocks", nargs="+", type=int, default=[6, 4], help="blocks per task (one value or one per task)")
    p.add_argument("--ours-pythonpath", default="")
    p.add_argument("--peer-pythonpath", default="")
    p.add_argument("--peer-script", default=str(ROOT.parent / "shared" / "peers" / "run_official_fpo.py"))
    p.add_argument(
        "--runs", nargs="*", default=[], help="only these side:task pairs (e.g. ours:WalkerRun); default all"
    )
    p.add_argument("--ours-flags", default="", help="extra robot_fpo_fast.py flags (e.g. a CPU smoke test)")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds per run before it is stopped")
    p.add_argument("--out", type=Path, default=Path("bench_blocks"))
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    blocks = args.blocks * len(args.tasks) if len(args.blocks) == 1 else args.blocks
    try:
        card = subprocess.run(
            ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True
        ).stdout.strip()
    except FileNotFoundError:
        card = "cpu"
    rows = []
    for task, b in zip(args.tasks, blocks):
        for fn in (ours, official):
            if args.runs and f"{fn.__name__}:{task}" not in args.runs:
                continue
            rows.append(fn(task, b, args))
            print(json.dumps(rows[-1]), flush=True)
    (args.out / "blocks.json").write_text(json.dumps({"card": card, "rows": rows}, indent=1))
    lines = [
        f"card: {card}",
        "",
        "| task | side | blocks | start-up s | first block s | s per block after | rollout s | rc |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['task']} | {r['side']} | {r['blocks_done']} | {r['startup_s']} | {r['first_block_s']} | "
            f"{r['block_s_median']} | {r['rollout_s_median']} | {r['rc']} |"
        )
    (args.out / "blocks.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
