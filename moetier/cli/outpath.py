"""Output paths checked before any work: the one gate every flag that writes passes through.

Contract
--------
* ``check(path, flag, kind=FILE)`` returns ``Path(path)`` when a command may write there, else raises ``UserError``
  with one line naming the flag, the path and what was expected. Refused: an empty path; a path over ``PATH_MAX``
  bytes or a name over ``NAME_MAX`` bytes; a symlink loop (or any path ``stat`` cannot follow); an existing path that
  is not a regular file (a directory, a device such as /dev/full, a FIFO, a socket) - for ``kind=FOLDER``, one that
  is not a directory; a parent folder that is missing or not a folder; a parent folder where a file cannot be
  created (tried for real: moetier.atomic.cannot_write).
* ``file_arg(flag)`` / ``folder_arg(flag)`` are argparse types doing the same check at parse time, so a bad path is
  refused before a record, a trace or a store is read. ``registry_arg`` checks ``--registry DIR``: an existing path
  must be a folder (a missing one is created by the first write).
* Nothing here writes: the writes themselves are atomic (moetier.atomic), so a failure mid-way leaves the old file
  or nothing under the name.
"""
from __future__ import annotations

import argparse
import errno
import os
import stat
from pathlib import Path

from moetier.errors import UserError

FILE, FOLDER, REGISTRY = "file", "folder", "registry"
NAME_MAX, PATH_MAX = 255, 4096          # Linux's; pathconf below asks the file system when it can


def _limits(parent: str) -> tuple[int, int]:
    try:
        return os.pathconf(parent, "PC_NAME_MAX"), os.pathconf(parent, "PC_PATH_MAX")
    except (OSError, ValueError):
        return NAME_MAX, PATH_MAX


def _why(path: str, kind: str) -> str | None:
    """Why ``path`` cannot be written as ``kind``, or None."""
    if not path:
        return "an empty path"
    raw = os.fsencode(path)
    parent = os.path.dirname(os.path.abspath(path)) or "/"
    name_max, path_max = _limits(parent if os.path.isdir(parent) else "/")
    if len(raw) >= path_max:
        return f"a path of {len(raw)} bytes (expected under PATH_MAX, {path_max} bytes)"
    longest = max((len(c) for c in raw.split(b"/")), default=0)
    if longest > name_max:
        return f"a name of {longest} bytes (expected at most NAME_MAX, {name_max} bytes, per path component)"
    try:
        st = os.stat(path)
    except FileNotFoundError:
        st = None
    except OSError as e:
        if e.errno == errno.ELOOP:
            return "a symlink loop (expected a path that resolves)"
        if e.errno == errno.ENOTDIR:
            return "a path through something that is not a folder"
        return f"a path that cannot be looked up ({e.strerror})"
    if st is not None:
        if kind == FILE and not stat.S_ISREG(st.st_mode):
            return f"{_what(st.st_mode)} (expected a regular file or a new name)"
        if kind in (FOLDER, REGISTRY) and not stat.S_ISDIR(st.st_mode):
            return f"{_what(st.st_mode)} (expected a folder or a new name)"
    if kind == REGISTRY:
        return None                     # created with its parents by the first write; checked again there
    if not os.path.isdir(parent):
        return f"a missing parent folder {parent} (expected an existing folder)" if not os.path.lexists(parent) \
            else f"a parent {parent} that is not a folder"
    from moetier.atomic import cannot_write
    why = cannot_write(parent)
    if why:
        return f"a folder where nothing can be written ({why})"
    return None


def _what(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "a regular file" if stat.S_ISREG(mode) else "not a regular file"


def check(path, flag: str, kind: str = FILE) -> Path:
    """``Path(path)`` if a command may write there (see the module contract); UserError naming ``flag`` if not."""
    why = _why(os.fspath(path), kind)
    if why:
        raise UserError(f"{flag} {_short(os.fspath(path))}: cannot write there: {why}")
    return Path(path)


def _short(path: str) -> str:
    return path if len(path) <= 80 else f"{path[:40]}...{path[-20:]}"


def _arg(flag: str, kind: str):
    def parse(s: str) -> str:
        why = _why(s, kind)
        if why:
            raise argparse.ArgumentTypeError(f"{_short(s)}: cannot write there: {why}")
        return s
    parse.__name__ = f"a writable {kind} path"
    parse.writes = (flag, kind)         # the hypothesis test finds every writing flag by this mark
    return parse


def file_arg(flag: str):
    """An argparse type: a path a file can be written to (``--out``, ``--plot``, ``--report``, ``--probe``)."""
    return _arg(flag, FILE)


def folder_arg(flag: str):
    """An argparse type: a path a folder can be written to (``store pack --out``)."""
    return _arg(flag, FOLDER)


registry_arg = _arg("--registry", REGISTRY)
