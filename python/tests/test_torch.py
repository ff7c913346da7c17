"""monarch.torch datasets, without training (see test_torch_training.py)."""

import os
import pickle
import time

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import monarch  # noqa: E402
import monarch.torch as mt  # noqa: E402
from _torch_helpers import sha256  # noqa: E402
from conftest import SharedService  # noqa: E402


def test_file_list_dataset_bytes_in_workers(m, dataset):
    files = ["blob.bin", "sub/hello.txt", os.path.join(dataset, "array.npy"), "image.png"]
    ds = mt.FileListDataset(files, monarch=m, loader=sha256)
    for method in ("fork", "spawn"):
        loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2,
                                             multiprocessing_context=method)
        got = list(loader)
        want = [sha256(open(f if os.path.isabs(f) else os.path.join(dataset, f), "rb").read())
                for f in files]
        assert got == want, method
    raw = mt.FileListDataset(["sub/hello.txt"], dataset=dataset)  # default loader: bytes
    assert raw[0] == b"hello monarch\n" and len(raw) == 1
    with pytest.raises(FileNotFoundError):
        mt.FileListDataset(["missing"], monarch=m)[0]


def test_image_folder(tmp_path):
    from PIL import Image
    root = tmp_path / "ds"
    for c, colour in (("zebra", (255, 0, 0)), ("ant", (0, 255, 0))):
        (root / "train" / c / "nested").mkdir(parents=True)
        Image.new("RGB", (8, 8), colour).save(root / "train" / c / "a.png")
        Image.new("L", (8, 8), 7).save(root / "train" / c / "nested" / "b.jpg")
        (root / "train" / c / "notes.txt").write_text("not an image")
    ds = mt.ImageFolder("train", dataset=str(root))
    assert ds.classes == ["ant", "zebra"] and ds.class_to_idx == {"ant": 0, "zebra": 1}
    assert [s for s, _ in ds.samples] == ["train/ant/a.png", "train/ant/nested/b.jpg",
                                          "train/zebra/a.png", "train/zebra/nested/b.jpg"]
    img, target = ds[2]
    assert target == 1 and img.mode == "RGB" and img.getpixel((3, 3)) == (255, 0, 0)
    img, target = ds[1]
    assert target == 0 and img.mode == "RGB"  # grey JPEG converted
    absolute = mt.ImageFolder(str(root / "train"), dataset=str(root),
                              transform=lambda im: im.size)
    assert absolute[0] == ((8, 8), 0)
    clone = pickle.loads(pickle.dumps(ds))  # for spawned workers: config, not handle
    assert clone.monarch._handle is None and clone[3][1] == 1
    with pytest.raises(FileNotFoundError):
        mt.ImageFolder("nope", dataset=str(root))


def _read_share(config, rank, paths):
    """A rank of a 2-process job: announces its DistributedSampler share
    and reads it."""
    import torch.utils.data as data
    handle = monarch.Monarch(config)
    ds = mt.FileListDataset(paths, monarch=handle)
    sampler = mt.AnnouncingSampler(
        data.DistributedSampler(ds, num_replicas=2, rank=rank, shuffle=True, seed=3), ds)
    sampler.set_epoch(1)
    for index in sampler:
        ds[index]


def _numbered_files(root, count, size):
    """`count` files f00.bin... under `root`, file i holding `size + i` bytes of
    value i (each file's bytes distinct); their names."""
    root.mkdir()
    names = [f"f{i:02d}.bin" for i in range(count)]
    for i, name in enumerate(names):
        (root / name).write_bytes(bytes([i]) * (size + i))
    return names


def test_distributed_shares_are_announced_and_merged(tmp_path):
    root = tmp_path / "ds"
    paths = _numbered_files(root, 40, 1000)
    service = SharedService(str(root))
    try:
        import multiprocessing
        ctx = multiprocessing.get_context("spawn")
        ranks = [ctx.Process(target=_read_share, args=(service.config, r, paths))
                 for r in range(2)]
        for p in ranks:
            p.start()
        for p in ranks:
            p.join(60)
            assert p.exitcode == 0
        with monarch.Monarch(service.config) as client:
            client.wait_for_placement()
            node = client.stats()
        # Both shares reached the one service: 20 files each.
        assert node["prefetch_announced_files"] == len(paths)
        src = node["tiers"][-1]
        assert src["bytes_read"] == sum(1000 + i for i in range(40))  # each file once
        assert node["prefetch_order_files"] == 0  # withdrawn as the ranks left
    finally:
        service.stop()


