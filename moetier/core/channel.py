"""The NVMe channel model: one read queue shared by demand reads and prefetch, as time reservations (ms).

Contract
--------
``NvmeChannel(record_bytes, bw_gbps, *, bw_qd1_gbps, latency_ms, terms)``; ``demand(t, n)`` issues n demand reads
and returns their arrival times, ``prefetch(t, keys)`` queues prefetch reads, ``claim(key, t)`` takes a prefetched
key when it is needed, ``expire(keys, t)`` drops prefetches no longer wanted, ``read_now`` prices a demand read
without issuing it. The measured terms come in one ChannelTerms (moetier.core.terms); the planner
(moetier.core.plan) reads arrivals and the spread terms off the channel. Pure: no records, no clock of its own.
"""
from __future__ import annotations

import math

from moetier.core.arrivals import INF, INV_SQRT_2PI, SQRT2, max_normal
from moetier.core.terms import ChannelTerms


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
    resumes after the read before it landed as a blocked waiter does, benchmarks/prefetch_claims.py). In the
    table model a prefetch read in service does not add to a demand read's
    depth: a demand read issued while one is in service takes ``pf_factor`` times its latency instead
    (benchmarks/bench_read_latency.py measures it), and the prefetch read
    ``pf_share`` longer per demand read (the prefetch reads queued behind it move with it). A read the worker has
    started runs to its end even when it leaves the queue (claimed, or expired unused): the next one waits for it,
    and it is in service beside the demand reads issued meanwhile. With ``pf_sd`` (a prefetch read's measured
    spread) each read's start is a distribution that the chain accumulates, and ``claim`` says how likely a read
    has started when its key is needed.

    With measured ``bursts`` the reads of a burst share the device: a burst of n demand reads issued with none in
    flight takes each position's mean latency in bursts of n (where that size was measured) instead of the depth
    table's, which averages over the burst sizes the calibration happened to see; a burst issued while a prefetch
    read is in service takes ``pf_bursts``, the same table measured on such bursts, where it has the size (the
    factor then does not apply: the stall is a small difference of large numbers, and a factor fitted across
    arms moves it far more than the latency it scales); other bursts land together, at the table's latency for
    their last read. ``wake`` is the measured delay from a read landing to the thread
    blocked on it resuming; the planner adds it to a pick whose lane had to wait for the bytes. ``cv_shared`` and
    ``cv_own`` are the measured spread of a read's latency (standard deviation over mean), the part the reads of a
    layer share and the rest: an arrival is a distribution, and the planner charges a lane its *expected* end
    (moetier.core.arrivals.Finish), not the end for mean arrivals. ``lane_sd`` is the other side of that race: the
    spread (ms) of when the host reaches a layer's first wait, one draw per layer, that the reads' spread does not
    explain.
    """

    __slots__ = ("deep", "one", "lat", "dfree", "pf", "reads", "pf_reads", "pf_cancelled",
                 "pf_wasted", "qd_table", "outstanding", "pf_svc", "pf_lat", "pf_done", "wake", "cv_shared",
                 "cv_own", "spread", "bursts", "pf_factor", "lane_sd", "pf_alone", "pf_share", "pf_bursts", "pf_var",
                 "pf_gone", "reads_beside_pf")

    def __init__(self, record_bytes: int, bw_gbps: float, *, bw_qd1_gbps: float | None = None,
                 latency_ms: float = 0.1, terms: ChannelTerms | None = None):
        """``record_bytes`` over ``bw_gbps`` (deep queue) / ``bw_qd1_gbps`` (one read) plus ``latency_ms`` on an idle
        channel: the FIFO model; ``terms`` (ChannelTerms.at_rows): what was measured, each term absent by default."""
        t = terms if terms is not None else ChannelTerms()
        # paid only by a lane that had to wait, so it is the planner's to add, not part of the arrival
        self.wake = t.wake_ms
        self.cv_shared, self.cv_own, self.lane_sd = t.cv_shared, t.cv_own, t.lane_sd
        self.pf_var = t.pf_sd ** 2
        self.spread = self.cv_shared > 0.0 or self.cv_own > 0.0 or self.lane_sd > 0.0 or self.pf_var > 0.0
        self.pf_factor, self.pf_alone, self.pf_share = t.pf_factor, t.pf_alone, t.pf_share
        self.bursts, self.pf_bursts = _burst_rows(t.bursts), _burst_rows(t.pf_bursts)
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
        self.use_table(t.latency_by_qd)

    def _in_service(self, t: float) -> list | None:
        """The [start, end, var, busy] of the prefetch read in service at t (they run one at a time), or None:
        queued, or one that left the queue but runs to its end (the worker cannot drop a read it has started).
        A read holds the worker from ``busy``: its start on the plain means, not its expected start. The two differ
        where the read follows one whose end is spread: E[max(end, issue)] lies past both, and on expected starts
        the worker would idle between two chained reads, which the runtime's worker does not
        (benchmarks/prefetch_claims.py --arm tail-prefetch-C2 counts both)."""
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
            return (*max_normal(e, v, base, 0.0), busy)
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
        decides for real, and re-issues a read that has not started as a demand read
        (benchmarks/prefetch_claims.py counts how often)."""
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
            p = 0.5 * (1.0 + math.erf(z / SQRT2))
            a = e - sd * INV_SQRT_2PI * math.exp(-0.5 * z * z) / p if p > 1e-9 else e
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

