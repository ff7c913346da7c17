"""Monarch for Python: read a training dataset through Monarch's storage tiers.

    import monarch
    with monarch.Monarch("/etc/monarch.yaml") as m:     # or Monarch(dataset="/lustre/imagenet")
        data = m.read("train/n01440764/img_0001.JPEG")  # bytes
        with m.open("train/n01440764/img_0001.JPEG") as f:
            img = PIL.Image.open(f)

Every call goes to libmonarch_c.so (the C API in include/monarch/monarch_c.h)
through ctypes: bench/results/python.md has the measurement that chose ctypes
over a compiled (nanobind) extension.

Paths: a name relative to the dataset root ("train/a.jpg") or an absolute
path under the root ("/lustre/imagenet/train/a.jpg"); anything else raises
FileNotFoundError.

Errors: a missing file is FileNotFoundError (errno ENOENT, with the filename);
a bad config is ValueError whose message names the key; a failed read of the
source (or another I/O failure) is OSError with an errno; anything else is
monarch.MonarchError (a RuntimeError).

Threads and processes: a Monarch may be used from many threads at once. After
a fork (a DataLoader worker), the child reopens the same config on its first
call instead of touching the parent's handle, whose threads it does not
have; a Monarch pickles as its config, so it can be sent to spawned workers.
"""

import collections
import ctypes
import errno as _errno
import io
import json
import operator
import os
import stat as _stat
import sys
import threading
import time

from . import _lib

__all__ = ["Monarch", "MonarchError", "MonarchFile", "StatResult", "StageResult",
           "MAX_SAMPLED_EPOCHS", "library_path", "sampled_indices"]

library_path = _lib.library_path

# monarch_code values (monarch_c.h).
OK = 0
CANCELLED = 1
UNKNOWN = 2
INVALID_ARGUMENT = 3
DEADLINE_EXCEEDED = 4
NOT_FOUND = 5
ALREADY_EXISTS = 6
PERMISSION_DENIED = 7
RESOURCE_EXHAUSTED = 8
FAILED_PRECONDITION = 9
ABORTED = 10
OUT_OF_RANGE = 11
UNIMPLEMENTED = 12
INTERNAL = 13
UNAVAILABLE = 14
DATA_LOSS = 15

_CODE_NAMES = {value: name for name, value in globals().items()
               if name.isupper() and isinstance(value, int)}

# Codes a failed read, stat or listing can carry when the source's I/O
# failed; they become OSError. The library's errors carry no errno field, but
# an error made from an errno ends in ": <strerror>" (ErrnoToStatus in
# src/common/status_macros.cc), so that errno is recovered from the message;
# without one, the code's closest errno is used (EIO for failed I/O, as the
# preload library's StatusToErrno does).
_IO_CODES = {
    UNKNOWN: _errno.EIO,
    DEADLINE_EXCEEDED: _errno.ETIMEDOUT,
    PERMISSION_DENIED: _errno.EACCES,
    RESOURCE_EXHAUSTED: _errno.ENOMEM,
    FAILED_PRECONDITION: _errno.EIO,  # e.g. a source file replaced by a FIFO mid-run
    UNAVAILABLE: _errno.EAGAIN,
    INTERNAL: _errno.EIO,
    DATA_LOSS: _errno.EIO,
}
_STRERROR = {os.strerror(number): number for number in sorted(_errno.errorcode, reverse=True)}


def _c_name_array(names):
    """(a char* array of `names`, dataset names as bytes; their count)."""
    return (ctypes.c_char_p * max(len(names), 1))(*names), len(names)


class MonarchError(RuntimeError):
    """A Monarch failure that is neither a missing file, a bad config nor
    failed I/O (e.g. a node service that refused the client). `code` is the
    monarch_code (the canonical status code) and `code_name` its name."""

    def __init__(self, message, code=UNKNOWN):
        super().__init__(message)
        self.code = code
        self.code_name = _CODE_NAMES.get(code, str(code))


def _errno_in(message):
    """The errno whose strerror ends `message`, or None."""
    _, sep, tail = message.rpartition(": ")
    return _STRERROR.get(tail) if sep else None


