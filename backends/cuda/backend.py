"""The CUDA backend (CuPy): pinned+mapped RAM slots, a VRAM slot arena, gpu / zerocopy / cpu lanes.

Contract: see moetier.run.contract. Design (docs/backend-cuda.md):

* RAM tier: a moetier.transport.SlotPool (anonymous mmap, 2 MiB aligned, the O_DIRECT fill target) registered
  with ``cudaHostRegister(base, nbytes, cudaHostRegisterPortable | cudaHostRegisterMapped)``
  (``cupy.cuda.runtime.hostRegister``). That pins the pages (so pushes/drains are real async DMA) and maps them
  into the device address space; the device alias of the pool base comes from ``cudaPointerGetAttributes``
  (``cupy.cuda.runtime.pointerGetAttributes(base).devicePointer``; CuPy does not wrap cudaHostGetDevicePointer,
  and for registered memory the two give the same address). Fills are the transport's Reader into that pool.
* VRAM tier: one cupy uint8 array of ``vram_slots * record_bytes`` (a plain cudaMalloc through CuPy's pool).
* Lanes: ``gpu`` runs the expert kernels on device slots, ``zerocopy`` runs the same kernels on the mapped host
  alias of RAM slots (the record crosses PCIe inside the kernel), ``cpu`` runs backends.cpu.kernels on the pool
  bytes in place (when numba is installed).
* Streams: one copy stream (push = cudaMemcpyAsync H2D, drain = D2H, each followed by an event record; a drain
  and a later push of the same VRAM slot are ordered because they share the stream) and one compute stream that
  waits (cudaStreamWaitEvent) on the last copy event of every VRAM slot it reads. compute() returns host arrays,
  so it synchronizes the compute stream before returning.
* Handles: fills, pushes and drains share one monotonic ``seq``; landed = non-blocking poll (Reader state or
  cudaEventQuery), wait = block (Reader future or cudaEventSynchronize), fence = reader fence + both streams.
"""
from __future__ import annotations

import numpy as np

from moetier.run.contract import BackendUnavailable, Capabilities
from moetier.run.events import SequencedBackend, Sequencer
from moetier.run.router import StoreRouter
from moetier.bytes.expert import EXL3, RECORD_KINDS, act_range, section_offsets
from moetier.bytes.teardown import close_all
from moetier.bytes.transport import Reader, SlotPool, TransportError

from backends.cuda import kernels as K
from backends.cuda.exl3 import Exl3Kernels

try:
    from backends.cpu.lane import CpuLane
except ImportError:  # numba is the `cpu` extra; without it the cuda backend has no cpu lane
    CpuLane = None

HOST_REGISTER_PORTABLE = 0x01   # cudaHostRegisterPortable
HOST_REGISTER_MAPPED = 0x02     # cudaHostRegisterMapped
INSTALL_HINT = "pip install 'moetier[cuda12]' (or 'moetier[cuda13]' for a CUDA 13 driver)"



def _import_cupy():
    try:
        import cupy  # noqa: F401
    except Exception as e:  # ImportError, or a broken install raising anything at import
        raise BackendUnavailable(f"--backend cuda: cupy not installed: {INSTALL_HINT} ({type(e).__name__}: {e})") from None
    return cupy


