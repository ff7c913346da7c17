#!/usr/bin/env bash
# Installs the build tree into a scratch prefix with `cmake --install`, then
# configures, builds and runs a separate project that uses find_package(monarch).
set -euo pipefail
build_dir=$1
source_dir=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cmake --install "$build_dir" --prefix "$work/prefix" >/dev/null
cmake -S "$source_dir" -B "$work/build" -DCMAKE_PREFIX_PATH="$work/prefix" >/dev/null
cmake --build "$work/build" >/dev/null
mkdir -p "$work/data/sub"
printf 'hello from monarch' > "$work/data/sub/hello.txt"
out=$("$work/build/consumer" "$work/data" sub/hello.txt)
[ "$out" = "hello from monarch" ] || { echo "unexpected output: $out"; exit 1; }
out=$("$work/build/c_consumer" "$work/data" sub/hello.txt)
[ "$out" = "hello from monarch" ] || { echo "unexpected output from C: $out"; exit 1; }
# c_api.cc is compiled once, into an object library both libraries use.
# (Counted in the Makefiles' rules: stale objects of older layouts may linger.)
if ls "$build_dir"/CMakeFiles/*.dir/build.make >/dev/null 2>&1; then
  compiles=$(grep -l '/c_api.cc.o:' "$build_dir"/CMakeFiles/*.dir/build.make | wc -l)
  [ "$compiles" = 1 ] || { echo "c_api.cc is compiled by $compiles targets"; exit 1; }
fi
test -f "$work/prefix/include/monarch/monarch.h"
test -f "$work/prefix/lib/cmake/monarch/monarchConfig.cmake" || test -f "$work/prefix/lib/x86_64-linux-gnu/cmake/monarch/monarchConfig.cmake"
echo "install test passed"
