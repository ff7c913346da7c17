"""MonarchFile: the raw file object that Monarch.open() returns (inside an
io.BufferedReader); it reads through the Monarch that opened it."""

import errno as _errno
import io
import os


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
