"""Re-predict a calibration record from its stored counters, whole or with terms removed.

Contract
--------
``repredict(rec, strip=())`` runs the simulator on every arm of a calibration run record (registry/runs/
calibration-*.json) with the record's fitted terms and the lane deal its runtime made (the plan pass's terms), and
returns its rows and summary figures (``calibrate.summary``) - the figures the record holds, recomputed by
today's model. ``strip`` names terms (``TERMS``) removed first: the recipe then takes what it takes when the record
field is absent (a lane's or the host's term: its default, 0 or the hardware's figure; a channel table: the model
without it). ``ablate(rec)`` re-predicts the record with each term and each family of terms (``FAMILIES``) removed
and returns the change in the median, max and held-out |error|, the buckets within 15% and the bucket that moved
most, against the record's own pass-to-pass drift (the machine's speed between the plan and checked passes, a
floor under any change a term can be said to make). Run it with the registry the record was made with: the
record keeps the fitted terms, not the hardware record or the lanes' shapes.
"""
from __future__ import annotations

import dataclasses

from moetier.core import records as spec
from moetier.core import sim
from moetier.core.terms import CHANNEL_FIELDS
from moetier.errors import UserError
from moetier.measure import calibrate
from moetier.traces.format import load_trace

# a term -> what removing it removes: ("lane", lane, field), ("host", key) or ("engine", field)
TERMS: dict[str, list[tuple]] = {
    **{f"cpu.{f}": [("lane", "cpu", f)] for f in ("per_call_ms", "per_extra_token_ms", "per_read_ms",
                                                    "per_wake_ms", "per_after_wait_ms", "per_handoff_ms")},
    **{f"{ln}.{f}": [("lane", ln, f)] for ln in ("gpu", "zerocopy")
       for f in ("per_extra_token_ms", "per_read_ms", "per_read_busy_ms")},
    **{f"host.{k}": [("host", k)] for k in (*spec.HOST_TERMS, "head_per_layer_ms", "head_per_read_ms",
                                            "head_per_predict_ms", "head_per_predict_row_ms")},
    **{f: [("engine", f)] for f in ("nvme_latency_by_rows_qd_ms", *CHANNEL_FIELDS)},
}

FAMILIES: dict[str, list[str]] = {
    "cpu lane extras": ["cpu.per_read_ms", "cpu.per_wake_ms", "cpu.per_after_wait_ms", "cpu.per_handoff_ms"],
    "device lane reads": [f"{ln}.{f}" for ln in ("gpu", "zerocopy") for f in ("per_read_ms", "per_read_busy_ms")],
    # the host's time per read and the lane's wake-up after one stand in for each other
    "read overheads": ["host.per_read_ms", "nvme_wake_ms_by_rows"],
    "host head start": [t for t in TERMS if t.startswith("host.head_")],
    "host per-layer extras": ["host.per_nvme_layer_ms", "host.per_predict_row_ms", "host.per_copy_ms",
                              "host.per_zc_call_ms"],
    "read spread": ["nvme_latency_cv_shared_by_rows", "nvme_latency_cv_own_by_rows", "lane_lateness_sd_ms_by_rows"],
    "channel under load": ["nvme_latency_by_rows_qd_ms", *CHANNEL_FIELDS],
}

_LANE_DEFAULTS = {f.name: f.default for f in dataclasses.fields(spec.Lane)}


def _strip(R, terms):
    """Remove ``terms`` (names in TERMS) from the resolved recipe R, in place; returns R."""
    for name in terms:
        for op in TERMS[name]:
            if op[0] == "lane":
                if op[1] in R.lanes:
                    R.lanes[op[1]] = dataclasses.replace(R.lanes[op[1]], **{op[2]: _LANE_DEFAULTS[op[2]]})
            elif op[0] == "host":
                R.host.pop(op[1], None)
            else:
                R.engines = [{k: v for k, v in e.items() if k != op[1]} for e in R.engines]
    return R


