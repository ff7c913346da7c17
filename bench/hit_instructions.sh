#!/usr/bin/env bash
# Instructions per 4 KiB RAM hit, in process and through a node-service
# client, counted by callgrind: a measure that does not drift with a shared
# machine's load, for changes whose timing effect is below the noise.
#
#   bench/hit_instructions.sh [BUILD_DIR]
#
# monarch-epochs reads 50 files of 100 KiB in 4 KiB reads for 6 epochs with
# one thread; callgrind collects only inside the front end's Read and is
# switched on before epoch 2, so epochs 2-6 (6,250 reads, every one a RAM
# hit) are counted. Prints the instructions per hit for each.
set -euo pipefail
build=${1:-build}
command -v valgrind >/dev/null || { echo "valgrind is not installed" >&2; exit 77; }
work=$(mktemp -d /var/tmp/monarch-hits.XXXXXX)
cleanup() {
  # Stop, then purge the RAM copies the stop keeps on /dev/shm (node.keep_ram).
  if [ -f "$work/client.yaml" ]; then
    "$build/monarch" stop --config "$work/client.yaml" >/dev/null 2>&1 || true
    "$build/monarch" purge --config "$work/client.yaml" >/dev/null 2>&1 || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT
mkdir "$work/data"
for i in $(seq -w 0 49); do head -c 102400 /dev/urandom >"$work/data/f$i.bin"; done
cat >"$work/inproc.yaml" <<EOF
dataset: {path: $work/data}
tiers:
  - {kind: ram, capacity: 64MiB}
  - {kind: source}
EOF
cat "$work/inproc.yaml" - >"$work/client.yaml" <<EOF
node: {shared: true, runtime_dir: $work/run}
EOF
hook='if [ "$MONARCH_EPOCH" = 2 ]; then callgrind_control -i on $PPID >/dev/null; fi'
count() {  # count NAME CONFIG FUNCTION
  valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file="$work/$1.out" \
    "--toggle-collect=$3" "$build/monarch-epochs" --config "$2" --epochs 6 --threads 1 \
    --read-size 4096 --settle --before-epoch "$hook" >"$work/$1.log" 2>&1 ||
    { cat "$work/$1.log" >&2; exit 1; }
  local total
  total=$(callgrind_annotate "$work/$1.out" 2>/dev/null | awk '/PROGRAM TOTALS/ {gsub(",", "", $1); print $1}')
  awk -v t="$total" -v name="$1" 'BEGIN {printf "%-10s %.1f instructions per 4 KiB RAM hit (%d / 6250)\n", name, t / 6250, t}'
}
count in-process "$work/inproc.yaml" 'monarch::(anonymous namespace)::MonarchImpl::Read(std::basic_string_view*'
count client "$work/client.yaml" 'monarch::service::(anonymous namespace)::ServiceClient::Read(std::basic_string_view*'
