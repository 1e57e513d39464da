"""The fit table of docs/traces.md: `trace fit` (seed 0, rounds 2) on every trace a shipped recipe names and on two
generated traces, one with strong reuse (top-1 repeat >= 0.4 at every layer) and one with none.

Per trace and statistic: the worst |source - fitted| over layers and how many layers are outside the tolerance;
the fit's wall time. The generated traces come from the global knob generator (moetier.traces.gen.generate) at
2,400 tokens x 16 layers x top-8 over 128 experts, 4 segments, seed 11: zipf_s 1.0, affinity 0.3, affinity_width 2,
reuse 0.6 (strong) or 0.0 (none).

Run: PYTHONPATH=. python benchmarks/trace_fit_table.py [NAME ...] [--json]   (exit 3 when a layer misses)
"""
from __future__ import annotations

import argparse
import json
import sys

from moetier.traces.fit import STATISTICS, fit_trace, summary
from moetier.traces.gen import GenParams, generate

SHIPPED = ("tiny-ci", "tiny-16x64", "glm53-synth", "qwen38-synth")
GENERATED = {"strong reuse": 0.6, "no reuse": 0.0}
GEO = dict(layers=16, experts=128, topk=8, tokens=2400, segments=4)


def load(name: str):
    from moetier.cli.common import find_path
    from moetier.traces.format import load_trace
    if name in GENERATED:
        tr = generate(GenParams(zipf_s=1.0, reuse=GENERATED[name], affinity=0.3, affinity_width=2), seed=11, **GEO)
        return tr, GEO["experts"]
    tr = load_trace(find_path(f"traces/{name}.npz"))
    return tr, int(tr.meta["experts"])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("names", nargs="*", default=[*SHIPPED, *GENERATED])
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    rows = []
    for name in a.names:
        tr, E = load(name)
        d = fit_trace(tr, E)
        rows.append({"trace": name, "shape": d["shape"], "experts": E, "seconds": d["seconds"], "ok": d["ok"],
                     "stats": {r["statistic"]: r for r in summary(d)}})
        if not a.json:
            r = rows[-1]
            T, L, K = r["shape"]
            cells = " | ".join(f"{s['worst_diff']:.4f} ({s['missed']} of {s['layers']})"
                               for s in (r["stats"][k] for k in STATISTICS if k in r["stats"]))
            print(f"| {name} | {T} x {L} x {K}, {E} | {cells} | {r['seconds']:.0f} |", flush=True)
    if a.json:
        print(json.dumps(rows, indent=1, sort_keys=True))
    return 0 if all(r["ok"] for r in rows) else 3


if __name__ == "__main__":
    sys.exit(main())
