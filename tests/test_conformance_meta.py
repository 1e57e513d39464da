"""The conformance suite catches breakage: deliberately broken backends (conformance.broken) fail exactly the
matching checks, the real cpu backend passes, and the residency instruments flag a runtime that lands early."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import numba  # noqa: E402,F401  (the cpu extra: a missing install fails, it does not skip)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PKG = os.path.join(ROOT, "conformance")


def _suite(tmp_path, backend, select=None):
    rep = tmp_path / f"report-{backend}.json"
    cmd = [sys.executable, "-m", "pytest", "-p", "conformance.report", PKG, "--backend", backend, "--report",
           str(rep), "-q", "-p", "no:cacheprovider", "-o", "addopts=", "-rs"]
    if select:
        cmd += ["-k", select]
    r = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=300,
                       env={**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")})
    assert rep.exists(), r.stdout[-3000:] + r.stderr[-2000:]
    data = json.loads(rep.read_text())
    return r, {c["check"]: c["outcome"] for c in data["checks"]}, data


def _fails(outcomes):
    return sorted(k for k, v in outcomes.items() if v == "fail")


def test_cpu_backend_passes_everything(tmp_path):
    r, out, data = _suite(tmp_path, "cpu")
    assert r.returncode == 0, r.stdout[-3000:]
    assert not _fails(out) and data["counts"]["pass"] >= 15
    assert data["engine"]["lanes"]["cpu"]["per_expert_ms"] >= 0
    assert all(c["reason"] for c in data["checks"] if c["outcome"] == "skip"), "every skip carries its reason"
    assert "moetier conformance: backend cpu" in r.stdout and "| skip   | NOT_SUPPORTED" in r.stdout


@pytest.mark.parametrize("backend, select, must_fail, must_pass", [
    ("broken-landed-early", "landed_never or fill_lands or interleaving",
     ["test_landed_never_before_readable[int8]", "test_landed_never_before_readable[int4g32]",
      "test_landed_truthful_under_random_interleaving"],
     ["test_fill_lands_manifest_bytes[int8]"]),
    ("broken-nondeterministic", "deterministic or numerics_vs_reference",
     ["test_deterministic_bit_identical[cpu-int8]", "test_deterministic_bit_identical[cpu-int4g32]"],
     ["test_numerics_vs_reference[cpu-int8]"]),
    ("broken-bytes", "fill_lands or seq_monotonic",
     ["test_fill_lands_manifest_bytes[int8]", "test_fill_lands_manifest_bytes[int4g32]"],
     ["test_seq_monotonic[int8]"]),
    ("broken-seq", "seq_monotonic or fill_lands",
     ["test_seq_monotonic[int8]", "test_seq_monotonic[int4g32]"],
     ["test_fill_lands_manifest_bytes[int8]"]),
])
def test_broken_backend_is_caught(tmp_path, backend, select, must_fail, must_pass):
    r, out, _ = _suite(tmp_path, backend, select)
    assert r.returncode == 1, r.stdout[-3000:]
    for name in must_fail:
        assert out.get(name) == "fail", (backend, name, out)
    for name in must_pass:
        assert out.get(name) == "pass", (backend, name, out)


def test_residency_instruments_flag_an_early_landing(tmp_path, monkeypatch):
    """A runtime that marks keys resident without waiting for the transfer trips the Ledger.land instrument."""
    from conformance.test_residency import Chaos, ResidencyViolation, _Instrumented
    from moetier.run import runtime
    from moetier.core import records as spec
    from moetier.bytes import store
    from moetier.run.registry import get_backend
    from moetier.traces.format import load_trace
    R = spec.resolve("tiny-ci-cpu")
    store.pack(R.model, str(tmp_path / "s"))
    st = store.open_store(str(tmp_path / "s"), model=R.model)
    tr = load_trace(spec.REGISTRY.parent / R.trace, layers=R.layers, experts=R.experts, topk=R.topk)
    be = get_backend("cpu", st, ram_slots=R.ram_slots + 64)
    try:
        chaos = Chaos(be, 0)
        monkeypatch.setattr(runtime.Runtime, "_wait", lambda self, h, *args, **kw: h)   # never waits
        with _Instrumented(chaos), pytest.raises(ResidencyViolation, match="before its fill handle reported landed"):
            runtime.run(R, st, chaos, tr, 1, max_steps=2)
        # and compute() on a slot whose fill was never reported landed; the run above never waited for its reads,
        # so on a slow disk slot 0 may still have one in flight
        be.fence()
        chaos = Chaos(be, 1)
        chaos.fill(0, 0)
        with pytest.raises(ResidencyViolation, match="has not been reported landed"):
            chaos.compute("cpu", [(0, 0, [0])], __import__("numpy").zeros((1, R.model["store"]["hidden"]), "f4"))
        be.fence()
    finally:
        be.close()
