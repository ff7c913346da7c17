#!/usr/bin/env python3
"""Monarch against what users pick instead (issue 32), in one run: every arm
reads the same ImageNet-like dataset, kept on the PFS emulator's FUSE mount
(default latency and bandwidth), through torch.utils.data.DataLoader with the
same workers, batch size and seeded shuffle, for --epochs epochs after its
start-up:

  pfs        plain open()/read() of the files on the PFS mount
  local      plain open()/read() of a pre-staged local copy (the ideal)
  monarch    monarch.torch through the node service, a `posix` tier on the
             local disk (or `--tier ram`)
  announced  the same, each epoch's order announced (AnnouncingSampler)
  preload    an unchanged ImageFolder-style dataset (os.walk, open/read)
             under LD_PRELOAD=libmonarch_preload.so (a child process)
  litdata    litdata.StreamingDataset over chunks made by litdata.optimize,
             read as `local:` (remote) with a local cache_dir, through its
             StreamingDataLoader
  mosaic     streaming.StreamingDataset (MDS shards by MDSWriter), remote on
             the PFS mount, local cache directory, `predownload` two shards
             ahead, `py1e` shuffle, through its StreamingDataLoader
  webdataset webdataset.WebDataset over tar shards, `pipe:cat` URLs, its
             cache_dir, shard shuffle plus a sample shuffle buffer, batched in
             the workers, WebLoader
  fsspec     fsspec's `filecache` over the original files (no conversion), a
             cache directory per worker (the co-workers' read too)
  simplecache fsspec's `simplecache`, a cache directory per worker

Each arm's settings are its maintainers' (bench/results/rivals.md, "How each
rival is set up", cites where each is documented). Every arm runs --reps
times (default 3), in rounds.

The rivals' converted data is written to the PFS's backing directory (the
emulator is read-only), next to the dataset, and read through the mount;
their caches and Monarch's tier sit in one directory on the same local disk
with the same capacity (1.25x the dataset). Conversion is timed apart.

Each sample's bytes are checked in the worker: the worker returns the
sample's id, its CRC-32 and its length, and the main process compares them
with the manifest made when the dataset was generated. A wrong byte, a
missing sample or a sample from outside the dataset fails the run.

Per epoch: wall time, the emulator's bytes and operations, the peak of the
summed Pss of the job's process tree and the node service (sampled every
0.2 s; Pss counts shared memory, the RAM tier's arena and the mosaic
shared memory, once; the page cache is not counted), the bytes in the
local cache directory, where the machine's CPU went (the file system's
daemons, the node service, the rest: the job) and, for Monarch's arms, the
node service's prefetch and promotion counters. Every other round runs the
arms in the reverse order.

usage: sudo .venv/bin/python bench/rivals.py [--files 20000] [--workers 2]
         [--shards N] [--reps 3] [--tiny] [--arms pfs,local,...]
         [--out bench/results/rivals]
"""

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from moosefs_source import MooseFS, add_source_flags  # noqa: E402
from service_epochs import add_readahead_flag, drop_service, readahead_flags  # noqa: E402
ALL_ARMS = ("pfs", "local", "monarch", "announced", "preload", "litdata", "mosaic",
            "webdataset", "fsspec", "simplecache")
RIVALS = ("litdata", "mosaic", "webdataset", "fsspec", "simplecache")
MONARCH_ARMS = ("monarch", "announced", "preload")
SKIP = 77


# --- the dataset --------------------------------------------------------------------------

def generate(a, root):
    """The ImageNet-like files (monarch-epochs' generator) under root/images,
    and, with --shards, the same samples packed into a few large files under
    root/shards. Returns the manifest: [(path relative to the dataset root,
    offset, length, crc32)], sample id = index."""
    manifest_path = os.path.join(root, "manifest.json")
    if os.path.exists(manifest_path):
        with open(manifest_path) as f:
            return [tuple(r) for r in json.load(f)]
    images = os.path.join(root, "images")
    shutil.rmtree(root, ignore_errors=True)
    os.makedirs(root)
    subprocess.run([os.path.join(a.build, "monarch-epochs"), "--dataset", images,
                    "--generate", str(a.files), "--profile", "imagenet", "--epochs", "0"],
                   check=True, stdout=subprocess.DEVNULL)
    names = sorted(os.path.relpath(os.path.join(d, n), images)
                   for d, _, fs in os.walk(images) for n in fs)
    records = []
    if not a.shards:
        for n in names:
            with open(os.path.join(images, n), "rb") as f:
                data = f.read()
            records.append((n, 0, len(data), zlib.crc32(data)))
    else:
        shard_dir = os.path.join(root, "shards")
        os.makedirs(shard_dir)
        per = (len(names) + a.shards - 1) // a.shards
        for s in range(a.shards):
            rel = "shard-%03d.bin" % s
            with open(os.path.join(shard_dir, rel), "wb") as out:
                for n in names[s * per:(s + 1) * per]:
                    with open(os.path.join(images, n), "rb") as f:
                        data = f.read()
                    records.append((rel, out.tell(), len(data), zlib.crc32(data)))
                    out.write(data)
        shutil.rmtree(images)
    with open(manifest_path, "w") as f:
        json.dump(records, f)
    return records


def sample_tensor(sid, data):
    """What every arm's worker returns for a sample: id, CRC-32, length."""
    import torch
    return torch.tensor([sid, zlib.crc32(data), len(data)], dtype=torch.int64)


class Checker:
    """Checks an epoch's batches against the manifest."""

    def __init__(self, records):
        self.crc = [r[3] for r in records]
        self.size = [r[2] for r in records]

    def epoch(self, loader, arm, cap=0):
        """Checks one epoch; with `cap` (seconds), stops reading past it and
        returns what was read, marked incomplete."""
        seen = [0] * len(self.crc)
        nbytes = 0
        deadline = time.perf_counter() + cap if cap else None
        it = iter(loader)
        for batch in it:
            if deadline is not None and time.perf_counter() > deadline:
                del it
                return {"samples": sum(seen), "repeated": 0, "sample_bytes": nbytes,
                        "incomplete": True}
            for sid, crc, n in batch.tolist():
                if not 0 <= sid < len(seen):
                    raise SystemExit(f"{arm}: sample id {sid} is not in the dataset")
                if crc != self.crc[sid] or n != self.size[sid]:
                    raise SystemExit(f"{arm}: sample {sid} has wrong bytes (crc {crc:08x} "
                                     f"length {n}, expected {self.crc[sid]:08x} "
                                     f"length {self.size[sid]})")
                seen[sid] += 1
                nbytes += n
        missing = sum(1 for s in seen if s == 0)
        if missing:
            raise SystemExit(f"{arm}: {missing} of {len(seen)} samples never came")
        return {"samples": sum(seen), "repeated": sum(seen) - len(seen), "sample_bytes": nbytes}


