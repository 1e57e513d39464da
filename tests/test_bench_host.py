"""benchmarks/bench_host.py: paired rounds alternate the sides and give B / A ratios of the medians (the runs are
faked here: each is a minute of `moetier run`); host.md and host-prefetch.md are the tables of their JSON; bad
paths exit 2."""
import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

import bench_host  # noqa: E402


def test_rounds_alternate_and_ratio_the_medians():
    order = []
    plan = {"A": [2.0, 4.0, 3.0], "B": [1.0, 1.5, 9.0]}

    def fake(tree, a):
        order.append(tree)
        p = plan[tree].pop(0)
        return {"1": {"plan": p, "bookkeeping": 1.0, "tok_s": 10.0}}

    a = argparse.Namespace(rounds=3, steps=5, recipe="r")
    res = bench_host.rounds({"A": "A", "B": "B"}, a, run=fake)
    assert order == ["A", "B", "B", "A", "A", "B"]
    assert res["sides"]["A"]["1"]["plan"]["median"] == 3.0
    assert res["sides"]["B"]["1"]["plan"]["median"] == 1.5
    assert res["ratio_b_over_a"]["1"]["plan"] == 0.5


def test_host_md_is_the_recorded_run():
    bench = Path(bench_host.__file__).parent
    for name in ("host", "host-prefetch"):
        res = json.loads((bench / f"{name}.json").read_text())
        assert (bench / f"{name}.md").read_text() == bench_host.table(res) + "\n"


def test_a_missing_store_is_one_line_and_exit_2(tmp_path, capsys):
    assert bench_host.main(["--store", str(tmp_path / "none"), "--against", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--store" in err[0] and "expected a directory" in err[0]


def test_an_against_without_moetier_is_one_line_and_exit_2(tmp_path, capsys):
    assert bench_host.main(["--store", str(tmp_path), "--against", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"bench_host: --against {tmp_path}: expected a directory holding moetier/"]
