#!/usr/bin/env python3
"""Scale model of Monarch's peer tier (issue 15): what a job of 4 to 4,096
nodes over 1M-20M files costs in namespace memory, home-share imbalance,
bytes moved when nodes are lost, and requests per node per second.

The homes are computed with the same rendezvous hash as
src/remote/rendezvous_hash.cc (reimplemented here with numpy; --check-hash
compares it with the C++ code through bench/scale_model/home_check.cc).
Namespace memory comes from the layout of the namespace's table
(src/metadata/file_table_format.h) and the Namespace's own arrays, checked
against build/bench/bench_namespace_memory, which builds the real namespace
over the same ImageNet-21k-like names. The formulas are checked against 2-4
process runs of build/monarch-epochs on this machine.

usage: python3 bench/scale_model.py [--build build] [--src .] [--work DIR]
           [--budget 6e9] [--exact] [--epoch-seconds 300]
           [--skip-runs] [--skip-namespace] [--skip-hash-check]
           [--out bench/results/scale_model.md]

Needs numpy (.venv/bin/python has it), g++ and a Release build
(build/libmonarch.a, build/monarch-epochs, build/bench/bench_namespace_memory)
for the checks. ~4 minutes on 2 cores with the default budget; --exact
(every cell with the real hash, no sampling) takes ~10 minutes more.
"""

import argparse
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
KIB, MIB, GIB, TIB = 1024, 1024 ** 2, 1024 ** 3, 1024 ** 4

# ---------------------------------------------------------------------------
# The rendezvous hash of src/remote/rendezvous_hash.cc, in Python.

FNV_OFFSET = 0xCBF29CE484222325
FNV_PRIME = 0x100000001B3
MIX_M1 = 0xBF58476D1CE4E5B9
MIX_M2 = 0x94D049BB133111EB
U64 = (1 << 64) - 1


def mix_int(x):
    """Mix() on a Python int (the reference, one value)."""
    x &= U64
    x ^= x >> 30
    x = (x * MIX_M1) & U64
    x ^= x >> 27
    x = (x * MIX_M2) & U64
    x ^= x >> 31
    return x


def fnv_state(name):
    """FNV-1a state (before the final Mix) after `name`."""
    h = FNV_OFFSET
    for c in name.encode():
        h ^= c
        h = (h * FNV_PRIME) & U64
    return h


def stable_name_hash_int(name):
    """StableNameHash() on one name (str or bytes), pure Python."""
    h = FNV_OFFSET
    for c in name.encode() if isinstance(name, str) else name:
        h ^= c
        h = (h * FNV_PRIME) & U64
    return mix_int(h)


def home_rank_int(name_hash, peers):
    """HomeRank() on one hash, pure Python (ties: the lower rank, as in C++)."""
    best, best_score = 0, 0
    for rank in range(peers):
        score = mix_int(name_hash ^ mix_int(rank + 1))
        if rank == 0 or score > best_score:
            best, best_score = rank, score
    return best


_S30, _S27, _S31 = np.uint64(30), np.uint64(27), np.uint64(31)
_M1, _M2 = np.uint64(MIX_M1), np.uint64(MIX_M2)


def mix_inplace(x, tmp):
    """Mix() on a uint64 array, in place (numpy wraps uint64 products)."""
    np.right_shift(x, _S30, out=tmp)
    x ^= tmp
    x *= _M1
    np.right_shift(x, _S27, out=tmp)
    x ^= tmp
    x *= _M2
    np.right_shift(x, _S31, out=tmp)
    x ^= tmp
    return x


def stable_name_hashes(names):
    """StableNameHash() of many names, vectorized: names of equal length are
    hashed together, one byte column at a time."""
    encoded = [n.encode() for n in names]
    lengths = np.fromiter((len(e) for e in encoded), dtype=np.int64, count=len(encoded))
    out = np.empty(len(encoded), dtype=np.uint64)
    prime = np.uint64(FNV_PRIME)
    tmp = None
    for length in np.unique(lengths):
        rows = np.nonzero(lengths == length)[0]
        blob = b"".join(encoded[i] for i in rows)
        matrix = np.frombuffer(blob, dtype=np.uint8).reshape(len(rows), int(length))
        h = np.full(len(rows), FNV_OFFSET, dtype=np.uint64)
        for col in range(int(length)):
            h ^= matrix[:, col].astype(np.uint64)
            h *= prime
        tmp = np.empty_like(h)
        out[rows] = mix_inplace(h, tmp)
    return out


def rank_keys(peers):
    return np.array([mix_int(r + 1) for r in range(peers)], dtype=np.uint64)


def top2_homes_exact(hashes, peers, chunk=16384):
    """The two highest-scoring ranks per hash, with full 64-bit comparisons:
    [0] is HomeRank() exactly (strict '>' from rank 0 on, as in C++), [1] the
    runner-up (-1 if peers == 1). O(len(hashes) * peers); the slow path."""
    keys = rank_keys(peers)
    n = len(hashes)
    first = np.empty(n, dtype=np.int32)
    second = np.full(n, -1, dtype=np.int32)
    for a in range(0, n, chunk):
        h = hashes[a:a + chunk]
        m = len(h)
        tmp = np.empty(m, dtype=np.uint64)
        s = np.empty(m, dtype=np.uint64)
        best = mix_inplace(h ^ keys[0], tmp)
        br = np.zeros(m, dtype=np.int32)
        sec = np.zeros(m, dtype=np.uint64)
        sr = np.full(m, -1, dtype=np.int32)
        gt = np.empty(m, dtype=bool)
        gt2 = np.empty(m, dtype=bool)
        for r in range(1, peers):
            np.bitwise_xor(h, keys[r], out=s)
            mix_inplace(s, tmp)
            np.greater(s, best, out=gt)
            np.greater(s, sec, out=gt2)
            np.copyto(sec, s, where=gt2)
            np.copyto(sr, np.int32(r), where=gt2)
            np.copyto(sec, best, where=gt)
            np.copyto(sr, br, where=gt)
            np.copyto(best, s, where=gt)
            np.copyto(br, np.int32(r), where=gt)
        first[a:a + m] = br
        second[a:a + m] = sr
    return first, second


def top2_homes(hashes, peers, chunk=16384):
    """top2_homes_exact(), twice as fast: each score keeps its top 64-b bits
    and carries (2^b - 1 - rank) in its low b bits (b = bits of peers - 1),
    so plain max/min track the two best ranks without masks. Where the two
    best agree in their top bits (the packing could then decide the order),
    those hashes are recomputed with full comparisons, so [0] is exactly
    HomeRank(). [1] could differ from a 64-bit comparison only if the 2nd
    and 3rd scores agree in their top 64-b bits (probability ~1e-12 per
    file at N = 4096)."""
    if peers <= 1:
        return top2_homes_exact(hashes, peers)
    keys = rank_keys(peers)
    bits = (peers - 1).bit_length()
    mask = np.uint64((1 << bits) - 1)
    high = np.uint64(U64 ^ ((1 << bits) - 1))
    low = mask - np.arange(peers, dtype=np.uint64)
    n = len(hashes)
    first = np.empty(n, dtype=np.int32)
    second = np.empty(n, dtype=np.int32)
    for a in range(0, n, chunk):
        h = hashes[a:a + chunk]
        m = len(h)
        tmp = np.empty(m, dtype=np.uint64)
        s = np.empty(m, dtype=np.uint64)
        lo = np.empty(m, dtype=np.uint64)
        best = np.zeros(m, dtype=np.uint64)
        sec = np.zeros(m, dtype=np.uint64)
        for r in range(peers):
            np.bitwise_xor(h, keys[r], out=s)
            mix_inplace(s, tmp)
            s &= high
            s |= low[r]
            np.minimum(best, s, out=lo)
            np.maximum(best, s, out=best)
            np.maximum(sec, lo, out=sec)
        first[a:a + m] = (mask - (best & mask)).astype(np.int32)
        second[a:a + m] = (mask - (sec & mask)).astype(np.int32)
        ties = np.nonzero((best & high) == (sec & high))[0]
        if len(ties):
            f, s2 = top2_homes_exact(h[ties], peers)
            first[a + ties] = f
            second[a + ties] = s2
    return first, second


# ---------------------------------------------------------------------------
# Datasets.

IMAGENET_CLASSES = 21841
IMAGENET_MEAN = 110 * KIB
IMAGENET_SIGMA = 0.45  # As tools/monarch/epochs.cc --profile imagenet.
SHARD_MIN, SHARD_MAX = 64 * MIB, 256 * MIB


