"""The fits of `moetier calibrate`: the simulator's cost terms from the fit arms' runtime counters.

Contract
--------
``fit_terms(measured, arms, workers, parallel_min, idle_latency)`` returns the terms (``calibration.terms`` of a
calibration run record) from ``measured`` = {arm name: merged repeats (moetier.measure.calibrate._merge)}; each
fit below is a pure function of counters and may be re-run on a stored record (moetier.measure.ablate). The NVMe
channel's fits are moetier.measure.fit_nvme's.

The fits, from the fit arms' runtime counters:
   - cpu lane (engine record): ``moetier.measure.bench.fit_cpu_lane`` on the runtime's calls split by how the lane
     ran them (inline: per_call + work; split over workers: per_layer + the work of its longest share), work in cold-expert
     equivalents under the host cache model (hardware ``cpu.reuse_curve``, `moetier bench`; moetier.core.llc), plus
     ``per_read_ms`` per NVMe read of the layer (the reader's CPU work and the cache it streams through);
   - gpu / zerocopy lanes (the VRAM engine's record): per call = per_layer + per_expert x experts + per_extra_token
     x extra rows, over the runtime's calls grouped by shape (``fit_device_terms``);
   - one record copy (push or drain) -> hardware ``gpu.h2d_gbps``;
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
     (``moetier.core.arrivals.finish``);
   - the host's head start (recipe ``calibration.host.head_per_*_ms``): the host work between a layer's first NVMe
     submit and its first wait, less the lane and copy time in it (``fit_head``); the planner puts it before the
     first wait, in the reads' time, instead of after the lanes;
   - the host's lateness to that wait (engine ``lane_lateness_sd_ms_by_rows``): the measured spread of landing minus
     wait start beyond the simulator's own for the same arm (``fit_lane_lateness``, the only fit that runs the
     simulator); the planner adds it to the reads' spread in ``arrivals.finish_extra``.
"""
from __future__ import annotations

import statistics

from moetier.core import records as spec
from moetier.measure.fit_nvme import fit_channel

MIN_CALLS = 5          # device-lane call shapes seen fewer times are too noisy to fit on


