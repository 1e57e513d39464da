"""A stand-in for exllamav3's compiled extension, so that its Python layer imports on a machine without CUDA.

Contract
--------
``install()`` puts a module named ``exllamav3_ext`` into ``sys.modules`` unless a real compiled one is importable
(then it does nothing and returns None) and returns it (idempotent). exllamav3 1.6.5's ``ext.py`` imports the
compiled module only when ``importlib.util.find_spec`` gives an origin with an extension suffix and a loader, so the
stand-in's spec carries an ``ExtensionFileLoader`` and an origin ending in ``.so`` (reference adapters.md, section 7).

What the engine finds there:

* ``HAS_*`` build flags: False;
* ``BC_*`` (the engine's bound C++ classes, built at load time): constructing one succeeds and gives a
  ``StandinObject`` (loading a model builds them); calling any of its methods raises ``StandinCalled``;
* every other name is a kernel: calling it raises ``StandinCalled`` naming it, so a path that would have reached a
  CUDA kernel fails loudly instead of returning garbage.

Code that drives the engine on a CPU sets the few kernels it needs on the module, as named fakes (the adapter's
tests do). ``installed()`` says whether the module registered as exllamav3_ext is this stand-in. Importing this
module imports neither torch nor exllamav3.
"""
from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
import types

EXT_NAME = NAME = "exllamav3_ext"
_MARK = "__moetier_standin__"
ORIGIN = f"<moetier-standin>/{EXT_NAME}{importlib.machinery.EXTENSION_SUFFIXES[0]}"


class StandinCalled(RuntimeError):
    """An exllamav3 code path called into the compiled extension, which the stand-in does not provide."""


def _kernel(name: str):
    def call(*args, **kwargs):
        raise StandinCalled(f"{EXT_NAME}.{name} was called, but the compiled extension is a stand-in (no CUDA "
                            "here): only exllamav3's torch-only code can run")
    call.__name__ = name
    return call


class StandinObject:
    """An instance of one of the extension's bound classes: it exists; running it raises StandinCalled."""

    def __init__(self, cls: str, *args, **kwargs):
        self._cls = cls

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return _kernel(f"{self._cls}.{name}")

    def __repr__(self) -> str:
        return f"<stand-in {EXT_NAME}.{self._cls}>"


def _bound_class(name: str):
    def make(*args, **kwargs):
        return StandinObject(name, *args, **kwargs)
    make.__name__ = name
    return make


def _module_getattr(name: str):
    if name.startswith("__"):          # inspect and importlib probe dunders; they must not exist
        raise AttributeError(name)
    if name.startswith("HAS_"):
        return False
    if name.startswith("BC_"):
        return _bound_class(name)
    return _kernel(name)


def installed() -> bool:
    """True when the module registered as exllamav3_ext is this stand-in."""
    return bool(getattr(sys.modules.get(EXT_NAME), _MARK, False))


def real_extension_available() -> bool:
    """A compiled exllamav3_ext is imported or importable (a machine with the engine built): never replace it."""
    mod = sys.modules.get(EXT_NAME)
    if mod is not None:
        return not installed()
    try:
        spec = importlib.util.find_spec(EXT_NAME)
    except (ImportError, ValueError):
        return False
    return bool(spec and spec.origin and spec.loader and
                any(spec.origin.endswith(s) for s in importlib.machinery.EXTENSION_SUFFIXES))


def install() -> types.ModuleType | None:
    """The stand-in module (installed now or before), or None where a real extension is imported or importable."""
    if installed():
        return sys.modules[EXT_NAME]
    if real_extension_available():
        return None
    mod = types.ModuleType(EXT_NAME, "moetier stand-in for exllamav3's compiled extension")
    mod.__spec__ = importlib.machinery.ModuleSpec(
        EXT_NAME, importlib.machinery.ExtensionFileLoader(EXT_NAME, ORIGIN), origin=ORIGIN)
    mod.__file__ = ORIGIN
    mod.__getattr__ = _module_getattr
    setattr(mod, _MARK, True)
    sys.modules[EXT_NAME] = mod
    return mod
