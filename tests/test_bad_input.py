"""Bad input of every kind: one line on stderr naming what was wrong, exit status 2, no traceback, nothing
half-written (issue 23's cases, one test each, named after what it feeds in)."""
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from moetier.cli.main import main
from moetier.core import records as spec

REPO = Path(__file__).resolve().parents[1]


def run(capsys, *argv):
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def one_line_error(rc, err, *needles):
    assert rc == 2, err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("moetier: error:"), err
    assert "Traceback" not in err
    for n in needles:
        assert n in lines[0], (n, lines[0])


@pytest.fixture
def reg(tmp_path, monkeypatch):
    """A private copy of the registry, made the CLI's registry: the shipped one and the one written to."""
    root = tmp_path / "registry"
    shutil.copytree(spec.REGISTRY, root)
    monkeypatch.setattr(spec, "REGISTRY", root)
    monkeypatch.setenv("MOETIER_REGISTRY", str(root))
    return root


def _set_text(root, kind, rid, edit):
    p = root / kind / f"{rid}.json"
    p.write_text(edit(p.read_text()))
    return p


def _unwritable_dir(tmp_path) -> Path:
    """A folder no one can create files in: mode 0555 for a normal user; root ignores modes, so for root a sysfs
    folder (creating a file there fails for root too)."""
    if os.geteuid() != 0:
        d = tmp_path / "ro"
        d.mkdir()
        d.chmod(0o555)
        return d
    d = Path("/sys/kernel")
    try:
        fd, tmp = tempfile.mkstemp(dir=d)
    except OSError:
        return d
    os.close(fd)
    os.unlink(tmp)
    raise AssertionError("running as root and /sys/kernel is writable: no unwritable folder to test with")


# ---- overrides --------------------------------------------------------------------------------------------------
def test_set_nan_is_refused(capsys):
    rc, _, err = run(capsys, "show", "tiny-ci-cpu", "--set", "budget.ram_gb=NaN")
    one_line_error(rc, err, "--set budget.ram_gb=NaN", "not a finite number")


def test_set_infinity_is_refused(capsys):
    for v in ("Infinity", "-Infinity", "1e999"):
        rc, _, err = run(capsys, "show", "tiny-ci-cpu", "--set", f"budget.ram_gb={v}")
        one_line_error(rc, err, f"budget.ram_gb={v}", "not a finite number")


def test_set_nan_lane_cost_is_refused(capsys):
    rc, _, err = run(capsys, "sim", "tiny-ci-cpu", "--steps", "3", "--set", "lane_overrides.cpu.per_expert_ms=NaN")
    one_line_error(rc, err, "per_expert_ms=NaN", "not a finite number")


def test_set_fixed_ms_infinity_is_refused(capsys):
    rc, _, err = run(capsys, "sim", "tiny-ci-cpu", "--steps", "3", "--set", 'calibration.fixed_ms={"1": Infinity}')
    one_line_error(rc, err, "calibration.fixed_ms", "Infinity is not a finite number")


# ---- records ------------------------------------------------------------------------------------------------------
def test_recipe_record_with_nan(capsys, reg):
    _set_text(reg, "recipe", "tiny-ci-cpu", lambda t: t.replace('"ram_gb": 0.015', '"ram_gb": NaN'))
    rc, _, err = run(capsys, "show", "tiny-ci-cpu")
    one_line_error(rc, err, "tiny-ci-cpu.json", "NaN is not a finite number", "line")


def test_recipe_record_with_fixed_ms_infinity(capsys, reg):
    _set_text(reg, "recipe", "tiny-ci-cpu", lambda t: t.replace('"1": 1.0,', '"1": Infinity,', 1))
    rc, _, err = run(capsys, "sim", "tiny-ci-cpu", "--steps", "3", "--json")
    one_line_error(rc, err, "tiny-ci-cpu.json", "Infinity")


def test_engine_record_with_nan_lane_cost(capsys, reg):
    p = reg / "engine" / "numba-cpu.json"
    rec = json.loads(p.read_text())
    rec["lanes"]["cpu"]["per_expert_ms"] = float("nan")
    p.write_text(json.dumps(rec))                    # Python's json writes the NaN token
    rc, _, err = run(capsys, "sim", "tiny-ci-cpu", "--steps", "3", "--json")
    one_line_error(rc, err, "numba-cpu.json", "NaN is not a finite number")


