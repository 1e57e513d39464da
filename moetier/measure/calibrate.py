"""`moetier calibrate`: close the loop between the runtime and the simulator on this machine.

Contract
--------
``calibrate(recipe_id, store, trace, arms=None, repeats=2, ...)`` runs in two passes, each interleaving its arms
(A B C ... A B C ...) so drift cancels:

1. a *plan* pass: the fit arms with the recipe as written (``plan_repeats`` times), fitted as below. Its terms only
   make the runtime of pass 2 plan on this machine's costs - lane choices depend on them;
2. the *checked* pass: every arm, fit and held-out interleaved (``repeats`` times), the runtime planning on the plan
   pass's terms. The fit arms of this pass set the simulator's cost terms, and the simulator predicts every arm of
   the same pass with them: the terms and the figures they are checked against were measured minutes apart, not a
   pass apart (this 2 vCPU VM drifted ~15% between passes 10-25 minutes apart). Held-out arms never set a term.

The fits, from the fit arms' runtime counters:
   - cpu lane (engine record): ``moetier.bench.fit_cpu_lane`` on the runtime's calls split by how the lane ran them
     (inline: per_call + work; split over workers: per_layer + the work of its longest share), work in cold-expert
     equivalents under the host cache model (hardware ``cpu.reuse_curve``, `moetier bench`; moetier.llc), plus
     ``per_read_ms`` per NVMe read of the layer (the reader's CPU work and the cache it streams through);
   - gpu / zerocopy lanes (the VRAM engine's record): per call = per_layer + per_expert x experts + per_extra_token
     x extra rows, over the runtime's calls grouped by shape (``fit_device_terms``);
   - one record copy (push or drain) -> hardware ``gpu.h2d_gbps``, and per rows per step -> the VRAM engine's
     ``copy_ms_by_rows`` (what the planner takes);
   - host time (recipe ``calibration.host``, ``fit_host``): ``plan + bookkeeping + combine + prediction = per_layer
     * layer_calls + per_pick * picks + per_read * NVMe reads + per_nvme_layer * layers with NVMe picks
     + per_predict * predicted layers + per_predict_row * their rows + per_copy * copies``;
   - non-MoE time per step (recipe ``calibration.fixed_ms``): step wall minus everything booked to layers, split by
     least squares into a part per concurrency, a part per NVMe read that joins ``per_read`` and a part per
     zerocopy lane call that joins ``per_zc_call`` (``fit_fixed``);
     concurrencies without a fit arm are interpolated by the simulator;
   - NVMe queueing model (engine ``nvme_latency_by_rows_qd_ms``, per engine: its lanes load the cores the reader
     needs): mean submit-to-landed of the runtime's demand reads by rows per step and the demand queue depth they
     joined; depths not reached keep the hardware's idle-disk bench figures; and the same by burst size and
     position (``nvme_latency_by_rows_burst_ms``: a layer's reads are issued together and land together);
   - wake-up (engine ``nvme_wake_ms_by_rows``): mean delay from a read landing to the decode thread that was
     blocked on it resuming, by rows per step; the planner adds it to every pick whose lane waited for its bytes;
   - latency spread (engine ``nvme_latency_cv_shared_by_rows``, ``nvme_latency_cv_own_by_rows``): sd / mean of
     those reads' latency about the burst means, within each run, winsorized, split into the part a layer's reads
     share (they are late together) and each read's own; the planner charges each lane its expected end
     (``moetier.plan._Finish``);
   - the host's head start (recipe ``calibration.host.head_per_*_ms``): the host work between a layer's first NVMe
     submit and its first wait, less the lane and copy time in it (``fit_head``); the planner puts it before the
     first wait, in the reads' time, instead of after the lanes;
   - the host's lateness to that wait (engine ``lane_lateness_sd_ms_by_rows``): the measured spread of landing minus
     wait start beyond the simulator's own for the same arm (``fit_lane_lateness``, the only fit that runs the
     simulator); the planner adds it to the reads' spread in ``_Finish``.

The simulator then predicts every arm and the error table (predicted vs measured tok/s and per-token ms per bucket:
cpu_moe, gpu_moe, nvme_stall, copy, host) goes to the terminal and into a run record.
"""
from __future__ import annotations

import datetime as _dt
import json
import math
import statistics

import numpy as np

from moetier.run import runtime
from moetier.core import sim
from moetier.core import records as spec
from moetier.errors import UserError

BUCKETS = ("cpu_moe", "gpu_moe", "nvme_stall", "copy", "host")
# the per-rows channel terms an engine record carries beside its latency table (moetier.plan.channel_term,
# burst_table_for_rows), written and applied with it
CHANNEL_TERMS = ("nvme_wake_ms_by_rows", "nvme_latency_cv_shared_by_rows", "nvme_latency_cv_own_by_rows",
                 "nvme_latency_by_rows_burst_ms", "nvme_latency_prefetch_factor_by_rows", "lane_lateness_sd_ms_by_rows",
                 "nvme_prefetch_ms_by_rows", "nvme_prefetch_share_ms_by_rows", "nvme_latency_by_rows_burst_pf_ms",
                 "nvme_prefetch_sd_ms_by_rows")
# a VRAM tier on this machine: the SYCL backend's device slots (on the OpenCL CPU device, the same cores), whose
# engine runs its lanes and copies one after another (policy.overlap false)
VRAM_ENGINE = "sycl-opencl-cpu"
NOISE_FLAG_PCT = 5.0   # summary.noisy_arms: measured figures uncertain by more than this (2 standard errors)
MIN_CALLS = 5          # device-lane call shapes seen fewer times are too noisy to fit on


