#!/usr/bin/env python3
"""Memory mappings of a big dataset file through the transparent mode
(LD_PRELOAD=libmonarch_preload.so), against the same program without it, in
one run. The file (--gib GiB of random bytes) sits behind the PFS emulator.

Two cases, each run by every arm in turns, the page cache dropped before
each run so that every arm's pages come from the emulator:

  one byte      one process: numpy.memmap of the file, read one byte (the
                case issue 30 reported: a mapping used to read the whole
                file first);
  random pages  --procs processes at once, each numpy.memmap-ing the file
                and reading --pages random pages (seeded per process).

Arms: `plain` (no preload), `monarch` (the preload of --build, a node
service with a RAM tier larger than the file), `copies` (the same preload,
a node service whose posix tier holds the whole file, staged by extents
before the runs and checked: the mappings map those copies in place),
`ram` (the same, with the file staged into the service's RAM tier: the
mappings map the tier's own memory),
`local` (no preload, the emulator's backing file itself, on the local disk:
what the kernel does for a mapping of a local file, which the copies are),
and with --old-preload an earlier build of the library (`old`), to show
what changed. The page cache is dropped before each run, the copies' too:
their pages come from the local disk.

Reported per arm and case: wall time of the slowest process (start to
exit), the resident memory each process gained (VmRSS after its reads
minus before the mapping), the node's memory for the file once every
process has read (the sum of the processes' Pss of their mapping of it,
so shared pages count once, plus the copies in the node service's RAM
tier; the parts of the mappings that are those copies count once, as the
copies), and the bytes the emulator served. Ratios: time against plain;
node memory against one copy of the pages the processes touched (target
<= 1.1) and against the file.

With --source moosefs the file is copied onto a real MooseFS
(scripts/moosefs.sh, bench/moosefs_source.py) and mapped from there; the
source bytes are those that crossed its veth pair.

usage: sudo python3 bench/preload_mmap.py [--build build] [--repeat 3]
       [--old-preload PATH] [--out bench/results/preload_mmap] [--source moosefs]
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
from moosefs_source import MooseFS, add_source_flags  # noqa: E402
from service_epochs import Pfs, add_emulator_flags, start_service, stop_service  # noqa: E402

REPO = os.path.dirname(HERE)
PAGE = 4096
MIB = 1048576.0

# Under the preload: how many bytes of the process's mappings are of the
# tier's copies (paths holding argv[2]) once it mapped the file (a file
# tier's copy not checked yet is not mapped, and asking queues it to be
# checked).
PROBE = r"""
import mmap, os, sys
fd = os.open(sys.argv[1], os.O_RDONLY)
m = mmap.mmap(fd, 0, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ)
total = 0
for line in open("/proc/self/maps"):
    fields = line.split()
    # Private: the client's own mappings of the RAM tier, to read it, are shared.
    if any(m in line for m in sys.argv[2].split("|")) and fields[1].endswith("p"):
        start, end = (int(x, 16) for x in fields[0].split("-"))
        total += end - start
print(total)
"""

# Each process: map, read its pages, report, then wait for the driver to
# measure everybody's memory before it exits. numpy's mode "c" (a private
# mapping): the emulator's files, opened with direct_io, cannot be mapped
# shared without the library.
WORKER = r"""
import hashlib, random, sys, time
def rss():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
def mapping_memory(address, length):
    # Rss and Pss (KiB) of the mappings in [address, address + length): one,
    # or one per tier copy mapped in place of the source's pages. The RAM
    # tier's memory is not counted: it is the tier's copies, counted apart.
    inside, out = False, {}
    for line in open("/proc/self/smaps"):
        head = line.split()
        if "-" in head[0] and ":" not in head[0]:
            start, end = (int(x, 16) for x in head[0].split("-"))
            # The RAM tier: memfds, or with node.keep_ram (the default)
            # files under /dev/shm/monarch-<uid>/.
            inside = (start < address + length and address < end and
                      "/memfd:monarch-ram" not in line and "/dev/shm/monarch-" not in line)
        elif inside and head[0] in ("Rss:", "Pss:"):
            out[head[0]] = out.get(head[0], 0) + int(head[1])
    return out.get("Rss:", 0), out.get("Pss:", 0)