def test_deeply_nested_record(capsys, reg):
    p = reg / "recipe" / "tiny-ci-cpu.json"
    rec = json.loads(p.read_text())
    p.write_text(json.dumps(rec)[:-1] + ', "serve": ' + "[" * 100000 + "]" * 100000 + "}")
    rc, _, err = run(capsys, "show", "tiny-ci-cpu")
    one_line_error(rc, err, "tiny-ci-cpu.json", "nested too deeply")
    p.write_text(json.dumps(rec)[:-1] + ', "serve": ' + '{"a":' * 200 + "1" + "}" * 200 + "}")
    rc, _, err = run(capsys, "show", "tiny-ci-cpu")
    one_line_error(rc, err, "tiny-ci-cpu.json", "nested too deeply")


def test_missing_schema_file(capsys, monkeypatch, tmp_path):
    root = tmp_path / "registry"
    shutil.copytree(spec.REGISTRY, root)
    (root / "schema" / "recipe.schema.json").unlink()
    monkeypatch.setattr(spec, "REGISTRY", root)       # no shipped schema to fall back on either
    spec._SCHEMAS.clear()
    rc, _, err = run(capsys, "show", "tiny-ci-cpu")
    one_line_error(rc, err, "recipe.schema.json", "cannot be read")


def test_model_layers_1e308(capsys, reg):
    _set_text(reg, "model", "moetier-tiny-ci-int8", lambda t: t.replace('"layers": 8', '"layers": 1e308'))
    rc, _, err = run(capsys, "show", "tiny-ci-cpu")
    one_line_error(rc, err, "moetier-tiny-ci-int8.json", "$.moe.layers", "<= 4096")


def test_hardware_infinity_bandwidth(capsys, reg):
    for literal in ("Infinity", "1e999", "1e300"):
        _set_text(reg, "hardware", "local-cpu", lambda t: _with_bw(t, literal))
        rc, _, err = run(capsys, "sim", "tiny-ci-cpu", "--steps", "3")
        one_line_error(rc, err, "local-cpu.json")
        assert ("$.nvme.bw_gbps" in err) if literal == "1e300" else ("not a finite number" in err)


def _with_bw(text, literal):
    rec = json.loads(text, parse_constant=lambda c: 0.0, parse_float=lambda s: 1.0 if "e" in s else float(s))
    rec["nvme"]["bw_gbps"] = "@BW@"
    return json.dumps(rec).replace('"@BW@"', literal)


def test_every_numeric_schema_field_is_bounded():
    """Every number a record can carry has a lower and an upper bound in its schema."""
    unbounded = []
    for path in sorted((REPO / "registry" / "schema").glob("*.schema.json")):
        def walk(node, where):
            if isinstance(node, dict):
                t = node.get("type")
                ts = t if isinstance(t, list) else [t]
                if "number" in ts or "integer" in ts:
                    lo = "minimum" in node or "exclusiveMinimum" in node
                    hi = "maximum" in node or "exclusiveMaximum" in node
                    if not (lo and hi):
                        unbounded.append(f"{path.name}:{where}")
                for k, v in node.items():
                    walk(v, f"{where}/{k}")
            elif isinstance(node, list):
                for i, v in enumerate(node):
                    walk(v, f"{where}[{i}]")
        walk(json.loads(path.read_text()), "")
    assert not unbounded, unbounded


# ---- cross-field rules ----------------------------------------------------------------------------------------
def test_vram_slots_beyond_the_hardware(capsys):
    rc, _, err = run(capsys, "show", "glm53-rtx3090-55g-nvx4", "--set", "budget.vram_expert_slots=5000")
    one_line_error(rc, err, "$.budget.vram_expert_slots", "$.gpu.vram_gb")


def test_window_lfu_on_a_per_layer_ram_tier(capsys):
    # tiny-ci-cpu splits RAM per layer; the window LFU orders one global tier, so the ledger would refuse it late
    rc, _, err = run(capsys, "sim", "tiny-ci-cpu", "--steps", "3", "--set", 'policy.ram_evict="lfu:8:10"')
    one_line_error(rc, err, "$.policy.ram_evict", "global RAM tier", "'lfu:8:10'")


