#!/usr/bin/env python3
"""Writes bench/results/rivals.md's measured part (between marker lines; the
notes around them are kept) and the chart bench/results/rivals.png from the
JSON files bench/rivals.py wrote (rivals.json, and rivals-shards.json when it
exists).

usage: .venv/bin/python bench/rivals/report.py [--results bench/results]
"""

import argparse
import json
import os

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(os.path.dirname(HERE), "results")
MONARCH = ("monarch", "announced", "preload")
RIVALS = ("litdata", "mosaic", "webdataset", "fsspec", "simplecache")
BEGIN, END = "<!-- rivals.py: begin -->", "<!-- rivals.py: end -->"
MIB = 2.0 ** 20


def fmt_s(x):
    return "%.2f" % x if x is not None else "-"


def section(title, d):
    arms = d["arms"]
    ok = {k: v for k, v in arms.items() if "error" not in v and v.get("epochs")}
    # Complete epochs only compete for the targets.
    full = {k: dict(v, epochs=[e for e in v["epochs"] if not e.get("incomplete")])
            for k, v in ok.items()}
    n_epochs = max((len(v["epochs"]) for v in ok.values()), default=0)
    lines = [f"### {title}", "",
             f"Command: `{d['command']}`, commit `{d['commit']}`"
             + (f" (the build; rivals.py at `{d['script_commit']}`)"
                if d.get("script_commit") and d["script_commit"] != d["commit"] else "")
             + (f" with uncommitted edits to {', '.join(d['uncommitted'])}"
                if d.get("uncommitted") else "")
             + f", {d['date']}, "
             f"{d['cores']} cores; {d['files']} samples"
             + (f" in {d['shards']} shard files" if d["shards"] else " (one file each)")
             + f", {d['dataset_bytes'] / MIB:.0f} MiB; DataLoader {d['workers']} workers, "
             f"batch {d['batch']}; caches and Monarch's `{d['tier']}` tier "
             f"{d['capacity'] / MIB:.0f} MiB each; emulator `{' '.join(d['emulator'])}`; "
             f"whole run {d['wall_seconds'] / 60:.1f} min"
             + (f"; load average {d['load_start'][0]:.1f} at the start, "
                f"{d['load_end'][0]:.1f} at the end (2 cores; other work ran beside it)"
                if d.get("load_start") else "") + ".", "",
             "Seconds (conversion is the rival's own format made from the PFS copy, "
             "once, before the run; start-up is building the dataset object: listing, "
             "index, node service):", "",
             "| arm | conversion | start-up | " + " | ".join(
                 f"epoch {e + 1}" for e in range(n_epochs)) + " | load avg (start, end) |",
             "| --- | --- | --- | " + " | ".join("---" for _ in range(n_epochs)) + " | --- |"]
    for arm, v in arms.items():
        if arm not in ok:
            lines.append(f"| {arm} | failed: {v.get('error', 'no epochs')} |")
            continue
        conv = v.get("conversion", {}).get("seconds")
        cells = [fmt_s(e["seconds"]) if not e.get("incomplete") else
                 f"stopped at {e['seconds']:.0f} s ({e['samples']} of {d['files']} samples)"
                 for e in v["epochs"]]
        cells += ["not run"] * (n_epochs - len(cells))
        load = (f"{v['load_start'][0]:.1f}, {v['load_end'][0]:.1f}" if "load_start" in v
                else "-")
        lines.append(f"| {arm} | {fmt_s(conv)} | {fmt_s(v['startup']['seconds'])} | " +
                     " | ".join(cells) + f" | {load} |")
    # Targets: Monarch's best arm against the fastest rival, each epoch.
    lines += ["", "Target: in every epoch Monarch's best arm (monarch, announced, preload) "
              "<= 1.0x the fastest rival (litdata, mosaic, webdataset, fsspec, simplecache), "
              "conversion "
              "not counted (an epoch stopped at the cap does not compete); then with the "
              "conversion added to the rival's epoch 1:", "",
              "| epoch | Monarch's best | s | fastest rival | s | Monarch / rival | met |",
              "| --- | --- | --- | --- | --- | --- | --- |"]
    for e in range(n_epochs):
        best = min(((v["epochs"][e]["seconds"], a) for a, v in full.items()
                    if a in MONARCH and len(v["epochs"]) > e), default=None)
        rival = min(((v["epochs"][e]["seconds"], a) for a, v in full.items()
                     if a in RIVALS and len(v["epochs"]) > e), default=None)
        if best and rival:
            r = best[0] / rival[0]
            lines.append(f"| {e + 1} | {best[1]} | {best[0]:.2f} | {rival[1]} | "
                         f"{rival[0]:.2f} | {r:.2f} | {'yes' if r <= 1.0 else 'no'} |")
    best = min(((v["epochs"][0]["seconds"], a) for a, v in full.items()
                if a in MONARCH and v["epochs"]), default=None)
    rival = min(((v["epochs"][0]["seconds"] + v.get("conversion", {}).get("seconds", 0), a)
                 for a, v in full.items() if a in RIVALS and v["epochs"]), default=None)
    if best and rival:
        lines.append(f"| 1 + conversion | {best[1]} | {best[0]:.2f} | {rival[1]} | "
                     f"{rival[0]:.2f} | {best[0] / rival[0]:.2f} | "
                     f"{'yes' if best[0] <= rival[0] else 'no'} |")
    lines += ["", "Per phase: the PFS emulator's counters (bytes read, read requests, opens, "
              "all metadata operations), the peak of the summed Pss of the job's processes "
              "and the node service, and the bytes in the local cache (tier) directory at "
              "its end:", "",
              "| arm | phase | s | PFS MiB | reads | opens | metadata ops | peak Pss MiB | "
              "cache MiB | samples |",
              "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for arm, v in ok.items():
        c = v.get("conversion")
        if c:
            lines.append(f"| {arm} | conversion | {c['seconds']:.2f} | {c['bytes'] / MIB:.1f} | "
                         f"{c['reads']} | {c['opens']} | {c['metadata_ops']} | - | "
                         f"(output {c['output_bytes'] / MIB:.1f}) | - |")
        phases = [("start-up", v["startup"])] + [(f"epoch {e['epoch']}", e) for e in v["epochs"]]
        for name, p in phases:
            samples = p.get("samples")
            rep = p.get("repeated", 0)
            if p.get("incomplete"):
                name += " (stopped at the cap)"
            lines.append(f"| {arm} | {name} | {p['seconds']:.2f} | {p['bytes'] / MIB:.1f} | "
                         f"{p['reads']} | {p['opens']} | {p['metadata_ops']} | "
                         f"{p['peak_pss'] / MIB:.0f} | {p['cache_bytes'] / MIB:.1f} | "
                         + (f"{samples}" + (f" ({rep} repeated)" if rep else "")
                            if samples is not None else "-") + " |")
    return lines


def chart(datasets, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, len(datasets), figsize=(7 * len(datasets), 4.5), squeeze=False)
    for ax, (title, d) in zip(axes[0], datasets):
        arms = [a for a, v in d["arms"].items() if "error" not in v and v.get("epochs")]
        n = max(len(d["arms"][a]["epochs"]) for a in arms)
        width = 0.8 / n
        for e in range(n):
            xs = [i + (e - (n - 1) / 2) * width for i in range(len(arms))]
            ys = [d["arms"][a]["epochs"][e]["seconds"] if len(d["arms"][a]["epochs"]) > e
                  else 0 for a in arms]  # a capped epoch shows its time at the cap
            ax.bar(xs, ys, width, label=f"epoch {e + 1}")
        ax.set_xticks(range(len(arms)))
        ax.set_xticklabels(arms, rotation=30, ha="right")
        ax.set_ylabel("epoch time, s (log)")
        ax.set_yscale("log")
        ax.set_title(f"{title}: {d['files']} samples, {d['dataset_bytes'] / MIB:.0f} MiB, "
                     f"{d['workers']} workers")
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"DataLoader epochs over the PFS emulator (commit {datasets[0][1]['commit']})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--results", default=RESULTS)
    a = ap.parse_args()
    datasets = []
    for name, title in (("rivals.json", "files"), ("rivals-shards.json", "shards")):
        p = os.path.join(a.results, name)
        if os.path.exists(p):
            with open(p) as f:
                datasets.append((title, json.load(f)))
    if not datasets:
        raise SystemExit("no rivals.json in " + a.results)
    lines = [BEGIN]
    for title, d in datasets:
        lines += section({"files": "Small files", "shards": "Shards"}[title], d) + [""]
    lines.append(END)
    block = "\n".join(lines) + "\n"
    md = os.path.join(a.results, "rivals.md")
    old = open(md).read() if os.path.exists(md) else "# Monarch and its rivals (issue 32)\n\n"
    if BEGIN in old:
        old = old.split(BEGIN)[0] + block + old.split(END + "\n", 1)[-1]
    else:
        old += block
    with open(md, "w") as f:
        f.write(old)
    chart(datasets, os.path.join(a.results, "rivals.png"))
    print("wrote", md, "and rivals.png")


if __name__ == "__main__":
    main()
