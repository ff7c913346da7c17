"""PyTorch datasets that read through Monarch.

    import monarch.torch
    ds = monarch.torch.ImageFolder("train", config="job.yaml", transform=to_tensor)
    loader = torch.utils.data.DataLoader(ds, batch_size=64, shuffle=True, num_workers=8)

RecordDataset reads records inside big files instead (fixed-size records,
or an index of (file, offset, length)): a token file, packed arrays. With
`view=True` each record is a tensor over the node's copy, not copied out.

A dataset opened from `config=` or `dataset=` is a client of the node's
Monarch service (started on demand) unless the config says `node: {shared:
false}`: DataLoader workers are other processes, by default fresh each
epoch, and they all read through that one cache, so the whole job reads each
file from the source once and a fresh worker's first sample can be a hit. A
dataset pickled for a spawned worker carries the config, not the handle. A
handle passed as `monarch=` is used as it is (with an in-process handle each
worker opens its own instance).

The datasets tell Monarch each epoch's order by themselves when the
DataLoader's sampler is PyTorch's RandomSampler (shuffle=True),
SequentialSampler or DistributedSampler: the main process announces it as
the epoch starts, before any worker reads, so that Monarch reads ahead of
the workers (clairvoyant prefetch). `announce_order=False` turns it off.

AnnouncingSampler does the same for any other sampler, by wrapping it:

    sampler = monarch.torch.AnnouncingSampler(
        torch.utils.data.DistributedSampler(ds), ds)
    loader = torch.utils.data.DataLoader(ds, sampler=sampler, num_workers=8)

SeededSampler replaces DistributedSampler (or RandomSampler) itself: its
order is Monarch's seeded sampler, which the library rebuilds from the seed,
so each epoch it announces that epoch and the following ones (all the
remaining `num_epochs`, within bounds) and eviction knows several epochs
ahead:

    sampler = monarch.torch.SeededSampler(ds, seed=0, num_epochs=90)
    loader = torch.utils.data.DataLoader(ds, sampler=sampler, num_workers=8)
    for epoch in range(90):
        sampler.set_epoch(epoch)
        for batch in loader: ...
"""

import bisect
import ctypes
import io
import mmap
import operator
import os
import sys
import warnings
from array import array

import torch.utils.data

from . import MAX_SAMPLED_EPOCHS, Monarch, _c_name_array, _sampled_order, sampled_indices
from ._monarch import _address_of

__all__ = ["AnnouncingSampler", "FileListDataset", "ImageFolder", "IMAGE_EXTENSIONS",
           "RecordDataset", "SeededSampler", "pil_loader"]

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")


def pil_loader(fileobj):
    """Decodes an image file object with Pillow, converted to RGB (what
    torchvision's ImageFolder returns)."""
    from PIL import Image  # Here, so that `import monarch.torch` needs no Pillow.
    with Image.open(fileobj) as img:
        return img.convert("RGB")


# A page's entry in /proc/self/pagemap is a little-endian uint64 whose top
# byte says, in bit 7 (63), that the page is present; in bit 6 (62), that it
# is swapped out; in bit 5 (61), that it is a page of a file (or shared
# memory). A page of a private file mapping that this process wrote is a
# copy of its own: present or swapped, and not a file's. The top bytes that
# do not say so:
_UNWRITTEN_TOP_BYTES = bytes(x for x in range(256) if x & 0x20 or not x & 0xC0)
_pagemap = (None, None)  # (pid, descriptor): /proc/self is the opener's.
_PAGE = mmap.PAGESIZE


def _written_here(address, length):
    """Whether this process wrote a page of [address, address + length),
    part of a private file mapping (RecordDataset's views). True when the
    page map cannot be read: the caller then reads, which is always right."""
    global _pagemap
    pid = os.getpid()
    if _pagemap[0] != pid:
        try:
            _pagemap = (pid, os.open("/proc/self/pagemap", os.O_RDONLY | os.O_CLOEXEC))
        except OSError:
            _pagemap = (pid, None)
    if _pagemap[1] is None or length == 0:
        return _pagemap[1] is None
    first, last = address // _PAGE, (address + length - 1) // _PAGE
    try:
        entries = os.pread(_pagemap[1], 8 * (last - first + 1), 8 * first)
    except OSError:
        return True
    return len(entries) != 8 * (last - first + 1) or \
        bool(entries[7::8].translate(None, _UNWRITTEN_TOP_BYTES))