def test_announcing_sampler_passes_indices_through_and_checks_paths(m, dataset):
    import torch.utils.data as data
    ds = mt.FileListDataset(["blob.bin", "image.png", "sub/hello.txt"], monarch=m)
    sampler = mt.AnnouncingSampler(data.SequentialSampler(ds), ds)
    assert list(sampler) == [0, 1, 2] and len(sampler) == 3
    assert m.stats()["prefetch_announced_files"] == 3
    bad = mt.FileListDataset(["nope.bin"], monarch=m)
    with pytest.raises(FileNotFoundError):
        list(mt.AnnouncingSampler(data.SequentialSampler(bad), bad))


def test_announcing_sampler_announces_each_epochs_order_from_names_made_once(m, dataset):
    files = ["blob.bin", "image.png", "sub/hello.txt"]
    ds = mt.FileListDataset(files, monarch=m)
    announced, named = [], []

    class Recording:
        """The real handle, with what the sampler hands it written down."""
        def _name(self, path):
            named.append(path)
            return m._name(path)

        def _announce_names(self, name_array):
            array, count = name_array
            announced.append([array[i].decode() for i in range(count)])
            m._announce_names(name_array)

    class Epochs:
        orders = iter([[2, 0, 1], [1, 2, 2, 0]])

        def __iter__(self):
            return iter(next(self.orders))

    sampler = mt.AnnouncingSampler(Epochs(), ds, monarch=Recording())
    assert list(sampler) == [2, 0, 1]
    assert list(sampler) == [1, 2, 2, 0]
    assert announced == [[files[2], files[0], files[1]],
                         [files[1], files[2], files[2], files[0]]]
    assert sorted(named) == sorted(files)  # Each path turned into a name once.
    assert m.stats()["prefetch_announced_files"] == 7


_FILES = ["blob.bin", "image.png", "sub/hello.txt", "array.npy", "data.h5", "sub/deeper/x.bin"]


def test_seeded_sampler_yields_the_librarys_indices_and_each_epoch_differs(m):
    ds = mt.FileListDataset(_FILES * 5, monarch=m)  # 30 samples over 6 files.
    sampler = mt.SeededSampler(ds, seed=11)
    assert (sampler.num_replicas, sampler.rank, len(sampler)) == (1, 0, 30)
    epochs = []
    for epoch in range(4):
        sampler.set_epoch(epoch)
        got = list(sampler)
        assert got == monarch.sampled_indices(30, 11, epoch)
        assert sorted(got) == list(range(30))
        assert all(type(i) is int for i in got)
        epochs.append(got)
    assert len({tuple(e) for e in epochs}) == 4
    sampler.set_epoch(2)
    assert list(sampler) == epochs[2]  # The same epoch, the same order.
    assert list(mt.SeededSampler(ds, seed=12)) != epochs[0]
    unshuffled = mt.SeededSampler(ds, shuffle=False)
    assert list(unshuffled) == list(range(30))
    # Usable in a DataLoader as its sampler.
    loader = torch.utils.data.DataLoader(ds, sampler=sampler, batch_size=None)
    assert [bytes(b) for b in loader] == [ds[i] for i in epochs[2]]


