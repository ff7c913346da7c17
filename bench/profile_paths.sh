#!/usr/bin/env bash
# Profiles Monarch's cold path (epoch 1: every read a miss) and warm path
# (epochs 2-3: every read a hit) with perf's cpu-clock sampler, which works
# where hardware counters do not (perf stat -e instructions true says
# "not supported" on this kind of VM). Sampling is switched on and off at the
# epoch boundaries through perf's control FIFO, driven by monarch-epochs
# --before-epoch, so each profile holds exactly the epochs it names.
#
#   bench/profile_paths.sh [BUILD_DIR] [DATASET_DIR] [ram|posix] [READERS]
#
# For each path it prints the CPU time per thread (reader threads are
# "monarch-epochs", placement threads "monarch-place") and the top symbols.
# Defaults: build, /var/tmp/monarch-dnh/small (made by bench/do_no_harm.py,
# or: build/monarch-epochs --dataset DIR --generate 2000 --epochs 0), ram, 1.
set -euo pipefail
build=${1:-build}
dataset=${2:-/var/tmp/monarch-dnh/small}
tier=${3:-ram}
readers=${4:-1}
work=$(mktemp -d /var/tmp/monarch-profile.XXXXXX)
trap 'rm -rf "$work"' EXIT
mkfifo "$work/ctl" "$work/ack"
write_config() {  # write_config TIER_DIR: a fresh, empty tier for each profile
{
  echo "dataset: {path: $dataset}"
  echo "tiers:"
  if [ "$tier" = ram ]; then
    echo "  - {kind: ram, capacity: 4GiB}"
  else
    echo "  - {kind: posix, path: $1, capacity: 64GiB}"
  fi
  echo "  - {kind: source}"
} >"$work/config.yaml"
}
# The source in the page cache: the case where Monarch's own costs show.
"$build/monarch-epochs" --dataset "$dataset" --mode plain --epochs 1 --threads 2 >/dev/null

profile() {  # profile NAME FIRST_EPOCH LAST_EPOCH
  local name=$1 first=$2 last=$3
  mkdir "$work/tier-$name"
  write_config "$work/tier-$name"
  # perf answers each command with one "ack" line on the ack FIFO.
  local hook="if [ \$MONARCH_EPOCH = $first ]; then echo enable >$work/ctl; read a <$work/ack; fi;"
  hook+=" if [ \$MONARCH_EPOCH = $((last + 1)) ]; then echo disable >$work/ctl; read a <$work/ack; fi"
  perf record -q -e cpu-clock -F 4000 -D -1 --control "fifo:$work/ctl,$work/ack" \
    -o "$work/$name.data" -- "$build/monarch-epochs" --config "$work/config.yaml" \
    --threads "$readers" --read-size 256KiB --epochs 3 --before-epoch "$hook" |
    grep -E '^epoch'
  echo "== $name path (epochs $first-$last), $tier tier, $readers reader(s): CPU ms per thread kind"
  perf report -i "$work/$name.data" --stdio -n --sort comm 2>/dev/null |
    awk '/^#/ || NF == 0 {next} {printf "   %-16s %6.1f ms\n", $3, $2 / 4.0}' | head -4
  echo "-- top symbols (share of all samples in these epochs)"
  perf report -i "$work/$name.data" --no-children --sort comm,sym -g none --stdio \
    --percent-limit 1.5 2>/dev/null | awk '/^#/ || NF == 0 {next} {print}' | head -25
}

profile cold 1 1
profile warm 2 3
