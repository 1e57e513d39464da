"""`moetier sweep`: the simulator over overrides x traces x concurrency x policies (moetier.measure.sweep).

Contract: ``moetier sweep RECIPE --grid PATH=V1,V2 ... [--trace T ...] [--conc N ...] [--policy P ...]
--out results.jsonl [--steps N] [--workers N] [--ray ADDRESS|local] [--plot PNG] [--json]`` appends one JSON line
per finished cell to --out, skips cells already there (re-running resumes), then prints a summary and the best
cells (or, with --json, the summary and every row of this grid). A bad path or value in the grid is one line,
exit 2, before any cell runs.
"""
from __future__ import annotations

import sys

from moetier.cli.common import count, positive_int
from moetier.cli.outpath import file_arg
from moetier.errors import UserError


def register(sub, parser_class) -> None:
    p = sub.add_parser("sweep", help="simulate a grid: overrides x traces x concurrency x policies, resumable, on a "
                       "process pool or Ray")
    p.add_argument("recipe", help="recipe id (registry/recipe/<id>.json)")
    p.add_argument("--grid", nargs="+", default=[], metavar="PATH=V1,V2",
                   help="one axis per item: a dotted recipe path and its values (JSON, else strings)")
    p.add_argument("--set", nargs="+", default=[], metavar="PATH=VALUE",
                   help="overrides applied to every cell (values as JSON)")
    p.add_argument("--trace", nargs="+", default=[None], help="traces to replay (default: the recipe's)")
    p.add_argument("--conc", type=positive_int, nargs="+", default=[1, 2, 4],
                   help="concurrency levels (default 1 2 4)")
    p.add_argument("--policy", nargs="+", default=[None],
                   help="RAM eviction policies (policy.ram_evict: lru, lfu, lfu:WINDOW[:HALFLIFE]; default: the "
                   "recipe's)")
    p.add_argument("--steps", type=count, default=0, help="cap on measured steps per cell (0 = the trace's)")
    p.add_argument("--out", required=True, type=file_arg("--out"),
                   help="results file, JSON lines (appended; finished cells are skipped)")
    p.add_argument("--workers", type=positive_int, default=None,
                   help="local processes, or CPUs of a local Ray instance (default: the CPU count)")
    p.add_argument("--ray", metavar="ADDRESS", help="run on Ray: 'local' starts one here, else a cluster address "
                   "(needs pip install 'moetier[ray]')")
    p.add_argument("--batch", type=positive_int, default=1, help="cells per Ray task (default 1)")
    p.add_argument("--plot", metavar="PNG", type=file_arg("--plot"),
                   help="also draw tok/s per cell and concurrency (moetier plot compare)")
    p.add_argument("--json", action="store_true", help="print the summary and this grid's rows as JSON")
    p.set_defaults(fn=cmd_sweep)


def label(row: dict, axes: list[str]) -> str:
    """The cell's non-concurrency coordinates, short: 'ram_gb=30 lfu'."""
    vals = dict(o.split("=", 1) for o in row["overrides"])
    parts = [f"{a.rsplit('.', 1)[-1]}={vals[a]}" for a in axes if a in vals]
    if row.get("policy"):
        parts.append(str(row["policy"]))
    if row.get("trace"):
        parts.append(str(row["trace"]).rsplit("/", 1)[-1])
    return " ".join(parts) or row["recipe"]


def cmd_sweep(args) -> int:
    from moetier.cli import progress
    from moetier.cli.common import _emit, find_path
    from moetier.cli.render import say, table
    from moetier.measure import sweep as S
    traces = [str(find_path(t)) if t else None for t in args.trace]
    cells = S.cells(args.recipe, grid=args.grid, sets=args.set, traces=traces, concs=args.conc,
                    policies=args.policy, steps=args.steps)
    with progress.task("sweep", unit="cells") as cb:
        summary = S.sweep(cells, args.out, workers=args.workers, ray=args.ray, batch=args.batch, progress=cb)
    keys = {S.cell_key(c) for c in cells}
    rows = [r for r in S.read_rows(args.out) if r.get("key") in keys]
    axes = [S.parse_axis(g)[0] for g in args.grid]
    if args.plot:
        from moetier.cli.plots import plot_compare
        pts = [{"policy": label(r, axes), "conc": r["conc"], "tok_s": r["tok_s"]} for r in rows]
        print(f"wrote {plot_compare(pts, args.plot, title=f'sweep of {args.recipe}: decode tok/s')}",
              file=sys.stderr)
    if args.json:
        _emit({"summary": summary, "rows": rows})
        return 0
    rate = f", {summary['cells_per_s']:.2f} cells/s" if summary["cells_per_s"] else ""
    say(f"sweep {args.recipe}: {summary['cells']} cells, {summary['ran']} ran, {summary['skipped']} already in "
          f"{args.out}; {summary['backend']} x {summary['workers']}, {summary['seconds']:.1f} s{rate}")
    best = sorted(rows, key=lambda r: (r["conc"], -r["tok_s"]))
    shown = []
    for c in sorted({r["conc"] for r in rows}):
        shown += [r for r in best if r["conc"] == c][:5]
    if not shown:
        raise UserError(f"sweep: no rows for this grid in {args.out}")
    table(["cell", "conc", "decode tok/s (total)", "ms/step", "vram hit", "nvme/tok", "masked/tok"],
          [[label(r, axes), f"C{r['conc']}", f"{r['tok_s']:.2f}", f"{r['ms_per_step']:.1f}", f"{r['vram_hit']:.3f}",
            f"{r['nvme_per_tok']:.1f}", f"{r['masked_per_tok']:.1f}"] for r in shown],
          title="best cells per concurrency (up to 5 each)",
          legend=("every row of the grid is in the results file, one JSON line per cell, keyed by a hash of the "
                  "cell (moetier.measure.sweep.cell_key)",
                  "columns as in `moetier sim` (its legend): decode tok/s is the total over the streams"))
    return 0
