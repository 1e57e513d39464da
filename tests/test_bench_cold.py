"""benchmarks/bench_cold.py: a real (short) measurement in this process gives every figure cold and warm; rounds
alternate the sides and give B / A of the medians (the runs faked here); the recorded table is its JSON's; bad
arguments are one line and exit 2."""
import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

import bench_cold  # noqa: E402


def test_a_short_real_run_times_every_figure_cold_and_warm():
    got = bench_cold.measure(8, 20)
    assert set(got) == {"plan", *bench_cold.PRIMITIVES}
    for fig in got.values():
        for kind in ("cold", "warm"):
            s = fig[kind]
            assert 0 < s["min"] <= s["median"] <= s["max"]
    # the stream does leave the caches cold: the glue's operations cost several times their warm cost there
    cold, warm = (sum(got[f][kind]["median"] for f in bench_cold.PRIMITIVES) for kind in ("cold", "warm"))
    assert cold > 2 * warm, (cold, warm)


def test_rounds_alternate_and_ratio_the_medians():
    order = []
    med = {"A": [4.0, 2.0, 3.0], "B": [1.0, 9.0, 1.5]}

    def fake(tree, a):
        order.append(tree)
        m = med[tree].pop(0)
        return {f: {kind: {"min": m, "median": m, "max": m} for kind in ("cold", "warm")}
                for f in ("plan", *bench_cold.PRIMITIVES)}

    res = bench_cold.rounds({"A": "A", "B": "B"}, argparse.Namespace(rounds=3, mb=1.0, calls=5), run=fake)
    assert order == ["A", "B", "B", "A", "A", "B"]
    assert res["sides"]["A"]["plan"]["cold"]["median"] == 3.0 and res["sides"]["B"]["plan"]["cold"]["median"] == 1.5
    assert res["ratio_b_over_a"]["plan"]["warm"] == 0.5
    assert "| plan_layer | 2.00 / 3.00 / 4.00 | 1.00 / 1.50 / 9.00 |" in bench_cold.table(res)


def test_the_recorded_table_is_its_json():
    bench = Path(bench_cold.__file__).parent
    res = json.loads((bench / "cold.json").read_text())
    assert (bench / "cold.md").read_text() == bench_cold.table(res) + "\n"


def test_bad_arguments_are_one_line_and_exit_2(tmp_path, capsys):
    for argv in (["--mb", "0"], ["--calls", "0"], ["--against", str(tmp_path)]):
        assert bench_cold.main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("bench_cold: --"), err
