"""The scheduler: plan_layer picks the lane that computes each pick of one MoE layer call.

Contract
--------
``plan_layer(ctx, ledger, picks, t0, nvme, llc=None, lanes=None, idle=0.0)`` takes ``picks`` = {key: m} (m =
token rows routed to that expert in this layer call), the layer start time ``t0`` (ms, the caller's clock), the
NVMe channel, the host cache model (moetier.llc: a RAM pick recently used costs the cpu lane less; read only here)
and how long the cpu lane's worker has idled (a split call wakes it: spec.idle_wake), and returns a
``LayerPlan``: the lane of every pick, each lane's busy time and the layer cost (max over lanes when lanes overlap,
their sum when they do not). It reads residency but never changes it: the plan's lists are residency *intents*
that the executor carries out through ledger tickets once bytes have landed. The NVMe channel is a model of the
read queue (time reservations), shared by demand reads and prefetch.

Lanes: gpu (VRAM hit), zerocopy (GPU kernel reading the host copy), cpu (RAM in place), nvme_cpu (read -> RAM ->
cpu), nvme_gpu (read -> push -> VRAM -> gpu), masked (NVMe picks dropped in the lossy ``mask`` mode).
Split: greedy min-max, heaviest picks first; a pick goes to the cpu unless that raises the layer's max more than
sending it to the GPU would (ties go to the cpu, which keeps VRAM churn down). A lane's per_layer cost (launch,
handoff) is charged only when that lane gets work.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from moetier.errors import UserError
from moetier.core.ledger import ABSENT, PUSHING, RAM, VRAM
from moetier.core.records import hands_off, idle_wake

INF = float("inf")


class NvmeChannel:
    """One NVMe read queue with two priority classes (a modeled device, times in ms).

    Demand reads are served in FIFO order before any prefetch read that has not started; a prefetch read that has
    started runs to completion. Service time per record: ``deep`` when several reads are queued (streaming
    bandwidth), ``one`` for an isolated read, plus ``latency`` when the channel was idle at issue. With a measured
    latency-vs-queue-depth table (hardware ``nvme.latency_by_qd_ms``), demand reads instead complete after the
    table's latency at the depth they join (reads run concurrently, as on a real multi-queue device).
    Prefetch reads carry the layer they were issued for; ``expire(layer, t)`` cancels those not started and counts
    those started as wasted. They run one at a time and start only while no demand read is in flight (the runtime's
    reader has one low-priority worker that waits for demand reads); with a measured table each takes ``pf_alone``
    (measured on prefetch reads; else the table's queue-depth-1 latency), else ``deep``, plus ``wake`` (the worker
    resumes after the read before it landed as a blocked waiter does: 0.077 ms against 0.082 on VM D,
    benchmarks/prefetch_claims.py). In the table model a prefetch read in service does not add to a demand read's
    depth: a demand read issued while one is in service takes ``pf_factor`` times its latency instead (measured:
    ~5% more on VM A, 6-22% on VM B; benchmarks/bench_read_latency.py, docs/calibration.md), and the prefetch read
    ``pf_share`` longer per demand read (the prefetch reads queued behind it move with it). A read the worker has
    started runs to its end even when it leaves the queue (claimed, or expired unused): the next one waits for it,
    and it is in service beside the demand reads issued meanwhile. With ``pf_sd`` (a prefetch read's measured
    spread) each read's start is a distribution that the chain accumulates, and ``claim`` says how likely a read
    has started when its key is needed.

    With measured ``bursts`` the reads of a burst share the device: a burst of n demand reads issued with none in
    flight takes each position's mean latency in bursts of n (where that size was measured) instead of the depth
    table's, which averages over the burst sizes the calibration happened to see; a burst issued while a prefetch
    read is in service takes ``pf_bursts``, the same table measured on such bursts, where it has the size (the
    factor then does not apply: the stall is a small difference of large numbers, and a factor fitted across arms
    moved it by 18% per 7% of latency; run 42); other bursts land together, at
    the table's latency for their last read. ``wake`` is the measured delay from a read landing to the thread
    blocked on it resuming; the planner adds it to a pick whose lane had to wait for the bytes. ``cv_shared`` and
    ``cv_own`` are the measured spread of a read's latency (standard deviation over mean), the part the reads of a
    layer share and the rest: an arrival is a distribution, and the planner charges a lane its *expected* end
    (``_Finish``), not the end for mean arrivals. ``lane_sd`` is the other side of that race: the spread (ms) of when
    the host reaches a layer's first wait, one draw per layer, that the reads' spread does not explain.
    """

    __slots__ = ("deep", "one", "lat", "dfree", "pf", "reads", "pf_reads", "pf_cancelled",
                 "pf_wasted", "qd_table", "outstanding", "pf_svc", "pf_lat", "pf_done", "wake", "cv_shared",
                 "cv_own", "spread", "bursts", "pf_factor", "lane_sd", "pf_alone", "pf_share", "pf_bursts", "pf_var",
                 "pf_gone", "reads_beside_pf")

    def __init__(self, record_bytes: int, bw_gbps: float, bw_qd1_gbps: float | None = None,
                 latency_ms: float = 0.1, latency_by_qd: dict | None = None, wake_ms: float = 0.0,
                 cv_shared: float = 0.0, cv_own: float = 0.0, bursts: dict | None = None, pf_factor: float = 1.0,
                 lane_sd: float = 0.0, pf_alone: float = 0.0, pf_share: float = 0.0, pf_bursts: dict | None = None,
                 pf_sd: float = 0.0):
        # latency_by_qd: {q: ms}; see also latency_table_for_rows() (tables measured under the runtime's load)
        # wake_ms: from a read landing to the lane blocked on it resuming (engine nvme_wake_ms_by_rows); paid only
        # by a lane that had to wait, so it is the planner's to add, not part of the arrival
        self.wake = float(wake_ms)
        # a read's lateness as a fraction of its latency: the part a layer's reads share and each one's own
        # (engine nvme_latency_cv_shared_by_rows / nvme_latency_cv_own_by_rows; _Finish)
        self.cv_shared, self.cv_own = float(cv_shared), float(cv_own)
        # lane_sd: the host's lateness to its first wait (ms; engine lane_lateness_sd_ms_by_rows, _Finish)
        self.lane_sd = float(lane_sd) if lane_sd and lane_sd > 0 else 0.0
        # pf_sd: the spread (ms) of a prefetch read's service around alone + share per demand read (engine
        # nvme_prefetch_sd_ms_by_rows); the worker's chain accumulates it, so a read's start is a distribution
        self.pf_var = float(pf_sd) ** 2 if pf_sd and pf_sd > 0 else 0.0
        self.spread = self.cv_shared > 0.0 or self.cv_own > 0.0 or self.lane_sd > 0.0 or self.pf_var > 0.0
        # pf_factor: a demand read issued while a prefetch read is in service shares the device with it and takes
        # this times its latency (engine nvme_latency_prefetch_factor_by_rows; 1 where unmeasured)
        self.pf_factor = float(pf_factor) if pf_factor and pf_factor > 0 else 1.0
        # a prefetch read alone, and per demand read issued while it is in service (engine nvme_prefetch_ms_by_rows,
        # nvme_prefetch_share_ms_by_rows; 0: unmeasured)
        self.pf_alone = float(pf_alone) if pf_alone and pf_alone > 0 else 0.0
        self.pf_share = float(pf_share) if pf_share and pf_share > 0 else 0.0
        # bursts: {n: {q: ms}}, the mean latency of the q-th read of a burst of n issued together (reads share the
        # device, so the first of two lands later than a read alone; engine nvme_latency_by_rows_burst_ms)
        self.bursts, self.pf_bursts = _burst_rows(bursts), _burst_rows(pf_bursts)
        self.deep = record_bytes / (bw_gbps * 1e6)
        self.one = record_bytes / ((bw_qd1_gbps or bw_gbps) * 1e6)
        self.lat = latency_ms
        self.dfree = 0.0                 # when the last demand read completes
        # key -> [start, end, start variance, busy from] (insertion order = queue order)
        self.pf: dict[int, list] = {}
        self.pf_gone: list[list] = []    # reads that left the queue (claimed or wasted) after they had started
        self.reads = self.pf_reads = self.pf_cancelled = self.pf_wasted = 0
        self.reads_beside_pf = 0         # demand reads issued while a prefetch read was in service
        self.pf_done = 0                 # prefetch reads that ran (used or wasted) whose CPU work is not yet charged
        self.outstanding: list[float] = []     # arrival times of demand reads in flight (queueing model)
        self.use_table(latency_by_qd)

    def _in_service(self, t: float) -> list | None:
        """The [start, end, var, busy] of the prefetch read in service at t (they run one at a time), or None:
        queued, or one that left the queue but runs to its end (the worker cannot drop a read it has started).
        A read holds the worker from ``busy``: its start on the plain means, not its expected start. The two differ
        where the read follows one whose end is spread: E[max(end, issue)] lies past both, and on expected starts
        the worker would idle between two chained reads, which it does not: at tail-prefetch-C2 on run 52's terms
        137 of 2316 modeled demand bursts found it idle with reads queued on expected starts (a939892), 24 of 2315
        on busy starts, 43 of 2337 in the runtime (benchmarks/prefetch_claims.py --arm tail-prefetch-C2)."""
        for rec in self.pf.values():
            if rec[3] < t < rec[1]:
                return rec
        for rec in self.pf_gone:
            if rec[3] < t < rec[1]:
                return rec
        return None

    def _running_end(self, t: float) -> float:
        """End of the prefetch read in service at t (t if none)."""
        rec = self._in_service(t)
        return rec[1] if rec is not None else t

    def _worker_free(self, base: float, rec) -> tuple[float, float, float]:
        """When the prefetch worker can start a read, not before ``base``, behind ``rec`` (the last read queued
        before it, or None) and the reads that left the queue still running: the expected max, its variance (a
        worker late on its chain starts the next read late, whatever the channel's means) and the plain max (when
        the worker takes the read up on the means: ``_in_service``)."""
        e, v = -INF, 0.0
        for r in (rec, *self.pf_gone) if rec is not None else self.pf_gone:
            if r[1] >= e:
                e, v = r[1], r[2] + self.pf_var
        busy = e if e > base else base
        if v > 0.0:
            return (*_max_normal(e, v, base, 0.0), busy)
        return busy, 0.0, busy

    def _repack(self, t: float) -> None:
        """Reschedule prefetch reads that have not started at t after all demand work."""
        cur, v, busy = self._worker_free(max(t, self.dfree), self._in_service(t))
        svc, sv = self.pf_svc, self.pf_var
        for rec in self.pf.values():
            if rec[0] >= t:
                rec[0], rec[2], rec[3] = cur, v, busy
                cur += svc
                v += sv
                rec[1] = busy = cur

    def use_table(self, table: dict | None) -> None:
        """Switch the queueing model's latency-vs-queue-depth table (e.g. the one measured at this many rows)."""
        # queueing model (measured): completion time of a read that joins q outstanding reads
        self.qd_table = sorted((int(q), float(v)) for q, v in (table or {}).items())
        if self.qd_table:
            self.pf_svc, self.pf_lat = (self.pf_alone or self.latency_at(1)) + self.wake, 0.0
        else:
            self.pf_svc, self.pf_lat = self.deep + self.wake, self.lat

    def latency_at(self, q: int) -> float:
        """Measured completion time at queue depth q: piecewise linear; beyond the table, linear in q (bandwidth)."""
        tab = self.qd_table
        if q <= tab[0][0]:
            return tab[0][1]
        for (q0, v0), (q1, v1) in zip(tab, tab[1:]):
            if q <= q1:
                return v0 + (v1 - v0) * (q - q0) / (q1 - q0)
        return tab[-1][1] * q / tab[-1][0]

    def demand(self, t: float, n: int) -> list[float]:
        """Issue n demand reads at t; returns their arrival times (ms)."""
        if n <= 0:
            return []
        if self.qd_table:
            # reads run concurrently; the i-th read of this batch joins a queue of depth (reads still in flight + i)
            # and completes after the measured latency at that depth - the table is keyed the same way (the depth a
            # read joined when it was submitted)
            busy = [a for a in self.outstanding if a > t]
            rec = self._in_service(t)
            if rec is not None:                    # the prefetch read in service shares the device
                rec[1] += self.pf_share * n
                self.reads_beside_pf += n
            out = [t + x for x in self._burst(len(busy), n, rec is not None)]
            busy.extend(out)
            self.outstanding = busy
            self.dfree = max(self.dfree, out[-1])
            self.reads += n
            if self.pf:
                self._repack(t)
            return out
        start = self._fifo_start(t)
        svc = self.deep if n > 1 else self.one
        out = [start + svc * (i + 1) for i in range(n)]
        self.dfree = out[-1]
        self.reads += n
        if self.pf:
            self._repack(t)
        return out

    def _fifo_start(self, t: float) -> float:
        """When a demand read issued at t starts in the FIFO model (no latency table): behind the demand reads and
        the prefetch read in service, or at t plus the access latency on an idle channel."""
        busy_until = max(self.dfree, self._running_end(t))
        return busy_until if busy_until > t else t + self.lat

    def _burst(self, q0: int, n: int, beside_pf: bool) -> list[float]:
        """The latencies of n demand reads issued together, joining q0 reads in flight, beside a prefetch read in
        service or not (table model). Measured bursts: concurrent reads share the device and land together (a burst
        of 3 at 3.7 ms each, not 2.4 / 3.1 / 3.8); a size not measured (or joining reads in flight) lands at the
        depth table's latency for its last read. Beside a prefetch read, the burst table measured so where it has
        the size, else ``pf_factor`` times the plain figure."""
        f, bursts = 1.0, self.bursts
        if beside_pf:
            if q0 == 0 and n in self.pf_bursts:
                bursts = self.pf_bursts
            else:
                f = self.pf_factor
        if not bursts:
            return [f * self.latency_at(q0 + i + 1) for i in range(n)]
        row = bursts.get(n) if q0 == 0 else None
        return [f * v for v in row] if row is not None else [f * self.latency_at(q0 + n)] * n

    def claim(self, key: int, t: float) -> tuple:
        """(arrival or None, p, arrival if started) of a prefetched key needed at t; (None, 0, None) if it has no
        prefetch read. The read has started (arrival not None, promoted; else it is withdrawn and the caller issues
        a demand read) when its expected start is before t; p is the chance that it has, from its start's spread
        (the worker's chain), and the last item its expected arrival given that it has: the runtime's reader
        decides for real, and re-issues a read that has not started as a demand read (on run 45's terms at
        tail-prefetch-C2, 134 of the 444 layers whose NVMe picks the model served from started prefetch reads
        re-issued one: benchmarks/prefetch_claims.py)."""
        rec = self.pf.pop(key, None)
        if rec is None:
            return None, 0.0, None
        p, a = self._left(rec, t)
        if rec[0] < t:
            self.pf_done += 1
            return rec[1], p, a
        self.pf_cancelled += 1          # withdrawn before it started: it becomes a demand read
        return None, p, a

    def _left(self, rec, t: float) -> tuple[float, float]:
        """A prefetch read leaves the queue at t (claimed, or expired unused): (p, a), the chance that the worker
        has started it by t and its expected end if it has (the truncated normal of its start). The model keeps it
        running (if its expected start is before t) or withdraws it; the runtime's reader decides by its real
        start."""
        s, e, v, _ = rec
        if v > 0.0:
            sd = math.sqrt(v)
            z = (t - s) / sd
            p = 0.5 * (1.0 + math.erf(z / _SQRT2))
            a = e - sd * _INV_SQRT_2PI * math.exp(-0.5 * z * z) / p if p > 1e-9 else e
        else:
            p, a = (1.0 if s < t else 0.0), e
        gone = [r for r in self.pf_gone if r[1] > t]
        if s < t:
            gone.append(rec)
        self.pf_gone = gone
        return p, a

    def read_now(self, t: float, beside: int = 0) -> float:
        """When one more demand read issued at t, beside the ``beside`` demand reads just issued at t, would land,
        without issuing it (the other side of a claim's race): the last of their burst, as ``demand`` books one."""
        if not self.qd_table:
            return self._fifo_start(t) + self.one
        others = sum(1 for a in self.outstanding if a > t) - beside
        return t + self._burst(others, beside + 1, self._in_service(t) is not None)[-1]

    def prefetch(self, t: float, keys) -> list[float]:
        """Queue prefetch reads behind demand work; returns their (current) arrival times."""
        last = None
        for rec in self.pf.values():
            if last is None or rec[1] > last[1]:
                last = rec
        cur, v, busy = self._worker_free(max(t, self.dfree), last)
        if cur <= t:
            cur = busy = cur + self.pf_lat
        out = []
        svc, sv = self.pf_svc, self.pf_var
        for k in keys:
            s = cur
            cur += svc
            self.pf[k] = [s, cur, v, busy]
            v += sv
            busy = cur
            out.append(cur)
        self.pf_reads += len(out)
        return out

    def arrival(self, key: int):
        rec = self.pf.get(key)
        return None if rec is None else rec[1]

    def expire(self, keys, t: float) -> tuple[list[int], list[int]]:
        """Drop prefetches of keys no longer wanted. Returns (cancelled keys, wasted keys that were read)."""
        cancelled, wasted = [], []
        for k in keys:
            rec = self.pf.pop(k, None)
            if rec is None:
                continue
            self._left(rec, t)
            if rec[0] >= t:
                cancelled.append(k)
            else:
                wasted.append(k)
        self.pf_cancelled += len(cancelled)
        self.pf_wasted += len(wasted)
        self.pf_done += len(wasted)
        if cancelled:
            self._repack(t)
        return cancelled, wasted


