"""Nothing is written into the working directory unless asked: every command that reads, simulates or reports,
run in an empty folder, leaves it empty (compare draws its PNG only with --plot; conformance writes its report and
engine record only with --report, and hypothesis keeps its files in the user cache)."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests._terminal import ROOT, env

TRACE = str(ROOT / "traces" / "tiny-ci.npz")
COMMANDS = {
    "show": ["show", "tiny-ci-cpu"],
    "list": ["list", "recipe"],
    "sim": ["sim", "tiny-ci-cpu", "--conc", "1", "--steps", "10"],
    "table": ["table", "tiny-ci-cpu", "--conc", "1"],
    "compare": ["compare", "tiny-ci-cpu", "--conc", "1", "--steps", "10"],
    "compare --json": ["compare", "tiny-ci-cpu", "--conc", "1", "--steps", "10", "--json"],
    "trace stats": ["trace", "stats", TRACE],
    "doctor": ["doctor", "--recipe", "tiny-ci-cpu"],
    # the cost fit (it writes the engine record beside a report) and a hypothesis check (its database)
    "conformance": ["conformance", "--backend", "cpu", "-k", "lane_cost_fit or engine_record or adversarial"],
}


def _run(argv, cwd, tmp_path):
    e = env()
    e["XDG_CACHE_HOME"] = str(tmp_path / "cache")      # where hypothesis may keep its files: not the cwd
    e.pop("HYPOTHESIS_STORAGE_DIRECTORY", None)
    return subprocess.run([sys.executable, "-m", "moetier", *argv], cwd=cwd, env=e, capture_output=True,
                          text=True, timeout=600)


@pytest.mark.parametrize("name", list(COMMANDS))
def test_an_empty_working_directory_stays_empty(name, tmp_path):
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    r = _run(COMMANDS[name], cwd, tmp_path)
    assert r.returncode in (0, 1), r.stderr[-2000:]             # doctor: 1 where the recipe cannot run here
    assert sorted(os.listdir(cwd)) == [], f"moetier {name} wrote into the working directory"


def test_compare_plot_and_conformance_report_write_where_asked(tmp_path):
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    r = _run(["compare", "tiny-ci-cpu", "--conc", "1", "--steps", "10", "--plot", str(tmp_path / "c.png")],
             cwd, tmp_path)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "c.png").read_bytes()[:4] == b"\x89PNG" and f"(plot: {tmp_path / 'c.png'})" in r.stdout
    r = _run(["compare", "tiny-ci-cpu", "--conc", "1", "--steps", "10", "--png", str(tmp_path / "old.png")],
             cwd, tmp_path)
    assert r.returncode == 0 and (tmp_path / "old.png").exists(), "the old name --png still works"
    rep = tmp_path / "out" / "report.json"
    (tmp_path / "out").mkdir()
    r = _run(["conformance", "--backend", "cpu", "--perf", "-k", "lane_cost_fit or engine_record", "--report", str(rep)],
             cwd, tmp_path)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert sorted(os.listdir(tmp_path / "out")) == ["engine-conformance-cpu.json", "report.json"]
    assert sorted(os.listdir(cwd)) == []
