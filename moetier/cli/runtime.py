"""CLI verbs that touch real bytes and devices: store pack/verify, run, bench.

Contract: same as moetier.cli (one-line errors, exit 2). A run writes a run record under <user registry>/runs/
(moetier.core.records.user_registry) with the measured figures and, side by side, the simulator's prediction for the
same recipe, trace and concurrency. The bench writes its hardware and engine records there too, under ids that are
not shipped ones unless --overlay asks it to overlay a shipped record.
"""
from __future__ import annotations

import datetime as _dt
import platform
import sys

from moetier.cli import progress
from moetier.cli.common import count, fraction, int_in, positive_float, positive_int, replay_interval, seed

MAX_REPEATS = 100       # a calibration's repeats run back to back; 100 of the default matrix is days
MAX_ROUNDS = 100        # bench rounds: each one re-measures every term
MAX_RECORDS = 1 << 16   # bench records per bandwidth pass: 256 by default; beyond this the pass is only longer
from moetier.cli.outpath import file_arg, folder_arg
from moetier.errors import UserError


def register(sub, parser_class) -> None:
    sp = sub.add_parser("store", help="the packed expert record store")
    ssub = sp.add_subparsers(dest="store_cmd", parser_class=parser_class)
    p = ssub.add_parser("pack", help="write a store of deterministic seeded experts for a model record, or of the "
                        "routed experts of an EXL3 checkpoint (--checkpoint)")
    p.add_argument("model", nargs="?", help="model record id (with --checkpoint: checked against the checkpoint)")
    p.add_argument("--checkpoint", metavar="DIR", help="pack this EXL3 checkpoint's routed experts")
    p.add_argument("--out", required=True, type=folder_arg("--out"),
                   help="store directory to write (replaced atomically if a store)")
    p.add_argument("--seed", type=seed, default=0, help="seed of the deterministic expert weights (default 0)")
    v = ssub.add_parser("verify", help="re-read every record and check its checksum")
    v.add_argument("dir", help="store directory")
    v.add_argument("--model", help="model record id the store must match")
    sp.set_defaults(fn=cmd_store)

    r = sub.add_parser("run", help="run a recipe for real on a backend (real reads, real kernels)")
    r.add_argument("recipe", help="recipe id (registry/recipe/<id>.json)")
    r.add_argument("--store", required=True, help="packed store directory (moetier store pack)")
    r.add_argument("--trace", help="routing trace (.npz, or reference .npy); default: the recipe's")
    r.add_argument("--segments", help="segments .npy for a reference .npy trace")
    r.add_argument("--backend", default="cpu", help="cpu, sycl or cuda")
    r.add_argument("--conc", type=positive_int, nargs="+", default=[1, 2, 4],
                   help="concurrency levels (default 1 2 4)")
    r.add_argument("--steps", type=count, default=0, help="cap on measured steps per concurrency (0 = the trace's)")
    r.add_argument("--set", nargs="+", metavar="PATH=VALUE", help="dotted recipe overrides, values as JSON")
    r.add_argument("--verify-rate", type=fraction, default=1.0, help="fraction of reads checksum-checked on landing")
    r.add_argument("--record", help="run record id (default: <recipe>-run-<utc time>)")
    r.add_argument("--no-write", "--no-record", dest="no_record", action="store_true",
                   help="write nothing: no run record (--no-record is the old name)")
    r.add_argument("--force", action="store_true", help="replace an existing run record of the --record id, or "
                   "write a shipped one's (the user registry's copy then overlays it)")
    r.add_argument("--probe", metavar="FILE", type=file_arg("--probe"),
                   help="sample the host at 100 ms and the runtime's counters per step "
                   "into FILE (JSON lines; see `moetier probe`)")
    r.add_argument("--faults", type=fraction, default=0.0, metavar="RATE",
                   help="chaos: inject a fault into this fraction of reads (--fault-kinds); needs --verify-rate 1")
    r.add_argument("--fault-kinds", type=fault_kinds, default=("eio", "short", "flip", "slow"), metavar="K,K",
                   help="faults --faults draws from: eio, short, flip, slow (default all four)")
    r.add_argument("--stall-rate", type=fraction, default=0.0, metavar="RATE",
                   help="chaos: this fraction of reads stalls past --stall-timeout (the run stops with one line)")
    r.add_argument("--fault-seed", type=seed, default=0, help="seed of the fault draws")
    r.add_argument("--retries", type=count, default=3, help="times a failed read is read again before the run "
                   "stops (default 3)")
    r.add_argument("--stall-timeout", type=positive_float, default=None, metavar="S",
                   help="stop the run when a transfer has not landed after S seconds (default: wait; 1 s with "
                   "--stall-rate)")
    r.add_argument("--json", action="store_true", help="machine-readable output (the run record)")
    r.set_defaults(fn=cmd_run)

    c = sub.add_parser("calibrate", help="run a matrix of configurations for real, fit the simulator's cost terms "
                       "from the runtime's counters, and report prediction errors")
    c.add_argument("recipe", nargs="?", help="recipe id (registry/recipe/<id>.json)")
    c.add_argument("--store", help="packed store directory (moetier store pack); required unless --ablate")
    c.add_argument("--ablate", nargs="+", metavar="RECORD",
                   help="measure nothing: re-predict these calibration run records with each term and family of "
                        "terms removed, and print what each removal does to the errors")
    c.add_argument("--only", nargs="+", metavar="TERM", help="with --ablate: remove only these terms or families")
    c.add_argument("--redeal", action="store_true",
                   help="with --ablate: remove the terms from the plan pass too, so the replay re-deals the picks to "
                        "lanes as a runtime without them would")
    c.add_argument("--trace", help="routing trace (.npz, or reference .npy); default: the recipe's")
    c.add_argument("--segments", help="segments .npy for a reference .npy trace")
    c.add_argument("--backend", default="cpu", help="cpu, sycl or cuda (default cpu)")
    c.add_argument("--steps", type=positive_int, default=None,
                   help="measured steps per arm and repeat (default 200; with --quick 60)")
    c.add_argument("--repeats", type=int_in(1, MAX_REPEATS), default=None,
                   help="interleaved repeats of the whole matrix (A B .. A B ..; default 2)")
    c.add_argument("--quick", action="store_true",
                   help="the fit arms without a VRAM tier, one plan and four checked repeats of 60 steps after 16 "
                        "warm-up tokens (calibrate.quick_arms; a few minutes, README)")
    c.add_argument("--verify-rate", type=fraction, default=1.0,
                   help="fraction of reads checksum-checked on landing (default 1)")
    c.add_argument("--no-write", action="store_true", help="write nothing: not the fitted terms, not the run record")
    c.add_argument("--suffix", default="-cal", type=_suffix,
                   help="write the fitted terms as new records <id>SUFFIX (recipe, its engines and hardware; default "
                        "-cal: `moetier sim RECIPE-cal` predicts from them), never over a shipped record")
    c.add_argument("--overlay", action="store_true", help="write the fitted terms into the recipe's own records "
                   "instead (shipped ones included: the user registry's copies then overlay them for every later "
                   "command)")
    c.add_argument("--record", help="run record id (default calibration-<recipe>-<utc time>)")
    c.add_argument("--force", action="store_true", help="replace an existing run record of the --record id")
    c.add_argument("--json", action="store_true", help="machine-readable output (the run record)")
    c.add_argument("--plot", metavar="PNG", type=file_arg("--plot"),
                   help="also draw measured vs predicted tok/s (moetier plot calibration)")
    c.set_defaults(fn=cmd_calibrate)

    b = sub.add_parser("bench", help="measure this machine; write its hardware and engine records and a recipe that "
                       "predicts from them")
    b.add_argument("--store", required=True, help="a packed store of the recipe's model (moetier store pack)")
    b.add_argument("--recipe", default=None, help="the recipe whose sizes are measured (default tiny-local-cpu)")
    b.add_argument("--recipe-out", help="recipe id to write: the recipe on this bench's records (default "
                   "RECIPE-bench); predict with `moetier sim` / `table` / `run` of it")
    b.add_argument("--rounds", type=int_in(1, MAX_ROUNDS), default=5,
                   help="interleaved repetitions of the prediction terms (their spread is measured over them)")
    b.add_argument("--hardware", default="bench-cpu", help="hardware record id to write (default bench-cpu)")
    b.add_argument("--engine", default="bench-numba-cpu", help="engine record id to write (default bench-numba-cpu)")
    b.add_argument("--overlay", action="store_true", help="allow ids of shipped records: the user registry's copy "
                   "then overlays the shipped (calibrated) one for every later command")
    b.add_argument("--records", type=int_in(1, MAX_RECORDS), default=256, help="records read per bandwidth pass")
    b.add_argument("--no-write", "--dry-run", dest="dry_run", action="store_true",
                   help="measure and print, write nothing (--dry-run is the old name)")
    b.add_argument("--force", action="store_true", help="replace existing hardware/engine records of these ids")
    b.add_argument("--json", action="store_true", help="machine-readable output (measures and both records)")
    b.set_defaults(fn=cmd_bench)


