"""moetier probe: the report's arithmetic on hand-made probe files, bad input, the sampler, the CLI."""
import json
import shutil
import sys
import time

import pytest

from moetier.measure import probe
from moetier.cli.main import main

T0 = 1000.0
HW = {"id": "hw-test", "cpu": {"name": "test cpu", "cores": 2}, "nvme": {"name": "test disk", "bw_gbps": 1.0},
      "ceilings": {"ddr_practical_gbps": 17.0, "nvme_read_gbps": 1.0, "cores": 2, "threads": 2}}
# per step (0.1 s, 2 tokens): lanes in seconds; fixed = 0.1 - everything else = 0.01
STEP = {"lane_cpu_s": 0.05, "lane_gpu_s": 0.01, "lane_zc_s": 0.005, "nvme_wait_s": 0.01, "copy_s": 0.005,
        "plan_s": 0.002, "book_s": 0.003, "combine_s": 0.005, "reads": 3, "masked": 0, "picks": 16,
        "layer_calls": 8}


def header(**kw):
    h = {"kind": "header", "version": 1, "interval_s": 0.1, "cpus": [0, 1], "disks": ["vda"], "started": T0,
         "host": "test", "gpu": None, "gpu_note": "NVML not available"}
    h.update(kw)
    return h


def sample(i, cpu=(0.5, 1.0), read=25_000_000, dt=0.1):
    return {"kind": "sample", "t": T0 + 0.1 * i, "dt": dt, "cpu": list(cpu), "mem_used": 2 * 2 ** 30,
            "rss": 2 ** 30, "disk": {"vda": [read, 0]}}


def counters(i, conc=1, measured=True, wall=0.1, tokens=2):
    d = {"kind": "counters", "t": T0 + 0.1 * i, "step": i, "measured": measured, "conc": conc, "tokens": tokens,
         "step_wall_s": wall}
    for k, v in STEP.items():
        d[k] = v * i
    return d


def write(path, lines, tail=""):
    with open(path, "w") as f:
        for ln in lines:
            f.write(json.dumps(ln) + "\n")
        f.write(tail)
    return path


def good_lines(n=10):
    return ([header(), {"kind": "mark", "phase": "decode_C1", "t": T0}] + [counters(0)]
            + [x for i in range(1, n + 1) for x in (sample(i), counters(i))])


def strict(rep):
    return json.loads(json.dumps(rep, allow_nan=False))


# ---- arithmetic ---------------------------------------------------------------------------------------------------
def test_report_known_answers(tmp_path):
    rep = strict(probe.report(write(tmp_path / "p.jsonl", good_lines()), HW, run_record=None))
    ph = rep["utilization"]["phases"]["decode_C1"]
    dec = ph["decode"]
    assert dec["active_s"] == pytest.approx(1.0, abs=1e-6)
    assert ph["time_split"]["decode"] == pytest.approx(1.0)
    r = dec["resources"]
    assert r["cpu_cores_busy_pct"]["mean"] == pytest.approx(75.0)
    assert r["cpu_cores_busy_pct"]["p90"] == pytest.approx(75.0)
    assert dec["per_core_busy_pct"] == {"0": pytest.approx(50.0), "1": pytest.approx(100.0)}
    assert r["cpu_lane_duty_pct"]["mean"] == pytest.approx(50.0, abs=1e-3)
    assert r["cpu_lane_duty_pct"]["pct_of_ceiling"]["mean"] == pytest.approx(50.0, abs=1e-2)
    nv = r["nvme_read_gbps"]
    assert nv["mean"] == pytest.approx(0.25) and nv["ceiling"] == 1.0
    assert nv["pct_of_ceiling"] == {"mean": pytest.approx(25.0), "p50": pytest.approx(25.0),
                                    "p90": pytest.approx(25.0)}
    assert nv["idle_frac"] == 0.0
    assert r["ram_gib"]["mean"] == pytest.approx(2.0) and "pct_of_ceiling" not in r["ram_gib"]
    assert r["rss_gib"]["mean"] == pytest.approx(1.0)

    cp = rep["chokepoints"]["phases"]["decode_C1"]
    d = cp["decode"]
    assert d["steps"] == 10 and d["tokens"] == 20
    ms = d["per_token_ms"]
    want = {"fixed": 5.0, "gpu_moe": 7.5, "cpu_moe": 25.0, "nvme_stall": 5.0, "copy": 2.5, "overhead": 5.0}
    for k, v in want.items():
        assert ms[k] == pytest.approx(v, abs=1e-3), k
    assert sum(ms.values()) == pytest.approx(d["wall_ms_per_token"], abs=1e-3)
    assert d["wall_ms_per_token"] == pytest.approx(50.0)
    assert d["tok_s_from_wall"] == pytest.approx(20.0)
    assert sum(d["share"].values()) == pytest.approx(1.0, abs=1e-3)
    assert d["binding"] == "cpu_moe" and d["share"]["cpu_moe"] == pytest.approx(0.5)
    assert d["per_layer_ms"]["cpu_lane"] == pytest.approx(50.0 / 8)
    assert d["per_step"]["reads"] == pytest.approx(3.0)
    assert isinstance(d["lane_last"], str) and "not measured" in d["lane_last"]
    b = cp["binding"]
    assert b["critical_path"] == "cpu_moe" and b["critical_share"] == pytest.approx(0.5)
    assert b["resource_nearest_ceiling"]["resource"] == "cpu_lane_duty_pct"
    assert rep["chokepoints"]["quality"]["gaps"] == 0
    md = probe.to_markdown(rep)
    assert "| cpu_moe | 25.000 | 50.0% |" in md and "binding: **cpu_moe**" in md


