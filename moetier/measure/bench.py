"""`moetier bench`: measure this machine like a vendor sheet and write hardware + engine records.

Contract: ``measure(store)`` returns the machine sheet (memory read bandwidth, O_DIRECT reads by queue depth on an
idle disk, the CPU time of one read, the host cache: its size from sysfs and the cpu lane's reuse curve,
``reuse_curve``, moetier.core.llc); moetier.measure.bench_terms adds the terms a recipe's prediction rests on, each
with its spread. ``records(...)`` turns both into a hardware and an engine record (the cpu lane, the NVMe tables
beside it, ``term_spread``) and ``recipe_record`` into a copy of the recipe on them; the CLI validates and writes
them together (moetier.core.records.write_records). ``fit_cpu_lane`` and ``relative_lstsq`` are the lane fit
`moetier calibrate` shares."""
from __future__ import annotations

import copy
import os
import platform
import random
import time
from itertools import combinations

import numpy as np

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


def _cpu_lane_terms(rows, read_cpu: float | None) -> tuple[bool, bool, bool, bool]:
    """Which of fit_cpu_lane's optional terms the rows identify: (per_read, per_wake, per_handoff,
    per_after_wait)."""
    timed = [r for r in rows if r["calls"]]
    # with no read during any call, per_read is not identifiable: left out (the planner keeps the hardware figure)
    fit_read = read_cpu is None and any(r.get("contended", 0) for r in timed)
    fit_wake = any(r.get("wake", 0.0) for r in timed)
    # the hand-off is identifiable only beside split calls that end with the caller's share (odd batches over two)
    fit_handoff = any(r.get("handoff", 0) for r in timed) and \
        any(r["cls"] == "split" and r["calls"] > r.get("handoff", r["calls"]) for r in rows)
    fit_waited = any(r.get("waited", 0) for r in timed)
    return fit_read, fit_wake, fit_handoff, fit_waited


_OPTIONAL = ("per_read_ms", "per_wake_ms", "per_after_wait_ms", "per_handoff_ms")     # fit_cpu_lane's columns 4..7


def _identifiable(A, wanted: list[int]) -> list[int]:
    """Those of the ``wanted`` optional columns (in order) the rows can tell apart from the four base ones: each
    joins while the used columns stay linearly independent and fewer than the rows. Beyond that least squares has
    many exact answers and the subset search returns an arbitrary one (on 5 aggregate rows and 8 terms: per_expert_ms
    at 0, the optional terms taking its cost)."""
    used, keep = [c for c in range(4) if A[:, c].any()], []
    for c in wanted:
        if len(used) + 1 < A.shape[0] and np.linalg.matrix_rank(A[:, used + [c]]) == len(used) + 1:
            used, keep = used + [c], keep + [c]
    return keep


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
    least squares (every row weighs the same). An optional term the rows cannot tell apart from the others
    (``_identifiable``) is left out of the fit and of the result.
    """
    fit_read, fit_wake, fit_handoff, fit_waited = _cpu_lane_terms(rows, read_cpu)
    timed = [r for r in rows if r["calls"]]
    A = []
    for r in timed:
        e = r.get("cold", r["experts"])
        if r["cls"] == "inline":
            a = [r["calls"], 0.0, e, r["extra"]]
        else:
            a = [0.0, r["calls"], r.get("crit_cold", e / workers), r.get("crit_extra", r["extra"] / workers)]
        A.append(a + [r.get("contended", 0), r.get("wake", 0.0), r.get("waited", 0),
                      r.get("handoff", 0) if r["cls"] == "split" else 0])
    A = np.asarray(A, float).reshape(len(timed), 4 + len(_OPTIONAL))
    wanted = [c for c, f in enumerate((fit_read, fit_wake, fit_waited, fit_handoff), 4) if f]
    cols = list(range(4)) + _identifiable(A, wanted)
    fit_read = 4 in cols
    y = [max(1e-6, r["ms"] - (0.0 if fit_read else (read_cpu or 0.0) * r.get("contended", 0))) for r in timed]
    coef = relative_lstsq(A[:, cols], y)
    return dict(zip([(("per_call_ms", "per_layer_ms", "per_expert_ms", "per_extra_token_ms") + _OPTIONAL)[c]
                     for c in cols], coef))


def llc_bytes(base: str = "/sys/devices/system/cpu/cpu0/cache") -> int:
    """Size of the host's last-level cache from sysfs (0 where it is not reported)."""
    best = (0, 0)
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


RECIPE = "tiny-local-cpu"      # the recipe `moetier bench` measures without --recipe: the local tiny store's
STAGES = ("memory bandwidth", "NVMe reads QD1-16 (idle)", "cache reuse curve", "CPU time per read")


