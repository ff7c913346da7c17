"""Trains a small CNN on a synthetic image folder read through a shared node
service by 4 DataLoader workers, under fork and under spawn (persistent
workers), with each epoch's order announced by AnnouncingSampler, and checks
that it learns, that every sample is byte-exact, that the source was read
once per file over the three epochs, and that the service got every order
and the workers' progress."""

import hashlib
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from PIL import Image  # noqa: E402

import monarch  # noqa: E402
import monarch.torch as mt  # noqa: E402
from _torch_helpers import hashing_loader  # noqa: E402
from conftest import SharedService, service_pids  # noqa: E402

CLASSES = 4
PER_CLASS = 40
COLOURS = [(220, 40, 40), (40, 200, 40), (40, 40, 220), (220, 220, 40)]


def make_image_folder(root):
    """4 classes x 40 images of 32x32: a noisy square of the class's colour
    on a noisy grey background, half JPEG, half PNG. Returns {path: sha256}."""
    rng = np.random.default_rng(1234)
    hashes = {}
    for c in range(CLASSES):
        os.makedirs(os.path.join(root, "train", f"class{c}"))
        for i in range(PER_CLASS):
            img = rng.normal(128, 30, (32, 32, 3))
            x, y = rng.integers(0, 16, 2)
            img[y:y + 16, x:x + 16] = np.array(COLOURS[c]) + rng.normal(0, 20, (16, 16, 3))
            ext = "jpg" if i % 2 else "png"
            path = os.path.join(root, "train", f"class{c}", f"img{i:03d}.{ext}")
            Image.fromarray(np.clip(img, 0, 255).astype(np.uint8)).save(path)
            with open(path, "rb") as f:
                hashes[os.path.relpath(path, root)] = hashlib.sha256(f.read()).hexdigest()
    return hashes


class SmallCNN(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.conv2 = torch.nn.Conv2d(8, 16, 3, padding=1)
        self.fc = torch.nn.Linear(16 * 8 * 8, CLASSES)

    def forward(self, x):
        x = torch.nn.functional.max_pool2d(torch.relu(self.conv1(x)), 2)
        x = torch.nn.functional.max_pool2d(torch.relu(self.conv2(x)), 2)
        return self.fc(x.flatten(1))


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_training_through_shared_service(tmp_path, method):
    torch.manual_seed(0)
    torch.set_num_threads(1)  # 2 shared cores, 4 workers
    root = str(tmp_path / "ds")
    hashes = make_image_folder(root)
    total_bytes = sum(os.path.getsize(os.path.join(root, p)) for p in hashes)
    service = SharedService(root)
    loader = None
    try:
        ds = mt.ImageFolder("train", config=service.config, loader=hashing_loader)
        assert len(ds) == CLASSES * PER_CLASS and ds.classes == [f"class{c}" for c in range(4)]
        sampler = mt.AnnouncingSampler(torch.utils.data.RandomSampler(ds), ds)
        loader = torch.utils.data.DataLoader(
            ds, batch_size=16, sampler=sampler, num_workers=4, multiprocessing_context=method,
            persistent_workers=(method == "spawn"))
        model = SmallCNN()
        opt = torch.optim.Adam(model.parameters(), lr=3e-3)
        class_of = {digest: int(path.split("/")[1][5:]) for path, digest in hashes.items()}
        assert len(class_of) == len(hashes)  # every file's bytes are distinct
        epoch_loss = []
        for epoch in range(3):
            losses, digests_seen = [], []
            for (images, digests), targets in loader:
                # (2) byte-exact: the bytes each worker decoded hash to a
                # file of the sample's class...
                for digest, target in zip(digests, targets.tolist()):
                    assert class_of.get(digest) == target, "sample bytes differ from every file"
                digests_seen += digests
                opt.zero_grad()
                loss = torch.nn.functional.cross_entropy(model(images), targets)
                loss.backward()
                opt.step()
                losses.append(loss.item())
            epoch_loss.append(sum(losses) / len(losses))
            # ...and each file was seen exactly once in the epoch.
            assert sorted(digests_seen) == sorted(hashes.values())
        # (1) it learns.
        assert epoch_loss[2] < epoch_loss[0], epoch_loss
        # (3) the node read each file from the source once over 3 epochs.
        with monarch.Monarch(service.config) as client:
            client.wait_for_placement()
            node = client.stats()  # a client's stats are its node service's
        assert node["service"]["clients"] >= 1
        src = node["tiers"][-1]
        assert src["kind"] == "source"
        assert src["bytes_read"] == total_bytes, (src, total_bytes)
        assert src["reads"] == len(hashes)
        # (4) prefetch: the three epochs' orders reached the service, and
        # the workers told it which files they started.
        assert node["prefetch_announced_files"] == 3 * len(hashes)
        assert node["prefetch_reads"] > 0
        assert service_pids(service.dir), "the workers' node service is not running"
    finally:
        del loader  # persistent workers exit before the service stops
        service.stop()
    assert not service_pids(service.dir)
