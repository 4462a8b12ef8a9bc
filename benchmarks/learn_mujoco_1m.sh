#!/usr/bin/env bash
# FPO at 1M environment steps on HalfCheetah-v5 and Walker2d-v5 with alpha_eps = 1 (native)
# and 0.5: four concurrent runs, each pinned to CORES cores starting at core CORE0 (defaults:
# 4 cores each from core 0, i.e. a 16-core machine). The networks go to the GPU when one is
# present (add --no-cuda to keep them on the CPU); extra arguments go to every run. Prints each
# run's peak evaluation return (eq:peak), its step, the last evaluation and the status.
# Reference at 1M steps (CleanRL PPO, v4 tasks): HalfCheetah 1442 +- 46, Walker2d 2288 +- 572.
# TIMEOUT=<seconds> stops every run after that wall time (runs then report where they stopped;
# continue them with the same command plus --resume). TAG is appended to the run names.
set -uo pipefail
cd "$(dirname "$0")/.."
RUN_DIR=${RUN_DIR:-runs}
SEED=${SEED:-1}
TIMEOUT=${TIMEOUT:-0}
CORE0=${CORE0:-0}
CORES=${CORES:-4}
TAG=${TAG:-}
mkdir -p "$RUN_DIR"
i=0
for env in HalfCheetah-v5 Walker2d-v5; do
  for a in 1.0 0.5; do
    name="${env}_ae${a}_s${SEED}${TAG}"
    first=$((CORE0 + CORES * i))
    timeout "$TIMEOUT" taskset -c "$first-$((first + CORES - 1))" python3 robot_fpo.py --env-id "$env" --objective fpo \
      --alpha-eps "$a" --total-timesteps 1000000 --eval-every 20 --checkpoint-every 40 --seed "$SEED" \
      --run-dir "$RUN_DIR" --run-name "$name" "$@" > "$RUN_DIR/$name.log" 2>&1 &
    i=$((i + 1))
  done
done
wait
python3 - "$RUN_DIR" "$SEED" "$TAG" <<'PY'
import json, sys
run_dir, seed, tag = sys.argv[1], sys.argv[2], sys.argv[3]
for env in ("HalfCheetah-v5", "Walker2d-v5"):
    for a in ("1.0", "0.5"):
        name = f"{env}_ae{a}_s{seed}{tag}"
        try:
            rows = [json.loads(x) for x in open(f"{run_dir}/{name}/metrics.jsonl")]
        except FileNotFoundError:
            print(f"{name}: no metrics")
            continue
        evals = [(r["global_step"], r["eval_return"]) for r in rows if "eval_return" in r]
        last = rows[-1]
        status = json.load(open(f"{run_dir}/{name}/summary.json"))["status"]
        status = status if status in ("completed", "nonfinite") else "stopped early"
        step, peak = max(evals, key=lambda e: e[1])
        print(f"{name}: last eval {evals[-1][1]:.0f} at step {evals[-1][0]}, peak {peak:.0f} at step {step}, "
              f"{last['global_step']} steps, {status}")
PY
