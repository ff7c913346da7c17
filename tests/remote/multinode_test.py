#!/usr/bin/env python3
"""Monarch peers as separate processes: the cluster tests of the remote tier.

Each "node" is a monarch-epochs process with its own posix tier over one
shared source directory, reading its share (--partition r/N) of a shuffled
epoch with every read checked against the source (--verify). Scenarios:

  loopback   3 processes on loopback: bytes exact, each file read from the
             source once across all processes, zero source reads after epoch 1.
  sigkill    3 processes, one SIGKILLed mid-run: the others finish every read
             correctly (falling back to the source).
  rehome     4 processes, 5 epochs, one SIGKILLed in epoch 2: its files move
             to the next rank of their rendezvous order, each read from the
             source once more at most, and epochs 4-5 read nothing from it.
  replicas   the same kill with remote.replicas 2: no source read after
             epoch 1 at all.
  no-show    1 of 2 processes: a clear start-up error after the rendezvous
             timeout, not a hang.
  netns      the loopback scenario, 4 processes, each in its own network
             namespace, joined by veth pairs and a bridge, UCX restricted to
             the veth device: the bytes cross a real network path. The
             dataset is on the PFS emulator: the 4 processes' metadata
             operations at start-up are about one walk's (rank 0 walks, the
             others build from its manifest). Needs root, iproute2 and FUSE;
             skipped (exit 77) otherwise.
  netns-extents  4 processes in network namespaces as above, a dataset of 2
             big files cached by extents (placement.extent_bytes), read as
             random records: every peer keeps exactly its striped share of
             the extents, each extent is read from the source once in the
             cluster, and every byte is exact. Needs root and iproute2.

usage: multinode_test.py MONARCH_EPOCHS SCENARIO
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from process_util import (SKIP, PfsEmulator, final_stats, write_dataset,  # noqa: E402
                          write_random_files)


def write_config(path, dataset, tier_dir, capacity, rank, size, rendezvous, extra=""):
    with open(path, "w") as f:
        f.write(
            "dataset: {path: %s}\n"
            "tiers:\n"
            "  - {kind: posix, path: %s, capacity: %d}\n"
            "  - {kind: source}\n"
            "remote:\n"
            "  enabled: true\n"
            "  rank: %d\n"
            "  size: %d\n"
            "  rendezvous_dir: %s\n"
            "  rendezvous_timeout: 30s\n"
            "  request_timeout: 3s\n"
            "%s" % (dataset, tier_dir, capacity, rank, size, rendezvous, extra))


class Cluster:
    def __init__(self, binary, work, size, files=120, capacity_fraction=0.5, extra="",
                 dataset_at=None, file_sizes=None):
        """`dataset_at`: where the processes find the dataset (a PFS emulator's
        mount of self.dataset), if not in self.dataset itself. `file_sizes`
        ({name: size}) instead of `files` small ones."""
        self.binary = binary
        self.work = work
        self.size = size
        self.dataset = os.path.join(work, "dataset")
        self.sizes = (write_random_files(self.dataset, file_sizes) if file_sizes
                      else write_dataset(self.dataset, files))
        self.total = sum(self.sizes.values())
        self.rendezvous = os.path.join(work, "rendezvous")
        self.barriers = os.path.join(work, "barriers")
        os.makedirs(self.barriers)
        self.configs = []
        for r in range(size):
            tier = os.path.join(work, "tier%d" % r)
            os.makedirs(tier)
            config = os.path.join(work, "rank%d.yaml" % r)
            write_config(config, dataset_at or self.dataset, tier,
                         int(self.total * capacity_fraction), r, size, self.rendezvous, extra)
            self.configs.append(config)

    def command(self, rank, epochs, barrier=True, read_size=0, extra=()):
        cmd = [self.binary, "--config", self.configs[rank], "--epochs", str(epochs),
               "--threads", "2", "--partition", "%d/%d" % (rank, self.size), "--verify",
               "--json", os.path.join(self.work, "epochs%d.json" % rank)]
        if barrier:
            cmd += ["--barrier-dir", self.barriers]
        if read_size:
            cmd += ["--read-size", str(read_size)]
        return cmd + list(extra)

    def epochs(self, rank):
        with open(os.path.join(self.work, "epochs%d.json" % rank)) as f:
            return json.load(f)


def run_all(commands, timeout=300, prefixes=None):
    procs = []
    for i, cmd in enumerate(commands):
        full = (prefixes[i] if prefixes else []) + cmd
        procs.append(subprocess.Popen(full, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True))
    outputs = []
    for p in procs:
        out, err = p.communicate(timeout=timeout)
        outputs.append((p.returncode, out, err))
    return outputs


def check_cluster_run(cluster, outputs, epochs, files_read=None):
    for rank, (code, out, err) in enumerate(outputs):
        assert code == 0, "rank %d exited %d\n%s\n%s" % (rank, code, out, err)
    per_epoch_source = [0] * epochs
    per_epoch_peers = [0] * epochs
    for rank in range(cluster.size):
        for e in cluster.epochs(rank):
            assert e["errors"] == 0 and e["mismatches"] == 0, e
            per_epoch_source[e["epoch"] - 1] += e["served"]["source"]["bytes"]
            per_epoch_peers[e["epoch"] - 1] += e["served"]["peers"]["bytes"]
    stats = [final_stats(out) for _, out, _ in outputs]
    source_bytes = sum(s["tiers"][-1]["bytes_read"] for s in stats)
    print("source bytes per epoch (all processes):", per_epoch_source, "dataset:", cluster.total)
    print("peer bytes per epoch (all processes):", per_epoch_peers)
    # Each file read from the source once, in epoch 1, across the cluster.
    assert per_epoch_source[0] == (files_read or cluster.total), per_epoch_source
    assert all(b == 0 for b in per_epoch_source[1:]), per_epoch_source
    assert source_bytes == (files_read or cluster.total), source_bytes
    assert all(b > 0 for b in per_epoch_peers), per_epoch_peers
    for s in stats:
        assert s["remote"]["checksum_failures"] == 0 and s["remote"]["fallbacks"] == 0, s["remote"]
    return stats


def scenario_loopback(binary, work):
    cluster = Cluster(binary, work, size=3)
    outputs = run_all([cluster.command(r, 3) for r in range(3)])
    check_cluster_run(cluster, outputs, 3)


def scenario_sigkill(binary, work):
    # Tiers of a third of the dataset: most reads keep going to peers, every epoch.
    cluster = Cluster(binary, work, size=3, capacity_fraction=0.34)
    epochs = 40
    procs = [subprocess.Popen(cluster.command(r, epochs, barrier=False, read_size=256 << 10),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for r in range(3)]
    victim = procs[2]
    seen = ""
    while "epoch 2:" not in seen:  # Let it serve for a while first.
        line = victim.stdout.readline()
        assert line, "rank 2 ended early:\n" + seen
        seen += line
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    killed_at = time.time()
    for rank in (0, 1):
        out, _ = procs[rank].communicate(timeout=300)
        assert procs[rank].returncode == 0, "rank %d exited %d\n%s" % (
            rank, procs[rank].returncode, out)
        stats = final_stats(out)
        epochs_done = cluster.epochs(rank)
        assert len(epochs_done) == epochs
        assert all(e["errors"] == 0 and e["mismatches"] == 0 for e in epochs_done)
        remote = stats["remote"]
        print("rank %d after the kill: %s" % (rank, json.dumps(remote)))
        assert remote["peer_failures"] >= 1, remote  # It noticed rank 2 die...
        assert remote["fallbacks"] + remote["down_skips"] >= 1, remote  # ...and used the source.
        assert remote["checksum_failures"] == 0
    print("survivors finished %.1f s after the kill" % (time.time() - killed_at))


MASK = (1 << 64) - 1


def _mix(x):
    x ^= x >> 30
    x = (x * 0xBF58476D1CE4E5B9) & MASK
    x ^= x >> 27
    x = (x * 0x94D049BB133111EB) & MASK
    return x ^ (x >> 31)


def rendezvous_order(name, size):
    """The ranks of a file's rendezvous order (src/remote/rendezvous_hash.h),
    rebuilt independently: home first, then who takes it over."""
    h = 0xCBF29CE484222325
    for c in name.encode():
        h = ((h ^ c) * 0x100000001B3) & MASK
    h = _mix(h)
    return sorted(range(size), key=lambda r: (-_mix(h ^ _mix(r + 1)), r))


def kill_in_epoch_2(cluster, epochs, victim_rank):
    """Runs the cluster with barriers and --settle, SIGKILLs one rank once
    epoch 2 is under way, and stands in for it at the remaining barriers (as a
    launcher that carries on with the survivors would). Returns the survivors'
    (rank, output)."""
    procs = []
    for r in range(cluster.size):
        cmd = cluster.command(r, epochs) + ["--settle"]
        procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True))
    victim = procs[victim_rank]
    # Epoch 2 starts when every rank has reached its barrier (a pipe's
    # output arrives too late to tell).
    deadline = time.time() + 120
    while not all(os.path.exists(os.path.join(cluster.barriers, "start-2.%d" % r))
                  for r in range(cluster.size)):
        assert victim.poll() is None and time.time() < deadline, "rank %d ended early:\n%s" % (
            victim_rank, victim.stdout.read() if victim.poll() is not None else "")
        time.sleep(0.001)
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    for name in ["start-%d" % e for e in range(2, epochs + 1)] + \
                ["end-%d" % e for e in range(2, epochs + 1)] + ["done"]:
        open(os.path.join(cluster.barriers, "%s.%d" % (name, victim_rank)), "w").close()
    outputs = []
    for r, p in enumerate(procs):
        if r == victim_rank:
            continue
        out, _ = p.communicate(timeout=300)
        assert p.returncode == 0, "rank %d exited %d\n%s" % (r, p.returncode, out)
        outputs.append((r, out))
    return outputs


def check_kill_run(cluster, outputs, epochs, victim_rank, replicas):
    share = {n: s for n, s in cluster.sizes.items()
             if rendezvous_order(n, cluster.size)[0] == victim_rank}
    share_bytes = sum(share.values())
    per_epoch_source = [0] * epochs
    adopted = 0
    for r, out in outputs:
        done = cluster.epochs(r)
        assert len(done) == epochs, done
        for e in done:
            assert e["errors"] == 0 and e["mismatches"] == 0, e
            per_epoch_source[e["epoch"] - 1] += e["served"]["source"]["bytes"]
        remote = final_stats(out)["remote"]
        assert remote["checksum_failures"] == 0, remote
        adopted += remote["adopted_files"]
        print("rank %d: %s" % (r, json.dumps(remote)))
    # The killed rank's figures of epoch 1, written before epoch 2 started.
    victim_e1 = [e for e in cluster.epochs(victim_rank) if e["epoch"] == 1]
    assert len(victim_e1) == 1, victim_e1
    victim_source = victim_e1[0]["served"]["source"]["bytes"]
    print("survivors' source bytes per epoch:", per_epoch_source,
          "the killed rank's in epoch 1:", victim_source,
          "dataset:", cluster.total, "the killed rank's home share:", share_bytes)
    e1_fallbacks = victim_e1[0]["served"]["remote"]["fallbacks"] + sum(
        e["served"]["remote"]["fallbacks"] for r, _ in outputs for e in cluster.epochs(r)
        if e["epoch"] == 1)
    # Epoch 1: every file read from the source once in the cluster, mostly by
    # its home; so the survivors' sum is not exact, the cluster's is. A fetch
    # that failed (a home too slow under load) is read from the source by the
    # asking rank, and perhaps by the home as well: only then may it be more.
    cluster_e1 = per_epoch_source[0] + victim_source
    if e1_fallbacks == 0:
        assert cluster_e1 == cluster.total, (per_epoch_source, victim_source)
    else:
        print("epoch 1 had %d failed peer fetches" % e1_fallbacks)
        assert cluster_e1 >= cluster.total, (per_epoch_source, victim_source)
    if replicas == 1:
        # Each of the lost rank's files once more at most, by its new holder...
        assert 0 < sum(per_epoch_source[1:3]) <= share_bytes, per_epoch_source
        # ...and not again.
        assert per_epoch_source[3:] == [0] * (epochs - 3), per_epoch_source
        assert adopted == len(share), (adopted, len(share))
    else:
        # Every file had a second holder before the kill.
        assert per_epoch_source[1:] == [0] * (epochs - 1), per_epoch_source
        assert adopted > 0, adopted


def scenario_rehome(binary, work, replicas=1):
    extra = "  retry_after: 1s\n" + ("  replicas: %d\n" % replicas if replicas > 1 else "")
    cluster = Cluster(binary, work, size=4, capacity_fraction=1.0, extra=extra)
    outputs = kill_in_epoch_2(cluster, 5, victim_rank=3)
    check_kill_run(cluster, outputs, 5, 3, replicas)


def scenario_replicas(binary, work):
    scenario_rehome(binary, work, replicas=2)


def scenario_no_show(binary, work):
    cluster = Cluster(binary, work, size=2, files=10)
    with open(cluster.configs[0], "a") as f:
        f.write("")  # Rank 1 is never started.
    text = open(cluster.configs[0]).read().replace("rendezvous_timeout: 30s",
                                                   "rendezvous_timeout: 2s")
    open(cluster.configs[0], "w").write(text)
    start = time.time()
    code, out, err = run_all([cluster.command(0, 1, barrier=False)], timeout=60)[0]
    elapsed = time.time() - start
    print("exit %d after %.1f s: %s" % (code, elapsed, err.strip()))
    assert code == 2, (code, out, err)
    assert "rank 1 never arrived" in err and "remote.rendezvous_timeout" in err, err
    assert elapsed < 20, elapsed


def sh(*args):
    subprocess.run(args, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


class NetworkNamespaces:
    """`count` network namespaces joined by veth pairs to a bridge in a hub
    namespace, node i at 10.77.0.(i+1). `prefixes[i]` runs a command in
    node i with UCX restricted to its veth device. `error` says why they
    could not be made (then the caller skips)."""

    def __init__(self, count):
        self.tag = "m%d" % (os.getpid() % 100000)
        self.hub = self.tag + "hub"
        self.nodes = [self.tag + "n%d" % i for i in range(count)]
        self.error = None
        if os.geteuid() != 0 or shutil.which("ip") is None:
            self.error = "needs root and iproute2"
            return
        try:
            sh("ip", "netns", "add", self.hub)
        except subprocess.CalledProcessError as e:
            self.error = "cannot create a network namespace: " + e.stderr.decode().strip()
            return
        tag, hub = self.tag, self.hub
        sh("ip", "-n", hub, "link", "add", "br0", "type", "bridge")
        sh("ip", "-n", hub, "link", "set", "br0", "up")
        for i, ns in enumerate(self.nodes):
            sh("ip", "netns", "add", ns)
            sh("ip", "link", "add", tag + "a%d" % i, "type", "veth", "peer", "name", tag + "b%d" % i)
            sh("ip", "link", "set", tag + "a%d" % i, "netns", ns)
            sh("ip", "link", "set", tag + "b%d" % i, "netns", hub)
            sh("ip", "-n", hub, "link", "set", tag + "b%d" % i, "master", "br0")
            sh("ip", "-n", hub, "link", "set", tag + "b%d" % i, "up")
            sh("ip", "-n", ns, "addr", "add", "10.77.0.%d/24" % (i + 1), "dev", tag + "a%d" % i)
            sh("ip", "-n", ns, "link", "set", tag + "a%d" % i, "up")
            sh("ip", "-n", ns, "link", "set", "lo", "up")
        self.prefixes = [["ip", "netns", "exec", ns, "env", "UCX_NET_DEVICES=%sa%d" % (tag, i)]
                         for i, ns in enumerate(self.nodes)]

    def bytes_sent(self):
        """Bytes the nodes' veth devices sent."""
        sent = 0
        for i, ns in enumerate(self.nodes):
            out = subprocess.run(["ip", "netns", "exec", ns, "cat",
                                  "/sys/class/net/%sa%d/statistics/tx_bytes" % (self.tag, i)],
                                 check=True, capture_output=True, text=True).stdout
            sent += int(out)
        return sent

    def close(self):
        for ns in self.nodes + [self.hub]:
            subprocess.run(["ip", "netns", "del", ns], stderr=subprocess.DEVNULL)


