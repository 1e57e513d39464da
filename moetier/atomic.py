"""Atomic file writes: a temporary file in the destination's folder, fsynced, then renamed over the destination.

Contract: ``atomic_write(path, write)`` calls ``write(f)`` with a binary file object; on any error the temporary
file is removed and the destination is untouched (no half-written record or trace ever exists under its name); an
OSError (a full disk, a read-only folder) becomes a one-line UserError naming the file.
``atomic_write_many([(path, write), ...])`` stages every file first and renames them only when all are staged, so
a command that writes several files writes all of them or none (a failure while staging - a full disk, a folder
that is not writable - leaves every destination untouched). ``cannot_write(folder)`` says why a file cannot be
created there (None if it can), for checks made before a command starts its work. The files get the usual
permissions (0666 minus the umask), not mkstemp's 0600. A destination that is a symlink is written through: its
target is replaced and the link kept.
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

from moetier.errors import UserError


def _stage(path: Path, write) -> str:
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
    except BaseException:
        _unlink(tmp)
        raise
    return tmp


def _unlink(tmp: str) -> None:
    try:
        os.unlink(tmp)
    except OSError:
        pass


def cannot_write(folder) -> str | None:
    """Why a file cannot be created in ``folder`` (or its nearest existing parent, for a folder a write would
    create), or None if it can. Tried for real: permission bits say nothing to root or on a read-only mount."""
    folder = Path(folder)
    probe = folder if folder.is_dir() else next((q for q in folder.parents if q.is_dir()), folder)
    try:
        fd, tmp = tempfile.mkstemp(prefix=".moetier-check-", dir=probe)
    except OSError as e:
        return e.strerror or str(e)
    os.close(fd)
    _unlink(tmp)
    return None


def atomic_write(path, write) -> Path:
    return atomic_write_many([(path, write)])[0]


def atomic_write_many(items) -> list[Path]:
    """Stage every (path, write) pair, then rename each over its destination; on a failure while staging, remove
    what was staged and re-raise (no destination changed)."""
    staged: list[tuple[str, Path]] = []
    path = None
    try:
        for path, write in items:
            # through a symlink, as open() would: the link keeps pointing at the new file
            path = Path(os.path.realpath(path)) if os.path.islink(path) else Path(path)
            staged.append((_stage(path, write), path))
        for i, (tmp, path) in enumerate(staged):
            os.replace(tmp, path)
            staged[i] = ("", path)
    except BaseException as e:
        for tmp, _ in staged:
            if tmp:
                _unlink(tmp)
        if isinstance(e, OSError):      # a full disk, a folder gone read-only: the user's to fix, not a bug
            where = path if path is not None else e.filename
            raise UserError(f"{where}: cannot write ({e.strerror or e}); nothing was written") from None
        raise
    return [path for _, path in staged]
