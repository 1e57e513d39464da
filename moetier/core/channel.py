"""The NVMe channel model: one read queue shared by demand reads and prefetch, as time reservations (ms).

Contract
--------
``NvmeChannel(record_bytes, bw_gbps, *, bw_qd1_gbps, latency_ms, terms)``; ``demand(t, n)`` issues n demand reads
and returns their arrival times, ``prefetch(t, keys)`` queues prefetch reads, ``claim(key, t)`` takes a prefetched
key when it is needed, ``expire(keys, t)`` drops prefetches no longer wanted. The measured terms come in one
ChannelTerms (moetier.core.terms); the planner (moetier.core.plan) reads arrivals and the spread terms off the
channel. Pure: no records, no clock of its own.
"""
from __future__ import annotations

import numpy as np

from moetier.core.jit import kernel
from moetier.core.terms import ChannelTerms


class NvmeChannel:
    """One NVMe read queue with two priority classes (a modeled device, times in ms).

    Demand reads are served in FIFO order before any prefetch read that has not started; a prefetch read that has
    started runs to completion. Service time per record: ``deep`` when several reads are queued (streaming
    bandwidth), ``one`` for an isolated read, plus ``latency`` when the channel was idle at issue. With a measured
    latency-vs-queue-depth table (hardware ``nvme.latency_by_qd_ms``, or the engine's table under load), demand
    reads instead complete after the table's latency at the depth they join (reads run concurrently, as on a real
    multi-queue device). Prefetch reads run one at a time and start only while no demand read is in flight (the
    runtime's reader has one low-priority worker that waits for demand reads); with a measured table each takes
    the table's queue-depth-1 latency, else ``deep``, plus ``wake`` (the worker resumes after the read before it
    landed as a blocked waiter does). A prefetch read in service does not add to a demand read's depth. A read the
    worker has started runs to its end even when it leaves the queue (claimed, or expired unused): the next one
    waits for it. ``reads_beside_pf`` counts the demand reads issued while a prefetch read was in service (the
    runtime's reader marks the same).

    With measured ``bursts`` the reads of a burst share the device: a burst of n demand reads issued with none in
    flight takes each position's mean latency in bursts of n (where that size was measured) instead of the depth
    table's, which averages over the burst sizes the calibration happened to see; other bursts land together, at
    the table's latency for their last read. ``wake`` is the measured delay from a read landing to the thread
    blocked on it resuming; the planner adds it to a pick whose lane had to wait for the bytes. ``cv_shared`` and
    ``cv_own`` are the measured spread of a read's latency (standard deviation over mean), the part the reads of a
    layer share and the rest: an arrival is a distribution, and the planner charges a lane its *expected* end
    (moetier.core.arrivals.finish), not the end for mean arrivals. ``lane_sd`` is the other side of that race: the
    spread (ms) of when the host reaches a layer's first wait, one draw per layer, that the reads' spread does not
    explain.
    """

    __slots__ = ("deep", "one", "lat", "dfree", "pf", "reads", "pf_reads", "pf_cancelled", "pf_wasted", "qd_table",
                 "outstanding", "pf_svc", "pf_lat", "pf_done", "wake", "cv_shared", "cv_own", "spread", "bursts",
                 "lane_sd", "pf_gone", "reads_beside_pf", "kt", "terms")

    def __init__(self, record_bytes: int, bw_gbps: float, *, bw_qd1_gbps: float | None = None,
                 latency_ms: float = 0.1, terms: ChannelTerms | None = None):
        """``record_bytes`` over ``bw_gbps`` (deep queue) / ``bw_qd1_gbps`` (one read) plus ``latency_ms`` on an idle
        channel: the FIFO model; ``terms`` (ChannelTerms.at_rows): what was measured, each term absent by default."""
        t = terms if terms is not None else ChannelTerms()
        # paid only by a lane that had to wait, so it is the planner's to add, not part of the arrival
        self.wake = t.wake_ms
        self.cv_shared, self.cv_own, self.lane_sd = t.cv_shared, t.cv_own, t.lane_sd
        self.spread = self.cv_shared > 0.0 or self.cv_own > 0.0 or self.lane_sd > 0.0
        # the planner's per-call scalars off the channel, fixed at construction (moetier.core.plan_kernel's S)
        self.terms = (self.wake, self.spread, self.cv_own, self.cv_shared, self.lane_sd)
        self.bursts = _burst_rows(t.bursts)
        self.deep = record_bytes / (bw_gbps * 1e6)
        self.one = record_bytes / ((bw_qd1_gbps or bw_gbps) * 1e6)
        self.lat = latency_ms
        self.dfree = 0.0                 # when the last demand read completes
        self.pf: dict[int, list] = {}    # key -> [start, end] (insertion order = queue order)
        self.pf_gone: list[list] = []    # reads that left the queue (claimed or wasted) after they had started
        self.reads = self.pf_reads = self.pf_cancelled = self.pf_wasted = 0
        self.reads_beside_pf = 0         # demand reads issued while a prefetch read was in service
        self.pf_done = 0                 # prefetch reads that ran (used or wasted) whose CPU work is not yet charged
        self.outstanding: list[float] = []     # arrival times of demand reads in flight (queueing model)
        self.use_table(t.latency_by_qd)

    def _in_service(self, t: float) -> list | None:
        """The [start, end] of the prefetch read in service at t (they run one at a time), or None: queued, or one
        that left the queue but runs to its end (the worker cannot drop a read it has started)."""
        for rec in self.pf.values():
            if rec[0] < t < rec[1]:
                return rec
        for rec in self.pf_gone:
            if rec[0] < t < rec[1]:
                return rec
        return None

    def _running_end(self, t: float) -> float:
        """End of the prefetch read in service at t (t if none)."""
        rec = self._in_service(t)
        return rec[1] if rec is not None else t

    def _worker_free(self, base: float, rec) -> float:
        """When the prefetch worker can start a read, not before ``base``, behind ``rec`` (the last read queued
        before it, or None) and the reads that left the queue still running."""
        e = base
        for r in (rec, *self.pf_gone) if rec is not None else self.pf_gone:
            if r[1] > e:
                e = r[1]
        return e

    def _repack(self, t: float) -> None:
        """Reschedule prefetch reads that have not started at t after all demand work."""
        cur = self._worker_free(max(t, self.dfree), self._in_service(t))
        svc = self.pf_svc
        for rec in self.pf.values():
            if rec[0] >= t:
                rec[0] = cur
                cur += svc
                rec[1] = cur

    def use_table(self, table: dict | None) -> None:
        """Switch the queueing model's latency-vs-queue-depth table (e.g. the one measured at this many rows)."""
        # queueing model (measured): completion time of a read that joins q outstanding reads
        self.qd_table = sorted((int(q), float(v)) for q, v in (table or {}).items())
        self.kt = _terms(self)
        if self.qd_table:
            self.pf_svc, self.pf_lat = self.latency_at(1) + self.wake, 0.0
        else:
            self.pf_svc, self.pf_lat = self.deep + self.wake, self.lat

    def latency_at(self, q: int) -> float:
        """Measured completion time at queue depth q: piecewise linear; beyond the table, linear in q (bandwidth)."""
        return latency_at(self.kt, q)

    @property
    def demand_only(self) -> bool:
        """No prefetch read is queued or still running: a demand read's arrival depends on the demand reads alone
        (what the planner's kernel computes itself, moetier.core.plan_gather)."""
        return not self.pf and not self.pf_gone

    def demand(self, t: float, n: int) -> list[float]:
        """Issue n demand reads at t; returns their arrival times (ms)."""
        if n <= 0:
            return []
        out = np.empty(n)
        if self.qd_table:
            if self._in_service(t) is not None:
                self.reads_beside_pf += n
            demand_arrivals(self.kt, t, 0.0, sum(a > t for a in self.outstanding), out)
        else:
            demand_arrivals(self.kt, t, max(self.dfree, self._running_end(t)), 0, out)
        out = out.tolist()
        self.issued(t, out)
        return out

    def issued(self, t: float, out: list) -> None:
        """Book demand reads issued at t that arrive at ``out`` (``demand_arrivals``'s): the reads in flight, when
        the demand work ends, the prefetch queue behind it."""
        if self.qd_table:
            busy = [a for a in self.outstanding if a > t]
            busy.extend(out)
            self.outstanding = busy
            self.dfree = max(self.dfree, out[-1])
        else:
            self.dfree = out[-1]
        self.reads += len(out)
        if self.pf:
            self._repack(t)

    def claim(self, key: int, t: float) -> float | None:
        """The arrival of a prefetched key needed at t, or None: it has no prefetch read, or its read had not started
        (it is withdrawn and the caller issues a demand read)."""
        rec = self.pf.pop(key, None)
        if rec is None:
            return None
        self._leave(rec, t)
        if rec[0] < t:
            self.pf_done += 1
            return rec[1]
        self.pf_cancelled += 1          # withdrawn before it started: it becomes a demand read
        return None

    def _leave(self, rec, t: float) -> None:
        """A prefetch read leaves the queue at t (claimed, or expired unused): one that has started keeps the
        worker until it lands."""
        gone = [r for r in self.pf_gone if r[1] > t]
        if rec[0] < t:
            gone.append(rec)
        self.pf_gone = gone

    def prefetch(self, t: float, keys) -> list[float]:
        """Queue prefetch reads behind demand work; returns their (current) arrival times."""
        last = None
        for rec in self.pf.values():
            if last is None or rec[1] > last[1]:
                last = rec
        cur = self._worker_free(max(t, self.dfree), last)
        if cur <= t:
            cur += self.pf_lat
        out = []
        svc = self.pf_svc
        for k in keys:
            s = cur
            cur += svc
            self.pf[k] = [s, cur]
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
            self._leave(rec, t)
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