def _uint8_tensor(view):
    """RecordDataset(view=True)'s default loader: the record's bytes as a
    uint8 tensor over the view, without a copy."""
    if len(view) == 0:
        return torch.empty(0, dtype=torch.uint8)  # frombuffer refuses an empty buffer.
    return torch.frombuffer(view, dtype=torch.uint8)


def _monarch_for(monarch, config, dataset):
    if monarch is not None:
        if config is not None or dataset is not None:
            raise ValueError("pass either monarch= or config=/dataset=, not both")
        return monarch
    # DataLoader workers are other processes, fresh each epoch by default:
    # one cache per node for all of them, unless the config says otherwise.
    return Monarch(config=config, dataset=dataset, share_node=True)


# Samplers whose order a dataset can replay as the epoch starts: it depends
# only on their own attributes and torch's generators, which the replay
# saves and restores. Exact types: a subclass may draw its order otherwise.
_REPLAYABLE_SAMPLERS = (torch.utils.data.RandomSampler, torch.utils.data.SequentialSampler,
                        torch.utils.data.distributed.DistributedSampler)


class _AnnouncesOrder:
    """Announces each epoch's order with no sampler to wrap.

    A DataLoader's main process starts an epoch by iterating its sampler,
    and the samplers above begin by asking len(dataset). That call, seen
    from its caller's frame, is the moment the epoch's order is decided and
    not yet handed to a worker: the dataset replays the sampler (torch's
    generator state saved before and restored after, so the real iteration
    draws the same order) and announces the order. Other samplers are left
    alone: AnnouncingSampler and SeededSampler announce by themselves, and
    an unknown sampler's order may hang on state a replay would disturb.
    A failed announcement is a warning: reads go on without prefetch."""

    announce_order = True
    _quiet = False  # While a sampler is replayed, or AnnouncingSampler iterates one.
    _announcer = None  # An AnnouncingSampler with no sampler: the names, made once.

    def _epoch_may_start(self):
        if not self.announce_order or self._quiet:
            return
        caller = sys._getframe(2)  # Whoever called len(): 0 is here, 1 __len__.
        sampler = caller.f_locals.get("self") if caller.f_code.co_name == "__iter__" else None
        if type(sampler) not in _REPLAYABLE_SAMPLERS or not self._order_reaches_reads(caller):
            return
        generator = getattr(sampler, "generator", None)
        state = generator.get_state() if generator is not None else torch.random.get_rng_state()
        self._quiet = True
        try:
            order = list(iter(sampler))
        finally:
            self._quiet = False
            if generator is not None:
                generator.set_state(state)
            else:
                torch.random.set_rng_state(state)
        if self._announcer is None:
            self._announcer = AnnouncingSampler(None, self)
        try:
            self._announcer._announce(order)
        except (OSError, RuntimeError, ValueError) as e:
            warnings.warn(f"monarch: read order not announced, no prefetch: {e}")

    def _order_reaches_reads(self, frame):
        """Whether the reads of this epoch go through a cache that sees an
        order announced here: the node service's, or this process's own when
        the DataLoader has no workers. An in-process handle's prefetch would
        otherwise read files into the main process that workers never use."""
        if getattr(self.monarch, "node_shared", False):
            return True
        single = getattr(torch.utils.data.dataloader, "_SingleProcessDataLoaderIter", None)
        for _ in range(16):  # The loader's iterator is a few calls up.
            if frame is None or single is None:
                return False
            if isinstance(frame.f_locals.get("self"), single):
                return True
            frame = frame.f_back
        return False

    def __getstate__(self):
        # The names are rebuilt where they are needed (a spawned worker
        # never announces).
        state = self.__dict__.copy()
        state.pop("_announcer", None)
        return state


