#!/usr/bin/env python3
"""Multi-epoch runs of 2 and 4 Monarch processes over the PFS emulator,
with the remote tier enabled and disabled (the same-run baseline).

Each process is one "node": a RAM tier holding 1/N of the dataset (plus 5%
headroom, because rendezvous hashing gives homes shares that differ by a
few percent), over the emulated PFS, reading its 1/N partition of each
shuffled epoch (--partition) with the N processes meeting at a barrier
around every epoch. Reports per epoch: wall time (slowest process) and the
bytes read from the PFS by all processes (Monarch's source counters, checked
against the emulator's own total).

usage: sudo python3 bench/remote_epochs.py [--build build] [--files 6000]
       [--procs 2 4] [--epochs 3] [--bandwidth-mbps 300] [--out FILE]
Needs root (FUSE mount). Writes bench/results/remote_epochs.md by default.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from service_epochs import add_readahead_flag, readahead_flags  # noqa: E402


def sh(*args, **kw):
    return subprocess.run(args, check=True, capture_output=True, text=True, **kw)


def emulator_stats(script, mount):
    return json.loads(sh(script, "stats", mount).stdout)


def run_cluster(a, work, mount, n, remote):
    tag = "%s-n%d" % ("remote" if remote else "local", n)
    base = os.path.join(work, tag)
    shutil.rmtree(base, ignore_errors=True)
    os.makedirs(os.path.join(base, "barriers"))
    total = a.dataset_bytes
    capacity = int(total / n * 1.05)
    procs = []
    for r in range(n):
        config = os.path.join(base, "rank%d.yaml" % r)
        with open(config, "w") as f:
            f.write("dataset: {path: %s}\n" % mount)
            f.write("tiers:\n  - {kind: ram, capacity: %d}\n  - {kind: source}\n" % capacity)
            if remote:
                f.write("remote: {enabled: true, rank: %d, size: %d, rendezvous_dir: %s}\n"
                        % (r, n, os.path.join(base, "rendezvous")))
        cmd = [os.path.join(a.build, "monarch-epochs"), "--config", config,
               "--epochs", str(a.epochs), "--threads", "2", "--partition", "%d/%d" % (r, n),
               "--barrier-dir", os.path.join(base, "barriers"),
               "--json", os.path.join(base, "epochs%d.json" % r)]
        procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True))
    outs = [p.communicate() for p in procs]
    for r, (p, (out, err)) in enumerate(zip(procs, outs)):
        if p.returncode != 0:
            sys.exit("%s rank %d failed (%d):\n%s\n%s" % (tag, r, p.returncode, out, err))
    epochs = [json.load(open(os.path.join(base, "epochs%d.json" % r))) for r in range(n)]
    result = []
    for e in range(a.epochs):
        result.append({
            "seconds": max(epochs[r][e]["seconds"] for r in range(n)),
            "pfs_bytes": sum(epochs[r][e]["served"]["source"]["bytes"] for r in range(n)),
            "peer_bytes": sum(epochs[r][e]["served"].get("peers", {}).get("bytes", 0)
                              for r in range(n)),
        })
    return result


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.path.join(REPO, "build"))
    ap.add_argument("--work", default="/var/tmp/monarch-remote-epochs")
    ap.add_argument("--files", type=int, default=6000)
    ap.add_argument("--procs", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--bandwidth-mbps", type=float, default=300)
    add_readahead_flag(ap)
    ap.add_argument("--out", default=os.path.join(REPO, "bench", "results", "remote_epochs.md"))
    a = ap.parse_args()
    script = os.path.join(a.build, "bin", "pfs-emulator")
    backing = os.path.join(a.work, "backing-%d" % a.files)
    mount = os.path.join(a.work, "pfs")
    os.makedirs(a.work, exist_ok=True)
    if not os.path.isdir(backing):
        sh(os.path.join(a.build, "monarch-epochs"), "--dataset", backing, "--generate",
           str(a.files), "--profile", "imagenet", "--epochs", "0")
    a.dataset_bytes = sum(os.path.getsize(os.path.join(d, f))
                          for d, _, fs in os.walk(backing) for f in fs)
    os.makedirs(mount, exist_ok=True)
    subprocess.run([script, "stop", mount], capture_output=True)
    sh(script, "start", backing, mount, "--bandwidth-mbps", str(a.bandwidth_mbps),
       *readahead_flags(a))
    rows = []
    try:
        for n in a.procs:
            for remote in (False, True):
                sh(script, "reset", mount)
                start = time.time()
                epochs = run_cluster(a, a.work, mount, n, remote)
                emulated = emulator_stats(script, mount)["counters"]["bytes_read"]
                counted = sum(e["pfs_bytes"] for e in epochs)
                rows.append((n, remote, epochs, emulated, counted, time.time() - start))
                print("N=%d remote=%s: %s (emulator read %d bytes, Monarch counted %d)" % (
                    n, remote, json.dumps(epochs), emulated, counted), flush=True)
    finally:
        subprocess.run([script, "stop", mount], capture_output=True)

    mib = 1048576.0
    lines = ["# Remote tier: multi-epoch runs over the PFS emulator", "",
             "Command: `sudo python3 bench/remote_epochs.py %s`" % " ".join(sys.argv[1:]), "",
             "Dataset: %d ImageNet-like files, %.1f MiB, on `monarch-pfs-emulator` "
             "(%g MB/s shared, 1 ms metadata, 0.5 ms per read, 8 ops at once, `%s`). "
             "Each process: RAM tier of 1/N of the dataset + 5%%, 2 reader threads, its 1/N "
             "partition of each shuffled epoch, barriers around every epoch. "
             "`local` = remote tier disabled (misses go to the PFS), `remote` = enabled. "
             "Epoch time = slowest process." % (a.files, a.dataset_bytes / mib, a.bandwidth_mbps,
                                                " ".join(readahead_flags(a))),
             "",
             "| N | setup | epoch | seconds | PFS MiB | from peers MiB | time remote/local |",
             "|---|---|---|---|---|---|---|"]
    by = {(n, r): e for n, r, e, _, _, _ in rows}
    for n, remote, epochs, emulated, counted, _ in rows:
        for i, e in enumerate(epochs):
            ratio = ""
            if remote and (n, False) in by:
                ratio = "%.2f" % (e["seconds"] / by[(n, False)][i]["seconds"])
            lines.append("| %d | %s | %d | %.2f | %.1f | %.1f | %s |" % (
                n, "remote" if remote else "local", i + 1, e["seconds"], e["pfs_bytes"] / mib,
                e["peer_bytes"] / mib, ratio))
    lines += ["", "PFS bytes cross-check (emulator total vs Monarch's source counters): " +
              "; ".join("N=%d %s %d/%d" % (n, "remote" if r else "local", em, c)
                        for n, r, _, em, c, _ in rows), ""]
    with open(a.out, "w") as f:
        f.write("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
