"""The user registry: what the tools write lands there (never in the shipped records), and it overlays them."""
from __future__ import annotations

import json

import pytest

from moetier.cli.main import main
from moetier.core import records as spec
from moetier.errors import UserError


def _shipped_bytes():
    return {p: p.read_bytes() for p in spec.REGISTRY.rglob("*.json")}


def test_default_user_registry_is_per_user_data(monkeypatch, tmp_path):
    monkeypatch.delenv("MOETIER_REGISTRY")
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    assert spec.user_registry() == tmp_path / "xdg" / "moetier" / "registry"
    monkeypatch.delenv("XDG_DATA_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert spec.user_registry() == tmp_path / "home" / ".local" / "share" / "moetier" / "registry"


def test_writes_go_to_the_user_registry_and_overlay_the_shipped(user_registry):
    before = _shipped_bytes()
    eng = spec.load_record("engine", "numba-cpu")
    eng["source"] = "a user's own calibration"
    path = spec.write_record("engine", eng, overlay=True)
    assert path == user_registry / "engine" / "numba-cpu.json"
    assert spec.load_record("engine", "numba-cpu")["source"] == "a user's own calibration"
    assert spec.record_path("engine", "numba-cpu") == path
    assert _shipped_bytes() == before, "a write changed a shipped record"
    assert "numba-cpu" in spec.record_ids("engine") and spec.record_ids("engine").count("numba-cpu") == 1
    path.unlink()
    assert spec.load_record("engine", "numba-cpu")["source"] != "a user's own calibration"


def test_a_user_recipe_resolves_against_shipped_records(user_registry):
    rec = spec.load_record("recipe", "tiny-ci-cpu")
    rec["id"] = "my-tiny"
    spec.write_record("recipe", rec)
    R = spec.resolve("my-tiny")
    assert R.id == "my-tiny" and R.model_id == "moetier-tiny-ci-int8"
    assert any(r["id"] == "my-tiny" for r in spec.index()["recipes"])


def test_registry_flag_points_the_writes(tmp_path, capsys, user_registry):
    d = tmp_path / "elsewhere"
    lines = [{"kind": "header", "version": 1, "interval_s": 0.1}]     # a report needs at least one sample
    lines += [{"kind": "sample", "t": 1000.0 + 0.1 * i, "dt": 0.1, "cpu": [0.5, 1.0], "mem_used": 2 ** 31,
               "rss": 2 ** 30, "disk": {"vda": [25_000_000, 0]}} for i in range(3)]
    (tmp_path / "p.jsonl").write_text("".join(json.dumps(ln) + "\n" for ln in lines))
    run = {"id": "t-run", "kind": "run", "recipe": "tiny-ci-cpu", "table": [{"conc": 1}], "probe": "p.jsonl"}
    (d / "runs").mkdir(parents=True)
    (d / "runs" / "t-run.json").write_text(json.dumps(run))
    before = _shipped_bytes()
    assert main(["probe", "report", "t-run", "--write", "--probe", str(tmp_path / "p.jsonl"),
                 "--registry", str(d)]) == 0
    assert "utilization" in json.loads((d / "runs" / "t-run.json").read_text())
    assert main(["--registry", str(d), "show", "tiny-ci-cpu"]) == 0
    capsys.readouterr()
    assert _shipped_bytes() == before and not user_registry.exists()
    with pytest.raises(UserError, match="unknown runs id 't-run'"):
        spec.load_record("runs", "t-run")        # main() restored the default user registry when it returned


def test_bench_refuses_to_overlay_a_shipped_record(capsys, tmp_path):
    rc = main(["bench", "--store", str(tmp_path / "no-store"), "--hardware", "local-cpu"])
    err = capsys.readouterr().err
    assert rc == 2 and "hardware 'local-cpu' is a shipped record" in err and "--overlay" in err
    assert len(err.strip().splitlines()) == 1


def test_traces_resolve_beside_the_shipped_registry(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)                  # not from the source tree: the shipped data's own folder
    R = spec.resolve("tiny-ci-cpu")
    from moetier.cli.common import find_path
    assert find_path(R.trace) == spec.REGISTRY.parent / R.trace and find_path(R.trace).is_file()