def _raise(code, message, filename=None, opening=False):
    """Raises the Python exception for a failed C call (see the module doc)."""
    if code == NOT_FOUND:
        raise FileNotFoundError(_errno.ENOENT, message, filename)
    if code == INVALID_ARGUMENT:
        number = None if opening else _errno_in(message)
        if number is not None:  # e.g. EISDIR: reading a directory.
            raise OSError(number, message, filename)
        raise ValueError(message)
    if code in _IO_CODES and not opening:
        # OSError(errno, ...) instantiates the matching subclass
        # (PermissionError for EACCES, ...).
        raise OSError(_errno_in(message) or _IO_CODES[code], message, filename)
    raise MonarchError(message, code)


# The most epochs one sampled-order announcement covers (the node service's
# bound; kMaxSampledEpochs in monarch/sampled_order.h).
MAX_SAMPLED_EPOCHS = 100


def _unsigned(name, value, bits):
    """`value` as an int in [0, 2**bits): ctypes would wrap a negative or
    too large one silently into another, valid-looking number."""
    value = operator.index(value)
    if not 0 <= value < 1 << bits:
        raise ValueError(f"{name} must be in [0, 2**{bits}), not {value}")
    return value


def _sampled_order(seed, first_epoch, epochs, shuffle, rank, world_size, drop_last):
    """A monarch_sampled_order. The library checks the values against each
    other (rank < world_size, ...) and names the field in its message."""
    return _lib.SampledOrder(
        seed=operator.index(seed) % (1 << 64),
        first_epoch=_unsigned("first_epoch", first_epoch, 64),
        epochs=_unsigned("epochs", epochs, 32),
        rank=_unsigned("rank", rank, 32),
        world_size=_unsigned("world_size", world_size, 32),
        shuffle=1 if shuffle else 0,
        drop_last=1 if drop_last else 0)


def sampled_indices(samples, seed, epoch, shuffle=True, rank=0, world_size=1, drop_last=False):
    """The sample indices (a list of ints, each < samples) that rank `rank`
    of `world_size` reads in epoch `epoch` of a dataset of `samples`
    samples, in order: the order Monarch.announce_sampled_order() announces
    for that epoch, computed by the same C library (monarch_sampled_epoch).

    Like torch's DistributedSampler: a permutation of range(samples) drawn
    from (seed, epoch) (range(samples) itself without shuffle), padded by
    repeating from its start to a multiple of world_size (cut instead with
    drop_last), of which the rank takes every world_size-th position from
    `rank`. The algorithm is specified exactly in monarch/sampled_order.h.
    `seed` is any int, taken modulo 2**64. ValueError names a bad argument
    (samples 0, rank >= world_size, ...)."""
    how = _sampled_order(seed, 0, 1, shuffle, rank, world_size, drop_last)
    samples = _unsigned("samples", samples, 64)
    epoch = _unsigned("epoch", epoch, 64)
    lib = _lib.lib()
    count = ctypes.c_size_t()
    error = ctypes.c_void_p()
    # The size query first, then the indices straight into a buffer of it.
    code = lib.monarch_sampled_epoch(ctypes.byref(how), samples, epoch, None, 0,
                                     ctypes.byref(count), ctypes.byref(error))
    message = _lib.take_string(error.value)
    if code != OK:
        _raise(code, message)
    if count.value == 0:
        return []
    indices = (ctypes.c_uint64 * count.value)()
    code = lib.monarch_sampled_epoch(ctypes.byref(how), samples, epoch, indices, count.value,
                                     ctypes.byref(count), ctypes.byref(error))
    message = _lib.take_string(error.value)
    if code != OK:
        _raise(code, message)
    return list(indices)


StatResult = collections.namedtuple("StatResult", "st_mode st_size st_mtime st_mtime_ns")
StatResult.__doc__ = """What Monarch.stat() returns, with os.stat_result's field names:
st_mode (S_IFREG|0444 for a file, S_IFDIR|0555 for a directory), st_size
(bytes), st_mtime (seconds, float) and st_mtime_ns (the source file's mtime as
the namespace walk saw it)."""

