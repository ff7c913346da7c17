#!/usr/bin/env python3
"""A PyTorch DataLoader (4 workers) over an ImageNet-like dataset, 3 epochs,
these arms in one run:

  (a) monarch  monarch.torch.FileListDataset, node service (`node: {shared:
               true}`, RAM tier) over the PFS emulator's mount
      announced  the same with AnnouncingSampler over the RandomSampler
      newcomer   the config a new user writes (a RAM tier, no `node:`
               section), the dataset opened from it (`config=`), under a
               plain `shuffle=True` DataLoader: what monarch.torch does by
               default (it shares the node, and announces the order itself)
  (b) pfs      plain open()/read() of the files on the PFS emulator's mount
  (c) local    plain open()/read() of a local copy, pre-read (page cache warm)

Each sample is the file's bytes (the DataLoader's per-sample cost without
decoding, so the ratio is about I/O). Prints each arm's epoch times, the
epoch-1 ratio (a)/(b) and the later epochs' ratio (a)/(c) (target <= 1.05).
With --settle, the Monarch arms wait (untimed) between epochs for the node
to finish writing the copies epoch 1 started, so the later epochs are hits.
With --huge-pages, the RAM tier has `huge_pages: true`, and the run sets
/sys/kernel/mm/transparent_hugepage/shmem_enabled to "advise" (root),
putting back what it was at the end.
With --arms, only the arms named run (for an A/B of two builds, which needs no
PFS arm: `--arms monarch,announced`).
With --interleave, each Monarch arm runs its epochs in turns with epochs of
the local arm (c), which epoch goes first alternating, and its later epochs
are compared with those: the page cache and the machine drift between arms
run one after the other (the local arm's epochs moved by 30% between runs).

  MONARCH_C_LIBRARY=/tmp/b/libmonarch_c.so MONARCH_BINARY=/tmp/b/monarch PYTHONPATH=python \
    .venv/bin/python bench/torch_epochs.py --build /tmp/b --files 2000
"""

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import time

import torch.utils.data

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from service_epochs import add_readahead_flag, drop_service, readahead_flags  # noqa: E402


class PlainFiles(torch.utils.data.Dataset):
    """The baseline: the builtin open() and read()."""

    def __init__(self, root, names):
        self.paths = [os.path.join(root, n) for n in names]

    def __len__(self):
        return len(self.paths)

    def __getitem__(self, i):
        with open(self.paths[i], "rb") as f:
            return len(f.read())


PERSISTENT = False  # --persistent-workers


def image_dataset(build, work, files, profile="imagenet"):
    """The dataset of the DataLoader benchmarks: `files` ImageNet-like files in
    WORK/backing-FILES (what the PFS emulator serves) and a plain copy in
    WORK/copy-FILES, each made once. Returns (backing, copy, names, total bytes).
    With profile "shards", `files` shards of 64 MiB (monarch-epochs --profile
    shards) in WORK/backing-shards-FILES and WORK/copy-shards-FILES."""
    tag = str(files) if profile == "imagenet" else f"{profile}-{files}"
    backing = os.path.join(work, f"backing-{tag}")
    copy = os.path.join(work, f"copy-{tag}")
    os.makedirs(work, exist_ok=True)
    if not os.path.isdir(backing):
        subprocess.run([os.path.join(build, "monarch-epochs"), "--dataset", backing,
                        "--generate", str(files), "--profile", profile, "--epochs", "0"],
                       check=True, stdout=subprocess.DEVNULL)
    if not os.path.isdir(copy):
        shutil.copytree(backing, copy)
    names = sorted(os.path.relpath(os.path.join(d, f), copy)
                   for d, _, fs in os.walk(copy) for f in fs)
    total = sum(os.path.getsize(os.path.join(copy, n)) for n in names)
    return backing, copy, names, total


def start_emulator(build, backing, mount):
    """Starts the PFS emulator serving `backing` at `mount`, its Lustre-like
    read-ahead on, after stopping one an earlier run left there. Returns a
    function that stops it."""
    script = os.path.join(REPO, "tools", "pfs_emulator", "pfs-emulator")
    env = dict(os.environ, MONARCH_PFS_EMULATOR=os.path.join(build, "bin",
                                                             "monarch-pfs-emulator"))
    subprocess.run([script, "stop", mount], capture_output=True, env=env)
    subprocess.run([script, "start", backing, mount, "--lustre-readahead"], check=True, env=env,
                   stdout=subprocess.DEVNULL)
    return lambda: subprocess.run([script, "stop", mount], capture_output=True, env=env)


def loader_for(dataset, workers, generator):
    return torch.utils.data.DataLoader(
        dataset, batch_size=32, shuffle=True, num_workers=workers, generator=generator,
        multiprocessing_context="fork", persistent_workers=PERSISTENT)


