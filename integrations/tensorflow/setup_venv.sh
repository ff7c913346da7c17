#!/usr/bin/env bash
# Creates (or reuses) <repo>/.venv with the pinned TensorFlow the Monarch
# TensorFlow plugin is built and tested against, plus what the LD_PRELOAD
# tests (tests/preload/) run real programs with: NumPy, Pillow, h5py,
# pyarrow, Hugging Face datasets and a CPU build of PyTorch. Idempotent: a venv that already has all of them (at
# the pinned versions) is left alone, so calling this from every build or CI
# run costs a second.
#
# Usage: integrations/tensorflow/setup_venv.sh [venv_dir]
set -euo pipefail

# Keep in sync with integrations/tensorflow/README.md.
TF_VERSION="2.21.0"
# The CPU build of PyTorch pip finds on this machine's disk. Never a bare
# `torch` (or a range admitting a newer release): that downloads GBs of CUDA.
TORCH_VERSION="2.13.0"

script_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo_root="$(cd "${script_dir}/../.." && pwd)"
venv="${1:-${repo_root}/.venv}"
python="${MONARCH_BASE_PYTHON:-python3}"

if [[ ! -x "${venv}/bin/python" ]]; then
  "${python}" -m venv "${venv}"
fi

# One line: "<tensorflow-cpu version> <torch version> <yes if the rest is there>".
have="$("${venv}/bin/python" -c '
import importlib.metadata as m
def version(name):
    try:
        return m.version(name)
    except m.PackageNotFoundError:
        return "none"
rest = all(version(n) != "none" for n in ("pytest", "numpy", "Pillow", "h5py", "pyarrow", "datasets"))
print(version("tensorflow-cpu"), version("torch").split("+")[0], "yes" if rest else "no")
' 2>/dev/null || true)"
if [[ "${have}" == "${TF_VERSION} ${TORCH_VERSION} yes" ]]; then
  echo "setup_venv: ${venv} already has tensorflow-cpu ${TF_VERSION}, torch ${TORCH_VERSION}," \
       "numpy, Pillow, h5py, pyarrow, datasets and pytest"
  exit 0
fi

# --no-cache-dir: the wheels are hundreds of MB; caching them would double the disk use.
"${venv}/bin/python" -m pip install --quiet --disable-pip-version-check --no-cache-dir \
  "tensorflow-cpu==${TF_VERSION}" "torch==${TORCH_VERSION}" numpy Pillow h5py pyarrow datasets pytest
echo "setup_venv: installed tensorflow-cpu ${TF_VERSION}, torch ${TORCH_VERSION}, numpy," \
     "Pillow, h5py, pyarrow, datasets and pytest into ${venv}"
