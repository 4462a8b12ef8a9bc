#!/usr/bin/env bash
# FPO at 1M environment steps on HalfCheetah-v5 and Walker2d-v5 with alpha_eps = 1 (native)
# and 0.5, for every seed in SEEDS: 4 x (number of seeds) concurrent runs, each pinned to CORES
# cores starting at core CORE0 (defaults: seed 1, 4 cores each from core 0, i.e. a 16-core
# machine; SEEDS="1 2 3" CORES=1 runs twelve one-core runs). The networks go to the GPU when one
# is present (with the CUDA-graph update; add --no-cuda to keep them on the CPU); extra arguments
# go to every run. Prints each run's peak evaluation return (eq:peak), its step, the last
# evaluation and the status, then per task and alpha_eps the mean +- SD over seeds of the return
# at the last evaluation and of the peak.
# Reference at 1M steps (CleanRL PPO, v4 tasks): HalfCheetah 1442 +- 46, Walker2d 2288 +- 572.
# TIMEOUT=<seconds> stops every run after that wall time (runs then report where they stopped;
# continue them with the same command plus --resume). TAG is appended to the run names.
set -uo pipefail
cd "$(dirname "$0")/.."
RUN_DIR=${RUN_DIR:-runs}
SEEDS=${SEEDS:-${SEED:-1}}
TIMEOUT=${TIMEOUT:-0}
CORE0=${CORE0:-0}
CORES=${CORES:-4}
TAG=${TAG:-}
mkdir -p "$RUN_DIR"
i=0
for seed in $SEEDS; do
  for env in HalfCheetah-v5 Walker2d-v5; do
    for a in 1.0 0.5; do
      name="${env}_ae${a}_s${seed}${TAG}"
      first=$((CORE0 + CORES * i))
      timeout "$TIMEOUT" taskset -c "$first-$((first + CORES - 1))" python3 robot_fpo.py --env-id "$env" --objective fpo \
        --alpha-eps "$a" --total-timesteps 1000000 --eval-every 20 --checkpoint-every 40 --seed "$seed" \
        --runs-dir "$RUN_DIR" --run-name "$name" "$@" > "$RUN_DIR/$name.log" 2>&1 &
      i=$((i + 1))
    done
  done
done
wait
python3 - "$RUN_DIR" "$SEEDS" "$TAG" <<'PY'
import json, statistics, sys
run_dir, seeds, tag = sys.argv[1], sys.argv[2].split(), sys.argv[3]
for env in ("HalfCheetah-v5", "Walker2d-v5"):
    for a in ("1.0", "0.5"):
        last_evals, peaks = [], []
        for seed in seeds:
            name = f"{env}_ae{a}_s{seed}{tag}"
            try:
                rows = [json.loads(x) for x in open(f"{run_dir}/{name}/metrics.jsonl")]
                status = json.load(open(f"{run_dir}/{name}/summary.json"))["status"]
            except FileNotFoundError:
                print(f"{name}: no metrics")
                continue
            evals = [(r["global_step"], r["eval_return"]) for r in rows if "eval_return" in r]
            last = rows[-1]
            status = status if status in ("finished", "nonfinite") else "stopped early"
            step, peak = max(evals, key=lambda e: e[1])
            print(f"{name}: last eval {evals[-1][1]:.0f} at step {evals[-1][0]}, peak {peak:.0f} at step {step}, "
                  f"{last['global_step']} steps, {status}")
            last_evals.append(evals[-1][1])
            peaks.append(peak)
        if len(last_evals) > 1:
            sd = lambda v: statistics.stdev(v)
            print(f"{env} alpha_eps={a} over {len(last_evals)} seeds: last eval {statistics.mean(last_evals):.0f} +- "
                  f"{sd(last_evals):.0f}, peak {statistics.mean(peaks):.0f} +- {sd(peaks):.0f}")
PY
