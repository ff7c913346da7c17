"""The repaired wheel on a node that has none of Monarch's libraries.

Takes the wheels scripts/build_wheel.sh left (ctest's python_wheel_build):
the repaired one in MONARCH_WHEEL_DIST, the unrepaired one in
MONARCH_WHEEL_WORK_DIR/raw. Then:

1. The repaired wheel has a manylinux tag, bundles Abseil, yaml-cpp and
   libpmem, and neither bundles nor needs UCX (no ELF in it lists a libuc*).
2. Installed into a fresh venv, it runs wheel_node.py in a mount namespace
   where the Debian libraries it was built against are hidden: reads
   byte-exact in process, through the node service started from the wheel's
   binary, and through monarch.torch's DataLoader; peers are refused with
   the error that names UCX.
3. Controls, so that a pass means something: outside the namespace the
   hidden libraries load and the same peers config starts (UCX found);
   inside it, the unrepaired wheel cannot read a byte.

Run by ctest as python_wheel with MONARCH_PYTHON (whose base interpreter
makes the venvs, and whose torch the venv borrows). Exits 77 (ctest's
SKIP_RETURN_CODE) where libraries cannot be hidden: not root, no
`unshare`, or bind mounts in a mount namespace refused (a container
without CAP_SYS_ADMIN).
"""

import glob
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile

from install_check import service_pids  # This directory is sys.path[0].

HERE = os.path.dirname(os.path.abspath(__file__))
SKIP = 77

# What a cluster node without root may lack: every library the wheel is
# built against outside the manylinux baseline (libpmem with the two
# libraries of its own stack), and UCX with its transport plugins (ucx/).
HIDDEN_PREFIXES = ("libabsl_", "libyaml-cpp", "libpmem", "libndctl", "libdaxctl",
                   "libucp", "libucs", "libuct", "libucm", "ucx")
UCX_SONAME = "libucp.so.0"


def hidden(name):
    return name.startswith(HIDDEN_PREFIXES)


def run(args, **kwargs):
    kwargs.setdefault("capture_output", True)
    kwargs.setdefault("text", True)
    return subprocess.run(args, **kwargs)


def needed(path):
    """The DT_NEEDED entries of an ELF file."""
    r = run(["readelf", "-d", path], check=True)
    return re.findall(r"\(NEEDED\).*\[(.+)\]", r.stdout)


def is_elf(path):
    with open(path, "rb") as f:
        return f.read(4) == b"\x7fELF"


def library_directories(raw_library):
    """{directory: [sonames]} for the hidden libraries the unrepaired
    library resolves to (ldd), plus UCX's (ldconfig)."""
    dirs = {}
    for line in run(["ldd", raw_library], check=True).stdout.splitlines():
        m = re.match(r"\s*(\S+) => (/\S+)", line)
        if m and hidden(m.group(1)):
            dirs.setdefault(os.path.dirname(os.path.realpath(m.group(2))), []).append(m.group(1))
    for line in run(["ldconfig", "-p"], check=True).stdout.splitlines():
        m = re.match(r"\s*(\S+) \(.*x86-64.*\) => (/\S+)", line)
        if m and m.group(1) == UCX_SONAME:
            dirs.setdefault(os.path.dirname(os.path.realpath(m.group(2))), []).append(UCX_SONAME)
    return dirs


def build_farms(dirs, work):
    """For each directory, a farm: a directory of symlinks to every entry of
    the original except the hidden ones, pointing through a stash mount
    of the original. Bound over the original inside the namespace, it
    leaves libc, libstdc++ and the rest where the loader expects them
    (the directory also holds those, so it cannot be hidden whole) while
    the hidden libraries are simply absent, as on a node without them:
    the loader says "cannot open shared object file", as a user would see
    it. (Empty files bound over each library would make them unreadable,
    not absent, and take one mount per file.)"""
    farms = []
    for i, real in enumerate(sorted(dirs)):
        farm, stash = os.path.join(work, f"farm{i}"), os.path.join(work, f"stash{i}")
        os.makedirs(farm)
        os.makedirs(stash)
        for entry in os.listdir(real):
            if not hidden(entry):
                os.symlink(os.path.join(stash, entry), os.path.join(farm, entry))
        farms.append((real, farm, stash))
    return farms