# ---- flags ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("spec,words", [
    ("2q:a2=0.3", ("$.policy.ram_evict", "unknown parameter 'a2'", "a1, ghost")),
    ("s3fifo:move=0", ("$.policy.ram_evict", "move=0", "at least 1")),
    ("wtinylfu:window=x", ("$.policy.ram_evict", "window='x'", "not a number")),
])
def test_policy_parameter_unknown_or_out_of_range(capsys, spec, words):
    rc, _, err = run(capsys, "sim", "tiny-ci-cpu", "--steps", "3", "--set", f'policy.ram_evict="{spec}"')
    one_line_error(rc, err, *words)


def test_vram_policy_parameter_out_of_range(capsys):
    rc, _, err = run(capsys, "sim", "tiny-ci-cpu", "--steps", "3", "--set", 'policy.vram_evict="slru:protected=1"')
    one_line_error(rc, err, "$.policy.vram_evict", "protected=1", "0 < protected < 1")


def test_accept_inf(capsys):
    rc, _, err = run(capsys, "sim", "tiny-ci-cpu", "--window", "4", "--accept", "inf")
    one_line_error(rc, err, "--accept", "'inf'")


def test_draft_ms_inf(capsys):
    for v in ("inf", "nan", "-1"):
        rc, _, err = run(capsys, "sim", "tiny-ci-cpu", "--window", "4", "--draft-ms", v)
        one_line_error(rc, err, "--draft-ms", repr(v))


def test_accept_10_window_4(capsys):
    rc, _, err = run(capsys, "sim", "tiny-ci-cpu", "--window", "4", "--accept", "10")
    one_line_error(rc, err, "--accept 10", "--window 4")


def test_trace_gen_tokens_1e9(capsys, tmp_path):
    out = tmp_path / "t.npz"
    rc, _, err = run(capsys, "trace", "gen", "--model", "moetier-tiny-ci-int8", "--out", str(out),
                     "--tokens", "1000000000")
    one_line_error(rc, err, "tokens=1000000000", "free memory")
    rc, _, err = run(capsys, "trace", "gen", "--model", "moetier-tiny-ci-int8", "--out", str(out), "--tokens", "1e9")
    one_line_error(rc, err, "--tokens", "positive integer")
    assert not out.exists()


def test_trace_stats_cache_sizes_a_b(capsys):
    rc, _, err = run(capsys, "trace", "stats", "traces/tiny-ci.npz", "--cache-sizes", "a,b")
    one_line_error(rc, err, "--cache-sizes", "'a,b'")


def test_trace_gen_params_notjson(capsys, tmp_path):
    for params in ("notjson", "5", '{"zipf_s": NaN}', '{"no_such": 1}'):
        rc, _, err = run(capsys, "trace", "gen", "--model", "moetier-tiny-ci-int8", "--out", str(tmp_path / "t.npz"),
                         "--params", params)
        one_line_error(rc, err)


def test_trace_gen_seed_minus_1(capsys, tmp_path):
    rc, _, err = run(capsys, "trace", "gen", "--model", "moetier-tiny-ci-int8", "--out", str(tmp_path / "t.npz"),
                     "--seed", "-1")
    one_line_error(rc, err, "--seed", "'-1'")


# ---- probe files ----------------------------------------------------------------------------------------------
def test_probe_file_with_1e308_values(capsys, tmp_path):
    p = tmp_path / "probe.jsonl"
    big = 1e308
    lines = [{"kind": "header", "version": 1, "interval_s": 0.1, "cpus": [0], "disks": ["sda"], "started": big},
             {"kind": "sample", "t": big, "dt": big, "cpu": [big], "mem_used": big, "rss": big,
              "disk": {"sda": [big, big]}},
             {"kind": "sample", "t": 1.7976931348623157e308, "dt": big, "cpu": [big], "mem_used": big, "rss": big,
              "disk": {"sda": [big, big]}},
             {"kind": "counters", "t": big, "step": big, "measured": True, "conc": big, "tokens": big,
              "step_wall_s": big},
             {"kind": "sample", "t": 100.0, "dt": 0.1, "cpu": [0.5], "mem_used": 1e9, "rss": big, "disk": {}}]
    p.write_text("".join(json.dumps(d) + "\n" for d in lines))
    rc, out, err = run(capsys, "probe", "report", str(p), "--json")
    one_line_error(rc, err, "no samples and no counters", "5 bad lines")        # every line beyond the bounds
    lines[-1]["rss"] = 1e9
    p.write_text("".join(json.dumps(d) + "\n" for d in lines))
    rc, out, err = run(capsys, "probe", "report", str(p), "--json")
    assert rc == 0 and "Traceback" not in err
    rep = json.loads(out, parse_constant=_no_constant)
    assert rep["utilization"]["quality"]["bad_lines"] == 4


