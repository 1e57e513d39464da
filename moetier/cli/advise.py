"""`moetier advise`: what to put where (the best recipe per concurrency, searched by the simulator), and with
``--upgrades`` what to buy next.

Contract: ``moetier advise [RECIPE | --model M --hardware H [--engines E ...]] [--trace T] [--conc N ...]
[--ram-gb GB] [--vram-reserve-gb GB] [--lossy [--masked-cap SHARE]] [--target TOK_S] [--candidates N] [--seed S]
[--steps N] [--workers N | --ray ADDRESS] [--id PREFIX] [--force] [--no-write] [--upgrades] [--plot PNG] [--json]``
prints, per concurrency, the starting and the advised tok/s with the advice's interval, what bounds it and which
knobs mattered; writes each advised recipe to the user registry as ``<PREFIX>-c<N>`` (default prefix
``<recipe>-advised``; an existing record is replaced only with --force, and the id is checked before the search),
printing ``wrote recipe <id>: <path>`` for each (on stderr with --json);
with --target, a target no placement can reach is one line and exit 2 before the search, and a target the search
does not reach says the best reachable and exits 1 (the advice is still printed and written). Bad limits: one
line, exit 2. Search and output: docs/advise.md.
"""
from __future__ import annotations

import sys

from moetier.cli.common import count_float, fraction, positive_float, positive_int, seed
from moetier.cli.outpath import file_arg
from moetier.errors import UserError


def register(sub, parser_class) -> None:
    p = sub.add_parser("advise", help="search the recipe's knobs for the best tok/s per concurrency; --upgrades: "
                       "what to buy next")
    p.add_argument("recipe", nargs="?", help="recipe to start from (or --model and --hardware)")
    p.add_argument("--model", help="model id: start from a recipe that joins it with --hardware")
    p.add_argument("--hardware", help="hardware id (with --model)")
    p.add_argument("--engines", nargs="+", help="engine ids the starting recipe must use (with --model)")
    p.add_argument("--trace", help="routing trace (default: the recipe's)")
    p.add_argument("--conc", type=positive_int, nargs="+", default=[1, 2, 4], help="concurrencies (default 1 2 4)")
    p.add_argument("--ram-gb", type=positive_float, help="RAM cap in GB (default: the recipe's budget.ram_gb)")
    p.add_argument("--vram-reserve-gb", type=count_float,
                   help="VRAM kept for the non-MoE part and KV cache (default: what the recipe's slots leave)")
    p.add_argument("--lossy", action="store_true", help="allow masking NVMe picks and low-bit cold records")
    p.add_argument("--masked-cap", type=fraction, help="largest masked share of picks (with --lossy; default 0.02, "
                   "or a start that masks: its own share)")
    p.add_argument("--target", type=positive_float, help="decode tok/s wanted at every concurrency")
    p.add_argument("--candidates", type=positive_int, default=64, help="configurations to try (default 64)")
    p.add_argument("--seed", type=seed, default=0, help="seed of the random candidates (default 0)")
    p.add_argument("--steps", type=positive_int, default=150, help="measured steps of a full replay (default 150)")
    p.add_argument("--workers", type=positive_int, help="local processes, or CPUs of a local Ray instance")
    p.add_argument("--ray", metavar="ADDRESS", help="run on Ray: 'local' or a cluster address")
    p.add_argument("--id", dest="rid", metavar="PREFIX", help="advised record ids: PREFIX-c<N>")
    p.add_argument("--force", action="store_true", help="replace advised records of the same id")
    p.add_argument("--no-write", dest="write", action="store_false", help="do not write the advised records")
    p.add_argument("--upgrades", action="store_true",
                   help="also search each upgrade the hardware record can express and print the tok/s each gains")
    p.add_argument("--plot", metavar="PNG", type=file_arg("--plot"), help="draw tok/s against RAM/VRAM used, Pareto front marked "
                   "(with --upgrades also PNG's stem + '-upgrades.png')")
    p.add_argument("--json", action="store_true", help="print the advice as JSON")
    p.set_defaults(fn=cmd_advise)


