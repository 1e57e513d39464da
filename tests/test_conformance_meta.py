"""The conformance suite catches breakage: every deliberately broken backend (conformance.broken.MUTANTS, over the
cpu backend and, where the verb exists, the sycl backend) fails the check it names, the real cpu and sycl backends
pass with their measured numerics inside the bounds, the bounds reject a uniform x1.001 scale, the perf section
counts nothing, a backend that declares nothing fails the minimum bar, one that lacks a required verb fails its checks,
and the residency instruments flag a runtime that lands early.

The table "broken backend -> check that caught it" is printed by ``pytest tests/test_conformance_meta.py -rP -k
table`` (and checked against docs/conformance.md)."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

import numba  # noqa: E402,F401  (the cpu extra: a missing install fails, it does not skip)
from conformance import bounds
from conformance.bar import shortfall
from conformance.broken import MUTANTS, name_of
from tests._extras import missing

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PKG = os.path.join(ROOT, "conformance")
CASES = [(m, b) for m in MUTANTS for b in m.bases]
PARALLEL = 4            # suite runs at once: each mostly waits on start-up (imports, packing, kernel builds)


def _sycl_why():
    from moetier.run.contract import BackendUnavailable
    try:
        from backends.sycl.device import import_dpctl, select_device
        import_dpctl()
        select_device(None)
    except (BackendUnavailable, ImportError) as e:
        return str(e)
    return None


def _cmd(backend, report, select=None, extra=()):
    cmd = [sys.executable, "-m", "pytest", "-p", "conformance.report", PKG, "--backend", backend, "--report",
           str(report), "-q", "-p", "no:cacheprovider", "-o", "addopts=", "-rs", *extra]
    return cmd + (["-k", select] if select else [])


def _run(cwd, backend, select=None, extra=()):
    rep = cwd / f"report-{backend}.json"
    r = subprocess.run(_cmd(backend, rep, select, extra), cwd=cwd, capture_output=True, text=True, timeout=600,
                       env={**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")})
    assert rep.exists(), r.stdout[-3000:] + r.stderr[-2000:]
    return r, json.loads(rep.read_text())


def _fails(data):
    return sorted(c["check"] for c in data["checks"] if c["outcome"] == "fail")


def _select(m) -> str:
    """The mutant's check on its kit's encoding only (the suite's other encodings add time, not coverage of the
    verb): int8, or a check of the exl3 kit's own."""
    return f"{m.check} and not int4g32 and not exl3" if m.enc == "int8" else m.check


@pytest.fixture(scope="module")
def caught(request, tmp_path_factory):
    """{broken backend name: (exit status, failed checks)} of the mutants whose test this session selected (``-k
    fence_never`` runs those alone): the suite's checks, each mutant's own selection, run PARALLEL at a time; the
    sycl mutants are left out (and their tests skip) where SYCL cannot run."""
    sycl_why = _sycl_why()
    chosen = {it.callspec.id for it in request.session.items if it.originalname == "test_broken_backend_is_caught"}
    cases = [(m, b) for m, b in CASES if name_of(m, b) in chosen and (b != "sycl" or sycl_why is None)]

    def one(case):
        m, b = case
        name = name_of(m, b)
        r, data = _run(tmp_path_factory.mktemp(name), name, _select(m))
        return name, (r.returncode, _fails(data), r.stdout[-1500:])

    with ThreadPoolExecutor(PARALLEL) as pool:
        return {"sycl_why": sycl_why, **dict(pool.map(one, cases))}


@pytest.mark.parametrize("mutant, base", CASES, ids=[name_of(m, b) for m, b in CASES])
def test_broken_backend_is_caught(caught, mutant, base):
    name = name_of(mutant, base)
    if base == "sycl" and caught["sycl_why"]:
        missing("sycl", f"the sycl mutants need SYCL: {caught['sycl_why']}")
    rc, fails, tail = caught[name]
    assert any(f.split("[")[0] == mutant.check for f in fails), \
        f"{name} survived: {mutant.check} did not fail (failed: {fails})\n{tail}"
    assert rc == 1, (name, rc, tail)
    print(f"{name} -> {', '.join(fails)}")


