#!/usr/bin/env python3
"""A RAM tier that yields before the job is killed, in a real memory cgroup.

The scenario of issue 31, scaled down: a cgroup v1 memory cgroup limited to
LIMIT; in it, a node service (`monarch serve`, autostart false) with a RAM
tier of TIER, filled by a client that reads a generated dataset of DATA
through it; then a "job" in the same cgroup allocates and touches JOB, more
than is left. With memory.watch on:

  - neither the job nor the service is OOM-killed (exit statuses, the service
    still answering, the cgroup's `oom_kill` count in memory.oom_control);
  - the tier shrank (stats: memory_shrinks, memory_shed_bytes,
    effective_capacity below capacity, resident_bytes down);
  - an epoch read afterwards through the service, by a client that compares
    every read with the source file (`monarch-epochs --verify`), is exact.

With memory.watch off (`--watch off`, what bench/memory_pressure.py runs
too) the same is only recorded: it is expected to be OOM-killed.

usage: memory_pressure_test.py --build-dir BUILD [--watch on|off] [--json FILE]
Exit code: 0 pass, 1 fail, 77 skip (no cgroup v1 memory controller, or not
root). The cgroup is removed whatever happens.
"""

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from process_util import SKIP, Failure, Skip, check, log, write_random_files  # noqa: E402

MiB = 1 << 20
V1_ROOT = "/sys/fs/cgroup/memory"

# Half the figures (1,536 MiB limit, 1 GiB tier holding 900 MiB, an
# 800 MiB job), so that the test stays within ~30 s.
DEFAULTS = dict(limit_mib=768, tier_mib=512, data_mib=450, job_mib=400, file_mib=2,
                headroom_mib=192, job_hold_s=2.0)


# --------------------------------------------------------------------------
# The cgroup.


def own_memory_cgroup():
    """This process's v1 memory cgroup directory, or the hierarchy's root."""
    try:
        with open("/proc/self/cgroup") as f:
            for line in f:
                _, controllers, path = line.rstrip("\n").split(":", 2)
                if "memory" in controllers.split(","):
                    candidate = os.path.join(V1_ROOT, path.lstrip("/"))
                    if os.path.isdir(candidate):
                        return candidate
    except OSError:
        pass
    return V1_ROOT


class Cgroup:
    """A v1 memory cgroup of its own, under this process's, removed by close()."""

    def __init__(self, limit_bytes):
        if os.geteuid() != 0:
            raise Skip("not root: cannot create a memory cgroup")
        if not os.path.exists(os.path.join(V1_ROOT, "memory.limit_in_bytes")):
            raise Skip("no cgroup v1 memory controller mounted at %s" % V1_ROOT)
        name = "monarch-mp-%d-%d" % (os.getpid(), int(time.time() * 1000) % 100000)
        self.path = None
        for parent in (own_memory_cgroup(), V1_ROOT):
            try:
                os.mkdir(os.path.join(parent, name))
                self.path = os.path.join(parent, name)
                break
            except OSError as e:
                log("cannot create a cgroup under %s: %s" % (parent, e))
        if self.path is None:
            raise Skip("cannot create a memory cgroup under %s" % V1_ROOT)
        self.write("memory.limit_in_bytes", str(limit_bytes))
        # No swap here; where there is, the limit must hold for swap too.
        try:
            self.write("memory.memsw.limit_in_bytes", str(limit_bytes))
        except OSError:
            pass

    def write(self, name, value):
        with open(os.path.join(self.path, name), "w") as f:
            f.write(value)

    def read(self, name):
        with open(os.path.join(self.path, name)) as f:
            return f.read()

    def oom_kills(self):
        """memory.oom_control's oom_kill: processes the OOM killer killed here."""
        for line in self.read("memory.oom_control").splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
        return 0

    def enter(self):
        """For preexec_fn: moves the calling (child) process into the cgroup."""
        procs = os.path.join(self.path, "cgroup.procs")

        def move():
            with open(procs, "w") as f:
                f.write(str(os.getpid()))
        return move

    def pids(self):
        return [int(p) for p in self.read("cgroup.procs").split()]

    def close(self):
        if self.path is None:
            return
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                pids = self.pids()
            except OSError:
                break
            if not pids:
                break
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.1)
        for _ in range(50):
            try:
                os.rmdir(self.path)
                break
            except FileNotFoundError:
                break
            except OSError:
                time.sleep(0.1)
        else:
            log("could not remove cgroup %s" % self.path)
        self.path = None


