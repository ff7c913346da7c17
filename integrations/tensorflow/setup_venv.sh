#!/usr/bin/env bash
# Creates (or reuses) <repo>/.venv with the pinned TensorFlow the Monarch
# TensorFlow plugin is built and tested against, plus what the LD_PRELOAD
# tests (tests/preload/) run real programs with: NumPy, Pillow, h5py,
# pyarrow, Hugging Face datasets and a CPU build of PyTorch. Idempotent: a
# venv that already has all of them (at the pinned versions) is left alone,
# so calling this from every build or CI run costs a second.
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

# Hugging Face datasets (tests/preload maps its Arrow files), installed
# apart with --no-deps and what it imports: datasets 5 wants
# huggingface_hub >= 1.31, which the transformers that mosaicml-streaming
# imports refuses (bench/rivals/install.sh pins 0.36.2), and datasets 4
# declares fsspec <= 2026.2.0, below the one torch brings. 4.8.5 imports and
# maps with both (the 'preload: mapping' test does it).
DATASETS_VERSION="4.8.5"
HUB_VERSION="0.36.2"
datasets_pins=(
  "datasets==${DATASETS_VERSION}" "huggingface_hub==${HUB_VERSION}" dill multiprocess xxhash
  pandas python-dateutil six tzdata requests charset-normalizer idna urllib3 certifi
  httpx==0.28.1 httpcore==1.0.9 h11 anyio tqdm pyyaml filelock packaging typing-extensions
)

# One line: "<tensorflow-cpu version> <torch version> <yes if the rest is there>
# <datasets version> <huggingface_hub version>".
have="$("${venv}/bin/python" -c '
import importlib.metadata as m
def version(name):
    try:
        return m.version(name)
    except m.PackageNotFoundError:
        return "none"
rest = all(version(n) != "none" for n in ("pytest", "numpy", "Pillow", "h5py", "pyarrow"))
print(version("tensorflow-cpu"), version("torch").split("+")[0], "yes" if rest else "no",
      version("datasets"), version("huggingface_hub"))
' 2>/dev/null || true)"
datasets_have="${DATASETS_VERSION} ${HUB_VERSION}"
if [[ "${have}" == "${TF_VERSION} ${TORCH_VERSION} yes ${datasets_have}" ]]; then
  echo "setup_venv: ${venv} already has tensorflow-cpu ${TF_VERSION}, torch ${TORCH_VERSION}," \
       "numpy, Pillow, h5py, pyarrow, datasets ${DATASETS_VERSION} and pytest"
  exit 0
fi

# --no-cache-dir: the wheels are hundreds of MB; caching them would double the disk use.
if [[ "${have}" != "${TF_VERSION} ${TORCH_VERSION} yes "* ]]; then
  "${venv}/bin/python" -m pip install --quiet --disable-pip-version-check --no-cache-dir \
    "tensorflow-cpu==${TF_VERSION}" "torch==${TORCH_VERSION}" numpy Pillow h5py pyarrow pytest
fi
"${venv}/bin/python" -m pip install --quiet --disable-pip-version-check --no-cache-dir --no-deps \
  "${datasets_pins[@]}"
"${venv}/bin/python" -c 'import datasets, huggingface_hub' || {
  echo "setup_venv: datasets ${DATASETS_VERSION} does not import" >&2; exit 1; }
echo "setup_venv: installed tensorflow-cpu ${TF_VERSION}, torch ${TORCH_VERSION}, numpy," \
     "Pillow, h5py, pyarrow, datasets ${DATASETS_VERSION} and pytest into ${venv}"
