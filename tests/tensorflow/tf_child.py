"""Child processes for the TensorFlow plugin tests.

The plugin keeps one Monarch instance per process, configured at the first
monarch:// access, so every scenario that needs its own config runs here in a
fresh interpreter:  python tf_child.py SCENARIO '{"json": "args"}'.
The child prints one line "RESULT <json>" on stdout; the pytest side asserts
on it and on the exit code (a clean interpreter exit is part of every test).
"""

import hashlib
import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import monarch_tf  # noqa: E402

IMAGE_SIDE = 28
NUM_CLASSES = 10


def emit(result):
    print("RESULT " + json.dumps(result), flush=True)


def dataset_bytes(root):
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(root) for f in fs)


# ---------------------------------------------------------------------------
# Data generation (plain paths only; no plugin).

def write_tfrecords(path, records):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with tf.io.TFRecordWriter(path) as writer:
        for record in records:
            writer.write(record)


def gen_records(args):
    """A few small-record files plus big shards of random-size records."""
    rng = np.random.default_rng(1234)
    root = args["root"]
    for i in range(args["small_files"]):
        sizes = rng.integers(1, 300, size=args["small_records"])
        write_tfrecords(os.path.join(root, "small", f"part-{i}.tfrecord"),
                        [rng.bytes(int(s)) for s in sizes])
    for i in range(args["big_shards"]):
        records, total = [], 0
        while total < args["big_shard_bytes"]:
            size = int(rng.integers(1, 256 << 10))
            records.append(rng.bytes(size))
            total += size
        write_tfrecords(os.path.join(root, "big", f"shard-{i}.tfrecord"), records)
    emit({"bytes": dataset_bytes(root)})


def mnist_like_example(image, label):
    feature = {
        "image": tf.train.Feature(bytes_list=tf.train.BytesList(value=[image.tobytes()])),
        "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[int(label)])),
    }
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


def gen_mnist(args):
    """Synthetic MNIST: noisy copies of one random blob per class, in equal
    files of fixed-size records (so half the capacity holds half the files)."""
    rng = np.random.default_rng(7)
    prototypes = rng.random((NUM_CLASSES, IMAGE_SIDE, IMAGE_SIDE)) > 0.7
    for f in range(args["files"]):
        records = []
        for _ in range(args["records_per_file"]):
            label = rng.integers(NUM_CLASSES)
            noise = rng.normal(0, 60, (IMAGE_SIDE, IMAGE_SIDE))
            image = np.clip(prototypes[label] * 160 + 40 + noise, 0, 255).astype(np.uint8)
            records.append(mnist_like_example(image, label))
        write_tfrecords(os.path.join(args["root"], f"train-{f:02d}.tfrecord"), records)
    emit({"bytes": dataset_bytes(args["root"])})


def gen_tree(args):
    """Nested directories, a name with spaces and a tiny image-folder dataset."""
    root = args["root"]
    files = {
        "top.txt": b"top level\n",
        "a/one.bin": bytes(range(256)) * 40,
        "a/b/two.txt": b"two\n",
        "a/b/c/deep file.txt": b"deep " * 1000,
        "with space/file with spaces.txt": b"spaces are fine\n",
        "empty.bin": b"",
    }
    for name, data in files.items():
        os.makedirs(os.path.dirname(os.path.join(root, name)) or root, exist_ok=True)
        with open(os.path.join(root, name), "wb") as f:
            f.write(data)
    rng = np.random.default_rng(3)
    for cls in ("class a", "class_b"):
        os.makedirs(os.path.join(root, "images", cls))
        for i in range(3):
            image = rng.integers(0, 255, (8, 8, 3), dtype=np.uint8)
            png = tf.io.encode_png(image).numpy()
            with open(os.path.join(root, "images", cls, f"img{i}.png"), "wb") as f:
                f.write(png)
    emit({"bytes": dataset_bytes(root)})


# ---------------------------------------------------------------------------
# Scenarios that read through the plugin.

def record_digests(files, parallel):
    """sha1 of every record of `files`, read by `parallel` interleaved readers."""
    ds = tf.data.Dataset.from_tensor_slices(files).interleave(
        tf.data.TFRecordDataset, cycle_length=parallel, block_length=4,
        num_parallel_calls=parallel, deterministic=True)
    return [hashlib.sha1(r.numpy()).hexdigest() for r in ds]


