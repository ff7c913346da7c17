#!/usr/bin/env python3
"""A rank whose peer died still exits: no wait in Monarch without an end.

Three "nodes" on loopback, each with its own posix tier of half the dataset
over one shared source, read their shares (--partition r/3) of shuffled
epochs in pieces (--read-size 65536), every read checked against the source
(--verify), with file barriers around each epoch. One node is SIGKILLed at a
seeded random moment at one of these points:

  epoch1   during epoch 1's promotions (every file is being copied, and
           fetched from its home);
  fetch    in the middle of a later epoch, while the others fetch from it;
  rehoming rank 2 in epoch 2, then rank 1 while it takes over rank 2's
           files (its keeper fills them): rank 0 survives alone;
  close    right when every rank reached the last barrier, so the
           survivors shut down (draining their promotions) as it dies.

The launcher stands in for the dead ranks at the remaining barriers, as a
job that carries on with its survivors would. Every survivor must read
every epoch with 0 errors and 0 mismatches, exit 0, and exit within
EXIT_BOUND seconds of its last read (the end of its last epoch). The bound:
Shutdown(kDrain) drains for at most placement.shutdown_timeout (30 s by
default), then waits at most 5 s for threads to notice the cancellation,
and the peer network's goodbye and endpoint close take at most 1 + 5 s
(src/common/shutdown.h, PeerNetwork::Shutdown): 41 s, rounded up to 45.

Scenarios:
  peers    the points above, each with --seeds runs;
  service  the same nodes as node services (`monarch serve`, node.shared)
           with one monarch-epochs client each: node 2's service and client
           are killed mid-epoch (or right before the end); the survivors'
           clients exit 0 with exact bytes, and `monarch stop` stops their
           services within the bound.

--report prints, per point, the survivors' exit times after their last
read (median and maximum) for bench/results/exit.md.

usage: exit_test.py MONARCH_EPOCHS MONARCH_CLI SCENARIO [--seeds N] [--report]
"""

import argparse
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from multinode_test import Cluster  # noqa: E402
from process_util import check, log  # noqa: E402

EXIT_BOUND = 45.0
EPOCHS = 5
FILES = 240
POINTS = ["epoch1", "fetch", "rehoming", "close"]


def barrier_path(cluster, name, rank):
    return os.path.join(cluster.barriers, "%s.%d" % (name, rank))


def wait_for_barrier(cluster, name, procs, timeout=120):
    """Waits until every rank still running has reached barrier `name`."""
    deadline = time.time() + timeout
    while True:
        alive = [r for r, p in enumerate(procs) if p is not None and p.poll() is None]
        if all(os.path.exists(barrier_path(cluster, name, r)) for r in alive):
            return
        check(time.time() < deadline, "barrier %s not reached in %d s" % (name, timeout))
        for r, p in enumerate(procs):
            if p is not None and p.poll() is not None and p.returncode != 0:
                raise AssertionError("rank %d exited %d early:\n%s" % (r, p.returncode,
                                                                       open(p.log_path).read()))
        time.sleep(0.002)


def stand_in_for(cluster, rank, epochs):
    """Creates every barrier file `rank` would have, for the survivors."""
    for name in (["start-%d" % e for e in range(1, epochs + 1)] +
                 ["end-%d" % e for e in range(1, epochs + 1)] + ["done"]):
        open(barrier_path(cluster, name, rank), "w").close()


def kill(procs, rank, cluster, epochs, extra=()):
    procs[rank].send_signal(signal.SIGKILL)
    procs[rank].wait()
    for p in extra:
        p.send_signal(signal.SIGKILL)
        p.wait()
    stand_in_for(cluster, rank, epochs)
    procs[rank] = None


