"""The NVMe channel's fits: latency tables, bursts, wake-up, spread and prefetch service from the runtime's reads.

Contract
--------
``fit_channel(fit_runs, idle_latency)`` returns {field: {engine: {rows: ...}}} for the engine record fields
moetier.core.terms reads (``nvme_latency_by_rows_qd_ms`` and ``CHANNEL_FIELDS``), from the fit arms' merged
reads (submit-to-landed by queue depth, by burst and position, wake-ups). Pure functions of the samples; fewer
than 8 samples make no entry.
"""
from __future__ import annotations

import numpy as np

from moetier.core.terms import CHANNEL_FIELDS


def fit_channel(fit_runs: list[dict], idle_latency: dict | None = None) -> dict:
    """The NVMe channel's terms per engine from the fit arms' reads, as {field: {engine: {rows: ...}}}:
    ``nvme_latency_by_rows_qd_ms`` (mean submit-to-landed by rows per step and the demand queue depth a read joined),
    ``nvme_latency_by_rows_burst_ms`` (the same by burst size and position: the reads of a burst land together,
    ``burst_means``), ``nvme_wake_ms_by_rows`` (mean wake-up: landed to the blocked waiter resuming), and the
    latency's spread as sd / mean about those means, split into the part the reads of one burst (a layer's) share and
    each read's own (``nvme_latency_cv_shared_by_rows``, ``nvme_latency_cv_own_by_rows``; ``spread_split``,
    moetier.core.arrivals.finish). The reader keeps the demand reads that found a prefetch read in service out of
    these samples (the model gives them the plain latency: a term for them did not earn its place). Means, not medians:
    the planner adds them into stalls, and the median of a right-skewed latency understates their sum. The spread
    matters as much: a lane expects to wait E[max(0, arrival - free)], far more than the wait for a mean arrival that
    is about when the lane gets free (e.g. a layer's first read 0.70 ms against 0.03 for its mean; its reads'
    latencies correlate 0.78 within a layer). Depths the runtime reached are measured under its load; deeper ones keep
    the idle-disk bench figures. Fewer than 8 samples make no entry."""
    lat, wake, bursts = _pool(fit_runs)
    idle = {int(q): float(v) for q, v in (idle_latency or {}).items()}
    out = {f: {} for f in ("nvme_latency_by_rows_qd_ms", *CHANNEL_FIELDS)}
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
        per: dict[str, dict] = {}
        for r in sorted(by_rows):
            for field, v in _rows_terms(bursts.get(eng, {}).get(r, ()), means[r]).items():
                per.setdefault(field, {})[str(r)] = v
        for field, tab in per.items():
            out[field][eng] = tab
    return out


def _pool(fit_runs) -> tuple[dict, ...]:
    """The fit arms' reads pooled by engine and rows per step: latencies by queue depth ({q: [ms]}), wake-ups
    ([ms]) and burst reads ([(run, burst, q, ms)], one run per fit arm and repeat, so the runs' bursts stay
    apart)."""
    lat: dict = {}
    wake: dict = {}
    bursts: dict = {}
    for i, m in enumerate(fit_runs):
        eng, rows = m.get("engine"), m["conc"]
        for q, v in m.get("latency_by_qd", {}).items():
            lat.setdefault(eng, {}).setdefault(rows, {}).setdefault(int(q), []).extend(v)
        wake.setdefault(eng, {}).setdefault(rows, []).extend(m.get("wake_ms", ()))
        bursts.setdefault(eng, {}).setdefault(rows, []).extend(((i, rep), b, q, ms)
                                                                for rep, b, q, ms in m.get("burst_ms", ()))
    return lat, wake, bursts


def _rows_terms(samples, mean_by_q: dict) -> dict:
    """The channel terms of one engine at one rows per step, {field: value}, the unmeasured ones left out."""
    out = {}
    by_burst = burst_means(samples)
    if by_burst:
        out["nvme_latency_by_rows_burst_ms"] = {str(n): {str(q): round(v, 4) for q, v in row.items()}
                                                for n, row in sorted(by_burst.items())}
    split = spread_split(samples, mean_by_q, by_burst)
    if split is not None:
        out["nvme_latency_cv_shared_by_rows"], out["nvme_latency_cv_own_by_rows"] = (round(x, 4) for x in split)
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
