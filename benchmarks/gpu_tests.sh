#!/usr/bin/env bash
# Every GPU test, on a GPU machine without a package index, from the repository root:
#   bash benchmarks/gpu_tests.sh BUNDLE_DIR [LOG_DIR]
# BUNDLE_DIR is the folder benchmarks/gpu_bundle.sh made (tyro, pytest 9, Playground, envpool). The test files
# that hold GPU tests run whole, one pytest process each, side by side; LOG_DIR (default /tmp/gpu_tests) keeps
# one log per file and versions.txt. Fails if a test fails, or is skipped for a reason other than a part the bundle
# left out: warp-lang (the warp parts, gpu_bundle.sh) and envpool's legged robots and their assets (LEGGED=1);
# skips are listed.
set -uo pipefail
bundle=${1:?usage: gpu_tests.sh BUNDLE_DIR [LOG_DIR]}
logs=${2:-/tmp/gpu_tests}
py=${PYTHON:-python3}
mkdir -p "$logs"
source benchmarks/gpu_setup.sh "$bundle"
export PYTHONPATH=$OURS PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 OMP_NUM_THREADS=2
files=(tests/test_flow_triton.py tests/test_playground_env.py tests/test_robot_fpo.py tests/test_robot_fpo_fast.py
  tests/test_samplers.py tests/test_cifar_fpo.py
  tests/test_obs_routing.py tests/test_cifar_pack.py)
{
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  "$py" -c "import sys, torch, jax, pytest, triton
print('python', sys.version.split()[0], '| torch', torch.__version__, '| jax', jax.__version__, jax.default_backend(),
      '| pytest', pytest.__version__, '| triton', triton.__version__)"
} | tee "$logs/versions.txt"
for f in "${files[@]}"; do
  "$py" -m pytest -q -rA -p no:cacheprovider "$f" > "$logs/$(basename "$f" .py).log" 2>&1 &
done
wait
status=0
for f in "${files[@]}"; do
  log="$logs/$(basename "$f" .py).log"
  echo "$f: $(tail -n 1 "$log")"
  grep -q -E "^(FAILED|ERROR) |[0-9]+ (failed|error)" "$log" && status=1
  skipped=$(grep -E "^SKIPPED" "$log")
  [ -n "$skipped" ] && echo "$skipped"
  grep -q -v -E "^$|needs warp-lang|CPU compiler|Playground ports|Menagerie assets are missing" <<<"$skipped" && status=1
done
[ $status -eq 0 ] && echo "gpu tests: all passed (skips, if any, listed above)" || echo "gpu tests: FAILED (logs in $logs)"
exit $status
