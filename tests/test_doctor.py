"""moetier doctor: real checks of this machine; exit 0 exactly when the recipe can run, the fix for what cannot."""
import json
from pathlib import Path

import pytest

from moetier.cli import doctor
from moetier.cli.main import main


def test_o_direct_probe_reads_aligned(tmp_path):
    ok, what = doctor.o_direct(tmp_path)
    # either the aligned read worked, or the filesystem refused O_DIRECT and says so; no file is left behind
    assert (ok and "4096 bytes" in what) or (not ok and ("refused" in what or "failed" in what or "no O_DIRECT" in what))
    assert list(tmp_path.iterdir()) == []


def test_doctor_json_exit_status_follows_can_run(capsys, tmp_path):
    rc = main(["doctor", "--recipe", "tiny-ci-cpu", "--store-dir", str(tmp_path), "--json"])
    d = json.loads(capsys.readouterr().out)
    names = [c["name"] for c in d["checks"]]
    for n in ("python", "packages", "numba (cpu backend)", "dpctl (sycl backend)", "cupy (cuda backend)",
              "transparent huge pages", "registry", "recipe tiny-ci-cpu", "RAM"):
        assert n in names, n
    assert d["level"] == "run" and d["backends"] == ["cpu"]
    numba_ok = next(c for c in d["checks"] if c["name"].startswith("numba"))["status"] == "ok"
    assert d["can_run"] is numba_ok and rc == (0 if d["can_run"] else 1)
    for c in d["checks"]:
        assert c["status"] in ("ok", "warn", "fail", "skip")
        assert (c["fix"] is None) == (c["status"] == "ok"), c


def test_default_recipe_is_checked_for_simulation(capsys, tmp_path):
    rc = main(["doctor", "--store-dir", str(tmp_path), "--json"])
    d = json.loads(capsys.readouterr().out)
    assert d["level"] == "sim" and rc == 0 and d["can_run"]


def test_a_missing_backend_fails_with_its_fix(capsys, tmp_path, monkeypatch):
    monkeypatch.setattr(doctor, "check_numba", lambda: doctor._check("numba (cpu backend)", "fail", "not installed",
                                                                     "pip install -e '.[cpu]'"))
    rc = main(["doctor", "--recipe", "tiny-ci-cpu", "--store-dir", str(tmp_path)])
    out = capsys.readouterr().out
    assert rc == 1 and "fix numba (cpu backend): pip install -e '.[cpu]'" in out and "can NOT run" in out


def test_a_store_that_does_not_fit_fails(capsys, tmp_path, monkeypatch):
    import shutil
    from collections import namedtuple
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda p: usage(10**9, 10**9 - 1000, 1000))
    rc = main(["doctor", "--recipe", "tiny-ci-cpu", "--store-dir", str(tmp_path), "--json"])
    d = json.loads(capsys.readouterr().out)
    disk = next(c for c in d["checks"] if c["name"].startswith("free disk"))
    assert rc == 1 and disk["status"] == "fail" and "--store-dir" in disk["fix"]


@pytest.mark.parametrize("argv,needle", [(["doctor", "--recipe", "no-such"], "no-such"),
                                         (["doctor", "--store-dir", "/nonexistent/dir"], "/nonexistent/dir")])
def test_bad_arguments_are_one_line(argv, needle, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and needle in err


def _tree(root, files: dict):
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return str(root / "moetier" / "__init__.py")


def test_a_fix_installs_the_way_this_copy_was_installed(tmp_path, monkeypatch):
    checkout = _tree(tmp_path / "src", {"moetier/__init__.py": "", "pyproject.toml": '[project]\nname = "moetier"\n'})
    wheel = _tree(tmp_path / "site-packages", {"moetier/__init__.py": ""})
    other = _tree(tmp_path / "other", {"moetier/__init__.py": "", "pyproject.toml": '[project]\nname = "x"\n'})
    assert doctor.source_checkout(checkout) == (tmp_path / "src").resolve()
    assert doctor.source_checkout(wheel) is None and doctor.source_checkout(other) is None

    import moetier
    monkeypatch.setattr(moetier, "__file__", wheel)
    assert doctor.install("cpu").endswith(" -m pip install 'moetier[cpu]'") and " -e " not in doctor.install("cpu")
    assert doctor.install().endswith(" -m pip install 'moetier'")
    monkeypatch.setattr(moetier, "__file__", checkout)
    assert doctor.install("sycl").endswith(f" -m pip install -e '{(tmp_path / 'src').resolve()}[sycl]'")


def test_this_checkout_gets_an_editable_fix():
    import moetier
    assert doctor.source_checkout(moetier.__file__) == Path(__file__).resolve().parents[1]
    assert doctor.install("cpu").endswith(f"-e '{Path(__file__).resolve().parents[1]}[cpu]'")
