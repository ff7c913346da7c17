#!/usr/bin/env python3
"""Real programs under the LD_PRELOAD library (libmonarch_preload.so).

Every program runs twice, with `LD_PRELOAD=<the .so> MONARCH_CONFIG=<job.yaml>`
and without, and its output must be byte-identical; the preloaded run must
also have gone through Monarch (the node service's counters grew). Each
scenario has its own dataset, runtime directory and service, always stopped
at the end:

  tools          cat, md5sum, cp -r / -a / --sparse, dd with odd block sizes
                 and skips (and iflag=direct), tar cf - of the dataset (also
                 -S), head/tail -c, od, wc, stat, ls, cmp, grep -r, find
                 -exec, gzip, redirects the shell opens (also children that
                 share the shell's offset: { head -c N; cat; } < file); the
                 service auto-started by the first of them; every file read
                 from the source once for all of them.
  python-basics  open().read(), readinto, seek/tell, SEEK_DATA/SEEK_HOLE,
                 os.pread/readv/preadv/lseek, dup, fdopen, sendfile, flock,
                 a forked child's pread, mmap, pathlib, text mode, threads
                 (also sharing one descriptor), shutil.copyfile,
                 numpy.fromfile and numpy.load (.npy, mmap_mode, .npz); then
                 child processes (subprocess, posix_spawn) given a dataset
                 file as stdin.
  images         Pillow Image.open().load() on JPEG, PNG (and PPM, BMP, TIFF,
                 GIF): decoded pixels and raw bytes.
  hdf5           h5py, contiguous and chunked (gzip, fletcher32, resized)
                 datasets with slicing; default driver, driver="sec2",
                 driver="stdio" (fopen/fread) and a Python file object.
  tensorflow     tf.data.TFRecordDataset (plain, GZIP, parallel reads),
                 tf.io.read_file, tf.io.gfile on plain paths.
  pytorch        a map-style Dataset using open(), DataLoader(num_workers=4)
                 with the fork and the spawn start method.
  counts         (FUSE) over the PFS emulator, 3 epochs each of tools, a
                 Python reader and a PyTorch DataLoader: the source (the
                 emulator's byte counter, and the node's) reads each file
                 once per node; without the preload the same check fails (3x).
  kill-service   the service SIGKILLed mid-epoch: the program finishes with
                 exact bytes; with node.autostart, a new service is started
                 by the program itself.
  untouched      programs that never touch the dataset (including a sibling
                 directory whose name starts with the dataset's): identical
                 output, the same thread count, no service started, no socket
                 connected (strace, when usable).
  bad-config     a missing, malformed or invalid config, or no service with
                 autostart off: plain I/O and exactly one stderr line naming
                 the problem (the YAML key); MONARCH_PRELOAD_STRICT=1: the
                 program fails.

Programs run with MONARCH_PRELOAD_STRICT=1 unless a scenario says otherwise,
so that a preload which silently fell back to plain I/O cannot pass.

usage: preload_programs_test.py --build-dir BUILD [--python PY] [--preload SO]
                                [--dry-run] SCENARIO
--python: the interpreter with NumPy, Pillow, h5py, TensorFlow and PyTorch
(integrations/tensorflow/setup_venv.sh makes <repo>/.venv, the default).
--dry-run: run the "preloaded" programs without LD_PRELOAD, to check the
harness itself: outputs agree by construction, and every check that needs
Monarch to have served the reads is reported (not failed) as one that would
fail.
Exit code: 0 pass, 1 fail, 77 skip (the machine cannot run the scenario).
MONARCH_TEST_KEEP=1 keeps the scenario's files (under /tmp/mpre-*) to look at.
"""

import argparse
import contextlib
import difflib
import hashlib
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
PROGRAMS = os.path.join(HERE, "programs")
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(HERE, "..", "service"))

# The service harness: Failure/Skip/check/log, the service, its lock and stats.
from service_processes_test import (  # noqa: E402
    Failure, Service, Skip, check, lock_held, lock_holder, log, pid_alive,
    stop_service)
from service_processes_test import Env as ServiceEnv  # noqa: E402

SKIP = 77


# --------------------------------------------------------------------------
# The scenario's environment.


class Env(ServiceEnv):
    """service_processes_test's environment, plus the preload library and the interpreter."""

    def __init__(self, args, name):
        super().__init__(args.build_dir, name)
        self.preload = os.path.abspath(args.preload or os.path.join(
            self.build, "integrations", "preload", "libmonarch_preload.so"))
        self.python = args.python or default_python()
        self.dry = args.dry_run
        if not self.dry:
            check(os.path.exists(self.preload),
                  "missing %s (build the target monarch_preload)" % self.preload)
        self.dry_misses = []

    def popen(self, cmd, **kwargs):
        kwargs.setdefault("text", False)  # Programs' outputs are compared as bytes.
        return super().popen(cmd, **kwargs)

    def path(self, *parts):
        return os.path.join(self.work, *parts)


def default_python():
    if os.environ.get("MONARCH_PYTHON"):
        return os.environ["MONARCH_PYTHON"]
    venv = os.path.join(REPO, ".venv", "bin", "python")
    return venv if os.access(venv, os.X_OK) else sys.executable