def vram_arms(R, slots: int | None = None) -> list[dict]:
    """Arms with a VRAM tier (SYCL device slots) on top of the recipe's RAM budget and NVMe tail."""
    slots = slots or max(8, R.keys // 10)
    vram = [f'engines=["{VRAM_ENGINE}"]', f"budget.vram_expert_slots={slots}", "policy.overlap=false"]
    return [{"name": f"vram{slots}-C1", "set": vram, "conc": 1, "fit": True, "backend": "sycl"},
            {"name": f"vram{slots}-C4", "set": vram, "conc": 4, "fit": True, "backend": "sycl"},
            {"name": f"vram{slots}-C2", "set": vram, "conc": 2, "fit": False, "backend": "sycl"}]


def sycl_available() -> str | None:
    """None if the SYCL backend can run here, else why not."""
    try:
        from backends.sycl.backend import import_dpctl, select_device
        import_dpctl()
        select_device(None)
        return None
    except Exception as e:          # noqa: BLE001 - any failure means: no VRAM arms, said in the output
        return f"{type(e).__name__}: {e}"


def default_arms(R, *, vram: bool = True) -> list[dict]:
    """At least 8 configurations of a cpu-backend recipe: all-in-RAM, two NVMe-tail budgets, prefetch, mask,
    C1/C2/C4, and (``vram``) the same tail with a VRAM tier. ``fit`` arms set cost terms; the others are held out.
    The tail is fitted at C2 too: read latency under load is not linear in rows (measured mean at depth 1 on the
    2026-12-01 VM: 1.33 ms at C1, 2.03 at C2, 2.90 at C4), and the simulator's rule between C1 and C4
    (plan._at_rows, in the layer's expected distinct experts) is a model of that shape, not a measurement of it. So
    is all-in-RAM: the cpu lane's split call is not linear in its batch (2026-12-02 VM: 0.68 / 1.13 / 1.76 ms per
    call at C1 / C2 / C4, and a fit on C1 and C4 put C2 13% short; all-in-RAM C2 was the held-out miss in runs 10,
    15 and 17 on VM B). The held-out arms check what the fits do not see: a tighter budget (0.8 x the tail's: a
    deeper NVMe tail than any fit arm has), prefetch at C2, mask, a VRAM tier at C2."""
    ram = float(R.raw["budget"]["ram_gb"])
    allram = round(R.keys * R.ram_expert_bytes / 1e9 * 1.05 + 0.01, 3)
    mid = round(ram * 0.8, 3)
    return (vram_arms(R) if vram else []) + [
        {"name": "allram-C1", "set": [f"budget.ram_gb={allram}"], "conc": 1, "fit": True},
        {"name": "allram-C2", "set": [f"budget.ram_gb={allram}"], "conc": 2, "fit": True},
        {"name": "allram-C4", "set": [f"budget.ram_gb={allram}"], "conc": 4, "fit": True},
        {"name": "tail-C1", "set": [], "conc": 1, "fit": True},
        {"name": "tail-C2", "set": [], "conc": 2, "fit": True},
        {"name": "tail-C4", "set": [], "conc": 4, "fit": True},
        {"name": "tail-prefetch-C1", "set": ["policy.prefetch.depth=1", "policy.prefetch.predictor=transition"],
         "conc": 1, "fit": True},
        {"name": "tail-prefetch-C4", "set": ["policy.prefetch.depth=1", "policy.prefetch.predictor=transition"],
         "conc": 4, "fit": True},
        {"name": f"tail{mid}g-C2", "set": [f"budget.ram_gb={mid}"], "conc": 2, "fit": False},
        {"name": "tail-prefetch-C2", "set": ["policy.prefetch.depth=1", "policy.prefetch.predictor=transition"],
         "conc": 2, "fit": False},
        {"name": "tail-mask-C1", "set": ["policy.exact=mask"], "conc": 1, "fit": False},
    ]


def arm_recipe(recipe_id: str, arm: dict, terms: dict | None = None):
    """The arm's recipe; with ``terms``, the fitted terms apply (lanes the arm's engines have, host, fixed, link)."""
    if not terms:
        return spec.resolve(recipe_id, arm["set"])
    lanes = spec.resolve(recipe_id, arm["set"]).lanes        # the arm's engines decide which lanes get terms
    R = spec.resolve(recipe_id, term_overrides(terms, tuple(lanes)) + arm["set"])
    if terms.get("copy_ms"):
        R.h2d_gbps = copy_gbps(R.nvme_expert_bytes, terms["copy_ms"])
    if R.engines[-1]["id"] == VRAM_ENGINE:      # the fitted copy time, not one an earlier run left in the record
        R.engines = [*R.engines[:-1], {**R.engines[-1], "copy_ms_by_rows": terms.get("copy_ms_by_rows") or {},
                                       "copy_record_bytes": R.nvme_expert_bytes}]
    eng = R.engines[-1]["id"]
    head = terms.get("head_per_read_ms_by_engine", {}).get(eng)
    if head is not None:          # the fitted figure, not one an earlier calibration left in the engine record
        R.host["head_per_read_ms"] = head
    tab = terms.get("nvme_latency_by_rows_qd_ms", {}).get(eng)
    if tab:
        per_rows = {f: terms.get(f, {}).get(eng, {}) for f in CHANNEL_TERMS}
        R.engines = [*R.engines[:-1], {**R.engines[-1], "nvme_latency_by_rows_qd_ms": tab, **per_rows,
                                       "nvme_latency_record_bytes": R.nvme_expert_bytes}]
    return R


def _measure(recipe_id, st, tr, arm, steps, backend_name, verify_rate, terms=None):
    R = arm_recipe(recipe_id, arm, terms)
    be = runtime.make_backend(arm.get("backend", backend_name), st, R, arm["conc"], verify_rate)
    try:
        res = runtime.run(R, st, be, tr, arm["conc"], max_steps=steps)
        reader = getattr(be, "reader", None)
        res["latency_by_qd"] = {q: list(v) for q, v in getattr(reader, "latency_by_qd", {}).items()}
        res["wake_ms"] = list(getattr(reader, "wake_ms", ()))
        res["burst_ms"] = list(getattr(reader, "burst_ms", ()))
        res["latency_pf_busy"] = list(getattr(reader, "latency_pf_busy", ()))
        res["prefetch_ms"] = list(getattr(reader, "prefetch_ms", ()))
        res["engine"] = R.engines[-1]["id"]
        return res
    finally:
        be.close()


def _merge(runs):
    """One arm's repeats -> their middle repeats pooled: with three or more, the fastest and the slowest (by tok/s)
    are dropped and the rest summed (counters, calls by shape, tokens, wall time) and pooled (read latencies,
    wake-ups, bursts numbered by repeat). The fits, the read-latency means and the error table's measured figure
    then describe the same minutes of the run: this VM's speed moves by 5-15% between repeats minutes apart, and
    read latency moves with it (the reader costs CPU), so a lane cost taken from one repeat against a latency mean
    over all of them misstates the wait, a small difference of two large numbers. Dropping the extremes keeps the
    heavy tail out (a repeat can lose a scheduler slice per layer); summing the rest averages the interleaved
    cycles, where a median takes each arm's figure from whichever cycle it fell in."""
    ranked = sorted(runs, key=lambda r: r["tok_s"])
    kept = ranked[1:-1] if len(ranked) >= 3 else ranked
    counters: dict = {}
    groups: dict = {}
    for r in kept:
        for k, v in r["counters"].items():
            counters[k] = counters.get(k, 0) + v
        for *key, n, sec in r.get("call_groups", ()):
            g = groups.setdefault(tuple(key), [0, 0.0])
            g[0] += n
            g[1] += sec
    lat: dict[int, list] = {}
    for r in kept:
        for q, v in r.get("latency_by_qd", {}).items():
            lat.setdefault(int(q), []).extend(v)
    first = kept[0]
    return {"counters": counters, "latency_by_qd": lat, "wall_s": sum(r["wall_s"] for r in kept),
            "wake_ms": [w for r in kept for w in r.get("wake_ms", ())],
            "burst_ms": [(i, b, q, ms) for i, r in enumerate(kept) for b, q, ms in r.get("burst_ms", ())],
            "latency_pf_busy": [(i, b, q, ms) for i, r in enumerate(kept)
                                for b, q, ms in r.get("latency_pf_busy", ())],
            "prefetch_ms": [s for r in kept for s in r.get("prefetch_ms", ())],
            "call_groups": [[*k, n, sec] for k, (n, sec) in sorted(groups.items())],
            "tokens": sum(r["tokens"] for r in kept), "steps": sum(r["steps"] for r in kept),
            "tok_s_each": [r["tok_s"] for r in runs], "repeats_kept": len(kept), "conc": first["conc"],
            "engine": first.get("engine")}


def fit_terms(measured: dict, arms: list[dict], workers: int = 1, parallel_min: int = 0,
              idle_latency: dict | None = None) -> dict:
    """Cost terms from the fit arms' runtime counters. The cpu lane's cost per NVMe read of the layer
    (``per_read_ms``) is fitted with its other costs: the bench's reader CPU time per core (0.14 ms here) left out
    what a read does to the cache the lane computes from (uncontended calls of one shape cost ~20% more in a tail
    arm than in an all-in-RAM one on the 2026-12-01 VM). workers and parallel_min (how the lane splits a batch,
    measured by `moetier bench`) travel with the cpu lane's terms: every engine running this lane gets the same call
    classes."""
    from moetier.measure.bench import fit_cpu_lane
    fit = [a for a in arms if a["fit"]]
    lane_rows = []
    for a in fit:
        m = measured[a["name"]]
        c = m["counters"]
        # the lane's own costs come from arms without prefetch: prefetch reads landing during a batch add contention
        # the lane model does not carry (the prefetch arm sets the host prediction term)
        # per arm and call class (aggregates): a fit on per-shape means was tried and is unstable here - single-expert
        # calls are mostly NVMe picks computed cold right after their wait, and dominate by count
        if not c["predict_layers"]:
            lane_rows += cpu_lane_rows(c)
    host, fixed = fit_host_and_fixed([(measured[a["name"]], a["conc"]) for a in fit])
    head = fit_head([measured[a["name"]]["counters"] for a in fit], [measured[a["name"]].get("engine") for a in fit])
    head_by_engine = head.pop("head_per_read_ms_by_engine", None)
    out = {"cpu": {**fit_cpu_lane(lane_rows, workers, None), "workers": workers, "parallel_min": parallel_min},
           "host": {**host, **head},
           **({"head_per_read_ms_by_engine": head_by_engine} if head_by_engine else {}),
           "fixed_ms": fixed,
           **fit_channel([measured[a["name"]] for a in fit], idle_latency)}
    out.update(fit_device_terms([measured[a["name"]] for a in fit]))
    return out


def cpu_lane_rows(c: dict) -> list[dict]:
    """One arm's cpu-lane calls as moetier.bench.fit_cpu_lane's rows, one per call class (aggregates over its
    counters: calls, experts and their cold equivalents, extra rows, reads of the layer in flight; inline calls
    right after a blocked wait; a split call's longest share, its worker's idle and the calls that ended with a
    worker's share)."""
    return [{"cls": cls, "calls": c[f"cpu_{cls}_calls"], "experts": c[f"cpu_{cls}_experts"],
             "extra": c[f"cpu_{cls}_extra"], "ms": c[f"cpu_{cls}_s"] * 1e3, "contended": c[f"cpu_{cls}_contended"],
             "cold": c.get(f"cpu_{cls}_cold", c[f"cpu_{cls}_experts"]),
             **({"waited": c.get("cpu_inline_waited", 0)} if cls == "inline" else {}),
             **({"crit_cold": c["cpu_split_crit_cold"], "crit_extra": c["cpu_split_crit_extra"],
                 "wake": c.get("cpu_split_wake", 0.0), "handoff": c.get("cpu_split_handoff", 0)}
                if cls == "split" and "cpu_split_crit_cold" in c else {})}
            for cls in ("inline", "split")]


def fit_host(runs) -> dict:
    """The host's timed work (plan, bookkeeping, combine, prediction) from the fit arms' counters, ``runs`` =
    [(counters, conc)]: per layer call, per computed pick, per NVMe read, per layer call with NVMe picks, per
    predicting layer, per row it predicts for, per copy (non-negative relative least squares). The part per
    layer with NVMe picks is the work a layer's reads share: planning them (the channel, the arrival spread),
    one issue loop and one wait loop. Per read alone put tail0.8g-C2 (held out: 14.7 reads a token in 7.0 such
    layers, against tail-C2's 9.9 in 6.0) 25-47% over in runs 27-30 (run 30, 2026-12-02k: +0.72 ms a token over
    all-in-RAM C2 measured, +0.96 per read; +0.76 per layer with NVMe picks). A term no fit arm exercises (no
    prediction, no copies) is left out and set to 0; so is the prediction's part per row without predicting arms
    at two concurrencies (the predictor reads every row's picks: tail-prefetch-C2's host time was 14-24% over a
    per-layer term fitted at C1)."""
    from moetier.measure.bench import relative_lstsq
    A = [[c["layer_calls"], c["picks"] - c["masked"], c["reads"], c.get("nvme_layers", 0), c["predict_layers"],
          c.get("predict_rows", 0), c.get("copies", 0)] for c, _ in runs]
    y = [host_timed_s(c) * 1e3 for c, _ in runs]
    pred_concs = {conc for (c, conc) in runs if c["predict_layers"]}
    used = [j for j in range(len(A[0])) if j < 3 or (any(r[j] for r in A) and (j != 5 or len(pred_concs) > 1))]
    coef = dict(zip(used, relative_lstsq([[r[j] for j in used] for r in A], y)))
    return {name: coef.get(j, 0.0) for j, name in enumerate(spec.HOST_TIMED_TERMS)}


def fit_head(counters: list[dict], engines: list | None = None) -> dict:
    """The host's head start (recipe ``calibration.host.head_per_*_ms``): the host work between a layer's first
    NVMe submit and its first wait, less the lane and copy time in it (Runtime._wait_read), as per read layer + per
    read + per read layer that predicts + per row it predicts for (the host's prediction term has the same two
    parts), over the fit arms' read layers. ``engines``: each arm's engine; the per-read part is the backend's
    (submitting a read) and is fitted per engine, returned as ``head_per_read_ms_by_engine`` (``head_per_read_ms``:
    that of the engine most arms ran on, the recipe's own). Empty without read layers; a column no arm exercises
    is 0, and so is the per-row part without predicting arms at two concurrencies. Sixth session, VM B: the
    runtime's span was 0.2-0.9 ms longer than the resident lanes'. Eighth session, VM C: one per-predict term
    fitted on C1 and C4 put tail-prefetch-C4's head at 0.37 ms against 0.57 measured (its stall +53%); one
    per-read term for both engines put the SYCL arms' head at 0.05-0.08 ms against 0.07-0.16 (their stall
    +14-23%)."""
    from moetier.measure.bench import relative_lstsq
    engines = list(engines) if engines is not None else [None] * len(counters)
    data = [(e, c) for e, c in zip(engines, counters) if c.get("read_layers") and c.get("read_head_s")]
    if not data:
        return {}
    engs = list(dict.fromkeys(e for e, _ in data))
    # columns: per read layer, per read on each engine, per predicting layer, per row it predicts for
    rows = [(c["read_layers"], *(c.get("read_reads", 0) if e == x else 0 for x in engs), c.get("read_predict", 0),
             c.get("read_predict_rows", 0), c.get("read_head_s", 0.0) * 1e3) for e, c in data]
    n = len(engs)
    jp, jr = 1 + n, 2 + n
    # rows per predicting layer: the per-row part is identifiable only beside the per-layer one at two values
    per_row = len({r[jr] / r[jp] for r in rows if r[jp]}) > 1
    used = [j for j in range(jr + 1) if j <= n or (j == jp and any(r[jp] for r in rows)) or (j == jr and per_row)]
    if len(rows) < len(used):         # fewer arms than terms: the mean per read layer
        return {"head_per_layer_ms": sum(r[-1] for r in rows) / sum(r[0] for r in rows)}
    coef = dict(zip(used, relative_lstsq([[r[j] for j in used] for r in rows], [r[-1] for r in rows])))
    by_engine = {e: coef.get(1 + i, 0.0) for i, e in enumerate(engs)}
    main = max(engs, key=[e for e, _ in data].count)
    return {"head_per_layer_ms": coef.get(0, 0.0), "head_per_read_ms": by_engine[main],
            "head_per_predict_ms": coef.get(jp, 0.0), "head_per_predict_row_ms": coef.get(jr, 0.0),
            **({"head_per_read_ms_by_engine": by_engine} if engs != [None] else {})}


def fit_lane_lateness(recipe_id, tr, fit_arms, measured, steps, terms, min_layers: int = 50,
                      planned_on: dict | None = None) -> dict:
    """The host's lateness to its first wait (engine ``lane_lateness_sd_ms_by_rows``, ms): per fit arm, the
    variance of the measured gap (landing minus wait start, ``read_coverage``) beyond the simulator's own for that
    arm with ``terms`` (the plan's spread over layers and the reads' modeled lateness), pooled by engine and rows
    over the read layers. The reads' spread alone gave ~0.3-0.5 ms where the runtime's waits implied ~1.4 (run 18,
    tail-prefetch-C2). Arms with fewer than ``min_layers`` read layers set nothing. ``planned_on``: the terms the
    runtime planned on (None: the registry's); the simulator times the deal they made (predict_and_compare)."""
    pool: dict = {}
    base = {**terms, "lane_lateness_sd_ms_by_rows": {}}
    for a in fit_arms:
        m = measured[a["name"]]
        cov = read_coverage(m["counters"])
        if cov["gap_sd_ms"] is None or cov["layers"] < min_layers:
            continue
        p = sim.run(arm_recipe(recipe_id, a, base), tr, a["conc"], max_steps=steps,
                    choose=arm_recipe(recipe_id, a, planned_on))["read_coverage"]
        if p["gap_sd_ms"] is None:
            continue
        acc = pool.setdefault((m.get("engine"), a["conc"]), [0, 0.0])      # read layers, their excess variance
        acc[0] += cov["layers"]
        acc[1] += cov["layers"] * max(0.0, cov["gap_sd_ms"] ** 2 - p["gap_sd_ms"] ** 2)
    out: dict = {}
    for (eng, rows), (n, v) in sorted(pool.items(), key=lambda kv: (str(kv[0][0]), kv[0][1])):
        out.setdefault(eng, {})[str(rows)] = round(math.sqrt(v / n), 4)
    return out


def fit_channel(fit_runs: list[dict], idle_latency: dict | None = None) -> dict:
    """The NVMe channel's terms per engine from the fit arms' reads, as {field: {engine: {rows: ...}}}:
    ``nvme_latency_by_rows_qd_ms`` (mean submit-to-landed by rows per step and the demand queue depth a read
    joined), ``nvme_latency_by_rows_burst_ms`` (the same by burst size and position: the reads of a burst land
    together, ``burst_means``), ``nvme_wake_ms_by_rows`` (mean wake-up: landed to the blocked waiter resuming),
    and the latency's spread as sd / mean about those means, split into the part the reads of one burst (a
    layer's) share and each read's own (``nvme_latency_cv_shared_by_rows``, ``nvme_latency_cv_own_by_rows``;
    ``spread_split``, moetier.plan._Finish), and the reads that found a prefetch read in service, kept out of every
    other table: the burst table of bursts whose every read found one (``nvme_latency_by_rows_burst_pf_ms``) and,
    for the sizes it lacks, how much longer such a read takes (``nvme_latency_prefetch_factor_by_rows``: its
    latency over what the model gives it without one, ratio of sums, ``prefetch_busy_refs``), and a prefetch read's
    own time, alone and per demand read beside it, and its spread about that (``nvme_prefetch_ms_by_rows``,
    ``nvme_prefetch_share_ms_by_rows``, ``nvme_prefetch_sd_ms_by_rows``; ``prefetch_service``). Means, not medians:
    the planner adds them into stalls, and the median of a right-skewed latency understates their sum.
    The spread matters as much: a lane expects to wait E[max(0, arrival - free)], far more than the wait for a mean
    arrival that is about when the lane gets free (2026-12-01 VM: a layer's first read 0.70 ms against 0.03 for
    its mean; its reads' latencies correlate 0.78 within a layer). Depths the runtime reached are measured under
    its load; deeper ones keep the idle-disk bench figures. Fewer than 8 samples make no entry."""
    lat: dict[str, dict] = {}                      # engine -> rows per step -> q -> samples
    wake: dict[str, dict] = {}                     # engine -> rows per step -> samples
    bursts: dict[str, dict] = {}                   # engine -> rows per step -> [(run, burst, q, ms)]
    pf_busy: dict[str, dict] = {}                  # the same, of reads that found a prefetch read in service
    pf_svc: dict[str, dict] = {}                   # engine -> rows per step -> [(demand reads beside, ms)]
    for i, m in enumerate(fit_runs):
        eng, rows = m.get("engine"), m["conc"]
        pf_svc.setdefault(eng, {}).setdefault(rows, []).extend(m.get("prefetch_ms", ()))
        pf_busy.setdefault(eng, {}).setdefault(rows, []).extend(((i, rep), b, q, ms)
                                                                for rep, b, q, ms in m.get("latency_pf_busy", ()))
        for q, v in m.get("latency_by_qd", {}).items():
            lat.setdefault(eng, {}).setdefault(rows, {}).setdefault(int(q), []).extend(v)
        wake.setdefault(eng, {}).setdefault(rows, []).extend(m.get("wake_ms", ()))
        # one run per fit arm and repeat, so the runs' bursts stay apart
        bursts.setdefault(eng, {}).setdefault(rows, []).extend(((i, rep), b, q, ms)
                                                                for rep, b, q, ms in m.get("burst_ms", ()))
    idle = {int(q): float(v) for q, v in (idle_latency or {}).items()}
    out = {f: {} for f in ("nvme_latency_by_rows_qd_ms", *CHANNEL_TERMS)}
    for eng, by_rows in sorted(lat.items(), key=lambda kv: str(kv[0])):
        means = {r: {q: float(np.mean(v)) for q, v in tab.items() if len(v) >= 8} for r, tab in by_rows.items()}
        tabs = {str(r): {str(q): round(v, 4) for q, v in sorted({**idle, **means[r]}.items())}
                for r in sorted(by_rows)}
        if not (eng and any(tabs.values())):
            continue
        out["nvme_latency_by_rows_qd_ms"][eng] = tabs
        w = {str(r): round(float(np.mean(v)), 4) for r, v in sorted(wake.get(eng, {}).items()) if len(v) >= 8}
        if w:
            out["nvme_wake_ms_by_rows"][eng] = w
        shared, own, burst_tabs, pf_tabs, pf, alone, share, pf_sd = {}, {}, {}, {}, {}, {}, {}, {}
        for r in sorted(by_rows):
            samples = bursts.get(eng, {}).get(r, ())
            by_burst = burst_means(samples)
            pf_samples = pf_busy.get(eng, {}).get(r, ())
            # the bursts whose every read found a prefetch read in service (none of theirs among the others)
            apart = {(run, b) for run, b, _, _ in samples}
            by_pf_burst = burst_means([s for s in pf_samples if (s[0], s[1]) not in apart])
            if by_pf_burst:
                pf_tabs[str(r)] = _burst_record(by_pf_burst)
            busy = prefetch_busy_refs(pf_samples, samples, by_burst, means[r])
            if len(busy) >= 8:
                pf[str(r)] = round(sum(ms for ms, _ in busy) / sum(ref for _, ref in busy), 4)
            chain = prefetch_service(pf_svc.get(eng, {}).get(r, ()))
            if chain is not None:
                alone[str(r)] = round(chain[0], 4)
                pf_sd[str(r)] = round(chain[2], 4)
                if chain[1] is not None:
                    share[str(r)] = round(chain[1], 4)
            if by_burst:
                burst_tabs[str(r)] = _burst_record(by_burst)
            split = spread_split(samples, means[r], by_burst)
            if split is not None:
                shared[str(r)], own[str(r)] = (round(x, 4) for x in split)
        if burst_tabs:
            out["nvme_latency_by_rows_burst_ms"][eng] = burst_tabs
        if pf_tabs:
            out["nvme_latency_by_rows_burst_pf_ms"][eng] = pf_tabs
        if shared:
            out["nvme_latency_cv_shared_by_rows"][eng] = shared
            out["nvme_latency_cv_own_by_rows"][eng] = own
        if pf:
            out["nvme_latency_prefetch_factor_by_rows"][eng] = pf
        if alone:
            out["nvme_prefetch_ms_by_rows"][eng] = alone
        if share:
            out["nvme_prefetch_share_ms_by_rows"][eng] = share
        if pf_sd:
            out["nvme_prefetch_sd_ms_by_rows"][eng] = pf_sd
    return out


def _burst_record(by_burst: dict) -> dict:
    """burst_means' {n: {q: ms}} as an engine record keeps it (string keys, 4 decimals)."""
    return {str(n): {str(q): round(v, 4) for q, v in row.items()} for n, row in sorted(by_burst.items())}


def prefetch_service(samples, min_n: int = 8) -> tuple[float, float | None, float] | None:
    """(alone, share, sd) of prefetch reads [(demand reads submitted while it was in service, started-to-landed
    ms)]: the mean of those no demand read joined, how much longer one takes per demand read that joined (ratio of
    sums of the excess over ``alone`` to the reads), and the sd of all about alone + share per demand read (the
    worker's chain adds it up: a read's start spreads, and with it whether it has started when its key is needed,
    NvmeChannel.claim). None with fewer than ``min_n`` reads alone; share None with fewer than ``min_n`` joined.
    A demand read takes the device from a prefetch read in service (2026-12-02, VM D, tail-prefetch-C1: 1.44 ms
    alone, 1.75 / 2.20 / 2.52 with one / two / three demand reads beside it), so the prefetch chain runs later
    than back-to-back reads of the demand reads' latency, and the model had promoted as started prefetch reads the
    runtime had not started (half of them; docs/calibration.md, twelfth session)."""
    free = [ms for n, ms in samples if n == 0]
    if len(free) < min_n:
        return None
    a = float(np.mean(free))
    joined = [(n, ms) for n, ms in samples if n > 0]
    share = max(0.0, sum(ms - a for _, ms in joined) / sum(n for n, _ in joined)) if len(joined) >= min_n else None
    sd = math.sqrt(sum((ms - a - (share or 0.0) * n) ** 2 for n, ms in samples) / len(samples))
    return a, share, sd


def prefetch_busy_refs(busy, samples, by_burst: dict, mean_by_q: dict) -> list[tuple]:
    """[(ms, reference ms)] of the demand reads that found a prefetch read in service ([(run, burst, q, ms)]),
    each against what the channel model would give it without one (NvmeChannel.demand, which the factor then
    scales): its burst's size and position in the burst table where its burst is whole (its reads counted with the
    others of that burst, ``samples``) and measured, else the depth mean; a depth without a mean is left out."""
    sizes = {key: (max(q for q, _ in v), len(v)) for key, v in _bursts([*samples, *busy]).items()}
    out = []
    for run, b, q, ms in busy:
        n, count = sizes[(run, b)]
        ref = by_burst.get(n, {}).get(int(q)) if count == n else None
        if ref is None:
            ref = mean_by_q.get(int(q))
        if ref is not None:
            out.append((ms, ref))
    return out


def _bursts(samples) -> dict:
    """[(run, burst, q, ms)] -> {(run, burst): [(q, ms)]}."""
    out: dict = {}
    for run, b, q, ms in samples:
        out.setdefault((run, b), []).append((int(q), ms))
    return out


def burst_means(samples, min_n: int = 8) -> dict:
    """Mean latency by burst size and position, {n: {q: ms}}, from [(run, burst, q, ms)] (the reader's ``burst_ms``
    with the runtime run it came from): a burst's size is its deepest read. Only sizes with at least ``min_n``
    bursts, every position measured."""
    cells: dict = {}
    for v in _bursts(samples).values():
        n = max(q for q, _ in v)
        if len(v) == n:                       # a burst with a read missing (failed, over the cap) tells nothing
            for q, ms in v:
                cells.setdefault(n, {}).setdefault(q, []).append(ms)
    return {n: {q: float(np.mean(x)) for q, x in sorted(row.items())} for n, row in cells.items()
            if len(row.get(1, ())) >= min_n}


def spread_split(samples, mean_by_q: dict, mean_by_burst: dict | None = None) -> tuple[float, float] | None:
    """(shared, own) sd / mean of read latencies [(run, burst, q, ms)] about their mean - by burst size and position
    where ``mean_by_burst`` has it, else by depth: the own part is the pooled variance within bursts of two or more
    reads, the shared part the rest of the total variance. Each run's mean lateness is taken out first: a run
    slower than the others (this VM drifts by 5-15% between repeats minutes apart) is drift, not lateness within a
    layer. None with fewer than 8 samples or no burst of two."""
    by_burst: dict = {}
    for b, v in _bursts(samples).items():
        row = (mean_by_burst or {}).get(max(q for q, _ in v)) or {}
        for q, ms in v:
            mu = row.get(q) or mean_by_q.get(q)
            if mu:
                by_burst.setdefault(b, []).append(ms / mu - 1.0)
    rel = [x for v in by_burst.values() for x in v]
    multi = [v for v in by_burst.values() if len(v) > 1]
    if len(rel) < 8 or not multi:
        return None
    # winsorized at 0.5% / 99.5%: a rare read 36x its mean (the SYCL arms, one in thousands) would set the normal's
    # width for every layer; its own cost is in the mean latency already
    lo, hi = np.percentile(rel, [0.5, 99.5])
    by_burst = {b: np.clip(v, lo, hi) for b, v in by_burst.items()}
    runs: dict = {}
    for (run, _), v in by_burst.items():
        runs.setdefault(run, []).extend(v)
    offset = {run: float(np.mean(v)) for run, v in runs.items()}
    by_burst = {(run, b): v - offset[run] for (run, b), v in by_burst.items()}
    rel = [x for v in by_burst.values() for x in v]
    multi = [v for v in by_burst.values() if len(v) > 1]
    total = float(np.mean(np.square(rel)))
    within = sum(float(np.sum(np.square(np.subtract(v, np.mean(v))))) for v in multi) / sum(len(v) - 1 for v in multi)
    within = min(within, total)
    return float(np.sqrt(total - within)), float(np.sqrt(within))


def host_timed_s(c: dict) -> float:
    """The runtime's timed host work (plan, bookkeeping, combine, prediction) in seconds: what the host terms model."""
    return c["plan_s"] + c["book_s"] + c["combine_s"] + c["predict_s"]


def fit_host_and_fixed(runs) -> tuple[dict, dict]:
    """The host terms (fit_host on the timed work, plus the parts of the time outside every timer that follow
    reads and zerocopy calls) and the non-MoE time per concurrency (fit_fixed), from ``runs`` = [(measured run:
    counters, steps, wall_s; conc)] of the fit arms."""
    host = fit_host([(m["counters"], conc) for m, conc in runs])
    fixed, per_read, host["per_zc_call_ms"] = fit_fixed(
        [(conc, m["counters"]["reads"] / m["steps"], m["counters"].get("zc_calls", 0) / m["steps"], unbooked_ms(m))
         for m, conc in runs])
    host["per_read_ms"] += per_read
    return host, fixed


def unbooked_ms(m: dict) -> float:
    """A measured run's ms per step outside every timer: its step wall less everything booked to layers."""
    c = m["counters"]
    booked = (c["lane_cpu_s"] + c["lane_gpu_s"] + c["lane_zc_s"] + c["nvme_wait_s"] + c["copy_s"] + c["stage_s"]
              + host_timed_s(c))
    return max(0.0, (m["wall_s"] - booked) * 1e3 / m["steps"])


def fit_fixed(unbooked) -> tuple[dict, float, float]:
    """Non-MoE time per step by concurrency, and the parts of it that grow with NVMe reads and zerocopy calls.

    unbooked: (conc, demand reads, zerocopy lane calls, ms outside every timer), per step. That time is not
    constant: reader threads finishing reads take the interpreter from the decode thread between the timed sections
    (measured here: allram arms 0.1-0.2 ms per step below the tail arms at the same concurrency), and so does a
    zerocopy call on the SYCL CPU device (0.008-0.059 ms a call fitted on runs 30-37; vram102-C2's host bucket was
    -22% without it in run 34, and its outside time twice all-in-RAM C2's). Model: ms = fixed[conc] + u x reads
    + z x zerocopy calls, least squares over the fit arms; u and z are then charged per read and per zerocopy call
    (they join host per_read_ms and per_zc_call_ms). A part no two arms at one concurrency tell apart is not
    identifiable: 0 (per-conc means where neither is)."""
    from moetier.measure.bench import relative_lstsq
    concs = sorted({u[0] for u in unbooked})
    # a column is fitted where two arms at one concurrency differ in it
    cols = [j for j in (1, 2) if any(len({u[j] for u in unbooked if u[0] == c}) > 1 for c in concs)]
    if not cols:
        return {str(c): round(statistics.mean(u[-1] for u in unbooked if u[0] == c), 4) for c in concs}, 0.0, 0.0
    A = [[1.0 if u[0] == cc else 0.0 for cc in concs] + [u[j] for j in cols] for u in unbooked]
    coef = relative_lstsq(A, [max(u[-1], 1e-6) for u in unbooked])
    part = dict(zip(cols, coef[len(concs):]))
    return {str(c): round(v, 4) for c, v in zip(concs, coef)}, part.get(1, 0.0), part.get(2, 0.0)


def fit_device_terms(fit_runs: list[dict]) -> dict:
    """The VRAM tier's terms from the fit arms that had one: the gpu and zerocopy lanes and the time of one record
    copy (pushes and drains: copy + stage time over copies), as ``copy_ms``. A lane call costs per_layer +
    per_expert x experts + per_extra_token x extra rows + per_read x the layer's NVMe reads in flight +
    per_read_busy if any is + per_step_row x (the step's rows - 1), fitted over the runtime's calls grouped by
    shape. On the SYCL CPU device (2026-12-02 VM) a one-expert gpu call took 0.25 ms with no read in flight, 0.29
    with one, 0.30 with two - the lanes share the cores with the reader - and its fixed cost grew with the step's
    rows, ~0.20 ms at C1, 0.28 at C2, 0.43 at C4, more than the per-call arguments (the call's own rows) explain.
    Fitted on C1 and C4 without these two terms, C1's gpu calls came out 8-22% long and C4's 21% short; with them,
    C1 -0.4%, C4 -1.7%, C2 (held out) -1.2%. What a read in flight costs does not grow with the reads (2026-12-02,
    VM D, run 39's vram102-C1: a one-expert gpu call 0.33 ms with none, 0.46 with one, 0.36 with two): fitted per read
    alone it came out 0.024 ms (run 38); with per_read_busy beside it the fit puts it all there (run 39: 0.092 ms
    gpu, 0.095 zerocopy) and the gpu calls with reads in flight within 10% (benchmarks/device_calls.py)."""
    from moetier.measure.bench import relative_lstsq
    groups: dict[str, dict] = {}
    for m in fit_runs:
        s = int(m.get("conc", 1)) - 1
        for p, e, x, r, n, sec in m.get("call_groups", ()):
            if p not in ("gpu", "zc"):
                continue
            g = groups.setdefault(p, {}).setdefault((e, x, r, s), [0, 0.0])
            g[0] += n
            g[1] += sec * 1e3
    out = {}
    names = ("per_layer_ms", "per_expert_ms", "per_extra_token_ms", "per_read_ms", "per_step_row_ms",
             "per_read_busy_ms")
    for p, shapes in sorted(groups.items()):
        # per-call means by shape; relative residuals weighted by sqrt(calls): a shape seen thrice does not pull
        # the fit as hard as one seen a thousand times. Shapes seen fewer than MIN_CALLS times are pooled per
        # concurrency into one row (their mean counts; the model is linear, so it holds for the pool): at C4 most
        # gpu calls have a shape of their own
        # a row: experts, extra rows, reads, step rows - 1, whether a read was in flight; calls; mean ms
        rows = [(e, x, r, s, float(r > 0), n, ms / n) for (e, x, r, s), (n, ms) in sorted(shapes.items())
                if n >= MIN_CALLS]
        for s in sorted({k[3] for k in shapes}):
            rare = [(e, x, r, float(r > 0), n, ms) for (e, x, r, s_), (n, ms) in shapes.items()
                    if s_ == s and n < MIN_CALLS]
            if rare:
                n = sum(v[4] for v in rare)
                e, x, r, busy = (sum(v[j] * v[4] for v in rare) / n for j in range(4))
                rows.append((e, x, r, s, busy, n, sum(v[5] for v in rare) / n))
        cols = [0, 1, 2, 3, 4, 5]
        if len({row[0] for row in rows}) < 2:
            # one expert count (e.g. the zerocopy lane's single-expert calls): launch and expert cost are one
            # number; it is booked per expert so batches of several experts are not charged one launch each
            cols.remove(0)
        # extra rows, reads in flight, step rows, a read in flight at all: a term with one value is not identifiable
        for j in (2, 3, 4, 5):
            if len({row[j - 1] for row in rows}) < 2:
                cols.remove(j)
        coef = relative_lstsq([[(1.0, *row[:5])[j] for j in cols] for row in rows], [row[6] for row in rows],
                              [row[5] ** 0.5 for row in rows])
        full = dict(zip(cols, coef))
        # every term, 0 where not identifiable: as recipe overrides (term_overrides) they must replace what an
        # earlier calibration left in the engine record, or the runtime plans on a term the fit never made (run 26:
        # the plan pass had no per_step_row_ms for the gpu lane, its runtime took run 25's, and the simulator's
        # lane choices on the recorded plan terms no longer matched the runtime's)
        out[{"gpu": "gpu", "zc": "zerocopy"}[p]] = {names[j]: full.get(j, 0.0) for j in range(6)}
    # copies and their seconds by rows: a copy on a device that shares the host's cores costs more in a larger step,
    # as its lane calls do (per_step_row_ms); the planner takes the per-rows figure (plan._push_ms), the pooled one
    # is the link's (hardware gpu.h2d_gbps)
    by_rows: dict[int, list] = {}
    for m in fit_runs:
        c = m["counters"]
        if c.get("copies", 0):
            acc = by_rows.setdefault(int(m.get("conc", 1)), [0, 0.0])
            acc[0] += c["copies"]
            acc[1] += c["copy_s"] + c["stage_s"]
    if by_rows:
        out["copy_ms"] = sum(s for _, s in by_rows.values()) * 1e3 / sum(n for n, _ in by_rows.values())
        out["copy_ms_by_rows"] = {str(r): s * 1e3 / n for r, (n, s) in sorted(by_rows.items())}
    return out


def write_terms(recipe_id: str, terms: dict, when: str) -> None:
    """Write the fitted terms into the engines (cpu lane: the recipe's engine and, with VRAM arms, the VRAM engine,
    which runs the same cpu lane; gpu/zerocopy lanes: the VRAM engine), the hardware record (NVMe latency table,
    gpu.h2d_gbps from the copy time) and the recipe's calibration block (validated; all of them or none)."""
    rec = spec.load_record("recipe", recipe_id)
    writes = []       # calibrate updates these records by design (force); all are staged, then renamed
    R0 = spec.resolve(recipe_id)
    record_bytes = R0.nvme_expert_bytes
    with_cpu = [e for e in rec["engines"] if "cpu" in spec.load_record("engine", e)["lanes"]]
    if not with_cpu:
        raise UserError(f"calibrate {recipe_id}: no engine of the recipe has a cpu lane to calibrate")
    src = f"moetier calibrate {when}: lanes fitted in situ from runtime counters ({recipe_id} fit arms)"
    device = {ln: terms[ln] for ln in ("gpu", "zerocopy") if ln in terms}
    tables = terms["nvme_latency_by_rows_qd_ms"]
    for eng_id in dict.fromkeys([with_cpu[-1]] + ([VRAM_ENGINE] if device else []) + list(tables)):
        eng = spec.load_record("engine", eng_id)
        for ln, vals in [("cpu", terms["cpu"])] + (list(device.items()) if eng_id == VRAM_ENGINE else []):
            if ln in eng["lanes"]:
                for c in spec.LANE_OPTIONAL:                    # one fitted by an earlier run must not outlive it
                    eng["lanes"][ln].pop(c, None)
                eng["lanes"][ln].update({k: round(v, 6) for k, v in vals.items()})
                eng["lanes"][ln]["expert_bytes"] = R0.expert_bytes   # the terms hold at this model's expert size
        eng.pop("head_per_read_ms", None)
        if eng_id == VRAM_ENGINE:
            eng.pop("copy_ms_by_rows", None)
            eng.pop("copy_record_bytes", None)
            if terms.get("copy_ms_by_rows"):
                eng["copy_ms_by_rows"] = {r: round(v, 6) for r, v in terms["copy_ms_by_rows"].items()}
                eng["copy_record_bytes"] = record_bytes
        if eng_id in terms.get("head_per_read_ms_by_engine", {}):
            eng["head_per_read_ms"] = round(terms["head_per_read_ms_by_engine"][eng_id], 6)
        if eng_id in tables:
            eng["nvme_latency_by_rows_qd_ms"] = tables[eng_id]
            eng["nvme_latency_record_bytes"] = record_bytes
            for field in CHANNEL_TERMS:
                eng.pop(field, None)          # a table from an earlier run must not outlive its own
                if terms.get(field, {}).get(eng_id):
                    eng[field] = terms[field][eng_id]
            eng["nvme_latency_note"] = (f"moetier calibrate {when}: mean submit-to-landed of the runtime's demand "
                                        f"reads by rows per step and demand queue depth, under this engine's load "
                                        f"(fit arms, measured steps); deeper queues: the hardware's idle-disk "
                                        f"figures. nvme_wake_ms_by_rows: mean delay from a read landing to the "
                                        f"blocked waiter resuming; nvme_latency_cv_shared/own_by_rows: latency sd / "
                                        f"mean, the part a layer's reads share and each read's own; "
                                        f"lane_lateness_sd_ms_by_rows: sd of the host reaching its first wait "
                                        f"beyond the plan's, from landing minus wait start; "
                                        f"nvme_latency_prefetch_factor_by_rows: latency of a demand read that found "
                                        f"a prefetch read in service, over the model's figure without one; "
                                        f"nvme_prefetch_ms_by_rows: started-to-landed of a prefetch read alone; "
                                        f"nvme_prefetch_share_ms_by_rows: how much longer per demand read beside it; "
                                        f"nvme_prefetch_sd_ms_by_rows: the sd of a prefetch read about those; "
                                        f"nvme_latency_by_rows_burst_pf_ms: the burst table of bursts issued "
                                        f"beside a prefetch read in service")
        eng["source"] = src
        writes.append(("engine", eng))
    rec["calibration"]["fixed_ms"] = terms["fixed_ms"]
    rec["calibration"]["host"] = {**{k: round(v, 6) for k, v in terms["host"].items()},
                                  "source": f"moetier calibrate {when}"}
    rec["calibration"]["source"] = f"moetier calibrate {when}: fixed_ms = measured step wall outside the layers"
    writes.append(("recipe", rec))
    hw = spec.load_record("hardware", rec["hardware"])
    hw_changed = False
    if terms.get("copy_ms") and hw.get("gpu"):
        hw["gpu"]["h2d_gbps"] = round(copy_gbps(record_bytes, terms["copy_ms"]), 4)
        hw["gpu"]["note"] = (f"h2d_gbps: moetier calibrate {when}: one record pushed or drained by the runtime "
                             f"(copy + stage time over copies, VRAM fit arms)")
        hw_changed = True
    if tables and hw["nvme"].pop("latency_by_rows_qd_ms", None) is not None:
        # the tables under load now live with the engines that produced the load
        hw["nvme"]["latency_note"] = "latency_by_qd_ms: moetier bench on an idle disk"
        hw_changed = True
    spec.write_records(writes + ([("hardware", hw)] if hw_changed else []), force=True)


def copy_gbps(record_bytes: int, copy_ms: float) -> float:
    """The link speed that moves one record in copy_ms."""
    return record_bytes / (copy_ms * 1e6)


def term_overrides(terms: dict, lanes=("cpu",)) -> list[str]:
    """The fitted terms as recipe overrides, so predictions use exactly them whether or not they were written.
    lanes: the arm's lanes that get fitted values (gpu/zerocopy only where its engine has them). A lane term whose
    absence means 0 and that the fit did not make is 0 here, not what an earlier calibration left in the engine
    record (run 26: a per_step_row_ms inherited that way; a record from before the wake-up term re-predicted on a
    registry with one)."""
    host = {k: round(v, 6) for k, v in terms["host"].items()}
    return ([f"lane_overrides.{ln}.{k}={round(v, 6)}" for ln in lanes if ln in terms
             for k, v in {**dict.fromkeys(spec.LANE_ZERO_IF_ABSENT, 0.0), **terms[ln]}.items()]
            + [f"calibration.host={json.dumps(host)}", f"calibration.fixed_ms={json.dumps(terms['fixed_ms'])}"])


def predict_and_compare(recipe_id, tr, arms, measured, steps, terms, plan_terms=None) -> list[dict]:
    """Predict every arm with the fitted ``terms``. The runtime planned on ``plan_terms`` (the plan pass's; None: the
    registry's): the simulator replays that plan on its own clock to deal every pick as the runtime did and times
    the deal on ``terms`` (sim.run's ``choose``), so that neither a cost that moved between the passes nor the
    fitted clock changes which lane computes what (2026-12-02 VM, pass drift +31%: vram102-C2 computed 11.4
    zerocopy picks per token, the simulator on the checked terms alone 6.8; run 37, dealing on plan_terms' costs
    but the fitted clock: 7.1 against 11.6)."""
    rows = []
    for a in arms:
        R = arm_recipe(recipe_id, a, terms)
        p = sim.run(R, tr, a["conc"], max_steps=steps, choose=arm_recipe(recipe_id, a, plan_terms))
        m = measured[a["name"]]
        c, tok = m["counters"], m["tokens"]
        meas_tok_s = m["tokens"] / m["wall_s"]          # the middle repeats (_merge)
        meas = {"cpu_moe": c["lane_cpu_s"], "gpu_moe": c["lane_gpu_s"] + c["lane_zc_s"],
                "nvme_stall": c["nvme_wait_s"] + c["stage_s"], "copy": c["copy_s"]}
        meas["host"] = m["wall_s"] - sum(meas.values())
        meas = {k: v * 1e3 / tok for k, v in meas.items()}
        pred = sim_buckets(R, p)
        ptok = p["tokens"] / p["steps"]
        # the host bucket split: timed host work (plan, bookkeeping, combine, prediction) against the simulator's
        # host terms, and the time outside every timer against its non-MoE fixed time
        timed = host_timed_s(c) * 1e3 / tok
        fixed = p["ms_fixed"] / ptok
        rows.append({"arm": a["name"], "conc": a["conc"], "fit": a["fit"], "set": a["set"],
                     "measured_tok_s": meas_tok_s, "measured_each": m["tok_s_each"],
                     "noise_pct": noise_pct(m["tok_s_each"]), "sim_tok_s": p["tok_s"],
                     "error_pct": (p["tok_s"] / meas_tok_s - 1) * 100,
                     "ms_per_token": {"measured": meas, "sim": pred},
                     "bucket_error_pct": bucket_errors(meas, pred),
                     "host_split": {"measured": {"timed": timed, "outside": meas["host"] - timed},
                                    "sim": {"terms": pred["host"] - fixed, "fixed": fixed}},
                     "reads_per_token": c["reads"] / tok, "sim_nvme_per_tok": p["nvme_per_tok"],
                     # expert computes per token by lane: the simulator replays the runtime's deal, so the two
                     # agree (a difference is a replay that parted from the run it predicts)
                     "lane_experts_per_token": {
                         "measured": {"gpu": c["gpu_experts"] / tok, "zerocopy": c["zc_experts"] / tok,
                                      "cpu": c["cpu_experts"] / tok},
                         "sim": {"gpu": p["gpu_experts_per_tok"] + p["nvme_gpu_per_tok"],
                                 "zerocopy": p["zerocopy_per_tok"],
                                 "cpu": p["cpu_experts_per_tok"] + p["nvme_cpu_per_tok"]}},
                     "read_ms": _distribution(m),
                     "read_coverage": {"measured": read_coverage(c), "sim": p["read_coverage"]},
                     # the merged repeats' own counters: a later fit can be re-run on the record
                     "measured_run": {"counters": c, "tokens": tok, "wall_s": m["wall_s"], "steps": m["steps"],
                                      "repeats_kept": m["repeats_kept"],
                                      # the device lanes' calls by shape (fit_device_terms' input)
                                      "call_groups": [g for g in m.get("call_groups", ()) if g[0] in ("gpu", "zc")]}})
    return rows


def sim_buckets(R, p) -> dict:
    """The simulator's per-token ms by bucket for a ``sim.run`` result ``p`` of recipe ``R``: lane busy net of the
    NVMe waits inside it, NVMe waits (with the push of an NVMe -> VRAM pick), admission/drain copies, and the rest
    (serial host time)."""
    ptok = p["tokens"] / p["steps"]
    wait, gwait = p["ms_nvme_wait"] / ptok, p["ms_nvme_wait_gpu"] / ptok
    pred = {"cpu_moe": p["ms_cpu_moe"] / ptok - (wait - gwait), "gpu_moe": p["ms_gpu_moe"] / ptok - gwait,
            "nvme_stall": wait, "copy": p["ms_copy"] / ptok}
    lanes_ms = (p["ms_cpu_moe"] + p["ms_gpu_moe"] if R.policy.get("overlap") is False else p["ms_cpu_moe"]) / ptok
    pred["host"] = p["ms_per_token"] - lanes_ms - pred["copy"]
    return pred


def bucket_errors(meas: dict, pred: dict) -> dict:
    """Predicted against measured per bucket, % (None for a bucket under 0.05 ms/token: nothing to compare)."""
    return {b: ((pred[b] / meas[b] - 1) * 100 if meas[b] > 0.05 else None) for b in BUCKETS}


def read_coverage(c) -> dict:
    """The runtime's read coverage (Runtime._wait_read) from its counters: layers whose NVMe picks were all demand
    reads issued then, the mean time from the first one's submit to the wait for it (the work it had to land in)
    and to its landing. The stall is a small difference of these two; set against the simulator's, they say
    which side of it a stall-bucket miss is on; ``gap_sd_ms`` is the spread of landing minus wait start (where
    every such layer's read has the reader's timestamps), what the wait for a given mean gap depends on."""
    n, nl = c.get("read_layers", 0), c.get("read_latency_n", 0)
    out = {"layers": n, "span_ms": c["read_span_s"] * 1e3 / n if n else None,
           "head_ms": c["read_head_s"] * 1e3 / n if n and "read_head_s" in c else None,
           "latency_ms": c["read_latency_s"] * 1e3 / nl if nl else None, "gap_sd_ms": None}
    if nl >= 2 and n == nl:          # gap = landing - wait start, per layer; its mean is latency - span
        mean = (c["read_latency_s"] - c["read_span_s"]) / n
        out["gap_sd_ms"] = math.sqrt(max(0.0, c.get("read_gap_sq", 0.0) / n - mean * mean)) * 1e3
    return out


def _distribution(m) -> dict:
    """The arm's demand-read latency by queue depth and its wake-ups as distributions (n, p50, mean, p90, ms): the
    evidence behind the channel model's means."""
    def d(v):
        return {"n": len(v), "p50": float(np.median(v)), "mean": float(np.mean(v)), "p90": float(np.percentile(v, 90))}
    out = {f"qd{q}": d(v) for q, v in sorted(m.get("latency_by_qd", {}).items()) if len(v) >= 8}
    if len(m.get("wake_ms", ())) >= 8:
        out["wake"] = d(m["wake_ms"])
    return out


def noise_pct(tok_s_each) -> float | None:
    """How far the measured figure itself is uncertain: twice the standard error (a ~95% half-width) of the
    repeats the figure pools (_merge: the middle ones), in percent of their mean; None with fewer than two. An
    arm's error cannot be told from a model error to better than this."""
    ranked = sorted(tok_s_each)
    kept = ranked[1:-1] if len(ranked) >= 3 else ranked
    if len(kept) < 2:
        return None
    return 200.0 * statistics.stdev(kept) / math.sqrt(len(kept)) / statistics.fmean(kept)


def summary(rows) -> dict:
    errs = [abs(r["error_pct"]) for r in rows]
    held = [abs(r["error_pct"]) for r in rows if not r["fit"]]
    # per-bucket check: buckets of at least 0.25 ms/token (smaller ones are within timer noise either way)
    checked = [(r["arm"], b, e) for r in rows for b, e in r["bucket_error_pct"].items()
               if e is not None and r["ms_per_token"]["measured"][b] >= 0.25]
    misses = [f"{a}:{b} {e:+.0f}%" for a, b, e in checked if abs(e) > 15]
    return {"median_abs_error_pct": statistics.median(errs), "max_abs_error_pct": max(errs),
            "held_out_max_abs_error_pct": max(held) if held else None, "arms": len(rows),
            "buckets_checked": len(checked), "buckets_within_15pct": len(checked) - len(misses),
            "bucket_misses": misses,
            # arms whose measurement alone is uncertain by more than half the max-error budget (10%): their error
            # says as much about the machine as about the model
            "noisy_arms": [f"{r['arm']} +-{r['noise_pct']:.0f}%" for r in rows
                           if r.get("noise_pct") is not None and r["noise_pct"] > NOISE_FLAG_PCT]}


def calibrate(recipe_id, st, tr, *, arms=None, steps=200, repeats=2, plan_repeats=None, backend="cpu",
              verify_rate=1.0, write=True, progress=None) -> dict:
    R = spec.resolve(recipe_id)
    notes = []
    if arms is None:
        why = sycl_available() if R.vram_slots == 0 else "the recipe has a VRAM tier of its own"
        if why:
            notes.append(f"no VRAM-tier arms: {why}")
        arms = default_arms(R, vram=why is None)
    def measure(which, terms, label, reps):
        runs: dict[str, list] = {a["name"]: [] for a in which}
        for rep in range(reps):                      # A B C ... A B C ...: drift cancels across arms
            for a in which:
                if progress:
                    progress(f"{label} rep {rep + 1}/{reps} {a['name']}")
                runs[a["name"]].append(_measure(recipe_id, st, tr, a, steps, backend, verify_rate, terms))
        return {k: _merge(v) for k, v in runs.items()}

    fit_arms = [a for a in arms if a["fit"]]
    cpu = R.lanes.get("cpu")
    def fit(measured, planned_on=None):
        terms = fit_terms(measured, fit_arms, cpu.workers if cpu else 1, cpu.parallel_min if cpu else 0,
                          R.hardware.get("nvme", {}).get("latency_by_qd_ms"))
        terms["lane_lateness_sd_ms_by_rows"] = fit_lane_lateness(recipe_id, tr, fit_arms, measured, steps, terms,
                                                                 planned_on=planned_on)
        return terms
    planned = measure(fit_arms, None, "plan", plan_repeats or max(1, repeats // 2))
    plan_terms = fit(planned)
    checked = measure(arms, plan_terms, "check", repeats)
    terms = fit(checked, plan_terms)
    when = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    if write:
        write_terms(recipe_id, terms, when)
    rows = predict_and_compare(recipe_id, tr, arms, checked, steps, terms, plan_terms)
    return {"when": when, "terms": terms, "plan_terms": plan_terms, "rows": rows,
            "summary": {**summary(rows), "pass_drift_pct": pass_drift(fit_arms, planned, checked)},
            "steps": steps, "repeats": repeats, "backend": backend, "notes": notes}


def pass_drift(fit_arms, first: dict, second: dict) -> float | None:
    """How much faster (+) the machine ran the fit arms in the checked pass than in the plan pass, in % (median over
    the arms whose plan cannot depend on the costs: one compute lane, no VRAM tier): the error a fit on one pass
    checked against the other would have carried, and why the terms come from the checked pass."""
    d = [(second[a["name"]]["tokens"] / second[a["name"]]["wall_s"])
         / (first[a["name"]]["tokens"] / first[a["name"]]["wall_s"]) - 1 for a in fit_arms if "backend" not in a]
    return statistics.median(d) * 100 if d else None