class CudaBackend(SequencedBackend):
    def __init__(self, store, *, ram_slots: int, vram_slots: int, queue_depth: int = 16, verify_rate: float = 1.0,
                 faults=None, direct: bool = True, device: int = 0):
        cupy = _import_cupy()
        self.cp = cupy
        self._closed = True            # close() is a no-op until construction succeeded
        self.store = store
        self.layout = lay = store.layout
        if lay.encoding not in RECORD_KINDS:
            raise BackendUnavailable(f"--backend cuda: encoding {lay.encoding!r} not supported {RECORD_KINDS}")
        self.exl3 = None
        self.record_bytes = rb = int(store.record_bytes)
        self.nvram = int(vram_slots)
        if self.nvram < 0:
            raise ValueError(f"CudaBackend: vram_slots must be >= 0, got {vram_slots}")
        self.pool = None
        self.reader = None
        self._registered = False
        rterr = cupy.cuda.runtime.CUDARuntimeError
        errs = (rterr, cupy.cuda.driver.CUDADriverError)
        try:
            self._open_device(int(device), self.nvram * rb)
            self._compile(lay, errs)
            self.arena = cupy.zeros(max(1, self.nvram) * rb, dtype=cupy.uint8) if self.nvram else None
            self.arena_ptr = int(self.arena.data.ptr) if self.arena is not None else 0
            self._map_pool(int(ram_slots), rb, int(device))
            self.copy_stream = cupy.cuda.Stream(non_blocking=True)
            self.compute_stream = cupy.cuda.Stream(non_blocking=True)
        except BackendUnavailable:
            self._teardown()
            raise
        except errs as e:
            self._teardown()
            raise BackendUnavailable(f"--backend cuda: CUDA error while setting up device {device}: {e}") from None
        except MemoryError as e:
            self._teardown()
            raise BackendUnavailable(f"--backend cuda: out of memory while setting up device {device}: {e}") from None
        except Exception as e:
            # cupy raises its own OutOfMemoryError (not a CUDARuntimeError) for a failed arena allocation
            self._teardown()
            raise BackendUnavailable(f"--backend cuda: setup of device {device} failed: {type(e).__name__}: {e}") from None
        try:
            self.reader = Reader(store, self.pool, queue_depth=queue_depth, verify_rate=verify_rate, direct=direct,
                                 faults=faults)
        except BaseException:
            self._teardown()
            raise
        lanes = {"gpu", "zerocopy"} | ({"cpu"} if CpuLane is not None else set())
        notes = ("zerocopy reads pinned mapped host slots (cudaHostRegisterMapped)",)
        if CpuLane is None:
            notes += ("no cpu lane: numba is not installed (pip install 'moetier[cpu]')",)
        self.capabilities = Capabilities(name="cuda", device=f"{self.device_name} (sm_{self.cc[0]}{self.cc[1]}, CuPy)",
                                         lanes=frozenset(lanes), encodings=frozenset(RECORD_KINDS),
                                         vram_slots=self.nvram, notes=notes)
        self._offs = section_offsets(lay)
        self._slot_event: dict = {}                    # vram slot -> event of the last copy touching it
        self._stats = {"pushes": 0, "drains": 0, "push_bytes": 0, "drain_bytes": 0}
        self._closed = False
        # the cpu lane is the cpu backend's runner (same call classes, so one engine cost model for every backend)
        self.lane = CpuLane(lay) if CpuLane is not None else None
        self.workers = self.lane.workers if self.lane else 1
        self.parallel_min = self.lane.parallel_min if self.lane else 0
        SequencedBackend.__init__(self, events=Sequencer(self.reader, lambda ev: bool(ev.done),
                                                         lambda ev: ev.synchronize(), "cuda"),
                                  reader=self.reader, router=StoreRouter(store))

    # -- helpers ------------------------------------------------------------------------------------------------

    def _open_device(self, device: int, need: int) -> None:
        """Select the device and refuse one that cannot hold the VRAM tier or run the kernels."""
        if not self.cp.cuda.is_available():
            raise BackendUnavailable("--backend cuda: no CUDA device (cupy.cuda.is_available() is False)")
        ndev = self.cp.cuda.runtime.getDeviceCount()
        if not 0 <= device < ndev:
            raise BackendUnavailable(f"--backend cuda: device {device} does not exist ({ndev} CUDA devices)")
        self.device = self.cp.cuda.Device(device)
        self.device.use()
        props = self.cp.cuda.runtime.getDeviceProperties(device)
        name = props.get("name", b"CUDA device")
        self.device_name = name.decode() if isinstance(name, bytes) else str(name)
        self.cc = (int(props.get("major", 0)), int(props.get("minor", 0)))
        if self.cc < (6, 1):
            raise BackendUnavailable(f"--backend cuda: {self.device_name} is sm_{self.cc[0]}{self.cc[1]}; "
                                     "the kernels need dp2a (sm_61 or newer)")
        free, total = self.cp.cuda.runtime.memGetInfo()
        if need > free:
            raise BackendUnavailable(
                f"--backend cuda: {self.nvram} VRAM slots x {self.record_bytes:,} B = {need / 2**20:,.1f} MiB do not fit in the "
                f"free device memory of {self.device_name} ({free / 2**20:,.1f} MiB free of {total / 2**20:,.1f} MiB)")

    def _compile(self, lay, errs) -> None:
        """Compile the kernels now: a missing NVRTC or a compile error must fail construction, not the first compute."""
        try:
            self.module = self.cp.RawModule(code=K.SOURCE, options=K.NVRTC_OPTIONS)
            self.fn = {n: self.module.get_function(n) for n in K.KERNEL_NAMES}
            if lay.encoding == EXL3:
                self.exl3 = Exl3Kernels(self.cp, self.cp.RawModule, K.NVRTC_OPTIONS)
        except errs:
            raise
        except Exception as e:
            raise BackendUnavailable(f"--backend cuda: compiling the expert kernels failed "
                                     f"({type(e).__name__}: {str(e).strip()[:400]})") from None

    def _map_pool(self, ram_slots: int, rb: int, device: int) -> None:
        """The RAM tier: pinned host slots mapped into the device's address space (zero-copy)."""
        self.pool = SlotPool(max(1, ram_slots), rb)
        self.cp.cuda.runtime.hostRegister(self.pool.base, self.pool.nbytes,
                                          HOST_REGISTER_PORTABLE | HOST_REGISTER_MAPPED)
        self._registered = True
        attrs = self.cp.cuda.runtime.pointerGetAttributes(self.pool.base)
        dptr = int(attrs.devicePointer)
        if not dptr:
            dptr = self.pool.base if self.cp.cuda.runtime.deviceGetAttribute(
                self.cp.cuda.runtime.cudaDevAttrCanUseHostPointerForRegisteredMem, device) else 0
        if not dptr:
            raise BackendUnavailable("--backend cuda: the pinned RAM pool has no device mapping (zero-copy)")
        self.pool_dptr = dptr

    def _teardown(self):
        cp = self.cp
        if self._registered:
            try:
                cp.cuda.runtime.hostUnregister(self.pool.base)
            except Exception:
                pass
            self._registered = False
        if self.pool is not None:
            self.pool.close()
            self.pool = None
        self.arena = None

    def _check_vram(self, slot) -> int:
        if not isinstance(slot, (int, np.integer)) or not 0 <= int(slot) < self.nvram:
            raise ValueError(f"cuda backend: VRAM slot {slot!r} out of range 0..{self.nvram - 1}")
        return int(slot)

    def _check_ram(self, slot) -> int:
        self.pool.check_index(slot)
        return int(slot)

    def _vram_ptr(self, slot: int) -> int:
        return self.arena_ptr + self._check_vram(slot) * self.record_bytes

    def _ram_ptr(self, slot: int) -> int:
        return self.pool.addr(self._check_ram(slot))

    def _ram_dptr(self, slot: int) -> int:
        return self.pool_dptr + self._check_ram(slot) * self.pool.slot_bytes

    def vram_ptr(self, slot: int) -> int:
        """Device address of VRAM slot ``slot`` (bench)."""
        return self._vram_ptr(slot)

    def ram_device_ptr(self, slot: int) -> int:
        """Device alias (mapped pinned memory) of RAM slot ``slot`` (bench, zero-copy)."""
        return self._ram_dptr(slot)

    @property
    def ram_slot_count(self) -> int:
        return self.pool.n

    def ram_view(self, slot: int) -> np.ndarray:
        return self.pool.view(slot)

    def read_vram(self, slot: int) -> np.ndarray:
        """Synchronous copy of VRAM slot ``slot`` to a new host array (tests, debugging); waits for its copies."""
        s = self._check_vram(slot)
        ev = self._slot_event.get(s)
        if ev is not None:
            ev.synchronize()
        return self.arena[s * self.record_bytes:(s + 1) * self.record_bytes].get()

    # -- compute ------------------------------------------------------------------------------------------------
    def compute(self, lane: str, jobs, x: np.ndarray) -> dict:
        """jobs = [(key, slot, row_indices)]; slot is a VRAM slot (gpu) or RAM slot (zerocopy, cpu)."""
        if lane not in self.capabilities.lanes:
            raise BackendUnavailable(f"cuda backend: no {lane!r} lane (has {sorted(self.capabilities.lanes)})")
        if not jobs:
            return {}
        if lane == "cpu":
            return self.lane.run(jobs, x, self.pool.view)
        if lane == "gpu" and self.nvram == 0:
            raise BackendUnavailable("cuda backend: gpu lane with zero VRAM slots")
        ptrs = [self._vram_ptr(s) if lane == "gpu" else self._ram_dptr(s) for _, s, _ in jobs]
        waits = [self._slot_event[int(s)] for _, s, _ in jobs if lane == "gpu" and int(s) in self._slot_event]
        out = self._forward(ptrs, [np.asarray(r, dtype=np.int64).reshape(-1) for _, _, r in jobs], x, waits)
        res, r0 = {}, 0
        for k, _, rows in jobs:
            n = len(rows)
            res[k] = out[r0:r0 + n]
            r0 += n
        return res

    # -- EXL3 test hooks (conformance: bit-exact decode, one-hot raw GEMM) ------------------------------------------
    def _exl3_on_lane(self, lane, trellis, run):
        """run(device address of a copy of trellis in the memory the lane reads) -> device array, fetched to host."""
        cp = self.cp
        t = np.ascontiguousarray(trellis)
        if lane == "gpu":
            d = cp.asarray(t.view(np.uint8).reshape(-1))
            with self.compute_stream as s:
                return run(int(d.data.ptr)).get(stream=s)
        if lane != "zerocopy":
            raise BackendUnavailable(f"cuda backend: no {lane!r} device lane")
        pool = SlotPool(1, t.nbytes)      # pinned + mapped like the RAM tier, so the kernel reads it over the link
        rt = cp.cuda.runtime
        try:
            rt.hostRegister(pool.base, pool.nbytes, HOST_REGISTER_PORTABLE | HOST_REGISTER_MAPPED)
            try:
                pool.view(0)[:t.nbytes] = t.view(np.uint8).reshape(-1)
                dptr = int(rt.pointerGetAttributes(pool.base).devicePointer) or pool.base
                with self.compute_stream as s:
                    return run(dptr).get(stream=s)
            finally:
                rt.hostUnregister(pool.base)
        finally:
            pool.close()

    def exl3_decode(self, lane: str, trellis: np.ndarray, codebook) -> np.ndarray:
        """W_inner [k, n] float32 of a trellis as the lane's EXL3 kernel decodes it."""
        from moetier.bytes import exl3
        if lane == "cpu":
            return self.lane.exl3_decode(trellis, codebook)
        kern = self.exl3 or Exl3Kernels(self.cp, self.cp.RawModule, K.NVRTC_OPTIONS)
        k, n, Kb = trellis.shape[0] * 16, trellis.shape[1] * 16, exl3.trellis_bits(trellis)
        return self._exl3_on_lane(lane, trellis, lambda p: kern.decode(p, k, n, Kb, codebook))

    def exl3_raw_gemm(self, lane: str, xh: np.ndarray, trellis: np.ndarray, codebook) -> np.ndarray:
        """xh [T, k] @ W_inner, float32, as the lane's EXL3 kernel computes it."""
        from moetier.bytes import exl3
        if lane == "cpu":
            return self.lane.exl3_raw_gemm(xh, trellis, codebook)
        kern = self.exl3 or Exl3Kernels(self.cp, self.cp.RawModule, K.NVRTC_OPTIONS)
        k, n, Kb = trellis.shape[0] * 16, trellis.shape[1] * 16, exl3.trellis_bits(trellis)
        d_x = self.cp.asarray(np.ascontiguousarray(xh, dtype=np.float32).reshape(-1, k))
        return self._exl3_on_lane(lane, trellis, lambda p: kern.raw_gemm(p, d_x, k, n, Kb, codebook))

    def forward_ptrs(self, ptrs, rows, x, waits=()):
        """Bench/test entry: experts at device-readable record addresses ``ptrs`` on token rows ``rows`` of x."""
        return self._forward(ptrs, rows, x, waits)

    def _forward(self, ptrs, rows_list, x, waits):
        cp, lay = self.cp, self.layout
        H = lay.hidden
        x = np.asarray(x, dtype=np.float32)
        if x.ndim != 2 or x.shape[1] != H:
            raise ValueError(f"x: expected float32 [rows, {H}], got shape {list(x.shape)}")
        counts = [len(r) for r in rows_list]
        R = int(sum(counts))
        if R == 0:
            return np.empty((0, H), np.float32)
        xcat = np.ascontiguousarray(np.concatenate([x[r] for r in rows_list]), dtype=np.float32)
        nj = len(ptrs)
        table = np.empty((nj, 3), np.int64)
        table[:, 0] = np.asarray(ptrs, dtype=np.uint64).view(np.int64)
        table[:, 1] = np.concatenate([[0], np.cumsum(counts)[:-1]])
        table[:, 2] = counts
        s = self.compute_stream
        with s:
            for ev in waits:
                s.wait_event(ev)
            d_x = cp.asarray(xcat)
            d_jobs = cp.asarray(table)
            out = self.exl3.forward(lay, d_jobs, counts, d_x) if self.exl3 is not None else \
                self._launch(d_jobs, nj, R, d_x)
            res = out.get(stream=s)          # blocking: compute results are host arrays
        return res

    def _launch(self, d_jobs, nj: int, R: int, d_x):
        """Enqueue the four launches on the current stream; returns the device output [R, H] (not synchronized).

        d_jobs: device int64 [nj, 3] (record address, first row, rows); d_x: device float32 [R, H].
        """
        cp, lay, fn = self.cp, self.layout, self.fn
        H, F = lay.hidden, lay.ffn
        q4 = lay.encoding == "int4g32"
        og, ou, od, ogs, ous, ods = (np.int64(o) for o in self._offs)
        xq = cp.empty((R, H), cp.int16)
        sx = cp.empty(R, cp.float32)
        h = cp.empty((R, F), cp.float32)
        hq = cp.empty((R, F), cp.int16)
        sh = cp.empty(R, cp.float32)
        out = cp.empty((R, H), cp.float32)
        T = K.QUANT_THREADS
        fn["quant_rows"]((R,), (T,), (d_x, np.int32(H), np.int32(act_range(H)), np.int32(q4), xq, sx))
        blk = (32 * K.WARPS,)
        gu, dn = (fn["gate_up_q4"], fn["down_q4"]) if q4 else (fn["gate_up_i8"], fn["down_i8"])
        gu(((F + K.WARPS - 1) // K.WARPS, nj), blk, (d_jobs, np.int32(H), np.int32(F), og, ou, ogs, ous, xq, sx, h))
        fn["quant_rows"]((R,), (T,), (h, np.int32(F), np.int32(act_range(F)), np.int32(q4), hq, sh))
        dn(((H + K.WARPS - 1) // K.WARPS, nj), blk, (d_jobs, np.int32(H), np.int32(F), od, ods, hq, sh, out))
        return out

    # -- transfers ----------------------------------------------------------------------------------------------
    def _copy(self, key, kind, dst, src, slot_vram, src_slot, dst_slot):
        cp = self.cp
        rt = cp.cuda.runtime
        direction = rt.memcpyHostToDevice if kind == "push" else rt.memcpyDeviceToHost

        def start():
            ev = cp.cuda.Event(block=False, disable_timing=True)
            try:
                rt.memcpyAsync(dst, src, self.record_bytes, direction, self.copy_stream.ptr)
                ev.record(self.copy_stream)
            except rt.CUDARuntimeError as e:
                raise TransportError(f"cuda backend: {kind} of key {key} failed to start: {e}") from None
            self._slot_event[slot_vram] = ev
            return ev
        h = self.events.copy(kind, key, src_slot, dst_slot, start)
        self._stats[kind + "es" if kind == "push" else kind + "s"] += 1
        self._stats[kind + "_bytes"] += self.record_bytes
        return h

    def push(self, key: int, src_slot: int, vram_slot: int):
        """RAM slot -> VRAM slot on the copy stream (the source fill must have landed)."""
        return self._copy(key, "push", self._vram_ptr(vram_slot), self._ram_ptr(src_slot), int(vram_slot),
                          int(src_slot), int(vram_slot))

    def drain(self, key: int, vram_slot: int, ram_slot: int):
        """VRAM slot -> RAM slot on the copy stream (ordered after earlier pushes/compute waits on that stream)."""
        # a drain must not overtake compute still reading the slot: compute() is synchronous, so nothing is
        return self._copy(key, "drain", self._ram_ptr(ram_slot), self._vram_ptr(vram_slot), int(vram_slot),
                          int(vram_slot), int(ram_slot))

    def fence(self) -> None:
        if self.reader is not None:
            self.reader.fence()
        if not self._closed:
            self.copy_stream.synchronize()
            self.compute_stream.synchronize()

    @property
    def stats(self) -> dict:
        st = dict(self.reader.stats) if self.reader is not None else {}
        st.update(self._stats, copy_failures=self.events.copy_failures)
        return st

    def close(self) -> None:
        if self._closed:
            return
        try:
            self.fence()
        finally:
            self._closed = True
            self._slot_event.clear()
            self.events.closed = True
            # a failed close leaks none after it: the reader's descriptor, the pinned pool
            close_all((self.lane.close if self.lane is not None else None, self.reader.close, self._teardown))