def repredict(rec: dict, strip=(), terms: dict | None = None, redeal: bool = False) -> dict:
    """{"rows": [...], "summary": {...}}: the record ``rec`` re-predicted with ``terms`` (default: its own fitted
    terms) less ``strip``. The replay deals the picks to lanes as the runtime did, on the plan pass's terms; with
    ``redeal`` those lose ``strip`` too, as a runtime without the terms would have dealt them (a term that shapes
    the deal shows only then). Each row: arm, fit, the recorded and the new tok/s error, measured / recorded / new ms per
    token by bucket and the new bucket errors."""
    unknown = [t for t in strip if t not in TERMS]
    if unknown:
        raise UserError(f"ablate: unknown term {unknown[0]!r} (terms: {', '.join(TERMS)})")
    cal = rec.get("calibration")
    if not isinstance(cal, dict) or "rows" not in cal or "terms" not in cal:
        raise UserError(f"ablate: {rec.get('id', 'record')}: not a calibration run record (no calibration.rows / "
                        "calibration.terms)")
    terms = current_terms(terms or cal["terms"])
    plan_terms = current_terms(cal["plan_terms"]) if cal.get("plan_terms") else None
    recipe = rec["recipe"]
    R0 = spec.resolve(recipe)
    tr = load_trace(spec.REGISTRY.parent / R0.trace, layers=R0.layers, experts=R0.experts, topk=R0.topk)
    arms = {arm["name"]: arm for arm in calibrate.default_arms(R0, vram=True)}
    out_of_fit = set(calibrate.held_out([{**arms[r["arm"]], "fit": r["fit"]} for r in cal["rows"] if r["arm"] in arms]))
    rows = []
    for row in cal["rows"]:
        arm = arms.get(row["arm"])
        if arm is None:
            raise UserError(f"ablate: {rec.get('id')}: arm {row['arm']!r} is not in today's default matrix")
        Ra = _strip(calibrate.arm_recipe(recipe, arm, terms), strip)
        # the runtime planned on the plan pass's terms: a replay of them deals the picks as it did
        choose = calibrate.arm_recipe(recipe, arm, plan_terms) if plan_terms else None
        if choose is not None and redeal:
            choose = _strip(choose, strip)
        p = sim.run(Ra, tr, arm["conc"], max_steps=cal["steps"], choose=choose)
        meas, pred = row["ms_per_token"]["measured"], calibrate.sim_buckets(Ra, p)
        rows.append({"arm": row["arm"], "fit": row["fit"], "held_out": row["arm"] in out_of_fit,
                     "recorded_error_pct": row["error_pct"],
                     "error_pct": (p["tok_s"] / row["measured_tok_s"] - 1) * 100,
                     "ms_per_token": {"measured": meas, "sim": pred, "recorded_sim": row["ms_per_token"]["sim"]},
                     "bucket_error_pct": calibrate.bucket_errors(meas, pred),
                     "zerocopy_per_token": {"measured": row.get("lane_experts_per_token", {}).get("measured", {})
                                            .get("zerocopy"), "sim": p["zerocopy_per_tok"]}})
    return {"rows": rows, "summary": calibrate.summary(rows)}


def current_terms(terms: dict) -> dict:
    """A calibration record's terms without the fields of terms the model no longer has (records.REMOVED_FIELDS):
    a run record is a measurement, kept as it was made, and its counters re-predict with today's model; an engine
    or recipe record that still carries such a field is refused instead (what it would plan on is gone)."""
    gone = set(spec.REMOVED_FIELDS)
    return {k: ({f: x for f, x in v.items() if f not in gone} if k in ("cpu", "gpu", "zerocopy") else v)
            for k, v in terms.items() if k not in gone}


def _bucket_abs(rows) -> dict:
    return {(r["arm"], b): abs(e) for r in rows for b, e in r["bucket_error_pct"].items()
            if e is not None and r["ms_per_token"]["measured"][b] >= 0.25}


def change(base: dict, new: dict) -> dict:
    """What removing terms did to a re-prediction: the change in median / max / held-out |error| (points), the
    buckets within 15% before and after, and the bucket whose |error| grew most."""
    b, n = base["summary"], new["summary"]
    bb, nb = _bucket_abs(base["rows"]), _bucket_abs(new["rows"])
    worst = max(nb, key=lambda k: nb[k] - bb.get(k, 0.0), default=None)
    return {"median": n["median_abs_error_pct"] - b["median_abs_error_pct"],
            "max": n["max_abs_error_pct"] - b["max_abs_error_pct"],
            "held_out": (n["held_out_max_abs_error_pct"] or 0.0) - (b["held_out_max_abs_error_pct"] or 0.0),
            "buckets": (n["buckets_within_15pct"], n["buckets_checked"]),
            "worst_bucket": (f"{worst[0]}:{worst[1]}", nb[worst] - bb.get(worst, 0.0)) if worst else None}


def ablate(rec: dict, terms=None, progress=None, redeal: bool = False) -> dict:
    """The record re-predicted whole and with each term and family removed: {"base": summary, "drift": |pass
    drift| (points), "rows": [(name, members, change)]}. ``terms``: the names to try (default: every term the
    record fits, then every family); ``redeal``: see ``repredict``."""
    base = repredict(rec)
    fitted = present_terms(rec)
    names = terms or [*(t for t in TERMS if t in fitted), *FAMILIES]
    out = []
    for name in names:
        members = FAMILIES.get(name, [name])
        members = [m for m in members if m in fitted]
        if not members:
            continue
        if progress:
            progress(name)
        out.append((name, members, change(base, repredict(rec, members, redeal=redeal))))
    drift = rec["calibration"]["summary"].get("pass_drift_pct")
    return {"base": base["summary"], "drift": abs(drift) if drift is not None else 0.0, "rows": out}


def present_terms(rec: dict) -> set:
    """The TERMS a calibration record fitted (a non-empty, non-zero value in calibration.terms)."""
    t = rec["calibration"]["terms"]
    out = set()
    for name, ops in TERMS.items():
        op = ops[0]
        if op[0] == "lane":
            v = (t.get(op[1]) or {}).get(op[2])
        elif op[0] == "host":
            v = (t.get("host") or {}).get(op[1])
            if op[1] == "head_per_read_ms":
                v = v or t.get("head_per_read_ms_by_engine")
        else:
            v = t.get(op[1])
        if v:
            out.add(name)
    return out


def earns(change_: dict, drift: float) -> bool:
    """A term earns its place in a record when removing it worsens the median or the max |error| by more than the
    record's pass drift."""
    return change_["median"] > drift or change_["max"] > drift
