"""The door for outside backend authors: the contract's required/optional split with its defaults, options passed
only where a factory takes them, SequencedBackend's explicit parts, the public slot pool protocol over a foreign
buffer, records shipped by a backend package, the markdown report, and the template package passing the suite."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conformance import capabilities
from conformance.publish import markdown
from moetier.bytes import store
from moetier.bytes.transport import BufferSlotPool, Reader
from moetier.core import records as spec
from moetier.run import contract, registry
from moetier.run.contract import BackendUnavailable, Capabilities, ContractError
from moetier.run.events import SequencedBackend

ROOT = Path(__file__).resolve().parents[1]
TEMPLATE = ROOT / "examples" / "backend-template"


class _Minimal:
    """A test fake: exactly the required verbs, doing nothing."""

    def __init__(self, vram_slots=0):
        self.capabilities = Capabilities("fake-min", "none", frozenset({"cpu"}), frozenset({"int8"}), vram_slots)
        self.ram_slot_count = 1

    def compute(self, lane, jobs, x): return {}
    def fill(self, key, slot, *, prefetch=False): return None
    def landed(self, h): return True
    def wait(self, h): return h
    def fence(self): pass
    def completed_seq(self): return 0
    def close(self): pass


def test_check_binds_every_optional_default_and_names_missing_required_verbs():
    be = contract.check(_Minimal())
    assert be.cancel(object()) is False and (be.workers, be.parallel_min) == (1, 0) and be.stats == {}
    assert be.read_timing() == {"latency_by_qd": {}, "wake_ms": [], "burst_ms": []} and be.begin_measured() is None
    with pytest.raises(BackendUnavailable, match="no VRAM tier"):
        be.push(0, 0, 0)
    with pytest.raises(BackendUnavailable, match="no router"):
        be.route(0, np.zeros((1, 4), np.float32))
    del _Minimal.compute
    try:
        with pytest.raises(ContractError, match=r"lacks compute \(required\)"):
            contract.check(_Minimal(), "fake-min")
    finally:
        _Minimal.compute = lambda self, lane, jobs, x: {}
    with pytest.raises(ContractError, match="lacks push, drain"):     # a VRAM tier makes them required
        contract.check(_Minimal(vram_slots=4))
    uncallable = _Minimal()
    uncallable.fence = None                                           # there, but not a verb
    with pytest.raises(ContractError, match=r"lacks fence \(required\)"):
        contract.check(uncallable, "fake-min")


def test_registry_passes_only_the_options_a_factory_takes():
    def narrow(store, *, ram_slots, vram_slots=0):
        return None

    def wide(store, *, ram_slots, vram_slots=0, **options):
        return None

    assert registry.accepted(narrow, "n", {"verify_rate": 1.0, "faults": None}) == {}
    with pytest.raises(BackendUnavailable, match="takes no verify_rate= option"):
        registry.accepted(narrow, "n", {"verify_rate": 0.5})
    assert registry.accepted(wide, "w", {"verify_rate": 0.5}) == {"verify_rate": 0.5}


def test_sequenced_backend_says_what_it_needs():
    class Forgot(SequencedBackend):
        def __init__(self):
            pass                   # never hands over events / reader / router

    with pytest.raises(AttributeError, match=r"SequencedBackend needs self.events; call SequencedBackend.__init__"):
        Forgot().completed_seq()


@pytest.fixture(scope="module")
def tiny_store(tmp_path_factory):
    R = spec.resolve("tiny-ci-cpu")
    d = tmp_path_factory.mktemp("door") / "store"
    store.pack(R.model, str(d))
    return store.open_store(str(d), model=R.model)


def test_the_reader_fills_a_foreign_buffer_through_the_public_pool_protocol(tiny_store):
    """A device's host memory (here a page-aligned numpy array) as a slot pool: real O_DIRECT reads land there."""
    st = tiny_store
    n, rb = 3, int(st.record_bytes)
    raw = np.zeros(n * (-(-rb // 4096) * 4096) + 4096, np.uint8)
    off = (-raw.ctypes.data) % 4096
    pool = BufferSlotPool(raw, n, rb, raw.ctypes.data + off, offset=off)
    with Reader(st, pool, verify_rate=1.0) as rd:
        rd.wait(rd.fill(5, 2))
        with open(st.data_path, "rb") as f:
            f.seek(st.offset(5))
            want = np.frombuffer(f.read(rb), np.uint8)
        assert np.array_equal(pool.view(2)[:rb], want) and rd.stats["checksum_checked"] == 1
    pool.zero(2)
    assert not pool.view(2).any()
    with pytest.raises(ValueError, match="slot index 3 out of range"):
        pool.check_index(3)


def test_a_backend_package_ships_its_ci_recipe(install_distribution, tmp_path, monkeypatch):
    monkeypatch.setenv("MOETIER_REGISTRY", str(tmp_path / "user"))
    assert capabilities.recipe_id("pkgdev") == "tiny-ci-cpu"          # without the package: the fallback
    reg = tmp_path / "pkg-registry" / "recipe"
    reg.mkdir(parents=True)
    rec = json.loads((spec.REGISTRY / "recipe" / "tiny-ci-cpu.json").read_text())
    (reg / "tiny-ci-pkgdev.json").write_text(json.dumps({**rec, "id": "tiny-ci-pkgdev"}))
    install_distribution("pkgdev-records", {"moetier.registries": {"pkgdev": "pkgdev_records:folder"}},
                         {"pkgdev_records.py": f"def folder():\n    return {str(reg.parent)!r}\n"})
    spec.package_registries.cache_clear()
    try:
        assert capabilities.recipe_id("pkgdev") == "tiny-ci-pkgdev"
        assert spec.resolve("tiny-ci-pkgdev").id == "tiny-ci-pkgdev"
        user = tmp_path / "user" / "recipe"                          # the user registry provides one too
        user.mkdir(parents=True)
        (user / "tiny-ci-userdev.json").write_text(json.dumps({**rec, "id": "tiny-ci-userdev"}))
        assert capabilities.recipe_id("userdev") == "tiny-ci-userdev"
    finally:
        spec.package_registries.cache_clear()


def test_markdown_report_lists_failures_first_with_reasons():
    rep = {"backend": "x", "capabilities": None, "unavailable": None, "counts": {"pass": 1, "fail": 1, "skip": 1},
           "checks": [{"check": "a", "outcome": "pass", "reason": "", "seconds": 0.1},
                      {"check": "b", "outcome": "skip", "reason": "NOT_SUPPORTED: no | gpu", "seconds": 0},
                      {"check": "c", "outcome": "fail", "reason": "assert 1 == 2", "seconds": 0.2}]}
    md = markdown(rep)
    rows = [ln for ln in md.splitlines() if ln.startswith("| `")]
    assert [r.split("`")[1] for r in rows] == ["c", "a", "b"]
    assert "2 checks ran: 1 passed, 1 failed; 1 skipped" in md and "no \\| gpu" in md


def test_the_template_package_passes_the_suite_from_its_own_records(tmp_path):
    """The template as an installed distribution (its entry points in a dist-info beside its folder): conformance
    finds the backend and its tiny-ci-template recipe, and the checks that ran pass."""
    site = tmp_path / "site"
    info = site / "moetier_backend_template-0.1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: moetier-backend-template\nVersion: 0.1.0\n")
    import tomllib
    eps = tomllib.loads((TEMPLATE / "pyproject.toml").read_text())["project"]["entry-points"]
    (info / "entry_points.txt").write_text("".join(f"[{g}]\n" + "".join(f"{k} = {v}\n" for k, v in e.items())
                                                   for g, e in eps.items()))
    env = {**os.environ, "MOETIER_REGISTRY": str(tmp_path / "user"),
           "PYTHONPATH": os.pathsep.join([str(site), str(TEMPLATE), str(ROOT), os.environ.get("PYTHONPATH", "")])}
    r = subprocess.run([sys.executable, "-m", "moetier", "conformance", "--backend", "template", "-k",
                        "numerics or fill_lands or seq_monotonic or plan_parity", "--report", str(tmp_path / "r.json"),
                        "--md", str(tmp_path / "r.md")], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    rep = json.loads((tmp_path / "r.json").read_text())
    ran = {c["check"] for c in rep["checks"] if c["outcome"] == "pass"}
    assert rep["counts"]["fail"] == 0 and "test_plan_parity_with_simulator" in ran
    assert "test_numerics_vs_reference[cpu-int8]" in ran and "test_fill_lands_manifest_bytes[int8]" in ran
    assert "| `test_plan_parity_with_simulator` | pass |" in (tmp_path / "r.md").read_text()


def test_the_contract_page_names_every_verb_the_code_declares():
    page = (ROOT / "docs" / "backend-contract.md").read_text()
    names = (contract.REQUIRED + contract.VRAM_REQUIRED + tuple(contract.OPTIONAL) + tuple(contract.TELEMETRY)
             + contract.TEST_HOOKS + tuple(contract.OPTIONS))
    assert not [n for n in names if f"`{n}" not in page], "docs/backend-contract.md lacks some of the contract"
