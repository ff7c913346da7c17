#!/usr/bin/env python3
"""Start-up of a job on a node: a walk of the dataset against the namespace
kept on the node by an earlier start (dataset.keep_namespace).

A dataset of --files small files in --dirs directories sits behind the PFS
emulator (1 ms per metadata operation, 8 at once: its Lustre-like
defaults). Each arm opens Monarch in process (a RAM tier over the mount)
and times Monarch(config) to its return, the namespace built, reading
nothing; the emulator's metadata operations are counted for the same span.

  walk   dataset.keep_namespace: false: every start walks
  kept   the default: one untimed start walks and keeps the namespace, the
         timed ones build from it (every directory and 64 files checked)

The arms run in turns, --reps times each; prints each start and the
medians, and kept/walk.

  sudo MONARCH_C_LIBRARY=build/libmonarch_c.so PYTHONPATH=python \\
    .venv/bin/python bench/startup.py --build build --files 20000
"""

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from service_epochs import Pfs, add_emulator_flags  # noqa: E402


def generate(backing, files, dirs):
    """--files files of 2 KiB in --dirs directories (once), the directories
    an hour old."""
    done = os.path.join(backing, ".complete")
    if os.path.exists(done):
        return
    shutil.rmtree(backing, ignore_errors=True)
    for d in range(dirs):
        os.makedirs(os.path.join(backing, "train", f"d{d:04d}"))
    block = os.urandom(2048)
    for i in range(files):
        with open(os.path.join(backing, "train", f"d{i % dirs:04d}", f"f{i:07d}.bin"), "wb") as f:
            f.write(block)
    open(done, "w").close()
    # An hour old, as a dataset is: a walk right after a directory changed
    # is not kept (a change later in the same second could go unseen).
    old = time.time() - 3600
    for d, _, _ in os.walk(backing):
        os.utime(d, (old, old))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default="build")
    ap.add_argument("--dir", default="/var/tmp/monarch-startup")
    ap.add_argument("--files", type=int, default=20000)
    ap.add_argument("--dirs", type=int, default=100)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--arms", default="walk,kept",
                    help="the timed arms; `kept` alone still walks once, untimed, to keep the "
                         "namespace (at a million files a walk takes minutes)")
    add_emulator_flags(ap)
    a = ap.parse_args()
    import monarch

    backing = os.path.join(a.dir, f"backing-{a.files}-{a.dirs}")
    mount = os.path.join(a.dir, "pfs")
    generate(backing, a.files, a.dirs)
    pfs = Pfs(a, backing, mount)
    if not pfs.ok:
        sys.exit("PFS emulator unavailable: " + pfs.why)
    # The kept namespaces of this run only.
    os.environ["XDG_RUNTIME_DIR"] = tempfile.mkdtemp(prefix="mstart", dir="/tmp")
    configs = {}
    for arm, keep in (("walk", "false"), ("kept", "true")):
        configs[arm] = (f"dataset: {{path: {mount}, keep_namespace: {keep}}}\n"
                        "tiers: [{kind: ram, capacity: 1GiB}, {kind: source}]\n")

    def start(arm):
        pfs.reset()
        began = time.perf_counter()
        m = monarch.Monarch(configs[arm])
        seconds = time.perf_counter() - began
        stats = m.stats()
        m.close()
        return seconds, pfs.stats().get("metadata_ops", 0), stats["namespace_built_from_manifest"]

    try:
        print(f"dataset: {a.files} files in {a.dirs} directories; PFS emulator "
              f"{' '.join(pfs.flags)}; load {os.getloadavg()[0]:.2f}", flush=True)
        began = time.perf_counter()
        start("kept")  # Walks and keeps the namespace (untimed in the table).
        print(f"the first start (a walk, kept): {time.perf_counter() - began:.1f} s", flush=True)
        results = {"walk": [], "kept": []}
        for rep in range(a.reps):
            for arm in ("walk", "kept") if rep % 2 == 0 else ("kept", "walk"):
                if arm not in a.arms.split(","):
                    continue
                seconds, ops, from_manifest = start(arm)
                assert from_manifest == (1 if arm == "kept" else 0), (arm, from_manifest)
                results[arm].append((seconds, ops))
                print(f"rep {rep + 1} {arm}: {seconds:.3f} s, {ops} metadata operations", flush=True)
        results = {arm: r for arm, r in results.items() if r}
        med = {arm: statistics.median(s for s, _ in r) for arm, r in results.items()}
        ops = {arm: statistics.median(o for _, o in r) for arm, r in results.items()}
        for arm in results:
            lo = min(s for s, _ in results[arm])
            hi = max(s for s, _ in results[arm])
            print(f"{arm}: median {med[arm]:.3f} s (min {lo:.3f}, max {hi:.3f}), "
                  f"{ops[arm]:.0f} metadata operations")
        if "walk" in med and "kept" in med:
            print(f"kept/walk: {med['kept'] / med['walk']:.3f} in time, "
                  f"{ops['kept'] / max(ops['walk'], 1):.4f} in metadata operations")
    finally:
        pfs.stop()
        shutil.rmtree(os.environ["XDG_RUNTIME_DIR"], ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
