"""The moetier command line: show, table, sim, trace, list, plot, doctor, store, run, bench, ...

Contract: user errors (UserError, bad arguments) print one line ``moetier: error: ...`` on stderr and exit 2, with no
traceback. ``--json`` output is one JSON document with sorted keys. Progress goes to stderr, only on a terminal.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading

from moetier.cli.common import (DEFAULT_RECIPE, _emit, _Parser, _resolve, _trace, count,  # noqa: F401
                                count_float, find_path, fraction, int_in, int_list, json_object, missing_arg,
                                positive_float, positive_int, replay_interval, seed)
from moetier.cli import progress, views
from moetier.cli.outpath import REGISTRY, file_arg, registry_arg
from moetier.cli.outpath import check as check_out
from moetier.errors import UserError

MAX_WINDOW = 256        # sim --window: tokens verified per stream per step; each one is a row of every layer


def _sim_runs(R, tr, concs, args):
    from moetier.core import sim
    out = []
    for c in concs:
        kw = {}
        if getattr(args, "window", None):
            kw = dict(window=args.window, accept=args.accept or 1.0, draft_ms=args.draft_ms or 0.0)
        steps = getattr(args, "steps", 0) or 0
        with progress.task(f"sim C{c}") as cb:
            out.append(sim.run(R, tr, c, max_steps=steps, progress=cb, timeline=bool(args.plot), **kw))
        if args.interval:
            out[-1]["interval"] = replay_interval(R, tr, c, steps, **kw)
    return out


# ---- verbs -----------------------------------------------------------------------------------------------------
def cmd_show(args) -> int:
    from moetier.cli.render import say
    R = _resolve(args)
    s = R.summary()
    if args.json:
        _emit(s)
        return 0
    say(f"recipe {R.id}: model {R.model_id} on {R.hardware_id}")
    say(f"  experts: {R.layers} layers x {R.experts} (top-{R.topk}) = {R.keys} keys of {R.expert_bytes:,} B")
    say(f"  capacity: vram {R.vram_slots:,} / ram {R.ram_slots:,} / nvme-only {R.nvme_only:,}")
    say(f"  links: h2d {R.h2d_gbps} GB/s, nvme {R.nvme_bw_gbps} GB/s deep / {R.nvme_bw_qd1_gbps} GB/s qd1, "
          f"latency {R.nvme_latency_ms} ms")
    say("  lanes (ms):        per_layer  per_expert  per_extra_token  reads")
    for ln in R.lanes.values():
        say(f"    {ln.name:<14} {ln.per_layer_ms:>9.4f}  {ln.per_expert_ms:>10.4f}  {ln.per_extra_token_ms:>15.4f}"
              f"  {ln.reads}")
    say("  lanes (GB/s implied by per_expert_ms, against the hardware record):")
    for c in s["lane_checks"]:
        got = "n/a (no per-expert cost)" if c["gbps"] is None else f"{c['gbps']:.2f} GB/s"
        cap = f"{c['what']} {c['ceiling_gbps']:g} GB/s ({c['ceiling']})" if c["ceiling_gbps"] else \
            "no ceiling in the hardware record"
        say(f"    {c['lane']:<14} {got:<24} {'ABOVE' if c['over'] else 'within'} {cap}")
    for c in (c for c in s["lane_checks"] if c["over"]):
        print(f"  warning: {c['lane']} at {c['gbps']:.2f} GB/s is faster than the hardware record allows "
              f"({c['what']} {c['ceiling_gbps']:g} GB/s): its engine or hardware record is wrong for this model",
              file=sys.stderr)
    say(f"  policy: {json.dumps(R.policy, sort_keys=True)}")
    say(f"  fixed_ms: {json.dumps({str(k): v for k, v in sorted(R.fixed_ms.items())})}")
    return 0


def cmd_sim(args) -> int:
    if args.window is None:
        for flag, v in (("--accept", args.accept), ("--draft-ms", args.draft_ms)):
            if v is not None:
                raise UserError(f"{flag} {v:g}: needs --window N (the speculative verify window it applies to); "
                                f"without one every stream makes one token a step")
    elif args.accept is not None and args.accept > args.window:
        raise UserError(f"--accept {args.accept:g}: more than --window {args.window} (a stream cannot accept more "
                        f"tokens per step than its verify window holds)")
    R = _resolve(args)
    tr = _trace(args, R)
    res = _sim_runs(R, tr, args.conc or [1, 2, 4], args)
    _fixed_notes(R, res)
    if args.plot:
        from moetier.cli.plots import plot_timeline
        print(f"wrote {plot_timeline(res, args.plot)}", file=sys.stderr)
        for r in res:
            r.pop("timeline")
    if args.json:
        _emit(res if len(res) > 1 else res[0])
        return 0
    views.print_decode(res, title=f"sim {R.id} (trace {tr.meta.get('name') or args.trace or R.trace}, "
                                  f"seed {R.policy.get('seed')})")
    return 0


def _fixed_notes(R, results) -> None:
    """Say on stderr where a concurrency's non-MoE time was not measured (fixed_basis; also in --json)."""
    for r in results:
        if r.get("fixed_basis", "measured") != "measured":
            rows = r["conc"] * r["window"]
            print(f"note: C{r['conc']}: recipe {R.id} has no calibration.fixed_ms entry for {rows} rows; its non-MoE "
                  f"time (fixed) is {r['fixed_basis']}", file=sys.stderr)


