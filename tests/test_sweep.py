"""moetier sweep: the grid, resumable JSON lines, the pool, and Ray giving the pool's results."""
import json

import pytest

from moetier.cli.main import main
from moetier.core import records as spec
from moetier.core import sim
from moetier.measure import sweep as S
from moetier.traces.format import load_trace

GRID = dict(grid=["budget.ram_gb=0.01,0.015"], concs=[1, 2], policies=["lru", "lfu"], steps=12)


def strip(rows):
    return {r["key"]: {k: v for k, v in r.items() if k not in S.TIMING_FIELDS} for r in rows}


def test_grid_is_the_cartesian_product_with_stable_keys():
    cells = S.cells("tiny-ci-cpu", **GRID)
    assert len(cells) == 2 * 2 * 2
    assert {(c["overrides"][0], c["conc"], c["policy"]) for c in cells} == {
        (f"budget.ram_gb={g}", c, p) for g in ("0.01", "0.015") for c in (1, 2) for p in ("lru", "lfu")}
    keys = [S.cell_key(c) for c in cells]
    assert len(set(keys)) == len(keys)
    # the key is the cell's, not its position: the same cell from a grid written in another order
    other = S.cells("tiny-ci-cpu", grid=["budget.ram_gb=0.015,0.01"], concs=[2, 1], policies=["lfu", "lru"],
                    steps=12)
    assert sorted(S.cell_key(c) for c in other) == sorted(keys)


@pytest.mark.parametrize("item,values", [("budget.ram_gb=30,55,100", ["30", "55", "100"]),
                                         ("policy.ram_evict=lru,lfu:32", ['"lru"', '"lfu:32"']),
                                         ('calibration.fixed_ms={"1": 9},{"1": 10}', ['{"1": 9}', '{"1": 10}'])])
def test_axis_values_parse_as_json_else_strings(item, values):
    assert S.parse_axis(item)[1] == values


def test_a_short_replay_equals_the_whole_segment_replay():
    """The simulator turns only the tokens a replay steps through into lists (Streams span): same figures."""
    R = spec.resolve("tiny-ci-cpu")
    tr = load_trace(spec.REGISTRY.parent / R.trace, layers=R.layers, experts=R.experts, topk=R.topk)
    a = sim.Streams(tr, 3, R.topk, R.experts, offsets=[0, 5, 997])
    b = sim.Streams(tr, 3, R.topk, R.experts, offsets=[0, 5, 997], span=20)
    for step in range(20):
        ra, rb = a.rows(step), b.rows(step)
        for layer in range(R.layers):
            assert a.picks(ra, layer) == b.picks(rb, layer)
            assert a.local_rows(ra, layer) == b.local_rows(rb, layer)


def test_pool_sweep_appends_resumes_and_cuts_a_torn_line(tmp_path):
    out = tmp_path / "r.jsonl"
    cells = S.cells("tiny-ci-cpu", **GRID)
    s = S.sweep(cells[:5], out, workers=2)
    assert (s["ran"], s["skipped"]) == (5, 0) and len(out.read_text().splitlines()) == 5
    with open(out, "a") as f:
        f.write('{"key": "torn')                       # a run killed mid-line
    s = S.sweep(cells, out, workers=2)
    assert (s["ran"], s["skipped"]) == (3, 5)
    rows = S.read_rows(out)
    assert len(rows) == 8 and {r["key"] for r in rows} == {S.cell_key(c) for c in cells}
    # a row is the simulator's figures for its cell
    r = next(r for r in rows if r["conc"] == 2 and r["policy"] == "lfu" and r["overrides"] == ["budget.ram_gb=0.01"])
    R = spec.resolve("tiny-ci-cpu", spec.parse_overrides(["budget.ram_gb=0.01", "policy.ram_evict=lfu"]))
    ref = sim.run(R, load_trace(spec.REGISTRY.parent / R.trace, layers=R.layers, experts=R.experts, topk=R.topk), 2, max_steps=12)
    assert r["tok_s"] == ref["tok_s"] and r["nvme_per_tok"] == ref["nvme_per_tok"]
    assert S.sweep(cells, out, workers=2)["ran"] == 0


def test_sweep_cli_and_bad_grid(tmp_path, capsys):
    out = tmp_path / "r.jsonl"
    rc = main(["sweep", "tiny-ci-cpu", "--grid", "budget.ram_gb=0.01,0.015", "--conc", "1", "--steps", "8",
               "--workers", "1", "--out", str(out), "--json", "--plot", str(tmp_path / "s.png")])
    d = json.loads(capsys.readouterr().out)
    assert rc == 0 and d["summary"]["ran"] == 2 and len(d["rows"]) == 2 and (tmp_path / "s.png").stat().st_size
    rc = main(["sweep", "tiny-ci-cpu", "--grid", "budget.ram_gbb=1,2", "--out", str(tmp_path / "bad.jsonl")])
    err = capsys.readouterr().err
    assert rc == 2 and "budget.ram_gbb" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "bad.jsonl").exists()
    rc = main(["sweep", "tiny-ci-cpu", "--grid", "budget.ram_gb", "--out", str(out)])
    assert rc == 2 and "PATH=V1,V2" in capsys.readouterr().err


def test_ray_local_gives_the_pools_results(tmp_path):
    pytest.importorskip("ray", reason="Ray is an optional extra (pip install 'moetier[ray]')")
    cells = S.cells("tiny-ci-cpu", **GRID)
    S.sweep(cells, tmp_path / "pool.jsonl", workers=2)
    s = S.sweep(cells, tmp_path / "ray.jsonl", workers=2, ray="local", batch=2)
    assert s["ran"] == len(cells) and s["backend"] == "ray local"
    a, b = strip(S.read_rows(tmp_path / "pool.jsonl")), strip(S.read_rows(tmp_path / "ray.jsonl"))
    assert len(a) == len(cells) and a == b
