#!/usr/bin/env bash
# One cold `monarch stage` of an ImageNet-like dataset on MooseFS (20,000
# files of about 110 KiB, 2.3 GiB; the one bench/rivals.py --source moosefs
# reads) into a RAM tier, through a node service started for it: MooseFS's
# caches dropped first, the tier purged before and after. Prints the stage's
# own line ("staged ... in N s") last.
#
#   bench/stage_moosefs.sh BUILD_DIR        (as root: MooseFS needs it)
#
# To compare two builds, run it for each in turns (A B A B ...) and pair
# the stage lines. The dataset is generated with BUILD_DIR's monarch-epochs
# if it is not there.
set -euo pipefail
build=$(cd "${1:?usage: bench/stage_moosefs.sh BUILD_DIR}" && pwd)
here=$(cd "$(dirname "$0")/.." && pwd)
mount=$("$here/scripts/moosefs.sh" start | tail -1)
dataset="$mount/monarch-bench/stage-20000-files"
if [ ! -f "$dataset.complete" ]; then
  rm -rf "$dataset"
  "$build/monarch-epochs" --dataset "$dataset" --generate 20000 --profile imagenet \
    --epochs 0 > /dev/null
  touch "$dataset.complete"
fi
work=$(mktemp -d /var/tmp/monarch-stage-bench.XXXXXX)
config="$work/stage.yaml"
cat > "$config" <<EOF
dataset: {path: $dataset}
tiers: [{kind: ram, capacity: 3GiB}, {kind: source}]
node: {shared: true, runtime_dir: $work/rt, idle_exit: 0, autostart: false}
EOF
finish() {
  "$build/monarch" stop --config "$config" > /dev/null 2>&1 || true
  "$build/monarch" purge --config "$config" > /dev/null 2>&1 || true
  rm -rf "$work"
}
trap finish EXIT
"$here/scripts/moosefs.sh" drop-cache > /dev/null
"$build/monarch" serve --config "$config" > "$work/serve.log" 2>&1 &
for _ in $(seq 1 600); do
  [ -S "$work/rt/monarch.sock" ] && "$build/monarch" status --config "$config" > /dev/null 2>&1 \
    && break
  sleep 0.1
done
"$build/monarch" stage --config "$config" 2> /dev/null
