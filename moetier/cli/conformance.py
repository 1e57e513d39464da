"""`moetier conformance`: run the backend conformance suite (the `conformance` package) against one backend.

Contract: ``moetier conformance --backend NAME [--report PATH] [--md PATH] [--perf] [--write-engine ID] [-k EXPR]
[-x] [-v]`` runs ``pytest -p conformance.report <the conformance package dir> --backend NAME -rs`` in this process
and exits

  0  every check that ran passed (NOT_SUPPORTED checks are skipped with their reason) and, on a full run (no -k,
     no -x), the backend meets the minimum bar (conformance.bar: one lane's numerics, fill, landed/fence, the
     residency rule),
  1  at least one check failed (a backend moetier.run.contract.check refuses fails every check), or the minimum
     bar is not met (one line on stderr says which part and why; a backend that declares no lanes is named as
     such),
  2  a user error: an unknown backend name, a -k expression pytest cannot parse, or NOTHING could run because the
     backend's runtime or device is missing (the one-line BackendUnavailable reason is printed, e.g. "no CUDA
     device"); a --report is still written with every check skipped;
  130  interrupted (Ctrl-C, SIGTERM) before the run ended, whatever had passed by then.

The summary table (check | pass/fail/skip | reason) is printed at the end. Files only where asked: the JSON report
and the measured engine record beside it with --report, the markdown page with --md (conformance.publish), the engine
record in the user registry with --write-engine; nothing in the working directory otherwise (hypothesis's files go to
the user cache, conformance.report).
"""
from __future__ import annotations

import os
import sys

from moetier.atomic import atomic_write
from moetier.cli.outpath import check as check_out
from moetier.cli.outpath import file_arg
from moetier.errors import UserError


def register(sub, parser_class) -> None:
    p = sub.add_parser("conformance", help="run the backend conformance suite against one backend")
    p.add_argument("--backend", required=True, help="a registered backend: cpu, sycl, cuda, exl3xpu, exllamav3, or any "
                   "installed moetier.backends entry point")
    p.add_argument("--report", type=file_arg("--report"),
                   help="also write the JSON report to this path, the measured engine record beside it")
    p.add_argument("--md", metavar="FILE", type=file_arg("--md"), help="also write the report as a markdown table "
                   "(which checks ran, passed, failed, were skipped and why) to FILE")
    p.add_argument("--write-engine", metavar="ID", help="also write the measured engine record to "
                   "<user registry>/engine/<ID>.json")
    p.add_argument("--force", action="store_true", help="with --write-engine: replace an existing record, or write "
                   "a shipped id (the user registry's copy then overlays the shipped one)")
    p.add_argument("--perf", action="store_true", help="also run the perf section (lane costs, fill/push GB/s, the "
                   "engine record): figures only, never counted as a pass or a fail")
    p.add_argument("-k", dest="select", metavar="EXPR", help="pytest -k expression selecting checks")
    p.add_argument("-x", dest="exitfirst", action="store_true", help="stop at the first failure")
    p.add_argument("-v", dest="verbose", action="store_true", help="verbose pytest output")
    p.set_defaults(fn=cmd_conformance)


def pytest_args(backend: str, report: str | None, *, write_engine=None, select=None, exitfirst=False,
                verbose=False, force=False, perf=False) -> list:
    from conformance import capabilities
    pkg = os.path.dirname(os.path.abspath(capabilities.__file__))   # a path, not --pyargs: works from any cwd even
    args = ["-p", "conformance.report", pkg, "--backend", backend,  # under an old editable install
            "-rs", "-p", "no:cacheprovider", "-o", "addopts=", "-o", "testpaths=", "-q",
            # this process imported the plugin before pytest could rewrite its asserts (the checks' are rewritten)
            "-W", "ignore::pytest.PytestAssertRewriteWarning"]
    if report:
        args += ["--report", report]
    if write_engine:
        args += ["--write-engine", write_engine]
        if force:
            args.append("--replace-engine")
    if perf or write_engine:                            # the engine record is the perf section's figures
        args.append("--perf")
    if select:
        args += ["-k", select]
    if exitfirst:
        args.append("-x")
    if verbose:
        args.append("-v")
    return args


def _refused_or_interrupted(pytest, rc) -> bool:
    """True when pytest refused its arguments (it printed its one line: a -k it cannot parse); KeyboardInterrupt
    when the run was interrupted (Ctrl-C, SIGTERM), for what passed before that shows nothing."""
    if int(rc) == pytest.ExitCode.INTERRUPTED:
        raise KeyboardInterrupt
    return int(rc) == pytest.ExitCode.USAGE_ERROR


def _outputs_writable(args) -> str | None:
    """Every file the run was asked to write can be written (UserError naming the option, before the suite runs,
    not after); the --report path, absolute, with a report left there by an earlier run removed."""
    report = os.path.abspath(args.report) if args.report else None
    if report:
        check_out(report, "--report")
    if args.md:
        check_out(os.path.abspath(args.md), "--md")
    if args.write_engine is not None:
        from moetier.core import records as spec
        spec.check_writable("engine", args.write_engine, force=args.force, overlay=args.force)
    if report and os.path.exists(report):
        os.unlink(report)
    return report


def cmd_conformance(args) -> int:
    from conformance import bar, capabilities
    capabilities.check_name(args.backend)               # UserError -> one line, exit 2
    try:
        import pytest
    except ImportError:
        raise UserError("conformance: pytest is not installed (pip install 'moetier[test]')") from None
    from conformance import report as plugin
    report = _outputs_writable(args)
    plugin.STATE.clear()
    rc = pytest.main(pytest_args(args.backend, report, write_engine=args.write_engine, select=args.select,
                                 exitfirst=args.exitfirst, verbose=args.verbose, force=args.force,
                                 perf=args.perf))
    if _refused_or_interrupted(pytest, rc):
        return 2
    rep = plugin.build_report() if plugin.STATE.get("checks") else None
    if rep is not None and args.md:
        from conformance.publish import markdown
        text = markdown(rep).encode("utf-8")
        atomic_write(os.path.abspath(args.md), lambda f: f.write(text))
    if rep is not None:
        n = rep["counts"]
        if rep.get("unavailable") and n["pass"] == 0 and n["fail"] == 0:
            raise UserError(f"conformance: nothing could run: {rep['unavailable']}"
                            + (f" (report: {report})" if report else ""))
        why = None if args.select or args.exitfirst else bar.shortfall(rep)   # a selection cannot meet the bar
        if why:
            print(f"conformance: {why}" + (f" (report: {report})" if report else ""), file=sys.stderr)
        return 1 if n["fail"] or why else 0
    if int(rc) == 5:                                   # no tests collected / selected
        raise UserError(f"conformance: no check selected{f' by -k {args.select!r}' if args.select else ''}")
    return 1 if int(rc) else 0
