#!/usr/bin/env python3
"""Monarch under a real Slurm: a one-machine cluster the test starts itself.

The test writes a munge key and a minimal slurm.conf into its own work
directory (nothing under /etc), starts munged, slurmctld and slurmd for this
machine, waits until sinfo shows the node idle, and then:

  serve     `srun --ntasks-per-node=1 monarch serve` starts the node service
            (a RAM tier, node.autostart off); `srun -n 2` readers of its
            node.shared config read 2 epochs through it with every byte
            checked (--verify). Checks: the service runs as task 0 of the
            job srun got; the readers' bytes are exact and the node read the
            source once (source bytes_read == dataset, the RAM tier holds the
            dataset); the service's per-client stats, taken while each reader
            is still connected, account for every byte that reader read; then
            `scancel --signal=TERM` stops the service cleanly (srun exits 0,
            the job leaves the queue, the service's lock is free).
  peers     `srun -n 4` readers, one identical config with remote.enabled,
            remote.rank/size `auto` and rendezvous_dir `.../rdv/${SLURM_JOB_ID}`,
            each reading its own --partition $SLURM_PROCID/$SLURM_NTASKS of 3
            epochs with --verify. Checks: every task exits 0 with no error or
            mismatch; each process's rank is its SLURM_PROCID and it saw 4
            peers; the source is read once across the 4 (per-epoch source
            bytes [dataset, 0, 0], the processes' source bytes_read sum to the
            dataset) and peers served bytes every epoch; the one directory
            under rdv/ is named after the job id srun got.
  jobs      jobs of one user reading one dataset through one config with no
            node.runtime_dir meet in one autostarted service: job A
            (`srun -n 2`, 2 epochs) starts it and ends, and the service
            outlives the step, listing A as left with both tasks' reads; job
            B, cancelled (`scancel`) mid-read, is listed as left soon after,
            its copies kept; job C reads everything as hits (the source was
            read once for the three); then the node is drained and, with no
            job left, the service exits by itself after node.idle_exit.

Nothing of Slurm's or munge's is left running at the end, whatever happens;
daemons (and job processes) left by an earlier run in the same build
directory are killed first.

usage: slurm_test.py --build-dir BUILD
Exit code: 0 pass, 1 fail, 77 skip (Slurm cannot run here: the reason is
printed). MONARCH_TEST_KEEP=1 keeps the work directory to look at.
"""

import argparse
import fcntl
import hashlib
import json
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from process_util import (SKIP, START, Failure, Skip, check, final_stats, log,  # noqa: E402
                          write_dataset)


def tail(path, lines=30):
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-lines:])
    except OSError as e:
        return "(%s)" % e


# Variables a launcher (or an enclosing Slurm job) may have set. The test's
# processes must find their rank and size from the Slurm it started alone.
LAUNCHER_PREFIXES = ("SLURM_", "SLURMD_", "SBATCH_", "SALLOC_", "SRUN_", "FLUX_", "OMPI_",
                     "PMIX_", "PMI_")
LAUNCHER_NAMES = ("MONARCH_RANK", "MONARCH_SIZE", "MONARCH_CONFIG")


def clean_environment(conf):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(LAUNCHER_PREFIXES) and k not in LAUNCHER_NAMES}
    env["SLURM_CONF"] = conf
    return env


# --------------------------------------------------------------------------
# Processes of an earlier run.


def proc_text(pid, name):
    try:
        with open("/proc/%d/%s" % (pid, name), "rb") as f:
            return f.read().decode(errors="replace").split("\0")
    except OSError:
        return None


def ancestors():
    pids, pid = set(), os.getpid()
    while pid > 1:
        pids.add(pid)
        try:
            with open("/proc/%d/stat" % pid) as f:
                pid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
    return pids


def processes_of(work, conf):
    """Pids whose command line names a path in `work`, or whose environment
    has SLURM_CONF=`conf` (job steps, slurmstepd): this test's, and no one
    else's. Never this process or its ancestors."""
    mine = ancestors()
    prefix = work + "/"
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) in mine:
            continue
        pid = int(entry)
        cmdline = proc_text(pid, "cmdline")
        if not cmdline or cmdline == [""]:
            continue  # A kernel thread or gone.
        if any(prefix in arg or arg == work for arg in cmdline):
            found.append(pid)
            continue
        environ = proc_text(pid, "environ") or []
        if "SLURM_CONF=" + conf in environ:
            found.append(pid)
    return found


def kill_leftovers(work, conf, why):
    pids = processes_of(work, conf)
    for pid in pids:
        log("%s: SIGKILL pid %d: %s" % (why, pid, " ".join(proc_text(pid, "cmdline") or [])[:160]))
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + 10
    while pids and time.monotonic() < deadline:
        pids = [p for p in pids if alive(p)]
        time.sleep(0.05)