def launch(cluster, rank, seed, work, prefix=()):
    hook = "date +%%s.%%N > %s/last-read.%d" % (work, rank)
    cmd = list(prefix) + cluster.command(rank, EPOCHS, read_size=65536, extra=[
        "--seed", str(seed), "--before-epoch",
        '[ "$MONARCH_EPOCH" != %d ] || %s' % (EPOCHS + 1, hook)])
    log_path = os.path.join(work, "rank%d.log" % rank)
    p = subprocess.Popen(cmd, stdout=open(log_path, "w"), stderr=subprocess.STDOUT)
    p.log_path = log_path
    return p


def kill_at(point, cluster, procs, rng, epochs, extra_victims=None):
    """Kills the victims for `point`; returns the ranks killed."""
    extra_victims = extra_victims or {}
    if point == "epoch1":
        wait_for_barrier(cluster, "start-1", procs)
        time.sleep(rng.uniform(0.0, 0.3))
        kill(procs, 2, cluster, epochs, extra_victims.get(2, ()))
        return [2]
    if point == "fetch":
        wait_for_barrier(cluster, "start-3", procs)
        time.sleep(rng.uniform(0.0, 0.2))
        kill(procs, 2, cluster, epochs, extra_victims.get(2, ()))
        return [2]
    if point == "rehoming":
        wait_for_barrier(cluster, "start-2", procs)
        time.sleep(rng.uniform(0.0, 0.1))
        kill(procs, 2, cluster, epochs, extra_victims.get(2, ()))
        # Rank 1 notices at its next fetch from rank 2 and its keeper starts
        # filling rank 2's files (it looks five times a second).
        time.sleep(rng.uniform(0.25, 0.6))
        kill(procs, 1, cluster, epochs, extra_victims.get(1, ()))
        return [2, 1]
    if point == "close":
        wait_for_barrier(cluster, "done", procs)
        time.sleep(rng.uniform(0.0, 0.05))
        kill(procs, 2, cluster, epochs, extra_victims.get(2, ()))
        return [2]
    raise ValueError(point)


def wait_survivors(cluster, procs, work, timeout=600):
    """Waits for every survivor; returns {rank: seconds from last read to exit}."""
    exited_at = {}
    deadline = time.time() + timeout
    while len(exited_at) < sum(p is not None for p in procs):
        for r, p in enumerate(procs):
            if p is not None and r not in exited_at and p.poll() is not None:
                exited_at[r] = time.time()
        if time.time() > deadline:
            for r, p in enumerate(procs):
                if p is not None and p.poll() is None:
                    p.kill()
            raise AssertionError("survivors %s did not exit in %d s" % (
                [r for r, p in enumerate(procs) if p is not None and r not in exited_at], timeout))
        time.sleep(0.005)
    after_last_read = {}
    for r, p in enumerate(procs):
        if p is None:
            continue
        out = open(p.log_path).read()
        check(p.returncode == 0, "rank %d exited %d:\n%s" % (r, p.returncode, out[-3000:]))
        done = cluster.epochs(r)
        check(len(done) == EPOCHS, "rank %d: %d epochs" % (r, len(done)))
        for e in done:
            check(e["errors"] == 0 and e["mismatches"] == 0, "rank %d: %s" % (r, e))
        last_read = float(open(os.path.join(work, "last-read.%d" % r)).read())
        after_last_read[r] = exited_at[r] - last_read
    return after_last_read


def write_node_configs(cluster, work):
    """The cluster's configs as node services: node.shared, a runtime
    directory each."""
    for r, path in enumerate(cluster.configs):
        with open(path, "a") as f:
            f.write("node:\n  shared: true\n  runtime_dir: %s\n  autostart: false\n"
                    "  idle_exit: 0\n" % os.path.join(work, "run%d" % r))


def run_peers(binary, cli, work, seed, point):
    cluster = Cluster(binary, work, size=3, files=FILES, capacity_fraction=0.5)
    rng = random.Random(seed)
    procs = [launch(cluster, r, seed, work) for r in range(3)]
    try:
        killed = kill_at(point, cluster, procs, rng, EPOCHS)
        times = wait_survivors(cluster, procs, work)
    finally:
        for p in procs:
            if p is not None and p.poll() is None:
                p.kill()
    return killed, times


