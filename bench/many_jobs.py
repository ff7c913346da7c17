#!/usr/bin/env python3
"""Many jobs of one user reading one dataset on one node (issue 42): one
node service for them all, against a service per job.

--files ImageNet-like files (~110 KiB) sit behind the PFS emulator (its
Lustre-like defaults, read-ahead on) or on MooseFS (--source moosefs). Each
job is a `monarch-epochs` process (--threads readers, its own shuffle seed,
3 epochs) with its own SLURM_JOB_ID, given one config: a RAM tier sized for
one copy of the dataset (--ram-copies, default 1.05) over the source, node
sharing on, no node.runtime_dir. The arms, in turns, each from a cold
start (services stopped, the source's counters zeroed):

  single    one job alone: the baseline of a job's time
  shared    --jobs jobs at once with that config: the default, one service
            per user, dataset and cache shape
  per-job   the same jobs, each config naming a runtime directory of its
            job's own (node.runtime_dir: .../job-${SLURM_JOB_ID}): a service
            per job, as Monarch's default was before issue 42
  local-1, local-N
            plain reads of a local copy (the source's backing directory,
            page-cached) by one job and by --jobs jobs at once: what running
            N jobs on this machine's cores costs any reader, Monarch or not

--sample-us gives every reader a model's step per sample (slept): on a
machine with fewer cores than the jobs' readers, reading alone makes the
jobs compete for the cores whatever they read through (local-N shows it).

Per arm: the source's bytes over the whole arm against the dataset, the
node memory the RAM tiers hold (bytes_used and resident, summed over the
services), and each job's epoch times and CPU seconds (its process's user
and system time). A job's epochs 2-3 are compared with the single job's,
and that slowdown with local-N's over local-1's. So is their CPU time: with
more reader threads than cores, a job's wall time grows with the number of
jobs whatever it reads through, while its CPU time grows only with the work
each read costs it (contention in a shared service would show there).

  sudo .venv/bin/python bench/many_jobs.py --build build --files 20000 \\
    --out /tmp/many_jobs.json
"""

import contextlib
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from emulated_dataset import mounted_dataset, parser, private_runtime_base  # noqa: E402
from huge_ram import add_huge_ram_flag, huge_ram_dir, ram_dir_label  # noqa: E402
from service_epochs import drop_service  # noqa: E402


def write_config(path, dataset, ram_bytes, runtime_dir=None, node_keys=""):
    with open(path, "w") as f:
        f.write("dataset: {path: %s}\n"
                "tiers: [{kind: ram, capacity: %d}, {kind: source}]\n"
                "node:\n  shared: true\n  autostart: true\n  idle_exit: 0\n" % (dataset, ram_bytes))
        if runtime_dir:
            f.write("  runtime_dir: %s\n" % runtime_dir)
        if node_keys:
            f.write("  %s\n" % node_keys)


def run_jobs(a, work, name, job_ids, config=None, plain_dir=None, dataset=None):
    """Starts one monarch-epochs per job id at once; returns their per-epoch
    JSON figures, by job id."""
    procs = {}
    for job in job_ids:
        out = os.path.join(work, "%s-%d.json" % (name, job))
        cmd = [os.path.join(a.build, "monarch-epochs"), "--epochs", str(a.epochs),
               "--threads", str(a.threads), "--seed", str(job), "--json", out]
        if a.sample_us:
            cmd += ["--sample-us", str(a.sample_us)]
        if plain_dir:
            cmd += ["--mode", "plain", "--dataset", dataset, "--plain-dir", plain_dir]
        else:
            cmd += ["--config", config]
        env = dict(os.environ, SLURM_JOB_ID=str(job))
        procs[job] = (subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE,
                                       stderr=subprocess.PIPE, text=True), out)
    figures = {}
    for job, (proc, out) in procs.items():
        stdout, stderr = proc.communicate()
        if proc.returncode != 0:
            sys.exit("%s job %d failed (%d):\n%s%s" % (name, job, proc.returncode, stdout, stderr))
        with open(out) as f:
            figures[job] = json.load(f)
    return figures