def alive(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def free_ports(count):
    """Ports no one listens on now: a slurmctld or slurmd of anything else
    on this machine (or of an earlier run) is never in the way."""
    sockets = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


# --------------------------------------------------------------------------
# The one-machine cluster.


class Cluster:
    def __init__(self, build, work):
        self.build = build
        self.work = work
        self.monarch = os.path.join(build, "monarch")
        self.epochs_bin = os.path.join(build, "monarch-epochs")
        self.munge_dir = os.path.join(work, "munge")
        self.slurm_dir = os.path.join(work, "slurm")
        self.conf = os.path.join(self.slurm_dir, "slurm.conf")
        self.env = clean_environment(self.conf)
        self.daemons = []  # (name, Popen, log path)
        self.host = socket.gethostname().split(".")[0]

    # -- set-up --

    def write_munge_key(self):
        try:
            munge = pwd.getpwnam("munge")
        except KeyError:
            raise Skip("no 'munge' user: is the munge package installed?")
        os.makedirs(self.munge_dir)
        # munged wants its socket's directory searchable by all, and its key
        # readable by its own user only.
        os.chown(self.munge_dir, munge.pw_uid, munge.pw_gid)
        os.chmod(self.munge_dir, 0o711)
        key = os.path.join(self.munge_dir, "munge.key")
        fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o400)
        os.write(fd, os.urandom(128))
        os.close(fd)
        os.chown(key, munge.pw_uid, munge.pw_gid)
        return munge

    def start_munged(self):
        munge = self.write_munge_key()
        self.munge_socket = os.path.join(self.munge_dir, "munged.sock")
        cmd = ["munged", "--foreground", "--socket=" + self.munge_socket,
               "--key-file=" + os.path.join(self.munge_dir, "munge.key"),
               "--pid-file=" + os.path.join(self.munge_dir, "munged.pid"),
               "--log-file=" + os.path.join(self.munge_dir, "munged.log"),
               "--seed-file=" + os.path.join(self.munge_dir, "munged.seed")]
        proc = self.spawn("munged", cmd, os.path.join(self.munge_dir, "munged.out"),
                          user=munge.pw_uid, group=munge.pw_gid, extra_groups=[])
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise Skip("munged exited %d:\n%s\n%s" % (
                    proc.returncode, tail(os.path.join(self.munge_dir, "munged.out")),
                    tail(os.path.join(self.munge_dir, "munged.log"))))
            r = subprocess.run("munge -n -S %s | unmunge -S %s" % (self.munge_socket,
                                                                   self.munge_socket),
                               shell=True, capture_output=True, text=True, env=self.env)
            if r.returncode == 0 and "Success" in r.stdout:
                log("munged up (pid %d)" % proc.pid)
                return
            time.sleep(0.1)
        raise Skip("munged did not answer in 20 s:\n%s" % tail(os.path.join(self.munge_dir,
                                                                            "munged.log")))

    def write_conf(self):
        for d in ("state", "spool"):
            os.makedirs(os.path.join(self.slurm_dir, d))
        s = self.slurm_dir
        # A job id nobody would guess: the rendezvous directory must be named
        # after the one srun got, not after a constant.
        self.first_job_id = 1000 + int.from_bytes(os.urandom(3), "little") % 900000
        ctld_port, slurmd_port = free_ports(2)
        lines = [
            "ClusterName=monarchtest",
            "SlurmctldHost=%s" % self.host,
            "SlurmctldPort=%d" % ctld_port,
            "SlurmdPort=%d" % slurmd_port,
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            "AuthInfo=socket=%s" % self.munge_socket,
            "StateSaveLocation=%s/state" % s,
            "SlurmdSpoolDir=%s/spool" % s,
            "SlurmctldPidFile=%s/slurmctld.pid" % s,
            "SlurmdPidFile=%s/slurmd.pid" % s,
            "SlurmctldLogFile=%s/slurmctld.log" % s,
            "SlurmdLogFile=%s/slurmd.log" % s,
            # No cgroups here: processes are tracked through /proc, tasks not bound.
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_CPU",
            # The node may have fewer cores than the 4 tasks need: declare 4.
            "SlurmdParameters=config_overrides",
            "MpiDefault=none",
            "ReturnToService=2",
            "SchedulerType=sched/builtin",
            "AccountingStorageType=accounting_storage/none",
            "JobCompType=jobcomp/none",
            "JobAcctGatherType=jobacct_gather/none",
            "FirstJobId=%d" % self.first_job_id,
            "KillWait=5",
            "NodeName=%s CPUs=4 State=UNKNOWN" % self.host,
            "PartitionName=monarch Nodes=%s Default=YES MaxTime=INFINITE State=UP" % self.host,
        ]
        with open(self.conf, "w") as f:
            f.write("\n".join(lines) + "\n")

    def spawn(self, name, cmd, out, **kwargs):
        with open(out, "w") as f:
            proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, env=self.env, cwd=self.work,
                                    **kwargs)
        self.daemons.append((name, proc, out))
        return proc

    def start(self):
        for binary in ("munged", "munge", "unmunge", "slurmctld", "slurmd", "srun", "sinfo",
                       "squeue", "scancel"):
            if shutil.which(binary) is None and not os.access("/usr/sbin/" + binary, os.X_OK):
                raise Skip("%s not found: install slurm-wlm and munge (scripts/install_deps.sh)"
                           % binary)
        self.env["PATH"] = self.env.get("PATH", "/usr/bin:/bin") + ":/usr/sbin:/sbin"
        self.start_munged()
        self.write_conf()
        s = self.slurm_dir
        ctld = self.spawn("slurmctld", ["slurmctld", "-D", "-f", self.conf],
                          os.path.join(s, "slurmctld.out"))
        slurmd = self.spawn("slurmd", ["slurmd", "-D", "-f", self.conf],
                            os.path.join(s, "slurmd.out"))
        deadline = time.monotonic() + 60
        state = ""
        while time.monotonic() < deadline:
            for name, proc in (("slurmctld", ctld), ("slurmd", slurmd)):
                if proc.poll() is not None:
                    raise Skip("%s exited %d:\n%s\n%s" % (
                        name, proc.returncode, tail(os.path.join(s, name + ".out")),
                        tail(os.path.join(s, name + ".log"))))
            r = self.run(["sinfo", "-h", "-N", "-o", "%N %t"], timeout=30, check_ok=False)
            state = (r.stdout + r.stderr).strip()
            if r.returncode == 0 and state.split() == [self.host, "idle"]:
                log("slurm up: node %s idle (slurmctld %d, slurmd %d)" % (self.host, ctld.pid,
                                                                       slurmd.pid))
                return
            time.sleep(0.25)
        raise Skip("the node did not become idle in 60 s (sinfo: %r):\n%s\n%s" % (
            state, tail(os.path.join(s, "slurmctld.log")), tail(os.path.join(s, "slurmd.log"))))

    # -- use --

    def run(self, cmd, timeout=120, check_ok=True):
        r = subprocess.run(cmd, capture_output=True, text=True, env=self.env, cwd=self.work,
                           timeout=timeout)
        if check_ok:
            check(r.returncode == 0, "%s exited %d:\n%s%s" % (" ".join(cmd), r.returncode,
                                                              r.stdout, r.stderr))
        return r

    def queue(self):
        r = self.run(["squeue", "-h", "-o", "%i %j %T"], timeout=30)
        return [line.split() for line in r.stdout.splitlines() if line.strip()]

    # -- tear-down --

    def stop(self):
        if any(name == "slurmctld" and proc.poll() is None for name, proc, _ in self.daemons):
            # Jobs first, while slurmd can still end their steps.
            self.run(["scancel", "--full", "--user", "root"], timeout=30, check_ok=False)
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                try:
                    if not self.queue():
                        break
                except (Failure, subprocess.TimeoutExpired):
                    break
                time.sleep(0.2)
        for name, proc, _ in reversed(self.daemons):  # slurmd, slurmctld, munged
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    log("%s did not stop on SIGTERM: SIGKILL" % name)
                    proc.kill()
                    proc.wait()
        kill_leftovers(self.work, self.conf, "left at the end")