def read_records(args):
    root = args["root"]
    plain = sorted(tf.io.gfile.glob(os.path.join(root, "*", "*.tfrecord")))
    expected = record_digests(plain, args["parallel"])
    monarch_tf.register()
    # list_files exercises the plugin's glob; sorted to match `plain`.
    files = sorted(f.decode() for f in tf.data.Dataset.list_files(
        monarch_tf.uri(root) + "/*/*.tfrecord", shuffle=False).as_numpy_iterator())
    epochs = []
    for _ in range(args["epochs"]):
        digests = record_digests(files, args["parallel"])
        monarch_tf.wait_for_placement()
        epochs.append({"equal": digests == expected, "stats": monarch_tf.stats()})
    emit({"records": len(expected), "files": [f[len("monarch://"):] for f in files],
          "plain_files": plain, "epochs": epochs})


def lenet():
    return tf.keras.Sequential([
        tf.keras.Input((IMAGE_SIDE, IMAGE_SIDE, 1)),
        tf.keras.layers.Conv2D(6, 5, padding="same", activation="relu"),
        tf.keras.layers.MaxPooling2D(),
        tf.keras.layers.Conv2D(16, 5, activation="relu"),
        tf.keras.layers.MaxPooling2D(),
        tf.keras.layers.Flatten(),
        tf.keras.layers.Dense(120, activation="relu"),
        tf.keras.layers.Dense(84, activation="relu"),
        tf.keras.layers.Dense(NUM_CLASSES),
    ])


def parse_mnist(record):
    parsed = tf.io.parse_single_example(record, {
        "image": tf.io.FixedLenFeature([], tf.string),
        "label": tf.io.FixedLenFeature([], tf.int64),
    })
    image = tf.reshape(tf.io.decode_raw(parsed["image"], tf.uint8), (IMAGE_SIDE, IMAGE_SIDE, 1))
    return tf.cast(image, tf.float32) / 255.0, parsed["label"]


class StatsPerEpoch(tf.keras.callbacks.Callback):
    """Snapshots Monarch's stats after each epoch, once placement is idle."""

    def __init__(self):
        super().__init__()
        self.snapshots = []

    def on_epoch_end(self, epoch, logs=None):
        monarch_tf.wait_for_placement()
        self.snapshots.append(monarch_tf.stats())


