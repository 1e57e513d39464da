"""The runtime's books: the counters a run reports and the per-call accounting the lane cost fits read.

Contract
--------
``new_stats()`` is the runtime's counter dict (every key zero): seconds per lane, wait and bookkeeping bucket, calls,
experts and extra rows per lane class, read coverage and read retries. ``inner_s(stats)`` is the seconds booked to
waits, copies and lanes, which a timed bookkeeping section subtracts from itself.

``Booking`` is a mixin of moetier.run.layer.Runtime: its ``_book_*`` methods add one lane call to ``self.stats`` and
to ``self.call_groups`` ((lane or cpu class, experts, extra rows, reads in flight) -> [calls, seconds]), the rows of
moetier.measure.calibrate's lane fits. It needs ``stats``, ``call_groups``, ``cpu_pmin``, ``cpu_workers`` and
``_split_end`` on the instance, and only books: it moves no bytes and computes nothing.
"""
from __future__ import annotations

from moetier.core.records import deal, hands_off, idle_wake


def new_stats() -> dict:
    """The runtime's counters, every one zero."""
    return dict(plan_s=0.0, book_s=0.0, lane_cpu_s=0.0, lane_gpu_s=0.0, lane_zc_s=0.0, nvme_wait_s=0.0,
                copy_s=0.0, combine_s=0.0, reads=0, masked=0, picks=0, layer_calls=0,
                cpu_bytes=0, cpu_layers=0, cpu_calls=0, cpu_experts=0, cpu_extra_rows=0,
                cpu_contended_reads=0, nvme_picks=0, nvme_layers=0, prefetch_reads=0,
                cpu_inline_calls=0, cpu_inline_experts=0, cpu_inline_extra=0, cpu_inline_s=0.0,
                cpu_inline_contended=0, cpu_split_calls=0, cpu_split_experts=0, cpu_split_extra=0,
                cpu_split_s=0.0, cpu_split_contended=0, cpu_inline_cold=0.0, cpu_split_cold=0.0,
                cpu_split_crit_cold=0.0, cpu_split_crit_extra=0, cpu_split_wake=0.0, cpu_split_handoff=0,
                cpu_inline_waited=0,
                predict_s=0.0, predict_layers=0, predict_rows=0,
                gpu_calls=0, gpu_experts=0, gpu_extra=0, zc_calls=0, zc_experts=0, zc_extra=0, copies=0,
                stage_s=0.0, read_layers=0, read_span_s=0.0, read_latency_n=0, read_latency_s=0.0,
                read_gap_sq=0.0, read_head_s=0.0, read_reads=0, read_predict=0,
                read_predict_rows=0, read_retries=0)


def inner_s(st: dict) -> float:
    """Seconds booked to waits, copies and lanes (timed inside the bookkeeping section, so taken out of it)."""
    return (st["nvme_wait_s"] + st["copy_s"] + st["stage_s"] + st["lane_cpu_s"] + st["lane_gpu_s"]
            + st["lane_zc_s"])


class Booking:
    def _book_cpu_call(self, keys, picks, t0: float, t1: float, contended: int = 0, cold: float | None = None,
                 crit: tuple | None = None, waited: bool = False) -> None:
        """cpu lane accounting per call (from t0 to t1, perf_counter seconds), split by how the backend ran it
        (inline vs split over workers): the inputs of the lane cost fit in moetier.bench.fit_cpu_lane. A split call
        also books its longest share (``crit``: cold-expert equivalents, extra rows; the plan's, else by count over
        the strided deal), whether it ends with a worker's share (spec.hands_off) and how long its worker idled
        before it (spec.idle_wake); an inline call, whether the host
        blocked on its pick's read right before it (``waited``)."""
        st = self.stats
        seconds = t1 - t0
        cls = "inline" if len(keys) < max(2, self.cpu_pmin) else "split"
        st["lane_cpu_s"] += seconds
        st["cpu_calls"] += 1
        st["cpu_contended_reads"] += contended
        st[f"cpu_{cls}_calls"] += 1
        extra = sum(picks[k] - 1 for k in keys)
        st[f"cpu_{cls}_experts"] += len(keys)
        st[f"cpu_{cls}_extra"] += extra
        st[f"cpu_{cls}_s"] += seconds
        st[f"cpu_{cls}_contended"] += contended
        st[f"cpu_{cls}_cold"] += len(keys) if cold is None else cold
        if cls == "inline":
            st["cpu_inline_waited"] += waited
        else:
            if crit is None:
                share = deal(keys, self.cpu_workers)[0]
                crit = ((len(keys) if cold is None else cold) * len(share) / len(keys),
                  sum(picks[k] - 1 for k in share))
            st["cpu_split_crit_cold"] += crit[0]
            st["cpu_split_crit_extra"] += crit[1]
            st["cpu_split_handoff"] += hands_off(len(keys), self.cpu_workers)
            if self._split_end is not None:
                st["cpu_split_wake"] += idle_wake((t0 - self._split_end) * 1e3)
            self._split_end = t1
        self._group(f"cpu_{cls}", len(keys), extra, contended, seconds)

    def _group(self, lane, experts, extra, contended, seconds) -> None:
        """Calls by shape (lane or cpu class, experts, extra rows, reads in flight): the lane fits' rows."""
        g = self.call_groups.setdefault((lane, experts, extra, contended), [0, 0.0])
        g[0] += 1
        g[1] += seconds

    def _book_device_call(self, lane, keys, picks, seconds: float, contended: int = 0) -> None:
        """gpu / zerocopy lane accounting per call: the inputs of the lane cost fit (moetier.calibrate)."""
        st = self.stats
        p = "gpu" if lane == "gpu" else "zc"
        st[f"lane_{p}_s"] += seconds
        st[f"{p}_calls"] += 1
        st[f"{p}_experts"] += len(keys)
        extra = sum(picks[k] - 1 for k in keys)
        st[f"{p}_extra"] += extra
        self._group(p, len(keys), extra, contended, seconds)