# --------------------------------------------------------------------------
# Data, configs, outputs.


def read_json(path):
    with open(path) as f:
        return json.load(f)


def read_text(path):
    with open(path, errors="replace") as f:
        return f.read()


def srun_job_id(text):
    """The job id `srun -v` reports ("srun: jobid 1234: nodes(1):...")."""
    m = re.search(r"^srun: jobid (\d+)", text, re.M)
    return int(m.group(1)) if m else None


def environ_of(pid):
    values = {}
    for item in proc_text(pid, "environ") or []:
        if "=" in item:
            k, v = item.split("=", 1)
            values[k] = v
    return values


def tier(node, name):
    for t in node["tiers"]:
        if t["name"] == name:
            return t
    raise Failure("no tier %s in %s" % (name, [t["name"] for t in node["tiers"]]))


# The wrapper each task runs: its own partition and output files, from the
# variables Slurm gave it. "$0" "$@" is the monarch-epochs command line.
TASK_WRAPPER = ('exec "$0" "$@" --partition "$SLURM_PROCID/$SLURM_NTASKS" '
                '--json "$OUT/epochs-$SLURM_PROCID.json"')


# --------------------------------------------------------------------------
# 1. The node service under srun.


def scenario_serve(cluster, dataset, sizes):
    total = sum(sizes.values())
    work = cluster.work
    out = os.path.join(work, "serve-out")
    os.makedirs(os.path.join(out, "barrier"))
    rt = os.path.join(work, "rt")
    check(len(rt) < 80, "runtime dir too long: " + rt)
    config = os.path.join(work, "node.yaml")
    with open(config, "w") as f:
        f.write("dataset: {path: %s}\n"
                "tiers:\n"
                "  - {kind: ram, capacity: %d}\n"
                "  - {kind: source}\n"
                "node:\n"
                "  shared: true\n"
                "  runtime_dir: %s\n"
                "  autostart: false\n"
                "  idle_exit: 0\n"
                # The local dataset stands for a PFS and sits in the page
                # cache: `defer` would leave its copies to idle CPU, which
                # epoch 2 may not wait for (no --settle), and read it again.
                "placement: {cached_source: promote}\n" % (dataset, 2 * total, rt))

    serve_log = os.path.join(out, "srun-serve.log")
    with open(serve_log, "w") as f:
        serve = subprocess.Popen(["srun", "-v", "--ntasks-per-node=1", "--job-name=monarch-serve",
                                  cluster.monarch, "serve", "--config", config],
                                 stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                 env=cluster.env, cwd=work)
    try:
        # Up when `monarch status` answers.
        deadline = time.monotonic() + 60
        status = ""
        while time.monotonic() < deadline:
            check(serve.poll() is None, "srun monarch serve exited %s:\n%s" % (
                serve.returncode, read_text(serve_log)))
            r = cluster.run([cluster.monarch, "status", "--runtime-dir", rt], timeout=30,
                            check_ok=False)
            status = r.stdout + r.stderr
            if r.returncode == 0 and "Monarch service pid" in r.stdout:
                break
            time.sleep(0.1)
        else:
            raise Failure("the service did not come up in 60 s: %s\n%s" % (status,
                                                                           read_text(serve_log)))
        service_pid = int(re.search(r"Monarch service pid (\d+)", status).group(1))
        job_id = srun_job_id(read_text(serve_log))
        check(job_id is not None, "no job id in srun -v's output:\n" + read_text(serve_log))
        penv = environ_of(service_pid)
        log("service pid %d up in job %d (its SLURM_JOB_ID %s, SLURM_PROCID %s)" % (
            service_pid, job_id, penv.get("SLURM_JOB_ID"), penv.get("SLURM_PROCID")))
        # It is the job's task, started by slurmd, not something else at rt.
        check(penv.get("SLURM_JOB_ID") == str(job_id) and penv.get("SLURM_PROCID") == "0"
              and penv.get("SLURM_NTASKS") == "1",
              "service pid %d is not task 0 of job %d: %s" % (
                  service_pid, job_id, {k: v for k, v in penv.items() if k.startswith("SLURM_")}))
        check([str(job_id), "monarch-serve", "RUNNING"] in cluster.queue(),
              "job %d not running: %s" % (job_id, cluster.queue()))

        # Two readers of its config, as srun tasks. After their last epoch each
        # one, still connected, records the service's stats.
        epochs = 2
        hook = ('"%s" stats --json --runtime-dir "%s" > "$OUT/stats-$MONARCH_EPOCH-$PPID.json"'
                % (cluster.monarch, rt))
        readers_env = dict(cluster.env, OUT=out)
        r = subprocess.run(
            ["srun", "-v", "-n", "2", "--job-name=monarch-readers",
             "--output", os.path.join(out, "reader-%j-%t.out"), "sh", "-c", TASK_WRAPPER,
             cluster.epochs_bin, "--config", config, "--epochs", str(epochs), "--threads", "2",
             "--verify", "--barrier-dir", os.path.join(out, "barrier"),
             "--before-epoch", 'echo $PPID > "$OUT/pid-$SLURM_PROCID"; ' + hook],
            capture_output=True, text=True, env=readers_env, cwd=work, timeout=300)
        readers_job = srun_job_id(r.stderr)
        outputs = [os.path.join(out, "reader-%s-%d.out" % (readers_job, t)) for t in range(2)]
        check(r.returncode == 0, "srun -n 2 readers exited %d:\n%s\n%s" % (
            r.returncode, r.stderr, "\n".join(tail(p, 40) for p in outputs)))
        check(readers_job is not None and readers_job != job_id,
              "readers' job %s (service's %d)" % (readers_job, job_id))
        read_per_epoch = [0] * epochs
        for t in range(2):
            text = read_text(outputs[t])
            result = read_json(os.path.join(out, "epochs-%d.json" % t))
            check(len(result) == epochs, "reader %d: %d epochs" % (t, len(result)))
            for e in result:
                check(e["errors"] == 0 and e["mismatches"] == 0,
                      "reader %d epoch %d: %d errors, %d mismatches" % (
                          t, e["epoch"], e["errors"], e["mismatches"]))
                read_per_epoch[e["epoch"] - 1] += e["bytes"]
            # The node's source as this reader saw it: the service's counter.
            source_per_epoch = [e["served"].get("source", {}).get("bytes", 0) for e in result]
            check(source_per_epoch == [total] + [0] * (epochs - 1),
                  "reader %d: node source bytes per epoch %s, dataset %d" % (
                      t, source_per_epoch, total))
            # The service's view of this reader, after its last epoch.
            pid = int(read_text(os.path.join(out, "pid-%d" % t)))
            snap = read_json(os.path.join(out, "stats-%d-%d.json" % (epochs + 1, pid)))
            mine = [c for c in snap["clients"] if c["pid"] == pid]
            check(len(mine) == 1, "reader %d (pid %d) not among the service's clients %s" % (
                t, pid, snap["clients"]))
            c = mine[0]
            read_bytes = sum(e["bytes"] for e in result)
            log("reader %d (pid %d): read %d bytes; service: %d misses/%d bytes served by it, "
                "%d hits/%d bytes from its shared tier" % (t, pid, read_bytes, c["misses"],
                                                           c["miss_bytes"], c["hits"],
                                                           c["hit_bytes"]))
            check(c["hit_bytes"] + c["miss_bytes"] == read_bytes,
                  "service accounts for %d + %d bytes of reader %d's %d" % (
                      c["hit_bytes"], c["miss_bytes"], t, read_bytes))
            check(c["miss_bytes"] > 0, "the service served reader %d nothing: %s" % (t, c))
            check("stats: " in text, "reader %d printed no stats:\n%s" % (t, text))
        check(read_per_epoch == [total] * epochs,
              "bytes read per epoch %s, dataset %d" % (read_per_epoch, total))

        r = cluster.run([cluster.monarch, "stats", "--json", "--runtime-dir", rt], timeout=30)
        node = json.loads(r.stdout)["node"]
        src, ram = node["tiers"][-1], tier(node, "ram")
        log("node: source bytes_read %d, ram %d files/%d bytes, dataset %d files/%d bytes" % (
            src["bytes_read"], ram["files"], ram["bytes_used"], len(sizes), total))
        check(src["bytes_read"] == total,
              "node source bytes_read %d != dataset %d (once per node)" % (src["bytes_read"], total))
        check(ram["files"] == len(sizes) and ram["bytes_used"] == total,
              "ram tier holds %d files, %d bytes" % (ram["files"], ram["bytes_used"]))

        # Stop it the launcher's way: SIGTERM to the job's step.
        cluster.run(["scancel", "--signal=TERM", str(job_id)], timeout=30)
        try:
            code = serve.wait(timeout=60)
        except subprocess.TimeoutExpired:
            raise Failure("srun monarch serve still running 60 s after scancel:\n"
                          + read_text(serve_log))
        text = read_text(serve_log)
        check(code == 0, "srun monarch serve exited %d after scancel --signal=TERM:\n%s" % (
            code, text))
        check("monarch: serving %s" % dataset in text, "no 'serving' line:\n" + text)
        deadline = time.monotonic() + 20
        while alive(service_pid) or any(q[0] == str(job_id) for q in cluster.queue()):
            check(time.monotonic() < deadline, "service pid %d or job %d still there: %s" % (
                service_pid, job_id, cluster.queue()))
            time.sleep(0.1)
        r = cluster.run([cluster.monarch, "status", "--runtime-dir", rt], timeout=30,
                        check_ok=False)
        check(r.returncode == 3, "monarch status after the stop exited %d: %s%s" % (
            r.returncode, r.stdout, r.stderr))
        log("service stopped by scancel --signal=TERM: srun exited 0, job %d gone" % job_id)
    finally:
        if serve.poll() is None:
            cluster.run([cluster.monarch, "stop", "--runtime-dir", rt], timeout=60,
                        check_ok=False)
            try:
                serve.wait(timeout=30)
            except subprocess.TimeoutExpired:
                serve.kill()
                serve.wait()


