"""Inputs read strictly and bounded before anything is allocated: config.json, plot inputs and router logs refuse
NaN/Infinity with the field named, deep nesting is one line, sizes are checked against stated bounds, and the MoE
geometry is linear in the layer count."""
import json
import time

import pytest

from tests._cli import one_line, run_cli

CONFIG = {"hidden_size": 64, "num_local_experts": 8, "num_experts_per_tok": 2, "intermediate_size": 32,
          "num_hidden_layers": 4, "torch_dtype": "bfloat16"}




@pytest.fixture
def model_dir(tmp_path):
    def make(text):
        d = tmp_path / "m"
        d.mkdir(exist_ok=True)
        (d / "config.json").write_text(text)
        return str(d)
    return make


@pytest.mark.parametrize("text, needle", [
    (json.dumps(CONFIG).replace('"intermediate_size": 32', '"intermediate_size": 32, "swiglu_limit": NaN'), "NaN"),
    (json.dumps(CONFIG).replace('"intermediate_size": 32', '"intermediate_size": 32, "swiglu_limit": 1e999'),
     "1e999"),
    (json.dumps(CONFIG).replace('"intermediate_size": 32', '"intermediate_size": 32, "x": -Infinity'),
     "-Infinity"),
    ("[" * 100000 + "]" * 100000, "nested too deeply"),
])
def test_model_import_refuses_non_finite_numbers_and_deep_nesting(model_dir, tmp_path, text, needle):
    rc, out, err = run_cli(["model", "import", model_dir(text), "--out", str(tmp_path / "rec.json")])
    one_line(rc, err, "config.json", needle)
    assert not (tmp_path / "rec.json").exists()


def test_model_import_writes_standard_json(model_dir, tmp_path):
    rc, out, err = run_cli(["model", "import", model_dir(json.dumps(CONFIG)), "--out", str(tmp_path / "rec.json")])
    assert rc == 0, err
    text = (tmp_path / "rec.json").read_text()
    json.loads(text, parse_constant=lambda c: pytest.fail(f"bare {c} written"))


def test_a_million_layers_are_refused_at_once(model_dir):
    cfg = dict(CONFIG, num_hidden_layers=1_000_000)
    t0 = time.monotonic()
    rc, out, err = run_cli(["model", "import", model_dir(json.dumps(cfg))])
    one_line(rc, err, "num_hidden_layers", "at most 4096")
    assert time.monotonic() - t0 < 5


def test_dense_layers_is_linear():
    from moetier.bytes.hf_config import MoeGeometry
    n = 20000                   # quadratic (a set built per layer) takes seconds here; linear takes milliseconds
    g = MoeGeometry("x", 64, 32, 8, 2, 0, n, tuple(range(0, n, 2)))
    t0 = time.monotonic()
    assert g.dense_layers == list(range(1, n, 2))
    assert time.monotonic() - t0 < 0.5


def test_plot_compare_refuses_non_finite_rows(tmp_path):
    for i, rows in enumerate(['[{"policy": "a", "conc": 1, "tok_s": NaN}]',
                              '[{"policy": "a", "conc": 1, "tok_s": Infinity}]',
                              '{"policy": "a", "conc": 1, "tok_s": 3}\n{"policy": "b", "conc": 1, "tok_s": NaN}\n',
                              '[{"policy": "a", "conc": 1, "tok_s": "NaN"}]',
                              '[{"policy": "a", "conc": "x", "tok_s": 1}]']):
        src = tmp_path / f"rows{i}.json"
        src.write_text(rows)
        rc, out, err = run_cli(["plot", "compare", str(src), "--out", str(tmp_path / "c.png")])
        one_line(rc, err)
        assert "NaN" in err or "Infinity" in err or "conc a positive integer" in err, err
        assert not (tmp_path / "c.png").exists()


@pytest.mark.parametrize("log, suffix, needle", [
    ('{"token": 0, "layer": 1000000000, "experts": [1, 2]}\n', "jsonl", "field 'layer' is 1000000000"),
    ('{"token": 0, "layer": 0, "experts": [1, 2], "weights": [NaN, 0.5]}\n', "jsonl", "NaN"),
    ("token,layer,experts0,experts1,weights0,weights1\n0,0,1,2,nan,0.5\n", "csv", "gate weight 'nan'"),
    ("token,layer,experts0,experts1,weights0,weights1\n0,0,1,2,inf,0.5\n", "csv", "gate weight 'inf'"),
    ('{"token": 0, "layer": 0, "experts": [1, 99999999999]}\n', "jsonl", "expert id 99999999999"),
    ('{"token": 0, "layer": 0, "experts": [' + ",".join(map(str, range(2000))) + ']}\n', "jsonl",
     "2000 expert ids"),
])
def test_trace_import_bounds_and_finite_weights(tmp_path, log, suffix, needle):
    src = tmp_path / f"log.{suffix}"
    src.write_text(log)
    t0 = time.monotonic()
    rc, out, err = run_cli(["trace", "import", str(src), "--out", str(tmp_path / "t.npz")])
    one_line(rc, err, needle)
    assert time.monotonic() - t0 < 5 and not (tmp_path / "t.npz").exists()


def test_trace_import_bounds_the_trace_before_allocating(tmp_path, monkeypatch):
    from moetier.errors import UserError
    from moetier.traces import importer
    monkeypatch.setattr(importer, "MAX_PICKS", 100)
    src = tmp_path / "log.jsonl"
    src.write_text("".join(json.dumps({"token": t, "layer": l, "experts": [1, 2]}) + "\n"
                           for t in range(10) for l in range(6)))
    with pytest.raises(UserError, match="10 tokens x 6 layers x top-2 is over 100 picks"):
        importer.import_log(src)
    with pytest.raises(UserError, match="--layers 5000: expected at most 4096"):
        importer.import_log(src, layers=5000)


@pytest.mark.parametrize("grid, needle", [("budget.ram_gb=NaN,1", "NaN is not a finite number"),
                                          ("budget.ram_gb=" + "[" * 5000 + "]" * 5000, "nested too deeply")])
def test_sweep_grid_values_are_strict(grid, needle, tmp_path):
    rc, out, err = run_cli(["sweep", "tiny-ci-cpu", "--grid", grid, "--out", str(tmp_path / "s.jsonl")])
    one_line(rc, err, "--grid budget.ram_gb=", needle)
    assert len(err) < 300 and list(tmp_path.iterdir()) == []


def test_a_registry_kind_that_is_a_file_is_refused_before_work(user_registry, tmp_path):
    user_registry.mkdir()
    (user_registry / "runs").write_text("not a folder")
    rc, out, err = run_cli(["run", "tiny-ci-cpu", "--store", str(tmp_path / "no-store"), "--record", "r1"])
    one_line(rc, err, "runs", "not a folder")


def test_inputs_that_never_end_are_refused(tmp_path):
    import os
    os.mkfifo(tmp_path / "fifo")
    for argv, needle in (
            (["plot", "compare", str(tmp_path / "fifo"), "--out", str(tmp_path / "c.png")], "regular file"),
            (["model", "import", str(tmp_path / "fifo")], "no config.json"),
            (["trace", "import", str(tmp_path / "fifo"), "--format", "jsonl", "--out", str(tmp_path / "t.npz")],
             "regular file"),
            (["plot", "compare", "/dev/zero", "--out", str(tmp_path / "c.png")], "regular file")):
        rc, out, err = run_cli(argv)
        one_line(rc, err, needle)
