"""monarch.torch datasets, without training (see test_torch_training.py)."""

import os
import pickle

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


def test_distributed_shares_are_announced_and_merged(tmp_path):
    root = tmp_path / "ds"
    root.mkdir()
    paths = []
    for i in range(40):
        (root / f"f{i:02d}.bin").write_bytes(bytes([i]) * (1000 + i))
        paths.append(f"f{i:02d}.bin")
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
