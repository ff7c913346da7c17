#!/usr/bin/env python3
"""h5py reading random rows of a big HDF5 file through the transparent mode
(LD_PRELOAD=libmonarch_preload.so), against the same program without it, in
one run (issue 30). The file (--gib GiB: one contiguous uint8 dataset of
--row-kib KiB rows) sits behind the PFS emulator.

Each epoch, --procs processes (as DataLoader workers) each open the file with
h5py and read their share of the rows (every procs-th row of a permutation
seeded by the epoch) one row at a time. Arms, in turns:

  plain    no preload: h5py's reads go to the emulator
  extents  the preload, a node service with a RAM tier of --tier-gib GiB,
           placement.extent_bytes --extent-kib KiB (the file is cached by
           extents, each promoted on its first read)
  whole    the same service caching whole files (placement.extent_bytes 0):
           the file's first read starts a promotion of all of it

Every arm's service starts empty (a new job), and epochs follow each other
without waiting for placement, as a training job's do. Per epoch: the
slowest process's time (h5py open to last row), and the bytes and reads the
emulator served. Each process hashes the rows it read (CRC-32, in order),
and every arm must hash as plain does.

usage: python3 bench/h5py_preload.py [--build build] [--gib 4] [--repeat 2]
       [--out bench/results/h5py_preload]
Needs root (drops the page cache), FUSE, and h5py in --python's environment.
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from preload_mmap import drop_caches  # noqa: E402
from service_epochs import Pfs, add_emulator_flags, start_service, stop_service  # noqa: E402

REPO = os.path.dirname(HERE)
MIB = 1 << 20

WORKER = r"""
import random, sys, time, zlib
t0 = time.monotonic()
import h5py
path, epoch, part, parts = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
with h5py.File(path, "r") as f:
    rows = f["rows"]
    order = list(range(rows.shape[0]))
    random.Random(1000 + epoch).shuffle(order)
    crc = 0
    for r in order[part::parts]:
        crc = zlib.crc32(rows[r].tobytes(), crc)
