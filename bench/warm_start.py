#!/usr/bin/env python3
"""The next job's epoch 1 after a node service restart, with the RAM tier's
copies kept (node.keep_ram), over the PFS emulator.

Each repetition, for each way the first service ends (`sigterm`: stopped, as
`monarch stop` or a job's end does; `sigkill`: killed):
  job 1   a fresh `monarch serve` (RAM tier of 1.25x the dataset) and one
          `monarch-epochs` client, 5 shuffled epochs: epoch 1 cold, 2-5 hot;
  end     the service is sent the signal and waited for;
  job 2   a new `monarch serve` on the same config (it adopts the kept
          copies: the time from its launch to its first answer is reported),
          and a new client, 2 epochs.
and, as baselines, job 2 through job 1's service, never ended (the best a
restart could do: a new client process reads with pread() until it reads a
file again, ram_driver.cc's RamReader, so its epoch 1 is slower than a hot
epoch of job 1's client whatever the service), and the restart with
`node.keep_ram: false` (the RAM copies die with the service, job 2 starts
cold).

Reported: job 2's epoch 1 / job 1's hot epoch (the median of its epochs 2
to 5: a hot epoch of 2000 files lasts a few tens of ms), the PFS bytes job 2 read (the emulator's counters), the service's
start time. Target (issue 42): at most 1.1x a hot epoch.

usage: sudo python3 bench/warm_start.py [--build build] [--files 2000]
       [--reps 3] [--out bench/results/warm_start.md]
Needs root (FUSE mount). A few minutes on a 2-core VM.
"""

import argparse
import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from service_epochs import add_readahead_flag, readahead_flags  # noqa: E402
from huge_ram import add_huge_ram_flag, huge_ram_dir, ram_dir_label  # noqa: E402

MIB = 1048576.0
# How job 1's service ends before job 2 ("none": job 2 reads through the same
# service, the best a restart could do), and whether RAM copies are kept.
ENDINGS = [("none", True), ("sigterm", True), ("sigkill", True), ("sigterm", False),
           ("sigkill", False)]


def sh(*args, **kw):
    return subprocess.run(args, check=True, capture_output=True, text=True, **kw)


class Pfs:
    def __init__(self, script, mount):
        self.script, self.mount = script, mount

    def reset(self):
        sh(self.script, "reset", self.mount)

    def bytes_read(self):
        return json.loads(sh(self.script, "stats", self.mount).stdout)["counters"]["bytes_read"]


def start_service(a, config, log_path):
    log = open(log_path, "a")
    began = time.monotonic()
    proc = subprocess.Popen([os.path.join(a.build, "monarch"), "serve", "--config", config],
                            stdout=log, stderr=subprocess.STDOUT)
    deadline = began + 120
    while True:
        r = subprocess.run([os.path.join(a.build, "monarch"), "stats", "--json", "--config",
                            config], capture_output=True, text=True)
        if r.returncode == 0:
            return proc, log, time.monotonic() - began, json.loads(r.stdout)["node"]
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            sys.exit("monarch serve did not start:\n" + open(log_path).read())
        time.sleep(0.01)


def job(a, config, base, name, epochs):
    path = os.path.join(base, name + ".json")
    sh(os.path.join(a.build, "monarch-epochs"), "--config", config, "--epochs", str(epochs),
       "--threads", "2", "--json", path)
    with open(path) as f:
        return json.load(f)


def run_one(a, pfs, rep, ending, keep):
    tag = "%s-%s-r%d" % (ending, "kept" if keep else "notkept", rep)
    base = os.path.join(a.work, "runs", tag)
    shutil.rmtree(base, ignore_errors=True)  # A new runtime directory: nothing kept yet.
    os.makedirs(base)
    config = os.path.join(base, "node.yaml")
    with open(config, "w") as f:
        f.write("dataset: {path: %s}\n" % a.mount)
        f.write("tiers:\n  - {name: ram, kind: ram, capacity: %d}\n  - {kind: source}\n"
                % int(a.dataset_bytes * 1.25))
        f.write("node: {shared: true, runtime_dir: %s, autostart: false, idle_exit: 0, "
                "keep_ram: %s%s}\n" % (os.path.join(base, "run"), "true" if keep else "false",
                                       ", " + a.node_keys if a.node_keys else ""))
    log_path = os.path.join(base, "serve.log")
    proc, log, _, _ = start_service(a, config, log_path)
    one = job(a, config, base, "job1", 5)
    start_seconds, node = 0.0, {"warm_files_reused": 0}
    if ending != "none":
        proc.send_signal(signal.SIGTERM if ending == "sigterm" else signal.SIGKILL)
        proc.wait(timeout=60)
        log.close()
        pfs.reset()
        proc, log, start_seconds, node = start_service(a, config, log_path)
    else:
        pfs.reset()
    two = job(a, config, base, "job2", 2)
    pfs_bytes = pfs.bytes_read()
    subprocess.run([os.path.join(a.build, "monarch"), "stop", "--config", config],
                   capture_output=True)
    proc.wait(timeout=60)
    log.close()
    # What a stop keeps (and a keeper of node.ram_dir auto) would stay until
    # the next service starts.
    subprocess.run([os.path.join(a.build, "monarch"), "purge", "--config", config],
                   capture_output=True)
    hot = statistics.median([e["seconds"] for e in one[1:]])
    result = {"tag": tag, "ending": ending, "keep": keep, "job1": [e["seconds"] for e in one],
              "job2": [e["seconds"] for e in two], "hot": hot,
              "ratio": two[0]["seconds"] / hot, "ratio2": two[1]["seconds"] / hot,
              "ratio_first_hot": two[0]["seconds"] / one[1]["seconds"],
              "start_seconds": start_seconds, "reused": node["warm_files_reused"],
              "job2_pfs_bytes": pfs_bytes,
              "job2_epoch1_source_bytes": two[0]["served"].get("source", {}).get("bytes", 0)}
    print(json.dumps(result), flush=True)
    return result


