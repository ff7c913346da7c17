#!/usr/bin/env python3
"""What checking tier copies against their checksums costs, in one run.

For each dataset profile (ImageNet-like small files read whole; 64 MiB shards
read in 256 KiB calls like TFRecord readers) and each file tier (posix on
the disk, pmem on /dev/shm), it runs 3 epochs of monarch-epochs with every
placement.verify policy (off, first-read, every-read), and 3 epochs of plain
pread of a pre-staged local copy, in turns, `--repeat` times, keeping each
epoch's best time. Nothing drops the page cache: the hot epochs read copies
that are in memory, where a checksum costs the most relative to the read.
(placement.route_by_speed is off, so that those reads go to the copies and
not to the source's page cache, which would be as fast and check nothing.)

Epoch 2 is the first hot epoch of the process (first-read checks each block
there); epoch 3 is the steady state. Reported: each hot epoch / the local
copy's same epoch (target for the default, first-read: <= 1.05).

With --restart, each tier setup first runs one epoch to fill its tier,
then the measured run starts on the copies it left: epoch 1 is then the
first epoch after a restart, hot (the copies are reused), and epoch 2 the
one after it.

With --baseline-build, each tier setup also runs with that build's
monarch-epochs (another commit, built in its own directory), in turns with
this one, and gets its own rows: a before/after in the same run. Epoch 1
(cold: promotions, and the tier readying each new copy in the background)
is reported too, so what moves off the hot epochs shows up there if it
costs anything.

usage: bench/integrity.py [--build build] [--dir /var/tmp/monarch-bench-integrity]
                          [--small-files 8000] [--shards 16] [--threads 4] [--repeat 3]
                          [--policies off,first-read,every-read] [--baseline-build DIR]
                          [--restart]
"""
import argparse
import json
import os
import shutil
import subprocess
import sys

POLICIES = ("off", "first-read", "every-read")


def run(cmd):
    print("+", " ".join(cmd), flush=True)
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout


def epochs(binary, args, json_path):
    run([binary] + args + ["--json", json_path])
    with open(json_path) as f:
        return [e["seconds"] for e in json.load(f)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--dir", default="/var/tmp/monarch-bench-integrity")
    ap.add_argument("--shm", default="/dev/shm/monarch-bench-integrity")
    ap.add_argument("--small-files", type=int, default=8000)
    ap.add_argument("--shards", type=int, default=16)
    ap.add_argument("--threads", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--policies", default=",".join(POLICIES))
    ap.add_argument("--baseline-build", default="")
    ap.add_argument("--restart", action="store_true")
    ap.add_argument("--out", default="bench/results/integrity.md")
    a = ap.parse_args()
    binary = os.path.join(a.build, "monarch-epochs")
    policies = a.policies.split(",")
    builds = [("", binary)]
    if a.baseline_build:
        builds.append((" (baseline)", os.path.join(a.baseline_build, "monarch-epochs")))
    os.makedirs(a.dir, exist_ok=True)
    j = os.path.join(a.dir, "run.json")
    load_before = f"{os.getloadavg()[0]:.2f}"
    rows = []
    for profile, count, read_size in (("imagenet", a.small_files, "0"),
                                      ("shards", a.shards, "256KiB")):
        base = os.path.join(a.dir, profile)
        source, local = base + "-source", base + "-local"
        if not os.path.isdir(source):
            run([binary, "--dataset", source, "--generate", str(count), "--profile", profile,
                 "--epochs", "0"])
        if not os.path.isdir(local):
            shutil.copytree(source, local)
        common = ["--threads", str(a.threads), "--read-size", read_size, "--seed", "7"]
        best = {}

        def keep(key, times):
            best[key] = [min(x, t) for x, t in zip(best.get(key, [float("inf")] * 3), times)]

        for rep in range(a.repeat):
            keep("local", epochs(binary, ["--dataset", source, "--plain-dir", local,
                                          "--mode", "plain", "--epochs", "3"] + common, j))
            for kind, root in (("posix", a.dir), ("pmem", a.shm)):
                for policy in policies:
                    for label, build_binary in builds:
                        tier = os.path.join(root, f"tier-{profile}-{kind}-{policy}")
                        shutil.rmtree(tier, ignore_errors=True)
                        os.makedirs(tier)
                        config = os.path.join(a.dir, "integrity.yaml")
                        with open(config, "w") as f:
                            f.write(f"dataset: {{path: {source}}}\n"
                                    f"tiers:\n  - {{name: {kind}, kind: {kind}, path: {tier}, "
                                    f"capacity: 8GiB}}\n  - {{name: pfs, kind: source}}\n"
                                    f"placement: {{threads: 2, verify: {policy}, "
                                    # The source stays in the page cache (never
                                    # dropped), and by default a hit is read from
                                    # there when that is faster than the copy: the
                                    # hot epochs would check no copy at all.
                                    f"route_by_speed: false}}\n")
                        run_args = ["--config", config, "--settle"] + common
                        if a.restart:  # Fills the tier the measured run starts on.
                            epochs(build_binary, run_args + ["--epochs", "1"], j)
                        keep((kind, policy, label),
                             epochs(build_binary, run_args + ["--epochs", "3"], j))
                        shutil.rmtree(tier, ignore_errors=True)
        rows.append((profile, count, best))

    lines = ["# Cost of checking tier copies (placement.verify)", "",
             f"Command: `python3 bench/integrity.py --small-files {a.small_files} "
             f"--shards {a.shards} --threads {a.threads} --repeat {a.repeat}"
             + (f" --policies {a.policies}" if a.policies != ",".join(POLICIES) else "")
             + (f" --baseline-build {a.baseline_build}" if a.baseline_build else "")
             + (" --restart" if a.restart else "") + "` "
             "(page cache never dropped: hot epochs read copies in memory; posix tier on the "
             "disk, pmem tier on /dev/shm; best of "
             f"{a.repeat} runs per epoch, setups in turns; load average before: {load_before}, "
             f"after: {os.getloadavg()[0]:.2f}).", "",
             ("Epoch 1 is the first epoch after a restart on the copies an earlier run left; "
              if a.restart else
              "Epoch 2 is each process's first hot epoch (first-read checks every block there "
              "once); ") +
             "epoch 3 is the steady state. Ratios are to the plain reads of a "
             "pre-staged local copy in the same epoch.", "",
             "| dataset | tier | verify | e1 (s) | e2 (s) | e3 (s) | e1 / local | e2 / local | "
             "e3 / local |",
             "|---|---|---|---|---|---|---|---|---|"]
    if a.baseline_build:
        lines[2] += (f" Rows marked (baseline) ran `{a.baseline_build}/monarch-epochs`, in turns "
                     "with this build.")
    for profile, count, best in rows:
        local = best["local"]
        lines.append(f"| {profile} ({count} files) | local copy | - | {local[0]:.3f} | "
                     f"{local[1]:.3f} | {local[2]:.3f} | 1 | 1 | 1 |")
        for kind in ("posix", "pmem"):
            for policy in policies:
                for label, _ in builds:
                    t = best[(kind, policy, label)]
                    lines.append(f"| {profile} ({count} files) | {kind} | {policy}{label} | "
                                 f"{t[0]:.3f} | {t[1]:.3f} | {t[2]:.3f} | "
                                 f"{t[0] / local[0]:.3f} | {t[1] / local[1]:.3f} | "
                                 f"{t[2] / local[2]:.3f} |")
    shutil.rmtree(a.shm, ignore_errors=True)
    text = "\n".join(lines) + "\n"
    print(text)
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    with open(a.out, "w") as f:
        f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