def _burst_rows(bursts: dict | None) -> dict:
    """{n: {q: ms}} -> {n: [ms by position]}, the sizes with every position measured (else the depth table
    decides)."""
    out = {}
    for n, tab in (bursts or {}).items():
        row = {int(q): float(v) for q, v in tab.items()}
        if sorted(row) == list(range(1, int(n) + 1)):
            out[int(n)] = [row[q] for q in sorted(row)]
    return out


def _engine_tables(engines, record_bytes) -> dict:
    """The engine record whose NVMe tables apply: the last of ``engines`` with ``nvme_latency_by_rows_qd_ms``
    measured under its load with records of ``record_bytes`` (a table for other record sizes does not apply)."""
    return next((e for e in reversed(list(engines)) if e.get("nvme_latency_by_rows_qd_ms")
                 and e.get("nvme_latency_record_bytes", record_bytes) == record_bytes), {})


def layer_width(rows: int, width: tuple | None = None) -> float:
    """The distinct experts a layer call of ``rows`` token rows computes, in expectation, with routing uniform over
    ``width`` = (experts, top-k): E (1 - (1 - k / E) ** rows). Without a width, ``rows`` (every pick distinct: the
    limit of many experts)."""
    if width is None:
        return float(rows)
    e, k = width
    return e * (1.0 - (1.0 - k / e) ** rows)


