#!/usr/bin/env bash
# The main job on the embedded default: installs what is needed, builds,
# generates a small ImageNet-like dataset (2,000 files of ~110 KiB, fixed
# seed) and reads it for 3 shuffled epochs with 4 threads through Monarch's
# default configuration (a RAM tier over the source).
set -euo pipefail
cd "$(dirname "$0")/.."
MONARCH_SKIP_TENSORFLOW=1 scripts/install_deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DMONARCH_BUILD_TENSORFLOW=OFF >/dev/null
cmake --build build -j"$(nproc)" --target monarch-epochs
dataset=${MONARCH_DEMO_DATASET:-/tmp/monarch-demo-dataset}
generate=()
[ -d "$dataset" ] || generate=(--generate 2000 --profile imagenet)
exec build/monarch-epochs --dataset "$dataset" "${generate[@]}" --epochs 3 --threads 4 "$@"
