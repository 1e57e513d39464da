"""No record with a shipped id is written without --force/--overlay, refused before any work; calibrate writes its
terms as <id>-cal records of its own and every command names each record it wrote."""
import json

import pytest

from tests._cli import run_cli
from moetier.core import records as spec



def _user_files(user_registry):
    return sorted(str(p.relative_to(user_registry)) for p in user_registry.rglob("*") if p.is_file()) \
        if user_registry.exists() else []


def test_run_record_of_a_shipped_id_is_refused_before_the_store_is_opened(user_registry, tmp_path):
    shipped = spec.record_ids("runs")[0]
    assert spec.is_shipped("runs", shipped)
    rc, out, err = run_cli(["run", "tiny-ci-cpu", "--store", str(tmp_path / "no-store"), "--record", shipped])
    assert rc == 2 and err.count("\n") == 1 and f"runs {shipped!r} is a shipped record" in err, err
    assert "--force" in err and _user_files(user_registry) == []


def test_probe_report_write_to_a_shipped_run_needs_force(user_registry, tmp_path):
    rid = "tiny-local-cpu-runtime-probed-2026-11-29"
    assert spec.is_shipped("runs", rid)
    probe = tmp_path / "p.jsonl"
    probe.write_text('{"kind": "header", "version": 1, "interval_s": 0.1, "cpus": [0], "started": 1.0}\n'
                     '{"kind": "sample", "t": 1.1, "dt": 0.1, "cpu": [1.0]}\n')
    rc, out, err = run_cli(["probe", "report", rid, "--probe", str(probe), "--write"])
    assert rc == 2 and err.count("\n") == 1 and "shipped record" in err and "--force" in err, err
    assert _user_files(user_registry) == []
    rc, out, err = run_cli(["probe", "report", rid, "--probe", str(probe), "--write", "--force"])
    assert rc == 0, err
    assert f"wrote runs {rid}: " in err and _user_files(user_registry) == [f"runs/{rid}.json"]


@pytest.mark.parametrize("flag", ["--hardware", "--engine", "--recipe-out"])
def test_bench_still_needs_overlay_for_a_shipped_id(flag, tmp_path, user_registry):
    shipped = {"--hardware": "local-cpu", "--engine": "numba-cpu", "--recipe-out": "tiny-local-cpu"}[flag]
    rc, out, err = run_cli(["bench", "--store", str(tmp_path / "s"), flag, shipped])
    assert rc == 2 and "is a shipped record" in err and "--overlay" in err and err.count("\n") == 1, err


def test_model_import_of_a_shipped_id_needs_force(tmp_path, user_registry):
    (tmp_path / "config.json").write_text(json.dumps(
        {"hidden_size": 64, "num_local_experts": 8, "num_experts_per_tok": 2, "intermediate_size": 32,
         "num_hidden_layers": 2, "torch_dtype": "bfloat16"}))
    shipped = spec.record_ids("model")[0]
    rc, out, err = run_cli(["model", "import", str(tmp_path), "--id", shipped])
    assert rc == 2 and err.count("\n") == 1 and _user_files(user_registry) == [], err


def test_the_library_refuses_a_shipped_id_unless_asked():
    from moetier.errors import UserError
    eng = spec.load_record("engine", "numba-cpu")
    with pytest.raises(UserError, match="engine 'numba-cpu' is a shipped record"):
        spec.write_record("engine", eng, force=True)          # --force replaces a user record, not a shipped one
    with pytest.raises(UserError, match="shipped record"):
        spec.check_writable("engine", "numba-cpu", force=True)


def test_calibrate_writes_cal_records_of_its_own_and_names_them(tiny_ci_store, user_registry):
    argv = ["calibrate", "tiny-ci-cpu", "--store", tiny_ci_store, "--quick", "--steps", "8", "--repeats", "1"]
    rc, out, err = run_cli(argv)
    assert rc == 0, err
    files = _user_files(user_registry)
    assert "recipe/tiny-ci-cpu-cal.json" in files and "engine/numba-cpu-cal.json" in files, files
    shipped = [f for f in files if spec.is_shipped(f.split("/")[0], f.split("/")[1][:-5])]
    assert shipped == [], f"overlaid shipped records: {shipped}"
    wrote = [ln for ln in err.splitlines() if ln.startswith("wrote ")]
    assert len(wrote) == len(files), (wrote, files)            # every record written is named
    for f in files:
        kind, rid = f.split("/")[0], f.split("/")[1][:-5]
        assert any(ln.startswith(f"wrote {kind} {rid}: ") for ln in wrote), (f, wrote)
    rec = spec.load_record("recipe", "tiny-ci-cpu-cal")
    assert "numba-cpu-cal" in rec["engines"] and "numba-cpu" not in rec["engines"]
    assert spec.resolve("tiny-ci-cpu-cal").host != spec.resolve("tiny-ci-cpu").host      # the fitted terms
    # calibrating the -cal recipe again replaces its own records, and adds no -cal-cal
    rc, out, err = run_cli(["calibrate", "tiny-ci-cpu-cal", *argv[2:]])
    assert rc == 0, err
    assert not any("-cal-cal" in f for f in _user_files(user_registry))


def test_calibrate_overlay_checks_before_measuring(tmp_path, user_registry):
    rc, out, err = run_cli(["calibrate", "tiny-ci-cpu", "--store", str(tmp_path / "no-store"), "--suffix", "cal"])
    assert rc == 2 and "--suffix" in err and err.count("\n") == 1, err
    rc, out, err = run_cli(["calibrate", "tiny-ci-cpu", "--store", str(tmp_path / "no-store"), "--suffix",
                         "-" + "x" * 40 + "y"])
    assert rc == 2 and "--suffix" in err, err
