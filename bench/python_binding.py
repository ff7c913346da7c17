#!/usr/bin/env python3
"""ctypes or nanobind for the monarch Python package? Times the read call
from a RAM-tier-hot file, 4 KiB and 110 KiB reads, through:

  ctypes-api  monarch.Monarch.readinto (the package: name check + ctypes call)
  ctypes-raw  the bare ctypes call of monarch_read with a prepared buffer
  nanobind    bench/python_binding_nb.cc, the same call as a nanobind function

and prints microseconds per call and the ratios. --build compiles the
nanobind module first (needs `pip install nanobind` in this interpreter).

  MONARCH_C_LIBRARY=build/libmonarch_c.so PYTHONPATH=python \
    python bench/python_binding.py --build --lib-dir build
"""

import argparse
import ctypes
import glob
import os
import subprocess
import sys
import sysconfig
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)


def build_nanobind(lib_dir, out_dir):
    import nanobind
    nb_dir = os.path.dirname(nanobind.__file__)
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    target = os.path.join(out_dir, "monarch_nb" + suffix)
    cmd = ["g++", "-O2", "-std=c++17", "-shared", "-fPIC", "-fvisibility=hidden",
           "-I" + nanobind.include_dir(), "-I" + os.path.join(nb_dir, "ext", "robin_map", "include"),
           "-I" + sysconfig.get_paths()["include"], "-I" + os.path.join(REPO, "include"),
           os.path.join(nb_dir, "src", "nb_combined.cpp"), os.path.join(HERE, "python_binding_nb.cc"),
           "-L" + lib_dir, "-lmonarch_c", "-Wl,-rpath," + os.path.abspath(lib_dir), "-o", target]
    print("build:", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)
    return out_dir


def per_call_us(fn, iterations, repeats=5):
    """Best of `repeats` runs of `iterations` calls (least disturbed by the
    other processes on the machine), in microseconds per call."""
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(iterations):
            fn()
        best = min(best, time.perf_counter() - start)
    return best / iterations * 1e6


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--build", action="store_true", help="compile the nanobind module")
    parser.add_argument("--lib-dir", default=os.path.join(REPO, "build"),
                        help="directory of libmonarch_c.so to link the nanobind module with")
    parser.add_argument("--nb-dir", default="/tmp/py-nb", help="where the module is built/found")
    parser.add_argument("--iterations", type=int, default=20000)
    args = parser.parse_args()
    os.makedirs(args.nb_dir, exist_ok=True)
    if args.build:
        build_nanobind(args.lib_dir, args.nb_dir)
    sys.path.insert(0, args.nb_dir)
    import monarch_nb
    import monarch
    from monarch import _lib

    with tempfile.TemporaryDirectory(prefix="mpyb") as dataset:
        with open(os.path.join(dataset, "img.jpg"), "wb") as f:
            f.write(os.urandom(110 * 1024))
        m = monarch.Monarch(dataset=dataset)
        m.read("img.jpg")
        m.wait_for_placement()
        ram = m.stats()["tiers"][0]
        assert ram["kind"] == "ram" and ram["files"] == 1, ram  # RAM-tier hot
        lib = _lib.lib()
        handle = m._h()
        print(f"library: {monarch.library_path()}  python {sys.version.split()[0]}")
        print(f"{'size':>8} {'ctypes-api':>11} {'ctypes-raw':>11} {'nanobind':>9}  "
              f"{'api/nb':>7} {'raw/nb':>7}  (us per call, best of 5 x {args.iterations})")
        for size in (4096, 110 * 1024):
            buf = bytearray(size)
            target = (ctypes.c_char * size).from_buffer(buf)
            got, err = ctypes.c_size_t(), ctypes.c_void_p()
            got_ref, err_ref = ctypes.byref(got), ctypes.byref(err)

            def api():
                return m.readinto("img.jpg", buf)

            def raw():
                return lib.monarch_read(handle, b"img.jpg", target, size, 0, got_ref, err_ref)

            def nb():
                return monarch_nb.read_into(handle.value, "img.jpg", buf, 0)

            assert api() == size and raw() == 0 and got.value == size and nb() == size
            times = [per_call_us(f, args.iterations) for f in (api, raw, nb)]
            print(f"{size:>8} {times[0]:>11.2f} {times[1]:>11.2f} {times[2]:>9.2f}  "
                  f"{times[0] / times[2]:>7.2f} {times[1] / times[2]:>7.2f}")
        del target
        m.close()


if __name__ == "__main__":
    main()