def cmd_store(args) -> int:
    from moetier.core import records as spec
    from moetier.bytes import store
    if args.store_cmd == "pack":
        if args.model is None and args.checkpoint is None:
            raise UserError("store pack: expected a model id, or --checkpoint DIR")
        model = spec.load_record("model", args.model) if args.model else None
        with progress.task(f"pack {args.model or args.checkpoint}", unit="records") as cb:
            if args.checkpoint:
                m = store.pack_checkpoint(args.checkpoint, args.out, model=model, progress=cb)
            else:
                m = store.pack(model, args.out, seed=args.seed, progress=cb)
        if m.get("removed_stale"):
            print(f"removed {len(m['removed_stale'])} staging folder(s) left by a pack that is no longer running: "
                  f"{', '.join(m['removed_stale'])}", file=sys.stderr)
        print(f"packed {m['records']} records of {m['record_bytes']:,} B into {args.out} "
              f"({m['records'] * m['record_bytes'] / 1e9:.2f} GB, {m.get('seconds', 0):.1f} s)")
        return 0
    if args.store_cmd == "verify":
        model = spec.load_record("model", args.model) if args.model else None
        with progress.task(f"verify {args.dir}", unit="records") as cb:
            res = store.verify(args.dir, model=model, progress=cb)
        print(f"verified {res['records']} records, {res['bytes'] / 1e9:.2f} GB in {res['seconds']:.1f} s "
              f"({'O_DIRECT' if res.get('direct') else 'buffered'}): 0 bad")
        return 0
    raise UserError("store: expected a subcommand: pack or verify")


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def _record_id(rid, prefix: str, when: str, *, write: bool, force: bool) -> str:
    """The run record's id, checked before any work: the one given (an existing record is replaced only with
    --force), else prefix + the measurement time, with -2, -3, ... when that id is taken (a new id each time)."""
    from moetier.core import records as spec
    if rid is None:
        base = f"{prefix}-{_dt.datetime.fromisoformat(when).strftime('%Y%m%dt%H%M%S')}".lower()
        taken = set(spec.record_ids("runs"))
        rid = next(c for c in [base] + [f"{base}-{i}" for i in range(2, len(taken) + 3)] if c not in taken)
    if write:
        spec.check_writable("runs", rid, force=force, overlay=force)
    return rid