def scenario_netns(binary, work):
    net = NetworkNamespaces(4)
    try:
        if net.error:
            print("SKIP:", net.error)
            return SKIP
        # The dataset on the PFS emulator, which counts metadata operations.
        mount = os.path.join(work, "pfs")
        cluster = Cluster(binary, work, size=4, dataset_at=mount)
        emulator = PfsEmulator(os.path.join(os.path.dirname(os.path.abspath(binary)), "bin",
                                            "pfs-emulator"), cluster.dataset, mount, latency_us=100)
        if not emulator.started:
            print("SKIP: the PFS emulator did not mount:", emulator.error.strip())
            return SKIP
        try:
            # One walk, for the baseline: a process without peers.
            alone = os.path.join(work, "alone.yaml")
            with open(alone, "w") as f:
                f.write("dataset: {path: %s}\ntiers: [{kind: ram, capacity: 1GiB}, "
                        "{kind: source}]\n" % mount)
            one = os.path.join(work, "one.start.json")
            (code, out, err), = run_all([[binary, "--config", alone, "--epochs", "1",
                                          "--threads", "2",
                                          "--before-epoch", emulator.snapshot_at_epoch_1(one)]])
            assert code == 0, "one walk: exit %d\n%s%s" % (code, out, err)
            emulator.reset()
            snapshots = [os.path.join(work, "rank%d.start.json" % r) for r in range(4)]
            outputs = run_all([cluster.command(r, 3, extra=[
                "--before-epoch", emulator.snapshot_at_epoch_1(snapshots[r])]) for r in range(4)],
                prefixes=net.prefixes)
        finally:
            emulator.stop()
        check_cluster_run(cluster, outputs, 3)
        one_walk = json.load(open(one))["counters"]["metadata_ops"]
        # Each snapshot is taken once its process has started; the last one
        # when all have, before any read.
        at_start = max(json.load(open(p))["counters"]["metadata_ops"] for p in snapshots)
        print("metadata operations at start-up: 4 peers %d, one walk %d" % (at_start, one_walk))
        assert at_start <= 1.2 * one_walk + 10 * 4, (at_start, one_walk)
        built = [final_stats(out)["namespace_built_from_manifest"] for _, out, _ in outputs]
        assert built == [0, 1, 1, 1], built  # Rank 0 walked; the others used its manifest.
        crossed = net.bytes_sent()
        print("bytes sent over the veth devices: %d (dataset %d)" % (crossed, cluster.total))
        # Epochs 2-3 alone move most of the dataset between the nodes.
        assert crossed > cluster.total // 2, crossed
    finally:
        net.close()
    return 0