def services_memory(a, config, job_ids):
    """How many services the jobs used (one per runtime directory), and
    their RAM tiers' bytes_used and resident_bytes, summed."""
    ram_of = {}
    for job in job_ids:
        env = dict(os.environ, SLURM_JOB_ID=str(job))
        monarch = os.path.join(a.build, "monarch")
        status = subprocess.run([monarch, "status", "--config", config], env=env,
                                capture_output=True, text=True)
        match = re.search(r"Monarch service pid (\d+)", status.stdout)
        if status.returncode != 0 or not match or int(match.group(1)) in ram_of:
            continue
        stats = subprocess.run([monarch, "stats", "--json", "--config", config], env=env,
                               capture_output=True, text=True, check=True)
        ram = json.loads(stats.stdout)["node"]["tiers"][0]
        ram_of[int(match.group(1))] = (ram["bytes_used"], ram.get("resident_bytes", 0))
    return (len(ram_of), sum(u for u, _ in ram_of.values()),
            sum(r for _, r in ram_of.values()))


def stop_services(a, config, job_ids):
    """Stops the jobs' services and drops the RAM copies they keep
    (node.keep_ram), so that the next arm starts cold."""
    for job in job_ids:
        drop_service(os.path.join(a.build, "monarch"), config,
                     env=dict(os.environ, SLURM_JOB_ID=str(job)))


def hot_seconds(epochs):
    return sum(e["seconds"] for e in epochs[1:])


