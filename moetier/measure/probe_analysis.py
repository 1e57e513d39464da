"""The probe report: utilization per phase (host samples against the hardware record's ceilings) and chokepoints
(the decode critical path, attributed from the runtime's cumulative counters).

Contract: ``report(probe_path, hardware, *, run_record)`` reads a probe file (moetier.measure.probe_file: gaps, a
truncated last line, bad lines, missing counters, a hardware record without ceilings and unknown record versions
are tolerated) and returns ``{"utilization": ..., "chokepoints": ...}``; what could not be computed is listed, with
the reason, under ``missing``. Every number in the result is finite (``json.dumps(..., allow_nan=False)`` holds).
Field reference and formulas: docs/utilization.md.
"""
from __future__ import annotations

from moetier.measure import probe_timeline as tl
from moetier.measure.probe_file import _finite, _num, _quantile, _r, quality, read_probe
from moetier.measure.probe_timeline import CUMULATIVE, LATER
from moetier.measure.sampler import VERSION
from moetier.errors import UserError

IDLE_FRAC_OF_CEILING = 0.05      # an interval below 5% of the ceiling counts as idle for that resource
DECODE_COVER = 0.5               # an interval is decode when runtime steps cover at least half of it
BUCKETS = ("fixed", "gpu_moe", "cpu_moe", "nvme_stall", "copy", "overhead")
# binding.resource_nearest_ceiling ignores these: busy-% readings that spinning workers or clocks inflate
NOT_NEAREST = ("cpu_cores_busy_pct", "gpu_util_pct", "gpu_power_w")


# ---------------------------------------------------------------------------------------------------------------
# utilization

def stats(values: list[float], ceiling: float | None) -> dict | None:
    vals = sorted(v for v in values if _finite(v))
    if not vals:
        return None
    mean = sum(vals) / len(vals)
    out = {"n": len(vals), "mean": _r(mean), "p50": _r(_quantile(vals, 0.5)), "p90": _r(_quantile(vals, 0.9)),
           "ceiling": _r(ceiling) if ceiling else None}
    if ceiling and ceiling > 0:
        out["pct_of_ceiling"] = {k: _r(100.0 * out[k] / ceiling, 2) for k in ("mean", "p50", "p90")}
        out["idle_frac"] = _r(sum(1 for v in vals if v < IDLE_FRAC_OF_CEILING * ceiling) / len(vals))
    return out


def _ceilings(hardware) -> tuple[dict, list[str]]:
    missing = []
    if hardware is None:
        return {}, ["hardware: no hardware record given or found: no ceilings, pct_of_ceiling omitted"]
    if not isinstance(hardware, dict):
        return {}, ["hardware: not a JSON object: no ceilings, pct_of_ceiling omitted"]
    c = hardware.get("ceilings")
    if not isinstance(c, dict):
        return {}, [f"hardware {hardware.get('id', '?')}: no ceilings section: pct_of_ceiling omitted"]
    good = {k: float(v) for k, v in c.items() if _finite(v) and v > 0}
    if not good:
        missing.append(f"hardware {hardware.get('id', '?')}: ceilings hold no positive numbers: "
                       "pct_of_ceiling omitted")
    return good, missing


def _resource_ceiling(name: str, ceil: dict) -> tuple[float | None, str | None]:
    """(ceiling, hardware key it came from); % resources have the fixed ceiling 100."""
    if name.endswith("_pct"):
        return 100.0, None
    keys = {"nvme_read_gbps": ("nvme_read_gbps", "nvme_measured_gbps"),
            "cpu_lane_weight_gbps": ("ddr_practical_gbps",), "ddr_derived_gbps": ("ddr_practical_gbps",),
            "pcie_h2d_gbps": ("pcie_nvml_sat_gbps", "pcie_h2d_gbps"),
            "pcie_d2h_gbps": ("pcie_nvml_sat_gbps", "pcie_d2h_gbps"),
            "gpu_power_w": ("gpu_power_w",)}.get(name)
    if keys is None:
        return None, None                 # no ceiling by design (ram_gib, rss_gib, vram_gib)
    for k in keys:
        if k in ceil:
            return ceil[k], k
    return None, keys[0]


def _nvme_disks(samples: list[dict]) -> list[str]:
    names = set()
    for s in samples:
        if isinstance(s.get("disk"), dict):
            names.update(s["disk"])
    md = sorted(n for n in names if n.startswith("md"))
    return md or sorted(names)


