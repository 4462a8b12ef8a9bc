#!/usr/bin/env bash
# A study of many runs as detached queues that outlive the shell that started them, so a machine
# lent call by call (each call at most a few minutes) can run it: one call starts it, later calls
# wait a while, print where each run is, and pack what is finished so far.
#
#   bash benchmarks/robot_study.sh start DIR PLANFILE   # start one detached worker per queue, return at once
#   bash benchmarks/robot_study.sh wait DIR SECONDS     # until every queue is done or SECONDS pass; then status
#   bash benchmarks/robot_study.sh status DIR           # name, state (queued / running / exit N / skipped), last update,
#                                                       # last eval
#   bash benchmarks/robot_study.sh stop DIR SECONDS     # start no further line; SIGTERM the running commands (the
#                                                       # trainers stop at their next checkpoint); wait as `wait` does
#   bash benchmarks/robot_study.sh collect DIR DEST     # DIR without checkpoints/ and TensorBoard files ->
#                                                       # DEST/study.tar.gz (parts .00 .01 ... of <= 15 MB if larger)
#   CHECKPOINTS=1 bash benchmarks/robot_study.sh collect DIR DEST   # also each run's last checkpoint, without its
#                                                       # environments' state (benchmarks/portable_checkpoints.py)
#   bash benchmarks/robot_study.sh restore SRC DIR      # SRC's study.tar.gz (or parts) -> the runs in DIR/runs, each
#                                                       # with its checkpoint, for plan lines with --resume-or-start
#
# PLANFILE: one run a line, `QUEUE NAME COMMAND...` (# comments and blank lines ignored). Each queue
# runs its lines in order; a failing line does not stop it. COMMAND runs through `bash -c` from the
# repository root with RUN_DIR=DIR/runs and PEER_OUT=DIR/peer exported, and CUDA_VISIBLE_DEVICES
# set to the queue name's digits when it is gpuK (gpu2 -> 2, gpu23 -> 2,3); its output goes to
# DIR/logs/NAME.log, DIR/started/NAME marks its start and DIR/done/NAME holds its exit code.
# PYTHONUNBUFFERED=1 and MUJOCO_GL=disable (unless set) are exported too; the rest of the caller's
# environment passes through. On a machine whose working tree is re-copied call by call, keep DIR
# outside it (e.g. /tmp/study) and collect into the folder the call hands back.
# PYTHON (default python3) is the interpreter that runs portable_checkpoints.py for collect and restore.
# The analysis: python benchmarks/plot_robot_study.py DIR (it expects run folders named NAME in
# DIR/runs, the official runner's JSONs in DIR/peer and its logs as logs/official_TASK_sSEED.log).
set -u
self=$(cd "$(dirname "$0")" && pwd)/$(basename "$0")
root=$(cd "$(dirname "$0")/.." && pwd)
py=${PYTHON:-python3}
usage() {
  echo "usage: $0 start DIR PLANFILE | wait DIR SECONDS | status DIR | stop DIR SECONDS | collect DIR DEST |" \
    "restore SRC DIR" >&2
  exit 2
}
[ $# -ge 2 ] || usage
cmd=$1; dir=$2
lines() { grep -v '^[[:space:]]*\(#\|$\)' "$dir/plan.txt"; }  # the plan's run lines
all_done() {  # every queue finished (or its worker is gone)
  local q
  for q in $(lines | awk '!seen[$1]++ {print $1}'); do
    [ -e "$dir/queues/$q.done" ] && continue
    kill -0 "$(cat "$dir/queues/$q.pid" 2>/dev/null || echo 0)" 2>/dev/null && return 1
  done
}
[ "$cmd" = start ] || [ "$cmd" = restore ] || [ -f "$dir/plan.txt" ] || { echo "error: $dir holds no study (no plan.txt)" >&2; exit 2; }
case $cmd in
start)
  [ $# -eq 3 ] && [ -f "$3" ] || { echo "error: plan file ${3:-(none)} not found" >&2; exit 2; }
  [ -e "$2/plan.txt" ] && { echo "error: $2 already holds a study (plan.txt); pick a new DIR" >&2; exit 2; }
  mkdir -p "$dir"/{logs,started,done,queues,runs,peer} && dir=$(cd "$dir" && pwd)
  cp "$3" "$dir/plan.txt"
  { nvidia-smi -L 2>&1 || true; echo "nproc $(nproc)"; date -u; } >"$dir/machine.txt"
  for q in $(lines | awk '!seen[$1]++ {print $1}'); do
    setsid nohup bash "$self" _worker "$dir" "$q" >"$dir/queues/$q.log" 2>&1 </dev/null &
    echo $! >"$dir/queues/$q.pid"
    echo "queue $q: worker $!"
  done ;;
_worker)  # DIR QUEUE: run the queue's lines in order
  q=$3
  lines | while read -r lq name command; do
    [ "$lq" = "$q" ] || continue
    [ -e "$dir/stop" ] && continue  # `stop`: no further line starts
    date -u >"$dir/started/$name"
    (
      cd "$root" || exit 1
      export RUN_DIR="$dir/runs" PEER_OUT="$dir/peer" PYTHONUNBUFFERED=1 MUJOCO_GL=${MUJOCO_GL:-disable}
      if [[ $q =~ ^gpu([0-9]+)$ ]]; then
        export CUDA_VISIBLE_DEVICES=$(echo "${BASH_REMATCH[1]}" | sed 's/./&,/g; s/,$//')
      fi
      exec bash -c "$command"
    ) >"$dir/logs/$name.log" 2>&1 </dev/null
    echo $? >"$dir/done/$name"
  done
  date -u >"$dir/queues/$q.done" ;;