def _run_record(rid: str, recipe: str, backend: str, when: str) -> dict:
    """The common head of a run record."""
    return {"id": rid, "kind": "run", "recipe": recipe, "measured": when,
            "backend": backend, "machine": f"{platform.node()} {platform.machine()}"}


def _write(kind: str, rec: dict, force: bool = False) -> None:
    from moetier.core import records as spec
    print(f"wrote {kind} {rec['id']}: {spec.write_record(kind, rec, force=force, overlay=force)}", file=sys.stderr)


def _existing(kind: str, rid: str) -> dict | None:
    """The record a write would replace, if there is one."""
    from moetier.core import records as spec
    return spec.load_record(kind, rid) if rid in spec.record_ids(kind) else None


def _suffix(s: str) -> str:
    """An argparse type: a record-id suffix (``-cal``): id characters, starting with one that is not a letter or
    digit so that it reads apart from the id."""
    import argparse
    import re
    if not re.fullmatch(r"[._-][a-z0-9._-]{1,40}", s):
        raise argparse.ArgumentTypeError(f"expected '-', '.' or '_' then 1 to 40 of a-z 0-9 . _ -, got {s!r}")
    return s


def fault_kinds(s: str) -> tuple:
    """An argparse type: comma-separated fault kinds (``--fault-kinds eio,flip``)."""
    import argparse
    kinds = tuple(k.strip() for k in s.split(","))
    known = ("eio", "short", "flip", "slow")
    if not all(k in known for k in kinds):
        raise argparse.ArgumentTypeError(f"expected comma-separated kinds from {', '.join(known)}, got {s!r}")
    return kinds


