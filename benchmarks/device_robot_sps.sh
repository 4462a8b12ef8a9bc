#!/usr/bin/env bash
# One call on a GPU machine with 16 cores: the CUDA tests of tests/test_robot_fpo_fast.py, then
# bench_robot_sps.py (environment-only vs end-to-end steps/s, networks on the GPU) for one envpool
# MuJoCo task and one DM Control task, then the time to build WalkerRun-v1 pools (what the envpool
# backend pays at each environment restart). Results go to $OUT (default /tmp/robot_sps).
# Without a package index, ENVPOOL_BUNDLE=<envpool.tar.gz from ../shared/tools/envpool_bundle.sh>
# and WHEELS=<folder with tyro, docstring-parser, typeguard, shtab wheels> are installed to /tmp first:
#   ENVPOOL_BUNDLE=.gpu/envpool.tar.gz WHEELS=.gpu/whl bash benchmarks/device_robot_sps.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/robot_sps}
py=${PYTHON:-python3}
mkdir -p "$OUT"
if [ -n "${ENVPOOL_BUNDLE:-}" ]; then
  tar xzf "$ENVPOOL_BUNDLE" -C /tmp && export PYTHONPATH=/tmp/envpool_bundle:${PYTHONPATH:-}
fi
if [ -n "${WHEELS:-}" ]; then
  "$py" -m pip install -q --no-index --no-deps --target /tmp/site "$WHEELS"/*.whl && export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
fi
export MUJOCO_GL=disable PYTHONUNBUFFERED=1
{ nproc; lscpu | grep -i 'model name'; nvidia-smi -L; "$py" -c 'import torch, envpool; print("torch", torch.__version__, "envpool", envpool.__version__)'; } 2>&1 | tee "$OUT/machine.txt"
timeout 150 "$py" -m pytest -q -p no:cacheprovider tests/test_robot_fpo_fast.py tests/test_samplers.py 2>&1 | tail -n 3 | tee "$OUT/gpu_tests.txt"
bench() {  # bench <task> <repeats>
  taskset -c 0-15 timeout 150 "$py" benchmarks/bench_robot_sps.py --env-id "$1" --num-envs "${NUM_ENVS:-1024}" --cuda \
    --repeats "$2" --num-updates "${UPDATES:-3}" --json-out "$OUT/sps_$1.json" 2>&1 | tail -n 1
}
bench HalfCheetah-v5 "${REPEATS:-2}"
timeout "${POOL_TIMEOUT:-100}" "$py" - <<'PY' 2>&1 | tee "$OUT/pool_build.txt"
import time
import envpool
t = time.perf_counter()
e = envpool.make("WalkerRun-v1", env_type="gymnasium", num_envs=2048, seed=0, num_threads=16)
print(f"WalkerRun-v1 pool of 2048 environments, 16 threads: built in {time.perf_counter() - t:.1f} s", flush=True)
PY
bench CartpoleSwingup-v1 1