def _at_rows(by_rows: dict, rows: int, mix, width: tuple | None = None):
    """A per-rows measurement ({rows: value}) at ``rows``: between measured rows, linear in the layer's expected
    distinct experts (``layer_width``; ``mix(lo, hi, f)``), the nearest outside. What the reads measure under load
    follows the work the lanes do beside them, and that follows the experts a layer computes, not its rows. On VM C
    (runs 23-28) rows 2 sat 18-33% of the way from rows 1 to 4 in the numba engine's depth-1 latency and 21-47% in
    the SYCL engine's (mean 30%); the 64-expert top-4 model computes 4 / 7.7 / 14.1 distinct experts per layer call
    at rows 1 / 2 / 4 (37%; uniform routing 36%). log(rows), the rule before, puts it at 50%, and the SYCL engine's
    held-out rows-2 stall came out +7% to +36% in runs 22-28."""
    keys = sorted(by_rows)
    lo = max([r for r in keys if r <= rows], default=keys[0])
    hi = min([r for r in keys if r >= rows], default=keys[-1])
    if lo == hi:
        return by_rows[lo]
    x0, x1 = layer_width(lo, width), layer_width(hi, width)
    # top-k = every expert: more rows add no experts, and the layer's work is the lower rows'
    return mix(by_rows[lo], by_rows[hi], (layer_width(rows, width) - x0) / (x1 - x0) if x1 > x0 else 0.0)


def latency_table_for_rows(nvme: dict, rows: int, engines=(), record_bytes: int | None = None,
                           width: tuple | None = None) -> dict | None:
    """The channel's latency-vs-queue-depth table for a step of ``rows`` token rows.

    A table by rows ({rows: {q: ms}}, written by `moetier calibrate` from the runtime's own reads) captures that
    reads complete later while the lanes keep the cores busy (more rows, more work per layer), and how much later
    depends on the engine (``_engine_tables``: the engine's table measured under its load wins, else the hardware's
    ``nvme.latency_by_rows_qd_ms``); rows between measured ones interpolate in the layer's expected distinct experts
    (``_at_rows``, ``width`` = (experts, top-k)), outside they take the nearest. Without any: the idle-disk
    ``latency_by_qd_ms`` of `moetier bench`, or None (the reference's FIFO model)."""
    src = (_engine_tables(engines, record_bytes).get("nvme_latency_by_rows_qd_ms")
           or nvme.get("latency_by_rows_qd_ms") or {})
    by_rows = {int(r): {int(q): float(v) for q, v in tab.items()} for r, tab in src.items() if tab}
    if not by_rows:
        return nvme.get("latency_by_qd_ms")
    return _at_rows(by_rows, rows, lambda a, b, f: {q: a[q] * (1 - f) + b[q] * f for q in sorted(set(a) & set(b))},
                    width)


