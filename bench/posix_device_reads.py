#!/usr/bin/env python3
"""Fresh DataLoader workers reading a node service's posix tier after the
page cache is dropped, against a local copy: epoch time and device reads.

The paper suite's scenario 3 set-up, cut to what it times: 4 workers forked
fresh each epoch (PyTorch's default), the page cache dropped before every
epoch, and the Monarch arm's copies in a posix tier on the same local disk
as the local copy. A process that opens a copy for the first time reads
its trailer (the block checksums, at its end) and then its bytes; a plain
file is one read. So besides each epoch's time this counts the reads the
disk completed during it (/proc/diskstats), per file.

Arms, in turns each round (the order alternating), after an untimed epoch 1
that makes the copies:
- `local`: the builtin open() and read() of a local copy;
- `monarch`: monarch.torch.FileListDataset over a config with a posix tier
  (125% of the dataset, on local disk) and `node: {shared: true}`.
Each sample is its file's length after reading all of it; every epoch's
byte total is checked.

As root (FUSE, drop_caches). The dataset and its copy are torch_epochs.py's:
    MONARCH_C_LIBRARY=build/libmonarch_c.so MONARCH_BINARY=build/monarch \\
      MONARCH_READ_BYTES_MODULE=build/python/_read_bytes.abi3.so PYTHONPATH=python \\
      .venv/bin/python bench/posix_device_reads.py --files 20000 --rounds 4
"""

import argparse
import json
import os
import shutil
import statistics
import sys
import time

import torch
import torch.utils.data

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from service_epochs import drop_service  # noqa: E402
from torch_epochs import PlainFiles, image_dataset, start_emulator  # noqa: E402
sys.path.insert(0, os.path.join(HERE, "suite"))
from torch_reader import drop_caches  # noqa: E402  (the suite's, as its scenario 3 drops them)


def device_of(path):
    """The /proc/diskstats name of the whole disk holding `path`."""
    dev = os.stat(path).st_dev
    name = os.path.basename(os.path.realpath(f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}"))
    parent = os.path.realpath(f"/sys/class/block/{name}/..")
    return os.path.basename(parent) if os.path.exists(f"{parent}/stat") else name


def disk_reads(device):
    """Reads completed and bytes read so far by `device`."""
    with open("/proc/diskstats") as f:
        for line in f:
            fields = line.split()
            if fields[2] == device:
                return int(fields[3]), int(fields[5]) * 512
    sys.exit(f"no {device} in /proc/diskstats")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default=os.path.join(REPO, "build"))
    ap.add_argument("--work", default="/tmp/monarch-torch-epochs")
    ap.add_argument("--tier", default="/var/tmp/monarch-posix-device-reads",
                    help="the posix tier's directory (local disk)")
    ap.add_argument("--files", type=int, default=20000)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--out", help="a JSON file for the figures")
    a = ap.parse_args()
    import monarch.torch as mt

    backing, copy, names, total = image_dataset(a.build, a.work, a.files)
    mount = os.path.join(a.work, "pfs")
    stop_emulator = start_emulator(a.build, backing, mount)
    shutil.rmtree(a.tier, ignore_errors=True)
    os.makedirs(a.tier)
    device = device_of(a.tier)
    if device != device_of(copy):
        sys.exit(f"the tier ({device}) and the local copy ({device_of(copy)}) are on "
                 "different disks: their device reads would not compare")
    config = os.path.join(a.work, "posix-device-reads.yaml")
    with open(config, "w") as f:
        f.write(f"dataset: {{path: {mount}}}\n"
                f"tiers:\n  - {{name: local, kind: posix, path: {a.tier}, "
                f"capacity: {int(total * 1.25)}}}\n  - {{kind: source}}\n"
                "node: {shared: true}\n")
    binary = os.environ.get("MONARCH_BINARY", os.path.join(a.build, "monarch"))
    drop_service(binary, config)

    def epoch(dataset):
        loader = torch.utils.data.DataLoader(dataset, batch_size=32, shuffle=True,
                                             num_workers=a.workers,
                                             multiprocessing_context="fork")
        drop_caches()
        reads, read_bytes = disk_reads(device)
        start = time.perf_counter()
        got = sum(int(batch.sum()) for batch in loader)
        seconds = time.perf_counter() - start
        after_reads, after_bytes = disk_reads(device)
        assert got == total, (got, total)  # every byte of every file
        return {"seconds": seconds, "device_reads": after_reads - reads,
                "device_bytes": after_bytes - read_bytes}

    rows = {"local": [], "monarch": []}
    try:
        load = os.getloadavg()[0]
        ds = mt.FileListDataset(names, config=config, loader=len)
        first = epoch(ds)
        ds.monarch.wait_for_placement()
        tier = ds.monarch.stats()["tiers"][0]
        assert tier["files"] == len(names), tier  # every file copied in epoch 1
        local = PlainFiles(copy, names)
        for r in range(a.rounds):
            for arm in (("local", "monarch") if r % 2 == 0 else ("monarch", "local")):
                rows[arm].append(epoch(local if arm == "local" else ds))
            m, p = rows["monarch"][-1], rows["local"][-1]
            print(f"round {r + 1}  monarch {m['seconds']:.2f} s, {m['device_reads']} device "
                  f"reads  |  local {p['seconds']:.2f} s, {p['device_reads']} device reads",
                  flush=True)
        ds.monarch.close()
    finally:
        drop_service(binary, config)
        stop_emulator()
        shutil.rmtree(a.tier, ignore_errors=True)

    ratios = [m["seconds"] / p["seconds"] for m, p in zip(rows["monarch"], rows["local"])]
    per_file = {arm: statistics.median(r["device_reads"] for r in rows[arm]) / len(names)
                for arm in rows}
    print(f"{len(names)} files, {total / 2**20:.1f} MiB, {a.workers} fresh workers per epoch, "
          f"page cache dropped before each epoch; load {load:.2f} at the start; epoch 1 "
          f"{first['seconds']:.2f} s")
    print(f"device reads per file, median of {a.rounds} epochs: monarch "
          f"{per_file['monarch']:.2f}, local {per_file['local']:.2f}")
    print(f"epoch time, monarch / local, median of {a.rounds} rounds: "
          f"{statistics.median(ratios):.3f} (min {min(ratios):.3f}, max {max(ratios):.3f})")
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"files": len(names), "bytes": total, "workers": a.workers, "load": load,
                       "epoch1": first, "rows": rows, "ratios": ratios,
                       "device_reads_per_file": per_file}, f, indent=1)


if __name__ == "__main__":
    main()
