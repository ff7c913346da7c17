#!/usr/bin/env bash
# Installs what bench/suite/run_suite.py needs beyond the project build:
# matplotlib, into <repo>/.venv when that venv exists (it also holds
# TensorFlow for the TF setups), otherwise into the user site of python3.
# Idempotent: does nothing when matplotlib already imports.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
if [[ -x "$repo/.venv/bin/python" ]]; then
  python="$repo/.venv/bin/python"
  pip_args=()
else
  python="python3"
  pip_args=(--user)
fi

if "$python" -c 'import matplotlib' 2>/dev/null; then
  echo "setup: matplotlib already installed for $python"
  exit 0
fi

echo "setup: installing matplotlib for $python"
if ! "$python" -m pip --version >/dev/null 2>&1; then
  # Debian's python3 may come without pip.
  if command -v apt-get >/dev/null && [[ $EUID -eq 0 ]]; then
    apt-get install -y python3-pip >/dev/null
  else
    echo "setup: error: $python has no pip; install python3-pip" >&2
    exit 1
  fi
fi
if ! "$python" -m pip install --quiet "${pip_args[@]}" matplotlib; then
  # A Debian system interpreter refuses user installs (PEP 668) unless told.
  [[ ${#pip_args[@]} -gt 0 ]] || exit 1
  "$python" -m pip install --quiet "${pip_args[@]}" --break-system-packages matplotlib
fi
"$python" -c 'import matplotlib; print("setup: matplotlib", matplotlib.__version__)'
