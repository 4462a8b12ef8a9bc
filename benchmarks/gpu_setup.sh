# Sourced on a GPU machine without a package index, from the repository root, with the folder that
# benchmarks/gpu_bundle.sh made:  source benchmarks/gpu_setup.sh DIR
# Unpacks into /tmp and exports OURS (PYTHONPATH for robot_fpo.py: tyro, Playground 0.2.0, envpool, warp-lang)
# and PEERPATH (PYTHONPATH for the official FPO runner: Playground 0.0.5 and the peer's sources).
# Keep them apart: the two Playground versions must not share one PYTHONPATH.
_b=${1:?usage: source benchmarks/gpu_setup.sh DIR}
"${PYTHON:-python3}" -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "$_b"/whl/*.whl 2>&1 | grep -v WARNING
mkdir -p /tmp/so /tmp/sp /tmp/ep
# a DIR with whl/ alone (gpu_bundle.sh with ROBOT=0) is enough for CIFAR grids (halving.py cifar-grid), the CIFAR
# benchmarks (with DIFFUSERS=1 their diffusers peers too) and pretrain_cfm.py: the robot parts are skipped when absent
if [ -f "$_b/pg/site_ours.tar.xz" ]; then tar xJf "$_b/pg/site_ours.tar.xz" -C /tmp/so; fi
if [ -f "$_b/pg/site_peer.tar.xz" ]; then tar xJf "$_b/pg/site_peer.tar.xz" -C /tmp/sp; fi
if [ -f "$_b/envpool.tar.gz" ]; then tar xzf "$_b/envpool.tar.gz" -C /tmp/ep; fi
if [ -f "$_b/legged.tar.xz" ]; then tar xJf "$_b/legged.tar.xz" -C /tmp/ep; fi  # Spot, Go1 and G1 (LEGGED=1)
for _m in "$_b"/menagerie_*.tar.xz; do [ -f "$_m" ] && tar xJf "$_m" -C /tmp/ep; done  # their assets alone
export MUJOCO_GL=disable PYTHONUNBUFFERED=1
export OURS=/tmp/site:/tmp/so:/tmp/ep/envpool_bundle
# warp-lang for --physics warp (gpu_bundle.sh): this call's parts from DIR/warp/ join those earlier calls left in
# /tmp/warp_parts/; when all are there (the joined archive has DIR/warp/warp.sha256's sum) they are unpacked once.
if [ -f "$_b/warp/warp.sha256" ]; then
  mkdir -p /tmp/warp_parts && cp "$_b"/warp/warp.tar.xz.[0-9]* /tmp/warp_parts/ 2>/dev/null || true
  if [ ! -d /tmp/wp/warp_bundle/warp ]; then
    if [ "$(cat /tmp/warp_parts/warp.tar.xz.[0-9]* | sha256sum | cut -d' ' -f1)" = "$(cat "$_b/warp/warp.sha256")" ]; then
      mkdir -p /tmp/wp && cat /tmp/warp_parts/warp.tar.xz.[0-9]* | tar xJf - -C /tmp/wp
    else
      echo "warp-lang: $(ls /tmp/warp_parts | wc -l) part(s) in /tmp/warp_parts, not all yet: --physics jax only"
    fi
  fi
  if [ -d /tmp/wp/warp_bundle/warp ]; then export OURS=$OURS:/tmp/wp/warp_bundle; fi
fi
_here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)  # peer_jax_compat: the peer's MJX on a newer JAX
export PEERPATH=$_here/peer_jax_compat:/tmp/sp:$(realpath "$_b")/peers/fpo_playground/src:$(realpath "$_b")/peers/wandb_stub