def test_binding_is_largest_bucket_and_runs_restart(tmp_path):
    # two runtime instances (conc 1 then conc 2): counters restart; the second phase is nvme-bound
    lines = good_lines(5)
    lines.append({"kind": "mark", "phase": "decode_C2", "t": T0 + 0.55})
    for j, i in enumerate(range(6, 12)):
        c = counters(j, conc=2)
        c["t"] = T0 + 0.1 * i
        c["nvme_wait_s"] = 0.08 * j
        c["lane_cpu_s"] = 0.0
        lines += [sample(i), c]
    rep = strict(probe.report(write(tmp_path / "p.jsonl", lines), HW, run_record=None))
    c1 = rep["chokepoints"]["phases"]["decode_C1"]["decode"]
    c2 = rep["chokepoints"]["phases"]["decode_C2"]["decode"]
    assert c1["binding"] == "cpu_moe" and c1["steps"] == 5
    assert c2["binding"] == "nvme_stall" and c2["steps"] == 5 and c2["quality"]["steps_excluded"] == 1
    assert sum(c2["per_token_ms"].values()) == pytest.approx(c2["wall_ms_per_token"], abs=1e-3)


def test_overlapping_timers_still_sum_to_wall(tmp_path):
    lines = good_lines(4)
    for ln in lines:
        if ln["kind"] == "counters":
            ln["book_s"] = 0.2 * ln["step"]          # bookkeeping timer enclosing the others: sum > wall
    rep = strict(probe.report(write(tmp_path / "p.jsonl", lines), HW, run_record=None))
    d = rep["chokepoints"]["phases"]["decode_C1"]["decode"]
    assert sum(d["per_token_ms"].values()) == pytest.approx(d["wall_ms_per_token"], abs=1e-3)
    assert d["quality"]["overlap_ms_per_token"] > 0 and d["per_token_ms"]["fixed"] == 0


# ---- bad input ----------------------------------------------------------------------------------------------------
def test_gaps_and_truncated_last_line(tmp_path):
    lines = [ln for ln in good_lines() if not (ln["kind"] == "sample" and 4 <= round((ln["t"] - T0) * 10) <= 6)]
    p = write(tmp_path / "p.jsonl", lines, tail='{"kind": "sample", "t": 1001.1, "dt": 0.1, "cpu": [0.5')
    rep = strict(probe.report(p, HW, run_record=None))
    q = rep["utilization"]["quality"]
    assert q["truncated_last_line"] is True and q["gaps"] == 1 and q["lost"] == 3 and q["samples"] == 7
    assert rep["utilization"]["phases"]["decode_C1"]["decode"]["resources"]["cpu_cores_busy_pct"]["mean"] == \
        pytest.approx(75.0)
    assert rep["chokepoints"]["phases"]["decode_C1"]["decode"]["binding"] == "cpu_moe"


def test_no_counters_gives_null_chokepoints_with_reason(tmp_path):
    p = write(tmp_path / "p.jsonl", [header()] + [sample(i) for i in range(1, 6)])
    rep = strict(probe.report(p, HW, run_record=None))
    assert rep["chokepoints"] is None
    u = rep["utilization"]
    assert "counters" in u["chokepoints_reason"]
    assert any(m.startswith("counters") for m in u["missing"])
    ph = u["phases"]["all"]
    assert ph["decode"] is None and ph["time_split"]["unknown"] == 1.0
    assert ph["all"]["resources"]["cpu_cores_busy_pct"]["mean"] == pytest.approx(75.0)
    assert "not available" in probe.to_markdown(rep)