def standard_table(R, tr, concs, with_interval: bool = False) -> dict:
    from moetier.core import sim
    decode = []
    for c in concs:
        with progress.task(f"sim C{c}") as cb:
            decode.append(sim.run(R, tr, c, progress=cb))
        if with_interval:
            decode[-1]["interval"] = replay_interval(R, tr, c)
    pre = {str(n): sim.prefill(R, n) for n in (8192, 32768)}
    return {"recipe": R.id, "vram_slots": R.vram_slots, "ram_slots": R.ram_slots, "nvme_only": R.nvme_only,
            "decode": decode, "prefill": pre}


def cmd_table(args) -> int:
    if args.recipe is None:
        args.recipe = DEFAULT_RECIPE
    R = _resolve(args)
    tr = _trace(args, R)
    t = standard_table(R, tr, args.conc or [1, 2, 4], args.interval)
    _fixed_notes(R, t["decode"])
    if args.json:
        _emit(t)
        return 0
    views.print_standard(t, f"recipe {R.id}: vram {R.vram_slots:,} / ram {R.ram_slots:,} / nvme {R.nvme_only:,} "
                            f"experts (trace {tr.meta.get('name') or args.trace or R.trace}, "
                            f"seed {R.policy.get('seed')}); decode")
    return 0


def cmd_trace(args) -> int:
    from moetier.traces import format as T
    if args.trace_cmd == "stats":
        from moetier.traces.stats import stats
        kw = _model_geometry(args.model) if args.model else {}
        tr = T.load_trace(find_path(args.path), args.segments, missing=args.missing, **kw)
        experts = kw.get("experts") or int(tr.meta.get("experts") or int(tr.ids.max()) + 1)
        with progress.task("trace stats", unit="parts") as cb:
            d = stats(tr, experts, cache_sizes=args.cache_sizes, layer_sizes=args.layer_sizes, progress=cb)
        if args.plot:
            from moetier.cli.plot import cache_curves
            from moetier.cli.plots import plot_cache
            curves = cache_curves(args.path, args.model, missing=args.missing)
            curves.update({"cache": d["cache"], "layers": d["layers"]})
            print(f"wrote {plot_cache(curves, args.plot)}", file=sys.stderr)
        if args.json:
            _emit(d)
        else:
            from moetier.cli.trace_view import print_trace_stats
            print_trace_stats(d)
        return 0
    if args.trace_cmd == "gen":
        from moetier.traces.gen import GenParams, generate
        from moetier.traces.layergen import MODEL, LayerParams, generate_layers
        geo = _model_geometry(args.model)
        if args.fit:
            from moetier import strictjson
            try:
                text = find_path(args.fit).read_text()
            except OSError as e:
                raise UserError(f"trace gen --fit {args.fit}: cannot be read ({e.strerror})") from None
            rec = strictjson.loads(text, f"trace gen --fit {args.fit}")
            if not isinstance(rec, dict) or not isinstance(rec.get("params"), dict):
                raise UserError(f"trace gen --fit {args.fit}: expected the record `trace fit --out` writes (a JSON "
                                f"object with \"params\")")
            args.params = rec["params"]
        if isinstance(args.params, dict) and args.params.get("model") == MODEL:     # `trace fit --out`'s params
            lp = LayerParams.from_json(args.params)
            if lp.layers != geo["layers"]:
                raise UserError(f"trace gen --params: {lp.layers} layers of parameters; model {args.model} has "
                                f"{geo['layers']} MoE layers")
            tr = generate_layers(lp, experts=geo["experts"], topk=geo["topk"], tokens=args.tokens,
                                 segments=args.segments, seed=args.seed, model_id=args.model)
        else:
            params = GenParams.from_json(args.params) if args.params is not None else GenParams()
            tr = generate(params, layers=geo["layers"], experts=geo["experts"], topk=geo["topk"],
                          tokens=args.tokens, segments=args.segments, seed=args.seed, model_id=args.model)
        T.save_trace(tr, args.out)
        print(f"wrote {args.out}: {tr.ids.shape[0]} tokens x {tr.ids.shape[1]} layers x top-{tr.ids.shape[2]}, "
              f"{tr.nseg} segments")
        return 0
    if args.trace_cmd == "convert":
        tr = T.convert(find_path(args.src), args.dst, segments_path=args.segments, missing=args.missing)
        print(f"wrote {args.dst}: {tuple(tr.ids.shape)}, {tr.nseg} segments")
        return 0
    if getattr(args, "trace_fn", None) is not None:
        return args.trace_fn(args)
    raise UserError("trace: expected a subcommand: stats, gen, convert, import or fit")


