"""Layer by layer: the runtime's measured time against the simulator's plan of the same layer.

    python benchmarks/layer_residuals.py --store DIR [--recipe tiny-local-cpu] [--arm vram102-C1] [--steps 200]
                                         [--top 8] [--json]

The runtime plans on the modeled clock (plan parity), so a replay of the recipe it ran makes its decisions layer
for layer. This runs one calibration arm (moetier.measure.calibrate.default_arms) on the runtime, with the registry's
terms (the last calibration's), then in the simulator, and groups the layers by shape: VRAM hits, cpu RAM picks,
zerocopy picks, NVMe picks to the cpu and gpu lanes, and whether those are demand reads (d), prefetched (p) or
both (m), and the NVMe wait summed over the run by that kind. Per shape, the mean ms a layer of the cpu lane (net
of waits), the gpu and zerocopy lanes, the NVMe wait, and for demand reads the host's work before its first wait
(the runtime's read span, from the submit; the plan's wait_from, from the layer's start) and that read's latency,
measured against modeled. A bucket
that is right on average can be wrong per layer: the stall follows how far the work before a wait reaches into
the read, layer by layer.
"""
from __future__ import annotations

import json

# benchmarks/ is on sys.path when this script runs
from _recipe import calibration_arm, open_recipe, parser  # noqa: E402
from moetier.run import runtime  # noqa: E402
from moetier.core import sim  # noqa: E402

KEYS = ("lane_cpu_s", "lane_gpu_s", "lane_zc_s", "nvme_wait_s", "stage_s", "read_span_s", "read_layers",
        "read_latency_s", "read_latency_n")
BUCKETS = ("cpu", "gpu+zc", "wait", "span", "latency")


def shape(plan) -> tuple:
    """Picks per lane, and for a layer with NVMe picks whether they are all demand reads ("d"), all prefetched ("p")
    or both ("m"): a prefetched read has been in flight since an earlier layer, so its wait is another quantity."""
    n = tuple(len(x) for x in (plan.gpu, plan.cpu, plan.zerocopy, plan.nvme_cpu, plan.nvme_gpu))
    nv = n[3] + n[4]
    return n + (("" if not nv else "d" if plan.demand_reads == nv else "p" if not plan.demand_reads else "m"),)


def measured_layers(R, st, tr, arm, steps) -> list[tuple]:
    """(step, layer, shape, {bucket: ms}) of every layer the runtime ran past its first step."""
    out, last, shapes = [], {}, {}
    be = runtime.make_backend(arm.get("backend", "cpu"), st, R, arm["conc"], 1.0)

    def on_plan(s, layer, plan):
        shapes[(s, layer)] = shape(plan)

    def on_layer(s, layer, xin, y, rows_keys, rows_w, rt):
        now = {k: rt.stats[k] for k in KEYS}
        if last and s > 0:
            d = {k: now[k] - last[k] for k in KEYS}
            span = d["read_span_s"] * 1e3 if d["read_layers"] else None
            lat = d["read_latency_s"] * 1e3 if d["read_latency_n"] else None
            out.append((s, layer, shapes[(s, layer)], {
                "cpu": d["lane_cpu_s"] * 1e3, "gpu+zc": (d["lane_gpu_s"] + d["lane_zc_s"]) * 1e3,
                "wait": (d["nvme_wait_s"] + d["stage_s"]) * 1e3, "span": span, "latency": lat}))
        last.update(now)
    try:
        runtime.run(R, st, be, tr, arm["conc"], max_steps=steps, plan_hook=on_plan, layer_hook=on_layer)
    finally:
        be.close()
    return out


def modeled_layers(R, tr, arm, steps) -> dict:
    """{(step, layer): (shape, {bucket: ms})} of the simulator's plans (the same decisions as the runtime's)."""
    out = {}

    def on_plan(s, layer, p):
        wait_cpu = p.nvme_wait_ms - p.gpu_wait_ms
        nv = p.nvme_cpu or p.nvme_gpu
        demand = nv and p.demand_reads == len(p.nvme_cpu) + len(p.nvme_gpu)
        out[(s, layer)] = (shape(p), {"cpu": p.cpu_ms - wait_cpu, "gpu+zc": p.gpu_ms - p.gpu_wait_ms,
                                      "wait": p.nvme_wait_ms, "span": p.wait_from if demand else None,
                                      "latency": p.arrivals[nv[0]] - p.t0 if demand else None})
    sim.run(R, tr, arm["conc"], max_steps=steps, plan_hook=on_plan)
    return out


def main(argv=None):
    ap = parser(200)
    ap.add_argument("--arm", default="vram102-C1")
    ap.add_argument("--top", type=int, default=8, help="shapes shown, most frequent first")
    a = ap.parse_args(argv)
    R0, st, tr = open_recipe(a)
    arm, R = calibration_arm(R0, a.arm, "layer_residuals")
    meas = measured_layers(R, st, tr, arm, a.steps)
    model = modeled_layers(R, tr, arm, a.steps)
    groups: dict = {}
    parted = 0
    for s, layer, shp, m in meas:
        mshp, p = model[(s, layer)]
        parted += mshp != shp
        g = groups.setdefault(shp, {"layers": 0, **{b: [0.0, 0.0, 0] for b in BUCKETS}})
        g["layers"] += 1
        for b in BUCKETS:
            if m[b] is not None and p[b] is not None:
                acc = g[b]
                acc[0] += m[b]
                acc[1] += p[b]
                acc[2] += 1
    rows = []
    for shp, g in sorted(groups.items(), key=lambda kv: -kv[1]["layers"]):
        rows.append({"shape": dict(zip(("vram", "cpu", "zerocopy", "nvme_cpu", "nvme_gpu"), shp)),
                     "reads": shp[5], "layers": g["layers"],
                     **{b: ({"measured": g[b][0] / g[b][2], "sim": g[b][1] / g[b][2]} if g[b][2] else None)
                        for b in BUCKETS}})
    # the stall by kind of reads, summed over the run: where the bucket's error comes from
    by_reads: dict = {}
    for r in rows:
        if r["reads"] and r["wait"]:
            w = by_reads.setdefault(r["reads"], {"layers": 0, "measured_ms": 0.0, "sim_ms": 0.0})
            w["layers"] += r["layers"]
            w["measured_ms"] += r["wait"]["measured"] * r["layers"]
            w["sim_ms"] += r["wait"]["sim"] * r["layers"]
    out = {"arm": a.arm, "layers": len(meas), "layers_whose_plan_parted": parted, "shapes": rows,
           "wait_by_reads": by_reads}
    if a.json:
        print(json.dumps(out, indent=1))
        return
    print(f"{a.arm}: {len(meas)} layers, {parted} planned otherwise by the simulator (plan parity: 0)")
    print("| vram/cpu/zc/nvme_cpu/nvme_gpu | reads | layers | " + " | ".join(f"{b} ms measured (sim)" for b in BUCKETS)
          + " |\n|---|---|---|" + "---|" * len(BUCKETS))
    for r in rows[:a.top]:
        cells = [f"{r[b]['measured']:.3f} ({r[b]['sim']:.3f})" if r[b] else "-" for b in BUCKETS]
        shp = "/".join(str(v) for v in r["shape"].values())
        print(f"| {shp} | {r['reads'] or '-'} | {r['layers']} | " + " | ".join(cells) + " |")
    print("NVMe wait summed over the run, ms measured (sim): " + ", ".join(
        f"{k} layers ({w['layers']}) {w['measured_ms']:.0f} ({w['sim_ms']:.0f})" for k, w in sorted(by_reads.items())))


if __name__ == "__main__":
    main()