def run_hidden(farms, argv, env, timeout):
    """Runs argv in a new mount namespace with the farms bound over the
    originals; nothing outside the namespace sees them."""
    script = ["set -e"]
    for real, farm, stash in farms:
        script += [f"mount --bind {shlex.quote(real)} {shlex.quote(stash)}",
                   f"mount --bind {shlex.quote(farm)} {shlex.quote(real)}"]
    script.append('exec "$@"')
    return run(["unshare", "--mount", "--propagation", "private", "sh", "-c",
                "\n".join(script), "sh", *argv], env=env, timeout=timeout)


def make_venv(base, path, wheel, env):
    run([base, "-m", "venv", path], check=True)
    python = os.path.join(path, "bin", "python")
    r = run([python, "-m", "pip", "install", "--no-index", "--disable-pip-version-check",
             wheel], env=env)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return python


def make_dataset(root):
    """Two class directories of files from empty to a few MiB (several
    transfer chunks), random bytes."""
    sizes = [0, 1, 4095, 4096, 4097, 65536, 300_000, 1 << 20, (3 << 20) + 123]
    for cls in ("cls0", "cls1"):
        os.makedirs(os.path.join(root, cls))
        for i, size in enumerate(sizes):
            with open(os.path.join(root, cls, f"f{i}.bin"), "wb") as f:
                f.write(os.urandom(size))


def skip_reason():
    if os.geteuid() != 0:
        return "not root: cannot make a mount namespace to hide libraries"
    if shutil.which("unshare") is None:
        return "no unshare(1)"
    # What run_hidden does, on two empty directories.
    probe = tempfile.mkdtemp(prefix="mwhlprobe", dir="/tmp")
    try:
        os.mkdir(os.path.join(probe, "a"))
        os.mkdir(os.path.join(probe, "b"))
        r = run(["unshare", "--mount", "--propagation", "private", "mount", "--bind",
                 os.path.join(probe, "a"), os.path.join(probe, "b")])
    finally:
        shutil.rmtree(probe, ignore_errors=True)
    if r.returncode != 0:
        return f"bind mounts in a mount namespace refused: {r.stderr.strip()}"
    return None