def _fault_plan(args):
    """The chaos fault plan of `run --faults/--stall-rate`, checked against the other flags first; None without."""
    if not (args.faults or args.stall_rate):
        return None
    if args.verify_rate < 1.0:
        raise UserError(f"--faults {args.faults:g} / --stall-rate {args.stall_rate:g} need --verify-rate 1 (got "
                        f"{args.verify_rate:g}): a flipped byte is caught only on a verified read")
    if args.faults + args.stall_rate > 1.0:
        raise UserError(f"--faults {args.faults:g} + --stall-rate {args.stall_rate:g}: expected at most 1 together")
    from moetier.bytes.transport import FaultPlan
    if args.stall_rate and args.stall_timeout is None:
        args.stall_timeout = 1.0
    stall_s = 4 * args.stall_timeout + 1.0 if args.stall_timeout else 2.0
    return FaultPlan.at_rate(args.faults, kinds=args.fault_kinds, stall_rate=args.stall_rate, seed=args.fault_seed,
                             stall_s=stall_s)


def cmd_run(args) -> int:
    from moetier.run import runtime
    from moetier.core import sim
    from moetier.bytes import store
    from moetier.cli.common import _emit, _resolve, _trace
    from moetier.core import interval
    plan = _fault_plan(args)
    R = _resolve(args)
    when = _now()
    rid = _record_id(args.record, f"{R.id}-run", when, write=not args.no_record, force=args.force)
    st = store.open_store(args.store, model=R.model)
    tr = _trace(args, R)
    for c in args.conc:     # before measuring: the prediction beside each run needs the trace to support it
        sim.check_conc(tr, c)
    rows, preds = [], []
    sampler = None
    if args.probe:
        from moetier.measure.probe import Sampler
        sampler = Sampler(args.probe)
        sampler.start()
    try:
        for c in args.conc:
            be = runtime.make_backend(args.backend, st, R, c, args.verify_rate, faults=plan)
            with runtime.closing(be, args.stall_timeout):
                if sampler is not None:
                    sampler.mark(f"decode_C{c}")
                with progress.task(f"run C{c}") as cb:
                    res = runtime.run(R, st, be, tr, c, max_steps=args.steps, progress=cb,
                                      step_hook=sampler.counters if sampler is not None else None,
                                      retries=args.retries, wait_timeout_s=args.stall_timeout)
            rows.append(res)
    finally:
        if sampler is not None:
            sampler.stop()
    for res in rows:
        c = res["conc"]
        res.pop("outputs")
        res["digest_last"] = res.pop("digests")[-1]
        with progress.task(f"sim C{c}") as cb:
            p = sim.run(R, tr, c, max_steps=args.steps, progress=cb)
        preds.append({**{k: p[k] for k in ("conc", "tok_s", "ms_per_token", "nvme_per_tok", "cpu_experts_per_tok",
                                           "ms_fixed", "ms_cpu_moe", "ms_gpu_moe", "ms_nvme_wait", "masked_per_tok")},
                      "interval": replay_interval(R, tr, c, args.steps)})
    table = []
    for r, p in zip(rows, preds):
        err = (p["tok_s"] / r["tok_s"] - 1) * 100 if r["tok_s"] else None
        table.append({"conc": r["conc"], "measured_tok_s": r["tok_s"], "sim_tok_s": p["tok_s"],
                      "sim_interval": p["interval"], "inside": interval.inside(r["tok_s"], p["interval"]),
                      "sim_error_pct": err, "reads_per_token": r["reads_per_token"],
                      "sim_nvme_per_tok": p["nvme_per_tok"], "checksum_failures": r["checksum_failures"],
                      "read_retries": r["read_retries"]})
    faults = None
    if plan is not None:
        faults = {"rate": args.faults, "stall_rate": args.stall_rate, "kinds": list(args.fault_kinds),
                  "seed": args.fault_seed, "injected": plan.counts(),
                  "retries": sum(r["read_retries"] for r in rows), "stall_timeout_s": args.stall_timeout}
    record = {
        **_run_record(rid, R.id, args.backend, when), "store": str(args.store),
        "trace": args.trace or R.trace, "overrides": args.set or [], "lossy": any(r["lossy"] for r in rows),
        "table": table, "measured_runs": rows, "sim": preds, "probe": args.probe,
        "note": "sim_error_pct = simulator prediction vs measured decode tok/s, same recipe, trace and steps",
        **({"faults": faults} if faults is not None else {}),
        "memory": {"peak_rss_bytes": runtime.peak_rss(), "bound_bytes": runtime.rss_bound(R, max(args.conc)),
                   "ram_budget_gb": R.raw["budget"]["ram_gb"], "overhead_bytes": runtime.RSS_OVERHEAD_BYTES,
                   "note": "peak resident set of the moetier process; bound = RAM budget + in-flight slots + "
                           "overhead (moetier.run.runtime.rss_bound)"},
    }
    if not args.no_record:
        _write("runs", record, force=args.force)
    if args.json:
        _emit(record)
        return 0
    if faults is not None:
        print(f"faults injected: {', '.join(f'{k} {n}' for k, n in faults['injected'].items())}; "
              f"reads retried: {faults['retries']}")
    from moetier.cli.render import table as render
    rows_out = []
    for t, r in zip(table, rows):
        ln = r["lanes_ms_per_token"]
        err = "n/a" if t["sim_error_pct"] is None else f"{t['sim_error_pct']:+.1f}%"
        iv = t["sim_interval"]
        rows_out.append([t["conc"], f"{t['measured_tok_s']:.2f}", f"{t['sim_tok_s']:.2f}",
                         f"{iv['low']:.2f}-{iv['high']:.2f}", "yes" if t["inside"] else "no", err,
                         f"{t['reads_per_token']:.2f} ({t['sim_nvme_per_tok']:.2f})", f"{ln['cpu']:.2f}",
                         f"{ln['nvme_wait']:.2f}", t["checksum_failures"]])
    render(["conc", "measured tok/s", "sim tok/s", "sim interval", "inside", "sim error", "reads/tok (sim)", "cpu ms/tok", "nvme wait ms/tok",
            "checksum failures"], rows_out,
           title=f"run {record['id']}: recipe {R.id} on backend {args.backend} "
                 f"({'lossy' if record['lossy'] else 'exact'})",
           legend=("measured tok/s: decode tokens per second over all streams, real reads and kernels; sim tok/s: "
                   "the simulator's prediction for the same recipe, trace and steps; sim error = sim / measured - 1",
                   "sim interval: sim tok/s with every cost term at its slow and fast quantile (docs/fidelity.md); "
                   "inside: whether the measured tok/s fell in it",
                   "reads/tok: NVMe reads per generated token (the simulator's in brackets: they match when the "
                   "runtime planned as the simulator did)",
                   "cpu ms/tok, nvme wait ms/tok: the cpu lane's compute and its waits for reads, per token"))
    return 0