def train(args):
    tf.keras.utils.set_random_seed(42)
    monarch_tf.register()
    files = tf.data.Dataset.list_files(monarch_tf.uri(args["root"]) + "/*.tfrecord",
                                       shuffle=False)
    ds = (files.interleave(tf.data.TFRecordDataset, cycle_length=4,
                           num_parallel_calls=tf.data.AUTOTUNE)
          .map(parse_mnist, num_parallel_calls=tf.data.AUTOTUNE)
          .shuffle(1024, seed=1).batch(64).prefetch(2))
    model = lenet()
    model.compile(optimizer=tf.keras.optimizers.Adam(1e-3),
                  loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    callback = StatsPerEpoch()
    history = model.fit(ds, epochs=args["epochs"], callbacks=[callback], verbose=0)
    emit({"loss": history.history["loss"], "accuracy": history.history["accuracy"],
          "stats": callback.snapshots})


def listing(args):
    """The same tf.io.gfile / Keras queries on plain paths and monarch://."""
    root = args["root"]
    monarch_tf.register()

    def queries(base):
        gfile = tf.io.gfile
        out = {}
        for rel in ["", "a", "a/b", "a/b/c", "with space", "images"]:
            out["listdir " + rel] = sorted(gfile.listdir(os.path.join(base, rel)))
        for rel in ["", "top.txt", "a", "a/b/c/deep file.txt", "with space",
                    "with space/file with spaces.txt", "missing", "a/missing", "a/b/c/missing",
                    "empty.bin"]:
            out["exists " + rel] = gfile.exists(os.path.join(base, rel))
            out["isdir " + rel] = gfile.isdir(os.path.join(base, rel))
        for rel in ["top.txt", "a/one.bin", "a/b/c/deep file.txt",
                    "with space/file with spaces.txt", "empty.bin"]:
            path = os.path.join(base, rel)
            st = gfile.stat(path)
            # TensorFlow's own POSIX filesystem reports whole seconds.
            out["stat " + rel] = [st.length, st.is_directory, st.mtime_nsec // 10**9]
            with gfile.GFile(path, "rb") as f:
                out["sha " + rel] = hashlib.sha1(f.read()).hexdigest()
            out["read_file " + rel] = hashlib.sha1(tf.io.read_file(path).numpy()).hexdigest()
        out["stat dir"] = gfile.stat(os.path.join(base, "a")).is_directory
        for pattern in ["*", "*/*", "a/*/*", "a/b/c/*.txt", "with space/*spaces*", "*/*/*/*",
                        "a/?ne.bin", "images/class*/*.png", "nomatch*", "[at]*", "a/[^o]*",
                        "images/*/img[0-1].png", "top.txt", "a", "missing/*"]:
            out["glob " + pattern] = sorted(
                p[len(base):] for p in gfile.glob(os.path.join(base, pattern)))
        out["walk"] = sorted([d[len(base):], sorted(ds), sorted(fs)]
                             for d, ds, fs in gfile.walk(base))
        images = tf.keras.utils.image_dataset_from_directory(
            os.path.join(base, "images"), image_size=(8, 8), batch_size=None, shuffle=False)
        out["keras images"] = [[hashlib.sha1(x.numpy().tobytes()).hexdigest(), int(y)]
                               for x, y in images]
        return out

    plain = queries(root)
    monarch = queries(monarch_tf.uri(root))

    errors = {}
    for name, path in [("missing", "/missing.bin"), ("outside", "/../outside.txt"),
                       ("directory", "/a")]:
        try:
            tf.io.gfile.GFile(monarch_tf.uri(root) + path, "rb").read()
            errors[name] = "no error"
        except tf.errors.OpError as e:
            errors[name] = type(e).__name__
    try:
        list(tf.data.TFRecordDataset(monarch_tf.uri(root) + "/nope.tfrecord"))
        errors["tfrecord"] = "no error"
    except tf.errors.OpError as e:
        errors["tfrecord"] = type(e).__name__
    errors["outside exists"] = tf.io.gfile.exists(monarch_tf.uri(os.path.dirname(root)))
    # The dataset was configured through a symlink; both spellings must work.
    errors["via symlink"] = tf.io.gfile.exists(monarch_tf.uri(args["link"]) + "/a/b/two.txt")
    emit({"plain": plain, "monarch": monarch, "errors": errors, "stats": monarch_tf.stats()})


def bad_config(args):
    """Every access fails with the same clear error; nothing crashes."""
    monarch_tf.register()
    path = monarch_tf.uri(args["root"]) + "/top.txt"
    attempts = []
    for access in (lambda: tf.data.Dataset.list_files(path),
                   lambda: tf.io.gfile.glob(path + "*"),
                   lambda: tf.io.gfile.exists(path),
                   lambda: tf.io.gfile.GFile(path, "rb").read(),
                   lambda: list(tf.data.TFRecordDataset(path)),
                   monarch_tf.stats):
        try:
            access()
            attempts.append(["no error", ""])
        except tf.errors.OpError as e:
            attempts.append([type(e).__name__, e.message])
    emit({"attempts": attempts})


def exit_while_reading(args):
    """Leaves parallel readers and prefetching running at interpreter exit."""
    monarch_tf.register()
    files = sorted(tf.io.gfile.glob(monarch_tf.uri(args["root"]) + "/*/*.tfrecord"))
    ds = (tf.data.Dataset.from_tensor_slices(files)
          .interleave(tf.data.TFRecordDataset, cycle_length=4, num_parallel_calls=4)
          .repeat().prefetch(64))
    iterator = iter(ds)
    for _ in range(50):
        next(iterator)
    emit({"read": 50})
    # Keep `iterator` alive: its background threads are still reading when
    # the interpreter finalizes and the plugin's atexit close runs.
    globals()["_keep"] = iterator


SCENARIOS = {f.__name__: f for f in (gen_records, gen_mnist, gen_tree, read_records, train,
                                    listing, bad_config, exit_while_reading)}

if __name__ == "__main__":
    SCENARIOS[sys.argv[1]](json.loads(sys.argv[2]))
