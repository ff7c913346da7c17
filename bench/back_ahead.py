#!/usr/bin/env python3
"""The RAM tier's back_ahead key, on and off, in turns, in one run.

For each source state (dropped: its pages evicted before each epoch, as a
cold PFS client; cached: in the page cache) and each repetition, runs
`monarch-epochs` over the do-no-harm bench's small dataset (2,000 files of
~110 KiB; bench/do_no_harm.py makes it) with a 4 GiB RAM tier, 4 readers,
256 KiB reads, 2 epochs, once with `back_ahead: 0` and once with
`back_ahead: SIZE`, which going first alternating. `--pause` seconds pass
between start-up and epoch 1 (untimed, `--before-epoch "sleep N"`): a job
builds its model and its DataLoader before it reads, and that is when the
memory can be backed. Prints and records, per arm, the median epoch 1 time,
its ratio on/off, and the copies published by the end of epoch 1.

Needs root (drop_caches).

  python3 bench/back_ahead.py [--build build] [--repeat 5] [--pause 1] [--size 512MiB]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)


def drop_page_cache():
    subprocess.run(["sync"], check=True)
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--dir", default="/var/tmp/monarch-dnh")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--pause", type=float, default=1.0)
    ap.add_argument("--size", default="512MiB")
    ap.add_argument("--out", default="bench/results/back_ahead")
    a = ap.parse_args()
    binary = os.path.join(a.build, "monarch-epochs")
    source = os.path.join(a.dir, "small")
    if not os.path.isdir(source):
        sys.exit(f"{source} is missing: run bench/do_no_harm.py --only small-cached-1-ram first")
    commit = subprocess.run(["git", "-C", REPO, "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip()
    arms = {"off": "0", "on": a.size}
    configs = {}
    for arm, size in arms.items():
        configs[arm] = os.path.join(a.dir, f"back_ahead_{arm}.yaml")
        with open(configs[arm], "w") as f:
            f.write(f"dataset: {{path: {source}}}\ntiers:\n"
                    f"  - {{name: ram, kind: ram, capacity: 4GiB, back_ahead: {size}}}\n"
                    "  - {name: pfs, kind: source}\n")
    out_json = os.path.join(a.dir, "back_ahead_run.json")
    results = {}
    for state in ["dropped", "cached"]:
        runs = {arm: [] for arm in arms}
        for rep in range(a.repeat):
            order = ["off", "on"] if rep % 2 == 0 else ["on", "off"]
            for arm in order:
                drop_page_cache()
                cmd = [binary, "--config", configs[arm], "--read-size", "262144", "--threads", "4",
                       "--epochs", "2", "--seed", "7", "--json", out_json,
                       "--before-epoch", f"[ $MONARCH_EPOCH != 1 ] || sleep {a.pause}"]
                if state == "dropped":
                    cmd.append("--drop-source-cache")
                else:
                    subprocess.run([binary, "--dataset", source, "--mode", "plain", "--epochs", "1",
                                    "--threads", "2"], check=True, capture_output=True)
                subprocess.run(cmd, check=True, capture_output=True)
                with open(out_json) as f:
                    epochs = json.load(f)
                assert all(e["errors"] == 0 for e in epochs), epochs
                runs[arm].append({"e1": epochs[0]["seconds"], "e2": epochs[1]["seconds"],
                                  "published_e1": epochs[0]["published_files"]})
                print(state, arm, runs[arm][-1], flush=True)
        results[state] = {
            arm: {"e1_median": statistics.median(r["e1"] for r in rs),
                  "e2_median": statistics.median(r["e2"] for r in rs),
                  "published_e1_median": statistics.median(r["published_e1"] for r in rs),
                  "runs": rs}
            for arm, rs in runs.items()}
    cmd_line = (f"python3 bench/back_ahead.py --repeat {a.repeat} --pause {a.pause:g} "
                f"--size {a.size}")
    lines = ["# The RAM tier's back_ahead, on and off", "",
             f"Command: `{cmd_line}` (root; a Release build; the dataset of "
             "`bench/do_no_harm.py`). Measured at " + commit + ". 2,000 files of ~110 KiB, a 4 GiB "
             f"RAM tier, 4 readers, 256 KiB reads, {a.pause:g} s between start-up and epoch 1, "
             "the two arms in turns. Medians over " + str(a.repeat) + " runs.", "",
             "| source | e1 off (s) | e1 on (s) | e1 on/off | copies made in e1, off | on |",
             "|---|---|---|---|---|---|"]
    for state, r in results.items():
        lines.append(f"| {state} | {r['off']['e1_median']:.3f} | {r['on']['e1_median']:.3f} | "
                     f"{r['on']['e1_median'] / r['off']['e1_median']:.2f} | "
                     f"{r['off']['published_e1_median']:.0f} | {r['on']['published_e1_median']:.0f} |")
    os.makedirs(os.path.dirname(a.out) or ".", exist_ok=True)
    with open(a.out + ".json", "w") as f:
        json.dump({"commit": commit, "command": cmd_line, "results": results}, f, indent=1)
    with open(a.out + ".md", "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
