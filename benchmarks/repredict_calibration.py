"""Re-run the simulator on a committed calibration record: its fitted terms, its arms, its measured tok/s.

    python benchmarks/repredict_calibration.py RECORD [--spread SHARED OWN] [--json]

What a new simulator term would have predicted for a run already made, without the 25-35 minutes of measuring
again: ``--spread`` sets the NVMe arrival spread (engine nvme_latency_cv_shared_by_rows / _own_by_rows, sd / mean)
at every measured rows per step, for records made before calibrate fitted it. Prints each arm's recorded and new
tok/s error and NVMe stall (ms per token), then median / max / held-out max |error|.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from moetier import calibrate, sim, spec  # noqa: E402
from moetier.trace import load_trace  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("record")
    ap.add_argument("--spread", nargs=2, type=float, metavar=("SHARED", "OWN"))
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    rec = json.loads(Path(a.record).read_text())
    cal = rec["calibration"]
    terms = dict(cal["terms"])
    if a.spread:
        tables = terms.get("nvme_latency_by_rows_qd_ms", {})
        for field, v in zip(("nvme_latency_cv_shared_by_rows", "nvme_latency_cv_own_by_rows"), a.spread):
            terms[field] = {eng: {rows: v for rows in t} for eng, t in tables.items()}
    R = spec.resolve(rec["recipe"])
    tr = load_trace(spec.REGISTRY.parent / R.trace, layers=R.layers, experts=R.experts, topk=R.topk)
    arms = {arm["name"]: arm for arm in calibrate.default_arms(R, vram=True)}
    rows = []
    for row in cal["rows"]:
        arm = arms.get(row["arm"])
        if arm is None:
            sys.exit(f"repredict_calibration: {a.record}: arm {row['arm']!r} is not in today's default matrix")
        p = sim.run(calibrate.arm_recipe(rec["recipe"], arm, terms), tr, arm["conc"], max_steps=cal["steps"])
        ptok = p["tokens"] / p["steps"]
        rows.append({"arm": row["arm"], "fit": row["fit"], "recorded_error_pct": row["error_pct"],
                     "error_pct": (p["tok_s"] / row["measured_tok_s"] - 1) * 100,
                     "stall_measured": row["ms_per_token"]["measured"]["nvme_stall"],
                     "stall_recorded": row["ms_per_token"]["sim"]["nvme_stall"],
                     "stall": p["ms_nvme_wait"] / ptok})
    errs = [abs(r["error_pct"]) for r in rows]
    held = [abs(r["error_pct"]) for r in rows if not r["fit"]]
    out = {"rows": rows, "median_abs_error_pct": statistics.median(errs), "max_abs_error_pct": max(errs),
           "held_out_max_abs_error_pct": max(held) if held else None}
    if a.json:
        print(json.dumps(out, indent=1))
        return
    print("| arm | fit | recorded error | error | stall measured | stall recorded | stall |\n|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['arm']} | {'fit' if r['fit'] else 'held-out'} | {r['recorded_error_pct']:+.1f}% | "
              f"{r['error_pct']:+.1f}% | {r['stall_measured']:.2f} | {r['stall_recorded']:.2f} | {r['stall']:.2f} |")
    print(f"\nmedian |error| {out['median_abs_error_pct']:.1f}%, max {out['max_abs_error_pct']:.1f}%, "
          f"held-out max {out['held_out_max_abs_error_pct'] or 0:.1f}%")


if __name__ == "__main__":
    main()