def burst_table_for_rows(rows: int, engines=(), record_bytes: int | None = None, width: tuple | None = None,
                         field: str = "nvme_latency_by_rows_burst_ms") -> dict:
    """The mean latency by burst size and position ({n: {q: ms}}) at ``rows`` token rows, from the engine whose
    latency table applies (``field``: ``nvme_latency_by_rows_burst_ms``, or ``nvme_latency_by_rows_burst_pf_ms`` of
    bursts issued beside a prefetch read in service); between measured rows, the cells both have mix as
    ``_at_rows`` does. {} if unmeasured: the depth table alone then sets arrivals.

    The table beside a prefetch read is the plain table at ``rows`` times the ratio of the two where both were
    measured (the ratio mixes across rows, not the latencies). A read's latency follows the work on the cores at
    that many rows, which the plain table measures on its own fit arm, and the prefetch read in service is what the
    ratio adds to it. Mixing the latencies ignored the rows-2 plain table: on run 49's terms a burst of one beside a
    prefetch read took 1.51 ms at rows 2 (rows 1's 1.28 and rows 4's 1.95 mixed) and takes 1.56 now (rows 2's
    plain 1.51 times the ratios 1.00 and 1.09 mixed); the held-out tail-prefetch-C2's stall, re-predicted from runs
    46-49's records, went from -17 / -6 / -23 / -18% to -8 / +7 / -16 / -11% (docs/calibration.md)."""
    eng = _engine_tables(engines, record_bytes)
    plain = _burst_by_rows(eng.get("nvme_latency_by_rows_burst_ms"))
    tabs = plain if field == "nvme_latency_by_rows_burst_ms" else _burst_by_rows(eng.get(field))
    if not tabs:
        return {}
    out = _at_rows(tabs, rows, _mix_bursts, width)
    if tabs is plain or not plain:
        return out
    ratios = {}
    for r, tab in tabs.items():
        base = _at_rows(plain, r, _mix_bursts, width)
        ratios[r] = {n: {q: v / base[n][q] for q, v in row.items()} for n, row in tab.items()
                     if n in base and set(base[n]) == set(row) and min(base[n].values()) > 0.0}
    base, ratio = _at_rows(plain, rows, _mix_bursts, width), _at_rows(ratios, rows, _mix_bursts, width)
    # a size the plain table lacks keeps the pf table's own mix
    out.update({n: {q: base[n][q] * f for q, f in row.items()} for n, row in ratio.items()
                if n in base and set(base[n]) == set(row)})
    return out


def _burst_by_rows(src: dict | None) -> dict:
    """A record's {rows: {n: {q: ms}}} with int keys, the rows without a table left out."""
    return {int(r): {int(n): {int(q): float(v) for q, v in row.items()} for n, row in tab.items()}
            for r, tab in (src or {}).items() if tab}


def _mix_bursts(a: dict, b: dict, f: float) -> dict:
    """Two burst tables mixed cell by cell (``_at_rows``), the sizes whose positions both have."""
    return {n: {q: a[n][q] * (1 - f) + b[n][q] * f for q in a[n]} for n in sorted(set(a) & set(b))
            if set(a[n]) == set(b[n])}


def channel_term(field: str, rows: int, engines=(), record_bytes: int | None = None,
                 width: tuple | None = None) -> float:
    """A per-rows term of the NVMe channel at ``rows`` token rows - ``nvme_wake_ms_by_rows`` (the wake-up, ms),
    ``nvme_latency_cv_shared_by_rows`` / ``nvme_latency_cv_own_by_rows`` (the latency's spread),
    ``nvme_latency_prefetch_factor_by_rows`` (a demand read beside a prefetch read in service),
    ``nvme_prefetch_ms_by_rows`` / ``nvme_prefetch_share_ms_by_rows`` / ``nvme_prefetch_sd_ms_by_rows`` (a prefetch
    read alone, per demand read beside it, and its spread, ms),
    ``lane_lateness_sd_ms_by_rows`` (the host's lateness to its first wait, ms) - from the engine whose latency
    table applies; 0 if unmeasured."""
    return _scalar_at_rows(_engine_tables(engines, record_bytes).get(field), rows, width)


def _scalar_at_rows(src: dict | None, rows: int, width: tuple | None) -> float:
    """A record's {rows: number} at ``rows`` (``_at_rows``); 0 if there is none."""
    by_rows = {int(r): float(v) for r, v in (src or {}).items()}
    return _at_rows(by_rows, rows, lambda a, b, f: a * (1 - f) + b * f, width) if by_rows else 0.0


