#!/usr/bin/env bash
# Builds the Python package (python/) as a wheel that installs without root
# on a Linux node that has none of Monarch's libraries:
#   pip install dist/monarch-*.whl
# scikit-build-core builds the wheel from the same CMake targets as the
# repository's build; `auditwheel repair` then goes through every ELF file
# in it (libmonarch_c.so, the _read_bytes module, the `monarch` binary),
# copies the shared libraries they need beyond the manylinux baseline
# (Abseil, yaml-cpp, libpmem and what libpmem needs) into the wheel
# (monarch.libs/), sets the RPATHs that find them there, and gives the wheel
# a manylinux tag.
# UCX is not bundled: nothing links it, and peers open the system's at run
# time (src/remote/ucx_loader.h).
#
# Usage: scripts/build_wheel.sh [DIST_DIR]     (default: <repository>/dist)
# Environment:
#   MONARCH_WHEEL_WORK_DIR  build tools (a venv), the CMake build directory
#                           (kept, so a second run only recompiles what
#                           changed) and the unrepaired wheel (raw/);
#                           default <repository>/build-wheel-work
#   MONARCH_WHEEL_JOBS      parallel compile jobs; default nproc
#   MONARCH_BASE_PYTHON     the Python that creates the tools venv; default python3
# Installs what it needs: Debian packages (scripts/install_deps.sh, as
# root; without TensorFlow) and, into the tools venv, PyPI's build,
# scikit-build-core, ninja, auditwheel and patchelf.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
dist=$(realpath -m "${1:-$repo/dist}")
work=$(realpath -m "${MONARCH_WHEEL_WORK_DIR:-$repo/build-wheel-work}")
cd "$repo"
started=$(date +%s)

MONARCH_SKIP_TENSORFLOW=1 scripts/install_deps.sh

# The build tools in a venv of their own, so nothing is installed into the
# system's Python; pip is asked only when one is missing.
tools="$work/tools"
if [[ ! -x "$tools/bin/python" ]]; then
  "${MONARCH_BASE_PYTHON:-python3}" -m venv "$tools"
fi
# Ninja (the generator scikit-build-core prefers, found as a module): it
# recompiles only the objects whose command line changed, which keeps the
# reused build directory below incremental (a wheel's install prefix is a new
# temporary directory each build; see the top-level CMakeLists.txt).
if ! "$tools/bin/python" -c 'import build, scikit_build_core, auditwheel, ninja' 2>/dev/null ||
   [[ ! -x "$tools/bin/patchelf" ]]; then
  "$tools/bin/python" -m pip install --quiet --disable-pip-version-check \
    build "scikit-build-core>=0.10" auditwheel patchelf ninja
fi

# The cmake on PATH may be a wrapper script (pyenv's shim, PyPI's cmake):
# scikit-build-core gives `cmake --version` a few seconds, which a wrapper
# on a loaded machine can miss, so it is handed the binary itself.
echo 'message("${CMAKE_COMMAND}")' >"$work/cmake_command.cmake"
export CMAKE_EXECUTABLE="${CMAKE_EXECUTABLE:-$(cmake -P "$work/cmake_command.cmake" 2>&1)}"

# --no-isolation: the tools venv is the build environment, so the CMake
# build directory below sees the same interpreter every run and is reused.
echo "== building the wheel (CMake build directory $work/cmake) =="
rm -rf "$work/raw"
CMAKE_BUILD_PARALLEL_LEVEL="${MONARCH_WHEEL_JOBS:-$(nproc)}" \
  "$tools/bin/python" -m build --wheel --no-isolation --outdir "$work/raw" \
  -C build-dir="$work/cmake" python >"$work/build.log" 2>&1 ||
  { tail -n 60 "$work/build.log"; exit 1; }
raw=("$work"/raw/monarch-*.whl)

# auditwheel finds patchelf on PATH; it picks the most widely usable
# manylinux tag the wheel's symbol versions allow.
echo "== auditwheel repair =="
mkdir -p "$dist"
rm -f "$dist"/monarch-*.whl
PATH="$tools/bin:$PATH" auditwheel repair --wheel-dir "$dist" "${raw[0]}" >"$work/repair.log" 2>&1 ||
  { cat "$work/repair.log"; exit 1; }
wheel=("$dist"/monarch-*.whl)
PATH="$tools/bin:$PATH" auditwheel show "${wheel[0]}" | sed -n '1,/^$/p'
echo "built ${wheel[0]} ($(du -k "${wheel[0]}" | cut -f1) KiB) in $(($(date +%s) - started)) s"