def test_table_of_caught_mutants_matches_the_doc(caught):
    """docs/conformance.md lists every broken backend beside the check that catches it, as conformance.broken
    declares and the runs above show."""
    doc = open(os.path.join(ROOT, "docs", "conformance.md"), encoding="utf-8").read()
    rows = dict(re.findall(r"^\| `(broken-[a-z0-9-]+)` \| [^|]+ \| [^|]+ \| `(test_[a-z0-9_]+)` \|$", doc, re.M))
    want = {name_of(m, b): m.check for m, b in CASES}
    assert rows == want, sorted(set(rows.items()) ^ set(want.items()))
    for name, check in sorted(want.items()):
        if name in caught:
            print(f"{name:<38} -> {', '.join(caught[name][1])}")


@pytest.mark.parametrize("backend", ["cpu", "sycl"])
def test_real_backend_passes_with_its_error_beside_the_bounds(tmp_path, backend):
    if backend == "sycl":
        why = _sycl_why()
        if why:
            missing("sycl", f"the sycl backend cannot run here: {why}")
    r, data = _run(tmp_path, backend)
    assert r.returncode == 0 and not _fails(data), r.stdout[-3000:]
    assert data["counts"]["pass"] >= 15 and not data["perf"], data["counts"]
    lanes, encs = data["capabilities"]["lanes"], data["capabilities"]["encodings"]
    assert set(data["numerics"]) == {f"{ln}-{e}" for ln in lanes for e in encs}, sorted(data["numerics"])
    for what, f in data["numerics"].items():
        assert 0 < f["nmse"] < f["nmse_bound"] and abs(f["scale_minus_1"]) < f["scale_bound"], (what, f)
        print(f"{backend} {what}: NMSE {f['nmse']:.3g} (bound {f['nmse_bound']:.3g}), scale-1 "
              f"{f['scale_minus_1']:+.2g} (bound {f['scale_bound']:g})")
    assert all(c["reason"] for c in data["checks"] if c["outcome"] == "skip"), "every skip carries its reason"
    assert f"moetier conformance: backend {backend}" in r.stdout
    assert shortfall(data) is None, "a real backend meets the minimum bar"


@pytest.mark.parametrize("enc", sorted(bounds.BOUNDS))
def test_bounds_reject_a_uniform_scale_of_1_001(enc):
    """Each encoding's bounds fail an output that is the reference x 1.001 and pass one off it by a quarter of the
    scale bound (so the bound is not so tight that only the reference itself passes)."""
    ref = np.random.default_rng(3).standard_normal((8, 256))
    assert bounds.uniform_scale_caught(enc, ref, 1.001)
    assert not bounds.uniform_scale_caught(enc, ref, 1 + bounds.BOUNDS[enc].scale / 4)
    assert bounds.BOUNDS[enc].nmse < 5e-4 / 60, "orders tighter than the old 5e-4"


def test_perf_section_reports_figures_and_counts_nothing(tmp_path):
    r, data = _run(tmp_path, "cpu", "cost_fit or bandwidth or engine_record or fill_lands", ["--perf"])
    assert r.returncode == 0, r.stdout[-3000:]
    perf = {c["check"]: c["outcome"] for c in data["perf"]}
    assert {"test_lane_cost_fit[cpu]", "test_fill_bandwidth", "test_engine_record"} <= set(perf), perf
    assert not any(c["check"] in perf for c in data["checks"]), "a perf check was counted"
    assert sum(data["counts"].values()) == len(data["checks"]) and data["counts"]["pass"] >= 1
    fit = data["costs"]["lanes"]["cpu"]["fit"]                 # unclipped: a negative fit would show here
    assert 0 < fit["per_expert_ms"] < 100, fit
    assert data["costs"]["fill_gbps"] > 0 and data["engine"]["lanes"]["cpu"]["per_expert_ms"] == \
        pytest.approx(fit["per_expert_ms"], abs=1e-5)