@dataclass
class PlanContext:
    """Recipe constants the planner needs, flattened once (attribute lookups are the planner's main cost)."""

    experts: int
    gpu: tuple | None          # (per_layer, per_expert, per_extra_token) or None if the lane is missing
    zerocopy: tuple | None
    cpu: tuple | None
    push_ms: float
    mask: bool
    overlap: bool
    can_admit: bool            # a VRAM tier exists (zerocopy/nvme_gpu picks are admitted)
    cpu_call: float = 0.0      # cpu lane: an inline one-thread call (an NVMe pick computed as it lands)
    cpu_workers: int = 1       # cpu lane: threads a batch is split over ...
    cpu_pmin: int = 0          # ... once it has at least this many experts
    cpu_wake: float = 0.0      # ... and then pays this per unit of its worker's idle (spec.idle_wake)
    cpu_after_wait: float = 0.0   # cpu lane: what an inline call pays beyond cpu_call right after a blocked wait
    cpu_handoff: float = 0.0   # cpu lane: what a split call pays when it ends with a worker's share (spec.hands_off)
    host_layer: float = 0.0    # serial host time per layer call outside the lanes (plan, bookkeeping, combine)
    host_pick: float = 0.0     # ... per pick
    host_read: float = 0.0     # ... and per NVMe pick (issue, slot, landing bookkeeping)
    host_nvme_layer: float = 0.0   # ... and per layer with NVMe picks (what its reads share: their plan, the loops)
    read_cpu: float = 0.0      # core time one NVMe read takes from the cpu lane (O_DIRECT + checksum), per lane ms
    host_predict: float = 0.0  # serial host time per layer of a prefetch predictor (when prefetch is on), at its rows
    copy_serial: bool = False  # admission pushes and drains run after the lanes, one after another (no overlap)
    host_copy: float = 0.0     # serial host time per admission push or drain (submit, wait, landing bookkeeping)
    host_zc_call: float = 0.0  # serial host time per layer whose zerocopy lane computes (outside the runtime's timers)
    # the part of the host time above that runs between a layer's first NVMe submit and its first wait (the rest of
    # the issue loop, the lane calls' set-up, prediction and prefetch issue, recency): per such layer, per read,
    # and per layer that predicts. It delays the first wait and overlaps the reads
    head_layer: float = 0.0
    head_read: float = 0.0
    # what a gpu / zerocopy lane call pays per NVMe read of its layer in flight: the lane's per_read_ms where
    # `moetier calibrate` fitted one (a device on the host's cores shares them with the reader), else 0 (a
    # discrete GPU does not compete with the reader's CPU work)
    gpu_read: float = 0.0
    zc_read: float = 0.0
    # ... and once per call while any read is in flight (the lane's per_read_busy_ms)
    gpu_busy: float = 0.0
    zc_busy: float = 0.0

    @classmethod
    def from_recipe(cls, R, rows: int = 1) -> "PlanContext":
        """``rows``: token rows per step (the prediction's host time has a part per row)."""
        def lane(name):
            ln = R.lanes.get(name)
            if ln is None:
                return None
            # a call's fixed cost at this many rows per step (device lanes; the cpu lane has no such term)
            return (ln.per_layer_ms + (ln.per_step_row_ms or 0.0) * (rows - 1), ln.per_expert_ms,
                    ln.per_extra_token_ms)

        gpu = lane("gpu") if R.vram_slots > 0 else None
        if R.vram_slots > 0 and gpu is None:
            raise UserError(f"recipe {R.id}: budget.vram_expert_slots={R.vram_slots} but no engine provides a "
                            f"gpu lane to compute VRAM-resident experts")
        zc = lane("zerocopy")
        cpu = lane("cpu")
        cl = R.lanes.get("cpu")

        def per_read(name, term="per_read_ms"):
            ln = R.lanes.get(name)
            return float(getattr(ln, term) or 0.0) if ln is not None else 0.0

        overlap = bool(R.policy.get("overlap", True))
        if cpu is None and zc is None and gpu is None:
            raise UserError(f"recipe {R.id}: no lane can compute RAM or NVMe experts (need cpu, zerocopy or gpu)")
        host = getattr(R, "host", None) or {}
        return cls(experts=R.experts, gpu=gpu, zerocopy=zc, cpu=cpu,
                   push_ms=_push_ms(R, rows),
                   mask=R.policy.get("exact", "stall") == "mask",
                   overlap=overlap, can_admit=gpu is not None,
                   cpu_call=cl.per_call_ms if cl else 0.0, cpu_workers=cl.workers if cl else 1,
                   cpu_pmin=cl.parallel_min if cl else 0, cpu_wake=float(cl.per_wake_ms or 0.0) if cl else 0.0,
                   cpu_after_wait=float(cl.per_after_wait_ms or 0.0) if cl else 0.0,
                   cpu_handoff=float(cl.per_handoff_ms or 0.0) if cl else 0.0,
                   host_layer=float(host.get("per_layer_ms", 0.0)), host_pick=float(host.get("per_pick_ms", 0.0)),
                   host_read=float(host.get("per_read_ms", 0.0)),
                   host_nvme_layer=float(host.get("per_nvme_layer_ms", 0.0)),
                   read_cpu=_read_cpu(R),
                   host_predict=(float(host.get("per_predict_ms", 0.0))
                                 + rows * float(host.get("per_predict_row_ms", 0.0)) if _prefetching(R.policy) else 0.0),
                   copy_serial=gpu is not None and not overlap,
                   host_copy=float(host.get("per_copy_ms", 0.0)),
                   host_zc_call=float(host.get("per_zc_call_ms", 0.0)),
                   head_layer=float(host.get("head_per_layer_ms", 0.0)) + (
                       float(host.get("head_per_predict_ms", 0.0))
                       + rows * float(host.get("head_per_predict_row_ms", 0.0)) if _prefetching(R.policy) else 0.0),
                   head_read=float(host.get("head_per_read_ms", 0.0)),
                   gpu_read=per_read("gpu") if gpu is not None else 0.0, zc_read=per_read("zerocopy"),
                   gpu_busy=per_read("gpu", "per_read_busy_ms") if gpu is not None else 0.0,
                   zc_busy=per_read("zerocopy", "per_read_busy_ms"))


def _push_ms(R, rows: int) -> float:
    """One record copy between RAM and VRAM at ``rows`` token rows per step: the VRAM engine's ``copy_ms_by_rows``
    where `moetier calibrate` measured it under the engine's load (on the SYCL CPU device a copy took 0.118 /
    0.111 / 0.129 ms at C1 / C2 / C4 in run 28, and one figure pooled over C1 and C4 - mostly C4's copies - put C1
    and C2 9-16% long), else the record over the hardware's link (gpu.h2d_gbps). Like the engine's NVMe tables, the
    measured copy time holds for the record size it was measured with (``copy_record_bytes``) only."""
    size = R.nvme_expert_bytes
    by_rows = next((e["copy_ms_by_rows"] for e in reversed(getattr(R, "engines", None) or ())
                    if e.get("copy_ms_by_rows") and e.get("copy_record_bytes", size) == size), None)
    if by_rows:
        return _scalar_at_rows(by_rows, rows, (R.experts, R.topk))
    return R.nvme_expert_bytes / (R.h2d_gbps * 1e6) if R.h2d_gbps else INF


def _prefetching(policy: dict) -> bool:
    pf = policy.get("prefetch") or {}
    return int(pf.get("depth") or 0) > 0 and pf.get("predictor", "recall") not in (None, "none") and \
        (pf.get("predictor") != "recall" or float(pf.get("recall") or 0) > 0)


def _read_cpu(R) -> float:
    """Contention between the NVMe reader and the cpu lane on shared cores: the cpu lane's own per_read_ms where
    `moetier calibrate` fitted one, else the measured CPU time of one read (hardware nvme.cpu_ms_per_read, from
    `moetier bench`) spread over the cores the lane runs on."""
    cl = (getattr(R, "lanes", None) or {}).get("cpu")
    if cl is not None and cl.per_read_ms is not None:
        return cl.per_read_ms
    hw = getattr(R, "hardware", None) or {}
    per_read = float((hw.get("nvme") or {}).get("cpu_ms_per_read", 0.0))
    cores = int((hw.get("cpu") or {}).get("cores") or 1)
    return per_read / max(1, cores)


class LayerPlan:
    """The lane of every pick (lists of keys), modeled NVMe arrivals, lane busy times and the layer cost (ms)."""

    __slots__ = ("gpu", "zerocopy", "cpu", "nvme_cpu", "nvme_gpu", "masked", "arrivals", "demand_reads", "gpu_ms",
                 "cpu_ms", "nvme_wait_ms", "gpu_wait_ms", "ms", "cpu_cold", "issue_ms",
                 "head_ms", "cpu_crit", "wait_from", "split_end", "t0")

    def __init__(self):
        self.gpu, self.zerocopy, self.cpu, self.nvme_cpu, self.nvme_gpu, self.masked = [], [], [], [], [], []
        self.arrivals: dict = {}
        self.demand_reads = 0
        self.cpu_cold = 0.0        # the cpu lane's RAM picks in cold-expert equivalents (host cache, moetier.llc)
        # a split batch: (cold-expert equivalents, extra rows) of its longest share, what the call's time follows
        self.cpu_crit = None
        self.split_end = None      # a split call: when it ends (the caller's clock), its worker idle from then on
        # wait_from: when the host, past its lanes, the reads' contention and its head, first waits for a read
        self.wait_from = 0.0
        # gpu_wait_ms: the part of nvme_wait_ms spent on the gpu lane (read + push of NVMe -> VRAM picks)
        self.gpu_ms = self.cpu_ms = self.nvme_wait_ms = self.gpu_wait_ms = self.ms = 0.0
        # issue_ms: when the host, past the resident lanes it runs itself, issues the prefetch for the layers ahead
        self.issue_ms = 0.0
        # head_ms: the host work past issue_ms and before the first wait for an NVMe pick (PlanContext.head_layer)
        self.head_ms = 0.0
        self.t0 = 0.0              # the clock the layer was planned at: arrivals and split_end are on it

    def lanes(self) -> dict:
        return {"gpu": self.gpu, "zerocopy": self.zerocopy, "cpu": self.cpu, "nvme_cpu": self.nvme_cpu,
                "nvme_gpu": self.nvme_gpu, "masked": self.masked}