@pytest.mark.parametrize("samples", [1, 5, 6, 7, 30])
@pytest.mark.parametrize("world_size", [1, 2, 4])
@pytest.mark.parametrize("drop_last", [False, True])
def test_seeded_sampler_shares_like_distributed_sampler(m, samples, world_size, drop_last):
    import torch.utils.data as data
    ds = mt.FileListDataset((_FILES * 5)[:samples], monarch=m)
    shares = []
    for rank in range(world_size):
        ours = mt.SeededSampler(ds, num_replicas=world_size, rank=rank, seed=5,
                                drop_last=drop_last)
        theirs = data.DistributedSampler(ds, num_replicas=world_size, rank=rank, seed=5,
                                         drop_last=drop_last)
        ours.set_epoch(3)
        share = list(ours)
        assert len(share) == len(ours) == len(theirs) == len(list(theirs))
        assert (ours.num_samples, ours.total_size) == (theirs.num_samples, theirs.total_size)
        shares.append(share)
    # Interleaved, the shares are the epoch's permutation, padded from its start.
    whole = monarch.sampled_indices(samples, 5, 3)
    interleaved = [shares[k % world_size][k // world_size]
                   for k in range(len(shares[0]) * world_size)]
    assert interleaved == [whole[k % samples] for k in range(len(interleaved))]
    if drop_last:
        assert len(set(interleaved)) == len(interleaved)  # Cut: nothing repeated.
    else:
        assert set(interleaved) == set(range(samples))  # Every sample read.


def test_seeded_sampler_takes_rank_and_world_size_from_torch_distributed(m, monkeypatch):
    import torch.distributed as dist
    ds = mt.FileListDataset(_FILES, monarch=m)
    monkeypatch.setattr(dist, "is_available", lambda: True)
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_world_size", lambda *a: 4)
    monkeypatch.setattr(dist, "get_rank", lambda *a: 3)
    sampler = mt.SeededSampler(ds, seed=1)
    assert (sampler.num_replicas, sampler.rank, len(sampler)) == (4, 3, 2)
    assert list(sampler) == monarch.sampled_indices(6, 1, 0, rank=3, world_size=4)
    assert mt.SeededSampler(ds, num_replicas=2, rank=0).num_replicas == 2  # Explicit wins.
    with pytest.raises(ValueError, match="rank"):
        mt.SeededSampler(ds, num_replicas=2, rank=2)
    with pytest.raises(ValueError, match="announce_epochs"):
        mt.SeededSampler(ds, announce_epochs=monarch.MAX_SAMPLED_EPOCHS + 1)


def test_seeded_sampler_announces_several_epochs_ahead(m):
    ds = mt.FileListDataset(_FILES * 2, monarch=m)  # 12 samples.

    def announced(sampler, epoch):
        before = m.stats()["prefetch_announced_files"]
        sampler.set_epoch(epoch)
        list(sampler)
        stats = m.stats()
        assert stats["prefetch_order_files"] == stats["prefetch_announced_files"] - before
        return stats["prefetch_announced_files"] - before

    # 4 epochs of 10 in all: at epoch 1, epochs 1..3 (3 of 6 samples each).
    limited = mt.SeededSampler(ds, num_replicas=2, rank=1, seed=4, num_epochs=4)
    assert announced(limited, 1) == 3 * 6
    assert announced(limited, 3) == 1 * 6
    assert announced(limited, 7) == 1 * 6  # Past num_epochs: still the epoch at hand.
    assert announced(mt.SeededSampler(ds, seed=4), 0) == 12  # num_epochs unknown: one.
    assert announced(mt.SeededSampler(ds, seed=4, announce_epochs=5, num_epochs=2), 0) == 5 * 12
    many = mt.SeededSampler(ds, seed=4, num_epochs=1000)
    assert announced(many, 0) == monarch.MAX_SAMPLED_EPOCHS * 12
    # The announced order is the sampler's own, epoch after epoch: the same
    # list announce_sampled_order gives for the same description.
    m.announce_sampled_order(ds.files, seed=4, first_epoch=1, epochs=3, rank=1, world_size=2)
    assert m.stats()["prefetch_order_files"] == 3 * 6


def test_seeded_sampler_announcement_failure_is_a_warning(dataset):
    class Unreachable:
        """A handle whose service is gone."""

        def _name_array(self, paths):
            return None

        def _announce_sampled(self, names, how):
            raise monarch.MonarchError("no Monarch service session", monarch.UNAVAILABLE)

    ds = mt.FileListDataset(_FILES, dataset=dataset)
    sampler = mt.SeededSampler(ds, seed=2, monarch=Unreachable())
    with pytest.warns(UserWarning, match="not announced"):
        assert list(sampler) == monarch.sampled_indices(6, 2, 0)
    bad = mt.FileListDataset(["nope.bin"], dataset=dataset)
    with pytest.raises(FileNotFoundError):
        list(mt.SeededSampler(bad))
    clone = pickle.loads(pickle.dumps(mt.SeededSampler(ds, seed=2)))
    assert list(clone) == monarch.sampled_indices(6, 2, 0)


def _token_files(tmp_path):
    """Two "token files" (12,345 and 8,000 bytes) in a new dataset."""
    root = tmp_path / "tokens"
    root.mkdir()
    rng = np.random.default_rng(30)
    data = {"a.bin": rng.integers(0, 256, 12_345, dtype=np.uint8).tobytes(),
            "b.bin": rng.integers(0, 256, 8_000, dtype=np.uint8).tobytes()}
    for name, content in data.items():
        (root / name).write_bytes(content)
    return str(root), data


def test_record_dataset_fixed_size_records_in_workers(tmp_path):
    root, data = _token_files(tmp_path)
    ds = mt.RecordDataset(["a.bin", os.path.join(root, "b.bin")], record_bytes=1000,
                          dataset=root)
    # 12 whole records of a.bin (its last 345 bytes are none), then 8 of b.bin.
    assert len(ds) == 20 and ds.record(12) == (os.path.join(root, "b.bin"), 0, 1000)
    want = [data["a.bin"][i * 1000:(i + 1) * 1000] for i in range(12)] + \
        [data["b.bin"][i * 1000:(i + 1) * 1000] for i in range(8)]
    assert [ds[i] for i in range(20)] == want and ds[-1] == want[-1]
    loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2,
                                         sampler=mt.SeededSampler(ds, seed=3))
    order = monarch.sampled_indices(20, 3, 0)
    assert [bytes(b) for b in loader] == [want[i] for i in order]
    with pytest.raises(IndexError):
        ds[20]
    for bad in (0, -5, 2.5):
        with pytest.raises(ValueError, match="record_bytes"):
            mt.RecordDataset(["a.bin"], record_bytes=bad, dataset=root)


