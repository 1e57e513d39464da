"""moetier's stand-in for exl3xpu's op surface, for machines without exl3xpu (no Intel XPU, no oneAPI, no _moe.so).

Contract
--------
``ProvidedOps`` has exactly the ``torch.ops.exl3xpu_moe`` ops the adapter calls (adapters.exl3xpu.surface.OPS), with
the argument lists, argument kinds and semantics of exl3xpu's ``exl3_moe.sycl`` (reference section 4.2), over numpy
arrays where the real ops take torch tensors:

* ``moe_forward(x, topk_ids, topk_w, ptrs, I, K, n_experts)``: the grouped MoE with every expert addressed only
  through ``ptrs`` (int64[n_experts], one address per expert): y[r] = sum over j (in slot order, fp32) of
  topk_w[r, j] * expert(ptrs[topk_ids[r, j]])(x[r]). Each expert is computed by moetier's EXL3 CPU kernel
  (backends.cpu.exl3, fp16 at the engine's rounding points; the NumPy reference where numba is missing) on the
  blob at that address. Every address a pick reads must lie inside memory the stand-in allocated (``host_alloc``,
  or ``device_empty``: the stand-in's ``torch.empty(device="xpu")``), or the op raises - a row that points nowhere
  fails loudly instead of reading junk. A pick of weight 0 (the masked "safe expert, weight 0" of the tier)
  contributes exactly 0 and its row is still checked.
* ``host_alloc(nbytes)``: USM host memory, a page-aligned uint8 array (the real op: a CPU uint8 tensor over
  ``sycl::malloc_host``), freed when the array is dropped.
* ``usm_kind(ptr)``: an int, as the real op returns it: 0 unknown (pageable), 1 host USM, 2 device USM, 3 shared.
* ``memcpy_async(dst, src, nbytes)``: a byte copy between two addresses (ints); synchronous here (the bytes are there
  when it returns), on the current stream's queue on the device. Both ranges must lie inside the stand-in's memory.
* ``blob_bytes(H, I, K)``.

Nothing else is public but ``provider`` (what computes the ops), ``calls`` (counters of moe_forward calls, pairs and
experts computed) and ``close()``. The address -> buffer map that lets the stand-in resolve addresses is private to
this module: ``host_alloc`` and ``device_empty(table, nbytes)`` (the XPU allocator's stand-in, which
adapters.exl3xpu.surface.device_allocator hands the backend in place of ``torch.empty(..., device="xpu")``) enter
their buffers; a buffer leaves the map when it is garbage-collected, as the real memory is freed by its tensor's
deleter.

The bytes at an address are exl3xpu's expert blob (adapters.exl3xpu.blob: PLANAR4 trellis words, then the scales),
which the op unpacks. What is NOT the engine's: the numerics are the CPU kernel's (exllamav3's rounding points), not
the Arc kernel's. ``SyclOps(store)`` is the same stand-in with the experts computed by moetier's SYCL EXL3 kernel
(backends/sycl) on a dpctl device - the OpenCL CPU device in CI; ``surface.op_table(store)`` picks it where dpctl has
a device.
"""
from __future__ import annotations

import bisect
import ctypes
import weakref

import numpy as np

from adapters.engine_lanes import CPU_KERNEL, cpu_rows
from adapters.exl3xpu import blob
from adapters.exl3xpu import geometry
from moetier.bytes.expert import EXL3, layout

PAGE = 4096


class OpError(RuntimeError):
    """An op was called with arguments the real op would fault or fail on (bad id, address outside any region)."""


class _Memory:
    """The stand-in's allocations: base address -> (nbytes, USM kind, a weak reference to the array owning the bytes,
    the offset of base in it). An allocation leaves when its owner is collected (every view of it dropped)."""

    def __init__(self):
        self._bases: list = []
        self._regions: dict = {}

    def enter(self, arr: np.ndarray, kind: int) -> None:
        owner = arr
        while isinstance(owner.base, np.ndarray):
            owner = owner.base
        base = int(arr.ctypes.data)
        bisect.insort(self._bases, base)
        self._regions[base] = (arr.nbytes, kind, weakref.ref(owner), base - int(owner.ctypes.data))
        weakref.finalize(owner, self._leave, base)

    def _leave(self, base: int) -> None:
        if self._regions.pop(base, None) is not None:
            self._bases.remove(base)

    def _find(self, ptr: int, nbytes: int = 1):
        i = bisect.bisect(self._bases, int(ptr)) - 1
        if i >= 0:
            base = self._bases[i]
            size, kind, ref, off = self._regions[base]
            owner = ref()
            if owner is not None and ptr + nbytes <= base + size:
                return base, kind, owner.reshape(-1).view(np.uint8), off
        return None

    def kind(self, ptr: int) -> int:
        hit = self._find(ptr)
        return hit[1] if hit else geometry.USM_UNKNOWN

    def view(self, ptr: int, nbytes: int) -> np.ndarray:
        hit = self._find(ptr, nbytes)
        if hit is None:
            raise OpError(f"address {ptr:#x} (+{nbytes} B) is not inside any host or device allocation")
        base, _, a, off = hit
        return a[off + ptr - base:off + ptr - base + nbytes]


def _aligned(nbytes: int) -> np.ndarray:
    """A page-aligned, zeroed uint8 array of ``nbytes`` (malloc_host and the device allocator align to pages; O_DIRECT
    reads into host slots need it)."""
    raw = np.zeros(int(nbytes) + PAGE, np.uint8)
    off = (-raw.ctypes.data) % PAGE
    return raw[off:off + int(nbytes)]