def cmd_calibrate(args) -> int:
    from moetier.measure import calibrate
    from moetier.core import records as spec
    from moetier.bytes import store
    from moetier.cli.common import _emit, _trace
    if args.ablate:
        return _ablate(args)
    if not args.recipe or not args.store:
        raise UserError("calibrate: expected RECIPE and --store DIR (or --ablate RECORD...)")
    R = spec.resolve(args.recipe)
    rid = _record_id(args.record, f"calibration-{R.id}", _now(), write=not args.no_write, force=args.force)
    suffix = "" if args.overlay else args.suffix
    if not args.no_write:   # before measuring: the fitted terms can be written where they go
        from moetier.measure.write import written_ids
        for kind, wid in written_ids(R.id, calibrate.VRAM_ENGINE, suffix):
            spec.check_writable(kind, wid, force=True, overlay=args.overlay, flag="--overlay")
    st = store.open_store(args.store, model=R.model)
    tr = _trace(args, R)
    with progress.status("calibrate") as prog:
        quick = calibrate.QUICK if args.quick else {}
        res = calibrate.calibrate(args.recipe, st, tr, steps=args.steps or quick.get("steps", 200),
                                  repeats=args.repeats or quick.get("repeats", 2),
                                  plan_repeats=quick.get("plan_repeats"),
                                  arms=calibrate.quick_arms(R) if args.quick else None,
                                  backend=args.backend, verify_rate=args.verify_rate, write=not args.no_write,
                                  suffix=suffix, progress=prog)
    record = {**_run_record(rid, R.id, args.backend, res["when"]),
              "title": f"calibration matrix for {R.id}",
              "table": [{"arm": r["arm"], "conc": r["conc"], "decode": r["measured_tok_s"], "sim_decode": r["sim_tok_s"],
                         "error_pct": r["error_pct"], "fit": r["fit"]} for r in res["rows"]],
              "calibration": res,
              "note": "arms interleaved A B .. A B ..; the fit arms of the checked pass set the cost terms, the others "
                      "are held out; errors are simulator vs measured decode tok/s"}
    for w in res["written"]:
        print(f"wrote {w['kind']} {w['id']}: {w['path']}", file=sys.stderr)
    if not args.no_write:
        _write("runs", record, force=args.force)
    if args.plot:
        from moetier.cli.plots import plot_calibration
        print(f"wrote {plot_calibration(record, args.plot)}", file=sys.stderr)
    if args.json:
        _emit(record)
        return 0
    from moetier.cli.calibrate_view import print_calibration
    print_calibration(res, calibrate.BUCKETS, calibrate.NOISE_FLAG_PCT)
    return 0


