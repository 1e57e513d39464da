"""CLI verb ``moetier probe``: ``record`` (sample the host while a command runs) and ``report`` (utilization and
chokepoints for a run record or a probe file; ``--write`` stores them in the run record).

Contract: same as moetier.cli (one-line errors, exit 2). ``record`` exits with the command's exit status.
``report`` prints markdown tables, or with ``--json`` one strict JSON document ``{utilization, chokepoints}``;
``--md`` is accepted and ignored for one release (it asked for the tables when JSON was the default).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from moetier.cli.common import count_float, positive_float
from moetier.cli.outpath import file_arg
from moetier.errors import UserError


def register(sub, parser_class) -> None:
    sp = sub.add_parser("probe", help="host sampler and utilization / chokepoint report (docs/utilization.md)")
    psub = sp.add_subparsers(dest="probe_cmd", parser_class=parser_class)
    r = psub.add_parser("record", help="sample the host (JSON lines) while COMMAND runs")
    r.add_argument("--out", required=True, type=file_arg("--out"), help="probe file to append to")
    r.add_argument("--interval", type=positive_float, default=0.1, help="seconds between samples (default 0.1)")
    r.add_argument("--duration", type=count_float, default=0.0,
                   help="stop sampling after S seconds (0: when COMMAND exits)")
    r.add_argument("command", nargs="*", help="the command, after --")
    p = psub.add_parser("report", help="utilization + chokepoints of a run record or a probe file")
    p.add_argument("target", metavar="RUN_OR_PROBE", help="run record id (registry/runs/<id>.json), a run record "
                   "file, or a probe file")
    p.add_argument("--probe", help="probe file (default: the run record's 'probe' field)")
    p.add_argument("--hardware", help="hardware record id for the ceilings (default: the run record's, or its "
                   "recipe's)")
    p.add_argument("--json", action="store_true", help="print the report as one strict JSON document instead of "
                   "the tables")
    p.add_argument("--md", action="store_true", help="accepted and ignored (the tables are the default now; "
                   "the flag goes in the next release)")
    p.add_argument("--write", action="store_true", help="store utilization and chokepoints in the run record")
    p.add_argument("--force", action="store_true", help="with --write: write a shipped run record's id (the user "
                   "registry's copy then overlays the shipped one)")
    p.add_argument("--plot", metavar="PNG", type=file_arg("--plot"),
                   help="also draw the per-layer chokepoint waterfall (moetier plot "
                   "waterfall)")
    sp.set_defaults(fn=cmd_probe)


def cmd_probe(args) -> int:
    if args.probe_cmd == "record":
        return _record(args)
    if args.probe_cmd == "report":
        return _report(args)
    raise UserError("probe: expected a subcommand: record or report")


def _record(args) -> int:
    from moetier.measure import probe
    cmd = list(args.command or [])
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    return probe.record(args.out, cmd, interval=args.interval, duration=args.duration)


def _is_probe_file(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            first = f.readline(1 << 16).decode("utf-8", errors="replace")
    except OSError:
        return False
    try:
        d = json.loads(first)
    except (ValueError, RecursionError):
        return False
    return isinstance(d, dict) and d.get("kind") in ("header", "sample", "counters", "mark")


def _load_run(target: str):
    """(run record, path or None) for a run id or a run-record file; (None, None) when target is a probe file."""
    from moetier.core import records as spec
    p = Path(target)
    if p.is_file():
        if _is_probe_file(p):
            return None, None
        from moetier import strictjson
        try:
            rec = strictjson.load(p, target)
        except UserError as e:
            raise UserError(f"{e} (neither a probe file, JSON lines, nor a run record, JSON)") from None
        if not isinstance(rec, dict) or "id" not in rec:
            raise UserError(f"{target}: not a run record (expected a JSON object with an 'id')")
        return rec, p
    if not spec.ID_RE.match(target):
        raise UserError(f"{target}: no such file, and not a run record id")
    return spec.load_record("runs", target), spec.record_path("runs", target)


def _resolve_probe(p: str, rec_path: Path | None) -> Path:
    q = Path(p)
    if q.is_file() or q.is_absolute():
        return q
    from moetier.core import records as spec
    for base in ([rec_path.parent] if rec_path is not None else []) + spec.data_roots():
        if (base / q).is_file():
            return base / q
    return q


def _hardware_for(args, rec):
    """(hardware record or None, why it is None)."""
    from moetier.core import records as spec
    if args.hardware:
        return spec.load_record("hardware", args.hardware), None
    if rec is None:
        return None, None
    hid = rec.get("hardware") if isinstance(rec.get("hardware"), str) else None
    if hid is None and isinstance(rec.get("recipe"), str):
        try:
            hid = spec.load_record("recipe", rec["recipe"]).get("hardware")
        except UserError as e:
            return None, f"hardware: the run record's recipe could not be loaded ({e})"
    if hid is None:
        return None, None
    try:
        return spec.load_record("hardware", hid), None
    except UserError as e:
        return None, f"hardware: {e}"


def _report(args) -> int:
    from moetier.measure import probe
    from moetier.core import records as spec
    from moetier.cli.common import _emit
    rec, rec_path = _load_run(args.target)
    if rec is None:
        if args.write:
            raise UserError("probe report: --write needs a run record (give the run id, with --probe FILE)")
        probe_path = Path(args.probe) if args.probe else Path(args.target)
    else:
        src = args.probe or rec.get("probe")
        if not isinstance(src, str) or not src:
            raise UserError(f"run record {rec.get('id')}: no 'probe' field naming its probe file; give --probe FILE")
        probe_path = _resolve_probe(src, rec_path)
        if args.write:          # before the report: --write updates the run's record, a shipped one only with --force
            spec.check_writable("runs", rec.get("id"), force=True, overlay=args.force)
    if not probe_path.is_file():
        raise UserError(f"{probe_path}: probe file not found")
    hw, why = _hardware_for(args, rec)
    rep = probe.report(probe_path, hw, run_record=rec)
    q = rep["utilization"].get("quality") or {}
    if not q.get("samples") and rep["chokepoints"] is None:     # nothing to report: say so, not an empty table
        raise UserError(f"{probe_path}: no samples and no counters ({q.get('bad_lines', 0)} bad lines); expected a "
                        "probe file from moetier probe record or moetier run --probe")
    if why:
        rep["utilization"]["missing"] = sorted(set(rep["utilization"]["missing"]) | {why})
    if args.write:
        rec = dict(rec)
        rec["utilization"] = rep["utilization"]
        rec["chokepoints"] = rep["chokepoints"]
        if "probe" not in rec:
            rec["probe"] = str(probe_path)
        print(f"wrote runs {rec['id']}: {spec.write_record('runs', rec, force=True, overlay=args.force)}",
              file=sys.stderr)
    if args.plot:
        from moetier.cli.plots import plot_waterfall
        print(f"wrote {plot_waterfall(rep, args.plot)}", file=sys.stderr)
    if args.json:
        _emit(rep)
    else:
        from moetier.cli.render import text
        text(probe.to_markdown(rep).rstrip("\n"))
    return 0
