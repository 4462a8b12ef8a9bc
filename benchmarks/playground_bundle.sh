#!/usr/bin/env bash
# Packs what the Playground backend (and the official FPO peer) need on a GPU machine that has
# PyTorch, JAX with CUDA, flax and optax but no package index, as two trimmed site folders:
#   OUTDIR/site_ours.tar.xz   playground 0.2.0 + mujoco/mujoco-mjx 3.17.0 + brax 0.14.2 (~6 MB)
#   OUTDIR/site_peer.tar.xz   playground 0.0.5 + mujoco/mujoco-mjx 3.3.7 + brax 0.14.2 (~5 MB),
#                             with the empty menagerie folder 0.0.5 would otherwise clone at import
# The wheels are ~65 MB; the viewer, Studio, Filament renderer, test data and locomotion textures
# are dropped (none is imported by the DM Control suite with MUJOCO_GL=disable).
# There: mkdir -p /tmp/so && tar xJf site_ours.tar.xz -C /tmp/so && export PYTHONPATH=/tmp/so MUJOCO_GL=disable
# Usage: bash benchmarks/playground_bundle.sh OUTDIR [PYTHON_VERSION (3.12)]
set -euo pipefail
out=$(realpath -m "${1:?usage: playground_bundle.sh OUTDIR [PYTHON_VERSION]}"); py=${2:-3.12}
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
plat="--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64"
get() { python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$py" --implementation cp $plat -d "$tmp/$1" "${@:2}"; }
common="brax==0.14.2 ml-collections jaxopt trimesh tensorboardx flask flask-cors mediapy jax-dataclasses"
get ours playground==0.2.0 mujoco==3.17.0 mujoco-mjx==3.17.0 $common
get peer playground==0.0.5 mujoco==3.3.7 mujoco-mjx==3.3.7 $common
mkdir -p "$out"
for s in ours peer; do
  python3 -m pip install -q --no-deps --no-compile --only-binary=:all: --python-version "$py" --implementation cp $plat \
    --target "$tmp/site_$s" "$tmp/$s"/*.whl
  (cd "$tmp/site_$s" && rm -rf bin learning mujoco/experimental mujoco/_render_filament* mujoco/_simulate* \
     mujoco/mjx/test_data mujoco/testdata mujoco/include mujoco/usd mujoco/sysid mujoco/plugin &&
   find . \( -name '*_test.py' -o -name '*.stl' -o -name '*.obj' \) -delete &&
   find . -name '*.png' \( -path '*locomotion*' -o -path '*manipulation*' \) -delete &&
   find . -name __pycache__ -prune -exec rm -rf {} +)
done
mkdir -p "$tmp/site_peer/mujoco_playground/external_deps/mujoco_menagerie"
touch "$tmp/site_peer/mujoco_playground/external_deps/mujoco_menagerie/.keep"
for s in ours peer; do tar cJf "$out/site_$s.tar.xz" -C "$tmp/site_$s" .; done
ls -la "$out"