def device_empty(table: "ProvidedOps", nbytes: int) -> np.ndarray:
    """The stand-in's ``torch.empty(nbytes, dtype=uint8, device="xpu")``: device memory of ``table`` (usm_kind 2)."""
    a = _aligned(nbytes)
    table._memory.enter(a, geometry.USM_DEVICE)
    return a


class ProvidedOps:
    provider = f"moetier ({CPU_KERNEL})"

    def __init__(self, codebook: str = "mul1", act_limit: float = 0.0):
        self._codebook, self._act_limit = codebook, float(act_limit)
        self._memory = _Memory()
        self._layouts: dict = {}
        self.calls = {"moe_forward": 0, "pairs": 0, "experts": 0}

    def _layout(self, H: int, I: int, K: int):  # noqa: E741
        key = (H, I, K)
        if key not in self._layouts:
            self._layouts[key] = layout(H, I, EXL3, bits=K, codebook=self._codebook, act_limit=self._act_limit)
        return self._layouts[key]

    # -- compute ----------------------------------------------------------------------------------------------
    def moe_forward(self, x, topk_ids, topk_w, ptrs, I, K, n_experts):  # noqa: E741
        x = np.asarray(x, np.float32)
        ids, w = np.asarray(topk_ids, np.int32), np.asarray(topk_w, np.float32)
        ptrs = np.asarray(ptrs, np.int64)
        M, H = x.shape
        if ids.shape != w.shape or ids.shape[0] != M or ptrs.shape != (int(n_experts),):
            raise OpError(f"moe_forward: x {x.shape}, topk_ids {ids.shape}, topk_w {w.shape}, ptrs {ptrs.shape} "
                          f"(expected [M, H], [M, k], [M, k], [{n_experts}])")
        if ids.size and (ids.min() < 0 or ids.max() >= n_experts):
            raise OpError(f"moe_forward: topk_ids outside 0..{n_experts - 1}")
        lay = self._layout(H, int(I), int(K))
        nblob = geometry.blob_bytes(H, int(I), int(K))
        self.calls["moe_forward"] += 1
        rows: dict = {}
        for r in range(M):
            for j in range(ids.shape[1]):
                e = int(ids[r, j])
                rec = self._memory.view(int(ptrs[e]), nblob)                # every row read is checked
                if w[r, j] != 0.0:
                    rows.setdefault(e, (rec, []))[1].append(r)
        jobs = [(e, rec, sorted(set(rs))) for e, (rec, rs) in rows.items()]
        done = self._experts(lay, jobs, x)
        out = {e: dict(zip(rs, np.asarray(done[e], np.float32))) for e, _, rs in jobs}
        self.calls["experts"] += len(jobs)
        y = np.zeros((M, H), np.float32)
        for r in range(M):                  # combine: fixed order, slot j ascending, fp32
            for j in range(ids.shape[1]):
                if w[r, j] != 0.0:
                    y[r] += w[r, j] * out[int(ids[r, j])][r]
                    self.calls["pairs"] += 1
        return y

    def _experts(self, lay, jobs, x) -> dict:
        """{expert: its unweighted output rows} for jobs [(expert, blob bytes, rows)]."""
        return {e: cpu_rows(x[rs], blob.expert(lay, b), self._act_limit) for e, b, rs in jobs}

    # -- memory -------------------------------------------------------------------------------------------------
    def host_alloc(self, nbytes):
        a = _aligned(nbytes)
        self._memory.enter(a, geometry.USM_HOST)
        return a

    def usm_kind(self, ptr):
        return self._memory.kind(int(ptr))

    def memcpy_async(self, dst, src, nbytes):
        n = int(nbytes)
        d, s = self._memory.view(int(dst), n), self._memory.view(int(src), n)     # both ranges checked
        ctypes.memmove(d.ctypes.data, s.ctypes.data, n)

    def blob_bytes(self, H, I, K):  # noqa: E741
        return geometry.blob_bytes(int(H), int(I), int(K))


class SyclOps(ProvidedOps):
    """The same ops with every expert computed by moetier's SYCL EXL3 kernel (backends/sycl, ``exl3.cl``) on a
    dpctl device - the OpenCL CPU device in CI. The kernel reads its experts from USM host slots of a SyclBackend over
    ``store`` (the zerocopy path): each blob a pick addresses is unpacked there, as a moetier record, from its
    address first, so ``ptrs`` alone still says which bytes are computed. ``device``: a dpctl filter string (default:
    dpctl's default)."""

    def __init__(self, store, codebook: str = "mul1", act_limit: float = 0.0, *, slots: int = 64, device=None):
        from moetier.run.registry import get_backend
        super().__init__(codebook, act_limit)
        self.sycl = get_backend("sycl", store, ram_slots=slots, vram_slots=0, device=device)
        self.provider = f"moetier (SYCL EXL3 kernel on {self.sycl.device.name})"

    def _experts(self, lay, jobs, x) -> dict:
        if lay != self.sycl.layout:
            raise OpError("moe_forward: the records' geometry differs from the SYCL provider's store")
        out = {}
        n = self.sycl.ram_slot_count
        for i in range(0, len(jobs), n):
            batch = jobs[i:i + n]
            for s, (_, b, _) in enumerate(batch):
                self.sycl.ram_view(s)[:lay.record_bytes] = blob.record(lay, b)     # the kernel reads records
            out.update(self.sycl.compute("zerocopy", [(e, s, rs) for s, (e, _, rs) in enumerate(batch)], x))
        return out

    def close(self) -> None:
        self.sycl.close()
