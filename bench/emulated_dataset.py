"""What the emulated-PFS epoch benchmarks share (prefetch_epochs.py,
eviction_epochs.py): their common flags, and an ImageNet-like dataset
generated once behind a PFS emulator mount."""

import argparse
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from service_epochs import Pfs  # noqa: E402


def parser(reps, out):
    """The flags every such benchmark takes; `reps` and `out` are its defaults."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--dir", default="/var/tmp/monarch-prefetch-bench")
    ap.add_argument("--files", type=int, default=2000)
    ap.add_argument("--threads", type=int, default=4)
    ap.add_argument("--reps", type=int, default=reps)
    ap.add_argument("--meta-latency-us", type=int, default=1000)
    ap.add_argument("--read-latency-us", type=int, default=500)
    ap.add_argument("--bandwidth-mbps", type=float, default=300)
    ap.add_argument("--out", default=out)
    return ap


def mounted_dataset(a):
    """Generates --files ImageNet-like files under --dir (once) and mounts
    them through the PFS emulator. Returns (pfs, files, total_bytes); exits
    when FUSE is unavailable."""
    backing, mount = os.path.join(a.dir, "backing"), os.path.join(a.dir, "pfs")
    os.makedirs(a.dir, exist_ok=True)
    if not os.path.isdir(backing):
        subprocess.run([os.path.join(a.build, "monarch-epochs"), "--dataset", backing,
                        "--generate", str(a.files), "--profile", "imagenet", "--epochs", "0"],
                       check=True, capture_output=True)
    sizes = [os.path.getsize(os.path.join(d, n)) for d, _, names in os.walk(backing)
             for n in names]
    pfs = Pfs(a, backing, mount)
    if not pfs.ok:
        sys.exit("PFS emulator unavailable: " + pfs.why)
    return pfs, len(sizes), sum(sizes)