StageResult = collections.namedtuple("StageResult", "files bytes")
StageResult.__doc__ = "What Monarch.stage() returns: files read and their bytes."

# Per process, not per handle: a lock a parent thread held during fork() would
# stay held forever in the child, so the child gets a fresh one.
_reopen_lock = threading.Lock()


def _reset_after_fork():
    global _reopen_lock
    _reopen_lock = threading.Lock()


os.register_at_fork(after_in_child=_reset_after_fork)


class Monarch:
    """A Monarch instance over one dataset.

    Monarch(config) opens a YAML config: a file path, or the YAML text itself
    when the string contains a newline. Monarch(dataset=DIR) opens the
    embedded default (a RAM tier of half the available memory over DIR).
    With neither, $MONARCH_CONFIG (a YAML file) or else $MONARCH_DATASET is
    used, as the TensorFlow plugin and the preload library do. With
    `node: {shared: true}` in the config, the handle is a client of the
    node's `monarch serve` (started on demand with the bundled binary).

    Use it as a context manager or call close(). It is safe to use from many
    threads; after os.fork() the child transparently reopens the same config
    on first use, and pickling sends the config, not the handle.
    """

    def __init__(self, config=None, dataset=None):
        if config is None and dataset is None:
            config = os.environ.get("MONARCH_CONFIG") or None
            dataset = None if config else (os.environ.get("MONARCH_DATASET") or None)
            if config is None and dataset is None:
                raise ValueError("Monarch needs a config or a dataset: pass config= or "
                                 "dataset=, or set MONARCH_CONFIG or MONARCH_DATASET")
        elif config is not None and dataset is not None:
            raise ValueError("pass either config or dataset, not both")
        if config is not None:
            config = os.fspath(config)
            if isinstance(config, bytes):
                config = os.fsdecode(config)
            if "\n" not in config:
                # Absolute, so that a worker started in another directory
                # (spawn) opens the same file.
                config = os.path.abspath(config)
        else:
            dataset = os.path.abspath(os.fsdecode(os.fspath(dataset)))
        self._config = config
        self._dataset = dataset
        self._handle = None
        self._pid = None
        self._root = None
        self._fork_safe = False
        self._closed = False
        self._reopen()

    @classmethod
    def _unpickled(cls, config, dataset):
        # Opened on first use, in whatever process that is.
        self = cls.__new__(cls)
        self._config, self._dataset = config, dataset
        self._handle = self._pid = self._root = None
        self._fork_safe = False
        self._closed = False
        return self

    def __reduce__(self):
        return (Monarch._unpickled, (self._config, self._dataset))

    @property
    def config(self):
        """The config this handle was opened with: an absolute file path or
        YAML text (None for the embedded default)."""
        return self._config

    @property
    def root(self):
        """The absolute dataset directory."""
        self._h()
        return self._root

    def _reopen(self):
        with _reopen_lock:
            if self._closed:
                raise ValueError("I/O operation on a closed Monarch")
            if self._handle is not None and self._pid == os.getpid():
                return self._handle  # Another thread got here first.
            # A handle inherited through fork() is abandoned, not closed:
            # closing would join placement threads this process does not have.
            lib = _lib.lib()
            handle = ctypes.c_void_p()
            error = ctypes.c_void_p()
            if self._config is None:
                code = lib.monarch_open_default(os.fsencode(self._dataset),
                                                ctypes.byref(handle), ctypes.byref(error))
                what = self._dataset
            elif "\n" in self._config:
                code = lib.monarch_open_yaml_string(self._config.encode(),
                                                    ctypes.byref(handle), ctypes.byref(error))
                what = None
            else:
                code = lib.monarch_open_yaml_file(os.fsencode(self._config),
                                                  ctypes.byref(handle), ctypes.byref(error))
                what = self._config
            message = _lib.take_string(error.value)
            if code != OK:
                _raise(code, message, what, opening=True)
            self._root = os.fsdecode(lib.monarch_dataset_root(handle))
            self._fork_safe = bool(lib.monarch_usable_after_fork(handle))
            self._handle = handle
            self._pid = os.getpid()
            return handle

    def _h(self):
        handle = self._handle
        if handle is not None:
            if self._pid == os.getpid():
                return handle
            if self._fork_safe:
                # A node-service client goes on in a forked child (a
                # DataLoader worker): the C library remaps the service's
                # tables there and connects anew, with no config parsing
                # or handshake (monarch_usable_after_fork).
                self._pid = os.getpid()
                return handle
        return self._reopen()

    def close(self):
        """Stops background placement and frees the instance (in this process;
        a handle inherited through fork is only dropped, unless it is a node
        service client, which the child may close). Idempotent."""
        with _reopen_lock:
            handle, self._handle = self._handle, None
            self._closed = True
            if handle is not None and (self._pid == os.getpid() or self._fork_safe):
                _lib.lib().monarch_close(handle)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:  # Interpreter shutdown: modules may be gone.
            pass

    def __repr__(self):
        source = f"config={self._config!r}" if self._config else f"dataset={self._dataset!r}"
        state = "closed" if self._closed else "open"
        return f"<monarch.Monarch {source} ({state})>"

    # --- names

    def _name(self, path):
        """The dataset name (bytes) of `path`, or FileNotFoundError."""
        text = os.fspath(path)
        if isinstance(text, bytes):
            text = os.fsdecode(text)
        if os.path.isabs(text):
            out = ctypes.c_void_p()
            clean = os.path.normpath(text)
            if _lib.lib().monarch_path_to_name(self._h(), os.fsencode(clean), ctypes.byref(out)):
                return os.fsencode(_lib.take_string(out.value))
            raise FileNotFoundError(_errno.ENOENT,
                                    f"not under the dataset root {self.root}", text)
        clean = os.path.normpath(text) if text else "."
        if clean == ".":
            return b""
        if clean == ".." or clean.startswith("../"):
            raise FileNotFoundError(_errno.ENOENT, "outside the dataset", text)
        return os.fsencode(clean)

    def _size(self, name, path):
        size = ctypes.c_uint64()
        error = ctypes.c_void_p()
        code = _lib.lib().monarch_file_size(self._h(), name, ctypes.byref(size),
                                            ctypes.byref(error))
        message = _lib.take_string(error.value)
        if code != OK:
            self._fail(code, message, name, path)
        return size.value

    def _fail(self, code, message, name, path):
        # A directory is not a "dataset file" to the C API; say what the
        # builtin open() would.
        if code == NOT_FOUND and name and _lib.lib().monarch_is_directory(self._h(), name):
            raise IsADirectoryError(_errno.EISDIR, "is a directory", os.fspath(path))
        _raise(code, message, os.fspath(path))

    # --- reads

    def _readinto(self, name, buffer, offset, path):
        view = memoryview(buffer)
        if view.readonly:
            raise TypeError(f"readinto() needs a writable buffer, not a read-only "
                            f"{type(buffer).__name__}")
        if offset < 0:
            raise ValueError(f"negative offset {offset}")
        n = view.nbytes
        if n == 0:
            return 0
        # Zero copy: a ctypes array over the caller's memory (this also
        # refuses non-contiguous buffers); the view is released when the
        # array goes away, after the call.
        target = (ctypes.c_char * n).from_buffer(view)
        got = ctypes.c_size_t()
        error = ctypes.c_void_p()
        code = _lib._lib.monarch_read(self._h(), name, target, n, offset, ctypes.byref(got),
                                      ctypes.byref(error))
        if code != OK:
            self._fail(code, _lib.take_string(error.value), name, path)
        return got.value

    def read(self, path, offset=0, size=-1):
        """Returns `size` bytes of the file from `offset` (all of the rest
        when size < 0) as bytes; short at the end of the file, empty past it."""
        name = self._name(path)
        fast = _read_bytes_module()
        if fast is not None:
            if offset < 0:
                raise ValueError(f"negative offset {offset}")
            result = fast.read(self._h().value, name, offset,
                               -1 if size is None or size < 0 else size)
            if result.__class__ is bytes:
                return result
            self._fail(result[0], result[1], name, path)
        if size is None or size < 0:
            size = max(0, self._size(name, path) - offset)
        if _new_bytes is not None and size > 0:
            # Read straight into a new bytes object: saves a copy of every
            # sample (measured: bench/results/python.md).
            data = _new_bytes(None, size)
            got = self._read_to_address(name, id(data) + _BYTES_DATA_OFFSET, size, offset, path)
            return data if got == size else data[:got]
        buffer = bytearray(size)
        got = self._readinto(name, buffer, offset, path)
        return bytes(buffer) if got == size else bytes(memoryview(buffer)[:got])

    def _read_to_address(self, name, address, n, offset, path):
        if offset < 0:
            raise ValueError(f"negative offset {offset}")
        got = ctypes.c_size_t()
        error = ctypes.c_void_p()
        code = _lib._lib.monarch_read(self._h(), name, address, n, offset, ctypes.byref(got),
                                      ctypes.byref(error))
        if code != OK:
            self._fail(code, _lib.take_string(error.value), name, path)
        return got.value

    def readinto(self, path, buffer, offset=0):
        """Reads up to len(buffer) bytes of the file from `offset` straight
        into `buffer` (any writable, C-contiguous object with the buffer
        protocol: bytearray, memoryview, numpy array...) and returns the
        number of bytes read (0 at or past the end). A read-only buffer
        raises TypeError."""
        return self._readinto(self._name(path), buffer, offset, path)

    def open(self, path, mode="rb", buffering=-1):
        """Opens a dataset file for reading, like the builtin open(path, "rb"):
        an io.BufferedReader over a MonarchFile (buffering=0 returns the
        MonarchFile itself). Works with PIL.Image.open, numpy.load, h5py.File
        and anything else that takes a binary file object."""
        if mode not in ("rb", "br"):
            raise ValueError(f"Monarch files are read-only binary: mode must be 'rb', not {mode!r}")
        name = self._name(path)
        raw = MonarchFile(self, name, os.fspath(path), self._size(name, path))
        if buffering == 0:
            return raw
        return io.BufferedReader(raw, buffering if buffering > 1 else _BUFFER_SIZE)

    # --- namespace

    def stat(self, path):
        """Size and source mtime of a file (or a directory: size 0) as a
        StatResult, os.stat_result's field names."""
        name = self._name(path)
        if name == b"" or self.isdir(path):
            return StatResult(_stat.S_IFDIR | 0o555, 0, 0.0, 0)
        size = ctypes.c_uint64()
        mtime = ctypes.c_int64()
        error = ctypes.c_void_p()
        code = _lib.lib().monarch_stat(self._h(), name, ctypes.byref(size), ctypes.byref(mtime),
                                       ctypes.byref(error))
        message = _lib.take_string(error.value)
        if code != OK:
            _raise(code, message, os.fspath(path))
        return StatResult(_stat.S_IFREG | 0o444, size.value, mtime.value / 1e9, mtime.value)

    def exists(self, path):
        """True for a dataset file or directory."""
        try:
            name = self._name(path)
        except FileNotFoundError:
            return False
        lib = _lib.lib()
        handle = self._h()
        return bool(name == b"" or lib.monarch_file_exists(handle, name)
                    or lib.monarch_is_directory(handle, name))

    def isdir(self, path):
        """True for a directory of the dataset (the root included)."""
        try:
            name = self._name(path)
        except FileNotFoundError:
            return False
        return name == b"" or bool(_lib.lib().monarch_is_directory(self._h(), name))

    def isfile(self, path):
        """True for a file of the dataset."""
        try:
            name = self._name(path)
        except FileNotFoundError:
            return False
        return bool(name) and bool(_lib.lib().monarch_file_exists(self._h(), name))

    def listdir(self, path=""):
        """Sorted names directly inside a dataset directory ("" = the root)."""
        return self._names("monarch_list_directory", self._name(path), path)

    def glob(self, pattern):
        """Dataset files and directories matching `pattern` (fnmatch per path
        component, as glob.glob), sorted, from the in-memory namespace. A
        relative pattern is taken from the dataset root and gives names
        relative to it; an absolute one gives absolute paths."""
        text = os.fsdecode(os.fspath(pattern))
        absolute = os.path.isabs(text)
        root = self.root
        full = text if absolute else os.path.join(root, text)
        matches = self._names("monarch_glob", os.fsencode(full), pattern)
        if absolute:
            return matches
        prefix = root.rstrip("/") + "/"
        return [m[len(prefix):] if m.startswith(prefix) else m for m in matches]

    def _names(self, function, argument, path):
        names = ctypes.POINTER(ctypes.c_char_p)()
        count = ctypes.c_size_t()
        error = ctypes.c_void_p()
        lib = _lib.lib()
        code = getattr(lib, function)(self._h(), argument, ctypes.byref(names),
                                      ctypes.byref(count), ctypes.byref(error))
        message = _lib.take_string(error.value)
        if code != OK:
            _raise(code, message, os.fspath(path))
        try:
            return [os.fsdecode(names[i]) for i in range(count.value)]
        finally:
            lib.monarch_free_list(names, count.value)

    def walk(self, path=""):
        """Like os.walk (top-down) over a dataset directory: yields
        (dirpath, dirnames, filenames) with dirpath as given/joined."""
        base = os.fspath(path)
        dirs, files = [], []
        for entry in self.listdir(base):
            (dirs if self.isdir(os.path.join(base, entry)) else files).append(entry)
        yield base, dirs, files
        for d in dirs:
            yield from self.walk(os.path.join(base, d))

    # --- counters and placement

    def stats(self):
        """Monarch's counters as a dict (monarch_stats_json): "tiers" fastest
        first with the source last, each with reads, bytes_read, files,
        bytes_used...; promotion counters. A client of a node service
        (`node: {shared: true}`) gets the service's counters, plus "service"
        (e.g. the number of clients connected)."""
        return json.loads(_lib.take_string(_lib.lib().monarch_stats_json(self._h())))

    def stats_prometheus(self):
        """The same counters in the Prometheus text format."""
        return _lib.take_string(_lib.lib().monarch_stats_prometheus(self._h()))

    def wait_for_placement(self):
        """Blocks until no promotion is queued or running."""
        _lib.lib().monarch_wait_for_placement(self._h())

    def announce_order(self, paths):
        """Clairvoyant prefetch: tells Monarch the order in which this
        process (or the DataLoader workers it feeds) will read `paths`, e.g.
        an epoch's shuffled order, before reading starts. Monarch then reads
        ahead in that order (config `prefetch`) and promotes the files. A
        new call replaces the order; an empty one withdraws it. With a node
        service (`node: {shared: true}`) each process announces its own share
        and the service merges them; without one, only this process's own
        reads profit (DataLoader workers are other processes: use the node
        service). FileNotFoundError names a path outside the dataset, and
        nothing is announced then."""
        self._announce_names(self._name_array(paths))

    def _announce_names(self, name_array):
        """announce_order() of a _name_array()."""
        array, count = name_array
        error = ctypes.c_void_p()
        code = _lib.lib().monarch_announce_order(self._h(), array, count, ctypes.byref(error))
        message = _lib.take_string(error.value)
        if code != OK:
            _raise(code, message)

    def announce_sampled_order(self, files, seed, first_epoch, epochs=1, shuffle=True, rank=0,
                               world_size=1, drop_last=False):
        """announce_order() for an order given as a seeded sampler: `files[i]`
        is the path sample i reads, and the order announced is what rank
        `rank` of `world_size` reads in epochs first_epoch ..
        first_epoch + epochs - 1 (sampled_indices() of each, concatenated),
        rebuilt by the library. So several epochs can be announced at once
        and eviction (placement.policy lru) knows when each file is read
        next beyond the coming epoch. `epochs` is 1 to MAX_SAMPLED_EPOCHS.
        ValueError names a bad argument; FileNotFoundError a path outside the
        dataset (nothing is announced then); otherwise as announce_order()."""
        how = _sampled_order(seed, first_epoch, epochs, shuffle, rank, world_size, drop_last)
        self._announce_sampled(self._name_array(files), how)

    def _name_array(self, paths):
        """(a char* array of the dataset names of `paths`, their count): what
        the announce calls take, kept by monarch.torch.SeededSampler so that
        each epoch's announcement does not convert every path again."""
        return _c_name_array([self._name(p) for p in paths])

    def _announce_sampled(self, name_array, how):
        array, count = name_array
        error = ctypes.c_void_p()
        code = _lib.lib().monarch_announce_sampled_order(self._h(), array, count,
                                                         ctypes.byref(how), ctypes.byref(error))
        message = _lib.take_string(error.value)
        if code != OK:
            _raise(code, message)

    def stage(self, paths_or_pattern, progress=True, file=None):
        """Reads files through Monarch so that they are promoted into its
        tiers, then waits for placement. `paths_or_pattern`: a path or glob
        pattern, or a list of them; directories are staged with everything
        below them. With `progress`, shows progress on `file` (stderr): a bar
        redrawn in place on a terminal, a line per 10% otherwise. Returns
        StageResult(files, bytes)."""
        if isinstance(paths_or_pattern, (str, bytes, os.PathLike)):
            paths_or_pattern = [paths_or_pattern]
        names, seen = [], set()

        def add(name):
            if self.isdir(os.fsdecode(name) or "."):
                for entry in self.listdir(os.fsdecode(name)):
                    add(os.path.join(name, os.fsencode(entry)) if name else os.fsencode(entry))
            elif name not in seen:
                seen.add(name)
                names.append(name)

        for item in paths_or_pattern:
            text = os.fsdecode(os.fspath(item))
            if any(c in text for c in "*?["):
                for match in self.glob(text):
                    add(self._name(match))
            else:
                name = self._name(text)
                if not (name == b"" or self.exists(text)):
                    raise FileNotFoundError(_errno.ENOENT, "not in the dataset", text)
                add(name)
        sizes = [self._size(n, os.fsdecode(n)) for n in names]
        bar = _Progress(len(names), sum(sizes), file or sys.stderr) if progress else None
        buffer = bytearray(min(max(sizes, default=0), 8 << 20))
        total = 0
        for name, size in zip(names, sizes):
            offset = 0
            while offset < size:
                got = self._readinto(name, buffer, offset, os.fsdecode(name))
                if got == 0:
                    break
                offset += got
                if bar:
                    bar.add(0, got)
            total += offset
            if bar:
                bar.add(1, 0)
        self.wait_for_placement()
        if bar:
            bar.finish()
        return StageResult(len(names), total)


