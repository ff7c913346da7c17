"""Byte-exact TFRecord reads through monarch://, from the source (epoch 1) and
from a faster tier (later epochs), with parallel interleaved readers."""

import os
import select
import shutil
import signal

import pytest

from conftest import run_child, write_config


@pytest.mark.parametrize("kind,shared", [("ram", False), ("posix", False), ("ram", True)])
def test_records_byte_exact_across_epochs(records_dataset, tmp_path, kind, shared):
    """With `shared`, the plugin is unchanged but the process is a client of
    a node service it starts itself; the stats are then the node's."""
    root, total = records_dataset
    node_dir = f"/tmp/monarch-tf-{os.getpid()}" if shared else None
    config = write_config(tmp_path / "monarch.yaml", root,
                          [(kind, 2 * total, tmp_path / "tier" if kind == "posix" else None)],
                          node_dir=node_dir)
    result, _ = run_child("read_records", {"root": root, "epochs": 3, "parallel": 4},
                          env={"MONARCH_CONFIG": config})

    assert result["files"] == result["plain_files"]  # list_files/glob saw the same files.
    assert result["records"] > 2000
    assert [e["equal"] for e in result["epochs"]] == [True, True, True]

    first, second, third = (e["stats"] for e in result["epochs"])
    tier, source = first["tiers"][0], first["tiers"][-1]
    assert source["kind"] == "source" and tier["kind"] == kind
    # Epoch 1 came from the source and every file was promoted.
    assert source["bytes_read"] >= total
    assert first["promotions_completed"] == len(result["files"])
    # A posix copy also holds its checksum trailer: 4 bytes per 4 KiB block
    # and a 64-byte footer (src/drivers/copy_integrity.h).
    trailers = sum(4 * -(-os.path.getsize(f) // 4096) + 64 for f in result["files"])
    assert tier["files"] == len(result["files"])
    assert tier["bytes_used"] == total + (trailers if kind == "posix" else 0)
    # Epochs 2 and 3: not one byte from the source, everything from the tier.
    for before, after in ((first, second), (second, third)):
        assert after["tiers"][-1]["reads"] == before["tiers"][-1]["reads"]
        assert after["tiers"][-1]["bytes_read"] == before["tiers"][-1]["bytes_read"]
        assert after["tiers"][0]["bytes_read"] - before["tiers"][0]["bytes_read"] >= total
    for t in third["tiers"]:
        assert t["read_errors"] == 0 and t["write_errors"] == 0
    if shared:
        # The service served the misses; the client its own hits.
        assert third["service"]["clients"] == 1
        assert os.path.exists(os.path.join(node_dir, "monarch.lock"))
        with open(os.path.join(node_dir, "monarch.lock")) as lock:
            service_pid = int(lock.read().split()[0])
        # The client is gone: the service exits after idle_exit (3 s), and
        # takes the RAM copies it kept on /dev/shm with it (node.keep_ram),
        # so that repeated runs leave nothing in the node's memory.
        try:
            pidfd = os.pidfd_open(service_pid)
        except ProcessLookupError:
            pidfd = None  # Already gone.
        if pidfd is not None:
            exited = select.select([pidfd], [], [], 60)[0]  # Readable once it has exited.
            os.close(pidfd)
            if not exited:
                os.kill(service_pid, signal.SIGKILL)
                pytest.fail(f"the node service {service_pid} did not exit after idle_exit")
        # Where the service kept them (drivers/ram_keep.h): the runtime
        # directory's path with '%' and '/' escaped.
        escaped = node_dir.replace("%", "%25").replace("/", "%2F")
        kept = f"/dev/shm/monarch-{os.geteuid()}/{escaped}"
        assert not os.path.exists(kept), "an idle exit leaves the kept RAM copies"
        shutil.rmtree(node_dir, ignore_errors=True)
