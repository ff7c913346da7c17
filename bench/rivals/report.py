#!/usr/bin/env python3
"""Writes bench/results/rivals.md's measured part (between marker lines; the
notes around them are kept) and its charts from the JSON files bench/rivals.py
wrote: rivals.json and rivals-shards.json (the PFS emulator; chart
rivals.png), rivals-moosefs.json and rivals-moosefs-shards.json (MooseFS;
chart rivals-moosefs.png), each where it exists.

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


def median(xs):
    xs = sorted(xs)
    n = len(xs)
    return (xs[n // 2] + xs[(n - 1) // 2]) / 2 if n else None


def runs_of(v):
    """An arm's runs (JSON from before --reps holds one run, unwrapped)."""
    return [r for r in v.get("runs", [v]) if "error" not in r and r.get("epochs")]


def spread(xs, capped=0, total=None):
    """`median (min-max)` of xs; a value that includes an epoch stopped at
    the cap is a lower bound, marked with >= and how many runs stopped."""
    if not xs:
        return "-"
    m = median(xs)
    cell = fmt_s(m) if len(xs) == 1 else f"{m:.2f} ({min(xs):.2f}-{max(xs):.2f})"
    if capped:
        cell = ">= " + cell + f", capped in {capped} of {total or len(xs)} runs"
    elif total and len(xs) < total:  # the other runs stopped at the cap earlier
        cell += f", {len(xs)} of {total} runs"
    return cell


def span(xs):
    return f"{min(xs):.1f}" if min(xs) == max(xs) else f"{min(xs):.1f}-{max(xs):.1f}"


def epoch_stats(runs, e):
    """(seconds of epoch e in every run that reached it, how many of them
    stopped at the cap)."""
    eps = [r["epochs"][e] for r in runs if len(r["epochs"]) > e]
    return [p["seconds"] for p in eps], sum(1 for p in eps if p.get("incomplete"))


def to_end(run, e):
    """Seconds from the job's start (its start-up) to the end of epoch e;
    None when the run did not get there."""
    if len(run["epochs"]) <= e:
        return None
    return run["startup"]["seconds"] + sum(p["seconds"] for p in run["epochs"][:e + 1])


def complete(runs, e):
    """Every run finished epoch e within the cap."""
    return bool(runs) and all(len(r["epochs"]) > e and not r["epochs"][e].get("incomplete")
                              for r in runs)


