"""TensorFlow reading TFRecord files on plain paths (its own POSIX file system).

usage: tfrecords.py write DIR   (shards, one GZIP; pure Python, no TensorFlow, no preload)
       tfrecords.py read DIR    (one line per check)

`read` reads every shard with tf.data.TFRecordDataset (one by one; all
plain shards with num_parallel_reads=2 and a 4 KiB buffer; the GZIP shard),
and every file with tf.io.read_file and tf.io.gfile.GFile (whole, and from
an offset), and lists the directory with tf.io.gfile.glob and stat.
"""

import gzip
import hashlib
import os
import random
import struct
import sys


def _crc32c_table():
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


_TABLE = _crc32c_table()


def crc32c(data):
    c = 0xFFFFFFFF
    table = _TABLE
    for b in data:
        c = table[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


def masked(data):
    c = crc32c(data)
    return ((((c >> 15) | (c << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF


def frame(record):
    length = struct.pack("<Q", len(record))
    return length + struct.pack("<I", masked(length)) + record + struct.pack("<I", masked(record))


def write(directory):
    rng = random.Random(5)
    for shard in range(4):
        records = [rng.randbytes(rng.choice([0, 1, 17, 300, 4093, 4096, 9000, 30000]))
                   for _ in range(30 + 7 * shard)]
        data = b"".join(frame(r) for r in records)
        name = "train-%05d-of-00004.tfrecord" % shard
        if shard == 3:
            data = gzip.compress(data, mtime=0)
            name += ".gz"
        with open(os.path.join(directory, name), "wb") as f:
            f.write(data)
    return 0


def h(data):
    return hashlib.sha256(data).hexdigest()[:32]


def read(directory):
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import tensorflow as tf

    out = []
    names = sorted(os.listdir(directory))
    paths = [os.path.join(directory, n) for n in names]
    plain = [p for p in paths if p.endswith(".tfrecord")]
    for path, name in zip(paths, names):
        kind = "GZIP" if name.endswith(".gz") else ""
        records = [r.numpy() for r in tf.data.TFRecordDataset([path], compression_type=kind)]
        out.append("%s: %d records %d bytes %s" % (name, len(records), sum(map(len, records)),
                                                   h(b"".join(h(r).encode() for r in records))))
    parallel = sorted(h(r.numpy()) for r in tf.data.TFRecordDataset(
        plain, num_parallel_reads=2, buffer_size=4096))
    out.append("parallel, 4 KiB buffer: %d records %s" % (len(parallel),
                                                         h("".join(parallel).encode())))
    for path, name in zip(paths, names):
        whole = tf.io.read_file(path).numpy()
        with tf.io.gfile.GFile(path, "rb") as f:
            gfile = f.read()
            f.seek(len(gfile) // 3)
            middle = f.read(5000)
            where = f.tell()
        out.append("%s: read_file %d %s gfile %s seek %s tell %d stat %d" % (
            name, len(whole), h(whole), h(gfile), h(middle), where,
            tf.io.gfile.stat(path).length))
    globbed = sorted(os.path.basename(p) for p in tf.io.gfile.glob(os.path.join(directory,
                                                                                "*.tfrecord")))
    out.append("glob: %s" % globbed)
    sys.stdout.write("\n".join(out) + "\n")
    return 0


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "write":
        return write(sys.argv[2])
    if len(sys.argv) == 3 and sys.argv[1] == "read":
        return read(sys.argv[2])
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
