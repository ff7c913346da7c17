#!/usr/bin/env python3
"""What announcing an epoch's order costs the DataLoader's main process, which
pays it as each epoch starts: monarch.torch.AnnouncingSampler's iteration
against announce_order() of the epoch's paths (what the sampler did before
it kept the dataset's names), through a node service, in one run.

Both arms announce a fresh shuffle of every sample each time, --reps times
in turns; reported: the median milliseconds per epoch and their ratio.

  MONARCH_C_LIBRARY=build/libmonarch_c.so MONARCH_BINARY=build/monarch PYTHONPATH=python \\
    .venv/bin/python bench/announce_cost.py --build build --files 6000 --reps 15
"""

import argparse
import os
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


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default="build")
    ap.add_argument("--work", default="/tmp/monarch-announce-cost")
    ap.add_argument("--files", type=int, default=6000)
    ap.add_argument("--reps", type=int, default=15)
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
        paths_each_epoch, sampler_times = [], []
        for _ in range(a.reps):
            start = time.perf_counter()
            order = list(iter(shuffle))
            m.announce_order([ds.file_of(i) for i in order])
            paths_each_epoch.append(time.perf_counter() - start)
            start = time.perf_counter()
            list(iter(sampler))
            sampler_times.append(time.perf_counter() - start)
        before = statistics.median(paths_each_epoch) * 1e3
        after = statistics.median(sampler_times) * 1e3
        print(f"{len(names)} samples, {a.reps} epochs each, median ms per epoch's announcement:")
        print(f"  announce_order(paths)   {before:6.2f} ms")
        print(f"  AnnouncingSampler       {after:6.2f} ms  ({after / before:.2f}x)")
    finally:
        m.close()
        monarch_binary = os.environ.get("MONARCH_BINARY", os.path.join(a.build, "monarch"))
        drop_service(monarch_binary, config)


if __name__ == "__main__":
    main()
