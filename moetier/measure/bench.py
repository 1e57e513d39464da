"""`moetier bench`: measure this machine like a vendor sheet and write hardware + engine records.

Contract: ``measure(store, ...)`` returns a dict of measured figures; ``records(...)`` turns them into a hardware
record (memory read bandwidth, O_DIRECT bandwidth at QD1 / QD16 for the store's record size, read latency, ceilings)
and an engine record (cpu lane per_layer / per_expert / per_extra_token, fitted by least squares over a grid of
experts x rows), plus the host cache: its size (sysfs) and the cpu lane's reuse curve (``reuse_curve``: the cost of
an expert against the bytes streamed since its last use, moetier.core.llc). Both are validated and written atomically by
spec.write_record; the simulator and the runtime then use them through the recipe."""
from __future__ import annotations

import os
import platform
import random
import time
from itertools import combinations

import numpy as np

from moetier.core.records import deal
from moetier.bytes.transport import Reader, SlotPool


def drop_cache(path: str) -> None:
    """Evict a file from the page cache (written pages are flushed first, so they can be dropped too)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def read_bandwidth(st, qd: int, nrec: int, seed: int = 0) -> dict:
    """O_DIRECT reads of nrec random records at queue depth qd; GB/s and per-read latency (ms)."""
    keys = random.Random(seed).sample(range(st.nrecords), min(nrec, st.nrecords))
    pool = SlotPool(min(len(keys), max(qd * 2, 1)), st.record_bytes)
    rd = Reader(st, pool, queue_depth=qd, verify_rate=0.0)
    drop_cache(st.data_path)
    lat = []
    try:
        t0 = time.perf_counter()
        inflight = []
        free = list(range(pool.n))
        for k in keys:
            if not free:
                h = inflight.pop(0)
                rd.wait(h)
                lat.append(h.read_ms)
                free.append(h.slot)
            inflight.append(rd.fill(k, free.pop()))
        for h in inflight:
            rd.wait(h)
            lat.append(h.read_ms)
        dt = time.perf_counter() - t0
        direct = rd.direct
    finally:
        rd.close()
        pool.close()
    return {"qd": qd, "records": len(keys), "gbps": len(keys) * st.record_bytes / dt / 1e9,
            "latency_ms_p50": float(np.percentile(lat, 50)), "latency_ms_p90": float(np.percentile(lat, 90)),
            "direct": direct}


def read_cpu_ms(st, nrec: int = 256, qd: int = 16) -> float:
    """Process CPU time per O_DIRECT read with checksum verification (syscall, page pinning, virtio, xxh3): the core
    time a read takes away from the cpu lane."""
    keys = random.Random(5).sample(range(st.nrecords), min(nrec, st.nrecords))
    pool = SlotPool(qd, st.record_bytes)
    rd = Reader(st, pool, queue_depth=qd, verify_rate=1.0)
    drop_cache(st.data_path)
    try:
        c0 = time.process_time()
        for b in range(0, len(keys), qd):
            for h in [rd.fill(k, j) for j, k in enumerate(keys[b:b + qd])]:
                rd.wait(h)
        return (time.process_time() - c0) * 1e3 / len(keys)
    finally:
        rd.close()
        pool.close()


def best_seconds(fn, repeats: int) -> float:
    """Best wall time of ``repeats`` calls of fn (the benchmarks' noise filter on a shared machine)."""
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def relative_lstsq(A, y, weights=None) -> list[float]:
    """Non-negative least squares on relative residuals (each row weighs the same whatever its size, times
    ``weights`` when given).

    Costs cannot be negative, and clipping a negative coefficient of the unconstrained fit at 0 leaves the others
    fitted for the value it was clipped from. So every subset of columns is fitted and the best one whose
    coefficients are all >= 0 wins: exact for the few columns these fits have (at most 6), where scipy's nnls would
    be a new dependency for 2^6 small solves."""
    A, y = np.asarray(A, float), np.asarray(y, float)
    w = 1.0 / np.maximum(y, 1e-9)
    if weights is not None:
        w = w * np.asarray(weights, float)
    Aw, yw = A * w[:, None], y * w
    n = A.shape[1]
    best, best_res = np.zeros(n), float(yw @ yw)
    for k in range(n, 0, -1):
        for cols in combinations(range(n), k):
            c, *_ = np.linalg.lstsq(Aw[:, cols], yw, rcond=None)
            if (c < 0).any():
                continue
            r = yw - Aw[:, cols] @ c
            res = float(r @ r)
            if res < best_res - 1e-12 * max(1.0, best_res):
                best, best_res = np.zeros(n), res
                best[list(cols)] = c
    return [float(v) for v in best]


def fit_cpu_lane(rows, workers: int, read_cpu: float | None = 0.0) -> dict:
    """Fit the cpu lane's costs from timed calls, split by how the backend ran them.

    rows: {"cls": "inline" | "split", "calls", "experts", "extra", "ms", "contended", "cold", "crit_cold",
    "crit_extra", "wake", "waited"} (aggregates or single calls). Model (spec.Lane.cost): inline call = per_call +
    work, + ``per_after_wait`` where the host blocked on the pick's read right before it (``waited``: such calls;
    fitted where a row has any); split call = per_layer + the work of its longest share (the batch is dealt out
    strided over ``workers`` threads: ``crit_*``, else cold / workers and extra / workers) + ``per_wake`` per unit
    of its worker's idle (``wake``, summed spec.idle_wake; fitted where a row has any) + ``per_handoff`` for each
    call that ends with a worker's share (``handoff``: spec.hands_off; fitted where some split calls do and some do
    not), with work = per_expert *
    cold + per_extra_token * extra_rows (one-thread costs; ``cold``: the experts in cold-expert equivalents under
    the host cache model, moetier.core.llc - the expert count without one), plus ``per_read`` for each NVMe read of the
    layer (``contended``).
    The longest share, not the mean: a batch of 7 runs 4 experts on one thread of two. ``read_cpu``: a known per_read
    (the bench's reader CPU time per core, taken out first); None: per_read is fitted too and returned as
    ``per_read_ms`` - the in-situ cost, which also carries what a read does to the cache. Non-negative relative
    least squares (every row weighs the same).
    """
    A, y = [], []
    # with no read during any call, per_read is not identifiable: left out (the planner keeps the hardware figure)
    fit_read = read_cpu is None and any(r.get("contended", 0) for r in rows if r["calls"])
    fit_wake = any(r.get("wake", 0.0) for r in rows if r["calls"])
    # the hand-off is identifiable only beside split calls that end with the caller's share (odd batches over two)
    fit_handoff = any(r.get("handoff", 0) for r in rows if r["calls"]) and \
        any(r["cls"] == "split" and r["calls"] > r.get("handoff", r["calls"]) for r in rows)
    fit_waited = any(r.get("waited", 0) for r in rows if r["calls"])
    read_cpu = read_cpu or 0.0
    for r in rows:
        if not r["calls"]:
            continue
        e, n = r.get("cold", r["experts"]), r.get("contended", 0)
        if r["cls"] == "inline":
            a = [r["calls"], 0.0, e, r["extra"]]
        else:
            a = [0.0, r["calls"], r.get("crit_cold", e / workers), r.get("crit_extra", r["extra"] / workers)]
        A.append(a + ([n] if fit_read else []) + ([r.get("wake", 0.0)] if fit_wake else [])
                 + ([r.get("waited", 0)] if fit_waited else [])
                 + ([r.get("handoff", 0) if r["cls"] == "split" else 0] if fit_handoff else []))
        y.append(max(1e-6, r["ms"] - (0.0 if fit_read else read_cpu * n)))
    coef = relative_lstsq(A, y)
    out = dict(zip(("per_call_ms", "per_layer_ms", "per_expert_ms", "per_extra_token_ms"), coef))
    if fit_read:
        out["per_read_ms"] = coef[4]
    if fit_wake:
        out["per_wake_ms"] = coef[4 + fit_read]
    if fit_waited:
        out["per_after_wait_ms"] = coef[4 + fit_read + fit_wake]
    if fit_handoff:
        out["per_handoff_ms"] = coef[-1]
    return out


def cpu_lane_costs(st, *, experts=(1, 2, 4, 8, 16), rows=(1, 2, 4, 8), repeats=7) -> dict:
    """Time the cpu backend's compute() exactly as the runtime calls it over a grid (n experts, m rows) and fit
    fit_cpu_lane; also reports weight bytes/s of the largest one-row batch."""
    from backends.cpu.backend import CpuBackend
    lay = st.layout
    nslots = min(st.nrecords, max(experts) * 8)
    be = CpuBackend(st, ram_slots=nslots, verify_rate=1.0)
    try:
        for i in range(nslots):
            be.wait(be.fill(i, i))
        rng = np.random.default_rng(0)
        samples = []
        rot = 0
        pmin = max(2, be.parallel_min)
        for n in experts:
            for m in rows:
                x = rng.standard_normal((m, lay.hidden)).astype(np.float32)
                times = []
                for _ in range(repeats):
                    jobs = [(j, (rot + j) % nslots, list(range(m))) for j in range(n)]  # rotate: weights from DRAM
                    rot += n
                    t0 = time.perf_counter()
                    be.compute("cpu", jobs, x)
                    times.append((time.perf_counter() - t0) * 1e3)
                share = len(deal(range(n), be.workers)[0])       # the calling thread's share: the longest
                samples.append({"cls": "inline" if n < pmin else "split", "calls": 1, "experts": n,
                                "extra": n * (m - 1), "ms": float(np.median(times)), "rows": m,
                                "crit_cold": share, "crit_extra": share * (m - 1)})
        fit = fit_cpu_lane(samples, be.workers)
        one = [s["ms"] for s in samples if s["rows"] == 1 and s["experts"] == max(experts)][0]
        gbps = max(experts) * lay.weight_bytes / (one / 1e3) / 1e9
        shape = {"workers": be.workers, "parallel_min": be.parallel_min}
    finally:
        be.close()
    return {**fit, **shape, "weight_gbps_1row": gbps, "samples": samples, "encoding": lay.encoding}


def llc_bytes() -> int:
    """Size of the host's last-level cache from sysfs (0 where it is not reported)."""
    best = (0, 0)
    base = "/sys/devices/system/cpu/cpu0/cache"
    try:
        entries = os.listdir(base)
    except OSError:
        return 0
    for e in entries:
        try:
            with open(f"{base}/{e}/level") as f:
                level = int(f.read())
            with open(f"{base}/{e}/size") as f:
                txt = f.read().strip()
        except (OSError, ValueError):
            continue
        mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(txt[-1:], 1)
        try:
            size = int(txt.rstrip("KMG")) * mult
        except ValueError:
            continue
        best = max(best, (level, size))
    return best[1]


def reuse_curve(st, *, max_bytes: int | None = None, rounds: int = 6, calls: int = 24) -> dict:
    """The cpu lane's cost of one expert against the bytes streamed since it was last computed (moetier.core.llc), as a
    factor of a cold expert's. cpu calls cycle over working sets of growing size (the reuse distance of a cyclic
    walk is its working set); an expert's cost is the difference between calls of 3b and b experts over 2b, so the
    per-call overhead drops out. The working sets are interleaved, ``rounds`` times, each after one untimed cycle
    that sets the cache up for it: a sweep measured one size after another read this VM's drift as a curve. A
    farther reuse cannot be cheaper, so the costs are made non-decreasing (``monotone``, which also pools the noise
    of the plateau); cold is the largest working set's. Returns {"curve": {bytes: factor}, "samples": [...],
    "cold_per_expert_ms", "batch"}."""
    from backends.cpu.backend import CpuBackend
    import psutil
    rb = st.record_bytes
    cap = max_bytes if max_bytes is not None else psutil.virtual_memory().available // 3
    nmax = int(min(st.nrecords, max(16, cap // rb)))
    be = CpuBackend(st, ram_slots=nmax, verify_rate=0.0)
    try:
        for i in range(nmax):
            be.wait(be.fill(i, i))
        b1 = max(4, int(be.parallel_min), 2 * int(be.workers))     # a split call, like the runtime's batches
        b2 = 3 * b1
        sizes = sorted({n for n in (24, 32, 48, 64, 96, 128, 160, 192, 256, 384, 512, 768, 1024, 2048)
                        if b2 <= n <= nmax} | {max(b2, nmax)})
        x = np.random.default_rng(1).standard_normal((1, st.layout.hidden)).astype(np.float32)
        times = {(n, b): [] for n in sizes for b in (b1, b2)}
        for _ in range(rounds):
            for n in sizes:
                for b in (b1, b2):
                    rot = 0
                    cycle = max(1, n // b)
                    for i in range(cycle + max(cycle, calls)):      # first cycle untimed
                        jobs = [(j, (rot + j) % n, [0]) for j in range(b)]
                        rot += b
                        t0 = time.perf_counter()
                        be.compute("cpu", jobs, x)
                        if i >= cycle:
                            times[(n, b)].append((time.perf_counter() - t0) * 1e3)
    finally:
        be.close()
    samples = []
    for n in sizes:
        t1, t2 = float(np.median(times[(n, b1)])), float(np.median(times[(n, b2)]))
        samples.append({"records": n, "bytes": n * rb, "call_ms": {str(b1): t1, str(b2): t2},
                        "per_expert_ms": max(1e-6, (t2 - t1) / (b2 - b1))})
    fitted = monotone([s["per_expert_ms"] for s in samples])
    cold = fitted[-1]
    curve = {str(s["bytes"]): round(max(0.05, f / cold), 4) for s, f in zip(samples, fitted)}
    return {"curve": curve, "samples": samples, "cold_per_expert_ms": cold, "batch": [b1, b2]}


def monotone(y) -> list[float]:
    """The non-decreasing sequence closest to y in least squares (pool adjacent violators)."""
    blocks: list[list[float]] = []                   # [mean, count]
    for v in y:
        blocks.append([float(v), 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            (m1, n1), (m2, n2) = blocks[-2], blocks.pop()
            blocks[-1] = [(m1 * n1 + m2 * n2) / (n1 + n2), n1 + n2]
    return [m for m, n in blocks for _ in range(n)]


STAGES = ("memory bandwidth", "NVMe reads QD1-16", "cpu lane costs", "cache reuse curve", "CPU time per read")


def measure(st, *, nrec: int = 256, progress=None) -> dict:
    """The machine sheet; ``progress(stage)`` is called before each of STAGES."""
    from backends.cpu import kernels
    stage = iter(STAGES)
    say = (lambda: progress(next(stage))) if progress is not None else (lambda: None)
    say()
    membw = kernels.membw_read_gbps(nbytes=512 << 20)
    say()
    by_qd = {q: read_bandwidth(st, q, max(16 * q, nrec // 4), seed=q) for q in (1, 2, 4, 8, 16)}
    qd1, qd16 = by_qd[1], by_qd[16]
    say()
    lane = cpu_lane_costs(st)
    llc = llc_bytes()
    say()
    reuse = reuse_curve(st)
    say()
    read_cpu = read_cpu_ms(st, nrec)
    return {"membw_read_gbps": membw, "nvme_qd1": qd1, "nvme_qd16": qd16, "cpu_lane": lane,
            "llc_bytes": llc, "reuse": reuse,
            "nvme_latency_by_qd_ms": {str(q): r["latency_ms_p50"] for q, r in by_qd.items()},
            "nvme_cpu_ms_per_read": read_cpu,
            "record_bytes": st.record_bytes, "cores": os.cpu_count(), "machine": platform.node()}


def records(m: dict, hardware_id: str, engine_id: str, when: str, previous_hw: dict | None = None) -> tuple[dict, dict]:
    """The hardware and engine records of measurement ``m``. Sections of ``previous_hw`` (the record this one
    replaces) that the bench does not measure - the VRAM tier's ``gpu`` description and link - are kept: a bench
    re-run must not drop them."""
    qd1, qd16, lane = m["nvme_qd1"], m["nvme_qd16"], m["cpu_lane"]
    service_qd1 = m["record_bytes"] / (qd1["gbps"] * 1e6)
    hw = {
        "id": hardware_id,
        "cpu": {"name": platform.processor() or platform.machine(), "cores": m["cores"],
                "llc_bytes": int(m.get("llc_bytes", 0)),
                **({"reuse_curve": m["reuse"]["curve"]} if m.get("reuse") else {})},
        "nvme": {"name": "store filesystem (O_DIRECT)", "bw_gbps": round(qd16["gbps"], 3),
                 "bw_qd1_gbps": round(qd1["gbps"], 3),
                 "latency_ms": round(max(0.0, qd1["latency_ms_p50"] - service_qd1), 4),
                 "latency_by_qd_ms": {q: round(v, 4) for q, v in m["nvme_latency_by_qd_ms"].items()},
                 "cpu_ms_per_read": round(m["nvme_cpu_ms_per_read"], 4)},
        "ceilings": {"ddr_practical_gbps": round(m["membw_read_gbps"], 2), "nvme_read_gbps": round(qd16["gbps"], 3),
                     "cores": m["cores"], "threads": m["cores"],
                     "nvme_latency_ms_p50": round(qd1["latency_ms_p50"], 4),
                     "nvme_latency_ms_p90": round(qd1["latency_ms_p90"], 4),
                     "measured_by": f"moetier bench {when} on {m['machine']}, records of {m['record_bytes']} B"},
        "source": f"moetier bench {when}",
    }
    hw = {**{k: v for k, v in (previous_hw or {}).items() if k not in hw}, **hw}
    eng = {
        "id": engine_id,
        "lanes": {"cpu": {"reads": "ram", "expert_bytes": m["record_bytes"], **{k: round(lane[k], 5) for k in
                                             ("per_layer_ms", "per_call_ms", "per_expert_ms", "per_extra_token_ms")},
                          "workers": lane["workers"], "parallel_min": lane["parallel_min"]}},
        "overheads": {"weight_gbps_1row": round(lane["weight_gbps_1row"], 3)},
        "source": f"moetier bench {when} on {m['machine']}: fit_cpu_lane over experts x rows "
                  f"({lane['encoding']} records of {m['record_bytes']} B)",
    }
    return hw, eng
