"""The exception kinds monarch_code values turn into."""

import errno
import os

import pytest

import monarch


def test_missing_file_is_file_not_found(read_path, m):
    with pytest.raises(FileNotFoundError) as err:
        m.read("no/such/file.jpg")
    assert err.value.errno == errno.ENOENT and err.value.filename == "no/such/file.jpg"
    with pytest.raises(FileNotFoundError):
        m.open("no/such/file.jpg")
    with pytest.raises(FileNotFoundError) as err:
        monarch.Monarch("/nonexistent/monarch.yaml")
    assert err.value.filename == "/nonexistent/monarch.yaml"


def test_config_error_is_value_error_naming_the_key(dataset):
    with pytest.raises(ValueError, match="capacity") as err:
        monarch.Monarch(f"dataset: {{path: {dataset}}}\n"
                        "tiers: [{kind: ram, capacity: banana}, {kind: source}]\n")
    assert "banana" in str(err.value)
    with pytest.raises(ValueError, match="dataset.path"):
        monarch.Monarch("dataset: {path: relative/dir}\ntiers: [{kind: source}]\n")
    with pytest.raises(ValueError, match="scan_thread"):  # unknown keys are errors
        monarch.Monarch(f"dataset: {{path: {dataset}, scan_thread: 4}}\n"
                        "tiers: [{kind: source}]\n")


def test_source_io_errors_are_oserror_with_errno(read_path, m, dataset):
    # Both files are in the namespace (walked at open); their sources break
    # afterwards, so the read reaches the source and fails there.
    fifo = os.path.join(dataset, "blob.bin")
    os.unlink(fifo)
    os.mkfifo(fifo)  # Opened non-blocking; its pread fails with ESPIPE, named in the message.
    with pytest.raises(OSError) as err:
        m.read("blob.bin")
    assert type(err.value) is OSError and err.value.errno == errno.ESPIPE
    assert "blob.bin" in str(err.value) and err.value.filename == "blob.bin"
    loop = os.path.join(dataset, "sub", "hello.txt")
    os.unlink(loop)
    os.symlink("hello.txt", loop)  # open() fails with ELOOP, named in the message
    with pytest.raises(OSError) as err:
        m.read("sub/hello.txt")
    assert err.value.errno == errno.ELOOP


def test_other_failures_are_monarch_error(dataset, tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text(f"dataset: {{path: {dataset}}}\n"
                      "tiers: [{kind: ram, capacity: 1MiB}, {kind: source}]\n"
                      f"node: {{shared: true, autostart: false, runtime_dir: {tmp_path}/rt}}\n")
    with pytest.raises(monarch.MonarchError) as err:  # no service, and none may be started
        monarch.Monarch(config)
    assert isinstance(err.value, RuntimeError)
    assert err.value.code == monarch.FAILED_PRECONDITION
    assert err.value.code_name == "FAILED_PRECONDITION" and "service" in str(err.value)
