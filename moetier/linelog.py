"""Whole-line appends to a JSON-lines file: a killed writer or a full disk never leaves a torn last line.

Contract: ``LineLog(path, where)`` opens ``path`` for appending (created with the usual permissions; a path that is
not a regular file is a one-line ``UserError`` naming ``where``) and first cuts a torn last line - bytes after the
last newline, left by a writer killed mid-line - so what follows starts on a line of its own. ``append(line)``
writes one line (a str without a newline; the newline is added) with a single ``os.write`` of the whole line to
the ``O_APPEND`` descriptor; a failed or short write truncates the file back to its size before the line and raises
a one-line ``UserError`` naming ``where`` (the lines before it stay whole). ``close()`` is idempotent; a ``LineLog``
is a context manager.
"""
from __future__ import annotations

import os
import stat

from moetier.errors import UserError

_TAIL = 1 << 16


class LineLog:
    def __init__(self, path, where: str):
        self.where = where
        try:
            fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK, 0o666)
        except OSError as e:
            raise UserError(f"{where}: cannot append ({e.strerror or e})") from None
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise UserError(f"{where}: not a regular file (a device, FIFO or folder; expected a file)")
        os.set_blocking(fd, True)
        self._fd = fd
        try:
            self.size = self._cut_torn()
        except OSError as e:
            self.close()
            raise UserError(f"{where}: cannot append ({e.strerror or e})") from None

    def _cut_torn(self) -> int:
        """Truncate after the last newline; the file's size then."""
        end = os.fstat(self._fd).st_size
        pos = end
        while pos > 0:
            start = max(0, pos - _TAIL)
            block = os.pread(self._fd, pos - start, start)
            nl = block.rfind(b"\n")
            if nl >= 0:
                keep = start + nl + 1
                break
            pos = start
        else:
            keep = 0
        if keep != end:
            os.ftruncate(self._fd, keep)
        return keep

    def append(self, line: str) -> None:
        data = (line + "\n").encode("utf-8")
        try:
            n = os.write(self._fd, data)
            if n != len(data):
                raise OSError(28, f"wrote {n} of {len(data)} bytes (disk full?)")
        except OSError as e:
            try:
                os.ftruncate(self._fd, self.size)
            except OSError:
                pass
            raise UserError(f"{self.where}: cannot append ({e.strerror or e}); the lines before this one are "
                            "kept whole") from None
        self.size += n

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
