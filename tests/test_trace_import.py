"""A user's real routing log in with one command: several files, multi-field request keys, token indices that restart
per request, npz segments, ``--missing`` on every command that reads a trace, and the OLMoE counts as package data.
Each test writes its own small log."""

import json
import tomllib
from pathlib import Path

import numpy as np
import pytest

from moetier.cli.main import build_parser, main
from moetier.errors import UserError
from moetier.traces.format import Trace, load_trace, save_trace
from moetier.traces.importer import Fields, import_log

# three requests of 4, 3 and 5 tokens over 2 layers, top-2 of 6 experts: (dataset, problem_id) names a request,
# problem_id alone does not (p1 is in both datasets), and the token index restarts at 0 in every request
REQS = [("gsm", "p1", 4), ("math", "p1", 3), ("gsm", "p2", 5)]


def _routing(r: int, t: int, l: int) -> list:
    a = (3 * r + t + 2 * l) % 6
    return [a, (a + 1 + r) % 6]


def _records():
    return [{"dataset": d, "problem_id": q, "tok": t, "layer": l, "experts": _routing(r, t, l)}
            for r, (d, q, n) in enumerate(REQS) for t in range(n) for l in range(2)]


def _expected():
    return np.array([[_routing(r, t, l) for l in range(2)] for r, (_, _, n) in enumerate(REQS) for t in range(n)])


def _write_jsonl(p: Path, recs) -> Path:
    p.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return p


def test_several_files_and_a_two_field_request_key(tmp_path):
    recs = _records()
    # split over three files: the first request's layer 1 in another file than its layer 0 (a log split by layer)
    a = [r for r in recs if (r["dataset"], r["problem_id"]) == ("gsm", "p1") and r["layer"] == 0]
    b = [r for r in recs if (r["dataset"], r["problem_id"]) == ("gsm", "p1") and r["layer"] == 1]
    c = [r for r in recs if (r["dataset"], r["problem_id"]) != ("gsm", "p1")]
    for name, part in (("log-0.jsonl", a), ("log-1.jsonl", b), ("log-2.jsonl", c)):
        _write_jsonl(tmp_path / name, part)
    f = Fields(token="tok", weights=None, segment="dataset,problem_id")
    tr = import_log([str(tmp_path / "log-*.jsonl")], f, experts=6)
    assert tr.ids.tolist() == _expected().tolist()
    assert tr.segments.tolist() == [0, 4, 7, 12]
    assert tr.meta["imported_from"] == ["log-0.jsonl", "log-1.jsonl", "log-2.jsonl"]
    # the same files named one by one give the same trace
    same = import_log([tmp_path / "log-0.jsonl", tmp_path / "log-1.jsonl", tmp_path / "log-2.jsonl"], f, experts=6)
    assert same.ids.tolist() == tr.ids.tolist() and same.segments.tolist() == tr.segments.tolist()
    # problem_id alone is not a request id: p1 of gsm and p1 of math collide on token 0
    with pytest.raises(UserError, match="a second record for token 0, layer 0"):
        import_log([str(tmp_path / "log-*.jsonl")], Fields(token="tok", weights=None, segment="problem_id"))


def test_token_indices_that_restart_start_a_segment_without_a_request_field(tmp_path):
    recs = [{k: v for k, v in r.items() if k not in ("dataset", "problem_id")} for r in _records()]
    p = _write_jsonl(tmp_path / "log.jsonl", recs)
    tr = import_log(p, Fields(token="tok", weights=None), experts=6)
    assert tr.ids.tolist() == _expected().tolist() and tr.segments.tolist() == [0, 4, 7, 12]
    # a log written layer by layer (all tokens of layer 0, then layer 1): the layer change is no restart
    one = [r for r in recs[:8]]
    q = _write_jsonl(tmp_path / "bylayer.jsonl", sorted(one, key=lambda r: (r["layer"], r["tok"])))
    t2 = import_log(q, Fields(token="tok", weights=None), experts=6)
    assert t2.segments.tolist() == [0, 4] and t2.ids.tolist() == _expected()[:4].tolist()


def test_a_csv_log_split_by_token_range_and_a_request_key(tmp_path):
    rows = ["dataset,problem_id,tok,layer,experts"] + [
        f'{r["dataset"]},{r["problem_id"]},{r["tok"]},{r["layer"]},"{r["experts"][0]} {r["experts"][1]}"'
        for r in _records()]
    (tmp_path / "a.csv").write_text("\n".join(rows[:9]) + "\n")
    (tmp_path / "b.csv").write_text("\n".join([rows[0]] + rows[9:]) + "\n")
    tr = import_log([tmp_path / "a.csv", tmp_path / "b.csv"], Fields(token="tok", weights=None,
                                                                      segment=("dataset", "problem_id")), experts=6)
    assert tr.ids.tolist() == _expected().tolist() and tr.segments.tolist() == [0, 4, 7, 12]


