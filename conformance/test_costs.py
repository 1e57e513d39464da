"""The perf section (``--perf``; every check here is marked ``perf``): measured costs per lane per_layer /
per_expert / per_extra_token (least squares over experts x rows, the engine record's lane cost model), fill and
push GB/s, as a validated engine record: written beside the report only with --report, and to
registry/engine/<ID>.json only with --write-engine ID. Figures, never a verdict: the report keeps these checks apart
and does not count them."""
from __future__ import annotations

import datetime as _dt
import os
import platform
import time

import numpy as np
import pytest

from conformance import capabilities as caps
from conformance import report
from conformance.conftest import NK, RAM_SCRATCH, VRAM_SCRATCH, fence_within, first_kit
from moetier.run.contract import LANES

EXPERTS = (1, 2, 4, 8, 16)
ROWS = (1, 2, 4, 8)
REPEATS = 5
pytestmark = pytest.mark.perf


def _costs() -> dict:
    return report.STATE.setdefault("costs", {})


@pytest.mark.parametrize("lane", LANES)
def test_lane_cost_fit(kits, lane):
    kit = first_kit(kits)
    why = caps.lane_skip(kit.be, lane)
    if why:
        pytest.skip(why)
    be, lay = kit.be, kit.layout
    rng = np.random.default_rng(0)
    A, y, samples = [], [], []
    be.compute(lane, [(k, k, [0]) for k in range(NK)], rng.standard_normal((1, lay.hidden)).astype(np.float32))
    for n in EXPERTS:
        for m in ROWS:
            x = rng.standard_normal((m, lay.hidden)).astype(np.float32)
            jobs = [(k % NK, k % NK, list(range(m))) for k in range(n)]
            times = []
            for _ in range(REPEATS):
                t0 = time.perf_counter()
                be.compute(lane, jobs, x)
                times.append((time.perf_counter() - t0) * 1e3)
            ms = float(np.median(times))
            A.append([1.0, n, n * (m - 1)])
            y.append(ms)
            samples.append({"experts": n, "rows": m, "ms": round(ms, 5)})
    coef, *_ = np.linalg.lstsq(np.array(A), np.array(y), rcond=None)
    assert np.isfinite(coef).all(), coef
    fit = dict(zip(("per_layer_ms", "per_expert_ms", "per_extra_token_ms"), (float(c) for c in coef)))
    # the engine record's terms cannot be negative; the unclipped fit stays beside them, so a fit that went
    # negative shows
    _costs().setdefault("lanes", {})[lane] = {
        "reads": "vram" if lane == "gpu" else "ram", **{k: max(0.0, v) for k, v in fit.items()}, "fit": fit,
        "samples": samples}


def _gbps(be, issue, n, rb):
    t0 = time.perf_counter()
    hs = [issue(i) for i in range(n)]
    for h in hs:
        be.wait(h)
    fence_within(be)
    return n * rb / (time.perf_counter() - t0) / 1e9


def test_fill_bandwidth(kits):
    kit = first_kit(kits)
    be, rb = kit.be, kit.rb
    c = _costs()
    c["record_bytes"] = rb
    c["encoding"] = kit.enc
    c["fill_gbps"] = max(_gbps(be, lambda i: be.fill(i % NK, NK + i % RAM_SCRATCH), RAM_SCRATCH, rb)
                         for _ in range(3))
    assert 0 < c["fill_gbps"] < 1e4, c["fill_gbps"]     # finite, positive: the handles really completed


def test_push_bandwidth(kits):
    kit = first_kit(kits)
    be, rb = kit.be, kit.rb
    why = caps.vram_skip(be, NK + VRAM_SCRATCH)
    if why:
        pytest.skip(why)
    _costs()["push_gbps"] = max(_gbps(be, lambda i: be.push(i % NK, i % NK, NK + i % VRAM_SCRATCH),
                                      4 * VRAM_SCRATCH, rb) for _ in range(3))
    assert 0 < _costs()["push_gbps"] < 1e4


def engine_record(eid: str, costs: dict, backend: str, device: str) -> dict:
    lanes = {}
    for lane, f in sorted(costs.get("lanes", {}).items()):
        lanes[lane] = {"reads": f["reads"], "per_layer_ms": round(f["per_layer_ms"], 5),
                       "per_expert_ms": round(f["per_expert_ms"], 5),
                       "per_extra_token_ms": round(f["per_extra_token_ms"], 5),
                       "note": f"measured by moetier conformance ({costs.get('encoding', 'int8')}, tiny H256 F128 "
                               f"experts)"}
    ov = {"fill_gbps": round(costs["fill_gbps"], 3)} if costs.get("fill_gbps") else {}
    if costs.get("push_gbps"):
        ov["push_gbps"] = round(costs["push_gbps"], 3)
    when = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    rec = {"id": eid, "lanes": lanes,
           "source": f"moetier conformance --backend {backend} {when} on {platform.node()} ({device}): least-squares "
                     f"fit over experts {list(EXPERTS)} x rows {list(ROWS)}, median of {REPEATS}, "
                     f"{costs.get('record_bytes', 0)} B records"}
    if ov:
        rec["overheads"] = ov
    return rec


def test_engine_record(kits, backend_name):
    """The measured costs as an engine record: validated by moetier.spec; written next to the report (if any)."""
    from moetier import strictjson
    from moetier.atomic import atomic_write
    from moetier.core import records as spec
    first_kit(kits)                                    # skips with the reason when the backend is unavailable
    c = _costs()
    if not c.get("lanes"):
        pytest.skip("no lane cost was measured (run without -k filtering out test_lane_cost_fit)")
    eid = report.STATE.get("write_engine") or f"conformance-{backend_name}"
    dev = (report.STATE.get("capabilities") or {}).get("device", "?")
    rec = engine_record(eid, c, backend_name, dev)
    spec.validate("engine", rec, f"engine-{eid}.json")
    report.STATE["engine"] = rec
    if report.STATE.get("report"):                  # beside the report only when one was asked for
        out_dir = os.path.dirname(os.path.abspath(report.STATE["report"]))
        path = os.path.join(out_dir, f"engine-{eid}.json")
        os.makedirs(out_dir, exist_ok=True)
        text = strictjson.dumps(rec, indent=2) + "\n"
        atomic_write(path, lambda f: f.write(text.encode("utf-8")))
        report.STATE["engine_path"] = path
    if report.STATE.get("write_engine"):
        force = report.STATE.get("replace_engine", False)      # --force: replace, or overlay a shipped id
        report.STATE["engine_path"] = str(spec.write_record("engine", rec, force=force, overlay=force))
