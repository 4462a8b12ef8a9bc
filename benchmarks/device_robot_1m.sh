#!/usr/bin/env bash
# One call on a 16-core machine with a GPU: the GPU tests of tests/test_robot_fpo.py, the 16-core
# SPS benchmark at the defaults (CPU networks at 16 / 8 / 4 torch threads; GPU networks without
# the CUDA-graph update at 4 threads and with it at 1 and 4 threads; each REPEATS alternating
# environment-only / end-to-end pairs of BENCH_UPDATES iterations; plus BENCH_ARGS="...";
# skipped with BENCH=0), then (unless RUNS=0) the 1M-step FPO runs of learn_mujoco_1m.sh for every
# seed in SEEDS (default "1 2 3": twelve runs, CORES=1 core each; networks on the GPU with the
# CUDA-graph update, or on the CPU if the CUDA-graph test failed), plus RUN_ARGS="..." if given.
# Everything stops DEADLINE seconds after the start (runs then report where they stopped;
# continue them with RUN_ARGS=--resume BENCH=0 TESTS=0 and the run folders restored under
# /tmp/robot_results).
# Results go to $OUT/robot_results.tgz (metrics, summaries, logs, benchmark JSON and each run's
# small checkpoints/latest.pt, which --resume needs).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out}
DEADLINE=${DEADLINE:-510}
BENCH=${BENCH:-1}
TESTS=${TESTS:-1}
RUNS=${RUNS:-1}
BENCH_UPDATES=${BENCH_UPDATES:-4}
REPEATS=${REPEATS:-5}
SEEDS=${SEEDS:-1 2 3}
CORES=${CORES:-1}
RUN_ARGS=${RUN_ARGS:-}
BENCH_ARGS=${BENCH_ARGS:-}
R=/tmp/robot_results
mkdir -p "$R" "$OUT"
export PYTHONUNBUFFERED=1 MUJOCO_GL=disable
{ nproc; lscpu | grep -i 'model name'; nvidia-smi -L; python3 -c 'import numpy, torch; print("torch", torch.__version__, torch.cuda.is_available(), "numpy", numpy.__version__)'; } > "$R/machine.txt" 2>&1
cat "$R/machine.txt"
if [ "$TESTS" = 1 ]; then
  timeout 150 python3 -m pytest -q -rfs tests/test_robot_fpo.py -k "graph or sampler" > "$R/gpu_tests.log" 2>&1
  grep -E "passed|failed|FAILED|SKIPPED|Error" "$R/gpu_tests.log" | tail -n 12
  if ! grep -q passed "$R/gpu_tests.log" || grep -q -E "FAILED.*cuda_graph_update|CUDA-graph update with" "$R/gpu_tests.log"; then
    echo "the CUDA-graph update test failed or was skipped: runs keep the networks on the CPU"
    RUN_ARGS="$RUN_ARGS --no-cuda"
  fi
fi
bench() {  # bench <json name> <args...>
  local name=$1
  shift
  # shellcheck disable=SC2086
  taskset -c 0-15 timeout 120 python3 benchmarks/bench_robot_sps.py --num-updates "$BENCH_UPDATES" --repeats "$REPEATS" "$@" $BENCH_ARGS \
    --json-out "$R/$name.json" >> "$R/bench.log" 2>&1 || echo "$name failed" >> "$R/bench.log"
}
if [ "$BENCH" = 1 ]; then
  : > "$R/bench.log"
  for th in 16 8 4; do
    bench "sps_16cores_cpu_th${th}" --torch-threads "$th" --no-cuda
  done
  bench sps_16cores_cuda_eager_th4 --torch-threads 4 --cuda --no-cuda-graph
  bench sps_16cores_cuda_graph_th1 --torch-threads 1 --cuda
  bench sps_16cores_cuda_graph_th4 --torch-threads 4 --cuda
  grep -v -i warning "$R/bench.log" | grep -v '^$' | grep -v '^{'
fi
if [ "$RUNS" = 1 ]; then
  left=$((DEADLINE - SECONDS))
  echo "runs: $left s left, SEEDS=$SEEDS CORES=$CORES RUN_ARGS=$RUN_ARGS"
  # shellcheck disable=SC2086
  RUN_DIR=$R TIMEOUT=$left SEEDS="$SEEDS" CORES=$CORES bash benchmarks/learn_mujoco_1m.sh $RUN_ARGS > "$R/learn_summary.txt" 2>&1
  cat "$R/learn_summary.txt"
fi
find "$R" -name 'update_*.pt' -delete
tar czf "$OUT/robot_results.tgz" -C /tmp robot_results