def _ablate(args) -> int:
    """`moetier calibrate --ablate RECORD...`: the ablation table (moetier.measure.ablate), one column group per
    record; a term is kept where its removal worsens the median or max |error| by more than the record's pass
    drift on at least two of the records (on all of them, with fewer than two)."""
    from moetier.measure import ablate
    from moetier.cli.common import _emit
    recs = [_load_run(path) for path in args.ablate]
    unknown = [t for t in args.only or () if t not in ablate.TERMS and t not in ablate.FAMILIES]
    if unknown:
        raise UserError(f"calibrate --only {unknown[0]}: expected a term or family of `moetier calibrate --ablate` "
                        f"({', '.join([*ablate.TERMS, *ablate.FAMILIES])})")
    prog = (lambda msg: print(f"ablate: {msg}", file=sys.stderr)) if sys.stderr.isatty() else None
    res = [ablate.ablate(rec, terms=args.only, progress=prog, redeal=args.redeal) for rec in recs]
    need = min(2, len(recs))
    verdict = {}
    for name in dict.fromkeys(n for r in res for n, _, _ in r["rows"]):
        hits = sum(ablate.earns(c, r["drift"]) for r in res for n, _, c in r["rows"] if n == name)
        verdict[name] = hits >= need
    if args.json:
        _emit({"records": [{"id": rec.get("id"), "base": r["base"], "drift": r["drift"],
                            "rows": [{"removed": n, "terms": m, **c} for n, m, c in r["rows"]]}
                           for rec, r in zip(recs, res)], "earns": verdict})
        return 0
    from moetier.cli.calibrate_view import print_ablation
    print_ablation(recs, res, verdict, need, ablate.earns)
    return 0


def _load_run(path: str) -> dict:
    from moetier import strictjson
    from moetier.cli.common import find_path
    rec = strictjson.load(find_path(path), f"calibrate --ablate {path} (expected a calibration run record)")
    if not isinstance(rec, dict) or not isinstance(rec.get("calibration"), dict):
        raise UserError(f"calibrate --ablate {path}: expected a calibration run record (a 'calibration' object), "
                        f"got {type(rec).__name__}" + (" without one" if isinstance(rec, dict) else ""))
    return rec