def measure(st, *, nrec: int = 256, progress=None) -> dict:
    """The machine sheet; ``progress(stage)`` is called before each of STAGES. The prediction terms a recipe's
    replay rests on are moetier.measure.bench_terms' (``bench_terms.measure`` runs both)."""
    import psutil
    from backends.cpu import kernels
    stage = iter(STAGES)
    seconds: dict = {}
    clock = [None, time.perf_counter()]

    def say():
        name, now = next(stage, None), time.perf_counter()
        if clock[0] is not None:
            seconds[clock[0]] = round(now - clock[1], 1)
        clock[:] = [name, now]
        if progress is not None and name is not None:
            progress(name)
    say()
    membw = kernels.membw_read_gbps(nbytes=512 << 20)
    say()
    by_qd = {q: read_bandwidth(st, q, max(16 * q, nrec // 4), seed=q) for q in (1, 2, 4, 8, 16)}
    qd1, qd16 = by_qd[1], by_qd[16]
    llc = llc_bytes()
    say()
    # working sets up to 4x the host cache (256 MB at least): beyond, an expert is cold whatever the distance
    cap = min(psutil.virtual_memory().available // 3, max(4 * llc, 256 << 20))
    reuse = reuse_curve(st, max_bytes=cap, rounds=2, calls=8)
    say()
    read_cpu = read_cpu_ms(st, nrec)
    say()
    return {"membw_read_gbps": membw, "nvme_qd1": qd1, "nvme_qd16": qd16, "llc_bytes": llc, "reuse": reuse,
            "nvme_latency_by_qd_ms": {str(q): r["latency_ms_p50"] for q, r in by_qd.items()},
            "nvme_cpu_ms_per_read": read_cpu, "seconds_by_stage": seconds,
            "record_bytes": st.record_bytes, "cores": os.cpu_count(), "machine": platform.node()}


LANE_FIELDS = ("per_layer_ms", "per_call_ms", "per_expert_ms", "per_extra_token_ms", "per_wake_ms", "per_handoff_ms")


def records(m: dict, hardware_id: str, engine_id: str, when: str, previous_hw: dict | None = None) -> tuple[dict, dict]:
    """The hardware and engine records of measurement ``m``. Sections of ``previous_hw`` (the record this one
    replaces) that the bench does not measure - the VRAM tier's ``gpu`` description and link - are kept: a bench
    re-run must not drop them. The engine record carries the cpu lane, the NVMe tables measured beside it (when a
    recipe was measured) and ``term_spread``: each measured term's spread over the bench's rounds."""
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
    cpu = {"reads": "ram", "expert_bytes": m["record_bytes"],
           **{k: round(lane[k], 5) for k in LANE_FIELDS if k in lane},
           "workers": lane["workers"], "parallel_min": lane["parallel_min"]}
    eng = {
        "id": engine_id,
        "lanes": {"cpu": cpu},
        "overheads": {"weight_gbps_1row": round(lane["weight_gbps_1row"], 3)},
        "source": f"moetier bench {when} on {m['machine']}: fit_cpu_lane over experts x rows "
                  f"({lane['encoding']} records of {m['record_bytes']} B)",
    }
    spread = dict(lane.get("spread") or {})
    ch = m.get("channel")
    if ch and ch["tables"].get("nvme_latency_by_rows_qd_ms"):
        eng.update(ch["tables"])
        eng["nvme_latency_record_bytes"] = m["record_bytes"]
        eng["nvme_latency_note"] = (f"moetier bench {when}: reads by rows per step, queue depth and burst position, "
                                    f"issued as a layer of recipe {m['recipe']} issues them, beside the cpu lane's "
                                    f"work (moetier.measure.bench_terms.ReadsBesideLane)")
        spread.update(ch["spread"])
    if m.get("host"):
        spread.update(m["host"]["spread"])
    if spread:
        eng["term_spread"] = spread
    return hw, eng


def recipe_record(m: dict, recipe_id: str, out_id: str, hardware_id: str, engine_id: str, when: str) -> dict:
    """A copy of recipe ``recipe_id`` that predicts from this bench: its hardware and engine are the bench's, its
    host terms and non-MoE time the bench's (the terms the bench does not measure are absent: the model without
    them), so `moetier sim OUT_ID` and `moetier run OUT_ID` use what this machine measured and nothing fitted on
    another."""
    from moetier.core import records as spec
    rec = copy.deepcopy(spec.load_record("recipe", recipe_id))
    rec["id"] = out_id
    rec["hardware"], rec["engines"] = hardware_id, [engine_id]
    cal = rec["calibration"]
    if m.get("host"):
        cal["fixed_ms"] = m["host"]["fixed_ms"]
        cal["host"] = {**{k: round(v, 6) for k, v in m["host"]["host"].items()}, "source": f"moetier bench {when}"}
    else:
        cal.pop("host", None)
    cal["source"] = f"moetier bench {when}: recipe {recipe_id} on this machine's bench records"
    rec["source"] = f"moetier bench {when} from recipe {recipe_id}"
    return rec
