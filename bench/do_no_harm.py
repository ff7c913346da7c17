#!/usr/bin/env python3
"""Do-no-harm matrix: every epoch through Monarch against plain reads of the source.

One run measures every cell of

    dataset   small (2,000 ImageNet-like files, ~110 KiB) | large (64 x 16 MiB)
    source    cached (in the page cache) | dropped (its pages evicted before each epoch)
    readers   1 | 4
    tier      ram | posix (a directory on the source's own disk)

with `monarch-epochs --read-size 256KiB`: per repetition, plain reads of the
source for 3 epochs (`--mode plain`) then Monarch for 3 epochs, in turns, each
Monarch run on a fresh, empty tier. A cell's figure per epoch is the median,
over repetitions, of Monarch's time divided by the plain time of the same
repetition. "dropped" evicts only the source's files (POSIX_FADV_DONTNEED,
`--drop-source-cache`): a PFS client whose cache went cold; tier copies keep
their pages, as in the original MONARCH's measurements.

Beside the ratios it measures, in the same run:
  - the memcpy bound of epoch 1: plain time plus one copy of the dataset's
    bytes into memory that is not in the CPU cache (the second pass a copy
    into a tier makes), spread over min(readers, cores) cores;
  - the tier-write bound: plain time plus writing the dataset into a fresh
    tier the cheapest way that tier allows (`bench_tier_write`), likewise;
  - for "dropped": the device's own bound. The source and a posix tier share
    one disk: epoch 1 must read the bytes (what plain reads take) and a
    posix tier must also write them (bytes / the disk's write bandwidth,
    measured with dd, O_DIRECT), unless the page cache defers the writes.

Targets (issue "Do no harm"): epoch 1 <= 1.10x plain with 1 reader, <= 1.5x
with 4; epochs 2 and 3 <= 1.05x in every cell; every copy published by the end
of epoch 2. Writes bench/results/do_no_harm.{md,json,png}.

Needs root: every repetition starts from an empty page cache (drop_caches),
so that one cell's tier copies do not fill the memory the next one needs.

Note: ext4 creates files slowly for minutes after many were deleted (its
search for an inode not recently freed). The script deletes its tier
directories only at the very end; wait a few minutes between two runs.

With --source moosefs the datasets are copied onto a real MooseFS
(scripts/moosefs.sh, bench/moosefs_source.py) and read from there; "dropped"
then also evicts the chunk server's pages before each epoch (scripts/moosefs.sh
drop-cache), so a cold epoch meets the chunk server's disk.

usage: bench/do_no_harm.py [--build build] [--dir /var/tmp/monarch-dnh] [--repeat 3]
                           [--only small-cached-1-ram,...] [--source moosefs]
"""
import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from moosefs_source import SCRIPT as MOOSEFS_SCRIPT, MooseFS, add_source_flags  # noqa: E402

EPOCHS = 3
TARGET_E1 = {1: 1.10, 4: 1.5}
TARGET_HOT = 1.05


def run(cmd, **kw):
    return subprocess.run(cmd, check=True, capture_output=True, text=True, **kw).stdout


def epochs(binary, args, json_path):
    # Dirty pages an earlier run left (tier copies) are written back first, so
    # their writeback does not run, and cost CPU and disk, inside this one.
    os.sync()
    out = run([binary] + args + ["--json", json_path])
    with open(json_path) as f:
        return json.load(f), out


def drop_page_cache():
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("1\n")
    except OSError as e:
        sys.exit(f"cannot drop the page cache ({e}): run as root")