# --- plain datasets: the same code serves pfs, local and the preload -----------------------

class PlainFiles:
    """ImageFolder-style: lists `root` (os.walk, sorted) and reads each
    sample with open()/seek()/read(). With a manifest's records the list is
    the records'; the walk is still made (and timed) as a dataset would."""

    def __init__(self, root, records):
        import torch.utils.data  # noqa: F401
        listed = sorted(os.path.relpath(os.path.join(d, n), root)
                        for d, _, fs in os.walk(root) for n in fs)
        wanted = sorted({r[0] for r in records})
        if listed != wanted:
            raise SystemExit(f"{root}: listing differs from the manifest")
        self.root = root
        self.records = records

    def __len__(self):
        return len(self.records)

    def __getitem__(self, i):
        rel, off, n, _ = self.records[i]
        with open(os.path.join(self.root, rel), "rb") as f:
            if off:
                f.seek(off)
            return sample_tensor(i, f.read(n))


def torch_dataset(obj):
    import torch.utils.data

    class Wrapped(torch.utils.data.Dataset):
        def __len__(self):
            return len(obj)

        def __getitem__(self, i):
            return obj[i]
    return Wrapped()


def map_loader(a, ds, sampler=None):
    import torch
    import torch.utils.data
    if sampler is None:
        return torch.utils.data.DataLoader(
            ds, batch_size=a.batch, shuffle=True, num_workers=a.workers,
            generator=torch.Generator().manual_seed(a.seed), multiprocessing_context="fork")
    return torch.utils.data.DataLoader(ds, batch_size=a.batch, sampler=sampler,
                                       num_workers=a.workers, multiprocessing_context="fork")


# --- measuring ---------------------------------------------------------------------------

def pss(pid):
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def children_of():
    kids = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        kids.setdefault(ppid, []).append(int(d))
    return kids


def service_pids(config):
    """Processes whose command line names `config` (the node service)."""
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/cmdline", "rb") as f:
                    if config.encode() in f.read():
                        out.append(int(d))
            except OSError:
                pass
    return out


class MemorySampler:
    """Peak of summed Pss over this process's tree plus extra roots (the
    node service), sampled every `period` s in a thread."""

    def __init__(self, period=0.2):
        self.period = period
        self.roots = None  # None: this process (the job); else these pids
        self.extra = []
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def sample(self):
        kids = children_of()
        unvisited = list(self.roots or [os.getpid()]) + list(self.extra)
        seen = set()
        total = 0
        while unvisited:
            p = unvisited.pop()
            if p in seen:
                continue
            seen.add(p)
            total += pss(p)
            unvisited += kids.get(p, [])
        self.peak = max(self.peak, total)
        return total

    def take_peak(self):
        self.sample()
        peak, self.peak = self.peak, 0
        return peak

    def _run(self):
        while not self._stop.wait(self.period):
            self.sample()

    def stop(self):
        self._stop.set()


# Where an epoch's CPU went, by command: the file system's daemons, the node
# service, and the rest (the job: its main process and workers, which may
# exit before the epoch's end and are then counted in "busy" only).
CPU_COMMANDS = ("mfsmount", "mfschunkserver", "mfsmaster", "monarch", "pfs-emulator")


def cpu_seconds():
    """The machine's busy CPU seconds so far, and each CPU_COMMANDS
    command's (its live processes' user and system time)."""
    tick = os.sysconf("SC_CLK_TCK")
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    # user nice system idle iowait irq softirq steal (guest time is in user)
    out = {"busy": (sum(fields[:3]) + fields[5] + fields[6]) / tick, "steal": fields[7] / tick}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                head, tail = f.read().rsplit(")", 1)
        except OSError:
            continue
        comm = head.split("(", 1)[1]
        if comm in CPU_COMMANDS:
            t = tail.split()
            out[comm] = out.get(comm, 0.0) + (int(t[11]) + int(t[12])) / tick
    return out


def cpu_delta(before, after):
    delta = {k: round(after.get(k, 0.0) - before.get(k, 0.0), 2) for k in after}
    delta["job"] = round(delta["busy"] - sum(v for k, v in delta.items()
                                             if k not in ("busy", "steal")), 2)
    return delta


# The node service's counters that tell how an epoch's misses went: what
# the prefetch streams fetched and readers hit, and what readers loaded
# themselves.
SERVICE_COUNTERS = ("prefetch_files", "prefetch_reads", "prefetch_hits", "prefetch_yields",
                    "prefetch_skipped_files", "prefetch_staged_files", "promotions_started",
                    "promotions_completed", "chunks_written_by_placement",
                    "chunks_written_by_readers", "staging_waits", "placement_waiters",
                    "deferred_copies_queued", "promotion_bytes_from_memory")


def service_counters(config):
    """SERVICE_COUNTERS and each tier's reads, from `monarch stats`; {}
    when no service answers."""
    r = subprocess.run([os.environ["MONARCH_BINARY"], "stats", "--json", "--config", config],
                       capture_output=True, text=True)
    if r.returncode != 0:
        return {}
    s = json.loads(r.stdout)["node"]
    out = {k: s[k] for k in SERVICE_COUNTERS if k in s}
    for t in s.get("tiers", []):
        out[t["name"] + "_reads"] = t["reads"]
    return out


def cpu_note(rec):
    c = rec["cpu"]
    mfs = sum(c.get(k, 0.0) for k in ("mfsmount", "mfschunkserver", "mfsmaster"))
    return (f"  CPU {c['busy']:.1f} s: job {c['job']:.1f}, service {c.get('monarch', 0.0):.1f}"
            + (f", MooseFS {mfs:.1f}" if mfs else "") + f"; stolen {c['steal']:.1f} s")


def counters_delta(before, after):
    return {k: v - before.get(k, 0) for k, v in after.items()}


def du(path):
    total = 0
    for d, _, fs in os.walk(path):
        for n in fs:
            try:
                total += os.lstat(os.path.join(d, n)).st_blocks * 512
            except OSError:
                pass
    return total


