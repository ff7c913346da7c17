"""Python's own file calls and NumPy's on every file of a dataset.

usage: python_basics.py write DIR         (NumPy files for the dataset; no preload)
       python_basics.py read DATASET OUT  (prints one line per check)
       python_basics.py children DATASET  (child processes reading a dataset stdin)

`read` walks DATASET and, per file: open().read(), unbuffered readinto with
an odd buffer, seek/tell (from the start, the current position and the end,
past the end), os.open/pread/lseek/read/fstat, dup, readv/preadv, sendfile,
flock, fadvise, a forked child's pread, fdopen, mmap.mmap (whole and at a
page offset), pathlib, text mode; then threads reading concurrently,
shutil.copyfile (sendfile on Linux) into OUT, numpy.fromfile (by name, with
offset and count, and from an open file at a position) and numpy.load (.npy,
.npy with mmap_mode, .npz). Every line is a digest or a number, so the
output is byte-identical with and without the preload.
"""

import concurrent.futures
import fcntl
import hashlib
import mmap
import os
import pathlib
import shutil
import subprocess
import sys


def h(data):
    return hashlib.sha256(bytes(data)).hexdigest()


def write(directory):
    import numpy as np

    rng = np.random.default_rng(13)
    rng.standard_normal(300_001).astype("<f4").tofile(os.path.join(directory, "floats.f32"))
    np.save(os.path.join(directory, "matrix.npy"), rng.integers(-2**31, 2**31, (333, 517),
                                                                 dtype="<i8"))
    np.savez(os.path.join(directory, "arrays.npz"), a=np.arange(12345, dtype="<u2"),
             b=rng.standard_normal((64, 65)), c=np.array(["x", "yz"]))
    np.savez_compressed(os.path.join(directory, "compressed.npz"),
                        z=rng.integers(0, 7, 200_000, dtype="u1"))
    return 0


