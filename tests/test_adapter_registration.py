"""The engine adapters register as moetier backends through the ``moetier.backends`` entry points that moetier's
pyproject.toml declares (the adapters ship in moetier's wheel; their engines are optional extras), so that
``moetier conformance --backend exl3xpu|exllamav3`` finds them with nothing edited in moetier.

A source checkout run from PYTHONPATH has no installed metadata, so the fixture installs the declared entry points as
a distribution (a dist-info directory on sys.path, what ``pip install`` writes)."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from moetier.run import registry

ROOT = Path(__file__).resolve().parents[1]
ADAPTERS = {"exl3xpu": "adapters.exl3xpu.backend:open_backend",
            "exllamav3": "adapters.exllamav3.backend:open_backend"}


def declared() -> dict:
    """The ``moetier.backends`` table of pyproject.toml (name = "target" lines; tomllib is Python 3.11+ only)."""
    out, inside = {}, False
    for line in (ROOT / "pyproject.toml").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line.startswith("["):
            inside = line == '[project.entry-points."moetier.backends"]'
        elif inside and "=" in line:
            name, target = (v.strip() for v in line.split("=", 1))
            out[name] = target.strip('"')
    return out


@pytest.fixture
def installed(install_distribution):
    """moetier's declared moetier.backends entry points of the adapters, installed as a distribution on sys.path."""
    return install_distribution("moetier-entry-points",
                                {"moetier.backends": {k: v for k, v in declared().items() if k in ADAPTERS}})


def test_pyproject_declares_both_adapters():
    eps = declared()
    assert {k: eps.get(k) for k in ADAPTERS} == ADAPTERS


def test_the_entry_points_resolve_to_the_adapters_factories(installed):
    from adapters.exl3xpu.backend import open_backend as xpu
    from adapters.exllamav3.backend import open_backend as exl
    assert set(ADAPTERS) <= set(registry.names())
    assert registry.factory("exl3xpu") is xpu and registry.factory("exllamav3") is exl


def conformance(site, backend: str, tmp_path, select: str):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(ROOT), os.environ.get("PYTHONPATH", "")])}
    rep = tmp_path / f"rep-{backend}.json"
    r = subprocess.run([sys.executable, "-m", "moetier", "conformance", "--backend", backend, "-k", select,
                        "--report", str(rep)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    return r, (json.loads(rep.read_text()) if rep.exists() else None)


def test_conformance_runs_on_the_exl3xpu_backend(installed, tmp_path):
    """exl3xpu runs here on moetier's provider of its ops: every lane, transfers and the residency rule."""
    pytest.importorskip("safetensors", reason="the conformance kits need the test extra")
    r, rep = conformance(installed, "exl3xpu", tmp_path,
                         "seq_monotonic or fill_lands or push_lands or expert_vs_float64")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    got = {row["check"]: row["outcome"] for row in rep["checks"]}
    assert rep["counts"]["fail"] == 0 and rep["counts"]["pass"] >= 6, rep["counts"]
    assert rep["capabilities"]["name"] == "exl3xpu" and rep["capabilities"]["device"].startswith("exl3xpu ops: ")
    assert all(got[f"test_exl3_expert_vs_float64[{ln}]"] == "pass" for ln in ("cpu", "zerocopy", "gpu")), got
    assert got["test_seq_monotonic[exl3]"] == "pass", got


def test_conformance_on_the_exllamav3_backend_runs_or_names_the_missing_engine(installed, tmp_path):
    """Where torch and exllamav3 import (the exllamav3 extra), the suite runs on its cpu lane and transfers; where
    they do not, nothing runs and the one line (exit 2) names what is missing."""
    r, rep = conformance(installed, "exllamav3", tmp_path, "seq_monotonic or fill_lands or expert_vs_float64")
    engine = all(importlib.util.find_spec(m) is not None for m in ("torch", "exllamav3"))
    if engine:
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
        assert rep["counts"]["fail"] == 0 and rep["counts"]["pass"] >= 3, rep["counts"]
        assert rep["capabilities"]["lanes"] == ["cpu"]
    else:
        assert r.returncode == 2, r.stdout[-2000:] + r.stderr[-2000:]
        line = r.stderr.strip().splitlines()[-1]
        assert line.startswith("moetier: error: conformance: nothing could run: exllamav3 backend: ")
        assert ("exllamav3 is not installed" in line or "torch" in line), line


def test_an_unattached_exllamav3_backend_offers_only_its_cpu_lane(tmp_path):
    """exllamav3's kernels compute gpu/zerocopy picks inside an attached model; alone, the backend refuses them
    with the reason (and it computes exl3 only)."""
    pytest.importorskip("torch", reason="the exllamav3 backend's slots are torch tensors (the exllamav3 extra)")
    from adapters.exllamav3.backend import EngineBackend
    from moetier.bytes import store
    from moetier.run.contract import BackendUnavailable
    model = {"id": "m", "moe": {"layers": 1, "experts": 2, "topk": 1}, "store": {"hidden": 64, "ffn": 64,
                                                                                  "encoding": "int8"}}
    store.pack(model, tmp_path / "s")
    be = EngineBackend(store.open_store(tmp_path / "s"), ram_slots=2, vram_slots=1, lanes=("cpu",), any_store=True)
    try:
        assert be.capabilities.lanes == {"cpu"} and be.capabilities.encodings == {"exl3"}
        be.wait(be.fill(1, 0))
        with pytest.raises(BackendUnavailable, match=r"holds 'int8' records; its lanes compute 'exl3' only"):
            be.compute("cpu", [(1, 0, [0])], np.zeros((1, 64), np.float32))
    finally:
        be.close()
