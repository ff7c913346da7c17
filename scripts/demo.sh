#!/usr/bin/env bash
# What Monarch buys, measured in under a minute after the build: installs
# what is needed, builds monarch-epochs and the PFS emulator, generates a
# small ImageNet-like dataset (2,000 files of ~110 KiB, fixed seed) and reads
# it for 3 shuffled epochs with 4 threads twice, with plain reads and through
# Monarch's embedded default (a RAM tier over the source), from the PFS
# emulator (a FUSE mount that behaves like a busy Lustre and counts what
# reaches it; the local directory where FUSE cannot mount). Prints per epoch
# both times, their ratio, the bytes and metadata operations each read from
# the source and how many copies were in RAM, then one sentence to repeat.
# The run and the report: scripts/demo.py.
#
#   scripts/demo.sh [monarch-epochs options for both runs, e.g. --threads 8 --epochs 5]
#   MONARCH_DEMO_DIR=/var/tmp/demo scripts/demo.sh  # dataset, mount point, logs (/tmp/monarch-demo)
#   MONARCH_DEMO_LOCAL=1 scripts/demo.sh            # the local directory even where FUSE works
set -euo pipefail
cd "$(dirname "$0")/.."
MONARCH_SKIP_TENSORFLOW=1 scripts/install_deps.sh
# Every cache entry the demo depends on is named: scripts/test.sh configures
# the same build/ with the tests, the benchmarks and TensorFlow on (and names
# what it needs in turn). MONARCH_PYTHON is used by none of the demo's
# targets.
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DMONARCH_SANITIZE= -DMONARCH_FUZZ=OFF \
  -DMONARCH_BUILD_PFS_EMULATOR=ON -DMONARCH_BUILD_TENSORFLOW=OFF -DMONARCH_BUILD_TESTS=OFF \
  -DMONARCH_BUILD_BENCHMARKS=OFF >/dev/null
cmake --build build -j"${MONARCH_BUILD_JOBS:-$(nproc)}" --target monarch-epochs monarch-pfs-emulator

dir=${MONARCH_DEMO_DIR:-/tmp/monarch-demo}
# demo.py unmounts the emulator on exit, Ctrl-C, SIGTERM and SIGHUP; this is
# for a demo.py that could not (killed), and only while no other demo holds
# the directory's lock.
cleanup() {
  if [ -f "$dir/.monarch-demo" ]; then
    flock -n "$dir/lock" tools/pfs_emulator/pfs-emulator stop "$dir/pfs" >/dev/null 2>&1 || true
  fi
}
trap cleanup EXIT
local_flag=()
[ "${MONARCH_DEMO_LOCAL:-0}" = 1 ] && local_flag=(--local)
# MONARCH_DEMO_MOOSEFS=DIRECT or AUTO: the source on a real MooseFS (scripts/moosefs.sh).
[ -n "${MONARCH_DEMO_MOOSEFS:-}" ] && local_flag+=(--moosefs "$MONARCH_DEMO_MOOSEFS")
python3 scripts/demo.py --build build --dir "$dir" "${local_flag[@]}" "$@"
