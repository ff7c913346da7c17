#!/usr/bin/env python3
"""What Monarch buys, measured: the run and the report of scripts/demo.sh.

Reads one ImageNet-like dataset for the same epochs in the same shuffled
orders twice: with plain reads (`monarch-epochs --mode plain`: open, pread,
close), then through Monarch's embedded default (a RAM tier over the
source). The source is the PFS emulator (tools/pfs_emulator) at its
defaults, mounted over the dataset: it opens every file with direct_io, so
the kernel's page cache serves no read and every read pays the emulator's
latency and bandwidth, and it counts what reaches it. Its counters, read
before every epoch and after the last (`monarch-epochs --before-epoch`),
give both arms' bytes and metadata operations per epoch. Where FUSE cannot
mount (or with --local), both arms read the local directory instead, its
files dropped from the page cache before every epoch, and the bytes from
the source are those each arm read from the dataset's files as it counts
them (all of the plain reads', Monarch's source tier's).

Every figure printed is measured in this run.

  scripts/demo.py --build build --dir /tmp/monarch-demo [monarch-epochs options...]
  scripts/demo.py ... --moosefs [DIRECT|AUTO]   the source on a real MooseFS

With --moosefs the dataset is copied onto MooseFS (scripts/moosefs.sh: a
master and a chunk server in a network namespace, the FUSE client over a
veth pair), and the bytes from the source are those that crossed the veth
pair from the chunk server. DIRECT (the default) mounts the client with
mfscachemode=DIRECT, a dataset larger than the client's memory; AUTO lets
the kernel keep the client's pages, as a small dataset on a real node would.

Options after the demo's own go to both runs of monarch-epochs (e.g.
--threads 8, --epochs 5, --read-size 64KiB, --seed 7). The demo directory
holds the dataset, the mount point, the counters and both runs' output; an
existing one without the demo's stamp file is refused.
"""

import argparse
import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import time

FILES = 2000
PROFILE = "imagenet"
GENERATE_SEED = 42  # The dataset is the same on every machine.
STAMP = ".monarch-demo"  # In the demo directory: made by this script.
# Flags the demo sets itself; passed through, they would undo its set-up.
OWN_FLAGS = {"--dataset", "--config", "--mode", "--json", "--before-epoch", "--generate",
             "--profile", "--file-size", "--plain-dir", "--partition", "--barrier-dir"}


class DemoError(Exception):
    """A one-line failure; `code` 2 for bad input, 1 for a failed step."""

    def __init__(self, message, code=1):
        super().__init__(message)
        self.code = code


def size(n):
    return "%.1f MiB" % (n / 1048576.0) if n else "0 bytes"


def ratio(x):
    return ("%.2fx" % x) if x >= 0.01 else ("%.3fx" % x)


def run(cmd, log):
    """Runs `cmd` with its output in the file `log`; a failure raises
    DemoError with the output's last lines."""
    with open(log, "w") as out:
        r = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT)
    if r.returncode != 0:
        with open(log) as f:
            tail = "".join(f.readlines()[-5:])
        raise DemoError("%s exited with %d (output in %s):\n%s"
                        % (" ".join(cmd[:1] + cmd[1:4]), r.returncode, log, tail.rstrip()))


def listing(root):
    """[files, bytes] of the files under `root`."""
    files = total = 0
    for d, _, names in os.walk(root):
        for n in names:
            files += 1
            total += os.lstat(os.path.join(d, n)).st_size
    return [files, total]


def claim_demo_dir(demo_dir):
    """Makes `demo_dir` the demo's (stamped), or refuses one that is not."""
    stamp = os.path.join(demo_dir, STAMP)
    if os.path.lexists(demo_dir) and not os.path.isdir(demo_dir):
        raise DemoError("%s exists and is not a directory; set MONARCH_DEMO_DIR to another path"
                        % demo_dir, 2)
    if os.path.isdir(demo_dir) and not os.path.exists(stamp) and os.listdir(demo_dir):
        raise DemoError("%s exists and was not made by scripts/demo.sh (it has no %s); remove "
                        "it or set MONARCH_DEMO_DIR to another path" % (demo_dir, STAMP), 2)
    os.makedirs(demo_dir, exist_ok=True)
    if not os.path.exists(stamp):
        with open(stamp, "w") as f:
            json.dump({}, f)  # Ours from here on, even if generation is interrupted.