# kt: the channel's terms as its kernels read them: the model, then the depth table's points, then the measured
# bursts (each row: its size, then its latency by position; none: each read takes the table's latency at its depth)
T_TABLE, T_LAT, T_DEEP, T_ONE, T_NQ, T_N = range(6)


def _terms(ch) -> np.ndarray:
    tab, rows = ch.qd_table, ch.bursts
    return np.array([bool(tab), ch.lat, ch.deep, ch.one, len(tab), *(q for q, _ in tab), *(v for _, v in tab),
                     len(rows), *(x for n, row in rows.items() for x in (n, *row))], np.float64)


@kernel
def latency_at(kt, q):
    """The depth table's completion time at queue depth q: piecewise linear; beyond the table, linear in q (the
    device's bandwidth)."""
    m = int(kt[T_NQ])
    qs, vs = kt[T_N:T_N + m], kt[T_N + m:T_N + 2 * m]
    if q <= qs[0]:
        return vs[0]
    for i in range(1, m):
        if q <= qs[i]:
            q0, q1 = int(qs[i - 1]), int(qs[i])
            return vs[i - 1] + (vs[i] - vs[i - 1]) * (q - q0) / (q1 - q0)
    return vs[m - 1] * q / int(qs[m - 1])


@kernel
def demand_arrivals(kt, t, busy_until, q0, out):
    """The arrivals of len(out) demand reads issued at t, into ``out``. FIFO model: ``fifo_reads`` behind
    ``busy_until``. Depth table: reads run concurrently, the i-th of the batch joining ``q0`` reads in flight plus
    the i before it (the table is keyed by the depth a read joined at). Measured bursts: the reads of a burst with
    none in flight share the device and land together (a burst of 3 at 3.7 ms each, not 2.4 / 3.1 / 3.8); a size
    not measured, or one joining reads in flight, lands at the table's latency for its last read."""
    n = out.shape[0]
    if not kt[T_TABLE]:
        fifo_reads(busy_until, t, kt[T_LAT], kt[T_DEEP], kt[T_ONE], out)
        return
    at = T_N + 2 * int(kt[T_NQ])
    rows = int(kt[at])
    if rows == 0:
        for i in range(n):
            out[i] = t + latency_at(kt, q0 + i + 1)
        return
    at += 1
    for _ in range(rows):
        size = int(kt[at])
        if size == n and q0 == 0:
            for i in range(n):
                out[i] = t + kt[at + 1 + i]
            return
        at += 1 + size
    x = latency_at(kt, q0 + n)
    for i in range(n):
        out[i] = t + x


@kernel
def fifo_reads(busy_until, t, lat, deep, one, out):
    """The arrivals of len(out) demand reads issued at t in the FIFO model (no latency table), into ``out``: they
    start behind the channel's work (``busy_until``: the demand reads and the prefetch read in service), or at t
    plus the access latency on an idle channel, and each takes ``deep`` (several reads) or ``one`` (a lone read)."""
    start = busy_until if busy_until > t else t + lat
    n = out.shape[0]
    svc = deep if n > 1 else one
    for i in range(n):
        out[i] = start + svc * (i + 1)


def _burst_rows(bursts: dict | None) -> dict:
    """{n: {q: ms}} -> {n: [ms by position]}, the sizes with every position measured (else the depth table
    decides)."""
    out = {}
    for n, tab in (bursts or {}).items():
        row = {int(q): float(v) for q, v in tab.items()}
        if sorted(row) == list(range(1, int(n) + 1)):
            out[int(n)] = [row[q] for q in sorted(row)]
    return out
