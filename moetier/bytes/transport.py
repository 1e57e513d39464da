"""Portable NVMe side of the transport: an O_DIRECT record reader filling the slots of a RAM slot pool.

Contract (see docs/store.md):

- ``Reader.fill(key, slot)`` submits one asynchronous positional read of record ``key`` into pool slot ``slot`` and
  returns a ``Completion`` whose ``seq`` is one more than the previous submit's.
- ``Reader.landed(handle)`` is a non-blocking poll. It returns True only once the bytes are in the slot and, when the
  read was sampled for verification, the digest matched. A failed read (short read, OSError, checksum mismatch) makes
  ``landed`` raise ``TransportError``; the completion's state is then "failed" and the slot is zeroed, so its bytes
  must never be used.
- ``Reader.completed_seq()`` is the highest ``s`` such that every submit with ``seq <= s`` is finished (landed or
  failed): completion polling by sequence number.
- ``Reader.fence(timeout=None)`` waits for every outstanding read; it does not raise (failures surface on
  ``landed``/``wait``). ``close()`` wakes the reads the fault seam holds back, then fences.

The slot pool (``SlotPool``, ``PAGE``, ``HUGE``, ``TransportError``, ``PoolExhausted``) lives in moetier.bytes.pool
and the fault seam (``FaultPlan``, ``FAULT_KINDS``) in moetier.bytes.faults; both are re-exported here, where callers
import them from.
"""

from __future__ import annotations

import errno
import os
import threading
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as _FutTimeout
from functools import partial

from moetier.bytes import faults as _faults
from moetier.bytes.faults import FAULT_KINDS, FaultPlan  # noqa: F401  (re-exported)
from moetier.bytes.layout import digest as record_digest   # the store format owns its checksum
from moetier.bytes.teardown import close_all
from moetier.bytes.pool import (HUGE, PAGE, BufferSlotPool, PoolExhausted, SlotPool,  # noqa: F401  (re-exported)
                                TransportError, _round_up, smaps_huge_bytes)

__all__ = ["BufferSlotPool", "Completion", "FAULT_KINDS", "FaultPlan", "HUGE", "PAGE", "PoolExhausted", "Reader",
           "SlotPool", "TransportError", "smaps_huge_bytes"]

# Paths (directories) already warned about an O_DIRECT refusal: the warning is printed once per process per folder.
_WARNED: set = set()


class Completion:
    """Handle for one fill: ``seq`` (monotonic), ``key``, ``slot``, ``state`` in pending|landed|failed, ``error``."""

    __slots__ = ("seq", "key", "slot", "state", "error", "verified", "read_ms", "_future", "prefetch", "started",
                 "t_submit", "qd", "t_landed", "burst", "pf_busy", "t_started")

    def __init__(self, seq: int, key: int, slot: int):
        self.seq = seq
        self.key = key
        self.slot = slot
        self.state = "pending"
        self.error: str | None = None
        self.verified = False
        self.read_ms = 0.0
        self._future = None
        self.prefetch = False
        self.started = False
        self.t_submit = 0.0
        self.qd = 0            # demand reads outstanding when this one was submitted (itself included)
        self.t_started = 0.0   # perf_counter when a worker took it up (a prefetch read: once no demand read was left)
        self.t_landed = 0.0    # perf_counter when the worker marked it landed
        self.burst = 0         # demand reads submitted while others of this burst were outstanding share one
        self.pf_busy = False   # a prefetch read was in service when this demand read was submitted

    def __repr__(self):
        err = f", error={self.error!r}" if self.error else ""
        return f"Completion(seq={self.seq}, key={self.key}, slot={self.slot}, state={self.state}{err})"