def need_python(env, modules):
    """The interpreter has every module, or the scenario fails (it is never skipped)."""
    code = "import " + ", ".join(modules)
    r = env.run([env.python, "-c", code], timeout=120,
                env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
    check(r.returncode == 0, "%s cannot `%s` (run integrations/tensorflow/setup_venv.sh):\n%s" % (
        env.python, code, r.stderr.strip()[-2000:]))


class Problems:
    """Failures of independent cases, collected so that one run shows them all."""

    def __init__(self):
        self.items = []

    @contextlib.contextmanager
    def case(self, label):
        try:
            yield
        except Failure as e:
            message = str(e)
            log("FAILED %s" % (message if message.startswith(label) else label + ": " + message))
            self.items.append(message.splitlines()[0] if message else label)

    def check(self):
        check(not self.items, "%d case(s) failed: %s" % (
            len(self.items), "; ".join(i[:300] for i in self.items)))


def expect_monarch(env, condition, message):
    """A check that holds only if the preload really served the reads through Monarch.

    In a dry run (no preload) it is reported, not failed: it shows the check can fail."""
    if condition:
        return
    if env.dry:
        env.dry_misses.append(message)
        log("dry run: would fail: %s" % message)
        return
    raise Failure(message)


# --------------------------------------------------------------------------
# Programs with and without the preload.


class Result:
    def __init__(self, cmd, proc, elapsed):
        self.cmd = cmd
        self.returncode = proc.returncode
        self.stdout = proc.stdout
        self.stderr = proc.stderr
        self.elapsed = elapsed

    def describe(self):
        """One line (exit status and stderr's first line), then stderr's tail."""
        err = self.stderr.decode(errors="replace")
        lines = [line for line in err.splitlines() if line.strip()]
        if lines and lines[0].startswith("Traceback"):
            lines.insert(0, lines.pop())  # Python: the exception first.
        return "exit %s after %.2f s, %d stderr line(s)%s%s" % (
            self.returncode, self.elapsed, len(lines), ": " + lines[0] if lines else "",
            "\n" + err[-1500:] if len(lines) > 1 else "")


def program_env(env, preload, config=None, strict=True, extra=None):
    e = dict(os.environ)
    for k in ("LD_PRELOAD", "MONARCH_CONFIG", "MONARCH_PRELOAD_STRICT", "MONARCH_DATASET"):
        e.pop(k, None)
    e.update({"LC_ALL": "C", "TZ": "UTC", "PYTHONHASHSEED": "0", "TF_CPP_MIN_LOG_LEVEL": "3",
              "PYTHONDONTWRITEBYTECODE": "1", "OMP_NUM_THREADS": "1"})
    if preload:
        if not env.dry:
            e["LD_PRELOAD"] = env.preload
        if config is not None:
            e["MONARCH_CONFIG"] = config
        if strict:
            e["MONARCH_PRELOAD_STRICT"] = "1"
    e.update(extra or {})
    return e


def run_program(env, cmd, preload, config=None, strict=True, cwd=None, extra_env=None,
                timeout=300):
    e = program_env(env, preload, config, strict, extra_env)
    started = time.monotonic()
    try:
        proc = subprocess.run(cmd, cwd=cwd, env=e, capture_output=True, timeout=timeout,
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as ex:
        raise Failure("%s %s did not finish in %d s (%s preload); stderr:\n%s" % (
            " ".join(cmd[:4]), "..." if len(cmd) > 4 else "", timeout,
            "with" if preload else "without",
            (ex.stderr or b"").decode(errors="replace")[-2000:]))
    return Result(cmd, proc, time.monotonic() - started)


def first_difference(a, b):
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def show_difference(label, what, want, got):
    at = first_difference(want, got)
    text = ("%s: %s differ with the preload: %d bytes without, %d with; first difference at "
            "byte %d" % (label, what, len(want), len(got), at))
    try:
        a, b = want.decode().splitlines(), got.decode().splitlines()
    except UnicodeDecodeError:
        a = b = None
    if a is not None and len(a) > 1:
        diff = [line for line in difflib.unified_diff(a, b, "without", "with", n=0, lineterm="")
                if not line.startswith("@@")]
        return text + " (a diff of the lines):\n" + "\n".join(diff[:24])
    return text + ":\n  without: %r\n  with:    %r" % (want[max(0, at - 40):at + 80],
                                                     got[max(0, at - 40):at + 80])


def compare(label, base, pre, stderr=True):
    """The preloaded run did what the plain one did, byte for byte."""
    check(base.returncode == 0, "%s: fails without the preload (test bug): %s" % (
        label, base.describe()))
    check(pre.returncode == base.returncode, "%s: with the preload: %s" % (label, pre.describe()))
    check(pre.stdout == base.stdout, show_difference(label, "stdout", base.stdout, pre.stdout))
    if stderr:
        check(pre.stderr == base.stderr, show_difference(label, "stderr", base.stderr,
                                                         pre.stderr))


def both(env, label, cmd, config, cwd=None, stderr=True, timeout=300, strict=True):
    """Runs cmd without and with the preload and compares; returns (base, pre)."""
    base = run_program(env, cmd, False, cwd=cwd, timeout=timeout)
    pre = run_program(env, cmd, True, config, cwd=cwd, timeout=timeout, strict=strict)
    compare(label, base, pre, stderr)
    return base, pre


# --------------------------------------------------------------------------
# Datasets, configs and the node's counters.


def content(name, size):
    rng = random.Random(hashlib.sha256(name.encode()).digest())
    if name.endswith(".txt"):
        lines = []
        total = 0
        i = 0
        while total < size:
            line = "line %d: %s caf\xe9 %d\n" % (i, "x" * rng.randrange(60), rng.randrange(10**9))
            lines.append(line)
            total += len(line)
            i += 1
        return "".join(lines).encode("latin-1")[:size]
    return rng.randbytes(size)


def mixed_spec(classes=3, per_class=10, big=3 * 2**20 + 123):
    """Edge sizes, nesting, a space in a name, a text file, a big file and a
    directory of image-sized files."""
    spec = [("empty.bin", 0), ("one.bin", 1), ("page-1.bin", 4095), ("page.bin", 4096),
            ("page+1.bin", 4097), ("odd.bin", 65537), ("a/b/c/deep.bin", 12345),
            ("with space.bin", 3000), ("notes.txt", 50_000), ("big.bin", big)]
    rng = random.Random(3)
    for c in range(classes):
        for i in range(per_class):
            spec.append(("train/class%d/img_%03d.bin" % (c, i), rng.randrange(2_000, 120_000)))
    return spec


def make_dataset(root, spec):
    for name, size in spec:
        path = os.path.join(root, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(content(name, size))
    return scan(root)


def scan(root):
    """{relative name: bytes} of every regular file under root (the expected contents)."""
    files = {}
    for dirpath, dirnames, names in os.walk(root):
        dirnames.sort()
        for n in sorted(names):
            path = os.path.join(dirpath, n)
            with open(path, "rb") as f:
                files[os.path.relpath(path, root)] = f.read()
    return files


def total_bytes(files):
    return sum(len(v) for v in files.values())


def sha(data):
    return hashlib.sha256(data).hexdigest()


def write_config(path, dataset, rt, capacity, autostart=False, tiers=None, extra=""):
    tiers = tiers or ["{kind: ram, capacity: %d}" % capacity]
    lines = ["dataset: {path: %s}" % dataset, "tiers:"]
    lines += ["  - " + t for t in tiers]
    # The dataset stands for a PFS, whose files are read once per node: a
    # local directory's files are in the page cache, which `defer` would
    # serve from there (tests/test_read_path.cc covers that).
    lines += ["  - {kind: source}", "placement: {cached_source: promote}",
              "node:", "  shared: true", "  runtime_dir: %s" % rt,
              "  autostart: %s" % ("true" if autostart else "false"), "  idle_exit: 0"]
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n" + extra)
    return path


def service_for(env, dataset, files, name="rt", autostart=False, tiers=None):
    """A config over `dataset` (a RAM tier twice its size) and, unless
    autostart, a running service."""
    rt = env.runtime_dir(name)
    config = write_config(env.path(name + ".yaml"), dataset, rt,
                          max(2 * total_bytes(files), 16 << 20), autostart=autostart, tiers=tiers)
    service = None if autostart else Service(env, config, rt, "serve-" + name)
    return config, rt, service


def node_counters(env, rt, settle=5.0):
    """The node's stats once no client is connected (a client's hits are folded
    into the node's tiers when it leaves), or None if no service answers."""
    if not os.path.exists(os.path.join(rt, "monarch.sock")):
        return None
    deadline = time.monotonic() + settle
    while True:
        r = env.run([env.monarch, "stats", "--json", "--runtime-dir", rt], timeout=30)
        if r.returncode != 0:
            return None
        stats = json.loads(r.stdout)
        if not stats["clients"] or time.monotonic() > deadline:
            return stats["node"]
        time.sleep(0.05)


def served(node):
    """Bytes the node's tiers have read, all tiers (0 without a service)."""
    return sum(t["bytes_read"] for t in node["tiers"]) if node else 0


def source_bytes(node):
    return node["tiers"][-1]["bytes_read"] if node else 0


class Usage:
    """How much the node served across one program run."""

    def __init__(self, env, rt):
        self.env = env
        self.rt = rt
        self.before = served(node_counters(env, rt))

    def delta(self):
        return served(node_counters(self.env, self.rt)) - self.before


# --------------------------------------------------------------------------
# Scenarios.


def scenario_tools(env):
    ds = env.path("ds")
    files = make_dataset(ds, mixed_spec())
    total = total_bytes(files)
    names = list(files)
    log("dataset: %d files, %d bytes" % (len(files), total))
    outside = env.path("outside")
    os.makedirs(outside)
    big = os.path.join(ds, "big.bin")
    big_copy = os.path.join(outside, "big.bin")
    with open(big_copy, "wb") as f:
        f.write(files["big.bin"])
    # No service: the first preloaded program starts it (node.autostart).
    config, rt, _ = service_for(env, ds, files, autostart=True)
    check(not lock_held(rt), "a service runs already")

    reads_all = "reads every file"
    cases = [
        ("cat, absolute paths", ["cat"] + [os.path.join(ds, n) for n in names], None, reads_all),
        ("cat, relative paths from the dataset", ["cat"] + names, ds, reads_all),
        ("md5sum", ["md5sum"] + names, ds, reads_all),
        # The shell opens the file and execs the reader, which the
        # preload hands a real descriptor (the exec has no table): exact
        # bytes, not necessarily through Monarch.
        ("sha256sum < big.bin (a redirect the shell opens)",
         ["sh", "-c", "sha256sum < big.bin; md5sum < empty.bin; cat < notes.txt | wc -l"], ds,
         None),
        # Each child execs with the shell's descriptor: the kernel shares
        # one offset among them (head leaves it right after what it took).
        ("{ head -c 4093; cat; } < big.bin, { head -n 2; cat; } < notes.txt",
         ["sh", "-c", "{ head -c 4093; cat; } < big.bin | md5sum; "
          "{ head -n 2; cat; } < notes.txt | md5sum; "
          "{ head -c 5000 >/dev/null; wc -c; } < odd.bin"],
         ds, None),
        ("dd bs=4093 skip=3 count=300", ["dd", "if=" + big, "bs=4093", "skip=3", "count=300",
                                         "status=none"], None, "reads"),
        ("dd bs=1M", ["dd", "if=" + big, "bs=1M", "status=none"], None, "reads"),
        ("dd ibs=65537 obs=4096 skip=5 count=7", ["dd", "if=" + big, "ibs=65537", "obs=4096",
                                                  "skip=5", "count=7", "status=none"], None,
         "reads"),
        ("dd bs=777 skip=2 to EOF", ["dd", "if=odd.bin", "bs=777", "skip=2", "status=none"], ds,
         "reads"),
        ("dd iflag=skip_bytes,count_bytes skip=12345 count=100000 bs=4093",
         ["dd", "if=" + big, "iflag=skip_bytes,count_bytes", "skip=12345", "count=100000",
          "bs=4093", "status=none"], None, "reads"),
        ("dd skip past EOF", ["dd", "if=page.bin", "bs=4096", "skip=5", "status=none"], ds,
         None),
        ("tar cf - -C <dataset> .", ["tar", "cf", "-", "-C", ds, "."], None, reads_all),
        ("tar --sort=name cf - <dataset> (absolute)", ["tar", "--sort=name", "-cf", "-", ds],
         None, reads_all),
        ("tar -S (sparse: SEEK_DATA/SEEK_HOLE)", ["tar", "-S", "--sort=name", "-cf", "-", "-C",
                                                 ds, "."], None, reads_all),
        ("dd iflag=direct bs=1M", ["dd", "if=" + big, "iflag=direct", "bs=1M", "status=none"],
         None, "reads"),
        ("gzip -c", ["sh", "-c", "gzip -c -n big.bin notes.txt | md5sum"], ds, "reads"),
        ("head -c 1000000 big.bin", ["head", "-c", "1000000", big], None, "reads"),
        ("head -c -4096 big.bin", ["head", "-c", "-4096", big], None, "reads"),
        ("tail -c 70001 big.bin", ["tail", "-c", "70001", big], None, "reads"),
        ("head -c 5, head -n 3", ["sh", "-c", "head -c 5 page+1.bin; head -n 3 notes.txt"], ds,
         "reads"),
        ("od -A d -t x1 -j 100 -N 64", ["od", "-A", "d", "-t", "x1", "-j", "100", "-N", "64",
                                        "odd.bin"], ds, "reads"),
        ("wc -c (sizes)", ["wc", "-c"] + names, ds, None),
        ("wc -l (reads)", ["wc", "-l"] + names, ds, reads_all),
        ("cmp with a copy outside", ["cmp", big, big_copy], None, "reads"),
        ("stat -c", ["stat", "-c", "%n %s %Y %f %F"] + names, ds, None),
        ("ls -lR", ["ls", "-lR", "--time-style=+%s", ds], None, None),
        ("grep -c caf", ["grep", "-c", "caf", "notes.txt"], ds, "reads"),
        ("grep -rc (openat below directory descriptors)", ["grep", "-rc", "--", "caf", "."], ds,
         "reads"),
        ("find -exec md5sum {} +", ["find", ds, "-type", "f", "-exec", "md5sum", "{}", "+"],
         None, "reads"),
        ("xargs sha1sum", ["sh", "-c", "find . -type f -print0 | sort -z | xargs -0 sha1sum"], ds,
         "reads"),
    ]

    def run_case(label, cmd, cwd, reads):
        usage = Usage(env, rt)
        base, pre = both(env, label, cmd, config, cwd=cwd)
        delta = usage.delta()
        log("%-62s %9d bytes out, %.2f s / %.2f s preloaded, node served %d" % (
            label, len(base.stdout), base.elapsed, pre.elapsed, delta))
        if reads == reads_all:
            expect_monarch(env, delta >= total,
                           "%s: the node served %d bytes; the program reads all %d" % (
                               label, delta, total))
        elif reads:
            expect_monarch(env, delta > 0, "%s: the node served nothing" % label)

    # cp: the copies (made by the program, outside the dataset) are the files.
    def run_cp(k, flags, label):
        targets = []
        usage = Usage(env, rt)
        for preload in (False, True):
            target = env.path("cp%d-%d" % (k, preload))
            r = run_program(env, ["cp"] + flags + [ds, target], preload, config)
            check(r.returncode == 0, "%s (%s preload): %s" % (label, "with" if preload else
                                                              "without", r.describe()))
            targets.append(target)
        delta = usage.delta()
        got = scan(targets[1])
        check(scan(targets[0]) == files, "%s without the preload: not the dataset" % label)
        bad = sorted(n for n in set(files) | set(got) if files.get(n) != got.get(n))
        check(not bad, "%s: %d files differ from the dataset with the preload: %s" % (
            label, len(bad), bad[:5]))
        if "-a" in flags:
            for n in names:
                want = os.stat(os.path.join(ds, n))
                have = os.stat(os.path.join(targets[1], n))
                check((want.st_mtime_ns, want.st_mode) == (have.st_mtime_ns, have.st_mode),
                      "%s: %s mtime/mode %s, the source's %s" % (
                          label, n, (have.st_mtime_ns, oct(have.st_mode)),
                          (want.st_mtime_ns, oct(want.st_mode))))
        log("%-62s %d files exact, node served %d" % (label, len(got), delta))
        expect_monarch(env, delta >= total, "%s: the node served %d bytes of %d" % (label, delta,
                                                                                   total))

    problems = Problems()
    for label, cmd, cwd, reads in cases:
        with problems.case(label):
            run_case(label, cmd, cwd, reads)
    for k, flags in enumerate((["-r"], ["-a"], ["-r", "--reflink=never"],
                               ["-r", "--sparse=always"])):
        label = "cp %s <dataset> <dir>" % " ".join(flags)
        with problems.case(label):
            run_cp(k, flags, label)

    node = node_counters(env, rt)
    log("node after %d programs: source read %d bytes (dataset %d), all tiers %d" % (
        len(cases) + 6, source_bytes(node), total, served(node)))
    with problems.case("node counters"):
        expect_monarch(env, node is not None, "no service was auto-started at %s" % rt)
        expect_monarch(env, source_bytes(node) == total,
                       "the source read %d bytes for a dataset of %d: each file once per node" % (
                           source_bytes(node), total))
    problems.check()


def scenario_python_basics(env):
    need_python(env, ["numpy"])
    ds = env.path("ds")
    make_dataset(ds, mixed_spec(classes=2, per_class=5, big=2 * 2**20 + 5))
    r = env.run([env.python, os.path.join(PROGRAMS, "python_basics.py"), "write", ds])
    check(r.returncode == 0, "writing the NumPy files: %s" % r.stderr)
    files = scan(ds)
    total = total_bytes(files)
    log("dataset: %d files, %d bytes" % (len(files), total))
    config, rt, _ = service_for(env, ds, files)
    outs = [env.path("out0"), env.path("out1")]
    for d in outs:
        os.makedirs(d)
    prog = os.path.join(PROGRAMS, "python_basics.py")
    usage = Usage(env, rt)
    base = run_program(env, [env.python, prog, "read", ds, outs[0]], False)
    pre = run_program(env, [env.python, prog, "read", ds, outs[1]], True, config)
    compare("python_basics.py", base, pre)
    delta = usage.delta()
    text = base.stdout.decode()
    # The reference itself is right: whole-file digests are the files'.
    for name, data in files.items():
        want = "%s: read %d %s" % (name, len(data), sha(data))
        check(want in text, "without the preload: no line %r" % want)
    check(scan(outs[0]) == scan(outs[1]), "shutil.copyfile copies differ")
    log("python_basics.py: %d checks, %d bytes of output identical; %.2f s / %.2f s "
        "preloaded; node served %d bytes (dataset %d)" % (
            len(text.splitlines()), len(base.stdout), base.elapsed, pre.elapsed, delta, total))
    problems = Problems()
    with problems.case("reading"):
        expect_monarch(env, delta >= total, "the node served %d bytes; the program reads "
                       "all %d" % (delta, total))
    # Child processes (subprocess, posix_spawn) given a dataset file as stdin.
    with problems.case("children"):
        base, pre = both(env, "python_basics.py children", [env.python, prog, "children", ds],
                         config)
        log("python_basics.py children: identical:\n%s" % base.stdout.decode().rstrip())
    problems.check()


def scenario_images(env):
    need_python(env, ["PIL"])
    ds = env.path("ds")
    os.makedirs(ds)
    prog = os.path.join(PROGRAMS, "images.py")
    r = env.run([env.python, prog, "write", ds])
    check(r.returncode == 0, "writing the images: %s" % r.stderr)
    files = scan(ds)
    total = total_bytes(files)
    log("dataset: %d images, %d bytes (%d JPEG, %d PNG)" % (
        len(files), total, sum(n.endswith(".jpg") for n in files),
        sum(n.endswith(".png") for n in files)))
    config, rt, _ = service_for(env, ds, files)
    usage = Usage(env, rt)
    base, pre = both(env, "images.py", [env.python, prog, "read", ds], config)
    delta = usage.delta()
    text = base.stdout.decode()
    for name, data in files.items():
        check(" raw %d %s" % (len(data), sha(data)) in text, "no raw digest line for " + name)
    check("DIFFERENT" not in text, "decoding from memory differs:\n" + text)
    log("images.py: %d lines identical (pixels and raw bytes of %d files); %.2f s / %.2f s "
        "preloaded; node served %d bytes" % (len(text.splitlines()), len(files), base.elapsed,
                                              pre.elapsed, delta))
    expect_monarch(env, delta >= total, "the node served %d bytes; the program reads all %d" % (
        delta, total))


def scenario_hdf5(env):
    need_python(env, ["h5py", "numpy"])
    ds = env.path("ds")
    os.makedirs(ds)
    prog = os.path.join(PROGRAMS, "hdf5.py")
    r = env.run([env.python, prog, "write", ds])
    check(r.returncode == 0, "writing the HDF5 files: %s" % r.stderr)
    files = scan(ds)
    log("dataset: %s" % ", ".join("%s %d bytes" % (n, len(d)) for n, d in files.items()))
    config, rt, _ = service_for(env, ds, files)
    outputs = {}
    problems = Problems()
    for driver in ("default", "sec2", "stdio", "fileobj"):
        with problems.case("h5py, %s driver" % driver):
            usage = Usage(env, rt)
            base, pre = both(env, "h5py, %s driver" % driver,
                             [env.python, prog, "read", driver, ds], config)
            delta = usage.delta()
            outputs[driver] = base.stdout
            log("h5py %-8s %d lines identical; %.2f s / %.2f s preloaded; node served %d bytes" % (
                driver, len(base.stdout.splitlines()), base.elapsed, pre.elapsed, delta))
            expect_monarch(env, delta > 0, "h5py %s driver: the node served nothing" % driver)
    # Same arrays whichever way the file is read.
    strip = lambda b: re.sub(rb"driver \w+", b"", b)  # noqa: E731
    check(len(set(strip(o) for o in outputs.values())) == 1,
          "the drivers disagree without the preload")
    problems.check()


def scenario_tensorflow(env):
    need_python(env, ["tensorflow"])
    ds = env.path("ds")
    os.makedirs(ds)
    prog = os.path.join(PROGRAMS, "tfrecords.py")
    r = env.run([env.python, prog, "write", ds])
    check(r.returncode == 0, "writing the TFRecord files: %s" % r.stderr)
    files = scan(ds)
    total = total_bytes(files)
    config, rt, _ = service_for(env, ds, files)
    usage = Usage(env, rt)
    # TensorFlow's stderr (absl's start-up lines) is not compared.
    base, pre = both(env, "tf.data.TFRecordDataset", [env.python, prog, "read", ds], config,
                     stderr=False)
    delta = usage.delta()
    text = base.stdout.decode()
    for name, data in files.items():
        check("%s: read_file %d %s" % (name, len(data), sha(data)[:32]) in text,
              "no read_file line for %s" % name)
    log(text.rstrip())
    log("TensorFlow: %d lines identical; %.1f s / %.1f s preloaded; node served %d bytes "
        "(dataset %d)" % (len(text.splitlines()), base.elapsed, pre.elapsed, delta, total))
    expect_monarch(env, delta >= total, "the node served %d bytes; the program reads all %d" % (
        delta, total))


def write_list(path, names):
    with open(path, "w") as f:
        f.write("".join(n + "\n" for n in names))
    return path


def expected_lines(files, names, epochs, fmt):
    return "".join(fmt(e, n, files[n]) for e in range(1, epochs + 1) for n in names).encode()


def torch_line(epoch, name, data):
    return "%d %s %d %s %s\n" % (epoch, name, len(data), sha(data),
                                 sha(data[len(data) // 2:len(data) // 2 + 4096]))


def reader_line(epoch, name, data):
    return "%d %s %d %s\n" % (epoch, name, len(data), sha(data))


def scenario_pytorch(env):
    need_python(env, ["torch"])
    ds = env.path("ds")
    files = make_dataset(ds, mixed_spec(classes=2, per_class=10, big=2**20 + 17))
    total = total_bytes(files)
    names = list(files)
    listing = write_list(env.path("files.txt"), names)
    config, rt, _ = service_for(env, ds, files)
    prog = os.path.join(PROGRAMS, "torch_loader.py")
    problems = Problems()
    # Spawned workers each import torch (seconds on 2 cores): one epoch.
    for method, epochs in (("fork", 2), ("spawn", 1)):
        with problems.case("DataLoader %s" % method):
            usage = Usage(env, rt)
            base, pre = both(env, "DataLoader(num_workers=4, %s)" % method,
                             [env.python, prog, method, ds, listing, str(epochs)], config,
                             stderr=False)
            delta = usage.delta()
            body = base.stdout
            if method == "fork":
                first, body = body.split(b"\n", 1)
                check(first.decode() == "parent: %s %d %s" % (names[0], len(files[names[0]]),
                                                             sha(files[names[0]])),
                      "parent line %r" % first)
            check(body == expected_lines(files, names, epochs, torch_line),
                  "DataLoader %s: items differ from the files (without the preload)" % method)
            workers = pre.stderr.decode(errors="replace").strip().splitlines()[-1:]
            log("DataLoader %-5s %d files x %d epochs identical; %.1f s / %.1f s preloaded "
                "(%s); node served %d bytes" % (method, len(names), epochs, base.elapsed,
                                                pre.elapsed, workers, delta))
            expect_monarch(env, delta >= total, "DataLoader %s: the node served %d bytes; the "
                           "workers read all %d" % (method, delta, total))
    problems.check()


# --- counts: over the PFS emulator.


def start_pfs(env, backing):
    if not os.path.exists("/dev/fuse") or not os.access(env.pfs, os.X_OK):
        raise Skip("no /dev/fuse or no %s" % env.pfs)
    mount = env.path("pfs")
    r = env.run([env.pfs, "start", backing, mount, "--no-delay"], timeout=60)
    if r.returncode != 0:
        raise Skip("pfs-emulator start failed: %s%s" % (r.stdout, r.stderr))
    env.mounts.append(mount)
    return mount


def pfs_counters(env, mount):
    r = env.run([env.pfs, "stats", mount], timeout=60)
    check(r.returncode == 0, "pfs-emulator stats: %s%s" % (r.stdout, r.stderr))
    return json.loads(r.stdout)["counters"]


def pfs_reset(env, mount):
    r = env.run([env.pfs, "reset", mount], timeout=60)
    check(r.returncode == 0, "pfs-emulator reset: %s%s" % (r.stdout, r.stderr))


def read_once_problems(label, pfs_bytes, node_source, total):
    """Why `label` did not read each file from the source exactly once ([] if it did)."""
    problems = []
    if pfs_bytes != total:
        problems.append("%s: the PFS served %d bytes over 3 epochs, %.2fx the dataset (%d); "
                        "want each file once" % (label, pfs_bytes, pfs_bytes / total, total))
    if node_source is not None and node_source != total:
        problems.append("%s: the node's source tier read %d bytes, dataset %d" % (
            label, node_source, total))
    return problems


def scenario_counts(env):
    backing = env.path("backing")
    files = make_dataset(os.path.join(backing, "train"),
                         mixed_spec(classes=2, per_class=10, big=2**20 + 77))
    total = total_bytes(files)
    names = list(files)
    mount = start_pfs(env, backing)
    ds = os.path.join(mount, "train")
    listing = write_list(env.path("files.txt"), names)
    log("dataset on the PFS emulator: %d files, %d bytes" % (len(files), total))
    md5 = "".join("%s  %s\n" % (hashlib.md5(files[n]).hexdigest(), n) for n in names).encode()
    cat_all = sha(b"".join(files[n] for n in names))
    big = "big.bin"
    dd_want = files[big][3 * 4093:3 * 4093 + 100 * 4093]

    def tools_epoch(config, preload, epoch):
        r = run_program(env, ["md5sum"] + names, preload, config, cwd=ds)
        check(r.returncode == 0 and r.stdout == md5, "epoch %d md5sum: %s" % (epoch,
                                                                            r.describe()))
        r = run_program(env, ["cat"] + [os.path.join(ds, n) for n in names], preload, config)
        check(r.returncode == 0 and sha(r.stdout) == cat_all, "epoch %d cat: %s" % (
            epoch, r.describe()))
        r = run_program(env, ["dd", "if=" + big, "bs=4093", "skip=3", "count=100", "status=none"],
                        preload, config, cwd=ds)
        check(r.returncode == 0 and r.stdout == dd_want, "epoch %d dd: %s" % (epoch,
                                                                           r.describe()))

    def python_epoch(config, preload, epoch):
        r = run_program(env, [env.python, os.path.join(PROGRAMS, "reader.py"), "--root", ds,
                              "--list", listing, "--read-size", "65536", "--threads", "2"],
                        preload, config)
        check(r.returncode == 0 and r.stdout == expected_lines(files, names, 1, reader_line),
              "epoch %d reader.py: %s" % (epoch, r.describe()))

    def torch_epochs(config, preload):
        r = run_program(env, [env.python, os.path.join(PROGRAMS, "torch_loader.py"), "fork", ds,
                              listing, "3"], preload, config)
        check(r.returncode == 0, "torch_loader.py: %s" % r.describe())
        body = r.stdout.split(b"\n", 1)[1]
        check(body == expected_lines(files, names, 3, torch_line),
              "torch_loader.py: items differ from the files")

    kinds = [("tools (md5sum, cat, dd)", lambda c, p: [tools_epoch(c, p, e) for e in (1, 2, 3)]),
             ("python (reader.py, a process per epoch)",
              lambda c, p: [python_epoch(c, p, e) for e in (1, 2, 3)])]
    need_python(env, ["torch"])
    kinds.append(("pytorch (DataLoader, 4 forked workers, 3 epochs)", torch_epochs))

    def measure(i, label, body, preload):
        config, rt, service = service_for(env, ds, files, name="rt%d" % i)
        pfs_reset(env, mount)
        started = time.monotonic()
        body(config, preload)
        elapsed = time.monotonic() - started
        counters = pfs_counters(env, mount)
        node = node_counters(env, rt)
        service.stop()
        log("%-50s %s preload: PFS bytes_read %d (%.2fx the dataset), reads %d, opens %d, "
            "metadata ops %d; node source %d; %.1f s" % (
                label, "with" if preload else "without", counters["bytes_read"],
                counters["bytes_read"] / total, counters["reads"], counters["opens"],
                counters["metadata_ops"], source_bytes(node), elapsed))
        return counters["bytes_read"], source_bytes(node) if preload else None

    problems = []
    for i, (label, body) in enumerate(kinds):
        pfs_bytes, node_source = measure(i, label, body, True)
        problems += read_once_problems(label, pfs_bytes, node_source, total)
    # The check can fail: the same Python epochs without the preload read
    # the dataset 3 times.
    pfs_bytes, _ = measure(len(kinds), kinds[1][0], kinds[1][1], False)
    control = read_once_problems("without the preload", pfs_bytes, None, total)
    check(control, "the read-once check passes without the preload (PFS bytes %d)" % pfs_bytes)
    check(pfs_bytes == 3 * total, "without the preload the PFS served %d bytes, not 3 x %d" % (
        pfs_bytes, total))
    log("control: %s" % control[0])
    for p in problems:
        expect_monarch(env, False, p)


# --- mapping: big files mapped, a few pages read, over the PFS emulator.


def scenario_mapping(env):
    need_python(env, ["numpy", "pyarrow", "datasets"])
    backing = env.path("backing")
    os.makedirs(backing)
    prog = os.path.join(PROGRAMS, "mapping.py")
    r = env.run([env.python, prog, "write", backing], timeout=300)
    check(r.returncode == 0, "writing the files: %s" % r.stderr)
    mount = start_pfs(env, backing)
    sizes = {n: os.path.getsize(os.path.join(backing, n)) for n in sorted(os.listdir(backing))}
    log("dataset on the PFS emulator: %s" % ", ".join("%s %d bytes" % i for i in sizes.items()))
    # A RAM tier smaller than the big files: nothing a mapping reads may
    # depend on a copy of them.
    config, rt, service = service_for(env, mount, {}, tiers=["{kind: ram, capacity: 16MiB}"])
    extra = {"HF_HOME": env.path("hf-home"), "HF_DATASETS_CACHE": env.path("hf-cache"),
             "HF_HUB_OFFLINE": "1"}
    # What one touched page may cost: the source read and each process's
    # growth (an extent of issue 30's design; the kernel reads a page).
    page, per_page = 4096, 1 << 20
    problems = Problems()

    def run_all(cmds, preload, cfg=None, more=None):
        """Runs the programs at once; their Results in order."""
        procs = []
        for cmd in cmds:
            started = time.monotonic()
            procs.append((cmd, started, subprocess.Popen(
                cmd, env=program_env(env, preload, cfg or config, extra=dict(extra, **(more or {}))),
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)))
        results = []
        for cmd, started, proc in procs:
            out, err = proc.communicate(timeout=300)
            proc.stdout, proc.stderr = out, err
            results.append(Result(cmd, proc, time.monotonic() - started))
        return results

    def growth_kib(result):
        return int(result.stdout.split(b"rss-growth ")[1].split()[0])

    def body(result):
        return result.stdout.split(b"rss-growth ")[0]

    def case(label, cmds, source_limit, growth_limit, pre_cmds=None):
        """`cmds` read the same bytes with and without the preload (with it,
        `pre_cmds` if given); with it, the PFS served at most `source_limit`
        bytes and no process grew by more than `growth_limit` KiB."""
        with problems.case(label):
            base = run_all(cmds, False)
            pfs_reset(env, mount)
            pre = run_all(pre_cmds or cmds, True)
            source = pfs_counters(env, mount)["bytes_read"]
            for b, p in zip(base, pre):
                check(b.returncode == 0, "%s: fails without the preload: %s" % (label, b.describe()))
                check(p.returncode == 0, "%s: with the preload: %s" % (label, p.describe()))
                check(body(p) == body(b), show_difference(label, "stdout", body(b), body(p)))
            growth = [growth_kib(p) for p in pre]
            log("%-40s identical; with the preload the PFS served %d bytes, processes grew by "
                "%s KiB (without: %s KiB)" % (label, source, "/".join(map(str, growth)),
                                              "/".join(str(growth_kib(b)) for b in base)))
            check(source <= source_limit, "%s: the PFS served %d bytes, more than %d" % (
                label, source, source_limit))
            check(max(growth) <= growth_limit, "%s: a process grew by %d KiB, more than %d KiB"
                  % (label, max(growth), growth_limit))

    big = os.path.join(mount, "big.bin")
    rng = random.Random(30)
    offsets = [[rng.randrange(sizes["big.bin"] // page) * page] for _ in range(4)]
    offsets[0] = [0]  # A mark.
    # 4 processes mapping the 2 GiB file, one page each: the source read at
    # most `per_page` per touched page, each process at most that much
    # bigger. Shared mappings (numpy's mode "r") with the preload;
    # without it the emulator can map its files only privately (mode "c").
    numpy = [[env.python, prog, "numpy", big, "c", str(o[0])] for o in offsets]
    case("numpy.memmap, 4 processes, a page each", numpy, 4 * per_page, per_page >> 10,
         pre_cmds=[c[:4] + ["r"] + c[5:] for c in numpy[:2]] + numpy[2:])
    rows = ["0", "77", "4194303"]
    case("pyarrow.memory_map", [[env.python, prog, "pyarrow", os.path.join(mount, "table.arrow")]
                                + rows], 4 * per_page, 16 << 10)
    case("datasets.Dataset.from_file",
         [[env.python, prog, "datasets", os.path.join(mount, "stream.arrow")] + rows],
         4 * per_page, 16 << 10)
    # A small file is still mapped through Monarch (filled, promoted).
    with problems.case("numpy.memmap of a 1 MiB file"):
        cmd = [env.python, prog, "numpy", os.path.join(mount, "small.bin"), "c", "8192"]
        base = run_all([cmd], False)[0]
        usage = Usage(env, rt)
        pre = run_all([cmd], True)[0]
        delta = usage.delta()
        check(base.returncode == 0 and pre.returncode == 0, "small.bin: %s / %s" % (
            base.describe(), pre.describe()))
        check(body(pre) == body(base), show_difference("small.bin", "stdout", body(base),
                                                       body(pre)))
        log("numpy.memmap of a 1 MiB file: identical; the node served %d bytes" % delta)
        expect_monarch(env, delta >= sizes["small.bin"], "small.bin: the node served %d bytes, "
                       "not the file's %d" % (delta, sizes["small.bin"]))
    service.stop()
    # Copies mapped in place: a posix tier holds the extents (4 MiB) of the
    # touched pages and the whole Arrow files; mappings then read those pages
    # from the copies, and the PFS serves nothing.
    with problems.case("mappings of a posix tier's copies"):
        nvme = env.path("nvme")
        os.makedirs(nvme)
        copies, _, copies_service = service_for(
            env, mount, {}, name="rt-copies", tiers=["{kind: posix, path: %s, capacity: 128MiB}" % nvme])
        # A page of each touched page's extent, not at its start: a read at
        # offset 0 would start a scan, whose read-ahead copies more.
        touched = sorted({o[0] // (4 << 20) for o in offsets})
        table = os.path.join(mount, "table.arrow")
        stream = os.path.join(mount, "stream.arrow")
        warm = run_all([[env.python, prog, "pread", big] + [str((e << 22) + 8192) for e in touched],
                        [env.python, prog, "pread", table, "0"],
                        [env.python, prog, "pread", stream, "0"]], True, copies)
        check(all(w.returncode == 0 for w in warm), "copying: %s" % warm[0].describe())
        # The service writes the copies, then checks each in the background;
        # a mapping maps only checked ones (and asks for the others).
        probe = [env.python, prog, "numpy", big, "c", "0"]
        show = {"MAPPING_COPIES_UNDER": nvme}
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            seen = run_all([probe], True, copies, show)[0]
            if seen.returncode == 0 and b"copies %d" % len(touched) in seen.stdout:
                break
            time.sleep(0.2)
        extents = sum(len(names) for _, _, names in os.walk(os.path.join(nvme, ".monarch", "extents")))
        check(extents == len(touched), "%d extents copied, not the %d read" % (extents, len(touched)))
        readers = numpy + [[env.python, prog, "pyarrow", table] + rows,
                           [env.python, prog, "datasets", stream] + rows]
        base = run_all(readers, False)
        pfs_reset(env, mount)
        pre = run_all(readers, True, copies, show)
        source = pfs_counters(env, mount)["bytes_read"]
        for b, p in zip(base, pre):
            check(p.returncode == 0, "with the preload: %s" % p.describe())
            check(body(p) == body(b), show_difference("copies", "stdout", body(b), body(p)))
        mapped = [int(p.stdout.split(b"copies ")[1].split()[0]) for p in pre]
        log("mappings of copies: identical; %s copies mapped per process; the PFS served %d "
            "bytes" % ("/".join(map(str, mapped)), source))
        expect_monarch(env, mapped == [extents] * len(numpy) + [1, 1],
                       "mapped %s copies, want %d per numpy process and 1 per Arrow file" % (
                           mapped, extents))
        # Only the Arrow files' last pages (458 and 280 bytes) stay on the
        # source: a copy's checksums follow its bytes there. Their readers
        # read their footers.
        tails = sizes["table.arrow"] % page + sizes["stream.arrow"] % page
        expect_monarch(env, source <= tails,
                       "the PFS served %d bytes to mappings of copies, more than the Arrow "
                       "files' last pages (%d)" % (source, tails))
        copies_service.stop()
    problems.check()


# --- kill-service.


def wait_for(condition, timeout, what):
    deadline = time.monotonic() + timeout
    while not condition():
        check(time.monotonic() < deadline, "timed out waiting for " + what)
        time.sleep(0.005)


def scenario_kill_service(env):
    ds = env.path("ds")
    files = make_dataset(ds, mixed_spec(classes=2, per_class=20, big=2**20 + 9))
    total = total_bytes(files)
    names = list(files)
    listing = write_list(env.path("files.txt"), names)
    prog = os.path.join(PROGRAMS, "reader.py")
    problems = []

    def run_and_kill(label, config, rt, service, epochs, kill_epoch, sleep):
        """Runs reader.py; SIGKILLs the service when the reader is half-way
        through big.bin in epoch kill_epoch (its descriptor open); lets it go on."""
        marks = env.path("marks-" + label.replace(" ", "-"))
        os.makedirs(marks)
        gate = os.path.join(marks, "go")
        cmd = [env.python, prog, "--root", ds, "--list", listing, "--epochs", str(epochs),
               "--read-size", "4096", "--marks", marks, "--sleep", str(sleep),
               "--pause", "%d:%d:%s" % (kill_epoch, names.index("big.bin"), gate)]
        # Not strict: a service that dies is no error; the reads go on without it.
        proc = env.popen(cmd, env=program_env(env, True, config, strict=False))
        wait_for(lambda: os.path.exists(os.path.join(marks, "paused")) or
                 proc.poll() is not None, 120, "the reader to reach epoch %d" % kill_epoch)
        if proc.poll() is not None:
            raise Failure("%s: the program ended early: %s" % (
                label, proc.communicate()[1].decode(errors="replace")))
        r = env.run([env.monarch, "stats", "--json", "--runtime-dir", rt], timeout=30)
        clients = json.loads(r.stdout)["clients"] if r.returncode == 0 else []
        os.kill(service.pid, signal.SIGKILL)
        service.proc.wait()
        log("%s: SIGKILLed the service (pid %d) in epoch %d of %d, half-way through big.bin; "
            "it had %d client(s): %s" % (label, service.pid, kill_epoch, epochs, len(clients),
                                         clients))
        expect_monarch(env, any(c["pid"] == proc.pid for c in clients),
                       "%s: the program was no client of the service before the kill" % label)
        killed_at = time.monotonic()
        open(gate, "w").close()
        out, err = proc.communicate(timeout=300)
        log("%s: the program exited %d %.1f s after the kill; stderr: %s" % (
            label, proc.returncode, time.monotonic() - killed_at,
            err.decode(errors="replace").strip() or "(none)"))
        check(proc.returncode == 0, "%s: the program exited %d after the kill:\n%s" % (
            label, proc.returncode, err.decode(errors="replace")))
        want = expected_lines(files, names, epochs, reader_line)
        if out != want:
            bad = sorted(set(want.decode().splitlines()) - set(out.decode().splitlines()))
            problems.append("%s: %d of %d file reads wrong after the kill, e.g. %s" % (
                label, len(bad), len(names) * epochs, bad[:3]))
        else:
            log("%s: all %d reads exact (%d bytes x %d epochs)" % (label, len(names) * epochs,
                                                                   total, epochs))

    # Tiers of half the dataset: after the kill, what is in the tier is read
    # from it and the rest (misses) needs the source or a service.
    capacity = total // 2

    # 1. autostart off: the service stays dead; the program reads on alone,
    # the RAM tier's copies (still mapped) and the source itself.
    rt = env.runtime_dir("rt-off")
    config = write_config(env.path("off.yaml"), ds, rt, capacity)
    service = Service(env, config, rt, "serve-off")
    run_and_kill("autostart off", config, rt, service, 3, 2, 0)
    check(not lock_held(rt), "a service runs after the kill with autostart off")

    # 2. autostart on, a posix tier: the program's next miss starts a new
    # service (it retries at most once a second, so the epochs after the
    # kill last a few seconds) and moves over to it.
    tier_dir = env.path("tier")
    os.makedirs(tier_dir)
    rt = env.runtime_dir("rt-on")
    config = write_config(env.path("on.yaml"), ds, rt, 0, autostart=True, tiers=[
        "{kind: posix, path: %s, capacity: %d}" % (tier_dir, capacity)])
    service = Service(env, config, rt, "serve-on")
    run_and_kill("autostart on", config, rt, service, 4, 2, 0.03)
    holder = lock_holder(rt)
    node = node_counters(env, rt) if holder and holder != service.pid else None
    log("after the run: service pid %s (killed %d); it read %d bytes from the source, "
        "reused %s posix copies" % (holder, service.pid, source_bytes(node),
                                    node["warm_files_reused"] if node else "no"))
    expect_monarch(env, holder is not None and holder != service.pid and pid_alive(holder) and
                   lock_held(rt), "no new service was started by the program (autostart on)")
    expect_monarch(env, source_bytes(node) > 0,
                   "the new service served none of the program's misses")
    check(not problems, "; ".join(problems))


# --- untouched.


def strace_usable():
    if shutil.which("strace") is None:
        return False
    r = subprocess.run(["strace", "-f", "-qq", "-o", "/dev/null", "true"], capture_output=True)
    return r.returncode == 0


def scenario_untouched(env):
    ds = env.path("ds")
    files = make_dataset(ds, mixed_spec(classes=1, per_class=3, big=100_000))
    # A sibling whose name starts with the dataset's: not the dataset.
    sibling = ds + "x"
    other = make_dataset(sibling, [("a.bin", 70_000), ("b.txt", 3000), ("empty", 0)])
    outside = [os.path.join(sibling, n) for n in other]
    rt = env.path("rt")  # Not created: a preload that starts nothing leaves no trace.
    env.runtime_dirs.append(rt)
    config = write_config(env.path("job.yaml"), ds, rt, 64 << 20, autostart=True)

    def no_trace(label):
        left = sorted(os.listdir(rt)) if os.path.isdir(rt) else None
        return None if not left and not lock_held(rt) else "%s: the runtime dir %s holds %s%s" % (
            label, rt, left, ", a service runs" if lock_held(rt) else "")

    python_prog = [env.python, os.path.join(PROGRAMS, "untouched.py")] + outside
    cases = [
        ("ls /proc/self/task | wc -l (threads of ls)", ["sh", "-c", "ls /proc/self/task | wc -l"]),
        ("untouched.py (threads, memfds, reads)", python_prog),
        ("cat, md5sum, tar of the sibling", ["sh", "-c", "cat %s | md5sum; md5sum %s; "
                                             "tar --sort=name -cf - -C %s . | md5sum" % (
                                                 outside[0], " ".join(outside), sibling)]),
        ("stat of the dataset's parent", ["stat", "-c", "%n %F", env.work]),
    ]
    for label, cmd in cases:
        base, pre = both(env, label, cmd, config)
        log("%-45s identical: %s" % (label, pre.stdout.decode().strip().splitlines()[-1]))
        trace = no_trace(label)
        check(trace is None, trace)
    log("runtime dir after the programs: %s" % (sorted(os.listdir(rt)) if os.path.isdir(rt)
                                               else "not created"))

    traced = strace_usable()
    if traced:
        for label, cmd in cases[:3]:
            r, calls = strace_monarch_calls(env, config, cmd)
            check(r.returncode == 0, "%s under strace: %s" % (label, r.stderr))
            check(not calls, "%s: Monarch calls under strace: %s" % (label, calls[:5]))
        log("strace: no connect() to a Monarch socket and no service started by 3 programs")
    else:
        log("strace not usable here: the runtime directory check only")

    # The checks can fail: a program that reads one dataset file starts the
    # service and connects to it.
    touch = ["cat", os.path.join(ds, "page.bin")]
    r = run_program(env, touch, True, config)
    check(r.returncode == 0 and r.stdout == files["page.bin"], "control cat: %s" % r.describe())
    trace = no_trace("control")
    log("control (cat of a dataset file): %s" % (trace or "no trace"))
    expect_monarch(env, trace is not None, "a program that reads the dataset left no trace in "
                   "%s: the untouched check cannot fail" % rt)
    # ...and untouched.py given a dataset file maps the service's memory.
    cmd = [env.python, os.path.join(PROGRAMS, "untouched.py"), os.path.join(ds, "page.bin")]
    base = run_program(env, cmd, False)
    pre = run_program(env, cmd, True, config)
    check(base.returncode == 0 and pre.returncode == 0, "control untouched.py: %s / %s" % (
        base.describe(), pre.describe()))
    last = [r.stdout.decode().strip().splitlines()[-1] for r in (base, pre)]
    log("control untouched.py on a dataset file: without: %s; with: %s" % tuple(last))
    expect_monarch(env, base.stdout != pre.stdout, "untouched.py reading a dataset file prints "
                   "the same with and without the preload: its comparison cannot fail")
    if traced:
        r, calls = strace_monarch_calls(env, config, touch)
        log("control under strace: %s" % (calls[:1] or "no Monarch call"))
        expect_monarch(env, calls, "strace saw no connect() from a program reading the "
                       "dataset: the strace check cannot fail")


def strace_monarch_calls(env, config, cmd):
    """Runs cmd preloaded under strace -f; returns (result, the lines that
    connect to a Monarch socket or start a service)."""
    out = env.path("strace.out")
    pass_env = []
    for k, v in program_env(env, True, config).items():
        if k in ("LD_PRELOAD", "MONARCH_CONFIG", "MONARCH_PRELOAD_STRICT"):
            pass_env += ["-E", "%s=%s" % (k, v)]
    r = subprocess.run(["strace", "-f", "-qq", "-e", "trace=connect,execve", "-o", out] +
                       pass_env + cmd, capture_output=True, timeout=120,
                       env=program_env(env, False))
    with open(out) as f:
        calls = [line.strip() for line in f
                 if ("connect(" in line and "monarch.sock" in line) or
                 ("execve(" in line and '"serve"' in line)]
    return r, calls


# --- bad-config.


def scenario_bad_config(env):
    ds = env.path("ds")
    files = make_dataset(ds, mixed_spec(classes=1, per_class=8, big=300_000))
    names = list(files)
    listing = write_list(env.path("files.txt"), names)
    rt = env.runtime_dir()
    good = write_config(env.path("good.yaml"), ds, rt, 64 << 20)

    def variant(name, text):
        path = env.path(name + ".yaml")
        with open(good) as f:
            body = f.read()
        changed = text(body)
        check(changed != body, "the %s variant of the config is the good one" % name)
        with open(path, "w") as f:
            f.write(changed)
        return path

    cases = [
        ("missing config file", env.path("nope.yaml"), "nope.yaml"),
        ("malformed YAML", variant("malformed", lambda b: b.replace(
            "dataset: {path: %s}" % ds, "dataset: {path: [%s" % ds)), "config"),
        ("bad tier capacity", variant("capacity", lambda b: b.replace(
            "capacity: %d" % (64 << 20), "capacity: 12 parsecs")), "tiers[0].capacity"),
        ("unknown key", variant("unknown", lambda b: b.replace(
            "dataset: {path: %s}" % ds, "dataset: {path: %s, bogus: 1}" % ds)), "dataset.bogus"),
        ("bad node value", variant("port", lambda b: b + "  metrics_port: 99999\n"),
         "node.metrics_port"),
        ("no service, autostart off", good, "service"),
    ]
    programs = [
        ("cat", ["cat"] + [os.path.join(ds, n) for n in names[:3]]),
        ("reader.py (2 threads)", [sys.executable, os.path.join(PROGRAMS, "reader.py"), "--root",
                                   ds, "--list", listing, "--threads", "2"]),
    ]
    for case, config, key in cases:
        for label, cmd in programs:
            base = run_program(env, cmd, False)
            check(base.returncode == 0, "%s fails without the preload" % label)
            pre = run_program(env, cmd, True, config, strict=False)
            lines = pre.stderr.decode(errors="replace").splitlines()
            log("%-26s %-22s exit %d, stdout %s, stderr %d line(s): %s" % (
                case, label, pre.returncode, "identical" if pre.stdout == base.stdout else
                "DIFFERENT", len(lines), lines))
            check(pre.returncode == 0 and pre.stdout == base.stdout,
                  "%s, %s: plain I/O did not work: %s" % (case, label, pre.describe()))
            expect_monarch(env, len(lines) == 1,
                           "%s, %s: %d stderr lines, want exactly one: %s" % (
                               case, label, len(lines), lines))
            if lines:
                check(key.lower() in lines[0].lower(),
                      "%s, %s: the line does not name %r: %s" % (case, label, key, lines[0]))
            strict = run_program(env, cmd, True, config, strict=True)
            log("%-26s %-22s MONARCH_PRELOAD_STRICT=1: exit %d: %s" % (
                case, label, strict.returncode, strict.stderr.decode(
                    errors="replace").strip().splitlines()[:1]))
            expect_monarch(env, strict.returncode != 0,
                           "%s, %s: MONARCH_PRELOAD_STRICT=1 and the program exited 0" % (
                               case, label))
        check(not lock_held(rt), "%s: a service runs" % case)

    # Without MONARCH_CONFIG at all the program works (what it prints is logged).
    label, cmd = programs[0]
    pre = run_program(env, cmd, True, None, strict=False)
    log("no MONARCH_CONFIG: exit %d, stderr %s" % (pre.returncode, pre.stderr.decode(
        errors="replace").strip().splitlines()))
    check(pre.returncode == 0 and pre.stdout == run_program(env, cmd, False).stdout,
          "without MONARCH_CONFIG: %s" % pre.describe())

    # The good config serves: the same programs, strict, through the service.
    service = Service(env, good, rt, "serve")
    for label, cmd in programs:
        usage = Usage(env, rt)
        both(env, label + " with the good config", cmd, good)
        delta = usage.delta()
        log("good config: %s identical, node served %d bytes" % (label, delta))
        expect_monarch(env, delta > 0, "good config, %s: the node served nothing" % label)
    # A killed service's socket and lock left behind: still "no service".
    os.kill(service.pid, signal.SIGKILL)
    service.proc.wait()
    check(os.path.exists(os.path.join(rt, "monarch.sock")), "no stale socket to test with")
    label, cmd = programs[0]
    base = run_program(env, cmd, False)
    pre = run_program(env, cmd, True, good, strict=False)
    lines = pre.stderr.decode(errors="replace").splitlines()
    log("stale socket, autostart off: exit %d, stderr %s" % (pre.returncode, lines))
    check(pre.returncode == 0 and pre.stdout == base.stdout,
          "stale socket: plain I/O did not work: %s" % pre.describe())
    expect_monarch(env, len(lines) == 1, "stale socket: %d stderr lines: %s" % (len(lines),
                                                                               lines))
    strict = run_program(env, cmd, True, good, strict=True)
    expect_monarch(env, strict.returncode != 0,
                   "stale socket: MONARCH_PRELOAD_STRICT=1 and the program exited 0")


def scenario_signals(env):
    ds = env.path("ds")
    files = make_dataset(ds, mixed_spec(classes=1, per_class=8, big=2 * 2**20 + 77))
    rt = env.runtime_dir()
    config = write_config(env.path("job.yaml"), ds, rt, 64 << 20, autostart=True)
    program = os.path.join(env.build, "tests", "preload_signal_threads")
    check(os.access(program, os.X_OK), "missing %s (build the project first)" % program)
    paths = [os.path.join(ds, n) for n in sorted(files)]
    base, pre = both(env, "signal_threads", [program] + paths, config)
    out = pre.stdout.decode()
    check("offset errors 0" in out, "a shared descriptor's offset moved under a pread: " + out)
    log("4 threads x 20 rounds over %d files with SIGALRM every 100 us (its handler reads a "
        "pipe), a pread thread sharing a descriptor: output identical" % len(paths))
    node = served(node_counters(env, rt))
    check(node >= 20 * 4 * total_bytes(files) // 2,
          "the node served %d bytes: the reads did not go through Monarch" % node)


SCENARIOS = {
    "tools": scenario_tools,
    "python-basics": scenario_python_basics,
    "images": scenario_images,
    "hdf5": scenario_hdf5,
    "tensorflow": scenario_tensorflow,
    "pytorch": scenario_pytorch,
    "counts": scenario_counts,
    "kill-service": scenario_kill_service,
    "mapping": scenario_mapping,
    "untouched": scenario_untouched,
    "bad-config": scenario_bad_config,
    "signals": scenario_signals,
}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--build-dir", required=True)
    parser.add_argument("--python")
    parser.add_argument("--preload")
    parser.add_argument("--dry-run", action="store_true")
    parser.add_argument("scenario")
    a = parser.parse_args()
    if a.scenario not in SCENARIOS:
        print("unknown scenario %s; one of %s" % (a.scenario, ", ".join(SCENARIOS)))
        return 2
    try:
        env = Env(a, a.scenario)
    except Failure as e:
        print("FAIL %s: %s" % (a.scenario, e))
        return 1
    began = time.monotonic()
    log("%s: preload %s, python %s" % (a.scenario, "NONE (dry run)" if env.dry else env.preload,
                                       env.python))
    try:
        SCENARIOS[a.scenario](env)
    except Skip as e:
        print("SKIP %s: %s" % (a.scenario, e))
        return SKIP
    except Failure as e:
        message = str(e)
        if "\n" in message:
            print(message)
        print("FAIL %s after %.1f s: %s" % (a.scenario, time.monotonic() - began,
                                           message.splitlines()[0] if message else ""))
        return 1
    except Exception:  # noqa: BLE001 - anything unexpected is a failure, after cleanup
        traceback.print_exc()
        print("FAIL %s after %.1f s: unexpected exception" % (a.scenario,
                                                             time.monotonic() - began))
        return 1
    finally:
        env.cleanup()
    if env.dry:
        print("PASS %s (dry run, no preload) in %.1f s; %d check(s) that need the preload "
              "would fail:" % (a.scenario, time.monotonic() - began, len(env.dry_misses)))
        for m in env.dry_misses:
            print("  - " + m)
        return 0
    print("PASS %s in %.1f s" % (a.scenario, time.monotonic() - began))
    return 0


if __name__ == "__main__":
    sys.exit(main())
