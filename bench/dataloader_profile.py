#!/usr/bin/env python3
"""Where a hot epoch of fresh DataLoader workers spends its time, through
Monarch's node service against a local copy (issue 41's per-sample profile).

Both arms read the same files with a PyTorch DataLoader whose workers are
forked fresh each epoch (PyTorch's default). The Monarch arm reads through
the config a newcomer writes (a RAM tier, no `node:` section), its copies
made in an untimed first epoch; then the two arms' epochs run in turns, so
the machine's drift falls on both. Per epoch it records the wall time and
the CPU time of each party: the main process, the workers (reaped at the
epoch's end: RUSAGE_CHILDREN), and the node service (/proc/<pid>/stat),
with the workers' minor page faults. On 2 cores the CPU a hot epoch costs
is its wall time, so the per-sample split says where the gap to the local
copy is.

  MONARCH_C_LIBRARY=build/libmonarch_c.so MONARCH_BINARY=build/monarch PYTHONPATH=python \\
    .venv/bin/python bench/dataloader_profile.py --build build --files 2000
"""

import argparse
import contextlib
import json
import os
import resource
import signal
import statistics
import subprocess
import sys
import time

import torch.utils.data

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
TICK = os.sysconf("SC_CLK_TCK")
sys.path.insert(0, HERE)
from torch_epochs import PlainFiles, image_dataset  # noqa: E402  (the local copy's arm, as there)
from service_epochs import drop_service  # noqa: E402
from huge_ram import add_huge_ram_flag, huge_ram_dir, ram_dir_label  # noqa: E402


def service_cpu(pid):
    """CPU seconds (user + system) of process `pid` and its threads."""
    if pid is None:
        return 0.0
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def timed_epoch(dataset, workers, total, seed, service_pid, persistent_loader=None):
    loader = persistent_loader or torch.utils.data.DataLoader(
        dataset, batch_size=32, shuffle=True, num_workers=workers,
        generator=torch.Generator().manual_seed(seed), multiprocessing_context="fork")
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    main = resource.getrusage(resource.RUSAGE_SELF)
    service = service_cpu(service_pid)
    start = time.perf_counter()
    got = sum(int(batch.sum()) for batch in loader)
    wall = time.perf_counter() - start
    del loader  # Fresh workers are joined (and reaped) here, at the latest.
    after_children = resource.getrusage(resource.RUSAGE_CHILDREN)
    after_main = resource.getrusage(resource.RUSAGE_SELF)
    assert got == total, (got, total)

    def cpu(a, b):
        return (b.ru_utime - a.ru_utime) + (b.ru_stime - a.ru_stime)

    return {"wall": wall, "main_cpu": cpu(main, after_main),
            "workers_cpu": cpu(children, after_children),
            "workers_user": after_children.ru_utime - children.ru_utime,
            "workers_sys": after_children.ru_stime - children.ru_stime,
            "workers_minflt": after_children.ru_minflt - children.ru_minflt,
            "service_cpu": service_cpu(service_pid) - service}


