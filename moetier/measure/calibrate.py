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

The fits are moetier.measure.fit's (lanes, host, non-MoE time, device) and moetier.measure.fit_nvme's (the NVMe
channel); moetier.measure.write writes them into the records. ``fit_lane_lateness``, the one fit that runs the
simulator, is here.

The simulator then predicts every arm and the error table (predicted vs measured tok/s and per-token ms per bucket:
cpu_moe, gpu_moe, nvme_stall, copy, host) goes to the terminal and into a run record.
"""
from __future__ import annotations

import datetime as _dt
import json
import math
import statistics

import numpy as np

from moetier.core import records as spec
from moetier.core import sim
from moetier.core.terms import CHANNEL_FIELDS
from moetier.measure.fit import fit_terms, host_timed_s
from moetier.measure.write import copy_gbps, write_terms
from moetier.run import runtime

BUCKETS = ("cpu_moe", "gpu_moe", "nvme_stall", "copy", "host")
# a VRAM tier on this machine: the SYCL backend's device slots (on the OpenCL CPU device, the same cores), whose
# engine runs its lanes and copies one after another (policy.overlap false)
VRAM_ENGINE = "sycl-opencl-cpu"
NOISE_FLAG_PCT = 5.0   # summary.noisy_arms: measured figures uncertain by more than this (2 standard errors)


def vram_arms(R, slots: int | None = None) -> list[dict]:
    """Arms with a VRAM tier (SYCL device slots) on top of the recipe's RAM budget and NVMe tail."""
    slots = slots or max(8, R.keys // 10)
    # the arms fit the copy terms, which only admissions cost: VRAM admits (CLOCK, the ledger's default) whatever
    # the recipe's policy says (vram_admit "auto" keeps a small VRAM tier static)
    vram = [f'engines=["{VRAM_ENGINE}"]', f"budget.vram_expert_slots={slots}", "policy.overlap=false",
            "policy.vram_admit=true", 'policy.vram_evict="clock"']
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
    The tail is fitted at C2 too: read latency under load is not linear in rows (e.g. a mean at depth 1 of 1.33 ms
    at C1, 2.03 at C2, 2.90 at C4), and the simulator's rule between C1 and C4 (terms._at_rows, in the layer's
    expected distinct experts) is a model of that shape, not a measurement of it. So is all-in-RAM: the cpu lane's
    split call is not linear in its batch (e.g. 0.68 / 1.13 / 1.76 ms per call at C1 / C2 / C4, where a fit on C1
    and C4 put C2 13% short). The arms not fitted check what the fits do not see: a tighter budget (0.8 x the
    tail's: a deeper NVMe tail than any fit arm has), prefetch at C2, mask, a VRAM tier at C2; of those, the ones
    no fit arm covers at their concurrency and budget are held out (``held_out``)."""
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


# `moetier calibrate --quick`: the fit arms without a VRAM tier (quick_arms), each run warmed up on 16 tokens; one plan
# repeat and four checked ones of 60 steps. Four, not two: _merge drops the fastest and the slowest, so one repeat
# caught in a slow minute of a shared host does not reach the fit (docs/fidelity.md, "A quick calibration").
QUICK = {"steps": 60, "repeats": 4, "plan_repeats": 1, "warmup_tokens": 16}


def quick_arms(R, warmup_tokens: int | None = QUICK["warmup_tokens"]) -> list[dict]:
    """The arms of `moetier calibrate --quick`: the fit arms of ``default_arms`` without the VRAM tier. Each kept term
    is still identified: the cpu lane's calls by class at C1 / C2 / C4 (all-in-RAM and tail), the NVMe tables and
    bursts at rows 1 / 2 / 4 (tail), the host's per-layer, per-pick and per-read terms (all-in-RAM against tail at
    one concurrency) and its prediction terms at two concurrencies (tail-prefetch C1 and C4). What goes: the VRAM
    tier's lanes and copies (a SYCL device on these cores), and the checked arms (the fidelity benchmark checks
    every arm, benchmarks/bench_fidelity.py).

    ``warmup_tokens`` (None: the recipe's) replaces the recipe's warm-up in every arm: each run replays its warm-up
    before its measured steps, and the recipe's 64 tokens were more than half of a quick run's steps. The warm-up
    only seeds the tiers and the predictor; the costs the fits take (per call, per pick, per read) do not depend
    on it, and the simulator checks each arm with the same warm-up (the override is in the arm's ``set``)."""
    warm = [f"policy.warmup_tokens={warmup_tokens}"] if warmup_tokens is not None and \
        int(R.policy.get("warmup_tokens", 1000)) > warmup_tokens else []
    return [{**a, "set": a["set"] + warm} for a in default_arms(R, vram=False) if a["fit"]]


def arm_recipe(recipe_id: str, arm: dict, terms: dict | None = None):
    """The arm's recipe; with ``terms``, the fitted terms apply (lanes the arm's engines have, host, fixed, link)."""
    if not terms:
        return spec.resolve(recipe_id, arm["set"])
    lanes = spec.resolve(recipe_id, arm["set"]).lanes        # the arm's engines decide which lanes get terms
    R = spec.resolve(recipe_id, term_overrides(terms, tuple(lanes)) + arm["set"])
    if terms.get("copy_ms"):
        R.h2d_gbps = copy_gbps(R.nvme_expert_bytes, terms["copy_ms"])
    eng = R.engines[-1]["id"]
    head = terms.get("head_per_read_ms_by_engine", {}).get(eng)
    if head is not None:          # the fitted figure, not one an earlier calibration left in the engine record
        R.host["head_per_read_ms"] = head
    tab = terms.get("nvme_latency_by_rows_qd_ms", {}).get(eng)
    if tab:
        per_rows = {f: terms.get(f, {}).get(eng, {}) for f in CHANNEL_FIELDS}
        R.engines = [*R.engines[:-1], {**R.engines[-1], "nvme_latency_by_rows_qd_ms": tab, **per_rows,
                                       "nvme_latency_record_bytes": R.nvme_expert_bytes}]
    return R


def _measure(recipe_id, st, tr, arm, steps, backend_name, verify_rate, terms=None):
    R = arm_recipe(recipe_id, arm, terms)
    be = runtime.make_backend(arm.get("backend", backend_name), st, R, arm["conc"], verify_rate)
    try:
        res = runtime.run(R, st, be, tr, arm["conc"], max_steps=steps)
        timing = be.read_timing()       # the contract's read-timing samples of the measured steps
        res["latency_by_qd"] = {q: list(v) for q, v in timing.get("latency_by_qd", {}).items()}
        res["wake_ms"] = list(timing.get("wake_ms", ()))
        res["burst_ms"] = list(timing.get("burst_ms", ()))
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
            "call_groups": [[*k, n, sec] for k, (n, sec) in sorted(groups.items())],
            "tokens": sum(r["tokens"] for r in kept), "steps": sum(r["steps"] for r in kept),
            "tok_s_each": [r["tok_s"] for r in runs], "repeats_kept": len(kept), "conc": first["conc"],
            "engine": first.get("engine")}


def fit_lane_lateness(recipe_id, tr, fit_arms, measured, steps, terms, min_layers: int = 50,
                      planned_on: dict | None = None) -> dict:
    """The host's lateness to its first wait (engine ``lane_lateness_sd_ms_by_rows``, ms): per fit arm, the
    variance of the measured gap (landing minus wait start, ``read_coverage``) beyond the simulator's own for that
    arm with ``terms`` (the plan's spread over layers and the reads' modeled lateness), pooled by engine and rows
    over the read layers. The reads' spread alone can give a third of what the runtime's waits imply (e.g. at
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


def term_overrides(terms: dict, lanes=("cpu",)) -> list[str]:
    """The fitted terms as recipe overrides, so predictions use exactly them whether or not they were written.
    lanes: the arm's lanes that get fitted values (gpu/zerocopy only where its engine has them). A lane term whose
    absence means 0 and that the fit did not make is 0 here, not what an earlier calibration left in the engine
    record (a per_wake_ms inherited that way, or a record from before a term re-predicted on a registry with one,
    would plan on a term the fit never made)."""
    host = {k: round(v, 6) for k, v in terms["host"].items()}
    return ([f"lane_overrides.{ln}.{k}={round(v, 6)}" for ln in lanes if ln in terms
             for k, v in {**dict.fromkeys(spec.LANE_ZERO_IF_ABSENT, 0.0), **terms[ln]}.items()]
            + [f"calibration.host={json.dumps(host)}", f"calibration.fixed_ms={json.dumps(terms['fixed_ms'])}"])


def predict_and_compare(recipe_id, tr, arms, measured, steps, terms, plan_terms=None) -> list[dict]:
    """Predict every arm with the fitted ``terms``. The runtime planned on ``plan_terms`` (the plan pass's; None: the
    registry's): the simulator replays that plan on its own clock to deal every pick as the runtime did and times
    the deal on ``terms`` (sim.run's ``choose``), so that neither a cost that moved between the passes nor the
    fitted clock changes which lane computes what (with a pass drift of +31%, the simulator on the checked terms
    alone dealt vram102-C2 60% of the runtime's zerocopy picks)."""
    rows = []
    out_of_fit = set(held_out(arms))
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
        rows.append({"arm": a["name"], "conc": a["conc"], "fit": a["fit"], "held_out": a["name"] in out_of_fit,
                     "set": a["set"],
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


def held_out(arms) -> list[str]:
    """The arms no fit arm covers: none shares its concurrency and its budget (RAM GB, VRAM slots, engines), so
    every per-rows table it takes is interpolated or no fit arm ran its tiers. An arm not fitted that shares both
    with a fit arm (the same budget at the same concurrency with another policy: prefetch, mask) is not held out:
    the tables it uses were fitted on that arm's reads. In the default matrix: the VRAM tier at C2 and the tighter
    RAM budget at C2."""
    def key(a):
        return a["conc"], tuple(sorted(x for x in a["set"] if x.startswith(("budget.", "engines="))))
    covered = {key(a) for a in arms if a["fit"]}
    return [a["name"] for a in arms if not a["fit"] and key(a) not in covered]


def summary(rows) -> dict:
    """The figures a calibration is read by: median and max |tok/s error| over every arm and the max over the
    held-out ones (a row's ``held_out``, else not ``fit``), the buckets within 15%, the noisy arms."""
    errs = [abs(r["error_pct"]) for r in rows]
    held = [abs(r["error_pct"]) for r in rows if r.get("held_out", not r["fit"])]
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
              verify_rate=1.0, write=True, suffix="", progress=None) -> dict:
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
                    progress(f"{label} rep {rep + 1}/{reps} {a['name']}", stages)
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
    plan_reps = plan_repeats or max(1, repeats // 2)
    stages = len(fit_arms) * plan_reps + len(arms) * repeats + 1      # every measured pass, then the fit
    planned = measure(fit_arms, None, "plan", plan_reps)
    plan_terms = fit(planned)
    checked = measure(arms, plan_terms, "check", repeats)
    if progress:
        progress("fit and predict", stages)
    terms = fit(checked, plan_terms)
    when = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    written = write_terms(recipe_id, terms, when, VRAM_ENGINE, suffix) if write else []
    rows = predict_and_compare(recipe_id, tr, arms, checked, steps, terms, plan_terms)
    return {"when": when, "terms": terms, "plan_terms": plan_terms, "rows": rows,
            "summary": {**summary(rows), "pass_drift_pct": pass_drift(fit_arms, planned, checked)},
            "steps": steps, "repeats": repeats, "backend": backend, "notes": notes,
            "written": [{"kind": k, "id": i, "path": str(p)} for k, i, p in written]}


def pass_drift(fit_arms, first: dict, second: dict) -> float | None:
    """How much faster (+) the machine ran the fit arms in the checked pass than in the plan pass, in % (median over
    the arms whose plan cannot depend on the costs: one compute lane, no VRAM tier): the error a fit on one pass
    checked against the other would have carried, and why the terms come from the checked pass."""
    d = [(second[a["name"]]["tokens"] / second[a["name"]]["wall_s"])
         / (first[a["name"]]["tokens"] / first[a["name"]]["wall_s"]) - 1 for a in fit_arms if "backend" not in a]
    return statistics.median(d) * 100 if d else None
