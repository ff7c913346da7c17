"""Memory mappings of big dataset files, read a few pages at a time.

usage: mapping.py write DIR
           big.bin (2 GiB, sparse: an 8-byte mark every 64 KiB), small.bin
           (1 MiB of random bytes), table.arrow (an Arrow IPC file of 4M
           int64 rows, 32 MiB) and stream.arrow (the same rows as an IPC
           stream, the format Hugging Face datasets maps)
       mapping.py numpy PATH MODE OFFSET... numpy.memmap (mode r: shared, c: private),
                                            one page at each offset
       mapping.py pyarrow PATH ROW...       pyarrow.memory_map + ipc.open_file
       mapping.py datasets PATH ROW...      datasets.Dataset.from_file
       mapping.py pread PATH OFFSET...      os.pread of a page at each offset

Each reader prints one line per page or row (a digest or the value), then
`rss-growth KiB`: how much the process's resident memory grew from before
the mapping to after the reads, so a harness can tell a mapping that read
the whole file from one that read only what was touched. With
MAPPING_COPIES_UNDER=DIR it then prints `copies N`: how many of the
process's mappings are of files under DIR (a tier's copies, mapped in
place of the source's pages).
"""

import hashlib
import os
import sys

PAGE = 4096
MARK_EVERY = 64 << 10
BIG_BYTES = 2 << 30
ROWS = 4 << 20


def rss_kib():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS")


def write(directory):
    import struct

    import pyarrow as pa

    with open(os.path.join(directory, "big.bin"), "wb") as f:
        f.truncate(BIG_BYTES)
        for at in range(0, BIG_BYTES, MARK_EVERY):
            os.pwrite(f.fileno(), struct.pack("<Q", at // MARK_EVERY + 1), at)
    with open(os.path.join(directory, "small.bin"), "wb") as f:
        f.write(os.urandom(1 << 20))
    table = pa.table({"x": pa.array(range(ROWS), type=pa.int64())})
    with pa.OSFile(os.path.join(directory, "table.arrow"), "wb") as sink:
        with pa.ipc.new_file(sink, table.schema) as writer:
            writer.write_table(table)
    with pa.OSFile(os.path.join(directory, "stream.arrow"), "wb") as sink:
        with pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table)
    return 0


def pages(buffer, offsets):
    for offset in offsets:
        page = bytes(buffer[offset:offset + PAGE])
        print("%d %s" % (offset, hashlib.sha256(page).hexdigest()[:24]))


def main(argv):
    what = argv[1]
    if what == "write":
        return write(argv[2])
    if what == "numpy":
        import numpy as np

        before = rss_kib()
        mapped = np.memmap(argv[2], dtype=np.uint8, mode=argv[3])
        pages(mapped, [int(a) for a in argv[4:]])
    elif what == "pyarrow":
        import pyarrow as pa

        before = rss_kib()
        with pa.memory_map(argv[2], "r") as source:
            column = pa.ipc.open_file(source).read_all().column("x")
            for row in argv[3:]:
                print("%s %s" % (row, column[int(row)].as_py()))
    elif what == "datasets":
        import datasets

        datasets.disable_progress_bars()
        before = rss_kib()
        rows = datasets.Dataset.from_file(argv[2])
        for row in argv[3:]:
            print("%s %s" % (row, rows[int(row)]["x"]))
    elif what == "pread":
        before = rss_kib()
        fd = os.open(argv[2], os.O_RDONLY)
        for offset in [int(a) for a in argv[3:]]:
            page = os.pread(fd, PAGE, offset)
            print("%d %s" % (offset, hashlib.sha256(page).hexdigest()[:24]))
        os.close(fd)
    else:
        raise SystemExit(__doc__)
    print("rss-growth %d" % (rss_kib() - before))
    under = os.environ.get("MAPPING_COPIES_UNDER")
    if under:
        with open("/proc/self/maps") as f:
            print("copies %d" % sum(1 for line in f if under + "/" in line))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
