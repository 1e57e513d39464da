"""`moetier plot KIND ...`: draw one figure (moetier.cli.plots) from the data the other commands make.

Contract: every kind takes ``--out PNG`` (required) and prints the path it wrote. Inputs are run record ids
(registry/runs/<id>.json), JSON files the commands print with --json, or JSON lines (one object a line, as
`moetier sweep` writes). A missing or malformed input is one line, exit 2. The commands that make the data also
take ``--plot PNG`` (sim, trace stats, probe report, calibrate, examples/levers.py) and call the same functions.
"""
from __future__ import annotations

from pathlib import Path

from moetier.cli.common import int_list, missing_arg, positive_int
from moetier.cli.outpath import file_arg
from moetier.errors import UserError

KINDS = ("levers", "timeline", "waterfall", "cache", "calibration", "compare")


def register(sub, parser_class) -> None:
    sp = sub.add_parser("plot", help="draw a figure (PNG): levers, timeline, waterfall, cache, calibration, compare")
    ps = sp.add_subparsers(dest="plot_kind", parser_class=parser_class, metavar="KIND")

    def out(p):
        p.add_argument("--out", required=True, metavar="PNG", type=file_arg("--out"), help="the PNG file to write")
        p.add_argument("--title", help="figure title (default: one naming the data)")

    p = ps.add_parser("levers", help="the lever study: bars per lever and concurrency")
    p.add_argument("data", metavar="JSON", help="the study's rows: python examples/levers.py --json > levers.json")
    out(p)
    p = ps.add_parser("timeline", help="tier use and VRAM hit rate over a simulated replay (stacked area)")
    p.add_argument("recipe", help="recipe id (registry/recipe/<id>.json)")
    p.add_argument("--set", nargs="+", metavar="PATH=VALUE", help="dotted recipe overrides, values as JSON")
    p.add_argument("--trace", help="routing trace (.npz, or reference .npy); default: the recipe's")
    p.add_argument("--segments", help="segments .npy for a reference .npy trace")
    p.add_argument("--conc", type=positive_int, nargs="+", default=[1], help="concurrency levels (default 1)")
    p.add_argument("--steps", type=positive_int, default=None, help="cap on measured steps (default: the trace's)")
    out(p)
    p = ps.add_parser("waterfall", help="per-layer chokepoint waterfall of a probed run")
    p.add_argument("data", metavar="RUN_OR_JSON", help="run record id with chokepoints (moetier probe report RUN "
                   "--write), or a probe report JSON file (moetier probe report ... --json > report.json)")
    out(p)
    p = ps.add_parser("cache", help="per-layer hit rate against cache slots: LRU vs Belady")
    p.add_argument("trace", help="trace file (.npz)")
    p.add_argument("--model", help="model id (its experts per layer; default: the trace's metadata)")
    p.add_argument("--layers", type=int, nargs="+", help="layers to draw (default: first, 1/3, 2/3, last)")
    p.add_argument("--layer-sizes", type=int_list, help="comma-separated slots per layer (default: a ladder)")
    p.add_argument("--sizes", dest="layer_sizes", type=positive_int, nargs="+",
                   help="slots per layer, space-separated: the old name of --layer-sizes")
    missing_arg(p)
    out(p)
    p = ps.add_parser("calibration", help="calibration: measured vs predicted tok/s with the error bands")
    p.add_argument("data", metavar="RUN_OR_JSON", help="calibration run record id (moetier calibrate) or its file")
    out(p)
    p = ps.add_parser("compare", help="policy comparison: bars per policy and concurrency")
    p.add_argument("data", metavar="JSON", help="rows {policy, conc, tok_s}: a JSON list, or JSON lines (a sweep's "
                   "results file)")
    out(p)
    sp.set_defaults(fn=cmd_plot)


def load_json(src: str, kind: str | None = "runs"):
    """A record id of ``kind``, a JSON file, or a JSON-lines file (a list of its objects)."""
    from moetier.core import records as spec
    p = Path(src)
    if not p.exists():
        if kind and spec.ID_RE.match(src):
            return spec.load_record(kind, src)
        raise UserError(f"{src}: no such file" + (f" and no {kind} record of that id" if kind else ""))
    from moetier import strictjson
    text = strictjson.read_text(p, src)
    try:
        return strictjson.loads(text, src)
    except UserError as e:
        if "invalid JSON" not in str(e):        # a non-finite number or deep nesting: no JSON-lines reading helps
            raise
    rows = []
    for i, line in enumerate(text.splitlines(), 1):
        if line.strip():
            try:
                rows.append(strictjson.loads(line, f"{src}:{i}"))
            except UserError as e:
                raise UserError(f"{e} (neither JSON nor JSON lines)") from None
    return rows


def timeline_results(R, tr, concs, steps=None) -> list[dict]:
    """sim.run with the per-step timeline, one result per concurrency (progress bars on a terminal)."""
    from moetier.cli import progress
    from moetier.core import sim
    out = []
    for c in concs:
        with progress.task(f"sim C{c}") as cb:
            out.append(sim.run(R, tr, c, max_steps=steps or 0, progress=cb, timeline=True))
    return out


def cmd_plot(args) -> int:
    from moetier.cli import plots
    k = args.plot_kind
    if k is None:
        raise UserError(f"plot: expected a kind: {', '.join(KINDS)}")
    try:
        return _plot(plots, k, args)
    except UserError as e:          # the drawing functions see rows, not files: name the input here
        src = getattr(args, "data", None)
        if src is None or not str(e).startswith("plot: "):
            raise
        raise UserError(f"plot {k} {src}: {str(e).removeprefix('plot: ')}") from None


def _plot(plots, k, args) -> int:
    if k == "levers":
        path = plots.plot_levers(load_json(args.data, None), args.out, args.title)
    elif k == "timeline":
        from moetier.cli.common import _resolve, _trace
        R = _resolve(args)
        path = plots.plot_timeline(timeline_results(R, _trace(args, R), args.conc, args.steps), args.out,
                                   args.title)
    elif k == "waterfall":
        path = plots.plot_waterfall(load_json(args.data), args.out, args.title)
    elif k == "cache":
        curves = cache_curves(args.trace, args.model, args.layers, args.layer_sizes, args.missing)
        path = plots.plot_cache(curves, args.out, args.title)
    elif k == "calibration":
        path = plots.plot_calibration(load_json(args.data), args.out, args.title)
    else:
        rows = load_json(args.data, None)
        path = plots.plot_compare(rows if isinstance(rows, list) else [rows], args.out, args.title)
    print(f"wrote {path}")
    return 0


def cache_curves(trace_path: str, model: str | None, layers=None, sizes=None, missing: str = "error") -> dict:
    from moetier.cli import plots
    from moetier.cli.common import find_path
    from moetier.core import records as spec
    from moetier.traces import format as T
    kw = {}
    if model:
        m = spec.load_record("model", model)["moe"]
        kw = {"layers": m["layers"], "experts": m["experts"], "topk": m["topk"], "model_id": model}
    tr = T.load_trace(find_path(trace_path), None, missing=missing, **kw)
    experts = kw.get("experts") or int(tr.meta.get("experts") or int(tr.ids.max()) + 1)
    from moetier.cli import progress
    with progress.task("hit-rate curves", unit="layers") as cb:
        return plots.layer_curves(tr, experts, layers, sizes, progress=cb)
