"""What the process-level tests (tests/*/*.py) share: the skip exit code,
their failure and logging helpers, `monarch-epochs`' final stats line, and a
dataset of small files with a few large ones."""

import json
import os
import time

SKIP = 77  # ctest's SKIP_RETURN_CODE for these tests.
START = time.monotonic()


class Skip(Exception):
    """The machine cannot run this test (exit SKIP, saying why)."""


class Failure(AssertionError):
    pass


def check(condition, message):
    if not condition:
        raise Failure(message)


def log(*args):
    print("[%8.3f]" % (time.monotonic() - START), *args, flush=True)


def final_stats(output):
    """The stats JSON `monarch-epochs` prints last ("stats: {...}")."""
    for line in output.splitlines():
        if line.startswith("stats: "):
            return json.loads(line[len("stats: "):])
    raise Failure("no stats line in:\n" + output)


def write_dataset(root, count, big_every=10, classes=5):
    """ImageNet-like small files, and every `big_every`-th one of a few MiB
    (so transfers stream); random bytes. Returns {name: size}."""
    sizes = {}
    for i in range(count):
        size = 3 * 1024 * 1024 + 12345 if i % big_every == 0 else 20000 + (i * 7919) % 150000
        name = "class%d/img%04d.bin" % (i % classes, i)
        path = os.path.join(root, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(os.urandom(size))
        sizes[name] = size
    return sizes
