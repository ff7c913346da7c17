"""How Monarch.read() avoids most of ctypes' cost per sample (measured:
bench/results/python.md).

_read_bytes_module() is the compiled read (monarch._read_bytes: the size, the
new bytes object and the read in one call), bound to the loaded C library.
Without it, read() makes its three calls through ctypes, and on CPython reads
into a new bytes object in place (_new_bytes, _BYTES_DATA_OFFSET) instead of
copying from a buffer. Monarch's module imports these names, so read() finds
them as globals of its own module: no attribute lookup on the read path (and
a test that switches read() to ctypes replaces _read_bytes_module there).
"""

import ctypes
import os
import sys

from . import _lib

_read_bytes_bound = None  # What _read_bytes_module() returns once _read_bytes_tried.
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
    _new_bytes = _BYTES_DATA_OFFSET = None
