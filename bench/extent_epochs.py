#!/usr/bin/env python3
"""Big files read by records, cached by extents (placement.extent_bytes),
against plain reads and against whole-file caching, in one run, on the PFS
emulator (its default latency and bandwidth).

Two experiments:

  records   One file of --file-mib MiB, --tier-mib of RAM tier (by default
            half the file), read in random order as records of
            --record-kib KiB by --threads threads, --epochs epochs. Arms, in
            turns: `plain` (pread of the emulator's file), `whole` (Monarch
            caching whole files: the file fits no tier, so it is never
            cached), `extents` (Monarch with extents of --extent-kib).
            Targets (issue 30): epochs 2-3 read at most 0.55x of the file
            from the source and take at most 0.6x the time of plain reads.

  scan      --shards files of --shard-mib MiB, each scanned front to back by
            one of --threads threads in --record-kib reads, in a RAM tier
            that holds them all: extents (with read-ahead) against whole
            files. Target: at most 1.05x the whole-file arm.

  sweep     The Stimulus paper's shape: one file of --samples samples of
            --sample-bytes, read at random by sample, in a RAM tier that
            holds it; extents swept over --sweep-kib. Reports each size's
            epoch times, bandwidth, and the source's bytes and operations.

Arms named `...-service` (in --arms: `whole-service`, `extents-service`) read
through a node service instead: the worker is a client of a `monarch serve`
started empty for the run, so the figures are those of the client's read
path (its hits of extent copies read in the worker, misses sent to the
service).

Each arm runs in its own process (a fresh Monarch instance, fresh source
descriptors). Per epoch: seconds, the emulator's bytes and read operations
(its counters), and for Monarch the RAM tier's bytes used.

usage: python3 bench/extent_epochs.py [--build build] [--experiment records,scan,sweep]
       [--out bench/results/extents]
"""

import argparse
import json
import os
import random
import shlex
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from service_epochs import Pfs, add_emulator_flags, start_service, stop_service  # noqa: E402

REPO = os.path.dirname(HERE)
MIB = 1 << 20

# One arm's epochs, in a process of its own: prints one JSON line per epoch.
WORKER = r"""
import json, os, random, sys, threading, time
spec = json.load(open(sys.argv[1]))
sys.path.insert(0, spec["python"])
os.environ["MONARCH_C_LIBRARY"] = spec["c_library"]
# Tasks: [name, offset, length, step]: read [offset, offset + length) in
# pieces of `step`, front to back. Records are one piece each; a scan, a
# whole file.
tasks, total = spec["tasks"], spec["total"]
if spec["arm"] == "plain":
    fds = {name: os.open(os.path.join(spec["mount"], name), os.O_RDONLY)
           for name in {t[0] for t in tasks}}
    def read(name, offset, n):
        return len(os.pread(fds[name], n, offset))
    stats = lambda: {}
else:
    import monarch
    m = monarch.Monarch(config=spec["config"])
    def read(name, offset, n):
        return len(m.read(name, offset, n))
    def stats():
        m.wait_for_placement()
        s = m.stats()
        return {"tier_bytes_used": s["tiers"][0]["bytes_used"],
                "tier_files": s["tiers"][0]["files"],
                "read_ahead_extents": s.get("read_ahead_extents", 0)}
for epoch in range(spec["epochs"]):
    order = tasks[:]
    if spec["shuffle"]:
        random.Random(spec["seed"] + epoch).shuffle(order)
    it = iter(order)
    lock = threading.Lock()
    got = [0]
    def reader():
        n = 0
        while True:
            with lock:
                task = next(it, None)
            if task is None:
                break
            name, offset, length, step = task
            end = offset + length
            while offset < end:
                n += read(name, offset, min(step, end - offset))
                offset += step
        with lock:
            got[0] += n
    print(json.dumps({"event": "start", "epoch": epoch + 1}), flush=True)
    sys.stdin.readline()  # The driver has read the emulator's counters.
    began = time.monotonic()
    threads = [threading.Thread(target=reader) for _ in range(spec["threads"])]
    for t in threads: t.start()
    for t in threads: t.join()
    seconds = time.monotonic() - began
    if got[0] != total:
        sys.exit("epoch %d read %d bytes of %d" % (epoch + 1, got[0], total))
    extra = stats()
    print(json.dumps(dict(event="end", epoch=epoch + 1, seconds=seconds, **extra)), flush=True)
    sys.stdin.readline()
"""