def device_bandwidth(path, scratch):
    """Read bandwidth of `path`'s device (O_DIRECT, 4 MiB blocks) and write bandwidth."""
    rd = subprocess.run(["dd", f"if={path}", "of=/dev/null", "bs=4M", "iflag=direct"],
                        capture_output=True, text=True).stderr
    target = os.path.join(scratch, "dd-write-probe")
    wr = subprocess.run(["dd", "if=/dev/zero", f"of={target}", "bs=4M", "count=256",
                         "oflag=direct", "conv=fsync"], capture_output=True, text=True).stderr
    os.unlink(target)

    def rate(text, what):
        m = re.search(r"(\d+) bytes .* copied, ([\d.]+) s", text)
        if not m or int(m.group(1)) == 0:
            raise SystemExit(f"cannot measure the device's {what} bandwidth with dd: {text.strip()}")
        return int(m.group(1)) / float(m.group(2))
    return rate(rd, "read"), rate(wr, "write")


def main():
    tiers_made = []
    try:
        return measure(tiers_made)
    finally:
        for t in tiers_made:
            shutil.rmtree(t, ignore_errors=True)


def measure(tiers_made):
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--dir", default="/var/tmp/monarch-dnh")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--only", default="", help="comma-separated cells, e.g. small-cached-1-ram")
    ap.add_argument("--read-size", default="256KiB",
                    help="bytes per read call (monarch-epochs --read-size; 0: whole files)")
    ap.add_argument("--buffer-offset", type=int, default=0,
                    help="where each reader's buffer starts in its page, in both modes "
                         "(16: where malloc() puts a buffer above 128 KiB)")
    ap.add_argument("--cached-source", choices=["defer", "promote"], default="defer",
                    help="placement.cached_source of Monarch's runs")
    ap.add_argument("--back-ahead", default="",
                    help="tiers[i].back_ahead of the RAM tier (a size such as 256MiB)")
    ap.add_argument("--out", default="bench/results/do_no_harm")
    add_source_flags(ap)
    ap.add_argument("--report-only", action="store_true",
                    help="rewrite OUT.md and OUT.png from OUT.json without measuring")
    a = ap.parse_args()
    if a.report_only:
        with open(a.out + ".json") as f:
            saved = json.load(f)
        a.repeat = saved.get("repeat", a.repeat)
        a.read_size = saved.get("read_size", "256KiB")
        a.buffer_offset = saved.get("buffer_offset", 0)
        a.cached_source = saved.get("cached_source", "promote")
        a.back_ahead = saved.get("back_ahead", "")
        a.source_line = saved.get("source_line", "")
        a.commit = saved.get("commit", "unknown")
        bounds = {tuple(k.split("-", 1)): v for k, v in saved["bounds"].items()}
        if saved["device"]:
            add_device_bounds(saved["cells"], saved["device"])
        write_report(a, saved["cells"], bounds, saved["device"], saved.get("load_before", 0),
                     saved.get("cores", os.cpu_count()), saved.get("load_after"))
        return 0
    binary = os.path.join(a.build, "monarch-epochs")
    a.commit = subprocess.run(["git", "describe", "--always", "--dirty"], capture_output=True,
                              text=True).stdout.strip() or "unknown"
    writer = os.path.join(a.build, "bench", "bench_tier_write")
    os.makedirs(a.dir, exist_ok=True)
    cores = os.cpu_count()
    datasets = {"small": (["--generate", "2000", "--profile", "imagenet"]),
                "large": (["--generate", "64", "--profile", "shards", "--file-size", "16MiB"])}
    for name, gen in datasets.items():
        source = os.path.join(a.dir, name)
        if not os.path.isdir(source):
            run([binary, "--dataset", source, "--epochs", "0"] + gen)
    # Every posix run keeps its fresh tier until the end (see the note on ext4).
    need = sum(sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in
                   os.walk(os.path.join(a.dir, n)) for f in fs) for n in datasets) * (4 * a.repeat + 2)
    free = shutil.disk_usage(a.dir).free
    if free < need * 1.1:
        raise SystemExit(f"{a.dir}: {free >> 30} GiB free, the tier copies need ~{need >> 30} GiB")
    only = set(filter(None, a.only.split(",")))
    # Where each dataset is read from: the local directory, or its copy on MooseFS.
    sources = {name: os.path.join(a.dir, name) for name in datasets}
    a.source_line = ""
    if a.source == "moosefs":
        for name in datasets:
            fs = MooseFS(a, sources[name], "dnh-" + name)
            if not fs.ok:
                raise SystemExit(fs.why)
            sources[name] = fs.mount
        a.source_line = fs.describe()
    load_before = os.getloadavg()[0]
    run_id = f"{os.getpid()}-{int(time.time())}"
    cells = []
    bounds = {}
    for name in datasets:
        source = sources[name]
        dataset_bytes = sum(os.path.getsize(os.path.join(d, f))
                            for d, _, fs in os.walk(source) for f in fs)
        for tier in ("ram", "posix"):
            # One copy of the dataset into this tier, by the bench helper, in a fresh place.
            place = os.path.join(a.dir, f"bound-{name}-{tier}-{run_id}")
            tiers_made.append(place)
            os.makedirs(place)
            out = run([writer, "--dataset", source, "--tier", tier, "--dir", place])
            bounds[(name, tier)] = json.loads(out)
        for state in ("cached", "dropped"):
            for readers in (1, 4):
                for tier in ("ram", "posix"):
                    cell = f"{name}-{state}-{readers}-{tier}"
                    if only and cell not in only:
                        continue
                    common = ["--threads", str(readers), "--read-size", a.read_size,
                              "--buffer-offset", str(a.buffer_offset),
                              "--epochs", str(EPOCHS), "--seed", "7"]
                    if state == "dropped":
                        common.append("--drop-source-cache")
                        if a.source == "moosefs":
                            common += ["--before-epoch", MOOSEFS_SCRIPT + " drop-cache"]
                    plain_runs, monarch_runs, published = [], [], []
                    for rep in range(a.repeat):
                        # Every repetition starts with the same memory: earlier
                        # runs' tier copies out of the page cache (so fresh
                        # memory need not be reclaimed from them), the source
                        # back in it for "cached".
                        drop_page_cache()
                        if state == "cached":
                            run([binary, "--dataset", source, "--mode", "plain", "--epochs", "1",
                                 "--threads", "2"])
                        j = os.path.join(a.dir, "run.json")
                        p, _ = epochs(binary, ["--dataset", source, "--mode", "plain"] + common, j)
                        tier_dir = os.path.join(a.dir, f"tier-{cell}-{run_id}-{rep}")
                        tiers_made.append(tier_dir)
                        os.makedirs(tier_dir)
                        config = os.path.join(a.dir, "config.yaml")
                        with open(config, "w") as f:
                            f.write(f"dataset: {{path: {source}}}\ntiers:\n")
                            if tier == "ram":
                                extra = f", back_ahead: {a.back_ahead}" if a.back_ahead else ""
                                f.write(f"  - {{name: ram, kind: ram, capacity: 4GiB{extra}}}\n")
                            else:
                                f.write(f"  - {{name: nvme, kind: posix, path: {tier_dir}, "
                                        "capacity: 64GiB}\n")
                            f.write("  - {name: pfs, kind: source}\n")
                            f.write(f"placement: {{cached_source: {a.cached_source}}}\n")
                        m, _ = epochs(binary, ["--config", config] + common, j)
                        plain_runs.append([e["seconds"] for e in p])
                        monarch_runs.append([e["seconds"] for e in m])
                        published.append([e["published_files"] for e in m])
                        src_bytes = [e["served"]["pfs"]["bytes"] for e in m]
                        if src_bytes[0] != dataset_bytes or any(src_bytes[1:]):
                            print(f"warning: {cell}: source bytes per epoch {src_bytes}, "
                                  f"dataset {dataset_bytes}", file=sys.stderr)
                    ratios = [statistics.median(mo[e] / pl[e] for mo, pl in
                                                zip(monarch_runs, plain_runs))
                              for e in range(EPOCHS)]
                    plain_med = [statistics.median(r[e] for r in plain_runs) for e in range(EPOCHS)]
                    mon_med = [statistics.median(r[e] for r in monarch_runs) for e in range(EPOCHS)]
                    b = bounds[(name, tier)]
                    spread = min(readers, cores)
                    memcpy_bound = plain_med[0] + b["memcpy_seconds"] / spread
                    write_bound = plain_med[0] + b["tier_write_seconds"] / spread
                    c = {"cell": cell, "dataset": name, "source": state, "readers": readers,
                         "tier": tier, "plain": plain_med, "monarch": mon_med, "ratios": ratios,
                         "published_after_e2": min(p[1] for p in published),
                         "files": b["files"], "bytes": dataset_bytes,
                         "memcpy_bound_ratio": memcpy_bound / plain_med[0],
                         "e1_over_memcpy_bound": mon_med[0] / memcpy_bound,
                         "tier_write_bound_ratio": write_bound / plain_med[0],
                         "e1_over_tier_write_bound": mon_med[0] / write_bound}
                    cells.append(c)
                    print(f"{cell}: ratios " + " / ".join(f"{r:.2f}" for r in ratios) +
                          f"  published after e2 {c['published_after_e2']}/{b['files']}", flush=True)

    device = None
    if any(c["source"] == "dropped" for c in cells):
        large = os.path.join(a.dir, "large")
        probe = os.path.join(large, sorted(os.listdir(large))[0])
        probe = os.path.join(probe, sorted(os.listdir(probe))[0])
        read_bw, write_bw = device_bandwidth(probe, a.dir)
        device = {"read_bytes_per_s": read_bw, "write_bytes_per_s": write_bw}
        add_device_bounds(cells, device)

    write_report(a, cells, bounds, device, load_before, cores, os.getloadavg()[0])
    ok = all(c["ratios"][0] <= TARGET_E1[c["readers"]] and
             all(r <= TARGET_HOT for r in c["ratios"][1:]) and
             c["published_after_e2"] == c["files"] for c in cells)
    return 0 if ok else 1


