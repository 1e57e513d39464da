"""The gpu and zerocopy lanes' calls in a calibration record, by experts and NVMe reads in flight, against its terms.

    python benchmarks/device_calls.py RECORD [--max-experts 3]

Calibration records keep each arm's device-lane calls by shape (``rows[].measured_run
.call_groups``: lane, experts, extra rows, reads of the layer in flight, calls, seconds). Per VRAM arm and lane,
the mean ms of a call with 1..max-experts experts and no extra rows, by reads in flight (0, 1, 2, 3 or more), and
beside it the model's error with the record's fitted terms (moetier.measure.fit.fit_device_terms' model): how the
cost of a read in flight grows with the reads (per_read_ms against per_read_busy_ms).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def model_ms(t: dict, e: int, x: int, r: int, conc: int) -> float:
    """The model's call (moetier.measure.fit.fit_device_terms); ``conc`` is no term of it (a record made before the
    step-rows term left the model keeps that term's figure, which this leaves out)."""
    return (t["per_layer_ms"] + t["per_expert_ms"] * e + t["per_extra_token_ms"] * x + t["per_read_ms"] * r
            + t.get("per_read_busy_ms", 0.0) * (r > 0))


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("record")
    ap.add_argument("--max-experts", type=int, default=3)
    a = ap.parse_args(argv)
    cal = json.loads(Path(a.record).read_text())["calibration"]
    terms = cal["terms"]
    rows = [r for r in cal["rows"] if r["measured_run"].get("call_groups")]
    if not rows:
        sys.exit(f"device_calls: {a.record}: no device-lane calls (rows[].measured_run.call_groups)")
    print("| arm | lane | experts | ms per call by reads in flight 0 / 1 / 2 / 3+ (model error) |\n|---|---|---|---|")
    for r in rows:
        for lane, name in (("gpu", "gpu"), ("zc", "zerocopy")):
            for e in range(1, a.max_experts + 1):
                acc: dict = {}
                for p, ee, x, rd, n, sec in r["measured_run"]["call_groups"]:
                    if p == lane and ee == e and x == 0:
                        g = acc.setdefault(min(rd, 3), [0, 0.0, 0.0])
                        g[0] += n
                        g[1] += sec * 1e3
                        g[2] += n * model_ms(terms[name], e, 0, rd, r["conc"])
                cells = [f"{g[1] / g[0]:.3f} ({(g[2] / g[1] - 1) * 100:+.0f}%, {g[0]})" if (g := acc.get(k)) else "-"
                         for k in range(4)]
                print(f"| {r['arm']} | {name} | {e} | {' / '.join(cells)} |")


if __name__ == "__main__":
    main()