def counters(pfs):
    c = pfs.stats()
    return {"bytes": c.get("bytes_read", 0), "reads": c.get("reads", 0),
            "opens": c.get("opens", 0)}


def run_arm(a, pfs, arm, tasks, total, config, epochs, seed, shuffle=True):
    spec = {"arm": arm, "mount": pfs.mount, "tasks": tasks, "total": total, "config": config,
            "epochs": epochs, "seed": seed, "threads": a.threads, "shuffle": shuffle,
            "python": os.path.join(REPO, "python"),
            "c_library": os.path.join(os.path.abspath(a.build), "libmonarch_c.so")}
    # In a file: a sweep's tasks are too many for a command line.
    spec_path = os.path.join(a.dir, "spec.json")
    with open(spec_path, "w") as f:
        json.dump(spec, f)
    service = start_service(a, config, a.dir) if arm.endswith("-service") else None
    proc = subprocess.Popen([sys.executable, "-c", WORKER, spec_path],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    rows = []
    before = None
    for line in proc.stdout:
        msg = json.loads(line)
        if msg["event"] == "start":
            before = counters(pfs)
        else:
            after = counters(pfs)
            msg.update({k: after[k] - before[k] for k in after})
            del msg["event"]
            rows.append(msg)
        proc.stdin.write("\n")
        proc.stdin.flush()
    code = proc.wait()
    if service:
        stop_service(a, config, *service)
    if code != 0:
        sys.exit("arm %s failed" % arm)
    return rows


def run_arms(a, pfs, tasks, total, configs):
    """--arms in turns, --reps times: each arm's epochs per rep."""
    results = {arm: [] for arm in a.arms.split(",")}
    for rep in range(a.reps):
        for arm in results:
            rows = run_arm(a, pfs, arm, tasks, total, configs.get(arm), a.epochs, 1 + rep)
            results[arm].append(rows)
            print(arm, rep + 1, " ".join("e%d %.2fs %.0f MiB" % (r["epoch"], r["seconds"],
                                                                  r["bytes"] / MIB) for r in rows),
                  flush=True)
    return results


def write_config(a, dataset, tier_bytes, extent_bytes, threshold, service=False):
    fd, path = tempfile.mkstemp(suffix=".yaml", dir=a.dir)
    with os.fdopen(fd, "w") as f:
        f.write("dataset: {path: %s}\n"
                "tiers:\n  - {kind: ram, capacity: %d}\n  - {kind: source}\n"
                "placement: {extent_bytes: %d, extent_threshold: %d}\n"
                % (dataset, tier_bytes, extent_bytes, threshold))
        if service:
            f.write("node: {shared: true, runtime_dir: %s, autostart: false, idle_exit: 0}\n"
                    % os.path.join(a.dir, "rt"))
    return path


def with_service_arms(a, configs, make):
    """`configs` plus each `<arm>-service` of --arms: `make(arm, service)`
    writes an arm's config."""
    for arm in a.arms.split(","):
        if arm.endswith("-service"):
            configs[arm] = make(arm[:-len("-service")], True)
    return configs


def make_file(path, size):
    if os.path.exists(path) and os.path.getsize(path) == size:
        return
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path + ".tmp", "wb") as f:
        left = size
        while left > 0:
            n = min(left, 64 * MIB)
            f.write(os.urandom(n))
            left -= n
    os.rename(path + ".tmp", path)