class Dataset:
    def __init__(self, label, kind, sizes, name_of, dirs, files_per_dir):
        self.label = label
        self.kind = kind
        self.sizes = sizes
        self.n = len(sizes)
        self.total = int(sizes.sum())
        self.name_of = name_of  # i -> dataset-relative name
        self.dirs = dirs        # directory names (for the namespace model)
        self.files_per_dir = files_per_dir  # list of counts, one per directory with files
        self._hashes = None
        self.fast_hash = None  # ids -> StableNameHash of their names, without strings
        sample = [name_of(int(i)) for i in np.linspace(0, self.n - 1, min(self.n, 2000))]
        self.mean_name = float(np.mean([len(s) for s in sample]))
        mean = sizes.mean()
        self.cv = float(sizes.std() / mean)

    def names(self, ids):
        return [self.name_of(int(i)) for i in ids]

    def hashes(self, ids=None):
        """StableNameHash of files `ids` (all if None; cached, in chunks of 1M)."""
        if ids is None:
            if self._hashes is None:
                parts = []
                for a in range(0, self.n, 1 << 20):
                    parts.append(self._hash_ids(np.arange(a, min(self.n, a + (1 << 20)))))
                self._hashes = np.concatenate(parts)
            return self._hashes
        if self._hashes is not None:
            return self._hashes[ids]
        return self._hash_ids(np.asarray(ids))

    def _hash_ids(self, ids):
        if self.fast_hash is None:
            return stable_name_hashes(self.names(ids))
        return self.fast_hash(ids)