def run_service(binary, cli, work, seed, point):
    cluster = Cluster(binary, work, size=3, files=FILES, capacity_fraction=0.5)
    write_node_configs(cluster, work)
    rng = random.Random(seed)
    services = []
    procs = []
    for r in range(3):
        log_path = os.path.join(work, "service%d.log" % r)
        services.append(subprocess.Popen([cli, "serve", "--config", cluster.configs[r]],
                                         stdout=open(log_path, "w"), stderr=subprocess.STDOUT))
        services[-1].log_path = log_path
    try:
        # The services meet at the rendezvous; a client connects once its
        # service listens.
        deadline = time.time() + 60
        while not all(os.path.exists(os.path.join(work, "run%d" % r, "monarch.sock"))
                      for r in range(3)):
            check(all(s.poll() is None for s in services), "a service exited at start-up")
            check(time.time() < deadline, "the services did not start")
            time.sleep(0.01)
        procs = [launch(cluster, r, seed, work) for r in range(3)]
        killed = kill_at(point, cluster, procs, rng, EPOCHS,
                         extra_victims={2: [services[2]], 1: [services[1]]})
        for r in killed:
            services[r] = None
        times = wait_survivors(cluster, procs, work)
        # Then the survivors' services stop, in bounded time.
        for r, service in enumerate(services):
            if service is None:
                continue
            started = time.time()
            stop = subprocess.run([cli, "stop", "--config", cluster.configs[r]],
                                  capture_output=True, text=True, timeout=120)
            check(stop.returncode == 0, "monarch stop of node %d: %s%s" % (r, stop.stdout,
                                                                           stop.stderr))
            service.wait(timeout=120)
            took = time.time() - started
            check(service.returncode == 0, "service %d exited %d:\n%s" % (
                r, service.returncode, open(service.log_path).read()[-3000:]))
            check(took <= EXIT_BOUND, "service %d took %.1f s to stop" % (r, took))
            log("node %d's service stopped in %.2f s" % (r, took))
    finally:
        for s in services:
            if s is not None and s.poll() is None:
                s.kill()
        for p in procs:
            if p is not None and p.poll() is None:
                p.kill()
    return killed, times


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("binary")
    parser.add_argument("cli")
    parser.add_argument("scenario", choices=["peers", "service"])
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--first-seed", type=int, default=1)
    parser.add_argument("--points", default=",".join(POINTS))
    parser.add_argument("--report", action="store_true")
    args = parser.parse_args()
    points = args.points.split(",")
    if args.scenario == "service":
        points = [p for p in points if p in ("fetch", "close")]
    run = run_peers if args.scenario == "peers" else run_service
    results = {p: [] for p in points}
    for point in points:
        for seed in range(args.first_seed, args.first_seed + args.seeds):
            work = tempfile.mkdtemp(prefix="monarch-exit-")
            try:
                killed, times = run(args.binary, args.cli, work, seed, point)
            except BaseException:
                print("FAILED at point %s, seed %d; logs in %s" % (point, seed, work))
                raise
            shutil.rmtree(work, ignore_errors=True)
            log("%s seed %d: killed %s; survivors exited %s s after their last read" % (
                point, seed, killed, {r: round(t, 2) for r, t in times.items()}))
            for r, t in times.items():
                check(t <= EXIT_BOUND, "rank %d exited %.1f s after its last read (bound %.0f s)"
                      % (r, t, EXIT_BOUND))
            results[point].extend(times.values())
    summary = {p: {"runs": args.seeds, "survivors": len(t),
                   "median_s": round(statistics.median(t), 3), "max_s": round(max(t), 3)}
               for p, t in results.items()}
    print(("report: " if args.report else "exit times: ") + json.dumps(summary))
    print("PASS", args.scenario)
    return 0


if __name__ == "__main__":
    sys.exit(main())