_read_bytes_bound = None  # Not `_read_bytes`: the package attribute would shadow the module.
_read_bytes_tried = False


def _read_bytes_module():
    """monarch._read_bytes (python/monarch/_read_bytes.c), bound to the loaded
    C library, or None: read() then makes its three calls through ctypes.
    Installed packages have it next to this file; a build tree names it in
    MONARCH_READ_BYTES_MODULE (the tests' environment); MONARCH_READ_BYTES=0
    turns it off."""
    global _read_bytes_bound, _read_bytes_tried
    if _read_bytes_tried:
        return _read_bytes_bound
    module = None
    if os.environ.get("MONARCH_READ_BYTES", "1") != "0":
        try:
            from . import _read_bytes as module
        except ImportError:
            path = os.environ.get("MONARCH_READ_BYTES_MODULE")
            if path:
                import importlib.util
                spec = importlib.util.spec_from_file_location("monarch._read_bytes", path)
                module = importlib.util.module_from_spec(spec)
                spec.loader.exec_module(module)
        if module is not None:
            lib = _lib.lib()
            module.bind(*(ctypes.cast(f, ctypes.c_void_p).value
                          for f in (lib.monarch_read, lib.monarch_file_size, lib.monarch_free)))
    _read_bytes_bound, _read_bytes_tried = module, True
    return module