def striped_homes(sizes, extent_bytes, peers):
    """{rank: [(file, extent index)]} whose home each rank is: extent k of a
    file goes to (the home of the file's name + k) mod peers
    (src/remote/rendezvous_hash.h, HolderOrder), rebuilt independently."""
    homes = {r: [] for r in range(peers)}
    for name, size in sizes.items():
        first = rendezvous_order(name, peers)[0]
        for k in range((size + extent_bytes - 1) // extent_bytes):
            homes[(first + k) % peers].append((name, k))
    return homes


def scenario_netns_extents(binary, work):
    net = NetworkNamespaces(4)
    try:
        if net.error:
            print("SKIP:", net.error)
            return SKIP
        extent = 1 << 20
        # 2 files of 40 and 27 extents (the last ones short), read as records
        # that straddle extent boundaries: 67 extents over 4 peers.
        sizes = {"shards/big0.bin": 40 * extent - 4000, "big1.h5": 26 * extent + 77777}
        extra = "placement:\n  extent_bytes: 1MiB\n  extent_threshold: 4MiB\n"
        cluster = Cluster(binary, work, size=4, file_sizes=sizes, extra=extra)
        commands = [cluster.command(r, 3, extra=["--records", str(300 << 10)]) for r in range(4)]
        outputs = run_all(commands, prefixes=net.prefixes)
        check_cluster_run(cluster, outputs, 3)
        homes = striped_homes(sizes, extent, 4)
        print("extents per home:", {r: len(h) for r, h in homes.items()})
        for rank, (_, out, _) in enumerate(outputs):
            stats = final_stats(out)
            held = stats["tiers"][0]["files"]
            print("rank %d: %d extents in its tier, %d bytes; %s" % (
                rank, held, stats["tiers"][0]["bytes_used"], json.dumps(stats["remote"])))
            # Each peer is home of its stripes of both files, 16 or 17...
            assert stats["remote"]["home_files"] == len(homes[rank]) >= 16, (rank, stats["remote"])
            # ...and keeps every one of them in its tier (beside the copies
            # of other extents it had room for).
            tier = os.path.join(work, "tier%d" % rank, ".monarch", "extents", str(extent))
            for name, k in homes[rank]:
                copy = os.path.join(tier, name, str(k))
                assert os.path.getsize(copy) >= min(extent, sizes[name] - k * extent), copy
            assert held >= len(homes[rank]), (rank, held)
            assert stats["remote"]["bytes_served"] > 0, stats["remote"]
        crossed = net.bytes_sent()
        print("bytes sent over the veth devices: %d (dataset %d)" % (crossed, cluster.total))
        # Epochs 2-3 read three quarters of each epoch from the other nodes.
        assert crossed > cluster.total, crossed
    finally:
        net.close()
    return 0


def main():
    binary, scenario = sys.argv[1], sys.argv[2]
    work = tempfile.mkdtemp(prefix="monarch-multinode-")
    try:
        result = {"loopback": scenario_loopback, "sigkill": scenario_sigkill,
                  "no-show": scenario_no_show, "netns": scenario_netns,
                  "netns-extents": scenario_netns_extents,
                  "rehome": scenario_rehome, "replicas": scenario_replicas}[scenario](binary, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if result == SKIP:
        return SKIP
    print("PASS", scenario)
    return 0


if __name__ == "__main__":
    sys.exit(main())
