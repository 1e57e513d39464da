"""What `moetier calibrate` prints: the calibration matrix and the ablation, as tables through ``render.table``.

Contract: ``print_calibration(res, buckets, noise_flag_pct)`` prints the fitted terms, the per-arm table and the
summary of a ``measure.calibrate.calibrate`` result; ``print_ablation(recs, res, verdict, need)`` prints
``measure.ablate`` results, one column per record and one row per removed term or family. Rich on a terminal,
markdown when piped; every figure is a field of the ``--json`` output, rounded.
"""
from __future__ import annotations

import json

from moetier.cli.render import table


def print_calibration(res: dict, buckets, noise_flag_pct: float) -> None:
    t = res["terms"]
    terms = [[f"cpu lane {k}", f"{v:.4f}"] for k, v in t["cpu"].items()]
    terms += [[f"host {k}", f"{v:.4f}"] for k, v in t["host"].items()]
    terms.append(["fixed_ms", json.dumps(t["fixed_ms"])])
    table(["fitted term", "value"], terms, title="fitted terms (written to the engine and recipe records)",
          legend=tuple(f"note: {n}" for n in res.get("notes", ())))
    rows = []
    for r in res["rows"]:
        m, p = r["ms_per_token"]["measured"], r["ms_per_token"]["sim"]
        noise = "" if r.get("noise_pct") is None else f" (+-{r['noise_pct']:.1f}%)"
        rows.append([r["arm"], str(r["conc"]), "fit" if r["fit"] else "held-out", f"{r['measured_tok_s']:.1f}{noise}",
                     f"{r['sim_tok_s']:.1f}", f"{r['error_pct']:+.1f}%",
                     *(f"{m[b]:.2f} ({p[b]:.2f})" for b in buckets)])
    s = res["summary"]
    held = s["held_out_max_abs_error_pct"]        # None: no arm held out (calibrate --quick)
    legend = [f"median |error| {s['median_abs_error_pct']:.1f}%, max {s['max_abs_error_pct']:.1f}%, held-out max "
              f"{'n/a' if held is None else f'{held:.1f}%'} over {s['arms']} arms; buckets within 15%: "
              f"{s['buckets_within_15pct']}/{s['buckets_checked']} (misses: {', '.join(s['bucket_misses']) or 'none'})",
              "measured tok/s: decode tokens per second over all streams, +- 2 standard errors over the pooled "
              "repeats; error: simulator vs measured; ms/tok columns: measured (simulated) milliseconds per token "
              "in each time bucket.",
              "fit: the arm's measurements set the cost terms; held-out: no fitted table covers its concurrency "
              "and budget, so it checks the model."]
    if s.get("noisy_arms"):
        legend.append(f"noisy: the measured figure of {', '.join(s['noisy_arms'])} is uncertain by more than "
                      f"{noise_flag_pct:.0f}%: their errors are not a model check alone; rerun on a quieter machine "
                      f"or with more --repeats")
    if s.get("pass_drift_pct") is not None:
        legend.append(f"machine drift between the plan pass and the checked pass (cpu-only fit arms, median; the "
                      f"terms come from the checked pass): {s['pass_drift_pct']:+.1f}%")
    print()
    table(["arm", "conc", "fit/held-out", "measured tok/s", "sim tok/s", "error",
           *(f"ms/tok {b} (sim)" for b in buckets)], rows, title="calibration matrix", legend=legend)


def _cell(c: dict, earns: bool) -> str:
    w = f"{c['worst_bucket'][0]} {c['worst_bucket'][1]:+.1f}" if c["worst_bucket"] else "-"
    return (f"{c['median']:+.2f} / {c['max']:+.2f} / {c['held_out']:+.2f} / {c['buckets'][0]}/{c['buckets'][1]} / "
            f"{w}{'*' if earns else ''}")


def print_ablation(recs, res, verdict: dict, need: int, earns) -> None:
    """``earns(cell, drift)`` is ``measure.ablate.earns`` (passed in: the view imports no measurement code)."""
    base = []
    for rec, r in zip(recs, res):
        b = r["base"]
        base.append([str(rec.get("id")), f"{b['median_abs_error_pct']:.2f}%", f"{b['max_abs_error_pct']:.2f}%",
                     f"{b['held_out_max_abs_error_pct'] or 0:.2f}%",
                     f"{b['buckets_within_15pct']}/{b['buckets_checked']}", f"{r['drift']:.2f}"])
    table(["record", "median |error|", "max", "held-out max", "buckets within 15%", "pass drift (points)"], base,
          title="re-predicted with every term")
    rows = []
    for name in verdict:
        cells = []
        for r in res:
            c = next((c for n, _, c in r["rows"] if n == name), None)
            cells.append("-" if c is None else _cell(c, earns(c, r["drift"])))
        rows.append([name, *cells, "yes" if verdict[name] else "no"])
    print()
    table(["removed", *(str(rec.get("id")) for rec in recs), "earns"], rows, title="ablation",
          legend=("each record's cell: change in median / max / held-out |error| (points) / buckets within 15% / "
                  "worst bucket, with the term or family removed.",
                  f"*: worsens the median or max |error| by more than that record's pass drift; earns: on at least "
                  f"{need} record(s)."))
