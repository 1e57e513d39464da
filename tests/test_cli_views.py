"""`trace stats` and `calibrate` print tables through the renderer: markdown when piped, one row per item."""
import json

from moetier.cli.calibrate_view import print_calibration
from moetier.cli.main import main
from moetier.core import records as spec
from moetier.measure import calibrate


def _md_rows(txt: str, first_cell: str) -> list[list[str]]:
    """Rows of the markdown table whose header starts with ``first_cell``."""
    lines = txt.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith(f"| {first_cell} |"))
    rows = []
    for ln in lines[start + 2:]:
        if not ln.startswith("|"):
            break
        rows.append([c.strip() for c in ln.strip("|").split("|")])
    return rows


def test_trace_stats_prints_markdown_tables_when_piped(capsys, tmp_path):
    out = tmp_path / "g.npz"
    assert main(["trace", "gen", "--model", "moetier-tiny-ci-int8", "--out", str(out), "--tokens", "120"]) == 0
    capsys.readouterr()
    assert main(["trace", "stats", str(out), "--model", "moetier-tiny-ci-int8", "--layer-sizes", "2,4"]) == 0
    txt = capsys.readouterr().out
    assert main(["trace", "stats", str(out), "--model", "moetier-tiny-ci-int8", "--layer-sizes", "2,4",
                 "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    per_layer = _md_rows(txt, "layer")
    assert [r[0] for r in per_layer] == [str(p["layer"]) for p in d["per_layer"]]
    assert per_layer[0][1] == f"{d['per_layer'][0]['entropy_norm']:.3f}"
    curve = _md_rows(txt, "slots")
    assert len(curve) == len(d["cache"]["sizes"]) and curve[0][2] == f"{100 * d['cache']['lru'][0]:.1f}%"
    assert [r[0] for r in _md_rows(txt, "slots per layer")] == ["2", "4"]
    assert "- LRU: least-recently-used" in txt           # the legend under the table


def newest_calibration() -> dict:
    recs = [json.loads(p.read_text()) for p in sorted((spec.REGISTRY / "runs").glob("calibration-*.json"))]
    return max(recs, key=lambda r: r["calibration"]["when"])


def test_calibration_prints_one_markdown_row_per_arm(capsys):
    res = newest_calibration()["calibration"]
    print_calibration(res, calibrate.BUCKETS, calibrate.NOISE_FLAG_PCT)
    txt = capsys.readouterr().out
    rows = _md_rows(txt, "arm")
    assert [r[0] for r in rows] == [r["arm"] for r in res["rows"]]
    assert rows[0][5] == f"{res['rows'][0]['error_pct']:+.1f}%"
    assert f"median |error| {res['summary']['median_abs_error_pct']:.1f}%" in txt
    assert _md_rows(txt, "fitted term")


def test_ablation_prints_a_row_per_removed_term(capsys):
    rec = sorted((spec.REGISTRY / "runs").glob("calibration-*.json"))[-1]
    assert main(["calibrate", "--ablate", str(rec), "--only", "host.per_layer_ms"]) == 0
    txt = capsys.readouterr().out
    assert [r[0] for r in _md_rows(txt, "removed")] == ["host.per_layer_ms"]
    assert len(_md_rows(txt, "record")) == 1
