"""benchmarks/bench_disk_drift.py: real O_DIRECT reads from a packed store, per window; bad arguments exit 2."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_disk_drift.py"
_spec = importlib.util.spec_from_file_location("bench_disk_drift", _PATH)
dd = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(dd)


def test_windows_and_their_spread_around_the_median(tiny_ci_store):
    r = dd.drift(tiny_ci_store, seconds=0.6, window=0.2, pause_s=0.0)
    assert len(r["windows_ms"]) >= 2 and all(w > 0 for w in r["windows_ms"])
    assert r["min_ms"] <= r["p10_ms"] <= r["median_ms"] <= r["p90_ms"] <= r["max_ms"]
    assert r["rel_p10"] <= 1.0 <= r["rel_p90"]


@pytest.mark.parametrize("argv", [["--seconds", "0"], ["--seconds", "1", "--window", "2"]])
def test_bad_arguments_exit_2(tiny_ci_store, argv, capsys):
    assert dd.main(["--store", tiny_ci_store, *argv]) == 2
    assert "bench_disk_drift:" in capsys.readouterr().err


def test_a_folder_that_is_no_store_exits_2(tmp_path, capsys):
    assert dd.main(["--store", str(tmp_path), "--seconds", "1", "--window", "1"]) == 2
    assert capsys.readouterr().err.startswith("bench_disk_drift: ")