def _model_geometry(model_id: str) -> dict:
    from moetier.core import records as spec
    m = spec.load_record("model", model_id)
    return {"layers": m["moe"]["layers"], "experts": m["moe"]["experts"], "topk": m["moe"]["topk"],
            "model_id": model_id}


REGISTRY_HELP = ("user registry: where bench, calibrate and run records are written, read over the shipped records "
                 "(default $MOETIER_REGISTRY, else $XDG_DATA_HOME/moetier/registry)")


# ---- parser ----------------------------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="moetier", description="Tiered MoE expert residency: records, planner, simulator, runtime.")
    p.add_argument("--version", action="version", version=f"moetier {_version()}",
                   help="print the version and exit")
    p.add_argument("--registry", metavar="DIR", type=registry_arg, help=REGISTRY_HELP)
    sub = p.add_subparsers(dest="cmd", parser_class=_Parser)

    def recipe_args(sp, optional=False):
        if optional:
            sp.add_argument("recipe", nargs="?", default=None, help=f"recipe id (default {DEFAULT_RECIPE})")
        else:
            sp.add_argument("recipe", help="recipe id (registry/recipe/<id>.json)")
        sp.add_argument("--set", nargs="+", metavar="PATH=VALUE", help="dotted recipe overrides, values as JSON")
        sp.add_argument("--json", action="store_true", help="machine-readable output")

    sp = sub.add_parser("show", help="resolved records, capacity split, lanes and costs")
    recipe_args(sp)
    sp.set_defaults(fn=cmd_show)

    for name, fn, opt in (("sim", cmd_sim, False), ("table", cmd_table, True)):
        sp = sub.add_parser(name, help="trace replay" if name == "sim" else "the standard table")
        recipe_args(sp, optional=opt)
        sp.add_argument("--trace", help="routing trace (.npz, or reference .npy); default: the recipe's")
        sp.add_argument("--segments", help="segments .npy for a reference .npy trace")
        sp.add_argument("--conc", type=positive_int, nargs="+", help="concurrency levels (default 1 2 4)")
        missing_arg(sp)
        if name == "sim":
            sp.add_argument("--steps", type=count, default=0, help="cap on measured steps (0 = the trace's)")
            sp.add_argument("--window", type=int_in(1, MAX_WINDOW), default=None,
                            help="speculative verify window (tokens per stream)")
            sp.add_argument("--accept", type=positive_float, default=None,
                            help="with --window: tokens accepted per stream per step (default 1)")
            sp.add_argument("--draft-ms", type=count_float, default=None,
                            help="with --window: draft cost per step (ms; default 0)")
            sp.add_argument("--plot", metavar="PNG", type=file_arg("--plot"),
                            help="also draw tier use and VRAM hit rate over the replay "
                            "(moetier plot timeline)")
            sp.add_argument("--no-interval", dest="interval", action="store_false",
                            help="skip the prediction interval (two more replays: the terms at their slow and fast "
                                 "quantiles, moetier.core.interval)")
        else:
            sp.add_argument("--interval", action="store_true",
                            help="add each decode tok/s's prediction interval (two more replays per concurrency: "
                                 "the terms at their slow and fast quantiles, moetier.core.interval)")
        sp.set_defaults(fn=fn)

    sp = sub.add_parser("trace", help="routing traces: stats, gen, convert, import, fit")
    tsub = sp.add_subparsers(dest="trace_cmd", parser_class=_Parser)
    s = tsub.add_parser("stats", help="popularity, reuse distance, LRU/Belady curves")
    s.add_argument("path", help="trace file (.npz, or a reference .npy with --segments)")
    s.add_argument("--segments", help="segments .npy for a reference .npy trace")
    s.add_argument("--model", help="model id to validate against")
    s.add_argument("--cache-sizes", type=int_list, help="comma-separated slot counts for the hit-rate curves")
    s.add_argument("--layer-sizes", type=int_list, help="comma-separated slots per layer for the per-layer curves")
    missing_arg(s)
    s.add_argument("--json", action="store_true", help="machine-readable output")
    s.add_argument("--plot", metavar="PNG", type=file_arg("--plot"),
                   help="also draw per-layer hit-rate curves, LRU vs Belady (moetier plot "
                   "cache)")
    g = tsub.add_parser("gen", help="synthetic trace (docs/traces.md)")
    g.add_argument("--model", required=True, help="model id whose geometry (layers, experts, top-k) to use")
    g.add_argument("--out", required=True, type=file_arg("--out"), help="trace file to write (.npz)")
    g.add_argument("--tokens", type=positive_int, default=4000, help="tokens to generate (default 4000)")
    g.add_argument("--segments", type=positive_int, default=4, help="independent segments (streams; default 4)")
    g.add_argument("--seed", type=seed, default=0, help="random seed (default 0)")
    g.add_argument("--params", type=json_object, help="GenParams as JSON, or the per-layer parameters `trace fit "
                   "--out` wrote (its \"params\")")
    g.add_argument("--fit", metavar="JSON", help="the record `trace fit --out` wrote: generate from its per-layer "
                   "parameters")
    c = tsub.add_parser("convert", help="reference .npy (+ .segments.npy) <-> .npz")
    c.add_argument("src", help="trace to read (.npz or reference .npy)")
    c.add_argument("dst", type=file_arg("DST"), help="trace to write (.npz or .npy)")
    c.add_argument("--segments", help="segments .npy beside a reference .npy trace")
    missing_arg(c)
    from moetier.cli import trace_io
    trace_io.register(tsub, _Parser)
    sp.set_defaults(fn=cmd_trace)
    from moetier.cli import model as cli_model
    cli_model.register(sub, _Parser)
    from moetier.cli import compare as cli_compare
    cli_compare.register(sub, _Parser)
    _extend(sub)
    _finish(p)
    _registry_everywhere(p)
    return p