def section(title, d):
    arms = d["arms"]
    ok = {k: runs_of(v) for k, v in arms.items()}
    ok = {k: v for k, v in ok.items() if v}
    reps = d.get("reps", 1)
    n_epochs = max((len(r["epochs"]) for v in ok.values() for r in v), default=0)
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
             f"{d['capacity'] / MIB:.0f} MiB each; source: "
             f"{d.get('source') or 'PFS emulator ' + ' '.join(d['emulator'])}; "
             f"{reps} run{'s' if reps != 1 else ''} of every arm; "
             f"whole run {d['wall_seconds'] / 60:.1f} min"
             + (f"; load average {d['load_start'][0]:.1f} at the start, "
                f"{d['load_end'][0]:.1f} at the end (2 cores)"
                if d.get("load_start") else "") + ".", "",
             f"Seconds, the median of the runs and their range (min-max). Conversion is "
             "the rival's own format made from the PFS copy, once, before the runs; "
             "start-up is building the dataset object (listing, index, node service); "
             "an epoch that ran past the cap shows its time up to the cap as a lower "
             "bound (>=), and the arm's later epochs did not run:", "",
             "| arm | conversion | start-up | " + " | ".join(
                 f"epoch {e + 1}" for e in range(n_epochs)) + " | load avg (start, end) |",
             "| --- | --- | --- | " + " | ".join("---" for _ in range(n_epochs)) + " | --- |"]
    for arm, v in arms.items():
        runs = ok.get(arm)
        failed = [r for r in v.get("runs", [v]) if "error" in r]
        if not runs:
            lines.append(f"| {arm} | failed: {v.get('error', 'no epochs')} |")
            continue
        conv = [r["conversion"]["seconds"] for r in runs if r.get("conversion")]
        cells = []
        for e in range(n_epochs):
            xs, capped = epoch_stats(runs, e)
            cells.append(spread(xs, capped, len(runs)) if xs else "not run")
        loads = [r["load_start"][0] for r in runs if "load_start" in r]
        loade = [r["load_end"][0] for r in runs if "load_end" in r]
        load = (f"{span(loads)}, {span(loade)}" if loads and loade else "-")
        lines.append(f"| {arm} | {fmt_s(median(conv)) if conv else '-'} | "
                     f"{spread([r['startup']['seconds'] for r in runs])} | "
                     + " | ".join(cells) + f" | {load} |"
                     + (f" ({len(failed)} of {len(failed) + len(runs)} runs failed: "
                        f"{failed[0]['error']})" if failed else ""))
    # What a user feels: from the job's start, start-up included.
    lines += ["", "What a user waits: seconds from the job's start (start-up included) to "
              "the end of each epoch, median (min-max); the conversion apart, and spread "
              "over a training run of 10 and of 90 epochs (its share per epoch):", "",
              "| arm | " + " | ".join(f"to end of epoch {e + 1}" for e in range(n_epochs))
              + " | conversion | per epoch over 10 | per epoch over 90 |",
              "| --- | " + " | ".join("---" for _ in range(n_epochs)) + " | --- | --- | --- |"]
    for arm, runs in ok.items():
        cells = []
        for e in range(n_epochs):
            xs = [to_end(r, e) for r in runs if to_end(r, e) is not None]
            capped = sum(1 for r in runs if len(r["epochs"]) > e
                         and any(p.get("incomplete") for p in r["epochs"][:e + 1]))
            cells.append(spread(xs, capped, len(runs)) if xs else "not run")
        conv = median([r["conversion"]["seconds"] for r in runs if r.get("conversion")])
        lines.append(f"| {arm} | " + " | ".join(cells) + " | "
                     + (f"{conv:.2f} | {conv / 10:.2f} | {conv / 90:.2f} |" if conv is not None
                        else "- | - | - |"))
    lines += target_lines(ok, n_epochs)
    lines += ["", "Per phase, medians of the runs: the source's counters (bytes read, "
              "read requests, opens, all metadata operations), the peak of the summed Pss "
              "of the job's processes and the node service, and the bytes in the local "
              "cache (tier) directory at its end:", "",
              "| arm | phase | s | PFS MiB | reads | opens | metadata ops | peak Pss MiB | "
              "cache MiB | samples |",
              "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for arm, runs in ok.items():
        convs = [r["conversion"] for r in runs if r.get("conversion")]
        if convs:
            c = convs[0]  # made once, reused by every run
            lines.append(f"| {arm} | conversion | {c['seconds']:.2f} | {c['bytes'] / MIB:.1f} | "
                         f"{c['reads']} | {c['opens']} | {c['metadata_ops']} | - | "
                         f"(output {c['output_bytes'] / MIB:.1f}) | - |")
        phases = [("start-up", [r["startup"] for r in runs])] + [
            (f"epoch {e + 1}", [r["epochs"][e] for r in runs if len(r["epochs"]) > e])
            for e in range(n_epochs)]
        for name, ps in phases:
            if not ps:
                continue

            def m(k):
                return median([p[k] for p in ps])
            capped = sum(1 for p in ps if p.get("incomplete"))
            if capped:
                name += f" (stopped at the cap in {capped} of {len(ps)} runs)"
            samples = [p["samples"] for p in ps if "samples" in p]
            rep = median([p.get("repeated", 0) for p in ps])
            lines.append(f"| {arm} | {name} | {m('seconds'):.2f} | {m('bytes') / MIB:.1f} | "
                         f"{m('reads'):.0f} | {m('opens'):.0f} | {m('metadata_ops'):.0f} | "
                         f"{m('peak_pss') / MIB:.0f} | {m('cache_bytes') / MIB:.1f} | "
                         + (f"{median(samples):.0f}" + (f" ({rep:.0f} repeated)" if rep else "")
                            if samples else "-") + " |")
    return lines


def target_lines(ok, n_epochs):
    """Monarch's best arm -- one arm, the one whose median time from start to
    the end of the last epoch is smallest -- against the fastest rival in
    each epoch (medians; epochs that stopped at the cap in any run do not
    compete), per epoch and from the job's start."""
    last = n_epochs - 1
    monarch = [(median([to_end(r, last) for r in runs]), arm) for arm, runs in ok.items()
               if arm in MONARCH and complete(runs, last) and all(
                   complete(runs, e) for e in range(n_epochs))]
    if not monarch or n_epochs == 0:
        return []
    best = min(monarch)[1]
    lines = ["", f"Target: Monarch's best arm, one arm (`{best}`: the smallest median time "
             "from start to the end of the last epoch), against the fastest rival of each "
             "row (litdata, mosaic, webdataset, fsspec, simplecache; medians; an epoch "
             "that stopped at the cap in any run does not compete), <= 1.0x; per epoch "
             "with the conversion not counted, then from the job's start with start-up "
             "counted, then with the conversion added whole and spread over 10 and 90 "
             "epochs:", "",
             "| row | Monarch s | fastest rival | s | Monarch / rival | met |",
             "| --- | --- | --- | --- | --- | --- |"]

    def row(label, value):
        mine = value(best, ok[best], False)
        rivals = [(value(arm, runs, True), arm) for arm, runs in ok.items()
                  if arm in RIVALS and value(arm, runs, True) is not None]
        if mine is None or not rivals:
            return
        s, arm = min(rivals)
        r = mine / s
        lines.append(f"| {label} | {mine:.2f} | {arm} | {s:.2f} | {r:.2f} | "
                     f"{'yes' if r <= 1.0 else 'no'} |")

    def conv(runs):
        return median([r["conversion"]["seconds"] for r in runs if r.get("conversion")]) or 0

    for e in range(n_epochs):
        row(f"epoch {e + 1}", lambda arm, runs, _, e=e: median(
            [r["epochs"][e]["seconds"] for r in runs]) if complete(runs, e) else None)
    for e in range(n_epochs):
        row(f"start to end of epoch {e + 1}", lambda arm, runs, _, e=e: median(
            [to_end(r, e) for r in runs]) if all(complete(runs, k) for k in range(e + 1))
            else None)
    for share, label in ((1.0, "whole"), (0.1, "over 10 epochs"), (1 / 90, "over 90 epochs")):
        row(f"start to end of epoch 1, conversion {label}",
            lambda arm, runs, rival, share=share: (
                median([to_end(r, 0) for r in runs]) + (share * conv(runs) if rival else 0))
            if complete(runs, 0) else None)
    return lines


def chart(datasets, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, len(datasets), figsize=(7 * len(datasets), 4.5), squeeze=False)
    for ax, (title, d) in zip(axes[0], datasets):
        runs = {a: runs_of(v) for a, v in d["arms"].items()}
        arms = [a for a, v in runs.items() if v]
        n = max(len(r["epochs"]) for a in arms for r in runs[a])
        width = 0.8 / n
        for e in range(n):
            xs = [i + (e - (n - 1) / 2) * width for i in range(len(arms))]
            # the median; a capped epoch shows its time at the cap
            ys = [median(epoch_stats(runs[a], e)[0]) or 0 for a in arms]
            ax.bar(xs, ys, width, label=f"epoch {e + 1}")
        ax.set_xticks(range(len(arms)))
        ax.set_xticklabels(arms, rotation=30, ha="right")
        ax.set_ylabel("epoch time, s (log; median of runs)")
        ax.set_yscale("log")
        # Each panel's own commit: the runs of one source may be of two.
        ax.set_title(f"{title}: {d['files']} samples, {d['dataset_bytes'] / MIB:.0f} MiB, "
                     f"{d['workers']} workers (commit {d['commit']})")
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=8)
    where = datasets[0][1].get("source") or "the PFS emulator"
    fig.suptitle(f"DataLoader epochs over {where.split(',')[0]}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--results", default=RESULTS)
    a = ap.parse_args()
    # Per source (issue 39: every headline figure on the emulator and on a
    # real file system), its small-file and shard runs and its chart.
    sources = []
    for where, suffix in (("", ""), (" on MooseFS", "-moosefs")):
        datasets = []
        for kind, title in (("", "files"), ("-shards", "shards")):
            p = os.path.join(a.results, f"rivals{suffix}{kind}.json")
            if os.path.exists(p):
                with open(p) as f:
                    datasets.append((title, json.load(f)))
        if datasets:
            sources.append((where, suffix, datasets))
    if not sources:
        raise SystemExit("no rivals.json or rivals-moosefs.json in " + a.results)
    lines = [BEGIN]
    for where, _, datasets in sources:
        for title, d in datasets:
            lines += section({"files": "Small files", "shards": "Shards"}[title] + where,
                             d) + [""]
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
    charts = []
    for _, suffix, datasets in sources:
        charts.append(f"rivals{suffix}.png")
        chart(datasets, os.path.join(a.results, charts[-1]))
    print("wrote", md, "and", ", ".join(charts))


if __name__ == "__main__":
    main()
