#!/usr/bin/env bash
# remote.bootstrap: mpi, end to end: builds monarch-epochs with
# -DMONARCH_WITH_MPI=ON, runs 2 ranks under mpirun (addresses exchanged by
# MPI_Allgatherv, rank and size from MPI_COMM_WORLD), every read verified
# against the source, and checks that each file was read from the source
# once across both ranks. Exit 77 (skip) without mpirun/mpicc.
# usage: mpi_bootstrap_test.sh SOURCE_DIR WORK_BUILD_DIR
set -euo pipefail
src=$1
build=$2/mpi-build
command -v mpirun >/dev/null && command -v mpicc >/dev/null || { echo "SKIP: no Open MPI"; exit 77; }
cmake -S "$src" -B "$build" -DCMAKE_BUILD_TYPE=Release -DMONARCH_WITH_MPI=ON \
  -DMONARCH_BUILD_TESTS=OFF -DMONARCH_BUILD_BENCHMARKS=OFF -DMONARCH_BUILD_TENSORFLOW=OFF \
  -DMONARCH_BUILD_PFS_EMULATOR=OFF >/dev/null
cmake --build "$build" -j"$(nproc)" --target monarch-epochs >/dev/null
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$build/monarch-epochs" --dataset "$work/dataset" --generate 150 --epochs 0 >/dev/null
mkdir "$work/barriers"
cat > "$work/mpi.yaml" <<YAML
dataset: {path: $work/dataset}
tiers:
  - {kind: ram, capacity: 64MiB}
  - {kind: source}
remote: {enabled: true, bootstrap: mpi}
YAML
mpirun --allow-run-as-root --oversubscribe -np 2 sh -c \
  "\"$build/monarch-epochs\" --config \"$work/mpi.yaml\" --epochs 2 --threads 2 --verify \
     --partition \$OMPI_COMM_WORLD_RANK/2 --barrier-dir \"$work/barriers\" \
     --json \"$work/epochs.\$OMPI_COMM_WORLD_RANK.json\" > \"$work/out.\$OMPI_COMM_WORLD_RANK\" 2>&1"
python3 - "$work" <<'PY'
import json, sys
work = sys.argv[1]
epochs = [json.load(open("%s/epochs.%d.json" % (work, r))) for r in range(2)]
files = 150
e1 = sum(e[0]["served"]["source"]["reads"] for e in epochs)
e2 = sum(e[1]["served"]["source"]["reads"] for e in epochs)
peers = sum(e[0]["served"]["peers"]["reads"] + e[1]["served"]["peers"]["reads"] for e in epochs)
print("source reads epoch 1: %d (files %d), epoch 2: %d; peer reads %d" % (e1, files, e2, peers))
assert e1 == files and e2 == 0 and peers > 0
assert all(x["errors"] == 0 and x["mismatches"] == 0 for e in epochs for x in e)
print("PASS mpi bootstrap")
PY
