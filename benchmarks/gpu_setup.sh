# Sourced on a GPU machine without a package index, from the repository root, with the folder that
# benchmarks/gpu_bundle.sh made:  source benchmarks/gpu_setup.sh DIR
# Unpacks into /tmp and exports OURS (PYTHONPATH for robot_fpo.py: tyro, Playground 0.2.0, envpool)
# and PEERPATH (PYTHONPATH for the official FPO runner: Playground 0.0.5 and the peer's sources).
# Keep them apart: the two Playground versions must not share one PYTHONPATH.
_b=${1:?usage: source benchmarks/gpu_setup.sh DIR}
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "$_b"/whl/*.whl 2>&1 | grep -v WARNING
mkdir -p /tmp/so /tmp/sp /tmp/ep
tar xJf "$_b/pg/site_ours.tar.xz" -C /tmp/so
tar xJf "$_b/pg/site_peer.tar.xz" -C /tmp/sp
tar xzf "$_b/envpool.tar.gz" -C /tmp/ep
export MUJOCO_GL=disable PYTHONUNBUFFERED=1
export OURS=/tmp/site:/tmp/so:/tmp/ep/envpool_bundle
_here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)  # peer_jax_compat: the peer's MJX on a newer JAX
export PEERPATH=$_here/peer_jax_compat:/tmp/sp:$(realpath "$_b")/peers/fpo_playground/src:$(realpath "$_b")/peers/wandb_stub
