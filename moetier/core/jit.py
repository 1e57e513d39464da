"""Numba's ``njit`` for moetier's kernels, with an on-disk cache that follows every source a kernel may call.

Contract
--------
``kernel(fn)`` or ``kernel(**options)(fn)`` is ``numba.njit(cache=True, **options)(fn)`` with the cache in a folder
of its own: ``<base>/<digest>``, where ``digest`` hashes the numba version and every ``.py`` file of the package
``fn`` is defined in (all of moetier, all of backends), and ``base`` is ``NUMBA_CACHE_DIR`` when it is set, else the
user's cache folder (``$XDG_CACHE_HOME`` or ``~/.cache``) ``/moetier/numba``.

Why: Numba's own cache keys a kernel's machine code on the kernel's source file alone, so a kernel that calls (and
inlines) a kernel of another module keeps running the old code after that module changes (numba issue #1833: the
ledger's compiled commit calls the LFU policy's kernels, the planner's kernel the lanes' and the arrivals'). Here a
change to any source of the package compiles afresh into a new folder. A folder is touched when a process first
uses it, and a folder of this base unused for ``KEEP_DAYS`` is removed when a new one is made. Where the folder
cannot be made, Numba falls back to its own cache locations.
"""
from __future__ import annotations

import os
import shutil
import sys
import time
from pathlib import Path

import numba
import xxhash
from numba import njit

__all__ = ["kernel", "cache_dir"]

KEEP_DAYS = 30
MARK = "moetier-kernels"                 # the file that marks a folder as made here
_DIRS: dict = {}


def _base() -> Path:
    env = os.environ.get("NUMBA_CACHE_DIR")
    if env:
        return Path(env)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "moetier" / "numba"


def _digest(root: Path) -> str:
    h = xxhash.xxh3_64(numba.__version__.encode())
    for p in sorted(root.rglob("*.py")):
        h.update(str(p.relative_to(root)).encode() + b"\0")
        h.update(p.read_bytes())
    return h.hexdigest()


def _prune(base: Path, keep: Path) -> None:
    """Folders of ``base`` unused for KEEP_DAYS: another version's or an edited tree's kernels. Only folders this
    module made (its MARK inside) go: ``NUMBA_CACHE_DIR`` may be shared with other programs' caches."""
    old = time.time() - KEEP_DAYS * 86400
    for d in base.iterdir():
        if d != keep and (d / MARK).is_file() and d.stat().st_mtime < old:
            shutil.rmtree(d, ignore_errors=True)


def cache_dir(module: str) -> Path:
    """The cache folder of the kernels of ``module`` (a module name): one per package and state of its sources."""
    top = module.partition(".")[0]
    out = _DIRS.get(top)
    if out is None:
        root = Path(sys.modules[top].__file__).resolve().parent
        base = _base()
        out = base / _digest(root)
        try:
            fresh = not out.exists()
            out.mkdir(parents=True, exist_ok=True)
            (out / MARK).touch()
            os.utime(out)
            if fresh:
                _prune(base, out)
        except OSError:
            pass                           # numba's own locations take over (its locator checks the folder)
        _DIRS[top] = out
    return out


def kernel(fn=None, **options):
    """``numba.njit(cache=True, **options)`` with the cache in ``cache_dir(fn.__module__)`` (module docstring)."""
    if fn is None:
        return lambda f: kernel(f, **options)
    # numba picks a function's cache folder when caching is enabled, at decoration: set it for this one only
    saved = numba.config.CACHE_DIR
    numba.config.CACHE_DIR = str(cache_dir(fn.__module__))
    try:
        return njit(cache=True, **options)(fn)
    finally:
        numba.config.CACHE_DIR = saved