class Pfs:
    def __init__(self, a, backing, mount, attach=False):
        self.script = os.path.join(a.build, "bin", "pfs-emulator")
        self.mount = mount
        self.flags = ["--meta-latency-us", str(a.meta_latency_us), "--read-latency-us",
                      str(a.read_latency_us), "--bandwidth-mbps", str(a.bandwidth_mbps)]
        self.flags += readahead_flags(a)
        if attach:  # an arm's process: the parent started it
            return
        subprocess.run([self.script, "stop", mount], capture_output=True)
        r = subprocess.run([self.script, "start", backing, mount] + self.flags,
                           capture_output=True, text=True)
        if r.returncode != 0:
            raise SystemExit("pfs-emulator start failed: " + (r.stderr or r.stdout))

    def stats(self):
        c = json.loads(subprocess.run([self.script, "stats", self.mount], capture_output=True,
                                      text=True, check=True).stdout)["counters"]
        return {"bytes": c.get("bytes_read", 0), "reads": c.get("reads", 0),
                "opens": c.get("opens", 0), "metadata_ops": c.get("metadata_ops", 0)}

    def reset(self):
        subprocess.run([self.script, "reset", self.mount], check=True, capture_output=True)

    def stop(self):
        subprocess.run([self.script, "stop", self.mount], capture_output=True)

    def describe(self):
        return "PFS emulator " + " ".join(self.flags)

    def drop_cache(self):
        pass  # direct_io: the emulator's files are never in the page cache.


class MooseFSCounters:
    """Pfs's face over MooseFS (bench/moosefs_source.py)."""

    def __init__(self, fs):
        self.fs, self.flags = fs, fs.flags

    def stats(self):
        c = self.fs.stats()
        return {"bytes": c["bytes_read"], "reads": c["reads"], "opens": c["opens"],
                "metadata_ops": c["metadata_ops"]}

    def reset(self):
        self.fs.reset()

    def stop(self):
        self.fs.stop()

    def describe(self):
        return self.fs.describe()

    def drop_cache(self):
        self.fs.drop_cache()


class Run:
    """One arm: start-up, then epochs, each measured the same way."""

    def __init__(self, a, arm, pfs, mem, cache_dir, checker):
        self.a, self.arm, self.pfs, self.mem = a, arm, pfs, mem
        self.cache_dir, self.checker = cache_dir, checker
        self.result = {"arm": arm, "epochs": []}

    def startup(self, build):
        self.pfs.reset()
        self.mem.take_peak()
        t = time.perf_counter()
        out = build()
        self.result["startup"] = {"seconds": time.perf_counter() - t, **self.pfs.stats(),
                                  "peak_pss": self.mem.take_peak(),
                                  "cache_bytes": du(self.cache_dir)}
        print(f"  {self.arm:10s} start-up {self.result['startup']['seconds']:7.2f} s", flush=True)
        return out

    def epoch(self, e, loader, before=None, config=None):
        """`config`: a Monarch arm's, whose node service's counters the
        epoch records."""
        if before is not None:
            before(e)
        self.pfs.reset()
        self.mem.take_peak()
        counters = service_counters(config) if config else None
        cpu = cpu_seconds()
        t = time.perf_counter()
        check = self.checker.epoch(loader, self.arm, self.a.epoch_cap)
        sec = time.perf_counter() - t
        rec = {"epoch": e + 1, "seconds": sec, **self.pfs.stats(), "peak_pss": self.mem.take_peak(),
               "cache_bytes": du(self.cache_dir), **check, "cpu": cpu_delta(cpu, cpu_seconds())}
        if config:
            rec["service"] = counters_delta(counters, service_counters(config))
        self.result["epochs"].append(rec)
        print(f"  {self.arm:10s} epoch {e + 1} {sec:7.2f} s  PFS {rec['bytes'] / 2**20:8.1f} MiB "
              f"{rec['opens']:6d} opens {rec['metadata_ops']:6d} meta  Pss "
              f"{rec['peak_pss'] / 2**20:7.1f} MiB  cache {rec['cache_bytes'] / 2**20:8.1f} MiB"
              + (f"  ({check['repeated']} repeated)" if check["repeated"] else "") + cpu_note(rec),
              flush=True)
        if check.get("incomplete"):
            print(f"  {self.arm:10s} stopped after {self.a.epoch_cap} s ({check['samples']} of "
                  f"{len(self.checker.crc)} samples): the arm's remaining epochs are skipped",
                  flush=True)
            raise Capped()


class Capped(Exception):
    """An epoch ran past --epoch-cap: the arm stops there."""


# --- the arms ----------------------------------------------------------------------------

def monarch_config(a, w, dataset, name, autostart=True):
    tier_dir = os.path.join(w.cache, name)
    os.makedirs(tier_dir, exist_ok=True)
    tier = (f"{{kind: posix, path: {tier_dir}, capacity: {w.capacity}}}" if a.tier == "posix"
            else f"{{kind: ram, capacity: {w.capacity}}}")
    path = os.path.join(w.work, name + ".yaml")
    with open(path, "w") as f:
        f.write(f"dataset: {{path: {dataset}}}\ntiers: [{tier}, {{kind: source}}]\n"
                f"node: {{shared: true, runtime_dir: {os.path.join(w.work, 'rt-' + name)}, "
                f"idle_exit: 0, autostart: {'true' if autostart else 'false'}}}\n"
                + (a.monarch_yaml + "\n" if a.monarch_yaml else ""))
    return path, tier_dir


def stop_monarch(config):
    # And purge: a stop leaves a RAM tier's copies on /dev/shm for the next
    # service (node.keep_ram), whose epoch 1 (the next run's) would be warm.
    drop_service(os.environ["MONARCH_BINARY"], config)


def arm_plain(a, w, run, root):
    ds = run.startup(lambda: torch_dataset(PlainFiles(root, w.records)))
    loader = map_loader(a, ds)
    for e in range(a.epochs):
        run.epoch(e, loader)


