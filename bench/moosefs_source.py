"""A real distributed file system as a benchmark's source: the dataset copied
onto MooseFS (scripts/moosefs.sh: a master and a chunk server in a network
namespace, the FUSE client mounted over a veth pair).

`MooseFS` has the PFS emulator's face in bench/service_epochs.py (`Pfs`):
`mount`, `script`, `ok`/`why`, `flags`, `stats()`, `reset()`, `stop()`, so a
benchmark takes either. Its `script` is scripts/moosefs.sh, whose `stats` and
`reset` print and zero counters in the emulator's shape: bytes_read (the
bytes that crossed the veth pair from the chunk server, headers included),
reads, opens and metadata_ops (mfsmount's own counts).

Three set-ups, recorded side by side (issue 39):
  default    mfscachemode=AUTO: the kernel keeps the client's pages, as on a
             node whose memory holds the dataset
  direct     mfscachemode=DIRECT: no client cache, a dataset larger than the
             node's memory
  throttled  AUTO, the chunk server's disk reads throttled (cgroup v1 blkio)
             to --moosefs-read-mbps: a busy PFS
`drop_cache()` evicts the dataset from the client's and the chunk server's
page caches, so a cold epoch meets the disk (and the throttle) again.
"""

import json
import os
import shutil
import subprocess

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(REPO, "scripts", "moosefs.sh")
# scripts/moosefs.sh's state (metadata, chunks, mount point); its daemons'
# command lines name it.
STATE_DIR = os.environ.get("MONARCH_MOOSEFS_DIR", "/var/tmp/monarch-moosefs")
SETUPS = ("default", "direct", "throttled")


def add_source_flags(ap):
    """--source and the MooseFS set-up flags."""
    ap.add_argument("--source", choices=("emulator", "moosefs"), default="emulator",
                    help="where the dataset lives: the PFS emulator (default) or a real "
                         "MooseFS (scripts/moosefs.sh)")
    ap.add_argument("--moosefs-setup", choices=SETUPS, default="default",
                    help="with --source moosefs: default (client cache on), direct "
                         "(mfscachemode=DIRECT) or throttled (blkio read limit)")
    ap.add_argument("--moosefs-read-mbps", type=float, default=150,
                    help="the chunk server's disk read limit in MB/s for --moosefs-setup "
                         "throttled (default 150)")


def _tree(root):
    """{relative name: size} of the regular files under root."""
    out = {}
    for d, _, names in os.walk(root):
        for n in names:
            p = os.path.join(d, n)
            out[os.path.relpath(p, root)] = os.lstat(p).st_size
    return out


class MooseFS:
    """`backing` copied onto MooseFS (once: a whole copy is kept), started
    with the set-up `a.moosefs_setup`. `mount` is the dataset's directory
    there."""

    def __init__(self, a, backing, name, attach=False):
        """`backing`: a local tree to copy there, or None for an empty directory
        the benchmark fills itself. `attach`: the parent process started it."""
        self.script = SCRIPT
        self.ok, self.why, self.mount = False, "", None
        setup = getattr(a, "moosefs_setup", "default")
        self.setup = setup
        self.flags = ["MooseFS", setup] + (
            ["(%g MB/s disk reads)" % a.moosefs_read_mbps] if setup == "throttled" else [])
        if attach:
            r = subprocess.run([SCRIPT, "status"], capture_output=True, text=True)
        else:
            args = ["start", "--cache-mode", "DIRECT" if setup == "direct" else "AUTO"]
            if setup == "throttled":
                args += ["--read-bps", str(int(a.moosefs_read_mbps * 1e6))]
            r = subprocess.run([SCRIPT] + args, capture_output=True, text=True)
        if r.returncode != 0:
            self.why = "scripts/moosefs.sh %s failed: %s" % (
                "status" if attach else "start", (r.stderr or r.stdout).strip() or "not mounted")
            return
        root = os.path.join(r.stdout.strip().splitlines()[-1], "monarch-bench")
        self.mount = os.path.join(root, name)
        if backing is None:
            os.makedirs(self.mount, exist_ok=True)
        elif not attach and _tree(self.mount) != _tree(backing):
            shutil.rmtree(self.mount, ignore_errors=True)
            os.makedirs(root, exist_ok=True)
            shutil.copytree(backing, self.mount)
        self.ok = True

    def describe(self):
        return {"default": "MooseFS, mfscachemode=AUTO (client page cache on), unthrottled",
                "direct": "MooseFS, mfscachemode=DIRECT (no client cache)",
                "throttled": "MooseFS, mfscachemode=AUTO, chunk server disk reads throttled to "
                             "%s" % " ".join(self.flags[2:])}[self.setup]

    def stats(self):
        r = subprocess.run([SCRIPT, "stats"], capture_output=True, text=True, check=True)
        return json.loads(r.stdout)["counters"]

    def reset(self):
        subprocess.run([SCRIPT, "reset"], capture_output=True, check=True)

    def drop_cache(self):
        subprocess.run([SCRIPT, "drop-cache"], capture_output=True, check=True)

    def pid(self):
        return 0  # The client (mfsmount) is not the benchmark's to watch.

    def stop(self):
        pass  # The file system stays up for the next arm; scripts/moosefs.sh stop ends it.
