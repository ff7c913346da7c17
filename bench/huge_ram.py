"""node.ram_dir for the benchmarks that compare the RAM tier's page sizes
(next_job.py, many_jobs.py, warm_start.py, dataloader_profile.py,
dataloader_pairs.py).

Without a flag the configs keep the default, `auto`: outside a batch job a
private tmpfs of 2 MiB pages held by a keeper process
(src/service/ram_keeper.h), else /dev/shm.
--ram-dir DIR names DIR (an existing tmpfs, e.g. /dev/shm for its 4 KiB
pages) as node.ram_dir in every config.
--huge-ram-dir DIR mounts a tmpfs with huge=within_size at DIR (as root,
as a node's administrator would) for the run, unmounts it at the end, and
names DIR as node.ram_dir."""

import contextlib
import os
import subprocess
import sys


def add_huge_ram_flag(ap):
    ap.add_argument("--huge-ram-dir", metavar="DIR", default="",
                    help="mount a tmpfs with huge=within_size at DIR (as root) and name it as "
                         "node.ram_dir in every config: the RAM tier's kept files on 2 MiB pages")
    ap.add_argument("--ram-dir", metavar="DIR", default="",
                    help="name DIR (an existing tmpfs, e.g. /dev/shm) as node.ram_dir in every "
                         "config; default: node.ram_dir's own, auto")


def ram_dir_label(a):
    """What the run's configs say node.ram_dir is, for the figures."""
    return a.huge_ram_dir or a.ram_dir or "auto"


@contextlib.contextmanager
def huge_ram_dir(a):
    """Yields the node: keys to add to a config ('' without a flag)."""
    if a.ram_dir and a.huge_ram_dir:
        sys.exit("--ram-dir and --huge-ram-dir: one or the other")
    if a.ram_dir:
        print("node.ram_dir: %s" % a.ram_dir, flush=True)
        yield "ram_dir: %s" % a.ram_dir
        return
    if not a.huge_ram_dir:
        print("node.ram_dir: auto (the default)", flush=True)
        yield ""
        return
    os.makedirs(a.huge_ram_dir, exist_ok=True)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "huge=within_size,mode=1777",
                        "monarch-huge-ram", a.huge_ram_dir], capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit("--huge-ram-dir: cannot mount a tmpfs at %s: %s" % (a.huge_ram_dir,
                                                                     r.stderr.strip()))
    try:
        print("node.ram_dir: %s, a tmpfs mounted huge=within_size" % a.huge_ram_dir, flush=True)
        yield "ram_dir: %s" % a.huge_ram_dir
    finally:
        subprocess.run(["umount", "-l", a.huge_ram_dir], check=False)
