"""The device kit (benchmarks/device): check.sh --dry-run runs every step that needs no GPU and brings back what a
device run may bring back; a step that fails or runs out of time is recorded and the others still run; prepare.sh
refuses a wheel folder a device run could not carry."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
KIT = ROOT / "benchmarks" / "device"
STEPS = ["setup", "device", "doctor", "conformance", "tests", "kernels", "run", "probe", "bench", "stage2"]


def check(tmp_path, *args, **env):
    e = {**os.environ, "OUT": str(tmp_path / "out"), "PYTHON": sys.executable,
         "MOETIER_REGISTRY": str(tmp_path / "reg"), **env}
    return subprocess.run(["bash", str(KIT / "check.sh"), *args], env=e, capture_output=True, text=True,
                          timeout=300)


def test_dry_run_runs_every_step_and_fits_a_device_run(tmp_path):
    p = check(tmp_path, "--dry-run")
    out = tmp_path / "out"
    s = json.loads((out / "summary.json").read_text())
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert [r["step"] for r in s["steps"]] == STEPS
    assert all(r["rc"] == 0 for r in s["steps"]), [(r["step"], r["log_tail"]) for r in s["steps"] if r["rc"]]
    files = sorted(f.name for f in out.iterdir())
    assert len(files) <= 8 and files == s["files"]
    for name in ("conformance-cuda.json", "conformance-cuda.md", "run-record.json", "probe.md", "logs.tar.gz"):
        assert name in files
    rep = json.loads((out / "conformance-cuda.json").read_text())
    md = (out / "conformance-cuda.md").read_text()
    assert len(rep["checks"]) > 10 and md.count("\n| ") == len(rep["checks"]) + 1     # header + one row per check
    rec = json.loads((out / "run-record.json").read_text())
    assert rec["table"][0]["measured_tok_s"] > 0 and "utilization" in rec


def test_a_step_out_of_time_is_recorded_and_the_rest_still_run(tmp_path):
    p = check(tmp_path, "--dry-run", CHECK_BUDGET_S="40")
    s = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert p.returncode == 1 and not s["ok"]
    assert [r["step"] for r in s["steps"]] == STEPS                   # every step has its line
    assert s["steps"][0]["rc"] == 0
    assert {r["rc"] for r in s["steps"][-4:]} == {124}                # the budget ran out: timed out, not dropped
    assert set(s["failed"]) >= {"run", "probe", "bench", "stage2"}


def test_unknown_argument_is_one_line(tmp_path):
    p = check(tmp_path, "--dry")
    assert p.returncode == 2 and p.stderr.strip().count("\n") == 0 and "--dry" in p.stderr


def test_summary_refuses_more_than_a_device_run_brings_back(tmp_path):
    sys.path.insert(0, str(KIT))
    import summary
    work = tmp_path / "w"
    (work / "logs").mkdir(parents=True)
    (work / "logs" / "setup.log").write_text("ok\n")
    (work / "steps.jsonl").write_text(json.dumps({"step": "setup", "rc": 0, "seconds": 1, "timeout_s": 9}) + "\n")
    out = tmp_path / "out"
    out.mkdir()
    for i in range(7):
        (out / f"extra{i}.txt").write_text("x")
    with pytest.raises(SystemExit, match="at most 8"):
        summary.gather(work, out, dry_run=True)


def prepare_check(folder: Path):
    # prepare.sh --check reads benchmarks/device/wheels; a copy of the script beside a test folder reads that one
    (folder / "prepare.sh").write_text((KIT / "prepare.sh").read_text())
    return subprocess.run(["bash", str(folder / "prepare.sh"), "--check"], capture_output=True, text=True, timeout=60)


def test_prepare_refuses_a_folder_over_64_mib(tmp_path):
    (tmp_path / "wheels").mkdir()
    with open(tmp_path / "wheels" / "big-1.0-py3-none-any.whl", "wb") as f:
        f.truncate(64 * 1024 * 1024 + 1)                              # sparse: sized, not written
    p = prepare_check(tmp_path)
    assert p.returncode == 2 and "64 MiB" in p.stderr


def test_prepare_refuses_two_versions_of_one_wheel(tmp_path):
    (tmp_path / "wheels").mkdir()
    for v in ("4.25.0", "4.26.0"):
        (tmp_path / "wheels" / f"jsonschema-{v}-py3-none-any.whl").write_bytes(b"x")
    p = prepare_check(tmp_path)
    assert p.returncode == 2 and "jsonschema" in p.stderr
    (tmp_path / "wheels" / "jsonschema-4.25.0-py3-none-any.whl").unlink()
    p = prepare_check(tmp_path)
    assert p.returncode == 0 and "1 wheels" in p.stdout