class FileListDataset(_AnnouncesOrder, torch.utils.data.Dataset):
    """A map-style dataset over a list of files: item i is
    transform(loader(bytes of files[i])) (without a transform,
    loader(bytes); the default loader returns the bytes themselves).

    `files`: dataset-relative names or absolute paths under the dataset root.
    `monarch`: a Monarch to read through, or else `config`/`dataset` to open
    one (as Monarch() takes them; with neither, MONARCH_CONFIG/MONARCH_DATASET).
    Workers use their own handle (see the module doc). `announce_order`:
    see the module doc."""

    def __init__(self, files, monarch=None, config=None, dataset=None, transform=None,
                 loader=bytes, announce_order=True):
        self.monarch = _monarch_for(monarch, config, dataset)
        self.files = [os.fspath(f) for f in files]
        self.transform = transform
        self.loader = loader
        self.announce_order = announce_order

    def __len__(self):
        self._epoch_may_start()
        return len(self.files)

    def file_of(self, index):
        """The path item `index` is read from."""
        return self.files[index]

    def __getitem__(self, index):
        sample = self.loader(self.monarch.read(self.files[index]))
        return self.transform(sample) if self.transform is not None else sample


class RecordDataset(_AnnouncesOrder, torch.utils.data.Dataset):
    """A map-style dataset over records inside big files: token files,
    packed arrays, shards of fixed-size or indexed samples. Item i is
    transform(loader(bytes of record i)) (the default loader returns the
    bytes), read with one Monarch read of the record's range; with
    `view=True` (below), a view of the record instead of its bytes.

    The records, either:
    - `record_bytes`: every file cut into records of that many bytes, in
      file order then offset order; a file's last bytes that do not fill a
      record are not a record;
    - `index`: (file, offset, length) triples, one per record, in item order
      (files as in `files`, by path or by position in it); every record must
      lie inside its file.

    `files`, `monarch`, `config`, `dataset`, `announce_order`: as
    FileListDataset's; an order is announced as each record's range
    (record(), so that Monarch reads ahead the extents of big files that
    hold them), by the dataset itself or by AnnouncingSampler, and
    SeededSampler, which announces the file of each record (file_of). The
    records of a million-sample index cost 20 bytes each here, not a Python
    object each.

    `view=True`: no copy of a record. The loader gets a writable memoryview
    of it, and the default loader makes it a uint8 tensor
    (torch.frombuffer), which default_collate then stacks into the batch:
    the one copy of the record's bytes. Where the node holds a copy of the
    whole file (its whole pages: the RAM tier's own memory for files of
    1 MiB or more, a posix or pmem tier's checked copy), each process maps
    it once, privately: a view is a slice of that mapping. A write to a view
    (a transform in place) copies the page into the process and leaves the
    node's copy alone, and a later view of a range with a page so written is
    read instead (the process's page map tells), so no write reaches
    another sample.
    Elsewhere (a file not cached yet, a record in its last part-page, a
    tier that maps nothing) the view is of bytes read as without `view`, so
    the source is still read once, by Monarch. A view stays valid while it
    or anything over it (the tensor) lives. A mapping lives as long as its
    process (for PyTorch's fresh workers, an epoch), and the tier holds a
    copy somebody maps, counted against its capacity, even once it evicts
    it: use views when the tiers hold the files being read, or with workers
    fresh each epoch."""

    def __init__(self, files, record_bytes=None, index=None, monarch=None, config=None,
                 dataset=None, transform=None, loader=None, announce_order=True, view=False):
        if (record_bytes is None) == (index is None):
            raise ValueError("pass exactly one of record_bytes= and index=")
        self.announce_order = announce_order
        self.monarch = _monarch_for(monarch, config, dataset)
        self.files = [os.fspath(f) for f in files]
        self.transform = transform
        self.view = bool(view)
        self.loader = loader if loader is not None else (_uint8_tensor if self.view else bytes)
        # Each file's dataset name, made here and not once a record.
        self._file_names = [self.monarch._name(f) for f in self.files]
        sizes = [self.monarch.stat(f).st_size for f in self.files]
        self._sizes = sizes
        # This process's mappings (view=True): file position -> (a
        # memoryview of its mapping, its address); and the files not mapped:
        # position -> (reads before the next try, failed tries).
        self._mapped = {}
        self._unmapped = {}
        self.record_bytes = None
        if record_bytes is not None:
            try:
                self.record_bytes = operator.index(record_bytes)
            except TypeError:
                self.record_bytes = 0
            if self.record_bytes < 1:
                raise ValueError(f"record_bytes must be a positive integer, not "
                                 f"{record_bytes!r}")
            record_bytes = self.record_bytes
            # _ends[k]: the records in files 0..k; item i is in the first
            # file whose end exceeds i.
            self._ends = []
            total = 0
            for size in sizes:
                total += size // record_bytes
                self._ends.append(total)
            self._count = total
            return
        position = {f: k for k, f in enumerate(self.files)}
        self._file = array("i")
        self._offset = array("q")
        self._length = array("q")
        for i, entry in enumerate(index):
            try:
                file, offset, length = entry
            except (TypeError, ValueError):
                raise ValueError(f"index[{i}] must be (file, offset, length), not {entry!r}")
            if isinstance(file, (str, bytes, os.PathLike)):
                k = position.get(os.fspath(file))
            else:
                try:
                    k = operator.index(file)  # A position in `files`.
                except TypeError:
                    k = None
            if k is None or not 0 <= k < len(self.files):
                raise ValueError(f"index[{i}]: {file!r} is not one of the files")
            if offset < 0 or length < 0 or offset + length > sizes[k]:
                raise ValueError(f"index[{i}]: bytes [{offset}, {offset + length}) are not "
                                 f"inside {self.files[k]} ({sizes[k]} bytes)")
            self._file.append(k)
            self._offset.append(offset)
            self._length.append(length)
        self._count = len(self._file)

    def __len__(self):
        self._epoch_may_start()
        return self._count

    def record(self, index):
        """(path, offset, length) of item `index`."""
        k, offset, length = self._record_in_file(index)
        return self.files[k], offset, length

    def _record_in_file(self, index):
        """(position in files, offset, length) of item `index`."""
        if not -self._count <= index < self._count:
            raise IndexError(f"record {index} out of range ({self._count} records)")
        index %= self._count
        if self.record_bytes is None:
            return self._file[index], self._offset[index], self._length[index]
        k = bisect.bisect_right(self._ends, index)
        first = self._ends[k - 1] if k else 0
        return k, (index - first) * self.record_bytes, self.record_bytes

    def file_of(self, index):
        """The path item `index` is read from."""
        return self.record(index)[0]

    def __getitem__(self, index):
        k, offset, length = self._record_in_file(index)
        if self.view:
            data = self._view_of(k, offset, length)
        else:
            data = (self.monarch._read_name(self._file_names[k], offset, length, self.files[k])
                    if length else b"")
        if len(data) != length:
            raise OSError(f"{self.files[k]}: read {len(data)} of record {index}'s {length} "
                          f"bytes at {offset}: the file is shorter than when the dataset was "
                          f"made")
        sample = self.loader(data)
        return self.transform(sample) if self.transform is not None else sample

    # A file not mapped is tried again after this many of its records were
    # read here, doubling from 1 after each failure: a file being cached is
    # mapped soon after its copy lands, and a file that stays uncached costs
    # a failed try (a lookup and an anonymous mapping made and unmade, no
    # service request) once every 16 records.
    _MAX_READS_BETWEEN_TRIES = 16

    def _view_of(self, k, offset, length):
        """A writable memoryview of `length` bytes of file `k` at `offset`:
        a slice of this process's mapping of the node's copy, or else of
        bytes read (short at the end of the file)."""
        mapped = self._mapped.get(k)
        if mapped is None:
            mapped = self._try_to_map(k)
        if (mapped is not None and offset + length <= len(mapped[0])
                and not _written_here(mapped[1] + offset, length)):
            return mapped[0][offset:offset + length]
        buffer = bytearray(length)
        got = (self.monarch._readinto(self._file_names[k], buffer, offset, self.files[k])
               if length else 0)
        view = memoryview(buffer)
        return view if got == length else view[:got]

    def _try_to_map(self, k):
        """File `k`'s mapping: (a memoryview of it, its address); or None
        (see _view_of)."""
        skip, failures = self._unmapped.get(k, (0, 0))
        if skip > 0:
            self._unmapped[k] = (skip - 1, failures)
            return None
        made = self.monarch._map_whole_copy(self._file_names[k], self._sizes[k])
        if made is None:
            self._unmapped[k] = (min(1 << failures, self._MAX_READS_BETWEEN_TRIES), failures + 1)
            return None
        self._unmapped.pop(k, None)
        # The memoryview holds the mmap; slices of it hold the view.
        mapped = self._mapped[k] = (memoryview(made[0]), _address_of(made[0]))
        return mapped

    def __getstate__(self):
        # A spawned worker maps for itself.
        state = super().__getstate__()
        state["_mapped"] = {}
        state["_unmapped"] = {}
        return state


