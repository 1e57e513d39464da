"""Bounded reads of user-named files.

Contract: ``open_regular(path, where, max_bytes)`` opens ``path`` for binary reading only when it is a regular file
of at most ``max_bytes`` (a device such as /dev/zero or a FIFO may never end, and opening a FIFO would block: it is
opened without blocking and refused). Anything else is a one-line ``UserError`` naming ``where``; a missing file
raises ``FileNotFoundError`` for the caller to word.
"""
from __future__ import annotations

import os
import stat

from moetier.errors import UserError


def open_regular(path, where: str, max_bytes: int, mode: str = "rb"):
    """A binary file object of a regular file of at most ``max_bytes`` (see the module contract)."""
    flags = (os.O_RDWR if "+" in mode else os.O_RDONLY) | os.O_NONBLOCK
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise
    except OSError as e:
        raise UserError(f"{where}: cannot read ({e.strerror or e})") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise UserError(f"{where}: not a regular file (a device, FIFO or folder; expected a file)")
    if st.st_size > max_bytes:
        os.close(fd)
        raise UserError(f"{where}: {st.st_size:,} bytes, over the {max_bytes:,} this input may have")
    os.set_blocking(fd, True)
    return os.fdopen(fd, mode)