def spread(values, f="%.2f"):
    v = sorted(values)
    return (f + " (" + f + "-" + f + ")") % (statistics.median(v), v[0], v[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.path.join(REPO, "build"))
    ap.add_argument("--work", default="/var/tmp/monarch-warm-start")
    ap.add_argument("--files", type=int, default=2000)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--bandwidth-mbps", type=float, default=300)
    add_readahead_flag(ap)
    add_huge_ram_flag(ap)
    ap.add_argument("--out", default=os.path.join(REPO, "bench", "results", "warm_start.md"))
    a = ap.parse_args()
    a.build = os.path.abspath(a.build)
    ram_dir = contextlib.ExitStack()
    a.node_keys = ram_dir.enter_context(huge_ram_dir(a))
    script = os.path.join(a.build, "bin", "pfs-emulator")
    backing = os.path.join(a.work, "backing-%d" % a.files)
    a.mount = os.path.join(a.work, "pfs")
    os.makedirs(a.work, exist_ok=True)
    if not os.path.isdir(backing):
        sh(os.path.join(a.build, "monarch-epochs"), "--dataset", backing, "--generate",
           str(a.files), "--profile", "imagenet", "--epochs", "0")
    a.dataset_bytes = sum(os.path.getsize(os.path.join(d, f))
                          for d, _, fs in os.walk(backing) for f in fs)
    os.makedirs(a.mount, exist_ok=True)
    subprocess.run([script, "stop", a.mount], capture_output=True)
    sh(script, "start", backing, a.mount, "--bandwidth-mbps", str(a.bandwidth_mbps),
       *readahead_flags(a))
    pfs = Pfs(script, a.mount)
    rows = []
    try:
        for rep in range(a.reps):
            for ending, keep in ENDINGS:
                rows.append(run_one(a, pfs, rep, ending, keep))
    finally:
        subprocess.run([script, "stop", a.mount], capture_output=True)
        ram_dir.close()

    lines = ["# Warm start: the next job's epoch 1 after a service restart, RAM copies kept", "",
             "Command: `sudo python3 bench/warm_start.py %s`" % " ".join(sys.argv[1:]), "",
             "Dataset: %d ImageNet-like files, %.1f MiB, on `monarch-pfs-emulator` (%g MB/s, "
             "`%s`). One `monarch serve` (RAM tier 1.25x the dataset) and one `monarch-epochs` "
             "client (2 threads, shuffled; without `--verify`, which reads the PFS: the bytes are "
             "checked by `tests/service/service_processes_test.py keep-ram`). Job 1: 5 epochs; the service is then "
             "sent SIGTERM or SIGKILL; a new service on the same config; job 2: 2 epochs. "
             "Hot epoch = the median of job 1's epochs 2 to 5. `kept`: `node.keep_ram: true` "
             "(the default), `not kept`: `false`. `node.ram_dir`: %s. %d repetitions: median "
             "(min-max)."
             % (a.files, a.dataset_bytes / MIB, a.bandwidth_mbps, " ".join(readahead_flags(a)),
                "a tmpfs mounted `huge=within_size` (`--huge-ram-dir`)" if a.huge_ram_dir
                else "`%s`" % ram_dir_label(a), a.reps), "",
             "| first service ended by | RAM copies | job 2 epoch 1 / hot | job 2 epoch 1 / "
             "job 1 epoch 2 | job 2 epoch 2 / hot | hot epoch s | job 2 epoch 1 s | "
             "copies adopted | job 2 PFS MiB | service start s |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for ending, keep in ENDINGS:
        rs = [r for r in rows if r["ending"] == ending and r["keep"] == keep]
        if rs:
            lines.append("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
                "(not ended)" if ending == "none" else ending, "kept" if keep else "not kept",
                spread([r["ratio"] for r in rs]), spread([r["ratio_first_hot"] for r in rs]),
                spread([r["ratio2"] for r in rs]), spread([r["hot"] for r in rs], "%.3f"),
                spread([r["job2"][0] for r in rs], "%.3f"),
                spread([r["reused"] for r in rs], "%d"),
                spread([r["job2_pfs_bytes"] / MIB for r in rs], "%.1f"),
                spread([r["start_seconds"] for r in rs], "%.2f")))
    lines += ["", "Raw runs:", "", "```"] + [json.dumps(r) for r in rows] + ["```", ""]
    with open(a.out, "w") as f:
        f.write("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
