"""The SYCL backend's host memory: the RAM tier as one USM host allocation the device reads in place.

Contract
--------
- ``UsmSlotPool(n, slot_bytes, queue)``: the slot pool protocol (moetier.bytes.pool) whose ``n`` 4 KiB-aligned slots are
  carved from one ``MemoryUSMHost`` allocation (2 MiB aligned, MADV_HUGEPAGE advised); the Reader lands records in it
  and the zerocopy lane's kernels read it in place.
- ``UsmSub(mem, off, n, queue)``: an object exposing a sub-range of a USM allocation (dpctl builds memory over it).
- ``odirect_into(path, mem, nbytes)``: None when an O_DIRECT read into USM memory works, else the reason.
"""
from __future__ import annotations

import ctypes
import os

import numpy as np

from moetier.run.contract import BackendUnavailable
from moetier.bytes.transport import HUGE, PAGE, BufferSlotPool, _round_up


class UsmSub:
    """A USM sub-range exposed through __sycl_usm_array_interface__ (dpctl builds a memory view over it)."""

    def __init__(self, mem, off: int, n: int, queue):
        self.__sycl_usm_array_interface__ = {"data": (mem._pointer + off, False), "shape": (n,), "strides": None,
                                             "typestr": "|u1", "version": 1, "syclobj": queue}
        self._keep = mem


def _madvise_huge(addr: int, n: int) -> bool:
    # the process's own symbols (libc is loaded): ctypes.util.find_library would run `ldconfig -p` in a child
    # process on every call, forking while the device runtime's worker threads are alive
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.madvise(ctypes.c_void_p(addr), ctypes.c_size_t(n), 14) == 0  # MADV_HUGEPAGE
    except Exception:
        return False


class UsmSlotPool(BufferSlotPool):
    """The slot pool protocol (moetier.bytes.pool) over one USM host allocation (device-readable host memory)."""

    def __init__(self, n: int, slot_bytes: int, queue, *, hugepage: bool = True):
        import dpctl.memory as dm
        if int(n) < 1:
            raise ValueError(f"UsmSlotPool: n must be >= 1, got {n}")
        nbytes = int(n) * _round_up(int(slot_bytes), PAGE)
        self.mem = dm.MemoryUSMHost(nbytes, alignment=HUGE, queue=queue)
        super().__init__(memoryview(self.mem).cast("B"), n, slot_bytes, self.mem._pointer)
        if self.base % PAGE:
            raise BackendUnavailable(f"--backend sycl: USM host allocation not 4 KiB aligned (0x{self.base:x})")
        self.hugepage = bool(hugepage) and _madvise_huge(self.base, _round_up(self.nbytes, PAGE))
        self.u8 = np.frombuffer(self._mm, dtype=np.uint8)  # one root array: cpu-lane views share it
        self.queue = queue

    def view(self, i: int) -> np.ndarray:
        self._check_open()
        self.check_index(i)
        return self.u8[i * self.slot_bytes:(i + 1) * self.slot_bytes]

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.u8 = None
        try:
            self._mm.release()
        except BufferError:
            pass  # a view is still alive; the USM block is freed with the last reference


def odirect_into(path: str, mem, nbytes: int) -> str | None:
    """Try one O_DIRECT read of the first nbytes of path into USM memory; None if it worked, else the reason."""
    flag = getattr(os, "O_DIRECT", 0)
    if not flag:
        return "no O_DIRECT on this OS"
    try:
        fd = os.open(path, os.O_RDONLY | flag)
    except OSError as e:
        return f"open(O_DIRECT): {e.strerror}"
    mv = memoryview(mem).cast("B")
    try:
        n = os.preadv(fd, [mv[:nbytes]], 0)
        if n != nbytes:
            return f"short O_DIRECT read into USM host memory ({n} of {nbytes} bytes)"
        with open(path, "rb") as f:
            if f.read(nbytes) != bytes(mv[:nbytes]):
                return "O_DIRECT read into USM host memory returned different bytes"
        return None
    except OSError as e:
        return f"O_DIRECT read into USM host memory failed: {e.strerror}"
    finally:
        mv.release()
        os.close(fd)
