"""The calibration loop end to end on a small matrix (real runs on the CI tiny store), in a scratch registry."""
import json
import math
import shutil

import pytest

pytest.importorskip("numba", reason="the cpu backend needs the cpu extra (numba)")

from moetier import calibrate, spec, store  # noqa: E402
from moetier.cli import REPO  # noqa: E402
from moetier.trace import load_trace  # noqa: E402


@pytest.fixture()
def scratch(tmp_path, monkeypatch):
    root = tmp_path / "registry"
    shutil.copytree(spec.REGISTRY, root)
    monkeypatch.setattr(spec, "REGISTRY", root)
    R = spec.resolve("tiny-ci-cpu")
    d = tmp_path / "store"
    store.pack(R.model, str(d))
    tr = load_trace(REPO / R.trace, layers=R.layers, experts=R.experts, topk=R.topk)
    return root, store.open_store(str(d), model=R.model), tr


def test_small_matrix_fits_terms_writes_records_and_predicts(scratch):
    root, st, tr = scratch
    ram = spec.resolve("tiny-ci-cpu").raw["budget"]["ram_gb"]
    arms = [
        {"name": "allram-C1", "set": ["budget.ram_gb=1"], "conc": 1, "fit": True},
        {"name": "tail-C1", "set": [], "conc": 1, "fit": True},
        {"name": "tail-C2", "set": [], "conc": 2, "fit": True},
        {"name": "small-C2", "set": [f"budget.ram_gb={ram * 0.8}"], "conc": 2, "fit": False},
    ]
    res = calibrate.calibrate("tiny-ci-cpu", st, tr, arms=arms, steps=12, repeats=1, write=True)
    t = res["terms"]
    assert t["cpu"]["per_expert_ms"] >= 0 and set(t["fixed_ms"]) == {"1", "2"}
    assert all(math.isfinite(r["error_pct"]) and r["measured_tok_s"] > 0 and r["sim_tok_s"] > 0 for r in res["rows"])
    assert [r["fit"] for r in res["rows"]] == [True, True, True, False]
    json.dumps(res, allow_nan=False)
    # the fitted terms were written (validated) into the scratch registry and the simulator now uses them
    R = spec.resolve("tiny-ci-cpu")
    assert R.host["per_layer_ms"] == pytest.approx(round(t["host"]["per_layer_ms"], 6))
    assert R.fixed_ms[1] == pytest.approx(t["fixed_ms"]["1"])
    s = calibrate.summary(res["rows"])
    assert s["arms"] == 4 and s["held_out_max_abs_error_pct"] is not None


def test_device_lane_and_copy_terms_recover_known_costs():
    pl, pe, px, copy = 0.12, 0.05, 0.03, 0.09
    calls = [["gpu", e, x, 10, 10 * (pl + pe * e + px * x) / 1e3] for e in (1, 2, 4) for x in (0, 1, 3)]
    calls += [["zc", 1, 0, 7, 7 * 0.2 / 1e3]]             # one shape only: booked per expert, no launch term
    run = {"device_calls": calls, "counters": {"copies": 40, "copy_s": 30 * copy / 1e3, "stage_s": 10 * copy / 1e3}}
    t = calibrate.fit_device_terms([run])
    assert t["gpu"] == pytest.approx({"per_layer_ms": pl, "per_expert_ms": pe, "per_extra_token_ms": px}, rel=1e-6)
    assert t["zerocopy"] == pytest.approx({"per_layer_ms": 0.0, "per_expert_ms": 0.2, "per_extra_token_ms": 0.0})
    assert t["copy_ms"] == pytest.approx(copy)
    assert calibrate.fit_device_terms([{"device_calls": [], "counters": {"copies": 0}}]) == {}
