"""A plain Python reader: every file of a list, whole, in pieces of --read-size.

Run by preload_programs_test.py with and without LD_PRELOAD (counts,
kill-service, bad-config). Stdlib only. Prints one line per file and epoch:
"<epoch> <name> <size> <sha256>", nothing else.

usage: reader.py --root DIR --list FILE [--epochs N] [--read-size B]
                 [--marks DIR] [--sleep S] [--threads T] [--pause E:I:GATE]
--marks: touches DIR/<epoch> right before each epoch starts and DIR/done at
the end; --sleep: pause after each file (to make epochs last); --pause: in
epoch E, half-way through file number I (its descriptor open), touches
DIR/paused and waits until the file GATE exists.
"""

import argparse
import hashlib
import os
import sys
import threading
import time


def read_file(path, read_size, pause=None):
    """pause: (marks dir, gate file) to wait for half-way through the file."""
    digest = hashlib.sha256()
    size = 0
    half = os.path.getsize(path) // 2 if pause else None
    with open(path, "rb", buffering=0) as f:
        while True:
            if pause and size >= half:
                open(os.path.join(pause[0], "paused"), "w").close()
                deadline = time.monotonic() + 300
                while not os.path.exists(pause[1]) and time.monotonic() < deadline:
                    time.sleep(0.01)
                pause = None
            piece = f.read(read_size)
            if not piece:
                break
            digest.update(piece)
            size += len(piece)
    return size, digest.hexdigest()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--root", required=True)
    p.add_argument("--list", required=True)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--read-size", type=int, default=1 << 20)
    p.add_argument("--marks")
    p.add_argument("--sleep", type=float, default=0.0)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--pause")
    a = p.parse_args()
    pause_epoch, pause_index, gate = (a.pause.split(":", 2) if a.pause else (0, -1, None))
    pause_epoch, pause_index = int(pause_epoch), int(pause_index)
    with open(a.list) as f:
        names = [line.rstrip("\n") for line in f if line.strip()]
    out = []
    for epoch in range(1, a.epochs + 1):
        if a.marks:
            open(os.path.join(a.marks, str(epoch)), "w").close()
        results = [None] * len(names)

        def work(first):
            for i in range(first, len(names), a.threads):
                pause = (a.marks, gate) if (epoch, i) == (pause_epoch, pause_index) else None
                results[i] = read_file(os.path.join(a.root, names[i]), a.read_size, pause)
                if a.sleep:
                    time.sleep(a.sleep)

        threads = [threading.Thread(target=work, args=(t,)) for t in range(a.threads)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for name, (size, digest) in zip(names, results):
            out.append("%d %s %d %s" % (epoch, name, size, digest))
    if a.marks:
        open(os.path.join(a.marks, "done"), "w").close()
    sys.stdout.write("\n".join(out) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
