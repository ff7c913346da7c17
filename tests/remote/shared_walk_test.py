#!/usr/bin/env python3
"""One namespace walk per job, counted by the PFS emulator.

A dataset on an emulated PFS (tools/pfs_emulator: a FUSE mount that counts
every metadata operation) is opened by

  one walk   a single monarch-epochs process, peers off: the metadata
             operations of one walk plus one process's start-up;
  peers      4 monarch-epochs processes as peers on loopback, meeting in a
             rendezvous directory: rank 0 walks and writes the namespace
             manifest there, ranks 1-3 build from it after a few stats of the
             dataset's top-level directories.

and the metadata operations at start-up (counted when the last process is
about to read: every process waits at a barrier before its first read) are
compared in the same run: the peers' must be at most 1.2x one walk's plus a
small constant per process. Every process then reads its share of one epoch
with each read checked against the source (--verify), and reports whether
it built its namespace from a manifest (namespace_built_from_manifest).

--report adds the figures for bench/results/manifest.md: 4 processes
without peers (each walks: what a job cost before), and one process with a
manifest written by `monarch manifest` (dataset.manifest), with the
namespace build time of each.

usage: shared_walk_test.py MONARCH_EPOCHS MONARCH_CLI PFS_EMULATOR_SCRIPT
           [--files N] [--dirs N] [--meta-latency-us N] [--report]
Exit 77 (skipped) without /dev/fuse or when the emulator cannot mount.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from process_util import SKIP, PfsEmulator, final_stats  # noqa: E402

PEERS = 4
# Start-up operations a process makes besides the namespace (the config's
# check of dataset.path, the source driver opening it): allowed per process
# on top of 1.2x one walk.
PER_PROCESS_OPS = 10


def log(*args):
    print(*args, flush=True)


def write_dataset(root, files, dirs):
    total = 0
    for i in range(files):
        path = os.path.join(root, "class%02d" % (i % dirs), "img%05d.bin" % i)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        size = 2000 + (i * 7919) % 20000
        with open(path, "wb") as f:
            f.write(os.urandom(size))
        total += size
    return total


def write_config(path, dataset, rank=None, size=None, rendezvous=None, manifest=None):
    text = "dataset: {path: %s%s}\n" % (dataset, ", manifest: %s" % manifest if manifest else "")
    text += "tiers:\n  - {kind: ram, capacity: 256MiB}\n  - {kind: source}\n"
    if rank is not None:
        text += ("remote:\n  enabled: true\n  rank: %d\n  size: %d\n  rendezvous_dir: %s\n"
                 "  rendezvous_timeout: 60s\n  request_timeout: 10s\n" % (rank, size, rendezvous))
    with open(path, "w") as f:
        f.write(text)


def run_job(binary, emulator, work, name, configs):
    """Starts one monarch-epochs per config, all at once, meeting at a barrier
    before their first read; each snapshots the PFS counters just before it
    waits there. The last snapshot was taken when every process had
    finished starting and none had read: its metadata operations are the
    start-up's. Then they read one epoch, checked. Returns (ops, stats)."""
    barriers = os.path.join(work, name + ".barriers")
    os.makedirs(barriers)
    snapshots = [os.path.join(work, "%s.%d.start.json" % (name, r)) for r in range(len(configs))]
    emulator.reset()
    procs = []
    for r, config in enumerate(configs):
        cmd = [binary, "--config", config, "--epochs", "1", "--threads", "2", "--verify",
               "--before-epoch", emulator.snapshot_at_epoch_1(snapshots[r])]
        if len(configs) > 1:
            cmd += ["--partition", "%d/%d" % (r, len(configs)), "--barrier-dir", barriers]
        procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True))
    results = []
    for r, p in enumerate(procs):
        out, err = p.communicate(timeout=600)
        assert p.returncode == 0, "%s %d exited %d\n%s\n%s" % (name, r, p.returncode, out, err)
        assert "epoch 1:" in out and " 0 errors, 0 mismatches" in out, "%s %d:\n%s" % (name, r,
                                                                                     out)
        results.append(out)
    ops = 0
    for snapshot in snapshots:
        with open(snapshot) as f:
            ops = max(ops, json.load(f)["counters"]["metadata_ops"])
    return ops, [final_stats(out) for out in results]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("epochs_binary")
    parser.add_argument("cli_binary")
    parser.add_argument("pfs_script")
    parser.add_argument("--files", type=int, default=2000)
    parser.add_argument("--dirs", type=int, default=20)
    parser.add_argument("--meta-latency-us", type=int, default=100)
    parser.add_argument("--report", action="store_true")
    args = parser.parse_args()
    if not os.path.exists("/dev/fuse") or shutil.which("fusermount3") is None:
        log("skipped: no /dev/fuse or fusermount3")
        return SKIP
    work = tempfile.mkdtemp(prefix="monarch-shared-walk.")
    backing = os.path.join(work, "backing")
    mount = os.path.join(work, "pfs")
    # The dataset a level below the mount point, as on a real PFS.
    total = write_dataset(os.path.join(backing, "train"), args.files, args.dirs)
    emulator = PfsEmulator(os.path.abspath(args.pfs_script), backing, mount, args.meta_latency_us)
    if not emulator.started:
        log("skipped: the PFS emulator did not mount: " + emulator.error)
        shutil.rmtree(work, ignore_errors=True)
        return SKIP
    dataset = os.path.join(mount, "train")
    try:
        log("dataset: %d files in %d directories, %d bytes; metadata latency %d us" % (
            args.files, args.dirs, total, args.meta_latency_us))
        alone = os.path.join(work, "alone.yaml")
        write_config(alone, dataset)
        one_walk, stats = run_job(args.epochs_binary, emulator, work, "one", [alone])
        assert stats[0]["namespace_built_from_manifest"] == 0, stats[0]
        walk_ms = stats[0]["namespace_build_ms"]
        log("one process walking: %d metadata operations at start-up (namespace %d ms)" % (
            one_walk, walk_ms))

        rendezvous = os.path.join(work, "rendezvous")
        configs = []
        for r in range(PEERS):
            config = os.path.join(work, "peer%d.yaml" % r)
            write_config(config, dataset, r, PEERS, rendezvous)
            configs.append(config)
        peers, stats = run_job(args.epochs_binary, emulator, work, "peers", configs)
        built = [s["namespace_built_from_manifest"] for s in stats]
        log("%d peers: %d metadata operations at start-up (%.2fx one walk); built from the "
            "manifest: %s; namespace ms: %s" % (PEERS, peers, peers / one_walk, built,
                                                [s["namespace_build_ms"] for s in stats]))
        assert built == [0] + [1] * (PEERS - 1), built
        limit = 1.2 * one_walk + PER_PROCESS_OPS * PEERS
        assert peers <= limit, "%d peers made %d metadata operations at start-up, more than " \
            "1.2 x %d (one walk) + %d" % (PEERS, peers, one_walk, PER_PROCESS_OPS * PEERS)
        assert not os.path.exists(os.path.join(rendezvous, "namespace.manifest")), \
            "rank 0 left its manifest in the rendezvous directory"

        if args.report:
            configs = []
            for r in range(PEERS):
                config = os.path.join(work, "alone%d.yaml" % r)
                write_config(config, dataset)
                configs.append(config)
            separate, _ = run_job(args.epochs_binary, emulator, work, "separate", configs)
            log("%d processes without peers, each walking: %d metadata operations at start-up "
                "(%.2fx one walk)" % (PEERS, separate, separate / one_walk))
            manifest = os.path.join(work, "train.manifest")
            with_manifest = os.path.join(work, "manifest.yaml")
            write_config(with_manifest, dataset, manifest=manifest)
            began = time.time()
            r = subprocess.run([args.cli_binary, "manifest", "--config", with_manifest],
                               capture_output=True, text=True, timeout=600)
            assert r.returncode == 0, r.stdout + r.stderr
            log("monarch manifest (%.2f s): %s" % (time.time() - began, r.stdout.strip()))
            ops, stats = run_job(args.epochs_binary, emulator, work, "manifest", [with_manifest])
            assert stats[0]["namespace_built_from_manifest"] == 1
            log("one process with dataset.manifest: %d metadata operations at start-up "
                "(namespace %d ms, against %d ms walking)" % (ops, stats[0]["namespace_build_ms"],
                                                             walk_ms))
        log("PASS")
        return 0
    finally:
        emulator.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
