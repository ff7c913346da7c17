#!/usr/bin/env python3
"""Home balance of big files over peers (issue 30): 2 big files read as random
records by 4 monarch-epochs processes on loopback, each a peer with a RAM
tier, cached by extents (whose homes are striped round the peers,
src/remote/rendezvous_hash.h) against cached whole (one home per file).

Per arm and rank: the bytes it read from the source (each extent, or file,
is read by its home only, so that is its home share), the bytes it served to
the other peers, and the epochs' seconds. The figure is max/mean over the
ranks. Target (issue 30): max/mean bytes at most 1.1 with extents.

Every read is compared with the source (monarch-epochs --verify), so the
times include a pread of the page-cached source per record; they are given
for scale, not compared.

usage: python3 bench/extent_homes.py [--build build] [--work /var/tmp/monarch-extent-homes]
       [--file-mib 1000,700] [--extent-kib 4096] [--record-kib 1024] [--epochs 2]
       [--out bench/results/extent_homes]
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
sys.path.insert(0, os.path.join(REPO, "tests"))
from process_util import final_stats  # noqa: E402

MIB = 1 << 20


def make_files(root, sizes):
    """Random files of these sizes ({name: bytes}), kept between runs."""
    for name, size in sizes.items():
        path = os.path.join(root, name)
        if os.path.exists(path) and os.path.getsize(path) == size:
            continue
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path + ".tmp", "wb") as f:
            left = size
            while left:
                n = min(left, 64 * MIB)
                f.write(os.urandom(n))
                left -= n
        os.rename(path + ".tmp", path)


def run_arm(a, arm, dataset, total):
    base = os.path.join(a.work, "runs", arm)
    shutil.rmtree(base, ignore_errors=True)
    barriers = os.path.join(base, "barriers")
    os.makedirs(barriers)
    placement = "placement: {extent_bytes: %d, extent_threshold: %d}\n" % (
        a.extent_kib << 10 if arm == "extents" else 0, 64 * MIB)
    procs = []
    for r in range(a.peers):
        config = os.path.join(base, "rank%d.yaml" % r)
        with open(config, "w") as f:
            f.write("dataset: {path: %s}\n" % dataset)
            # Room for the whole dataset: what a peer keeps is its choice.
            f.write("tiers:\n  - {kind: ram, capacity: %d}\n  - {kind: source}\n" % (
                total + 64 * MIB))
            f.write("remote: {enabled: true, rank: %d, size: %d, rendezvous_dir: %s, "
                    "request_timeout: 10s}\n" % (r, a.peers, os.path.join(base, "rendezvous")))
            f.write(placement)
        cmd = [os.path.join(a.build, "monarch-epochs"), "--config", config,
               "--epochs", str(a.epochs), "--threads", str(a.threads),
               "--records", str(a.record_kib << 10), "--verify",
               "--partition", "%d/%d" % (r, a.peers), "--barrier-dir", barriers,
               "--json", os.path.join(base, "epochs%d.json" % r)]
        procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True))
    ranks = []
    for r, p in enumerate(procs):
        out, err = p.communicate(timeout=1800)
        if p.returncode != 0:
            sys.exit("%s rank %d exited %d:\n%s\n%s" % (arm, r, p.returncode, out, err))
        epochs = json.load(open(os.path.join(base, "epochs%d.json" % r)))
        stats = final_stats(out)
        for e in epochs:
            assert e["errors"] == 0 and e["mismatches"] == 0, e
        ranks.append({
            "source_bytes": sum(e["served"]["source"]["bytes"] for e in epochs),
            "source_bytes_epoch1": epochs[0]["served"]["source"]["bytes"],
            "bytes_served_to_peers": stats["remote"]["bytes_served"],
            "home_entries": stats["remote"]["home_files"],
            "tier_bytes_used": stats["tiers"][0]["bytes_used"],
            "seconds": [e["seconds"] for e in epochs],
            "fallbacks": stats["remote"]["fallbacks"],
        })
    shutil.rmtree(base, ignore_errors=True)
    return ranks


def max_over_mean(values):
    mean = sum(values) / len(values)
    return max(values) / mean if mean else float("nan")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.path.join(REPO, "build"))
    ap.add_argument("--work", default="/var/tmp/monarch-extent-homes")
    ap.add_argument("--file-mib", default="1000,700",
                    help="the big files' sizes in MiB, comma-separated")
    ap.add_argument("--extent-kib", type=int, default=4096)
    ap.add_argument("--record-kib", type=int, default=1024)
    ap.add_argument("--peers", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--arms", default="extents,whole")
    ap.add_argument("--out", default=os.path.join(REPO, "bench", "results", "extent_homes"))
    a = ap.parse_args()
    command = "python3 bench/extent_homes.py " + " ".join(sys.argv[1:])

    dataset = os.path.join(a.work, "dataset")
    # Sizes that are no multiple of the extent: the last extents are short.
    sizes = {"tokens/train-%d.bin" % i: int(m) * MIB + 12345 * (i + 1)
             for i, m in enumerate(a.file_mib.split(","))}
    make_files(dataset, sizes)
    total = sum(sizes.values())
    commit = subprocess.run(["git", "-C", REPO, "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip()
    data = {"command": command, "commit": commit, "files": sizes, "peers": a.peers,
            "extent_bytes": a.extent_kib << 10, "record_bytes": a.record_kib << 10,
            "epochs": a.epochs, "threads": a.threads, "arms": {},
            "load_before": os.getloadavg()[0]}
    for arm in a.arms.split(","):
        began = time.time()
        ranks = run_arm(a, arm, dataset, total)
        data["arms"][arm] = {"ranks": ranks, "wall_seconds": time.time() - began}
        src = [r["source_bytes_epoch1"] for r in ranks]
        served = [r["bytes_served_to_peers"] for r in ranks]
        print("%s: source bytes per rank %s (max/mean %.3f); served to peers %s (max/mean %.3f)"
              % (arm, src, max_over_mean(src), served, max_over_mean(served)), flush=True)
    data["load_after"] = os.getloadavg()[0]

    lines = ["# Home balance of 2 big files over %d peers" % a.peers, "",
             "Command: `%s`, at %s; load average %.1f before, %.1f after." % (
                 command, commit, data["load_before"], data["load_after"]), "",
             "%d processes on loopback (one peer each, %d reader threads, a RAM tier that "
             "holds the dataset), reading their partition of %d epochs of %d KiB records in "
             "random order, every read checked against the source. Files: %s (%s bytes). "
             "`extents`: extents of %d KiB, homes striped round the peers from each file's "
             "home; `whole`: files cached whole, one home each." % (
                 a.peers, a.threads, a.epochs, a.record_kib,
                 ", ".join("%s %s bytes" % (n, "{:,}".format(s)) for n, s in sizes.items()),
                 "{:,}".format(total), a.extent_kib), "",
             "Each extent (or file) is read from the source by its home alone, so a rank's "
             "source bytes are its home share; its bytes served are what the other ranks "
             "fetched from it.", "",
             "| arm | rank | home entries | source bytes | bytes served to peers | epoch seconds |",
             "|---|---|---|---|---|---|"]
    for arm, d in data["arms"].items():
        for r, x in enumerate(d["ranks"]):
            lines.append("| %s | %d | %d | %s | %s | %s |" % (
                arm, r, x["home_entries"], "{:,}".format(x["source_bytes"]),
                "{:,}".format(x["bytes_served_to_peers"]),
                ", ".join("%.2f" % s for s in x["seconds"])))
    lines += ["", "| arm | max/mean source bytes (home share) | max/mean bytes served | "
                  "source bytes, all ranks / dataset |", "|---|---|---|---|"]
    for arm, d in data["arms"].items():
        src = [x["source_bytes"] for x in d["ranks"]]
        served = [x["bytes_served_to_peers"] for x in d["ranks"]]
        lines.append("| %s | **%.3f** | %.3f | %.3f |" % (
            arm, max_over_mean(src), max_over_mean(served), sum(src) / total))
    lines += ["", "Target (issue 30): max/mean bytes at most 1.1 with extents.", ""]
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    with open(a.out + ".json", "w") as f:
        json.dump(data, f, indent=1)
    with open(a.out + ".md", "w") as f:
        f.write("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