def _sample_values(s: dict, dt: float, disks: list[str]) -> tuple[dict, list | None]:
    """The host resources of one sample: (values by resource name, per-core busy fractions or None)."""
    v: dict = {}
    cpu = s.get("cpu")
    per_core = None
    if isinstance(cpu, list) and cpu and all(_finite(x) for x in cpu):
        per_core = [min(1.0, max(0.0, float(x))) for x in cpu]
        v["cpu_cores_busy_pct"] = 100.0 * sum(per_core) / len(per_core)
    disk = s.get("disk")
    if isinstance(disk, dict) and disks:
        reads = [disk.get(d) for d in disks]
        reads = [max(0.0, float(x[0])) for x in reads if isinstance(x, list) and x and _finite(x[0])]
        if reads:
            v["nvme_read_gbps"] = sum(reads) / dt / 1e9
    if _finite(s.get("mem_used")):
        v["ram_gib"] = float(s["mem_used"]) / 2 ** 30
    if _finite(s.get("rss")):
        v["rss_gib"] = float(s["rss"]) / 2 ** 30
    g = s.get("gpu")
    if isinstance(g, dict):
        for src, dst, f in (("util", "gpu_util_pct", 1.0), ("mem_busy", "vram_busy_pct", 1.0),
                            ("pcie_rx_kbs", "pcie_h2d_gbps", 1024 / 1e9),
                            ("pcie_tx_kbs", "pcie_d2h_gbps", 1024 / 1e9),
                            ("power_mw", "gpu_power_w", 1e-3), ("vram_used", "vram_gib", 1 / 2 ** 30)):
            if _finite(g.get(src)):
                v[dst] = float(g[src]) * f
    return v, per_core


def _runtime_values(v: dict, cum, t0: float, t1: float, dt: float, with_bytes: bool) -> None:
    """Add the runtime-derived resources of [t0, t1] to ``v``: the cpu lane's duty and weight bandwidth."""
    lane = cum.value("lane_cpu_s", t1) - cum.value("lane_cpu_s", t0)
    v["cpu_lane_duty_pct"] = min(100.0, max(0.0, 100.0 * lane / dt))
    if with_bytes:
        wb = cum.value("cpu_bytes", t1) - cum.value("cpu_bytes", t0)
        v["cpu_lane_weight_gbps"] = max(0.0, wb) / dt / 1e9
        v["ddr_derived_gbps"] = v["cpu_lane_weight_gbps"] + v.get("nvme_read_gbps", 0.0) + \
            v.get("pcie_h2d_gbps", 0.0) + v.get("pcie_d2h_gbps", 0.0)


def _intervals(P: dict) -> list[dict]:
    """One interval per sample: [t - dt, t] with its resource values."""
    out = []
    cum = tl.Cum(P["counters"]) if P["counters"] else None
    spans = tl.step_spans(P["counters"])
    starts = [a for a, _ in spans]
    disks = _nvme_disks(P["samples"])
    with_bytes = any("cpu_bytes" in c for c in P["counters"])
    for s in P["samples"]:
        dt = _num(s.get("dt"))
        if dt is None or dt <= 0:
            continue
        t1 = s["t"]
        t0 = t1 - dt
        v, per_core = _sample_values(s, dt, disks)
        kind = "unknown"
        if cum is not None:
            kind = "decode" if tl.covered(spans, starts, t0, t1) / dt >= DECODE_COVER else "idle"
            _runtime_values(v, cum, t0, t1, dt, with_bytes)
        out.append({"t0": t0, "t1": t1, "dt": dt, "kind": kind, "values": v, "per_core": per_core})
    return out


def _utilization_kind(ivs: list[dict], cpus: list, ceil: dict, missing: set) -> dict | None:
    if not ivs:
        return None
    names = sorted({k for iv in ivs for k in iv["values"]})
    res = {}
    for n in names:
        c, key = _resource_ceiling(n, ceil)
        if c is None and key is not None and ceil:
            missing.add(f"{n}: hardware.ceilings.{key} not given: pct_of_ceiling omitted")
        st = stats([iv["values"][n] for iv in ivs if n in iv["values"]], c)
        if st is not None:
            res[n] = st
    cores = [iv["per_core"] for iv in ivs if iv["per_core"] is not None]
    per_core = None
    if cores:
        width = min(len(x) for x in cores)
        labels = [str(c) for c in cpus[:width]] if cpus and len(cpus) >= width else [str(i) for i in range(width)]
        per_core = {labels[i]: _r(100.0 * sum(x[i] for x in cores) / len(cores), 2) for i in range(width)}
    return {"active_s": _r(sum(iv["dt"] for iv in ivs), 3), "intervals": len(ivs), "resources": res,
            "per_core_busy_pct": per_core}


