#!/usr/bin/env python3
"""One PyTorch DataLoader job (several worker processes), timed epoch by
epoch: the multi-process setups (scenario 3) of bench/suite/run_suite.py. Run
by the suite under <repo>/.venv/bin/python, one process per setup, with
PYTHONPATH=<repo>/python, MONARCH_C_LIBRARY and MONARCH_BINARY pointing at
the build.

Setups (the directory given by --data decides PFS or local copy):
  mp-pfs / mp-local      plain open()/read() (imagenet) or os.pread() on a
                         descriptor each worker keeps per shard (shards)
  mp-monarch             monarch.torch.FileListDataset (imagenet) or
                         Monarch.read(path, offset, size) (shards) with a
                         config of `node: {shared: true}`: every worker is a
                         client of the one node service
  mp-monarch-announced   the same with monarch.torch.AnnouncingSampler
                         around the DataLoader's RandomSampler

Samples: imagenet, one whole file each; shards, one --read-size record each
(a map-style dataset over an index of fixed-size records). The DataLoader
shuffles with RandomSampler and a torch.Generator seeded with --seed, so
every setup reads the same order. Each sample's worker returns (index,
zlib.crc32 of its bytes, length); the main process checks every one against
--manifest (made by the suite from the generated dataset itself, before any
setup ran) and that each sample came exactly once per epoch: an arm that
returns wrong bytes, or misses a sample, fails.

Start-up (before epoch 1) is the listing: os.walk of --data for the plain
setups, the service's namespace (Monarch.walk) for Monarch, which starts the
node service (and its walk of the PFS) on the first open.

Epoch boundaries: the same handshake as tf_reader.py (one byte to
MONARCH_SUITE_HOOK_REQ_FD, wait for one on MONARCH_SUITE_HOOK_ACK_FD) so the
suite reads and resets the PFS emulator's counters exactly; then the page
cache is dropped (--drop-caches) and the epoch is timed. For Monarch, the
untimed wait for background placement after each epoch (settle_seconds) is
inside that epoch's phase, as for the other Monarch setups.

Writes a JSON list of epochs to --json in the shape monarch-epochs writes
(seconds, bytes, served per tier for Monarch) plus settle_seconds, samples
and verified.
"""

import argparse
import json
import os
import subprocess
import sys
import time
import zlib

import torch
import torch.utils.data


def boundary():
    req = os.environ.get("MONARCH_SUITE_HOOK_REQ_FD")
    ack = os.environ.get("MONARCH_SUITE_HOOK_ACK_FD")
    if req is None or ack is None:
        return
    os.sync()
    os.write(int(req), b"s")
    os.read(int(ack), 1)


def drop_caches():
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def checked(index, data):
    return torch.tensor([index, zlib.crc32(data), len(data)], dtype=torch.int64)


class PlainRecords(torch.utils.data.Dataset):
    """The baseline: the builtin open()/read() per file, or os.pread() on a
    descriptor the worker keeps open per shard."""

    def __init__(self, root, records, whole_files):
        self.root, self.records, self.whole = root, records, whole_files
        self.fds = {}

    def __len__(self):
        return len(self.records)

    def file_of(self, i):
        return os.path.join(self.root, self.records[i][0])

    def __getitem__(self, i):
        rel, offset, length, _ = self.records[i]
        if self.whole:
            with open(os.path.join(self.root, rel), "rb") as f:
                return checked(i, f.read())
        fd = self.fds.get(rel)
        if fd is None:
            fd = self.fds[rel] = os.open(os.path.join(self.root, rel), os.O_RDONLY)
        return checked(i, os.pread(fd, length, offset))


