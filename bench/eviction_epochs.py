#!/usr/bin/env python3
"""A dataset twice the size of the tier, 3 epochs: placement without
eviction (first-fit, the MONARCH paper's) against eviction (lru) without a
known order and with one (lru, every epoch's order announced at the start:
eviction by next use), in one run, arms in turns; plain reads of the PFS as
the baseline for time and for PFS operations.

--tiers ram+posix splits the same room over two cache tiers, a RAM tier and
a posix tier of a quarter of the dataset each (the posix tier's directory
emptied before each run): with an order announced, files read sooner then
take the RAM tier and the copies they displace move down to the posix tier
(counted as demotions). --baseline-build DIR adds a next-use arm run with
that build's monarch-epochs, in turns with the others.

--partition R/N makes the process read every N-th file of each epoch's
shuffled order, as rank R of a data-parallel job does (DistributedSampler):
a different share of the dataset each epoch, with the tier sized to half of
a share.

The dataset (ImageNet-like files) sits behind the PFS emulator at its
defaults; each arm is a fresh `monarch-epochs` process (empty RAM tier of
half the dataset's bytes), 4 reader threads, 3 shuffled epochs, no wait for
placement between epochs. Per arm: each epoch's time, the bytes the source
served in each epoch, and the PFS operations (metadata and reads) over the
3 epochs (the namespace walk before them excluded). The order of each epoch
is unknown to Monarch here (no announcement).

usage: sudo python3 bench/eviction_epochs.py [--build build] [--files 2000]
       [--reps 3] [--tiers ram|ram+posix] [--baseline-build DIR]
       [--partition R/N] [--out bench/results/eviction.md]
"""

import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from emulated_dataset import mounted_dataset, parser  # noqa: E402
from service_epochs import fmt  # noqa: E402

ARMS = ("vanilla", "first-fit", "lru", "next-use")
BASELINE = "next-use (baseline)"


def run(a, arm, config, work, pfs, rep):
    out = os.path.join(work, "epochs.json")
    ops_file = os.path.join(work, "ops.json")
    hook = ("if [ $MONARCH_EPOCH = 1 ]; then %s reset %s; elif [ $MONARCH_EPOCH = 4 ]; then "
            "%s stats %s > %s; fi" % (pfs.script, pfs.mount, pfs.script, pfs.mount, ops_file))
    build = a.baseline_build if arm == BASELINE else a.build
    shutil.rmtree(os.path.join(work, "tier-posix"), ignore_errors=True)
    os.makedirs(os.path.join(work, "tier-posix"))
    os.sync()  # The last arm's tier writes are not written back during this one.
    cmd = [os.path.join(build, "monarch-epochs"), "--config", config, "--epochs", "3",
           "--threads", str(a.threads), "--seed", str(100 + rep), "--json", out,
           "--before-epoch", hook]
    if arm == "vanilla":
        cmd += ["--mode", "plain"]
    if arm in ("next-use", BASELINE):
        cmd += ["--announce-all"]
    if a.partition:
        cmd += ["--partition", a.partition]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit("failed: %s\n%s%s" % (shlex.join(cmd), r.stdout, r.stderr))
    with open(out) as f:
        epochs = json.load(f)
    with open(ops_file) as f:
        ops = json.load(f)["counters"]
    stats = json.loads(r.stdout.split("stats: ", 1)[1].splitlines()[0]) if "stats: " in r.stdout else {}
    return {
        "seconds": [e["seconds"] for e in epochs],
        "source_bytes": [e.get("served", {}).get("source", {}).get("bytes", 0) for e in epochs],
        "metadata_ops": ops["metadata_ops"],
        "reads": ops["reads"],
        "evictions": stats.get("evictions", 0),
        "demotions": stats.get("demotions", 0),
        "command": shlex.join(cmd),
    }


