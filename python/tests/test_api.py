"""Reads, file objects and namespace queries of monarch.Monarch."""

import io
import os
import pickle
import stat

import numpy as np
import pytest

import monarch


def source(dataset, name):
    with open(os.path.join(dataset, name), "rb") as f:
        return f.read()


def test_read_whole_ranges_and_past_eof(read_path, m, dataset):
    blob = source(dataset, "blob.bin")
    assert m.read("blob.bin") == blob
    assert m.read(os.path.join(dataset, "blob.bin")) == blob  # absolute path under the root
    assert m.read("./sub/../blob.bin") == blob
    assert m.read("blob.bin", 1000, 4096) == blob[1000:5096]
    assert m.read("blob.bin", len(blob) - 10, 4096) == blob[-10:]  # short at the end
    assert m.read("blob.bin", len(blob)) == b""
    assert m.read("blob.bin", len(blob) + 12345, 100) == b""
    assert m.read("blob.bin", 0, 0) == b""
    with pytest.raises(ValueError):
        m.read("blob.bin", -1, 10)


def test_readinto_numpy_bytearray_memoryview(m, dataset):
    blob = source(dataset, "blob.bin")
    array = np.zeros(4096, dtype=np.uint8)
    assert m.readinto("blob.bin", array, 5) == 4096
    assert array.tobytes() == blob[5:4101]
    floats = np.zeros(100, dtype=np.float64)  # any element type: bytes are bytes
    assert m.readinto("blob.bin", floats) == 800
    assert floats.tobytes() == blob[:800]
    buf = bytearray(300_100)
    assert m.readinto("blob.bin", buf) == 300_000  # short at the end of the file
    assert bytes(buf[:300_000]) == blob and buf[300_000:] == bytearray(100)
    # Zero copy into a slice: only that window of the buffer changes.
    backing = bytearray(b"\xff" * 64)
    assert m.readinto("blob.bin", memoryview(backing)[16:32], 100) == 16
    assert backing[:16] == b"\xff" * 16 and backing[32:] == b"\xff" * 32
    assert bytes(backing[16:32]) == blob[100:116]
    assert m.readinto("blob.bin", bytearray(10), 10**7) == 0  # past the end
    with pytest.raises(TypeError):
        m.readinto("blob.bin", b"read-only bytes")
    with pytest.raises(TypeError):
        m.readinto("blob.bin", memoryview(bytearray(8)).toreadonly())
    readonly = np.zeros(8, dtype=np.uint8)
    readonly.flags.writeable = False
    with pytest.raises((TypeError, ValueError)):
        m.readinto("blob.bin", readonly)


def test_open_read_seek_tell(m, dataset):
    blob = source(dataset, "blob.bin")
    with m.open("blob.bin") as f:
        assert isinstance(f, io.BufferedReader) and isinstance(f.raw, io.RawIOBase)
        assert f.readable() and f.seekable() and not f.writable()
        assert f.name == "blob.bin" and f.mode == "rb"
        assert f.read(10) == blob[:10] and f.tell() == 10
        assert f.seek(100) == 100 and f.read(5) == blob[100:105]
        assert f.seek(-5, io.SEEK_CUR) == 100 and f.read(5) == blob[100:105]
        assert f.seek(-7, io.SEEK_END) == len(blob) - 7 and f.read() == blob[-7:]
        assert f.read(10) == b"" and f.tell() == len(blob)
        f.seek(1000)
        into = bytearray(2000)
        assert f.readinto(into) == 2000 and bytes(into) == blob[1000:3000]
        f.seek(0)
        assert f.read() == blob
        with pytest.raises(OSError):
            f.seek(-1)
    with pytest.raises(ValueError):
        f.read(1)  # closed
    raw = m.open("sub/hello.txt", buffering=0)
    assert isinstance(raw, monarch.MonarchFile) and raw.readall() == b"hello monarch\n"
    with pytest.raises(ValueError):
        m.open("blob.bin", "r")


def test_open_with_pil_numpy_h5py(m, dataset):
    from PIL import Image
    import h5py
    with Image.open(os.path.join(dataset, "image.png")) as expected, \
            Image.open(m.open("image.png")) as img:
        assert img.format == "PNG" and img.size == (32, 24)
        assert np.array_equal(np.asarray(img), np.asarray(expected))
    with m.open("array.npy") as f:
        loaded = np.load(f)
    assert np.array_equal(loaded, np.arange(1000, dtype=np.float64).reshape(20, 50))
    with m.open("data.h5") as f, h5py.File(f, "r") as h5:
        assert h5.attrs["label"] == "monarch"
        assert np.array_equal(h5["values"][:], np.arange(5000, dtype=np.int32))
        assert h5["values"][4000:4003].tolist() == [4000, 4001, 4002]


