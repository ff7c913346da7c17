#!/usr/bin/env python3
"""The transparent mode (LD_PRELOAD=libmonarch_preload.so) against the same
program without it, in one run, in alternating repetitions.

The program is bench_plain_reader (bench/bench_plain_reader.c): plain libc
open/fstat/read/pread/close. Two datasets, both behind the PFS emulator:

  small   many ImageNet-like files (64-160 KiB), each read whole
  shards  a few 32 MiB shards, read in 256 KiB preads

Comparisons (each A against B, B the baseline; A and B alternate):

  hot      A: the reader under the preload, the dataset promoted into the
           node service's RAM tier; B: the reader on a pre-staged local copy
           (page cache warm), no preload. The file list is read --hot-passes
           times per run so a run lasts long enough to time.  Target <= 1.05.
  epoch 1  A: the reader under the preload with a fresh service (RAM tier
           empty, started before the timed run as a Slurm prolog would);
           B: the reader on the emulator, no preload. Also the emulator's
           bytes and operations during A: bytes must equal the dataset's
           size.  Target <= 1.05.
  outside  A: 4 KiB preads at random offsets of a file outside the dataset,
           under the preload (configured, service running); B: the same
           without it.  Target <= 1.02.

Times are whole processes (start to exit), as a user sees them; the median
of the per-repetition ratios A/B is the figure. Needs root (FUSE).

usage: sudo python3 bench/preload_epochs.py [--build build] [--reps 5]
       [--out bench/results/preload.md]
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

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from service_epochs import Pfs, add_emulator_flags, fmt, start_service, stop_service  # noqa: E402

REPO = os.path.dirname(HERE)
MIB = 1048576.0


def write_dataset(base, small_files, shards):
    rng = random.Random(7)
    small = []
    for i in range(small_files):
        d = os.path.join(base, "small", "class%02d" % (i % 20))
        os.makedirs(d, exist_ok=True)
        p = os.path.join(d, "img%05d.jpg" % i)
        with open(p, "wb") as f:
            f.write(rng.randbytes(rng.randint(64 << 10, 160 << 10)))
        small.append(os.path.relpath(p, base))
    big = []
    os.makedirs(os.path.join(base, "shards"), exist_ok=True)
    for i in range(shards):
        p = os.path.join(base, "shards", "shard%02d.tfrecord" % i)
        with open(p, "wb") as f:
            f.write(rng.randbytes(32 << 20))
        big.append(os.path.relpath(p, base))
    return small, big


def write_list(path, root, names, passes=1, seed=0):
    order = []
    rng = random.Random(seed)
    for _ in range(passes):
        shuffled = list(names)
        rng.shuffle(shuffled)
        order += shuffled
    with open(path, "w") as f:
        f.write("".join(os.path.join(root, n) + "\n" for n in order))


def timed(cmd, env):
    start = time.monotonic()
    r = subprocess.run(cmd, env=env, capture_output=True, text=True)
    wall = time.monotonic() - start
    if r.returncode != 0:
        sys.exit("failed: %s\n%s%s" % (" ".join(cmd), r.stdout, r.stderr))
    fields = r.stdout.split()
    return wall, int(fields[1]), int(fields[3])  # seconds, bytes, checksum


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--build", default=os.path.join(REPO, "build"))
    p.add_argument("--work", default="/var/tmp/monarch-preload-bench")
    p.add_argument("--small-files", type=int, default=1500)
    p.add_argument("--shards", type=int, default=8)
    p.add_argument("--hot-passes", type=int, default=8)
    p.add_argument("--outside-reads", type=int, default=1000000)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--no-stage-ahead", action="store_true",
                   help="prefetch.stage_ahead: false (epoch 1 served by the reader's own misses)")
    add_emulator_flags(p)
    p.add_argument("--out", default=os.path.join(HERE, "results", "preload.md"))
    a = p.parse_args()
    a.build = os.path.abspath(a.build)
    reader = os.path.join(a.build, "bench", "bench_plain_reader")
    preload = os.path.join(a.build, "integrations", "preload", "libmonarch_preload.so")
    monarch = os.path.join(a.build, "monarch")
    for path in (reader, preload, monarch):
        if not os.path.exists(path):
            sys.exit("missing %s: build first" % path)

    shutil.rmtree(a.work, ignore_errors=True)
    backing = os.path.join(a.work, "backing")
    local = os.path.join(a.work, "local")
    mount = os.path.join(a.work, "pfs")
    small, shards = write_dataset(backing, a.small_files, a.shards)
    shutil.copytree(backing, local)
    dataset_bytes = {
        "small": sum(os.path.getsize(os.path.join(backing, n)) for n in small),
        "shards": sum(os.path.getsize(os.path.join(backing, n)) for n in shards),
    }
    pfs = Pfs(a, backing, mount)
    if not pfs.ok:
        sys.exit("PFS emulator unavailable: " + pfs.why)
    outside = os.path.join(a.work, "outside.bin")
    with open(outside, "wb") as f:
        f.write(os.urandom(64 << 20))

    runtime = os.path.join(a.work, "rt")
    config = os.path.join(a.work, "job.yaml")
    with open(config, "w") as f:
        f.write("dataset:\n  path: %s\ntiers:\n  - {kind: ram, capacity: 2GiB}\n"
                "  - {kind: source}\nnode:\n  shared: true\n  runtime_dir: %s\n"
                "  autostart: false\n  idle_exit: 0\n" % (mount, runtime))
        if a.no_stage_ahead:
            f.write("prefetch: {stage_ahead: false}\n")
    plain_env = dict(os.environ)
    plain_env.pop("LD_PRELOAD", None)
    preload_env = dict(plain_env, LD_PRELOAD=preload, MONARCH_CONFIG=config)

    lists = {}
    for kind, names in (("small", small), ("shards", shards)):
        for where, root in (("pfs", mount), ("local", local)):
            for passes in (1, a.hot_passes):
                path = os.path.join(a.work, "%s-%s-%d.list" % (kind, where, passes))
                write_list(path, root, names, passes, seed=passes)
                lists[(kind, where, passes)] = path

    def command(kind, where, passes):
        mode = ["whole"] if kind == "small" else ["chunks"]
        args = [lists[(kind, where, passes)]] + ([] if kind == "small" else [str(256 << 10)])
        return [reader] + mode + args

    results = {}

    def record(name, a_wall, b_wall, extra=None):
        r = results.setdefault(name, {"a": [], "b": [], "ratio": [], "extra": []})
        r["a"].append(a_wall)
        r["b"].append(b_wall)
        r["ratio"].append(a_wall / b_wall)
        if extra is not None:
            r["extra"].append(extra)

    started = time.monotonic()
    for rep in range(a.reps):
        a_first = rep % 2 == 0
        # Epoch 1: a fresh service per repetition, so its RAM tier is empty.
        for kind in ("small", "shards"):
            proc, log = start_service(a, config, a.work)
            pfs.reset()

            def run_a():
                wall, nbytes, checksum = timed(command(kind, "pfs", 1), preload_env)
                return wall, checksum, pfs.stats()

            def run_b():
                return timed(command(kind, "pfs", 1), plain_env)

            if a_first:
                wa, ca, counters = run_a()
                wb, _, cb = run_b()
            else:
                wb, _, cb = run_b()
                pfs.reset()
                wa, ca, counters = run_a()
            if ca != cb:
                sys.exit("epoch 1 %s: checksums differ with the preload" % kind)
            record("epoch1-" + kind, wa, wb, {"source_bytes": counters["bytes_read"],
                                               "metadata_ops": counters["metadata_ops"],
                                               "dataset_bytes": dataset_bytes[kind]})
            # Hot: the same service, now holding the dataset.
            subprocess.run([monarch, "stage", "--config", config], check=True,
                           capture_output=True)
            order = [("a", preload_env, "pfs"), ("b", plain_env, "local")]
            if not a_first:
                order.reverse()
            walls = {}
            sums = {}
            for tag, env, where in order:
                walls[tag], _, sums[tag] = timed(command(kind, where, a.hot_passes), env)
            if sums["a"] != sums["b"]:
                sys.exit("hot %s: checksums differ with the preload" % kind)
            record("hot-" + kind, walls["a"], walls["b"])
            if kind == "shards":
                small_cmd = [reader, "small", outside, "4096", str(a.outside_reads)]
                order = [("a", preload_env), ("b", plain_env)]
                if not a_first:
                    order.reverse()
                for tag, env in order:
                    walls[tag], _, sums[tag] = timed(small_cmd, env)
                record("outside", walls["a"], walls["b"])
            stop_service(a, config, proc, log)
            # The next repetition's epoch 1 starts cold: no kept RAM copies.
            subprocess.run([monarch, "purge", "--config", config], check=True,
                           capture_output=True)
        print("rep %d done (%.0f s)" % (rep + 1, time.monotonic() - started), flush=True)
    pfs.stop()

    # Epoch 1 of small files: issue 41's 0.6x of plain reads on the emulator.
    targets = {"hot-small": 1.05, "hot-shards": 1.05, "epoch1-small": 0.6,
               "epoch1-shards": 1.05, "outside": 1.02}
    what = {
        "hot-small": "hot, %d small files (%.0f MiB) whole, x%d" % (
            len(small), dataset_bytes["small"] / MIB, a.hot_passes),
        "hot-shards": "hot, %d x 32 MiB shards in 256 KiB preads, x%d" % (len(shards),
                                                                          a.hot_passes),
        "epoch1-small": "epoch 1 on the emulator, small files",
        "epoch1-shards": "epoch 1 on the emulator, shards",
        "outside": "%d 4 KiB preads of a file outside the dataset" % a.outside_reads,
    }
    baseline = {"hot-small": "local copy, no preload", "hot-shards": "local copy, no preload",
                "epoch1-small": "emulator, no preload", "epoch1-shards": "emulator, no preload",
                "outside": "no preload"}
    lines = ["<!-- preload_epochs.py: begin -->",
             "Command: `sudo python3 bench/preload_epochs.py --reps %d%s` (%s, %d cores). "
             "Emulator: %s." % (a.reps, " --no-stage-ahead" if a.no_stage_ahead else "",
                                time.strftime("%Y-%m-%d"), os.cpu_count(),
                                " ".join(pfs.flags)), "",
             "Whole-process wall seconds, min / median / max over %d repetitions; ratio = "
             "preload / baseline per repetition." % a.reps, "",
             "| comparison | baseline | preload s | baseline s | ratio | target | met |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for name in ("hot-small", "hot-shards", "epoch1-small", "epoch1-shards", "outside"):
        r = results[name]
        med = statistics.median(r["ratio"])
        lines.append("| %s | %s | %s | %s | %s | %.2f | %s |" % (
            what[name], baseline[name], fmt(r["a"]), fmt(r["b"]), fmt(r["ratio"]),
            targets[name], "yes" if med <= targets[name] else "no (median %.3f)" % med))
    lines += ["", "Source traffic during the preload's epoch 1 (emulator counters):", "",
              "| dataset | dataset bytes | source bytes read | metadata ops |",
              "| --- | --- | --- | --- |"]
    for kind in ("small", "shards"):
        for e in results["epoch1-" + kind]["extra"]:
            lines.append("| %s | %d | %d | %d |" % (kind, e["dataset_bytes"], e["source_bytes"],
                                                   e["metadata_ops"]))
    lines.append("<!-- preload_epochs.py: end -->")
    report = "\n".join(lines) + "\n"
    print(report)
    old = open(a.out).read() if os.path.exists(a.out) else "# Transparent mode (LD_PRELOAD)\n\n"
    if "<!-- preload_epochs.py: begin -->" in old:
        head = old.split("<!-- preload_epochs.py: begin -->")[0]
        tail = old.split("<!-- preload_epochs.py: end -->\n", 1)[-1]
        old = head + report + tail
    else:
        old = old + report
    with open(a.out, "w") as f:
        f.write(old)
    with open(os.path.splitext(a.out)[0] + ".json", "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
