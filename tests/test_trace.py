"""Trace format, validation, conversion, generator and statistics (fast)."""

import json
import zipfile

import numpy as np
import pytest

from moetier.errors import UserError
from moetier.traces.format import Trace, convert, load_trace, save_trace, segments_sibling, validate
from moetier.traces.gen import GenParams, generate
from moetier.traces.stats import belady_hits, lru_hits, next_use, stats


def _trace(T=20, L=3, K=2, E=8, seed=0, weights=True):
    rng = np.random.default_rng(seed)
    ids = np.stack([np.stack([rng.choice(E, K, replace=False) for _ in range(L)]) for _ in range(T)]).astype(np.int16)
    w = rng.random((T, L, K)).astype(np.float32) if weights else None
    return Trace(ids=ids, segments=np.array([0, 7, T]), weights=w, meta={"model_id": "m-test", "source": "unit"})


# ---------------------------------------------------------------------------------------------- format

def test_round_trip_npz(tmp_path):
    tr = _trace()
    p = tmp_path / "t.npz"
    save_trace(tr, p)
    back = load_trace(p, layers=3, experts=8, topk=2, model_id="m-test")
    assert np.array_equal(back.ids, tr.ids) and back.ids.dtype == np.int16
    assert back.segments.tolist() == [0, 7, 20] and back.nseg == 2
    assert np.array_equal(back.weights, tr.weights)
    assert back.meta == {"model_id": "m-test", "source": "unit"}
    assert np.array_equal(back.segment(1), tr.ids[7:20])
    with np.load(p, allow_pickle=False) as z:      # no pickle anywhere
        assert set(z.files) == {"ids", "segments", "weights", "meta"} and z["meta"].dtype.kind == "U"
    assert [x.name for x in tmp_path.iterdir()] == ["t.npz"]     # no temp file left behind


def test_reference_npy_with_segments_and_topk_slice(tmp_path):
    rng = np.random.default_rng(1)
    ids = rng.integers(0, 16, size=(30, 4, 10)).astype(np.int32)
    np.save(tmp_path / "g.npy", ids)
    np.save(tmp_path / "g.segments.npy", np.array([0, 10, 30]))
    tr = load_trace(tmp_path / "g.npy", layers=4, experts=16, topk=8)
    assert tr.ids.shape == (30, 4, 8) and np.array_equal(tr.ids, ids[:, :, :8])
    assert tr.segments.tolist() == [0, 10, 30] and tr.weights is None
    # explicit segments path overrides the sibling; no sibling -> one segment
    np.save(tmp_path / "other.npy", np.array([0, 5, 30]))
    assert load_trace(tmp_path / "g.npy", tmp_path / "other.npy").segments.tolist() == [0, 5, 30]
    np.save(tmp_path / "h.npy", ids)
    assert load_trace(tmp_path / "h.npy").segments.tolist() == [0, 30]


def test_convert_both_ways(tmp_path):
    tr = _trace(weights=False)
    save_trace(tr, tmp_path / "a.npy")
    assert segments_sibling(tmp_path / "a.npy").exists()
    out = convert(tmp_path / "a.npy", tmp_path / "b.npz")
    assert out.segments.tolist() == [0, 7, 20]
    back = convert(tmp_path / "b.npz", tmp_path / "c.npy")
    c = load_trace(tmp_path / "c.npy")
    assert np.array_equal(c.ids, tr.ids) and np.array_equal(back.ids, tr.ids)
    assert c.segments.tolist() == [0, 7, 20]


# ---------------------------------------------------------------------------------------------- validation

def _err(tmp_path, name, fn, **kw):
    with pytest.raises(UserError) as e:
        fn(tmp_path / name, **kw)
    msg = str(e.value)
    assert name in msg and "\n" not in msg
    return msg


