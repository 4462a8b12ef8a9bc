#!/usr/bin/env bash
# 61-block FPO runs side by side on one GPU: robot_fpo.py at the fpo preset on the Playground
# backend, and the official FPO code through its runner, all started at once and stopped together
# after DEADLINE seconds (a stopped run keeps the metrics it wrote; the official runner prints its
# evaluations to its log, and its JSON to OUT/peer when it finishes). Each run's log goes to OUT/logs, our run folders to OUT/runs.
#
#   bash benchmarks/playground_learning.sh OUT DEADLINE RUN...
#   RUN = ours:TASK:ALPHA_EPS:SEED | official:TASK:SEED
#   OURS_PYTHONPATH, PEER_PYTHONPATH, PEER_SCRIPT: where Playground (and the peer) are installed
#
# e.g. bash benchmarks/playground_learning.sh out 540 ours:AcrobotSwingup:1:0 official:AcrobotSwingup:0
set -u
out=$1; deadline=$2; shift 2
mkdir -p "$out/logs" "$out/runs"
export MUJOCO_GL=disable PYTHONUNBUFFERED=1
pids=()
for spec in "$@"; do
  IFS=: read -r side task a b <<<"$spec"
  if [ "$side" = ours ]; then
    PYTHONPATH=${OURS_PYTHONPATH:-} timeout -s INT -k 30 "$deadline" python3 robot_fpo.py --preset fpo --backend playground \
      --env-id "$task" --alpha-eps "$a" --seed "$b" --runs-dir "$out/runs" --run-name "${task}_ae${a}_s${b}" \
      >"$out/logs/ours_${task}_ae${a}_s${b}.log" 2>&1 &
  else
    # the official code preallocates 75% of the GPU unless told otherwise; share the card
    mkdir -p "$out/peer"
    OUT="$out/peer" XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=${PEER_PYTHONPATH:-} timeout -s INT -k 30 "$deadline" \
      python3 "${PEER_SCRIPT:?}" "$task" 61 "$a" >"$out/logs/official_${task}_s${a}.log" 2>&1 &
  fi
  pids+=($!)
done
for p in "${pids[@]}"; do wait "$p"; echo "run $p exit $?"; done