def test_every_spelling_of_a_path_names_what_normpath_names(m, dataset):
    # _name() passes an already canonical relative path through as it is
    # and normalises any other: both must name the same dataset file.
    hello = source(dataset, "sub/hello.txt")
    for path in ("sub/hello.txt", "sub//hello.txt", "./sub/hello.txt", "sub/./hello.txt",
                 "sub/deeper/../hello.txt", "sub/hello.txt/.",
                 os.path.join(dataset, "sub/hello.txt"), dataset + "//sub/./hello.txt"):
        assert m._name(path) == b"sub/hello.txt", path
        assert m.read(path) == hello, path
    assert m._name(b"sub/hello.txt") == b"sub/hello.txt"
    assert m._name("a/.b") == b"a/.b" and m._name(".b/c") == b".b/c"  # dot files, not "."
    assert m._name("sub\udcff") == os.fsencode("sub\udcff")  # an undecodable byte kept
    for path in ("..", "../blob.bin", "sub/../../blob.bin"):
        with pytest.raises(FileNotFoundError):
            m._name(path)


def test_paths_outside_the_dataset(m, dataset):
    for path in ("/etc/passwd", "../ds/blob.bin", os.path.dirname(dataset) + "/other",
                 "nope.bin", "sub/nope"):
        with pytest.raises(FileNotFoundError) as err:
            m.read(path)
        assert err.value.errno == 2 and err.value.filename == path
        assert not m.exists(path)
    with pytest.raises(IsADirectoryError):
        m.read("sub")


def test_namespace(m, dataset):
    assert m.root == dataset
    assert m.listdir() == sorted(["blob.bin", "sub", "array.npy", "image.png", "data.h5"])
    assert m.listdir("sub") == ["deeper", "hello.txt"]
    assert m.listdir(os.path.join(dataset, "sub", "deeper")) == ["x.bin"]
    assert m.glob("*.bin") == ["blob.bin"]
    assert m.glob("sub/*") == ["sub/deeper", "sub/hello.txt"]
    assert m.glob(os.path.join(dataset, "sub", "*", "*.bin")) == [
        os.path.join(dataset, "sub", "deeper", "x.bin")]
    assert m.glob("*.none") == []
    st = m.stat("blob.bin")
    real = os.stat(os.path.join(dataset, "blob.bin"))
    assert st.st_size == 300_000 and st.st_mtime_ns == real.st_mtime_ns
    assert stat.S_ISREG(st.st_mode) and abs(st.st_mtime - real.st_mtime) < 1e-3
    assert stat.S_ISDIR(m.stat("sub").st_mode)
    assert m.exists("sub") and m.exists("sub/hello.txt") and m.exists("")
    assert m.isdir("sub") and not m.isdir("sub/hello.txt") and m.isdir(dataset)
    assert m.isfile("sub/hello.txt") and not m.isfile("sub")
    with pytest.raises(FileNotFoundError):
        m.stat("missing")
    with pytest.raises(FileNotFoundError):
        m.listdir("missing")
    walked = {d: (sorted(ds), sorted(fs)) for d, ds, fs in m.walk("sub")}
    assert walked == {"sub": (["deeper"], ["hello.txt"]), "sub/deeper": ([], ["x.bin"])}


def test_stats_count_reads(m, dataset):
    before = m.stats()
    assert before["tiers"][-1]["kind"] == "source" and before["tiers"][0]["kind"] == "ram"
    m.read("blob.bin")
    m.wait_for_placement()
    after = m.stats()
    source_tier, ram = after["tiers"][-1], after["tiers"][0]
    assert source_tier["bytes_read"] - before["tiers"][-1]["bytes_read"] == 300_000
    assert ram["files"] == 1 and ram["bytes_used"] == 300_000
    m.read("blob.bin")
    assert m.stats()["tiers"][0]["bytes_read"] == 300_000  # the second read hit RAM
    assert "monarch_" in m.stats_prometheus()


def test_mmap_fills_small_files_and_maps_big_ones_from_the_source(tmp_path):
    root = tmp_path / "ds"
    root.mkdir()
    rng = np.random.default_rng(30)
    small = rng.integers(0, 256, 300_000, dtype=np.uint8).tobytes()
    big = rng.integers(0, 256, (12 << 20) + 123, dtype=np.uint8).tobytes()
    (root / "small.bin").write_bytes(small)
    (root / "big.bin").write_bytes(big)
    (root / "empty.bin").write_bytes(b"")
    with monarch.Monarch(dataset=str(root)) as m:
        filled, lazy = m.mmap("small.bin"), m.mmap(str(root / "big.bin"))
        assert filled[:] == small and len(lazy) == len(big)
        array = np.frombuffer(lazy, dtype=np.uint8)
        assert array[len(big) - 1] == big[-1] and bytes(array[5 << 20:(5 << 20) + 4096]) == \
            big[5 << 20:(5 << 20) + 4096]
        del array
        # The big file is the source file itself, mapped; the small one a
        # private memory file, filled through Monarch (its source tier read it).
        maps = open("/proc/self/maps").read()
        assert str(root / "big.bin") in maps and "monarch-mapping" in maps
        assert m.stats()["tiers"][-1]["bytes_read"] == len(small)
        for mapped in (filled, lazy):
            with pytest.raises(TypeError):
                mapped[0] = 1  # Read-only, as a mapping of a read-only file.
            mapped.close()
        with pytest.raises(ValueError):
            m.mmap("empty.bin")
        with pytest.raises(FileNotFoundError):
            m.mmap("missing.bin")