def prepare_dataset(epochs_bin, demo_dir):
    """The dataset in demo_dir/dataset: kept if whole, else made again.
    Returns [files, bytes]."""
    stamp = os.path.join(demo_dir, STAMP)
    dataset = os.path.join(demo_dir, "dataset")
    with open(stamp) as f:
        made = json.load(f)
    if made.get("files") == FILES and os.path.isdir(dataset) and listing(dataset) == [
            made["files"], made["bytes"]]:
        return [made["files"], made["bytes"]]
    print("generating the dataset: %d ImageNet-like files in %s" % (FILES, dataset), flush=True)
    with open(stamp, "w") as f:
        json.dump({}, f)
    shutil.rmtree(dataset, ignore_errors=True)
    run([epochs_bin, "--dataset", dataset, "--generate", str(FILES), "--profile", PROFILE,
         "--seed", str(GENERATE_SEED), "--epochs", "0"], os.path.join(demo_dir, "generate.log"))
    files, total = listing(dataset)
    with open(stamp, "w") as f:
        json.dump({"files": files, "bytes": total, "profile": PROFILE, "seed": GENERATE_SEED}, f)
    return [files, total]


class MooseFSSource:
    """The dataset on a real MooseFS (scripts/moosefs.sh), copied there once.
    `error` says why MooseFS could not start."""

    def __init__(self, script, dataset, cache_mode):
        self.script, self.mount, self.config = script, None, None
        r = subprocess.run([script, "start", "--cache-mode", cache_mode], capture_output=True,
                           text=True)
        self.error = None if r.returncode == 0 else (r.stderr.strip().splitlines() or ["?"])[-1]
        if self.error:
            return
        root = os.path.join(r.stdout.strip().splitlines()[-1], "monarch-demo")
        self.mount = os.path.join(root, "dataset")
        if listing(self.mount) != listing(dataset):
            print("copying the dataset onto MooseFS ...", flush=True)
            shutil.rmtree(self.mount, ignore_errors=True)
            os.makedirs(root, exist_ok=True)
            shutil.copytree(dataset, self.mount)

    def snapshot_command(self, path):
        """A shell command that writes the source's counters to `path`."""
        return "printf '{\"counters\": {\"bytes_read\": %%s}}' $(%s bytes) > %s" % (
            self.script, path)

    def stop(self):
        pass  # The file system stays up (scripts/moosefs.sh stop ends it).


class Emulator:
    """The PFS emulator over `dataset`, at its defaults, mounted at `mount`.
    `error` says why it could not mount."""

    def __init__(self, script, dataset, mount):
        self.script, self.mount = script, mount
        self.stop()  # A mount left by a run that was killed.
        r = subprocess.run([script, "start", dataset, mount], capture_output=True, text=True)
        self.error = None if r.returncode == 0 else (r.stderr.strip().splitlines() or ["?"])[-1]
        self.config = None
        if self.error is None:
            with open(r.stdout.strip()) as f:
                self.config = json.load(f)["config"]

    def stop(self):
        subprocess.run([self.script, "stop", self.mount], stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)


def run_arm(epochs_bin, source, mode, demo_dir, extra, emulator):
    """One arm's epochs: (per-epoch JSON of monarch-epochs, bytes and
    metadata ops from the source per epoch, final stats)."""
    snapshot = os.path.join(demo_dir, "%s-counters-$MONARCH_EPOCH.json" % mode)
    epochs_json = os.path.join(demo_dir, "%s-epochs.json" % mode)
    log = os.path.join(demo_dir, "%s.log" % mode)
    cmd = [epochs_bin, "--dataset", source, "--mode", mode, "--epochs", "3", "--threads", "4",
           "--json", epochs_json]
    if isinstance(emulator, MooseFSSource):
        cmd += ["--before-epoch", emulator.snapshot_command(snapshot)]
        # Each arm starts cold: the other arm's reads left the dataset in the
        # client's and the chunk server's page caches.
        subprocess.run([emulator.script, "drop-cache"], check=True, capture_output=True)
    elif emulator:
        cmd += ["--before-epoch", "%s stats %s > %s" % (emulator.script, emulator.mount, snapshot)]
    else:
        cmd.append("--drop-source-cache")
    for name in os.listdir(demo_dir):  # An earlier run's, which must not be taken for this one's.
        if name.startswith(mode + "-"):
            os.remove(os.path.join(demo_dir, name))
    run(cmd + extra, log)
    if not os.path.exists(epochs_json):
        raise DemoError("monarch-epochs ran no epoch (--epochs 0?); nothing to compare", 2)
    with open(epochs_json) as f:
        epochs = json.load(f)
    if emulator:
        counters = []
        for e in range(1, len(epochs) + 2):
            with open(snapshot.replace("$MONARCH_EPOCH", str(e))) as f:
                c = json.load(f)["counters"]
            counters.append((c["bytes_read"], c.get("metadata_ops")))
        # MooseFS's veth pair counts bytes only, not metadata operations.
        from_source = [{"bytes": b[0] - a[0], "ops": None if a[1] is None else b[1] - a[1]}
                       for a, b in zip(counters, counters[1:])]
    else:
        # Without the emulator, the bytes read from the dataset's files as
        # each arm counts them: every plain read's, Monarch's source tier's.
        from_source = [{"bytes": e["bytes"] if mode == "plain" else e["served"]["source"]["bytes"],
                        "ops": None} for e in epochs]
    final, threads = {}, None
    with open(log) as f:
        for line in f:
            if line.startswith("stats: "):
                final = json.loads(line[len("stats: "):])
            elif line.startswith("dataset ") and " threads, " in line:
                threads = int(line.split(" threads, ")[0].rsplit(" ", 1)[1])
    final["threads"] = threads
    return epochs, from_source, final


