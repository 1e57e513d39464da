"""``moetier trace fit``: the per-layer recency generator fitted to a trace, checked per layer (small traces: fast)."""

import json

import numpy as np
import pytest

from moetier.cli.main import main
from moetier.errors import UserError
from moetier.traces.fit import TOLERANCE, _depth_law, check_fit, fit_trace, measure
from moetier.traces.format import Trace, save_trace
from moetier.traces.gen import GenParams, generate
from moetier.traces.layergen import LayerParams, choice_share, exact_counts, generate_layers, transition, walk
from moetier.traces.stats import layer_cache_curves, lru_hits, norm_entropy, selection_counts, stack_depths

GEO = dict(layers=4, experts=32, topk=4, tokens=600, segments=2)


def _source(reuse: float, seed: int = 11) -> Trace:
    tr = generate(GenParams(zipf_s=1.0, reuse=reuse, affinity=0.3, affinity_width=2), seed=seed, **GEO)
    tr.meta["experts"] = GEO["experts"]
    return tr


@pytest.fixture(scope="module")
def strong():
    """A source with strong reuse: top-1 repeat >= 0.4 at every layer."""
    tr = _source(0.6)
    m = measure(tr.ids, tr.segments, 32, predictability=False)
    assert (m["top1_repeat"] >= 0.4).all(), m["top1_repeat"]
    return tr, fit_trace(tr, 32)


@pytest.fixture(scope="module")
def none():
    """A source with no reuse beyond what popularity gives."""
    tr = _source(0.0)
    return tr, fit_trace(tr, 32)


def test_tolerances_are_the_issues():
    assert TOLERANCE == {"lru_curve": 0.01, "top1_repeat": 0.02, "entropy_norm": 0.01, "predictability": 0.03}


@pytest.mark.parametrize("which", ["strong", "none"])
def test_fit_report_rows_and_every_tolerance_at_every_layer(which, request):
    """One row per layer and statistic, each ok exactly when within its tolerance; every statistic within its
    tolerance at every layer, strong reuse or none: the LRU curve (1..3 x top-k slots) and the top-1 repeat from
    the depth law, the entropy from the popularity, the predictability from the transition."""
    tr, d = request.getfixturevalue(which)
    rows = d["checks"]
    L = GEO["layers"]
    assert len(rows) == 3 * L + (L - 1)              # no predictability at layer 0
    assert {c["statistic"] for c in rows if c["layer"] == 0} == {"lru_curve", "top1_repeat", "entropy_norm"}
    for c in rows:
        assert c["tolerance"] == TOLERANCE[c["statistic"]]
        assert c["diff"] == pytest.approx(abs(c["source"] - c["fitted"]), abs=2e-4)
        assert c["ok"] == (c["diff"] <= c["tolerance"]), c
    assert all(1 <= c["size"] <= 3 * GEO["topk"] for c in rows if c["statistic"] == "lru_curve")
    assert [c for c in rows if not c["ok"]] == []
    assert d["ok"]


def _chain() -> Trace:
    """A source whose next-layer predictability is mostly its cross-layer chain (one successor per expert, no
    reuse): popularity alone reaches 0.31-0.35 of its 0.39-0.44."""
    return generate(GenParams(zipf_s=0.8, reuse=0.0, affinity=0.6, affinity_width=1), seed=11, layers=4, experts=64,
                    topk=4, tokens=2000, segments=2)


def test_the_transition_carries_a_cross_layer_chain():
    d = fit_trace(_chain(), 64)
    assert [c for c in d["checks"] if not c["ok"]] == []


@pytest.mark.parametrize("broken, missed", [("uniform popularity", "entropy_norm"),
                                            ("no transition", "predictability")])
def test_a_broken_model_misses_and_the_report_says_so(broken, missed, monkeypatch):
    """The fits above are the model's doing: with the popularity taken uniform (or the transition off) in every
    trace the fit generates, the report misses that statistic's tolerance at some layer and is not ok."""
    import moetier.traces.fit as F
    real = F.walk

    def fake_walk(arrays, *a, **k):
        if broken == "uniform popularity":
            arrays = arrays | {"popularity": np.ones_like(arrays["popularity"], dtype=np.float64)}
        else:
            arrays = arrays | {"affinity": np.zeros_like(arrays["affinity"])}
        return real(arrays, *a, **k)
    monkeypatch.setattr(F, "walk", fake_walk)
    d = fit_trace(_source(0.6), 32) if broken == "uniform popularity" else fit_trace(_chain(), 64)
    assert not d["ok"]
    assert missed in {c["statistic"] for c in d["checks"] if not c["ok"]}


