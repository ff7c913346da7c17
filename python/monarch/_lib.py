"""Loads libmonarch_c.so with ctypes and declares the C API's signatures.

Which library: $MONARCH_C_LIBRARY (the ctest suite points it at the build
tree), else the one installed next to this file by `pip install`. The
bundled `monarch` binary is what a client starts as the node service
(`node: {shared: true}` with autostart); the C library finds it through
$MONARCH_BINARY, so that variable is set here when the user has not set it.
"""

import ctypes
import os
import threading

_HERE = os.path.dirname(os.path.abspath(__file__))
_LIB_NAME = "libmonarch_c.so"
_lock = threading.Lock()
_lib = None


def library_path():
    """The libmonarch_c.so this package uses: $MONARCH_C_LIBRARY, else the
    one bundled in the package directory."""
    env = os.environ.get("MONARCH_C_LIBRARY")
    if env:
        if not os.path.isfile(env):
            raise ImportError(f"MONARCH_C_LIBRARY={env} does not exist")
        return os.path.abspath(env)
    bundled = os.path.join(_HERE, _LIB_NAME)
    if os.path.isfile(bundled):
        return bundled
    raise ImportError(
        f"{_LIB_NAME} not found next to {_HERE}: install the package with "
        "`pip install ./python`, or set MONARCH_C_LIBRARY to a built libmonarch_c.so")


def binary_path():
    """The `monarch` command bundled with the package, or None when the
    package runs from a source tree (then $MONARCH_BINARY or the library's
    compiled-in build path is used)."""
    bundled = os.path.join(_HERE, "bin", "monarch")
    return bundled if os.access(bundled, os.X_OK) else None


class SampledOrder(ctypes.Structure):
    """monarch_sampled_order (monarch_c.h): the field order is the ABI."""
    _fields_ = [
        ("seed", ctypes.c_uint64),
        ("first_epoch", ctypes.c_uint64),
        ("epochs", ctypes.c_uint32),
        ("rank", ctypes.c_uint32),
        ("world_size", ctypes.c_uint32),
        ("shuffle", ctypes.c_int32),
        ("drop_last", ctypes.c_int32),
    ]


def _declare(lib):
    c = ctypes
    handle = c.c_void_p
    err = c.POINTER(c.c_void_p)  # char** error: kept as void* so we can free it.
    names = c.POINTER(c.POINTER(c.c_char_p))
    signatures = {
        "monarch_open_yaml_file": (c.c_int, [c.c_char_p, c.POINTER(handle), err]),
        "monarch_open_yaml_string": (c.c_int, [c.c_char_p, c.POINTER(handle), err]),
        "monarch_open_default": (c.c_int, [c.c_char_p, c.POINTER(handle), err]),
        "monarch_open_sharing_node": (c.c_int, [c.c_char_p, c.c_char_p, c.c_char_p,
                                                c.POINTER(handle), err]),
        "monarch_close": (None, [handle]),
        "monarch_read": (c.c_int, [handle, c.c_char_p, c.c_void_p, c.c_size_t, c.c_uint64,
                                   c.POINTER(c.c_size_t), err]),
        "monarch_map_copies": (c.c_int, [handle, c.c_char_p, c.c_void_p, c.c_uint64, c.c_uint64,
                                         c.c_int, c.c_int, c.POINTER(c.c_uint64), err]),
        "monarch_file_size": (c.c_int, [handle, c.c_char_p, c.POINTER(c.c_uint64), err]),
        "monarch_stat": (c.c_int, [handle, c.c_char_p, c.POINTER(c.c_uint64),
                                   c.POINTER(c.c_int64), err]),
        "monarch_file_exists": (c.c_int, [handle, c.c_char_p]),
        "monarch_is_directory": (c.c_int, [handle, c.c_char_p]),
        "monarch_list_directory": (c.c_int, [handle, c.c_char_p, names,
                                             c.POINTER(c.c_size_t), err]),
        "monarch_free_list": (None, [c.POINTER(c.c_char_p), c.c_size_t]),
        "monarch_dataset_root": (c.c_char_p, [handle]),
        "monarch_stats_json": (c.c_void_p, [handle]),
        "monarch_stats_prometheus": (c.c_void_p, [handle]),
        "monarch_wait_for_placement": (None, [handle]),
        "monarch_free": (None, [c.c_void_p]),
        "monarch_path_to_name": (c.c_int, [handle, c.c_char_p, c.POINTER(c.c_void_p)]),
        "monarch_glob": (c.c_int, [handle, c.c_char_p, names, c.POINTER(c.c_size_t), err]),
        "monarch_announce_order": (c.c_int, [handle, c.POINTER(c.c_char_p), c.c_size_t, err]),
        "monarch_announce_ranges": (c.c_int, [handle, c.POINTER(c.c_char_p),
                                              c.POINTER(c.c_uint64), c.POINTER(c.c_uint64),
                                              c.c_size_t, err]),
        "monarch_usable_after_fork": (c.c_int, [handle]),
        "monarch_sampled_epoch": (c.c_int, [c.POINTER(SampledOrder), c.c_uint64, c.c_uint64,
                                            c.POINTER(c.c_uint64), c.c_size_t,
                                            c.POINTER(c.c_size_t), err]),
        "monarch_announce_sampled_order": (c.c_int, [handle, c.POINTER(c.c_char_p), c.c_size_t,
                                                     c.POINTER(SampledOrder), err]),
    }
    for name, (restype, argtypes) in signatures.items():
        fn = getattr(lib, name)
        fn.restype = restype
        fn.argtypes = argtypes
    return lib


def lib():
    """The loaded C library (loaded once per process)."""
    global _lib
    if _lib is None:
        with _lock:
            if _lib is None:
                binary = binary_path()
                if binary is not None and not os.environ.get("MONARCH_BINARY"):
                    os.environ["MONARCH_BINARY"] = binary
                _lib = _declare(ctypes.CDLL(library_path()))
    return _lib


def take_string(ptr):
    """Decodes a malloc'ed C string (a c_void_p value or int) and frees it."""
    if not ptr:
        return ""
    try:
        return ctypes.string_at(ptr).decode("utf-8", "replace")
    finally:
        _lib.monarch_free(ptr)
