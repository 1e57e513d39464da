"""Shared test configuration: hypothesis profiles for the fuzz suite (tests/fuzz) and its example counts, and a
temporary user registry, so that records the tools write never land in the user's home.

Profiles: ``ci`` (2,000 examples per target, derandomized: the same examples on every CI run; chosen when the
environment has CI=true), ``long`` (20,000 per target, random: for a local soak, HYPOTHESIS_PROFILE=long) and
``dev`` (200 per target, the default for a quick local run). The session summary prints how many examples each
fuzz target ran.

Installed distributions: ``install_distribution(name, entry_points, files)`` puts a distribution on sys.path the way
pip would (a dist-info directory with its METADATA and entry_points.txt, plus its module files), for the
entry-point registration tests.

User registry: at import (so that module fixtures and subprocesses started by tests inherit it) MOETIER_REGISTRY
points at one temporary folder, removed when the session ends; each test then gets its own empty one (the
``user_registry`` fixture), so a record one test writes never overlays the shipped records another test reads.
"""
import os
import shutil
import sys
import tempfile

import pytest
from hypothesis import HealthCheck, settings

_SESSION_REGISTRY = os.environ["MOETIER_REGISTRY"] = tempfile.mkdtemp(prefix="moetier-test-registry-")


def pytest_unconfigure(config):
    # made at import, outside pytest's tmp_path: a run left one folder behind in the system temp each time
    shutil.rmtree(_SESSION_REGISTRY, ignore_errors=True)


_QUIET = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much,
          HealthCheck.function_scoped_fixture]
settings.register_profile("ci", max_examples=2000, deadline=None, derandomize=True, database=None,
                          suppress_health_check=_QUIET, print_blob=True)
settings.register_profile("long", max_examples=20000, deadline=None, suppress_health_check=_QUIET, print_blob=True)
settings.register_profile("dev", max_examples=200, deadline=None, suppress_health_check=_QUIET, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE") or
                      ("ci" if os.environ.get("CI", "").lower() in ("1", "true", "yes") else "dev"))


def pytest_terminal_summary(terminalreporter):
    harness = sys.modules.get("tests.fuzz._harness") or sys.modules.get("fuzz._harness") \
        or sys.modules.get("_harness")
    counts = getattr(harness, "COUNTS", None)
    if not counts:
        return
    profile = settings._current_profile
    terminalreporter.write_sep("-", f"fuzz examples (hypothesis profile {profile!r})")
    for target, n in sorted(counts.items()):
        terminalreporter.write_line(f"{target}: {n} examples")


@pytest.fixture(autouse=True)
def user_registry(tmp_path, monkeypatch):
    d = tmp_path / "user-registry"
    monkeypatch.setenv("MOETIER_REGISTRY", str(d))
    return d


@pytest.fixture(scope="session")
def tiny_ci_store(tmp_path_factory) -> str:
    """A store packed from the shipped tiny-ci-cpu model, once per session; tests only read it."""
    from moetier.bytes import store
    from moetier.core import records as spec
    d = tmp_path_factory.mktemp("tiny-ci-store") / "store"
    store.pack(spec.resolve("tiny-ci-cpu").model, str(d))
    return str(d)


@pytest.fixture
def install_distribution(tmp_path, monkeypatch):
    """install(name, {group: {entry name: target}}, {file name: text}) -> the site directory, on sys.path."""
    def install(name: str, entry_points: dict, files: dict | None = None):
        site = tmp_path / "site"
        info = site / f"{name.replace('-', '_')}-0.1.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
        (info / "entry_points.txt").write_text("".join(
            f"[{group}]\n" + "".join(f"{k} = {v}\n" for k, v in eps.items()) for group, eps in entry_points.items()))
        for fname, text in (files or {}).items():
            (site / fname).write_text(text)
        monkeypatch.syspath_prepend(str(site))
        return site
    return install
