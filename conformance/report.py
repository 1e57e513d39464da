"""The conformance pytest plugin: options, per-check outcomes, the summary table and the JSON report.

Options (group "moetier conformance"):
  --backend NAME       cpu, sycl, cuda, or a test-only broken-* backend (default: $MOETIER_CONFORMANCE_BACKEND or cpu)
  --report PATH        also write the JSON report there, and the measured engine record beside it
                       (engine-<ID>.json); without it nothing is written into the working directory
  --write-engine ID    also write the measured engine record to registry/engine/<ID>.json
  --perf               also run the perf section (checks marked ``perf``: lane costs, fill/push GB/s, the engine
                       record); it reports figures and never counts as a pass or a fail

pytest parses options before it imports a conftest found through ``--pyargs``, so the options exist only when this
module is loaded as a plugin up front: ``pytest -p conformance.report --pyargs conformance --backend sycl`` (what
``moetier conformance`` runs). ``pytest conformance/`` (a path) works too: the conftest registers this plugin. With a
late registration the environment variables MOETIER_CONFORMANCE_BACKEND / _REPORT / _WRITE_ENGINE stand in.

The report: {"backend", "capabilities" (the table, or null), "unavailable" (the BackendUnavailable reason, or
null), "counts" {pass, fail, skip}, "checks" [{"check", "outcome", "reason", "seconds"}], "numerics"
{"<lane>-<encoding>": {nmse, nmse_bound, scale_minus_1, scale_bound, outputs}}, "perf" (the perf section's checks,
not counted), "costs" (measured lane costs and push GB/s), "engine" (the validated engine record), "engine_path"};
``build_report()`` gives it in-process after the run (``moetier conformance`` reads it there).

Hypothesis keeps its files (example database, constants cache) under the user cache folder
($XDG_CACHE_HOME/moetier/hypothesis, else ~/.cache/moetier/hypothesis) for the run, unless
HYPOTHESIS_STORAGE_DIRECTORY names one: never a .hypothesis/ in the working directory.
"""
from __future__ import annotations

import json
import os
import time

import pytest

STATE: dict = {}
_ENV = {"backend": "MOETIER_CONFORMANCE_BACKEND", "report": "MOETIER_CONFORMANCE_REPORT",
        "write_engine": "MOETIER_CONFORMANCE_WRITE_ENGINE", "perf": "MOETIER_CONFORMANCE_PERF"}


def pytest_addoption(parser):
    g = parser.getgroup("moetier conformance")
    g.addoption("--backend", default=None, help="backend under test: cpu, sycl, cuda (or a test-only broken-*)")
    g.addoption("--report", default=None, help="also write the JSON report to this path (default: none)")
    g.addoption("--write-engine", default=None, metavar="ID",
                help="also write the measured engine record to registry/engine/<ID>.json")
    g.addoption("--replace-engine", action="store_true", default=False,
                help="with --write-engine: replace an existing engine record of that id")
    g.addoption("--perf", action="store_true", default=None,
                help="also run the perf section (costs, bandwidths, engine record): figures, never a pass or fail")


def option(config, name: str):
    try:
        v = config.getoption(name)
    except ValueError:                      # registered after parsing (conftest found via --pyargs)
        v = None
    if v is None:
        v = os.environ.get(_ENV[name])
    if name == "backend" and not v:
        v = "cpu"
    return v


def _hypothesis_home():
    """The user cache folder for hypothesis's files (module docstring)."""
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(cache, "moetier", "hypothesis")


def pytest_configure(config):
    from conformance import capabilities
    if not os.environ.get("HYPOTHESIS_STORAGE_DIRECTORY"):
        from hypothesis import configuration
        STATE["hypothesis_home"] = vars(configuration).get("__hypothesis_home_directory")
        configuration.set_hypothesis_home_dir(_hypothesis_home())
    from moetier.errors import UserError
    name = option(config, "backend")
    try:
        capabilities.check_name(name)
    except UserError as e:
        raise pytest.UsageError(str(e)) from None
    home = STATE.pop("hypothesis_home", False)
    STATE.clear()
    if home is not False:
        STATE["hypothesis_home"] = home
    STATE.update(backend=name, report=option(config, "report"),
                 write_engine=option(config, "write_engine"),
                 replace_engine=bool(config.getoption("replace_engine", False)), unavailable=None, capabilities=None,
                 checks={},
                 costs={}, engine=None, engine_path=None, t0=time.time(), perf_on=bool(option(config, "perf")),
                 perf={}, numerics={})
    config.addinivalue_line("markers", "perf: a figure of the perf section (--perf); never a pass or a fail")


def _check_name(report) -> str:
    nodeid = report.nodeid
    return nodeid.split("::", 1)[1] if "::" in nodeid else nodeid