def per_file(dataset, name):
    path = os.path.join(dataset, name)
    out = []
    size = os.path.getsize(path)
    st = os.stat(path)
    out.append("%s: size %d stat %d mode %o" % (name, size, st.st_size, st.st_mode))
    with open(path, "rb") as f:
        whole = f.read()
    out.append("%s: read %d %s" % (name, len(whole), h(whole)))

    # Unbuffered readinto with an odd buffer; then buffered readinto.
    parts = []
    with open(path, "rb", buffering=0) as f:
        buf = bytearray(4093)
        while True:
            n = f.readinto(buf)
            if not n:
                break
            parts.append(bytes(buf[:n]))
    out.append("%s: readinto4093 %d pieces %s" % (name, len(parts), h(b"".join(parts))))
    with open(path, "rb") as f:
        buf = bytearray(size // 2 + 1)
        n = f.readinto(memoryview(buf))
        out.append("%s: buffered readinto %d %s, then %d" % (name, n, h(buf[:n]), len(f.read())))

    # seek/tell.
    with open(path, "rb") as f:
        end = f.seek(0, os.SEEK_END)
        tell_end = f.tell()
        f.seek(size // 3)
        a = f.read(1000)
        t1 = f.tell()
        f.seek(-min(size, 100), os.SEEK_END)
        b = f.read()
        past = f.seek(size + 10)
        c = f.read(5)
        f.seek(7)
        f.read(3)
        f.seek(5, os.SEEK_CUR)
        d = f.read(11)
        t2 = f.tell()
    out.append("%s: seek end %d tell %d; mid %s tell %d; tail %s; past %d %r; cur %s tell %d" % (
        name, end, tell_end, h(a), t1, h(b), past, c, h(d), t2))

    # The os module: file descriptors as they come.
    fd = os.open(path, os.O_RDONLY)
    try:
        fst = os.fstat(fd)
        pread = os.pread(fd, 777, size // 2)
        pos = os.lseek(fd, 3, os.SEEK_SET)
        r1 = os.read(fd, 5000)
        cur = os.lseek(fd, 0, os.SEEK_CUR)
        r2 = os.read(fd, 1 << 20)
        end = os.lseek(fd, 0, os.SEEK_END)
        r3 = os.read(fd, 10)
        data = os.lseek(fd, 0, os.SEEK_DATA) if size else "-"
        hole = os.lseek(fd, size // 2, os.SEEK_HOLE) if size else "-"
    finally:
        os.close(fd)
    out.append("%s: fstat %d pread %s lseek %d read %s cur %d read %s end %d eof %r "
               "SEEK_DATA %s SEEK_HOLE %s" % (name, fst.st_size, h(pread), pos, h(r1), cur,
                                              h(r2), end, r3, data, hole))

    # Descriptor calls: dup (shared offset), fdopen, readv/preadv, sendfile
    # into a pipe, flock and fadvise, and a forked child reading an inherited
    # descriptor with pread.
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
        fcntl.flock(fd, fcntl.LOCK_SH)
        twin = os.dup(fd)
        first = os.read(fd, 1000)
        second = os.read(twin, 1000)  # Goes on where fd left off.
        where = (os.lseek(fd, 0, os.SEEK_CUR), os.lseek(twin, 0, os.SEEK_CUR))
        os.close(twin)
        bufs = [bytearray(7), bytearray(4096), bytearray(333)]
        got = os.readv(fd, bufs)
        pv = [bytearray(100), bytearray(5000)]
        pgot = os.preadv(fd, pv, size // 4)
        out.append("%s: dup %s %s offsets %s readv %d %s preadv %d %s" % (
            name, h(first), h(second), where, got, h(b"".join(bufs)[:got]), pgot,
            h(b"".join(pv)[:pgot])))
        r, w = os.pipe()
        try:
            sent = os.sendfile(w, fd, 10, 60000) if size > 10 else 0
            os.close(w)
            w = -1
            piped = b""
            while True:
                chunk = os.read(r, 65536)
                if not chunk:
                    break
                piped += chunk
        finally:
            os.close(r)
            if w >= 0:
                os.close(w)
        out.append("%s: sendfile %d %s, offset after %d" % (name, sent, h(piped),
                                                             os.lseek(fd, 0, os.SEEK_CUR)))
        child = os.fork()
        if child == 0:
            code = 0 if os.pread(fd, 4096, size // 3) == whole[size // 3:size // 3 + 4096] else 1
            os._exit(code)
        _, status = os.waitpid(child, 0)
        out.append("%s: forked child's pread %s" % (name, "ok" if status == 0 else status))
        with os.fdopen(os.dup(fd), "rb") as f:
            f.seek(0)
            out.append("%s: fdopen %s" % (name, h(f.read())))
        fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)

    # mmap: the whole file, and a window at a page offset.
    if size:
        with open(path, "rb") as f:
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
                out.append("%s: mmap %d %s window %s" % (
                    name, len(m), h(m[:]), h(m[size // 2:size // 2 + 4096])))
            if size > 2 * mmap.ALLOCATIONGRANULARITY:
                g = mmap.ALLOCATIONGRANULARITY
                with mmap.mmap(f.fileno(), size - g, access=mmap.ACCESS_READ, offset=g) as m:
                    out.append("%s: mmap offset %d %s, byte %d" % (name, len(m), h(m[:]),
                                                                   m[len(m) // 2]))
    out.append("%s: pathlib %s" % (name, h(pathlib.Path(path).read_bytes())))
    if name.endswith(".txt"):
        with open(path, encoding="latin-1") as f:
            lines = f.readlines()
        with open(path, encoding="latin-1") as f:
            first = f.readline()
            rest = f.read()
        out.append("%s: %d lines %s; readline %r + %d" % (name, len(lines), h("".join(
            lines).encode("latin-1")), first[:40], len(rest)))
    return out


def read(dataset, out_dir):
    names = []
    for dirpath, dirnames, files in os.walk(dataset):
        dirnames.sort()
        for n in sorted(files):
            names.append(os.path.relpath(os.path.join(dirpath, n), dataset))
    out = ["%d files: %s" % (len(names), h("\n".join(names).encode()))]
    out.append("listdir: %s" % sorted(os.listdir(dataset)))
    for name in names:
        out.extend(per_file(dataset, name))

    # Threads reading every file at once.
    def whole(name):
        with open(os.path.join(dataset, name), "rb") as f:
            return h(f.read())

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        digests = list(pool.map(whole, names * 2))
    out.append("threads: %s" % h("".join(digests).encode()))

    # Threads sharing one descriptor: each read() takes the next 4 KiB
    # (the offset moves atomically), so the pieces are the file's 4 KiB
    # blocks, each exactly once.
    big = max(names, key=lambda n: os.path.getsize(os.path.join(dataset, n)))
    with open(os.path.join(dataset, big), "rb") as f:
        data = f.read()
    fd = os.open(os.path.join(dataset, big), os.O_RDONLY)
    pieces = []

    def take():
        mine = []
        while True:
            piece = os.read(fd, 4096)
            if not piece:
                break
            mine.append(piece)
        return mine

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        for mine in pool.map(lambda _: take(), range(4)):
            pieces += mine
    os.close(fd)
    blocks = sorted(data[i:i + 4096] for i in range(0, len(data), 4096))
    out.append("one descriptor, 4 threads: %d pieces, %s" % (
        len(pieces), "the file's blocks" if sorted(pieces) == blocks else "NOT the file's blocks"))

    # shutil.copyfile uses sendfile(2) from the dataset file.
    for name in names[:3] + [max(names, key=lambda n: os.path.getsize(os.path.join(dataset, n)))]:
        target = os.path.join(out_dir, name.replace("/", "_"))
        shutil.copyfile(os.path.join(dataset, name), target)
        with open(target, "rb") as f:
            out.append("copyfile %s: %s" % (name, h(f.read())))

    import numpy as np

    floats = os.path.join(dataset, "floats.f32")
    a = np.fromfile(floats, dtype="<f4")
    out.append("fromfile: %s %s" % (a.shape, h(a.tobytes())))
    b = np.fromfile(floats, dtype="<f4", count=1000, offset=4 * 333)
    out.append("fromfile offset count: %s %s" % (b.shape, h(b.tobytes())))
    with open(floats, "rb") as f:
        f.seek(400)
        c = np.fromfile(f, dtype="<i4", count=50)
        after = f.tell()
        d = f.read(64)
    out.append("fromfile(open file): %s %s tell %d then %s" % (c.shape, h(c.tobytes()), after,
                                                               h(d)))
    m = np.load(os.path.join(dataset, "matrix.npy"))
    out.append("load npy: %s %s %s" % (m.shape, m.dtype, h(m.tobytes())))
    mm = np.load(os.path.join(dataset, "matrix.npy"), mmap_mode="r")
    out.append("load npy mmap: %s %s rows %s" % (mm.shape, h(np.ascontiguousarray(mm).tobytes()),
                                                  h(mm[100:120:3].tobytes())))
    del mm
    with np.load(os.path.join(dataset, "arrays.npz")) as z:
        for k in sorted(z.files):
            v = z[k]
            out.append("load npz %s: %s %s %s" % (k, v.shape, v.dtype, h(v.tobytes())))
    with np.load(os.path.join(dataset, "compressed.npz")) as z:
        out.append("load compressed npz: %s" % h(z["z"].tobytes()))
    sys.stdout.write("\n".join(out) + "\n")
    return 0


def attempt(fn):
    """fn()'s value, or the error it raised, as text (so one run shows every step)."""
    try:
        return fn()
    except OSError as e:
        return "error: %s" % e


def children(dataset):
    """Child processes given a dataset file as their stdin, 100 bytes in: they
    read on from there (one open file description), and the parent's file,
    and its own stdin, are as they were."""
    out = []
    for name in ("big.bin", "notes.txt"):
        path = os.path.join(dataset, name)
        with open(path, "rb") as f:
            f.seek(100)
            # subprocess: fork_exec, which uses vfork() where it can.
            child = subprocess.run(["md5sum"], stdin=f, capture_output=True)
            out.append("%s: subprocess md5sum < file from 100: exit %d %s %r" % (
                name, child.returncode, child.stdout.decode().split()[:1],
                child.stderr.decode()[:200]))
            out.append("%s: then the parent's tell %s, read %s" % (
                name, attempt(f.tell), attempt(lambda: h(f.read(5000)))))
            out.append("%s: then the parent's stdin reads %s bytes" % (
                name, attempt(lambda: len(os.read(0, 1000)))))
            attempt(lambda: f.seek(100))
            # posix_spawn with a dup2 file action.
            r, w = os.pipe()
            pid = os.posix_spawn("/usr/bin/md5sum", ["md5sum"], os.environ, file_actions=[
                (os.POSIX_SPAWN_DUP2, f.fileno(), 0), (os.POSIX_SPAWN_DUP2, w, 1),
                (os.POSIX_SPAWN_CLOSE, r)])
            os.close(w)
            with os.fdopen(r, "rb") as pipe:
                spawned = pipe.read()
            _, status = os.waitpid(pid, 0)
            out.append("%s: posix_spawn md5sum < file from 100: status %d %s; parent's tell %s" % (
                name, status, spawned.decode().split()[:1], attempt(f.tell)))
    sys.stdout.write("\n".join(out) + "\n")
    return 0


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "children":
        return children(sys.argv[2])
    if len(sys.argv) == 3 and sys.argv[1] == "write":
        return write(sys.argv[2])
    if len(sys.argv) == 4 and sys.argv[1] == "read":
        return read(sys.argv[2], sys.argv[3])
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
