"""A handle used after fork(): Monarch in process reopens the same config
in the child; a node-service client goes on with the same handle."""

import multiprocessing
import os

import monarch
from monarch import _monarch


def _opened_here(m):
    """Whether `m`'s C handle was opened, or taken over, in this process (a
    fork since counts one more _fork_generation)."""
    return m._generation == _monarch._fork_generation


def _child_read(m, name, pipe):
    try:
        pipe.send((m.read(name), _opened_here(m), m.stats()["tiers"][-1]["bytes_read"]))
    except BaseException as e:  # Sent back so the parent's assertion shows it.
        pipe.send(e)


def in_forked_child(check):
    """Runs check() in a child made by os.fork(), which never returns into
    pytest; b"\x00" if it returned true, b"\x02" if false, b"\x01" if it
    raised."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:
        status = 1
        try:
            os.close(read_fd)
            status = 0 if check() else 2
        finally:
            os.write(write_fd, bytes([status]))
            os._exit(0)
    os.close(write_fd)
    with os.fdopen(read_fd, "rb") as r:
        answer = r.read()
    os.waitpid(pid, 0)
    return answer


def test_os_fork_reopens(m, dataset):
    assert m.read("sub/hello.txt") == b"hello monarch\n"
    parent_handle = m._handle.value

    def child():
        assert not _opened_here(m)
        data = m.read("blob.bin")
        # A new instance: its source counters start at this read.
        fresh = m.stats()["tiers"][-1]["bytes_read"] == len(data) == 300_000
        reopened = _opened_here(m) and m._handle.value != parent_handle
        return fresh and reopened

    assert in_forked_child(child) == b"\x00"
    # The parent's handle is untouched and still works.
    assert m._handle.value == parent_handle and _opened_here(m)
    assert m.read("sub/hello.txt") == b"hello monarch\n"
    assert m.stats()["tiers"][-1]["bytes_read"] == 14  # the child's reads are not ours


def test_multiprocessing_fork_and_spawn(m, dataset):
    m.read("sub/hello.txt")
    for method in ("fork", "spawn"):
        ctx = multiprocessing.get_context(method)
        here, there = ctx.Pipe()
        p = ctx.Process(target=_child_read, args=(m, "blob.bin", there))
        p.start()
        result = here.recv()
        p.join(60)
        assert not isinstance(result, BaseException), f"{method}: {result!r}"
        data, reopened, source_bytes = result
        with open(os.path.join(dataset, "blob.bin"), "rb") as f:
            assert data == f.read(), method
        assert reopened and source_bytes == 300_000, method
        assert p.exitcode == 0


def test_a_node_service_client_goes_on_in_a_forked_child(dataset):
    from conftest import SharedService
    service = SharedService(dataset)
    try:
        with monarch.Monarch(service.config) as m:
            assert m._fork_safe  # monarch_usable_after_fork: a service client
            assert m.read("sub/hello.txt") == b"hello monarch\n"
            parent_handle = m._handle.value

            def child():
                data = m.read("blob.bin")
                # The same C handle, no reopening: the library remaps the
                # service's tables in the child.
                same = m._handle.value == parent_handle and _opened_here(m)
                with open(os.path.join(dataset, "blob.bin"), "rb") as f:
                    return same and data == f.read()

            assert in_forked_child(child) == b"\x00"
            assert m.read("sub/hello.txt") == b"hello monarch\n"  # the parent goes on
    finally:
        service.stop()
    with monarch.Monarch(dataset=dataset) as embedded:
        assert not embedded._fork_safe  # in process: a child opens its own
