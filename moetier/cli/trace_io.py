"""``moetier trace import`` and ``moetier trace fit``: router logs in, and the generator fitted to a trace.

Contract: ``register(tsub, parser_class)`` adds both subcommands to the ``trace`` parser; each sets ``trace_fn``,
which ``cmd_trace`` calls. ``trace fit`` exits 0 when every layer's statistics are within their tolerances, 3
(``FIT_MISSED``) when one is not, after printing the table. Bad input: one line naming the file, field or flag (UserError, exit 2); the trace is
written atomically (moetier.traces.format.save_trace) or not at all.
"""
from __future__ import annotations

from moetier.errors import UserError

__all__ = ["register", "FIT_MISSED"]

FIT_MISSED = 3      # `trace fit`'s exit status when a statistic misses its tolerance at some layer


def cmd_import(args) -> int:
    from moetier.cli.common import _emit, find_path
    from moetier.traces.format import save_trace, validate
    from moetier.traces.importer import Fields, import_log
    geo = {}
    if args.model:
        from moetier.core import records as spec
        m = spec.load_record("model", args.model)["moe"]
        geo = {"experts": m["experts"], "topk": m["topk"], "layers": m["layers"]}
    fields = Fields(token=args.token_field, layer=args.layer_field, experts=args.experts_field,
                    weights=args.weights_field or None, segment=args.segment)
    tr = import_log([find_path(x) for x in args.src], fields, missing=args.missing, fmt=args.format,
                    experts=args.experts or geo.get("experts"), topk=args.topk or geo.get("topk"),
                    layers=args.layers or geo.get("layers"), name=args.name)
    if args.model:
        tr.meta["model_id"] = args.model
        validate(tr, layers=geo["layers"], experts=geo["experts"], topk=geo["topk"], path=args.src[0],
                 model_id=args.model)
    save_trace(tr, args.out)
    summary = {"out": str(args.out), "tokens": tr.tokens, "layers": tr.layers, "topk": tr.topk,
               "segments": tr.nseg, "dropped_tokens": tr.meta["dropped_tokens"],
               "masked_picks": tr.meta["masked_picks"], "weights": tr.weights is not None}
    if args.json:
        _emit(summary)
    else:
        lossy = ""
        if tr.meta["dropped_tokens"]:
            lossy = f", {tr.meta['dropped_tokens']} tokens dropped (missing router records)"
        elif tr.meta["masked_picks"]:
            lossy = f", {tr.meta['masked_picks']} picks masked (missing router records)"
        print(f"wrote {args.out}: {tr.tokens} tokens x {tr.layers} layers x top-{tr.topk}, {tr.nseg} segments"
              f"{lossy}")
    return 0


def cmd_fit(args) -> int:
    from moetier import strictjson
    from moetier.atomic import atomic_write
    from moetier.cli.common import _emit, find_path
    from moetier.traces.fit import fit_trace, format_fit
    from moetier.traces.format import load_trace
    geo = {}
    if args.model:
        from moetier.core import records as spec
        m = spec.load_record("model", args.model)["moe"]
        geo = {"experts": m["experts"], "topk": m["topk"], "layers": m["layers"], "model_id": args.model}
    tr = load_trace(find_path(args.path), args.segments, missing=args.missing, **geo)
    experts = args.experts or geo.get("experts") or tr.meta.get("experts")
    if not experts:
        raise UserError(f"trace fit {args.path}: the expert count is not in the trace's meta; give --experts or "
                        "--model")
    try:
        d = fit_trace(tr, int(experts), seed=args.seed, rounds=args.rounds)
    except UserError as e:          # fit_trace sees an array, not a file: name the file here
        raise UserError(f"{args.path}: {str(e).removeprefix('trace fit: ')}") from None
    d["trace"] = str(args.path)
    if args.out:
        rec = {"generator": "moetier.traces.layergen", "params": d["params"], "seed": d["seed"],
               "trace": d["trace"], "shape": d["shape"], "experts": d["experts"], "segments": d["segments"],
               "checks": d["checks"], "ok": d["ok"]}
        text = strictjson.dumps(rec, indent=1, sort_keys=True) + "\n"
        atomic_write(args.out, lambda f: f.write(text.encode()))
        d["out"] = str(args.out)
    if args.json:
        _emit(d)
    else:
        print(format_fit(d))
        if args.out:
            print(f"wrote {args.out}")
    return 0 if d["ok"] else FIT_MISSED


def register(tsub, parser_class) -> None:
    from moetier.cli.common import missing_arg, positive_int
    from moetier.cli.outpath import file_arg
    i = tsub.add_parser("import", help="router logs (JSON lines, CSV, npz) to one moetier trace")
    i.add_argument("src", nargs="+", help="router logs: .jsonl, .csv or .npz (or --format); several files or glob "
                   "patterns (quoted) are read in order into one trace")
    i.add_argument("--out", required=True, type=file_arg("--out"), help="trace to write (.npz)")
    i.add_argument("--format", choices=("jsonl", "csv", "npz"), help="log format (default: by suffix)")
    i.add_argument("--token-field", default="token", help="token index field (default token)")
    i.add_argument("--layer-field", default="layer", help="layer index field (default layer)")
    i.add_argument("--experts-field", default="experts", help="picked expert ids field (default experts)")
    i.add_argument("--weights-field", default="weights", help="gate weights field (default weights; '' for none)")
    i.add_argument("--segment", "--segment-field", dest="segment", metavar="FIELD[,FIELD...]",
                   help="request (segment) field, or several that together name a request (e.g. dataset,problem_id); "
                        "default: a token index that goes back starts a segment")
    i.add_argument("--missing", choices=("error", "drop", "mask"), default="error",
                   help="a missing router record: refuse (default), drop its token, or mask its picks (lossy)")
    i.add_argument("--model", help="model id: geometry from its record, and the trace is checked against it")
    i.add_argument("--experts", type=positive_int, help="experts per layer (ids must be below)")
    i.add_argument("--topk", type=positive_int, help="picks per token and layer (default: the most seen)")
    i.add_argument("--layers", type=positive_int, help="MoE layers (default: the most seen)")
    i.add_argument("--name", help="a name kept in the trace's meta")
    i.add_argument("--json", action="store_true", help="machine-readable summary")
    i.set_defaults(trace_fn=cmd_import)

    from moetier.cli.common import seed
    f = tsub.add_parser("fit", help="fit the per-layer generator to a trace and check the fit per layer; exit 3 when "
                        "a statistic misses its tolerance (docs/traces.md)")
    f.add_argument("path", help="trace file (.npz, or a reference .npy with --segments)")
    f.add_argument("--segments", help="segments .npy for a reference .npy trace")
    f.add_argument("--model", help="model id: geometry from its record, and the trace is checked against it")
    f.add_argument("--experts", type=positive_int, help="experts per layer (default: the trace's meta)")
    missing_arg(f)
    f.add_argument("--seed", type=seed, default=0, help="generator seed of the search and the check (default 0)")
    f.add_argument("--rounds", type=positive_int, default=2,
                   help="passes of the affinity and skew search (default 2; docs/traces.md)")
    f.add_argument("--out", type=file_arg("--out"),
                   help="write the fitted generator parameters and the checks here (JSON, atomic)")
    f.add_argument("--json", action="store_true", help="machine-readable report")
    f.set_defaults(trace_fn=cmd_fit)
