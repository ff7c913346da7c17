"""A program that never touches the dataset (stdlib only).

usage: untouched.py FILE...   (files outside the dataset)

Reads, stats, mmaps and lists the given files and their directories, runs a
child (`cat` of the first file), then prints digests, its thread count (from
/proc/self/task), Python's thread count and how many memfd mappings it has.
"""

import hashlib
import mmap
import os
import subprocess
import sys
import threading


def main():
    out = []
    for path in sys.argv[1:]:
        with open(path, "rb") as f:
            data = f.read()
            if data:
                with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
                    mapped = m[:]
            else:
                mapped = b""
        st = os.stat(path)
        fd = os.open(path, os.O_RDONLY)
        piece = os.pread(fd, 100, len(data) // 2)
        os.close(fd)
        out.append("%s %d %d %s %s %s" % (os.path.basename(path), len(data), st.st_size,
                                          hashlib.sha256(data).hexdigest()[:32],
                                          mapped == data, hashlib.sha256(piece).hexdigest()[:16]))
        out.append("listdir %s" % sorted(os.listdir(os.path.dirname(path))))
    child = subprocess.run(["cat", sys.argv[1]], capture_output=True, check=True)
    out.append("child cat %s" % hashlib.sha256(child.stdout).hexdigest()[:32])
    with open("/proc/self/maps") as f:
        memfds = sum(1 for line in f if "memfd:" in line)
    out.append("tasks %d python-threads %d memfd-mappings %d" % (
        len(os.listdir("/proc/self/task")), threading.active_count(), memfds))
    sys.stdout.write("\n".join(out) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
