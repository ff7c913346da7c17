#!/usr/bin/env python3
"""Epochs with a peer killed: PFS bytes and epoch times with and without
re-homing, and with two replicas.

4 Monarch processes ("nodes") over the PFS emulator, each with a RAM tier,
reading their 1/4 partition of each shuffled epoch (--partition) with
barriers and --settle around every epoch. Rank 3 is SIGKILLed as epoch 2
starts; a stand-in takes its place at the remaining barriers, as a launcher
that carries on with the survivors would. Setups, in one run:

  before     a build from before re-homing (--baseline-build): the dead
             peer's files go to the PFS on every miss, for the rest of the job
  rehome     this build: they move to the next rank of their rendezvous order
  replicas   this build with remote.replicas 2

Reports per epoch: the survivors' PFS MiB (Monarch's source counters) and
the epoch time (slowest survivor).

usage: sudo python3 bench/peer_loss_epochs.py --baseline-build DIR [--build build]
       [--files 3000] [--epochs 5] [--capacity 1.0] [--dir /var/tmp/monarch-peer-loss]
       [--out FILE] (and the PFS emulator's flags, bench/emulated_dataset.py)
A baseline build: git worktree add /work/old 79ece5a && cmake -S /work/old -B
/work/old/build -DCMAKE_BUILD_TYPE=Release && cmake --build /work/old/build
--target monarch-epochs
Needs root (FUSE mount). Writes bench/results/peer_loss.md by default.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import emulated_dataset  # noqa: E402
from service_epochs import readahead_flags  # noqa: E402

SIZE, VICTIM = 4, 3


def run(a, mount, setup, binary):
    base = os.path.join(a.dir, setup)
    shutil.rmtree(base, ignore_errors=True)
    barriers = os.path.join(base, "barriers")
    os.makedirs(barriers)
    procs = []
    for r in range(SIZE):
        config = os.path.join(base, "rank%d.yaml" % r)
        with open(config, "w") as f:
            f.write("dataset: {path: %s}\n" % mount)
            f.write("tiers:\n  - {kind: ram, capacity: %d}\n  - {kind: source}\n"
                    % int(a.dataset_bytes * a.capacity))
            f.write("remote: {enabled: true, rank: %d, size: %d, rendezvous_dir: %s%s}\n"
                    % (r, SIZE, os.path.join(base, "rendezvous"),
                       ", replicas: 2" if setup == "replicas" else ""))
        cmd = [binary, "--config", config, "--epochs", str(a.epochs), "--threads", str(a.threads),
               "--partition", "%d/%d" % (r, SIZE), "--barrier-dir", barriers, "--settle",
               "--json", os.path.join(base, "epochs%d.json" % r)]
        procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True))
    while not all(os.path.exists(os.path.join(barriers, "start-2.%d" % r)) for r in range(SIZE)):
        if any(p.poll() is not None for p in procs):
            sys.exit("%s: a process ended early:\n%s" % (
                setup, "\n".join(p.stdout.read() for p in procs if p.poll() is not None)))
        time.sleep(0.001)
    procs[VICTIM].send_signal(signal.SIGKILL)
    procs[VICTIM].wait()
    for e in range(2, a.epochs + 1):
        for name in ("start-%d" % e, "end-%d" % e):
            open(os.path.join(barriers, "%s.%d" % (name, VICTIM)), "w").close()
    open(os.path.join(barriers, "done.%d" % VICTIM), "w").close()
    survivors = [r for r in range(SIZE) if r != VICTIM]
    for r in survivors:
        out, _ = procs[r].communicate()
        if procs[r].returncode != 0:
            sys.exit("%s rank %d failed (%d):\n%s" % (setup, r, procs[r].returncode, out))
    epochs = {r: json.load(open(os.path.join(base, "epochs%d.json" % r))) for r in survivors}
    for r in survivors:
        for e in epochs[r]:
            if e["errors"] or e["mismatches"]:
                sys.exit("%s rank %d epoch %d: %s" % (setup, r, e["epoch"], e))
    return [{"seconds": max(epochs[r][i]["seconds"] for r in survivors),
             "pfs_bytes": sum(epochs[r][i]["served"]["source"]["bytes"] for r in survivors)}
            for i in range(a.epochs)]


def main():
    ap = emulated_dataset.parser(reps=1, out=os.path.join(REPO, "bench", "results",
                                                          "peer_loss.md"))
    ap.set_defaults(build=os.path.join(REPO, "build"), dir="/var/tmp/monarch-peer-loss",
                    files=3000, threads=2)
    ap.add_argument("--baseline-build", required=True,
                    help="build dir of a Monarch from before re-homing (its monarch-epochs)")
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--capacity", type=float, default=1.0,
                    help="each node's RAM tier, as a fraction of the dataset")
    a = ap.parse_args()
    pfs, _, a.dataset_bytes = emulated_dataset.mounted_dataset(a)
    results = {}
    try:
        for setup, build in (("before", a.baseline_build), ("rehome", a.build),
                             ("replicas", a.build)):
            results[setup] = run(a, pfs.mount, setup, os.path.join(build, "monarch-epochs"))
            print(setup, json.dumps(results[setup]), flush=True)
    finally:
        pfs.stop()

    baseline = subprocess.run(["git", "-C", a.baseline_build, "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True).stdout.strip()
    mib = 1048576.0
    lines = ["# Epochs with a peer killed: re-homing and replicas", "",
             "Command: `sudo python3 bench/peer_loss_epochs.py %s`" % " ".join(sys.argv[1:]), "",
             "Dataset: %d ImageNet-like files, %.1f MiB, on `monarch-pfs-emulator` (%g MB/s "
             "shared, %g ms metadata, %g ms per read, 8 ops at once, `%s`). 4 processes, each a RAM "
             "tier of %.2fx the dataset, %d reader threads, its 1/4 partition of each shuffled "
             "epoch, barriers and `--settle` around every epoch. Rank 3 is SIGKILLed as epoch 2 "
             "starts. Figures are the 3 survivors': PFS MiB summed, epoch time of the slowest. "
             "`before` = %s, commit %s (no re-homing: the dead peer's files go to the PFS on "
             "each miss that finds no copy)."
             % (a.files, a.dataset_bytes / mib, a.bandwidth_mbps, a.meta_latency_us / 1000,
                a.read_latency_us / 1000, " ".join(readahead_flags(a)), a.capacity, a.threads, a.baseline_build,
                baseline or "unknown"),
             "",
             "| epoch | before: PFS MiB | before: s | rehome: PFS MiB | rehome: s | "
             "replicas 2: PFS MiB | replicas 2: s |",
             "|---|---|---|---|---|---|---|"]
    for i in range(a.epochs):
        row = ["%d" % (i + 1)]
        for setup in ("before", "rehome", "replicas"):
            e = results[setup][i]
            row += ["%.1f" % (e["pfs_bytes"] / mib), "%.2f" % e["seconds"]]
        lines.append("| " + " | ".join(row) + " |")
    after = {s: sum(e["pfs_bytes"] for e in results[s][1:]) / mib for s in results}
    lines += ["", "PFS MiB read by the survivors after epoch 1: before %.1f, rehome %.1f, "
              "replicas 2 %.1f." % (after["before"], after["rehome"], after["replicas"]), ""]
    with open(a.out, "w") as f:
        f.write("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