def timed_epoch(loader, total_bytes):
    start = time.perf_counter()
    got = sum(int(batch.sum()) for batch in loader)
    assert got == total_bytes, (got, total_bytes)  # every byte of every file, every epoch
    return time.perf_counter() - start


def run_epochs(dataset, epochs, workers, total_bytes, announce=False, between=None,
               alongside=None):
    """Epoch times; `between` runs, untimed, after each epoch but the last.
    With `alongside` (a dataset of the same files), also that dataset's epoch
    times, its epochs in turns with these: (times, alongside_times)."""
    times = []
    generator = torch.Generator().manual_seed(42)
    if announce:
        import monarch.torch as mt
        sampler = mt.AnnouncingSampler(
            torch.utils.data.RandomSampler(dataset, generator=generator), dataset)
        loader = torch.utils.data.DataLoader(
            dataset, batch_size=32, sampler=sampler, num_workers=workers,
            multiprocessing_context="fork", persistent_workers=PERSISTENT)
    else:
        loader = loader_for(dataset, workers, generator)
    other = (loader_for(alongside, workers, torch.Generator().manual_seed(42))
             if alongside is not None else None)
    other_times = []
    for epoch in range(epochs):
        if other is not None and epoch % 2 == 1:
            other_times.append(timed_epoch(other, total_bytes))
        times.append(timed_epoch(loader, total_bytes))
        if other is not None and epoch % 2 == 0:
            other_times.append(timed_epoch(other, total_bytes))
        if between is not None and len(times) < epochs:
            between()
    return (times, other_times) if other is not None else times


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default=os.path.join(REPO, "build"),
                    help="build directory with monarch-epochs, monarch, bin/monarch-pfs-emulator")
    ap.add_argument("--work", default="/tmp/monarch-torch-epochs")
    ap.add_argument("--files", type=int, default=2000)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--meta-latency-us", type=int, default=1000)
    ap.add_argument("--read-latency-us", type=int, default=500)
    ap.add_argument("--bandwidth-mbps", type=int, default=300)
    add_readahead_flag(ap)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--persistent-workers", action="store_true",
                    help="keep the DataLoader's workers across epochs (every arm)")
    ap.add_argument("--interleave", action="store_true",
                    help="run each Monarch arm's epochs in turns with the local arm's and "
                         "compare with those")
    ap.add_argument("--huge-pages", action="store_true",
                    help="the RAM tier with huge_pages: true, shmem_enabled set to advise")
    ap.add_argument("--arms", default="pfs,local,monarch,announced,newcomer",
                    help="the arms to run, comma-separated (an A/B of two builds needs no pfs arm)")
    ap.add_argument("--settle", action="store_true",
                    help="between epochs, wait (untimed) until the node has written the copies "
                         "the epoch started, so later epochs measure hits alone")
    a = ap.parse_args()
    known = {"pfs", "local", "monarch", "announced", "newcomer"}
    unknown = set(a.arms.split(",")) - known
    if unknown:
        ap.error(f"--arms: unknown arm(s) {sorted(unknown)}; expected {', '.join(sorted(known))}")
    global PERSISTENT
    PERSISTENT = a.persistent_workers
    import monarch
    import monarch.torch as mt

    backing, copy, names, total = image_dataset(a.build, a.work, a.files)
    mount = os.path.join(a.work, "pfs")
    for n in names:  # (c) is page-cache warm
        with open(os.path.join(copy, n), "rb") as f:
            f.read()

    script = os.path.join(REPO, "tools", "pfs_emulator", "pfs-emulator")
    env = dict(os.environ, MONARCH_PFS_EMULATOR=os.path.join(a.build, "bin",
                                                             "monarch-pfs-emulator"))
    subprocess.run([script, "stop", mount], capture_output=True, env=env)
    flags = ["--meta-latency-us", str(a.meta_latency_us), "--read-latency-us",
             str(a.read_latency_us), "--bandwidth-mbps", str(a.bandwidth_mbps)]
    flags += readahead_flags(a)
    subprocess.run([script, "start", backing, mount] + flags, check=True, env=env,
                   stdout=subprocess.DEVNULL)
    runtime = os.path.join(a.work, "rt")
    config = os.path.join(a.work, "job.yaml")
    with open(config, "w") as f:
        f.write(f"dataset: {{path: {mount}}}\n"
                f"tiers: [{{kind: ram, capacity: {2 * total}"
                f"{', huge_pages: true' if a.huge_pages else ''}}}, {{kind: source}}]\n"
                f"node: {{shared: true, runtime_dir: {runtime}, idle_exit: 0}}\n")
    newcomer = os.path.join(a.work, "newcomer.yaml")  # No node: section.
    with open(newcomer, "w") as f:
        f.write(f"dataset: {{path: {mount}}}\n"
                f"tiers: [{{kind: ram, capacity: {2 * total}}}, {{kind: source}}]\n")
    results = {arm: [] for arm in ("pfs", "local", "monarch", "announced", "newcomer",
                                   "local|monarch", "local|announced", "local|newcomer")}
    monarch_binary = os.environ.get("MONARCH_BINARY", os.path.join(a.build, "monarch"))

    for leftover in (config, newcomer):  # Copies an earlier run kept: none adopted.
        drop_service(monarch_binary, leftover)

    def through_monarch(announce, newcomers=False):
        subprocess.run([script, "reset", mount], check=True, env=env, stdout=subprocess.DEVNULL)
        if newcomers:  # The dataset opens its own handle, as a new user's would.
            ds = mt.FileListDataset(names, config=newcomer, loader=len)
            m = ds.monarch
        else:
            m = monarch.Monarch(config)  # starts a fresh node service (walks the mount)
            ds = mt.FileListDataset(names, monarch=m, loader=len)
        try:
            times = run_epochs(ds, a.epochs, a.workers, total, announce=announce,
                               between=m.wait_for_placement if a.settle else None,
                               alongside=PlainFiles(copy, names) if a.interleave else None)
            src = m.stats()["tiers"][-1]
            pfs = json.loads(subprocess.run([script, "stats", mount], capture_output=True,
                                            text=True, env=env).stdout)["counters"]
            assert src["bytes_read"] == total, (src, total)  # the source once per file
            print(f"    node source bytes_read {src['bytes_read']} (dataset {total}); "
                  f"PFS emulator bytes_read {pfs.get('bytes_read')}", flush=True)
        finally:
            m.close()
            drop_service(monarch_binary, newcomer if newcomers else config)  # The next starts cold.
        return times

    shmem = "/sys/kernel/mm/transparent_hugepage/shmem_enabled"
    shmem_before = None
    if a.huge_pages:
        with open(shmem) as f:
            shmem_before = f.read().split("[")[1].split("]")[0]
        with open(shmem, "w") as f:
            f.write("advise")
    try:
        print(f"dataset: {len(names)} files, {total / 2**20:.1f} MiB; {a.workers} workers, "
              f"{a.epochs} epochs{', persistent workers' if PERSISTENT else ''}"
              f"{', placement settled between epochs' if a.settle else ''}"
              f"{', RAM tier huge_pages (shmem_enabled advise)' if a.huge_pages else ''}; "
              f"PFS emulator {' '.join(flags)}; load {os.getloadavg()[0]:.2f}",
              flush=True)
        for rep in range(a.reps):
            for arm in a.arms.split(","):
                if arm == "pfs":
                    times = run_epochs(PlainFiles(mount, names), a.epochs, a.workers, total)
                elif arm == "local":
                    times = run_epochs(PlainFiles(copy, names), a.epochs, a.workers, total)
                else:
                    times = through_monarch(announce=(arm == "announced"),
                                            newcomers=(arm == "newcomer"))
                    if a.interleave:
                        times, local_times = times
                        results["local|" + arm].append(local_times)
                        print(f"rep {rep + 1} {'local|' + arm:10s}",
                              " ".join(f"{t:7.3f}s" for t in local_times), flush=True)
                results[arm].append(times)
                print(f"rep {rep + 1} {arm:10s}", " ".join(f"{t:7.3f}s" for t in times),
                      flush=True)
    finally:
        for c in (config, newcomer):
            subprocess.run([monarch_binary, "stop", "--config", c], capture_output=True)
        subprocess.run([script, "stop", mount], capture_output=True, env=env)
        if shmem_before is not None:
            with open(shmem, "w") as f:
                f.write(shmem_before)

    def median_ratio(arm, base, first, last):
        ratios = [sum(x[first:last]) / sum(y[first:last])
                  for x, y in zip(results[arm], results[base])]
        return statistics.median(ratios), min(ratios), max(ratios)

    for arm in ("monarch", "announced", "newcomer"):
        if not results[arm] or not results["pfs"]:
            continue
        med, lo, hi = median_ratio(arm, "pfs", 0, 1)
        print(f"epoch 1: {arm}/pfs = {med:.3f} (min {lo:.3f}, max {hi:.3f})")
    if a.epochs > 1:
        for arm in ("monarch", "announced", "newcomer"):
            local = "local|" + arm if a.interleave else "local"
            if not results[arm] or not results[local]:
                continue
            med, lo, hi = median_ratio(arm, local, 1, a.epochs)
            print(f"epochs 2-{a.epochs}: {arm}/{local} = {med:.3f} (min {lo:.3f}, max {hi:.3f}) "
                  f"(target <= 1.05)")

if __name__ == "__main__":
    sys.exit(main())
