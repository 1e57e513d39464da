"""Atomic file writes: a temporary file in the destination's folder, fsynced, then renamed over the destination.

Contract: ``atomic_write(path, write)`` calls ``write(f)`` with a binary file object; on any error the temporary
file is removed and the destination is untouched (no half-written record or trace ever exists under its name).
The file gets the usual permissions (0666 minus the umask), not mkstemp's 0600.
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path


def atomic_write(path, write) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix="." + path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return path
