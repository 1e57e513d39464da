"""How the runtime's prefetch reads ran against the plan that counted on them.

    python benchmarks/prefetch_claims.py --store DIR [--recipe tiny-local-cpu] [--arm tail-prefetch-C1]
                                         [--steps 200] [--json]

Runs one calibration arm (moetier.measure.calibrate.default_arms) on the runtime with the registry's terms and prints:
the layers whose NVMe picks the plan served from prefetch reads (all of them, "p", or some, "m") and how many of
those the runtime had to re-issue as demand reads because its prefetch read had not started (plan parity keeps
the plan, the real reader decides); a prefetch read's started-to-landed time by the demand reads submitted while
it ran (the model gives it the depth-1 latency whatever reads share the device: ``_service``); and
how long after the read before it landed the prefetch worker started a queued one (its wake-up); and, the
runtime's against the simulator's on the same arm: the share of demand reads issued while a prefetch read was in
service (they share the device; the simulator's ``prefetch.demand_reads_beside``), the state of the prefetch worker
when a burst of demand reads began (a read in service, idle with reads queued, idle with none: NvmeChannel's
``_in_service``, the reader's own state), and the share of prefetch reads withdrawn before they started (the rest
ran, used or wasted). Counts are the measured steps' (the runtime's warm-up steps left out).
"""
from __future__ import annotations

import bisect
import json

import numpy as np

# benchmarks/ is on sys.path when this script runs
from _recipe import calibration_arm, open_recipe, parser  # noqa: E402
from moetier.run import runtime  # noqa: E402
from moetier.core import sim  # noqa: E402
from moetier.core.channel import NvmeChannel  # noqa: E402


def _service(comps) -> list[tuple[int, float]]:
    """(demand reads submitted while it was in service, started-to-landed ms) of each prefetch read that landed."""
    submits = sorted(c.t_submit for c in comps if not c.prefetch)
    return [(bisect.bisect_left(submits, c.t_landed) - bisect.bisect_left(submits, c.t_started),
             (c.t_landed - c.t_started) * 1e3) for c in comps if c.prefetch and c.state == "landed" and c.t_started]


