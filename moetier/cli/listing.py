"""`moetier list [KIND]`: the records in the registry, one line each: its id and what it is.

Contract: KIND is one of moetier.core.records.KINDS (model, hardware, engine, recipe, runs) or omitted (all kinds).
The description is built from the record's own fields (a record that fails to load is listed with the one-line
reason, not skipped). ``--json`` prints {kind: [{"id", "description"}]}.
"""
from __future__ import annotations

from moetier.errors import UserError


def register(sub, parser_class) -> None:
    from moetier.core.records import KINDS
    p = sub.add_parser("list", help="the records in the registry, one line each")
    p.add_argument("kind", nargs="?", choices=KINDS, metavar="KIND",
                   help=f"record kind: {', '.join(KINDS)} (default: all)")
    p.add_argument("--json", action="store_true", help="print {kind: [{id, description}]} as JSON")
    p.set_defaults(fn=cmd_list)


def _gb(x) -> str:
    return f"{x:g} GB" if isinstance(x, (int, float)) else "?"


def describe(kind: str, r: dict) -> str:
    """One line saying what record ``r`` of ``kind`` is."""
    if kind == "model":
        m = r.get("moe", {})
        return (f"{r.get('family', r['id'])}: {m.get('layers')} layers x {m.get('experts')} experts, "
                f"top-{m.get('topk')}, {m.get('expert_bytes', 0) / 2**20:.1f} MiB per expert")
    if kind == "hardware":
        parts = [(r.get(k) or {}).get("name") for k in ("gpu", "cpu", "nvme")]
        return " / ".join(p for p in parts if p) or r.get("source", "")
    if kind == "engine":
        lanes = ", ".join(sorted(r.get("lanes", {})))
        return f"lanes: {lanes or 'none'}" + (f"; {r['source']}" if r.get("source") else "")
    if kind == "recipe":
        b = r.get("budget", {})
        return (f"{r.get('model')} on {r.get('hardware')}, RAM {_gb(b.get('ram_gb'))}, "
                f"{b.get('vram_expert_slots', 0)} VRAM slots" + (f" ({r['status']})" if r.get("status") else ""))
    return r.get("title") or f"run of {r.get('recipe')} on {r.get('backend')}, {r.get('measured', '')}"


def cmd_list(args) -> int:
    from moetier.core import records as spec
    from moetier.cli.common import _emit
    from moetier.cli.render import table
    kinds = [args.kind] if args.kind else list(spec.KINDS)
    out = {}
    for kind in kinds:
        rows = []
        for rid in spec.record_ids(kind):
            try:
                desc = describe(kind, spec.load_record(kind, rid))
            except UserError as e:
                desc = f"(does not load: {e})"
            rows.append({"id": rid, "description": desc})
        out[kind] = rows
    if args.json:
        _emit(out)
        return 0
    for i, kind in enumerate(kinds):
        if i:
            print()
        table(["id", "description"], [[r["id"], r["description"]] for r in out[kind]],
              title=f"{kind} ({len(out[kind])})")
    return 0