def test_validation_errors_name_the_file(tmp_path):
    np.save(tmp_path / "flat.npy", np.zeros((10, 3), dtype=np.int32))
    assert "3-D" in _err(tmp_path, "flat.npy", load_trace)

    np.save(tmp_path / "ok.npy", np.zeros((10, 40, 8), dtype=np.int32))
    m = _err(tmp_path, "ok.npy", load_trace, layers=42, experts=256, topk=8, model_id="glm-x")
    assert "[10, 40, 8]" in m and "glm-x" in m and "expected 42 layers" in m
    assert "top-k" in _err(tmp_path, "ok.npy", load_trace, layers=40, experts=256, topk=10)

    bad = np.zeros((10, 2, 2), dtype=np.int32)
    bad[3, 1, 0] = 99
    bad[5, 0, 1] = -1
    np.save(tmp_path / "range.npy", bad)
    m = _err(tmp_path, "range.npy", load_trace, experts=64)
    assert "2 expert ids out of range 0..63" in m and "token 3" in m

    np.save(tmp_path / "f.npy", np.zeros((4, 2, 2), dtype=np.float32))
    assert "integers" in _err(tmp_path, "f.npy", load_trace)

    np.save(tmp_path / "s.npy", np.zeros((10, 2, 2), dtype=np.int32))
    for segs, want in (([0, 6, 4, 10], "strictly increasing"), ([1, 10], "start at 0"), ([0, 9], "end at")):
        np.save(tmp_path / "s.segments.npy", np.array(segs))
        assert want in _err(tmp_path, "s.segments.npy", lambda p: load_trace(tmp_path / "s.npy"))

    tr = _trace()
    save_trace(tr, tmp_path / "m.npz")
    assert "m-test" in _err(tmp_path, "m.npz", load_trace, model_id="other")

    tr.weights = tr.weights[:, :, :1]
    with pytest.raises(UserError, match="weights shape"):
        validate(tr, layers=3, experts=8, topk=2, path="w.npz")

    assert "not found" in _err(tmp_path, "missing.npz", load_trace)
    (tmp_path / "junk.npz").write_bytes(b"not a zip")
    assert "not a valid" in _err(tmp_path, "junk.npz", load_trace)
    (tmp_path / "junk.npy").write_bytes(b"garbage")
    assert "not a valid" in _err(tmp_path, "junk.npy", load_trace)
    (tmp_path / "x.csv").write_text("1,2")
    assert "format" in _err(tmp_path, "x.csv", load_trace)


def test_pickle_npz_is_refused(tmp_path):
    np.savez(tmp_path / "p.npz", ids=np.zeros((2, 1, 1), np.int16), segments=np.array([0, 2]),
             meta=np.array([{"a": 1}], dtype=object))
    assert "pickle" in _err(tmp_path, "p.npz", load_trace)
    with zipfile.ZipFile(tmp_path / "p.npz") as z:     # sanity: it really is an object array
        assert "meta.npy" in z.namelist()


# ---------------------------------------------------------------------------------------------- generator

def test_generator_deterministic_and_distinct():
    p = GenParams(zipf_s=1.0, zipf_jitter=0.2, reuse=0.4, affinity=0.5, affinity_width=4, drift=0.3)
    a = generate(p, layers=6, experts=32, topk=6, tokens=300, segments=3, seed=7, model_id="m")
    b = generate(p, layers=6, experts=32, topk=6, tokens=300, segments=3, seed=7, model_id="m")
    c = generate(p, layers=6, experts=32, topk=6, tokens=300, segments=3, seed=8, model_id="m")
    assert np.array_equal(a.ids, b.ids) and not np.array_equal(a.ids, c.ids)
    s = np.sort(a.ids, axis=2)
    assert (np.diff(s, axis=2) > 0).all() and a.ids.min() >= 0 and a.ids.max() < 32
    assert a.meta["source"] == "moetier.tracegen" and a.meta["seed"] == 7 and a.meta["params"] == p.to_json()
    assert a.nseg == 3 and a.segments[-1] == 300
    json.dumps(a.meta)
    validate(a, layers=6, experts=32, topk=6, model_id="m")


def test_generator_monotone_knobs():
    kw = dict(layers=4, experts=64, topk=8, tokens=400, segments=1, seed=3)
    ent = [stats(generate(GenParams(zipf_s=s), **kw), 64, cache=False)["summary"]["entropy_norm"]
           for s in (0.0, 0.6, 1.2)]
    assert ent[0] > ent[1] > ent[2]
    reu = [stats(generate(GenParams(zipf_s=0.3, reuse=r), **kw), 64, cache=False)["summary"]["reuse_prev_token"]
           for r in (0.0, 0.3, 0.7)]
    assert reu[0] < reu[1] < reu[2] and abs(reu[2] - 0.7) < 0.1
    nmi = [stats(generate(GenParams(zipf_s=0.3, affinity=a, affinity_width=4), **kw), 64,
                 cache=False)["summary"]["nmi_next"] for a in (0.0, 0.5)]
    assert nmi[0] < 0.03 < nmi[1]
    with pytest.raises(UserError, match="reuse"):
        generate(GenParams(reuse=1.5), **kw)


# ---------------------------------------------------------------------------------------------- stats