def fit_terms(measured: dict, arms: list[dict], workers: int = 1, parallel_min: int = 0,
              idle_latency: dict | None = None) -> dict:
    """Cost terms from the fit arms' runtime counters. The cpu lane's cost per NVMe read of the layer
    (``per_read_ms``) is fitted with its other costs: the bench's reader CPU time per core (0.14 ms here) left out
    what a read does to the cache the lane computes from (uncontended calls of one shape cost ~20% more in a tail
    arm than in an all-in-RAM one). workers and parallel_min (how the lane splits a batch,
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
    """One arm's cpu-lane calls as moetier.measure.bench.fit_cpu_lane's rows, one per call class (aggregates over its
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
    one issue loop and one wait loop (a term per read alone put tail0.8g-C2, with more reads per such layer than
    any fit arm, 25-47% over). A term no fit arm exercises (no
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
    is 0, and so is the per-row part without predicting arms at two concurrencies. The runtime's span can be
    0.2-0.9 ms longer than the resident lanes'; one per-predict term fitted on C1 and C4 put tail-prefetch-C4's
    head at 0.37 ms against 0.57 measured (its stall +53%); one per-read term for both engines put the SYCL arms'
    head at 0.05-0.08 ms against 0.07-0.16 (their stall
    +14-23%)."""
    from moetier.measure.bench import relative_lstsq
    engines = list(engines) if engines is not None else [None] * len(counters)
    data = [(e, c) for e, c in zip(engines, counters) if c.get("read_layers") and c.get("read_head_s")]
    if not data:
        return {}
    engs = list(dict.fromkeys(e for e, _ in data))
    rows = _head_rows(data, engs)
    n = len(engs)
    jp, jr = 1 + n, 2 + n
    used = _head_columns(rows, n)
    if len(rows) < len(used):         # fewer arms than terms: the mean per read layer
        return {"head_per_layer_ms": sum(r[-1] for r in rows) / sum(r[0] for r in rows)}
    coef = dict(zip(used, relative_lstsq([[r[j] for j in used] for r in rows], [r[-1] for r in rows])))
    by_engine = {e: coef.get(1 + i, 0.0) for i, e in enumerate(engs)}
    main = max(engs, key=[e for e, _ in data].count)
    return {"head_per_layer_ms": coef.get(0, 0.0), "head_per_read_ms": by_engine[main],
            "head_per_predict_ms": coef.get(jp, 0.0), "head_per_predict_row_ms": coef.get(jr, 0.0),
            **({"head_per_read_ms_by_engine": by_engine} if engs != [None] else {})}


def _head_rows(data, engs) -> list[tuple]:
    """fit_head's rows, one per arm: per read layer, per read on each engine, per predicting layer, per row it
    predicts for; the head's ms last."""
    return [(c["read_layers"], *(c.get("read_reads", 0) if e == x else 0 for x in engs), c.get("read_predict", 0),
             c.get("read_predict_rows", 0), c.get("read_head_s", 0.0) * 1e3) for e, c in data]


def _head_columns(rows, n: int) -> list[int]:
    """The columns of fit_head's rows a fit can tell apart (``n`` engines): the per-layer and per-read ones, the
    per-predict one where an arm predicts, the per-row one where predicting arms have two rows per layer."""
    jp, jr = 1 + n, 2 + n
    # rows per predicting layer: the per-row part is identifiable only beside the per-layer one at two values
    per_row = len({r[jr] / r[jp] for r in rows if r[jp]}) > 1
    return [j for j in range(jr + 1) if j <= n or (j == jp and any(r[jp] for r in rows)) or (j == jr and per_row)]


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
    zerocopy call on the SYCL CPU device (0.008-0.059 ms a call; without it vram102-C2's host bucket came out
    -22%, its outside time being twice all-in-RAM C2's). Model: ms = fixed[conc] + u x reads
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
    per_read_busy if any is, fitted over the runtime's calls grouped by shape. On the SYCL CPU device a one-expert
    gpu call took 0.25 ms with no read in flight, 0.29 with one, 0.30 with two - the lanes share the cores with the
    reader. What a read in flight costs does not grow with the reads (a one-expert gpu call 0.33 ms with none, 0.46
    with one, 0.36 with two): with per_read_busy beside per_read the fit puts it all in per_read_busy, and the gpu
    calls with reads in flight come within 10% (a calibration record's ``rows[].measured_run.call_groups``)."""
    groups: dict[str, dict] = {}
    for m in fit_runs:
        for p, e, x, r, n, sec in m.get("call_groups", ()):
            if p not in ("gpu", "zc"):
                continue
            g = groups.setdefault(p, {}).setdefault((e, x, r), [0, 0.0])
            g[0] += n
            g[1] += sec * 1e3
    out = {{"gpu": "gpu", "zc": "zerocopy"}[p]: _device_lane(shapes) for p, shapes in sorted(groups.items())}
    out.update(_copy_terms(fit_runs))
    return out


_DEVICE_TERMS = ("per_layer_ms", "per_expert_ms", "per_extra_token_ms", "per_read_ms", "per_read_busy_ms")


def _device_rows(shapes: dict) -> list[tuple]:
    """A device lane's calls {(experts, extra rows, reads in flight): [calls, ms]} as fit rows (experts, extra rows,
    reads, whether a read was in flight; calls; mean ms), one per shape seen at least MIN_CALLS times; the rarer
    ones pooled into one row (their mean counts; the model is linear, so it holds for the pool): at C4 most gpu
    calls have a shape of their own."""
    rows = [(e, x, r, float(r > 0), n, ms / n) for (e, x, r), (n, ms) in sorted(shapes.items()) if n >= MIN_CALLS]
    rare = [(e, x, r, float(r > 0), n, ms) for (e, x, r), (n, ms) in shapes.items() if n < MIN_CALLS]
    if rare:
        n = sum(v[4] for v in rare)
        e, x, r, busy = (sum(v[j] * v[4] for v in rare) / n for j in range(4))
        rows.append((e, x, r, busy, n, sum(v[5] for v in rare) / n))
    return rows


def _device_lane(shapes: dict) -> dict:
    """One device lane's terms from its calls by shape: relative least squares on the per-shape means, residuals
    weighted by sqrt(calls) (a shape seen thrice does not pull the fit as hard as one seen a thousand times).
    Every term is returned, 0 where not identifiable: as recipe overrides (calibrate.term_overrides) they must
    replace what an earlier calibration left in the engine record, or the runtime plans on a term the fit never
    made."""
    from moetier.measure.bench import relative_lstsq
    rows = _device_rows(shapes)
    cols = [0, 1, 2, 3, 4]
    if len({row[0] for row in rows}) < 2:
        # one expert count (e.g. the zerocopy lane's single-expert calls): launch and expert cost are one number;
        # it is booked per expert so batches of several experts are not charged one launch each
        cols.remove(0)
    # extra rows, reads in flight, a read in flight at all: a term with one value is not identifiable
    for j in (2, 3, 4):
        if len({row[j - 1] for row in rows}) < 2:
            cols.remove(j)
    coef = relative_lstsq([[(1.0, *row[:4])[j] for j in cols] for row in rows], [row[5] for row in rows],
                          [row[4] ** 0.5 for row in rows])
    full = dict(zip(cols, coef))
    return {_DEVICE_TERMS[j]: full.get(j, 0.0) for j in range(5)}


def _copy_terms(fit_runs) -> dict:
    """The time of one record copy (push or drain: copy + stage time over copies), pooled over the fit arms, as
    ``copy_ms`` (the link's: hardware gpu.h2d_gbps). {} without copies."""
    n = sec = 0.0
    for m in fit_runs:
        c = m["counters"]
        if c.get("copies", 0):
            n += c["copies"]
            sec += c["copy_s"] + c["stage_s"]
    return {"copy_ms": sec * 1e3 / n} if n else {}