# --------------------------------------------------------------------------
# 2. Four peers from srun -n 4.


def scenario_peers(cluster, dataset, sizes):
    total = sum(sizes.values())
    work = cluster.work
    out = os.path.join(work, "peers-out")
    os.makedirs(os.path.join(out, "barrier"))
    rdv = os.path.join(work, "rdv")
    os.makedirs(rdv)
    config = os.path.join(work, "peers.yaml")
    # One config for all ranks: rank and size from Slurm, the rendezvous
    # directory from the job id.
    with open(config, "w") as f:
        f.write("dataset: {path: %s}\n"
                "tiers:\n"
                "  - {kind: ram, capacity: %d}\n"
                "  - {kind: source}\n"
                "remote:\n"
                "  enabled: true\n"
                "  rank: auto\n"
                "  size: auto\n"
                "  rendezvous_dir: %s/${SLURM_JOB_ID}\n"
                "  rendezvous_timeout: 60s\n"
                "  request_timeout: 10s\n" % (dataset, total // 2, rdv))
    epochs = 3
    started = time.monotonic()
    r = subprocess.run(
        ["srun", "-v", "-n", "4", "--job-name=monarch-peers",
         "--output", os.path.join(out, "peer-%j-%t.out"), "sh", "-c", TASK_WRAPPER,
         cluster.epochs_bin, "--config", config, "--epochs", str(epochs), "--threads", "2",
         "--verify", "--barrier-dir", os.path.join(out, "barrier")],
        capture_output=True, text=True, env=dict(cluster.env, OUT=out), cwd=work, timeout=600)
    elapsed = time.monotonic() - started
    job_id = srun_job_id(r.stderr)
    outputs = [os.path.join(out, "peer-%s-%d.out" % (job_id, t)) for t in range(4)]
    check(r.returncode == 0, "srun -n 4 exited %d:\n%s\n%s" % (
        r.returncode, r.stderr, "\n".join(tail(p, 40) for p in outputs)))
    check(job_id is not None, "no job id in srun -v's output:\n" + r.stderr)
    log("srun -n 4: job %d, %d epochs in %.1f s" % (job_id, epochs, elapsed))

    source_per_epoch = [0] * epochs
    peers_per_epoch = [0] * epochs
    read_per_epoch = [0] * epochs
    source_bytes = 0
    per_task = []  # What each process read from the source, and what it adopted.
    for t in range(4):
        text = read_text(outputs[t])
        for e in read_json(os.path.join(out, "epochs-%d.json" % t)):
            check(e["errors"] == 0 and e["mismatches"] == 0,
                  "task %d epoch %d: %d errors, %d mismatches" % (
                      t, e["epoch"], e["errors"], e["mismatches"]))
            source_per_epoch[e["epoch"] - 1] += e["served"]["source"]["bytes"]
            peers_per_epoch[e["epoch"] - 1] += e["served"]["peers"]["bytes"]
            read_per_epoch[e["epoch"] - 1] += e["bytes"]
        stats = final_stats(text)
        remote = stats["remote"]
        log("task %d: rank %d of %d, source bytes_read %d, remote %s" % (
            t, remote["rank"], remote["peers"], stats["tiers"][-1]["bytes_read"],
            {k: remote[k] for k in ("requests_served", "fallbacks", "checksum_failures")}))
        # Its rank is its SLURM_PROCID (the task id srun named its output after).
        check(remote["rank"] == t and remote["peers"] == 4,
              "task %d found rank %d of %d" % (t, remote["rank"], remote["peers"]))
        check(remote["checksum_failures"] == 0 and remote["fallbacks"] == 0,
              "task %d: %s" % (t, remote))
        source_bytes += stats["tiers"][-1]["bytes_read"]
        per_task.append("task %d: source bytes_read %d, in its epochs %d; remote %s" % (
            t, stats["tiers"][-1]["bytes_read"],
            sum(e["served"]["source"]["bytes"]
                for e in read_json(os.path.join(out, "epochs-%d.json" % t))),
            {k: remote[k] for k in ("peers_down", "adopted_files", "fills", "peer_failures")
             if k in remote}))
    log("bytes read per epoch %s; from the source %s; from peers %s; dataset %d" % (
        read_per_epoch, source_per_epoch, peers_per_epoch, total))
    check(read_per_epoch == [total] * epochs, "bytes read per epoch %s" % read_per_epoch)
    check(source_per_epoch == [total] + [0] * (epochs - 1),
          "source bytes per epoch %s, want [%d, 0, 0]" % (source_per_epoch, total))
    check(source_bytes == total,
          "the 4 processes read %d bytes from the source over the run, dataset %d:\n  %s" % (
              source_bytes, total, "\n  ".join(per_task)))
    check(all(b > 0 for b in peers_per_epoch), "peer bytes per epoch %s" % peers_per_epoch)

    entries = sorted(os.listdir(rdv))
    log("rdv/ holds %s (job %d); inside: %s" % (entries, job_id, [
        sorted(os.listdir(os.path.join(rdv, e))) for e in entries]))
    check(entries == [str(job_id)],
          "rendezvous directories %s, want the job id %d" % (entries, job_id))
    check(os.path.isdir(os.path.join(rdv, entries[0])), "rdv/%s is not a directory" % entries[0])


# --------------------------------------------------------------------------


# --------------------------------------------------------------------------
# 3. Jobs of one user sharing one service.


def scenario_jobs(cluster, dataset, sizes):
    total = sum(sizes.values())
    work = cluster.work
    out = os.path.join(work, "jobs-out")
    os.makedirs(out)
    # The user's runtime base: the test's own (the default directory is made
    # under it, named after the dataset and the tiers, not the job).
    xdg = os.path.join(work, "xdg")
    os.makedirs(xdg, mode=0o700)
    env = dict(cluster.env, XDG_RUNTIME_DIR=xdg, MONARCH_BINARY=cluster.monarch, OUT=out)
    idle = 8
    config = os.path.join(work, "jobs.yaml")
    with open(config, "w") as f:
        f.write("dataset: {path: %s}\n"
                "tiers: [{kind: ram, capacity: %d}, {kind: source}]\n"
                "node: {shared: true, autostart: true, idle_exit: %ds}\n"
                "placement: {cached_source: promote}\n" % (dataset, 2 * total, idle))

    def status():
        r = subprocess.run([cluster.monarch, "status", "--config", config], capture_output=True,
                           text=True, env=env, timeout=30)
        jobs = dict(re.findall(r"\n    slurm-(\d+) +(\d+ process(?:es)?|left) +read", r.stdout))
        return r.returncode, r.stdout, {int(k): v for k, v in jobs.items()}

    def stats():
        r = subprocess.run([cluster.monarch, "stats", "--json", "--config", config],
                           capture_output=True, text=True, env=env, timeout=30)
        check(r.returncode == 0, "monarch stats: %s%s" % (r.stdout, r.stderr))
        return json.loads(r.stdout)

    def wait_for(what, predicate, timeout=60):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            result = predicate()
            if result:
                return result
            time.sleep(0.1)
        raise Failure("%s: not within %d s" % (what, timeout))

    # Job A: 2 tasks, 2 epochs; its first client starts the service.
    r = subprocess.run(["srun", "-v", "-n", "2", "--job-name=monarch-a", "--output",
                        os.path.join(out, "a-%t.out"), cluster.epochs_bin, "--config", config,
                        "--epochs", "2", "--threads", "2", "--verify"],
                       capture_output=True, text=True, env=env, cwd=work, timeout=300)
    job_a = srun_job_id(r.stderr)
    check(r.returncode == 0 and job_a is not None, "job A exited %d:\n%s\n%s" % (
        r.returncode, r.stderr, "\n".join(tail(os.path.join(out, "a-%d.out" % t)) for t in (0, 1))))
    for t in (0, 1):
        text = read_text(os.path.join(out, "a-%d.out" % t))
        check(" 0 mismatches" in text and "1 mismatches" not in text, "job A task %d:\n%s" % (
            t, text))
    code, text, jobs = status()
    check(code == 0, "the service did not outlive job A's step (status %d):\n%s" % (code, text))
    service_pid = int(re.search(r"Monarch service pid (\d+)", text).group(1))
    check(jobs.get(job_a) == "left", "job A not listed as left:\n" + text)
    by_job = {j["name"]: j for j in stats()["jobs"]}
    a = by_job["slurm-%d" % job_a]
    check(a["hit_bytes"] + a["miss_bytes"] == 2 * 2 * total,
          "job A's 2 tasks x 2 epochs read %d bytes, want %d" % (
              a["hit_bytes"] + a["miss_bytes"], 4 * total))
    log("job %d (2 tasks) ended; service %d outlived it: %s" % (
        job_a, service_pid, [l.strip() for l in text.splitlines() if l.startswith("    slurm-")]))

    # Job B: cancelled mid-read; it detaches, the service and copies stay.
    b_out = os.path.join(out, "b.out")
    with open(b_out, "w") as f:
        b = subprocess.Popen(["srun", "-v", "--job-name=monarch-b", cluster.epochs_bin, "--config",
                              config, "--epochs", "100000", "--threads", "2"],
                             stdout=f, stderr=subprocess.STDOUT, env=env, cwd=work)
    try:
        job_b = wait_for("job B attached", lambda: next(
            (j for j, state in status()[2].items() if j != job_a and state != "left"), None))
        cluster.run(["scancel", str(job_b)], timeout=30)
        b_code = b.wait(timeout=60)
    finally:
        if b.poll() is None:
            b.kill()
            b.wait()
    wait_for("job B listed as left after scancel", lambda: status()[2].get(job_b) == "left")
    code, text, _ = status()
    check(code == 0 and int(re.search(r"pid (\d+)", text).group(1)) == service_pid,
          "the service did not survive job B's cancellation:\n" + text)
    log("job %d cancelled (srun exit %d); listed as left; service %d serves on" % (
        job_b, b_code, service_pid))

    # Job C: every file a hit; the source was read once for the three jobs.
    r = subprocess.run(["srun", "-v", "--job-name=monarch-c", cluster.epochs_bin, "--config",
                        config, "--epochs", "1", "--threads", "2", "--verify"],
                       capture_output=True, text=True, env=env, cwd=work, timeout=300)
    job_c = srun_job_id(r.stderr)
    check(r.returncode == 0 and " 0 mismatches" in r.stdout, "job C: %s%s" % (r.stdout, r.stderr))
    node = stats()
    c = {j["name"]: j for j in node["jobs"]}["slurm-%d" % job_c]
    check(c["miss_bytes"] == 0 and c["hit_bytes"] == total, "job C: %s" % c)
    source = tier(node["node"], "source")["bytes_read"]
    check(source == total, "source read %d bytes for three jobs, dataset %d" % (source, total))
    log("job %d read all %d bytes as hits; source read once (%d bytes)" % (job_c, total, source))

    # Drain the node: no job comes, and the service leaves with its memory
    # after node.idle_exit.
    cluster.run(["scontrol", "update", "nodename=%s" % cluster.host, "state=drain",
                 "reason=monarch-test"], timeout=30)
    began = time.monotonic()
    wait_for("the service exiting after the drain", lambda: not alive(service_pid),
             timeout=idle + 30)
    check(status()[0] == 3, "a service still answers after the drain")
    log("node drained: service %d exited %.1f s later (idle_exit %d s)" % (
        service_pid, time.monotonic() - began, idle))
    cluster.run(["scontrol", "update", "nodename=%s" % cluster.host, "state=resume"], timeout=30)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--build-dir", required=True)
    args = parser.parse_args()
    build = os.path.abspath(args.build_dir)
    for binary in ("monarch", "monarch-epochs"):
        if not os.access(os.path.join(build, binary), os.X_OK):
            print("FAIL: missing %s/%s (build the project first)" % (build, binary))
            return 1
    if os.geteuid() != 0:
        print("SKIP: slurmd and munged need root to run here")
        return SKIP
    # One work directory per build directory, at a fixed path, so that a run
    # killed midway is cleaned up by the next one; short, for the sockets.
    tag = hashlib.sha1(build.encode()).hexdigest()[:10]
    work = os.path.join("/tmp", "monarch-slurm-" + tag)
    lock = open(work + ".lock", "w")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        print("FAIL: another run of this test for %s holds %s.lock" % (build, work))
        return 1
    conf = os.path.join(work, "slurm", "slurm.conf")
    kill_leftovers(work, conf, "left by an earlier run")
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    os.chmod(work, 0o711)  # munged (user munge) reaches its socket below it.
    cluster = Cluster(build, work)
    code = 1
    try:
        cluster.start()
        dataset = os.path.join(work, "ds")
        sizes = write_dataset(dataset, 90, big_every=15, classes=4)
        log("dataset: %d files, %d bytes" % (len(sizes), sum(sizes.values())))
        scenario_serve(cluster, dataset, sizes)
        scenario_peers(cluster, dataset, sizes)
        scenario_jobs(cluster, dataset, sizes)
        code = 0
        print("PASS: monarch serve, 4 peers and jobs sharing a service under Slurm (%.1f s)" % (
            time.monotonic() - START))
    except Skip as e:
        print("SKIP: Slurm cannot run here: %s" % e)
        code = SKIP
    except (Failure, subprocess.TimeoutExpired) as e:
        print("FAIL: %s" % e)
        print("--- slurmctld.log ---\n" + tail(os.path.join(work, "slurm", "slurmctld.log"), 15))
        print("--- slurmd.log ---\n" + tail(os.path.join(work, "slurm", "slurmd.log"), 15))
    finally:
        cluster.stop()
        if os.environ.get("MONARCH_TEST_KEEP"):
            print("kept", work)
        else:
            shutil.rmtree(work, ignore_errors=True)
    left = processes_of(work, conf)
    if left:
        print("FAIL: processes still running after the tear-down: %s" % left)
        return 1
    return code


if __name__ == "__main__":
    sys.exit(main())
