"""What the emulated-PFS epoch benchmarks share (prefetch_epochs.py,
eviction_epochs.py): their common flags, and an ImageNet-like dataset
generated once behind a PFS emulator mount. imagenet_like() also serves the
benchmarks that read a generated dataset directly."""

import argparse
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from moosefs_source import MooseFS, add_source_flags  # noqa: E402
from service_epochs import Pfs, add_emulator_flags  # noqa: E402


def parser(reps, out):
    """The flags every such benchmark takes; `reps` and `out` are its defaults."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--dir", default="/var/tmp/monarch-prefetch-bench")
    ap.add_argument("--files", type=int, default=2000)
    ap.add_argument("--threads", type=int, default=4)
    ap.add_argument("--reps", type=int, default=reps)
    add_emulator_flags(ap)
    add_source_flags(ap)
    ap.add_argument("--out", default=out)
    return ap


def imagenet_like(build, path, files):
    """Generates `files` ImageNet-like files at `path` (once, with
    monarch-epochs from `build`); returns their dataset-relative names,
    sorted."""
    if not os.path.isdir(path):
        subprocess.run([os.path.join(build, "monarch-epochs"), "--dataset", path,
                        "--generate", str(files), "--profile", "imagenet", "--epochs", "0"],
                       check=True, capture_output=True)
    return sorted(os.path.relpath(os.path.join(d, n), path)
                  for d, _, names in os.walk(path) for n in names)


def mounted_dataset(a):
    """Generates --files ImageNet-like files under --dir (once) and mounts
    them through the PFS emulator, or copies them onto MooseFS with
    --source moosefs (bench/moosefs_source.py). Returns (pfs, files,
    total_bytes); exits when the source is unavailable."""
    backing, mount = os.path.join(a.dir, "backing"), os.path.join(a.dir, "pfs")
    os.makedirs(a.dir, exist_ok=True)
    sizes = [os.path.getsize(os.path.join(backing, n))
             for n in imagenet_like(a.build, backing, a.files)]
    if getattr(a, "source", "emulator") == "moosefs":
        pfs = MooseFS(a, backing, "imagenet-%d" % a.files)
    else:
        pfs = Pfs(a, backing, mount)
    if not pfs.ok:
        sys.exit("source unavailable: " + pfs.why)
    return pfs, len(sizes), sum(sizes)


def private_runtime_base(prefix):
    """A fresh directory as this process's XDG_RUNTIME_DIR, so its node
    services live apart from any other run's (or the user's), with no batch
    job or config named by the environment; returns it."""
    work = tempfile.mkdtemp(prefix=prefix, dir="/tmp")
    os.environ["XDG_RUNTIME_DIR"] = work
    for variable in ("PBS_JOBID", "LSB_JOBID", "FLUX_JOB_ID", "MONARCH_JOB", "MONARCH_CONFIG"):
        os.environ.pop(variable, None)
    return work
