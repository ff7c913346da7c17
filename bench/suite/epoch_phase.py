#!/usr/bin/env python3
"""Epoch-boundary hook of bench/suite/run_suite.py, run by
`monarch-epochs --before-epoch` (see tools/monarch_epochs.cc):

  epoch_phase.py OUT_DIR [PFS_EMULATOR_SCRIPT MOUNT]

monarch-epochs runs it right before epoch MONARCH_EPOCH's timer starts (after
the page cache drop and the previous epoch's --settle wait) and once more
after the last epoch, with MONARCH_EPOCH=E+1, and waits for it. So it ends
phase MONARCH_EPOCH-1 (phase 0: start-up, phase k: epoch k and its settle).
It writes OUT_DIR/phase-<MONARCH_EPOCH-1>.json: CLOCK_MONOTONIC when it
started and when it finished (the suite takes the phase's wall time between
them) and, with a mount, the emulator's exact counters for that phase, which
it then resets (`pfs-emulator stats` and `reset`, both exact; the job is
blocked meanwhile).
"""

import json
import os
import subprocess
import sys
import time


def main():
    start = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
    if len(sys.argv) not in (2, 4):
        sys.exit(__doc__)
    out_dir = sys.argv[1]
    phase = int(os.environ["MONARCH_EPOCH"]) - 1
    record = {"phase": phase, "start_ns": start}
    if len(sys.argv) == 4:
        script, mount = sys.argv[2:]
        # Their errors go to stderr, i.e. the job's log; a failure fails the job.
        stats = subprocess.run([script, "stats", mount], check=True, stdout=subprocess.PIPE,
                               text=True).stdout
        record["pfs"] = json.loads(stats)["counters"]
        subprocess.run([script, "reset", mount], check=True, stdout=subprocess.DEVNULL)
    record["end_ns"] = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
    with open(os.path.join(out_dir, f"phase-{phase}.json"), "w") as f:
        json.dump(record, f)


if __name__ == "__main__":
    main()
