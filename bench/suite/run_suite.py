#!/usr/bin/env python3
"""Monarch experiment suite (issue 4): the MONARCH paper's two scenarios on a
PFS you can feel on one machine, with one command.

  sudo bench/suite/run_suite.py                 # full size, 10-20 minutes
  sudo bench/suite/run_suite.py --scale small   # a few hundred MB, ~2 minutes

For each generated dataset (ImageNet-like small files; TFRecord-like shards)
it runs 3 epochs per setup, dropping the page cache before every epoch:

  scenario 1, the dataset fits in the local tier:
    vanilla-pfs     plain open/pread/close of the PFS (the emulator mount)
    vanilla-local   plain reads of a copy staged on local disk beforehand
    monarch         Monarch, posix tier on local disk (room for the whole
                    dataset) over the PFS as source
    tf-*            the same three through TensorFlow, plus vanilla-caching
                    (dataset.cache(file)), when the monarch_tf plugin exists
  scenario 2, the dataset does not fit: monarch with a tier of 50% of the
    dataset, against scenario 1's vanilla-pfs run (vanilla-pfs does not
    depend on the tier).
  scenario 3, several processes: a PyTorch DataLoader with 4 worker
    processes (torch_reader.py, when <repo>/.venv has torch) on the PFS, on
    the local copy, and through Monarch's node service (scenario 1's tier),
    plain and with each epoch's order announced; every sample's bytes checked.

The PFS is tools/pfs_emulator (FUSE, default Lustre-like delays) over the
generated dataset; its exact counters are read and reset at every epoch
boundary inside one process (`monarch-epochs --before-epoch` running
epoch_phase.py, see there; tf_reader.py has its own handshake). With
--pfs-dir the suite runs against a real PFS directory instead, and PFS
figures come from Monarch's own source-tier counters (application level).
With --source moosefs the generated dataset is copied onto a real MooseFS
(scripts/moosefs.sh; --moosefs-setup default, direct or throttled) and its
counters (veth bytes, mfsmount's operations) are read the same way.
Results go to bench/results/suite/: results.md, PNG charts and results.json.
"""

import argparse
import datetime
import glob
import json
import math
import os
import platform
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.dirname(HERE))
from moosefs_source import (  # noqa: E402
    SCRIPT as MOOSEFS_SCRIPT, STATE_DIR as MOOSEFS_STATE_DIR, MooseFS, add_source_flags)
VENV_PYTHON = os.path.join(REPO, ".venv", "bin", "python")
sys.path.insert(0, os.path.dirname(HERE))
from service_epochs import add_readahead_flag, readahead_flags  # noqa: E402
MiB = 1 << 20

# Dataset sizes per scale. read_size 0 = whole file per read call (JPEG
# loaders); shards are read in 256 KiB calls like TFRecordDataset's buffer.
SCALES = {
    "full": [
        {"name": "imagenet", "profile": "imagenet", "count": 20000, "file_size": 0, "read_size": 0},
        {"name": "shards", "profile": "shards", "count": 32, "file_size": 64 * MiB,
         "read_size": 256 * 1024},
    ],
    "small": [
        {"name": "imagenet", "profile": "imagenet", "count": 2000, "file_size": 0, "read_size": 0},
        {"name": "shards", "profile": "shards", "count": 8, "file_size": 16 * MiB,
         "read_size": 256 * 1024},
    ],
}
GENERATE_SEED = 42  # monarch-epochs --generate seed: same bytes on every run
EPOCH_SEED = 7      # shuffle seed: the same per-epoch order for every setup
TF_SETUPS = ["tf-vanilla-pfs", "tf-vanilla-local", "tf-vanilla-caching", "tf-monarch"]
# Scenario 3: a PyTorch DataLoader with worker processes (torch_reader.py).
MP_SETUPS = ["mp-pfs", "mp-local", "mp-monarch", "mp-monarch-announced"]
SETUP_ORDER = ["vanilla-pfs", "vanilla-local", "monarch"] + TF_SETUPS + MP_SETUPS
COUNTER_KEYS = ["metadata_ops", "opens", "reads", "bytes_read", "lookups", "getattrs",
                "readdirs", "opendirs", "queued_ops", "errors"]


def log(msg):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def fmt_mib(b):
    return "n/a" if b is None else f"{b / MiB:.0f}"


# ---------------------------------------------------------------------------
# Environment: matplotlib, binaries, the emulator.

def ensure_matplotlib():
    """Makes matplotlib importable: runs setup.sh if needed and re-executes
    this script under <repo>/.venv/bin/python when that venv exists."""
    def importable(python):
        return subprocess.run([python, "-c", "import matplotlib"], capture_output=True).returncode == 0

    try:
        import matplotlib  # noqa: F401
        return
    except ImportError:
        pass
    want = VENV_PYTHON if os.access(VENV_PYTHON, os.X_OK) else sys.executable
    if not importable(want):
        subprocess.run([os.path.join(HERE, "setup.sh")], check=True)
    if os.environ.get("MONARCH_SUITE_REEXEC") == "1":
        sys.exit("run_suite: matplotlib is still missing after bench/suite/setup.sh")
    os.environ["MONARCH_SUITE_REEXEC"] = "1"
    os.execv(want, [want, os.path.abspath(__file__)] + sys.argv[1:])


class Emulator:
    """One pfs-emulator mount; stats/reset are the script's exact ones."""

    def __init__(self, script, backing, mount, flags):
        self.script, self.backing, self.mount, self.flags = script, backing, mount, flags
        self.started = False

    def _run(self, *args):
        return subprocess.run([self.script, *args], check=True, capture_output=True, text=True).stdout

    def start(self):
        subprocess.run([self.script, "stop", self.mount], capture_output=True)  # a stale one
        self._run("start", self.backing, self.mount, *self.flags)
        self.started = True
        return self.stats()["config"]

    def stats(self):
        return json.loads(self._run("stats", self.mount))

    def counters(self):
        return {k: v for k, v in self.stats()["counters"].items()}

    def reset(self):
        self._run("reset", self.mount)

    def stop(self):
        if self.started:
            r = subprocess.run([self.script, "stop", self.mount], capture_output=True, text=True)
            if r.returncode != 0:
                log(f"warning: pfs-emulator stop {self.mount}: {r.stderr.strip()}")
            self.started = False


class MooseFSMount:
    """The dataset copied onto a real MooseFS (bench/moosefs_source.py), with
    Emulator's face: scripts/moosefs.sh's stats and reset are in the
    emulator's shape (bytes from the veth pair, mfsmount's operation counts)."""

    def __init__(self, a, backing, name):
        self.a, self.backing, self.name = a, backing, name
        self.script, self.mount, self.fs = MOOSEFS_SCRIPT, None, None

    def start(self):
        self.fs = MooseFS(self.a, self.backing, self.name)
        if not self.fs.ok:
            sys.exit(f"run_suite: {self.fs.why}")
        self.mount = self.fs.mount
        return {"source": self.fs.describe()}

    def stats(self):
        return {"counters": self.fs.stats()}

    def counters(self):
        return self.fs.stats()

    def reset(self):
        self.fs.reset()

    def stop(self):
        pass  # MooseFS stays up; scripts/moosefs.sh stop ends it.


