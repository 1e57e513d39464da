"""Portable NVMe side of the transport: an O_DIRECT record reader and a 2 MiB-aligned RAM slot pool.

Contract (see docs/store.md):

- ``SlotPool`` carves ``n`` slots of ``slot_bytes`` (rounded up to 4 KiB) from one anonymous private mapping whose base
  is aligned to 2 MiB and advised ``MADV_HUGEPAGE``; each slot is 4 KiB aligned, which O_DIRECT needs.
- ``Reader.fill(key, slot)`` submits one asynchronous positional read of record ``key`` into pool slot ``slot`` and
  returns a ``Completion`` whose ``seq`` is one more than the previous submit's.
- ``Reader.landed(handle)`` is a non-blocking poll. It returns True only once the bytes are in the slot and, when the
  read was sampled for verification, the digest matched. A failed read (short read, OSError, checksum mismatch) makes
  ``landed`` raise ``TransportError``; the completion's state is then "failed" and the slot is zeroed, so its bytes
  must never be used.
- ``Reader.completed_seq()`` is the highest ``s`` such that every submit with ``seq <= s`` is finished (landed or
  failed): completion polling by sequence number.
- ``Reader.fence()`` waits for every outstanding read; it does not raise (failures surface on ``landed``/``wait``).

``FaultPlan`` is a test seam, not a fake transport: the real read always happens and the plan then damages its result
(reports it short, turns it into EIO, or flips one byte).
"""

from __future__ import annotations

import ctypes
import errno
import mmap
import os
import threading
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as _FutTimeout

import numpy as np

from moetier.bytes.layout import digest as record_digest   # the store format owns its checksum

PAGE = 4096
HUGE = 2 * 1024 * 1024

# Paths (directories) already warned about an O_DIRECT refusal: the warning is printed once per process per folder.
_WARNED: set = set()


class TransportError(RuntimeError):
    """A record read failed (short read, I/O error, checksum mismatch) or the pool/reader was misused."""


class PoolExhausted(TransportError):
    """SlotPool.alloc() with no free slot."""


def _round_up(n: int, a: int) -> int:
    return (n + a - 1) // a * a


def smaps_huge_bytes(start: int, length: int) -> int:
    """Bytes of [start, start + length) that this process has backed by transparent huge pages, from
    /proc/self/smaps: the AnonHugePages of each mapping that overlaps the range, clipped to the overlap (huge pages
    are counted whole, so a partial overlap counts the pages that lie inside it). 0 where smaps is not readable."""
    end = start + length
    total, lo, hi = 0, None, None
    try:
        with open("/proc/self/smaps") as f:
            for line in f:
                head = line.split(None, 1)[0]
                if "-" in head and not head.endswith(":"):
                    a, b = (int(x, 16) for x in head.split("-"))
                    lo, hi = (a, b) if a < end and b > start else (None, None)
                elif lo is not None and head == "AnonHugePages:":
                    huge = int(line.split()[1]) * 1024
                    total += min(huge, min(hi, end) - max(lo, start))
    except OSError:
        return 0
    return total


# ---------------------------------------------------------------------------------------------------------------------
# Slot pool


