#!/usr/bin/env python3
"""A/B of two placement settings on one cell of the do-no-harm matrix.

Runs Monarch with setting A and with setting B in turns (A B, B A, ...), each
on a fresh tier, plus plain reads of the source in the same repetition, and
prints the median epoch-1 ratio to plain of each setting and the median of
B/A pair by pair. How the defaults of placement.threads and
placement.max_staging_bytes were chosen; results in
bench/results/placement_ab.md.

usage: bench/ab_placement.py CELL 'A placement YAML' 'B placement YAML' [PAIRS]
  CELL is DATASET-SOURCE-READERS-TIER as in bench/do_no_harm.py, e.g.
  small-cached-1-ram; the datasets are the ones bench/do_no_harm.py made in
  /var/tmp/monarch-dnh. Example:
  bench/ab_placement.py small-cached-1-ram 'threads: 2' 'threads: 1' 8
"""
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

BINARY = os.environ.get("MONARCH_EPOCHS", "build/monarch-epochs")
DATA = os.environ.get("MONARCH_DNH_DIR", "/var/tmp/monarch-dnh")


def epochs(args, out):
    os.sync()
    subprocess.run([BINARY] + args + ["--json", out], check=True, capture_output=True)
    with open(out) as f:
        return json.load(f)


def main():
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    cell, setting_a, setting_b = sys.argv[1:4]
    pairs = int(sys.argv[4]) if len(sys.argv) > 4 else 8
    name, state, readers, tier = cell.split("-")
    source = os.path.join(DATA, name)
    work = os.path.join(DATA, f"ab-{os.getpid()}-{int(time.time())}")
    os.makedirs(work)
    common = ["--threads", readers, "--read-size", "256KiB", "--epochs", "1", "--seed", "7"]
    if state == "dropped":
        common.append("--drop-source-cache")
    out = os.path.join(work, "run.json")
    ratios = {"A": [], "B": []}
    try:
        for i in range(pairs):
            if state == "cached":
                epochs(["--dataset", source, "--mode", "plain", "--epochs", "1", "--threads", "2"],
                       out)
            plain = epochs(["--dataset", source, "--mode", "plain"] + common, out)[0]["seconds"]
            order = [("A", setting_a), ("B", setting_b)]
            for tag, setting in (order if i % 2 == 0 else order[::-1]):
                tier_dir = os.path.join(work, f"tier-{i}-{tag}")
                os.makedirs(tier_dir)
                config = os.path.join(work, "config.yaml")
                with open(config, "w") as f:
                    f.write(f"dataset: {{path: {source}}}\ntiers:\n")
                    if tier == "ram":
                        f.write("  - {kind: ram, capacity: 4GiB}\n")
                    else:
                        f.write(f"  - {{kind: posix, path: {tier_dir}, capacity: 64GiB}}\n")
                    f.write(f"  - {{kind: source}}\nplacement: {{{setting}}}\n")
                seconds = epochs(["--config", config] + common, out)[0]["seconds"]
                ratios[tag].append(seconds / plain)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    b_over_a = statistics.median(b / a for a, b in zip(ratios["A"], ratios["B"]))
    print(f"| {cell} | {setting_a} | {statistics.median(ratios['A']):.3f} | {setting_b} | "
          f"{statistics.median(ratios['B']):.3f} | {b_over_a:.3f} | {pairs} |")


if __name__ == "__main__":
    main()
