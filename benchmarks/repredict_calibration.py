"""Re-run the simulator on a committed calibration record: its fitted terms, its arms, its measured figures.

    python benchmarks/repredict_calibration.py RECORD [--spread SHARED OWN] [--no-wake] [--refit-host]
                                               [--refit-device] [--term FIELD JSON]... [--json]

What a new simulator term would have predicted for a run already made, without the 25-35 minutes of measuring
again: ``--spread`` sets the NVMe arrival spread (engine nvme_latency_cv_shared_by_rows / _own_by_rows, sd / mean)
at every measured rows per step, for records made before calibrate fitted it.
``--no-wake`` refits the cpu lane on the record's fit arms without the split call's wake-up term
(lanes.cpu.per_wake_ms), to show what that term does to the same run. ``--refit-host`` refits the host and
non-MoE time terms on the record's fit arms with today's fits (for a record made before a host term existed).
``--refit-device`` refits the gpu and zerocopy lanes on the record's VRAM fit arms' calls (where the record keeps
them: ``rows[].measured_run.call_groups``). ``--term FIELD JSON`` replaces one of the record's terms
(``calibration.terms``; a channel term is {engine: {rows: value}}, an empty object drops it): what another figure
would have predicted. Run with the registry the record was made with (its hardware record is not in the run
record). Prints each arm's recorded and new tok/s error, NVMe stall (ms per token) and zerocopy computes per token,
then the record's summary figures recomputed (moetier.measure.ablate.repredict): median / max / held-out max
|error| and the buckets within 15%. `moetier calibrate --ablate RECORD` removes terms one at a time instead.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import _recipe  # noqa: E402,F401 - puts the repository on sys.path
from moetier.measure import ablate, fit  # noqa: E402
from moetier.measure.bench import fit_cpu_lane  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("record")
    ap.add_argument("--spread", nargs=2, type=float, metavar=("SHARED", "OWN"))
    ap.add_argument("--no-wake", action="store_true", help="refit the cpu lane without its wake-up term")
    ap.add_argument("--refit-host", action="store_true",
                    help="refit the host and non-MoE time terms with today's fits (fit.fit_host_and_fixed)")
    ap.add_argument("--refit-device", action="store_true",
                    help="refit the gpu and zerocopy lanes with today's fit (fit.fit_device_terms)")
    ap.add_argument("--term", nargs=2, action="append", default=[], metavar=("FIELD", "JSON"),
                    help="replace one of the record's terms (repeatable)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    rec = json.loads(Path(a.record).read_text())
    cal = rec["calibration"]
    terms = dict(cal["terms"])
    for field, value in a.term:
        try:
            terms[field] = json.loads(value)
        except json.JSONDecodeError as e:
            sys.exit(f"repredict_calibration: --term {field}: expected JSON, got {value!r} ({e.msg})")
    if a.spread:
        tables = terms.get("nvme_latency_by_rows_qd_ms", {})
        for field, v in zip(("nvme_latency_cv_shared_by_rows", "nvme_latency_cv_own_by_rows"), a.spread):
            terms[field] = {eng: {rows: v for rows in t} for eng, t in tables.items()}
    fit_runs = [{"conc": r["conc"], "call_groups": r["measured_run"].get("call_groups", []),
                 "counters": r["measured_run"]["counters"]} for r in cal["rows"] if r["fit"]]
    device = fit.fit_device_terms(fit_runs)
    if a.refit_device:
        if not any(m["call_groups"] for m in fit_runs):
            sys.exit(f"repredict_calibration: {a.record}: --refit-device needs the device lanes' calls "
                     "(rows[].measured_run.call_groups), which this record lacks")
        terms.update({ln: v for ln, v in device.items() if ln in ("gpu", "zerocopy")})
        if not a.json:
            print("refitted device lanes: " + json.dumps({ln: {k: round(v, 4) for k, v in terms[ln].items()}
                                                         for ln in ("gpu", "zerocopy") if ln in terms}))
    if a.no_wake:
        rows = [{k: v for k, v in row.items() if k != "wake"} for m in fit_runs
                if not m["counters"]["predict_layers"] for row in fit.cpu_lane_rows(m["counters"])]
        terms["cpu"] = {**fit_cpu_lane(rows, terms["cpu"]["workers"], None),
                        **{k: terms["cpu"][k] for k in ("workers", "parallel_min")}}
    if a.refit_host:
        host, terms["fixed_ms"] = fit.fit_host_and_fixed([(r["measured_run"], r["conc"]) for r in cal["rows"]
                                                                if r["fit"]])
        terms["host"] = {**terms["host"], **host}
        if not a.json:
            print("refitted host: " + ", ".join(f"{k} {v:.4f}" for k, v in host.items()) + "; fixed_ms "
                  + json.dumps(terms["fixed_ms"]))
    out = ablate.repredict(rec, terms=terms)
    rows = out["rows"]
    if a.json:
        print(json.dumps(out, indent=1))
        return
    print("| arm | fit | recorded error | error | stall measured | stall recorded | stall | zerocopy/token measured | "
          "zerocopy/token |\n|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        ms = r["ms_per_token"]
        print(f"| {r['arm']} | {'fit' if r['fit'] else 'held-out' if r['held_out'] else 'checked'} | {r['recorded_error_pct']:+.1f}% | "
              f"{r['error_pct']:+.1f}% | {ms['measured']['nvme_stall']:.2f} | {ms['recorded_sim']['nvme_stall']:.2f} | "
              f"{ms['sim']['nvme_stall']:.2f} | {_num(r['zerocopy_per_token']['measured'])} | "
              f"{r['zerocopy_per_token']['sim']:.2f} |")
    s = out["summary"]
    print(f"\nmedian |error| {s['median_abs_error_pct']:.1f}%, max {s['max_abs_error_pct']:.1f}%, held-out max "
          f"{s['held_out_max_abs_error_pct'] or 0:.1f}%; buckets within 15%: {s['buckets_within_15pct']}/"
          f"{s['buckets_checked']} (misses: {', '.join(s['bucket_misses']) or '-'})")


def _num(v) -> str:
    return "-" if v is None else f"{v:.2f}"


if __name__ == "__main__":
    main()
