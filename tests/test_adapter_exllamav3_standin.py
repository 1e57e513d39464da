"""The exllamav3 extension stand-in: what the engine finds in it (no torch or engine needed)."""
from __future__ import annotations

import importlib.machinery
import importlib.util
import sys

import pytest

from adapters.exllamav3 import standin


@pytest.fixture
def fresh(monkeypatch):
    monkeypatch.delitem(sys.modules, standin.EXT_NAME, raising=False)
    yield
    sys.modules.pop(standin.EXT_NAME, None)


def test_install_passes_the_engines_compiled_module_check(fresh):
    mod = standin.install()
    assert mod is sys.modules["exllamav3_ext"] and standin.installed()
    assert standin.install() is mod                      # idempotent
    spec = importlib.util.find_spec("exllamav3_ext")     # what exllamav3/ext.py asks
    assert spec.loader is not None and spec.origin.endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES))


def test_flags_bound_classes_and_kernels(fresh):
    ext = standin.install()
    assert ext.HAS_DET_GEMM is False
    bc = ext.BC_BlockSparseMLP(1, 2, act_relu2=False)    # loading a model builds these
    assert isinstance(bc, standin.StandinObject)
    with pytest.raises(standin.StandinCalled, match=r"exllamav3_ext\.BC_BlockSparseMLP\.run_bszN was called"):
        bc.run_bszN(None, None, None)
    with pytest.raises(standin.StandinCalled, match=r"exllamav3_ext\.exl3_moe was called"):
        ext.exl3_moe()
    with pytest.raises(AttributeError):
        ext.__path__                                      # a plain module, not a package


def test_a_real_extension_is_never_replaced(fresh, monkeypatch):
    import types
    real = types.ModuleType("exllamav3_ext")
    monkeypatch.setitem(sys.modules, "exllamav3_ext", real)
    assert standin.real_extension_available() and standin.install() is None
    assert sys.modules["exllamav3_ext"] is real and not standin.installed()