class ImageFolder(_AnnouncesOrder, torch.utils.data.Dataset):
    """torchvision's ImageFolder over Monarch: `root` (a dataset-relative
    directory or an absolute path under the dataset root) holds one
    subdirectory per class; classes are the sorted subdirectory names and
    samples every image file below each (by extension, IMAGE_EXTENSIONS),
    sorted. Item i is (transform(image) or image, class_index), the image
    decoded by `loader` (default pil_loader: Pillow, RGB) from a Monarch file
    object. Attributes: classes, class_to_idx, samples [(path, class)],
    targets. `announce_order`: see the module doc."""

    def __init__(self, root, config=None, monarch=None, dataset=None, transform=None,
                 loader=pil_loader, extensions=IMAGE_EXTENSIONS, announce_order=True):
        self.announce_order = announce_order
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
        self._epoch_may_start()
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
        # The dataset name of every index (of every file, for records) and
        # its address, made at the first epoch. An epoch's announcement is
        # then array operations over them: the main process pays for it
        # before it hands its workers the epoch's first index, and a Python
        # object per sample cost milliseconds there, against hot epochs of
        # shards of 0.13-0.2 s (bench/results/dataloader.md, 05a6b84).
        # numpy, not torch: torch's indexing and searchsorted start OpenMP
        # threads, which then spin for milliseconds on the cores the
        # workers need (about 9 ms of CPU an epoch of 20,000 files on 2
        # cores: bench/announce_cost.py, bench/results/dataloader.md).
        self._names = None
        self._table = None

    def __len__(self):
        return len(self.sampler)

    def set_epoch(self, epoch):
        if hasattr(self.sampler, "set_epoch"):
            self.sampler.set_epoch(epoch)

    def __iter__(self):
        quiet = getattr(self.dataset, "_quiet", None)
        if quiet is not None:
            self.dataset._quiet = True  # This sampler announces, not the dataset.
        try:
            order = list(iter(self.sampler))
        finally:
            if quiet is not None:
                self.dataset._quiet = quiet
        _announce_or_warn(lambda: self._announce(order))
        return iter(order)

    def _announce(self, order):
        import numpy as np  # monarch[torch] installs it; import monarch.torch needs none.
        order = np.fromiter(order, dtype=np.int64, count=len(order))
        if hasattr(self.dataset, "record"):
            self._announce_records(np, order)
            return
        if self._names is None:
            self._names = [self.monarch._name(self.dataset.file_of(i))
                           for i in range(len(self.dataset))]
            self._table = _addresses(np, self._names)
        if not order.size:
            self.monarch._announce_names(_c_name_array([]))
            return
        at = self._table[order]
        self.monarch._announce_names(
            (ctypes.cast(at.ctypes.data, ctypes.POINTER(ctypes.c_char_p)), at.size))

    def _announce_records(self, np, order):
        """Records inside files: their ranges."""
        ds = self.dataset
        if self._table is None:
            self._names = [self.monarch._name(f) for f in ds.files]
            table = {"at": _addresses(np, self._names)}
            if ds.record_bytes is not None:
                table["ends"] = np.array(ds._ends, dtype=np.int64)
            else:
                for key in ("file", "offset", "length"):
                    table[key] = np.frombuffer(getattr(ds, "_" + key),
                                               dtype=getattr(ds, "_" + key).typecode)
            self._table = table
        table = self._table
        if order.size and not ((order >= -ds._count) & (order < ds._count)).all():
            raise IndexError(f"a record out of range ({ds._count} records) in the order")
        order = order % max(ds._count, 1)  # As record(): -1 is the last.
        if ds.record_bytes is not None:
            # Item i is in the first file whose end exceeds i (record()).
            file = np.searchsorted(table["ends"], order, side="right")
            first = np.where(file > 0, table["ends"][np.maximum(file - 1, 0)], 0)
            offsets = (order - first) * ds.record_bytes
            lengths = np.full_like(order, ds.record_bytes)
        else:
            file, offsets, lengths = (table[k][order] for k in ("file", "offset", "length"))
            # An empty record reads nothing, and a range of length 0 would
            # mean the whole file.
            keep = lengths > 0
            file, offsets, lengths = file[keep], offsets[keep], lengths[keep]
        names = np.ascontiguousarray(table["at"][file])
        offsets = np.ascontiguousarray(offsets, dtype=np.uint64)
        lengths = np.ascontiguousarray(lengths, dtype=np.uint64)
        self.monarch._announce_ranges_at(names.ctypes.data, offsets.ctypes.data,
                                         lengths.ctypes.data, names.size)