stop)  # the queues' workers lead their process groups (setsid): signal each group's processes but the workers'
  [ $# -eq 3 ] || usage  # bash, so each worker records its line's exit code and starts nothing after it
  date -u >"$dir/stop"
  for p in "$dir"/queues/*.pid; do
    for c in $(pgrep -g "$(cat "$p")" 2>/dev/null); do
      [ "$(cat "/proc/$c/comm" 2>/dev/null)" = bash ] || kill -TERM "$c" 2>/dev/null
    done
  done
  bash "$self" wait "$dir" "$3" ;;
wait)
  end=$((SECONDS + ${3:?SECONDS})); finished=0
  while [ $SECONDS -lt $end ]; do all_done && { finished=1; break; }; sleep 1; done
  [ $finished = 1 ] || all_done && echo "all queues done" || echo "still running after $3 s"
  bash "$self" status "$dir" ;;
status)
  lines | while read -r q name _; do
    if [ -e "$dir/done/$name" ]; then state="exit $(cat "$dir/done/$name")"
    elif [ -e "$dir/started/$name" ]; then state=running
    elif [ -e "$dir/stop" ]; then state=skipped; else state=queued; fi
    m="$dir/runs/$name/metrics.jsonl"; upd=-; ev=-
    if [ -s "$m" ]; then
      upd=$(tail -n 1 "$m" | grep -o '"update": *[0-9]*' | grep -o '[0-9]*$')
      ev=$(grep '"eval_return"' "$m" | tail -n 1 | grep -o '"eval_return": *[^,}]*' | sed 's/.*: *//')
    elif [ -e "$dir/logs/$name.log" ]; then  # the official runner prints `eval {'block': B, 'reward': R, ...}`
      ev=$(grep '^eval {' "$dir/logs/$name.log" | tail -n 1 | sed 's/^eval //')
    fi
    printf '%-8s %-40s %-9s update %-5s eval %s\n' "$q" "$name" "$state" "${upd:--}" "${ev:--}"
  done ;;
collect)
  dest=${3:?DEST}; mkdir -p "$dest" && rm -f "$dest"/study.tar.gz "$dest"/study.tar.gz.[0-9]*
  packed=1
  if [ "${CHECKPOINTS:-0}" != 0 ]; then
    "$py" "$root/benchmarks/portable_checkpoints.py" pack "$dir" || packed=0
  fi
  tar -C "$(dirname "$dir")" --warning=no-file-changed --exclude=checkpoints --exclude='events.out.tfevents*' \
    --exclude='study.tar.gz*' -czf "$dest/study.tar.gz" "$(basename "$dir")"
  rc=$?; [ $rc -le 1 ] || { echo "error: tar failed ($rc)" >&2; exit 5; }  # 1: a file changed while read
  part=${STUDY_PART_BYTES:-15000000}  # join the parts with: cat study.tar.gz.* > study.tar.gz
  if [ "$(stat -c %s "$dest/study.tar.gz")" -gt "$part" ]; then
    split -b "$part" -d -a 2 "$dest/study.tar.gz" "$dest/study.tar.gz." && rm "$dest/study.tar.gz"
  fi
  ls -l "$dest"/study.tar.gz*
  # CHECKPOINTS=1 asked for the checkpoints: the runs are collected all the same, but the call fails.
  [ $packed = 1 ] || { echo "error: packing the checkpoints with $py failed; $dest holds the runs without them" >&2; exit 4; } ;;
restore)  # SRC DIR: what collect wrote into SRC (study.tar.gz or its parts), its runs into DIR/runs
  [ $# -eq 3 ] || usage
  src=$2; dir=$3; tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
  if ! cat "$src"/study.tar.gz* | tar -xzf - -C "$tmp"; then
    echo "error: no readable study.tar.gz in $src (this repository's raw results:" \
      "python benchmarks/results_data.py fetch $src)" >&2
    exit 2
  fi
  mkdir -p "$dir/runs" && "$py" "$root/benchmarks/portable_checkpoints.py" unpack "$tmp"/* "$dir" ;;
*) usage ;;
esac