def add_device_bounds(cells, device):
    for c in cells:
        if c["source"] == "dropped" and c["tier"] == "posix":
            c["device_bound_s"] = c["plain"][0] + c["bytes"] / device["write_bytes_per_s"]


def write_report(a, cells, bounds, device, load_before, cores, load_after):
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    with open(a.out + ".json", "w") as f:
        json.dump({"cells": cells, "device": device, "load_before": load_before,
                   "load_after": load_after, "cores": cores, "repeat": a.repeat,
                   "read_size": a.read_size, "buffer_offset": a.buffer_offset,
                   "cached_source": a.cached_source, "back_ahead": a.back_ahead,
                   "commit": a.commit, "source_line": a.source_line,
                   "bounds": {f"{k[0]}-{k[1]}": v for k, v in bounds.items()}}, f, indent=1)
    cmd = (f"sudo python3 bench/do_no_harm.py --repeat {a.repeat}" +
           (f" --read-size {a.read_size}" if a.read_size != "256KiB" else "") +
           (f" --buffer-offset {a.buffer_offset}" if a.buffer_offset else "") +
           (f" --cached-source {a.cached_source}" if a.cached_source != "defer" else "") +
           (f" --back-ahead {a.back_ahead}" if a.back_ahead else "") +
           (f" --only {a.only}" if a.only else "") +
           (f" --source moosefs --moosefs-setup {a.moosefs_setup}"
            if getattr(a, "source", "emulator") == "moosefs" else "") +
           (f" --out {a.out}" if a.out != "bench/results/do_no_harm" else ""))
    lines = ["# Do no harm: Monarch against plain reads of the source", "",
             f"Command: `{cmd}` (needs a Release build: `cmake -S . -B build "
             "-DCMAKE_BUILD_TYPE=Release && cmake --build build -j2`). " +
             (f"Source: {a.source_line}. " if a.source_line else
              "Source: the local directory. ") +
             f"Measured at {a.commit}. {cores} cores; load average {load_before:.2f} before, {load_after or 0:.2f} after. "
             "Each figure is the median over repetitions of Monarch's epoch time divided by the "
             f"plain epoch time of the same repetition (`monarch-epochs --read-size {a.read_size} "
             f"--buffer-offset {a.buffer_offset}`, 3 epochs, a fresh tier each run; "
             f"`placement.cached_source: {a.cached_source}`" +
             (f", the RAM tier's `back_ahead: {a.back_ahead}`" if a.back_ahead else "") + ").", "",
             "| cell | plain e1/e2/e3 (s) | monarch e1/e2/e3 (s) | e1 ratio (target) | "
             "e2, e3 ratio (<= 1.05) | copies published after e2 | memcpy bound e1 | "
             "e1 / memcpy bound | tier-write bound e1 | e1 / tier-write bound | device bound e1 (plain reads + tier writes) |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for c in cells:
        r = c["ratios"]
        dev = (f"{c['device_bound_s']:.2f} s (monarch at {c['monarch'][0] / c['device_bound_s']:.2f} of it)"
               if "device_bound_s" in c else "")
        lines.append(
            f"| {c['cell']} | " + " / ".join(f"{x:.3f}" for x in c["plain"]) + " | " +
            " / ".join(f"{x:.3f}" for x in c["monarch"]) +
            f" | {r[0]:.2f} (<= {TARGET_E1[c['readers']]:.2f}) | {r[1]:.2f}, {r[2]:.2f} | "
            f"{c['published_after_e2']}/{c['files']} | {c['memcpy_bound_ratio']:.2f}x | "
            f"{c['e1_over_memcpy_bound']:.2f} | {c['tier_write_bound_ratio']:.2f}x | "
            f"{c['e1_over_tier_write_bound']:.2f} | {dev} |")
    lines += ["", "Bounds measured in the same run (`build/bench/bench_tier_write`, one thread):", ""]
    for (name, tier), b in bounds.items():
        lines.append(f"- {name} into {tier}: memcpy of the bytes into memory outside the CPU cache "
                     f"{b['memcpy_seconds']:.3f} s; writing a fresh tier copy of every file "
                     f"{b['tier_write_seconds']:.3f} s ({b['how']}).")
    if device:
        lines.append(f"- device: read {device['read_bytes_per_s'] / 1e9:.2f} GB/s, write "
                     f"{device['write_bytes_per_s'] / 1e9:.2f} GB/s (dd, O_DIRECT, 4 MiB blocks).")
    with open(a.out + ".md", "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed (pip install matplotlib): no chart", file=sys.stderr)
        return
    fig, ax = plt.subplots(figsize=(14, 5))
    width = 0.27
    xs = range(len(cells))
    for e in range(EPOCHS):
        ax.bar([x + (e - 1) * width for x in xs], [c["ratios"][e] for c in cells], width,
               label=f"epoch {e + 1}")
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.axhline(TARGET_HOT, color="green", linestyle="--", linewidth=0.8, label="1.05 (epochs 2-3)")
    ax.axhline(1.10, color="orange", linestyle="--", linewidth=0.8, label="1.10 (epoch 1, 1 reader)")
    ax.axhline(1.5, color="red", linestyle="--", linewidth=0.8, label="1.5 (epoch 1, 4 readers)")
    ax.set_xticks(list(xs))
    ax.set_xticklabels([c["cell"] for c in cells], rotation=60, ha="right", fontsize=8)
    ax.set_ylabel("Monarch time / plain time")
    ax.set_title("Do no harm: epochs through Monarch against plain reads of the source")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(a.out + ".png", dpi=110)


if __name__ == "__main__":
    sys.exit(main())
