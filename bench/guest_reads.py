#!/usr/bin/env python3
"""What a guest of another user's node service pays (node.share_with_group).

A guest maps none of the service's memory: each file it reads costs it an
open of the file on the source (its proof of access, once per file and
process) and a round trip per read through the service, where the
service's own user copies hits straight out of the shared RAM tier.

--files ImageNet-like files (~110 KiB) in a local directory (page-cached:
the source's own cost is left out, so the figures are the service path's).
User A (uid 4241) and user B (uid 4245), both in group 4242, share one
service through a config with a RAM tier and `share_with_group: 4242`; A
starts it and stages the dataset. Then, in turns, --reps times each, a
fresh `monarch-epochs` process (--threads readers, 2 epochs) of:

  owner   user A: hits from the RAM tier it maps
  guest   user B: every read through the service, each file proved first
  plain   user B reading the directory with plain pread (the baseline)

Prints each run's epoch times and the medians, and guest/owner and
guest/plain for epoch 1 (the process's first pass: proofs included) and
epoch 2 (proved already). Needs root (setpriv).

  sudo python3 bench/guest_reads.py --build build --files 5000
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

OWNER, GUEST, GROUP = 4241, 4245, 4242


def as_user(uid):
    return ["setpriv", "--reuid", str(uid), "--regid", str(uid), "--groups", str(GROUP)]


def run(cmd, uid, out=None):
    env = {k: v for k, v in os.environ.items() if k not in ("XDG_RUNTIME_DIR", "LD_PRELOAD")}
    r = subprocess.run(as_user(uid) + cmd, env=env, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit("%s failed (%d):\n%s%s" % (" ".join(cmd), r.returncode, r.stdout, r.stderr))
    if out:
        with open(out) as f:
            return [e["seconds"] for e in json.load(f)]
    return r.stdout


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default="build")
    ap.add_argument("--dir", default="/var/tmp/monarch-guest-bench")
    ap.add_argument("--files", type=int, default=5000)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out", default=None, help="JSON of every run")
    a = ap.parse_args()
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        sys.exit("needs root and setpriv")
    build = os.path.abspath(a.build)
    epochs_bin = os.path.join(build, "monarch-epochs")
    monarch = os.path.join(build, "monarch")
    shutil.rmtree(a.dir, ignore_errors=True)
    os.makedirs(a.dir)
    os.chmod(a.dir, 0o777)
    dataset = os.path.join(a.dir, "ds")
    subprocess.run([epochs_bin, "--dataset", dataset, "--generate", str(a.files), "--epochs", "0"],
                   check=True, capture_output=True)
    for root, dirs, _ in os.walk(a.dir):
        for d in dirs:
            os.chmod(os.path.join(root, d), 0o755)
    config = os.path.join(a.dir, "shared.yaml")
    with open(config, "w") as f:
        f.write("dataset: {path: %s}\ntiers: [{kind: ram, capacity: 2GiB}, {kind: source}]\n"
                "node: {shared: true, idle_exit: 0, share_with_group: '%d'}\n" % (dataset, GROUP))
    os.chmod(config, 0o644)
    runs = {"owner": [], "guest": [], "plain": []}
    env = {k: v for k, v in os.environ.items() if k not in ("XDG_RUNTIME_DIR", "LD_PRELOAD")}
    service = subprocess.Popen(as_user(OWNER) + [monarch, "serve", "--config", config], env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while subprocess.run(as_user(OWNER) + [monarch, "status", "--config", config], env=env,
                             capture_output=True).returncode != 0:
            if service.poll() is not None or time.monotonic() > deadline:
                sys.exit("monarch serve (user %d) did not start" % OWNER)
            time.sleep(0.05)
        run([monarch, "stage", "--config", config], OWNER)  # A's service holds the dataset.
        for rep in range(a.reps):
            arms = ["owner", "guest", "plain"]
            if rep % 2:
                arms.reverse()
            for arm in arms:
                out = os.path.join(a.dir, "%s.json" % arm)
                if os.path.exists(out):
                    os.remove(out)
                common = ["--epochs", "2", "--threads", str(a.threads), "--seed", str(rep),
                          "--json", out]
                if arm == "plain":
                    cmd = [epochs_bin, "--mode", "plain", "--dataset", dataset] + common
                else:
                    cmd = [epochs_bin, "--config", config] + common
                # The JSON is written by the run's user: a directory it may write.
                os.chmod(a.dir, 0o777)
                seconds = run(cmd, OWNER if arm == "owner" else GUEST, out)
                runs[arm].append(seconds)
                print("rep %d %-5s epochs %s s" % (rep, arm, " ".join("%.3f" % s for s in seconds)),
                      flush=True)
        stats = json.loads(run([monarch, "stats", "--json", "--config", config], OWNER))
        refusals = stats["node"]["service"]["guest_refusals"]
    finally:
        subprocess.run(as_user(OWNER) + [monarch, "stop", "--config", config], capture_output=True)
        try:
            service.wait(timeout=30)
        except subprocess.TimeoutExpired:
            service.kill()
        subprocess.run(as_user(OWNER) + [monarch, "purge", "--config", config],
                       capture_output=True)
    med = {arm: [statistics.median(r[e] for r in runs[arm]) for e in (0, 1)] for arm in runs}
    for e in (0, 1):
        print("epoch %d medians: owner %.3f s, guest %.3f s, plain %.3f s; guest/owner %.2f, "
              "guest/plain %.2f, owner/plain %.2f" % (
                  e + 1, med["owner"][e], med["guest"][e], med["plain"][e],
                  med["guest"][e] / med["owner"][e], med["guest"][e] / med["plain"][e],
                  med["owner"][e] / med["plain"][e]))
    print("guest refusals counted by the service: %d" % refusals)
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"files": a.files, "threads": a.threads, "runs": runs, "medians": med,
                       "guest_refusals": refusals}, f, indent=1)


if __name__ == "__main__":
    main()
