#!/usr/bin/env bash
# FPO at 1M environment steps on HalfCheetah-v5 and Walker2d-v5 with alpha_eps = 1 (native)
# and 0.5, four concurrent runs of ~4 cores each (a 16-core machine; add --cuda to put the
# networks on a GPU). Prints each run's peak evaluation return (eq:peak), its step and status.
# Reference at 1M steps (CleanRL PPO, v4 tasks): HalfCheetah 1442 +- 46, Walker2d 2288 +- 572.
set -uo pipefail
cd "$(dirname "$0")/.."
RUN_DIR=${RUN_DIR:-runs}
SEED=${SEED:-1}
i=0
for env in HalfCheetah-v5 Walker2d-v5; do
  for a in 1.0 0.5; do
    taskset -c $((4 * i))-$((4 * i + 3)) python3 robot_fpo.py --env-id "$env" --objective fpo --alpha-eps "$a" \
      --total-timesteps 1000000 --eval-every 40 --seed "$SEED" --run-dir "$RUN_DIR" \
      --run-name "${env}_ae${a}_s${SEED}" "$@" > "/tmp/${env}_ae${a}_s${SEED}.log" 2>&1 &
    i=$((i + 1))
  done
done
wait
python3 - "$RUN_DIR" "$SEED" <<'PY'
import json, sys
run_dir, seed = sys.argv[1], sys.argv[2]
for env in ("HalfCheetah-v5", "Walker2d-v5"):
    for a in ("1.0", "0.5"):
        s = json.load(open(f"{run_dir}/{env}_ae{a}_s{seed}/summary.json"))
        print(f"{env} alpha_eps={a}: peak {s['peak_eval_return']:.0f} at step {s['peak_step']}, "
              f"{s['global_step']} steps, status {s['status']}")
PY
