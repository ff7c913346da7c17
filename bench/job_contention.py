#!/usr/bin/env python3
"""Two jobs of different speeds sharing one node service over a dataset
larger than its RAM tier (issue 42's fair shares): does either job read more
from the PFS per epoch than it would alone?

--files ImageNet-like files (~110 KiB) sit behind the PFS emulator (its
Lustre-like defaults, read-ahead on). The RAM tier holds 1/--oversize of
the dataset (default 1.5: two thirds of it). Two jobs read it through one
node service, each with its own SLURM_JOB_ID and shuffle seed, announcing
each epoch's order (the prefetch streams serve both orders in turn, and
eviction sees both): the fast one with --fast-threads readers, the slow one
with --slow-threads, each of which spends --slow-sample-us on every sample
after reading it (a model's step: `monarch-epochs --sample-us`). Each job's PFS bytes per epoch are the source bytes
the service charges to it (`monarch status`): the files its misses started
reading, and what the prefetch streams fetched for its order.

Arms, each from a cold start (services stopped, the emulator's counters
zeroed), for each --policies placement policy:
  alone-fast, alone-slow   one job by itself
  together                 both at once

It prints, per job and epoch, the PFS bytes together against alone, and the
node's PFS bytes.

  sudo .venv/bin/python bench/job_contention.py --build build --files 6000 \\
    --out /tmp/job_contention.json
"""

import json
import os
import shutil
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from emulated_dataset import mounted_dataset, parser, private_runtime_base  # noqa: E402

FAST, SLOW = 201, 202


def write_config(path, dataset, ram_bytes, policy):
    with open(path, "w") as f:
        f.write("dataset: {path: %s}\n"
                "tiers: [{kind: ram, capacity: %d}, {kind: source}]\n"
                "placement: {policy: %s}\n"
                "node: {shared: true, autostart: true, idle_exit: 0}\n" % (dataset, ram_bytes,
                                                                         policy))


def run(a, work, arm, config, jobs):
    """Runs the jobs ({job id: (threads, sample_us)}) at once; returns {job id: {"seconds":
    [...], "source": [per-epoch bytes charged to it]}}."""
    monarch = os.path.join(a.build, "monarch")
    procs = {}
    for job, (threads, sample_us) in jobs.items():
        prefix = os.path.join(work, "%s-%d" % (arm, job))
        # Before each epoch (and after the last): the service's per-job
        # figures, while this job is still attached.
        hook = '"%s" stats --json --config "%s" > "%s-stats-$MONARCH_EPOCH.json"' % (
            monarch, config, prefix)
        cmd = [os.path.join(a.build, "monarch-epochs"), "--config", config, "--epochs",
               str(a.epochs), "--threads", str(threads), "--sample-us", str(sample_us),
               "--seed", str(job), "--announce",
               "--json", prefix + ".json", "--before-epoch", hook]
        procs[job] = (subprocess.Popen(cmd, env=dict(os.environ, SLURM_JOB_ID=str(job)),
                                       stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                       text=True), prefix)
    out = {}
    for job, (proc, prefix) in procs.items():
        stdout, stderr = proc.communicate()
        if proc.returncode != 0:
            sys.exit("%s job %d failed (%d):\n%s%s" % (arm, job, proc.returncode, stdout,
                                                       stderr[-3000:]))
        with open(prefix + ".json") as f:
            epochs = json.load(f)
        charged = []
        for e in range(1, a.epochs + 2):
            with open("%s-stats-%d.json" % (prefix, e)) as f:
                stats = json.load(f)
            mine = [j for j in stats["jobs"] if j["name"] == "slurm-%d" % job]
            charged.append(mine[0]["source_bytes"] if mine else 0)
        out[job] = {"seconds": [e["seconds"] for e in epochs],
                    "source": [charged[e + 1] - charged[e] for e in range(a.epochs)]}
    return out