# CPython: PyBytes_FromStringAndSize(NULL, n) makes an uninitialised bytes
# object whose n bytes start basicsize - 1 bytes into it (ob_sval); nothing
# else can see it before read() fills it. Elsewhere read() copies once more.
if sys.implementation.name == "cpython":
    _new_bytes = ctypes.pythonapi.PyBytes_FromStringAndSize
    _new_bytes.restype = ctypes.py_object
    _new_bytes.argtypes = [ctypes.c_void_p, ctypes.c_ssize_t]
    _BYTES_DATA_OFFSET = bytes.__basicsize__ - 1
else:
    _new_bytes = None

_BUFFER_SIZE = 64 * 1024  # PIL and numpy read in chunks of this order.


class MonarchFile(io.RawIOBase):
    """A read-only raw binary file over one dataset file (what
    Monarch.open() wraps in an io.BufferedReader). Supports read, readinto,
    readall, seek (SEEK_SET, SEEK_CUR, SEEK_END), tell; `name` is the path
    it was opened with, `mode` is "rb"."""

    def __init__(self, monarch, name, path, size):
        super().__init__()
        self._monarch = monarch
        self._dataset_name = name
        self.name = path
        self.mode = "rb"
        self._size = size
        self._pos = 0

    def readable(self):
        return True

    def seekable(self):
        return True

    def readinto(self, buffer):
        self._checkClosed()
        got = self._monarch._readinto(self._dataset_name, buffer, self._pos, self.name)
        self._pos += got
        return got

    def readall(self):
        self._checkClosed()
        # The size is known, so one call instead of RawIOBase's chunk loop.
        parts = [self._monarch.read(os.fsdecode(self._dataset_name), self._pos)]
        self._pos += len(parts[0])
        while True:  # Only if the file grew, which Monarch's namespace does not show.
            more = self._monarch.read(os.fsdecode(self._dataset_name), self._pos, 1 << 20)
            if not more:
                break
            parts.append(more)
            self._pos += len(more)
        return b"".join(parts)

    def seek(self, offset, whence=io.SEEK_SET):
        self._checkClosed()
        if whence == io.SEEK_SET:
            target = offset
        elif whence == io.SEEK_CUR:
            target = self._pos + offset
        elif whence == io.SEEK_END:
            target = self._size + offset
        else:
            raise ValueError(f"invalid whence ({whence}, should be 0, 1 or 2)")
        if target < 0:
            raise OSError(_errno.EINVAL, "negative seek position", self.name)
        self._pos = target
        return target

    def tell(self):
        self._checkClosed()
        return self._pos

    def __repr__(self):
        return f"<monarch.MonarchFile name={self.name!r}>"


