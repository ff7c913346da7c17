#!/usr/bin/env bash
# Fuzzes for a bounded time from a copy of a regression corpus (ctest's
# "fuzz run: <target>"). A crash, leak, timeout or out-of-memory fails the
# test, with the input saved under <work>/artifacts/ and the commands to
# reproduce it and to minimize it for the corpus.
#
#   run_fuzzer.sh <fuzzer> <corpus dir> <work dir> <seconds> <rss limit MB> <timeout s> [flags]
#
# Further flags go to libFuzzer as they are (e.g. -dict=...).
set -euo pipefail
if [ $# -lt 6 ]; then
  echo "usage: $0 <fuzzer> <corpus dir> <work dir> <seconds> <rss limit MB> <timeout s> [flags]" >&2
  exit 2
fi
fuzzer=$1 corpus=$2 work=$3 seconds=$4 rss_mb=$5 timeout=$6
shift 6
# ASan's default 256 MiB quarantine of freed blocks grows the fuzzer to
# 1 GiB and halves its speed on these small inputs; 64 MiB still catches
# use-after-free within an input.
export ASAN_OPTIONS=${ASAN_OPTIONS:-quarantine_size_mb=64}

# The copy is what libFuzzer grows; the tree's corpus is never written.
rm -rf "$work"
mkdir -p "$work/corpus" "$work/artifacts"
cp -R "$corpus"/. "$work/corpus/"

status=0
"$fuzzer" -max_total_time="$seconds" -rss_limit_mb="$rss_mb" -timeout="$timeout" \
  -print_final_stats=1 -artifact_prefix="$work/artifacts/" "$@" "$work/corpus" || status=$?
if [ "$status" -ne 0 ]; then
  echo
  echo "== $(basename "$fuzzer") failed (exit $status). Inputs it saved:"
  ls -l "$work/artifacts/"
  for input in "$work"/artifacts/*; do
    [ -f "$input" ] || continue
    echo "reproduce: $fuzzer $input"
    echo "minimize:  $fuzzer -minimize_crash=1 -runs=100000 -exact_artifact_path=<name> $input"
  done
  echo "Fix the decoder, then add the minimized input to $corpus/ (see tests/fuzz/README.md)."
fi
exit "$status"
