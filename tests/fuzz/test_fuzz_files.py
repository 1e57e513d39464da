"""Fuzz: trace files, store manifests and probe files. Each generated file is read as the command line reads it;
it succeeds with sound contents, or exits 2 with one line (see _harness)."""
import io
import json
import os

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from _harness import outcome
from moetier import strictjson
from moetier.bytes import store
from moetier.core import records as spec
from moetier.measure import probe
from moetier.traces.format import load_trace

L, E, K = 8, 32, 4
DTYPES = ["int8", "int16", "int32", "int64", "uint8", "uint16", "uint64", "float32", "float64", "bool", "U3"]


# ---- traces ---------------------------------------------------------------------------------------------------------
@st.composite
def arrays(draw, dtypes=DTYPES, max_side=6):
    dt = np.dtype(draw(st.sampled_from(dtypes)))
    shape = tuple(draw(st.lists(st.integers(0, max_side), min_size=0, max_size=4)))
    n = int(np.prod(shape)) if shape else 1
    if dt.kind == "U":
        vals = draw(st.lists(st.text(max_size=3), min_size=n, max_size=n))
    elif dt.kind == "b":
        vals = draw(st.lists(st.booleans(), min_size=n, max_size=n))
    elif dt.kind == "f":
        vals = draw(st.lists(st.floats(allow_nan=True, allow_infinity=True, width=32), min_size=n, max_size=n))
    else:
        info = np.iinfo(dt)
        vals = draw(st.lists(st.integers(max(info.min, -40), min(info.max, 40)), min_size=n, max_size=n))
    return np.array(vals, dtype=dt).reshape(shape)


@st.composite
def good_trace(draw):
    T = draw(st.integers(1, 12))
    ids = np.array(draw(st.lists(st.integers(0, E - 1), min_size=T * L * K, max_size=T * L * K)),
                   dtype=np.int16).reshape(T, L, K)
    cuts = sorted(set(draw(st.lists(st.integers(1, T - 1), max_size=3)))) if T > 1 else []
    return {"ids": ids, "segments": np.array([0, *cuts, T], dtype=np.int64),
            "weights": np.full((T, L, K), 1.0 / K, dtype=np.float32), "meta": np.array('{"name": "fuzz"}')}


@st.composite
def trace_bytes(draw):
    """An .npz: a valid trace with one part replaced, dropped or added, or the archive's bytes damaged."""
    parts = draw(good_trace())
    how = draw(st.sampled_from(["replace", "drop", "add", "bytes", "meta", "weight", "valid"]))
    if how == "weight":           # one routing weight damaged in place (the shape stays right)
        w = parts["weights"]
        w.flat[draw(st.integers(0, w.size - 1))] = draw(st.sampled_from(
            [float("nan"), float("inf"), float("-inf"), 3e38, -1.0, 0.0]))
    elif how == "replace":
        parts[draw(st.sampled_from(sorted(parts)))] = draw(arrays())
    elif how == "drop":
        parts.pop(draw(st.sampled_from(sorted(parts))))
    elif how == "add":
        parts[draw(st.text(min_size=1, max_size=5).filter(lambda k: k.isidentifier() and k != "file"))] = \
            draw(arrays())
    elif how == "meta":
        parts["meta"] = np.array(draw(st.one_of(st.text(max_size=20), st.sampled_from(
            ['{"a": NaN}', '{"model_id": "other"}', "[" * 500, "1e999", '{"a": Infinity}']))))
    buf = io.BytesIO()
    np.savez(buf, **parts)
    data = bytearray(buf.getvalue())
    if how == "bytes":
        for _ in range(draw(st.integers(1, 4))):
            i = draw(st.integers(0, len(data) - 1))
            data[i] = draw(st.integers(0, 255))
        if draw(st.booleans()):
            data = data[:draw(st.integers(0, len(data)))]
    return bytes(data)


def _trace_target(path, data, target="trace file"):
    path.write_bytes(data)

    def work():
        tr = load_trace(path, layers=L, experts=E, topk=K, model_id="moetier-tiny-ci-int8")
        assert tr.ids.shape[1:] == (L, K) and int(tr.ids.min()) >= 0 and int(tr.ids.max()) < E
        assert tr.weights is None or np.isfinite(tr.weights).all(), "a non-finite weight came through"
        assert int(tr.segments[0]) == 0 and int(tr.segments[-1]) == tr.ids.shape[0]
        return 0
    outcome(target, work)


@given(data=trace_bytes())
def test_fuzz_trace_file(tmp_path_factory, data):
    _trace_target(tmp_path_factory.getbasetemp() / "fuzz-trace.npz", data)


def test_fuzzer_catches_a_trace_loader_without_the_finite_weights_check(tmp_path, monkeypatch):
    """The trace target can fail: with the loader's finite-weights check taken out (np.isfinite answering True
    inside moetier.traces.format), a damaged weight comes through and the target's own property catches it."""
    import types
    from hypothesis import HealthCheck, Phase, settings
    from moetier.traces import format as fmt
    blind = types.SimpleNamespace(**{k: getattr(np, k) for k in dir(np) if not k.startswith("__")})
    blind.isfinite = lambda a: np.ones(np.shape(a), dtype=bool)
    monkeypatch.setattr(fmt, "np", blind)

    @settings(max_examples=2000, derandomize=True, database=None, phases=[Phase.generate], deadline=None,
              report_multiple_bugs=False, suppress_health_check=list(HealthCheck))
    @given(data=trace_bytes())
    def fuzz(data):
        _trace_target(tmp_path / "t.npz", data, "trace file (finite check taken out)")
    with pytest.raises(AssertionError, match="non-finite weight came through"):
        fuzz()