def main():
    ap = parser(reps=1, out=os.path.join(HERE, "results", "many_jobs.json"))
    ap.set_defaults(files=20000, threads=2, dir="/var/tmp/monarch-many-jobs")
    ap.add_argument("--jobs", type=int, default=4)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--ram-copies", type=float, default=1.05,
                    help="the RAM tier's capacity, in copies of the dataset")
    ap.add_argument("--sample-us", type=int, default=0,
                    help="each reader spends this long on each sample after reading it (a "
                         "model's step, slept), in every arm; 0: reading only")
    add_huge_ram_flag(ap)
    a = ap.parse_args()
    a.build = os.path.abspath(a.build)
    ram_dir = contextlib.ExitStack()
    node_keys = ram_dir.enter_context(huge_ram_dir(a))
    pfs, files, total = mounted_dataset(a)
    work = private_runtime_base("mjobs")
    ram = int(total * a.ram_copies)
    shared_cfg = os.path.join(work, "shared.yaml")
    write_config(shared_cfg, pfs.mount, ram, node_keys=node_keys)
    per_job_cfg = os.path.join(work, "per-job.yaml")
    write_config(per_job_cfg, pfs.mount, ram, runtime_dir=os.path.join(work, "job-${SLURM_JOB_ID}"),
                 node_keys=node_keys)
    backing = os.path.join(a.dir, "backing")
    jobs = list(range(101, 101 + a.jobs))
    print("%d files, %.1f MiB; source: %s; RAM tier %.1f MiB (%.2f copies); %d jobs x %d "
          "epochs x %d threads; %d us per sample" % (
              files, total / 2**20, " ".join(pfs.flags), ram / 2**20, a.ram_copies, a.jobs,
              a.epochs, a.threads, a.sample_us), flush=True)
    results = {"files": files, "dataset_bytes": total, "ram_bytes": ram, "jobs": a.jobs,
               "epochs": a.epochs, "threads": a.threads, "sample_us": a.sample_us,
               "source": " ".join(pfs.flags), "ram_dir": ram_dir_label(a),
               "reps": []}
    try:
        for rep in range(a.reps):
            rep_result = {}
            for arm, cfg, ids in (("single", shared_cfg, jobs[:1]), ("shared", shared_cfg, jobs),
                                  ("per-job", per_job_cfg, jobs)):
                if hasattr(pfs, "drop_cache"):
                    pfs.drop_cache()
                pfs.reset()
                began = time.monotonic()
                figures = run_jobs(a, work, arm, ids, config=cfg)
                wall = time.monotonic() - began
                source = pfs.stats().get("bytes_read", 0)
                services, used, resident = services_memory(a, cfg, ids)
                stop_services(a, cfg, ids)
                rep_result[arm] = {
                    "wall_seconds": wall, "source_bytes": source, "services": services,
                    "ram_bytes_used": used, "ram_resident_bytes": resident,
                    "epochs": {str(j): [e["seconds"] for e in f] for j, f in figures.items()},
                    "cpu": {str(j): [e["cpu_seconds"] for e in f] for j, f in figures.items()},
                    "bytes": {str(j): [e["bytes"] for e in f] for j, f in figures.items()}}
                hot = [hot_seconds(f) for f in figures.values()]
                print("rep %d %-8s %d service(s); source %.2fx the dataset; RAM used %.2fx, "
                      "resident %.2fx; epochs 2-%d per job %s s; epoch 1 %s s" % (
                          rep, arm, services, source / total, used / total, resident / total,
                          a.epochs, " ".join("%.2f" % h for h in hot),
                          " ".join("%.2f" % f[0]["seconds"] for f in figures.values())),
                      flush=True)
            for arm, ids in (("local-1", jobs[:1]), ("local-N", jobs)):
                figures = run_jobs(a, work, arm, ids, plain_dir=backing, dataset=pfs.mount)
                rep_result[arm] = {
                    "epochs": {str(j): [e["seconds"] for e in f] for j, f in figures.items()},
                    "cpu": {str(j): [e["cpu_seconds"] for e in f] for j, f in figures.items()}}
                print("rep %d %-8s epochs 2-%d per job %s s" % (
                    rep, arm, a.epochs,
                    " ".join("%.2f" % hot_seconds(f) for f in figures.values())), flush=True)
            results["reps"].append(rep_result)
    finally:
        for cfg in (shared_cfg, per_job_cfg):
            stop_services(a, cfg, jobs)
        pfs.stop()
        shutil.rmtree(work, ignore_errors=True)
        ram_dir.close()

    def hot(rep, arm, figure="epochs"):
        return [sum(e[1:]) for e in rep[arm][figure].values()]

    def versus(arm, baseline, figure):
        """min, median, max over reps and jobs of a job's epochs 2-N
        (seconds or CPU seconds) against the baseline's median in its rep."""
        ratios = [h / statistics.median(hot(r, baseline, figure)) for r in results["reps"]
                  for h in hot(r, arm, figure)]
        return [min(ratios), statistics.median(ratios), max(ratios)]

    print("\nsummary over %d rep(s) (median of reps):" % a.reps)
    summary = {}
    for arm in ("single", "shared", "per-job"):
        summary[arm] = {
            "source_x": statistics.median(r[arm]["source_bytes"] / total for r in results["reps"]),
            "ram_used_x": statistics.median(r[arm]["ram_bytes_used"] / total
                                            for r in results["reps"]),
            "ram_resident_x": statistics.median(r[arm]["ram_resident_bytes"] / total
                                                for r in results["reps"]),
            "services": results["reps"][0][arm]["services"]}
    for arm in ("shared", "per-job"):
        summary[arm]["hot_vs_single"] = versus(arm, "single", "epochs")
        summary[arm]["cpu_vs_single"] = versus(arm, "single", "cpu")
    summary["local-N"] = {"hot_vs_local_1": versus("local-N", "local-1", "epochs"),
                          "cpu_vs_local_1": versus("local-N", "local-1", "cpu")}
    results["summary"] = summary
    for arm in ("single", "shared", "per-job"):
        s = summary[arm]
        line = "  %-8s %d service(s): source %.2fx the dataset, RAM %.2fx (resident %.2fx)" % (
            arm, s["services"], s["source_x"], s["ram_used_x"], s["ram_resident_x"])
        if "hot_vs_single" in s:
            line += ("; each job's epochs 2-%d %.2f / %.2f / %.2f x the single job's, "
                     "CPU %.2f / %.2f / %.2f x" % (a.epochs, *s["hot_vs_single"],
                                                   *s["cpu_vs_single"]))
        print(line)
    print("  local-N: each job's epochs 2-%d %.2f / %.2f / %.2f x one job's alone, CPU %.2f / "
          "%.2f / %.2f x (plain reads of a local copy: the machine's own cost of %d jobs at "
          "once)" % (a.epochs, *summary["local-N"]["hot_vs_local_1"],
                     *summary["local-N"]["cpu_vs_local_1"], a.jobs))
    with open(a.out, "w") as f:
        json.dump(results, f, indent=1)
    print("wrote", a.out)


if __name__ == "__main__":
    main()
