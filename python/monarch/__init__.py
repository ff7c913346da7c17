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

# The package is the names below; the code lives in private modules, one job each:
#   _monarch.py     Monarch (reads, file objects, namespace, announcements,
#                   stage) and what it returns: StatResult, StageResult
#   _file.py        MonarchFile, what Monarch.open() wraps
#   _errors.py      MonarchError, the monarch_code values, C errors to exceptions
#   _sampling.py    sampled_indices() and MAX_SAMPLED_EPOCHS: the seeded order
#   _progress.py    stage()'s progress display
#   _fast_read.py   read()'s compiled path (_read_bytes.c) and in-place bytes
#   _lib.py         loads libmonarch_c.so and declares the C API for ctypes
#
# Importable from here too, but not by `import *` (hence the noqa): the
# monarch_code values, to compare with MonarchError.code; and for
# monarch.torch, the tests and the benches, _c_name_array, _sampled_order and
# _read_bytes_module (which tells whether read() has its compiled path;
# replacing it here does not switch read(), see _fast_read.py).

from ._errors import (  # noqa: F401
    ABORTED,
    ALREADY_EXISTS,
    CANCELLED,
    DATA_LOSS,
    DEADLINE_EXCEEDED,
    FAILED_PRECONDITION,
    INTERNAL,
    INVALID_ARGUMENT,
    NOT_FOUND,
    OK,
    OUT_OF_RANGE,
    PERMISSION_DENIED,
    RESOURCE_EXHAUSTED,
    UNAVAILABLE,
    UNIMPLEMENTED,
    UNKNOWN,
    MonarchError,
)
from ._fast_read import _read_bytes_module  # noqa: F401
from ._file import MonarchFile
from ._lib import library_path
from ._monarch import Monarch, StageResult, StatResult, _c_name_array  # noqa: F401
from ._sampling import MAX_SAMPLED_EPOCHS, _sampled_order, sampled_indices  # noqa: F401

__all__ = ["Monarch", "MonarchError", "MonarchFile", "StatResult", "StageResult",
           "MAX_SAMPLED_EPOCHS", "library_path", "sampled_indices"]

# Named as monarch's, as before the split: in tracebacks
# ("monarch.MonarchError: ..."), reprs, help() and pickles.
for _public in (Monarch, MonarchError, MonarchFile, StageResult, StatResult, sampled_indices):
    _public.__module__ = __name__
del _public
