"""The conformance report as a markdown page a vendor can publish (``moetier conformance --md FILE``).

Contract: ``markdown(report)`` renders the JSON report (conformance.report.build_report) as: a heading naming the
backend and device, the capability table, the counts (ran = passed + failed; skipped, each with its reason), then one
table row per check (check | outcome | reason | seconds), failures first, and the numerics measured beside their
bounds (the report's ``numerics``) where any ran. Pure: a dict in, text out.
"""
from __future__ import annotations

ORDER = {"fail": 0, "pass": 1, "skip": 2}


def _cell(v) -> str:
    return str(v).replace("|", "\\|").replace("\n", " ")


def markdown(rep: dict) -> str:
    n = rep.get("counts") or {}
    cap = rep.get("capabilities")
    lines = [f"# moetier conformance: backend {rep.get('backend')}", ""]
    if cap:
        lines += [f"Device: {_cell(cap.get('device'))}", "", "| capability | value |", "|---|---|"]
        lines += [f"| {k} | {_cell(', '.join(map(str, v)) if isinstance(v, list) else v)} |"
                  for k, v in cap.items() if k not in ("name", "device")]
        lines.append("")
    if rep.get("unavailable"):
        lines += [f"UNAVAILABLE: {_cell(rep['unavailable'])}", ""]
    ran = n.get("pass", 0) + n.get("fail", 0)
    lines += [f"{ran} checks ran: {n.get('pass', 0)} passed, {n.get('fail', 0)} failed; {n.get('skip', 0)} skipped "
              "(each with its reason below).", "", "| check | outcome | reason | seconds |", "|---|---|---|---|"]
    for c in sorted(rep.get("checks") or [], key=lambda c: (ORDER.get(c["outcome"], 3), c["check"])):
        lines.append(f"| `{_cell(c['check'])}` | {c['outcome']} | {_cell(c.get('reason') or '')} | "
                     f"{c.get('seconds', '')} |")
    num = rep.get("numerics") or {}
    if num:
        lines += ["", "Numerics against the float64 reference, measured beside the bounds (docs/conformance.md):", "",
                  "| lane-encoding | worst NMSE | bound | best scale - 1 | bound |", "|---|---|---|---|---|"]
        lines += [f"| {k} | {f['nmse']:.3g} | {f['nmse_bound']:.3g} | {f['scale_minus_1']:+.2g} | "
                  f"{f['scale_bound']:g} |" for k, f in sorted(num.items())]
    return "\n".join(lines) + "\n"
