"""`moetier calibrate`: close the loop between the runtime and the simulator on this machine.

Contract
--------
``calibrate(recipe_id, store, trace, arms=None, repeats=2, ...)`` runs every arm (recipe overrides + concurrency)
with the real runtime ``repeats`` times, interleaved (A B C ... A B C ...) so drift cancels, then sets the simulator's cost terms *from the runtime's own
counters on the fit arms only*:

- cpu lane (engine record): ``moetier.bench.fit_cpu_lane`` on the runtime's calls split by how the backend ran them
  (inline: per_call + work; split over workers: per_layer + work / workers), after taking out the contention of
  reads landing during a call (hardware ``nvme.cpu_ms_per_read``, measured by `moetier bench`);
- host time per layer call (recipe ``calibration.host``): ``plan + bookkeeping + combine + prediction =
  per_layer * layer_calls + per_pick * picks + per_read * NVMe reads + per_predict * layers with a predictor``;
- non-MoE time per step (recipe ``calibration.fixed_ms``): measured step wall minus everything booked to layers,
  per concurrency (rows); concurrencies without a fit arm are interpolated by the simulator;
- NVMe queueing model (hardware ``nvme.latency_by_rows_qd_ms``): the p50 submit-to-landed time of the runtime's
  own demand reads (measured steps of the fit arms) by rows per step and the queue depth they joined - reads complete
  later while the lanes keep the cores busy (measured here: 0.78 ms at C1, 1.56 ms at C4 for one read, 0.43 ms on an
  idle disk); depths the runtime did not reach keep the `moetier bench` figures.

Then the simulator predicts every arm (held-out arms included) with the written records, and the error table
(predicted vs measured tok/s and per-token ms per bucket) goes to the terminal and into a run record.
"""
from __future__ import annotations

import datetime as _dt
import json
import statistics

import numpy as np

from moetier import runtime, sim, spec
from moetier.errors import UserError

BUCKETS = ("cpu_moe", "nvme_stall", "host")


def default_arms(R) -> list[dict]:
    """At least 8 configurations of a cpu-backend recipe: all-in-RAM, two NVMe-tail budgets, prefetch, mask,
    C1/C2/C4. ``fit`` arms set cost terms; the others are held out."""
    ram = float(R.raw["budget"]["ram_gb"])
    allram = round(R.keys * R.ram_expert_bytes / 1e9 * 1.05 + 0.01, 3)
    mid = round(ram * 0.8, 3)
    return [
        {"name": "allram-C1", "set": [f"budget.ram_gb={allram}"], "conc": 1, "fit": True},
        {"name": "allram-C4", "set": [f"budget.ram_gb={allram}"], "conc": 4, "fit": True},
        {"name": "tail-C1", "set": [], "conc": 1, "fit": True},
        {"name": "tail-C4", "set": [], "conc": 4, "fit": True},
        {"name": "tail-prefetch-C1", "set": ["policy.prefetch.depth=1", "policy.prefetch.predictor=transition"],
         "conc": 1, "fit": True},
        {"name": "allram-C2", "set": [f"budget.ram_gb={allram}"], "conc": 2, "fit": False},
        {"name": "tail-C2", "set": [], "conc": 2, "fit": False},
        {"name": f"tail{mid}g-C2", "set": [f"budget.ram_gb={mid}"], "conc": 2, "fit": False},
        {"name": "tail-prefetch-C2", "set": ["policy.prefetch.depth=1", "policy.prefetch.predictor=transition"],
         "conc": 2, "fit": False},
        {"name": "tail-mask-C1", "set": ["policy.exact=mask"], "conc": 1, "fit": False},
    ]


def _measure(recipe_id, st, tr, arm, steps, backend_name, verify_rate):
    from moetier.cli_runtime import _make_backend
    R = spec.resolve(recipe_id, arm["set"])
    be = _make_backend(backend_name, st, R, arm["conc"], verify_rate)
    try:
        res = runtime.run(R, st, be, tr, arm["conc"], max_steps=steps)
        reader = getattr(be, "reader", None)
        res["latency_by_qd"] = {q: list(v) for q, v in getattr(reader, "latency_by_qd", {}).items()}
        return res
    finally:
        be.close()


def _merge(runs):
    """Sum counters and walls of repeated runs of one arm."""
    c = {k: sum(r["counters"][k] for r in runs) for k in runs[0]["counters"]}
    lat: dict[int, list] = {}
    for r in runs:
        for q, v in r.get("latency_by_qd", {}).items():
            lat.setdefault(int(q), []).extend(v)
    return {"counters": c, "latency_by_qd": lat, "wall_s": sum(r["wall_s"] for r in runs),
            "tokens": sum(r["tokens"] for r in runs),
            "steps": sum(r["steps"] for r in runs), "tok_s_each": [r["tok_s"] for r in runs],
            "conc": runs[0]["conc"], "layer_calls": c["layer_calls"]}