def imagenet_like(n, seed):
    """ImageNet-21k-like: 21,841 class directories 'train/nXXXXXXXX/', JPEG
    names as in the real set, log-normal sizes (sigma 0.45 as the repo's
    generator, median set so that the mean is 110 KiB), clamped to
    [4 KiB, 16 MiB]."""
    rng = np.random.default_rng(seed)
    median = IMAGENET_MEAN * math.exp(-IMAGENET_SIGMA ** 2 / 2)
    sizes = np.clip(rng.lognormal(math.log(median), IMAGENET_SIGMA, n), 4 * KIB,
                    16 * MIB).astype(np.int64)
    classes = min(IMAGENET_CLASSES, n)

    def name_of(i):
        wnid = 1000000 + 397 * (i % classes)
        return "train/n%08d/n%08d_%d.JPEG" % (wnid, wnid, i // classes)

    dirs = ["train"] + ["train/n%08d" % (1000000 + 397 * c) for c in range(classes)]
    per_dir = [n // classes + (1 if c < n % classes else 0) for c in range(classes)]
    ds = Dataset("imagenet-21k-like, %s files" % human_count(n), "imagenet", sizes, name_of,
                 dirs, per_dir)
    # FNV-1a state after each class's "train/nX/nX_" prefix, then the
    # index's digits and ".JPEG" column by column: the same hash as
    # stable_name_hashes(names) without building 20M strings (checked below).
    prefix = np.array([fnv_state("train/n%08d/n%08d_" % (1000000 + 397 * c, 1000000 + 397 * c))
                       for c in range(classes)], dtype=np.uint64)
    suffix = np.frombuffer(b".JPEG", dtype=np.uint8).astype(np.uint64)
    prime = np.uint64(FNV_PRIME)

    def fast_hash(ids):
        ids = np.asarray(ids, dtype=np.int64)
        h = prefix[ids % classes]
        j = ids // classes
        digits = np.maximum(1, np.searchsorted(10 ** np.arange(19, dtype=np.int64), j, side="right"))
        for d in np.unique(digits):
            rows = np.nonzero(digits == d)[0]
            hr = h[rows]
            jr = j[rows]
            for k in range(int(d) - 1, -1, -1):
                hr ^= ((jr // 10 ** k) % 10 + 48).astype(np.uint64)
                hr *= prime
            for c in suffix:
                hr ^= c
                hr *= prime
            h[rows] = hr
        return mix_inplace(h, np.empty_like(h))

    check = np.concatenate([np.arange(min(n, 300)), np.random.default_rng(seed).integers(0, n, 300)])
    assert (fast_hash(check) == stable_name_hashes(ds.names(check))).all(), "fast hash differs"
    ds.fast_hash = fast_hash
    return ds


def shard_like(total_bytes, seed, label):
    """Shard-like: TFRecord-style shards of uniform 64-256 MiB (mean 160
    MiB), as many as make `total_bytes`, all in one directory."""
    rng = np.random.default_rng(seed)
    count = max(1, int(round(total_bytes / ((SHARD_MIN + SHARD_MAX) / 2))))
    sizes = rng.integers(SHARD_MIN, SHARD_MAX + 1, count, dtype=np.int64)

    def name_of(i):
        return "train/shard-%06d-of-%06d.tfrecord" % (i, count)

    return Dataset("shard-like, %s shards (%s)" % (human_count(count), label), "shards", sizes,
                   name_of, ["train"], [count])


def human_count(n):
    if n >= 1000000 and n % 1000000 == 0:
        return "%dM" % (n // 1000000)
    return "{:,}".format(n)


def human_bytes(b):
    b = float(b)
    for unit, scale in (("TiB", TIB), ("GiB", GIB), ("MiB", MIB), ("KiB", KIB)):
        if abs(b) >= scale:
            return "%.3g %s" % (b / scale, unit)
    return "%d B" % b


# ---------------------------------------------------------------------------
# Namespace memory, from the layout of the namespace's table
# (src/metadata/file_table_format.h, FileTableWriter::Layout) and the
# Namespace's own arrays (src/metadata/namespace.h); checked against
# build/bench/bench_namespace_memory (measure_namespace).

TABLE_HEADER = 280    # sizeof(FileTableFormat::Header)
TABLE_RECORD = 20     # name offset (uint32), size, mtime
NAMES_PER_BASE = 2048  # a uint64 name base per 2,048 entries
SLOTS_PER_LINE = 8    # lookup slots, 8 bytes each, in lines of 8 at load 3/4
TABLE_CLASS = 40      # sizeof(FileTableFormat::Class): the stat() fields files share
ENTRY_HEAP = 5        # per entry, per process: a tier slot (4 B) and a placement state (1 B)
DIR_HEAP = 73.53      # per directory: its name, parent, by-name map entry and stamp (fitted:
                      # bench_namespace_memory's heap less 5 B per file, 21,843 directories)
HOME_ENTRY = 2        # PeerDriver::holders_: uint16_t per file (one home)
RAM_SLOT = 16         # ram_driver.cc Slot: sequence + location, per file, per RAM tier


def align8(k):
    return (k + 7) // 8 * 8


def table_bytes_model(n, name_chars, root_len, classes=1):
    """The table's region for n files (no extents) as FileTableWriter lays it out."""
    slots = -(-(n + n // 3 + 1) // SLOTS_PER_LINE) * SLOTS_PER_LINE
    sections = [(n + 1) * TABLE_RECORD,                        # records
                -(-(n + 1) // NAMES_PER_BASE) * 8,             # name bases
                8 * n, 8 * n, 8 * n,                           # inodes, ctimes, atimes
                n * (2 if classes <= 65536 else 4),            # class of each file
                classes * TABLE_CLASS,                          # classes
                0, 0, 0,                                        # extents, block exceptions
                slots * 8,                                      # lookup slots
                name_chars, root_len]
    at = align8(TABLE_HEADER)
    for index, size in enumerate(sections):
        if index == 10:
            at = (at + 63) // 64 * 64  # The slots start on a cache line.
        at = align8(at + size)
    return (at + 4095) // 4096 * 4096  # A sealed memfd of whole pages.


def heap_model(n, dirs):
    return ENTRY_HEAP * n + DIR_HEAP * dirs


# ---------------------------------------------------------------------------
# Statistics helpers.

def expected_max_normal(k):
    """E[max of k iid standard normals], numerically."""
    if k <= 1:
        return 0.0
    xs = np.linspace(-8, 10, 20001)
    phi = np.exp(-xs ** 2 / 2) / math.sqrt(2 * math.pi)
    cdf = 0.5 * (1 + np.vectorize(math.erf)(xs / math.sqrt(2)))
    density = k * phi * cdf ** (k - 1)
    return float(np.sum(xs * density) * (xs[1] - xs[0]))


def imbalance_formula(n, peers, cv):
    """max/mean of home bytes with independent uniform homes (normal approximation)."""
    return 1 + expected_max_normal(peers) * math.sqrt((peers - 1) * (1 + cv ** 2) / n)


def chi2_pvalue(counts):
    """Uniformity of home counts: chi-square, Wilson-Hilferty p-value."""
    counts = np.asarray(counts, dtype=np.float64)
    k = len(counts) - 1
    if k < 1:
        return 1.0
    expected = counts.sum() / len(counts)
    x2 = float(((counts - expected) ** 2 / expected).sum())
    z = ((x2 / k) ** (1 / 3) - (1 - 2 / (9 * k))) / math.sqrt(2 / (9 * k))
    return 0.5 * math.erfc(z / math.sqrt(2))


def iid_imbalance(weights, peers, reps, seed):
    """max/mean of per-node sums when every file's home is uniform and
    independent: the model the real hash is checked against."""
    rng = np.random.default_rng(seed)
    out = []
    mean = weights.sum() / peers
    for _ in range(reps):
        homes = rng.integers(0, peers, len(weights))
        out.append(np.bincount(homes, weights=weights, minlength=peers).max() / mean)
    return np.array(out)


def requests_per_file(sizes, chunk=MIB, remote_chunk=MIB):
    """Peer requests one whole-file fetch costs (peer_network.cc Fetch): the
    placement reads the file in `chunk`-byte chunks; a chunk up to the
    receive buffer (auto: 95th percentile of sizes, 4 KiB-rounded, in
    [64 KiB, 4 MiB]) is one request, a larger one goes in pieces of
    min(remote_chunk, buffer/4)."""
    k = min(len(sizes) - 1, len(sizes) * 95 // 100)
    p95 = int(np.partition(sizes, k)[k])
    buffer = min(max((p95 + 4095) // 4096 * 4096, 64 * KIB), 4 * MIB)
    piece = min(remote_chunk, max(4096, buffer // 4 // 4096 * 4096))
    full = sizes // chunk
    tail = sizes - full * chunk
    per_full = 1 if chunk <= buffer else -(-chunk // piece)
    tail_req = np.where(tail == 0, 0, np.where(tail <= buffer, 1, -(-tail // piece)))
    return full * per_full + tail_req, buffer, piece


# ---------------------------------------------------------------------------
# The cluster tables.

NODES = [4, 16, 64, 256, 1024, 4096]


def cell(ds, peers, args, req):
    """Home shares, losses and rates of dataset `ds` on `peers` nodes."""
    t0 = time.time()
    n = ds.n
    exact = args.exact or n * peers <= args.budget
    rng = np.random.default_rng(1000 + peers)
    lost1 = rng.choice(peers, 1, replace=False)
    lost10 = rng.choice(peers, 10, replace=False) if peers > 10 else None
    res = {"peers": peers, "exact": exact, "n": n}
    if exact:
        ids = None
        first, second = top2_homes(ds.hashes(), peers)
        sizes, wreq, scale = ds.sizes, req, 1.0
    else:
        m = max(1, int(args.budget // peers))
        ids = np.sort(np.random.default_rng(7 + peers).choice(n, m, replace=False))
        first, second = top2_homes(ds.hashes(ids), peers)
        sizes, wreq, scale = ds.sizes[ids], req[ids], n / m
    res["sampled_files"] = len(sizes)
    share = np.bincount(first, weights=sizes, minlength=peers)
    counts = np.bincount(first, minlength=peers)
    res["chi2_p"] = chi2_pvalue(counts)
    mean = ds.total / peers
    if exact:
        res["imbalance"] = share.max() / mean
        res["file_imbalance"] = counts.max() / (n / peers)
        res["req_max"] = np.bincount(first, weights=wreq, minlength=peers).max()
    reps = 20 if n >= 5000000 else 40 if n >= 500000 else 400
    mc = iid_imbalance(ds.sizes.astype(np.float64), peers, reps, 99 + peers)
    res["mc_mean"], res["mc_lo"], res["mc_hi"] = mc.mean(), mc.min(), mc.max()
    res["mc_sd"] = mc.std(ddof=1)
    res["mc_reps"] = reps
    if exact:  # Where the real hash's value falls among the iid draws.
        res["percentile"] = 100.0 * float((mc < res["imbalance"]).mean() +
                                          0.5 * (mc == res["imbalance"]).mean())
    if not exact:
        mcr = iid_imbalance(req.astype(np.float64), peers, reps, 199 + peers)
        res["req_max"] = mcr.mean() * req.sum() / peers
    res["formula"] = imbalance_formula(n, peers, ds.cv)

    def estimate(mask):
        """Bytes of the files in `mask`: exact, or a sample estimate with a 95% half-width."""
        y = np.where(mask, sizes, 0).astype(np.float64)
        value = y.sum() * scale
        if exact:
            return value, 0.0
        m = len(y)
        half = 1.96 * scale * math.sqrt(m * y.var(ddof=1) * (1 - m / n)) if m > 1 else 0.0
        return value, half

    for k, lost in ((1, lost1), (10, lost10)):
        if lost is None:
            continue
        in1 = np.isin(first, lost)
        in2 = np.isin(second, lost)
        res["lose%d_norep" % k] = estimate(in1)
        res["lose%d_rep_pfs" % k] = estimate(in1 & in2)
        res["lose%d_rep_peer" % k] = estimate(in1 ^ in2)
        res["lose%d_norep_formula" % k] = k * ds.total / peers
        res["lose%d_rep_pfs_formula" % k] = ds.total * k * (k - 1) / (peers * (peers - 1))
        res["lose%d_rep_peer_formula" % k] = ds.total * 2 * k * (peers - k) / (peers * (peers - 1))
    t = args.epoch_seconds
    res["reads_per_node_s"] = n / (peers * t)
    res["bytes_per_node_s"] = ds.total / (peers * t)
    res["peer_req_per_node_s"] = (peers - 1) / peers * req.sum() / (peers * t)
    res["peer_req_busiest_s"] = (peers - 1) / peers * res["req_max"] / t
    res["seconds"] = time.time() - t0
    return res


def fmt_loss(v, formula):
    value, half = v
    if half:
        return "%s ±%s (exp. %s)" % (human_bytes(value), human_bytes(half), human_bytes(formula))
    return "%s (exp. %s)" % (human_bytes(value), human_bytes(formula))


def run_tables(args, log):
    datasets = [imagenet_like(1000000, 1), imagenet_like(20000000, 2)]
    datasets += [shard_like(datasets[0].total, 3, "same bytes as the 1M-file set"),
                 shard_like(datasets[1].total, 4, "same bytes as the 20M-file set")]
    results = []
    for ds in datasets:
        req, buffer, piece = requests_per_file(ds.sizes)
        ds.req_total = int(req.sum())
        ds.buffer, ds.piece = buffer, piece
        log("dataset %s: %s, mean %s, cv %.2f, mean name %.1f chars, %d requests/epoch "
            "(receive buffer %s)" % (ds.label, human_bytes(ds.total), human_bytes(ds.total / ds.n),
                                     ds.cv, ds.mean_name, ds.req_total, human_bytes(buffer)))
        for peers in NODES:
            r = cell(ds, peers, args, req)
            results.append((ds, r))
            log("  N=%4d %s: max/mean %s (iid model %.4f [%.4f, %.4f], formula %.4f), "
                "chi2 p=%.2f, %.1f s" % (
                    peers, "exact  " if r["exact"] else "sampled",
                    "%.4f" % r["imbalance"] if "imbalance" in r else "-",
                    r["mc_mean"], r["mc_lo"], r["mc_hi"], r["formula"], r["chi2_p"], r["seconds"]))
    return datasets, results


# ---------------------------------------------------------------------------
# Big files cached by extents (placement.extent_bytes): whose home each
# extent is. Extent k of a file goes to (the file's home + k) mod N
# (HolderOrder in src/remote/rendezvous_hash.h); the alternatives were one
# home per file, or each extent's own name hashed.

EXTENT_BYTES = 4 * MIB
EXTENT_SETS = [("2 token files of 1 TiB", [TIB, TIB]),
               ("64 HDF5 files of 32 GiB", [32 * GIB] * 64),
               ("2 files of 1,000 and 700 MiB (bench/extent_homes.py)",
                [1000 * MIB + 12345, 700 * MIB + 24690])]


def extent_names(file, count):
    return [".monarch/extents/%d/%s/%d" % (EXTENT_BYTES, file, k) for k in range(count)]


def extent_sizes(size):
    count = -(-size // EXTENT_BYTES)
    sizes = np.full(count, EXTENT_BYTES, dtype=np.int64)
    sizes[-1] = size - (count - 1) * EXTENT_BYTES
    return sizes


def extent_cell(files, peers, budget):
    """max/mean home bytes for one set of big files over `peers` nodes: files
    homed whole, extents striped, and extents each hashed by name (exact
    while extents x peers <= budget, else the normal formula)."""
    file_hashes = stable_name_hashes([name for name, _ in files])
    file_homes = top2_homes(file_hashes, peers)[0]
    whole = np.zeros(peers)
    striped = np.zeros(peers)
    all_sizes = []
    for (name, size), home in zip(files, file_homes):
        whole[home] += size
        sizes = extent_sizes(size)
        all_sizes.append(sizes)
        striped += np.bincount((home + np.arange(len(sizes))) % peers, weights=sizes,
                               minlength=peers)
    sizes = np.concatenate(all_sizes)
    mean = sizes.sum() / peers
    res = {"peers": peers, "extents": len(sizes), "whole": whole.max() / mean,
           "striped": striped.max() / mean,
           "hashed_formula": imbalance_formula(len(sizes), peers,
                                               float(sizes.std() / sizes.mean()))}
    if len(sizes) * peers <= budget:
        hashes = stable_name_hashes([n for (name, size) in files
                                     for n in extent_names(name, len(extent_sizes(size)))])
        hashed = np.bincount(top2_homes(hashes, peers)[0], weights=sizes, minlength=peers)
        res["hashed"] = hashed.max() / mean
    return res


def run_extent_tables(args, log):
    budget = 4e8 if not args.exact else 6e9
    rows = []
    for label, sizes in EXTENT_SETS:
        files = [("data/part-%03d.bin" % i, size) for i, size in enumerate(sizes)]
        if label.startswith("2 files of 1,000"):
            files = [("tokens/train-%d.bin" % i, size) for i, size in enumerate(sizes)]
        for peers in NODES:
            started = time.time()
            r = extent_cell(files, peers, budget)
            r["label"] = label
            rows.append(r)
            log("extents %s N=%4d: %d extents, max/mean whole %.3f, striped %.4f, hashed %s "
                "(formula %.3f), %.1f s" % (label, peers, r["extents"], r["whole"], r["striped"],
                                            "%.4f" % r["hashed"] if "hashed" in r else "-",
                                            r["hashed_formula"], time.time() - started))
    return rows


# ---------------------------------------------------------------------------
# Checks against the real code and real runs.

def compile_helpers(args, log):
    bin_dir = os.path.join(args.work, "bin")
    os.makedirs(bin_dir, exist_ok=True)
    lib = os.path.join(args.build, "libmonarch.a")
    if not os.path.exists(lib):
        sys.exit("no %s: build first (see bench/results/scale_model.md)" % lib)
    common = ["g++", "-std=c++17", "-O2", "-I" + os.path.join(args.src, "src"),
              "-I" + os.path.join(args.src, "include")]
    # The library is built in layers (src/*/CMakeLists.txt): libmonarch.a
    # and one archive per layer beside it; the linker takes what it needs.
    layers = sorted(os.path.join(args.build, f) for f in os.listdir(args.build)
                    if f.startswith("libmonarch_") and f.endswith(".a"))
    archives = ["-Wl,--start-group", lib] + layers + ["-Wl,--end-group"]
    out = {}
    for name, libs in (("home_check", []),):
        src = os.path.join(HERE, "scale_model", name + ".cc")
        exe = os.path.join(bin_dir, name)
        cmd = common + [src] + archives + libs + ["-o", exe]
        subprocess.run(cmd, check=True)
        out[name] = exe
    log("compiled %s against %s" % (", ".join(out), lib))
    return out


def check_hash(helpers, extra_names, log):
    ds = imagenet_like(1000000, 1)
    sh = shard_like(20 * TIB, 3, "check")
    names = ds.names(np.random.default_rng(5).choice(ds.n, 2500, replace=False))
    names += sh.names(range(0, sh.n, max(1, sh.n // 1000)))
    names += ["a", "", "ü/ß.jpg", "x" * 300] + list(extra_names)
    names = [s for s in names if "\n" not in s]
    peers = [1, 2, 3, 4, 7, 16, 64, 256, 1024, 4096]
    # Extents: striped homes, and the hash of their names.
    extents = [("tokens/train-%d.bin" % f, k) for f in range(3) for k in range(0, 5000, 37)]
    extent_out = subprocess.run([helpers["home_check"]] + [str(p) for p in peers], check=True,
                                input="".join("%s\t%d\t%d\n" % (f, k, EXTENT_BYTES)
                                              for f, k in extents).encode(),
                                capture_output=True).stdout.decode()
    extent_rows = [line.split("\t") for line in extent_out.splitlines()]
    assert len(extent_rows) == len(extents), (len(extent_rows), len(extents))
    extent_hash = stable_name_hashes([".monarch/extents/%d/%s/%d" % (EXTENT_BYTES, f, k)
                                      for f, k in extents])
    extent_mismatch = int((np.array([int(r[0], 16) for r in extent_rows], dtype=np.uint64)
                           != extent_hash).sum())
    file_hash = stable_name_hashes([f for f, _ in extents])
    for j, p in enumerate(peers):
        striped = (top2_homes(file_hash, p)[0] + np.array([k for _, k in extents])) % p
        extent_mismatch += int((np.array([int(r[1 + j]) for r in extent_rows]) != striped).sum())
    out = subprocess.run([helpers["home_check"]] + [str(p) for p in peers], check=True,
                         input=("\n".join(names) + "\n").encode(),
                         capture_output=True).stdout.decode()
    rows = [line.split("\t") for line in out.splitlines()]
    assert len(rows) == len(names), (len(rows), len(names))
    cpp_hash = np.array([int(r[0], 16) for r in rows], dtype=np.uint64)
    py_hash = stable_name_hashes(names)
    hash_mismatch = int((cpp_hash != py_hash).sum())
    ref_mismatch = sum(stable_name_hash_int(names[i]) != int(py_hash[i])
                       for i in range(0, len(names), 7))
    home_mismatch = runner_up_mismatch = 0
    for j, p in enumerate(peers):
        cpp_home = np.array([int(r[1 + j]) for r in rows])
        first, second = top2_homes(py_hash, p)
        first_x, second_x = top2_homes_exact(py_hash, p)
        home_mismatch += int((cpp_home != first).sum()) + int((cpp_home != first_x).sum())
        runner_up_mismatch += int((second != second_x).sum())
    # The scalar reference against the vectorized one, on a few.
    scalar_mismatch = sum(home_rank_int(int(py_hash[i]), 64) != int(top2_homes(py_hash[i:i + 1],
                                                                             64)[0][0])
                          for i in range(0, len(names), 97))
    result = {"names": len(names), "peer_counts": peers, "hash_mismatches": hash_mismatch,
              "home_mismatches": home_mismatch, "runner_up_mismatches": runner_up_mismatch,
              "scalar_mismatches": ref_mismatch + scalar_mismatch,
              "extents": len(extents), "extent_mismatches": extent_mismatch}
    log("hash check: %d names x %d peer counts: %d hash mismatches, %d home mismatches, "
        "%d runner-up mismatches (fast vs full comparisons), %d scalar-reference mismatches; "
        "%d extents: %d mismatches of hash or striped home" % (
            len(names), len(peers), hash_mismatch, home_mismatch, runner_up_mismatch,
            result["scalar_mismatches"], len(extents), extent_mismatch))
    if (hash_mismatch or home_mismatch or runner_up_mismatch or result["scalar_mismatches"] or
            extent_mismatch):
        sys.exit("the Python hash does not match the C++ one")
    return result


def measure_namespace(args, log):
    """bench_namespace_memory builds the real Namespace over ImageNet-21k-like
    names (those of imagenet_like) and counts its heap and its table; each
    against the model."""
    exe = os.path.join(args.build, "bench", "bench_namespace_memory")
    out = subprocess.run([exe] + [str(n) for n in args.ns_counts], check=True,
                         capture_output=True, text=True).stdout
    rows = []
    for line in out.splitlines():
        m = re.search(r"^(\d+) files .*exact: heap (\d+) B, table (\d+) B, (\d+) name chars, "
                      r"(\d+) directories", line)
        if not m:
            sys.exit("bench_namespace_memory printed an unexpected line: %s" % line)
        n, heap, table, chars, dirs = (int(g) for g in m.groups())
        row = {"files": n, "name_chars": chars, "dirs": dirs, "measured_heap": heap,
               "model_heap": heap_model(n, dirs), "measured_table": table,
               "model_table": table_bytes_model(n, chars, len("/data/imagenet"))}
        rows.append(row)
        log("namespace %d files: heap %d (model %d, %+.3f%%), table %d (model %d)" % (
            n, heap, row["model_heap"], 100 * (row["model_heap"] / heap - 1), table,
            row["model_table"]))
    return rows


def namespace_per_node(ds):
    chars = int(round(ds.mean_name * ds.n))
    table = table_bytes_model(ds.n, chars, 40)
    heap = heap_model(ds.n, len(ds.dirs) + 1)  # The root too.
    return {"table": table, "heap": heap, "homes": HOME_ENTRY * ds.n,
            "ram_slots": RAM_SLOT * ds.n, "chars": chars}


def dataset_listing(root):
    names, sizes = [], []
    for d, _, files in os.walk(root):
        for f in files:
            p = os.path.join(d, f)
            names.append(os.path.relpath(p, root))
            sizes.append(os.path.getsize(p))
    return names, np.array(sizes, dtype=np.int64)


def final_stats(text):
    for line in text.splitlines():
        if line.startswith("stats: "):
            return json.loads(line[len("stats: "):])
    raise RuntimeError("no stats line in:\n" + text)


def write_rank_config(path, dataset, capacity, rank, size, rendezvous):
    with open(path, "w") as f:
        f.write("dataset: {path: %s}\n" % dataset)
        f.write("tiers:\n  - {kind: ram, capacity: %d}\n  - {kind: source}\n" % capacity)
        f.write("remote: {enabled: true, rank: %d, size: %d, rendezvous_dir: %s, "
                "request_timeout: 3s}\n" % (rank, size, rendezvous))


def run_cluster(args, dataset, size, capacities, epochs, tag, leave=None):
    """`size` monarch-epochs processes, one per rank, reading their
    partition of every epoch with barriers. With leave=r, rank r is
    SIGKILLed once every rank has finished epoch 1, and its barrier files
    are supplied for the rest of the run so the others go on."""
    base = os.path.join(args.work, "runs", tag)
    shutil.rmtree(base, ignore_errors=True)
    barriers = os.path.join(base, "barriers")
    os.makedirs(barriers)
    binary = os.path.join(args.build, "monarch-epochs")
    procs = []
    for r in range(size):
        config = os.path.join(base, "rank%d.yaml" % r)
        write_rank_config(config, dataset, capacities[r], r, size, os.path.join(base, "rendezvous"))
        cmd = [binary, "--config", config, "--epochs", str(epochs), "--threads", "2",
               "--partition", "%d/%d" % (r, size), "--barrier-dir", barriers,
               "--json", os.path.join(base, "epochs%d.json" % r)]
        procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True))
    if leave is not None:
        deadline = time.time() + 300
        while not all(os.path.exists(os.path.join(barriers, "end-1.%d" % r)) for r in range(size)):
            if time.time() > deadline:
                raise RuntimeError("epoch 1 did not end")
            time.sleep(0.01)
        procs[leave].send_signal(signal.SIGKILL)
        procs[leave].wait()
        for e in range(2, epochs + 1):
            for name in ("start-%d" % e, "end-%d" % e):
                open(os.path.join(barriers, "%s.%d" % (name, leave)), "w").close()
        open(os.path.join(barriers, "done.%d" % leave), "w").close()
    outs = []
    for r, p in enumerate(procs):
        out, err = p.communicate(timeout=600)
        if r == leave:
            outs.append(None)
            continue
        if p.returncode != 0:
            raise RuntimeError("%s rank %d exited %d:\n%s\n%s" % (tag, r, p.returncode, out, err))
        outs.append({"stats": final_stats(out),
                     "epochs": json.load(open(os.path.join(base, "epochs%d.json" % r)))})
    return outs


def check_runs(args, log):
    dataset = os.path.join(args.work, "ds-%d" % args.check_files)
    if not os.path.isdir(dataset):
        subprocess.run([os.path.join(args.build, "monarch-epochs"), "--dataset", dataset,
                        "--generate", str(args.check_files), "--profile", "imagenet",
                        "--epochs", "0"], check=True, capture_output=True)
    names, sizes = dataset_listing(dataset)
    total = int(sizes.sum())
    hashes = stable_name_hashes(names)
    req, buffer, piece = requests_per_file(sizes)
    checks = {"files": len(names), "total": total, "dataset": dataset, "runs": [],
              "buffer": buffer, "piece": piece}
    for size in args.check_procs:
        first, _ = top2_homes(hashes, size)
        share = np.bincount(first, weights=sizes, minlength=size).astype(np.int64)
        count = np.bincount(first, minlength=size)
        capacity = int(total / size * 1.25)
        t0 = time.time()
        outs = run_cluster(args, dataset, size, [capacity] * size, 2, "n%d" % size)
        elapsed = time.time() - t0
        ranks = []
        for r in range(size):
            st, ep = outs[r]["stats"], outs[r]["epochs"]
            ranks.append({
                "rank": r, "pred_files": int(count[r]), "meas_files": st["remote"]["home_files"],
                "pred_bytes": int(share[r]), "meas_source": st["tiers"][-1]["bytes_read"],
                "meas_source_e1": ep[0]["served"]["source"]["bytes"],
                "meas_source_e2": ep[1]["served"]["source"]["bytes"],
                "peer_e1": ep[0]["served"]["peers"]["bytes"],
                "served_e1": ep[0]["served"]["remote"]["served_for_peers"],
            })
        p = (size - 1) / size
        peer_pred = p * total
        peer_sd = math.sqrt(p * (1 - p) * float((sizes.astype(np.float64) ** 2).sum()))
        req_pred = p * float(req.sum())
        req_sd = math.sqrt(p * (1 - p) * float((req.astype(np.float64) ** 2).sum()))
        mc = iid_imbalance(sizes.astype(np.float64), size, 2000, 5)
        run = {"procs": size, "capacity": capacity, "ranks": ranks, "seconds": elapsed,
               "peer_pred": peer_pred, "peer_sd": peer_sd,
               "peer_meas": sum(x["peer_e1"] for x in ranks),
               "req_pred": req_pred, "req_sd": req_sd,
               "req_meas": sum(x["served_e1"] for x in ranks),
               "imb_meas": max(x["meas_source"] for x in ranks) / (total / size),
               "imb_pred": share.max() / (total / size),
               "imb_formula": imbalance_formula(len(sizes), size, float(sizes.std() / sizes.mean())),
               "imb_mc": (float(mc.mean()), float(np.percentile(mc, 2.5)),
                          float(np.percentile(mc, 97.5)))}
        checks["runs"].append(run)
        log("run N=%d: home files %s (predicted %s); source bytes %s (predicted %s); "
            "epoch-1 peer bytes %d (predicted %.0f ± %.0f); requests %d (predicted %.0f ± %.0f); "
            "%.1f s" % (size, [x["meas_files"] for x in ranks], [x["pred_files"] for x in ranks],
                        [x["meas_source"] for x in ranks], [x["pred_bytes"] for x in ranks],
                        run["peer_meas"], peer_pred, peer_sd, run["req_meas"], req_pred, req_sd,
                        elapsed))
    # One node lost: 4 ranks, rank 3 killed after epoch 1, tiers of each
    # survivor's home share + 2% of T/N (little room for inclusive copies).
    size, leave, epochs = 4, 3, 4
    first, _ = top2_homes(hashes, size)
    share = np.bincount(first, weights=sizes, minlength=size).astype(np.int64)
    capacities = [int(share[r] + 0.02 * total / size) for r in range(size)]
    t0 = time.time()
    outs = run_cluster(args, dataset, size, capacities, epochs, "loss", leave=leave)
    dead = first == leave
    p = (size - 1) / size
    pred = p * float(sizes[dead].sum())
    sd = math.sqrt(p * (1 - p) * float((sizes[dead].astype(np.float64) ** 2).sum()))
    headroom = 0.02 * total / size * (size - 1)
    per_epoch = [sum(outs[r]["epochs"][e]["served"]["source"]["bytes"]
                     for r in range(size) if r != leave) for e in range(epochs)]
    checks["loss"] = {"procs": size, "leave": leave, "epochs": epochs, "dead_share": int(sizes[dead].sum()),
                      "pred": pred, "sd": sd, "headroom": headroom, "per_epoch": per_epoch,
                      "seconds": time.time() - t0,
                      "survivor_share": int(sum(share[r] for r in range(size) if r != leave))}
    log("loss run: survivors' source bytes per epoch %s; dead share %d; predicted per epoch after "
        "the loss %.0f ± %.0f (minus at most %.0f kept in headroom)" % (
            per_epoch, sizes[dead].sum(), pred, sd, headroom))
    # The recorded bench/results/remote_epochs.md run (6000 files, seed 42,
    # RAM tiers of T/N + 5%): whose home share overflowed its tier?
    if len(names) == 6000:
        over = []
        for size in (2, 4):
            first, _ = top2_homes(hashes, size)
            share = np.bincount(first, weights=sizes, minlength=size)
            cap = int(total / size * 1.05)
            over.append((size, [int(s) for s in share], cap,
                         [int(s - cap) for s in share if s > cap]))
        checks["recorded"] = over
        log("recorded remote_epochs run: %s" % over)
    return checks


# ---------------------------------------------------------------------------
# The report.

def chunk_imbalance(sizes, peers, chunk=MIB):
    """The formula's max/mean if files were homed per `chunk`-byte piece."""
    full = sizes // chunk
    tail = sizes % chunk
    n = int(full.sum() + (tail > 0).sum())
    mean = sizes.sum() / n
    second = (full * float(chunk) ** 2 + tail.astype(np.float64) ** 2).sum() / n
    cv = math.sqrt(max(0.0, second / mean ** 2 - 1))
    return n, imbalance_formula(n, peers, cv)


def findings(datasets, results, mem, checks, ns_rows, t, extent_rows=None):
    by = {(ds.label, r["peers"]): r for ds, r in results}
    img1, img20, sh1, sh20 = datasets

    def imb(ds, peers):
        r = by[(ds.label, peers)]
        return r.get("imbalance", r["mc_mean"])

    L = ["## Findings", ""]
    chunks, chunk_imb = chunk_imbalance(sh20.sizes, 4096)
    L.append("- **Home-share imbalance decides the tier headroom**: a node's tiers must hold "
             "max/mean × T/N for every home share to stay in them. Images: %.3f (1M files) "
             "and %.3f (20M) at 256 nodes, %.2f and ~%.3f at 4,096. Shards homed per file: "
             "%.2f (13,428 shards) and %.2f (671 shards) at 256 nodes, %.1f and %.1f at "
             "4,096, where most nodes are home of no shard at all. Homing them per 1 MiB "
             "piece by the hash of each piece's name would make them %s pieces, and "
             "max/mean %.2f at 4,096 nodes (formula); extents above "
             "`placement.extent_threshold` are homed striped instead (below)." % (
                 imb(img1, 256), imb(img20, 256), imb(img1, 4096), imb(img20, 4096),
                 imb(sh20, 256), imb(sh1, 256), imb(sh20, 4096), imb(sh1, 4096),
                 "{:,}".format(chunks), chunk_imb))
    if extent_rows:
        ext = {(r["label"], r["peers"]): r for r in extent_rows}
        tok4, tok4096 = ext[(EXTENT_SETS[0][0], 4)], ext[(EXTENT_SETS[0][0], 4096)]
        h5 = ext[(EXTENT_SETS[1][0], 4096)]
        L.append("- **Big files by extents.** 2 token files of 1 TiB homed whole leave 2 of N "
                 "nodes holding everything (max/mean %.1f at 4 nodes, %.0f at 4,096). By %s "
                 "extents striped round the nodes, max/mean is %.4f at 4 nodes and %.4f at "
                 "4,096 (%.0f extents per node); hashing each extent by its name would give "
                 "%.3f and %.3f. 64 HDF5 files of 32 GiB at 4,096 nodes: %.4f striped, %.3f "
                 "hashed." % (tok4["whole"], tok4096["whole"], human_bytes(EXTENT_BYTES),
                              tok4["striped"], tok4096["striped"], tok4096["extents"] / 4096,
                              tok4.get("hashed", tok4["hashed_formula"]),
                              tok4096.get("hashed", tok4096["hashed_formula"]),
                              h5["striped"], h5.get("hashed", h5["hashed_formula"])))
    if checks and "recorded" in checks:
        over = [(n, ov) for n, _, _, ov in checks["recorded"] if ov]
        if over:
            L.append("- The model explains the recorded 4-process run (`remote_epochs.md`: "
                     "0.1 MiB, one file, read from the PFS after epoch 1 with tiers of "
                     "T/N + 5%%): with that dataset's real names, rank 0's home share is "
                     "%s bytes over its tier." % "{:,}".format(over[0][1][0]))
    r1 = by[(img20.label, 1024)]
    L.append("- **Losing nodes.** One lost node moves exactly its share, ≈T/N (20M files on "
             "1,024 nodes: %s); today the survivors re-read it from the PFS every epoch, "
             "with re-homing once. With 2 homes per file one loss costs no PFS read and ten "
             "cost T·90/(N(N−1)) (%s at 1,024 nodes instead of %s, (N−1)/(k−1) = %.0f× "
             "less), but every node then keeps 2T/N in its tiers." % (
                 human_bytes(r1["lose1_norep_formula"]), human_bytes(r1["lose10_rep_pfs_formula"]),
                 human_bytes(r1["lose10_norep_formula"]), 1023 / 9))
    m1, m20 = mem[img1.label], mem[img20.label]
    L.append("- **Namespace memory does not shrink with N**: every node holds the whole "
             "namespace, ~%.0f B per file with the node service (one table of every name and "
             "stat, shared by the service and its clients, plus 5 B per file of tier slot and "
             "state and 2 B of home: 1M files %s, 20M files %s per node). A process that "
             "builds its own namespace, without the service, holds all of it: 8 such "
             "processes per node would hold %s (20M files)." % (
                 (m20["table"] + m20["heap"] + m20["homes"]) / img20.n,
                 human_bytes(m1["table"] + m1["heap"] + m1["homes"]),
                 human_bytes(m20["table"] + m20["heap"] + m20["homes"]),
                 human_bytes(8 * (m20["table"] + m20["heap"] + m20["homes"]))))
    a, b = by[(img20.label, 4)], by[(img20.label, 4096)]
    L.append("- **Load per node falls as 1/N; the PFS's does not.** For a %g s epoch over "
             "20M images each node serves %s peer requests/s at 4 nodes and %s at 4,096 "
             "(busiest home %s); but epoch 1 reads every file from the PFS once whatever N: "
             "%s opens/s and %s/s for the cluster." % (
                 t, "{:,.0f}".format(a["peer_req_per_node_s"]), "{:,.0f}".format(b["peer_req_per_node_s"]),
                 "{:,.0f}".format(b["peer_req_busiest_s"]), "{:,.0f}".format(img20.n / t),
                 human_bytes(img20.total / t)))
    if checks:
        worst_peer = max(abs(r["peer_meas"] - r["peer_pred"]) / r["peer_sd"] for r in checks["runs"])
        worst_req = max(abs(r["req_meas"] - r["req_pred"]) / r["req_sd"] for r in checks["runs"])
        exact_all = all(x["pred_bytes"] == x["meas_source"] and x["pred_files"] == x["meas_files"]
                        for r in checks["runs"] for x in r["ranks"])
        lo = checks["loss"]
        worst_loss = max(abs(b - lo["pred"]) / lo["sd"] for b in lo["per_epoch"][1:])
        L.append("- **Checked here** with 2, 3 and 4 processes: home files and source bytes "
                 "per rank %s the model's to the byte; peer bytes and peer requests in epoch 1 "
                 "within %.1f and %.1f standard deviations of (N−1)/N of the dataset; after a "
                 "SIGKILLed rank, the survivors' source bytes per epoch within %.1f sd of the "
                 "dead rank's share in their partitions.%s" % (
                     "equal" if exact_all else "DIFFER FROM", worst_peer, worst_req, worst_loss,
                     " Namespace table exact and heap within %.3f%% of the model at 20k-1M "
                     "files." % max(abs(r["model_heap"] / r["measured_heap"] - 1) * 100
                                    for r in ns_rows) if ns_rows else ""))
    L.append("")
    return L

def shown(path):
    """A path as the report shows it: relative to the repository when inside it."""
    rel = os.path.relpath(os.path.realpath(path), os.path.realpath(REPO))
    return path if rel.startswith("..") else rel


def report(args, datasets, results, hash_check, ns_rows, checks, started, argv,
           extent_rows):
    L = []
    t = args.epoch_seconds
    L += ["# Scale model of the peer tier (issue 15)", "",
          "Written by `bench/scale_model.py` (command and run time at the end). Homes come from "
          "the same rendezvous hash as `src/remote/rendezvous_hash.cc` (reimplemented in numpy "
          "and checked name by name against the C++ code); namespace memory from the layout of "
          "the namespace's table (`src/metadata/file_table_format.h`) and its per-file arrays, "
          "checked against the real code; everything is checked against 2-4 process runs of `monarch-epochs` on "
          "this machine at the end.", ""]
    mem = {ds.label: namespace_per_node(ds) for ds in datasets}
    L += findings(datasets, results, mem, checks, ns_rows, t, extent_rows)
    L += ["## Datasets", "",
          "| dataset | files | bytes | mean file | size cv | mean name | peer requests per epoch |",
          "|---|---|---|---|---|---|---|"]
    for ds in datasets:
        L.append("| %s | %s | %s | %s | %.2f | %.1f chars | %s |" % (
            ds.label, "{:,}".format(ds.n), human_bytes(ds.total), human_bytes(ds.total / ds.n), ds.cv,
            ds.mean_name, "{:,}".format(ds.req_total)))
    L += ["",
          "- ImageNet-21k-like: names `train/nXXXXXXXX/nXXXXXXXX_K.JPEG` over 21,841 class "
          "directories; sizes log-normal with sigma 0.45 (as `monarch-epochs --profile imagenet`), "
          "median 99 KiB so the mean is 110 KiB, clamped to [4 KiB, 16 MiB]. Seeded.",
          "- Shard-like: `train/shard-NNNNNN-of-MMMMMM.tfrecord`, sizes uniform in [64, 256] MiB "
          "(mean 160 MiB), as many shards as give the same bytes as the 1M- and 20M-file image "
          "sets (%s and %s): %s and %s shards." % (
              human_bytes(datasets[0].total), human_bytes(datasets[1].total),
              "{:,}".format(datasets[2].n), "{:,}".format(datasets[3].n)),
          "- Requests: a whole-file fetch is read in 1 MiB placement chunks, each one request "
          "up to the receive buffer (`auto` = 95th percentile of sizes: %s for the image sets, "
          "4 MiB for shards), so an image is ~1 request and a shard ~160." % human_bytes(
              datasets[0].buffer), ""]

    L += ["## The model on paper", "",
          "Notation: n files of total size T and mean size s̄ (coefficient of variation cv), N "
          "nodes (one Monarch peer per node, the node service's), epoch time t, k nodes lost, "
          "r homes per file.", "",
          "1. **Namespace memory per node** = M_table + M_heap + M_homes, independent of N, "
          "because every node holds the whole namespace:",
          "   - M_table = n·(20 + 3·8 + 2 + 8·⌈(4n/3 + 1)/8⌉·8/n) + Σ|name| + a 280-byte header "
          "and 8 bytes per 2,048 files, in whole pages: a 20-byte record (name offset, size, mtime), inode, "
          "ctime and atime, a 2-byte index into the stat() fields files share, and lookup "
          "slots of 8 bytes at load 3/4 in lines of 8 (`src/metadata/file_table.h`): ~57 B "
          "per file and the names. One memfd per node, mapped by the service and every client.",
          "   - M_heap = 5·n + 73.5·d: a 4-byte tier slot and a 1-byte placement state per "
          "file, and per directory its name, parent, by-name map entry and stamp (73.5 B "
          "fitted to the measured heap).",
          "   - M_homes = 2·n (`PeerDriver::holders_`, a uint16 per file and home), plus 16·n per RAM tier "
          "(its slot table) - listed apart, it is tier metadata.",
          "2. **Home-share imbalance.** Each file's home is the rank with the highest score, "
          "so with a mixing hash the homes are independent and uniform: node j's home bytes "
          "B_j = Σ s_i·[home_i = j] have mean T/N and standard deviation "
          "(T/N)·√((N−1)(1+cv²)/n). Hence max/mean ≈ 1 + z_N·√((N−1)(1+cv²)/n), z_N = E[max of "
          "N standard normals] (1.03 for N=4, 3.63 for N=4096). It grows like √(N·log N / n): "
          "tiny for images, large for shards, where n/N is a few files per node (there the "
          "normal approximation fails and only the simulation counts).",
          "3. **Bytes moved when k nodes are lost.** Rendezvous hashing keeps every file whose "
          "home survives where it is and gives each lost file to its next-highest-scoring "
          "survivor, so exactly the lost nodes' shares move: Σ_{j lost} B_j ≈ k·T/N. Today "
          "(no re-homing) the survivors read that share from the PFS every epoch; with "
          "re-homing, once. With r = 2 (the top two ranks are the homes), the PFS is read only "
          "for files both of whose homes were lost: T·k(k−1)/(N(N−1)) — zero for k = 1 — and "
          "the files that lost one of their two homes, T·2k(N−k)/(N(N−1)) ≈ 2kT/N, are copied "
          "peer to peer to restore two copies.",
          "4. **Load for an epoch of t seconds.** Each node reads n/(N·t) files/s "
          "(T/(N·t) bytes/s); a fraction (N−1)/N of them live on another node, so each node "
          "sends and, as a home, serves (N−1)/N·R/(N·t) peer requests/s on average, R being the "
          "requests per epoch (one per image, one per MiB of shard). The busiest home serves "
          "max/mean times that (max/mean of its requests, as in 2). In epoch 1 each home also "
          "reads its share B_j from the PFS once; later epochs read nothing from the PFS "
          "while the tiers hold the home shares.", ""]

    L += ["## Tables", "",
          "Cells with n·N ≤ %.1e hash evaluations are computed exactly with the real hash for "
          "every file; larger ones (marked *) use a uniform random sample of the files with "
          "the real hash (for the chi-square test and the loss estimates, ±95%% interval) and "
          "the independent-uniform-homes model the exact cells confirm (Monte-Carlo draws "
          "with all n files). `--exact` computes every cell exactly." % args.budget, ""]
    L += ["### Home-share imbalance (max/mean bytes per node)", "",
          "'Real hash' is the simulated value with every file's home from the real hash; in "
          "brackets, the share of iid-model draws below it (a hash that behaves like "
          "independent uniform homes lands anywhere in 0-100%%, with no trend). The iid "
          "model: %s draws per cell (20 for 20M files, 40 for 1M, 400 for the shard sets); "
          "its mean is the expected max/mean, [min, max] its spread. Formula: point 2 above. "
          "Chi² p: uniformity of the per-node file counts under the real hash "
          "(sample-based for * cells)." % "20-400", "",
          "| dataset | N | files/node | bytes/node (mean) | max/mean, real hash | iid model mean [min, max] | formula | chi² p (home counts) |",
          "|---|---|---|---|---|---|---|---|"]
    for ds, r in results:
        L.append("| %s | %d%s | %s | %s | %s | %.4f [%.4f, %.4f] | %s | %.2f |" % (
            ds.label, r["peers"], "" if r["exact"] else "*", "{:,.1f}".format(ds.n / r["peers"]),
            human_bytes(ds.total / r["peers"]),
            "%.4f (%.0f%%)" % (r["imbalance"], r["percentile"]) if "imbalance" in r
            else "(sampled: see model)",
            r["mc_mean"], r["mc_lo"], r["mc_hi"],
            "%.4f" % r["formula"] if ds.n / r["peers"] >= 30 else "n/N < 30: n/a",
            r["chi2_p"]))
    L += ["", "### Big files cached by extents: home-share imbalance (max/mean bytes per node)", "",
          "Extents of %s (`placement.extent_bytes`), the last one of each file short. "
          "'Whole files': each file homed whole by its name's hash, as without extents. "
          "'Striped' (`HolderOrder` in `src/remote/rendezvous_hash.h`): extent k of a file goes "
          "to (the file's home + k) mod N. 'Each extent hashed': every extent homed by the "
          "hash of its own name (the code until 2026-11-28); exact where extents × N ≤ %.0e, else the formula of point 2 (marked f)." % (
              human_bytes(EXTENT_BYTES), 4e8 if not args.exact else 6e9), "",
          "| files | N | extents/node | whole files | each extent hashed | striped |",
          "|---|---|---|---|---|---|"]
    for r in extent_rows:
        L.append("| %s | %d | %s | %.3f | %s | **%.4f** |" % (
            r["label"], r["peers"], "{:,.1f}".format(r["extents"] / r["peers"]), r["whole"],
            "%.4f" % r["hashed"] if "hashed" in r else "%.4f f" % r["hashed_formula"],
            r["striped"]))
    measured = os.path.join(HERE, "results", "extent_homes.json")
    if os.path.exists(measured):
        # The real 4-peer run of the same 2 files: its home shares are the
        # bytes each rank read from the source.
        run = json.load(open(measured))
        model = {(r["label"], r["peers"]): r for r in extent_rows}[(EXTENT_SETS[2][0], 4)]
        got = {}
        for arm, d in run["arms"].items():
            src = [x["source_bytes"] for x in d["ranks"]]
            got[arm] = max(src) / (sum(src) / len(src))
        L += ["", "Checked by the 4-process run of `bench/extent_homes.py` "
              "(`results/extent_homes.md`, at %s): max/mean home bytes measured %s, "
              "the model %.4f (striped) and %.4f (whole files)." % (
                  run["commit"], ", ".join("%.4f (%s)" % (v, k) for k, v in got.items()),
                  model["striped"], model["whole"])]
    L += ["", "### Bytes moved when nodes are lost", "",
          "Simulated for a random set of lost nodes (seeded); 'exp.' is the formula. 'No "
          "replicas' is what moves to the new homes (today: read from the PFS every epoch; "
          "with re-homing: once). 'r=2 PFS' is what no surviving home holds; 'r=2 peers' what "
          "is copied between peers to restore two homes.", "",
          "| dataset | N | lose 1: no replicas | lose 1: r=2 PFS | lose 10: no replicas | lose 10: r=2 PFS | lose 10: r=2 peers |",
          "|---|---|---|---|---|---|---|"]
    for ds, r in results:
        row = [ds.label, "%d%s" % (r["peers"], "" if r["exact"] else "*"),
               fmt_loss(r["lose1_norep"], r["lose1_norep_formula"]),
               fmt_loss(r["lose1_rep_pfs"], r["lose1_rep_pfs_formula"])]
        if "lose10_norep" in r:
            row += [fmt_loss(r["lose10_norep"], r["lose10_norep_formula"]),
                    fmt_loss(r["lose10_rep_pfs"], r["lose10_rep_pfs_formula"]),
                    fmt_loss(r["lose10_rep_peer"], r["lose10_rep_peer_formula"])]
        else:
            row += ["-", "-", "-"]
        L.append("| " + " | ".join(row) + " |")
    L += ["", "### Load per node for an epoch of %g s, and namespace memory per node" % t, "",
          "Rates scale as 1/t. Peer requests: sent = served on average; 'busiest' is the home "
          "with the most requests. Memory: node-service layout (one table per node), the "
          "same for every N.", "",
          "| dataset | N | files read/node/s | MiB/s read per node | peer requests/node/s (mean) | busiest home, requests/s | namespace + homes per node |",
          "|---|---|---|---|---|---|---|"]
    for ds, r in results:
        m = mem[ds.label]
        L.append("| %s | %d | %s | %s | %s | %s | %s |" % (
            ds.label, r["peers"], "{:,.1f}".format(r["reads_per_node_s"]),
            "{:,.1f}".format(r["bytes_per_node_s"] / MIB), "{:,.1f}".format(r["peer_req_per_node_s"]),
            "{:,.1f}".format(r["peer_req_busiest_s"]),
            human_bytes(m["table"] + m["heap"] + m["homes"])))
    L += ["", "### Namespace memory per node, by part", "",
          "| dataset | table (shared) | heap | homes | total per node | RAM tier slot table |",
          "|---|---|---|---|---|---|"]
    for ds in datasets:
        m = mem[ds.label]
        tot = m["table"] + m["heap"] + m["homes"]
        L.append("| %s | %s (%.0f B/file) | %s | %s | %s (%.0f B/file) | %s |" % (
            ds.label, human_bytes(m["table"]), m["table"] / ds.n, human_bytes(m["heap"]),
            human_bytes(m["homes"]), human_bytes(tot), tot / ds.n, human_bytes(m["ram_slots"])))
    L += ["", "Without the node service every process (e.g. 8 per node) that builds its own "
          "namespace holds its own table, heap and homes: multiply the total by the processes per node. Not modelled: the "
          "walk's lists while a namespace is built (`startup.md` keeps the namespace on the "
          "node, so the next job does not walk), and a process that lists directories "
          "indexes every base name once (`NamespaceView::directories()`).", ""]

    L += ["## Checks against the real code and real runs", ""]
    if hash_check:
        L += ["**Hash.** `bench/scale_model/home_check.cc` (linked with `%s`) "
              "printed StableNameHash and HomeRank for %d names (image-like, shard-like, the "
              "%s check dataset's own names, and edge cases: empty, one byte, UTF-8, 300 bytes) "
              "and N ∈ %s: %d hash mismatches and %d home mismatches against the numpy "
              "versions (the fast packed-score one the tables use and the full 64-bit one); "
              "the two agree on the runner-up rank too (%d mismatches), and the pure-Python "
              "scalar reference agrees with both (%d mismatches)." % (
                  shown(os.path.join(args.build, "libmonarch.a")), hash_check["names"], "{:,}-file".format(checks["files"]) if checks else "",
                  hash_check["peer_counts"], hash_check["hash_mismatches"],
                  hash_check["home_mismatches"], hash_check["runner_up_mismatches"],
                  hash_check["scalar_mismatches"]),
              "It printed, too, the hash of %d extents' names (3 files, extents 0-4,995 in "
              "steps of 37) and their striped homes for the same N: %d mismatches." % (
                  hash_check["extents"], hash_check["extent_mismatches"]), ""]
    if ns_rows:
        L += ["**Namespace memory.** `build/bench/bench_namespace_memory` builds the real "
              "`Namespace` from a listing of the ImageNet-21k-like names above (21,841 class "
              "directories, root `/data/imagenet`), counts every C++ allocation it keeps "
              "(usable size) and the table's bytes:", "",
              "| files | mean name | dirs | table measured | table model | heap measured | heap model | error |",
              "|---|---|---|---|---|---|---|---|"]
        for r in ns_rows:
            L.append("| {:,} | {:.1f} chars | {:,} | {:,} | {:,} | {:,} | {:,.0f} | {:+.3f}% |".format(
                r["files"], r["name_chars"] / r["files"], r["dirs"], r["measured_table"],
                r["model_table"], r["measured_heap"], r["model_heap"],
                100 * (r["model_heap"] / r["measured_heap"] - 1)))
        L += ["", "`bench/results/namespace_memory.md` measures the same at 20 million files, and "
              "the lookups.", ""]
    if checks:
        L += ["**Runs.** Dataset: `monarch-epochs --generate %d --profile imagenet` (seed 42; "
              "%s; receive buffer %s, pieces of %s). N `monarch-epochs` processes on this "
              "machine, each a peer with a RAM tier over the plain source directory, reading "
              "its 1/N partition of each shuffled epoch (`--partition`, barriers), 2 epochs. "
              "Tiers of 1.25·T/N, so every home share fits. Predicted = the model's homes for "
              "the dataset's real names and sizes." % (
                  checks["files"], human_bytes(checks["total"]), human_bytes(checks["buffer"]),
                  human_bytes(checks["piece"])), "",
              "| N | rank | home files: predicted / measured | home share = source bytes: predicted / measured | source bytes epoch 1 / epoch 2 |",
              "|---|---|---|---|---|"]
        for run in checks["runs"]:
            for x in run["ranks"]:
                L.append("| %d | %d | %d / %d | %d / %d %s | %d / %d |" % (
                    run["procs"], x["rank"], x["pred_files"], x["meas_files"], x["pred_bytes"],
                    x["meas_source"], "(equal)" if x["pred_bytes"] == x["meas_source"] else
                    "(**%+d**)" % (x["meas_source"] - x["pred_bytes"]), x["meas_source_e1"],
                    x["meas_source_e2"]))
        L += ["", "| N | max/mean home bytes: measured / model (real hash) / iid 95% range / formula | epoch-1 peer bytes, all ranks: measured / predicted (N−1)/N·T ± 1 sd | epoch-1 peer requests served: measured / predicted ± 1 sd |",
              "|---|---|---|---|"]
        for run in checks["runs"]:
            L.append("| %d | %.4f / %.4f / [%.4f, %.4f] / %.4f | %s / %s ± %s (%+.1f sd) | %d / %.0f ± %.0f (%+.1f sd) |" % (
                run["procs"], run["imb_meas"], run["imb_pred"], run["imb_mc"][1], run["imb_mc"][2],
                run["imb_formula"], "{:,}".format(run["peer_meas"]),
                "{:,.0f}".format(run["peer_pred"]), "{:,.0f}".format(run["peer_sd"]),
                (run["peer_meas"] - run["peer_pred"]) / run["peer_sd"], run["req_meas"],
                run["req_pred"], run["req_sd"], (run["req_meas"] - run["req_pred"]) / run["req_sd"]))
        lo = checks["loss"]
        L += ["", "**A node lost.** 4 ranks, tiers of each survivor's predicted home share + "
              "2%% of T/N; rank %d is SIGKILLed when every rank has finished epoch 1, and the "
              "others read epochs 2-%d. Its files move to new homes (re-homing), but tiers "
              "sized to the survivors' own shares have room for few of them, so the model says the "
              "survivors read the dead rank's share (%s) from the source every epoch — the "
              "(N−1)/N of it in their partitions (the dead rank's own partition is not read "
              "here): %s ± %s per epoch, less whatever inclusive copies fit in the 2%% "
              "headroom (at most %s). Measured source bytes per epoch (survivors): %s; epoch "
              "1 = the survivors' own shares (%s predicted)." % (
                  lo["leave"], lo["epochs"], "{:,}".format(lo["dead_share"]),
                  "{:,.0f}".format(lo["pred"]), "{:,.0f}".format(lo["sd"]),
                  "{:,.0f}".format(lo["headroom"]), ", ".join("{:,}".format(b) for b in lo["per_epoch"]),
                  "{:,}".format(lo["survivor_share"])), ""]
        if "recorded" in checks:
            L += ["**The recorded run** (`bench/results/remote_epochs.md`, the same 6,000 "
                  "files, RAM tiers of T/N + 5%%): the model gives these home shares: %s. %s" % (
                      "; ".join("N=%d: %s (tier %s)" % (n, ", ".join("{:,}".format(s) for s in sh),
                                                        "{:,}".format(cap))
                                for n, sh, cap, _ in checks["recorded"]),
                      " ".join("At N=%d, %s over its tier by %s bytes." % (
                          n, "one home is" if len(ov) == 1 else "%d homes are" % len(ov),
                          ", ".join("{:,}".format(v) for v in ov))
                               for n, _, _, ov in checks["recorded"] if ov) or
                      "No home exceeds its tier."), ""]
    commit = subprocess.run(["git", "-C", args.src, "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "-C", args.src, "status", "--porcelain", "--", "src",
                            "include", "bench/scale_model.py", "bench/scale_model"],
                           capture_output=True, text=True).stdout.strip()
    L += ["## Commands", "",
          "Run at %s%s." % (commit or "(not a git tree)",
                            " with uncommitted changes to the code it measures" if dirty else ""),
          "",
          "```sh",
          "cmake -S . -B build -DCMAKE_BUILD_TYPE=Release && cmake --build build -j2   # if build/ is missing",
          ".venv/bin/python bench/scale_model.py %s" % " ".join(argv),
          "```", "",
          "It compiles `bench/scale_model/home_check.cc` with g++ "
          "against `%s` into `%s/bin`, keeps the "
          "check dataset under `%s`, and runs the processes itself (no root needed). This "
          "run took %.0f s on this 2-core machine (load average %.1f at the end: other "
          "jobs shared the cores)." % (
              shown(os.path.join(args.build, "libmonarch.a")), args.work, args.work,
              time.time() - started, os.getloadavg()[0]), ""]
    note = os.path.join(args.src, "SNAPSHOT")
    if os.path.realpath(args.src) != os.path.realpath(REPO) and os.path.exists(note):
        L += [open(note).read().strip(), ""]
    return "\n".join(L)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.path.join(REPO, "build"),
                    help="a Release build: libmonarch.a and monarch-epochs")
    ap.add_argument("--src", default=REPO,
                    help="the source tree --build was built from (its src/ and include/)")
    ap.add_argument("--work", default="/var/tmp/monarch-scale-model")
    ap.add_argument("--budget", type=float, default=6e9,
                    help="hash evaluations (files x nodes) above which a cell is sampled")
    ap.add_argument("--exact", action="store_true", help="no sampling (slow: ~10 min more)")
    ap.add_argument("--epoch-seconds", type=float, default=300)
    ap.add_argument("--check-files", type=int, default=6000)
    ap.add_argument("--check-procs", type=int, nargs="+", default=[2, 3, 4])
    ap.add_argument("--skip-runs", action="store_true")
    ap.add_argument("--skip-namespace", action="store_true")
    ap.add_argument("--skip-hash-check", action="store_true")
    ap.add_argument("--out", default=os.path.join(REPO, "bench", "results", "scale_model.md"))
    args = ap.parse_args()
    args.ns_counts = [20000, 100000, 1000000]
    started = time.time()

    def log(msg):
        print("[%6.1f s] %s" % (time.time() - started, msg), flush=True)

    os.makedirs(args.work, exist_ok=True)
    helpers = None
    if not (args.skip_runs and args.skip_hash_check):
        helpers = compile_helpers(args, log)
    checks = None if args.skip_runs else check_runs(args, log)
    hash_check = None
    if not args.skip_hash_check:
        extra = []
        if checks:
            extra = dataset_listing(checks["dataset"])[0]
        hash_check = check_hash(helpers, extra, log)
    ns_rows = None if args.skip_namespace else measure_namespace(args, log)
    datasets, results = run_tables(args, log)
    extent_rows = run_extent_tables(args, log)
    text = report(args, datasets, results, hash_check, ns_rows, checks, started,
                  sys.argv[1:], extent_rows)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
        log("wrote %s" % args.out)
    print(text)


if __name__ == "__main__":
    main()