def test_declares_nothing_fails_the_minimum_bar_in_one_line(tmp_path):
    rep = tmp_path / "r.json"
    r = subprocess.run([sys.executable, "-m", "moetier", "conformance", "--backend", "broken-declares-nothing",
                        "--report", str(rep)], cwd=tmp_path, capture_output=True, text=True, timeout=600,
                       env={**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")})
    assert r.returncode == 1, (r.returncode, r.stdout[-2000:], r.stderr[-2000:])
    err = r.stderr.strip().splitlines()
    assert len(err) == 1 and "declares no lanes" in err[0] and "Traceback" not in r.stderr, r.stderr
    data = json.loads(rep.read_text())
    assert data["counts"]["pass"] == 0 and data["counts"]["fail"] == 0


def test_a_backend_lacking_a_required_verb_fails_and_is_not_unavailable(tmp_path):
    """A backend the contract's check refuses (ContractError: no compute) is there and broken: its checks fail with
    that line (exit 1), where a missing runtime or device skips them all as UNAVAILABLE (exit 2)."""
    r, data = _run(tmp_path, "broken-lacks-compute", "(fill_lands and int8) or plan_parity")
    assert r.returncode == 1 and data["unavailable"] is None, (r.returncode, data["unavailable"])
    assert _fails(data) == ["test_fill_lands_manifest_bytes[int8]", "test_plan_parity_with_simulator"], _fails(data)
    assert all("lacks compute (required)" in c["reason"] for c in data["checks"]), data["checks"]


def test_markdown_report_shows_the_numerics_beside_their_bounds():
    from conformance.publish import markdown
    f = {"nmse": 6.64e-9, "nmse_bound": bounds.BOUNDS["int8"].nmse, "scale_minus_1": 2.5e-7, "scale_bound": 2e-5,
         "outputs": 9}
    md = markdown({"backend": "cpu", "counts": {"pass": 1}, "checks": [], "numerics": {"cpu-int8": f}})
    assert "| cpu-int8 | 6.64e-09 | 1.19e-07 | +2.5e-07 | 2e-05 |" in md, md
    assert "worst NMSE" not in markdown({"backend": "cpu", "counts": {}, "checks": []})


def test_reference_cache_keys_on_the_whole_input(tmp_path):
    """Two inputs alike in their first 64 bytes (the old cache key) but not after get their own references."""
    from conformance.conftest import Kit
    kit = Kit("cpu", "int8", str(tmp_path))
    try:
        x = np.random.default_rng(0).standard_normal((4, kit.layout.hidden)).astype(np.float32)
        y = x.copy()
        y[-1] *= 2
        a, b = kit.ref(3, x), kit.ref(3, y)
        assert np.array_equal(a[:-1], b[:-1]) and not np.allclose(a[-1], b[-1])
        assert kit.ref(3, x.astype(np.float64)).dtype == np.float64 and len(kit._refs) == 3   # dtype is in the key
    finally:
        kit.close()


def test_minimum_bar_names_the_missing_part():
    cap = {"lanes": ["cpu"]}
    ok = [{"check": c, "outcome": "pass", "reason": ""} for c in
          ("test_numerics_vs_reference[cpu-int8]", "test_fill_lands_manifest_bytes[int8]",
           "test_landed_never_before_readable[int8]", "test_fence_leaves_nothing_pending[int8]",
           "test_residency_rule_under_adversarial_timing")]
    assert shortfall({"backend": "x", "capabilities": cap, "checks": ok}) is None
    for i, part in enumerate(("numerics", "fill", "landed/fence", "landed/fence", "residency")):
        skipped = [dict(c, outcome="skip", reason="NOT_SUPPORTED: why") if j == i else c for j, c in enumerate(ok)]
        why = shortfall({"backend": "x", "capabilities": cap, "checks": skipped})
        assert why and part in why and "NOT_SUPPORTED: why" in why, (part, why)


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