def records(a, pfs):
    size = a.file_mib * MIB
    tier = (a.tier_mib or a.file_mib // 2) * MIB
    record = a.record_kib * 1024
    make_file(os.path.join(a.dir, "backing", "records.bin"), size)
    tasks = [["records.bin", offset, min(record, size - offset), record]
             for offset in range(0, size, record)]
    def make(arm, service=False):
        extent = a.extent_kib * 1024 if arm == "extents" else 0
        return write_config(a, pfs.mount, tier, extent, extent, service)
    configs = with_service_arms(a, {"whole": make("whole"), "extents": make("extents")}, make)
    results = run_arms(a, pfs, tasks, size, configs)
    return {"file_bytes": size, "tier_bytes": tier, "record_bytes": record,
            "extent_bytes": a.extent_kib * 1024, "results": results}


def scan(a, pfs):
    size = a.shard_mib * MIB
    names = ["shard%02d.tar" % i for i in range(a.shards)]
    for name in names:
        make_file(os.path.join(a.dir, "backing", "shards", name), size)
    total = size * len(names)
    # Each reader takes whole shards, in a shuffled order, and scans each
    # front to back in --record-kib reads (WebDataset's pattern).
    tasks = [["shards/" + name, 0, size, a.record_kib * 1024] for name in names]
    def make(arm, service=False):
        extent = a.extent_kib * 1024 if arm == "extents" else 0
        return write_config(a, pfs.mount, 2 * total, extent, extent, service)
    configs = with_service_arms(a, {"whole": make("whole"), "extents": make("extents")}, make)
    results = run_arms(a, pfs, tasks, total, configs)
    return {"shard_bytes": size, "shards": len(names), "record_bytes": a.record_kib * 1024,
            "extent_bytes": a.extent_kib * 1024, "results": results}


def sweep(a, pfs):
    size = a.samples * a.sample_bytes
    make_file(os.path.join(a.dir, "backing", "samples.bin"), size)
    tasks = [["samples.bin", offset, a.sample_bytes, a.sample_bytes]
             for offset in range(0, size, a.sample_bytes)]
    results = {}
    arms = ["plain", "whole"] + ["extents-%d" % kib for kib in a.sweep_kib]
    for arm in arms:
        results[arm] = []
    for rep in range(a.reps):
        for arm in arms:
            if arm == "plain":
                config = None
            elif arm == "whole":
                config = write_config(a, pfs.mount, 2 * size, 0, 0)
            else:
                kib = int(arm.split("-")[1])
                config = write_config(a, pfs.mount, 2 * size, kib * 1024, 0)
            rows = run_arm(a, pfs, "plain" if arm == "plain" else "monarch", tasks, size,
                           config, a.epochs, 1 + rep)
            results[arm].append(rows)
            print(arm, rep + 1, " ".join("e%d %.2fs %.0f MiB %d reads" % (
                r["epoch"], r["seconds"], r["bytes"] / MIB, r["reads"]) for r in rows), flush=True)
    return {"file_bytes": size, "sample_bytes": a.sample_bytes, "results": results}


def median(values):
    values = sorted(values)
    return values[len(values) // 2]


def epoch_rows(res, epochs, cells):
    """A table row per arm and epoch: `cells(e, runs)` gives the columns
    after the arm and the epoch; runs[i][e] is run i's epoch e."""
    return ["| %s | %d | %s |" % (arm, e + 1, " | ".join(cells(e, runs)))
            for arm, runs in res.items() for e in range(epochs)]


def med(runs, e, key):
    """The median over runs of epoch e's `key`."""
    return median([r[e][key] for r in runs])


def report(a, data, command):
    lines = ["# Extents: big files read by records", "",
             "Command: `%s`" % command, "",
             "Commit: %s" % subprocess.run(["git", "-C", REPO, "rev-parse", "--short", "HEAD"],
                                           capture_output=True, text=True).stdout.strip(),
             "Emulator: %s" % " ".join(a.emulator_flags), ""]

    def versus(res, base, e, sec):
        return "%.3f" % (sec / med(res[base], e, "seconds")) if base in res else "-"

    if "records" in data:
        d = data["records"]
        res = d["results"]
        lines += ["## One file twice the tier, random records", "",
                  "%d MiB file, %d MiB RAM tier, %d KiB records in random order, %d threads, "
                  "extents of %d KiB; medians of %d runs." % (
                      d["file_bytes"] // MIB, d["tier_bytes"] // MIB, d["record_bytes"] // 1024,
                      a.threads, d["extent_bytes"] // 1024, a.reps), "",
                  "| arm | epoch | seconds | vs plain | source bytes / file | source reads |",
                  "|---|---|---|---|---|---|"]
        lines += epoch_rows(res, a.epochs, lambda e, runs: [
            "%.2f" % med(runs, e, "seconds"), versus(res, "plain", e, med(runs, e, "seconds")),
            "%.3f" % (med(runs, e, "bytes") / d["file_bytes"]), "%d" % med(runs, e, "reads")])
        lines.append("")
    if "scan" in data:
        d = data["scan"]
        res = d["results"]
        total = d["shard_bytes"] * d["shards"]
        lines += ["## Shards scanned front to back", "",
                  "%d shards of %d MiB, each scanned by one of %d threads in %d KiB reads, "
                  "a RAM tier twice the data; extents of %d KiB; medians of %d runs." % (
                      d["shards"], d["shard_bytes"] // MIB, a.threads, d["record_bytes"] // 1024,
                      d["extent_bytes"] // 1024, a.reps), "",
                  "| arm | epoch | seconds | vs plain | vs whole | source bytes / data |",
                  "|---|---|---|---|---|---|"]
        lines += epoch_rows(res, a.epochs, lambda e, runs: [
            "%.2f" % med(runs, e, "seconds"), versus(res, "plain", e, med(runs, e, "seconds")),
            versus(res, "whole", e, med(runs, e, "seconds")),
            "%.3f" % (med(runs, e, "bytes") / total)])
        lines.append("")
    if "sweep" in data:
        d = data["sweep"]
        res = d["results"]
        lines += ["## Extent size sweep: the Stimulus shape", "",
                  "One file of %d samples of %d bytes (%d MiB), read at random by sample, "
                  "%d threads, a RAM tier twice the file; medians of %d runs. Bandwidth: "
                  "the file's bytes over the epoch's time." % (
                      d["file_bytes"] // d["sample_bytes"], d["sample_bytes"],
                      d["file_bytes"] // MIB, a.threads, a.reps), "",
                  "| arm | epoch | seconds | MiB/s | source MiB | source reads |",
                  "|---|---|---|---|---|---|"]
        lines += epoch_rows(res, a.epochs, lambda e, runs: [
            "%.2f" % med(runs, e, "seconds"),
            "%.0f" % (d["file_bytes"] / MIB / med(runs, e, "seconds")),
            "%.1f" % (med(runs, e, "bytes") / MIB), "%d" % med(runs, e, "reads")])
        lines.append("")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default="build")
    ap.add_argument("--dir", default="/var/tmp/monarch-extents")
    ap.add_argument("--experiment", default="records,scan,sweep",
                    help="comma-separated: records, scan, sweep")
    ap.add_argument("--shards", type=int, default=8)
    ap.add_argument("--shard-mib", type=int, default=256)
    ap.add_argument("--arms", default="plain,whole,extents")
    ap.add_argument("--file-mib", type=int, default=1024)
    ap.add_argument("--tier-mib", type=int, default=0)
    ap.add_argument("--record-kib", type=int, default=1024)
    ap.add_argument("--extent-kib", type=int, default=4096)
    ap.add_argument("--samples", type=int, default=32768)
    ap.add_argument("--sample-bytes", type=int, default=8192)
    ap.add_argument("--sweep-kib", type=lambda s: [int(x) for x in s.split(",")],
                    default=[256, 1024, 4096, 16384, 65536])
    ap.add_argument("--threads", type=int, default=4)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--out", default="")
    add_emulator_flags(ap)
    a = ap.parse_args()
    os.makedirs(os.path.join(a.dir, "backing"), exist_ok=True)
    pfs = Pfs(a, os.path.join(a.dir, "backing"), os.path.join(a.dir, "mnt"))
    if not pfs.ok:
        sys.exit("no PFS emulator: " + pfs.why)
    a.emulator_flags = pfs.flags
    data = {}
    try:
        for experiment in a.experiment.split(","):
            data[experiment] = {"records": records, "scan": scan, "sweep": sweep}[experiment](a, pfs)
    finally:
        pfs.stop()
    command = "python3 bench/extent_epochs.py " + shlex.join(sys.argv[1:])
    text = report(a, data, command)
    print(text)
    if a.out:
        with open(a.out + ".md", "w") as f:
            f.write(text + "\n")
        with open(a.out + ".json", "w") as f:
            json.dump(data, f, indent=1)


if __name__ == "__main__":
    main()