def test_hardware_without_ceilings_omits_pct(tmp_path):
    p = write(tmp_path / "p.jsonl", good_lines())
    for hw in ({"id": "bare", "cpu": {}, "nvme": {}}, None, {"id": "x", "ceilings": {"ddr_practical_gbps": 0}}):
        rep = strict(probe.report(p, hw, run_record=None))
        nv = rep["utilization"]["phases"]["decode_C1"]["decode"]["resources"]["nvme_read_gbps"]
        assert "pct_of_ceiling" not in nv and nv["ceiling"] is None
        miss = " ".join(rep["utilization"]["missing"])
        assert "ceiling" in miss
        # %-native resources keep their fixed ceiling of 100
        assert "pct_of_ceiling" in rep["utilization"]["phases"]["decode_C1"]["decode"]["resources"][
            "cpu_lane_duty_pct"]


def test_unknown_run_record_version_and_probe_version(tmp_path):
    lines = good_lines()
    lines[0] = header(version=99)
    p = write(tmp_path / "p.jsonl", lines)
    rep = strict(probe.report(p, HW, run_record={"id": "old-run", "schema_version": 0, "results": []}))
    miss = " ".join(rep["utilization"]["missing"])
    assert "run record" in miss and "version 99" in miss
    assert rep["chokepoints"]["phases"]["decode_C1"]["decode"]["binding"] == "cpu_moe"
    rep = strict(probe.report(p, HW, run_record={"id": "r", "recipe": "x", "measured_runs": [
        {"conc": 1, "ms_per_token": 50.5}]}))
    assert rep["chokepoints"]["phases"]["decode_C1"]["decode"]["run_record_ms_per_token"] == 50.5
    strict(probe.report(p, HW, run_record=["not", "a", "dict"]))


def test_degenerate_values_never_give_nan(tmp_path):
    lines = [header(interval_s=0), {"kind": "mark", "phase": "p", "t": T0}, counters(0, wall=0.0, tokens=0)]
    for i in range(1, 5):
        lines += [sample(i, dt=0.0), counters(i, wall=0.0, tokens=0)]
    lines += [sample(5, cpu=()), {"kind": "sample", "t": T0 + 0.6, "dt": 0.1, "cpu": [0.5, 1.0], "disk": None}]
    p = write(tmp_path / "p.jsonl", lines, tail='{"kind":"sample","t":1001,"dt":NaN}\n{"kind": "counters"}\n'
              'not json\n[1, 2]\n')
    rep = strict(probe.report(p, {"id": "h", "ceilings": "nope"}, run_record=None))
    d = rep["chokepoints"]["phases"]["p"]["decode"]
    assert d["wall_ms_per_token"] == 0 and d["binding"] is None and d["tok_s_from_wall"] is None
    assert rep["utilization"]["quality"]["bad_lines"] >= 3
    probe.to_markdown(rep)
    # empty file and header-only file
    for body in ("", json.dumps(header()) + "\n"):
        (tmp_path / "e.jsonl").write_text(body)
        rep = strict(probe.report(tmp_path / "e.jsonl", None, run_record=None))
        assert rep["chokepoints"] is None
        probe.to_markdown(rep)


def test_counters_missing_fields_are_zero_and_named(tmp_path):
    lines = good_lines(4)
    for ln in lines:
        ln.pop("copy_s", None)
    rep = strict(probe.report(write(tmp_path / "p.jsonl", lines), HW, run_record=None))
    d = rep["chokepoints"]["phases"]["decode_C1"]["decode"]
    assert d["per_token_ms"]["copy"] == 0 and "copy_s" in d["quality"]["fields_missing"]
    assert sum(d["per_token_ms"].values()) == pytest.approx(d["wall_ms_per_token"], abs=1e-3)


