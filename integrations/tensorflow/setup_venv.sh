#!/usr/bin/env bash
# Creates (or reuses) <repo>/.venv with the pinned TensorFlow the Monarch
# TensorFlow plugin is built and tested against. Idempotent: a venv that
# already has the pinned version is left alone, so calling this from every
# build or CI run costs a second.
#
# Usage: integrations/tensorflow/setup_venv.sh [venv_dir]
set -euo pipefail

# Keep in sync with integrations/tensorflow/README.md.
TF_VERSION="2.21.0"

script_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo_root="$(cd "${script_dir}/../.." && pwd)"
venv="${1:-${repo_root}/.venv}"
python="${MONARCH_BASE_PYTHON:-python3}"

if [[ ! -x "${venv}/bin/python" ]]; then
  "${python}" -m venv "${venv}"
fi

have="$("${venv}/bin/python" -c 'import importlib.metadata as m; print(m.version("tensorflow-cpu"))' 2>/dev/null || true)"
have_pytest="$("${venv}/bin/python" -c 'import pytest; print("yes")' 2>/dev/null || true)"
if [[ "${have}" == "${TF_VERSION}" && "${have_pytest}" == "yes" ]]; then
  echo "setup_venv: ${venv} already has tensorflow-cpu ${TF_VERSION}"
  exit 0
fi

# --no-cache-dir: the wheel is ~270 MB; caching it would double the disk use.
"${venv}/bin/python" -m pip install --quiet --disable-pip-version-check --no-cache-dir \
  "tensorflow-cpu==${TF_VERSION}" pytest
echo "setup_venv: installed tensorflow-cpu ${TF_VERSION} into ${venv}"