def test_fitted_figures_are_those_of_the_generated_trace(strong):
    tr, d = strong
    gen = generate_layers(LayerParams.from_json(d["params"]), experts=32, topk=4, tokens=600,
                          segments=tr.segments, seed=d["seed"])
    m = measure(gen.ids, gen.segments, 32)
    for c in d["checks"]:
        l = c["layer"]
        if c["statistic"] == "entropy_norm":
            assert c["fitted"] == pytest.approx(m["entropy_norm"][l], abs=1e-4)
        if c["statistic"] == "lru_curve":
            assert c["fitted"] == pytest.approx(m["lru"][l][c["size"] - 1], abs=1e-4)


def test_the_depth_law_gives_the_lru_curve_and_top1_repeat():
    """The model's claim: the LRU curve at 1..D slots is the cumulative depth law and the top-1 repeat is slot 0's
    share at depth top-k - 1, to within the rounding of exact counts."""
    L, E, K, T = 3, 40, 4, 900
    rng = np.random.default_rng(0)
    D = 3 * K
    law = []
    for _ in range(L):
        rows = []
        for k in range(K):
            p = np.zeros(D + 1)
            p[k:] = rng.random(D + 1 - k) ** 3
            rows.append(tuple(p / p.sum()))
        law.append(tuple(rows))
    succ, cnt = transition(rng.integers(0, E, size=(200, L, K)), E, 2 * K)
    p = LayerParams.from_arrays({"depth_p": np.asarray(law), "choice": rng.random((L, K, D + 1)),
                                 "affinity": np.array([2.0, 1.0, 8.0]),
                                 "popularity": rng.random((L, E)) ** 2, "successors": succ,
                                 "successor_counts": cnt})
    tr = generate_layers(p, experts=E, topk=K, tokens=T, segments=3, seed=4)
    assert all(len(set(r)) == K for r in tr.ids.reshape(-1, K).tolist())          # distinct picks
    m = measure(tr.ids, tr.segments, E, predictability=False)
    q = np.asarray(law)
    want = np.stack([q[:, :, :s].sum(axis=(1, 2)) / K for s in range(1, D + 1)], axis=1)
    assert np.abs(m["lru"] - want).max() <= 0.005
    first_of_segment = len(tr.segments) - 1
    assert np.abs(m["top1_repeat"] - q[:, 0, K - 1]).max() <= first_of_segment / T + 0.003
    # the exact-count rounding: n x p summed to n by largest remainder
    c = exact_counts(np.array([[0.5, 0.25, 0.25], [1 / 3, 1 / 3, 1 / 3]]), 10)
    assert c.tolist() == [[5, 3, 2], [4, 3, 3]]