def _addresses(np, names):
    """The address of each of `names` (bytes, which CPython keeps with a
    trailing NUL: each a char*) as an array, so that an order's names are an
    index into it. The caller keeps `names` alive."""
    return np.fromiter((ctypes.cast(ctypes.c_char_p(n), ctypes.c_void_p).value for n in names),
                       dtype=np.uint64, count=len(names))


def _announce_or_warn(announce):
    """Runs `announce`; a failure of Monarch (no service answers, ...) is a
    warning, since training goes on without prefetch. A path outside the
    dataset (FileNotFoundError) or a bad argument (ValueError) is the
    caller's bug and raised."""
    try:
        announce()
    except OSError as e:
        if isinstance(e, FileNotFoundError):
            raise
        warnings.warn(f"monarch: read order not announced, no prefetch: {e}")
    except RuntimeError as e:  # MonarchError: e.g. the service is gone.
        warnings.warn(f"monarch: read order not announced, no prefetch: {e}")


# Without an explicit announce_epochs, an announcement covers at most this
# many samples (and always one epoch): Monarch builds the announced list in
# memory, a name per sample, and the node service keeps it, so 90 epochs
# of ImageNet on one rank (115 million names) would cost gigabytes.
DEFAULT_MAX_ANNOUNCED_SAMPLES = 1 << 22


