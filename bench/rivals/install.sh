#!/usr/bin/env bash
# Installs the rivals that bench/rivals.py measures Monarch against into the
# repo's test venv (.venv, made by integrations/tensorflow/setup_venv.sh):
# litdata, mosaicml-streaming, webdataset (fsspec is already there), plus
# torchvision (which litdata and streaming import) and matplotlib (the chart).
#
# Every package goes in with --no-deps and an explicit list of what the
# rivals really import: their declared dependencies would replace the venv's
# torch 2.13.0 CPU build or its NumPy (streaming pins numpy<2.2, tensorflow
# wants the venv's), and pull in cloud SDKs (google-cloud-storage, azure,
# oci, paramiko, transformers) that only their remote back ends import.
# Idempotent: a venv that has everything at these versions is left alone
# in about a second.
#
# Usage: bench/rivals/install.sh [venv_dir]
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "${here}/../.." && pwd)"
venv="${1:-${repo}/.venv}"
py="${venv}/bin/python"
[[ -x "${py}" ]] || { echo "rivals/install: no venv at ${venv} (run scripts/install_deps.sh)" >&2; exit 1; }

# Not torchvision: PyPI's 0.28.0 (the release matching torch 2.13.0) is the
# CUDA build, and beside the CPU torch its import fails ("operator
# torchvision::nms does not exist"); no CPU build is reachable here. litdata
# does not need it; streaming imports one class from it for its vision
# datasets, which bench/rivals.py stubs when torchvision cannot be imported.
#
# The rivals, then what they import at run time (found by importing them).
pins=(
  litdata==0.2.76 lightning-utilities==0.15.3 boto3 botocore s3transfer jmespath
  python-dateutil tifffile
  mosaicml-streaming==0.13.0 xxhash zstd python-snappy cramjam brotli tqdm catalogue
  transformers==4.57.6 huggingface_hub==0.36.2 tokenizers==0.22.2 safetensors regex
  webdataset==1.0.2 braceexpand pyyaml
  matplotlib contourpy cycler fonttools kiwisolver pyparsing
)

missing="$("${py}" - "${pins[@]}" <<'PY'
import importlib.metadata as m, sys
out = []
for pin in sys.argv[1:]:
    name, _, want = pin.partition("==")
    try:
        have = m.version(name)
    except m.PackageNotFoundError:
        out.append(pin); continue
    if want and have.split("+")[0] != want:
        out.append(pin)
print(" ".join(out))
PY
)"
if [[ -z "${missing}" ]]; then
  echo "rivals/install: ${venv} already has litdata, mosaicml-streaming, webdataset, matplotlib"
  exit 0
fi
# shellcheck disable=SC2086
"${py}" -m pip install --quiet --disable-pip-version-check --no-cache-dir --no-deps ${missing}
# torch must still be the CPU 2.13.0 build.
"${py}" -c '
import sys, torch
sys.path.insert(0, "'"${repo}"'/bench")
from rivals import install_torchvision_stub
install_torchvision_stub()
import litdata, streaming, webdataset, fsspec, matplotlib
assert torch.__version__.startswith("2.13.0"), torch.__version__
print("rivals/install: torch", torch.__version__,
      "litdata", litdata.__version__, "streaming", streaming.__version__,
      "webdataset", getattr(webdataset, "__version__", "?"), "matplotlib", matplotlib.__version__)'
