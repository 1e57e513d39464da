"""The soft cases decided: a concurrency the trace cannot support is refused with its bound, a non-MoE time not
measured at the asked rows is stated, --accept/--draft-ms need --window, garbage in a probe's run record is one
line."""
import json
import time

import pytest

from tests._cli import one_line, run_cli
from moetier.core import records as spec




@pytest.mark.parametrize("argv", [
    ["sim", "tiny-ci-cpu", "--conc", "100000"],
    ["table", "tiny-ci-cpu", "--conc", "1", "801"],
    ["compare", "tiny-ci-cpu", "--conc", "100000", "--png", "{tmp}/c.png"],
    ["sweep", "tiny-ci-cpu", "--conc", "100000", "--out", "{tmp}/s.jsonl"],
    ["run", "tiny-ci-cpu", "--store", "{store}", "--conc", "100000", "--no-record"],
])
def test_a_concurrency_over_the_trace_is_refused_with_its_bound(argv, tmp_path, tiny_ci_store):
    tokens = 800
    from moetier.traces.format import load_trace
    R = spec.resolve("tiny-ci-cpu")
    assert load_trace(spec.REGISTRY.parent / R.trace).tokens == tokens
    t0 = time.monotonic()
    rc, out, err = run_cli([a.format(tmp=tmp_path, store=tiny_ci_store) for a in argv])
    one_line(rc, err, f"supports at most {tokens} streams", "--conc")
    assert time.monotonic() - t0 < 10 and list(tmp_path.iterdir()) == []


def test_the_bound_itself_still_runs():
    from moetier.core import sim
    from moetier.traces.format import load_trace
    R = spec.resolve("tiny-ci-cpu")
    tr = load_trace(spec.REGISTRY.parent / R.trace)
    sim.check_conc(tr, tr.tokens)                       # at the bound: accepted
    with pytest.raises(Exception, match="supports at most"):
        sim.check_conc(tr, tr.tokens + 1)


def test_a_fixed_time_not_measured_at_the_rows_is_stated():
    R = spec.resolve("tiny-ci-cpu")
    rows = sorted(R.fixed_ms)
    assert R.fixed_basis(rows[0]) == "measured"
    between = next(n for n in range(rows[0], rows[-1]) if n not in R.fixed_ms)
    assert R.fixed_basis(between).startswith("interpolated between")
    assert R.fixed_basis(rows[-1] + 1).startswith("extrapolated from")
    rc, out, err = run_cli(["sim", "tiny-ci-cpu", "--conc", str(between), "--no-interval", "--json"])
    assert rc == 0 and json.loads(out)["fixed_basis"].startswith("interpolated"), err
    assert f"no calibration.fixed_ms entry for {between} rows" in err
    rc, out, err = run_cli(["sim", "tiny-ci-cpu", "--conc", str(rows[0]), "--no-interval"])
    assert rc == 0 and "fixed_ms" not in err, err


@pytest.mark.parametrize("flag, value", [("--accept", "2"), ("--draft-ms", "3")])
def test_speculative_flags_without_window_are_refused(flag, value):
    rc, out, err = run_cli(["sim", "tiny-ci-cpu", flag, value])
    one_line(rc, err, flag, "needs --window")
    rc, out, err = run_cli(["sim", "tiny-ci-cpu", "--conc", "1", "--window", "2", flag, value, "--no-interval",
                         "--json"])
    assert rc == 0, err


@pytest.mark.parametrize("runs", [5, True, "x", {"a": 1}, [1, 2], [None]])
def test_garbage_runs_in_a_probed_run_record_are_one_line(runs, tmp_path):
    rec = spec.load_record("runs", "tiny-local-cpu-runtime-probed-2026-11-29")
    probe = tmp_path / "p.jsonl"
    probe.write_text('{"kind": "header", "version": 1, "interval_s": 0.1, "cpus": [0], "started": 1.0}\n'
                     '{"kind": "sample", "t": 1.1, "dt": 0.1, "cpu": [1.0]}\n')
    rec.update(measured_runs=runs, probe=str(probe))
    (tmp_path / "run.json").write_text(json.dumps(rec))
    rc, out, err = run_cli(["probe", "report", str(tmp_path / "run.json")])
    one_line(rc, err, "$.measured_runs: expected a list of run objects")


@pytest.mark.parametrize("counters", [
    {"step": "x", "tokens": "a", "step_wall_s": [1], "conc": [1]},
    {"step": None, "reads": {"a": 1}, "conc": {"a": 1}, "lane_cpu_s": "z"},
    {"t": "late", "step": 1},
])
def test_garbage_counters_in_a_probe_file_do_not_crash_the_report(counters, tmp_path):
    lines = [{"kind": "header", "version": 1, "interval_s": 0.1, "cpus": [0], "started": 1.0},
             {"kind": "sample", "t": 1.1, "dt": 0.1, "cpu": [1.0]},
             {"kind": "counters", "t": 1.15, "step": 0, "conc": 1, "tokens": 1, "step_wall_s": 0.01},
             {"kind": "counters", "t": 1.2, **counters}]
    probe = tmp_path / "p.jsonl"
    probe.write_text("".join(json.dumps(ln) + "\n" for ln in lines))
    rc, out, err = run_cli(["probe", "report", str(probe)])
    assert rc in (0, 2) and "Traceback" not in err, err
    if rc == 2:
        one_line(rc, err)
