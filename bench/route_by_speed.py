#!/usr/bin/env python3
"""placement.route_by_speed, on and off, in turns, in one run.

The case it is for: a posix tier whose copies' pages are not in the page
cache (written with O_DIRECT, `write_mode: direct`, as `auto` does once the
copies outgrow memory) while the source's are. Over the do-no-harm bench's
large dataset (64 files of 16 MiB; bench/do_no_harm.py makes it), each
repetition runs plain reads of the source (in the page cache) for 3 epochs,
then Monarch with the model on, then off (which first alternating), each on
a fresh posix tier in the same directory tree as the source, with
`cached_source: promote` so that epoch 1 makes every copy, `--settle`, 256
KiB reads and 4 readers. Epochs 2 and 3 are hits: off, they read the
copies from the device; on, the model measures that and reads the source's
page cache. Prints the median ratios over plain reads per epoch and arm.

Needs root (drop_caches).

  python3 bench/route_by_speed.py [--build build] [--repeat 3]
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
EPOCHS = 3


def drop_page_cache():
    subprocess.run(["sync"], check=True)
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def epochs(binary, args, out_json):
    subprocess.run([binary] + args + ["--json", out_json], check=True, capture_output=True)
    with open(out_json) as f:
        result = json.load(f)
    assert all(e["errors"] == 0 and e["mismatches"] == 0 for e in result), result
    return result


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--dir", default="/var/tmp/monarch-dnh")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--threads", type=int, default=4)
    ap.add_argument("--out", default="bench/results/route_by_speed")
    a = ap.parse_args()
    binary = os.path.join(a.build, "monarch-epochs")
    source = os.path.join(a.dir, "large")
    if not os.path.isdir(source):
        sys.exit(f"{source} is missing: run bench/do_no_harm.py --only large-cached-1-posix first")
    commit = subprocess.run(["git", "-C", REPO, "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip()
    out_json = os.path.join(a.dir, "route_run.json")
    common = ["--read-size", "262144", "--threads", str(a.threads), "--epochs", str(EPOCHS),
              "--seed", "7", "--verify"]
    runs = {"plain": [], "on": [], "off": []}
    served = {"on": [], "off": []}
    for rep in range(a.repeat):
        drop_page_cache()
        # The source in the page cache, as a PFS client's cache or a local file system.
        subprocess.run([binary, "--dataset", source, "--mode", "plain", "--epochs", "1",
                        "--threads", "2"], check=True, capture_output=True)
        runs["plain"].append([e["seconds"] for e in epochs(
            binary, ["--dataset", source, "--mode", "plain"] + common, out_json)])
        for arm in (["on", "off"] if rep % 2 == 0 else ["off", "on"]):
            tier = os.path.join(a.dir, f"route-tier-{arm}")
            shutil.rmtree(tier, ignore_errors=True)
            os.makedirs(tier)
            config = os.path.join(a.dir, f"route_{arm}.yaml")
            with open(config, "w") as f:
                f.write(f"dataset: {{path: {source}}}\ntiers:\n"
                        f"  - {{name: nvme, kind: posix, path: {tier}, capacity: 64GiB, "
                        "write_mode: direct}\n  - {name: pfs, kind: source}\n"
                        "placement: {cached_source: promote, route_by_speed: "
                        f"{'true' if arm == 'on' else 'false'}}}\n")
            result = epochs(binary, ["--config", config, "--settle"] + common, out_json)
            runs[arm].append([e["seconds"] for e in result])
            served[arm].append([{k: v.get("bytes", 0) for k, v in e["served"].items()
                                 if isinstance(v, dict) and "bytes" in v} for e in result])
            shutil.rmtree(tier, ignore_errors=True)
        print(rep, {k: v[-1] for k, v in runs.items()}, flush=True)
    ratios = {arm: [statistics.median(m[e] / p[e] for m, p in zip(runs[arm], runs["plain"]))
                    for e in range(EPOCHS)] for arm in ("on", "off")}
    medians = {arm: [statistics.median(r[e] for r in runs[arm]) for e in range(EPOCHS)]
               for arm in runs}
    cmd = f"python3 bench/route_by_speed.py --repeat {a.repeat} --threads {a.threads}"
    mib = lambda b: f"{b / 1048576:.0f}"
    lines = ["# placement.route_by_speed, on and off", "",
             f"Command: `{cmd}` (root; a Release build; the large dataset of "
             f"`bench/do_no_harm.py`: 64 files of 16 MiB). Measured at {commit}. A posix tier "
             "with `write_mode: direct` (its copies' pages not cached) on the source's disk, the "
             "source in the page cache, `cached_source: promote`, `--settle`, 256 KiB reads, "
             f"{a.threads} readers, the arms in turns. Medians over {a.repeat} runs; ratios over "
             "plain reads of the source in the same repetition.", "",
             "| arm | e1 / e2 / e3 (s) | e1 / e2 / e3 ratio | epoch 2 served from (MiB, last run) |",
             "|---|---|---|---|"]
    lines.append("| plain reads | " + " / ".join(f"{x:.3f}" for x in medians["plain"]) + " | 1 | - |")
    for arm in ("on", "off"):
        e2 = served[arm][-1][1]
        where = ", ".join(f"{k} {mib(v)}" for k, v in e2.items() if v)
        lines.append(f"| route_by_speed: {'true' if arm == 'on' else 'false'} | " +
                     " / ".join(f"{x:.3f}" for x in medians[arm]) + " | " +
                     " / ".join(f"{x:.2f}" for x in ratios[arm]) + f" | {where} |")
    os.makedirs(os.path.dirname(a.out) or ".", exist_ok=True)
    with open(a.out + ".json", "w") as f:
        json.dump({"commit": commit, "command": cmd, "runs": runs, "served": served,
                   "ratios": ratios}, f, indent=1)
    with open(a.out + ".md", "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
