#!/usr/bin/env bash
# The verbs of one lease of the paper-layout pretraining (scripts/pretrain_cfm.py --preset paper) on a rented GPU
# machine that starts bare, takes at most 64 MiB a call (the working tree is ~30 MB of it) and gives back at most
# 8 files of 16 MiB (64 MiB) a call. The calls in order: benchmarks/pretrain_results/README.md.
#
# Here:
#   carry DIR [STATE]     DIR/data1, data2, ...: one tar of the wheels (WHEELS, default DIR/whl, made with
#                         ROBOT=0 benchmarks/gpu_bundle.sh when absent) and the CIFAR-10 zips (CIFAR, default
#                         ../shared/data/cifar10) in pieces; DIR/state1, state2, ...: STATE's parts (what `give`
#                         brought back: train_state.pt.NN and train_state.sha256). Each folder is at most
#                         CARRY_BYTES (34,000,000: two parts), to travel beside the working tree (~30 MB) in one call.
# There (from the repository root; everything under LEASE, default /tmp/lease):
#   data FOLDER           keep a carried data folder's piece; once all are kept: check the sum, put the zips in
#                         LEASE/cifar10 and install the wheels into LEASE/site
#   restore FOLDER        keep a carried state folder's parts; once all are kept: check the sums, join them into
#                         LEASE/run/train_state.pt
#   start [FLAGS...]      pretrain_cfm.py --preset paper --state-format portable [--resume] FLAGS, detached (setsid
#                         nohup), output appended to LEASE/run/train.log; --resume when LEASE/run holds a state
#   wait SECONDS [OUT]    sleep while the run lives, at most SECONDS; then whether it lives and the log's tail.
#                         With OUT, then `hand OUT`: a lease whose machine is lost between calls keeps what came
#   hand OUT [COUNT]      the next COUNT (3) parts of a rolling snapshot of the newest saved state, with the sum
#                         file and the logs, into OUT; once all of a snapshot's parts are out, the next call takes
#                         a new snapshot (if a newer state was saved). Three calls bring one whole snapshot home
#   stop [SECONDS]        SIGTERM the run (it saves its finished steps, exit 130) and wait for it (default 300 s)
#   give OUT FIRST COUNT  FIRST=0 snapshots LEASE/run/train_state.pt in PART_BYTES (16,000,000) parts with
#                         train_state.sha256; copy parts FIRST..FIRST+COUNT-1 (COUNT <= 4), the sum file,
#                         quality.jsonl, train_summary.json and train.log to OUT
# Here, after the calls:
#   collect DEST DIR...   from the calls' files (DIR, in call order), the newest snapshot whose parts all came
#                         back, checked against its sums, into DEST with the last call's quality.jsonl,
#                         train_summary.json and train.log (DEST is what `carry DIR DEST` takes next lease)
# PYTHON (default python3) runs pip and the trainer.
set -euo pipefail
shopt -s nullglob
root=$(cd "$(dirname "$0")/.." && pwd)
py=${PYTHON:-python3}
L=${LEASE:-/tmp/lease}
carry_bytes=${CARRY_BYTES:-34000000}
part_bytes=${PART_BYTES:-16000000}
die() { echo "error: $*" >&2; exit 2; }
sums_ok() { (cd "$1" && sha256sum -c --quiet "${@:2}" 2>/dev/null); }  # FOLDER SUMFILE [FLAGS]: failures on stdout
alive() { [ -f "$L/pid" ] && kill -0 "$(cat "$L/pid")" 2>/dev/null; }
keep() {  # keep FOLDER's files in LEASE/in/KIND
  mkdir -p "$L/in/$2"
  cp "$1"/* "$L/in/$2/"
}
report() {
  if alive; then echo "running (pid $(cat "$L/pid"))"
  elif [ -f "$L/rc" ]; then echo "exited $(cat "$L/rc")"
  else echo "no run started"; fi
  if [ -f "$L/run/train.log" ]; then tail -n "${TAIL:-20}" "$L/run/train.log"; fi
}
snapshot() {  # a hard link keeps this state even when the run saves a new one over the name
  [ -f "$L/run/train_state.pt" ] || die "no state in $L/run"
  rm -rf "$L/give"
  mkdir -p "$L/give"
  ln "$L/run/train_state.pt" "$L/give/train_state.pt"
  (cd "$L/give" && split -b "$part_bytes" -d -a 2 train_state.pt train_state.pt.)
  (cd "$L/give" && sha256sum train_state.pt train_state.pt.[0-9]* >train_state.sha256)
  : >"$L/give/handed"
  if alive; then echo "note: the run is going; these parts are its state saved $(date -r "$L/give/train_state.pt")"; fi
}
logs() {  # OUT: the run's small files beside the parts
  for f in quality.jsonl train_summary.json; do if [ -f "$L/run/$f" ]; then cp "$L/run/$f" "$1/"; fi; done
  if [ -f "$L/run/train.log" ]; then tail -c 2000000 "$L/run/train.log" >"$1/train.log"; fi
}
hand() {  # OUT COUNT: the rolling snapshot's next parts
  local out=$1 count=$2 g=$L/give parts todo=() p
  if [ ! -f "$g/handed" ] || { [ "$(wc -l <"$g/handed")" -ge "$(ls "$g"/train_state.pt.[0-9]* | wc -l)" ] &&
    [ -f "$L/run/train_state.pt" ] && ! [ "$L/run/train_state.pt" -ef "$g/train_state.pt" ]; }; then
    [ -f "$L/run/train_state.pt" ] || { echo "hand: no state saved yet"; return 0; }
    snapshot
  fi
  parts=("$g"/train_state.pt.[0-9]*)
  for p in "${parts[@]}"; do
    grep -qx "$(basename "$p")" "$g/handed" || todo+=("$p")
  done
  mkdir -p "$out"
  logs "$out"
  if [ ${#todo[@]} -eq 0 ]; then echo "hand: all ${#parts[@]} parts of the newest snapshot are out"; return 0; fi
  todo=("${todo[@]:0:count}")
  cp "${todo[@]}" "$g/train_state.sha256" "$out/"
  for p in "${todo[@]}"; do basename "$p" >>"$g/handed"; done
  echo "hand: $(wc -l <"$g/handed") of ${#parts[@]} parts of the snapshot of $(date -r "$g/train_state.pt" +%T) out"
}
cmd=${1:-}; [ $# -gt 0 ] && shift
case $cmd in
carry)
  dir=${1:?usage: carry DIR [STATE]}; state=${2:-}
  whl=${WHEELS:-$dir/whl}; cifar=${CIFAR:-$root/../shared/data/cifar10}
  if [ ! -d "$whl" ]; then
    [ -z "${WHEELS:-}" ] || die "WHEELS=$WHEELS is not a folder"
    ROBOT=0 bash "$root/benchmarks/gpu_bundle.sh" "$dir"
  fi
  [ -f "$cifar/train.zip" ] && [ -f "$cifar/test.zip" ] || die "no train.zip and test.zip in $cifar (set CIFAR)"
  if [ -n "$state" ]; then  # check the parts here, before they travel
    [ -f "$state/train_state.sha256" ] || die "no train_state.sha256 in $state"
    sums_ok "$state" train_state.sha256 --ignore-missing || die "a part in $state is damaged"
    parts=("$state"/train_state.pt.[0-9]*)
    [ ${#parts[@]} -eq "$(grep -c 'train_state\.pt\.[0-9]' "$state/train_state.sha256")" ] ||
      die "$state holds ${#parts[@]} parts, train_state.sha256 lists another number"
  fi
  mkdir -p "$dir"
  rm -rf "$dir"/data[0-9]* "$dir"/state[0-9]*
  tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
  mkdir "$tmp/cifar10"
  ln -s "$(realpath "$whl")" "$tmp/whl"
  ln -s "$(realpath "$cifar/train.zip")" "$(realpath "$cifar/test.zip")" "$tmp/cifar10/"
  tar chf "$tmp/data.tar" -C "$tmp" whl cifar10
  split -b $((carry_bytes - 1000)) -d -a 2 "$tmp/data.tar" "$tmp/data.tar."
  (cd "$tmp" && sha256sum data.tar >data.sha256)
  pieces=("$tmp"/data.tar.[0-9]*)
  for i in "${!pieces[@]}"; do
    d=$dir/data$((i + 1))
    mkdir "$d"
    mv "${pieces[i]}" "$d/"
    cp "$tmp/data.sha256" "$d/"
    echo ${#pieces[@]} >"$d/data.pieces"
  done
  if [ -n "$state" ]; then
    per=$(((carry_bytes - 1000) / part_bytes)); [ "$per" -ge 1 ] || per=1
    for ((j = 0; j < ${#parts[@]}; j += per)); do
      d=$dir/state$((j / per + 1))
      mkdir "$d"
      cp "${parts[@]:j:per}" "$state/train_state.sha256" "$d/"
    done
  fi
  for f in "$dir"/data[0-9]* "$dir"/state[0-9]*; do
    size=$(stat -c %s "$f"/* | awk '{n += $1} END {print n}')
    [ "$size" -le "$carry_bytes" ] || die "$f is $size bytes, over CARRY_BYTES=$carry_bytes"
    echo "$f $size bytes: one call (carry it, run \`$(basename "$f" | tr -d 0-9 | sed 's/state/restore/') $f\`)"
  done ;;
data)
  folder=${1:?usage: data FOLDER}; keep "$folder" data
  pieces=("$L"/in/data/data.tar.[0-9]*); n=$(cat "$L/in/data/data.pieces")
  if [ ${#pieces[@]} -lt "$n" ]; then echo "data: ${#pieces[@]} of $n pieces kept; carry the next"; exit 0; fi
  cat "${pieces[@]}" >"$L/in/data/data.tar"
  sums_ok "$L/in/data" data.sha256 || die "data: the joined pieces do not match data.sha256"
  rm -rf "$L/payload" "$L/cifar10"
  mkdir -p "$L/payload"
  tar xf "$L/in/data/data.tar" -C "$L/payload"
  rm "$L/in/data/data.tar"
  mv "$L/payload/cifar10" "$L/cifar10"
  wheels=("$L"/payload/whl/*.whl)
  if [ ${#wheels[@]} -gt 0 ]; then
    "$py" -m pip install -q --no-index --no-deps --no-compile --target "$L/site" "${wheels[@]}"
  fi
  echo "data: CIFAR-10 in $L/cifar10, ${#wheels[@]} wheels installed into $L/site" ;;
restore)
  folder=${1:?usage: restore FOLDER}; alive && die "a run is going; stop it before restoring a state"
  keep "$folder" state
  sums=$L/in/state/train_state.sha256; parts=("$L"/in/state/train_state.pt.[0-9]*)
  n=$(grep -c 'train_state\.pt\.[0-9]' "$sums")
  if [ ${#parts[@]} -lt "$n" ]; then echo "restore: ${#parts[@]} of $n parts kept; carry the next"; exit 0; fi
  cat "${parts[@]}" >"$L/in/state/train_state.pt"
  sums_ok "$L/in/state" train_state.sha256 || die "restore: the parts do not match their sums"
  mkdir -p "$L/run"
  mv "$L/in/state/train_state.pt" "$L/run/train_state.pt"
  echo "restore: $L/run/train_state.pt ($(stat -c %s "$L/run/train_state.pt") bytes) matches train_state.sha256" ;;
start)
  alive && die "a run is going (pid $(cat "$L/pid")); wait for it or stop it"
  [ -f "$L/cifar10/train.zip" ] || die "no CIFAR-10 in $L/cifar10; carry the data folders with \`data\` first"
  mkdir -p "$L/run"
  rm -f "$L/pid" "$L/rc"
  resume=(); [ -f "$L/run/train_state.pt" ] && resume=(--resume)
  export PYTHONPATH=$L/site${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 D=$L
  # the wrapper records the trainer's pid (for stop) and, once it ends, its exit code
  setsid nohup bash -c '"$@" >>"$D/run/train.log" 2>&1 & echo $! >"$D/pid"; wait $!; echo $? >"$D/rc"' \
    _ "$py" "$root/scripts/pretrain_cfm.py" --preset paper --data "$L/cifar10" --out-dir "$L/run" \
    --state-format portable "${resume[@]}" "$@" </dev/null >/dev/null 2>&1 &
  for _ in $(seq 100); do [ -s "$L/pid" ] && break; sleep 0.1; done
  echo "started pid $(cat "$L/pid") (${resume[*]:-fresh}), log $L/run/train.log" ;;
wait)
  end=$((SECONDS + ${1:?usage: wait SECONDS}))
  while alive && [ $SECONDS -lt "$end" ]; do sleep 2; done
  report
  if [ $# -ge 2 ]; then hand "$2" 3; fi ;;
hand)
  hand "${1:?usage: hand OUT [COUNT]}" "${2:-3}" ;;
stop)
  end=$((SECONDS + ${1:-300}))
  if alive; then kill -TERM "$(cat "$L/pid")"; fi
  while alive && [ $SECONDS -lt "$end" ]; do sleep 1; done
  report ;;
give)
  [ $# -eq 3 ] || die "usage: give OUT FIRST COUNT"
  out=$1; first=$2; count=$3
  [ "$count" -ge 1 ] && [ "$count" -le 4 ] || die "COUNT $count must be 1..4 (a call brings back 8 files, 64 MiB)"
  g=$L/give
  if [ "$first" = 0 ]; then snapshot; fi
  [ -f "$g/train_state.sha256" ] || die "give FIRST=0 first: it takes the snapshot the other parts come from"
  parts=("$g"/train_state.pt.[0-9]*)
  mkdir -p "$out"
  last=$((first + count < ${#parts[@]} ? first + count : ${#parts[@]}))
  [ "$first" -lt "$last" ] || die "FIRST $first: the state has ${#parts[@]} parts (0..$((${#parts[@]} - 1)))"
  cp "${parts[@]:first:last-first}" "$g/train_state.sha256" "$out/"
  logs "$out"
  echo "give: parts $first..$((last - 1)) of ${#parts[@]} (0..$((${#parts[@]} - 1))) in $out" ;;
collect)
  dest=${1:?usage: collect DEST DIR...}; shift; [ $# -ge 1 ] || die "usage: collect DEST DIR..."
  best=""; declare -A where=()
  for d in "$@"; do  # each part file by snapshot (the whole file's sum) and name; later calls win
    [ -f "$d/train_state.sha256" ] || continue
    sum=$(awk '$2 == "train_state.pt" {print $1}' "$d/train_state.sha256")
    where[$sum/sums]=$d/train_state.sha256
    for p in "$d"/train_state.pt.[0-9]*; do where[$sum/$(basename "$p")]=$p; done
  done
  for d in "$@"; do  # the newest snapshot (by the last call holding one of its parts) that came back whole
    [ -f "$d/train_state.sha256" ] || continue
    sum=$(awk '$2 == "train_state.pt" {print $1}' "$d/train_state.sha256"); whole=1
    for n in $(awk '$2 ~ /^train_state\.pt\.[0-9]/ {print $2}' "$d/train_state.sha256"); do
      [ -n "${where[$sum/$n]:-}" ] || whole=0
    done
    [ "$whole" = 1 ] && best=$sum
  done
  [ -n "$best" ] || die "no snapshot came back whole in $*"
  mkdir -p "$dest"
  rm -f "$dest"/train_state.pt.[0-9]*
  cp "${where[$best/sums]}" "$dest/train_state.sha256"
  for n in $(awk '$2 ~ /^train_state\.pt\.[0-9]/ {print $2}' "$dest/train_state.sha256"); do
    cp "${where[$best/$n]}" "$dest/"
  done
  chmod u+w "$dest"/*
  sums_ok "$dest" train_state.sha256 --ignore-missing || die "collect: a part in $dest does not match its sum"
  [ "$(cat "$dest"/train_state.pt.[0-9]* | sha256sum | cut -d' ' -f1)" = "$best" ] ||
    die "collect: the joined parts do not match the whole file's sum"
  last=${*: -1}
  for f in quality.jsonl train_summary.json train.log; do if [ -f "$last/$f" ]; then cp "$last/$f" "$dest/"; fi; done
  chmod u+w "$dest"/*
  echo "collect: snapshot ${best:0:12} whole in $dest ($(cat "$dest"/train_state.pt.[0-9]* | wc -c) bytes)" ;;
*)
  echo "usage: $0 carry DIR [STATE] | data FOLDER | restore FOLDER | start [FLAGS...] | wait SECONDS [OUT] |" \
    "hand OUT [COUNT] | stop [SECONDS] | give OUT FIRST COUNT | collect DEST DIR..." >&2
  exit 2 ;;
esac
