#!/usr/bin/env python3
"""What announcing an epoch's order costs the DataLoader's main process, which
pays it as each epoch starts: monarch.torch.AnnouncingSampler's iteration
against announce_order() of the epoch's paths (what the sampler did before
it kept the dataset's names), through a node service, in one run.

Both arms announce a fresh shuffle of every sample each time, --reps times
in turns; reported: the median milliseconds per epoch and their ratio, and
the sampler's CPU time: the whole process's (every thread's), from the
announcement's start to --idle-ms after it returned, less the idle sleep's
own. Threads an announcement leaves running (an OpenMP team spinning after
a torch operation) count there: on a 2-core node they take a core from the
DataLoader's workers as the epoch starts.

  MONARCH_C_LIBRARY=build/libmonarch_c.so MONARCH_BINARY=build/monarch PYTHONPATH=python \\
    .venv/bin/python bench/announce_cost.py --build build --files 6000 --reps 15
"""

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time

import monarch
import monarch.torch as mt
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from emulated_dataset import imagenet_like  # noqa: E402
from service_epochs import drop_service  # noqa: E402


def process_cpu():
    """User and system seconds of every thread of this process."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default="build")
    ap.add_argument("--work", default="/tmp/monarch-announce-cost")
    ap.add_argument("--files", type=int, default=6000)
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--idle-ms", type=float, default=50,
                    help="how long after each sampler announcement its CPU time is counted")
    a = ap.parse_args()
    dataset = os.path.join(a.work, f"dataset-{a.files}")
    names = imagenet_like(a.build, dataset, a.files)
    config = os.path.join(a.work, "job.yaml")
    with open(config, "w") as f:
        f.write(f"dataset: {{path: {dataset}}}\n"
                f"tiers: [{{kind: ram, capacity: 1GiB}}, {{kind: source}}]\n"
                f"node: {{shared: true, runtime_dir: {a.work}/rt, idle_exit: 0}}\n")
    m = monarch.Monarch(config)  # starts a node service
    try:
        ds = mt.FileListDataset(names, monarch=m)
        generator = torch.Generator().manual_seed(7)
        shuffle = torch.utils.data.RandomSampler(ds, generator=generator)
        sampler = mt.AnnouncingSampler(shuffle, ds)
        paths_each_epoch, sampler_times, sampler_cpu = [], [], []
        idle_cpu = []  # The same window with no announcement: the sleep's own CPU.
        for _ in range(a.reps):
            start = time.perf_counter()
            order = list(iter(shuffle))
            m.announce_order([ds.file_of(i) for i in order])
            paths_each_epoch.append(time.perf_counter() - start)
            time.sleep(a.idle_ms / 1e3)  # Whatever the arm above left running ends.
            cpu = process_cpu()
            start = time.perf_counter()
            list(iter(sampler))
            sampler_times.append(time.perf_counter() - start)
            time.sleep(a.idle_ms / 1e3)
            sampler_cpu.append(process_cpu() - cpu)
            cpu = process_cpu()
            time.sleep(a.idle_ms / 1e3)
            idle_cpu.append(process_cpu() - cpu)
        before = statistics.median(paths_each_epoch) * 1e3
        after = statistics.median(sampler_times) * 1e3
        print(f"{len(names)} samples, {a.reps} epochs each, median ms per epoch's announcement:")
        print(f"  announce_order(paths)   {before:6.2f} ms")
        print(f"  AnnouncingSampler       {after:6.2f} ms  ({after / before:.2f}x)")
        cpu_ms = (statistics.median(sampler_cpu) - statistics.median(idle_cpu)) * 1e3
        print(f"  AnnouncingSampler's CPU time, every thread, to {a.idle_ms:g} ms after it: "
              f"{cpu_ms:6.2f} ms (median; an idle window's {statistics.median(idle_cpu) * 1e3:.2f} "
              f"ms taken off)")
    finally:
        m.close()
        monarch_binary = os.environ.get("MONARCH_BINARY", os.path.join(a.build, "monarch"))
        drop_service(monarch_binary, config)


if __name__ == "__main__":
    main()