def _gpu_ms(ctx, vram_l, picks, reads: int = 0) -> float:
    """The gpu lane's call over the VRAM picks, with ``reads`` NVMe reads of the layer in flight meanwhile (each
    costs it gpu_read, and any at all gpu_busy once)."""
    pl, pe, px = ctx.gpu
    g = pl + ctx.gpu_read * reads + ctx.gpu_busy if reads else pl
    for k in vram_l:
        g += pe + px * (picks[k] - 1)
    return g


def _ram_lanes(ctx, ram_l, g, llc, cpu_list, zc_list, force=None, reads: int = 0, wake: float = 0.0):
    """Deal the RAM picks (``ram_l``: (rows, key), heaviest first) to the cpu or zerocopy lane, each where the layer
    ends sooner on ``ctx``'s costs - or, with ``force`` (the keys already dealt to the cpu lane), as dealt, only
    timed on them. Appends to the two lists; returns (g, c, the cpu batch's cold-expert equivalents, its longest
    share's (cold, extra rows) if the call is split else None). A split call deals its batch out strided
    (spec.deal: thread i takes experts i, i + W, ...) and ends with its longest share, plus the hand-off when a
    worker's share is as long as the caller's by count (spec.hands_off). ``reads``: the layer's NVMe
    reads in flight during the zerocopy call (ctx.zc_read each, and ctx.zc_busy once if any; the cpu lane's share is
    booked by the caller).
    ``wake``: the idle units of the split call's worker (spec.idle_wake), ctx.cpu_wake each."""
    cpl, cpe, cpx = ctx.cpu if ctx.cpu else (INF, INF, 0.0)
    cpl += ctx.cpu_wake * wake
    zpl, zpe, zpx = ctx.zerocopy if ctx.zerocopy else (INF, INF, 0.0)
    if reads:
        zpl += ctx.zc_read * reads + ctx.zc_busy
    W, pmin, cpc, hoff = ctx.cpu_workers, ctx.cpu_pmin, ctx.cpu_call, ctx.cpu_handoff
    c, zc_on = 0.0, False
    n_c, work_c = 0, 0.0              # the cpu batch so far: experts and summed one-thread work
    shares, crit = [0.0] * W, 0.0     # per thread of a split call: its work; the longest
    share_cold, share_extra = [0.0] * W, [0] * W
    factor = llc.factor if llc is not None else None
    for m, k in ram_l:
        f = factor(k) if factor is not None else 1.0
        w = cpe * f + cpx * (m - 1) if m > 1 else cpe * f
        work1 = work_c + w
        n1 = n_c + 1
        i = n_c % W
        s_i = shares[i] + w
        if n1 < pmin:
            ce = cpc + work1
        else:
            ce = cpl + (s_i if s_i > crit else crit)
            if hoff and hands_off(n1, W):
                ce += hoff
        ge = (g if zc_on else g + zpl) + zpe
        if m > 1:
            ge += zpx * (m - 1)
        if force is not None:
            to_cpu = k in force
        else:
            to_cpu = (ce if ce > g else g) <= (c if c > ge else ge)
        if to_cpu:
            c = ce
            n_c, work_c = n1, work1
            shares[i] = s_i
            if s_i > crit:
                crit = s_i
            share_cold[i] += f
            share_extra[i] += m - 1
            cpu_list.append(k)
        else:
            g = ge
            zc_on = True
            zc_list.append(k)
    if n_c < pmin or not n_c:
        return g, c, sum(share_cold), None
    i = shares.index(crit)
    return g, c, sum(share_cold), (share_cold[i], share_extra[i])


def plan_layer(ctx: PlanContext, ledger, picks: dict, t0: float, nvme: NvmeChannel | None,
               llc=None, lanes: LayerPlan | None = None, idle: float = 0.0) -> LayerPlan:
    """Plan one layer call. See the module docstring for the contract. ``llc``: the host cache model
    (moetier.llc.ReuseModel) or None; a RAM pick costs the cpu lane per_expert x its reuse factor. ``lanes``: a
    plan of the same picks and tiers made elsewhere (on other terms and another clock) whose lane deal this plan
    keeps, only timing it on ``ctx``'s terms: a calibration predicting a run times the decisions that run made
    (sim.run's ``choose``); None: ``ctx`` deals. ``idle``: ms since the cpu lane's last split call ended
    (sim.Replay.idle), what waking its worker costs a split call (spec.idle_wake); the plan's ``split_end`` is
    when this layer's split call ends, if it makes one."""
    if lanes is not None and ((lanes.cpu or lanes.nvme_cpu) and ctx.cpu is None or lanes.nvme_gpu and ctx.gpu is None
                              or lanes.zerocopy and ctx.zerocopy is None):
        raise ValueError("plan_layer: lanes deal picks to a lane this recipe lacks")
    plan = LayerPlan()
    plan.t0 = t0
    sget = ledger.state.get
    absent = RAM if ledger.all_in_ram else ABSENT    # state of a key the ledger does not track
    vram_l, ram_l, nvme_l = plan.gpu, [], []
    for k, m in picks.items():
        s = sget(k, absent)
        if s == RAM or s == PUSHING:                 # tiers as the planner sees them (ledger._TIER_OF)
            ram_l.append((m, k))
        elif s == VRAM:
            vram_l.append(k)
        else:
            nvme_l.append(k)

    reads = 0 if ctx.mask else len(nvme_l)     # the layer's reads in flight while its resident lanes compute
    g = _gpu_ms(ctx, vram_l, picks, reads) if vram_l else 0.0
    g_on = bool(vram_l)   # gpu lane has work: its per_layer is paid
    c = 0.0
    c_on = False
    if ram_l:
        if len(ram_l) > 1:
            ram_l.sort(reverse=True)      # heaviest first; ties by key (descending) keep it deterministic
        # the log only where a lane pays for it (most recipes' cpu lane has no wake-up term)
        wake = idle_wake(idle) if ctx.cpu_wake else 0.0
        g, c, plan.cpu_cold, plan.cpu_crit = _ram_lanes(ctx, ram_l, g, llc, plan.cpu, plan.zerocopy,
                                                        set(lanes.cpu) if lanes is not None else None, reads, wake)
        c_on = bool(plan.cpu)
        if plan.cpu_crit is not None:     # the lanes start at t0 and the runtime runs the cpu lane's call first
            plan.split_end = t0 + c

    plan.issue_ms = c if ctx.overlap else g + c
    if nvme_l:
        if ctx.mask:
            plan.masked = nvme_l
        else:
            if c_on and ctx.read_cpu:
                c += ctx.read_cpu * len(nvme_l)      # the reads' CPU work lands while the cpu lane computes
            ahead = 0.0
            if ctx.copy_serial and plan.zerocopy:
                # the serial runtime pushes the zerocopy picks into VRAM (draining a victim first when VRAM is
                # full, in an exclusive ledger) before it waits for the gpu lane's reads
                full = ledger.exclusive and ledger.vram_full()
                ahead = len(plan.zerocopy) * (ctx.push_ms + ctx.host_copy) * (2 if full else 1)
            plan.head_ms = head = ctx.head_layer + ctx.head_read * len(nvme_l)
            _plan_nvme(ctx, plan, picks, nvme_l, t0, nvme, g, g_on, c, c_on, ahead, head,
                       (lanes.nvme_cpu, lanes.nvme_gpu) if lanes is not None else None)
            g, c = plan.gpu_ms, plan.cpu_ms
    # a masked pick is neither computed nor combined: the per-pick host work is the computed picks'
    serial = ctx.host_layer + ctx.host_pick * (len(picks) - len(plan.masked)) + ctx.host_predict
    if plan.zerocopy:
        serial += ctx.host_zc_call
    if ctx.read_cpu and nvme is not None and nvme.pf_done:
        # the CPU work of prefetch reads that ran since the last layer, on the cores the cpu lane (or the host) uses
        if c_on:
            c += ctx.read_cpu * nvme.pf_done
        else:
            serial += ctx.read_cpu * nvme.pf_done
        nvme.pf_done = 0
    plan.gpu_ms, plan.cpu_ms = g, c
    if ctx.overlap:
        # the head is host work done before the first wait, while the reads are in flight: the host timeline (the
        # cpu lane's) ends no earlier than it, and it leaves the serial part
        h = plan.head_ms
        plan.ms = (g if g > c + h else c + h) + serial - h
    else:
        plan.ms = g + c + serial         # the serial timeline waited past the head already (_serial_nvme)
    if nvme_l and not ctx.mask:
        plan.ms += ctx.host_read * len(nvme_l) + ctx.host_nvme_layer
    return plan


