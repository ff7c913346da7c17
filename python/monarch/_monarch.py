"""Monarch: the handle on one dataset (see the package doc), with what its
methods return (StatResult, StageResult) and take (_c_name_array)."""

import collections
import ctypes
import errno as _errno
import io
import json
import mmap as _mmap
import os
import stat as _stat
import sys
import threading

from . import _lib
from ._errors import NOT_FOUND, OK, _raise
from ._fast_read import _BYTES_DATA_OFFSET, _new_bytes, _read_bytes_module
from ._file import MonarchFile
from ._progress import _Progress
from ._sampling import _sampled_order


def _c_name_array(names):
    """(a char* array of `names`, dataset names as bytes; their count)."""
    return (ctypes.c_char_p * max(len(names), 1))(*names), len(names)


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
# Which process a handle was opened in, without asking the kernel: every
# os.fork() child counts one more. A handle remembers the count it was
# opened (or taken over) at; os.getpid() instead cost a system call on every
# read (0.23 us here, a tenth of a 4 KiB record's read).
_fork_generation = 0


def _reset_after_fork():
    global _reopen_lock, _fork_generation
    _reopen_lock = threading.Lock()
    _fork_generation += 1


os.register_at_fork(after_in_child=_reset_after_fork)

_BUFFER_SIZE = 64 * 1024  # PIL and numpy read in chunks of this order.
# Monarch.mmap fills mappings of files up to this size, as the transparent
# mode does (kFilledMappingBytes in integrations/preload/hooks.cc).
_FILLED_MAPPING_BYTES = 8 << 20


class _PyBuffer(ctypes.Structure):
    """CPython's Py_buffer: the address of an object's memory (a read-only
    mmap.mmap's, which ctypes.c_char.from_buffer refuses)."""
    _fields_ = [("buf", ctypes.c_void_p), ("obj", ctypes.c_void_p),
                ("len", ctypes.c_ssize_t), ("itemsize", ctypes.c_ssize_t),
                ("readonly", ctypes.c_int), ("ndim", ctypes.c_int),
                ("format", ctypes.c_char_p), ("shape", ctypes.c_void_p),
                ("strides", ctypes.c_void_p), ("suboffsets", ctypes.c_void_p),
                ("internal", ctypes.c_void_p)]


_get_buffer = ctypes.pythonapi.PyObject_GetBuffer
_get_buffer.argtypes = [ctypes.py_object, ctypes.POINTER(_PyBuffer), ctypes.c_int]
_release_buffer = ctypes.pythonapi.PyBuffer_Release
_release_buffer.argtypes = [ctypes.POINTER(_PyBuffer)]


def _address_of(obj):
    """The address of a buffer object's memory (held only for the call)."""
    view = _PyBuffer()
    if _get_buffer(obj, ctypes.byref(view), 0) != 0:
        raise BufferError("no buffer")
    try:
        return view.buf
    finally:
        _release_buffer(ctypes.byref(view))