# ---------------------------------------------------------------------------------------------------------------
# chokepoints (decode critical-path attribution from the runtime's cumulative counters)

def _attribution(steps: list[dict], excluded: int, fields_missing: list[str], run_ms: float | None) -> dict:
    n = len(steps)
    tokens = sum(s["tokens"] for s in steps)
    wall = sum(s["wall"] for s in steps)
    tot = {k: sum(s[k] for s in steps) for k in CUMULATIVE + LATER}
    tot["copy_s"] += tot["stage_s"]          # NVMe -> VRAM pushes are copies too
    raw = {"gpu_moe": tot["lane_gpu_s"] + tot["lane_zc_s"], "cpu_moe": tot["lane_cpu_s"],
           "nvme_stall": tot["nvme_wait_s"], "copy": tot["copy_s"],
           "overhead": tot["plan_s"] + tot["book_s"] + tot["combine_s"]}
    attributed = sum(raw.values())
    overlap = max(0.0, attributed - wall)
    if overlap > 0:
        # a timer that encloses another (bookkeeping around the NVMe waits it triggers) counts twice: take the
        # excess out of overhead first, then scale the rest so the six buckets still sum to the wall
        take = min(overlap, raw["overhead"])
        raw["overhead"] -= take
        rest = overlap - take
        if rest > 0:
            s = sum(raw.values())
            f = wall / s if s > 0 else 0.0
            raw = {k: v * f for k, v in raw.items()}
    raw["fixed"] = max(0.0, wall - sum(raw.values()))
    per_tok = (lambda x: 1000.0 * x / tokens) if tokens > 0 else (lambda x: 0.0)
    ms = {k: _r(per_tok(raw[k])) for k in BUCKETS}
    wall_ms = per_tok(wall)
    share = {k: _r(raw[k] / wall) if wall > 0 else 0.0 for k in BUCKETS}
    binding = max(BUCKETS, key=lambda k: raw[k]) if wall > 0 else None
    lc = tot["layer_calls"]
    per_layer = (lambda x: _r(1000.0 * x / lc)) if lc > 0 else (lambda x: None)
    out = {
        "steps": n, "tokens": _r(tokens, 3), "tokens_per_step": _r(tokens / n, 3) if n else None,
        "layer_calls": int(lc), "wall_ms_per_token": _r(wall_ms),
        "tok_s_from_wall": _r(1000.0 / wall_ms, 3) if wall_ms > 0 else None,
        "per_token_ms": ms, "share": share, "binding": binding,
        "moe_stage_ms_per_token": _r(sum(per_tok(raw[k]) for k in ("gpu_moe", "cpu_moe", "nvme_stall", "copy"))),
        "detail_ms_per_token": {"plan": _r(per_tok(tot["plan_s"])), "bookkeeping": _r(per_tok(tot["book_s"])),
                                "combine": _r(per_tok(tot["combine_s"])), "gpu_lane": _r(per_tok(tot["lane_gpu_s"])),
                                "zerocopy_lane": _r(per_tok(tot["lane_zc_s"])),
                                "cpu_lane": _r(per_tok(tot["lane_cpu_s"])),
                                "nvme_wait": _r(per_tok(tot["nvme_wait_s"])), "copy": _r(per_tok(tot["copy_s"])),
                                "overlap_removed": _r(per_tok(overlap))},
        "per_layer_ms": {"wall": per_layer(wall), "gpu_lane": per_layer(tot["lane_gpu_s"] + tot["lane_zc_s"]),
                         "cpu_lane": per_layer(tot["lane_cpu_s"]), "copy": per_layer(tot["copy_s"]),
                         "nvme_wait": per_layer(tot["nvme_wait_s"]),
                         "overhead": per_layer(tot["plan_s"] + tot["book_s"] + tot["combine_s"])},
        "per_step": {k: _r(tot[k] / n, 3) if n else None for k in ("reads", "masked", "picks", "layer_calls")},
        "lane_last": "not measured (the runtime runs its lanes one after another and records no lane end times)",
        "slack_ms_per_layer": "not measured (needs per-lane end timestamps; the runtime's lanes do not overlap)",
        "quality": {"steps_excluded": excluded, "overlap_ms_per_token": _r(per_tok(overlap)),
                    "fields_missing": fields_missing},
    }
    if run_ms is not None:
        out["run_record_ms_per_token"] = _r(run_ms)
    return out