def monarch_dataset(records, monarch, whole_files):
    import monarch.torch as mt

    if whole_files:
        class Files(mt.FileListDataset):
            def __getitem__(self, i):
                return checked(i, super().__getitem__(i))
        return Files([r[0] for r in records], monarch=monarch)

    class Records(torch.utils.data.Dataset):
        def __init__(self):
            self.monarch, self.records = monarch, records

        def __len__(self):
            return len(self.records)

        def file_of(self, i):
            return self.records[i][0]

        def __getitem__(self, i):
            rel, offset, length, _ = self.records[i]
            return checked(i, self.monarch.read(rel, offset, length))
    return Records()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--setup", required=True,
                    choices=["mp-pfs", "mp-local", "mp-monarch", "mp-monarch-announced"])
    ap.add_argument("--data", required=True, help="dataset directory (PFS path or local copy)")
    ap.add_argument("--manifest", required=True,
                    help="JSON [[relative path, offset, length, crc32], ...], one per sample")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--config", default=None, help="Monarch YAML with node: {shared: true}")
    ap.add_argument("--monarch-binary", default=None, help="to stop the node service at the end")
    ap.add_argument("--drop-caches", action="store_true")
    ap.add_argument("--json", required=True)
    a = ap.parse_args()

    with open(a.manifest) as f:
        records = [tuple(r) for r in json.load(f)]
    whole = all(r[1] == 0 for r in records) and len({r[0] for r in records}) == len(records)
    root = os.path.abspath(a.data)
    m = None
    if a.setup.startswith("mp-monarch"):
        import monarch
        m = monarch.Monarch(a.config)  # a client: starts the node service (its walk)
        listed = {os.path.join(d, f) for d, _, fs in m.walk() for f in fs}
        dataset = monarch_dataset(records, m, whole)
    else:
        listed = {os.path.relpath(os.path.join(d, f), root)
                  for d, _, fs in os.walk(root) for f in fs}
        dataset = PlainRecords(root, records, whole)
    missing = {r[0] for r in records} - listed
    if missing:
        sys.exit(f"torch_reader: {len(missing)} files of the manifest are not listed under "
                 f"{root}, e.g. {sorted(missing)[0]}")
    print(f"{a.setup}: {len(records)} samples in {len(listed)} files under {root}", flush=True)

    generator = torch.Generator().manual_seed(a.seed)
    sampler = torch.utils.data.RandomSampler(dataset, generator=generator)
    if a.setup == "mp-monarch-announced":
        import monarch.torch as mt
        sampler = mt.AnnouncingSampler(sampler, dataset)
    loader = torch.utils.data.DataLoader(dataset, batch_size=a.batch_size, sampler=sampler,
                                         num_workers=a.workers, multiprocessing_context="fork")
    crc = torch.tensor([r[3] for r in records], dtype=torch.int64)
    length = torch.tensor([r[2] for r in records], dtype=torch.int64)
    expected_bytes = int(length.sum())

    def tier_totals():
        return {t["name"]: (t["reads"], t["bytes_read"]) for t in m.stats()["tiers"]}

    previous = tier_totals() if m else None
    epochs = []
    try:
        for epoch in range(1, a.epochs + 1):
            boundary()
            if a.drop_caches:
                drop_caches()
            seen = torch.zeros(len(records), dtype=torch.int64)
            total = 0
            start = time.perf_counter()
            for batch in loader:
                idx = batch[:, 0]
                bad = (batch[:, 1] != crc[idx]) | (batch[:, 2] != length[idx])
                if bool(bad.any()):
                    i = int(idx[bad][0])
                    sys.exit(f"torch_reader: {a.setup} epoch {epoch}: sample {i} "
                             f"({records[i][0]} at {records[i][1]}) has wrong bytes: "
                             f"crc32 {int(batch[bad][0, 1]):08x}, {int(batch[bad][0, 2])} bytes; "
                             f"expected {records[i][3]:08x}, {records[i][2]} bytes")
                seen.index_add_(0, idx, torch.ones_like(idx))
                total += int(batch[:, 2].sum())
            seconds = time.perf_counter() - start
            if not bool((seen == 1).all()) or total != expected_bytes:
                sys.exit(f"torch_reader: {a.setup} epoch {epoch}: "
                         f"{int((seen == 0).sum())} samples missing, "
                         f"{int((seen > 1).sum())} repeated; {total} bytes, expected "
                         f"{expected_bytes}")
            result = {"epoch": epoch, "seconds": seconds, "bytes": total,
                      "samples": len(records), "verified": True}
            if m:
                from monarch import _fast_read
                result["compiled_read"] = _fast_read._read_bytes_module() is not None
                now = tier_totals()
                result["served"] = {name: {"reads": now[name][0] - previous[name][0],
                                           "bytes": now[name][1] - previous[name][1]}
                                    for name in now}
                settle_start = time.perf_counter()
                m.wait_for_placement()
                result["settle_seconds"] = time.perf_counter() - settle_start
                previous = tier_totals()
            print(f"epoch {epoch}: {seconds:.3f} s, {total / 2**20:.1f} MiB, "
                  f"{len(records)} samples checked"
                  + (f", served {result['served']}" if m else ""), flush=True)
            epochs.append(result)
        if m:
            epochs[-1]["monarch_stats"] = m.stats()
    finally:
        if m:
            m.close()
            if a.monarch_binary:
                subprocess.run([a.monarch_binary, "stop", "--config", a.config],
                               capture_output=True)
    with open(a.json, "w") as f:
        json.dump(epochs, f)


if __name__ == "__main__":
    main()