t0 = time.monotonic()
import numpy as np
path, seed, pages = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
before = rss()
mapped = np.memmap(path, dtype=np.uint8, mode="c")
count = len(mapped) // 4096
rng = random.Random(seed)
digest = hashlib.sha256()
if pages == 0:
    digest.update(bytes([int(mapped[len(mapped) // 2])]))
    touched = [len(mapped) // 2 // 4096]
else:
    touched = [rng.randrange(count) for _ in range(pages)]
    for page in touched:
        digest.update(mapped[page * 4096:page * 4096 + 4096].tobytes())
print("done %.6f %d %s %s" % (time.monotonic() - t0, rss() - before, digest.hexdigest(),
                              ",".join(map(str, touched))), flush=True)
sys.stdin.readline()
print("mapping %d %d" % mapping_memory(mapped.ctypes.data, len(mapped)), flush=True)
"""

def drop_caches():
    subprocess.run(["sync"])
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def write_file(path, gib):
    if os.path.exists(path) and os.path.getsize(path) == gib << 30:
        return
    os.makedirs(os.path.dirname(path), exist_ok=True)
    rng = random.Random(30)
    with open(path + ".tmp", "wb") as f:
        for _ in range(gib * 16):
            f.write(rng.randbytes(64 << 20))
    os.rename(path + ".tmp", path)


def tier_copies_bytes(a, config):
    """Bytes of copies the node service's tiers hold (its RAM tier's copies
    are node memory too; the memory it backs ahead is not the mapping's)."""
    r = subprocess.run([os.path.join(a.build, "monarch"), "stats", "--json", "--config", config],
                       capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit("monarch stats failed: " + r.stderr)
    tiers = json.loads(r.stdout)["node"]["tiers"]
    return sum(t["bytes_used"] for t in tiers if t["kind"] == "ram")


def stage_copies(a, env, config, path, marker, length):
    """Stages the file into the fastest tier of `config`'s running service,
    then maps it until `length` bytes are mapped from copies (paths holding
    `marker`): every extent's copy checked and mapped."""
    r = subprocess.run([os.path.join(a.build, "monarch"), "stage", "--config", config],
                       capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit("monarch stage failed: " + r.stderr)
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        r = subprocess.run([a.python, "-c", PROBE, path, marker], env=env,
                           capture_output=True, text=True)
        if r.returncode != 0:
            sys.exit("the probe failed: " + r.stderr)
        if int(r.stdout) == length:
            return
        time.sleep(1)
    sys.exit("the copies were not all mapped after 600 s: %s of %d bytes" % (
        r.stdout.strip(), length))


def run_case(a, env, path, procs, pages, config):
    """Runs `procs` workers at once; returns the case's measurements."""
    started = time.monotonic()
    workers = [subprocess.Popen([a.python, "-c", WORKER, path, str(seed), str(pages)], env=env,
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
               for seed in range(procs)]
    lines = [w.stdout.readline().split() for w in workers]
    slowest = time.monotonic() - started
    for w, line in zip(workers, lines):
        if not line or line[0] != "done":
            w.kill()
            sys.exit("a worker failed (exit %s)" % w.wait())
    copies = tier_copies_bytes(a, config) if config else 0
    for w in workers:
        w.stdin.write("\n")
        w.stdin.flush()
    # Each process's mapping of the file, measured while all are alive: the
    # pages they share count once in the sum of their Pss.
    mapping = [w.stdout.readline().split() for w in workers]
    for w in workers:
        w.wait()
    if any(not m or m[0] != "mapping" for m in mapping):
        sys.exit("a worker did not report its mapping")
    pss = sum(int(m[2]) for m in mapping) * 1024
    touched = set()
    for line in lines:
        touched.update(int(p) for p in line[4].split(","))
    return {"wall_s": slowest, "rss_growth_mib": [int(line[2]) / 1024.0 for line in lines],
            "mapping_rss_mib": [int(m[1]) / 1024.0 for m in mapping],
            "digests": [line[3] for line in lines], "mapping_pss_mib": pss / MIB,
            "copies_mib": copies / MIB, "touched_mib": len(touched) * PAGE / MIB}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--build", default=os.path.join(REPO, "build"))
    p.add_argument("--work", default="/var/tmp/monarch-mmap-bench")
    p.add_argument("--python", default=os.path.join(REPO, ".venv", "bin", "python"))
    p.add_argument("--gib", type=int, default=2)
    p.add_argument("--procs", type=int, default=4)
    p.add_argument("--pages", type=int, default=2000)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--old-preload", help="an earlier build of libmonarch_preload.so (arm `old`)")
    add_emulator_flags(p)
    add_source_flags(p)
    p.add_argument("--out", default=os.path.join(HERE, "results", "preload_mmap"))
    a = p.parse_args()
    a.build = os.path.abspath(a.build)
    preload = os.path.join(a.build, "integrations", "preload", "libmonarch_preload.so")
    for path in (preload, os.path.join(a.build, "monarch"), a.python):
        if not os.path.exists(path):
            sys.exit("missing %s" % path)

    backing = os.path.join(a.work, "backing")
    write_file(os.path.join(backing, "big.bin"), a.gib)
    if a.source == "moosefs":
        pfs = MooseFS(a, backing, "mmap-%dgib" % a.gib)
    else:
        pfs = Pfs(a, backing, os.path.join(a.work, "pfs"))
    if not pfs.ok:
        sys.exit("source unavailable: " + pfs.why)
    path = os.path.join(pfs.mount, "big.bin")
    file_mib = (a.gib << 30) / MIB
    runtime = os.path.join(a.work, "rt")
    shutil.rmtree(runtime, ignore_errors=True)
    config = os.path.join(a.work, "job.yaml")
    job = ("dataset:\n  path: %s\ntiers:\n  - %s\n"
           "  - {kind: source}\nplacement: {cached_source: promote}\nnode:\n"
           "  shared: true\n  runtime_dir: %s\n  autostart: false\n  idle_exit: 0\n")
    with open(config, "w") as f:
        f.write(job % (pfs.mount, "{kind: ram, capacity: %dGiB}" % (a.gib + 1), runtime))
    copies_runtime = os.path.join(a.work, "rt-copies")
    nvme = os.path.join(a.work, "nvme")
    for d in (copies_runtime, nvme):
        shutil.rmtree(d, ignore_errors=True)
    os.makedirs(nvme)
    copies_config = os.path.join(a.work, "copies.yaml")
    with open(copies_config, "w") as f:
        f.write(job % (pfs.mount, "{kind: posix, path: %s, capacity: %dGiB}" % (nvme, a.gib + 1),
                       copies_runtime))
    ram_runtime = os.path.join(a.work, "rt-ram")
    shutil.rmtree(ram_runtime, ignore_errors=True)
    ram_config = os.path.join(a.work, "ram.yaml")
    with open(ram_config, "w") as f:
        f.write(job % (pfs.mount, "{kind: ram, capacity: %dGiB}" % (a.gib + 1), ram_runtime))
    plain = dict(os.environ, OMP_NUM_THREADS="1")
    plain.pop("LD_PRELOAD", None)
    # (arm, environment, its service's config, whether each run starts a
    # fresh service: the RAM tier's arms do, as a new job; the copies' keeps
    # one, whose checked copies are what it measures).
    copies_env = dict(plain, LD_PRELOAD=preload, MONARCH_CONFIG=copies_config)
    ram_env = dict(plain, LD_PRELOAD=preload, MONARCH_CONFIG=ram_config)
    local = os.path.join(backing, "big.bin")
    arms = [("plain", plain, None, False, path),
            ("monarch", dict(plain, LD_PRELOAD=preload, MONARCH_CONFIG=config), config, True, path),
            ("copies", copies_env, copies_config, False, path),
            ("ram", ram_env, ram_config, False, path),
            ("local", plain, None, False, local)]
    if a.old_preload:
        arms.append(("old", dict(plain, LD_PRELOAD=os.path.abspath(a.old_preload),
                                 MONARCH_CONFIG=config), config, True, path))
    cases = [("one byte", 1, 0), ("random pages", a.procs, a.pages)]
    results = {case: {arm: [] for arm, _, _, _, _ in arms} for case, _, _ in cases}
    kept_log = os.path.join(a.work, "copies-service")
    os.makedirs(kept_log, exist_ok=True)
    kept = start_service(a, copies_config, kept_log)
    ram_log = os.path.join(a.work, "ram-service")
    os.makedirs(ram_log, exist_ok=True)
    kept_ram = start_service(a, ram_config, ram_log)
    try:
        stage_copies(a, copies_env, copies_config, path, nvme + "/", a.gib << 30)
        # The RAM tier's memory: memfds, or files on /dev/shm (node.keep_ram).
        stage_copies(a, ram_env, ram_config, path, "/memfd:monarch-ram|/dev/shm/monarch-",
                     a.gib << 30)
        for rep in range(a.repeat):
            order = arms[rep % len(arms):] + arms[:rep % len(arms)]
            for case, procs, pages in cases:
                for arm, env, arm_config, fresh, arm_path in order:
                    # A fresh service per run: an empty RAM tier, as for a new job.
                    proc_log = start_service(a, arm_config, a.work) if fresh else None
                    drop_caches()
                    pfs.reset()
                    r = run_case(a, env, arm_path, procs, pages, arm_config)
                    r["source_mib"] = pfs.stats()["bytes_read"] / MIB
                    if proc_log:
                        stop_service(a, arm_config, *proc_log)
                    results[case][arm].append(r)
                    print("%-12s %-8s %7.2f s  rss +%s MiB  mappings' Pss %.1f MiB, RAM copies "
                          "%.1f MiB, touched %.1f MiB  source %.1f MiB" % (
                              case, arm, r["wall_s"], "/".join(
                                  "%.1f" % x for x in r["rss_growth_mib"]), r["mapping_pss_mib"],
                              r["copies_mib"], r["touched_mib"], r["source_mib"]), flush=True)
                plain_digests = results[case]["plain"][-1]["digests"]
                for arm, _, _, _, _ in arms:
                    if results[case][arm][-1]["digests"] != plain_digests:
                        sys.exit("%s: %s read other bytes than plain" % (case, arm))
    finally:
        stop_service(a, copies_config, *kept)
        stop_service(a, ram_config, *kept_ram)
        pfs.stop()

    rows = []
    for case, _, _ in cases:
        for arm, _, _, _, _ in arms:
            runs = results[case][arm]
            med = lambda key: statistics.median(r[key] for r in runs)  # noqa: E731
            node = statistics.median(r["mapping_pss_mib"] + r["copies_mib"] for r in runs)
            plain_wall = [r["wall_s"] for r in results[case]["plain"]]
            ratios = [r["wall_s"] / w for r, w in zip(runs, plain_wall)]
            rows.append({
                "case": case, "arm": arm, "wall_s": med("wall_s"),
                "time_vs_plain": statistics.median(ratios),
                "rss_growth_mib_max": statistics.median(max(r["rss_growth_mib"]) for r in runs),
                "node_mib": node, "touched_mib": med("touched_mib"),
                "node_vs_touched": node / med("touched_mib"), "node_vs_file": node / file_mib,
                "source_mib": med("source_mib")})
    commit = subprocess.run(["git", "-C", REPO, "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip()
    command = "python3 bench/preload_mmap.py " + " ".join(sys.argv[1:])
    with open(a.out + ".json", "w") as f:
        json.dump({"commit": commit, "command": command, "file_mib": file_mib,
                   "source": pfs.describe() if a.source == "moosefs" else
                   "PFS emulator " + " ".join(pfs.flags),
                   "procs": a.procs, "pages": a.pages, "repeat": a.repeat, "rows": rows,
                   "runs": results}, f, indent=1)
    lines = ["| case | arm | time (s) | vs plain | RSS growth per process (MiB) | node (MiB) "
             "| node / touched | node / file | source (MiB) |", "|" + " --- |" * 9]
    for r in rows:
        lines.append("| %s | %s | %.2f | %.2f | %.1f | %.1f | %.2f | %.3f | %.1f |" % (
            r["case"], r["arm"], r["wall_s"], r["time_vs_plain"], r["rss_growth_mib_max"],
            r["node_mib"], r["node_vs_touched"], r["node_vs_file"], r["source_mib"]))
    print("\n".join(lines))
    print("commit %s; medians of %d runs; %s" % (commit, a.repeat, command))


if __name__ == "__main__":
    sys.exit(main())
