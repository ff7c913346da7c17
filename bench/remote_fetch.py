#!/usr/bin/env python3
"""Remote fetch throughput against ucx_perftest on the same transport, same run.

Runs build/bench/bench_remote_fetch (two processes: a home serving from its
RAM tier, a client whose every read is a peer fetch through the full read
path) for 128 KiB, 1 MiB and 16 MiB files, then ucx_perftest between two
processes on the same transport (UCX_TLS=tcp, loopback):

  ucp_am_bw -e   active messages with peer error handling: exactly the UCP
                 configuration Monarch uses (the baseline for the ratio);
  ucp_am_bw      the same without error handling;
  ucp_put_bw     RMA put, for the design note's choice of API.

Repeats everything --repeat times, interleaved, and reports medians.
Both tools' figures are in MiB/s (ucx_perftest's "MB/s" are 2^20 bytes).

usage: python3 bench/remote_fetch.py [--build build] [--threads 4] [--repeat 3] [--out FILE]
"""

import argparse
import os
import re
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
SIZES = [128 << 10, 1 << 20, 16 << 20]


def perftest(test, size, error_handling, port):
    env = dict(os.environ, UCX_TLS="tcp")
    flags = ["-t", test, "-s", str(size), "-n", str(max(200, (2 << 30) // size // 8)), "-w", "20",
             "-f", "-p", str(port)] + (["-e"] if error_handling else [])
    server = subprocess.Popen(["ucx_perftest"] + flags, env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    time.sleep(0.5)
    out = subprocess.run(["ucx_perftest", "127.0.0.1"] + flags, env=env, capture_output=True,
                         text=True, timeout=300).stdout
    server.wait(timeout=60)
    last = out.strip().splitlines()[-1].split()
    return float(last[5])  # Average bandwidth, MB/s (2^20).


def monarch_fetch(build, threads):
    out = subprocess.run([os.path.join(build, "bench", "bench_remote_fetch"),
                          "/var/tmp/monarch-remote-fetch", str(threads), "tcp"],
                         capture_output=True, text=True, timeout=900)
    if out.returncode != 0:
        sys.exit("bench_remote_fetch failed:\n" + out.stdout + out.stderr)
    result = {}
    for line in out.stdout.splitlines():
        m = re.match(r"fetch size=(\d+) .* MBps=([\d.]+) source_reads=0 fallbacks=0 errors=0", line)
        if m:
            result[int(m.group(1))] = float(m.group(2)) * 1e6 / 1048576  # -> MiB/s
    if len(result) != len(SIZES):
        sys.exit("unexpected output (a fetch fell back or failed?):\n" + out.stdout)
    return result


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(REPO, "build"))
    ap.add_argument("--threads", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--out", default=os.path.join(REPO, "bench", "results", "remote_fetch.md"))
    a = ap.parse_args()
    runs = {k: {s: [] for s in SIZES} for k in ("monarch", "am_e", "am", "put")}
    port = 13500
    for rep in range(a.repeat):
        for size, mibps in monarch_fetch(a.build, a.threads).items():
            runs["monarch"][size].append(mibps)
        for size in SIZES:
            for key, test, e in (("am_e", "ucp_am_bw", True), ("am", "ucp_am_bw", False),
                                 ("put", "ucp_put_bw", False)):
                port += 1
                runs[key][size].append(perftest(test, size, e, port))
        print("repetition %d: %s" % (rep + 1, {k: {s: v[-1] for s, v in d.items()}
                                                for k, d in runs.items()}), flush=True)
    med = {k: {s: statistics.median(v) for s, v in d.items()} for k, d in runs.items()}
    lines = ["# Remote fetch throughput vs ucx_perftest", "",
             "Command: `python3 bench/remote_fetch.py %s`" % " ".join(sys.argv[1:]), "",
             "Two processes on loopback, UCX 1.13.1, `UCX_TLS=tcp`. Monarch: %d client threads "
             "reading whole files through `Monarch::Read`, every read a peer fetch from a home "
             "serving its RAM tier (request; the home sends the active-message reply from its "
             "RAM copy with a CRC32C combined from the copy's block sums; up to 256 KiB the "
             "reply comes eagerly, straight into the caller's buffer, larger ones into a "
             "registered receive buffer and then to the caller; length and CRC checks). "
             "Medians of %d interleaved "
             "repetitions, MiB/s."
             % (a.threads, a.repeat), "",
             "| file size | Monarch fetch | perftest am_bw -e (same config) | ratio | "
             "perftest am_bw | perftest put_bw |",
             "|---|---|---|---|---|---|"]
    for s in SIZES:
        lines.append("| %s | %.0f | %.0f | %.2f | %.0f | %.0f |" % (
            "%d KiB" % (s >> 10) if s < (1 << 20) else "%d MiB" % (s >> 20), med["monarch"][s],
            med["am_e"][s], med["monarch"][s] / med["am_e"][s], med["am"][s], med["put"][s]))
    lines += ["", "All runs: " + repr(runs), ""]
    with open(a.out, "w") as f:
        f.write("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
