#!/bin/bash
# before (main's cifar_fpo.py) and after (the reshaped one), the fast mode, on one card, alternating
cd "$(dirname "$0")"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site whl/*.whl || exit 1
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
nvidia-smi -L
python3 -c 'import torch; print(torch.__version__, torch.cuda.get_device_name(0))'
i=0
for side in after before after before after before; do
  if [ $i -ge 2 ] && [ $SECONDS -gt 300 ]; then echo "stop after $i runs at ${SECONDS}s"; break; fi
  echo "== $side (run $i, t=${SECONDS}s)"
  (cd $side && python3 benchmarks/bench_cifar_update.py --modes bf16+compile --updates 60 --warmup 5 \
     --json "$OUT/${side}_$i.json") 2>&1 | tee -a "$OUT/log.txt" | grep -v -i warn | tail -6
  i=$((i+1))
done
echo "total ${SECONDS}s"