def why_not_in_ram(final, epochs, files):
    """Why not every copy was in RAM when epoch 2 ended, in one line."""
    if final.get("promotions_skipped", 0):
        return ("%d files did not fit in the RAM tier (half the memory free at start-up)"
                % final["promotions_skipped"])
    if final.get("promotions_failed", 0):
        return "%d copies failed (see monarch.log)" % final["promotions_failed"]
    missing = files - epochs[1]["published_files"]
    # Neither skipped nor failed: still on their way (being copied, or
    # committed: a stat of the source file each) when the epoch ended.
    one = missing == 1
    line = ("%d %s still on %s way to RAM (being copied or committed) when epoch 2 ended"
            % (missing, "copy was" if one else "copies were", "its" if one else "their"))
    if len(epochs) >= 3 and epochs[2]["published_files"] == files:
        line += "; all were in RAM when epoch 3 ended"
    return line


def report(files, total, source_line, plain, monarch, moosefs=False):
    p_epochs, p_source, _ = plain
    m_epochs, m_source, m_final = monarch
    n = len(p_epochs)
    ops = p_source[0]["ops"] is not None

    def from_source(c):
        return size(c["bytes"]) + (", %d ops" % c["ops"] if ops else "")

    header = ("epoch", "plain reads", "Monarch", "Monarch/plain", "source: plain",
              "source: Monarch", "copies in RAM")
    rows = [(str(e + 1), "%.3f s" % p_epochs[e]["seconds"], "%.3f s" % m_epochs[e]["seconds"],
             ratio(m_epochs[e]["seconds"] / p_epochs[e]["seconds"]), from_source(p_source[e]),
             from_source(m_source[e]), "%d of %d" % (m_epochs[e]["published_files"], files))
            for e in range(n)]
    widths = [max(len(r[i]) for r in [header] + rows) for i in range(len(header))]
    print()
    print("%s files, %s, %d epochs each in the same shuffled orders, %d reader threads;"
          % (format(files, ","), size(total), n, m_final["threads"]))
    print(source_line)
    print()
    for r in [header] + rows:
        print("  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                        for i, (c, w) in enumerate(zip(r, widths))))
    if ops:
        print("source: bytes and metadata operations (lookups, opens, getattrs) that reached the "
              "PFS in the epoch; Monarch's commit of a copy over one chunk (1 MiB) adds a getattr")
    elif moosefs:
        print("source: bytes that crossed the veth pair from MooseFS's chunk server in the epoch "
              "(data and protocol headers)")
    else:
        print("source: bytes read from the dataset's files in the epoch, as each arm counts them "
              "(the plain reads; Monarch's source tier)")
    print("copies in RAM: Monarch's complete copies when the epoch ended")
    for e in range(n):
        if p_source[e]["bytes"] < total:
            print("warning: in epoch %d plain reads took only %s of %s from the source: the page "
                  "cache served the rest, so that baseline is too fast"
                  % (e + 1, size(p_source[e]["bytes"]), size(total)))
    print()
    first = ratio(m_epochs[0]["seconds"] / p_epochs[0]["seconds"])
    if n < 2:
        print("Epoch 1, which copies the dataset into RAM: %s the time of plain reads." % first)
        return
    if m_epochs[1]["published_files"] < files:
        print("Not every copy was in RAM when epoch 2 ended: %s."
              % why_not_in_ram(m_final, m_epochs, files))
    later = range(1, n)
    times = sum(m_epochs[e]["seconds"] for e in later) / sum(p_epochs[e]["seconds"] for e in later)
    print("%s: %s the time of plain reads, %s from the source (epoch 1, which copies the "
          "dataset into RAM: %s)." % ("Epoch 2" if n == 2 else "Epochs 2-%d" % n, ratio(times),
                                      size(sum(m_source[e]["bytes"] for e in later)), first))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0], allow_abbrev=False)
    parser.add_argument("--build", required=True, help="the build directory")
    parser.add_argument("--dir", required=True, help="the demo directory")
    parser.add_argument("--local", action="store_true",
                        help="read the local directory even where the PFS emulator mounts")
    parser.add_argument("--moosefs", nargs="?", const="DIRECT", choices=("DIRECT", "AUTO"),
                        help="read the dataset from a real MooseFS (scripts/moosefs.sh) mounted "
                             "with this mfscachemode (DIRECT: no client cache)")
    args, extra = parser.parse_known_args()
    for flag in extra:
        if flag in OWN_FLAGS:
            raise DemoError("%s is the demo's own; extra options go to both runs of "
                            "monarch-epochs (e.g. --threads 8, --epochs 5)" % flag, 2)
    start = time.monotonic()
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    build = os.path.abspath(args.build)
    epochs_bin = os.path.join(build, "monarch-epochs")
    # The emulator's script, here and in the --before-epoch commands, runs this binary.
    os.environ["MONARCH_PFS_EMULATOR"] = os.path.join(build, "bin", "monarch-pfs-emulator")
    demo_dir = os.path.abspath(args.dir)
    claim_demo_dir(demo_dir)
    # One demo at a time in a directory: they would share the mount point.
    lock = open(os.path.join(demo_dir, "lock"), "w")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise DemoError("another scripts/demo.sh is running in %s" % demo_dir, 2)
    files, total = prepare_dataset(epochs_bin, demo_dir)
    dataset = os.path.join(demo_dir, "dataset")
    emulator = None
    if args.moosefs and args.local:
        raise DemoError("--moosefs and --local (MONARCH_DEMO_LOCAL=1) exclude each other", 2)
    if args.moosefs:
        emulator = MooseFSSource(os.path.join(repo, "scripts", "moosefs.sh"), dataset,
                                 args.moosefs)
        if emulator.error:
            raise DemoError("MooseFS could not start: %s" % emulator.error)
        source_line = ("source: MooseFS (a master and a chunk server in a network namespace, "
                       "the FUSE client over a veth pair, mfscachemode=%s%s); bytes are those "
                       "that crossed the veth pair" % (
                           args.moosefs, ": the client caches nothing" if args.moosefs == "DIRECT"
                           else ": the kernel keeps the client's pages"))
    elif args.local:
        source_line = ("source: the local directory %s, its files dropped from the page cache "
                       "before each epoch (MONARCH_DEMO_LOCAL=1)" % dataset)
    else:
        emulator = Emulator(os.path.join(repo, "tools", "pfs_emulator", "pfs-emulator"), dataset,
                            os.path.join(demo_dir, "pfs"))
        if emulator.error:
            source_line = ("source: the local directory, its files dropped from the page cache "
                           "before each epoch: the PFS emulator could not mount (%s)"
                           % emulator.error)
            emulator = None
        else:
            c = emulator.config
            source_line = ("source: the PFS emulator at its defaults, a busy Lustre (%g ms per "
                           "metadata op, %g ms per read, %g MB/s, %d ops at once; direct_io: the "
                           "page cache serves no read)"
                           % (c["meta_latency_us"] / 1000.0, c["read_latency_us"] / 1000.0,
                              c["bandwidth_mbps"], c["max_concurrent"]))
    try:
        source = emulator.mount if emulator else dataset
        print("reading the dataset with plain reads ...", flush=True)
        plain = run_arm(epochs_bin, source, "plain", demo_dir, extra, emulator)
        print("reading the dataset through Monarch ...", flush=True)
        monarch = run_arm(epochs_bin, source, "monarch", demo_dir, extra, emulator)
    finally:
        if emulator:
            emulator.stop()
    report(files, total, source_line, plain, monarch, moosefs=bool(args.moosefs))
    print("(this run: %.0f s; the output of both: %s/plain.log and monarch.log)"
          % (time.monotonic() - start, demo_dir))


if __name__ == "__main__":
    # SIGTERM and SIGHUP unwind as Ctrl-C does, so the mount is stopped.
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda signum, frame: sys.exit(128 + signum))
    try:
        main()
    except DemoError as e:
        print("demo: error: %s" % e, file=sys.stderr)
        sys.exit(e.code)
    except KeyboardInterrupt:
        print("demo: interrupted", file=sys.stderr)
        sys.exit(130)