@pytest.mark.parametrize("reuse, broken", [(0.0, 0.0), (0.6, 1.0)])
def test_the_choice_share_holds_the_popularity_and_the_depth_schedule(reuse, broken):
    """The source's popularity and depth law, walked with the choice share read off the source: the entropy within
    tolerance and the LRU hit at top-k slots on schedule in every quarter of the trace. With the choice taken 0
    everywhere (depth alone decides) a Zipf source with no reuse comes out flatter (entropy about 0.027 high) and
    its shallow depths run out late; with it taken 1 everywhere (popularity decides, repeats too) a source with
    strong reuse comes out skewed (about 0.02 low) and off schedule by about 0.2."""
    src = generate(GenParams(zipf_s=1.0, reuse=reuse, affinity=0.3, affinity_width=2), seed=11, layers=2,
                   experts=128, topk=8, tokens=2400, segments=4)
    ids = src.ids.astype(np.int64)
    T, L, K = ids.shape
    E, D, q = 128, 24, 600
    m = measure(ids, src.segments, E, predictability=False)
    share = choice_share(ids, E, D)
    if reuse:
        assert (share[:, 0, K - 1] < 0.2).all()               # a repeat takes whoever sits there
    else:
        assert np.median(share[:, :, K:]) > 0.9              # every pick a popularity draw
    succ, cnt = transition(ids, E, 2 * K)
    arrays = {"depth_p": _depth_law(m["depth"], D), "popularity": selection_counts(ids, E), "affinity": np.zeros(L),
              "successors": succ, "successor_counts": cnt}

    def errors(choice):
        gen = walk(arrays | {"choice": choice}, T, K, 0)
        entropy = np.array([norm_entropy(c) for c in selection_counts(gen, E)])
        lru = [measure(x[i * q:(i + 1) * q], np.array([0, q]), E, predictability=False)["lru"][:, K - 1]
               for x in (gen, ids) for i in range(4)]
        return np.abs(entropy - m["entropy_norm"]).max(), np.abs(np.subtract(lru[:4], lru[4:])).max()
    entropy, schedule = errors(share)
    assert entropy <= TOLERANCE["entropy_norm"] and schedule <= 0.04, (entropy, schedule)
    entropy, schedule = errors(np.full_like(share, broken))
    assert entropy > 1.5 * TOLERANCE["entropy_norm"] and schedule > 0.04, (entropy, schedule)


def test_stack_depths_give_lru_hits_at_every_size():
    tr = _source(0.4, seed=3)
    ids = tr.ids.astype(np.int64)
    depth = stack_depths(ids)
    for l in range(GEO["layers"]):
        seq = ids[:, l, :].ravel()
        for s in (1, 3, 4, 7, 12, 20):
            assert int((depth[:, l, :] < s).sum()) == lru_hits(seq, s)
    lc = layer_cache_curves(ids, 32, [1, 5, 12], belady=False)
    assert lc["lru"] == pytest.approx([float((depth < s).mean()) for s in (1, 5, 12)], abs=1e-4)


def test_check_fit_flags_a_trace_that_differs():
    a = _source(0.6)
    b = generate(GenParams(zipf_s=0.3, reuse=0.0), seed=1, **GEO)      # flatter, no locality, no affinity
    rows = check_fit(measure(a.ids, a.segments, 32), measure(b.ids, b.segments, 32))
    missed = {c["statistic"] for c in rows if not c["ok"]}
    assert missed == {"lru_curve", "top1_repeat", "entropy_norm", "predictability"}


def test_fit_refuses_a_short_trace_and_ids_out_of_range():
    ids = np.zeros((10, 2, 1), dtype=np.int16)
    with pytest.raises(UserError, match="at least 64"):
        fit_trace(Trace(ids=ids, segments=np.array([0, 10])), 4)
    with pytest.raises(UserError, match=r"out of range 0\.\.15"):
        fit_trace(_source(0.3), 16)


def test_params_refuse_bad_fields_with_one_line():
    layer = {"depth_p": [[0.5, 0.5]], "choice": [[1, 0.5]], "popularity": [1, 2, 3], "affinity": 0.0,
             "successors": [], "successor_counts": []}
    good = {"model": "recency", "layers": [layer, {**layer, "affinity": 2.0, "successors": [[1, 2], [0], []],
                                                   "successor_counts": [[3, 1], [2], []]}]}
    LayerParams.from_json(good)
    two = good["layers"][1]
    for bad, want in (({**good, "extra": 1}, "unknown field"),
                      ({**good, "layers": [{**layer, "affinity": -1}]}, r"affinity=-1, expected a number in \[0, 16\]"),
                      ({**good, "layers": [{**layer, "depth_p": [[0.5, 0.6]]}]}, "summing to 1"),
                      ({**good, "layers": [{**layer, "choice": [[1.5, 0]]}]},
                       r"layers\[0\].choice must be 1 rows of 2 numbers in \[0, 1\]"),
                      ({**good, "layers": [{**layer, "depth_p": [[0.5, 0.5], [0.5, 0.5]]}]},
                       "depths below 1 are impossible"),
                      ({**good, "layers": [layer, {**layer, "popularity": [1, 2]}]}, r"layers\[1\].popularity"),
                      ({**good, "layers": [layer, {**two, "successors": [[1, 3], [0], []]}]},
                       r"layers\[1\].successors: expected expert ids in 0..2"),
                      ({**good, "layers": [layer, {**two, "successor_counts": [[3], [2], []]}]}, "same lengths"),
                      ({**good, "layers": [{**layer, "successors": [[1]], "successor_counts": [[1]]}]},
                       r"layers\[0\].successors and successor_counts must be 3 lists .*; or both empty")):
        with pytest.raises(UserError, match=want) as e:
            LayerParams.from_json(bad)
        assert "\n" not in str(e.value)