def arm_monarch(a, w, run, announce):
    import monarch
    import monarch.torch as mt
    config, tier_dir = monarch_config(a, w, w.dataset_on_pfs, run.arm)
    run.cache_dir = tier_dir
    stop_monarch(config)  # Nothing an interrupted run kept: epoch 1 starts cold.
    records = w.records

    class Records(mt.FileListDataset):
        def __getitem__(self, i):
            rel, off, n, _ = records[i]
            return sample_tensor(i, self.monarch.read(rel, off, n))

    def build():
        m = monarch.Monarch(config)  # starts the node service, which walks the mount
        run.mem.extra = service_pids(config)
        return m, Records([r[0] for r in records], monarch=m)
    m, ds = run.startup(build)
    try:
        sampler = None
        if announce:
            import torch
            sampler = mt.AnnouncingSampler(torch.utils.data.RandomSampler(
                ds, generator=torch.Generator().manual_seed(a.seed)), ds)
        loader = map_loader(a, ds, sampler)
        # --settle: before epochs 2.., wait (untimed) until the node service
        # has written and readied the copies epoch 1 started.
        def settle(e):
            if e > 0:
                t = time.perf_counter()
                m.wait_for_placement()
                run.result.setdefault("settle_seconds", []).append(time.perf_counter() - t)
        settle = settle if a.settle else None
        for e in range(a.epochs):
            run.epoch(e, loader, before=settle, config=config)
        src = m.stats()["tiers"][-1]
        run.result["node_source_bytes"] = src["bytes_read"]
    finally:
        m.close()
        stop_monarch(config)
        run.mem.extra = []