def _no_constant(c):
    raise AssertionError(f"non-standard JSON token {c}")


# ---- strict --json output ---------------------------------------------------------------------------------------
def test_emit_writes_null_with_a_reason_for_a_nan(capsys):
    from moetier.cli.common import _emit
    _emit({"a": float("nan"), "b": [1.0, float("inf")]})
    d = json.loads(capsys.readouterr().out, parse_constant=_no_constant)
    assert d["a"] is None and d["b"] == [1.0, None]
    assert set(d["null_reasons"]) == {"$.a", "$.b[1]"}


# ---- writes: no record replaced silently, all or none, checked before the work --------------------------------------
def _no_run(monkeypatch):
    """Make the runtime's work fail loudly: a check that must come before it shows up as an AssertionError."""
    from moetier.run import runtime
    from moetier.measure import bench

    def boom(*a, **k):
        raise AssertionError("the work started before the inputs were checked")
    monkeypatch.setattr(runtime, "run", boom)
    monkeypatch.setattr(bench, "measure", boom)


def test_run_record_replaced_only_with_force(capsys, reg, tiny_ci_store, monkeypatch):
    argv = ["run", "tiny-ci-cpu", "--store", tiny_ci_store, "--steps", "2", "--conc", "1", "--record", "mine"]
    assert run(capsys, *argv)[0] == 0
    first = (reg / "runs" / "mine.json").read_bytes()
    _no_run(monkeypatch)
    rc, _, err = run(capsys, *argv)
    one_line_error(rc, err, "mine", "exists", "--force")
    assert (reg / "runs" / "mine.json").read_bytes() == first
    monkeypatch.undo()
    monkeypatch.setattr(spec, "REGISTRY", reg)
    monkeypatch.setenv("MOETIER_REGISTRY", str(reg))
    assert run(capsys, *argv, "--force")[0] == 0


def test_run_default_record_ids_are_new_each_time(capsys, reg, tiny_ci_store, monkeypatch):
    from moetier.cli import runtime as cli_runtime
    monkeypatch.setattr(cli_runtime, "_now", lambda: "2026-01-02T03:04:05+00:00")    # two runs in one second
    argv = ["run", "tiny-ci-cpu", "--store", tiny_ci_store, "--steps", "2", "--conc", "1"]
    assert run(capsys, *argv)[0] == 0 and run(capsys, *argv)[0] == 0
    ids = sorted(p.stem for p in (reg / "runs").glob("tiny-ci-cpu-run-20260102t030405*.json"))
    assert ids == ["tiny-ci-cpu-run-20260102t030405", "tiny-ci-cpu-run-20260102t030405-2"]


def test_run_invalid_record_id_before_work(capsys, tiny_ci_store, monkeypatch):
    _no_run(monkeypatch)
    for bad in ("../escape", "UPPER", "a/b"):
        rc, _, err = run(capsys, "run", "tiny-ci-cpu", "--store", tiny_ci_store, "--record", bad)
        one_line_error(rc, err, repr(bad), "not a valid record id")


def test_run_into_unwritable_registry(capsys, reg, tiny_ci_store, monkeypatch, tmp_path):
    shutil.rmtree(reg / "runs")
    (reg / "runs").symlink_to(_unwritable_dir(tmp_path))
    _no_run(monkeypatch)
    rc, _, err = run(capsys, "run", "tiny-ci-cpu", "--store", tiny_ci_store, "--steps", "2", "--record", "r1")
    one_line_error(rc, err, "cannot write runs records")