def test_cli_fit_json_out_and_gen_from_the_record(tmp_path, capsys, strong):
    tr, _ = strong
    p = tmp_path / "src.npz"
    save_trace(tr, p)
    out = tmp_path / "fit.json"
    rc = main(["trace", "fit", str(p), "--json", "--out", str(out)])
    d = json.loads(capsys.readouterr().out)
    assert rc == (0 if d["ok"] else 3)
    rec = json.loads(out.read_text())
    assert rec["params"] == d["params"] and rec["ok"] == d["ok"] and rec["generator"] == "moetier.traces.layergen"
    assert [x.name for x in tmp_path.iterdir() if x.name.startswith(".")] == []   # atomic: no temp left
    # the record feeds `trace gen` (a model record of the same geometry: the tiny CI model is 8 layers; refused)
    g = tmp_path / "gen.npz"
    assert main(["trace", "gen", "--model", "moetier-tiny-ci-int8", "--fit", str(out), "--out", str(g)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "4 layers of parameters" in err and not g.exists()


def test_cli_fit_exits_3_and_names_the_miss(tmp_path, capsys, monkeypatch):
    import moetier.traces.fit as F
    monkeypatch.setattr(F, "TOLERANCE", {**F.TOLERANCE, "entropy_norm": 0.0})     # a fit cannot be exact
    p = tmp_path / "src.npz"
    save_trace(_source(0.3), p)
    assert main(["trace", "fit", str(p), "--rounds", "1"]) == 3
    text = capsys.readouterr().out
    assert "fit OUTSIDE tolerance: entropy_norm at" in text
    assert "lru_curve" in text and "top1_repeat" in text and "predictability" in text


def test_cli_fit_bad_input_one_line_exit_2(tmp_path, capsys):
    assert main(["trace", "fit", str(tmp_path / "missing.npz")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "missing.npz" in err
    tr = _source(0.3)
    del tr.meta["experts"]                       # no expert count in meta, none given
    p = tmp_path / "noexp.npz"
    save_trace(tr, p)
    out = tmp_path / "fit.json"
    assert main(["trace", "fit", str(p), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--experts" in err and not out.exists()


def test_the_fit_of_a_shipped_trace_is_within_every_tolerance():
    """`moetier trace fit traces/tiny-ci.npz` at its defaults: every statistic within its tolerance at every layer
    (the old global generator missed the LRU curve by up to 0.022 on a real log)."""
    from moetier.cli.common import find_path
    from moetier.traces.format import load_trace
    tr = load_trace(find_path("traces/tiny-ci.npz"))
    d = fit_trace(tr, int(tr.meta["experts"]))
    assert d["shape"] == [800, 8, 4] and d["segments"] == 4
    assert [c for c in d["checks"] if not c["ok"]] == []


def test_the_fit_table_of_docs_traces_is_the_scripts(capsys):
    """docs/traces.md's fit table, for the two tiny shipped traces (the others take minutes): the rows that
    benchmarks/trace_fit_table.py prints, but for the wall time."""
    from pathlib import Path

    from benchmarks import trace_fit_table
    names = ["tiny-ci", "tiny-16x64"]
    assert trace_fit_table.main(names) == 0
    printed = [r.rsplit("|", 2)[0] for r in capsys.readouterr().out.splitlines()]
    doc = (Path(__file__).resolve().parents[1] / "docs" / "traces.md").read_text()
    assert printed == [r.rsplit("|", 2)[0] for r in doc.splitlines() if r.split(" | ")[0][2:] in names]