def arm_preload(a, w, run):
    """A child process under LD_PRELOAD reads the unchanged plain dataset on
    the mount; it reports start-up and each epoch's batches back through a
    pipe-free protocol: it calls this script with --child."""
    config, tier_dir = monarch_config(a, w, w.dataset_on_pfs, "preload")
    run.cache_dir = tier_dir
    stop_monarch(config)
    lib = os.path.join(a.build, "integrations", "preload", "libmonarch_preload.so")
    env = dict(os.environ, LD_PRELOAD=lib, MONARCH_CONFIG=config)
    out = os.path.join(w.work, "preload-child.json")
    cmd = [sys.executable, os.path.abspath(__file__), "--child-preload", out,
           "--work", a.work, "--build", a.build, "--files", str(a.files),
           "--shards", str(a.shards), "--workers", str(a.workers), "--batch", str(a.batch),
           "--epochs", str(a.epochs), "--seed", str(a.seed), "--tier", a.tier,
           "--epoch-cap", str(a.epoch_cap), "--source", a.source,
           "--moosefs-setup", a.moosefs_setup]
    # The child steps through start-up and epochs; at each boundary it waits
    # for a line on stdin so the parent can read the counters in between.
    proc = subprocess.Popen(cmd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    run.mem.roots = [proc.pid]  # the job is the child (this process only drives it)
    try:
        def step(what):
            run.pfs.reset()
            run.mem.take_peak()
            proc.stdin.write(what + "\n")
            proc.stdin.flush()
            line = proc.stdout.readline()
            if not line:
                raise SystemExit("preload: the child died (see its output above)")
            run.mem.extra = service_pids(config)
            msg = json.loads(line)
            if "error" in msg:
                raise SystemExit("preload: " + msg["error"])
            return msg
        msg = step("startup")
        run.result["startup"] = {"seconds": msg["seconds"], **run.pfs.stats(),
                                 "peak_pss": run.mem.take_peak(), "cache_bytes": du(tier_dir)}
        print(f"  {run.arm:10s} start-up {msg['seconds']:7.2f} s", flush=True)
        for e in range(a.epochs):
            counters, cpu = service_counters(config), cpu_seconds()
            msg = step("epoch")
            rec = {"epoch": e + 1, "seconds": msg["seconds"], **run.pfs.stats(),
                   "peak_pss": run.mem.take_peak(), "cache_bytes": du(tier_dir), **msg["check"],
                   "cpu": cpu_delta(cpu, cpu_seconds()),
                   "service": counters_delta(counters, service_counters(config))}
            run.result["epochs"].append(rec)
            print(f"  {run.arm:10s} epoch {e + 1} {rec['seconds']:7.2f} s  PFS "
                  f"{rec['bytes'] / 2**20:8.1f} MiB {rec['opens']:6d} opens "
                  f"{rec['metadata_ops']:6d} meta  Pss {rec['peak_pss'] / 2**20:7.1f} MiB  "
                  f"cache {rec['cache_bytes'] / 2**20:8.1f} MiB" + cpu_note(rec), flush=True)
        proc.stdin.write("quit\n")
        proc.stdin.flush()
        if proc.wait(timeout=120) != 0:
            raise SystemExit("preload: the child failed")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        stop_monarch(config)
        run.mem.extra = []
        run.mem.roots = None


def child_preload(a):
    """The preload arm's child (LD_PRELOAD set): the plain dataset, unchanged."""
    import torch  # noqa: F401
    w = Work(a, child=True)
    checker = Checker(w.records)
    ds = loader = None
    for line in sys.stdin:
        what = line.strip()
        try:
            if what == "startup":
                t = time.perf_counter()
                ds = torch_dataset(PlainFiles(w.dataset_on_pfs, w.records))
                ds[0]  # the first open connects to (and starts) the node service
                msg = {"seconds": time.perf_counter() - t}
                loader = map_loader(a, ds)
            elif what == "epoch":
                t = time.perf_counter()
                check = checker.epoch(loader, "preload", a.epoch_cap)
                msg = {"seconds": time.perf_counter() - t, "check": check}
            else:
                return 0
        except SystemExit as e:
            msg = {"error": str(e)}
        except Exception as e:  # noqa: BLE001 - reported to the parent
            msg = {"error": f"{type(e).__name__}: {e}"}
        print(json.dumps(msg), flush=True)
        if "error" in msg:
            return 1
    return 0


def read_record(w, i):
    rel, off, n, _ = w.records[i]
    with open(os.path.join(w.dataset_on_pfs, rel), "rb") as f:
        f.seek(off)
        return f.read(n)


def converted(w, name):
    """(output dir in the backing store, the same through the mount, the
    conversion record, or None when it must be made)."""
    out = os.path.join(w.formats_backing, name)
    done = os.path.join(w.formats_backing, name + ".done.json")
    via = os.path.join(w.mount, "formats", name)
    if os.path.exists(done):
        with open(done) as f:
            return out, via, json.load(f)
    shutil.rmtree(out, ignore_errors=True)
    return out, via, None


def timed_conversion(w, name, convert):
    out, via, rec = converted(w, name)
    if rec is None:
        w.pfs.reset()
        t = time.perf_counter()
        convert(out)
        rec = {"seconds": time.perf_counter() - t, **w.pfs.stats(), "output_bytes": du(out)}
        with open(os.path.join(w.formats_backing, name + ".done.json"), "w") as f:
            json.dump(rec, f)
        print(f"  {name:10s} conversion {rec['seconds']:7.2f} s "
              f"({rec['output_bytes'] / 2**20:.1f} MiB)", flush=True)
    else:
        print(f"  {name:10s} conversion reused ({rec['seconds']:.2f} s when made)", flush=True)
    return via, rec


def _litdata_item(job):
    path, off, n, i = job  # optimize() runs this in spawned processes
    with open(path, "rb") as f:
        f.seek(off)
        return {"id": i, "data": f.read(n)}


def _litdata_digest(item):
    return sample_tensor(int(item["id"]), item["data"])


def arm_litdata(a, w, run):
    import litdata

    def convert(out):
        # Best practice: optimize() into ~64 MB chunks, workers reading the source.
        jobs = [(os.path.join(w.dataset_on_pfs, r[0]), r[1], r[2], i)
                for i, r in enumerate(w.records)]
        litdata.optimize(fn=_litdata_item, inputs=jobs, output_dir=out,
                         chunk_bytes=w.chunk, num_workers=max(1, a.workers), mode="overwrite")
    via, rec = timed_conversion(w, "litdata", convert)
    run.result["conversion"] = rec

    def build():
        # litdata 0.2.76 (README "Resolve any path", scheme table): `local:`
        # names a network or shared drive whose chunks it copies into
        # `cache_dir` "to reduce NAS load" -- the PFS case. A plain path would
        # read the chunks in place (its POSIX-fast mode), uncached.
        # `max_pre_download` stays at its default (2): with a remote it is
        # raised by litdata itself (streaming/async_prefetch.py,
        # adaptive_pre_download: up to min(chunks, 32, 3 GB of chunks) per
        # worker, fetched 8 at a time, LITDATA_ASYNC_DOWNLOAD_CONCURRENCY).
        # `max_cache_size` stays at its default (75% of the free disk): its
        # README warns that a budget under 25 GB thrashes, and at 1.25x the
        # dataset its reader deleted chunks it had read with the disk under
        # budget (its size estimate counts chunks already on disk twice;
        # rivals.md, "litdata's epoch-2 re-read"), which made epoch 2 read
        # them again. The dataset fits either way.
        return litdata.StreamingDataset("local:" + via, cache_dir=run.cache_dir, shuffle=True,
                                        seed=a.seed, transform=_litdata_digest)
    ds = run.startup(build)
    # README ("StreamingDataset & StreamingDataLoader knobs"): prefer its
    # StreamingDataLoader over a plain DataLoader; it tells the dataset the
    # worker count and batch size and advances the dataset's epoch itself.
    loader = litdata.StreamingDataLoader(ds, batch_size=a.batch, num_workers=a.workers,
                                         multiprocessing_context="fork")
    for e in range(a.epochs):
        run.epoch(e, loader)


def install_torchvision_stub():
    """streaming imports torchvision.datasets.VisionDataset for its vision
    datasets, which we do not use. PyPI's torchvision 0.28.0 is built for
    CUDA torch and fails to import beside the CPU build (`operator
    torchvision::nms does not exist`), and no CPU build is reachable here:
    when it cannot be imported, a stub module stands in for that one name."""
    try:
        import torchvision.datasets  # noqa: F401
        return "torchvision"
    except Exception:  # noqa: BLE001
        import importlib.machinery
        import types
        import torch.utils.data
        tv = types.ModuleType("torchvision")
        tvd = types.ModuleType("torchvision.datasets")
        tvt = types.ModuleType("torchvision.transforms")

        class VisionDataset(torch.utils.data.Dataset):
            pass
        tvd.VisionDataset = VisionDataset
        tvt.functional = types.ModuleType("torchvision.transforms.functional")
        tv.datasets, tv.transforms = tvd, tvt
        def absent(name):
            if name.startswith("_"):
                raise AttributeError(name)

            def unavailable(*args, **kwargs):
                raise RuntimeError(f"torchvision stub: {name} is not available")
            return unavailable
        for mod in (tv, tvd, tvt, tvt.functional):
            mod.__spec__ = importlib.machinery.ModuleSpec(mod.__name__, None)
            if mod is not tv:
                mod.__getattr__ = absent
        sys.modules.update({"torchvision": tv, "torchvision.datasets": tvd,
                            "torchvision.transforms": tvt,
                            "torchvision.transforms.functional": tvt.functional})
        return "stub"


def arm_mosaic(a, w, run):
    install_torchvision_stub()
    import streaming
    from streaming.base.util import clean_stale_shared_memory

    def convert(out):
        # Best practice: MDSWriter, ~64 MB shards, uncompressed (JPEGs do not compress).
        with streaming.MDSWriter(out=out, columns={"id": "int", "data": "bytes"},
                                 size_limit=w.chunk) as writer:
            for i in range(len(w.records)):
                writer.write({"id": i, "data": read_record(w, i)})
    via, rec = timed_conversion(w, "mosaic", convert)
    run.result["conversion"] = rec
    clean_stale_shared_memory()

    class Digest(streaming.StreamingDataset):
        def get_item(self, sample_id, retry=7):
            item = super().get_item(sample_id, retry)
            return sample_tensor(int(item["id"]), item["data"])

    samples_per_shard = max(1, len(w.records) * w.chunk // max(1, w.dataset_bytes))

    def build():
        # Streaming 0.13.0 docs, "Performance Tuning" (distributed_training/
        # performance_tuning.html): if downloads lag, raise `predownload`
        # (default 8 x batch_size samples per worker) and keep the default
        # `shuffle_algo="py1e"`, which balances shard downloads; "Shuffling"
        # (dataset_configuration/shuffling.html): the default
        # `shuffle_block_size` is right in nearly all cases. Here each worker
        # looks two shards ahead. `cache_limit` is every arm's capacity (above
        # the dataset, so nothing is evicted).
        return Digest(remote=via, local=run.cache_dir, shuffle=True, shuffle_seed=a.seed,
                      shuffle_algo="py1e", batch_size=a.batch,
                      predownload=max(8 * a.batch, 2 * samples_per_shard),
                      cache_limit=w.capacity)
    ds = run.startup(build)
    # Its StreamingDataLoader (the docs' loader: a DataLoader that also counts
    # the samples it yielded, for mid-epoch resumption).
    loader = streaming.StreamingDataLoader(ds, batch_size=a.batch, num_workers=a.workers,
                                           multiprocessing_context="fork")
    try:
        for e in range(a.epochs):
            run.epoch(e, loader)
    finally:
        del loader
        clean_stale_shared_memory()


def _wds_digest(sample):
    return sample_tensor(int(sample["__key__"]), sample["bin"])


def arm_webdataset(a, w, run):
    import webdataset as wds

    def convert(out):
        os.makedirs(out)
        with wds.ShardWriter(os.path.join(out, "shard-%06d.tar"), maxsize=w.chunk,
                             maxcount=10 ** 9, verbose=0) as sink:
            for i in range(len(w.records)):
                sink.write({"__key__": "%09d" % i, "bin": read_record(w, i)})
    via, rec = timed_conversion(w, "webdataset", convert)
    run.result["conversion"] = rec
    shards = sorted(os.listdir(os.path.join(w.formats_backing, "webdataset")))
    # A remote source: `pipe:` URLs, which its FileCache copies into cache_dir
    # (plain local paths are read in place, uncached).
    urls = ["pipe:cat " + os.path.join(via, s) for s in shards]

    def build():
        # webdataset 1.0.2 (compat.py, WebDataset.__init__ warns on True):
        # `shardshuffle` a positive integer, here every shard; a sample
        # shuffle buffer after it (docs "Sharding, Parallel I/O, and
        # DataLoader", webdataset.github.io/webdataset/sharding/); batching in
        # the workers with WebLoader(batch_size=None), as its examples do,
        # since handing single samples across processes is slow
        # (github.com/tmbdev/wds-distributed README).
        return (wds.WebDataset(urls, cache_dir=run.cache_dir, cache_size=w.capacity,
                               shardshuffle=len(urls), detshuffle=True, seed=a.seed,
                               empty_check=False)
                .shuffle(1000).map(_wds_digest)
                .batched(a.batch, collation_fn=torch.utils.data.default_collate))
    import torch.utils.data
    ds = run.startup(build)
    loader = wds.WebLoader(ds, batch_size=None, num_workers=a.workers,
                           multiprocessing_context="fork")
    # detshuffle seeds each epoch's shard order with seed + its epoch count,
    # which it advances in the worker; fresh workers fork from this process
    # each epoch, so the count is set here, or every epoch would repeat the
    # first one's order.
    stages = [s for s in ds.pipeline if isinstance(s, wds.filters.detshuffle)]

    def set_epoch(e):
        for stage in stages:
            stage.epoch = e - 1
    for e in range(a.epochs):
        run.epoch(e, loader, before=set_epoch)


class FsspecFiles:
    def __init__(self, root, records, cache, protocol="filecache"):
        self.root, self.records, self.cache = root, records, cache
        self.protocol = protocol
        self.fs = None

    def __len__(self):
        return len(self.records)

    def __getitem__(self, i):
        import fsspec
        import torch.utils.data
        if self.fs is None:  # one per worker
            # A cache directory per worker. fsspec's docs ("Caching Files
            # Locally", docs/source/features.rst) guarantee only `simplecache`
            # safe across processes, and its issues #639 and #1126 (open) say
            # the cached file systems are largely untested from several
            # processes; a shared directory let a worker open a co-worker's
            # half-written copy here (rivals.md, "Fairness notes"). Both copy
            # a file under its final name (`_get_cached_file_before_open`).
            info = torch.utils.data.get_worker_info()
            me, n = (info.id, info.num_workers) if info else (0, 1)
            mine = os.path.join(self.cache, f"worker{me}")
            storage = [mine]
            if self.protocol == "filecache":
                # filecache names a file in its metadata only once its copy
                # is whole, so the co-workers' directories can be read too:
                # a list of locations is tried in order and only the last is
                # written (`cache_storage`, CachingFileSystem's docstring).
                storage = [os.path.join(self.cache, f"worker{k}") for k in range(n) if k != me]
                storage.append(mine)
            for d in storage:
                os.makedirs(d, exist_ok=True)
            self.fs = fsspec.filesystem(self.protocol, target_protocol="file",
                                        cache_storage=storage, skip_instance_cache=True)
        rel, off, n, _ = self.records[i]
        with self.fs.open(os.path.join(self.root, rel), "rb") as f:
            if off:
                f.seek(off)
            return sample_tensor(i, f.read(n))


def arm_fsspec(a, w, run, protocol="filecache"):
    ds = run.startup(lambda: torch_dataset(FsspecFiles(w.dataset_on_pfs, w.records,
                                                       run.cache_dir, protocol)))
    loader = map_loader(a, ds)
    for e in range(a.epochs):
        run.epoch(e, loader)


def arm_simplecache(a, w, run):
    """fsspec's `simplecache`: whole files, no metadata kept or checked. Its
    existence check cannot tell a co-worker's half-written copy, so each
    worker reads only its own directory."""
    arm_fsspec(a, w, run, "simplecache")


def negative_control(a, w, checker, mem):
    """The check must catch a wrong byte: flip one byte of one sample in the
    local copy, read it through the `local` arm, expect the failure."""
    rel, off, n, _ = w.records[len(w.records) // 2]
    path = os.path.join(w.local_dataset, rel)
    with open(path, "r+b") as f:
        f.seek(off + n // 2)
        byte = f.read(1)
        f.seek(off + n // 2)
        f.write(bytes([byte[0] ^ 0x40]))
    try:
        run = Run(a, "local-corrupted", w.pfs, mem, os.path.join(w.cache, "none"), checker)
        arm_plain(a, w, run, w.local_dataset)
    except SystemExit as e:
        if "wrong bytes" not in str(e):
            raise
        print(f"  negative control: one flipped byte in the local copy fails the run ({e})",
              flush=True)
    else:
        raise SystemExit("negative control: a flipped byte went unnoticed")
    finally:
        with open(path, "r+b") as f:
            f.seek(off + n // 2)
            f.write(byte)


# --- the run -----------------------------------------------------------------------------

WORK = None


class Work:
    def __init__(self, a, child=False):
        global WORK
        WORK = self
        self.work = a.work
        kind = f"shards{a.shards}" if a.shards else "files"
        self.backing = os.path.join(a.work, f"backing-{a.files}-{kind}")
        self.mount = os.path.join(a.work, "pfs")
        self.moosefs = None
        if a.source == "moosefs":
            # The dataset and the rivals' conversions live on MooseFS itself,
            # as on a cluster: the backing store and the mount are one.
            self.moosefs = MooseFS(a, None, f"rivals-{a.files}-{kind}", attach=child)
            if not self.moosefs.ok:
                raise SystemExit(self.moosefs.why)
            self.backing = self.mount = self.moosefs.mount
        self.cache = os.path.join(a.work, "cache")
        self.local = os.path.join(a.work, f"local-{a.files}-{kind}")
        self.formats_backing = os.path.join(self.backing, "formats")
        sub = "shards" if a.shards else "images"
        self.dataset_on_pfs = os.path.join(self.mount, sub)
        self.local_dataset = os.path.join(self.local, sub)
        if child:
            with open(os.path.join(self.backing, "manifest.json")) as f:
                self.records = [tuple(r) for r in json.load(f)]
            return
        self.records = generate(a, self.backing)
        os.makedirs(self.formats_backing, exist_ok=True)
        self.dataset_bytes = sum(r[2] for r in self.records)
        self.capacity = int(self.dataset_bytes * 1.25)
        # The rivals' chunk/shard size: their documented ~64 MB, smaller for
        # small datasets so that a few exist per worker.
        self.chunk = min(64 << 20, max(1 << 20, self.dataset_bytes // 16))
        if not os.path.isdir(self.local_dataset):
            shutil.rmtree(self.local, ignore_errors=True)
            shutil.copytree(os.path.join(self.backing, sub), self.local_dataset)


def write_outputs(a, w, results, commit, wall):
    out = {"command": " ".join(sys.argv), "commit": commit, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
           "files": len(w.records), "shards": a.shards, "dataset_bytes": w.dataset_bytes,
           "workers": a.workers, "batch": a.batch, "epochs": a.epochs, "reps": a.reps, "tier": a.tier,
           "capacity": w.capacity, "emulator": w.pfs.flags, "source": w.pfs.describe(), "cores": os.cpu_count(),
           "wall_seconds": wall, "load_start": w.load_start, "load_end": os.getloadavg(),
           "uncommitted": w.dirty, "script_commit": w.script_commit,
           "arms": results}
    with open(a.out + ".json", "w") as f:
        json.dump(out, f, indent=1)
    print(f"wrote {a.out}.json", flush=True)


def main():
    import torch.utils.data  # noqa: F401  (imported before any start-up is timed)
    # litdata's and streaming's downloaders copy a chunk from a local (here:
    # the FUSE mount's) path with shutil.copy, whose sendfile() fast path
    # makes the kernel read a FUSE file 4 KiB per request: 3,811 reads and
    # 2.7 s for a 15 MB shard against 241 reads and 0.21 s with read/write.
    # A Lustre client reads ahead under sendfile, so the emulator would
    # charge them for a FUSE artifact: copy with read/write, as on a PFS.
    import shutil
    shutil._USE_CP_SENDFILE = False
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default=os.path.join(REPO, "build"))
    ap.add_argument("--work", default="/var/tmp/monarch-rivals")
    ap.add_argument("--build-commit", default=None,
                    help="the commit --build was built from, recorded instead of HEAD")
    ap.add_argument("--files", type=int, default=10000)
    ap.add_argument("--shards", type=int, default=0,
                    help="pack the samples into this many large files (the shards variant)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--tier", choices=("posix", "ram"), default="posix")
    ap.add_argument("--arms", default=",".join(ALL_ARMS))
    ap.add_argument("--settle", action="store_true",
                    help="monarch and announced arms: before epochs 2.., wait (untimed) for the "
                         "node service to finish epoch 1's copies")
    ap.add_argument("--monarch-yaml", default="",
                    help="extra lines for the Monarch arms' config (an A/B of a setting), "
                         "e.g. 'placement: {verify: off}'")
    add_source_flags(ap)
    ap.add_argument("--meta-latency-us", type=int, default=1000)
    ap.add_argument("--read-latency-us", type=int, default=500)
    ap.add_argument("--bandwidth-mbps", type=int, default=300)
    add_readahead_flag(ap)
    ap.add_argument("--epoch-cap", type=float, default=180,
                    help="stop an arm whose epoch runs past this many seconds (recorded as "
                         "such; 0: no cap)")
    ap.add_argument("--reps", type=int, default=3,
                    help="run every arm this many times (rounds of all arms); the report "
                         "gives each epoch's median and range")
    ap.add_argument("--tiny", action="store_true",
                    help="CI: 300 files, 1 epoch, every arm, bytes checked, nothing written to "
                         "bench/results")
    ap.add_argument("--out", default=None,
                    help="results prefix (.json); default bench/results/rivals[-shards]")
    ap.add_argument("--child-preload", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--one-arm", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--one-arm-out", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    a.build = os.path.abspath(a.build)
    os.environ.setdefault("MONARCH_C_LIBRARY", os.path.join(a.build, "libmonarch_c.so"))
    os.environ.setdefault("MONARCH_BINARY", os.path.join(a.build, "monarch"))
    sys.path.insert(0, os.path.join(REPO, "python"))
    os.environ["PYTHONPATH"] = os.path.join(REPO, "python") + (
        ":" + os.environ["PYTHONPATH"] if os.environ.get("PYTHONPATH") else "")
    if a.child_preload:
        return child_preload(a)
    if a.tiny:
        a.files, a.epochs, a.epoch_cap, a.reps = 300, 1, 0, 1
        if a.work == "/var/tmp/monarch-rivals":
            a.work = "/var/tmp/monarch-rivals-tiny"
    if a.one_arm:
        return one_arm(a, a.one_arm)
    if a.out is None:
        a.out = (os.path.join(a.work, "rivals-tiny") if a.tiny else
                 os.path.join(HERE, "results", "rivals-shards" if a.shards else "rivals"))
    arms = a.arms.split(",")
    unknown = set(arms) - set(ALL_ARMS)
    if unknown:
        ap.error(f"unknown arms {sorted(unknown)}")
    if not os.path.exists("/dev/fuse"):
        print("SKIP: /dev/fuse does not exist (the PFS emulator needs FUSE)")
        return SKIP
    if os.geteuid() != 0:
        print("SKIP: needs root (FUSE mount, dropping nothing else)")
        return SKIP
    for need in ("monarch-epochs", "monarch", "libmonarch_c.so", "bin/pfs-emulator",
                 "integrations/preload/libmonarch_preload.so"):
        if not os.path.exists(os.path.join(a.build, need)):
            raise SystemExit(f"missing {a.build}/{need}: build first")
    os.makedirs(a.work, exist_ok=True)
    started = time.perf_counter()
    w = Work(a)
    w.load_start = os.getloadavg()
    w.pfs = MooseFSCounters(w.moosefs) if w.moosefs else Pfs(a, w.backing, w.mount)
    commit = subprocess.run(["git", "-C", REPO, "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "-C", REPO, "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True).stdout.rstrip()
    script_commit = commit
    if a.build_commit:  # --build is a copy of a build of that commit; the work tree's
        commit = a.build_commit  # edits are not in it
        dirty = ""
    print(f"dataset: {len(w.records)} samples in {len({r[0] for r in w.records})} files, "
          f"{w.dataset_bytes / 2**20:.1f} MiB; {a.workers} workers, batch {a.batch}, "
          f"{a.epochs} epochs; cache capacity {w.capacity / 2**20:.0f} MiB ({a.tier} tier); "
          f"{w.pfs.describe()}; commit {commit}"
          f"{' (uncommitted: ' + ', '.join(l[3:] for l in dirty.splitlines()) + ')' if dirty else ''}",
          flush=True)
    results = {arm: {"arm": arm, "runs": []} for arm in arms}
    try:
        # --reps rounds of every arm, the arms in turn within a round, so
        # that what else loads the machine falls on all of them alike; every
        # other round in the reverse order, so that a machine slowing down
        # (or speeding up) through a round does not favour the arms that
        # come first.
        for rep in range(a.reps):
            if a.reps > 1:
                print(f"round {rep + 1} of {a.reps}", flush=True)
            for arm in (arms if rep % 2 == 0 else arms[::-1]):
                # Each arm in a fresh process: none pays for another's imports in
                # its memory, none inherits another's state.
                out = os.path.join(a.work, f"arm-{arm}.json")
                if os.path.exists(out):
                    os.unlink(out)
                cmd = [sys.executable, os.path.abspath(__file__), "--one-arm", arm,
                       "--one-arm-out", out] + passthrough(a)
                # Every arm's epoch 1 meets a cold source (MooseFS's client
                # and chunk server caches hold the last arm's reads).
                w.pfs.drop_cache()
                r = subprocess.run(cmd)
                rec = {"arm": arm, "error": f"its process exited {r.returncode}"}
                if os.path.exists(out):
                    with open(out) as f:
                        rec = json.load(f)
                if r.returncode != 0:
                    rec.setdefault("error", f"its process exited {r.returncode}")
                    print(f"  {arm}: FAILED (exit {r.returncode})", flush=True)
                results[arm]["runs"].append(rec)
                if "error" in rec:  # one failed run fails the arm
                    results[arm].setdefault("error", rec["error"])
        if a.tiny:
            mem = MemorySampler()
            try:
                negative_control(a, w, Checker(w.records), mem)
            finally:
                mem.stop()
    finally:
        w.pfs.stop()
    # Tracked files modified in the work tree when measured (the build used
    # is whatever --build holds).
    w.dirty = [line[3:] for line in dirty.splitlines() if line.strip()]
    w.script_commit = script_commit
    write_outputs(a, w, results, commit, time.perf_counter() - started)
    if not a.tiny:
        subprocess.run([sys.executable, os.path.join(HERE, "rivals", "report.py"),
                        "--results", os.path.dirname(a.out)], check=False)
    failed = [arm for arm in arms if "error" in results.get(arm, {"error": 1})]
    print(f"{len(arms) - len(failed)} passed, {len(failed)} failed", flush=True)
    return 1 if failed else 0


def passthrough(a):
    return ["--build", a.build, "--work", a.work, "--files", str(a.files),
            "--shards", str(a.shards), "--workers", str(a.workers), "--batch", str(a.batch),
            "--epochs", str(a.epochs), "--seed", str(a.seed), "--tier", a.tier,
            "--epoch-cap", str(a.epoch_cap), "--meta-latency-us", str(a.meta_latency_us),
            "--read-latency-us", str(a.read_latency_us),
            "--bandwidth-mbps", str(a.bandwidth_mbps), "--monarch-yaml", a.monarch_yaml] + (
                ["--tiny"] if a.tiny else []) + (["--settle"] if a.settle else []) + (
                ["--no-readahead"] if a.no_readahead else []) + (
                ["--source", a.source, "--moosefs-setup", a.moosefs_setup,
                 "--moosefs-read-mbps", str(a.moosefs_read_mbps)])


def one_arm(a, arm):
    """One arm, in this process; its record goes to --one-arm-out."""
    w = Work(a, child=True)
    w.dataset_bytes = sum(r[2] for r in w.records)
    w.capacity = int(w.dataset_bytes * 1.25)
    w.chunk = min(64 << 20, max(1 << 20, w.dataset_bytes // 16))
    w.pfs = (MooseFSCounters(w.moosefs) if w.moosefs else
             Pfs(a, w.backing, w.mount, attach=True))
    checker = Checker(w.records)
    mem = MemorySampler()
    cache_dir = os.path.join(w.cache, arm)
    shutil.rmtree(cache_dir, ignore_errors=True)
    os.makedirs(cache_dir)
    run = Run(a, arm, w.pfs, mem, cache_dir, checker)
    run.result["load_start"] = os.getloadavg()
    try:
        if arm == "pfs":
            arm_plain(a, w, run, w.dataset_on_pfs)
        elif arm == "local":
            arm_plain(a, w, run, w.local_dataset)
        elif arm in ("monarch", "announced"):
            arm_monarch(a, w, run, announce=(arm == "announced"))
        elif arm == "preload":
            arm_preload(a, w, run)
        else:
            globals()["arm_" + arm](a, w, run)
    except Capped:
        run.result["capped"] = a.epoch_cap
    except ImportError as e:
        run.result["error"] = (f"cannot run: {type(e).__name__}: {e} (bench/rivals/install.sh "
                               "installs the rivals)")
    except SystemExit as e:  # wrong bytes, a missing sample, a failed step
        run.result["error"] = str(e)
    except Exception as e:  # noqa: BLE001 - the arm failed; its record says how
        import traceback
        traceback.print_exc()
        run.result["error"] = f"{type(e).__name__}: {e}"
    finally:
        mem.stop()
        shutil.rmtree(run.cache_dir, ignore_errors=True)
    run.result["load_end"] = os.getloadavg()
    with open(a.one_arm_out, "w") as f:
        json.dump(run.result, f)
    if "error" in run.result:
        print(f"{arm}: {run.result['error']}", flush=True)
        return 1
    return 0


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    sys.exit(main())