print("done %.6f %08x" % (time.monotonic() - t0, crc), flush=True)
"""

MAKE = r"""
import sys
import h5py, numpy as np
path, rows, row_bytes = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rng = np.random.default_rng(30)
with h5py.File(path, "w") as f:
    d = f.create_dataset("rows", shape=(rows, row_bytes), dtype=np.uint8)  # contiguous
    step = max(1, (64 << 20) // row_bytes)
    for r in range(0, rows, step):
        n = min(step, rows - r)
        d[r:r + n] = rng.integers(0, 256, size=(n, row_bytes), dtype=np.uint8)
"""


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--build", default=os.path.join(REPO, "build"))
    p.add_argument("--work", default="/var/tmp/monarch-h5py-bench")
    p.add_argument("--python", default=os.path.join(REPO, ".venv", "bin", "python"))
    p.add_argument("--gib", type=int, default=4)
    p.add_argument("--row-kib", type=int, default=256)
    p.add_argument("--procs", type=int, default=2)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--repeat", type=int, default=2)
    p.add_argument("--extent-kib", type=int, default=4096)
    p.add_argument("--tier-gib", type=int, default=0, help="RAM tier (default: --gib + 1)")
    p.add_argument("--arms", default="plain,extents,whole")
    add_emulator_flags(p)
    p.add_argument("--out", default=os.path.join(HERE, "results", "h5py_preload"))
    a = p.parse_args()
    a.build = os.path.abspath(a.build)
    tier_gib = a.tier_gib or a.gib + 1
    preload = os.path.join(a.build, "integrations", "preload", "libmonarch_preload.so")
    for path in (preload, os.path.join(a.build, "monarch"), a.python):
        if not os.path.exists(path):
            sys.exit("missing %s" % path)

    backing = os.path.join(a.work, "backing")
    os.makedirs(backing, exist_ok=True)
    row_bytes = a.row_kib << 10
    rows = (a.gib << 30) // row_bytes
    h5 = os.path.join(backing, "rows.h5")
    stamp = h5 + ".shape"
    shape = "%d %d" % (rows, row_bytes)
    if not (os.path.exists(stamp) and open(stamp).read() == shape):
        print("writing %s (%d rows of %d bytes)" % (h5, rows, row_bytes), flush=True)
        subprocess.run([a.python, "-c", MAKE, h5, str(rows), str(row_bytes)], check=True)
        open(stamp, "w").write(shape)
    file_bytes = os.path.getsize(h5)

    pfs = Pfs(a, backing, os.path.join(a.work, "pfs"))
    if not pfs.ok:
        sys.exit("PFS emulator unavailable: " + pfs.why)
    path = os.path.join(pfs.mount, "rows.h5")
    plain = dict(os.environ, OMP_NUM_THREADS="1")
    plain.pop("LD_PRELOAD", None)
    configs = {}
    for arm, extent in (("extents", a.extent_kib << 10), ("whole", 0)):
        runtime = os.path.join(a.work, "rt-" + arm)
        shutil.rmtree(runtime, ignore_errors=True)
        configs[arm] = os.path.join(a.work, arm + ".yaml")
        with open(configs[arm], "w") as f:
            f.write("dataset:\n  path: %s\ntiers:\n  - {kind: ram, capacity: %dGiB}\n"
                    "  - {kind: source}\nplacement: {extent_bytes: %d, extent_threshold: 64MiB}\n"
                    "node:\n  shared: true\n  runtime_dir: %s\n  autostart: false\n"
                    "  idle_exit: 0\n" % (pfs.mount, tier_gib, extent, runtime))
    arms = [arm for arm in a.arms.split(",")]
    results = {arm: [] for arm in arms}
    load_before = os.getloadavg()[0]
    try:
        for rep in range(a.repeat):
            order = arms[rep % len(arms):] + arms[:rep % len(arms)]
            for arm in order:
                env = plain if arm == "plain" else dict(plain, LD_PRELOAD=preload,
                                                        MONARCH_CONFIG=configs[arm])
                service = start_service(a, configs[arm], a.work) if arm != "plain" else None
                drop_caches()
                run = []
                for epoch in range(1, a.epochs + 1):
                    pfs.reset()
                    started = time.monotonic()
                    workers = [subprocess.Popen(
                        [a.python, "-c", WORKER, path, str(epoch), str(k), str(a.procs)],
                        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                        for k in range(a.procs)]
                    outs = [w.communicate() for w in workers]
                    wall = time.monotonic() - started
                    for w, (out, err) in zip(workers, outs):
                        if w.returncode != 0 or not out.startswith("done"):
                            sys.exit("%s epoch %d: a worker failed (exit %d):\n%s%s" % (
                                arm, epoch, w.returncode, out, err))
                    c = pfs.stats()
                    run.append({"epoch": epoch, "wall_s": wall,
                                "worker_s": [float(o.split()[1]) for o, _ in outs],
                                "crcs": [o.split()[2] for o, _ in outs],
                                "source_bytes": c.get("bytes_read", 0),
                                "source_reads": c.get("reads", 0)})
                    print("rep %d %-8s epoch %d: %7.2f s, source %8.1f MiB in %d reads" % (
                        rep + 1, arm, epoch, wall, run[-1]["source_bytes"] / MIB,
                        run[-1]["source_reads"]), flush=True)
                if service:
                    stop_service(a, configs[arm], *service)
                results[arm].append(run)
            for arm in arms:
                for e in range(a.epochs):
                    if results[arm][-1][e]["crcs"] != results[arms[0]][-1][e]["crcs"]:
                        sys.exit("epoch %d: %s read other bytes than %s" % (e + 1, arm, arms[0]))
    finally:
        pfs.stop()

    commit = subprocess.run(["git", "-C", REPO, "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip()
    command = "python3 bench/h5py_preload.py " + " ".join(sys.argv[1:])
    rows_out = []
    for arm in arms:
        for e in range(a.epochs):
            walls = [r[e]["wall_s"] for r in results[arm]]
            ratios = ([r[e]["wall_s"] / b[e]["wall_s"]
                       for r, b in zip(results[arm], results["plain"])]
                      if "plain" in results else [float("nan")])
            rows_out.append({"arm": arm, "epoch": e + 1, "wall_s": statistics.median(walls),
                             "wall_min": min(walls), "wall_max": max(walls),
                             "vs_plain": statistics.median(ratios),
                             "source_vs_file": statistics.median(
                                 r[e]["source_bytes"] for r in results[arm]) / file_bytes,
                             "source_reads": statistics.median(
                                 r[e]["source_reads"] for r in results[arm])})
    with open(a.out + ".json", "w") as f:
        json.dump({"commit": commit, "command": command, "file_bytes": file_bytes,
                   "rows": rows, "row_bytes": row_bytes, "procs": a.procs,
                   "repeat": a.repeat, "emulator": pfs.flags, "load_before": load_before,
                   "load_after": os.getloadavg()[0], "table": rows_out, "runs": results},
                  f, indent=1)
    lines = ["# h5py reading random rows through the preload", "",
             "Command: `%s`, at %s; load average %.1f before, %.1f after." % (
                 command, commit, load_before, os.getloadavg()[0]), "",
             "One HDF5 file of %s bytes (a contiguous uint8 dataset of %d rows of %d KiB) "
             "behind the PFS emulator (`%s`). Per epoch, %d processes open it with h5py and "
             "read their share of a seeded random permutation of the rows, one row at a "
             "time; every arm's rows hash as plain's. `extents`: the preload, a node service "
             "with a %d GiB RAM tier and extents of %d KiB; `whole`: the same caching whole "
             "files. Medians of %d runs (min-max), arms in turns; epochs not waiting for "
             "placement." % ("{:,}".format(file_bytes), rows, a.row_kib, " ".join(pfs.flags),
                             a.procs, tier_gib, a.extent_kib, a.repeat), "",
             "| arm | epoch | seconds (min-max) | vs plain | source bytes / file | source reads |",
             "|---|---|---|---|---|---|"]
    for r in rows_out:
        lines.append("| %s | %d | %.2f (%.2f-%.2f) | %.3f | %.3f | %d |" % (
            r["arm"], r["epoch"], r["wall_s"], r["wall_min"], r["wall_max"], r["vs_plain"],
            r["source_vs_file"], r["source_reads"]))
    lines.append("")
    with open(a.out + ".md", "w") as f:
        f.write("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())