class _Progress:
    """A dependency-free progress display for stage()."""

    def __init__(self, files, total_bytes, stream):
        self.files, self.total = files, total_bytes
        self.done_files = self.done_bytes = 0
        self.stream = stream
        self.tty = hasattr(stream, "isatty") and stream.isatty()
        self.started = self.last = time.monotonic()
        self.next_percent = 10

    def add(self, files, nbytes):
        self.done_files += files
        self.done_bytes += nbytes
        now = time.monotonic()
        percent = 100 * self.done_bytes // self.total if self.total else 100
        if self.tty:
            if now - self.last >= 0.1:
                self.last = now
                self._draw(percent)
        elif percent >= self.next_percent and self.done_bytes < self.total:
            while self.next_percent <= percent:
                self.next_percent += 10
            self._line(percent)

    def _draw(self, percent):
        width = 30
        filled = width * percent // 100
        self.stream.write("\r[" + "#" * filled + " " * (width - filled) + "] " +
                          self._text(percent))
        self.stream.flush()

    def _text(self, percent):
        return (f"{percent:3d}% {self.done_files}/{self.files} files "
                f"{self.done_bytes / 2**20:.1f}/{self.total / 2**20:.1f} MiB")

    def _line(self, percent):
        self.stream.write("monarch stage: " + self._text(percent) + "\n")
        self.stream.flush()

    def finish(self):
        elapsed = time.monotonic() - self.started
        if self.tty:
            self._draw(100)
            self.stream.write("\n")
        self.stream.write(f"monarch stage: {self.done_files} files, "
                          f"{self.done_bytes / 2**20:.1f} MiB staged in {elapsed:.1f} s\n")
        self.stream.flush()