# --------------------------------------------------------------------------
# The scenario.


def write_dataset(root, data_bytes, file_bytes):
    """Random files adding up to data_bytes; written by this process, so their
    page cache is charged here, not to the test cgroup."""
    count = max(1, data_bytes // file_bytes)
    # Sizes that are not whole pages, so that copies share pages.
    return write_random_files(root, {"shard%d/part%04d.bin" % (i % 8, i):
                                     file_bytes - (i * 4099) % 65536 for i in range(count)})


JOB = r"""
import sys, time
total, step, hold = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
held = []
start = time.monotonic()
while sum(len(b) for b in held) < total:
    held.append(b"\x5a" * min(step, total - sum(len(b) for b in held)))  # Written: every page touched.
print("allocated %d bytes in %.3f s" % (total, time.monotonic() - start), flush=True)
time.sleep(hold)
assert all(b.count(b"\x5a") == len(b) for b in held)
print("ok", flush=True)
"""


def node_stats(monarch, rt):
    r = subprocess.run([monarch, "stats", "--json", "--runtime-dir", rt], capture_output=True,
                       text=True, timeout=30)
    if r.returncode != 0:
        return None
    return json.loads(r.stdout)


def counter(stats, name):
    """A top-level counter of `monarch stats --json`, else 0."""
    node = stats.get("node", stats) if stats else {}
    value = node.get(name, stats.get(name, 0) if stats else 0)
    return value if isinstance(value, int) else 0


def ram_tier(stats):
    node = stats.get("node", stats)
    for t in node.get("tiers", stats.get("tiers", [])):
        if t.get("name") == "ram":
            return t
    raise Failure("no ram tier in the stats: %s" % json.dumps(stats)[:2000])


def run_scenario(build, watch, limit_mib, tier_mib, data_mib, job_mib, file_mib, headroom_mib,
                 job_hold_s, keep=False):
    """Runs the scenario once; returns what happened (a dict). Raises Skip."""
    build = os.path.abspath(build)
    monarch = os.path.join(build, "monarch")
    epochs = os.path.join(build, "monarch-epochs")
    for binary in (monarch, epochs):
        check(os.access(binary, os.X_OK), "missing binary %s (build the project first)" % binary)
    result = dict(watch=watch, limit_mib=limit_mib, tier_mib=tier_mib, data_mib=data_mib,
                  job_mib=job_mib, headroom_mib=headroom_mib)
    work = tempfile.mkdtemp(prefix="mmp-", dir="/tmp")
    data_dir = tempfile.mkdtemp(prefix="mmp-data-", dir="/var/tmp")
    cgroup = None
    procs = []
    service = None
    rt = os.path.join(work, "rt")
    config = None
    try:
        cgroup = Cgroup(limit_mib * MiB)
        log("cgroup %s, limit %d MiB" % (cgroup.path, limit_mib))
        sizes = write_dataset(data_dir, data_mib * MiB, file_mib * MiB)
        result["files"] = len(sizes)
        result["dataset_bytes"] = sum(sizes.values())
        config = os.path.join(work, "monarch.yaml")
        with open(config, "w") as f:
            f.write("dataset: {path: %s}\n" % data_dir)
            f.write("tiers:\n  - {kind: ram, capacity: %dMiB}\n  - {kind: source}\n" % tier_mib)
            f.write("node: {shared: true, runtime_dir: %s, autostart: false, idle_exit: 0}\n" % rt)
            # The staging budget (256 MiB by default) is memory of the
            # service's too: at this scale it alone would press the cgroup
            # while the tier fills.
            f.write("placement: {max_staging_bytes: 32MiB}\n")
            f.write("memory: {watch: %s, headroom: %dMiB, interval: 50ms}\n"
                    % ("true" if watch else "false", headroom_mib))
            f.write("logging: {level: info}\n")
        service_log = open(os.path.join(work, "serve.log"), "w")
        service = subprocess.Popen([monarch, "serve", "--config", config], stdout=service_log,
                                   stderr=subprocess.STDOUT, preexec_fn=cgroup.enter())
        procs.append(service)
        deadline = time.monotonic() + 60
        while node_stats(monarch, rt) is None:
            check(service.poll() is None, "monarch serve exited %s" % service.returncode)
            check(time.monotonic() < deadline, "the service did not come up in 60 s")
            time.sleep(0.05)

        # Fill the tier: one epoch through the service, from inside the cgroup.
        t0 = time.monotonic()
        fill = subprocess.run([epochs, "--config", config, "--epochs", "1", "--threads", "2",
                               "--settle"], capture_output=True, text=True, timeout=300,
                              preexec_fn=cgroup.enter())
        check(fill.returncode == 0, "the filling epoch failed (%d):\n%s%s"
              % (fill.returncode, fill.stdout, fill.stderr))
        before = node_stats(monarch, rt)
        check(before is not None, "no stats from the service after the fill")
        tier_before = ram_tier(before)
        result["fill_s"] = round(time.monotonic() - t0, 2)
        result["tier_bytes_before"] = tier_before.get("bytes_used", 0)
        result["resident_before"] = tier_before.get("resident_bytes", 0)
        result["usage_before_mib"] = round(int(cgroup.read("memory.usage_in_bytes")) / MiB, 1)
        log("filled: %s" % json.dumps(result))
        check(result["tier_bytes_before"] >= 0.9 * result["dataset_bytes"],
              "the RAM tier holds %d bytes of the %d-byte dataset"
              % (result["tier_bytes_before"], result["dataset_bytes"]))

        # The job: allocates and touches more than is left.
        job_start = time.monotonic()
        job = subprocess.Popen([sys.executable, "-c", JOB, str(job_mib * MiB), str(16 * MiB),
                                str(job_hold_s)], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, preexec_fn=cgroup.enter())
        procs.append(job)
        shrunk_at = None
        while job.poll() is None and time.monotonic() - job_start < 60:
            stats = node_stats(monarch, rt) if service.poll() is None else None
            if shrunk_at is None and stats is not None and counter(stats, "memory_shrinks") > 0:
                shrunk_at = time.monotonic() - job_start
            time.sleep(0.05)
        if job.poll() is None:
            job.kill()
        out, err = job.communicate(timeout=30)
        result["job_exit"] = job.returncode
        result["job_output"] = (out + err).strip()[-400:]
        result["job_oom_killed"] = job.returncode == -signal.SIGKILL
        # The OOM killer counts a kill when it sends it: if it killed
        # anything, wait for the service's end (it may be the one) before
        # saying whether it lives.
        if cgroup.oom_kills() > 0:
            try:
                service.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        result["service_alive"] = service.poll() is None
        result["service_exit"] = service.returncode
        result["service_oom_killed"] = service.returncode == -signal.SIGKILL
        result["cgroup_oom_kills"] = cgroup.oom_kills()
        result["cgroup_failcnt"] = int(cgroup.read("memory.failcnt"))
        result["cgroup_max_usage_mib"] = round(int(cgroup.read("memory.max_usage_in_bytes")) / MiB,
                                               1)
        result["time_to_shrink_s"] = round(shrunk_at, 3) if shrunk_at is not None else None

        after = node_stats(monarch, rt) if result["service_alive"] else None
        if after is not None:
            tier_after = ram_tier(after)
            for name in ("memory_shrinks", "memory_grows", "memory_shed_bytes",
                         "memory_dropped_bytes", "memory_demoted_bytes", "memory_released_bytes"):
                result[name] = counter(after, name)
            result["effective_capacity"] = tier_after.get("effective_capacity")
            result["capacity"] = tier_after.get("capacity")
            result["tier_bytes_after"] = tier_after.get("bytes_used")
            result["resident_after"] = tier_after.get("resident_bytes")
            # Every byte through the service afterwards, compared with the
            # source: from the tier where copies are left, else the source.
            verify = subprocess.run([epochs, "--config", config, "--epochs", "1", "--threads",
                                     "2", "--verify"], capture_output=True, text=True,
                                    timeout=300, preexec_fn=cgroup.enter())
            result["verify_exit"] = verify.returncode
            result["bytes_exact"] = verify.returncode == 0
            if verify.returncode != 0:
                result["verify_output"] = (verify.stdout + verify.stderr)[-2000:]
            result["service_alive_after_verify"] = service.poll() is None
        else:
            result["bytes_exact"] = None
        with open(os.path.join(work, "serve.log")) as f:
            lines = [l.strip() for l in f if "memory pressure" in l or "memory.watch" in l or
                     "pages on" in l]  # Where the RAM tier is, and its page size.
        result["log"] = lines[:6]
        return result
    finally:
        if service is not None and service.poll() is None:
            subprocess.run([monarch, "stop", "--runtime-dir", rt], capture_output=True,
                           timeout=40)
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        # A stopped service keeps its RAM copies for the next one
        # (node.keep_ram, on a keeper's tmpfs or /dev/shm); none follows, so
        # they and the keeper go with the test.
        if config is not None:
            subprocess.run([monarch, "purge", "--config", config], capture_output=True,
                           timeout=60)
        if cgroup is not None:
            cgroup.close()
        if keep:
            log("kept %s %s" % (work, data_dir))
        else:
            subprocess.run(["rm", "-rf", work, data_dir])


def assert_yielded(r):
    check(not r["job_oom_killed"] and r["job_exit"] == 0,
          "the job did not finish (exit %s): %s" % (r["job_exit"], r["job_output"]))
    check(r["service_alive"] and not r["service_oom_killed"],
          "the service died (exit %s)" % r["service_exit"])
    check(r["cgroup_oom_kills"] == 0, "the cgroup counts %d OOM kills" % r["cgroup_oom_kills"])
    check(r.get("memory_shrinks", 0) >= 1, "the RAM tier never shrank")
    check(r.get("memory_shed_bytes", 0) > 0, "nothing was shed")
    check(r["effective_capacity"] is not None and r["effective_capacity"] < r["capacity"],
          "the effective capacity %s is not below the capacity %s"
          % (r["effective_capacity"], r["capacity"]))
    check(r.get("memory_released_bytes", 0) > 0, "no memory was given back to the kernel")
    check(r["resident_after"] < r["resident_before"],
          "the tier's memory did not go down: %s -> %s" % (r["resident_before"],
                                                           r["resident_after"]))
    check(r["bytes_exact"], "bytes read afterwards differ from the source:\n%s"
          % r.get("verify_output", ""))
    check(r["service_alive_after_verify"], "the service died during the verifying epoch")


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--build-dir", required=True)
    parser.add_argument("--watch", choices=("on", "off"), default="on")
    parser.add_argument("--json", help="write the result here")
    args = parser.parse_args()
    try:
        result = run_scenario(args.build_dir, args.watch == "on",
                              keep=bool(os.environ.get("MONARCH_TEST_KEEP")), **DEFAULTS)
        print(json.dumps(result, indent=1))
        if args.json:
            with open(args.json, "w") as f:
                json.dump(result, f, indent=1)
        if args.watch == "on":
            assert_yielded(result)
        print("PASS")
        return 0
    except Skip as e:
        print("SKIP: %s" % e)
        return SKIP
    except Failure as e:
        print("FAIL: %s" % e)
        return 1
    except Exception:  # noqa: BLE001
        traceback.print_exc()
        return 1


if __name__ == "__main__":
    sys.exit(main())
