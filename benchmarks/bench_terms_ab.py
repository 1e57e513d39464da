"""The bench's terms against the runtime's own timers, interleaved in one process (A B A B, the same minutes).

Each round runs the bench's stages (moetier.measure.bench_terms: the lane grid, the reads beside the lane, the
host's work) and then arms of the calibration matrix for real on moetier's runtime (all-in-RAM at C1 and C4, the
NVMe tail at C1). Per term it prints the bench's figure applied to what the runtime did, over the runtime's timer
for it, so a ratio below 1 is a bench that measured the term cheaper than the runtime ran it:

- cpu lane inline / split: the bench's lane terms (``fit_cpu_lane`` on the grid's calls pooled per cell, as
  `moetier bench` fits them, and on its single calls, as it fitted them before) over the runtime's calls of that
  class (their experts, rows, worker idle and hand-offs), against the lane's timer;
- host per layer: the bench's host terms over the runtime's layer calls and picks, against its host timers;
- fixed: the bench's non-MoE ms per step against the runtime's time outside every timer;
- read qd1: the bench's depth-1 mean latency (rows 1) against the runtime's (tail arm): as `moetier bench` writes it
  (weighted to the recipe's burst sizes, bench_terms.burst_mix) and as a plain mean over the bench's even mix of
  sizes (what it wrote before: a depth-1 read of a burst of 4 waits about three times as long as a lone one's);
- read burst 1: the mean latency of a lone read (a burst of one), the cell the simulator gives such a layer;
- read wake: the mean delay from a read landing to the blocked waiter resuming, weighted and even as above.

Load moves every figure here by up to 2x between minutes; the ratios are per round, so a bias shows as every
round on one side of 1 and load as rounds scattered about it.

    python benchmarks/bench_terms_ab.py --store /tmp/local-store [--rounds 2 --steps 20]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

RECIPE = "tiny-local-cpu"


def lane_ms(r: dict, t: dict, workers: int, per_read: float) -> float:
    """The lane model's ms for one row of fit_cpu_lane's input (calls of one class summed)."""
    if r["cls"] == "inline":
        v = t["per_call_ms"] * r["calls"] + t["per_expert_ms"] * r.get("cold", r["experts"]) \
            + t["per_extra_token_ms"] * r["extra"] + t.get("per_after_wait_ms", 0.0) * r.get("waited", 0)
    else:
        v = (t["per_layer_ms"] * r["calls"] + t["per_expert_ms"] * r.get("crit_cold", r["experts"] / workers)
             + t["per_extra_token_ms"] * r.get("crit_extra", r["extra"] / workers)
             + t.get("per_wake_ms", 0.0) * r.get("wake", 0.0) + t.get("per_handoff_ms", 0.0) * r.get("handoff", 0))
    return v + per_read * r.get("contended", 0)


def read_ratios(res: dict, weighted: dict, even: dict) -> dict:
    """The bench's read terms at one row (its tables as written, ``weighted``, and on its even mix of burst sizes,
    ``even``: fit_channel's {field: {rows: ...}}) over the runtime arm ``res``'s own reads at depth 1, in bursts of
    one and their wake-ups; {} for an arm without reads."""
    from moetier.measure.fit_nvme import burst_means
    lat = {int(q): v for q, v in res["latency_by_qd"].items()}
    if not lat.get(1):
        return {}
    out = {}
    q1 = sum(lat[1]) / len(lat[1])
    for name, tabs in (("", weighted), (" (even mix)", even)):
        bench_q1 = (tabs.get("nvme_latency_by_rows_qd_ms") or {}).get("1", {}).get("1")
        if bench_q1:
            out[f"read qd1{name}"] = bench_q1 / q1
        wake = (tabs.get("nvme_wake_ms_by_rows") or {}).get("1")
        if wake and res["wake_ms"]:
            out[f"read wake{name}"] = wake / (sum(res["wake_ms"]) / len(res["wake_ms"]))
    lone = burst_means([(0, *b) for b in res["burst_ms"]], min_n=1).get(1, {}).get(1)
    bench_lone = (weighted.get("nvme_latency_by_rows_burst_ms") or {}).get("1", {}).get("1", {}).get("1")
    if lone and bench_lone:
        out["read burst 1"] = bench_lone / lone
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--store", required=True, help="a packed store of moetier-tiny-16x64-int8")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=20, help="measured steps per runtime arm and round")
    ap.add_argument("--json", help="also write the figures here")
    args = ap.parse_args(argv)
    from backends.cpu.backend import CpuBackend
    from moetier.bytes import store
    from moetier.core import records as spec
    from moetier.cli.common import find_path
    from moetier.measure import bench, bench_terms, calibrate
    from moetier.measure.fit import cpu_lane_rows, host_timed_s, unbooked_ms
    from moetier.measure.fit_nvme import fit_channel
    from moetier.traces.format import load_trace

    st = store.open_store(args.store)
    R = spec.resolve(RECIPE)
    tr = load_trace(find_path(R.trace), None, layers=R.layers, experts=R.experts, topk=R.topk, model_id=R.model_id)
    arms = [a for a in calibrate.default_arms(R, vram=False) if a["name"] in ("allram-C1", "allram-C4", "tail-C1")]
    per_read = bench.read_cpu_ms(st) / os.cpu_count()
    nslots, nread = min(st.nrecords // 2, 128), 8
    be = CpuBackend(st, ram_slots=nslots + nread, verify_rate=1.0)
    runs: dict = {a["name"]: [] for a in arms}
    load = [os.getloadavg()]
    try:
        for i in range(nslots):
            be.wait(be.fill(i, i))
        lane = bench_terms.LaneGrid(be, st.layout, nslots)
        host = bench_terms.HostWork(RECIPE, st, tr)
        mix = {rows: bench_terms.burst_mix(R, tr, rows) for rows in bench_terms.ROWS}
        chan = bench_terms.ReadsBesideLane(be, R, st.layout.hidden, nslots, st.nrecords - nslots, nslots,
                                           list(range(nslots, nslots + nread)), mix=mix)
        for rnd in range(args.rounds):            # A B A B: the bench's stages, then the runtime's arms
            lane.round()
            host.round()
            chan.round()
            for a in arms:
                runs[a["name"]].append(calibrate._measure(RECIPE, st, tr, a, args.steps, "cpu", 1.0))
            print(f"round {rnd + 1}/{args.rounds}", file=sys.stderr, flush=True)
        load.append(os.getloadavg())
    finally:
        be.close()
    W = be.workers
    flat = [s for r in lane.samples for s in r]
    fits = {"pooled": bench.fit_cpu_lane(bench_terms.pool_calls(flat), W), "single": bench.fit_cpu_lane(flat, W)}
    H = host.result()
    weighted, even = chan.result(None)["tables"], {f: t.get("bench", {}) for f, t in fit_channel(chan.runs).items()}
    rows = []
    for a in arms:
        for rnd, res in enumerate(runs[a["name"]]):
            c = res["counters"]
            ratio = {}
            for r in cpu_lane_rows(c):
                if r["calls"]:
                    for name, t in fits.items():
                        ratio[f"cpu {r['cls']} ({name})"] = lane_ms(r, t, W, per_read) / r["ms"]
            hp = H["host"]
            ratio["host per layer"] = (hp["per_layer_ms"] * c["layer_calls"] + hp["per_pick_ms"]
                                       * (c["picks"] - c["masked"])) / (host_timed_s(c) * 1e3)
            fx = H["fixed_ms"].get(str(a["conc"]))
            if fx is not None:
                ratio["fixed per step"] = fx / unbooked_ms(res)
            ratio.update(read_ratios(res, weighted, even))
            rows.append({"arm": a["name"], "round": rnd + 1, "tok_s": res["tok_s"], "ratio": ratio})
    terms = sorted({k for r in rows for k in r["ratio"]})
    print(f"bench term / runtime timer, {args.rounds} interleaved rounds, load average {load[0][0]:.1f} before, "
          f"{load[-1][0]:.1f} after\n")
    print("| term | " + " | ".join(f"{r['arm']} r{r['round']}" for r in rows) + " | median |")
    print("|---|" + "---|" * (len(rows) + 1))
    for k in terms:
        v = [r["ratio"].get(k) for r in rows]
        have = [x for x in v if x is not None]
        print(f"| {k} | " + " | ".join("-" if x is None else f"{x:.2f}" for x in v)
              + f" | {statistics.median(have):.2f} |")
    print("| tok/s | " + " | ".join(f"{r['tok_s']:.1f}" for r in rows) + " | |")
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "lane_fits": fits, "host": H["host"],
                                               "fixed_ms": H["fixed_ms"], "reads_bench": weighted,
                                               "reads_bench_even": even, "burst_mix": mix, "load": load},
                                              indent=1, default=float))
    return 0


if __name__ == "__main__":
    sys.exit(main())