def service_pid_of(binary, config):
    out = subprocess.run([binary, "status", "--config", config, "--json"], capture_output=True,
                         text=True)
    try:
        return json.loads(out.stdout)["service"]["pid"]
    except (ValueError, KeyError, TypeError):
        pass
    found = subprocess.run(["pgrep", "-f", "monarch serve"], capture_output=True, text=True)
    pids = [int(p) for p in found.stdout.split()]
    return pids[0] if len(pids) == 1 else None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default=os.path.join(REPO, "build"))
    ap.add_argument("--work", default="/tmp/monarch-torch-epochs")
    ap.add_argument("--files", type=int, default=2000)
    ap.add_argument("--epochs", type=int, default=6, help="hot epochs per arm")
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--emulator", action="store_true",
                    help="the source is the PFS emulator's mount of the files (Lustre-like "
                         "defaults), not the local directory")
    ap.add_argument("--perf", metavar="DIR",
                    help="record each arm's hot epochs with `perf record -a -g` into "
                         "DIR/<arm>.data (perf's start and stop are outside the timed epochs)")
    ap.add_argument("--out", help="write the per-epoch figures here as JSON")
    add_huge_ram_flag(ap)
    a = ap.parse_args()
    import monarch.torch as mt
    ram_dir = contextlib.ExitStack()
    node_keys = ram_dir.enter_context(huge_ram_dir(a))

    backing, copy, names, total = image_dataset(a.build, a.work, a.files)
    for root in (copy, backing):  # Both page-cache warm: only hits are timed.
        for n in names:
            with open(os.path.join(root, n), "rb") as f:
                f.read()
    binary = os.environ.get("MONARCH_BINARY", os.path.join(a.build, "monarch"))
    source = backing
    script = os.path.join(REPO, "tools", "pfs_emulator", "pfs-emulator")
    env = dict(os.environ, MONARCH_PFS_EMULATOR=os.path.join(a.build, "bin",
                                                             "monarch-pfs-emulator"))
    if a.emulator:
        source = os.path.join(a.work, "pfs")
        subprocess.run([script, "stop", source], capture_output=True, env=env)
        subprocess.run([script, "start", backing, source], check=True, env=env,
                       stdout=subprocess.DEVNULL)
    config = os.path.join(a.work, "profile-newcomer.yaml")
    with open(config, "w") as f:  # The config a newcomer writes: no node: section.
        f.write(f"dataset: {{path: {source}}}\n"
                f"tiers: [{{kind: ram, capacity: {2 * total}}}, {{kind: source}}]\n"
                + (f"node: {{{node_keys}}}\n" if node_keys else ""))
    drop_service(binary, config)  # Copies an earlier run kept: none adopted.

    ds = mt.FileListDataset(names, config=config, loader=len)
    rows = {"local": [], "monarch": []}
    try:
        warm = timed_epoch(ds, a.workers, total, 0, None)
        ds.monarch.wait_for_placement()
        pid = service_pid_of(binary, config)
        if a.emulator:
            pfs = json.loads(subprocess.run([script, "stats", source], capture_output=True,
                                            text=True, env=env).stdout)
            print(f"PFS emulator counters after epoch 1: {pfs['counters']}")
        tiers = ds.monarch.stats()["tiers"]
        assert tiers[0]["files"] == len(names), tiers[0]
        print(f"{len(names)} files, {total / 2**20:.1f} MiB, {a.workers} fresh workers per "
              f"epoch; Monarch's epoch 1 {warm['wall']:.3f} s, every file then in RAM; "
              f"service pid {pid}; load {os.getloadavg()[0]:.2f}", flush=True)
        for epoch in range(a.epochs):
            order = ("local", "monarch") if epoch % 2 == 0 else ("monarch", "local")
            for arm in order:
                perf = None
                if a.perf:
                    os.makedirs(a.perf, exist_ok=True)
                    data = os.path.join(a.perf, f"{arm}-{epoch + 1}.data")
                    perf = subprocess.Popen(["perf", "record", "-a", "-g", "-q", "-o", data],
                                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                    time.sleep(1.0)  # perf's own start-up, outside the timed epoch.
                if arm == "local":
                    row = timed_epoch(PlainFiles(copy, names), a.workers, total, epoch + 1, pid)
                else:
                    row = timed_epoch(ds, a.workers, total, epoch + 1, pid)
                rows[arm].append(row)
                if perf is not None:
                    perf.send_signal(signal.SIGINT)
                    perf.wait(timeout=60)
                print(f"epoch {epoch + 1} {arm:8s} wall {row['wall']:.3f} s  main "
                      f"{row['main_cpu']:.3f}  workers {row['workers_cpu']:.3f} (user "
                      f"{row['workers_user']:.3f} sys {row['workers_sys']:.3f}, "
                      f"{row['workers_minflt']} minor faults)  service {row['service_cpu']:.3f}",
                      flush=True)
        hits = ds.monarch.stats()["tiers"][0]
        source_tier = ds.monarch.stats()["tiers"][-1]
        assert source_tier["bytes_read"] == total, source_tier  # Hot epochs read no source byte.
        print(f"RAM tier reads {hits['reads']}, source bytes {source_tier['bytes_read']}")
        if a.emulator:
            pfs = json.loads(subprocess.run([script, "stats", source],
                                            capture_output=True, text=True, env=env).stdout)
            print(f"PFS emulator counters after the hot epochs: {pfs['counters']}")
    finally:
        ds.monarch.close()
        drop_service(binary, config)
        if a.emulator:
            subprocess.run([script, "stop", source], capture_output=True, env=env)
        ram_dir.close()

    n = len(names)
    print("\nmedian per sample (µs), over the hot epochs:")
    print("| | wall | main CPU | workers CPU (user, sys) | worker faults | service CPU |")
    print("|---|---|---|---|---|---|")
    for arm in ("local", "monarch"):
        def med(key):
            return statistics.median(r[key] for r in rows[arm])
        print(f"| {arm} | {med('wall') / n * 1e6:.1f} | {med('main_cpu') / n * 1e6:.1f} | "
              f"{med('workers_cpu') / n * 1e6:.1f} ({med('workers_user') / n * 1e6:.1f}, "
              f"{med('workers_sys') / n * 1e6:.1f}) | {med('workers_minflt') / n:.1f} | "
              f"{med('service_cpu') / n * 1e6:.1f} |")
    ratios = [m["wall"] / l["wall"] for m, l in zip(rows["monarch"], rows["local"])]
    print(f"monarch/local wall per epoch pair: median {statistics.median(ratios):.3f} "
          f"(min {min(ratios):.3f}, max {max(ratios):.3f})")
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"files": n, "bytes": total, "workers": a.workers,
                       "ram_dir": ram_dir_label(a), "rows": rows,
                       "ratios": ratios}, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
