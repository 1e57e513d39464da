"""benchmarks/bench_fidelity.py's report (summaries, noise floor, table) on a made-up result;
bench_quick_agreement.py refusing bad arguments."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_fidelity.py"
_spec = importlib.util.spec_from_file_location("bench_fidelity", _PATH)
bf = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bf)


def _row(arm, measured, predicted, each, inside=True):
    return {"arm": arm, "conc": 1, "measured_tok_s": measured, "measured_each": each, "sim_tok_s": predicted,
            "interval": [predicted * 0.8, predicted * 1.2], "basis": "measured",
            "error_pct": round((predicted / measured - 1) * 100, 2), "inside": inside}


def _phase(rows):
    return {"command": "moetier x", "seconds": 12.0, "rows": rows, "summary": bf.summary(rows)}


@pytest.fixture
def fake_result():
    res = {"machine": "fake-2c-8g", "cores": 2, "steps": 200, "repeats": 5, "load_before": [0.5, 0.5, 0.5],
           "load_after": [1.0, 1.0, 1.0], "goals": bf.GOALS,
           "bench": _phase([_row("a-C1", 50.0, 55.0, [48.0, 50.0, 53.0]),
                            _row("b-C2", 100.0, 90.0, [95.0, 100.0, 101.0], inside=False)]),
           "quick": _phase([_row("a-C1", 40.0, 42.0, [39.0, 40.0, 41.0]),
                            _row("b-C2", 110.0, 99.0, [100.0, 110.0, 120.0])]),
           "quick_again": _phase([_row("a-C1", 40.0, 46.2, [39.0, 40.0, 41.0]),
                                  _row("b-C2", 110.0, 99.0, [100.0, 110.0, 120.0])])}
    res["noise_floor"] = bf.noise_floor(res)
    return res


def test_summary_takes_the_magnitude_of_each_error():
    s = bf.summary([_row("a", 100.0, 80.0, [100.0]), _row("b", 100.0, 105.0, [100.0]),
                    _row("c", 100.0, 101.0, [100.0], inside=False)])
    assert s["median_abs_error_pct"] == 5.0 and s["max_abs_error_pct"] == 20.0 and s["max_arm"] == "a"
    assert s["inside_share"] == pytest.approx(2 / 3, abs=1e-3)


def test_noise_floor_is_the_arms_change_and_the_quick_calibrations_disagreement(fake_result):
    nf = fake_result["noise_floor"]
    assert nf["arm_change"]["by_arm"] == {"a-C1": -20.0, "b-C2": 10.0}
    assert nf["arm_change"]["max_abs_pct"] == 20.0 and nf["arm_change"]["max_arm"] == "a-C1"
    assert nf["arm_change"]["median_abs_pct"] == 15.0
    assert nf["quick_disagreement"]["by_arm"] == {"a-C1": 10.0, "b-C2": 0.0}
    assert bf.noise_floor({"bench": fake_result["bench"]}) == {}          # the bench phase alone has no floor


def test_markdown_shows_goals_repeats_and_the_floor(fake_result):
    md = bf.markdown(fake_result)
    assert "| a-C1 | 1 | 50.00 | 48.0-53.0 | 55.00 |" in md
    assert md.count("goals: median") == 2                                  # bench and quick; the second quick has none
    assert "goals: median <= 10%, max <= 20%, inside >= 80%" in md and "goals: median <= 5%, max <= 10%." in md
    assert "| a-C1 | -20.0% | +10.0% |" in md
    assert "The arms' own change between the phases: median 15.0%, max 20.0% (a-C1)." in md
    assert "## The noise floor" not in bf.markdown({**fake_result, "noise_floor": {}})


def test_quick_agreement_refuses_bad_arguments_before_any_work(capsys, monkeypatch):
    monkeypatch.syspath_prepend(str(_PATH.parent))        # the script imports bench_fidelity from beside it
    spec_ = importlib.util.spec_from_file_location("bench_quick_agreement", _PATH.parent / "bench_quick_agreement.py")
    qa = importlib.util.module_from_spec(spec_)
    spec_.loader.exec_module(qa)
    assert qa.main(["--store", "/nonexistent", "--repeats", "2", "0"]) == 2
    assert capsys.readouterr().err.startswith("bench_quick_agreement: --repeats")