def _default_distributed():
    """(world size, rank) of torch.distributed's default group, or (1, 0)
    when it is not initialized: the sampler then works alone."""
    import torch.distributed as dist
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size(), dist.get_rank()
    return 1, 0


class SeededSampler(torch.utils.data.Sampler):
    """A sampler whose order Monarch can rebuild from its seed, so that it
    announces several epochs ahead: a drop-in replacement for
    torch.utils.data.DistributedSampler (same arguments, attributes and
    set_epoch()), also usable alone (as a shuffling sampler over the whole
    dataset) since num_replicas and rank default to torch.distributed's
    world size and rank only when it is initialized, else to 1 and 0.

    Each epoch it yields monarch.sampled_indices(len(dataset), seed, epoch,
    shuffle, rank, num_replicas, drop_last): a permutation per epoch (not the
    one DistributedSampler draws), padded by repeating from its start to a
    multiple of num_replicas (or cut with drop_last), of which this rank
    reads every num_replicas-th position from `rank`; the ranks together
    read every sample. Call set_epoch() before each epoch, as with
    DistributedSampler: without it, every epoch repeats epoch 0's order.

    As an epoch starts (when the DataLoader iterates the sampler), it
    announces the order of that epoch and of the following ones through
    Monarch.announce_sampled_order: `announce_epochs` epochs if given (1 to
    monarch.MAX_SAMPLED_EPOCHS), else the epochs left of `num_epochs` if
    given (at least 1, at most MAX_SAMPLED_EPOCHS, and no more than keep
    the announcement within DEFAULT_MAX_ANNOUNCED_SAMPLES samples), else 1.
    A failed announcement is a warning, as with AnnouncingSampler.

    `dataset`: a dataset of this module, or anything with file_of(index)
    (the path sample `index` reads) and len(); `monarch`: the handle to
    announce through (default: dataset.monarch). As with AnnouncingSampler,
    DataLoader workers are other processes: the announcement reaches their
    reads through the node service (`node: {shared: true}`)."""

    def __init__(self, dataset, num_replicas=None, rank=None, shuffle=True, seed=0,
                 drop_last=False, num_epochs=None, announce_epochs=None, monarch=None):
        default_replicas, default_rank = _default_distributed()
        num_replicas = default_replicas if num_replicas is None else num_replicas
        rank = default_rank if rank is None else rank
        if num_replicas < 1:
            raise ValueError(f"num_replicas must be at least 1, not {num_replicas}")
        if not 0 <= rank < num_replicas:
            raise ValueError(f"rank {rank} must be in [0, {num_replicas})")
        if announce_epochs is not None and not 1 <= announce_epochs <= MAX_SAMPLED_EPOCHS:
            raise ValueError(f"announce_epochs must be 1 to {MAX_SAMPLED_EPOCHS}, "
                             f"not {announce_epochs}")
        if num_epochs is not None and num_epochs < 0:
            raise ValueError(f"num_epochs must not be negative, not {num_epochs}")
        # Checks the rest (types, ranges) the way the library will see them.
        _sampled_order(seed, 0, 1, shuffle, rank, num_replicas, drop_last)
        self.dataset = dataset
        self.monarch = monarch if monarch is not None else dataset.monarch
        self.num_replicas = num_replicas
        self.rank = rank
        self.shuffle = shuffle
        self.seed = seed
        self.drop_last = drop_last
        self.num_epochs = num_epochs
        self.announce_epochs = announce_epochs
        self.epoch = 0
        samples = len(dataset)
        if drop_last:
            self.num_samples = samples // num_replicas
        else:
            self.num_samples = -(-samples // num_replicas)
        self.total_size = self.num_samples * num_replicas
        self._names = None  # The dataset's paths as the library takes them, made once.

    def __len__(self):
        return self.num_samples

    def set_epoch(self, epoch):
        """Sets the epoch whose order the next iteration yields (and from
        which it announces)."""
        self.epoch = epoch

    def epochs_to_announce(self):
        """How many epochs, from the current one, the next iteration
        announces (see the class doc)."""
        if self.announce_epochs is not None:
            return self.announce_epochs
        if self.num_epochs is None:
            return 1
        left = min(max(self.num_epochs - self.epoch, 1), MAX_SAMPLED_EPOCHS)
        return max(1, min(left, DEFAULT_MAX_ANNOUNCED_SAMPLES // max(self.num_samples, 1)))

    def __iter__(self):
        samples = len(self.dataset)
        if samples == 0:
            return iter([])
        indices = sampled_indices(samples, self.seed, self.epoch, self.shuffle, self.rank,
                                  self.num_replicas, self.drop_last)
        _announce_or_warn(self._announce)
        return iter(indices)

    def _announce(self):
        if self._names is None:
            self._names = self.monarch._name_array(
                [self.dataset.file_of(i) for i in range(len(self.dataset))])
        how = _sampled_order(self.seed, self.epoch, self.epochs_to_announce(), self.shuffle,
                             self.rank, self.num_replicas, self.drop_last)
        self.monarch._announce_sampled(self._names, how)

    def __getstate__(self):
        # The name array is ctypes memory: rebuilt where it is needed.
        state = self.__dict__.copy()
        state["_names"] = None
        return state
