#!/usr/bin/env python3
"""One TensorFlow input pipeline, timed epoch by epoch: the TF setups of
bench/suite/run_suite.py. Run by the suite under <repo>/.venv/bin/python, one
process per setup (the plugin keeps one Monarch instance per process).

Setups (the directory given by --data decides PFS or local copy):
  tf-vanilla-pfs / tf-vanilla-local   plain paths
  tf-vanilla-caching                  plain paths + dataset.cache(--cache-file)
  tf-monarch                          monarch:// paths (--config, the plugin)

Pipelines (the generated files are random bytes, so nothing is decoded):
  imagenet  file names shuffled per epoch -> tf.io.read_file (--threads in
            parallel), like a JPEG pipeline before decoding
  shards    shard names shuffled per epoch -> FixedLengthRecordDataset
            (64 KiB records, --read-size byte reads, --threads shards read
            in parallel), the I/O pattern of TFRecordDataset
Both then take the record lengths, batch 256 and prefetch.

Epoch boundaries: before every epoch (after the previous epoch and, for
tf-monarch, after waiting for background placement) the reader writes one
byte to MONARCH_SUITE_HOOK_REQ_FD and waits for one on
MONARCH_SUITE_HOOK_ACK_FD (run_suite.py's run_hooked), so the suite reads
and resets the PFS emulator's counters at exact epoch boundaries. Then
it drops the page cache (--drop-caches) and times the epoch.

Writes a JSON list of epochs to --json, in the shape monarch-epochs writes
(seconds, bytes, served per tier for tf-monarch) plus settle_seconds.
"""

import argparse
import json
import os
import random
import sys
import time

RECORD_BYTES = 64 * 1024


def boundary():
    req = os.environ.get("MONARCH_SUITE_HOOK_REQ_FD")
    ack = os.environ.get("MONARCH_SUITE_HOOK_ACK_FD")
    if req is None or ack is None:
        return
    os.sync()
    os.write(int(req), b"s")
    os.read(int(ack), 1)


def drop_caches():
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--setup", required=True,
                    choices=["tf-vanilla-pfs", "tf-vanilla-local", "tf-vanilla-caching",
                             "tf-monarch"])
    ap.add_argument("--data", required=True, help="dataset directory (PFS path or local copy)")
    ap.add_argument("--profile", required=True, choices=["imagenet", "shards"])
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--threads", type=int, default=4)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--read-size", type=int, default=256 * 1024)
    ap.add_argument("--cache-file", default=None)
    ap.add_argument("--config", default=None, help="Monarch YAML (tf-monarch)")
    ap.add_argument("--plugin", default=None, help="libmonarch_tf_plugin.so (tf-monarch)")
    ap.add_argument("--drop-caches", action="store_true")
    ap.add_argument("--json", required=True)
    a = ap.parse_args()

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    root = os.path.abspath(a.data)
    monarch_tf = None
    if a.setup == "tf-monarch":
        import monarch_tf
        monarch_tf.configure(a.config)
        monarch_tf.register(a.plugin)
        root = monarch_tf.uri(root)

    # Listing: part of the start-up phase (counted before epoch 1).
    pattern = "*.jpg" if a.profile == "imagenet" else "*.tfrecord"
    files = sorted(tf.io.gfile.glob(root + "/class*/" + pattern))
    if not files:
        sys.exit(f"tf_reader: no files match {root}/class*/{pattern}")
    print(f"{a.setup}: {len(files)} files under {root}", flush=True)

    names = tf.data.Dataset.from_tensor_slices(files).shuffle(
        len(files), seed=a.seed, reshuffle_each_iteration=True)
    if a.profile == "imagenet":
        ds = names.map(tf.io.read_file, num_parallel_calls=a.threads, deterministic=False)
    else:
        ds = names.interleave(
            lambda f: tf.data.FixedLengthRecordDataset(f, RECORD_BYTES, buffer_size=a.read_size),
            cycle_length=a.threads, block_length=1, num_parallel_calls=a.threads,
            deterministic=False)
    if a.setup == "tf-vanilla-caching":
        ds = ds.cache(a.cache_file)
    ds = (ds.map(lambda x: tf.cast(tf.strings.length(x), tf.int64))
          .batch(256).map(tf.reduce_sum).prefetch(2))

    def tier_totals():
        return {t["name"]: (t["reads"], t["bytes_read"]) for t in monarch_tf.stats()["tiers"]}

    previous = tier_totals() if monarch_tf else None
    epochs = []
    for epoch in range(1, a.epochs + 1):
        boundary()
        if a.drop_caches:
            drop_caches()
        start = time.perf_counter()
        total = 0
        for batch_bytes in ds:
            total += int(batch_bytes)
        seconds = time.perf_counter() - start
        result = {"epoch": epoch, "seconds": seconds, "bytes": total}
        if monarch_tf:
            now = tier_totals()
            result["served"] = {name: {"reads": now[name][0] - previous[name][0],
                                       "bytes": now[name][1] - previous[name][1]}
                                for name in now}
            settle_start = time.perf_counter()
            monarch_tf.wait_for_placement()
            result["settle_seconds"] = time.perf_counter() - settle_start
            previous = tier_totals()
        print(f"epoch {epoch}: {seconds:.3f} s, {total / 2**20:.1f} MiB"
              + (f", served {result['served']}" if monarch_tf else ""), flush=True)
        epochs.append(result)
    if monarch_tf:
        epochs[-1]["monarch_stats"] = monarch_tf.stats()
    with open(a.json, "w") as f:
        json.dump(epochs, f)


if __name__ == "__main__":
    main()