def _reason(report) -> str:
    lr = report.longrepr
    if report.skipped and isinstance(lr, tuple) and len(lr) == 3:
        r = str(lr[2])
        return r[len("Skipped: "):] if r.startswith("Skipped: ") else r
    crash = getattr(lr, "reprcrash", None)
    msg = crash.message if crash is not None else str(lr or "")
    msg = " ".join(msg.split())
    return msg[:200]


def pytest_runtest_logreport(report):
    if not STATE or "conformance" not in report.nodeid.split("::")[0].replace("\\", "/").split("/")[:-1]:
        return                              # only checks of the conformance package (not tests/test_conformance_*)
    name = _check_name(report)
    checks = STATE["perf"] if "perf" in report.keywords else STATE["checks"]
    if report.when == "call" or (report.when == "setup" and not report.passed):
        outcome = "pass" if report.passed else ("skip" if report.skipped else "fail")
        checks[name] = {"check": name, "outcome": outcome, "reason": "" if report.passed else _reason(report),
                        "seconds": round(report.duration, 3)}
    elif report.when == "teardown" and report.failed and name in checks:
        checks[name].update(outcome="fail", reason="teardown: " + _reason(report))


def build_report() -> dict:
    checks = list(STATE.get("checks", {}).values())
    counts = {k: sum(c["outcome"] == k for c in checks) for k in ("pass", "fail", "skip")}
    return {"backend": STATE.get("backend"), "capabilities": STATE.get("capabilities"),
            "unavailable": STATE.get("unavailable"), "counts": counts, "checks": checks,
            "numerics": STATE.get("numerics"), "perf": list(STATE.get("perf", {}).values()),
            "costs": STATE.get("costs"), "engine": STATE.get("engine"), "engine_path": STATE.get("engine_path"),
            "seconds": round(time.time() - STATE.get("t0", time.time()), 2)}


def write_report(path=None) -> str:
    path = path or STATE["report"]
    d = os.path.dirname(os.path.abspath(path))
    os.makedirs(d, exist_ok=True)
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(build_report(), f, indent=1, sort_keys=True, default=str)
        f.write("\n")
    os.replace(tmp, path)
    return path


def pytest_terminal_summary(terminalreporter):
    if not STATE or not (STATE.get("checks") or STATE.get("perf")):    # a -k may select the perf section alone
        return
    rep = build_report()
    tw = terminalreporter
    cap = rep["capabilities"]
    tw.section(f"moetier conformance: backend {rep['backend']}")
    if cap:
        tw.line(f"device: {cap['device']}")
        tw.line(f"capabilities: lanes={','.join(cap['lanes'])} encodings={','.join(cap['encodings'])} "
                f"vram_slots={cap['vram_slots']} ram_readback={cap['ram_readback']} "
                f"vram_readback={cap['vram_readback']}")
    if rep["unavailable"]:
        tw.line(f"UNAVAILABLE: {rep['unavailable']}")
    w = max((len(c["check"]) for c in rep["checks"]), default=5)
    w = min(max(w, 5), 60)
    tw.line(f"{'check':<{w}} | {'result':<6} | reason")
    tw.line(f"{'-' * w}-+-{'-' * 6}-+-{'-' * 30}")
    for c in rep["checks"]:
        tw.line(f"{c['check'][:w]:<{w}} | {c['outcome']:<6} | {c['reason']}")
    n = rep["counts"]
    tw.line(f"{n['pass']} pass, {n['fail']} fail, {n['skip']} skip")
    for what, f in sorted((rep["numerics"] or {}).items()):
        tw.line(f"numerics {what}: NMSE {f['nmse']:.3g} (bound {f['nmse_bound']:.3g}), scale-1 "
                f"{f['scale_minus_1']:+.2g} (bound {f['scale_bound']:g})")
    if rep["perf"]:
        tw.line("perf (figures only, not counted): " + ", ".join(f"{c['check']} {c['outcome']}" for c in rep["perf"]))
    for lane, fit in sorted((rep["costs"] or {}).get("lanes", {}).items()):
        tw.line(f"cost {lane}: per_layer {fit['per_layer_ms']:.4f} ms, per_expert {fit['per_expert_ms']:.4f} ms, "
                f"per_extra_token {fit['per_extra_token_ms']:.4f} ms")
    for what in ("fill", "push"):
        v = (rep["costs"] or {}).get(f"{what}_gbps")
        if v is not None:
            tw.line(f"{what}: {v:.3f} GB/s")
    where = [f"report: {write_report()}"] if STATE.get("report") else []
    if rep["engine_path"]:
        where.append(f"engine record: {rep['engine_path']}")
    if where:
        tw.line("; ".join(where))


def pytest_unconfigure(config):
    if "hypothesis_home" in STATE:                # the process's own setting back (a run inside a test session)
        from hypothesis import configuration
        configuration.set_hypothesis_home_dir(STATE.pop("hypothesis_home"))
