"""``moetier trace fit``: the generator fitted to a trace, checked against the source (small traces: fast)."""

import json

import numpy as np
import pytest

from moetier.cli.main import main
from moetier.errors import UserError
from moetier.traces.fit import TOLERANCE, check_fit, fit_trace, measure
from moetier.traces.format import Trace, save_trace
from moetier.traces.gen import GenParams, generate

TRUE = GenParams(zipf_s=1.0, zipf_jitter=0.0, reuse=0.4, affinity=0.5, affinity_width=2, drift=0.3)
GEO = dict(layers=5, experts=32, topk=4, tokens=800, segments=2)


@pytest.fixture(scope="module")
def source():
    tr = generate(TRUE, seed=11, **GEO)
    tr.meta["experts"] = GEO["experts"]
    return tr


@pytest.fixture(scope="module")
def fitted(source):
    return fit_trace(source, GEO["experts"], seed=0, sample_tokens=800, sample_layers=5)


def test_fit_meets_the_tolerances_on_a_generated_trace(fitted):
    # a trace the generator made (other seed) must be fitted within every tolerance, measured at the source's shape
    assert {c["statistic"] for c in fitted["checks"]} == {"lru_layer_curve", "entropy_norm",
                                                          "next_layer_predictability"}
    for c in fitted["checks"]:
        assert c["ok"] and c["diff"] <= c["tolerance"], c
    assert fitted["ok"] and fitted["shape"] == [800, 5, 4] and fitted["segments"] == 2


def test_fit_recovers_the_knobs_it_is_monotone_in(fitted):
    p = fitted["params"]
    assert abs(p["reuse"] - TRUE.reuse) < 0.1
    assert abs(p["zipf_s"] - TRUE.zipf_s) < 0.3
    assert p["affinity"] > 0.2                # the source has cross-layer structure; a fit without it misses it


def test_fitted_figures_are_those_of_the_generated_trace(fitted, source):
    # the report's fitted figures are re-measurable: regenerate with the params and the seed
    gen = generate(GenParams.from_json(fitted["params"]), layers=5, experts=32, topk=4, tokens=800,
                   segments=source.segments, seed=fitted["seed"])
    m = measure(gen.ids, gen.segments, 32)
    assert fitted["fitted"]["entropy"] == pytest.approx(m["entropy"], abs=1e-4)
    assert fitted["fitted"]["lru"] == pytest.approx(m["lru"], abs=1e-4)


def test_check_fit_flags_a_trace_that_differs():
    a = generate(TRUE, seed=1, **GEO)
    b = generate(GenParams(zipf_s=0.3, reuse=0.0), seed=1, **GEO)      # flatter, no locality, no affinity
    checks = {c["statistic"]: c for c in check_fit(measure(a.ids, a.segments, 32), measure(b.ids, b.segments, 32))}
    assert not checks["lru_layer_curve"]["ok"] and checks["lru_layer_curve"]["diff"] > TOLERANCE["lru"]
    assert not checks["entropy_norm"]["ok"]
    assert not checks["next_layer_predictability"]["ok"]


def test_fit_refuses_a_short_trace_and_ids_out_of_range():
    ids = np.zeros((10, 2, 1), dtype=np.int16)
    with pytest.raises(UserError, match="at least 64"):
        fit_trace(Trace(ids=ids, segments=np.array([0, 10])), 4)
    tr = generate(TRUE, seed=1, **GEO)
    with pytest.raises(UserError, match=r"out of range 0\.\.15"):
        fit_trace(tr, 16)


