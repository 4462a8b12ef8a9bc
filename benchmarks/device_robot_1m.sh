#!/usr/bin/env bash
# One call on a 16-core machine: the 16-core SPS benchmark (CPU networks, then GPU networks),
# then the four 1M-step FPO runs of learn_mujoco_1m.sh, stopped after RUN_TIMEOUT seconds.
# Results go to $OUT/robot_results.tgz (metrics, summaries, logs, benchmark JSON).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out}
RUN_TIMEOUT=${RUN_TIMEOUT:-420}
R=/tmp/robot_results
mkdir -p "$R" "$OUT"
export PYTHONUNBUFFERED=1 MUJOCO_GL=disable
{ nproc; lscpu | grep -i 'model name'; python3 -c 'import torch; print(torch.__version__, torch.cuda.is_available())'; } > "$R/machine.txt" 2>&1
taskset -c 0-15 timeout 80 python3 benchmarks/bench_robot_sps.py --torch-threads 16 --num-updates 8 \
  --json-out "$R/sps_16cores_cpu.json" > "$R/bench.log" 2>&1
taskset -c 0-15 timeout 80 python3 benchmarks/bench_robot_sps.py --torch-threads 16 --num-updates 8 --cuda \
  --json-out "$R/sps_16cores_cuda.json" >> "$R/bench.log" 2>&1
cat "$R/bench.log"
RUN_DIR=$R TIMEOUT=$RUN_TIMEOUT bash benchmarks/learn_mujoco_1m.sh > "$R/learn_summary.txt" 2>&1
cat "$R/learn_summary.txt"
find "$R" -name '*.pt' -delete
tar czf "$OUT/robot_results.tgz" -C /tmp robot_results