@pytest.mark.parametrize("kind", ["posix", "ram"])
def test_mmap_maps_the_copies_of_a_tier_in_place(tmp_path, kind):
    """A posix tier's checked copies, or the RAM tier's own memory."""
    root = tmp_path / "ds"
    nvme = tmp_path / "nvme"
    root.mkdir()
    nvme.mkdir()
    rng = np.random.default_rng(31)
    big = rng.integers(0, 256, (12 << 20) + 123, dtype=np.uint8).tobytes()
    (root / "big.bin").write_bytes(big)
    tier = ("{kind: posix, path: %s, capacity: 64MiB}" % nvme if kind == "posix"
            else "{kind: ram, capacity: 64MiB}")
    marker = str(nvme) + "/.monarch/extents/" if kind == "posix" else "/memfd:monarch-ram"
    config = ("dataset: {path: %s}\n"
              "tiers:\n  - %s\n  - {kind: source}\n"
              "placement: {extent_bytes: 1MiB, extent_threshold: 4MiB, cached_source: promote}\n"
              % (root, tier))

    def mapped_from_copies():
        # Private mappings only: a process's own mappings of the RAM tier,
        # to read it, are shared.
        total = 0
        for line in open("/proc/self/maps").read().splitlines():
            fields = line.split()
            if marker in line and fields[1].endswith("p"):
                start, end = (int(x, 16) for x in fields[0].split("-"))
                total += end - start
        return total

    with monarch.Monarch(config) as m:
        before = m.mmap("big.bin")  # Nothing copied yet: all of it the source.
        assert mapped_from_copies() == 0
        before.close()
        assert m.read("big.bin") == big
        m.wait_for_placement()  # Copied by extents (and a posix tier's checked).
        lazy = m.mmap("big.bin")
        # The 12 whole extents' copies (the last, of 123 bytes, is less than
        # a page: it stays on the source).
        assert mapped_from_copies() == 12 << 20
        assert lazy[:] == big
        assert m.stats()["tiers"][-1]["bytes_read"] == len(big)  # Read once, to copy.
        lazy.close()


def test_stage_with_progress(m, dataset):
    out = io.StringIO()  # not a terminal: a line per 10%, then a summary
    result = m.stage(["*.bin", "sub"], file=out)
    assert result == monarch.StageResult(files=3, bytes=300_000 + 14 + 3000)
    text = out.getvalue()
    assert "monarch stage: 3 files" in text and "\r" not in text
    assert text.count("\n") >= 2  # at least one progress line before the summary
    ram = m.stats()["tiers"][0]
    assert ram["files"] == 3 and ram["bytes_used"] == result.bytes  # promoted

    class Terminal(io.StringIO):
        def isatty(self):
            return True
    tty = Terminal()
    assert m.stage("image.png", file=tty).files == 1
    assert "\r[" in tty.getvalue() and "#" in tty.getvalue()
    quiet = io.StringIO()
    m.stage("array.npy", progress=False, file=quiet)
    assert quiet.getvalue() == ""
    with pytest.raises(FileNotFoundError):
        m.stage("missing.bin", file=io.StringIO())


def test_config_sources(dataset, tmp_path, monkeypatch):
    yaml = (f"dataset: {{path: {dataset}}}\n"
            "tiers: [{kind: ram, capacity: 64MiB}, {kind: source}]\n")
    with monarch.Monarch(yaml) as m:  # a string with a newline is YAML text
        assert m.read("sub/hello.txt") == b"hello monarch\n"
    path = tmp_path / "c.yaml"
    path.write_text(yaml)
    with monarch.Monarch(path) as m:  # os.PathLike
        assert m.config == str(path) and m.stats()["tiers"][0]["capacity"] == 64 << 20
    monkeypatch.delenv("MONARCH_CONFIG", raising=False)
    monkeypatch.setenv("MONARCH_DATASET", dataset)
    with monarch.Monarch() as m:
        assert m.root == dataset and m.config is None
    monkeypatch.setenv("MONARCH_CONFIG", str(path))
    with monarch.Monarch() as m:
        assert m.config == str(path)
    monkeypatch.delenv("MONARCH_CONFIG")
    monkeypatch.delenv("MONARCH_DATASET")
    with pytest.raises(ValueError, match="MONARCH_CONFIG"):
        monarch.Monarch()


def test_close_and_pickle(dataset):
    m = monarch.Monarch(dataset=dataset)
    copy = pickle.loads(pickle.dumps(m))  # the config travels, not the handle
    assert copy.read("sub/hello.txt") == b"hello monarch\n"
    assert copy._handle is not None and copy._handle.value != m._handle.value
    copy.close()
    m.close()
    m.close()  # idempotent
    with pytest.raises(ValueError):
        m.read("sub/hello.txt")
    assert "closed" in repr(m)