def test_cli_fit_json_and_out(tmp_path, capsys, source):
    p = tmp_path / "src.npz"
    save_trace(source, p)
    out = tmp_path / "fit.json"
    assert main(["trace", "fit", str(p), "--sample-tokens", "800", "--sample-layers", "5", "--json",
                 "--out", str(out)]) == 0
    d = json.loads(capsys.readouterr().out)
    rec = json.loads(out.read_text())
    assert rec["params"] == d["params"] and rec["ok"] == d["ok"] and rec["generator"] == "moetier.traces.gen"
    GenParams.from_json(rec["params"]).check(32)          # the record feeds `trace gen --params` as is
    assert [x.name for x in tmp_path.iterdir() if x.name.startswith(".")] == []   # atomic: no temp left


def test_cli_fit_text(tmp_path, capsys, source):
    p = tmp_path / "src.npz"
    save_trace(source, p)
    assert main(["trace", "fit", str(p), "--sample-tokens", "800", "--sample-layers", "5"]) == 0
    text = capsys.readouterr().out
    assert "per-layer LRU" in text and "entropy_norm" in text and "next_layer_predictability" in text


def test_cli_fit_bad_input_one_line_exit_2(tmp_path, capsys):
    assert main(["trace", "fit", str(tmp_path / "missing.npz")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "missing.npz" in err
    tr = generate(TRUE, seed=1, **GEO)
    del tr.meta["experts"]                       # no expert count in meta, none given
    p = tmp_path / "noexp.npz"
    save_trace(tr, p)
    out = tmp_path / "fit.json"
    assert main(["trace", "fit", str(p), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--experts" in err and not out.exists()


def test_the_fit_of_a_shipped_trace_is_within_the_issues_tolerances():
    """`moetier trace fit traces/tiny-ci.npz` at its defaults: every check within the tolerance the issue set (per-layer
    LRU curve 0.02, popularity entropy 0.01, next-layer predictability 0.03), measured at the source's shape. The
    fitter once matched the LRU curve's mean, not its largest difference, and missed it by 0.0216 here."""
    from moetier.cli.common import find_path
    from moetier.traces.format import load_trace
    assert TOLERANCE == {"lru": 0.02, "entropy": 0.01, "predictability": 0.03}
    tr = load_trace(find_path("traces/tiny-ci.npz"))
    d = fit_trace(tr, int(tr.meta["experts"]))
    assert d["shape"] == [800, 8, 4] and d["segments"] == 4
    by = {c["statistic"]: c for c in d["checks"]}
    assert set(by) == {"lru_layer_curve", "entropy_norm", "next_layer_predictability"}
    for name, key in (("lru_layer_curve", "lru"), ("entropy_norm", "entropy"),
                      ("next_layer_predictability", "predictability")):
        assert by[name]["tolerance"] == TOLERANCE[key] and by[name]["diff"] <= TOLERANCE[key], by[name]
    assert d["ok"]


def test_affinity_search_takes_the_least_within_half_the_tolerance_only_when_asked():
    """The affinity grid: the nearest predictability by default; with ``least`` (the fit's sample has fewer layers
    than the source) the least affinity within half the tolerance, since a larger one concentrates load along the
    source's longer chain of layers (the Qwen trace's fit ended at affinity 1.0 and missed all three checks)."""
    from moetier.traces.fit import AFFINITY_GRID, _fit_affinity, _Sample
    sample = _Sample(4, 32, 4, 400, 2, 0, None)
    base = GenParams(zipf_s=1.0, reuse=0.3, affinity_width=2)
    pred = {a: sample.stat(GenParams(zipf_s=1.0, reuse=0.3, affinity=a, affinity_width=2), "predictability")
            for a in AFFINITY_GRID}
    target = pred[0.75]
    half = TOLERANCE["predictability"] / 2
    within = [a for a in AFFINITY_GRID if abs(pred[a] - target) <= half]
    assert within, pred
    nearest = min(AFFINITY_GRID, key=lambda a: (abs(pred[a] - target), AFFINITY_GRID.index(a)))
    assert _fit_affinity(base, target, sample).affinity == nearest == 0.75
    least = _fit_affinity(base, target, sample, least=True)
    assert least.affinity == within[0] < nearest and least.affinity_width == 2