class LoadSampler(threading.Thread):
    """Every 5 s: the 1-minute load average, and how many cores processes
    outside this suite used (the machine is shared). Ours are this process's
    descendants, the emulators (which run in their own session) and the
    processes that name one of `markers` (the work directory; MooseFS's
    master, chunk server and client, which serve our reads); kernel
    threads are left out, since they also do our I/O."""

    PERIOD = 5.0

    def __init__(self, markers):
        super().__init__(daemon=True)
        self.markers = tuple(markers)
        self.samples, self.others, self.timeline, self.halt = [], [], [], threading.Event()
        self.other_cpu = {}  # comm -> CPU seconds over the run
        self.hz = os.sysconf("SC_CLK_TCK")

    @staticmethod
    def _procs():
        procs = {}
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            try:
                with open(f"/proc/{pid}/stat") as f:
                    stat = f.read()
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    cmdline = f.read().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            comm = stat[stat.index("(") + 1:stat.rindex(")")]
            fields = stat[stat.rindex(")") + 2:].split()
            procs[int(pid)] = (comm, int(fields[1]), int(fields[11]) + int(fields[12]), cmdline,
                               int(fields[6]) & 0x00200000)  # PF_KTHREAD
        return procs

    def _ours(self, procs):
        ours, me = set(), os.getpid()
        for pid in procs:
            p, seen = pid, 0
            while p in procs and seen < 64:
                # The emulators and the node services run in sessions of
                # their own; both name a path under the work directory.
                if p == me or any(m in procs[p][3] for m in self.markers):
                    ours.add(pid)
                    break
                p, seen = procs[p][1], seen + 1
        return ours

    def run(self):
        before = self._procs()
        while not self.halt.wait(self.PERIOD):
            with open("/proc/loadavg") as f:
                self.samples.append(float(f.read().split()[0]))
            now = self._procs()
            ours = self._ours(now)
            used = 0.0
            for pid, (comm, _, ticks, _, kthread) in now.items():
                if pid in ours or kthread or pid not in before or before[pid][0] != comm:
                    continue
                delta = (ticks - before[pid][2]) / self.hz
                used += delta
                self.other_cpu[comm] = self.other_cpu.get(comm, 0.0) + delta
            self.others.append(used / self.PERIOD)
            self.timeline.append((time.time(), used / self.PERIOD))
            before = now

    def others_between(self, start, end):
        vals = [v for t, v in self.timeline if start < t <= end + self.PERIOD / 2]
        return round(sum(vals) / len(vals), 2) if vals else None


def loadavg():
    with open("/proc/loadavg") as f:
        return float(f.read().split()[0])


def git_head():
    """The short commit of the repository, with "+dirty" when bench/, src/,
    include/, tools/ or python/ differ from it."""
    def git(*args):
        return subprocess.run(["git", "-C", REPO, *args], capture_output=True, text=True)
    head = git("rev-parse", "--short", "HEAD")
    if head.returncode != 0:
        return None
    dirty = git("status", "--porcelain", "--untracked-files=no", "--", "src", "include",
                "tools", "python", "bench").stdout.strip()
    return head.stdout.strip() + ("+dirty" if dirty else "")


def uptime():
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


# ---------------------------------------------------------------------------
# Running one setup with exact per-epoch PFS counters.

def monotonic_ns():
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC)


def run_epochs_hooked(cmd, env, emulator, log_path, phase_dir, epochs):
    """Runs monarch-epochs `cmd`, whose --before-epoch runs epoch_phase.py
    with `phase_dir`: that writes phase-K.json for phases 0..epochs, each
    with the emulator's exact counters (read and reset while the job waits).
    Returns (phases, shutdown): phase 0 is start-up (process start, dataset
    walk), phase k epoch k (including its settle); wall times run from the
    end of one boundary hook to the start of the next. `shutdown` is what
    came after the last hook (Monarch's shutdown, process exit), kept apart.
    Without an emulator, wall times only."""
    shutil.rmtree(phase_dir, ignore_errors=True)
    os.makedirs(phase_dir)
    if emulator:
        emulator.reset()
    t = monotonic_ns()
    with open(log_path, "w") as out:
        out.write("+ " + shlex.join(cmd) + "\n")
        out.flush()
        proc = subprocess.run(cmd, env=env, stdout=out, stderr=subprocess.STDOUT)
    exited = monotonic_ns()
    shutdown = {}
    if emulator:
        shutdown["pfs"] = emulator.counters()
        emulator.reset()
    if proc.returncode != 0:
        with open(log_path) as f:
            tail = f.read()[-3000:]
        raise RuntimeError(f"{cmd[0]} failed with exit code {proc.returncode}:\n{tail}")
    phases = []
    for k in range(epochs + 1):
        path = os.path.join(phase_dir, f"phase-{k}.json")
        if not os.path.exists(path):
            raise RuntimeError(f"{path} is missing: did --before-epoch run?")
        with open(path) as f:
            hook = json.load(f)
        phase = {"wall_seconds": (hook["start_ns"] - t) / 1e9}
        if "pfs" in hook:
            phase["pfs"] = hook["pfs"]
        phases.append(phase)
        t = hook["end_ns"]
    shutdown["wall_seconds"] = (exited - t) / 1e9
    return phases, shutdown


def run_hooked(cmd, env, emulator, log_path):
    """Runs tf_reader.py, which blocks at every epoch boundary writing one
    byte to MONARCH_SUITE_HOOK_REQ_FD and waiting for one on
    MONARCH_SUITE_HOOK_ACK_FD; meanwhile we read the emulator's counters
    (exact) and reset them. Returns the phases: phase 0 is start-up (process
    start, listing), phase k epoch k (including its settle; the last one also
    the process exit). Without an emulator, returns wall times only."""
    req_r, req_w = os.pipe()
    ack_r, ack_w = os.pipe()
    env = dict(env, MONARCH_SUITE_HOOK_REQ_FD=str(req_w), MONARCH_SUITE_HOOK_ACK_FD=str(ack_r))
    if emulator:
        emulator.reset()
    phases = []
    t = time.perf_counter()
    with open(log_path, "w") as out:
        out.write("+ " + shlex.join(cmd) + "\n")
        out.flush()
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT,
                                pass_fds=(req_w, ack_r))
    os.close(req_w)
    os.close(ack_r)
    try:
        while True:
            byte = os.read(req_r, 1)
            now = time.perf_counter()
            phase = {"wall_seconds": now - t}
            if emulator:
                phase["pfs"] = emulator.counters()
                emulator.reset()
            if not byte:  # the child exited: the last phase is complete
                proc.wait()
                phase["wall_seconds"] = time.perf_counter() - t
                phases.append(phase)
                break
            phases.append(phase)
            t = time.perf_counter()
            os.write(ack_w, b"a")
    finally:
        os.close(req_r)
        os.close(ack_w)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if proc.returncode != 0:
        with open(log_path) as f:
            tail = f.read()[-3000:]
        raise RuntimeError(f"{cmd[0]} failed with exit code {proc.returncode}:\n{tail}")
    return phases


def served_split(e):
    """Monarch's tier counters for one epoch: bytes read from the local
    tier, bytes read from the source (by readers and by background
    promotions alike), and the bytes the job got that neither counted: served
    from a promotion's in-memory staging image loaded in an earlier epoch.
    None for plain setups."""
    s = e.get("served", {})
    if "local" not in s or "pfs" not in s:
        return None
    local, pfs = s["local"]["bytes"], s["pfs"]["bytes"]
    return local, pfs, max(0, e["bytes"] - local - pfs)


def pfs_ops(counters):
    """PFS operations: every request that reached the file system (metadata
    requests, opens included, plus READs)."""
    return counters["metadata_ops"] + counters["reads"]