def start_recipe(args) -> str:
    """The recipe to start from: the one given, else the first joining --model with --hardware (shipped
    candidates first, then by id)."""
    from moetier.core import records as spec
    if args.recipe:
        if args.model or args.hardware or args.engines:
            raise UserError("advise: give a recipe, or --model and --hardware, not both")
        return args.recipe
    if not (args.model and args.hardware):
        raise UserError("advise: expected a recipe id, or --model and --hardware")
    recs = [r for r in spec.index()["recipes"] if r["model"] == args.model and r["hardware"] == args.hardware]
    if args.engines:
        recs = [r for r in recs if spec.load_record("recipe", r["id"])["engines"] == list(args.engines)]
    if not recs:
        raise UserError(f"advise: no recipe joins model {args.model!r} with hardware {args.hardware!r}"
                        f"{' and engines ' + ' '.join(args.engines) if args.engines else ''}; a recipe carries the "
                        f"calibration a search needs: write one (docs/advise.md)")
    # a shipped candidate before a what-if or a record of the user's (an earlier advice among them)
    recs.sort(key=lambda r: (not spec.is_shipped("recipe", r["id"]), r["status"] != "candidate", r["id"]))
    return recs[0]["id"]


def cmd_advise(args) -> int:
    from moetier.cli import progress
    from moetier.cli.common import _emit, find_path
    from moetier.core import records as spec
    from moetier.measure import advise_report as AR
    from moetier.measure import advise_space as space
    rid = start_recipe(args)
    R0 = spec.resolve(rid)
    lim = space.limits(R0, ram_gb=args.ram_gb, vram_reserve_gb=args.vram_reserve_gb, lossy=args.lossy,
                       masked_cap=args.masked_cap)
    if args.target is not None:
        AR.target_check(R0, args.target, args.conc)
    trace = str(find_path(args.trace)) if args.trace else None
    from moetier.measure import sweep as S
    S._trace(trace, R0)                    # a bad trace is one line here, not an error in every replay
    ids = _advice_ids(args, rid)
    with progress.task("advise", unit="replays") as cb:
        out = AR.advise(rid, lim=lim, concs=args.conc, n=args.candidates, seed=args.seed, steps=args.steps,
                        trace=trace, workers=args.workers, ray=args.ray, progress=cb, upgrades=args.upgrades)
    if not out["best"]:
        errs = [r["error"] for r in out["search"]["rows"] if "error" in r]
        cap = "the start's share" if lim.masked_cap is None else f"{lim.masked_cap:g}"
        raise UserError(f"advise {rid}: no configuration ran within the limits (masked cap {cap})"
                        + (f"; the first error: {errs[0]}" if errs else ""))
    written = []
    if args.write:
        recs = [("recipe", AR.record(R0, out["best"][c], ids[c], c, args.seed)) for c in out["best"]]
        written = [{"kind": kind, "id": rec["id"], "path": str(path)}
                   for (kind, rec), path in zip(recs, spec.write_records(recs, force=args.force))]
    if args.plot:
        _plots(args, out, rid)
    short = [c for c in args.conc if args.target is not None and
             (c not in out["best"] or out["best"][c]["tok_s"] < args.target)]
    if args.json:
        _emit(_doc(rid, out, ids, written, args))
    else:
        _print(rid, out, args)
    for w in written:             # the line and stream of run --record, calibrate and bench: stdout keeps the advice
        print(f"wrote {w['kind']} {w['id']}: {w['path']}", file=sys.stderr)
    if short:
        best = ", ".join(f"C{c} {out['best'][c]['tok_s']:.2f}" for c in short if c in out["best"])
        print(f"advise: target {args.target:g} tok/s not reached at {', '.join(f'C{c}' for c in short)}; best "
              f"reachable: {best} tok/s", file=sys.stderr)
        return 1
    return 0


