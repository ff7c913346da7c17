#!/usr/bin/env bash
# Installs the Debian packages needed to build, run and test the PFS
# emulator. Idempotent: installs only what is missing. Needs root (or sudo).
#   libfuse3-dev  headers + pkg-config file for libfuse 3 (>= 3.12)
#   fuse3         fusermount3 and the fuse kernel-module helper
#   util-linux    findmnt, mountpoint, setsid (used by the pfs-emulator script)
#   cmake g++ pkg-config python3  build and tests
set -euo pipefail

packages=(libfuse3-dev fuse3 util-linux cmake g++ pkg-config python3)
missing=()
for pkg in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" ||
    missing+=("$pkg")
done
if ((${#missing[@]} == 0)); then
  echo "pfs_emulator deps: all installed"
  exit 0
fi
sudo=""
if [[ $(id -u) -ne 0 ]]; then sudo="sudo"; fi
echo "pfs_emulator deps: installing ${missing[*]}"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