class Suite:
    def __init__(self, a):
        self.a = a
        self.build = os.path.abspath(a.build)
        self.epochs_bin = os.path.join(self.build, "monarch-epochs")
        self.work = os.path.abspath(a.workdir)
        self.out = os.path.abspath(a.out)
        self.emulators = []
        self.cleanup = []  # tier dirs and TF cache files, freed after each run
        self.results = []
        self.tf = None  # (python, plugin) when the TF setups run

    # -- preparation -------------------------------------------------------

    def check_binaries(self):
        emulator_bin = os.path.join(self.build, "bin", "monarch-pfs-emulator")
        need = [self.epochs_bin] + ([] if self.a.pfs_dir else [emulator_bin])
        # A monarch-epochs built before --before-epoch existed is rebuilt too.
        if not all(os.access(p, os.X_OK) for p in need) or "--before-epoch" not in subprocess.run(
                [self.epochs_bin, "--help"], capture_output=True, text=True).stderr:
            log("building monarch-epochs and the PFS emulator")
            subprocess.run(["cmake", "-S", REPO, "-B", self.build, "-DCMAKE_BUILD_TYPE=Release"],
                           check=True, stdout=subprocess.DEVNULL)
            subprocess.run(["cmake", "--build", self.build, "-j2", "--target", "monarch-epochs"]
                           + ([] if self.a.pfs_dir else ["--target", "monarch-pfs-emulator"]),
                           check=True, stdout=subprocess.DEVNULL)
        if not self.a.pfs_dir:
            os.environ["MONARCH_PFS_EMULATOR"] = emulator_bin

    def detect_tf(self):
        if self.a.tf == "off":
            return "disabled with --tf off"
        python = VENV_PYTHON if os.access(VENV_PYTHON, os.X_OK) else None
        if python is None:
            reason = f"no venv at {VENV_PYTHON}"
        else:
            env = dict(os.environ, PYTHONPATH=os.path.join(REPO, "integrations", "tensorflow"))
            if self.a.tf_plugin:
                env["MONARCH_TF_PLUGIN"] = os.path.abspath(self.a.tf_plugin)
            r = subprocess.run([python, "-c", "import monarch_tf; print(monarch_tf.plugin_path())"],
                               capture_output=True, text=True, env=env)
            if r.returncode == 0:
                self.tf = (python, r.stdout.strip())
                return f"plugin {self.tf[1]}"
            reason = (r.stderr.strip().splitlines() or ["import monarch_tf failed"])[-1]
        if self.a.tf == "on":
            sys.exit(f"run_suite: --tf on, but the TensorFlow plugin is unavailable: {reason}")
        return f"skipped: {reason}"

    def prepare_dataset(self, ds):
        """Generates the dataset on the PFS side (the emulator's backing
        directory, or --pfs-dir) once, and stages the local copy."""
        tag = f"{ds['name']}-{ds['count']}x{ds['file_size'] or 'profile'}"
        base = os.path.abspath(self.a.pfs_dir) if self.a.pfs_dir else os.path.join(self.work, "pfs")
        backing = os.path.join(base, tag)
        local = os.path.join(self.work, "local", tag)
        for path, make in ((backing, self.generate), (local, None)):
            marker = path + ".complete"
            if os.path.exists(marker):
                continue
            shutil.rmtree(path, ignore_errors=True)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            if make:
                log(f"generating {tag} in {path}")
                make(ds, path)
            else:
                log(f"staging the local copy {path}")
                shutil.copytree(backing, path)
            open(marker, "w").close()
        files, total = 0, 0
        for dirpath, _, names in os.walk(local):
            for n in names:
                files += 1
                total += os.path.getsize(os.path.join(dirpath, n))
        ds.update(tag=tag, backing=backing, local=local, files=files, bytes=total)

    def generate(self, ds, path):
        cmd = [self.epochs_bin, "--dataset", path, "--generate", str(ds["count"]),
               "--profile", ds["profile"], "--epochs", "0", "--seed", str(GENERATE_SEED)]
        if ds["file_size"]:
            cmd += ["--file-size", str(ds["file_size"])]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)

    def new_tier(self, label):
        path = os.path.join(self.work, "tiers", f"{label}-{os.getpid()}-{len(self.cleanup)}")
        os.makedirs(path)
        self.cleanup.append(path)
        return path

    def drop_tiers(self):
        """Frees the tiers (and the TF cache) of the runs so far, unless
        --keep: kept to the end, a full-scale run's tiers (about 13 GiB of
        imagenet's alone) filled the disk twice."""
        if self.a.keep:
            return
        for path in self.cleanup:
            shutil.rmtree(path, ignore_errors=True)
        self.cleanup.clear()

    def write_config(self, ds, source, label, capacity, node=False):
        """A posix tier of `capacity` on local disk over `source`; with
        `node`, served by one node service (`node: {shared: true}`) with its
        runtime directory under the work directory, never exiting on its own
        (torch_reader.py stops it, and so does the suite)."""
        tier = self.new_tier(label)
        path = os.path.join(self.work, "runs", f"{label}.yaml")
        with open(path, "w") as f:
            f.write(f"dataset:\n  path: {source}\n"
                    f"tiers:\n  - name: local\n    kind: posix\n    path: {tier}\n"
                    f"    capacity: {capacity}\n"
                    f"  - name: pfs\n    kind: source\n")
            if self.a.placement_threads:
                f.write(f"placement:\n  threads: {self.a.placement_threads}\n")
            if node:
                runtime = os.path.join(self.work, "runs", label + ".rt")
                shutil.rmtree(runtime, ignore_errors=True)
                os.makedirs(runtime)
                f.write(f"node:\n  shared: true\n  runtime_dir: {runtime}\n  idle_exit: 0\n")
        return path

    def manifest(self, ds):
        """[[relative path, offset, length, crc32]] per sample of the
        multi-process setups, made once from the generated dataset itself
        (the emulator's backing directory, or --pfs-dir) and kept in the work
        directory: imagenet, one sample per file; shards, one per --read-size
        record. torch_reader.py checks every sample's bytes against it."""
        rs = ds["read_size"]
        path = os.path.join(self.work, "manifests", f"{ds['tag']}-{rs}.json")
        if os.path.exists(path):
            return path
        log(f"checksumming {ds['backing']} for the multi-process setups")
        records = []
        for dirpath, dirs, names in os.walk(ds["backing"]):
            dirs.sort()
            for n in sorted(names):
                full = os.path.join(dirpath, n)
                rel = os.path.relpath(full, ds["backing"])
                with open(full, "rb") as f:
                    if rs == 0:
                        data = f.read()
                        records.append([rel, 0, len(data), zlib.crc32(data)])
                        continue
                    offset = 0
                    while True:
                        data = f.read(rs)
                        if not data:
                            break
                        records.append([rel, offset, len(data), zlib.crc32(data)])
                        offset += len(data)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path + ".tmp", "w") as f:
            json.dump(records, f)
        os.rename(path + ".tmp", path)
        return path

    # -- setups ------------------------------------------------------------

    def record(self, ds, scenario, setup, cmd, phases, epochs, extra=None):
        """Joins the per-epoch JSON of the child with the exact PFS phases."""
        # A run without boundaries gives one phase: no start-up figure then.
        startup = phases[0] if len(phases) == len(epochs) + 1 else None
        result = {"dataset": ds["name"], "scenario": scenario, "setup": setup,
                  "command": cmd, "startup": startup, "epochs": []}
        for i, e in enumerate(epochs):
            e = dict(e)
            if self.emulated:
                e["pfs"] = phases[i + 1]["pfs"]
                e["pfs"]["ops"] = pfs_ops(e["pfs"])
                e["pfs_source"] = "emulator"
            else:
                e["pfs"] = self.app_level_pfs(ds, setup, e)
                e["pfs_source"] = "application"
            result["epochs"].append(e)
        if result["startup"] and "pfs" in result["startup"]:
            result["startup"]["pfs"]["ops"] = pfs_ops(result["startup"]["pfs"])
        result.update(extra or {})
        self.results.append(result)
        self.save_json()
        times = " / ".join(f"{e['seconds']:.2f}" for e in result["epochs"])
        ops = " / ".join(str(e["pfs"].get("ops", "n/a")) for e in result["epochs"])
        log(f"  {ds['name']} s{scenario} {setup}: epochs {times} s; PFS ops {ops}")
        return result

    def app_level_pfs(self, ds, setup, e):
        """Without the emulator: what the application sent to the PFS."""
        if "local" in setup or (setup == "tf-vanilla-caching" and e["epoch"] > 1):
            return {"reads": 0, "bytes_read": 0, "opens": 0, "ops": 0}
        if "served" in e and "pfs" in e["served"]:
            s = e["served"]["pfs"]
            return {"reads": s["reads"], "bytes_read": s["bytes"], "ops": s["reads"]}
        if setup == "vanilla-pfs":
            rs = ds["read_size"]
            reads = ds["files"] if rs == 0 else math.ceil(ds["bytes"] / rs)
            # Read calls only, like Monarch's source counters (which cannot
            # see opens); the opens are noted separately.
            return {"reads": reads, "bytes_read": e["bytes"], "opens": ds["files"], "ops": reads}
        return {"bytes_read": e.get("bytes")}

    def run_epochs_tool(self, ds, scenario, setup, mode_args, emulator, extra=None):
        label = f"{ds['name']}-s{scenario}-{setup}"
        json_path = os.path.join(self.work, "runs", label + ".json")
        log_path = os.path.join(self.work, "runs", label + ".log")
        cmd = [self.epochs_bin] + mode_args + [
            "--epochs", str(self.a.epochs), "--threads", str(self.a.threads),
            "--seed", str(EPOCH_SEED), "--read-size", str(ds["read_size"]),
            "--json", json_path] + ([] if self.a.no_drop_caches else ["--drop-caches"])
        phase_dir = os.path.join(self.work, "runs", label + ".phases")
        hook = [sys.executable, os.path.join(HERE, "epoch_phase.py"), phase_dir]
        if emulator:
            hook += [emulator.script, emulator.mount]
        cmd += ["--before-epoch", shlex.join(hook)]
        log(f"{label}: {shlex.join(cmd)}")
        load, t0 = loadavg(), time.time()
        phases, shutdown = run_epochs_hooked(cmd, dict(os.environ), emulator, log_path, phase_dir,
                                             self.a.epochs)
        with open(json_path) as f:
            epochs = json.load(f)
        if "pfs" in shutdown:
            shutdown["pfs"]["ops"] = pfs_ops(shutdown["pfs"])
            if shutdown["pfs"]["ops"]:
                log(f"  note: {shutdown['pfs']['ops']} PFS ops after the last epoch (shutdown)")
        extra = dict(extra or {}, load_before=load, load_after=loadavg(),
                     other_cores=self.sampler.others_between(t0, time.time()), shutdown=shutdown)
        with open(log_path) as f:
            text = f.read()
        settles = [float(x) for x in re.findall(r"placement settled ([0-9.]+) s", text)]
        for e, s in zip(epochs, settles):
            e["settle_seconds"] = s
        m = re.search(r"^stats: (\{.*\})$", text, re.M)
        if m and "--config" in mode_args:
            extra["monarch_stats"] = json.loads(m.group(1))
        return self.record(ds, scenario, setup, cmd, phases, epochs, extra)

    def run_tf(self, ds, setup, source, emulator):
        python, plugin = self.tf
        label = f"{ds['name']}-s1-{setup}"
        json_path = os.path.join(self.work, "runs", label + ".json")
        log_path = os.path.join(self.work, "runs", label + ".log")
        data = ds["local"] if setup == "tf-vanilla-local" else source
        cmd = [python, os.path.join(HERE, "tf_reader.py"), "--setup", setup, "--data", data,
               "--profile", ds["profile"], "--epochs", str(self.a.epochs),
               "--threads", str(self.a.threads), "--seed", str(EPOCH_SEED),
               "--read-size", str(ds["read_size"] or 256 * 1024), "--json", json_path]
        cmd += [] if self.a.no_drop_caches else ["--drop-caches"]
        extra = {}
        if setup == "tf-vanilla-caching":
            cache_dir = self.new_tier(label + "-cache")
            cmd += ["--cache-file", os.path.join(cache_dir, "cache")]
        if setup == "tf-monarch":
            capacity = ds["bytes"] * 5 // 4
            cmd += ["--config", self.write_config(ds, source, label, capacity), "--plugin", plugin]
            extra["tier_capacity"] = capacity
        env = dict(os.environ, PYTHONPATH=os.path.join(REPO, "integrations", "tensorflow"),
                   TF_CPP_MIN_LOG_LEVEL="2")
        log(f"{label}: {shlex.join(cmd)}")
        extra["load_before"], t0 = loadavg(), time.time()
        phases = run_hooked(cmd, env, emulator, log_path)
        extra["load_after"] = loadavg()
        extra["other_cores"] = self.sampler.others_between(t0, time.time())
        with open(json_path) as f:
            epochs = json.load(f)
        if epochs and "monarch_stats" in epochs[-1]:
            extra["monarch_stats"] = epochs[-1].pop("monarch_stats")
        return self.record(ds, 1, setup, cmd, phases, epochs, extra)

    def run_mp(self, ds, setup, source, emulator):
        """Scenario 3: torch_reader.py, a DataLoader with --workers worker
        processes; the Monarch setups through the node service with scenario
        1's tier (125% of the dataset, posix on local disk)."""
        label = f"{ds['name']}-s3-{setup}"
        json_path = os.path.join(self.work, "runs", label + ".json")
        log_path = os.path.join(self.work, "runs", label + ".log")
        data = ds["local"] if setup == "mp-local" else source
        monarch_binary = os.path.join(self.build, "monarch")
        cmd = [VENV_PYTHON, os.path.join(HERE, "torch_reader.py"), "--setup", setup,
               "--data", data, "--manifest", self.manifest(ds), "--epochs", str(self.a.epochs),
               "--workers", str(self.a.workers), "--seed", str(EPOCH_SEED), "--json", json_path]
        cmd += [] if self.a.no_drop_caches else ["--drop-caches"]
        extra = {"workers": self.a.workers}
        config = None
        if setup.startswith("mp-monarch"):
            capacity = ds["bytes"] * 5 // 4
            config = self.write_config(ds, source, label, capacity, node=True)
            cmd += ["--config", config, "--monarch-binary", monarch_binary]
            extra["tier_capacity"] = capacity
        env = dict(os.environ, PYTHONPATH=os.path.join(REPO, "python"),
                   MONARCH_C_LIBRARY=os.path.join(self.build, "libmonarch_c.so"),
                   MONARCH_BINARY=monarch_binary)
        # Monarch.read()'s compiled path, as an installed package has it
        # (the build tree's, made for the Python tests); else ctypes.
        compiled = sorted(glob.glob(os.path.join(self.build, "python", "_read_bytes*.so")))
        if compiled:
            env["MONARCH_READ_BYTES_MODULE"] = compiled[0]
        log(f"{label}: {shlex.join(cmd)}")
        extra["load_before"], t0 = loadavg(), time.time()
        try:
            phases = run_hooked(cmd, env, emulator, log_path)
        finally:
            if config:  # a service left by a failed run
                subprocess.run([monarch_binary, "stop", "--config", config], capture_output=True)
        extra["load_after"] = loadavg()
        extra["other_cores"] = self.sampler.others_between(t0, time.time())
        with open(json_path) as f:
            epochs = json.load(f)
        if epochs and "monarch_stats" in epochs[-1]:
            extra["monarch_stats"] = epochs[-1].pop("monarch_stats")
        return self.record(ds, 3, setup, cmd, phases, epochs, extra)

    def run_dataset(self, ds):
        emulator = None
        source = ds["backing"]
        if getattr(self.a, "source", "emulator") == "moosefs":
            emulator = MooseFSMount(self.a, ds["backing"], "suite-" + ds["tag"])
            self.emulators.append(emulator)
            log(f"copying {ds['backing']} onto MooseFS")
            self.emulator_config = emulator.start()
            source = emulator.mount
        elif not self.a.pfs_dir:
            mount = os.path.join(self.work, "mnt", ds["tag"])
            emulator = Emulator(os.path.join(REPO, "tools", "pfs_emulator", "pfs-emulator"),
                                ds["backing"], mount,
                                readahead_flags(self.a) + shlex.split(self.a.emulator_flags))
            self.emulators.append(emulator)
            log(f"starting the PFS emulator: {ds['backing']} -> {mount}")
            self.emulator_config = emulator.start()
            source = mount
        try:
            setups = self.a.setups
            if "vanilla-pfs" in setups:
                self.run_epochs_tool(ds, 1, "vanilla-pfs", ["--dataset", source, "--mode", "plain"],
                                     emulator)
            if "vanilla-local" in setups:
                self.run_epochs_tool(ds, 1, "vanilla-local",
                                     ["--dataset", ds["local"], "--mode", "plain"], emulator)
            for scenario, capacity in ((1, ds["bytes"] * 5 // 4), (2, ds["bytes"] // 2)):
                if f"monarch-s{scenario}" not in setups and "monarch" not in setups:
                    continue
                label = f"{ds['name']}-s{scenario}-monarch"
                config = self.write_config(ds, source, label, capacity)
                self.run_epochs_tool(ds, scenario, "monarch", ["--config", config, "--settle"],
                                     emulator,
                                     {"tier_capacity": capacity})
                self.drop_tiers()
            if self.tf:
                for setup in TF_SETUPS:
                    if setup in setups or "tf" in setups:
                        self.run_tf(ds, setup, source, emulator)
                        self.drop_tiers()
            for setup in MP_SETUPS if self.mp else []:
                # Announcing is about files: the shards' records would
                # announce each shard once per record.
                if setup == "mp-monarch-announced" and ds["profile"] != "imagenet" \
                        and setup not in setups:
                    continue
                if setup in setups or "mp" in setups:
                    self.run_mp(ds, setup, source, emulator)
                    self.drop_tiers()
        finally:
            if emulator:
                emulator.stop()

    @property
    def emulated(self):
        return not self.a.pfs_dir

    def save_json(self):
        os.makedirs(self.out, exist_ok=True)
        with open(os.path.join(self.out, "results.json"), "w") as f:
            json.dump({"meta": self.meta, "results": self.results}, f, indent=1)

    # -- the whole run -----------------------------------------------------

    def run(self):
        a = self.a
        if os.geteuid() != 0 and not a.no_drop_caches:
            sys.exit("run_suite: dropping the page cache needs root (or pass --no-drop-caches)")
        os.makedirs(os.path.join(self.work, "runs"), exist_ok=True)
        self.check_binaries()
        tf_status = self.detect_tf()
        log(f"TensorFlow setups: {tf_status}")
        self.mp = False
        if any(s == "mp" or s.startswith("mp-") for s in a.setups):
            r = subprocess.run([VENV_PYTHON, "-c", "import torch"], capture_output=True, text=True)
            if r.returncode == 0:
                self.mp = True
            else:
                log(f"skipping the DataLoader setups (scenario 3): {VENV_PYTHON} cannot import "
                    f"torch: {(r.stderr.strip().splitlines() or ['?'])[-1]}")
        datasets = [dict(d) for d in SCALES[a.scale] if d["name"] in a.datasets]
        for ds in datasets:
            if a.imagenet_files and ds["profile"] == "imagenet":
                ds["count"] = a.imagenet_files
            if a.shards and ds["profile"] == "shards":
                ds["count"] = a.shards
            if a.shard_size and ds["profile"] == "shards":
                ds["file_size"] = a.shard_size
        self.emulator_config = None
        sampler = self.sampler = LoadSampler(
            [self.work] + ([MOOSEFS_STATE_DIR] if a.source == "moosefs" else []))
        self.meta = {
            "command": shlex.join([os.path.relpath(os.path.abspath(__file__), REPO)] + sys.argv[1:]),
            "started": datetime.datetime.now().isoformat(timespec="seconds"),
            "host": platform.node(), "kernel": platform.release(), "cores": os.cpu_count(),
            "ram_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
            "uptime_before": uptime(), "scale": a.scale, "epochs": a.epochs,
            "threads": a.threads, "workers": a.workers, "tf": tf_status,
            "commit": a.commit or git_head(), "nice": os.nice(0),
            "pfs": a.pfs_dir or ("moosefs" if a.source == "moosefs" else "pfs-emulator"),
            "drop_caches": not a.no_drop_caches,
        }
        sampler.start()
        try:
            for ds in datasets:
                self.prepare_dataset(ds)
            self.meta["datasets"] = datasets
            for ds in datasets:
                log(f"dataset {ds['tag']}: {ds['files']} files, {ds['bytes'] / MiB:.0f} MiB")
                self.run_dataset(ds)
        finally:
            for emulator in self.emulators:
                emulator.stop()
            sampler.halt.set()
            self.meta["uptime_after"] = uptime()
            self.meta["load_samples"] = sampler.samples
            self.meta["other_cores_samples"] = [round(x, 2) for x in sampler.others]
            self.meta["other_cpu_seconds"] = dict(sorted(
                ((k, round(v, 1)) for k, v in sampler.other_cpu.items() if v >= 1),
                key=lambda kv: -kv[1])[:8])
            self.meta["emulator_config"] = self.emulator_config
            self.meta["finished"] = datetime.datetime.now().isoformat(timespec="seconds")
            self.drop_tiers()
            if self.results:
                self.save_json()
        report = Report(self.meta, self.results, datasets)
        report.write(self.out)
        print(report.summary)


# ---------------------------------------------------------------------------
# Report: results.md and charts.

class Report:
    def __init__(self, meta, results, datasets):
        self.meta, self.results, self.datasets = meta, results, datasets
        self.summary = ""

    def get(self, ds, scenario, setup):
        for r in self.results:
            if r["dataset"] == ds and r["setup"] == setup and r["scenario"] == scenario:
                return r
        return None

    def rows(self, ds):
        """(scenario, label, result) in display order; scenario 2's
        vanilla-pfs is scenario 1's run."""
        out = []
        for setup in ["vanilla-pfs", "vanilla-local", "monarch"] + TF_SETUPS:
            r = self.get(ds, 1, setup)
            if r:
                out.append((1, setup, r))
        for setup in ["vanilla-pfs", "monarch"]:
            r = self.get(ds, 2, setup) or (self.get(ds, 1, setup) if setup == "vanilla-pfs" else None)
            if r:
                out.append((2, setup, r))
        for setup in MP_SETUPS:
            r = self.get(ds, 3, setup)
            if r:
                out.append((3, setup, r))
        return out

    @staticmethod
    def total_ops(r):
        ops = [e["pfs"].get("ops") for e in r["epochs"]]
        if None in ops:
            return None, None
        startup = (r.get("startup") or {}).get("pfs", {}).get("ops", 0)
        return sum(ops) + startup, sum(ops)

    def table(self, ds):
        lines = [
            "| scenario | setup | startup s (PFS ops) | epoch 1 s | epoch 2 s | epoch 3 s | "
            "3-epoch total s | settle s | PFS ops per epoch | PFS MiB per epoch | "
            "PFS ops, 3 epochs + startup | Monarch read local:source:uncounted MiB per epoch | "
            "load before / after / other jobs' cores |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for scenario, setup, r in self.rows(ds):
            ep = r["epochs"]
            st = r.get("startup") or {}
            st_ops = st.get("pfs", {}).get("ops")
            startup = (f"{st['wall_seconds']:.1f}" if st else "n/a") + \
                (f" ({st_ops})" if st_ops is not None else "")
            times = [f"{e['seconds']:.2f}" for e in ep] + [""] * (3 - len(ep))
            settle = " / ".join(f"{e['settle_seconds']:.1f}" for e in ep if "settle_seconds" in e) or "-"
            ops = " / ".join(str(e["pfs"].get("ops", "n/a")) for e in ep)
            mib = " / ".join(fmt_mib(e["pfs"].get("bytes_read")) for e in ep)
            total, _ = self.total_ops(r)
            served = "-"
            if all(served_split(e) for e in ep):
                served = " / ".join(":".join(fmt_mib(b) for b in served_split(e)) for e in ep)
            name = setup + (" (= scenario 1 run)" if scenario == 2 and r["scenario"] == 1 else "")
            if "tier_capacity" in r:
                name += f", tier {r['tier_capacity'] / MiB:.0f} MiB"
            oc = r.get("other_cores")
            load = f"{r.get('load_before', 0):.1f} / {r.get('load_after', 0):.1f} / " + \
                ("-" if oc is None else f"{oc:.2f}")
            lines.append(f"| {scenario} | {name} | {startup} | {' | '.join(times[:3])} | "
                         f"{sum(e['seconds'] for e in ep):.2f} | {settle} | {ops} | {mib} | "
                         f"{total if total is not None else 'n/a'} | {served} | {load} |")
        return "\n".join(lines)

    def targets(self, ds):
        """[(target, measured, threshold, met, margin text, profile text)]"""
        out = []
        pfs = self.get(ds, 1, "vanilla-pfs")
        local = self.get(ds, 1, "vanilla-local")
        m1 = self.get(ds, 1, "monarch")
        m2 = self.get(ds, 2, "monarch")

        def served(r, i):
            e = r["epochs"][i]
            split = served_split(e) or (None, None, None)
            return (f"Monarch read local {fmt_mib(split[0])} / source {fmt_mib(split[1])} / "
                    f"uncounted {fmt_mib(split[2])} MiB; PFS ops {e['pfs'].get('ops', 'n/a')}; "
                    f"settle {e.get('settle_seconds', 0):.1f} s; other jobs' cores "
                    f"{r.get('other_cores') if r.get('other_cores') is not None else '-'}")

        n = min(3, len(m1["epochs"]) if m1 else 0)
        if m1 and local:
            for i in range(1, n):
                ratio = m1["epochs"][i]["seconds"] / local["epochs"][i]["seconds"]
                out.append((f"S1 epoch {i + 1}: monarch time within 5% of vanilla-local",
                            f"{m1['epochs'][i]['seconds']:.2f} s vs {local['epochs'][i]['seconds']:.2f} s "
                            f"= {ratio:.3f}", "<= 1.05", ratio <= 1.05,
                            f"{(ratio - 1.05) * 100:+.1f} pts vs limit", served(m1, i)))
            for i in range(1, n):
                reads = m1["epochs"][i]["pfs"].get("reads")
                out.append((f"S1 epoch {i + 1}: monarch sends zero reads to the PFS",
                            f"{reads} reads, {fmt_mib(m1['epochs'][i]['pfs'].get('bytes_read'))} MiB, "
                            f"{m1['epochs'][i]['pfs'].get('metadata_ops', 'n/a')} metadata ops",
                            "0 reads", reads == 0, "" if reads == 0 else f"{reads} reads over",
                            served(m1, i)))
        if m1 and pfs:
            ratio = m1["epochs"][0]["seconds"] / pfs["epochs"][0]["seconds"]
            with_settle = (m1["epochs"][0]["seconds"] + m1["epochs"][0].get("settle_seconds", 0)) \
                / pfs["epochs"][0]["seconds"]
            out.append(("S1 epoch 1: monarch no more than 5% slower than vanilla-pfs",
                        f"{m1['epochs'][0]['seconds']:.2f} s vs {pfs['epochs'][0]['seconds']:.2f} s "
                        f"= {ratio:.3f} (with settle {with_settle:.3f})", "<= 1.05", ratio <= 1.05,
                        f"{(ratio - 1.05) * 100:+.1f} pts vs limit", served(m1, 0)))
        if m2 and pfs:
            for i in range(1, min(3, len(m2["epochs"]))):
                mb, pb = m2["epochs"][i]["pfs"].get("bytes_read"), pfs["epochs"][i]["pfs"].get("bytes_read")
                ratio = mb / pb if mb is not None and pb else None
                out.append((f"S2 epoch {i + 1}: monarch PFS bytes <= 55% of vanilla-pfs",
                            f"{fmt_mib(mb)} MiB vs {fmt_mib(pb)} MiB = "
                            + ("n/a" if ratio is None else f"{ratio:.3f}"), "<= 0.55",
                            ratio is not None and ratio <= 0.55,
                            "" if ratio is None else f"{(ratio - 0.55) * 100:+.1f} pts vs limit",
                            served(m2, i)))
            for i in range(1, min(3, len(m2["epochs"]))):
                mt, pt = m2["epochs"][i]["seconds"], pfs["epochs"][i]["seconds"]
                out.append((f"S2 epoch {i + 1}: monarch time lower than vanilla-pfs",
                            f"{mt:.2f} s vs {pt:.2f} s = {mt / pt:.3f}", "< 1.00", mt < pt,
                            f"{(mt / pt - 1) * 100:+.1f}% vs vanilla-pfs", served(m2, i)))
            mt = sum(e["seconds"] for e in m2["epochs"])
            pt = sum(e["seconds"] for e in pfs["epochs"])
            out.append(("S2, 3 epochs: monarch total time lower than vanilla-pfs",
                        f"{mt:.2f} s vs {pt:.2f} s = {mt / pt:.3f}", "< 1.00", mt < pt,
                        f"{(mt / pt - 1) * 100:+.1f}% vs vanilla-pfs",
                        "settle " + " / ".join(f"{e.get('settle_seconds', 0):.1f}" for e in m2["epochs"]) + " s"))
        for scenario, m in ((1, m1), (2, m2)):
            if not (m and pfs):
                continue
            (mt, me), (pt, pe) = self.total_ops(m), self.total_ops(pfs)
            if mt is None or pt is None:
                out.append((f"S{scenario}, 3 epochs: PFS ops below 45% of vanilla-pfs (55% reduction)",
                            "n/a (no PFS counters)", "<= 0.45", None, "", ""))
                continue
            ratio = mt / pt
            out.append((f"S{scenario}, 3 epochs: PFS ops below 45% of vanilla-pfs (55% reduction)",
                        f"{mt} vs {pt} = {ratio:.3f} (reduction {(1 - ratio) * 100:.1f}%); "
                        f"epochs only {me} vs {pe} = {me / pe:.3f}",
                        "<= 0.45", ratio <= 0.45, f"{(ratio - 0.45) * 100:+.1f} pts vs limit",
                        "per epoch " + " / ".join(str(e["pfs"]["ops"]) for e in m["epochs"])
                        + f"; startup {(m.get('startup') or {}).get('pfs', {}).get('ops', 'n/a')}"))
        out += self.mp_targets(ds, served)
        return out

    def mp_targets(self, ds, served):
        """Scenario 3 (DataLoader workers, node service): scenario 1's
        targets, against the same DataLoader on the PFS and on the local
        copy."""
        out = []
        pfs, local = self.get(ds, 3, "mp-pfs"), self.get(ds, 3, "mp-local")
        for setup in ("mp-monarch", "mp-monarch-announced"):
            m = self.get(ds, 3, setup)
            if not m:
                continue
            n = min(3, len(m["epochs"]))
            if local:
                for i in range(1, n):
                    mt, lt = m["epochs"][i]["seconds"], local["epochs"][i]["seconds"]
                    ratio = mt / lt
                    out.append((f"S3 epoch {i + 1}: {setup} time within 5% of mp-local",
                                f"{mt:.2f} s vs {lt:.2f} s = {ratio:.3f}", "<= 1.05",
                                ratio <= 1.05, f"{(ratio - 1.05) * 100:+.1f} pts vs limit",
                                served(m, i)))
            for i in range(1, n):
                reads = m["epochs"][i]["pfs"].get("reads")
                out.append((f"S3 epoch {i + 1}: {setup} sends zero reads to the PFS",
                            f"{reads} reads, {fmt_mib(m['epochs'][i]['pfs'].get('bytes_read'))} MiB, "
                            f"{m['epochs'][i]['pfs'].get('metadata_ops', 'n/a')} metadata ops",
                            "0 reads", reads == 0, "" if reads == 0 else f"{reads} reads over",
                            served(m, i)))
            if pfs:
                mt, pt = m["epochs"][0]["seconds"], pfs["epochs"][0]["seconds"]
                ratio = mt / pt
                with_settle = (mt + m["epochs"][0].get("settle_seconds", 0)) / pt
                out.append((f"S3 epoch 1: {setup} no more than 5% slower than mp-pfs",
                            f"{mt:.2f} s vs {pt:.2f} s = {ratio:.3f} (with settle "
                            f"{with_settle:.3f})", "<= 1.05", ratio <= 1.05,
                            f"{(ratio - 1.05) * 100:+.1f} pts vs limit", served(m, 0)))
                (mo, me), (po, pe) = self.total_ops(m), self.total_ops(pfs)
                if mo is not None and po:
                    ratio = mo / po
                    out.append((f"S3, 3 epochs: {setup} PFS ops below 45% of mp-pfs",
                                f"{mo} vs {po} = {ratio:.3f} (reduction {(1 - ratio) * 100:.1f}%); "
                                f"epochs only {me} vs {pe} = {me / pe:.3f}", "<= 0.45",
                                ratio <= 0.45, f"{(ratio - 0.45) * 100:+.1f} pts vs limit",
                                "per epoch " + " / ".join(str(e["pfs"]["ops"]) for e in m["epochs"])
                                + f"; startup {(m.get('startup') or {}).get('pfs', {}).get('ops', 'n/a')}"))
        return out

    def tf_ratios(self, ds):
        get = lambda s: self.get(ds, 1, s)
        if not get("tf-monarch"):
            return []
        lines = []
        m, p, l, c = get("tf-monarch"), get("tf-vanilla-pfs"), get("tf-vanilla-local"), \
            get("tf-vanilla-caching")
        if p:
            lines.append(f"tf-monarch epoch 1 / tf-vanilla-pfs epoch 1 = "
                         f"{m['epochs'][0]['seconds'] / p['epochs'][0]['seconds']:.3f}")
        for i in range(1, len(m["epochs"])):
            if l:
                lines.append(f"tf-monarch epoch {i + 1} / tf-vanilla-local = "
                             f"{m['epochs'][i]['seconds'] / l['epochs'][i]['seconds']:.3f}")
            if c:
                lines.append(f"tf-monarch epoch {i + 1} / tf-vanilla-caching = "
                             f"{m['epochs'][i]['seconds'] / c['epochs'][i]['seconds']:.3f}")
        return lines

    def charts(self, out):
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        names = [d["name"] for d in self.datasets]
        made = []
        for metric, ylabel, fname, value in (
                ("time", "epoch wall time (s)", "epoch_time.png", lambda e: e["seconds"]),
                ("ops", "PFS operations per epoch", "pfs_ops.png", lambda e: e["pfs"].get("ops")),
                ("bytes", "PFS MiB read per epoch", "pfs_bytes.png",
                 lambda e: (e["pfs"].get("bytes_read") or 0) / MiB)):
            scenarios = [sc for sc in (1, 2, 3)
                         if any(s == sc for ds in names for s, _, _ in self.rows(ds))] or [1]
            fig, axes = plt.subplots(len(names), len(scenarios),
                                     figsize=(6.5 * len(scenarios), 4.2 * len(names)), squeeze=False)
            for row, ds in enumerate(names):
                for col, scenario in enumerate(scenarios):
                    ax = axes[row][col]
                    rows = [(s, r) for sc, s, r in self.rows(ds) if sc == scenario]
                    if not rows:
                        ax.set_visible(False)
                        continue
                    n_ep = max(len(r["epochs"]) for _, r in rows)
                    width = 0.8 / len(rows)
                    for k, (setup, r) in enumerate(rows):
                        vals = [value(e) for e in r["epochs"]]
                        vals = [v if v is not None else 0 for v in vals]
                        xs = [i + (k - (len(rows) - 1) / 2) * width for i in range(len(vals))]
                        color = plt.get_cmap("tab10")(SETUP_ORDER.index(setup) % 10)
                        bars = ax.bar(xs, vals, width, label=setup, color=color,
                                      hatch="//" if setup.startswith("tf-") else
                                      ("\\\\" if setup == "mp-monarch-announced" else None))
                        if metric != "time":
                            ax.bar_label(bars, labels=[f"{v:.0f}" for v in vals], fontsize=6,
                                         rotation=90, padding=2)
                    ax.set_xticks(range(n_ep), [f"epoch {i + 1}" for i in range(n_ep)])
                    ax.set_ylabel(ylabel)
                    title = {1: "fits in the local tier", 2: "local tier = 50% of the data",
                             3: f"DataLoader, {self.meta.get('workers', 4)} workers"}[scenario]
                    ax.set_title(f"{ds}: scenario {scenario} ({title})", fontsize=10)
                    top = max([value(e) or 0 for _, r in rows for e in r["epochs"]] + [1e-9])
                    ax.set_ylim(0, top * (1.5 if len(rows) > 3 else 1.3))
                    ax.legend(fontsize=7, ncol=4 if len(rows) > 3 else len(rows),
                              loc="upper center")
            fig.suptitle(f"Monarch suite ({self.meta['scale']} scale, PFS: {self.meta['pfs']}) - {ylabel}")
            fig.tight_layout()
            fig.savefig(os.path.join(out, fname), dpi=110)
            plt.close(fig)
            made.append(fname)
        return made

    def write(self, out):
        os.makedirs(out, exist_ok=True)
        charts = self.charts(out)
        meta = self.meta
        L = [f"# Monarch experiment suite ({meta['scale']} scale)", "",
             "Generated by `bench/suite/run_suite.py`; see `bench/suite/README.md`.", "",
             f"- Command (as root, from the repository root): `{meta['command']}`",
             f"- Commit: `{meta.get('commit') or 'not recorded'}` (`--commit` when given, for a "
             "`--build` made elsewhere; else `git rev-parse --short HEAD` when the run started, "
             "+dirty if bench/, src/, include/, tools/ or python/ differed).",
             f"- Run: {meta['started']} to {meta.get('finished', '?')}, host {meta['host']}, "
             f"kernel {meta['kernel']}, {meta['cores']} cores, {meta['ram_gib']} GiB RAM.",
             f"- Load before: `{meta['uptime_before']}`"
             + (f" (the suite ran at nice {meta['nice']}, its setups too)" if meta.get("nice") else ""),
             f"- Load after: `{meta.get('uptime_after', '?')}`"]
        rerun = meta.get("rerun")
        if rerun:  # Runs replaced by a later run's (merged by hand, reason recorded).
            L.append(f"- **Re-run:** {', '.join(rerun['runs'])} come from a later run "
                     f"(`{rerun['command']}`, commit `{rerun['commit']}`, {rerun['started']} to "
                     f"{rerun['finished']}): {rerun['why']}.")
        samples = meta.get("load_samples") or []
        others = meta.get("other_cores_samples") or []
        if samples:
            L.append(f"- 1-min load average sampled every 5 s during the run: mean "
                     f"{sum(samples) / len(samples):.2f}, max {max(samples):.2f} "
                     f"({len(samples)} samples; the suite's own blocked readers count too).")
        if others:
            mean = sum(others) / len(others)
            top = ", ".join(f"{k} {v:.0f} s" for k, v in meta.get("other_cpu_seconds", {}).items())
            L.append(f"- CPU used by processes outside the suite, in cores: mean {mean:.2f}, "
                     f"max {max(others):.2f} of {meta['cores']}" + (f" (top: {top})" if top else "")
                     + ".")
            if mean > 0.25 or max(others) > 1.0:
                L.append(f"- **The machine was shared** during this run: other jobs used "
                         f"{mean:.2f} of {meta['cores']} cores on average (up to {max(others):.2f}), "
                         "competing for CPU and disk. These are single runs: expect noise of 10% "
                         "or more in the times, and compare setups using the per-run load "
                         "column.")
        if meta["pfs"] == "moosefs":
            L.append(f"- PFS: a real MooseFS (scripts/moosefs.sh), "
                     f"`{json.dumps(meta.get('emulator_config'))}`. PFS counters: the bytes that "
                     "crossed the veth pair from the chunk server and mfsmount's own operation "
                     "counts, read and reset at each epoch boundary as for the emulator.")
        elif meta["pfs"] == "pfs-emulator":
            L.append(f"- PFS: `tools/pfs_emulator` FUSE mount over the generated dataset, config "
                     f"`{json.dumps(meta.get('emulator_config'))}`. PFS counters are the emulator's, "
                     "read and reset exactly at each epoch boundary inside the one process that "
                     "runs all epochs (`monarch-epochs --before-epoch` running "
                     "`bench/suite/epoch_phase.py`; the TF reader's own handshake).")
        else:
            L.append(f"- PFS: real directory `{meta['pfs']}` (no emulator). PFS figures are "
                     "application-level read calls: Monarch's source-tier counters, and for "
                     "vanilla-pfs the read calls the job issued. Opens and other metadata traffic "
                     "are not counted (see bench/suite/README.md for Lustre's own counters).")
        L += [f"- {meta['epochs']} epochs, {meta['threads']} reader threads, the same seeded "
              f"shuffle (seed {EPOCH_SEED}) for every setup; page cache "
              + ("dropped before every epoch." if meta["drop_caches"] else "NOT dropped (--no-drop-caches)."),
              f"- TensorFlow setups: {meta['tf']}."]
        if any(r["scenario"] == 3 for r in self.results):
            L.append(f"- Scenario 3 (mp-*): a PyTorch DataLoader with {meta.get('workers', 4)} "
                     "worker processes, batch 32, RandomSampler seeded with the same seed "
                     "(`bench/suite/torch_reader.py`); mp-monarch reads through the node service "
                     "(`node: {shared: true}`, every worker a client) with scenario 1's tier; "
                     "mp-monarch-announced also announces each epoch's order "
                     "(`monarch.torch.AnnouncingSampler`). Imagenet samples are whole files, "
                     "shards samples 256 KiB records. Every sample's CRC32 and length were "
                     "checked against a manifest made from the generated files, and each "
                     "sample came exactly once per epoch.")
        L += ["", "Datasets (generated with fixed seed "
              f"{GENERATE_SEED} by `monarch-epochs --generate`):", ""]
        for d in self.datasets:
            if d["profile"] == "imagenet":
                shape = "~110 KiB ImageNet-like files, whole-file reads"
            else:
                shape = f"{d['file_size'] / MiB:.0f} MiB shards, {d['read_size'] // 1024} KiB reads"
            L.append(f"- **{d['name']}**: {d.get('files')} files, "
                     f"{d.get('bytes', 0) / MiB:.0f} MiB ({shape}).")
        L += ["", "Columns: *startup* is process start to the first epoch (Monarch walks the "
              "dataset on the PFS; plain mode lists it the same way), not included in epoch times. "
              "*settle* is the untimed wait for Monarch's background placement after each epoch "
              "(its PFS traffic is counted in that epoch). *PFS ops* = metadata requests "
              "(lookup, getattr, open, readdir, ...) + READ requests that reached the PFS. "
              "*Monarch read* = its own tier counters per epoch: MiB read from the local tier, "
              "MiB read from the source (by readers and background promotions), and MiB the job got "
              "that neither counted (from in-memory staging). Scenario 2's vanilla-pfs row is "
              "scenario 1's run (it does not depend on the tier size). *load*: 1-min load "
              "average before and after the run, and the mean cores used by processes outside "
              "the suite during it (sampled every 5 s; - for runs shorter than that).", ""]
        summary = []
        for d in self.datasets:
            name = d["name"]
            if not any(r["dataset"] == name for r in self.results):
                continue
            L += [f"## {name}", "", self.table(name), "", "### Targets", "",
                  "| target | measured | limit | met | margin | profile |", "|---|---|---|---|---|---|"]
            for t, measured, limit, met, margin, profile in self.targets(name):
                status = "n/a" if met is None else ("met" if met else "**missed**")
                L.append(f"| {t} | {measured} | {limit} | {status} | {margin} | {profile} |")
                summary.append(f"{name}: {t}: {measured} -> {status}")
            tf = self.tf_ratios(name)
            if tf:
                L += ["", "TensorFlow ratios (informational): " + "; ".join(tf) + "."]
            L.append("")
        if os.path.exists(os.path.join(out, "ANALYSIS.md")):
            L += ["Analysis of the missed targets (written by hand for the recorded run): "
                  "[ANALYSIS.md](ANALYSIS.md).", ""]
        L += ["## Charts", ""] + [f"![{c}]({c})" for c in charts] + [
            "", "Raw data: `results.json` (every run's command, per-epoch times, the emulator's "
            "full counters per phase, Monarch's per-tier figures and final stats).", ""]
        with open(os.path.join(out, "results.md"), "w") as f:
            f.write("\n".join(L))
        self.summary = "\n".join(summary + [f"wrote {out}/results.md and {', '.join(charts)}"])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--scale", choices=sorted(SCALES), default="full")
    ap.add_argument("--datasets", default="imagenet,shards", help="comma list (imagenet,shards)")
    ap.add_argument("--setups", default="vanilla-pfs,vanilla-local,monarch,tf,mp",
                    help="comma list: vanilla-pfs, vanilla-local, monarch (both scenarios), "
                         "monarch-s1, monarch-s2, tf (all TF setups) or single tf-* setups, "
                         "mp (scenario 3: all DataLoader setups; mp-monarch-announced on "
                         "imagenet only unless named) or single mp-* setups")
    ap.add_argument("--imagenet-files", type=int, default=0, help="override the scale's count")
    ap.add_argument("--shards", type=int, default=0, help="override the scale's shard count")
    ap.add_argument("--shard-size", type=int, default=0, help="override the shard size (bytes)")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--threads", type=int, default=4, help="reader threads")
    ap.add_argument("--workers", type=int, default=4,
                    help="DataLoader worker processes of the mp-* setups (scenario 3)")
    ap.add_argument("--placement-threads", type=int, default=0,
                    help="Monarch placement.threads (0: its default, one per core)")
    ap.add_argument("--pfs-dir", default=None,
                    help="a directory on a real PFS: generate the datasets there and use it as "
                         "the source, without the emulator")
    ap.add_argument("--emulator-flags", default="",
                    help="extra monarch-pfs-emulator flags (default: its Lustre-like defaults)")
    add_source_flags(ap)
    add_readahead_flag(ap)
    ap.add_argument("--tf", choices=["auto", "on", "off"], default="auto",
                    help="TensorFlow setups: auto = when monarch_tf and its plugin are found")
    ap.add_argument("--tf-plugin", default=None, help="libmonarch_tf_plugin.so to use")
    ap.add_argument("--build", default=os.path.join(REPO, "build"))
    ap.add_argument("--commit", default=None,
                    help="the commit --build was built from, for the report (default: the "
                         "repository's HEAD, +dirty when its code differs from it)")
    ap.add_argument("--workdir", default="/var/tmp/monarch-suite",
                    help="datasets, local copies, tiers, mounts, logs (on the local disk)")
    ap.add_argument("--out", default=os.path.join(REPO, "bench", "results", "suite"))
    ap.add_argument("--no-drop-caches", action="store_true", help="for runs without root")
    ap.add_argument("--keep", action="store_true", help="keep the tier directories afterwards")
    ap.add_argument("--report-only", action="store_true",
                    help="only rewrite results.md and the charts from --out's results.json")
    a = ap.parse_args()
    a.datasets = a.datasets.split(",")
    a.setups = a.setups.split(",")
    ensure_matplotlib()
    if a.report_only:
        with open(os.path.join(a.out, "results.json")) as f:
            saved = json.load(f)
        report = Report(saved["meta"], saved["results"], saved["meta"]["datasets"])
        report.write(os.path.abspath(a.out))
        print(report.summary)
        return

    def on_term(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")
    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGHUP, on_term)
    Suite(a).run()


if __name__ == "__main__":
    main()
