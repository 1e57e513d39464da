"""The calibration regression check and the ablation command.

The newest committed calibration record (registry/runs/calibration-*.json), re-predicted from its stored counters
with today's model, must give the figures committed beside this test (tests/calibration_figures.json) within half a
point: a change to the planner, the channel, the terms or the fits that moves them shows here. When a change is
meant to move them, or a newer record is committed, rewrite that file from the figures the failure prints
(`python benchmarks/repredict_calibration.py RECORD` prints the same summary).
"""
import json
from pathlib import Path

import pytest

from moetier.cli.main import main
from moetier.core import records as spec
from moetier.errors import UserError
from moetier.measure import ablate

FIGURES = Path(__file__).with_name("calibration_figures.json")
TOLERANCE = 0.5     # points of |error| %, and bucket counts


def newest_calibration() -> dict:
    recs = [json.loads(p.read_text()) for p in sorted((spec.REGISTRY / "runs").glob("calibration-*.json"))]
    return max(recs, key=lambda r: r["calibration"]["when"])


@pytest.fixture(scope="module")
def newest():
    rec = newest_calibration()
    return rec, ablate.repredict(rec)


def test_the_newest_calibration_record_repredicts_to_its_committed_figures(newest):
    rec, got = newest
    want = json.loads(FIGURES.read_text())
    s = got["summary"]
    now = {"record": rec["id"], "median_abs_error_pct": round(s["median_abs_error_pct"], 2),
           "max_abs_error_pct": round(s["max_abs_error_pct"], 2),
           "held_out_max_abs_error_pct": round(s["held_out_max_abs_error_pct"], 2),
           "held_out_arms": sorted(r["arm"] for r in got["rows"] if r["held_out"]),
           "buckets_within_15pct": s["buckets_within_15pct"], "buckets_checked": s["buckets_checked"]}
    why = f"re-predicted {json.dumps(now)} against {FIGURES.name} {json.dumps(want)}"
    assert want["record"] == rec["id"], why
    assert want["held_out_arms"] == now["held_out_arms"], why
    for k in ("median_abs_error_pct", "max_abs_error_pct", "held_out_max_abs_error_pct", "buckets_within_15pct",
              "buckets_checked"):
        assert abs(now[k] - want[k]) <= TOLERANCE, f"{k}: {why}"


def test_removing_a_term_changes_the_prediction_and_is_measured_against_the_base(newest):
    rec, base = newest
    gone = ablate.repredict(rec, ["host.per_layer_ms"])        # the host's time per layer call: every arm has it
    c = ablate.change(base, gone)
    assert c["median"] > 0 and c["max"] > 0                      # every arm is predicted faster, so worse
    assert c["worst_bucket"][0].endswith(":host") and c["worst_bucket"][1] > 0
    assert ablate.earns(c, drift=0.1) and not ablate.earns({"median": 0.05, "max": -1.0}, drift=0.1)


def test_every_ablation_term_names_something_the_model_reads():
    fields = {f.name for f in __import__("dataclasses").fields(spec.Lane)}
    for name, ops in ablate.TERMS.items():
        for op in ops:
            if op[0] == "lane":
                assert op[2] in fields, name
    for fam, members in ablate.FAMILIES.items():
        assert members and set(members) <= set(ablate.TERMS), fam
    with pytest.raises(UserError, match="unknown term"):
        ablate.repredict(newest_calibration(), ["host.per_nothing_ms"])


def test_ablate_rejects_what_is_not_a_calibration_record(capsys, tmp_path):
    bad = tmp_path / "x.json"
    bad.write_text('{"id": "x"}')
    assert main(["calibrate", "--ablate", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "calibrate --ablate" in err and "calibration" in err and "Traceback" not in err
    assert main(["calibrate", "--ablate", str(tmp_path / "missing.json")]) == 2
    assert "expected a calibration run record" in capsys.readouterr().err
    rec = sorted((spec.REGISTRY / "runs").glob("calibration-*.json"))[0]
    assert main(["calibrate", "--ablate", str(rec), "--only", "nvme_nothing"]) == 2
    assert "--only nvme_nothing" in capsys.readouterr().err
    assert main(["calibrate", "tiny-local-cpu"]) == 2          # measuring needs a store
    assert "--store" in capsys.readouterr().err


def test_an_old_run_record_repredicts_without_the_removed_terms_and_a_record_carrying_one_is_refused(tmp_path):
    rec = newest_calibration()
    terms = rec["calibration"]["terms"]
    # the committed records were made while the model still had these terms: they must still re-predict
    assert any(f in terms for f in spec.REMOVED_FIELDS) or any(
        f in terms.get(ln, {}) for ln in ("gpu", "zerocopy") for f in spec.REMOVED_FIELDS)
    now = ablate.current_terms(terms)
    assert not set(now) & set(spec.REMOVED_FIELDS)
    assert not any(set(now.get(ln, {})) & set(spec.REMOVED_FIELDS) for ln in ("cpu", "gpu", "zerocopy"))
    assert now["host"] == terms["host"] and now["nvme_latency_by_rows_qd_ms"] == terms["nvme_latency_by_rows_qd_ms"]
    # an engine or recipe record that still carries one is refused, the field named on one line
    eng = spec.load_record("engine", "sycl-opencl-cpu")
    with pytest.raises(UserError, match=r"\$\.copy_ms_by_rows: a term the model no longer has") as e:
        spec.validate("engine", {**eng, "copy_ms_by_rows": {"1": 0.1}}, "sycl-opencl-cpu.json")
    assert "\n" not in str(e.value)
    eng["lanes"]["gpu"]["per_step_row_ms"] = 0.02
    with pytest.raises(UserError, match=r"\$\.lanes\.gpu\.per_step_row_ms: a term the model no longer has"):
        spec.validate("engine", eng, "sycl-opencl-cpu.json")
    recipe = spec.load_record("recipe", "tiny-ci-sycl")
    recipe["lane_overrides"]["gpu"]["per_step_row_ms"] = 0.0
    with pytest.raises(UserError, match=r"per_step_row_ms: a term the model no longer has"):
        spec.validate("recipe", recipe, "tiny-ci-sycl.json")


def test_redeal_shows_a_term_that_shapes_the_lane_deal():
    """The device lanes' read terms change nothing while the replay keeps the runtime's deal, and move the VRAM
    arms once the plan pass loses them too (--redeal)."""
    rec = newest_calibration()
    base = ablate.repredict(rec)
    kept = ablate.change(base, ablate.repredict(rec, ablate.FAMILIES["device lane reads"]))
    redealt = ablate.change(base, ablate.repredict(rec, ablate.FAMILIES["device lane reads"], redeal=True))
    assert abs(kept["max"]) < 0.5 < redealt["max"]
