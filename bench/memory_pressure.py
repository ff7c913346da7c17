#!/usr/bin/env python3
"""The memory-pressure scenario of issue 31, with memory.watch on and off.

A cgroup v1 memory cgroup limited to --limit-mib; in it a node service with a
RAM tier of --tier-mib filled with --data-mib through a client, then a job
that allocates and touches --job-mib, more than is left. Each arm runs
--repeat times (arms in turns); the scenario is tests/service/
memory_pressure_test.py's (run_scenario), which the CI test asserts on with
the feature on. Here nothing is asserted: an arm that gets OOM-killed is
recorded as such.

Prints, per run: OOM kills of the job and of the service (and the cgroup's
oom_kill count), the time from the job's start until the stats show the tier
shrunk (polled every 50 ms), bytes shed / given back to the kernel, and
whether an epoch read afterwards through the service was exact
(`monarch-epochs --verify`, every read compared with the source).

usage: sudo python3 bench/memory_pressure.py --build build [--repeat 2]
       [--limit-mib 1536 --tier-mib 1024 --data-mib 900 --job-mib 800]
       [--markdown FILE]
"""

import argparse
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "service"))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
import memory_pressure_test as scenario  # noqa: E402
from process_util import Skip  # noqa: E402

MiB = 1 << 20


def mib(value):
    return "-" if value is None else "%.1f" % (value / MiB)


def row(r):
    if r["service_alive"]:
        service = "alive"
    else:
        service = "**OOM-killed**" if r["service_oom_killed"] else "exit %s" % r["service_exit"]
    job = "**OOM-killed**" if r["job_oom_killed"] else (
        "ok" if r["job_exit"] == 0 else "exit %s" % r["job_exit"])
    exact = {True: "yes", False: "**no**", None: "- (no service)"}[r.get("bytes_exact")]
    shrink = "-" if r.get("time_to_shrink_s") is None else "%.2f" % r["time_to_shrink_s"]
    return "| %s | %s | %s | %d | %s | %s | %s | %s | %s | %s |" % (
        "on" if r["watch"] else "off", job, service, r["cgroup_oom_kills"], shrink,
        mib(r.get("memory_shed_bytes")), mib(r.get("memory_released_bytes")),
        mib(r.get("effective_capacity")), exact, r.get("cgroup_max_usage_mib"))


HEADER = ("| memory.watch | job | service | cgroup oom_kill | time to shrink s | shed MiB | "
          "given back MiB | effective capacity MiB after | bytes exact | cgroup max usage MiB |\n"
          "|---|---|---|---|---|---|---|---|---|---|")


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--build", required=True)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--limit-mib", type=int, default=1536)
    parser.add_argument("--tier-mib", type=int, default=1024)
    parser.add_argument("--data-mib", type=int, default=900)
    parser.add_argument("--job-mib", type=int, default=800)
    parser.add_argument("--headroom-mib", type=int, default=256)
    parser.add_argument("--file-mib", type=int, default=2)
    parser.add_argument("--job-hold-s", type=float, default=2.0)
    parser.add_argument("--markdown", help="append the table and the logs here")
    args = parser.parse_args()
    results = []
    try:
        for rep in range(args.repeat):
            for watch in (True, False):
                print("run %d, memory.watch %s" % (rep + 1, "on" if watch else "off"), flush=True)
                r = scenario.run_scenario(args.build, watch, args.limit_mib, args.tier_mib,
                                          args.data_mib, args.job_mib, args.file_mib,
                                          args.headroom_mib, args.job_hold_s)
                results.append(r)
                print(row(r), flush=True)
    except Skip as e:
        print("SKIP: %s" % e)
        return 77
    commit = subprocess.run(["git", "-C", HERE, "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip()
    text = ["", "Limit %d MiB (cgroup v1), RAM tier %d MiB holding %d MiB (%d files), job %d MiB, "
            "memory.headroom %d MiB; commit %s." % (args.limit_mib, args.tier_mib,
                                                    args.data_mib, results[0].get("files", 0),
                                                    args.job_mib, args.headroom_mib, commit),
            "", HEADER] + [row(r) for r in results] + ["", "Service log lines (memory.watch on):", ""]
    for r in results:
        if r["watch"]:
            text += ["    " + line for line in r.get("log", [])]
            break
    print("\n".join(text))
    if args.markdown:
        with open(args.markdown, "a") as f:
            f.write("\n".join(text) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