def cmd_bench(args) -> int:
    from moetier.measure import bench, bench_exl3, bench_terms
    from moetier.bytes import store
    from moetier.cli.common import _emit, _trace
    from moetier.core import records as spec
    recipe = args.recipe or bench.RECIPE
    out_id = args.recipe_out if args.recipe_out is not None else f"{recipe}-bench"    # "" is refused, not a default
    if not args.dry_run:     # before measuring: every id can be written (replacing a record needs --force)
        for kind, rid in (("hardware", args.hardware), ("engine", args.engine), ("recipe", out_id)):
            spec.check_writable(kind, rid, force=args.force, overlay=args.overlay, flag="--overlay")
    R = spec.resolve(recipe)
    st = store.open_store(args.store)
    if st.record_bytes != R.nvme_expert_bytes:
        raise UserError(f"bench --store {args.store}: records of {st.record_bytes:,} B, but recipe {recipe} reads "
                        f"{R.nvme_expert_bytes:,} B experts; pack the recipe's model ({R.model_id}) or pass --recipe")
    args.trace, args.segments = None, None
    tr = _trace(args, R)
    with progress.status("bench", total=len(bench.STAGES) + 1) as prog:
        m = bench_terms.measure(st, recipe, tr, nrec=args.records, rounds=args.rounds, progress=prog)
    m["exl3_lanes"] = bench_exl3.measure(rounds=min(args.rounds, 3))
    when = _now()
    hw, eng = bench.records(m, args.hardware, args.engine, when, _existing("hardware", args.hardware))
    eng["model_lanes"] = bench_exl3.model_lanes(m["exl3_lanes"], when)
    rec = bench.recipe_record(m, recipe, out_id, args.hardware, args.engine, when)
    if not args.dry_run:     # all three records or none
        written = [("hardware", hw), ("engine", eng), ("recipe", rec)]
        for (kind, r), path in zip(written, spec.write_records(written, force=args.force, overlay=args.overlay)):
            print(f"wrote {kind} {r['id']}: {path}", file=sys.stderr)
    if args.json:
        _emit({"measured": m, "hardware": hw, "engine": eng, "recipe": rec})
        return 0
    from moetier.cli.render import table as render
    lane = m["cpu_lane"]
    rows = [["CPU time per O_DIRECT read (checksummed)", f"{m['nvme_cpu_ms_per_read']:.3f} ms"],
            ["memory read bandwidth, all cores", f"{m['membw_read_gbps']:.2f} GB/s"]]
    for q in (m["nvme_qd1"], m["nvme_qd16"]):
        rows.append([f"{'O_DIRECT' if q['direct'] else 'buffered'} read QD{q['qd']}, {m['record_bytes']:,} B records",
                     f"{q['gbps']:.2f} GB/s, latency p50 {q['latency_ms_p50']:.2f} ms / p90 "
                     f"{q['latency_ms_p90']:.2f} ms"])
    rows += [[f"cpu lane ({lane['encoding']})", f"per_layer {lane['per_layer_ms']:.4f} ms, per_expert "
              f"{lane['per_expert_ms']:.4f} ms, per_extra_token {lane['per_extra_token_ms']:.4f} ms"],
             *([["cpu lane wake-up / hand-off", f"per_wake {lane.get('per_wake_ms', 0):.4f} ms, per_handoff "
                 f"{lane.get('per_handoff_ms', 0):.4f} ms ({lane['calls']} calls over {m['rounds']} rounds)"]]),
             *_bench_channel_rows(m),
             *[[f"cpu lane EXL3 expert, {mid}", f"{r['per_expert_ms']:.2f} ms per expert on one core, "
                f"{r['gbps_per_core']:.2f} GB/s of trellis bytes per core"] for mid, r in m["exl3_lanes"].items()],
             ["cpu lane weight bytes/s, 1 row", f"{lane['weight_gbps_1row']:.2f} GB/s "
              f"({lane['weight_gbps_1row'] / m['membw_read_gbps']:.2f} of memory bandwidth)"],
             ["last-level cache (sysfs)", f"{m['llc_bytes'] / 2**20:.0f} MiB" if m["llc_bytes"] else "not reported"],
             ["cpu lane expert cost after N MB streamed, of a cold one",
              ", ".join(f"{int(b) / 1e6:.0f} MB {f:.2f}" for b, f in m["reuse"]["curve"].items())]]
    rows.append(["seconds by stage", ", ".join(f"{k} {v:.1f}" for k, v in m["seconds_by_stage"].items())])
    render(["measure", "value"], rows,
           legend=(f"wrote recipe {rec['id']}: `moetier sim {rec['id']}` predicts from these figures, each "
                   f"with the interval their spread over the rounds gives",))
    return 0


def _bench_channel_rows(m: dict) -> list:
    """The bench's rows for the reads beside the cpu lane and the host's work (when a recipe was measured)."""
    rows = []
    ch = m.get("channel")
    if ch:
        tab = ch["tables"].get("nvme_latency_by_rows_qd_ms", {})
        rows.append(["read latency beside the lane, depth 1 by rows", ", ".join(
            f"rows {r}: {t.get('1', 0):.2f} ms" for r, t in tab.items())])
    if m.get("host"):
        h = m["host"]
        rows.append(["host work (runtime, all in RAM)", f"per_layer {h['host']['per_layer_ms']:.4f} ms, per_pick "
                     f"{h['host']['per_pick_ms']:.4f} ms; non-MoE ms per step "
                     + ", ".join(f"rows {r}: {v:.3f}" for r, v in h["fixed_ms"].items())])
    return rows