def main():
    ap = parser(reps=3, out="bench/results/eviction.md")
    ap.add_argument("--partition", default="", help="R/N: read rank R's share of each epoch")
    ap.add_argument("--tiers", default="ram", choices=("ram", "ram+posix"))
    ap.add_argument("--baseline-build", default="")
    a = ap.parse_args()
    arms = ARMS + ((BASELINE,) if a.baseline_build else ())
    pfs, files, total = mounted_dataset(a)
    mount = pfs.mount
    configs = {}
    share = total // int(a.partition.split("/")[1]) if a.partition else total
    if a.tiers == "ram":
        tiers = "  - {kind: ram, capacity: %d}\n" % (share // 2)
    else:
        tiers = ("  - {kind: ram, capacity: %d}\n  - {kind: posix, path: %s, capacity: %d}\n"
                 % (share // 4, os.path.join(a.dir, "tier-posix"), share // 4))
    for arm in arms:
        policy = {"vanilla": "first-fit", "next-use": "lru", BASELINE: "lru"}.get(arm, arm)
        path = os.path.join(a.dir, "evict-%s.yaml" % ("next-use-baseline" if arm == BASELINE
                                                      else arm))
        with open(path, "w") as f:
            f.write("dataset: {path: %s}\ntiers:\n%s  - {kind: source}\nplacement: {policy: %s}\n"
                    % (mount, tiers, policy))
        configs[arm] = path
    results = {arm: [] for arm in arms}
    load = os.getloadavg()[0]
    try:
        for rep in range(a.reps):
            for arm in arms:
                r = run(a, arm, configs[arm], a.dir, pfs, rep)
                results[arm].append(r)
                print("rep %d %-9s epochs %s s; source MiB %s; PFS metadata ops %d, reads %d; "
                      "evictions %d, demotions %d"
                      % (rep + 1, arm, " ".join("%.3f" % s for s in r["seconds"]),
                         " ".join("%.1f" % (b / 1048576) for b in r["source_bytes"]),
                         r["metadata_ops"], r["reads"], r["evictions"], r["demotions"]), flush=True)
    finally:
        pfs.stop()

    def med(arm, key, index=None):
        values = [r[key][index] if index is not None else r[key] for r in results[arm]]
        return statistics.median(values)

    room = ("a RAM tier of half what an epoch reads" if a.tiers == "ram" else
            "a RAM tier and a posix tier of a quarter of what an epoch reads each")
    lines = ["## %s%s\n" % ("rank %s's share of each epoch" % a.partition if a.partition
                             else "the whole dataset each epoch",
                             ", two cache tiers" if a.tiers == "ram+posix" else ""),
             "%d ImageNet-like files, %.1f MiB, behind the PFS emulator (%s); %s; %d reader "
             "threads; 3 epochs; %d repetitions, arms in turns (seeds 100..); load average "
             "before: %.2f. next-use: lru with the 3 epochs' order announced at the start "
             "(`--announce-all`).%s\n"
             % (files, total / 1048576, " ".join(pfs.flags), room, a.threads, a.reps, load,
                " next-use (baseline): the same with `%s/monarch-epochs`." % a.baseline_build
                if a.baseline_build else ""),
             "| arm | epoch 1 s | epoch 2 s | epoch 3 s | source MiB over 3 epochs | "
             "PFS ops (metadata + reads) | ops / vanilla | evictions | demotions |",
             "|---|---|---|---|---|---|---|---|---|"]
    vanilla_ops = med("vanilla", "metadata_ops") + med("vanilla", "reads")
    for arm in arms:
        seconds = [fmt([r["seconds"][e] for r in results[arm]]) for e in range(3)]
        source = statistics.median(sum(r["source_bytes"]) for r in results[arm]) / 1048576
        ops = med(arm, "metadata_ops") + med(arm, "reads")
        if arm == "vanilla":  # Every epoch's files from the PFS.
            source = 3 * (total / int(a.partition.split("/")[1]) if a.partition else total) / 1048576
        lines.append("| %s | %s | %s | %s | %.1f | %d | %.2f | %d | %d |" % (
            arm, seconds[0], seconds[1], seconds[2], source, ops, ops / vanilla_ops,
            med(arm, "evictions"), med(arm, "demotions")))
    lines.append("\nEpoch times are min / median / max over the repetitions; the rest are "
                 "medians. The vanilla arm reads the whole dataset from the PFS every epoch.\n")
    lines.append("Commands (the last repetition's):\n\n```")
    lines.append("sudo python3 bench/eviction_epochs.py --build %s --files %d --reps %d%s%s%s"
                 % (a.build, a.files, a.reps,
                    " --partition " + a.partition if a.partition else "",
                    " --tiers " + a.tiers if a.tiers != "ram" else "",
                    " --baseline-build " + a.baseline_build if a.baseline_build else ""))
    for arm in arms:
        lines.append(results[arm][-1]["command"])
    lines.append("```")
    text = "\n".join(lines) + "\n"
    print(text)
    if a.out:
        with open(a.out, "a") as f:  # One section per scenario.
            f.write(text + "\n")


if __name__ == "__main__":
    main()
