"""moetier's stand-in for exl3xpu's op surface, for machines without exl3xpu (no Intel XPU, no oneAPI, no _moe.so).

Contract
--------
``ProvidedOps`` has exactly the ``torch.ops.exl3xpu_moe`` ops the adapter calls (adapters.exl3xpu.surface.OPS), with
the argument lists, argument kinds and semantics of exl3xpu's ``exl3_moe.sycl`` (reference section 4.2), over numpy
arrays where the real ops take torch tensors:

* ``moe_forward(x, topk_ids, topk_w, ptrs, I, K, n_experts)``: the grouped MoE with every expert addressed only
  through ``ptrs`` (int64[n_experts], one address per expert): y[r] = sum over j (in slot order, fp32) of
  topk_w[r, j] * expert(ptrs[topk_ids[r, j]])(x[r]), returned in x's dtype. Each expert is computed by moetier's EXL3
  CPU kernel (backends.cpu.exl3, fp16 at the engine's rounding points; the NumPy reference where numba is missing) on
  the blob at that address. It refuses (OpError, one line) what the real op refuses, with the real op's checks
  (``refusal``: moe_forward_impl, launch_down and moe_prefill in exl3_moe.sycl, see ``SOURCE``): the four inputs
  must be device memory (XPU tensors there: here arrays in the stand-in's device memory, ``device_array``), x 2-D
  fp16 with unit stride along H (bf16, which the real op also takes, has no numpy dtype), ids int32, weights fp32 and
  ptrs int64, each contiguous; n_experts <= 1024, H and I multiples of 128, K = 3; the decode kernels' work splits
  (the down GEMV's I/16 rows over P = 10 k-splits for one row, else 5, in batches of min(40 / P, 8); the gate/up
  GEMV's H/16 rows over 5 k-splits in batches of 8 - the source checks the first and silently truncates the second)
  and, from 256 rows, the prefill geometry (H a multiple of 512). Every pick is computed, a weight-0 pick too (the
  kernel has no skip): its contribution is 0 * output, so a row pointing at bytes that decode to inf or NaN makes
  the output NaN, as on the device. Every address a pick reads must lie inside memory the stand-in allocated
  (``host_alloc``, ``device_empty``), or the op raises - a row that points nowhere fails loudly.
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


# where the real op's checks are: the exl3_moe.sycl the B70 image's _moe.so is built from, as published with the
# offload project (exl3xpu's own repository has no commit recorded; reference docs/adapters.md section 0)
SOURCE = ("https://github.com/sybil-solutions/qwen38-flash-next-b70-offload/blob/"
          "557f80fe0f4235a76d4cf835f89e108d599b5e94/experimental/n111-victim-ring/csrc/exl3_moe.sycl")
MAX_EXPERTS = 1024
PREFILL_MIN_M = 256          # g_prefill_min_m: from this many rows the DPAS prefill path runs
GU_P = 5                     # g_gu_p: the gate/up GEMV's k-splits


def refusal(x, ids, w, ptrs, I, K, n_experts, kind_of) -> str | None:  # noqa: E741
    """Why the real moe_forward refuses these arguments (None: it takes them); ``kind_of(ptr)`` is usm_kind."""
    return _inputs(x, ids, w, ptrs, int(n_experts), kind_of) or _geometry(x, I, K, int(n_experts))


def _inputs(x, ids, w, ptrs, E, kind_of) -> str | None:
    """The tensors: on the device, dtypes, contiguity and shapes (moe_forward_impl's first checks)."""
    for name, a in (("x", x), ("topk_ids", ids), ("topk_w", w), ("ptrs", ptrs)):
        if not isinstance(a, np.ndarray) or (a.size and kind_of(int(a.ctypes.data)) != geometry.USM_DEVICE):
            return f"{name} is not device memory (the op takes XPU tensors)"
    if x.ndim != 2 or (x.shape[1] > 1 and x.strides[1] != x.itemsize):
        return f"x must be 2-D with unit stride along H, got shape {list(x.shape)}"
    for name, a, dt in (("topk_ids", ids, np.int32), ("topk_w", w, np.float32), ("ptrs", ptrs, np.int64)):
        if a.dtype != dt or not a.flags.c_contiguous:
            return f"{name} must be contiguous {np.dtype(dt).name}, got {a.dtype}"
    if ids.ndim != 2 or ids.shape != w.shape or ids.shape[0] != x.shape[0] or ptrs.shape != (E,):
        return (f"x {list(x.shape)}, topk_ids {list(ids.shape)}, topk_w {list(w.shape)}, ptrs {list(ptrs.shape)}: "
                f"expected [M, H], [M, k], [M, k], [{E}]")
    return None


def _geometry(x, I, K, E) -> str | None:  # noqa: E741
    """E, H, I and K, x's dtype, then the kernels' work splits, in the order the op meets them."""
    M, H = x.shape
    if not (E <= MAX_EXPERTS and H % 128 == 0 and I % 128 == 0):
        return f"E <= {MAX_EXPERTS}, H % 128 == 0 and I % 128 == 0 required, got E={E} H={H} I={I}"
    if M >= PREFILL_MIN_M and not (K == 3 and H % 512 == 0 and (2 * I // 16) % 8 == 0):
        return f"moe prefill geometry: K=3, H % 512 == 0 needed from {PREFILL_MIN_M} rows, got H={H} K={K}"
    if K != 3:
        return f"moe: K=3 only in this build, got K={K}"
    if x.dtype != np.float16:
        return f"x dtype: fp16 (or bf16) required, got {x.dtype}"
    if M == 0:
        return None
    P = 10 if M <= 1 else 5
    RB = min(40 // P, 8)
    if not ((I // 16) % P == 0 and ((I // 16) // P) % RB == 0):
        return f"moe down: I/16 split: I={I} is not {P} k-splits of a multiple of {RB} tile-rows"
    if not ((H // 16) % GU_P == 0 and ((H // 16) // GU_P) % 8 == 0):
        return f"moe gateup: H={H} is not {GU_P} k-splits of a multiple of 8 tile-rows (the kernel would skip rows)"
    return None


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
        ptr = int(ptr) & ((1 << 64) - 1)           # an s64-wrapped address names the same byte
        i = bisect.bisect(self._bases, ptr) - 1
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
    a = _aligned(max(int(nbytes), 1))[:int(nbytes)]
    table._memory.enter(a, geometry.USM_DEVICE)
    return a


def device_array(table: "ProvidedOps", a) -> np.ndarray:
    """The stand-in's ``torch.from_numpy(a).to("xpu")``: a contiguous copy of ``a`` in ``table``'s device memory."""
    a = np.ascontiguousarray(a)
    d = device_empty(table, a.nbytes)
    d[:] = a.reshape(-1).view(np.uint8)
    return d.view(a.dtype).reshape(a.shape)


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
        why = refusal(x, topk_ids, topk_w, ptrs, int(I), int(K), n_experts, self._memory.kind)
        if why:
            raise OpError(f"moe_forward: {why} ({SOURCE})")
        M, H = x.shape
        ids, w = topk_ids, topk_w
        out16 = device_empty(self, M * H * 2).view(np.float16).reshape(M, H)
        if M == 0:
            return out16
        if ids.size and (ids.min() < 0 or ids.max() >= n_experts):
            raise OpError(f"moe_forward: topk_ids outside 0..{n_experts - 1}")
        lay = self._layout(H, int(I), int(K))
        nblob = geometry.blob_bytes(H, int(I), int(K))
        self.calls["moe_forward"] += 1
        xf = x.astype(np.float32)
        rows: dict = {}
        for r in range(M):
            for j in range(ids.shape[1]):
                e = int(ids[r, j])
                rec = self._memory.view(int(ptrs[e]), nblob)                # every row read is checked
                rows.setdefault(e, (rec, []))[1].append(r)                  # weight 0 too: the kernel has no skip
        jobs = [(e, rec, sorted(set(rs))) for e, (rec, rs) in rows.items()]
        done = self._experts(lay, jobs, xf)
        out = {e: dict(zip(rs, np.asarray(done[e], np.float32))) for e, _, rs in jobs}
        self.calls["experts"] += len(jobs)
        y = np.zeros((M, H), np.float32)
        with np.errstate(invalid="ignore", over="ignore"):
            for r in range(M):              # combine: fixed order, slot j ascending, fp32
                for j in range(ids.shape[1]):
                    y[r] += w[r, j] * out[int(ids[r, j])][r]
                    self.calls["pairs"] += 1
            out16[:] = y                    # the output in x's dtype (empty_like(x) in the real op)
        return out16

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
