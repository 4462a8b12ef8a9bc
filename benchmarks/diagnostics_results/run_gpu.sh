#!/usr/bin/env bash
# GPU measurement: a 20-update cifar_fpo run per alpha on the shipped generator (auto-a35, paper batch),
# then the gram diagnostic on its final checkpoint.
set -u
OUT=${OUT:-diagnostics_results}
if [ -d .whl ]; then  # offline tyro wheels, when the machine has no tyro
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
fi
export PYTHONPATH=/tmp/site:${PYTHONPATH:-} PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
for a in -2 1; do
  T0=$(date +%s)
  python3 cifar_fpo.py --reward auto-a35 --alpha=$a --num-updates 20 --run-name a$a --runs-dir /tmp/runs --no-verbose --no-save-samples || exit 1
  T1=$(date +%s)
  python3 diagnostics.py gram --checkpoint /tmp/runs/a$a --out /tmp/diag/a$a --name auto-a35 || exit 1
  T2=$(date +%s)
  echo "alpha=$a train_s=$((T1-T0)) gram_wall_s=$((T2-T1))"
  mkdir -p $OUT/a$a; cp /tmp/diag/a$a/cross.png /tmp/diag/a$a/gram.json /tmp/diag/a$a/gram.npz $OUT/a$a/
done
python3 - <<'PY'
import json
for a in ("-2", "1"):
    d = json.load(open(f"/tmp/diag/a{a}/gram.json"))
    s = json.load(open(f"/tmp/runs/a{a}/summary.json"))
    print(a, "cross_offdiag", d["C_cross"]["offdiag_mean"], "within_offdiag", d["C_within"]["offdiag_mean"], "S", d["S"],
          "rms", d["rms"], "paired_diag", d["C_paired"]["diag_mean"], "cross_diag", d["C_cross"]["diag_mean"],
          "time_s", d["time_s"], "layout", d["layout"], "val", s["initial_val_reward"], s["final_val_reward"])
PY
