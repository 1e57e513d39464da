"""A stand-in for exllamav3's compiled extension, so that its Python layer imports on a machine without CUDA.

Contract
--------
``install()`` puts a module named ``exllamav3_ext`` into ``sys.modules`` unless a real compiled one is importable
(then it does nothing and returns None). exllamav3 1.6.5's ``ext.py`` imports the compiled module only when
``importlib.util.find_spec`` gives an origin with an extension suffix and a loader, so the stand-in's spec carries an
``ExtensionFileLoader`` and an origin ending in ``.so`` (reference adapters.md, section 7). Every attribute the engine
asks for is an inert callable that returns None and records its name in ``calls``; the ``HAS_*`` feature flags are
False. Nothing here computes: code that needs a kernel's result must not reach one (the adapter's CPU tests replace
the few they drive with named fakes).
"""
from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
import types

NAME = "exllamav3_ext"
ORIGIN = "/nonexistent/exllamav3_ext-standin.so"


class Inert:
    """One extension function: accepts anything, does nothing, returns None (and is counted)."""

    def __init__(self, module, name: str):
        self._module, self.__name__ = module, name

    def __call__(self, *args, **kwargs):
        self._module.calls.append(self.__name__)
        return None

    def __repr__(self) -> str:
        return f"<stand-in {NAME}.{self.__name__}>"


def is_standin(module) -> bool:
    return getattr(module, "__standin__", False) is True


def real_extension_available() -> bool:
    """A compiled exllamav3_ext is importable (a GPU machine with the engine built): never replace it."""
    mod = sys.modules.get(NAME)
    if mod is not None:
        return not is_standin(mod)
    try:
        spec = importlib.util.find_spec(NAME)
    except (ImportError, ValueError):
        return False
    return bool(spec and spec.origin and spec.loader and
                any(spec.origin.endswith(s) for s in importlib.machinery.EXTENSION_SUFFIXES))


def install():
    """The stand-in module (installed now or before), or None where the real extension is importable."""
    mod = sys.modules.get(NAME)
    if mod is not None:
        return mod if is_standin(mod) else None
    if real_extension_available():
        return None
    mod = types.ModuleType(NAME, "stand-in for exllamav3's compiled extension (moetier adapters.exllamav3.standin)")
    mod.__spec__ = importlib.machinery.ModuleSpec(
        NAME, importlib.machinery.ExtensionFileLoader(NAME, ORIGIN), origin=ORIGIN)
    mod.__file__ = ORIGIN
    mod.__standin__ = True
    mod.calls = []

    def __getattr__(name: str):
        if name.startswith("__"):          # inspect and importlib probe dunders; they must not exist
            raise AttributeError(name)
        if name.startswith("HAS_"):        # feature flags of the build: none
            return False
        fn = Inert(mod, name)
        setattr(mod, name, fn)
        return fn

    mod.__getattr__ = __getattr__
    sys.modules[NAME] = mod
    return mod