def fit_terms(measured: dict, arms: list[dict], read_cpu: float = 0.0, workers: int = 1) -> dict:
    """Cost terms from the fit arms' runtime counters. read_cpu: core time per read the cpu lane loses (hardware
    record, `moetier bench`), taken out of the lane's measured time before fitting its own costs."""
    from moetier.bench import fit_cpu_lane, relative_lstsq
    fit = [a for a in arms if a["fit"]]
    lane_rows, Ah, yh = [], [], []
    step_fixed: dict[int, list] = {}
    for a in fit:
        m = measured[a["name"]]
        c = m["counters"]
        # the lane's own costs come from arms without prefetch: prefetch reads landing during a batch add contention
        # the lane model does not carry (the prefetch arm sets the host prediction term)
        for cls in (() if c["predict_layers"] else ("inline", "split")):
            lane_rows.append({"cls": cls, "calls": c[f"cpu_{cls}_calls"], "experts": c[f"cpu_{cls}_experts"],
                              "extra": c[f"cpu_{cls}_extra"], "ms": c[f"cpu_{cls}_s"] * 1e3,
                              "contended": c[f"cpu_{cls}_contended"]})
        Ah.append([c["layer_calls"], c["picks"], c["reads"], c["predict_layers"]])
        yh.append((c["plan_s"] + c["book_s"] + c["combine_s"] + c["predict_s"]) * 1e3)
        booked = (c["lane_cpu_s"] + c["lane_gpu_s"] + c["lane_zc_s"] + c["nvme_wait_s"] + c["copy_s"] + c["plan_s"]
                  + c["book_s"] + c["combine_s"] + c["predict_s"])
        step_fixed.setdefault(a["conc"], []).append(max(0.0, (m["wall_s"] - booked) * 1e3 / m["steps"]))
    if any(r[3] for r in Ah):
        hl, hp, hr, hpred = relative_lstsq(Ah, yh)
    else:                           # no fit arm predicts: the term is not identifiable
        (hl, hp, hr), hpred = relative_lstsq([r[:3] for r in Ah], yh), 0.0
    fixed = {str(k): round(statistics.mean(v), 4) for k, v in sorted(step_fixed.items())}
    lat: dict[int, dict] = {}                      # rows per step -> q -> samples
    for a in fit:
        for q, v in measured[a["name"]].get("latency_by_qd", {}).items():
            lat.setdefault(a["conc"], {}).setdefault(q, []).extend(v)
    latency = {str(r): {str(q): round(float(np.median(v)), 4) for q, v in sorted(tab.items()) if len(v) >= 8}
               for r, tab in sorted(lat.items())}
    return {"cpu": fit_cpu_lane(lane_rows, workers, read_cpu),
            "host": {"per_layer_ms": hl, "per_pick_ms": hp, "per_read_ms": hr, "per_predict_ms": hpred},
            "fixed_ms": fixed,
            "nvme_latency_by_rows_qd_ms": latency}


def write_terms(recipe_id: str, terms: dict, when: str) -> None:
    """Write the fitted terms into the recipe's engine (cpu lane) and calibration block (validated, atomic)."""
    rec = spec.load_record("recipe", recipe_id)
    with_cpu = [e for e in rec["engines"] if "cpu" in spec.load_record("engine", e)["lanes"]]
    if not with_cpu:
        raise UserError(f"calibrate {recipe_id}: no engine of the recipe has a cpu lane to calibrate")
    eng_id = with_cpu[-1]
    eng = spec.load_record("engine", eng_id)
    eng["lanes"]["cpu"].update({k: round(v, 6) for k, v in terms["cpu"].items()})
    eng["source"] = f"moetier calibrate {when}: cpu lane fitted in situ from runtime counters ({recipe_id} fit arms)"
    spec.write_record("engine", eng)
    rec["calibration"]["fixed_ms"] = terms["fixed_ms"]
    rec["calibration"]["host"] = {**{k: round(v, 6) for k, v in terms["host"].items()},
                                  "source": f"moetier calibrate {when}"}
    rec["calibration"]["source"] = f"moetier calibrate {when}: fixed_ms = measured step wall outside the layers"
    spec.write_record("recipe", rec)
    if any(terms["nvme_latency_by_rows_qd_ms"].values()):
        hw = spec.load_record("hardware", rec["hardware"])
        idle = hw["nvme"].get("latency_by_qd_ms") or {}
        # depths the runtime reached are measured under its load; deeper ones keep the idle-disk bench figures
        hw["nvme"]["latency_by_rows_qd_ms"] = {
            r: dict(sorted({**idle, **tab}.items(), key=lambda kv: int(kv[0])))
            for r, tab in terms["nvme_latency_by_rows_qd_ms"].items() if tab}
        hw["nvme"]["latency_note"] = (f"moetier calibrate {when}: latency_by_rows_qd_ms = p50 submit-to-landed of the "
                                      f"runtime's demand reads by rows per step and queue depth (fit arms, measured "
                                      f"steps); latency_by_qd_ms = moetier bench on an idle disk")
        spec.write_record("hardware", hw)