def test_bench_into_unwritable_registry(capsys, reg, tiny_ci_store, monkeypatch, tmp_path):
    hw_before = (reg / "hardware" / "local-cpu.json").read_bytes()
    shutil.rmtree(reg / "engine")
    (reg / "engine").symlink_to(_unwritable_dir(tmp_path))
    _no_run(monkeypatch)
    rc, _, err = run(capsys, "bench", "--store", tiny_ci_store, "--hardware", "local-cpu", "--engine", "new-engine",
                     "--force", "--overlay")
    one_line_error(rc, err, "cannot write engine records")
    assert (reg / "hardware" / "local-cpu.json").read_bytes() == hw_before


def test_bench_existing_records_need_force(capsys, reg, tiny_ci_store, monkeypatch):
    _no_run(monkeypatch)
    rc, _, err = run(capsys, "bench", "--store", tiny_ci_store, "--hardware", "local-cpu", "--engine", "numba-cpu",
                     "--overlay")
    one_line_error(rc, err, "local-cpu", "exists", "--force")


def test_bench_engine_record_unwritable_leaves_hardware_record_untouched(reg, tmp_path):
    """The write itself is all or none: the engine record cannot be staged, so the hardware record (staged first)
    is not renamed over the old one, and no staging file is left."""
    from moetier.errors import UserError
    hw = spec.load_record("hardware", "local-cpu", reg)
    eng = spec.load_record("engine", "numba-cpu", reg)
    hw["cpu"]["cores"] = hw["cpu"]["cores"] + 1
    before = (reg / "hardware" / "local-cpu.json").read_bytes()
    shutil.rmtree(reg / "engine")
    (reg / "engine").symlink_to(_unwritable_dir(tmp_path))
    with pytest.raises(UserError, match="nothing was written"):
        spec.write_records([("hardware", hw), ("engine", eng)], reg, force=True)
    assert (reg / "hardware" / "local-cpu.json").read_bytes() == before
    assert [p.name for p in (reg / "hardware").iterdir() if p.name.startswith(".")] == []


def test_conformance_report_unwritable_dir(capsys, tmp_path, monkeypatch):
    import pytest as _pytest
    monkeypatch.setattr(_pytest, "main", lambda *a, **k: (_ for _ in ()).throw(AssertionError("suite ran")))
    d = _unwritable_dir(tmp_path)
    for report in (d / "r.json", tmp_path / "no" / "such" / "r.json", tmp_path):
        rc, _, err = run(capsys, "conformance", "--backend", "cpu", "--report", str(report))
        one_line_error(rc, err, "--report")


