"""What the process-level tests (tests/*/*.py) share: the skip exit code,
their failure and logging helpers, `monarch-epochs`' final stats line, a
dataset of small files with a few large ones, and the PFS emulator."""

import json
import os
import subprocess
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


def write_random_files(root, sizes):
    """Writes each {name: size} under `root`, random bytes. Returns `sizes`."""
    for name, size in sizes.items():
        path = os.path.join(root, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(os.urandom(size))
    return sizes


def write_dataset(root, count, big_every=10, classes=5):
    """ImageNet-like small files, and every `big_every`-th one of a few MiB
    (so transfers stream); random bytes. Returns {name: size}."""
    return write_random_files(root, {
        "class%d/img%04d.bin" % (i % classes, i):
            3 * 1024 * 1024 + 12345 if i % big_every == 0 else 20000 + (i * 7919) % 150000
        for i in range(count)})


class PfsEmulator:
    """tools/pfs_emulator over `backing`, mounted at `mount`: a FUSE file
    system that counts every metadata operation. `started` is False (and
    `error` says why) when it cannot mount."""

    def __init__(self, script, backing, mount, latency_us, read_latency_us=0, bandwidth_mbps=0):
        self.script = script
        self.mount = mount
        os.makedirs(mount, exist_ok=True)
        r = subprocess.run([script, "start", backing, mount, "--meta-latency-us", str(latency_us),
                            "--read-latency-us", str(read_latency_us),
                            "--bandwidth-mbps", str(bandwidth_mbps)],
                           capture_output=True, text=True, timeout=60)
        self.started = r.returncode == 0
        self.error = r.stdout + r.stderr

    def counters(self):
        r = subprocess.run([self.script, "stats", self.mount], capture_output=True, text=True,
                           timeout=60, check=True)
        return json.loads(r.stdout)["counters"]

    def snapshot_at_epoch_1(self, path):
        """A `monarch-epochs --before-epoch` command that saves the counters
        to `path` right before epoch 1: after start-up, before any read."""
        return "[ \"$MONARCH_EPOCH\" != 1 ] || %s stats %s > %s" % (self.script, self.mount, path)

    def reset(self):
        subprocess.run([self.script, "reset", self.mount], capture_output=True, timeout=60,
                       check=True)

    def stop(self):
        subprocess.run([self.script, "stop", self.mount], capture_output=True, timeout=60)
