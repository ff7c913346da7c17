"""The progress display of Monarch.stage(): a bar redrawn in place on a
terminal, a line per 10% otherwise, and a summary when staging is done."""

import time


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