# ---- store pack: staging folders of a killed pack ------------------------------------------------------------------
def _pack_until_staging(out: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    p = subprocess.Popen([sys.executable, "-m", "moetier", "store", "pack", "moetier-tiny-16x64-int8", "--out",
                          str(out)], env=env, stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    tmp = Path(f"{out}.tmp-{p.pid}")
    t0 = time.time()
    while not (tmp / "experts.bin").exists() or (tmp / "experts.bin").stat().st_size == 0:
        assert p.poll() is None and time.time() - t0 < 120, "the pack ended before its staging folder filled"
        time.sleep(0.05)
    return p


def test_store_pack_sigkill_staging_removed_on_next_run(capsys, tmp_path):
    out = tmp_path / "store"
    p = _pack_until_staging(out)
    p.kill()
    p.wait()
    left = Path(f"{out}.tmp-{p.pid}")
    assert left.is_dir()                                    # SIGKILL cannot clean up ...
    rc, _, err = run(capsys, "store", "pack", "moetier-tiny-ci-int8", "--out", str(out))
    assert rc == 0 and not left.exists()                   # ... the next pack does, and says so in one line
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and "removed 1 staging folder" in lines[0] and str(left) in lines[0]


def test_store_pack_live_staging_is_kept(capsys, tmp_path):
    out = tmp_path / "store"
    live = Path(f"{out}.tmp-{os.getppid()}")               # a process that is alive: not ours to remove
    live.mkdir()
    assert run(capsys, "store", "pack", "moetier-tiny-ci-int8", "--out", str(out))[0] == 0
    assert live.is_dir()


def test_store_pack_sigterm_cleans_up(tmp_path):
    out = tmp_path / "store"
    p = _pack_until_staging(out)
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 128 + signal.SIGTERM
    assert [ln for ln in err.splitlines() if ln.strip()] == ["moetier: terminated (SIGTERM)"]
    assert list(tmp_path.iterdir()) == []                  # no staging folder, no store


# ---- strict --json output over every command that has --json --------------------------------------------------------
def _json_commands():
    """(command path) of every subcommand whose parser has --json."""
    from moetier.cli.main import build_parser
    out = []

    def walk(parser, path):
        for a in parser._actions:
            if a.dest == "json" and path:
                out.append(" ".join(path))
            if a.__class__.__name__ == "_SubParsersAction":
                for name, sp in a.choices.items():
                    walk(sp, path + [name])
    walk(build_parser(), [])
    return sorted(set(out))


def test_json_output_is_strict_for_every_command(capsys, tiny_ci_store, reg, tmp_path):
    hf = tmp_path / "olmoe"
    hf.mkdir()
    (hf / "config.json").write_text(json.dumps({
        "architectures": ["OlmoeForCausalLM"], "hidden_size": 2048, "intermediate_size": 1024, "num_hidden_layers": 16,
        "num_experts": 64, "num_experts_per_tok": 8, "torch_dtype": "bfloat16"}))
    log = tmp_path / "router.jsonl"
    log.write_text('{"token": 0, "layer": 0, "experts": [1, 2]}\n')
    probe = tmp_path / "p.jsonl"
    probe.write_text('{"kind": "header", "version": 1, "interval_s": 0.1, "cpus": [0], "started": 1.0}\n'
                     '{"kind": "sample", "t": 1.1, "dt": 0.1, "cpu": [1.0]}\n')
    argvs = {
        "probe report": ["probe", "report", str(probe), "--json"],
        "model import": ["model", "import", str(hf), "--out", str(tmp_path / "m.json"), "--json"],
        "show": ["show", "tiny-ci-cpu", "--json"],
        "sim": ["sim", "tiny-ci-cpu", "--steps", "3", "--conc", "1", "2", "--json"],
        "table": ["table", "tiny-ci-cpu", "--conc", "1", "--json"],
        "trace import": ["trace", "import", str(log), "--out", str(tmp_path / "imp.npz"), "--json"],
        "compare": ["compare", "tiny-ci-cuda", "--conc", "1", "--steps", "3", "--peers", "moetier,fiddler",
                    "--png", str(tmp_path / "c.png"), "--json"],
        "trace stats": ["trace", "stats", "traces/tiny-ci.npz", "--cache-sizes", "4,16", "--json"],
        "trace fit": ["trace", "fit", "traces/tiny-ci.npz", "--experts", "32", "--rounds", "1", "--json"],
        "run": ["run", "tiny-ci-cpu", "--store", tiny_ci_store, "--steps", "2", "--conc", "1", "--no-record", "--json"],
        "bench": ["bench", "--store", tiny_ci_store, "--recipe", "tiny-ci-cpu", "--rounds", "3", "--records", "8",
                  "--dry-run", "--json"],
        "calibrate": ["calibrate", "tiny-ci-cpu", "--store", tiny_ci_store, "--steps", "1", "--repeats", "1",
                      "--no-write", "--json"],
        "list": ["list", "--json"],
        "advise": ["advise", "tiny-ci-cpu", "--candidates", "3", "--steps", "10", "--conc", "1", "--workers", "1",
                   "--no-write", "--json"],
        "doctor": ["doctor", "--store-dir", str(tmp_path), "--json"],
        "sweep": ["sweep", "tiny-ci-cpu", "--conc", "1", "--steps", "2", "--workers", "1", "--out",
                  str(tmp_path / "sweep.jsonl"), "--json"],
    }
    assert set(_json_commands()) <= set(argvs), "a command with --json has no strict-JSON check here"
    for name in _json_commands():
        rc, out, err = run(capsys, *argvs[name])
        assert rc == 0 or (name == "trace fit" and rc == 3), (name, err)      # 3: a fit outside a tolerance
        json.loads(out, parse_constant=_no_constant)       # NaN / Infinity tokens fail here
