"""What the host time outside every timer follows, over calibration records' cpu arms.

    python benchmarks/outside_time_fit.py RECORD [RECORD ...]

Per record, the step wall less everything booked to layers (the part `moetier calibrate` fits as
``calibration.fixed_ms`` + parts per demand read and per zerocopy call, ``fit.fit_fixed``) of every arm, then
of the cpu arms fitted by least squares on the concurrency plus candidate columns per step: demand reads alone
(fit_fixed's model on these arms), then with prefetch reads, split calls, inline calls, computed picks or layers
with NVMe picks. Every cpu arm is in the fit, held-out ones too: this asks which counter explains the time, it
sets no term. Prints each fit's coefficients, its rms relative error and the arms it misses by more than 6%
(the non-MoE row of docs/calibration.md).
"""
from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from moetier.measure.bench import relative_lstsq
from moetier.measure.fit import unbooked_ms

COLUMNS = (("demand",), ("demand", "prefetch"), ("demand", "split"), ("demand", "inline"), ("demand", "computed"),
           ("demand", "nvme_layers"))


def vram_arm(row: dict) -> bool:
    return any("vram_expert_slots" in s for s in row.get("set", ()))


def arms(record: dict) -> list[tuple]:
    """(arm, conc, {column: per step}, ms per step outside the timers) of the record's cpu arms."""
    out = []
    for r in record["calibration"]["rows"]:
        if vram_arm(r):
            continue
        m = r["measured_run"]
        c, n = m["counters"], m["steps"]
        cols = {"demand": c["reads"], "prefetch": c.get("prefetch_reads", 0), "split": c["cpu_split_calls"],
                "inline": c["cpu_inline_calls"], "computed": c["picks"] - c["masked"],
                "nvme_layers": c.get("nvme_layers", 0)}
        out.append((r["arm"], r["conc"], {k: v / n for k, v in cols.items()}, max(1e-6, unbooked_ms(m))))
    return out


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("records", nargs="+")
    a = ap.parse_args(argv)
    for path in a.records:
        rec = json.loads(Path(path).read_text())
        rows = arms(rec)
        concs = sorted({c for _, c, _, _ in rows})
        print(f"{Path(path).name}: ms per step outside the timers: " + ", ".join(
            f"{r['arm']} {unbooked_ms(r['measured_run']):.3f}" for r in rec["calibration"]["rows"]))
        print(f"  fits over its {len(rows)} cpu arms:")
        for cols in COLUMNS:
            A = [[float(c == cc) for cc in concs] + [x[k] for k in cols] for _, c, x, _ in rows]
            coef = relative_lstsq(A, [y for *_, y in rows])
            err = [(sum(p * q for p, q in zip(ar, coef)) / y - 1) * 100 for ar, (*_, y) in zip(A, rows)]
            rms = math.sqrt(sum(e * e for e in err) / len(err))
            names = [f"C{c}" for c in concs] + list(cols)
            print(f"  {'+'.join(cols):20s} rms {rms:4.1f}%  " + " ".join(f"{k} {v:.4f}" for k, v in zip(names, coef))
                  + "  misses: " + (" ".join(f"{r[0]} {e:+.0f}%" for r, e in zip(rows, err) if abs(e) > 6) or "-"))


if __name__ == "__main__":
    main()
