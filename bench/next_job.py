#!/usr/bin/env python3
"""The next job on a node (issue 42's warm start): a job started while the
last one's node service still keeps its copies (within node.idle_exit)
reads its epoch 1 from them.

--files ImageNet-like files (~110 KiB) sit behind the PFS emulator (its
Lustre-like defaults, read-ahead on). Job A (`monarch-epochs`, its own
SLURM_JOB_ID, --threads readers) reads --epochs epochs through a config
with a RAM tier of 1.05 copies, node sharing on and node.idle_exit of 10
minutes, and ends. Job B, another SLURM_JOB_ID with the same config, starts
right after and reads 2 epochs. Each rep starts cold (service stopped,
emulator counters zeroed, its kept RAM copies purged). Reports B's epoch 1 against A's hot
epoch (its last), against A's epoch 2 (A's first from RAM, which pays the
same first touch of each page in a new process), and the PFS bytes B's run
cost.

  sudo .venv/bin/python bench/next_job.py --build build --files 20000 \\
    --out /tmp/next_job.json
"""

import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from emulated_dataset import mounted_dataset, parser, private_runtime_base  # noqa: E402
from huge_ram import add_huge_ram_flag, huge_ram_dir, ram_dir_label  # noqa: E402
from service_epochs import drop_service  # noqa: E402


def job(a, config, job_id, epochs, out):
    r = subprocess.run([os.path.join(a.build, "monarch-epochs"), "--config", config, "--epochs",
                        str(epochs), "--threads", str(a.threads), "--seed", str(job_id), "--json",
                        out] + (["--sample-us", str(a.sample_us)] if a.sample_us else []),
                       env=dict(os.environ, SLURM_JOB_ID=str(job_id)),
                       capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit("job %d failed (%d):\n%s%s" % (job_id, r.returncode, r.stdout, r.stderr[-3000:]))
    with open(out) as f:
        return [e["seconds"] for e in json.load(f)]


def main():
    ap = parser(reps=3, out=os.path.join(HERE, "results", "next_job.json"))
    ap.set_defaults(files=20000, threads=2, dir="/var/tmp/monarch-many-jobs")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--sample-us", type=int, default=0,
                    help="each reader spends this long on each sample after reading it (a "
                         "model's step, slept); 0: reading only")
    add_huge_ram_flag(ap)
    a = ap.parse_args()
    a.build = os.path.abspath(a.build)
    ram_dir = contextlib.ExitStack()
    node_keys = ram_dir.enter_context(huge_ram_dir(a))
    pfs, files, total = mounted_dataset(a)
    work = private_runtime_base("mnext")
    config = os.path.join(work, "job.yaml")
    with open(config, "w") as f:
        f.write("dataset: {path: %s}\ntiers: [{kind: ram, capacity: %d}, {kind: source}]\n"
                "node: {shared: true, autostart: true, idle_exit: 10m%s}\n" % (
                    pfs.mount, int(total * 1.05), ", " + node_keys if node_keys else ""))
    print("%d files, %.1f MiB; source: %s; jobs of %d threads; node.idle_exit 10m; %d us per "
          "sample" % (files, total / 2**20, " ".join(pfs.flags), a.threads, a.sample_us),
          flush=True)
    runs = []
    monarch = os.path.join(a.build, "monarch")
    try:
        for rep in range(a.reps):
            drop_service(monarch, config)  # Cold: no service, and none of its copies kept.
            pfs.reset()
            first = job(a, config, 300 + 2 * rep, a.epochs, os.path.join(work, "a.json"))
            before = pfs.stats().get("bytes_read", 0)
            second = job(a, config, 301 + 2 * rep, 2, os.path.join(work, "b.json"))
            b_source = pfs.stats().get("bytes_read", 0) - before
            # A's last epoch is its hot one: its epoch 2, its first from RAM,
            # also pays its process's first touch of every page.
            hot = first[-1]
            runs.append({"a": first, "b": second, "b_source_bytes": b_source,
                         "b_epoch1_vs_a_hot": second[0] / hot,
                         "b_epoch1_vs_a_epoch2": second[0] / first[1]})
            print("rep %d: job A epochs %s s; job B epochs %s s; B's epoch 1 / A's hot (last) "
                  "epoch %.3f, / A's epoch 2 %.3f; PFS bytes in B's run %.4fx the dataset" % (
                      rep, " ".join("%.2f" % s for s in first),
                      " ".join("%.2f" % s for s in second), second[0] / hot,
                      second[0] / first[1], b_source / total), flush=True)
    finally:
        drop_service(monarch, config)
        pfs.stop()
        shutil.rmtree(work, ignore_errors=True)
        ram_dir.close()
    for key, what in (("b_epoch1_vs_a_hot", "job A's hot (last) epoch"),
                      ("b_epoch1_vs_a_epoch2", "job A's epoch 2, its first from RAM")):
        ratios = sorted(r[key] for r in runs)
        print("job B's epoch 1 / %s: min %.3f, median %.3f, max %.3f" % (
            what, ratios[0], statistics.median(ratios), ratios[-1]))
    with open(a.out, "w") as f:
        json.dump({"files": files, "dataset_bytes": total, "threads": a.threads,
                   "sample_us": a.sample_us, "ram_dir": ram_dir_label(a),
                   "source": " ".join(pfs.flags), "runs": runs}, f, indent=1)
    print("wrote", a.out)


if __name__ == "__main__":
    main()