# ---------------------------------------------------------------------------------------------------------------
# report

def _header_interval(P: dict, missing: set) -> float:
    """The nominal sampling interval (the header's, else the samples' median), noting header problems."""
    hdr = P["header"]
    if hdr is None:
        missing.add("probe header: absent (file cut at the start or not written by moetier probe): "
                    "interval taken from the samples")
    elif hdr.get("version") != VERSION:
        missing.add(f"probe header: version {hdr.get('version')!r} is not {VERSION}: fields read as version {VERSION}")
    if hdr is not None and hdr.get("gpu") is None:
        missing.add(f"gpu: {hdr.get('gpu_note') or 'no GPU sampled'}")
    interval = _num((hdr or {}).get("interval_s"))
    if hdr is not None and (interval is None or interval <= 0):
        missing.add(f"probe header: interval_s {hdr.get('interval_s')!r} is not a positive number: interval taken "
                    "from the samples")
    if interval is None or interval <= 0:
        dts = sorted(_num(s.get("dt"), 0.0) for s in P["samples"] if _num(s.get("dt"), 0.0) > 0)
        interval = _quantile(dts, 0.5) if dts else 0.1
    return interval


def _checked_run_record(run_record, missing: set):
    """The run record, or None when it is not an object; notes the fields it lacks for the cross-check."""
    if run_record is None:
        return None
    if not isinstance(run_record, dict):
        missing.add("run record: not a JSON object: ignored")
        return None
    runs = run_record.get("measured_runs", [])
    if not isinstance(runs, list) or not all(isinstance(r, dict) for r in runs):
        raise UserError(f"run record {run_record.get('id')!r}: $.measured_runs: expected a list of run objects, got "
                        f"{type(runs).__name__}" + (" holding other values" if isinstance(runs, list) else ""))
    for f in ("measured_runs", "recipe"):
        if f not in run_record:
            missing.add(f"run record: no {f!r} (older or other schema): not cross-checked")
    return run_record


def _run_ms(run_record) -> dict:
    """conc -> the run record's measured ms per token."""
    out = {}
    for r in (run_record or {}).get("measured_runs") or []:
        if isinstance(r, dict) and _finite(r.get("ms_per_token")) and r.get("conc") is not None:
            out[r["conc"]] = float(r["ms_per_token"])
    return out


def _note_absent(P: dict, missing: set) -> list[str]:
    """Note what the probe file lacks; returns the counter fields absent or not numbers."""
    if not P["samples"]:
        missing.add("samples: none in the probe file: utilization empty")
    if not P["counters"]:
        missing.add("counters: none in the probe file (sampled without `moetier run --probe`): decode "
                    "classification and chokepoints not available")
    if not any("cpu_bytes" in c for c in P["counters"]):
        missing.add("cpu_lane_weight_gbps, ddr_derived_gbps: the runtime's counters carry no cpu_bytes")
    fields = sorted({k for c in P["counters"] for k in CUMULATIVE + ("step_wall_s", "tokens")
                     if not _finite(c.get(k))})
    if fields:
        missing.add(f"counters: fields {', '.join(fields)} absent or not numbers: taken as 0")
    return fields


def _phase_utilization(ivs: list[dict], a: float, b: float, cpus: list, ceil: dict, missing: set) -> dict:
    mine = [iv for iv in ivs if a <= 0.5 * (iv["t0"] + iv["t1"]) < b]
    tot_dt = sum(iv["dt"] for iv in mine)
    split = {k: _r(sum(iv["dt"] for iv in mine if iv["kind"] == k) / tot_dt) if tot_dt > 0 else 0.0
             for k in ("decode", "prefill", "mixed", "idle", "unknown")}
    dec = [iv for iv in mine if iv["kind"] == "decode"]
    ph = {"window_s": _r(max(0.0, b - a), 3), "decode": _utilization_kind(dec, cpus, ceil, missing),
          "prefill": None, "time_split": split}
    if not dec:
        ph["all"] = _utilization_kind(mine, cpus, ceil, missing)
    return ph


