"""Monarch's errors as Python's own exceptions.

The C API returns a monarch_code (the canonical status code) and a message;
_raise() turns that into what a Python programmer expects: a missing file is
FileNotFoundError (errno ENOENT, with the filename); a bad config is
ValueError whose message names the key; a failed read of the source (or
another I/O failure) is OSError with an errno; anything else is MonarchError
(a RuntimeError). The codes are re-exported by the package
(monarch.FAILED_PRECONDITION, ...) for comparing with MonarchError.code.
"""

import errno as _errno
import os

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
