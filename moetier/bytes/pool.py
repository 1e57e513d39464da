"""The RAM slot pool the transport fills: ``n`` slots of ``slot_bytes`` in one 2 MiB-aligned anonymous mapping.

Contract
--------
- The slot pool protocol (what the O_DIRECT ``Reader`` and the lanes use; a device's host pool implements the same,
  most simply by subclassing ``BufferSlotPool`` over its own allocation): ``n``, ``slot_bytes`` (a multiple of 4 KiB),
  ``nbytes``, ``base`` (address of slot 0); ``alloc()`` / ``free(i)`` / ``nfree``; ``addr(i)``; ``view(i)`` (a
  zero-copy uint8 array of slot i); ``buffer(i, nbytes)`` -> ``(parent, sub)`` memoryviews over the first ``nbytes``
  of slot i, which the caller releases (a read lands there); ``zero(i)`` (a failed read's bytes are never used);
  ``check_index(i)`` (ValueError naming the slot when out of range); ``close()``.
- ``BufferSlotPool(buf, n, slot_bytes, base)`` is that protocol over any writable buffer of at least
  ``n * slot_bytes`` bytes whose first byte is at address ``base`` (USM host memory, an engine's pinned tensor).
- ``SlotPool(n, slot_bytes, hugepage=True)`` carves ``n`` slots of ``slot_bytes`` (rounded up to 4 KiB) from one
  anonymous private mapping whose base is aligned to 2 MiB and advised ``MADV_HUGEPAGE``; each slot is 4 KiB aligned,
  which O_DIRECT needs. ``alloc``/``free`` hand slots out (lowest index first) and back; ``addr``/``view`` address
  them; ``huge_bytes`` says how much of the pool the kernel backs with huge pages (/proc/self/smaps).
- ``TransportError`` is the one error a transfer raises (a failed read, a misused pool or reader); ``PoolExhausted``
  is ``alloc`` with no free slot. moetier.bytes.transport re-exports all of these: callers import them from there.
"""

from __future__ import annotations

import ctypes
import mmap
import threading

import numpy as np

PAGE = 4096
HUGE = 2 * 1024 * 1024


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


class BufferSlotPool:
    """The slot pool protocol over a writable buffer ``buf`` of at least ``n * slot_bytes`` bytes (``slot_bytes``
    rounded up to 4096) starting ``offset`` bytes in, whose byte ``offset`` is at address ``base``."""

    def __init__(self, buf, n: int, slot_bytes: int, base: int, *, offset: int = 0):
        if int(n) < 1:
            raise ValueError(f"{type(self).__name__}: n must be >= 1, got {n}")
        if int(slot_bytes) < 1:
            raise ValueError(f"{type(self).__name__}: slot_bytes must be >= 1, got {slot_bytes}")
        self.n = int(n)
        self.slot_bytes = _round_up(int(slot_bytes), PAGE)
        self.nbytes = self.n * self.slot_bytes
        self._mm, self._off, self.base = buf, int(offset), int(base)
        self.hugepage = False
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
            self.check_index(i)
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
        self.check_index(i)
        return self.base + i * self.slot_bytes

    def view(self, i: int) -> np.ndarray:
        """Zero-copy uint8 view of slot ``i`` (len slot_bytes). Drop views before close()."""
        self._check_open()
        self.check_index(i)
        return np.frombuffer(self._mm, dtype=np.uint8, count=self.slot_bytes, offset=self._off + i * self.slot_bytes)

    def buffer(self, i: int, nbytes: int) -> tuple:
        """(parent, sub) memoryviews over the first nbytes of slot i; the caller releases both."""
        parent = memoryview(self._mm)
        start = self._off + i * self.slot_bytes
        return parent, parent[start:start + nbytes]

    def zero(self, i: int) -> None:
        self.check_index(i)
        parent, sub = self.buffer(i, self.slot_bytes)
        try:
            sub[:] = bytes(self.slot_bytes)
        finally:
            sub.release()
            parent.release()

    def check_index(self, i) -> None:
        if not isinstance(i, (int, np.integer)) or not 0 <= int(i) < self.n:
            raise ValueError(f"{type(self).__name__}: slot index {i!r} out of range 0..{self.n - 1}")

    def _check_open(self) -> None:
        if self._closed:
            raise TransportError("SlotPool: closed")

    def close(self) -> None:
        """Mark the pool closed; the buffer's owner frees it (a subclass that owns it frees it here)."""
        self._closed = True

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return f"{type(self).__name__}(n={self.n}, slot_bytes={self.slot_bytes}, free={self.nfree}, base=0x{self.base:x})"


class SlotPool(BufferSlotPool):
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
        nbytes = int(n) * _round_up(int(slot_bytes), PAGE)
        flags = getattr(mmap, "MAP_PRIVATE", 0) | getattr(mmap, "MAP_ANONYMOUS", 0)
        total = _round_up(nbytes, HUGE) + HUGE
        if flags:
            mm = mmap.mmap(-1, total, flags=flags, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        else:  # pragma: no cover - non-POSIX
            mm = mmap.mmap(-1, total)
        cbuf = ctypes.c_char.from_buffer(mm)
        raw = ctypes.addressof(cbuf)
        del cbuf  # release the buffer export so close() works
        off = (-raw) % HUGE
        super().__init__(mm, n, slot_bytes, raw + off, offset=off)
        if hugepage and hasattr(self._mm, "madvise") and hasattr(mmap, "MADV_HUGEPAGE"):
            try:
                self._mm.madvise(mmap.MADV_HUGEPAGE, self._off, _round_up(self.nbytes, HUGE))
                self.hugepage = True
            except (OSError, ValueError):
                pass

    def huge_bytes(self) -> int:
        """Bytes of the slots backed by huge pages now (0 where /proc/self/smaps is not readable).

        Pages are backed on first touch, so a fresh pool reports 0 until its slots are written."""
        return smaps_huge_bytes(self.base, self.nbytes)

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
