#!/usr/bin/env bash
# One call on a 16-core machine: the 16-core SPS benchmark (CPU networks at several thread
# counts, then GPU networks, plus BENCH_ARGS="..."; skipped with BENCH=0), then the four 1M-step FPO runs of
# learn_mujoco_1m.sh (at the defaults, plus RUN_ARGS="..." if given), stopped after RUN_TIMEOUT
# seconds. With ALT_ARGS="..."
# a second set of four runs with those extra arguments (run names ending in _alt) runs
# alongside, and every run gets 2 cores instead of 4. Results go to $OUT/robot_results.tgz
# (metrics, summaries, logs, benchmark JSON; no checkpoints).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out}
RUN_TIMEOUT=${RUN_TIMEOUT:-330}
BENCH=${BENCH:-1}
ALT_ARGS=${ALT_ARGS:-}
RUN_ARGS=${RUN_ARGS:-}
BENCH_ARGS=${BENCH_ARGS:-}
R=/tmp/robot_results
mkdir -p "$R" "$OUT"
export PYTHONUNBUFFERED=1 MUJOCO_GL=disable
{ nproc; lscpu | grep -i 'model name'; python3 -c 'import torch; print(torch.__version__, torch.cuda.is_available())'; } > "$R/machine.txt" 2>&1
if [ "$BENCH" = 1 ]; then
  : > "$R/bench.log"
  # shellcheck disable=SC2086
  for th in 16 8 4; do
    taskset -c 0-15 timeout 60 python3 benchmarks/bench_robot_sps.py --torch-threads "$th" --num-updates 8 --no-cuda $BENCH_ARGS \
      --json-out "$R/sps_16cores_cpu_th${th}.json" >> "$R/bench.log" 2>&1
  done
  # shellcheck disable=SC2086
  taskset -c 0-15 timeout 60 python3 benchmarks/bench_robot_sps.py --torch-threads 4 --num-updates 8 --cuda $BENCH_ARGS \
    --json-out "$R/sps_16cores_cuda.json" >> "$R/bench.log" 2>&1
  grep -v -i warning "$R/bench.log" | grep -v '^$'
fi
if [ -z "$ALT_ARGS" ]; then
  # shellcheck disable=SC2086
  RUN_DIR=$R TIMEOUT=$RUN_TIMEOUT bash benchmarks/learn_mujoco_1m.sh $RUN_ARGS > "$R/learn_summary.txt" 2>&1
else
  # shellcheck disable=SC2086
  RUN_DIR=$R TIMEOUT=$RUN_TIMEOUT CORE0=0 CORES=2 bash benchmarks/learn_mujoco_1m.sh $RUN_ARGS > "$R/learn_summary.txt" 2>&1 &
  # shellcheck disable=SC2086
  RUN_DIR=$R TIMEOUT=$RUN_TIMEOUT CORE0=8 CORES=2 TAG=_alt bash benchmarks/learn_mujoco_1m.sh $ALT_ARGS > "$R/learn_summary_alt.txt" 2>&1 &
  wait
  echo "alt runs: $ALT_ARGS" >> "$R/learn_summary_alt.txt"
fi
cat "$R"/learn_summary*.txt
find "$R" -name '*.pt' -delete
tar czf "$OUT/robot_results.tgz" -C /tmp robot_results