class Reader:
    """Fill engine: asynchronous record -> slot reads with O_DIRECT on a thread pool of ``queue_depth`` workers.

    ``store`` needs ``data_path``, ``record_bytes``, ``nrecords``, ``offset(key)`` and ``digest(key)`` (a
    ``moetier.store.Store`` has them). ``verify_rate`` is the fraction of reads whose landed bytes are checked against
    the manifest digest (deterministic: read number i is sampled when floor((i+1)*rate) > floor(i*rate)).
    """

    def __init__(self, store, pool, *, queue_depth: int = 16, verify_rate: float = 1.0, direct: bool = True,
                 faults=None):
        if int(queue_depth) < 1:
            raise ValueError(f"Reader: queue_depth must be >= 1, got {queue_depth}")
        if not 0.0 <= float(verify_rate) <= 1.0:
            raise ValueError(f"Reader: verify_rate must be in [0, 1], got {verify_rate}")
        self.store = store
        self.pool = pool
        self.record_bytes = int(store.record_bytes)
        if pool.slot_bytes < self.record_bytes:
            raise ValueError(f"Reader: pool slot_bytes {pool.slot_bytes} < record_bytes {self.record_bytes}")
        self.queue_depth = int(queue_depth)
        self.verify_rate = float(verify_rate)
        self.faults = faults
        self.path = os.fspath(store.data_path)
        self.direct = False
        self._fd = self._open(direct)
        self._lock = threading.Lock()
        self._cv = threading.Condition(self._lock)
        self._seq = 0
        self._done_seq = 0  # completed_seq watermark
        self._done_above: set = set()
        self._pending: dict = {}
        self._busy_slots: set = set()
        self._submitted = 0
        self.stats = {"reads": 0, "bytes": 0, "checksum_checked": 0, "checksum_failures": 0, "read_ms": 0.0,
                      "failures": 0, "short_reads": 0, "io_errors": 0}
        self._pool = ThreadPoolExecutor(max_workers=self.queue_depth, thread_name_prefix="moetier-fill")
        # prefetch reads: one low-priority worker that starts a read only while no demand read is outstanding
        self._pf_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="moetier-prefetch")
        self._demand = 0
        self.stats["cancelled"] = 0
        # submit-to-landed ms of demand reads by the demand queue depth they joined: the channel model's measured
        # input, for reads that found no prefetch read in service (one that did shares the device with it; the
        # model gives it the plain latency, and keeping it out keeps the tables the plain reads')
        self.latency_by_qd: dict[int, list] = {}
        self._pf_busy = 0               # prefetch reads in service
        # ms from a read landing to the thread blocked in wait() resuming (the GIL and the scheduler hand it back
        # later than the bytes arrived): the channel model's wake-up term, sampled only where wait() really blocked
        self.wake_ms: list = []
        # (burst, queue depth, submit-to-landed ms) of demand reads: a burst starts with a read that finds no other
        # demand read outstanding (one layer's reads, in the runtime), so its reads' shared lateness can be told
        # from each one's own (the channel model's spread terms, moetier.calibrate.fit_channel)
        self.burst_ms: list = []
        self._bursts = 0
        self._closed = False
        self._closing = threading.Event()   # set by close(): a read the fault seam holds back gives up at once

    # opening ------------------------------------------------------------------------------------------------------
    def _open(self, direct: bool) -> int:
        flag = getattr(os, "O_DIRECT", 0)
        if direct and flag:
            try:
                fd = os.open(self.path, os.O_RDONLY | flag)
                self.direct = True
                return fd
            except OSError as e:
                if e.errno != errno.EINVAL:
                    raise
                self._warn_refused()
        elif direct and not flag:
            self._warn_refused()
        return os.open(self.path, os.O_RDONLY)

    def _warn_refused(self) -> None:
        where = os.path.dirname(os.path.abspath(self.path))
        if where in _WARNED:
            return
        _WARNED.add(where)
        warnings.warn(f"transport: O_DIRECT refused by {where}; using buffered reads", RuntimeWarning, stacklevel=3)

    # submit / poll ------------------------------------------------------------------------------------------------
    def fill(self, key: int, slot: int, *, prefetch: bool = False) -> Completion:
        """Read record ``key`` into ``slot``. ``prefetch=True``: low priority - the read waits while any demand read
        is outstanding and can be cancelled until it starts."""
        key = int(key)
        slot = int(slot)
        if not 0 <= key < int(self.store.nrecords):
            raise ValueError(f"Reader.fill: key {key} out of range 0..{int(self.store.nrecords) - 1}")
        self.pool.check_index(slot)
        with self._lock:
            if self._closed:
                raise TransportError("Reader: closed")
            if slot in self._busy_slots:
                raise TransportError(f"Reader.fill: slot {slot} already has a read in flight")
            self._busy_slots.add(slot)
            self._seq += 1
            c = Completion(self._seq, key, slot)
            i = self._submitted
            self._submitted += 1
            sample = int((i + 1) * self.verify_rate) > int(i * self.verify_rate)
            self._pending[c.seq] = c
            c.prefetch = bool(prefetch)
            c.t_submit = time.perf_counter()
            if not prefetch:
                self._demand += 1
                c.qd = self._demand
                c.pf_busy = self._pf_busy > 0
                if c.qd == 1:
                    self._bursts += 1
                c.burst = self._bursts
            c._future = (self._pf_pool if prefetch else self._pool).submit(self._run, c, sample)
        return c

    def begin_measured(self) -> None:
        """Clear the read-timing samples, so that they cover the measured steps only (not seeding's deep queue)."""
        with self._lock:
            for samples in (self.latency_by_qd, self.wake_ms, self.burst_ms):
                samples.clear()

    def read_timing(self) -> dict:
        """Copies of the read-timing samples since begin_measured (the channel model's measured inputs)."""
        with self._lock:
            return {"latency_by_qd": {q: list(v) for q, v in self.latency_by_qd.items()},
                    "wake_ms": list(self.wake_ms), "burst_ms": list(self.burst_ms)}

    def cancel(self, handle: Completion) -> bool:
        """Withdraw a read that has not started (a prefetch nobody needs any more). True if it was withdrawn; its
        slot is free again and it never lands."""
        with self._cv:
            if handle.state != "pending" or handle.started:
                return False
            handle.state = "cancelled"
            handle.error = f"transport: read of key {handle.key} cancelled"
            self.stats["cancelled"] += 1
            self._finish_locked(handle)
            return True

    def landed(self, handle: Completion) -> bool:
        st = handle.state
        if st == "landed":
            return True
        if st in ("failed", "cancelled"):
            raise TransportError(handle.error)
        return False

    def completed_seq(self) -> int:
        return self._done_seq

    @property
    def outstanding(self) -> int:
        return len(self._pending)

    def wait(self, handle: Completion, timeout: float | None = None) -> Completion:
        """Block until the read finishes; raise TransportError if it failed, TimeoutError on timeout."""
        fut = handle._future
        if fut is not None:
            blocked = handle.state == "pending"
            try:
                fut.result(timeout)
            except _FutTimeout:
                raise TimeoutError(f"transport: key {handle.key} (seq {handle.seq}) not landed after {timeout}s")
            if blocked and handle.state == "landed" and len(self.wake_ms) < 4096:
                self.wake_ms.append((time.perf_counter() - handle.t_landed) * 1000.0)
        self.landed(handle)
        return handle

    def fence(self, timeout: float | None = None) -> bool:
        """Wait for every outstanding read (landed or failed), at most ``timeout`` seconds (None: no limit).
        Returns whether none is left. Does not raise."""
        with self._cv:
            return self._cv.wait_for(lambda: not self._pending, timeout)

    def close(self) -> None:
        if self._closed:
            return
        self._closing.set()
        self.fence()
        with self._lock:
            self._closed = True
        close_all((self._pool.shutdown, self._pf_pool.shutdown, partial(os.close, self._fd)))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # worker -------------------------------------------------------------------------------------------------------
    def _read(self, slot: int, offset: int, nbytes: int) -> int:
        parent, sub = self.pool.buffer(slot, nbytes)
        try:
            got = 0
            while got < nbytes:
                n = os.preadv(self._fd, [sub[got:]], offset + got)
                if n <= 0:
                    break
                got += n
            return got
        finally:
            sub.release()
            parent.release()

    def _finish_locked(self, c: Completion) -> None:
        """Bookkeeping when a read finished (landed, failed, cancelled); caller holds the lock."""
        if not c.prefetch and c.state != "cancelled":
            self._demand -= 1
        elif c.prefetch and c.started:
            self._pf_busy -= 1
        self._busy_slots.discard(c.slot)
        self._pending.pop(c.seq, None)
        if c.seq == self._done_seq + 1:
            self._done_seq = c.seq
            while self._done_seq + 1 in self._done_above:
                self._done_seq += 1
                self._done_above.discard(self._done_seq)
        else:
            self._done_above.add(c.seq)
        self._cv.notify_all()

    def _run(self, c: Completion, sample: bool) -> None:
        """A worker's whole read: start (a prefetch waits out the demand reads), read through the fault seam, verify
        when sampled, zero a failed slot, then book it and finish it under the lock. It never leaves ``c`` pending."""
        if not self._start(c):
            return
        t0 = time.perf_counter()
        got, kind, err = self._attempt(c)
        ms = (time.perf_counter() - t0) * 1000.0
        verified = bad_sum = False
        if err is None and sample:
            verified, err = self._verify(c)
            bad_sum = err is not None
        if err is not None:
            try:
                self.pool.zero(c.slot)  # failed bytes must never be used
            except Exception:
                pass
        with self._cv:
            self._book(got, ms, kind if not bad_sum else "checksum", err, verified)
            c.read_ms = ms
            c.verified = verified
            c.error = err
            c.state = "failed" if err is not None else "landed"
            c.t_landed = time.perf_counter()
            if err is None:
                self._sample_timing(c)
            self._finish_locked(c)

    def _start(self, c: Completion) -> bool:
        """Take ``c`` up; a prefetch read first waits while any demand read is outstanding. False: it was cancelled
        before it started."""
        with self._cv:
            if c.prefetch:
                while self._demand > 0 and c.state == "pending" and not self._closed:
                    self._cv.wait(0.05)
            if c.state != "pending":
                return False
            c.started = True
            c.t_started = time.perf_counter()
            if c.prefetch:
                self._pf_busy += 1
        return True

    def _attempt(self, c: Completion) -> tuple:
        """Read record ``c.key`` into its slot through the fault seam: (bytes got, failure kind "short" | "io" |
        None, one-line error | None)."""
        rb = self.record_bytes
        got = 0
        try:
            action = self.faults(c.key) if self.faults is not None else None
            held = _faults.held_s(self.faults, action)
            if held and self._closing.wait(held):    # a late completion; closing must not wait for it
                raise OSError(errno.ECANCELED, "reader closed while the read was held back")
            got = self._read(c.slot, int(self.store.offset(c.key)), _faults.want_bytes(action, rb))
            _faults.after_read(action, lambda: self.pool.view(c.slot))
        except OSError as e:
            return got, "io", f"transport: read of key {c.key} from {self.path} failed: {e.strerror or e}"
        except Exception as e:  # never leave a completion pending
            return got, "io", f"transport: read of key {c.key} from {self.path} failed: {type(e).__name__}: {e}"
        if got != rb:
            return got, "short", (f"transport: short read of key {c.key} from {self.path}: got {got} of {rb} bytes "
                                  f"(expected {rb})")
        return got, None, None

    def _verify(self, c: Completion) -> tuple:
        """(checked, error | None): the landed bytes against the manifest digest (unchecked where it has none)."""
        try:
            want = self.store.digest(c.key)
            if want is None:
                return False, None
            parent, sub = self.pool.buffer(c.slot, self.record_bytes)
            try:
                have = record_digest(sub)
            finally:
                sub.release()
                parent.release()
        except Exception as e:  # never leave a completion pending
            return False, f"transport: checksum of key {c.key} in {self.path} not computed: {type(e).__name__}: {e}"
        if have != want:
            return True, f"transport: checksum mismatch for key {c.key} in {self.path} (xxh3-128)"
        return True, None

    def _book(self, got: int, ms: float, kind, err, verified: bool) -> None:
        """The read's counters (caller holds the lock); ``kind``: "short", "io", "checksum" or None."""
        s = self.stats
        s["reads"] += 1
        s["bytes"] += got
        s["read_ms"] += ms
        s["checksum_checked"] += verified
        s["checksum_failures"] += kind == "checksum"
        s["short_reads"] += kind == "short"
        s["io_errors"] += kind == "io"
        s["failures"] += err is not None

    def _sample_timing(self, c: Completion) -> None:
        """A landed demand read's timing sample, for the channel model's fits (caller holds the lock); a prefetch
        read, or a demand read that shared the device with one, is not sampled."""
        if c.prefetch or c.pf_busy:
            return
        ms = (c.t_landed - c.t_submit) * 1000.0
        samples = self.latency_by_qd.setdefault(c.qd, [])
        if len(samples) < 4096:
            samples.append(ms)
        if len(self.burst_ms) < 16384:    # a burst with a read left out is not counted (burst_means)
            self.burst_ms.append((c.burst, c.qd, ms))