def main(argv=None):
    ap = parser(200)
    ap.add_argument("--arm", default="tail-prefetch-C1")
    a = ap.parse_args(argv)
    R0, st, tr = open_recipe(a)
    arm, R = calibration_arm(R0, a.arm, "prefetch_claims")
    be = runtime.make_backend(arm.get("backend", "cpu"), st, R, arm["conc"], 1.0)
    reader, comps, layers = be.reader, [], {}
    fill = reader.fill
    bursts = {"runtime": [], "sim": []}       # [step, worker state] of each burst's first demand read

    def booked_fill(key, slot, prefetch=False):
        if not prefetch:
            with reader._lock:
                if reader._demand == 0:
                    queued = any(c.prefetch and not c.started and c.state == "pending"
                                 for c in reader._pending.values())
                    bursts["runtime"].append([None, _state(reader._pf_busy > 0, queued)])
        c = fill(key, slot, prefetch=prefetch)
        comps.append(c)
        return c
    reader.fill = booked_fill
    mark, first, warm = [0], [0], [0]

    def on_plan(s, layer, p):       # called after the layer ran: the demand fills since the last one are its
        _tag(bursts["runtime"], s)
        nv = len(p.nvme_cpu) + len(p.nvme_gpu)
        fresh = sum(not c.prefetch for c in comps[mark[0]:])
        mark[0] = len(comps)
        if nv and p.demand_reads < nv:
            kind = "p" if p.demand_reads == 0 else "m"
            g = layers.setdefault(kind, [0, 0])
            g[0] += 1
            g[1] += fresh > p.demand_reads

    def on_step(ev):                # the fills before the first measured step seeded the tiers or warmed them up
        if not ev["measured"]:
            first[0], warm[0] = len(comps), ev["step"] + 1
    try:
        runtime.run(R, st, be, tr, arm["conc"], max_steps=a.steps, plan_hook=on_plan, step_hook=on_step)
    finally:
        be.close()
    service = _service(comps[first[0]:])
    by_joined: dict = {}
    for n, ms in service:
        by_joined.setdefault(n, []).append(ms)
    demand = [c for c in comps[first[0]:] if not c.prefetch]
    prefetched = [c for c in comps[first[0]:] if c.prefetch]
    demand_call = NvmeChannel.demand

    def booked_demand(ch, t, n):    # the simulator's channel, as the reader is booked above
        if n > 0 and not any(x > t for x in ch.outstanding):
            bursts["sim"].append([None, _state(ch._in_service(t) is not None,
                                                any(rec[0] >= t for rec in ch.pf.values()))])
        return demand_call(ch, t, n)
    NvmeChannel.demand = booked_demand
    try:
        srun = sim.run(R, tr, arm["conc"], max_steps=a.steps, plan_hook=lambda s, layer, p: _tag(bursts["sim"], s))
    finally:
        NvmeChannel.demand = demand_call
    modeled = srun["prefetch"]
    landed = sorted(c.t_landed for c in comps if c.state == "landed")
    gaps = []
    for c in comps:
        if c.prefetch and c.t_started and c.t_started - c.t_submit > 1e-4:      # it waited in the queue
            i = bisect.bisect_left(landed, c.t_started) - 1
            if i >= 0:
                gaps.append((c.t_started - landed[i]) * 1e3)
    out = {"arm": a.arm,
           "claimed_layers": {k: {"layers": n, "reissued": r} for k, (n, r) in sorted(layers.items())},
           "prefetch_ms_by_demand_reads_beside": {n: {"reads": len(v), "mean_ms": float(np.mean(v))}
                                                  for n, v in sorted(by_joined.items())},
           "start_after_landing_ms": {"reads": len(gaps), "mean": float(np.mean(gaps)) if gaps else None,
                                      "p50": float(np.median(gaps)) if gaps else None},
           "worker_at_a_bursts_first_read": {
               who: {k: sum(1 for step, state in v if step >= warm[0] and state == k) for k in STATES}
               for who, v in bursts.items()},
           "demand_reads_beside_a_prefetch_read": {
               "runtime": {"reads": len(demand), "beside": sum(c.pf_busy for c in demand)},
               "sim": {"reads": modeled["demand_reads"], "beside": modeled["demand_reads_beside"]}},
           "prefetch_reads_withdrawn": {
               "runtime": {"reads": len(prefetched), "withdrawn": sum(c.state == "cancelled" for c in prefetched)},
               "sim": {"reads": round(modeled["issued_per_tok"] * srun["tokens"]), "withdrawn": modeled["cancelled"]}}}
    if a.json:
        print(json.dumps(out, indent=1))
        return
    for k, v in out["claimed_layers"].items():
        print(f"{k} layers: {v['layers']}, of which re-issued as demand reads: {v['reissued']}")
    print("| demand reads beside | prefetch reads | mean started-to-landed ms |\n|---|---|---|")
    for n, v in out["prefetch_ms_by_demand_reads_beside"].items():
        print(f"| {n} | {v['reads']} | {v['mean_ms']:.3f} |")
    g = out["start_after_landing_ms"]
    if g["reads"]:
        print(f"queued prefetch reads started {g['mean']:.3f} ms (mean; p50 {g['p50']:.3f}) after the read before "
              f"them landed ({g['reads']} reads)")
    for who, v in out["demand_reads_beside_a_prefetch_read"].items():
        print(f"{who}: {v['beside']} of {v['reads']} demand reads ({_pct(v['beside'], v['reads'])}) issued beside a "
              f"prefetch read in service")
    for who, v in out["worker_at_a_bursts_first_read"].items():
        n = sum(v.values())
        print(f"{who}: of {n} demand bursts, the prefetch worker was " + ", ".join(
            f"{k} at {v[k]} ({_pct(v[k], n)})" for k in STATES))
    for who, v in out["prefetch_reads_withdrawn"].items():
        print(f"{who}: {v['withdrawn']} of {v['reads']} prefetch reads ({_pct(v['withdrawn'], v['reads'])}) withdrawn "
              f"before they started")


STATES = ("reading", "idle with reads queued", "idle with none queued")


def _state(in_service: bool, queued: bool) -> str:
    return STATES[0] if in_service else STATES[1] if queued else STATES[2]


def _tag(rows: list, step: int) -> None:
    """The bursts booked since the last plan hook were that layer's: give them its step."""
    for r in reversed(rows):
        if r[0] is not None:
            break
        r[0] = step


def _pct(n, d) -> str:
    return f"{100.0 * n / d:.1f}%" if d else "-"


if __name__ == "__main__":
    main()