def term_overrides(terms: dict) -> list[str]:
    """The fitted terms as recipe overrides, so predictions use exactly them whether or not they were written."""
    host = {k: round(v, 6) for k, v in terms["host"].items()}
    return ([f"lane_overrides.cpu.{k}={round(v, 6)}" for k, v in terms["cpu"].items()]
            + [f"calibration.host={json.dumps(host)}", f"calibration.fixed_ms={json.dumps(terms['fixed_ms'])}"])


def predict_and_compare(recipe_id, tr, arms, measured, steps, terms) -> list[dict]:
    rows = []
    fitted = term_overrides(terms)
    for a in arms:
        R = spec.resolve(recipe_id, fitted + a["set"])
        p = sim.run(R, tr, a["conc"], max_steps=steps)
        m = measured[a["name"]]
        c, tok = m["counters"], m["tokens"]
        # the median over interleaved repeats: this VM's noise is heavy-tailed (a repeat can lose a scheduler slice
        # per layer); the cost fits above use the summed counters of all repeats
        meas_tok_s = statistics.median(m["tok_s_each"])
        meas = {"cpu_moe": c["lane_cpu_s"] * 1e3 / tok, "nvme_stall": c["nvme_wait_s"] * 1e3 / tok,
                "host": (m["wall_s"] - c["lane_cpu_s"] - c["nvme_wait_s"]) * 1e3 / tok}
        # the simulator's buckets per token: cpu lane busy net of NVMe waits, NVMe waits, serial host time
        ptok = p["tokens"] / p["steps"]
        pred_nvme = p["ms_nvme_wait"] / ptok
        pred = {"cpu_moe": p["ms_cpu_moe"] / ptok - pred_nvme, "nvme_stall": pred_nvme,
                "host": p["ms_per_token"] - p["ms_cpu_moe"] / ptok}
        rows.append({"arm": a["name"], "conc": a["conc"], "fit": a["fit"], "set": a["set"],
                     "measured_tok_s": meas_tok_s, "measured_each": m["tok_s_each"], "sim_tok_s": p["tok_s"],
                     "error_pct": (p["tok_s"] / meas_tok_s - 1) * 100,
                     "ms_per_token": {"measured": meas, "sim": pred},
                     "bucket_error_pct": {b: ((pred[b] / meas[b] - 1) * 100 if meas[b] > 0.05 else None)
                                          for b in BUCKETS},
                     "reads_per_token": c["reads"] / tok, "sim_nvme_per_tok": p["nvme_per_tok"]})
    return rows


def summary(rows) -> dict:
    errs = [abs(r["error_pct"]) for r in rows]
    held = [abs(r["error_pct"]) for r in rows if not r["fit"]]
    return {"median_abs_error_pct": statistics.median(errs), "max_abs_error_pct": max(errs),
            "held_out_max_abs_error_pct": max(held) if held else None, "arms": len(rows)}


def calibrate(recipe_id, st, tr, *, arms=None, steps=200, repeats=2, backend="cpu", verify_rate=1.0,
              write=True, progress=None) -> dict:
    R = spec.resolve(recipe_id)
    arms = arms or default_arms(R)
    runs: dict[str, list] = {a["name"]: [] for a in arms}
    for rep in range(repeats):                      # A B C ... A B C ...: drift cancels across arms
        for a in arms:
            if progress:
                progress(f"rep {rep + 1}/{repeats} {a['name']}")
            runs[a["name"]].append(_measure(recipe_id, st, tr, a, steps, backend, verify_rate))
    measured = {k: _merge(v) for k, v in runs.items()}
    when = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    from moetier.plan import _read_cpu
    cpu = R.lanes.get("cpu")
    terms = fit_terms(measured, arms, _read_cpu(R), cpu.workers if cpu else 1)
    if write:
        write_terms(recipe_id, terms, when)
    rows = predict_and_compare(recipe_id, tr, arms, measured, steps, terms)
    return {"when": when, "terms": terms, "rows": rows, "summary": summary(rows), "steps": steps,
            "repeats": repeats, "backend": backend}
