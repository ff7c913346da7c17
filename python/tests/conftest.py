"""Fixtures for the monarch package's tests.

The package under test is whatever `import monarch` finds: under ctest,
python/ (PYTHONPATH) over the build tree's libmonarch_c.so
(MONARCH_C_LIBRARY) and `monarch` binary (MONARCH_BINARY).
"""

import os
import shutil
import signal
import subprocess
import tempfile
import time

import numpy as np
import pytest

import monarch


@pytest.fixture
def dataset(tmp_path):
    """A small dataset with real files: random bytes, a .npy, a PNG, an HDF5
    file, a subdirectory. Returns its absolute path."""
    root = tmp_path / "ds"
    (root / "sub" / "deeper").mkdir(parents=True)
    rng = np.random.default_rng(7)
    (root / "blob.bin").write_bytes(rng.integers(0, 256, 300_000, dtype=np.uint8).tobytes())
    (root / "sub" / "hello.txt").write_bytes(b"hello monarch\n")
    (root / "sub" / "deeper" / "x.bin").write_bytes(b"\x00\x01\x02" * 1000)
    np.save(root / "array.npy", np.arange(1000, dtype=np.float64).reshape(20, 50))
    from PIL import Image
    img = Image.fromarray(rng.integers(0, 256, (24, 32, 3), dtype=np.uint8))
    img.save(root / "image.png")
    import h5py
    with h5py.File(root / "data.h5", "w") as f:
        f.create_dataset("values", data=np.arange(5000, dtype=np.int32))
        f.attrs["label"] = "monarch"
    return str(root)


@pytest.fixture
def m(dataset):
    """The embedded default (RAM tier over the source) over `dataset`."""
    with monarch.Monarch(dataset=dataset) as handle:
        yield handle


def monarch_binary():
    """The `monarch` command the package starts as the node service."""
    from monarch import _lib
    _lib.lib()  # Sets MONARCH_BINARY to the bundled binary if unset.
    binary = os.environ.get("MONARCH_BINARY")
    assert binary and os.access(binary, os.X_OK), f"no monarch binary (MONARCH_BINARY={binary})"
    return binary


def service_pids(runtime_dir):
    """Pids of `monarch serve` processes whose config lives in runtime_dir's
    test directory (the config path is on their command line)."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                args = f.read().split(b"\0")
        except OSError:
            continue
        if b"serve" in args and any(runtime_dir.encode() in a for a in args):
            pids.append(int(entry))
    return pids


class SharedService:
    """A config with `node: {shared: true}` in a short private runtime
    directory; stop() (also on teardown) stops its service and kills any
    leftover by pid, so no service outlives the test."""

    def __init__(self, dataset_dir, capacity="256MiB", extra=""):
        # Short: the socket path must fit in 108 bytes.
        self.dir = tempfile.mkdtemp(prefix="mpy", dir="/tmp")
        self.runtime_dir = os.path.join(self.dir, "rt")
        self.config = os.path.join(self.dir, "job.yaml")
        with open(self.config, "w") as f:
            f.write(f"dataset: {{path: {dataset_dir}}}\n"
                    f"tiers:\n  - {{kind: ram, capacity: {capacity}}}\n  - {{kind: source}}\n"
                    f"node: {{shared: true, runtime_dir: {self.runtime_dir}, idle_exit: 0}}\n"
                    + extra)

    def stop(self):
        subprocess.run([monarch_binary(), "stop", "--config", self.config],
                       capture_output=True, timeout=60)
        deadline = time.monotonic() + 10
        while service_pids(self.dir) and time.monotonic() < deadline:
            time.sleep(0.1)
        for pid in service_pids(self.dir):
            os.kill(pid, signal.SIGKILL)
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture(scope="session", autouse=True)
def private_runtime_directory():
    """Services the tests start on demand in default runtime directories
    (monarch.torch's datasets share the node unless told otherwise) live
    under a private XDG_RUNTIME_DIR, and none outlives the session."""
    base = tempfile.mkdtemp(prefix="mxdg", dir="/tmp")  # Short: socket paths.
    saved = os.environ.get("XDG_RUNTIME_DIR")
    os.environ["XDG_RUNTIME_DIR"] = base
    yield base

    def holders():
        """The services still running under `base`: each holds its runtime
        directory's monarch.lock, which names its pid."""
        pids = set(service_pids(base))
        for directory, _, files in os.walk(base):
            if "monarch.lock" in files:
                with open(os.path.join(directory, "monarch.lock")) as f:
                    pid = f.read().strip()
                if pid.isdigit() and os.path.exists(f"/proc/{pid}") and int(pid) != os.getpid():
                    pids.add(int(pid))
        return pids

    for pid in holders():
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 10
    while holders() and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid in holders():
        os.kill(pid, signal.SIGKILL)
    if saved is None:
        os.environ.pop("XDG_RUNTIME_DIR", None)
    else:
        os.environ["XDG_RUNTIME_DIR"] = saved
    shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def shared_service(dataset):
    service = SharedService(dataset)
    yield service
    service.stop()
    assert not service_pids(service.dir), "a monarch service outlived the test"


@pytest.fixture(params=["compiled", "ctypes"])
def read_path(request, monkeypatch):
    """Runs a test through each of Monarch.read()'s two paths: the compiled
    monarch._read_bytes (required when the build made one and named it in
    MONARCH_READ_BYTES_MODULE) and the three ctypes calls (in _read_name)."""
    if request.param == "ctypes":
        # Replaced where read() looks it up: the globals of read()'s own
        # module, which need not be the package (whose name can be a copy).
        assert "_read_bytes_module" in monarch.Monarch._read_name.__code__.co_names
        monkeypatch.setitem(monarch.Monarch.read.__globals__, "_read_bytes_module", lambda: None)
    elif monarch._read_bytes_module() is None:
        if os.environ.get("MONARCH_READ_BYTES_MODULE"):
            pytest.fail("MONARCH_READ_BYTES_MODULE is set, but monarch._read_bytes did not load")
        pytest.skip("monarch._read_bytes was not built")
    return request.param