def _nearest_ceiling(ph: dict):
    dres = (ph["decode"] or {}).get("resources", {})
    cands = [(v["pct_of_ceiling"]["mean"], k) for k, v in dres.items()
             if k not in NOT_NEAREST and "pct_of_ceiling" in v and _finite(v["pct_of_ceiling"]["mean"])]
    if not cands:
        return "not measured (no decode resource with a ceiling)"
    pct, res = max(cands)
    return {"resource": res, "pct_mean": pct}


def _phase_chokepoints(P: dict, steps: list, excluded_t: list, a: float, b: float, fields_missing: list,
                       run_ms: dict, ph: dict) -> dict:
    st = [s for s in steps if a < s["t"] <= b]
    meas = [s for s in st if s["measured"]]
    use = meas or st
    if not P["counters"]:
        return {"decode": None, "reason": "no counters lines in the probe file", "prefill": None, "binding": None}
    if not use:
        return {"decode": None, "reason": "no runtime steps in this phase window", "prefill": None, "binding": None}
    concs = {s["conc"] for s in use}
    rms = run_ms.get(next(iter(concs))) if len(concs) == 1 else None
    excluded = sum(1 for t in excluded_t if a < t <= b)
    att = _attribution(use, excluded, fields_missing, rms)
    if st and not meas:
        att["quality"]["note"] = "no measured steps in this phase: warm-up steps attributed"
    return {"decode": att, "prefill": None, "binding": {
        "critical_path": att["binding"], "critical_share": att["share"].get(att["binding"]) if att["binding"]
        else None, "lane_last": "not measured", "resource_nearest_ceiling": _nearest_ceiling(ph)}}


def report(probe_path, hardware: dict | None = None, *, run_record: dict | None = None) -> dict:
    """{"utilization": ..., "chokepoints": ...} for a probe file (see docs/utilization.md)."""
    P = read_probe(probe_path)
    missing: set[str] = set()
    interval = _header_interval(P, missing)
    ceil, m = _ceilings(hardware)
    missing.update(m)
    run_record = _checked_run_record(run_record, missing)
    fields_missing = _note_absent(P, missing)
    times = [s["t"] for s in P["samples"]] + [c["t"] for c in P["counters"]] + [m_["t"] for m_ in P["marks"]]
    t_lo, t_hi = (min(times), max(times)) if times else (0.0, 0.0)
    ivs = _intervals(P)
    hdr = P["header"] or {}
    cpus = hdr.get("cpus") if isinstance(hdr.get("cpus"), list) else []
    steps, excluded_t = tl.steps(P["counters"]) if P["counters"] else ([], [])
    run_ms = _run_ms(run_record)
    U, C = {}, {}
    for name, a, b in tl.phases(P["marks"], t_lo - 1e-9, t_hi + 1e-9):
        U[name] = _phase_utilization(ivs, a, b, cpus, ceil, missing)
        C[name] = _phase_chokepoints(P, steps, excluded_t, a, b, fields_missing, run_ms, U[name])
    q = quality(P, interval)
    miss = sorted(missing)
    util = {"method": {"source": "moetier probe: psutil host sampler + the runtime's per-step counters",
                       "interval_s": _r(interval, 4),
                       "classification": f"an interval is decode when runtime steps cover >= {DECODE_COVER:.0%} "
                                         "of it, else idle; unknown without counters; prefill/mixed not produced",
                       "stats": "per interval, unweighted; linear-interpolated p50/p90; idle_frac = share of "
                                f"intervals below {IDLE_FRAC_OF_CEILING:.0%} of the ceiling",
                       "doc": "docs/utilization.md"},
            "phases": U, "quality": q, "missing": miss}
    choke = {"phases": C, "quality": q, "missing": [m_ for m_ in miss if m_.startswith(("counters", "run record"))]}
    if not P["counters"]:
        choke = None
        util["chokepoints_reason"] = "no counters lines in the probe file"
    return {"utilization": util, "chokepoints": choke}
