"""The command line: every user error is one line on stderr, exit status 2, no traceback."""
import json
import shutil

import numpy as np
import pytest

from moetier.cli.main import main


def run(capsys, *argv):
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def one_line_error(rc, err, *needles):
    assert rc == 2
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("moetier: error:"), err
    assert "Traceback" not in err
    for n in needles:
        assert n in lines[0], (n, lines[0])


def test_show_json_is_stable_and_has_capacity(capsys):
    rc, out, _ = run(capsys, "show", "glm53-rtx3090-55g-nvx4", "--json")
    d = json.loads(out)
    assert rc == 0 and (d["vram_slots"], d["ram_slots"], d["nvme_only"]) == (1510, 5087, 5499)


def test_python_dash_m_and_console_script_agree(capsys):
    import subprocess
    import sys
    a = subprocess.run([sys.executable, "-m", "moetier", "show", "tiny-ci-cpu", "--json"], capture_output=True,
                       text=True, check=True).stdout
    rc, b, _ = run(capsys, "show", "tiny-ci-cpu", "--json")
    assert json.loads(a) == json.loads(b)


def test_sim_json(capsys):
    rc, out, _ = run(capsys, "sim", "tiny-ci-cpu", "--conc", "1", "--steps", "20", "--json")
    d = json.loads(out)
    assert rc == 0 and d["conc"] == 1 and d["tok_s"] > 0 and "prefetch" in d


@pytest.mark.parametrize("argv,needles", [
    (["show", "no-such-recipe"], ["unknown recipe id 'no-such-recipe'"]),
    (["show", "../etc/passwd"], ["not a valid record id"]),
    (["show", "glm53-rtx3090-55g-nvx4", "--set", "policy.prefetch.recal=0.7"], ["policy.prefetch.recal"]),
    (["show", "glm53-rtx3090-55g-nvx4", "--set", "budget.ram_gb=abc"], ["$.budget.ram_gb", "expected number"]),
    (["show", "glm53-rtx3090-55g-nvx4", "--set", "budget"], ["budget"]),
    (["sim", "tiny-ci-cpu", "--trace", "no/such/trace.npz"], ["no/such/trace.npz"]),
    (["frobnicate"], ["frobnicate"]),
    (["run", "tiny-ci-cpu", "--store", "/nonexistent/store"], ["/nonexistent/store"]),
    (["run", "tiny-ci-cpu", "--store", "/tmp", "--backend", "nope"], []),
    (["sim", "tiny-ci-cpu", "--conc", "0"], ["--conc", "positive integer"]),
    (["sim", "tiny-ci-cpu", "--steps", "-3"], ["--steps"]),
    (["sim", "tiny-ci-cpu", "--window", "2", "--accept", "0"], ["--accept"]),
    (["run", "tiny-ci-cpu", "--store", "/tmp", "--verify-rate", "5"], ["--verify-rate", "[0, 1]"]),
    (["calibrate", "tiny-ci-cpu", "--store", "/tmp", "--repeats", "0"], ["--repeats"]),
    (["sim", "tiny-ci-cpu", "--set", "budget.vram_expert_slots=10"], ["gpu lane"]),
])
def test_bad_input_is_one_line_exit_2(capsys, argv, needles):
    rc, _, err = run(capsys, *argv)
    one_line_error(rc, err, *needles)


def test_trace_with_out_of_range_ids_and_wrong_shape(capsys, tmp_path):
    from moetier.traces.format import Trace, save_trace
    ids = np.zeros((10, 8, 4), np.int16)
    ids[3, 2, 1] = 99
    save_trace(Trace(ids=ids, segments=np.array([0, 10])), tmp_path / "bad.npz")
    rc, _, err = run(capsys, "sim", "tiny-ci-cpu", "--trace", str(tmp_path / "bad.npz"))
    one_line_error(rc, err, "bad.npz", "out of range")
    save_trace(Trace(ids=np.zeros((10, 5, 4), np.int16), segments=np.array([0, 10])), tmp_path / "shape.npz")
    rc, _, err = run(capsys, "sim", "tiny-ci-cpu", "--trace", str(tmp_path / "shape.npz"))
    one_line_error(rc, err, "shape.npz", "8 layers")


def test_malformed_record_in_registry(capsys, tmp_path, monkeypatch):
    from moetier.core import records as spec
    root = tmp_path / "registry"
    shutil.copytree(spec.REGISTRY, root)
    p = root / "recipe" / "tiny-ci-cpu.json"
    rec = json.loads(p.read_text())
    rec["engines"] = ["no-such-engine"]
    p.write_text(json.dumps(rec))
    monkeypatch.setattr(spec, "REGISTRY", root)
    rc, _, err = run(capsys, "show", "tiny-ci-cpu")
    one_line_error(rc, err, "tiny-ci-cpu.json", "$.engines[0]", "no-such-engine")


def test_trace_gen_stats_convert_round_trip(capsys, tmp_path):
    out = tmp_path / "g.npz"
    rc, _, _ = run(capsys, "trace", "gen", "--model", "moetier-tiny-ci-int8", "--out", str(out), "--tokens", "200",
                   "--segments", "2", "--params", '{"zipf_s": 1.2, "reuse": 0.3}')
    assert rc == 0 and out.exists()
    rc, txt, _ = run(capsys, "trace", "stats", str(out), "--model", "moetier-tiny-ci-int8", "--json")
    d = json.loads(txt)
    assert rc == 0 and "cache" in d
    rc, _, _ = run(capsys, "trace", "convert", str(out), str(tmp_path / "g.npy"))
    assert rc == 0 and (tmp_path / "g.segments.npy").exists()