def main():
    ap = parser(reps=2, out=os.path.join(HERE, "results", "job_contention.json"))
    ap.set_defaults(files=6000, dir="/var/tmp/monarch-contention")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--oversize", type=float, default=1.5,
                    help="the dataset's size in RAM tiers (default 1.5)")
    ap.add_argument("--fast-threads", type=int, default=4)
    ap.add_argument("--slow-threads", type=int, default=1)
    ap.add_argument("--slow-sample-us", type=int, default=1000)
    ap.add_argument("--policies", default="first-fit,lru")
    a = ap.parse_args()
    a.build = os.path.abspath(a.build)
    pfs, files, total = mounted_dataset(a)
    work = private_runtime_base("mcont")
    ram = int(total / a.oversize)
    print("%d files, %.1f MiB; RAM tier %.1f MiB (dataset %.2fx it); source: %s; jobs: fast %d "
          "threads, slow %d threads with %d us per sample, %d epochs, orders announced" % (
              files, total / 2**20, ram / 2**20, a.oversize, " ".join(pfs.flags), a.fast_threads,
              a.slow_threads, a.slow_sample_us, a.epochs), flush=True)
    results = {"files": files, "dataset_bytes": total, "ram_bytes": ram, "epochs": a.epochs,
               "fast_threads": a.fast_threads, "slow_threads": a.slow_threads,
               "slow_sample_us": a.slow_sample_us,
               "source": " ".join(pfs.flags), "runs": []}
    fast, slow = (a.fast_threads, 0), (a.slow_threads, a.slow_sample_us)
    arms = (("alone-fast", {FAST: fast}), ("alone-slow", {SLOW: slow}),
            ("together", {FAST: fast, SLOW: slow}))
    try:
        for rep in range(a.reps):
            for policy in a.policies.split(","):
                config = os.path.join(work, "%s.yaml" % policy)
                write_config(config, pfs.mount, ram, policy)
                for arm, jobs in arms:
                    pfs.reset()
                    figures = run(a, work, "%s-%s-%d" % (arm, policy, rep), config, jobs)
                    node = pfs.stats().get("bytes_read", 0)
                    for command in ("stop", "purge"):  # Cold next: no copy kept either.
                        subprocess.run([os.path.join(a.build, "monarch"), command, "--config",
                                        config], capture_output=True)
                    results["runs"].append({"rep": rep, "policy": policy, "arm": arm,
                                            "node_source_bytes": node,
                                            "jobs": {str(j): f for j, f in figures.items()}})
                    print("rep %d %-9s %-10s node PFS %.2fx the dataset; %s" % (
                        rep, policy, arm, node / total, "; ".join(
                            "%s: PFS per epoch %s x, times %s s" % (
                                "fast" if j == FAST else "slow",
                                " ".join("%.2f" % (b / total) for b in f["source"]),
                                " ".join("%.1f" % s for s in f["seconds"]))
                            for j, f in figures.items())), flush=True)
    finally:
        for policy in a.policies.split(","):
            subprocess.run([os.path.join(a.build, "monarch"), "stop", "--config",
                            os.path.join(work, "%s.yaml" % policy)], capture_output=True)
        pfs.stop()
        shutil.rmtree(work, ignore_errors=True)

    print("\neach job's PFS bytes per epoch together / alone (median over %d reps):" % a.reps)
    summary = {}
    for policy in a.policies.split(","):
        runs = [r for r in results["runs"] if r["policy"] == policy]
        for job, alone_arm in ((FAST, "alone-fast"), (SLOW, "alone-slow")):
            ratios = []
            for e in range(a.epochs):
                alone = statistics.median(r["jobs"][str(job)]["source"][e] for r in runs
                                          if r["arm"] == alone_arm)
                together = statistics.median(r["jobs"][str(job)]["source"][e] for r in runs
                                             if r["arm"] == "together")
                ratios.append(together / alone if alone else (0.0 if together == 0 else
                                                              float("inf")))
            name = "fast" if job == FAST else "slow"
            summary["%s/%s" % (policy, name)] = ratios
            print("  %-9s %s job: %s" % (policy, name, "  ".join(
                "epoch %d %.2fx" % (e + 1, r) for e, r in enumerate(ratios))))
    results["summary"] = summary
    with open(a.out, "w") as f:
        json.dump(results, f, indent=1)
    print("wrote", a.out)


if __name__ == "__main__":
    main()