class SlotPool:
    """``n`` RAM slots of ``slot_bytes`` (rounded up to 4096) in one 2 MiB-aligned anonymous private mapping.

    The mapping is one huge page longer than the slots rounded up to whole huge pages, so that the aligned region
    always holds whole huge pages, whatever the pool's size: a pool smaller than 2 MiB can be backed by one too.
    ``hugepage=False`` skips madvise(MADV_HUGEPAGE) (4 KiB pages; the bench uses it as a control arm).
    ``self.hugepage`` tells whether the advice was accepted; ``huge_bytes()`` tells how many bytes of the slots the
    kernel actually backs with huge pages (from /proc/self/smaps), which is what a measurement should report.
    """

    def __init__(self, n: int, slot_bytes: int, *, hugepage: bool = True):
        if int(n) < 1:
            raise ValueError(f"SlotPool: n must be >= 1, got {n}")
        if int(slot_bytes) < 1:
            raise ValueError(f"SlotPool: slot_bytes must be >= 1, got {slot_bytes}")
        self.n = int(n)
        self.slot_bytes = _round_up(int(slot_bytes), PAGE)
        self.nbytes = self.n * self.slot_bytes
        flags = getattr(mmap, "MAP_PRIVATE", 0) | getattr(mmap, "MAP_ANONYMOUS", 0)
        total = _round_up(self.nbytes, HUGE) + HUGE
        if flags:
            self._mm = mmap.mmap(-1, total, flags=flags, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        else:  # pragma: no cover - non-POSIX
            self._mm = mmap.mmap(-1, total)
        cbuf = ctypes.c_char.from_buffer(self._mm)
        raw = ctypes.addressof(cbuf)
        del cbuf  # release the buffer export so close() works
        self._off = (-raw) % HUGE
        self.base = raw + self._off
        self.hugepage = False
        if hugepage and hasattr(self._mm, "madvise") and hasattr(mmap, "MADV_HUGEPAGE"):
            try:
                self._mm.madvise(mmap.MADV_HUGEPAGE, self._off, _round_up(self.nbytes, HUGE))
                self.hugepage = True
            except (OSError, ValueError):
                pass
        self._free = list(range(self.n))  # kept sorted descending so pop() hands out the lowest index
        self._free.reverse()
        self._isfree = [True] * self.n
        self._lock = threading.Lock()
        self._closed = False

    # allocation ---------------------------------------------------------------------------------------------------
    def alloc(self) -> int:
        with self._lock:
            self._check_open()
            if not self._free:
                raise PoolExhausted(f"SlotPool: all {self.n} slots are in use")
            i = self._free.pop()
            self._isfree[i] = False
            return i

    def free(self, i: int) -> None:
        with self._lock:
            self._check_open()
            self._check_index(i)
            if self._isfree[i]:
                raise ValueError(f"SlotPool.free: slot {i} is already free")
            self._isfree[i] = True
            self._free.append(i)
            self._free.sort(reverse=True)

    @property
    def nfree(self) -> int:
        return len(self._free)

    # addressing ---------------------------------------------------------------------------------------------------
    def addr(self, i: int) -> int:
        self._check_index(i)
        return self.base + i * self.slot_bytes

    def view(self, i: int) -> np.ndarray:
        """Zero-copy uint8 view of slot ``i`` (len slot_bytes). Drop views before close()."""
        self._check_open()
        self._check_index(i)
        return np.frombuffer(self._mm, dtype=np.uint8, count=self.slot_bytes, offset=self._off + i * self.slot_bytes)

    def _memoryview(self, i: int, nbytes: int) -> tuple:
        """(parent, sub) memoryviews over the first nbytes of slot i; the caller releases both."""
        parent = memoryview(self._mm)
        start = self._off + i * self.slot_bytes
        return parent, parent[start:start + nbytes]

    def huge_bytes(self) -> int:
        """Bytes of the slots backed by huge pages now (0 where /proc/self/smaps is not readable).

        Pages are backed on first touch, so a fresh pool reports 0 until its slots are written."""
        return smaps_huge_bytes(self.base, self.nbytes)

    def _zero(self, i: int) -> None:
        start = self._off + i * self.slot_bytes
        self._mm[start:start + self.slot_bytes] = bytes(self.slot_bytes)

    def _check_index(self, i) -> None:
        if not isinstance(i, (int, np.integer)) or not 0 <= int(i) < self.n:
            raise ValueError(f"SlotPool: slot index {i!r} out of range 0..{self.n - 1}")

    def _check_open(self) -> None:
        if self._closed:
            raise TransportError("SlotPool: closed")

    # lifetime -----------------------------------------------------------------------------------------------------
    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._mm.close()
        except BufferError:
            # A caller still holds a view(); the mapping is unmapped when the last view is dropped.
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return f"SlotPool(n={self.n}, slot_bytes={self.slot_bytes}, free={self.nfree}, base=0x{self.base:x})"


# ---------------------------------------------------------------------------------------------------------------------
# Fault injection (test seam)


class FaultPlan:
    """Test seam consulted once per read: ``plan(key)`` -> None | "short" | "eio" | "flip".

    The real read always happens first; the plan then damages the outcome: "short" reads one page less than the
    record (so the short-read check fires), "eio" raises OSError(EIO) after the read, "flip" flips one byte of the
    landed bytes (so the checksum check fires when the read is sampled). ``once=True`` makes each key's fault fire
    only on its first read (so a retry succeeds). Any callable with the same signature may be passed as ``faults``.
    """

    def __init__(self, short=(), eio=(), flip=(), *, once: bool = False, flip_at: int = 0):
        self.short = set(short)
        self.eio = set(eio)
        self.flip = set(flip)
        self.once = once
        self.flip_at = int(flip_at)
        self.fired: list = []
        self._lock = threading.Lock()

    def __call__(self, key: int):
        with self._lock:
            for name, keys in (("short", self.short), ("eio", self.eio), ("flip", self.flip)):
                if key in keys:
                    if self.once:
                        keys.discard(key)
                    self.fired.append((name, key))
                    return name
        return None


# ---------------------------------------------------------------------------------------------------------------------
# Reader


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

    def __init__(self, store, pool: SlotPool, *, queue_depth: int = 16, verify_rate: float = 1.0, direct: bool = True,
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
        self.pool._check_index(slot)
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

    def fence(self) -> None:
        """Wait for every outstanding read (landed or failed). Does not raise."""
        with self._cv:
            while self._pending:
                self._cv.wait()

    def close(self) -> None:
        if self._closed:
            return
        self.fence()
        with self._lock:
            self._closed = True
        self._pool.shutdown(wait=True)
        self._pf_pool.shutdown(wait=True)
        try:
            os.close(self._fd)
        except OSError:
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # worker -------------------------------------------------------------------------------------------------------
    def _read(self, slot: int, offset: int, nbytes: int) -> int:
        parent, sub = self.pool._memoryview(slot, nbytes)
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
        with self._cv:
            if c.prefetch:
                while self._demand > 0 and c.state == "pending" and not self._closed:
                    self._cv.wait(0.05)
            if c.state != "pending":        # cancelled before it started
                return
            c.started = True
            c.t_started = time.perf_counter()
            if c.prefetch:
                self._pf_busy += 1
        rb = self.record_bytes
        err = None
        kind = None
        got = 0
        t0 = time.perf_counter()
        try:
            action = self.faults(c.key) if self.faults is not None else None
            want = rb - PAGE if action == "short" and rb > PAGE else rb
            got = self._read(c.slot, int(self.store.offset(c.key)), want)
            if action == "eio":
                raise OSError(errno.EIO, os.strerror(errno.EIO))
            if action == "flip":
                v = self.pool.view(c.slot)
                v[0] ^= 0xFF  # the fault seam damages the landed bytes
                del v
            if got != rb:
                kind = "short"
                err = (f"transport: short read of key {c.key} from {self.path}: got {got} of {rb} bytes "
                       f"(expected {rb})")
        except OSError as e:
            kind = "io"
            err = f"transport: read of key {c.key} from {self.path} failed: {e.strerror or e}"
        except Exception as e:  # never leave a completion pending
            kind = "io"
            err = f"transport: read of key {c.key} from {self.path} failed: {type(e).__name__}: {e}"
        ms = (time.perf_counter() - t0) * 1000.0
        verified = False
        bad_sum = False
        if err is None and sample:
            want_digest = self.store.digest(c.key)
            if want_digest is not None:
                parent, sub = self.pool._memoryview(c.slot, rb)
                try:
                    have = record_digest(sub)
                finally:
                    sub.release()
                    parent.release()
                verified = True
                if have != want_digest:
                    bad_sum = True
                    err = f"transport: checksum mismatch for key {c.key} in {self.path} (xxh3-128)"
        if err is not None:
            try:
                self.pool._zero(c.slot)  # failed bytes must never be used
            except Exception:
                pass
        with self._cv:
            s = self.stats
            s["reads"] += 1
            s["bytes"] += got
            s["read_ms"] += ms
            if verified:
                s["checksum_checked"] += 1
            if bad_sum:
                s["checksum_failures"] += 1
            if kind == "short":
                s["short_reads"] += 1
            elif kind == "io":
                s["io_errors"] += 1
            if err is not None:
                s["failures"] += 1
            c.read_ms = ms
            c.verified = verified
            c.error = err
            c.state = "failed" if err is not None else "landed"
            c.t_landed = time.perf_counter()
            if err is None and not c.prefetch:
                ms = (c.t_landed - c.t_submit) * 1000.0
                if not c.pf_busy:
                    samples = self.latency_by_qd.setdefault(c.qd, [])
                    if len(samples) < 4096:
                        samples.append(ms)
                    if len(self.burst_ms) < 16384:    # a burst with a read left out is not counted (burst_means)
                        self.burst_ms.append((c.burst, c.qd, ms))
            self._finish_locked(c)