def _advice_ids(args, rid: str) -> dict:
    """conc -> the advised recipe's id, each checked writable before the search (never a shipped id)."""
    from moetier.core import records as spec
    prefix = args.rid or f"{rid}-advised"
    ids = {c: f"{prefix}-c{c}" for c in args.conc}
    for c, i in ids.items() if args.write else ():
        if spec.is_shipped("recipe", i):
            raise UserError(f"--id {prefix}: {i!r} is a shipped recipe id; expected an id of its own")
        spec.check_writable("recipe", i, force=args.force)
    return ids


def _plots(args, out: dict, rid: str) -> None:
    from moetier.cli.advise_plot import plot_pareto, plot_upgrades
    print(f"wrote {plot_pareto(out['search']['rows'], args.plot, f'advise {rid}: configurations tried')}",
          file=sys.stderr)
    if args.upgrades:
        up = str(args.plot).rsplit(".", 1)[0] + "-upgrades.png"
        print(f"wrote {plot_upgrades(out['upgrades'], args.conc, up, f'advise {rid}: tok/s per upgrade')}",
              file=sys.stderr)


def _doc(rid, out, ids, written, args) -> dict:
    def row(r):
        return {k: r[k] for k in ("tok_s", "ms_per_step", "ram_gb", "vram_gb", "bound", "masked_share",
                                  "overrides")}
    return {"recipe": rid, "seed": args.seed, "candidates": out["candidates"], "replays": out["cells"],
            "seconds": out["seconds"], "written": written,
            "advice": {str(c): {"id": ids[c], "start": row(out["start"][c]), "best": row(b),
                                "interval": out["interval"][c], "mattered": out["mattered"][c]}
                       for c, b in out["best"].items()},
            **({"upgrades": [{**u, "gain": {str(c): v for c, v in u.get("gain", {}).items()}}
                             for u in out["upgrades"]]} if "upgrades" in out else {})}


def _print(rid, out, args) -> None:
    from moetier.cli.render import table
    rows = []
    for c, b in out["best"].items():
        s, iv = out["start"][c], out["interval"][c]
        rows.append([f"C{c}", f"{s['tok_s']:.2f}", f"{b['tok_s']:.2f}", f"{b['tok_s'] - s['tok_s']:+.2f}",
                     f"{iv['low']:.2f}-{iv['high']:.2f}" if iv else "-", b["bound"], f"{b['ram_gb']:.1f}",
                     f"{b['vram_gb']:.1f}", "; ".join(o for o in b["overrides"]) or "(the start is best)"])
    table(["conc", "start tok/s", "advised tok/s", "gain", "interval", "bound", "RAM GB", "VRAM GB", "changes"],
          rows, title=f"advise {rid}: {out['candidates']} configurations, {out['cells']} replays, "
          f"{out['seconds']:.1f} s",
          legend=("tok/s: simulated decode, total over the streams, full replays; interval: the advice's terms at "
                  "their slow and fast quantiles (moetier.core.interval)",
                  "bound: the busier lane of the advice; changes: the overrides on the starting recipe"))
    for c, m in out["mattered"].items():
        if m:
            table(["knob", "advised value", "tok/s lost when put back"],
                  [[x["knob"], x["value"], "-" if x["lost_tok_s"] is None else f"{x['lost_tok_s']:.2f}"]
                   for x in m], title=f"which knobs mattered at C{c}")
    if "upgrades" in out:
        table(["upgrade", *[f"C{c} gain" for c in args.conc], "note"],
              [[u["name"], *[f"{u['gain'][c]:+.2f}" if c in u.get("gain", {}) else "-" for c in args.conc],
                u.get("why", "")] for u in out["upgrades"]],
              title="what to buy next: tok/s gained over the advice, each upgrade searched again")
