#!/usr/bin/env python3
"""What one sample costs a DataLoader worker: Monarch.read() of a RAM-tier hit
through the compiled path (monarch._read_bytes) and through ctypes, against
the builtin open().read() of a page-cached local copy, in one run.

Each arm reads every file of an ImageNet-like dataset once, in a shuffled
order, in a freshly forked process (as a DataLoader worker started for the
epoch does: the RAM tier's pages are not mapped in it yet), and then twice
more in the same process (a persistent worker's later epochs: a client's
second read of a copy maps its pages, the third finds them mapped). Arms run
in turns, --reps times; reported: the median microseconds per file of each
pass, and each Monarch arm over the plain read.

  MONARCH_C_LIBRARY=build/libmonarch_c.so MONARCH_BINARY=build/monarch PYTHONPATH=python \\
    MONARCH_READ_BYTES_MODULE=build/python/_read_bytes.abi3.so \\
    .venv/bin/python bench/python_read_path.py --build build --files 6000 --reps 7
"""

import argparse
import os
import random
import shutil
import statistics
import subprocess
import sys
import time

import monarch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from emulated_dataset import imagenet_like  # noqa: E402
from service_epochs import drop_service  # noqa: E402


PASSES = ("fresh process", "second pass", "third pass")


def per_file_us(read_all, count):
    """Microseconds per file of each pass (PASSES) of read_all() in a fresh child."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        times = []
        for _ in PASSES:
            start = time.perf_counter()
            read_all()
            times.append((time.perf_counter() - start) / count * 1e6)
        os.write(w, " ".join(map(str, times)).encode())
        os._exit(0)
    os.close(w)
    with os.fdopen(r) as f:
        times = [float(t) for t in f.read().split()]
    os.waitpid(pid, 0)
    return times


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default="build")
    ap.add_argument("--work", default="/var/tmp/monarch-python-read-path")
    ap.add_argument("--files", type=int, default=6000)
    ap.add_argument("--reps", type=int, default=7)
    a = ap.parse_args()
    if monarch._read_bytes_module() is None:
        sys.exit("monarch._read_bytes did not load: set MONARCH_READ_BYTES_MODULE "
                 "(build/python/_read_bytes.abi3.so) or install the package")
    dataset = os.path.join(a.work, f"ds-{a.files}")
    names = imagenet_like(a.build, dataset, a.files)
    random.Random(7).shuffle(names)
    paths = [os.path.join(dataset, n) for n in names]
    runtime = os.path.join(a.work, "rt")
    config = os.path.join(a.work, "job.yaml")
    with open(config, "w") as f:
        f.write(f"dataset: {{path: {dataset}}}\n"
                "tiers: [{kind: ram, capacity: 4GiB}, {kind: source}]\n"
                f"node: {{shared: true, runtime_dir: {runtime}, idle_exit: 0}}\n")
    binary = os.environ.get("MONARCH_BINARY", os.path.join(a.build, "monarch"))
    m = monarch.Monarch(config)
    try:
        m.stage(names, progress=False)  # every file a RAM-tier hit
        for p in paths:  # the plain arm's page cache warm
            with open(p, "rb") as f:
                f.read()
        # read() looks _read_bytes_module up among its own module's globals.
        read_globals = monarch.Monarch.read.__globals__
        compiled = read_globals["_read_bytes_module"]

        def plain():
            for p in paths:
                with open(p, "rb") as f:
                    f.read()

        def through(path_module):
            def read_all():
                read_globals["_read_bytes_module"] = path_module
                for n in names:
                    m.read(n)
            return read_all

        arms = {"plain open().read()": plain,
                "Monarch.read, compiled": through(compiled),
                "Monarch.read, ctypes": through(lambda: None)}
        results = {arm: [] for arm in arms}
        for _ in range(a.reps):
            for arm, fn in arms.items():
                results[arm].append(per_file_us(fn, len(names)))
        read_globals["_read_bytes_module"] = compiled
    finally:
        m.close()
        drop_service(binary, config)

    base = results["plain open().read()"]
    print(f"{len(names)} files, {sum(os.path.getsize(p) for p in paths) / 2**20:.1f} MiB; "
          f"{a.reps} reps; load {os.getloadavg()[0]:.2f}")
    print("| arm | " + " | ".join(f"{p} (us/file)" for p in PASSES) + " | " +
          " | ".join(f"{p} / plain" for p in PASSES) + " |")
    print("|---" * (1 + 2 * len(PASSES)) + "|")
    for arm, runs in results.items():
        us = [statistics.median(r[i] for r in runs) for i in range(len(PASSES))]
        ratios = [statistics.median(r[i] / b[i] for r, b in zip(runs, base))
                  for i in range(len(PASSES))]
        print(f"| {arm} | " + " | ".join(f"{u:.2f}" for u in us) + " | " +
              " | ".join(f"{x:.3f}" for x in ratios) + " |")
    shutil.rmtree(runtime, ignore_errors=True)


if __name__ == "__main__":
    main()
