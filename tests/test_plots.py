"""Every figure kind renders headless to a real PNG with content, from real data where it is cheap to make."""
import json

import numpy as np
import pytest

pytest.importorskip("matplotlib", reason="plots need matplotlib (pip install 'moetier[plot]')")

from moetier.cli import plots  # noqa: E402
from moetier.cli.main import main  # noqa: E402
from moetier.core import records as spec  # noqa: E402
from moetier.core import sim  # noqa: E402
from moetier.errors import UserError  # noqa: E402
from moetier.traces.format import load_trace  # noqa: E402



def check_png(path, min_colours: int = 8):
    """A PNG signature, decodes with matplotlib, is not blank and has more than ``min_colours`` distinct colours."""
    import matplotlib.image as mpimg
    with open(path, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    img = mpimg.imread(path)
    assert img.ndim == 3 and img.shape[0] > 100 and img.shape[1] > 100
    px = (img[..., :3] * 255).astype(np.uint8).reshape(-1, 3)
    colours = np.unique(px, axis=0)
    assert len(colours) > min_colours, len(colours)
    # not blank: a fair share of the pixels is not the background (white)
    assert (px.min(axis=1) < 250).mean() > 0.02


@pytest.fixture(scope="module")
def tiny():
    R = spec.resolve("tiny-ci-cpu")
    tr = load_trace(spec.REGISTRY.parent / R.trace, layers=R.layers, experts=R.experts, topk=R.topk)
    return R, tr


def test_timeline_from_a_real_replay(tiny, tmp_path):
    R, tr = tiny
    res = [sim.run(R, tr, c, max_steps=60, timeline=True) for c in (1, 2)]
    tl = res[0]["timeline"]
    n = res[0]["steps"]
    assert all(len(v) == n for v in tl.values())
    # the per-step counts add up to the run's per-token figures
    assert sum(tl["nvme"]) / res[0]["tokens"] == pytest.approx(res[0]["nvme_per_tok"])
    assert sum(tl["ram"]) / res[0]["tokens"] == pytest.approx(res[0]["cpu_experts_per_tok"]
                                                              + res[0]["zerocopy_per_tok"])
    assert sum(tl["ms"]) / n == pytest.approx(res[0]["ms_per_step"])
    assert max(tl["ram_used"]) <= R.ram_slots
    # recording the timeline does not change the replay
    plain = sim.run(R, tr, 1, max_steps=60)
    assert plain["tok_s"] == res[0]["tok_s"] and "timeline" not in plain
    check_png(plots.plot_timeline(res, tmp_path / "timeline.png"))


def test_levers_and_compare_from_real_replays(tiny, tmp_path):
    R0, tr = tiny
    rows, cmp = [], []
    for name, sets in (("base", []), ("+ more RAM", ["budget.ram_gb=0.03"])):
        R = spec.resolve("tiny-ci-cpu", spec.parse_overrides(sets))
        rows.append({"lever": name, "tok_s": {str(c): sim.run(R, tr, c, max_steps=30)["tok_s"] for c in (1, 2)}})
    for pol in ("lru", "lfu"):
        R = spec.resolve("tiny-ci-cpu", spec.parse_overrides([f"policy.ram_evict={pol}"]))
        cmp += [{"policy": pol, "conc": c, "tok_s": sim.run(R, tr, c, max_steps=30)["tok_s"]} for c in (1, 2)]
    check_png(plots.plot_levers(rows, tmp_path / "levers.png"))
    check_png(plots.plot_compare(cmp, tmp_path / "compare.png"))


def test_cache_curves_lru_never_beats_belady(tiny, tmp_path):
    R, tr = tiny
    curves = plots.layer_curves(tr, R.experts, sizes=[2, 4, 8, 16])
    assert set(curves) == {"layer 0", "layer 2", "layer 5", "layer 7"}
    for c in curves.values():
        assert all(a <= b + 1e-12 for a, b in zip(c["lru"], c["belady"]))
        assert c["belady"] == sorted(c["belady"])
    check_png(plots.plot_cache(curves, tmp_path / "cache.png"))


def test_calibration_and_waterfall_from_shipped_records(tmp_path, capsys):
    runs = spec.record_ids("runs")
    cal = next(r for r in reversed(runs) if r.startswith("calibration-"))
    assert main(["plot", "calibration", cal, "--out", str(tmp_path / "cal.png")]) == 0
    check_png(tmp_path / "cal.png")
    probed = next(r for r in runs if "probed" in r)
    assert main(["plot", "waterfall", probed, "--out", str(tmp_path / "wf.png")]) == 0
    check_png(tmp_path / "wf.png")


def test_plot_cli_compare_reads_json_lines(tmp_path, capsys):
    src = tmp_path / "rows.jsonl"
    src.write_text("\n".join(json.dumps({"policy": p, "conc": c, "tok_s": 10.0 * c + (p == "lfu")})
                             for p in ("lru", "lfu") for c in (1, 2, 4)) + "\n")
    assert main(["plot", "compare", str(src), "--out", str(tmp_path / "c.png")]) == 0
    assert "wrote" in capsys.readouterr().out
    check_png(tmp_path / "c.png")


@pytest.mark.parametrize("argv,needle", [
    (["plot", "calibration", "tiny-ci-cpu-no-such-run", "--out", "x.png"], "tiny-ci-cpu-no-such-run"),
    (["plot", "levers", "/nonexistent.json", "--out", "x.png"], "/nonexistent.json"),
    (["plot", "waterfall", "calibration-tiny-local-cpu-2026-12-02zg", "--out", "x.png"], "chokepoints"),
])
def test_plot_bad_input_is_one_line(argv, needle, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and needle in err
    assert not (tmp_path / "x.png").exists()


def test_plot_functions_refuse_wrong_data(tmp_path):
    with pytest.raises(UserError, match="policy, conc, tok_s"):
        plots.plot_compare([{"policy": "x"}], tmp_path / "x.png")
    with pytest.raises(UserError, match="timeline"):
        plots.plot_timeline([{"conc": 1}], tmp_path / "x.png")
    assert not (tmp_path / "x.png").exists()