def test_npz_segments_are_kept(tmp_path):
    ids = _expected()
    dense = tmp_path / "dense.npz"
    np.savez(dense, experts=ids, segments=np.array([0, 4, 7, 12]))
    tr = import_log(dense, experts=6)
    assert tr.ids.tolist() == ids.tolist() and tr.segments.tolist() == [0, 4, 7, 12]
    # a moetier trace (ids, segments, meta) re-imports with its segments
    mt = tmp_path / "trace.npz"
    save_trace(Trace(ids=ids.astype(np.int16), segments=np.array([0, 4, 7, 12])), mt)
    assert import_log(mt, experts=6).segments.tolist() == [0, 4, 7, 12]
    # a [records, topk] npz with two segment arrays
    recs = _records()
    rec = tmp_path / "rec.npz"
    np.savez(rec, experts=np.array([r["experts"] for r in recs]), tok=np.array([r["tok"] for r in recs]),
             layer=np.array([r["layer"] for r in recs]), dataset=np.array([r["dataset"] for r in recs]),
             problem_id=np.array([r["problem_id"] for r in recs]))
    tr = import_log(rec, Fields(token="tok", segment="dataset,problem_id"), experts=6)
    assert tr.ids.tolist() == ids.tolist() and tr.segments.tolist() == [0, 4, 7, 12]
    np.savez(tmp_path / "badseg.npz", experts=ids, segments=np.array([0, 5, 4, 12]))
    with pytest.raises(UserError, match="badseg.npz: array 'segments' must be boundaries"):
        import_log(tmp_path / "badseg.npz")


def test_cli_import_several_files_and_bad_input(tmp_path, capsys):
    recs = _records()
    _write_jsonl(tmp_path / "x-a.jsonl", recs[:10])
    _write_jsonl(tmp_path / "x-b.jsonl", recs[10:])
    out = tmp_path / "t.npz"
    assert main(["trace", "import", str(tmp_path / "x-a.jsonl"), str(tmp_path / "x-b.jsonl"), "--out", str(out),
                 "--token-field", "tok", "--segment", "dataset,problem_id", "--experts", "6", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["tokens"] == 12 and d["segments"] == 3
    assert load_trace(out).ids.tolist() == _expected().tolist()
    for argv, want in (([str(tmp_path / "nothing-*.jsonl")], "no file matches"),
                       ([str(tmp_path / "x-a.jsonl"), "--segment", "dataset,,problem_id"], "--segment"),
                       ([str(tmp_path / "x-a.jsonl"), "--segment", "dataset,request"], "no field 'request'"),
                       ([str(tmp_path / "x-a.jsonl"), str(tmp_path / "x-*.jsonl")], "named twice")):
        bad = tmp_path / "bad.npz"
        assert main(["trace", "import", *argv, "--out", str(bad), "--token-field", "tok"]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and want in err and not bad.exists(), err


@pytest.fixture
def holed(tmp_path):
    """An npz with -1 holes and no meta saying so (a user's own file): 3 of 12 tokens have one."""
    ids = _expected().astype(np.int16)
    ids[1, 0, 1] = ids[5, 1, 0] = ids[8, 0, 0] = -1
    p = tmp_path / "holed.npz"
    np.savez(p, ids=ids, segments=np.array([0, 4, 7, 12]))
    return p


def test_trace_stats_fit_and_convert_take_missing(holed, tmp_path, capsys):
    assert main(["trace", "stats", str(holed), "--json"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "holed.npz" in err and "--missing" in err
    assert main(["trace", "stats", str(holed), "--json", "--missing", "drop"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["tokens"] == 9 and d["segments"] == 3
    assert main(["trace", "stats", str(holed), "--json", "--missing", "mask"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["tokens"] == 9 and d["masked_tokens_left_out"] == 3      # statistics leave masked tokens out
    out = tmp_path / "dropped.npz"
    assert main(["trace", "convert", str(holed), str(out)]) == 2
    capsys.readouterr()
    assert not out.exists()
    assert main(["trace", "convert", str(holed), str(out), "--missing", "drop"]) == 0
    tr = load_trace(out)
    assert tr.tokens == 9 and tr.segments.tolist() == [0, 3, 5, 9] and tr.meta["dropped_tokens"] == 3
    assert main(["trace", "fit", str(holed), "--experts", "6"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--missing" in err


def test_every_command_that_reads_a_trace_takes_missing():
    p = build_parser()
    for argv in (["trace", "stats", "t.npz"], ["trace", "fit", "t.npz"], ["trace", "convert", "a.npz", "b.npz"],
                 ["sim", "r", "--trace", "t.npz"], ["table", "r"], ["plot", "cache", "t.npz", "--out", "x.png"]):
        assert p.parse_args(argv + ["--missing", "drop"]).missing == "drop", argv


def test_load_trace_missing_modes(holed):
    with pytest.raises(UserError, match=r"holed.npz: 3 expert ids out of range 0..1048575.*--missing mask"):
        load_trace(holed)
    m = load_trace(holed, missing="mask")
    assert m.meta["missing"] == "mask" and int((m.ids < 0).sum()) == 3 and m.tokens == 12
    d = load_trace(holed, missing="drop")
    assert (d.ids >= 0).all() and d.tokens == 9 and d.segments.tolist() == [0, 3, 5, 9]
    assert d.ids.tolist() == np.delete(_expected(), [1, 5, 8], axis=0).tolist()
    with pytest.raises(UserError, match="--missing 'skip'"):
        load_trace(holed, missing="skip")


def test_olmoe_counts_ship_inside_the_package():
    import moetier.traces
    from moetier.traces.gen import OLMOE_COUNTS
    pkg = Path(moetier.traces.__file__).resolve().parent
    assert OLMOE_COUNTS.is_file() and pkg in OLMOE_COUNTS.resolve().parents
    with np.load(OLMOE_COUNTS, allow_pickle=False) as z:
        assert z["olmoe__expert_counts__arxiv"].shape == (3, 64)
    # the wheel carries it: pyproject's package data for moetier.traces matches the file and its notice
    root = Path(__file__).resolve().parents[1]
    pd = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["moetier.traces"]
    rel = OLMOE_COUNTS.resolve().relative_to(pkg)
    assert any(rel.match(g) for g in pd)
    assert any(q.name.endswith("NOTICE.md") and any(q.relative_to(pkg).match(g) for g in pd)
               for q in OLMOE_COUNTS.parent.iterdir())