def _version() -> str:
    from moetier import __version__
    return __version__


def _finish(p: argparse.ArgumentParser) -> None:
    """Every (sub)command takes --quiet (no progress bars); the top level keeps its own value unless given."""
    for sp in _subparsers(p):
        if not any("--quiet" in a.option_strings for a in sp._actions):
            sp.add_argument("--quiet", "-q", action="store_true", default=argparse.SUPPRESS,
                            help="no progress bars (they draw only on a terminal anyway)")


def _subparsers(p: argparse.ArgumentParser):
    """p and every parser below it."""
    yield p
    for a in p._actions:
        if isinstance(a, argparse._SubParsersAction):
            for sp in dict.fromkeys(a.choices.values()):
                yield from _subparsers(sp)


def _registry_everywhere(p: argparse.ArgumentParser) -> None:
    """--registry after the verb too (`moetier run ... --registry DIR`, `moetier probe report ... --registry DIR`)."""
    for sp in _subparsers(p):
        if sp is not p:
            sp.add_argument("--registry", metavar="DIR", type=registry_arg, default=argparse.SUPPRESS,
                            help=REGISTRY_HELP)


def _extend(sub) -> None:
    """Verbs that need the runtime extras register here (kept out of the import path of the core verbs)."""
    from moetier.cli import adapter as cli_adapter       # imports its engine only when run
    from moetier.cli import advise, doctor, listing, plot, sweep
    for m in (cli_adapter, listing, plot, doctor, sweep, advise):
        m.register(sub, _Parser)
    try:
        from moetier.cli import runtime as cli_runtime
    except ImportError:
        return
    cli_runtime.register(sub, _Parser)
    from moetier.cli import conformance as cli_conformance
    cli_conformance.register(sub, _Parser)
    from moetier.cli import probe as cli_probe
    cli_probe.register(sub, _Parser)


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the main thread so that it unwinds (and cleans up) as Ctrl-C does."""


def _on_sigterm(signum, frame):
    raise Terminated()


def main(argv=None) -> int:
    from moetier.core import records as spec
    parser = build_parser()
    prev = spec.set_user_registry(None)

    def dispatch() -> int:
        args = parser.parse_args(argv)
        spec.set_user_registry(getattr(args, "registry", None) or prev)
        # before any work, read-only commands included: reads look there too
        check_out(spec.user_registry(), "--registry" if getattr(args, "registry", None) else
                  "user registry ($MOETIER_REGISTRY, else $XDG_DATA_HOME/moetier/registry)", REGISTRY)
        if not getattr(args, "fn", None):
            parser.print_help()
            return 2
        with progress.session(quiet=getattr(args, "quiet", False)):
            return args.fn(args) or 0
    try:
        return guarded(dispatch)
    finally:
        spec.set_user_registry(prev)       # main() may run many times in one process


def guarded(work) -> int:
    """Run ``work()`` at the command line's edge: its return value is the exit status; a UserError prints one line
    ``moetier: error: ...`` and gives 2; SIGTERM unwinds like Ctrl-C (130), as 143."""
    old = None
    if threading.current_thread() is threading.main_thread():
        old = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        return work()
    except UserError as e:
        print(f"moetier: error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        os._exit(0)
    except Terminated:
        print("moetier: terminated (SIGTERM)", file=sys.stderr)
        return 128 + signal.SIGTERM
    except KeyboardInterrupt:
        print("moetier: interrupted", file=sys.stderr)
        return 130
    finally:
        if old is not None:
            signal.signal(signal.SIGTERM, old)


if __name__ == "__main__":
    sys.exit(main())
