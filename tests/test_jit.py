"""moetier.core.jit: a cached kernel follows a change to a kernel it calls in another module (Numba's own cache does
not), and a process with nothing changed loads it from the cache."""
from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

CALLER = """
from pkgx.callee import value
DECO

@DECO_NAME
def outer():
    return value() + 0
"""
RUN = ("import json, pkgx.caller as c; r = c.outer(); "
       "print(json.dumps([int(r), c.outer.stats.cache_hits and sum(c.outer.stats.cache_hits.values()) or 0]))")


def _package(root: Path, plain: bool) -> None:
    pkg = root / "pkgx"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    deco, name = (("from numba import njit", "njit(cache=True)") if plain
                  else ("from moetier.core.jit import kernel", "kernel"))
    (pkg / "callee.py").write_text(f"{deco}\n\n@{name}\ndef value():\n    return 1\n")
    (pkg / "caller.py").write_text(textwrap.dedent(CALLER).replace("DECO_NAME", name).replace("DECO", deco))


def _run(root: Path, cache: Path) -> list:
    env = dict(os.environ, NUMBA_CACHE_DIR=str(cache), PYTHONPATH=f"{root}{os.pathsep}{REPO}")
    out = subprocess.run([sys.executable, "-c", RUN], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def _edit_callee(root: Path) -> None:
    """The callee returns 2; the caller's file is left exactly as it was, its time stamp included."""
    caller = root / "pkgx" / "caller.py"
    st = caller.stat()
    p = root / "pkgx" / "callee.py"
    p.write_text(p.read_text().replace("return 1", "return 2"))
    os.utime(caller, ns=(st.st_atime_ns, st.st_mtime_ns))


def test_a_callee_changed_in_another_module_is_compiled_afresh(tmp_path, plain=False):
    """``plain=True`` (numba.njit(cache=True)) is the broken variant: it runs the caller's old code, returning 1."""
    _package(tmp_path, plain)
    cache = tmp_path / "cache"
    first = _run(tmp_path, cache)
    assert first == [1, 0]                         # compiled into the empty cache
    assert _run(tmp_path, cache) == [1, 1]         # nothing changed: loaded from the cache
    _edit_callee(tmp_path)
    assert _run(tmp_path, cache)[0] == 2


def test_each_state_of_the_sources_has_its_own_folder(tmp_path, monkeypatch):
    from moetier.core import jit
    _package(tmp_path, plain=False)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(jit, "_DIRS", {})
    importlib.import_module("pkgx")
    a = jit.cache_dir("pkgx.caller")
    assert a.parent == tmp_path / "cache" and a.is_dir()
    _edit_callee(tmp_path)
    jit._DIRS.clear()
    b = jit.cache_dir("pkgx.callee")
    assert b != a and b.parent == a.parent
    sys.modules.pop("pkgx", None)


def test_only_its_own_old_folders_are_removed(tmp_path, monkeypatch):
    """NUMBA_CACHE_DIR may hold other programs' caches: a folder goes only when it is old and marked as made here."""
    from moetier.core import jit
    base = tmp_path / "cache"
    ours, theirs, recent = base / "0123456789abcdef", base / "fedcba9876543210", base / "aaaaaaaaaaaaaaaa"
    for d in (ours, theirs, recent):
        d.mkdir(parents=True)
    (ours / jit.MARK).touch()
    (recent / jit.MARK).touch()
    old = 1_000_000_000
    for d in (ours, theirs):
        os.utime(d, (old, old))
    keep = base / "1111111111111111"
    keep.mkdir()
    jit._prune(base, keep)
    assert not ours.exists() and theirs.exists() and recent.exists() and keep.exists()
