"""PyTorch datasets that read through Monarch.

    import monarch.torch
    ds = monarch.torch.ImageFolder("train", config="job.yaml", transform=to_tensor)
    loader = torch.utils.data.DataLoader(ds, batch_size=64, shuffle=True, num_workers=8)

Each DataLoader worker reads through its own Monarch handle, opened lazily in
the worker on its first sample: a handle inherited through fork() is never
used (its threads stayed in the parent), and a dataset pickled for a spawned
worker carries the config, not the handle. With `node: {shared: true}` in the
config every worker is a client of one node service, so the whole job reads
each file from the source once.

AnnouncingSampler wraps the DataLoader's sampler (RandomSampler,
DistributedSampler, any other) and tells Monarch each epoch's order before
the epoch starts, so that the node service reads ahead of the workers
(clairvoyant prefetch):

    sampler = monarch.torch.AnnouncingSampler(
        torch.utils.data.DistributedSampler(ds), ds)
    loader = torch.utils.data.DataLoader(ds, sampler=sampler, num_workers=8)
"""

import io
import os
import warnings

import torch.utils.data

from . import Monarch

__all__ = ["AnnouncingSampler", "FileListDataset", "ImageFolder", "IMAGE_EXTENSIONS",
           "pil_loader"]

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")


def pil_loader(fileobj):
    """Decodes an image file object with Pillow, converted to RGB (what
    torchvision's ImageFolder returns)."""
    from PIL import Image  # Here, so that `import monarch.torch` needs no Pillow.
    with Image.open(fileobj) as img:
        return img.convert("RGB")


def _monarch_for(monarch, config, dataset):
    if monarch is not None:
        if config is not None or dataset is not None:
            raise ValueError("pass either monarch= or config=/dataset=, not both")
        return monarch
    return Monarch(config=config, dataset=dataset)


class FileListDataset(torch.utils.data.Dataset):
    """A map-style dataset over a list of files: item i is
    transform(loader(bytes of files[i])) (without a transform,
    loader(bytes); the default loader returns the bytes themselves).

    `files`: dataset-relative names or absolute paths under the dataset root.
    `monarch`: a Monarch to read through, or else `config`/`dataset` to open
    one (as Monarch() takes them; with neither, MONARCH_CONFIG/MONARCH_DATASET).
    Workers use their own handle (see the module doc)."""

    def __init__(self, files, monarch=None, config=None, dataset=None, transform=None,
                 loader=bytes):
        self.monarch = _monarch_for(monarch, config, dataset)
        self.files = [os.fspath(f) for f in files]
        self.transform = transform
        self.loader = loader

    def __len__(self):
        return len(self.files)

    def file_of(self, index):
        """The path item `index` is read from."""
        return self.files[index]

    def __getitem__(self, index):
        sample = self.loader(self.monarch.read(self.files[index]))
        return self.transform(sample) if self.transform is not None else sample


class ImageFolder(torch.utils.data.Dataset):
    """torchvision's ImageFolder over Monarch: `root` (a dataset-relative
    directory or an absolute path under the dataset root) holds one
    subdirectory per class; classes are the sorted subdirectory names and
    samples every image file below each (by extension, IMAGE_EXTENSIONS),
    sorted. Item i is (transform(image) or image, class_index), the image
    decoded by `loader` (default pil_loader: Pillow, RGB) from a Monarch file
    object. Attributes: classes, class_to_idx, samples [(path, class)],
    targets."""

    def __init__(self, root, config=None, monarch=None, dataset=None, transform=None,
                 loader=pil_loader, extensions=IMAGE_EXTENSIONS):
        self.monarch = _monarch_for(monarch, config, dataset)
        self.root = os.fspath(root)
        self.transform = transform
        self.loader = loader
        m = self.monarch
        if not m.isdir(self.root):
            raise FileNotFoundError(2, "not a dataset directory", self.root)
        self.classes = [d for d in m.listdir(self.root) if m.isdir(os.path.join(self.root, d))]
        if not self.classes:
            raise FileNotFoundError(2, "no class directories", self.root)
        self.class_to_idx = {c: i for i, c in enumerate(self.classes)}
        extensions = tuple(e.lower() for e in extensions)
        self.samples = []
        for cls in self.classes:
            for dirpath, _, files in m.walk(os.path.join(self.root, cls)):
                for f in sorted(files):
                    if f.lower().endswith(extensions):
                        self.samples.append((os.path.join(dirpath, f), self.class_to_idx[cls]))
        self.samples.sort()
        self.targets = [target for _, target in self.samples]

    def __len__(self):
        return len(self.samples)

    def file_of(self, index):
        """The path item `index` is read from."""
        return self.samples[index][0]

    def __getitem__(self, index):
        path, target = self.samples[index]
        with self.monarch.open(path) as f:
            sample = self.loader(f)
        if self.transform is not None:
            sample = self.transform(sample)
        return sample, target


class AnnouncingSampler(torch.utils.data.Sampler):
    """Wraps `sampler` and announces each epoch's order to Monarch
    (Monarch.announce_order) as the epoch starts, i.e. when the DataLoader
    iterates the sampler, in the main process, before it hands indices to
    its workers.

    `dataset`: a dataset of this module (its file_of(index) gives the path
    an index reads), or any object with file_of(); `monarch`: the handle to
    announce through (default: the dataset's). With DistributedSampler each
    rank announces its own share, and the node service merges the shares of
    the ranks on its node. set_epoch() is passed on. An announcement that
    fails (no service answers) is a warning, not an error: training goes on
    without prefetch."""

    def __init__(self, sampler, dataset, monarch=None):
        self.sampler = sampler
        self.dataset = dataset
        self.monarch = monarch if monarch is not None else dataset.monarch

    def __len__(self):
        return len(self.sampler)

    def set_epoch(self, epoch):
        if hasattr(self.sampler, "set_epoch"):
            self.sampler.set_epoch(epoch)

    def __iter__(self):
        order = list(iter(self.sampler))
        try:
            self.monarch.announce_order([self.dataset.file_of(i) for i in order])
        except OSError as e:  # FileNotFoundError is a caller's bug: raised.
            if isinstance(e, FileNotFoundError):
                raise
            warnings.warn(f"monarch: read order not announced, no prefetch: {e}")
        except RuntimeError as e:  # MonarchError: e.g. the service is gone.
            warnings.warn(f"monarch: read order not announced, no prefetch: {e}")
        return iter(order)
