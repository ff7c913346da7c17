"""What `pip install ./python` installs, into a throwaway venv, then use the
installed package only: its bundled libmonarch_c.so reads a file
byte-exact, and its bundled `monarch` binary is what a shared config
autostarts.

The wheel is the one scikit-build-core built for scripts/build_wheel.sh
before auditwheel repaired it (MONARCH_WHEEL_WORK_DIR/raw): the same build
backend and CMake targets `pip install ./python` uses, so the core is
compiled once for this test and python_wheel (ctest's python_wheel_build).
"""

import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile

CHECK = r"""
import json, os, subprocess, sys
import monarch
here = os.path.dirname(monarch.__file__)
dataset, config = sys.argv[1], sys.argv[2]
out = {"package": here, "library": monarch.library_path()}
fast = monarch._read_bytes_module()  # read()'s compiled path, bundled
out["read_bytes_module"] = fast.__file__ if fast is not None else None
with monarch.Monarch(dataset=dataset) as m:
    out["read_ok"] = m.read("payload.bin") == open(os.path.join(dataset, "payload.bin"), "rb").read()
    out["listdir"] = m.listdir()
out["binary"] = os.environ.get("MONARCH_BINARY")
with monarch.Monarch(config) as m:  # autostarts the node service with the bundled binary
    out["shared_read_ok"] = m.read("payload.bin", 5, 10) == open(os.path.join(dataset, "payload.bin"), "rb").read()[5:15]
    out["service_clients"] = m.stats()["service"]["clients"]
print(json.dumps(out))
"""


def service_pids(marker):
    pids = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                args = f.read().split(b"\0")
        except OSError:
            continue
        if b"serve" in args and any(marker.encode() in a for a in args):
            pids.append(int(entry))
    return pids


def test_pip_install_and_use():
    base = subprocess.run([os.environ.get("MONARCH_PYTHON", sys.executable), "-c",
                           "import sys; print(sys._base_executable)"],
                          capture_output=True, text=True, check=True).stdout.strip()
    work = tempfile.mkdtemp(prefix="mpyi", dir="/tmp")
    venv = os.path.join(work, "venv")
    try:
        subprocess.run([base, "-m", "venv", "--system-site-packages", venv], check=True)
        python = os.path.join(venv, "bin", "python")
        # Nothing from the build tree or the source tree may leak in.
        env = {k: v for k, v in os.environ.items()
               if k not in ("PYTHONPATH", "MONARCH_C_LIBRARY", "MONARCH_BINARY",
                            "MONARCH_CONFIG", "MONARCH_DATASET")}
        wheels = glob.glob(os.path.join(os.environ["MONARCH_WHEEL_WORK_DIR"], "raw",
                                        "monarch-*.whl"))
        assert len(wheels) == 1, wheels
        r = subprocess.run([python, "-m", "pip", "install", "--no-index",
                            "--disable-pip-version-check", wheels[0]],
                           cwd=work, env=env, capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, r.stdout[-5000:] + r.stderr[-5000:]

        dataset = os.path.join(work, "ds")
        os.makedirs(dataset)
        with open(os.path.join(dataset, "payload.bin"), "wb") as f:
            f.write(os.urandom(200_000))
        config = os.path.join(work, "job.yaml")
        with open(config, "w") as f:
            f.write(f"dataset: {{path: {dataset}}}\n"
                    "tiers: [{kind: ram, capacity: 16MiB}, {kind: source}]\n"
                    f"node: {{shared: true, runtime_dir: {work}/rt, idle_exit: 0}}\n")
        r = subprocess.run([python, "-c", CHECK, dataset, config], cwd=work, env=env,
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr[-5000:]
        out = json.loads(r.stdout.strip().splitlines()[-1])
        site = os.path.join(venv, "lib")
        assert out["package"].startswith(site), out  # the installed copy, not python/
        assert out["library"] == os.path.join(out["package"], "libmonarch_c.so"), out
        assert out["binary"] == os.path.join(out["package"], "bin", "monarch"), out
        assert out["read_ok"] and out["listdir"] == ["payload.bin"], out
        assert out["read_bytes_module"] == os.path.join(out["package"], "_read_bytes.abi3.so"), out
        assert out["shared_read_ok"] and out["service_clients"] >= 1, out
        pids = service_pids(config)
        assert pids, "no node service was started from the installed binary"
        assert os.path.realpath(f"/proc/{pids[0]}/exe") == os.path.realpath(out["binary"])
        subprocess.run([out["binary"], "stop", "--config", config], capture_output=True,
                       timeout=60)
    finally:
        for pid in service_pids(os.path.join(work, "job.yaml")):
            os.kill(pid, 9)
        shutil.rmtree(work, ignore_errors=True)
