#!/usr/bin/env bash
# Installs what Monarch needs to build and test: Debian packages, and (unless
# MONARCH_SKIP_TENSORFLOW=1) the Python virtual environment with TensorFlow
# used by the TensorFlow plugin and its tests. Idempotent; run as root.
set -euo pipefail
cd "$(dirname "$0")/.."

# libclang-rt-dev: the default clang's sanitizer and libFuzzer runtimes (the
# fuzz build, tests/fuzz); clang only recommends it. slurm-wlm and munge: a
# one-machine Slurm the launcher test (tests/slurm) starts for itself.
# moosefs-*: a real distributed file system on this machine (scripts/moosefs.sh)
# under tests/moosefs and the benchmarks' --source moosefs.
packages=(build-essential pkg-config libabsl-dev libyaml-cpp-dev libpmem-dev doctest-dev
          libfuse3-dev fuse3 libucx-dev ucx-utils iproute2 libopenmpi-dev openmpi-bin
          clang libclang-rt-dev slurm-wlm munge
          moosefs-master moosefs-chunkserver moosefs-client moosefs-cli)
# cmake and python3 may come from elsewhere (pip, pyenv): take them from
# Debian only when they are not on PATH.
command -v cmake >/dev/null || packages+=(cmake)
command -v python3 >/dev/null || packages+=(python3 python3-venv)
want=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || want+=("$p")
done
if [ ${#want[@]} -gt 0 ]; then
  echo "installing: ${want[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${want[@]}" >/dev/null
fi

if [ "${MONARCH_SKIP_TENSORFLOW:-0}" != 1 ] && [ -x integrations/tensorflow/setup_venv.sh ]; then
  integrations/tensorflow/setup_venv.sh
fi