def main():
    reason = skip_reason()
    if reason:
        print(f"SKIP: {reason}")
        return SKIP
    started = time.monotonic()
    repaired = glob.glob(os.path.join(os.environ["MONARCH_WHEEL_DIST"], "monarch-*.whl"))
    raw = glob.glob(os.path.join(os.environ["MONARCH_WHEEL_WORK_DIR"], "raw", "monarch-*.whl"))
    assert len(repaired) == 1 and len(raw) == 1, (repaired, raw)
    repaired, raw = repaired[0], raw[0]

    # 1. What the repaired wheel holds.
    tag = os.path.basename(repaired)[:-len(".whl")].split("-")[-1]
    assert re.fullmatch(r"manylinux_\d+_\d+_x86_64(\.manylinux\w+)*", tag), tag
    with zipfile.ZipFile(repaired) as z:
        members = z.namelist()
    bundle = [os.path.basename(m) for m in members if m.startswith("monarch.libs/")]
    for prefix in ("libabsl_", "libyaml-cpp", "libpmem"):
        assert any(b.startswith(prefix) for b in bundle), (prefix, bundle)
    ucx_files = [m for m in members if re.search(r"(^|/)libuc[mpst]", m)]
    assert not ucx_files, f"UCX is in the wheel: {ucx_files}"
    for member in ("monarch/libmonarch_c.so", "monarch/_read_bytes.abi3.so", "monarch/bin/monarch"):
        assert member in members, (member, members)

    base = run([os.environ.get("MONARCH_PYTHON", sys.executable), "-c",
                "import sys; print(sys._base_executable)"], check=True).stdout.strip()
    torch_site = run([os.environ.get("MONARCH_PYTHON", sys.executable), "-c",
                      "import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))"],
                     check=True).stdout.strip()
    work = tempfile.mkdtemp(prefix="mwhl", dir="/tmp")
    # Nothing from the build tree, the source tree or the system's UCX path may leak in.
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "MONARCH_C_LIBRARY", "MONARCH_BINARY", "MONARCH_CONFIG",
                        "MONARCH_DATASET", "MONARCH_READ_BYTES_MODULE", "LD_LIBRARY_PATH",
                        "LD_PRELOAD")}
    try:
        python = make_venv(base, os.path.join(work, "venv"), repaired, env)
        raw_python = make_venv(base, os.path.join(work, "venv-raw"), raw, env)
        site = run([python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                   check=True).stdout.strip()
        # torch (hundreds of MB) from MONARCH_PYTHON's environment, after the
        # venv's own site-packages: the venv's monarch is the one imported.
        with open(os.path.join(site, "borrowed_torch.pth"), "w") as f:
            f.write(torch_site + "\n")
        package = os.path.join(site, "monarch")
        for dirpath, _, files in os.walk(site):
            for f in files:
                path = os.path.join(dirpath, f)
                if (path.startswith(package + os.sep) or "/monarch.libs/" in path) and \
                        is_elf(path):
                    ucx = [n for n in needed(path) if n.startswith("libuc")]
                    assert not ucx, f"{path} needs {ucx}"

        dataset = os.path.join(work, "ds")
        make_dataset(dataset)
        shared = os.path.join(work, "shared.yaml")
        with open(shared, "w") as f:
            f.write(f"dataset: {{path: {dataset}}}\n"
                    "tiers: [{kind: ram, capacity: 64MiB}, {kind: source}]\n"
                    f"node: {{shared: true, runtime_dir: {work}/rt, idle_exit: 0}}\n")
        remote = os.path.join(work, "remote.yaml")
        with open(remote, "w") as f:
            f.write(f"dataset: {{path: {dataset}}}\n"
                    "tiers: [{kind: ram, capacity: 64MiB}, {kind: source}]\n"
                    f"remote: {{enabled: true, rank: 0, size: 1, rendezvous_dir: {work}/rv}}\n")

        dirs = library_directories(os.path.join(
            os.path.dirname(run([raw_python, "-c", "import monarch; print(monarch.__file__)"],
                                env=env, check=True).stdout.strip()), "libmonarch_c.so"))
        sonames = sorted({s for names in dirs.values() for s in names})
        for prefix in ("libabsl_", "libyaml-cpp", "libpmem", "libucp"):
            assert any(s.startswith(prefix) for s in sonames), (prefix, dirs)
        farms = build_farms(dirs, work)

        # Controls outside the namespace: the libraries load, and peers start.
        r = run([python, "-c", "import ctypes, json, sys\n"
                 "for s in json.loads(sys.argv[1]): ctypes.CDLL(s)", json.dumps(sonames)], env=env)
        assert r.returncode == 0, r.stderr
        r = run([python, "-c", "import monarch, sys\n"
                 "with monarch.Monarch(sys.argv[1]) as m: assert m.read('cls0/f1.bin')",
                 remote], env=env, timeout=120)
        assert r.returncode == 0, "peers did not start with the system's UCX: " + r.stderr[-3000:]

        # The unrepaired wheel, on the node without the libraries: nothing reads.
        r = run_hidden(farms, [raw_python, "-c", "import monarch, sys\n"
                               "monarch.Monarch(dataset=sys.argv[1]).read('cls0/f1.bin')",
                               dataset], env, timeout=120)
        assert r.returncode != 0 and "cannot open shared object file" in r.stderr, \
            (r.returncode, r.stderr[-3000:])
        print("control: the unrepaired wheel fails there:", r.stderr.strip().splitlines()[-1])

        # The repaired wheel, on that node.
        r = run_hidden(farms, [python, os.path.join(HERE, "wheel_node.py"), dataset, shared,
                               remote, json.dumps(sonames)], env, timeout=600)
        sys.stdout.write(r.stdout)
        assert r.returncode == 0, r.stderr[-6000:]
        out = json.loads(r.stdout.strip().splitlines()[-1])
        assert out["package"] == package, (out["package"], package)
        print("hidden:", ", ".join(sonames))
        print("peers without UCX:", out["remote_error"])
        print(f"python_wheel: passed in {time.monotonic() - started:.1f} s "
              f"(wheel {os.path.basename(repaired)})")
        return 0
    finally:
        for pid in service_pids(os.path.join(work, "shared.yaml")):
            os.kill(pid, 9)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