# ---- store manifests -------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def store_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("fuzzstore") / "s"
    store.pack(spec.load_record("model", "moetier-tiny-ci-int8"), str(d))
    return d


SPECIAL = [0, -1, 1, 2**63, 1e308, 4096, 102400, 256, 8, 32, None, "", "xxh3-128", "moetier-store/1", [], {}, True,
           0.5, float("nan"), float("inf")]
values = st.recursive(st.one_of(st.sampled_from(SPECIAL), st.integers(-2**66, 2**66), st.text(max_size=6),
                                st.floats(allow_nan=True, allow_infinity=True)),
                      lambda ch: st.lists(ch, max_size=3) | st.dictionaries(st.text(max_size=5), ch, max_size=3),
                      max_leaves=5)


@given(data=st.data())
def test_fuzz_store_manifest(store_dir, data):
    mpath = store_dir / store.MANIFEST_NAME
    good = mpath.read_text()
    m = json.loads(good)
    op = data.draw(st.sampled_from(["field", "layout", "drop", "digest", "text"]), label="op")
    if op == "field":
        m[data.draw(st.sampled_from(sorted(m)), label="key")] = data.draw(values, label="value")
    elif op == "layout":
        lay = m["layout"]
        sec = lay["sections"]
        target = data.draw(st.sampled_from([lay, sec, *sec.values()]), label="where")
        target[data.draw(st.sampled_from(sorted(target) + ["extra"]), label="key")] = data.draw(values, label="v")
    elif op == "drop":
        m.pop(data.draw(st.sampled_from(sorted(m)), label="key"))
    elif op == "digest":
        i = data.draw(st.integers(0, len(m["digests"]) - 1), label="i")
        m["digests"][i] = data.draw(st.one_of(st.text(max_size=40), values), label="d")
    text = json.dumps(m, allow_nan=True)
    if op == "text":
        i = data.draw(st.integers(0, len(text)), label="at")
        text = text[:i] + data.draw(st.sampled_from(["NaN", "Infinity", "", "}", "1e999", "[" * 2000]), label="t") \
            + text[i + data.draw(st.integers(0, 8), label="n"):]
    mpath.write_text(text)
    model = spec.load_record("model", "moetier-tiny-ci-int8")

    def work():
        st_ = store.open_store(str(store_dir), model=model)
        assert st_.nrecords == st_.layers * st_.experts and st_.record_bytes % 4096 == 0
        assert os.path.getsize(st_.data_path) == st_.nrecords * st_.record_bytes
        return 0
    try:
        outcome("store manifest", work)
    finally:
        mpath.write_text(good)


# ---- probe files -----------------------------------------------------------------------------------------------------
def _line(draw, t):
    kind = draw(st.sampled_from(["header", "sample", "counters", "mark", "error", "junk", "json"]))
    num = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-2**70, 2**70),
                    st.sampled_from([1e308, -1e308, 0, 1e18, 1e19]))
    if kind == "junk":
        return draw(st.text(max_size=30))
    if kind == "json":
        return json.dumps(draw(values), allow_nan=True)
    d = {"kind": kind, "t": draw(st.one_of(st.just(t), num))}
    if kind == "header":
        d.update(version=draw(st.one_of(st.just(1), num)), interval_s=draw(st.one_of(st.just(0.1), num)),
                 cpus=[0, 1], disks=["sda"], started=t)
    elif kind == "sample":
        d.update(dt=draw(st.one_of(st.just(0.1), num)), cpu=draw(st.lists(st.one_of(st.just(0.5), num), max_size=3)),
                 mem_used=draw(st.one_of(st.just(10**9), num)), rss=draw(st.one_of(st.just(10**8), num)),
                 disk={"sda": draw(st.lists(st.one_of(st.just(4096), num), max_size=3))})
    elif kind == "counters":
        d.update(step=draw(st.integers(-2, 5)), measured=draw(st.booleans()), conc=draw(st.one_of(st.just(1), num)),
                 tokens=draw(st.one_of(st.just(1), num)), step_wall_s=draw(st.one_of(st.just(0.01), num)),
                 nvme_wait_s=draw(st.one_of(st.just(0.001), num)), lane_cpu_s=draw(st.one_of(st.just(0.002), num)))
    elif kind == "mark":
        d["phase"] = draw(st.one_of(st.sampled_from(["decode_C1", "prefill"]), st.text(max_size=5), num))
    return json.dumps(d, allow_nan=True)


@st.composite
def probe_text(draw):
    n = draw(st.integers(0, 8))
    lines = [_line(draw, 1000.0 + 0.1 * i) for i in range(n)]
    text = "\n".join(lines) + ("\n" if draw(st.booleans()) else "")
    return text


@given(text=probe_text())
def test_fuzz_probe_file(tmp_path_factory, text):
    p = tmp_path_factory.getbasetemp() / "fuzz-probe.jsonl"
    p.write_text(text, encoding="utf-8", errors="surrogatepass")
    hw = spec.load_record("hardware", "local-cpu")

    def work():
        rep = probe.report(p, hw)
        strictjson.dumps(rep)                      # what `probe report` prints: strict JSON, no NaN
        probe.to_markdown(rep)
        return 0
    outcome("probe file", work)