# ---- sampler ------------------------------------------------------------------------------------------------------
def test_sampler_writes_header_samples_counters(tmp_path):
    path = tmp_path / "s.jsonl"
    s = probe.Sampler(path, interval=0.1)
    s.start()
    s.mark("decode_C1")
    s.counters({"kind": "counters", "t": time.time(), "step": 0, "measured": True, "conc": 1, "tokens": 1,
                "step_wall_s": 0.01, "lane_cpu_s": 0.005, "nan": float("nan")})
    time.sleep(0.35)
    s.stop()
    s.stop()
    s.counters({"kind": "counters", "t": time.time()})     # after stop: ignored, no error
    lines = [json.loads(ln) for ln in path.read_text().splitlines()]
    assert lines[0]["kind"] == "header" and lines[0]["interval_s"] == 0.1 and "cpus" in lines[0]
    assert "gpu" in lines[0]
    kinds = [ln["kind"] for ln in lines]
    assert kinds.count("sample") >= 2 and kinds.count("counters") == 1 and kinds.count("mark") == 1
    smp = [ln for ln in lines if ln["kind"] == "sample"]
    assert all(len(x["cpu"]) == len(lines[0]["cpus"]) and 0 <= min(x["cpu"]) and max(x["cpu"]) <= 1 for x in smp)
    assert all(x["dt"] > 0 and x["mem_used"] > 0 for x in smp)
    c = next(ln for ln in lines if ln["kind"] == "counters")
    assert c["lane_cpu_s"] == 0.005 and c["nan"] is None
    strict(probe.report(path, None, run_record=None))
    # its own cost is accounted (benchmarks/bench_probe.py): some CPU for the samples, far below their wall time
    assert 0 < s.sampler_cpu_s < 0.35 and 0 < s.hook_s < 0.35


# ---- CLI ----------------------------------------------------------------------------------------------------------
def one_line_error(rc, err):
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert rc == 2 and len(lines) == 1 and lines[0].startswith("moetier: error:"), err


def test_cli_report_and_errors(tmp_path, capsys):
    p = write(tmp_path / "p.jsonl", good_lines())
    assert main(["probe", "report", str(p), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) == {"utilization", "chokepoints"}
    assert main(["probe", "report", str(p)]) == 0
    tables = capsys.readouterr().out
    assert "decode critical path" in tables
    assert main(["probe", "report", str(p), "--md"]) == 0       # the old flag: accepted, the same tables
    assert capsys.readouterr().out == tables
    one_line_error(main(["probe", "report", str(tmp_path / "nope.jsonl")]), capsys.readouterr().err)
    one_line_error(main(["probe", "report", str(p), "--write"]), capsys.readouterr().err)
    one_line_error(main(["probe", "report", str(p), "--hardware", "no-such-hw"]), capsys.readouterr().err)
    one_line_error(main(["probe", "record", "--out", str(tmp_path / "x")]), capsys.readouterr().err)  # no command
    one_line_error(main(["probe"]), capsys.readouterr().err)


def test_cli_report_write_fills_run_record(tmp_path, capsys, monkeypatch):
    from moetier.core import records as spec
    reg = tmp_path / "registry"
    shutil.copytree(spec.REGISTRY / "schema", reg / "schema")
    (reg / "runs").mkdir()
    write(tmp_path / "p.jsonl", good_lines())
    rec = {"id": "t-run", "kind": "run", "recipe": "tiny-ci-cpu", "table": [{"conc": 1}], "probe": "p.jsonl",
           "hardware": "hw-test"}
    (reg / "runs" / "t-run.json").write_text(json.dumps(rec))
    (reg / "hardware").mkdir()
    (reg / "hardware" / "hw-test.json").write_text(json.dumps(HW))
    monkeypatch.setattr(spec, "REGISTRY", reg)
    monkeypatch.setenv("MOETIER_REGISTRY", str(reg))
    monkeypatch.chdir(tmp_path)
    assert main(["probe", "report", "t-run", "--write"]) == 0
    capsys.readouterr()
    got = json.loads((reg / "runs" / "t-run.json").read_text())
    assert got["chokepoints"]["phases"]["decode_C1"]["decode"]["binding"] == "cpu_moe"
    nv = got["utilization"]["phases"]["decode_C1"]["decode"]["resources"]["nvme_read_gbps"]
    assert nv["pct_of_ceiling"]["mean"] == pytest.approx(25.0)


def test_cli_record_propagates_exit_code(tmp_path, capsys):
    out = tmp_path / "r.jsonl"
    rc = main(["probe", "record", "--out", str(out), "--interval", "0.05", "--",
               sys.executable, "-c", "import time, sys; time.sleep(0.3); sys.exit(3)"])
    assert rc == 3
    lines = [json.loads(ln) for ln in out.read_text().splitlines()]
    assert lines[0]["kind"] == "header" and sum(ln["kind"] == "sample" for ln in lines) >= 2
    strict(probe.report(out, None, run_record=None))
