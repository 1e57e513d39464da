"""The cpu lane's fitted cost against a calibration record's own calls, per arm and call class.

    python benchmarks/cpu_lane_residuals.py RECORD [--by-class] [--json]

For each arm, the runtime's inline and split calls (counters pooled over the kept repeats: calls, experts in cold
equivalents, extra rows, reads of the layer in flight, a split call's longest share and its worker's idle in
spec.idle_wake units; inline calls right after a blocked wait, where the record books them)
and the mean ms per call measured against what the record's fitted cpu lane gives (moetier.measure.bench.fit_cpu_lane's
model). ``--by-class``
refits the lane on the record's fit arms (no prefetch, as calibrate does) with a per-expert cost of its own for
each call class, and shows the same residuals under it.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from moetier.measure.bench import relative_lstsq

# one call class's row: [per inline call, per split call, inline experts, split experts, extra rows, reads, wake,
# inline calls after a blocked wait, split calls that end with a worker's share]
NAMES = ("per_call_ms", "per_layer_ms", "per_expert_ms", "per_split_expert_ms", "per_extra_token_ms", "per_read_ms",
         "per_wake_ms", "per_after_wait_ms", "per_handoff_ms")


def class_rows(record: dict) -> list[dict]:
    out = []
    for r in record["calibration"]["rows"]:
        c = r["measured_run"]["counters"]
        for cls in ("inline", "split"):
            n = c[f"cpu_{cls}_calls"]
            if not n:
                continue
            split = cls == "split"
            e = c["cpu_split_crit_cold"] if split else c[f"cpu_{cls}_cold"]
            x = c["cpu_split_crit_extra"] if split else c[f"cpu_{cls}_extra"]
            out.append({"arm": r["arm"], "fit": r["fit"] and not c["predict_layers"], "cls": cls, "calls": n,
                        "experts_per_call": c[f"cpu_{cls}_experts"] / n, "ms": c[f"cpu_{cls}_s"] * 1e3,
                        "a": [0 if split else n, n if split else 0, 0 if split else e, e if split else 0, x,
                              c[f"cpu_{cls}_contended"], c.get("cpu_split_wake", 0.0) if split else 0.0,
                              0 if split else c.get("cpu_inline_waited", 0),
                              c.get("cpu_split_handoff", 0) if split else 0]})
    return out


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("record")
    ap.add_argument("--by-class", action="store_true")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    rec = json.loads(Path(a.record).read_text())
    rows = class_rows(rec)
    t = rec["calibration"]["terms"]["cpu"]
    coef = {**{k: t.get(k, 0.0) for k in NAMES}, "per_split_expert_ms": t["per_expert_ms"]}
    if a.by_class:
        fit = [r for r in rows if r["fit"]]
        coef = dict(zip(NAMES, relative_lstsq([r["a"] for r in fit], [r["ms"] for r in fit])))
    for r in rows:
        pred = sum(coef[k] * v for k, v in zip(NAMES, r["a"]))
        r["ms_per_call"], r["model_ms_per_call"] = r["ms"] / r["calls"], pred / r["calls"]
        r["error_pct"] = (pred / r["ms"] - 1) * 100
    if a.json:
        print(json.dumps({"terms": coef, "rows": rows}, indent=1))
        return
    print("terms: " + ", ".join(f"{k} {v:.4f}" for k, v in coef.items()))
    print("| arm | fit | class | experts per call | ms per call | model | error |\n|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['arm']} | {'fit' if r['fit'] else '-'} | {r['cls']} | {r['experts_per_call']:.2f} | "
              f"{r['ms_per_call']:.3f} | {r['model_ms_per_call']:.3f} | {r['error_pct']:+.0f}% |")


if __name__ == "__main__":
    main()
