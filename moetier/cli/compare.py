"""``moetier compare RECIPE [--trace T ...]``: the peers' policies, moetier's default and the oracle bound, one table.

Contract: for each trace (default: the recipe's) one table, rows = moetier, each peer (moetier.peers.rows)
and the oracle; columns tok/s at each concurrency (a lossy row shows its masked share beside tok/s), then at the
first concurrency the tier shares (VRAM / RAM / NVMe), NVMe reads and MB per token, prefetch MB wasted per token;
then the ratios moetier / best peer and moetier / oracle, the tier structure the oracle took at each concurrency
and the rows, if any, faster than it; last, with the oracle, each row's distance from it in tok/s split into
replacement, read-ahead and the rest (moetier.peers.gap; ``--no-gap`` leaves it out, three replays fewer a row).
``--json``: the moetier.peers.compare documents (a list when several traces). With ``--plot PNG`` a PNG (tok/s per
row and concurrency) is written there, one per trace (-<trace name> added when several), atomically; without it
nothing is written.
"""
from __future__ import annotations

from pathlib import Path

from moetier.cli.common import tok_s
from moetier.errors import UserError

__all__ = ["register", "format_compare", "format_summary", "plot_compare"]


def format_compare(d: dict) -> str:
    """The compare document as a markdown table."""
    cs = [str(c) for c in d["concs"]]
    c0 = cs[0]
    head = ["row"] + [f"tok/s C{c}" for c in cs] + [f"VRAM/RAM/NVMe C{c0}", "reads/tok", "MB/tok",
                                                      "wasted MB/tok"]
    lines = [f"recipe {d['recipe']}, trace {d['trace']}", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in d["rows"]:
        v0 = r["by_conc"][c0]
        cells = [r["peer"]] + [tok_s(r["by_conc"][c]) for c in cs] + [
            f"{v0['vram_hit']:.2f} / {v0['ram_hit']:.2f} / {v0['nvme_share']:.2f}", f"{v0['reads_per_tok']:.1f}",
            f"{v0['bytes_per_tok'] / 1e6:.1f}", f"{v0['wasted_bytes_per_tok'] / 1e6:.2f}"]
        lines.append("| " + " | ".join(cells) + " |")
    rt = d["ratios"]
    if rt["default_over_best_peer"]:
        lines.append("")
        lines.append("moetier / best peer: " + ", ".join(
            f"C{c} {rt['default_over_best_peer'][c]:.3f} ({rt['best_peer'][c]})" for c in rt["best_peer"]))
    if rt["default_over_oracle"]:
        lines.append("moetier / oracle: " + ", ".join(
            f"C{c} {x:.3f}" for c, x in rt["default_over_oracle"].items() if x is not None))
    if rt.get("shipped_over_best_peer"):
        lines.append("moetier-default (the shipped default policy on this recipe) / best peer: " + ", ".join(
            f"C{c} {x:.3f}" for c, x in rt["shipped_over_best_peer"].items() if x is not None)
            + "; / oracle: " + ", ".join(
            f"C{c} {x:.3f}" for c, x in rt.get("shipped_over_oracle", {}).items() if x is not None))
    orc = next((r for r in d["rows"] if r["peer"] == "oracle"), None)
    if orc is not None:
        lines.append("oracle = best of Belady under each tier structure: " + ", ".join(
            f"C{c} {orc['by_conc'][c].get('structure', 'oracle')}" for c in cs))
        over = {c: x for c, x in rt.get("over_oracle", {}).items() if x}
        lines.append("rows faster than the oracle (not a bound there; docs/peers.md): " + (", ".join(
            f"C{c} {', '.join(x)}" for c, x in over.items()) if over else "none"))
    if d.get("gap"):
        lines += ["", format_gap(d["gap"], cs)]
    return "\n".join(lines)


def format_gap(gap: dict, cs) -> str:
    """Each row's distance from the oracle (tok/s) = replacement + read-ahead + rest, per concurrency."""
    head = ["row"] + [f"oracle - row C{c} = replacement + read-ahead + rest" for c in cs]
    lines = ["distance from the oracle, tok/s (docs/peers.md: the gap)", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, per in gap.items():
        lines.append("| " + " | ".join([name] + [
            f"{g['gap']:.2f} = {g['replacement']:.2f} + {g['readahead']:.2f} + {g['rest']:.2f}"
            for g in (per[c] for c in cs)]) + " |")
    return "\n".join(lines)


def format_summary(docs) -> str:
    """One markdown line per compare document: moetier / best peer (named) and moetier / oracle per concurrency, and
    the rows faster than the oracle (none where it bounds the table); a second line, "RECIPE (shipped default)", for
    a recipe whose own policy is not the shipped default (its moetier-default row against the same peers)."""
    cs = [str(c) for c in docs[0]["concs"]] if docs else []
    head = (["recipe", "trace"] + [f"moetier / best peer C{c}" for c in cs] + [f"moetier / oracle C{c}" for c in cs]
            + ["faster than the oracle"])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for d in docs:
        rt = d["ratios"]

        def x(v):
            return "-" if v is None else f"{v:.3f}"
        over = "; ".join(f"C{c} {', '.join(n)}" for c, n in rt.get("over_oracle", {}).items() if n) or "none"
        lines.append("| " + " | ".join(
            [d["recipe"], str(d["trace"])]
            + [f"{x(rt['default_over_best_peer'].get(c))} ({rt['best_peer'].get(c, '-')})" for c in cs]
            + [x(rt["default_over_oracle"].get(c)) for c in cs] + [over]) + " |")
        if rt.get("shipped_over_best_peer"):
            lines.append("| " + " | ".join(
                [f"{d['recipe']} (shipped default)", str(d["trace"])]
                + [f"{x(rt['shipped_over_best_peer'].get(c))} ({rt['best_peer'].get(c, '-')})" for c in cs]
                + [x(rt["shipped_over_oracle"].get(c)) for c in cs] + ["-"]) + " |")
    return "\n".join(lines)


def plot_compare(rows, path, title: str = "") -> str:
    """tok/s per row and concurrency as a PNG (the CLI's shared plot, moetier.cli.plots.plot_compare)."""
    from moetier.cli.plots import plot_compare as shared
    flat = [{"policy": r["peer"], "conc": int(c), "tok_s": v["tok_s"]} for r in rows for c, v in r["by_conc"].items()]
    return shared(flat, path, title)


def cmd_compare(args) -> int:
    from moetier.cli import progress
    from moetier.cli.common import _emit, _resolve, find_path
    from moetier.peers.compare import compare
    from moetier.peers.rows import PEERS, by_name
    from moetier.traces.format import load_trace
    R = _resolve(args)
    traces = args.trace or [R.trace]
    if not traces or traces == [None]:
        raise UserError(f"compare: recipe {R.id} names no trace; give --trace")
    peers = PEERS
    if args.peers:
        try:
            peers = tuple(by_name(n) for n in args.peers.split(","))
        except KeyError as e:
            raise UserError(f"compare --peers: unknown row {e.args[0]!r}; expected names from "
                            f"{', '.join(p.name for p in PEERS)}") from None
    docs = []
    for t in traces:
        tr = load_trace(find_path(t), layers=R.layers, experts=R.experts, topk=R.topk, model_id=R.model_id)
        with progress.task(f"compare {Path(t).stem}", unit="rows") as prog:
            docs.append(compare(R, tr, concs=args.conc or [1, 2, 4], peers=peers, oracle=not args.no_oracle,
                                max_steps=args.steps, trace_name=str(t), gap=not args.no_gap,
                                progress=lambda name, i, n: prog(i, n)))
    for t, d in zip(traces, docs) if args.plot else ():
        png = Path(args.plot)
        if len(traces) > 1:
            png = png.with_name(f"{png.stem}-{Path(t).stem}{png.suffix}")
        d["png"] = str(plot_compare(d["rows"], png, f"{R.id} / {Path(t).name}"))
    if args.json:
        _emit(docs if len(docs) > 1 else docs[0])
        return 0
    from moetier.cli.render import text
    for d in docs:
        text(format_compare(d))
        if "png" in d:
            print(f"(plot: {d['png']})")
        print()
    return 0


def register(sub, parser_class) -> None:
    from moetier.cli.common import count, positive_int
    from moetier.cli.outpath import file_arg
    sp = sub.add_parser("compare", help="peers' policies, moetier's default and the oracle bound side by side")
    sp.add_argument("recipe", help="recipe id (registry/recipe/<id>.json)")
    sp.add_argument("--trace", nargs="+", help="routing traces (default: the recipe's)")
    sp.add_argument("--conc", type=positive_int, nargs="+", help="concurrency levels (default 1 2 4)")
    sp.add_argument("--steps", type=count, default=0, help="cap on measured steps (0 = the trace's)")
    sp.add_argument("--peers", help="comma-separated rows to run (default: all)")
    sp.add_argument("--no-oracle", action="store_true", help="leave out the oracle bound")
    sp.add_argument("--no-gap", action="store_true",
                    help="leave out each row's distance from the oracle split into replacement and read-ahead")
    sp.add_argument("--plot", "--png", dest="plot", metavar="PNG", type=file_arg("--plot"),
                    help="also draw tok/s per row and concurrency (moetier plot compare); --png is the old name")
    sp.add_argument("--set", nargs="+", metavar="PATH=VALUE", help="dotted recipe overrides, values as JSON")
    sp.add_argument("--json", action="store_true", help="machine-readable output")
    sp.set_defaults(fn=cmd_compare)