def _private_mappings_of_tier_memory():
    """Bytes of this process's private mappings of a RAM tier's memory (its
    memfd, or a node service's kept stripes): a process's own mapping of
    the tier, to read it, is shared, so private ones are views' mappings."""
    total = 0
    for line in open("/proc/self/maps").read().splitlines():
        fields = line.split()
        if len(fields) >= 6 and fields[1].endswith("p") and (
                "memfd:monarch-ram" in fields[5] or "/stripe-" in fields[5]):
            start, end = (int(x, 16) for x in fields[0].split("-"))
            total += end - start
    return total


def _view_files(root):
    """A file of 3 MiB and 123 bytes (its last records lie in its last,
    part page, never mapped) and one of 1.5 MiB."""
    root.mkdir()
    rng = np.random.default_rng(41)
    data = {"a.bin": rng.integers(0, 256, (3 << 20) + 123, dtype=np.uint8).tobytes(),
            "b.bin": rng.integers(0, 256, 3 << 19, dtype=np.uint8).tobytes()}
    for name, content in data.items():
        (root / name).write_bytes(content)
    return data


@pytest.mark.parametrize("node_shared", [False, True])
def test_record_dataset_views_map_the_nodes_copy_and_a_write_stays_private(tmp_path,
                                                                            node_shared):
    root = tmp_path / "ds"
    data = _view_files(root)
    # The files were just written: their pages are in memory, which a read
    # would serve without copying them (placement.cached_source).
    promote = "placement: {cached_source: promote}\n"
    service = SharedService(root, extra=promote) if node_shared else None
    config = service.config if node_shared else (
        f"dataset: {{path: {root}}}\ntiers: [{{kind: ram, capacity: 64MiB}}, {{kind: source}}]\n"
        "node: {shared: false}\n" + promote)
    try:
        record = 131_075  # Records straddle pages; a.bin's 24th ends in its part page.
        before = _private_mappings_of_tier_memory()  # An earlier test's, if it failed.
        ds = mt.RecordDataset(["a.bin", "b.bin"], record_bytes=record, config=config, view=True,
                              announce_order=False)
        assert ds.monarch.node_shared == node_shared
        want = [content[i * record:(i + 1) * record] for content in data.values()
                for i in range(len(content) // record)]
        assert len(ds) == len(want)

        # Nothing cached yet: the first views are of bytes Monarch read,
        # which copies the files (a file whose copy lands during the pass may
        # be mapped for its later records); the source is read once.
        cold = [ds[i] for i in range(len(ds))]
        assert all(t.dtype == torch.uint8 for t in cold)
        assert [t.numpy().tobytes() for t in cold] == want
        ds.monarch.wait_for_placement()
        size = sum(len(c) for c in data.values())
        assert ds.monarch.stats()["tiers"][-1]["bytes_read"] == size

        # Cached: both files' whole pages mapped from the copies, once each.
        ds._unmapped.clear()  # Try again now, not after the back-off.
        hot = [ds[i] for i in range(len(ds))]
        assert [t.numpy().tobytes() for t in hot] == want
        pages = sum(len(c) // 4096 * 4096 for c in data.values())
        assert _private_mappings_of_tier_memory() == before + pages
        assert sorted(ds._mapped) == [0, 1]
        last = len(data["a.bin"]) // record - 1  # Ends in a.bin's part page: read.
        assert (last + 1) * record > len(data["a.bin"]) // 4096 * 4096
        assert hot[last].numpy().tobytes() == want[last]
        assert ds.monarch.stats()["tiers"][-1]["bytes_read"] == size  # No source read.

        # A write to a view (a transform in place) copies its pages into
        # this process, where the mapping now differs from the file: a later
        # view of them is read instead, and no other reader sees the write.
        hot[0][:16] = 0
        hot[0].add_(1)
        assert bytes(hot[0][:16].tolist()) == b"\x01" * 16
        assert ds[0].numpy().tobytes() == want[0]
        # Record 1 starts in record 0's last page, which was copied whole.
        assert ds[1].numpy().tobytes() == want[1] == hot[1].numpy().tobytes()
        assert ds[2].numpy().tobytes() == want[2]
        assert ds.monarch.read("a.bin", 0, record) == want[0]

        # Views outlive the dataset's hold on its mappings.
        kept = ds[1]
        ds._mapped.clear()
        del hot, cold
        assert kept.numpy().tobytes() == want[1]
        del kept
        assert _private_mappings_of_tier_memory() == before

        # In fresh workers, batches stacked by default_collate. Through the
        # node service each worker maps the node's copies for itself (the
        # transform sees its mappings); an in-process handle's workers each
        # open an instance of their own, empty, and read.
        ds.transform = lambda t: (t, _private_mappings_of_tier_memory())
        loader = torch.utils.data.DataLoader(ds, batch_size=4, shuffle=True, num_workers=2,
                                             generator=torch.Generator().manual_seed(3))
        for epoch in range(2):
            rows, mapped = [], []
            for batch, maps in loader:
                rows += [row.numpy().tobytes() for row in batch]
                mapped += maps.tolist()
            assert sorted(rows) == sorted(want), epoch
            if node_shared:
                assert min(mapped) >= len(data["b.bin"]), epoch
        assert ds.monarch.stats()["tiers"][-1]["bytes_read"] == size
        ds.monarch.close()
    finally:
        if service is not None:
            service.stop()


def test_record_dataset_views_of_files_no_tier_maps_are_reads(tmp_path):
    """Files under 1 MiB (the RAM tier maps none), and a tier with no room:
    every view is of bytes read, right, and nothing is mapped."""
    root = tmp_path / "ds"
    root.mkdir()
    small = np.random.default_rng(43).integers(0, 256, 500_000, dtype=np.uint8).tobytes()
    (root / "s.bin").write_bytes(small)
    big = np.random.default_rng(44).integers(0, 256, 2 << 20, dtype=np.uint8).tobytes()
    (root / "big.bin").write_bytes(big)
    config = (f"dataset: {{path: {root}}}\ntiers: [{{kind: ram, capacity: 1MiB}}, "
              "{kind: source}]\nnode: {shared: false}\nplacement: {cached_source: promote}\n")
    ds = mt.RecordDataset(["s.bin", "big.bin"], record_bytes=50_000, config=config, view=True,
                          loader=bytes)
    before = _private_mappings_of_tier_memory()  # An earlier test's, if it failed.
    want = [small[i:i + 50_000] for i in range(0, 500_000, 50_000)] + \
        [big[i:i + 50_000] for i in range(0, len(big) - 50_000 + 1, 50_000)]
    for _ in range(3):
        assert [ds[i] for i in range(len(ds))] == want
        ds.monarch.wait_for_placement()
        ds._unmapped.clear()
    assert ds.monarch.stats()["tiers"][0]["files"] == 1  # s.bin, cached but not mappable.
    assert ds._mapped == {} and _private_mappings_of_tier_memory() == before
    ds.monarch.close()


def test_announcing_sampler_announces_each_records_range_as_record_gives_it(tmp_path):
    # The ranges an epoch announces are computed from tables made once (a
    # numpy array per column); each must be the record the index reads, across
    # file boundaries, for negative indices, and without empty records.
    root, _ = _token_files(tmp_path)
    m = monarch.Monarch(dataset=root)
    import ctypes
    announced = []

    class Recording:
        """The real handle, with the ranges handed to it read back."""
        def _name(self, path):
            return m._name(path)

        def _announce_ranges_at(self, names, offsets, lengths, count):
            at = ctypes.cast(names, ctypes.POINTER(ctypes.c_char_p))
            off = ctypes.cast(offsets, ctypes.POINTER(ctypes.c_uint64))
            length = ctypes.cast(lengths, ctypes.POINTER(ctypes.c_uint64))
            announced.append([(at[i].decode(), off[i], length[i]) for i in range(count)])
            m._announce_ranges_at(names, offsets, lengths, count)

    class Orders:
        def __init__(self, *orders):
            self.orders = iter(orders)

        def __iter__(self):
            return iter(next(self.orders))

    def as_named(record):
        path, offset, length = record
        return (os.path.relpath(path, root) if os.path.isabs(path) else path, offset, length)

    fixed = mt.RecordDataset(["a.bin", os.path.join(root, "b.bin")], record_bytes=1000,
                             dataset=root)
    order = [12, 0, 11, -1, 19, 5, 13]
    sampler = mt.AnnouncingSampler(Orders(order, []), fixed, monarch=Recording())
    assert list(sampler) == order and list(sampler) == []
    assert announced == [[as_named(fixed.record(i)) for i in order], []]
    assert announced[0][0] == ("b.bin", 0, 1000) and announced[0][3] == ("b.bin", 7000, 1000)

    announced.clear()
    index = [("a.bin", 10, 20), ("b.bin", 5, 0), ("b.bin", 100, 50), ("a.bin", 0, 12_345)]
    listed = mt.RecordDataset(["a.bin", "b.bin"], index=index, dataset=root)
    sampler = mt.AnnouncingSampler(Orders([2, 1, 0, 3]), listed, monarch=Recording())
    assert list(sampler) == [2, 1, 0, 3]
    # The empty record reads nothing and is not announced (0 would mean the
    # whole file).
    assert announced == [[("b.bin", 100, 50), ("a.bin", 10, 20), ("a.bin", 0, 12_345)]]
    with pytest.raises(IndexError):
        list(mt.AnnouncingSampler(Orders([0, 4]), listed, monarch=Recording()))
    m.close()


_ANNOUNCE_IN_A_FRESH_PROCESS = r"""
import os, sys
import torch, torch.utils.data
import monarch, monarch.torch as mt
m = monarch.Monarch(dataset=sys.argv[1])


class Counting:
    # The announcements' arrays are taken and counted, not handed to
    # Monarch, whose own prefetch threads are not the announcer's.
    announced = 0
    def _name(self, path):
        return m._name(path)
    def _announce_ranges_at(self, names, offsets, lengths, count):
        Counting.announced += count
    def _announce_names(self, name_array):
        Counting.announced += name_array[1]


threads = lambda: len(os.listdir("/proc/self/task"))
before = threads()
fixed = mt.RecordDataset(["a.bin", "b.bin"], record_bytes=1, monarch=m)
listed = mt.RecordDataset(["a.bin"], index=[("a.bin", i % 12_000, 7) for i in range(20_000)],
                          monarch=m)
files = mt.FileListDataset(["a.bin", "b.bin"] * 10_000, monarch=m)
for ds in (fixed, listed, files):
    order = list(torch.utils.data.RandomSampler(ds, num_samples=20_000))
    assert list(mt.AnnouncingSampler(order, ds, monarch=Counting())) == order
assert Counting.announced == 60_000, Counting.announced
print(before, threads(), torch.get_num_threads())
"""


def test_an_epochs_announcement_starts_no_threads_in_the_main_process(tmp_path):
    # The DataLoader's main process announces each epoch while its workers
    # wait. Torch's indexing and searchsorted start an OpenMP team there,
    # whose threads then spin for milliseconds on the cores the workers
    # need; the announcement's arrays are numpy's, which starts none.
    import subprocess
    import sys
    root, _ = _token_files(tmp_path)
    r = subprocess.run([sys.executable, "-c", _ANNOUNCE_IN_A_FRESH_PROCESS, root],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    before, after, torch_threads = map(int, r.stdout.split())
    if torch_threads < 2:
        pytest.skip("torch has one intra-op thread here: no team to start")
    assert after == before, (before, after)


def test_announcing_sampler_announces_record_ranges_of_a_file_cached_by_extents(tmp_path):
    root = tmp_path / "ds"
    root.mkdir()
    data = np.random.default_rng(4).integers(0, 256, 12 << 20, dtype=np.uint8).tobytes()
    (root / "tokens.bin").write_bytes(data)
    config = tmp_path / "m.yaml"
    config.write_text(f"dataset: {{path: {root}}}\n"
                      "tiers:\n  - {kind: ram, capacity: 64MiB}\n  - {kind: source}\n"
                      "placement: {extent_bytes: 1MiB, extent_threshold: 2MiB, "
                      "cached_source: promote}\n")
    m = monarch.Monarch(config=str(config))
    # 40 records of 4 KiB in 3 of the 12 extents: only those are fetched.
    # None at offset 0, where a read begins a scan and reads ahead.
    records = [(i % 3) * (4 << 20) + (i // 3 + 1) * 4096 for i in range(40)]
    ds = mt.RecordDataset(["tokens.bin"], index=[("tokens.bin", o, 4096) for o in records],
                          monarch=m)
    sampler = mt.AnnouncingSampler(torch.utils.data.SequentialSampler(ds), ds)
    order = list(iter(sampler))
    deadline = time.monotonic() + 30
    while m.stats()["prefetch_files"] < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    m.wait_for_placement()
    stats = m.stats()
    assert stats["prefetch_announced_files"] == 40  # An extent per record.
    assert stats["prefetch_files"] == 3
    assert stats["tiers"][-1]["bytes_read"] == 3 << 20
    assert [ds[i] for i in order] == [data[o:o + 4096] for o in records]
    assert m.stats()["tiers"][-1]["bytes_read"] == 3 << 20  # Every record a hit.
    with pytest.raises(FileNotFoundError):
        m.announce_ranges([("nope.bin", 0, 1)])
    with pytest.raises(Exception, match="past the end"):
        m.announce_ranges([("tokens.bin", 12 << 20, 1)])
    m.close()


def test_announcing_sampler_ranges_through_the_node_service(tmp_path):
    # The same order of records, announced by a client of a node service:
    # the service fetches the 3 extents that hold them, and the client's
    # reads are all hits.
    root = tmp_path / "ds"
    root.mkdir()
    data = np.random.default_rng(5).integers(0, 256, 12 << 20, dtype=np.uint8).tobytes()
    (root / "tokens.bin").write_bytes(data)
    service = SharedService(root, extra="placement: {extent_bytes: 1MiB, extent_threshold: 2MiB, "
                                        "cached_source: promote}\n")
    try:
        m = monarch.Monarch(config=service.config)
        records = [(i % 3) * (4 << 20) + (i // 3 + 1) * 4096 for i in range(40)]
        ds = mt.RecordDataset(["tokens.bin"], index=[("tokens.bin", o, 4096) for o in records],
                              monarch=m)
        order = list(iter(mt.AnnouncingSampler(torch.utils.data.SequentialSampler(ds), ds)))
        deadline = time.monotonic() + 30
        while m.stats()["prefetch_files"] < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        m.wait_for_placement()
        stats = m.stats()
        assert stats["prefetch_announced_files"] == 40  # An extent per record, in the service.
        assert stats["prefetch_files"] == 3
        assert stats["tiers"][-1]["bytes_read"] == 3 << 20
        assert [ds[i] for i in order] == [data[o:o + 4096] for o in records]
        assert m.stats()["tiers"][-1]["bytes_read"] == 3 << 20  # Every record a hit.
        with pytest.raises(Exception, match="past the end"):
            m.announce_ranges([("tokens.bin", 12 << 20, 1)])
        m.close()
    finally:
        service.stop()


def test_record_dataset_index_with_seeded_sampler(tmp_path):
    root, data = _token_files(tmp_path)
    index = [("b.bin", 7_990, 10), (0, 0, 1), ("a.bin", 5_000, 7_345), (1, 100, 0),
             (np.int64(0), np.int64(3), np.int64(4))]
    ds = mt.RecordDataset(["a.bin", "b.bin"], index=index, dataset=root, loader=len)
    assert len(ds) == 5 and [ds[i] for i in range(5)] == [10, 1, 7_345, 0, 4]
    raw = mt.RecordDataset(["a.bin", "b.bin"], index=index, dataset=root)
    assert raw[0] == data["b.bin"][7_990:] and raw[2] == data["a.bin"][5_000:]
    assert raw.file_of(0) == "b.bin" and raw.file_of(1) == "a.bin"
    sampler = mt.SeededSampler(raw, seed=9)
    loader = torch.utils.data.DataLoader(raw, batch_size=None, num_workers=2, sampler=sampler)
    assert sorted(bytes(b) for b in loader) == sorted(raw[i] for i in range(5))
    for bad, match in (([("a.bin", 12_000, 346)], "not inside"), ([("c.bin", 0, 1)], "not one"),
                       ([(2, 0, 1)], "not one"), ([(0.5, 0, 1)], "not one"),
                       ([("a.bin", 0)], "must be"),
                       ([("a.bin", -1, 2)], "not inside")):
        with pytest.raises(ValueError, match=match):
            mt.RecordDataset(["a.bin", "b.bin"], index=bad, dataset=root)
    with pytest.raises(ValueError, match="exactly one"):
        mt.RecordDataset(["a.bin"], dataset=root)


_DISTINCT = ["blob.bin", "sub/hello.txt", "sub/deeper/x.bin", "array.npy", "image.png"]


def _recording(handle):
    """The real handle, with each order announced through it written down
    as names."""
    announced = []
    real = handle._announce_names

    def record(name_array):
        array, count = name_array
        announced.append([array[i].decode() for i in range(count)])
        real(name_array)

    handle._announce_names = record
    return announced


def _read_order(loader, dataset):
    """The files a loader's epoch read, in order (each file's bytes are distinct)."""
    by_bytes = {open(os.path.join(dataset, f), "rb").read(): f for f in _DISTINCT}
    return [by_bytes[bytes(b)] for b in loader]


@pytest.mark.parametrize("sampler", ["shuffle", "generator", "distributed", "sequential"])
def test_datasets_announce_a_plain_dataloaders_order_by_themselves(m, dataset, sampler):
    import torch.utils.data as data
    ds = mt.FileListDataset(_DISTINCT, monarch=m)
    announced = _recording(m)
    options = {
        "shuffle": {"shuffle": True},
        "generator": {"shuffle": True, "generator": torch.Generator().manual_seed(5)},
        "distributed": {"sampler": data.DistributedSampler(ds, num_replicas=2, rank=1, seed=3)},
        "sequential": {"shuffle": False},
    }[sampler]
    loader = data.DataLoader(ds, batch_size=None, **options)
    orders = []
    for epoch in range(3):
        if sampler == "distributed":
            loader.sampler.set_epoch(epoch)
        orders.append(_read_order(loader, dataset))
    # Each epoch announced once, before its reads, and exactly as read.
    assert announced == orders
    assert m.stats()["prefetch_announced_files"] == sum(len(o) for o in orders)


def test_announcing_by_itself_leaves_the_order_as_it_was(m, dataset):
    import torch.utils.data as data
    orders = {}
    for announce in (False, True):
        ds = mt.FileListDataset(_DISTINCT, monarch=m, announce_order=announce)
        torch.manual_seed(7)
        loader = data.DataLoader(ds, batch_size=None, shuffle=True)
        orders[announce] = [_read_order(loader, dataset) for _ in range(3)]
    # The replay restored torch's generator: the same seed draws the same orders.
    assert orders[True] == orders[False] and orders[True][0] != orders[True][1]
    assert m.stats()["prefetch_announced_files"] == 3 * len(_DISTINCT)


def test_dataset_does_not_announce_what_its_sampler_or_nobody_would_use(m, dataset):
    import torch.utils.data as data
    ds = mt.FileListDataset(_DISTINCT, monarch=m)
    announced = _recording(m)
    # AnnouncingSampler announces; the dataset under it stays quiet.
    sampler = mt.AnnouncingSampler(data.RandomSampler(ds), ds)
    order = _read_order(data.DataLoader(ds, batch_size=None, sampler=sampler), dataset)
    assert announced == [order]
    # Workers with in-process handles of their own: an order announced in the
    # main process would only make it prefetch files no worker reads there.
    announced.clear()
    before = m.stats()["prefetch_announced_files"]
    loader = data.DataLoader(ds, batch_size=None, shuffle=True, num_workers=2)
    assert sorted(_read_order(loader, dataset)) == sorted(_DISTINCT)
    assert announced == [] and m.stats()["prefetch_announced_files"] == before


def test_workers_of_the_node_service_get_the_order_without_asking(dataset):
    import torch.utils.data as data
    service = SharedService(dataset)
    try:
        handle = monarch.Monarch(service.config)
        assert handle.node_shared
        ds = mt.FileListDataset(_DISTINCT, monarch=handle)
        loader = data.DataLoader(ds, batch_size=None, shuffle=True, num_workers=2)
        for _ in range(2):
            assert sorted(_read_order(loader, dataset)) == sorted(_DISTINCT)
        with monarch.Monarch(service.config) as client:
            client.wait_for_placement()
            node = client.stats()
        assert node["prefetch_announced_files"] == 2 * len(_DISTINCT)
        assert node["tiers"][-1]["bytes_read"] == sum(
            os.path.getsize(os.path.join(dataset, f)) for f in _DISTINCT)  # each file once
        handle.close()
    finally:
        service.stop()


def test_a_newcomers_config_shares_one_cache_across_fresh_workers(tmp_path):
    """A RAM tier and no `node:` section, read by a DataLoader whose workers
    are fresh each epoch (PyTorch's default): one service holds the copies
    for all of them, so the source is read once and later epochs hit."""
    import torch.utils.data as data
    root = tmp_path / "ds"
    names = _numbered_files(root, 24, 20_000)
    config = tmp_path / "job.yaml"
    config.write_text(f"dataset: {{path: {root}}}\n"
                      "tiers:\n  - {kind: ram, capacity: 64MiB}\n  - {kind: source}\n")
    ds = mt.FileListDataset(names, config=str(config), loader=len)
    assert ds.monarch.node_shared
    loader = data.DataLoader(ds, batch_size=None, shuffle=True, num_workers=2)
    for _ in range(3):
        assert sorted(loader) == sorted(20_000 + i for i in range(24))
        ds.monarch.wait_for_placement()
    node = ds.monarch.stats()
    assert node["tiers"][-1]["bytes_read"] == sum(20_000 + i for i in range(24))
    assert node["tiers"][0]["files"] == 24
    # The config's own word wins.
    config.write_text(config.read_text() + "node: {shared: false}\n")
    assert not mt.FileListDataset(names, config=str(config)).monarch.node_shared
    ds.monarch.close()
