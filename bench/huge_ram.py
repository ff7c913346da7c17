"""node.ram_dir on a tmpfs of 2 MiB pages, for the benchmarks that compare
it with /dev/shm's 4 KiB pages (next_job.py, many_jobs.py, warm_start.py,
dataloader_profile.py, dataloader_pairs.py).

--huge-ram-dir DIR mounts a tmpfs with huge=within_size at DIR (as root,
as a node's administrator would) for the run, unmounts it at the end, and
the benchmark names DIR as node.ram_dir in its configs. Without the flag the
configs keep the default, /dev/shm."""

import contextlib
import os
import subprocess
import sys


def add_huge_ram_flag(ap):
    ap.add_argument("--huge-ram-dir", metavar="DIR", default="",
                    help="mount a tmpfs with huge=within_size at DIR (as root) and name it as "
                         "node.ram_dir in every config: the RAM tier's kept files on 2 MiB pages")


@contextlib.contextmanager
def huge_ram_dir(a):
    """Yields the node: keys to add to a config ('' without the flag)."""
    if not a.huge_ram_dir:
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
