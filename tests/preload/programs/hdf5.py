"""h5py on real HDF5 files: contiguous and chunked datasets, read whole and sliced.

usage: hdf5.py write DIR            (the files; no preload)
       hdf5.py read DRIVER DIR      (DRIVER: default, sec2, stdio or fileobj)

`read` opens every .h5 file under DIR with h5py.File(path, "r") (h5py's
default driver), with driver="sec2", or (fileobj) on a Python file object,
and for every dataset prints its layout and digests of the whole array and
of slices: strided, negative, a column, fancy indices, a chunk-straddling
block and single elements.
"""

import hashlib
import os
import sys

import h5py
import numpy as np


def h(array):
    return hashlib.sha256(np.ascontiguousarray(array).tobytes()).hexdigest()[:32]


def write(directory):
    rng = np.random.default_rng(11)
    with h5py.File(os.path.join(directory, "contiguous.h5"), "w") as f:
        f.create_dataset("x", data=rng.standard_normal((400, 300)))  # 960 KB contiguous
        f.create_dataset("group/ints", data=np.arange(100_000, dtype="<i4").reshape(500, 200))
        f.create_dataset("group/vector", data=rng.integers(0, 1 << 40, 50_001, dtype="<i8"))
        f.attrs["title"] = "contiguous"
        f["x"].attrs["scale"] = 2.5
    with h5py.File(os.path.join(directory, "chunked.h5"), "w") as f:
        f.create_dataset("plain", data=rng.standard_normal((333, 257)).astype("<f4"),
                         chunks=(64, 50))
        f.create_dataset("gzip", data=rng.integers(0, 50, (600, 400), dtype="<i2"),
                         chunks=(100, 128), compression="gzip", compression_opts=4, shuffle=True)
        f.create_dataset("fletcher", data=rng.standard_normal(70_000), chunks=(4096,),
                         fletcher32=True)
        grow = f.create_dataset("growing", shape=(0, 16), maxshape=(None, 16), chunks=(128, 16),
                                dtype="<u4")
        for step in range(5):
            grow.resize(grow.shape[0] + 1000 + step, axis=0)
            grow[-(1000 + step):] = rng.integers(0, 1 << 31, (1000 + step, 16), dtype="<u4")
        f.create_dataset("strings", data=np.array([b"alpha", b"beta", b"gamma" * 5]))
        f.attrs["title"] = "chunked"
    return 0


def slices(ds):
    if ds.ndim == 2:
        rows, cols = ds.shape
        return {
            "strided": ds[10:rows - 7:3, 5:cols:7],
            "negative": ds[-50:-3],
            "column": ds[:, cols // 2],
            "fancy": ds[[1, 5, 9, rows - 1], :],
            "block": ds[rows // 3:rows // 3 + 97, cols // 4:cols // 4 + 61],
            "element": np.array(ds[rows - 1, cols - 1]),
        }
    n = ds.shape[0]
    return {
        "strided": ds[3:n:11],
        "tail": ds[-999:],
        "fancy": ds[[0, 2, n // 2, n - 1]],
        "element": np.array(ds[n // 3]),
    }


def read(driver, directory):
    out = []
    paths = []
    for dirpath, dirnames, files in os.walk(directory):
        dirnames.sort()
        paths += [os.path.join(dirpath, n) for n in sorted(files) if n.endswith(".h5")]
    for path in paths:
        name = os.path.relpath(path, directory)
        handle = None
        if driver == "default":
            f = h5py.File(path, "r")
        elif driver in ("sec2", "stdio"):
            f = h5py.File(path, "r", driver=driver)
        elif driver == "fileobj":
            handle = open(path, "rb")
            f = h5py.File(handle, "r")
        else:
            raise SystemExit("unknown driver " + driver)
        with f:
            out.append("%s: driver %s attrs %s" % (name, f.driver, sorted(
                (k, str(v)) for k, v in f.attrs.items())))
            datasets = []
            f.visititems(lambda key, obj: datasets.append(key)
                         if isinstance(obj, h5py.Dataset) else None)
            for key in sorted(datasets):
                ds = f[key]
                out.append("%s/%s: %s %s chunks %s compression %s whole %s attrs %s" % (
                    name, key, ds.shape, ds.dtype, ds.chunks, ds.compression, h(ds[()]),
                    sorted((k, str(v)) for k, v in ds.attrs.items())))
                if ds.dtype.kind in "iuf":
                    for label, value in slices(ds).items():
                        out.append("%s/%s[%s]: %s %s" % (name, key, label, value.shape, h(value)))
        if handle is not None:
            handle.close()
    sys.stdout.write("\n".join(out) + "\n")
    return 0


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "write":
        return write(sys.argv[2])
    if len(sys.argv) == 4 and sys.argv[1] == "read":
        return read(sys.argv[2], sys.argv[3])
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