_SQRT2 = math.sqrt(2.0)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)


def late(mu: float, sd: float) -> float:
    """E[max(0, mu + e)] for e ~ Normal(0, sd): how long a lane free at 0 expects to wait for bytes due at mu whose
    arrival spreads by sd. sd 0: the deterministic max(0, mu)."""
    if sd <= 0.0:
        return mu if mu > 0.0 else 0.0
    z = mu / sd
    return mu * 0.5 * (1.0 + math.erf(z / _SQRT2)) + sd * _INV_SQRT_2PI * math.exp(-0.5 * z * z)


def _max_normal(m1: float, v1: float, m2: float, v2: float) -> tuple[float, float]:
    """Mean and variance of max(X, Y) for independent normals X ~ (m1, v1), Y ~ (m2, v2) (Clark, 1961)."""
    s2 = v1 + v2
    if s2 <= 0.0:
        return (m1, v1) if m1 >= m2 else (m2, v2)
    s = math.sqrt(s2)
    al = (m1 - m2) / s
    p = 0.5 * (1.0 + math.erf(al / _SQRT2))
    f = s * _INV_SQRT_2PI * math.exp(-0.5 * al * al)
    m = m1 * p + m2 * (1.0 - p) + f
    e2 = (m1 * m1 + v1) * p + (m2 * m2 + v2) * (1.0 - p) + (m1 + m2) * f
    v = e2 - m * m
    return m, (v if v > 0.0 else 0.0)


class _Finish:
    """The end of a lane (or of the serial timeline) that computes NVMe picks in arrival order, with the reads'
    arrival spread.

    Deterministically the lane ends at max(free, due): ``free`` if no pick waited for its bytes, ``due`` the end its
    critical read sets (the latest arrival + wake-up + the work after it). A read's lateness has two parts, both
    measured by `moetier calibrate` as a fraction of the read's latency: one the reads of a layer share (they are
    issued together and are late together: the wait for a layer's first read is E[max(0, X)], 0.70 ms against
    0.03 for its mean X, and charging every read an independent spread over-predicted the stall 4-12x) and one of
    each read's own. The own parts make the due time the max of normals (folded pairwise, ``_max_normal``); the
    shared part is one draw per layer, of sd cv_shared x the critical read's latency. ``extra`` is what the spread
    adds to the deterministic end, in expectation."""

    __slots__ = ("free", "due", "lat", "m", "v", "own")

    def __init__(self, free: float, own: float):
        self.free, self.due, self.lat, self.m, self.v, self.own = free, -INF, 0.0, -INF, 0.0, own

    def add(self, busy: float, ready: float, a: float, xv: float = 0.0) -> None:
        """A pick that keeps the lane ``busy`` ms more when its bytes are there; ``ready`` is when the lane could
        end it if it waited for them (arrival + wake-up + its work); ``a`` is its read's latency; ``xv`` a variance
        of its arrival beyond the read's own (a claim's race, _plan_nvme)."""
        self.free += busy
        xv += (self.own * a) ** 2
        if self.due == -INF:
            self.due, self.lat, self.m, self.v = ready, a, ready, xv
            return
        self.due += busy
        if ready > self.due:
            self.due, self.lat = ready, a
        self.m, self.v = _max_normal(self.m + busy, self.v, ready, xv)

    def shift(self, busy: float) -> None:
        """Time the timeline spends on something else (the serial engine's admissions) before the next pick."""
        self.free += busy
        if self.due != -INF:
            self.due += busy
            self.m += busy

    def extra(self, shared: float, lane_sd: float = 0.0) -> float:
        """``shared``: the layer's shared lateness as a fraction of the critical read's latency; ``lane_sd``: the
        lane's own lateness (ms), which races the reads the same way."""
        if self.due == -INF:
            return 0.0
        d = self.due - self.free
        sd = math.sqrt(self.v + (shared * self.lat) ** 2 + lane_sd * lane_sd)
        return late(self.m - self.free, sd) - (d if d > 0.0 else 0.0)