def test_cache_by_hand():
    seq = np.array([1, 2, 3, 1, 4, 1, 2, 3])
    assert next_use(seq).tolist() == [3, 6, 7, 5, 8, 8, 8, 8]
    # LRU, 2 slots: only the 1 at index 5 hits (after 1, 4)
    assert lru_hits(seq, 2) == 1
    # OPT, 2 slots: keep 1 (1 at 3 hits, at 5 hits), then keep 2 or 3 -> plus one of them = 3
    assert belady_hits(seq, 2) == 3
    # 3 slots: LRU hits at 3 (1), 5 (1); OPT hits 1,1,2,3 = 4
    assert lru_hits(seq, 3) == 2 and belady_hits(seq, 3) == 4
    rng = np.random.default_rng(0)
    for _ in range(20):
        s = rng.zipf(1.5, size=300) % 40
        for c in (1, 3, 8, 20):
            assert belady_hits(s, c) >= lru_hits(s, c)


def test_stats_tiny_trace_known_answers():
    # E=4, L=2, K=1; tokens: layer0 = 0,0,1,0 ; layer1 = 2,3,3,3 ; two segments [0,2) [2,4)
    ids = np.array([[[0], [2]], [[0], [3]], [[1], [3]], [[0], [3]]], dtype=np.int16)
    tr = Trace(ids=ids, segments=np.array([0, 2, 4]))
    d = stats(tr, 4, cache_sizes=[1, 2, 3, 8])
    pl = d["per_layer"]
    # reuse: valid transitions t=1 and t=3 (t=2 starts a segment); layer0: 0->0 yes, 1->0 no; layer1: 2->3 no, 3->3 yes
    assert pl[0]["reuse_prev_token"] == 0.5 and pl[1]["reuse_prev_token"] == 0.5
    # reuse distance within segment: key(0,0) t0 never, t1 d=1; key(0,1) t2 never; key(0,0) t3 never (new segment)
    # layer1: 2 never, 3 never, 3 (t2) never (new segment), 3 (t3) d=1 -> 2 x <64, 6 x never
    assert d["reuse_distance"]["count"] == [2, 0, 0, 0, 6]
    assert pl[0]["max_over_mean"] == 3.0 and pl[0]["top10_share"] == 0.75
    # access stream: keys 0,6,0,7,1,7,0,7 (layer1 keys = 4 + id)
    c = d["cache"]
    seq = [0, 6, 0, 7, 1, 7, 0, 7]
    assert c["accesses"] == 8 and c["distinct_keys"] == 4
    # LRU size 1: no consecutive repeats -> 0; size 2: hits at idx2 (0), idx5 (7), idx7 (7) -> 3;
    # size 3 also keeps 0 through 7,1,7 -> idx6 hits too -> 4; Belady with 2 slots: idx2, 5, 6, 7 -> 4
    assert c["lru"] == [0.0, 3 / 8, 4 / 8, 4 / 8]
    assert lru_hits(np.array(seq), 3) == 4
    assert c["belady"][1] == 4 / 8 == belady_hits(np.array(seq), 2) / 8 >= c["lru"][1]
    assert all(b >= a for a, b in zip(c["lru"], c["belady"]))
    json.dumps(d)


# ---------------------------------------------------------------------------------------------- per-layer stats
def test_per_layer_stats_known_answers():
    from moetier.traces.stats import layer_cache_curves, next_layer_recall
    # layer 0 cycles 0,1,2 (top-1); layer 1 is layer 0 + 1 (perfectly predictable)
    ids = np.array([[[0], [1]], [[1], [2]], [[2], [3]]] * 4, dtype=np.int16)
    tr = Trace(ids=ids, segments=np.array([0, 12]))
    d = stats(tr, 4, cache_sizes=[2], layer_sizes=[2, 3])
    assert d["per_layer"][0]["top1_repeat"] == 0.0
    lc = d["layer_cache"]
    assert lc["sizes"] == [2, 3]
    assert lc["per_layer"]["lru"][0] == [0.0, 0.75]         # a 3-cycle: LRU at 2 slots never hits; at 3 all but 3
    assert lc["per_layer"]["belady"][0][0] == 0.5             # OPT keeps 2 of the 3 and bypasses the third
    rec = next_layer_recall(ids.astype(np.int64), 4, ks=[1])
    assert rec["recall"][0][1] == 1.0                       # cross-fitted: the map e -> e + 1 is learnt exactly
    fine = d["per_layer"][1]["reuse_distance_fine"]
    assert fine[2] == 0.75 and fine[8] == 0.25             # reuses 3 tokens back (bucket 3-4); 3 first uses


