"""Runs in a fresh venv holding only the repaired wheel, on a "node" where
Debian's Abseil, yaml-cpp, libpmem (with libndctl and libdaxctl) and UCX
cannot be found (wheel_check.py hides them in a mount namespace). Exits
non-zero with the failed assertion; prints one JSON line of findings.

Usage: python wheel_node.py DATASET SHARED_CONFIG REMOTE_CONFIG HIDDEN_SONAMES_JSON
"""

import ctypes
import json
import os
import subprocess
import sys

from install_check import service_pids  # This directory is sys.path[0]; stdlib only.


def mapped_files(pid="self"):
    """The files mapped into a process (its loaded libraries among them)."""
    paths = set()
    with open(f"/proc/{pid}/maps") as f:
        for line in f:
            fields = line.split(None, 5)
            if len(fields) == 6 and fields[5].startswith("/"):
                paths.add(fields[5].strip())
    return paths


def bundled(paths, bundle_dir):
    """Which of Monarch's libraries (by name) were loaded from the wheel's bundle."""
    names = ("libabsl_", "libyaml-cpp", "libpmem")
    return {n: any(p.startswith(bundle_dir + "/") and os.path.basename(p).startswith(n)
                   for p in paths)
            for n in names}


def main():
    dataset, shared_config, remote_config, hidden_json = sys.argv[1:5]
    out = {}

    # The node really lacks them: not one can be loaded by name.
    for soname in json.loads(hidden_json):
        try:
            ctypes.CDLL(soname)
        except OSError:
            continue
        raise AssertionError(f"{soname} is still visible: the libraries are not hidden")

    import monarch
    package = os.path.dirname(monarch.__file__)
    bundle_dir = os.path.join(os.path.dirname(package), "monarch.libs")
    out["package"] = package
    out["library"] = monarch.library_path()
    assert out["library"] == os.path.join(package, "libmonarch_c.so"), out

    names = []
    for dirpath, _, files in os.walk(dataset):
        names += [os.path.relpath(os.path.join(dirpath, f), dataset) for f in files]
    names.sort()
    expected = {}
    for name in names:
        with open(os.path.join(dataset, name), "rb") as f:
            expected[name] = f.read()

    # 1. In this process, through the bundled library and read()'s compiled path.
    fast = monarch._read_bytes_module()
    assert fast is not None and fast.__file__ == os.path.join(package, "_read_bytes.abi3.so"), fast
    with monarch.Monarch(dataset=dataset) as m:
        for name in names:
            assert m.read(name) == expected[name], name
            assert m.read(name, offset=1000, size=100) == expected[name][1000:1100], name
        assert sorted(m.listdir()) == sorted(os.listdir(dataset))
    loaded = bundled(mapped_files(), bundle_dir)
    assert all(loaded.values()), f"not loaded from {bundle_dir}: {loaded}"
    out["in_process_files"] = len(names)
    # Set by the package once the library is loaded: what clients start.
    out["binary"] = os.environ.get("MONARCH_BINARY")
    assert out["binary"] == os.path.join(package, "bin", "monarch"), out

    # 2. Through the node service the client starts from the wheel's binary.
    with monarch.Monarch(shared_config) as m:
        for name in names:
            assert m.read(name) == expected[name], name
        stats = m.stats()
        assert stats["service"]["clients"] >= 1, stats["service"]
    pids = service_pids(shared_config)
    assert len(pids) == 1, f"node services started: {pids}"
    pid = pids[0]
    assert os.path.realpath(f"/proc/{pid}/exe") == os.path.realpath(out["binary"])
    loaded = bundled(mapped_files(pid), bundle_dir)
    assert all(loaded.values()), f"the service did not load from {bundle_dir}: {loaded}"
    out["service_pid"] = pid

    # 3. monarch.torch: DataLoader workers (forked) read through the service,
    # in the order the sampler announced.
    import torch.utils.data
    import monarch.torch as mt

    class Indexed(torch.utils.data.Dataset):
        def __init__(self, ds):
            self.ds = ds

        def __len__(self):
            return len(self.ds)

        def __getitem__(self, i):
            return i, self.ds[i]

    ds = mt.FileListDataset(names, config=shared_config)
    sampler = mt.AnnouncingSampler(torch.utils.data.RandomSampler(ds), ds)
    loader = torch.utils.data.DataLoader(Indexed(ds), sampler=sampler, batch_size=4,
                                         num_workers=2, collate_fn=list)
    seen = []
    for batch in loader:
        for i, data in batch:
            assert data == expected[ds.file_of(i)], ds.file_of(i)
            seen.append(i)
    assert sorted(seen) == list(range(len(names))), seen
    out["torch_samples"] = len(seen)

    # 4. Peers without UCX: the instance is refused, saying what to install.
    try:
        monarch.Monarch(remote_config)
    except monarch.MonarchError as e:
        assert e.code == monarch.FAILED_PRECONDITION, (e.code_name, str(e))
        out["remote_error"] = str(e)
    else:
        raise AssertionError("remote.enabled without UCX created an instance")
    for part in ("remote.enabled", "libucp.so.0", "cannot open shared object file", "libucx0",
                 "LD_LIBRARY_PATH"):
        assert part in out["remote_error"], (part, out["remote_error"])

    subprocess.run([out["binary"], "stop", "--config", shared_config], check=True,
                   capture_output=True, timeout=60)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