class Monarch:
    """A Monarch instance over one dataset.

    Monarch(config) opens a YAML config: a file path, or the YAML text itself
    when the string contains a newline. Monarch(dataset=DIR) opens the
    embedded default (a RAM tier of half the available memory over DIR).
    With neither, $MONARCH_CONFIG (a YAML file) or else $MONARCH_DATASET is
    used, as the TensorFlow plugin and the preload library do. With
    `node: {shared: true}` in the config, the handle is a client of the
    node's `monarch serve` (started on demand with the bundled binary).
    `share_node=True`, for a program whose readers are other processes
    (DataLoader workers, forked readers): the handle is such a client unless
    the config says `node: {shared: false}`, so that the readers of a node
    share one cache (monarch.torch's datasets open theirs this way).

    Use it as a context manager or call close(). It is safe to use from many
    threads; after os.fork() the child transparently reopens the same config
    on first use, and pickling sends the config, not the handle.
    """

    def __init__(self, config=None, dataset=None, share_node=False):
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
        self._share_node = bool(share_node)
        self._handle = None
        self._generation = None
        self._root = None
        self._fork_safe = False
        self._closed = False
        self._reopen()

    @classmethod
    def _unpickled(cls, config, dataset, share_node=False):
        # Opened on first use, in whatever process that is.
        self = cls.__new__(cls)
        self._config, self._dataset, self._share_node = config, dataset, share_node
        self._handle = self._generation = self._root = None
        self._fork_safe = False
        self._closed = False
        return self

    def __reduce__(self):
        return (Monarch._unpickled, (self._config, self._dataset, self._share_node))

    @property
    def config(self):
        """The config this handle was opened with: an absolute file path or
        YAML text (None for the embedded default)."""
        return self._config

    @property
    def node_shared(self):
        """True when this handle is a client of the node service (`node:
        {shared: true}`): every process of the node reads through one cache,
        and an order announced here reaches their reads."""
        self._h()
        return self._fork_safe

    @property
    def root(self):
        """The absolute dataset directory."""
        self._h()
        return self._root

    def _reopen(self):
        with _reopen_lock:
            if self._closed:
                raise ValueError("I/O operation on a closed Monarch")
            if self._handle is not None and self._generation == _fork_generation:
                return self._handle  # Another thread got here first.
            # A handle inherited through fork() is abandoned, not closed:
            # closing would join placement threads this process does not have.
            lib = _lib.lib()
            handle = ctypes.c_void_p()
            error = ctypes.c_void_p()
            if self._share_node:
                is_text = self._config is not None and "\n" in self._config
                code = lib.monarch_open_sharing_node(
                    None if is_text or self._config is None else os.fsencode(self._config),
                    self._config.encode() if is_text else None,
                    os.fsencode(self._dataset) if self._config is None else None,
                    ctypes.byref(handle), ctypes.byref(error))
                what = None if is_text else (self._config or self._dataset)
            elif self._config is None:
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
            self._generation = _fork_generation
            return handle

    def _h(self):
        handle = self._handle
        if handle is not None:
            if self._generation == _fork_generation:
                return handle
            if self._fork_safe:
                # A node-service client goes on in a forked child (a
                # DataLoader worker): the C library remaps the service's
                # tables there and connects anew, with no config parsing
                # or handshake (monarch_usable_after_fork).
                self._generation = _fork_generation
                return handle
        return self._reopen()

    def close(self):
        """Stops background placement and frees the instance (in this process;
        a handle inherited through fork is only dropped, unless it is a node
        service client, which the child may close). Idempotent."""
        with _reopen_lock:
            handle, self._handle = self._handle, None
            self._closed = True
            if handle is not None and (self._generation == _fork_generation or self._fork_safe):
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
        if (path.__class__ is str and path and path[0] not in "/." and path[-1] != "/"
                and "//" not in path and "/." not in path):
            # Already canonical (normpath would return it as it is): most
            # samples' paths: 0.7 us a name here, where normpath's way took 1.5.
            return os.fsencode(path)
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
        return self._read_name(self._name(path), offset, size, path)

    def _read_name(self, name, offset, size, path):
        """read() of a dataset name (_name(path)): monarch.torch's datasets
        make their names once, not once a sample."""
        fast = _read_bytes_module()
        if fast is not None:
            if offset < 0:
                raise ValueError(f"negative offset {offset}")
            # _h()'s common case inline: a sample's read is a microsecond.
            handle = self._handle
            if handle is None or self._generation != _fork_generation:
                handle = self._h()
            result = fast.read(handle.value, name, offset,
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

    def mmap(self, path):
        """A read-only mmap.mmap of the whole file (numpy.frombuffer,
        pyarrow.py_buffer and memoryview take it as is). A file over 8 MiB
        maps the source file itself, which reads nothing until a page is
        touched: pages come from the source through the kernel's page cache,
        shared by every process of the node that maps it, except the pages a
        RAM, posix or pmem tier holds a copy of, which are mapped from that
        copy (Monarch::MapCopies in the C++ API). A smaller file is
        read at once through Monarch into private memory, like read(). Empty
        files raise ValueError, as mmap.mmap does. The transparent mode maps
        the same way (integrations/preload/README.md)."""
        name = self._name(path)
        st = self.stat(path)
        if _stat.S_ISDIR(st.st_mode):
            raise IsADirectoryError(_errno.EISDIR, "is a directory", os.fspath(path))
        if st.st_size == 0:
            raise ValueError("cannot mmap an empty file")
        if st.st_size > _FILLED_MAPPING_BYTES:
            mapped = self._map_source(name, st)
            if mapped is not None and not self._map_copies(name, mapped, st.st_size):
                mapped.close()  # Remapped in part: the source alone, again.
                mapped = self._map_source(name, st)
            if mapped is not None:
                return mapped
        # Filled through a memory file mapped twice, so that the caller's
        # mapping is read-only like the source's, without a second copy.
        fd = os.memfd_create("monarch-mapping", os.MFD_CLOEXEC)
        try:
            os.ftruncate(fd, st.st_size)
            with _mmap.mmap(fd, st.st_size) as writable:
                got = self._readinto(name, writable, 0, path)
            if got != st.st_size:
                raise OSError(_errno.EIO, f"read {got} of the file's {st.st_size} bytes",
                              os.fspath(path))
            return _mmap.mmap(fd, st.st_size, access=_mmap.ACCESS_READ)
        finally:
            os.close(fd)

    def _map_copies(self, name, mapped, size):
        """Maps the tier copies into `mapped` (the source, mapped by
        _map_source, untouched yet). False if that failed part way."""
        got = ctypes.c_uint64(0)
        error = ctypes.c_void_p()
        code = _lib.lib().monarch_map_copies(self._h(), name, _address_of(mapped), 0, size,
                                             _mmap.PROT_READ, _mmap.MAP_PRIVATE,
                                             ctypes.byref(got), ctypes.byref(error))
        _lib.take_string(error.value)
        return code == OK

    def _map_whole_copy(self, name, size):
        """A copy-on-write mapping of the node's copy of `name` (`size`
        bytes): (mmap, bytes it covers: `size` down to a whole page), or
        None unless every whole page of it is mapped from a tier's copy
        (none yet, in part by extents, not checked yet, a guest's session):
        then the caller reads. monarch.torch.RecordDataset's views.

        Unlike mmap(), nothing here touches the source: the mapping starts
        anonymous, and one with a page left anonymous is never used, so a
        miss still goes through Monarch's read (and its one read of the
        source). Private and writable: a write copies the page into this
        process, as a transform that works in place expects, and the tier's
        copy stays as it was."""
        covered = size // _mmap.PAGESIZE * _mmap.PAGESIZE
        if covered == 0:
            return None
        mapping = _mmap.mmap(-1, covered, flags=_mmap.MAP_PRIVATE,
                             prot=_mmap.PROT_READ | _mmap.PROT_WRITE)
        got = ctypes.c_uint64(0)
        error = ctypes.c_void_p()
        code = _lib.lib().monarch_map_copies(self._h(), name, _address_of(mapping), 0, covered,
                                             _mmap.PROT_READ | _mmap.PROT_WRITE,
                                             _mmap.MAP_PRIVATE, ctypes.byref(got),
                                             ctypes.byref(error))
        _lib.take_string(error.value)
        if code != OK or got.value != covered:
            mapping.close()
            return None
        return mapping, covered

    def _map_source(self, name, st):
        """The source file mapped read-only, or None when it is no longer the
        file the namespace walked (size, mtime) or cannot be mapped."""
        try:
            fd = os.open(os.path.join(self.root, os.fsdecode(name)), os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return None
        try:
            now = os.fstat(fd)
            if now.st_size != st.st_size or now.st_mtime_ns != st.st_mtime_ns:
                return None
            # Private: it reads what a shared one would of a file nobody
            # writes, and FUSE files opened with direct_io map only so.
            return _mmap.mmap(fd, 0, flags=_mmap.MAP_PRIVATE, prot=_mmap.PROT_READ)
        except OSError:
            return None
        finally:
            os.close(fd)

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

    def announce_ranges(self, samples):
        """announce_order() for samples that are ranges of files, records
        inside big files: `samples` is a sequence of (path, offset, length)
        (length 0: to the end of the file). For a file cached by extents
        (config `placement.extent_bytes`), Monarch reads ahead the extents
        that hold each record, in that order. FileNotFoundError names a path
        outside the dataset; an offset past a file's end is an error too;
        nothing is announced then."""
        samples = list(samples)
        names, _ = self._name_array([s[0] for s in samples])
        count = len(samples)
        offsets = (ctypes.c_uint64 * max(count, 1))(*[int(s[1]) for s in samples])
        lengths = (ctypes.c_uint64 * max(count, 1))(*[int(s[2]) for s in samples])
        self._announce_ranges_at(ctypes.addressof(names), ctypes.addressof(offsets),
                                 ctypes.addressof(lengths), count)

    def _announce_ranges_at(self, names, offsets, lengths, count):
        """announce_ranges() of arrays its caller made and keeps alive, by
        address: `count` char* (dataset names), and `count` uint64 offsets
        and lengths. monarch.torch builds them with numpy operations over
        tables made once, not a Python object per sample."""
        error = ctypes.c_void_p()
        code = _lib.lib().monarch_announce_ranges(
            self._h(), ctypes.cast(names, ctypes.POINTER(ctypes.c_char_p)),
            ctypes.cast(offsets, ctypes.POINTER(ctypes.c_uint64)),
            ctypes.cast(lengths, ctypes.POINTER(ctypes.c_uint64)), count, ctypes.byref(error))
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