def test_top1_repeat_counts_only_within_segments():
    ids = np.array([[[5]], [[5]], [[5]], [[6]]], dtype=np.int16)
    d = stats(Trace(ids=ids, segments=np.array([0, 2, 4])), 8, cache=False)
    assert d["per_layer"][0]["top1_repeat"] == 0.5          # (1 -> 0 repeats, 3 -> 2 does not) of 2 pairs


# ---------------------------------------------------------------------------------------------- import
def _log(tmp_path, lines, name="log.jsonl"):
    p = tmp_path / name
    p.write_text("\n".join(lines) + "\n")
    return p


def test_import_jsonl_missing_error_drop_mask(tmp_path):
    import json as _json
    from moetier.errors import UserError
    from moetier.traces.importer import import_log
    recs = [{"tok": t, "lay": l, "ex": [t % 4, (t + l + 1) % 4], "req": "a" if t < 3 else "b"}
            for t in range(5) for l in range(2)]
    recs[3]["ex"] = [1, -1]                                  # token 1, layer 1: a missing pick
    del recs[8]                                              # token 4, layer 0: no record
    p = _log(tmp_path, [_json.dumps(r) for r in recs])
    from moetier.traces.importer import Fields
    f = Fields(token="tok", layer="lay", experts="ex", weights=None, segment="req")
    with pytest.raises(UserError, match="token 1, layer 1: missing router record"):
        import_log(p, f, experts=4)
    tr = import_log(p, f, missing="drop", experts=4)
    assert tr.tokens == 3 and tr.segments.tolist() == [0, 2, 3] and tr.meta["dropped_tokens"] == 2
    tr = import_log(p, f, missing="mask", experts=4)
    assert tr.tokens == 5 and tr.meta["masked_picks"] == 4 and (tr.ids[1, 1] == -1).all()
    out = tmp_path / "t.npz"
    save_trace(tr, out)
    back = load_trace(out, experts=4)
    assert back.meta["missing"] == "mask" and (back.ids[4, 0] == -1).all()
    assert stats(back, 4)["masked_tokens_left_out"] == 2


def test_import_csv_and_npz_forms(tmp_path):
    from moetier.traces.importer import Fields, import_log
    p = tmp_path / "log.csv"
    p.write_text("token,layer,e0,e1,w0,w1\n0,0,1,2,.7,.3\n0,1,0,3,.5,.5\n1,0,2,1,.6,.4\n1,1,3,0,.9,.1\n")
    tr = import_log(p, Fields(experts="e", weights="w"), experts=4)
    assert tr.ids.tolist() == [[[1, 2], [0, 3]], [[2, 1], [3, 0]]]
    assert tr.weights[1, 1].tolist() == pytest.approx([0.9, 0.1])
    q = tmp_path / "log2.csv"
    q.write_text('token,layer,experts\n0,0,"1 2"\n0,1,"0;3"\n')
    assert import_log(q, experts=4).ids.tolist() == [[[1, 2], [0, 3]]]
    z = tmp_path / "log.npz"
    np.savez(z, experts=np.array([[[1, 2], [0, 3]]]))
    assert import_log(z, experts=4).ids.tolist() == [[[1, 2], [0, 3]]]


def test_import_refuses_bad_logs_with_one_line(tmp_path):
    from moetier.errors import UserError
    from moetier.traces.importer import import_log
    with pytest.raises(UserError, match="line 1: invalid JSON"):
        import_log(_log(tmp_path, ["{nope"]))
    with pytest.raises(UserError, match="no field 'token'"):
        import_log(_log(tmp_path, ['{"t": 0, "layer": 0, "experts": [1]}']))
    with pytest.raises(UserError, match="out of range 0..3"):
        import_log(_log(tmp_path, ['{"token": 0, "layer": 0, "experts": [7]}']), experts=4)
    with pytest.raises(UserError, match="picked twice"):
        import_log(_log(tmp_path, ['{"token": 0, "layer": 0, "experts": [1, 1]}']))


def test_masked_picks_are_not_computed_by_the_simulator():
    from moetier.core.sim import Streams, rank_keys
    ids = np.array([[[0, -1], [1, 2]], [[3, 1], [-1, -1]]], dtype=np.int16)
    tr = Trace(ids=ids, segments=np.array([0, 2]), meta={"missing": "mask"})
    st = Streams(tr, 1, 2, 4, offsets=[0])
    assert st.picks(st.rows(0), 0) == {0: 1} and st.picks(st.rows(1), 1) == {}
    assert sorted(rank_keys(ids, 4).tolist()) == [0, 1, 3, 5, 6]
