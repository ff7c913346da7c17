#!/usr/bin/env python3
"""Cold epoch 1 with the read order announced (clairvoyant prefetch) against
vanilla reads of the PFS, in one run, in alternating repetitions.

The dataset (ImageNet-like files, ~110 KiB, from `monarch-epochs --generate
--profile imagenet`) sits behind the PFS emulator at its defaults (1 ms per
metadata operation, 0.5 ms per read, 300 MB/s, 8 operations at once). Each
repetition runs, in turn, one cold epoch of 4 reader threads in a shuffled
order:

  vanilla    plain open/pread/close of the emulator's files (the baseline)
  monarch    Monarch with a RAM tier, no order announced (today's miss path)
  announced  the same with the epoch's order announced as it starts
             (`monarch-epochs --announce`): prefetch.streams read ahead

Each Monarch run is a fresh process, so its RAM tier starts empty. The
figure is the epoch's own time (the namespace walk before it is not in it),
and the ratio is taken per repetition against that repetition's vanilla
run. Also printed: the epoch against the emulator's bandwidth bound
(dataset bytes / bandwidth), and the PFS operations of each arm.

usage: sudo python3 bench/prefetch_epochs.py [--build build] [--files 2000]
       [--reps 5] [--out bench/results/prefetch.md]
"""

import json
import os
import shlex
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from emulated_dataset import mounted_dataset, parser  # noqa: E402
from service_epochs import fmt  # noqa: E402


def epoch(a, config, extra, work, pfs):
    out = os.path.join(work, "epoch.json")
    if hasattr(pfs, "drop_cache"):
        pfs.drop_cache()  # MooseFS: a cold epoch meets the chunk server's disk again.
    hook = ("if [ $MONARCH_EPOCH = 1 ]; then %s reset %s; else %s stats %s > %s; fi" %
            (pfs.script, pfs.mount, pfs.script, pfs.mount, os.path.join(work, "ops.json")))
    cmd = [os.path.join(a.build, "monarch-epochs"), "--config", config, "--epochs", "1",
           "--threads", str(a.threads), "--seed", str(int(time.time())), "--json", out,
           "--before-epoch", hook] + extra
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit("failed: %s\n%s%s" % (" ".join(cmd), r.stdout, r.stderr))
    with open(out) as f:
        seconds = json.load(f)[0]["seconds"]
    with open(os.path.join(work, "ops.json")) as f:
        ops = json.load(f)["counters"]
    return seconds, ops, shlex.join(cmd)


def main():
    a = parser(reps=5, out="bench/results/prefetch.md").parse_args()
    pfs, files, total = mounted_dataset(a)
    mount = pfs.mount
    configs = {}
    for arm in ("vanilla", "monarch", "announced"):
        path = os.path.join(a.dir, arm + ".yaml")
        with open(path, "w") as f:
            f.write("dataset: {path: %s}\ntiers:\n  - {kind: ram, capacity: %d}\n"
                    "  - {kind: source}\n" % (mount, 2 * total))
        configs[arm] = path
    extra = {"vanilla": ["--mode", "plain"], "monarch": [], "announced": ["--announce"]}
    times = {arm: [] for arm in configs}
    ops = {}
    commands = {}
    try:
        for rep in range(a.reps):
            for arm in ("vanilla", "monarch", "announced"):
                s, o, cmd = epoch(a, configs[arm], extra[arm], a.dir, pfs)
                times[arm].append(s)
                ops[arm] = o
                commands[arm] = cmd
                print("rep %d %-9s %.3f s  (%d metadata ops, %d reads)" %
                      (rep + 1, arm, s, o["metadata_ops"], o["reads"]), flush=True)
    finally:
        pfs.stop()
    # The emulator's bandwidth bounds an epoch; MooseFS has no set bound.
    bound = None if a.source == "moosefs" else total / (a.bandwidth_mbps * 1e6)
    where = (pfs.describe() if a.source == "moosefs" else
             "behind the PFS emulator (%s)" % " ".join(pfs.flags))
    lines = []
    lines.append("# Cold epoch 1 with the read order announced (clairvoyant prefetch)\n")
    lines.append("%d ImageNet-like files, %.1f MiB, %s; %d reader "
                 "threads; %d repetitions, arms in turns; RAM tier; load average before: %.2f.\n"
                 % (files, total / 1048576.0, where, a.threads, a.reps, os.getloadavg()[0]))
    lines.append("| arm | epoch 1 s (min / median / max) | / vanilla (per repetition) | "
                 "/ bandwidth bound (%s) | PFS metadata ops | PFS reads |" % (
                     "%.3f s" % bound if bound else "none"))
    lines.append("|---|---|---|---|---|---|")
    for arm in ("vanilla", "monarch", "announced"):
        ratio = [t / v for t, v in zip(times[arm], times["vanilla"])]
        lines.append("| %s | %s | %s | %s | %d | %d |" % (
            arm, fmt(times[arm]), fmt(ratio),
            "%.2f" % (statistics.median(times[arm]) / bound) if bound else "-",
            ops[arm]["metadata_ops"], ops[arm]["reads"]))
    lines.append("\nPFS operations are those of the last repetition's epoch (the namespace walk "
                 "before it excluded).\n")
    lines.append("Commands (the last repetition's; the seed changes per run):\n")
    lines.append("```")
    lines.append("sudo python3 bench/prefetch_epochs.py --build %s --files %d --reps %d%s" %
                 (a.build, a.files, a.reps, " --source moosefs --moosefs-setup %s" %
                  a.moosefs_setup if a.source == "moosefs" else ""))
    for arm in ("vanilla", "monarch", "announced"):
        lines.append(commands[arm])
    lines.append("```")
    text = "\n".join(lines) + "\n"
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