def _plan_nvme(ctx, plan, picks, keys, t0, nvme, g, g_on, c, c_on, ahead=0.0, head=0.0, dealt=None):
    """``dealt``: (the NVMe picks dealt to the cpu lane, those dealt to the gpu lane), each in the order it runs,
    where another plan chose (plan_layer's ``lanes``); None: each pick goes, in arrival order, to the lane that
    ends it sooner on ctx's costs."""
    gpu, cpu = ctx.gpu, ctx.cpu
    push = ctx.push_ms
    arr = plan.arrivals
    fresh, race = [], {}
    for k in keys:
        a, p, a_pf = nvme.claim(k, t0) if nvme.pf else (None, 0.0, None)
        if a is None:
            fresh.append(k)
        else:
            arr[k] = a
        if 0.0 < p < 1.0:
            race[k] = (p, a_pf)
    if fresh:
        for k, a in zip(fresh, nvme.demand(t0, len(fresh))):
            arr[k] = a
        plan.demand_reads = len(fresh)
    # a claim the model decided one way may go the other in the runtime: the pick's arrival is the mixture of its
    # prefetch read (started, with chance p) and a demand read issued now; the mixture's variance joins its own
    xvar = {}
    for k, (p, a_pf) in race.items():
        a_d = arr[k] if k in fresh else nvme.read_now(t0, len(fresh))
        m = p * a_pf + (1.0 - p) * a_d
        arr[k], xvar[k] = m, p * (1.0 - p) * (a_pf - a_d) ** 2
    can_gpu = gpu is not None      # a gpu lane exists only with a VRAM tier (from_recipe)
    if dealt is not None:
        order, to_cpu = dealt[0] + dealt[1], set(dealt[0])
    else:
        # arrival order; demand reads come back in issue order, so only promoted prefetches need a sort
        order = sorted(keys, key=arr.__getitem__) if len(keys) > 1 and (len(fresh) < len(keys) or race) else keys
        to_cpu = None
    wake = nvme.wake
    if not ctx.overlap:
        _serial_nvme(ctx, plan, picks, order, arr, t0, g, c, c_on, can_gpu, wake, nvme, ahead, head, to_cpu, xvar)
        return
    wait = gwait = 0.0
    spread = nvme.spread
    # the cpu lane is the host's: its NVMe picks start past the head (c is its end on the host timeline here, its
    # busy time once the head is taken off again below)
    c += head
    plan.wait_from = c
    # after a blocked wait the cpu lane resumes past the wake-up and then runs its call slower (per_after_wait_ms)
    cpu_resume = wake + ctx.cpu_after_wait
    if spread:
        cf, gf = _Finish(c, nvme.cv_own), _Finish(g, nvme.cv_own)
        xv = xvar.get
    for k in order:
        a = arr[k] - t0
        if a < 0.0:
            a = 0.0
        m = picks[k]
        if cpu:
            # the call is made once the bytes are there: its set-up follows the wait, it does not hide under it
            cs = c
            cw = (ctx.cpu_call if c_on or ctx.cpu_pmin > 1 else cpu[0]) + cpu[1] + cpu[2] * (m - 1)
            ce = cs + cw if cs >= a else a + cpu_resume + cw
        else:
            ce = INF
        if can_gpu:
            gs = g if g_on else g + gpu[0]
            ap = a + push if gs >= a else a + wake + push
            gw = gpu[1] + gpu[2] * (m - 1)
            ge = (gs if gs > ap else ap) + gw
        else:
            ge = INF
        if ce == INF and ge == INF:
            raise ValueError("no lane can compute an NVMe pick: the recipe needs a cpu lane or a VRAM tier")
        if (ce if ce > g else g) <= (c if c > ge else ge) if to_cpu is None else k in to_cpu:
            if a > cs:
                wait += a + wake - cs
            if spread:
                cf.add(cs - c + cw, a + cpu_resume + cw, a, xv(k, 0.0))
            c = ce
            c_on = True
            plan.nvme_cpu.append(k)
        else:
            if ap > gs:
                wait += ap - gs
                gwait += ap - gs
            if spread:
                gf.add(gs - g + gw, a + wake + push + gw, a, xv(k, 0.0))
            g = ge
            g_on = True
            plan.nvme_gpu.append(k)
    if spread:
        dc, dg = cf.extra(nvme.cv_shared, nvme.lane_sd), gf.extra(nvme.cv_shared, nvme.lane_sd)
        c += dc
        g += dg
        wait += dc + dg
        gwait += dg
    plan.nvme_wait_ms = wait
    plan.gpu_wait_ms = gwait
    plan.gpu_ms, plan.cpu_ms = g, c - head


def _serial_nvme(ctx, plan, picks, order, arr, t0, g, c, c_on, can_gpu, wake, nvme, ahead=0.0, head=0.0,
                 to_cpu=None, xvar=None):
    """NVMe picks when lanes do not overlap (policy.overlap false): one timeline after the resident lanes (c + g).

    Lanes: each pick, in arrival order, goes to the lane that ends it sooner (``to_cpu``: the picks another plan
    dealt to the cpu lane, the rest to the gpu lane, ``order`` theirs). Time, in the order the serial runtime
    runs them (moetier.runtime.Runtime.layer): the cpu lane's NVMe picks, each waiting for its bytes (and the
    wake-up and the cpu lane's after-wait cost, if it had to wait); then the admissions of the layer's zerocopy
    picks (``ahead`` ms of copies, booked by the simulator after the layer, not here: the gpu picks' reads land
    meanwhile); then the gpu lane's NVMe picks, whose push to VRAM follows the read and is booked as stall (read +
    stage); each is a lane call of its own, so it pays the gpu lane's per-call cost (``per_layer_ms``) every time.
    The host's ``head`` (its work before the first wait) runs after the resident lanes, before the first NVMe
    pick, in the reads' time. Each pick's work is added to its lane's busy time, so g + c is the timeline's end
    less ``ahead`` and the head. The arrival spread (``_Finish``) adds to the lane of the timeline's last pick."""
    def cpu_work(on, m):            # an inline call (the lane's per_layer if it is the lane's first)
        cpu = ctx.cpu
        return (ctx.cpu_call if on or ctx.cpu_pmin > 1 else cpu[0]) + cpu[1] + cpu[2] * (m - 1)

    def gpu_work(m):                # the push, then the kernel: a call of its own (the runtime's), per_layer each
        gpu = ctx.gpu
        return ctx.push_ms + gpu[0] + gpu[1] + gpu[2] * (m - 1)

    push = ctx.push_ms
    due = {k: (arr[k] - t0 if arr[k] > t0 else 0.0) for k in order}    # arrival, from the layer's start
    has_cpu = ctx.cpu is not None
    if to_cpu is not None:
        plan.nvme_cpu += [k for k in order if k in to_cpu]
        plan.nvme_gpu += [k for k in order if k not in to_cpu]
    else:
        lg, lc, lc_on = g, c, c_on       # the lane choice's own timeline, in arrival order
        for k in order:
            a, m = due[k], picks[k]
            now = lg + lc + head
            ready = a + wake if a > now else a
            start = now if now > ready else ready
            ce = start + cpu_work(lc_on, m) + (ctx.cpu_after_wait if a > now else 0.0) if has_cpu else INF
            ge = start + gpu_work(m) if can_gpu else INF
            if ce == INF and ge == INF:
                raise ValueError("no lane can compute an NVMe pick: the recipe needs a cpu lane or a VRAM tier")
            if ce <= ge:
                lc, lc_on = ce - lg - head, True
                plan.nvme_cpu.append(k)
            else:
                lg = ge - lc - head
                plan.nvme_gpu.append(k)
    now = plan.wait_from = g + c + head
    wait = gwait = 0.0
    spread = nvme.spread
    fin = _Finish(now, nvme.cv_own) if spread else None
    for on_gpu, keys in ((False, plan.nvme_cpu), (True, plan.nvme_gpu)):
        if on_gpu and keys and ahead:
            now += ahead
            if spread:
                fin.shift(ahead)
        for k in keys:
            a, m = due[k], picks[k]
            ready = a + wake if a > now else a
            idle = ready - now if ready > now else 0.0
            if on_gpu:
                work, late = gpu_work(m), 0.0
                step = idle + work
                wait += idle + push
                gwait += idle + push
                g += step
            else:     # a call right after a blocked wait pays late on top
                work, late = cpu_work(c_on, m), ctx.cpu_after_wait
                step = idle + work + (late if idle else 0.0)
                wait += idle
                c += step
                c_on = True
            now += step
            if spread:
                fin.add(work, a + wake + late + work, a, xvar.get(k, 0.0) if xvar else 0.0)
    d = fin.extra(nvme.cv_shared, nvme.lane_sd) if spread else 0.0
    if d:
        wait += d
        if plan.nvme_gpu:
            g += d
            gwait += d
        else:
            c += d
    plan.nvme_wait_ms = wait
    plan.gpu_wait_ms = gwait
    plan.gpu_ms, plan.cpu_ms = g, c
