"""The SYCL backend (dpctl): VRAM tier = one USM device arena, RAM tier = a USM host slot pool, OpenCL C kernels.

Contract: see moetier.run.contract. Memory -> tiers:

* RAM tier: ``UsmSlotPool`` - ``ram_slots`` 4 KiB-aligned slots carved from one ``MemoryUSMHost`` allocation (2 MiB
  aligned, MADV_HUGEPAGE advised). The transport's O_DIRECT ``Reader`` lands NVMe records straight into it (checked
  at start-up: if an O_DIRECT read into USM host memory fails the backend says so and the Reader falls back to
  buffered reads). Because the pool *is* USM host memory, the zerocopy lane's device kernel reads the RAM slot in
  place - there is no staging copy anywhere.
* VRAM tier: one ``MemoryUSMDevice`` arena of ``vram_slots`` x slot_bytes ("device slots").
* push/drain: ``memcpy_async`` on one in-order copy queue (so a drain of a device slot is always ordered before a
  later push into it); handles wrap the ``SyclEvent``. Fills wrap the Reader's completions. All handles share one
  monotonic ``seq``.
* compute: ``gpu`` runs the kernels over device slots, ``zerocopy`` the same kernels over the RAM pool, ``cpu`` the
  Numba kernels (backends.cpu.kernels) on the RAM slot bytes in place. The OpenCL kernels (kernels.cl) implement the
  CPU lane's math (int16 row-quantized activations, exact int32 dots, one scale) and are deterministic: one
  work-item per output element, fixed reduction order, no atomics.
"""
from __future__ import annotations

import os

import numpy as np

from moetier.run.contract import BackendUnavailable, Capabilities
from moetier.run.events import SequencedBackend, Sequencer
from moetier.run.router import StoreRouter
from moetier.bytes.expert import EXL3, RECORD_KINDS, act_range, section_offsets
from moetier.bytes.teardown import close_all
from moetier.bytes.transport import PAGE, Reader, _round_up
from backends.sycl.device import built, import_dpctl, select_device
from backends.sycl.memory import UsmSlotPool, UsmSub, odirect_into

try:
    from backends.cpu.lane import CpuLane
except ImportError:  # numba is the `cpu` extra; the cpu lane is then missing
    CpuLane = None

__all__ = ["SyclBackend", "UsmSlotPool", "import_dpctl", "odirect_into", "select_device"]


def _event_done(event) -> bool:
    return str(event.execution_status).endswith("complete")


def _event_wait(event) -> None:
    event.wait()


class SyclBackend(SequencedBackend):
    """The backend contract on one SYCL device (module docstring: memory -> tiers, lanes, handles)."""

    def __init__(self, store, *, ram_slots: int, vram_slots: int, queue_depth: int = 16, verify_rate: float = 1.0,
                 faults=None, direct: bool = True, device=None):
        dpctl = import_dpctl()
        import dpctl.memory as dm
        import dpctl.program as dp
        self._dm = dm
        self.store = store
        self.layout = lay = store.layout
        self.record_bytes = int(store.record_bytes)
        self.slot_bytes = _round_up(self.record_bytes, PAGE)
        dev = select_device(device)
        self.device = dev
        vram_slots = max(0, int(vram_slots))
        need = vram_slots * self.slot_bytes
        gmem, amax = int(dev.global_mem_size), int(dev.max_mem_alloc_size)
        if need > gmem:
            raise BackendUnavailable(f"--backend sycl: {vram_slots} VRAM slots x {self.slot_bytes} B = {need:,} B "
                                     f"exceed the device's global memory {gmem:,} B ({dev.name})")
        if need > amax:
            raise BackendUnavailable(f"--backend sycl: VRAM arena {vram_slots} x {self.slot_bytes} B = {need:,} B "
                                     f"exceeds the device's max allocation {amax:,} B ({dev.name})")
        ctx, self.prog, self.k = built(dpctl, dp, dev)
        try:
            self.q = dpctl.SyclQueue(ctx, dev, property="in_order")     # compute
            self.cq = dpctl.SyclQueue(ctx, dev, property="in_order")    # copies (push/drain)
        except Exception as e:
            raise BackendUnavailable(f"--backend sycl: cannot create a queue on {dev.name}: {e}") from None
        # tiers
        self.pool = UsmSlotPool(max(1, int(ram_slots)), self.slot_bytes, self.q)
        self.odirect_note = odirect_into(os.fspath(store.data_path), self.pool.mem, min(self.record_bytes, PAGE))
        direct = bool(direct) and self.odirect_note is None
        self.vram_slot_count = vram_slots
        self.dev_mem = dm.MemoryUSMDevice(max(1, need), queue=self.q)
        self._ram_sub = [None] * self.pool.n
        self._dev_sub = [None] * vram_slots
        self.reader = Reader(store, self.pool, queue_depth=queue_depth, verify_rate=verify_rate, direct=direct,
                             faults=faults)
        lanes = {"gpu", "zerocopy"} | ({"cpu"} if CpuLane is not None else set())
        notes = ["RAM tier is USM host memory: fills land there by O_DIRECT and the zerocopy lane reads it in place"
                 if self.odirect_note is None else f"O_DIRECT into USM host refused ({self.odirect_note}); "
                                                   "fills are buffered reads into the USM host pool"]
        self.capabilities = Capabilities(name="sycl", device=f"{dev.name} ({dev.backend}, {dev.device_type})",
                                         lanes=frozenset(lanes), encodings=frozenset(RECORD_KINDS),
                                         vram_slots=vram_slots, notes=tuple(notes))
        self._copy_stats = {"pushes": 0, "drains": 0, "push_bytes": 0, "drain_bytes": 0, "kernel_calls": 0}
        self._scratch: dict = {}
        self._closed = False
        self._offs = section_offsets(lay)
        # the cpu lane is the cpu backend's runner (same call classes, so one engine cost model for both)
        self.lane = CpuLane(lay) if CpuLane is not None else None
        self.workers = self.lane.workers if self.lane else 1
        self.parallel_min = self.lane.parallel_min if self.lane else 0
        SequencedBackend.__init__(self, events=Sequencer(self.reader, _event_done, _event_wait, "sycl"),
                                  reader=self.reader, router=StoreRouter(store))
        self.compute("gpu" if vram_slots else "zerocopy", [(0, 0, [0])], np.zeros((1, lay.hidden), np.float32))

    # -- sizes ------------------------------------------------------------------------------------------------
    @property
    def ram_slot_count(self) -> int:
        return self.pool.n

    def ram_view(self, slot: int) -> np.ndarray:
        return self.pool.view(slot)

    def _ram(self, slot: int):
        m = self._ram_sub[slot]
        if m is None:
            self.pool.check_index(slot)
            m = self._dm.MemoryUSMHost(UsmSub(self.pool.mem, slot * self.slot_bytes, self.slot_bytes, self.q))
            self._ram_sub[slot] = m
        return m

    def _dev(self, slot: int):
        if not isinstance(slot, (int, np.integer)) or not 0 <= int(slot) < self.vram_slot_count:
            raise ValueError(f"sycl backend: VRAM slot {slot!r} out of range 0..{self.vram_slot_count - 1}")
        m = self._dev_sub[slot]
        if m is None:
            m = self._dm.MemoryUSMDevice(UsmSub(self.dev_mem, slot * self.slot_bytes, self.slot_bytes, self.q))
            self._dev_sub[slot] = m
        return m

    def read_vram(self, vram_slot: int) -> np.ndarray:
        """A host copy of one device slot's record bytes (tests / debugging; waits for the copy queue)."""
        out = np.empty(self.record_bytes, np.uint8)
        self.cq.wait()
        self.cq.memcpy(out, self._dev(vram_slot), self.record_bytes)
        return out

    # -- compute ----------------------------------------------------------------------------------------------
    def _buf(self, name, nbytes):
        m = self._scratch.get(name)
        if m is None or m.nbytes < nbytes:
            m = self._dm.MemoryUSMShared(max(256, _round_up(int(nbytes) * 2, 256)), queue=self.q)
            self._scratch[name] = m
        return m

    def _arr(self, name, dtype, n):
        m = self._buf(name, max(1, n) * np.dtype(dtype).itemsize)
        return m, np.frombuffer(m, dtype=dtype, count=n)

    def compute(self, lane: str, jobs, x: np.ndarray) -> dict:
        """jobs = [(key, slot, rows)] (slot: VRAM slot for gpu, RAM slot otherwise) -> {key: float32 [rows, H]}."""
        if not jobs:
            return {}
        if lane == "cpu":
            if self.lane is None:
                raise BackendUnavailable("sycl backend: cpu lane needs numba: pip install 'moetier[cpu]'")
            for _, s, _ in jobs:
                self.pool.check_index(s)
            return self.lane.run(jobs, x, self.pool.view)
        if lane == "gpu":
            base = self.dev_mem
            for _, s, _ in jobs:
                self._dev(s)
        elif lane == "zerocopy":
            base = self.pool.mem
            for _, s, _ in jobs:
                self.pool.check_index(s)
        else:
            raise BackendUnavailable(f"sycl backend: no {lane!r} lane")
        return self._device_forward(base, jobs, x)

    def _stage(self, jobs, x):
        """The jobs' token rows, record offsets and row pointers in device-readable buffers: (R, x, recs, rp,
        rp as an array), or None when there are no rows."""
        H = self.layout.hidden
        rows = [len(r) for _, _, r in jobs]
        R = int(sum(rows))
        if R == 0:
            return None
        x = np.asarray(x, dtype=np.float32)
        mx, ax = self._arr("x", np.float32, R * H)
        ax.reshape(R, H)[...] = np.concatenate([x[np.asarray(r, dtype=np.intp)] for _, _, r in jobs])
        mrecs, recs = self._arr("recs", np.int64, len(jobs))
        recs[:] = [int(s) * self.slot_bytes for _, s, _ in jobs]
        mrp, rp = self._arr("rp", np.int32, len(jobs) + 1)
        rp[0] = 0
        rp[1:] = np.cumsum(rows)
        return R, mx, mrecs, mrp, rp

    def _device_forward(self, base, jobs, x) -> dict:
        import ctypes as C
        lay = self.layout
        if lay.encoding == EXL3:
            return self._exl3_forward(base, jobs, x)
        H, F, enc = lay.hidden, lay.ffn, lay.encoding
        n = len(jobs)
        staged = self._stage(jobs, x)
        if staged is None:
            return {key: np.empty((0, H), np.float32) for key, _, _ in jobs}
        R, mx, mrecs, mrp, rp = staged
        mxq, _ = self._arr("xq", np.int16, R * H)
        msx, _ = self._arr("sx", np.float32, R)
        mxg, _ = self._arr("xg", np.int32, R * (H // 32))
        mh, _ = self._arr("h", np.float32, R * F)
        mhq, _ = self._arr("hq", np.int16, R * F)
        msh, _ = self._arr("sh", np.float32, R)
        mhg, _ = self._arr("hg", np.int32, R * (F // 32))
        mout, out = self._arr("out", np.float32, R * H)
        o = self._offs
        q, k = self.q, self.k
        i32, i64 = C.c_int32, C.c_int64
        q.submit_async(k["quant_rows"], [mx, i32(H), i32(act_range(H)), mxq, msx, mxg], [R])
        if enc == "int8":
            q.submit_async(k["i8_gate_up"], [base, mrecs, mrp, i32(H), i32(F), i64(o[0]), i64(o[1]), i64(o[3]),
                                             i64(o[4]), mxq, msx, mh], [n * F])
            q.submit_async(k["quant_rows"], [mh, i32(F), i32(act_range(F)), mhq, msh, mhg], [R])
            ev = q.submit_async(k["i8_down"], [base, mrecs, mrp, i32(H), i32(F), i64(o[2]), i64(o[5]), mhq, msh,
                                               mout], [n * H])
        else:
            q.submit_async(k["i4_gate_up"], [base, mrecs, mrp, i32(H), i32(F), i64(o[0]), i64(o[1]), i64(o[3]),
                                             i64(o[4]), mxq, msx, mxg, mh], [n * F])
            q.submit_async(k["quant_rows"], [mh, i32(F), i32(act_range(F)), mhq, msh, mhg], [R])
            ev = q.submit_async(k["i4_down"], [base, mrecs, mrp, i32(H), i32(F), i64(o[2]), i64(o[5]), mhq, msh,
                                               mhg, mout], [n * H])
        ev.wait()
        self._copy_stats["kernel_calls"] += 1
        res = out.reshape(R, H).copy()
        return {key: res[rp[e]:rp[e + 1]] for e, (key, _, _) in enumerate(jobs)}

    # -- EXL3 (exl3.cl) -----------------------------------------------------------------------------------------
    def _exl3_tables(self, codebook):
        """(codebook table, inverse tensor-core placement) as device-readable buffers, built once per backend."""
        from moetier.bytes import exl3
        m = self._scratch.get(("lut", codebook))
        if m is None:
            lut = exl3.codebook_lut(codebook).astype(np.float32)
            m = self._scratch[("lut", codebook)] = self._dm.MemoryUSMShared(lut.nbytes, queue=self.q)
            np.frombuffer(m, np.float32)[:] = lut
        p = self._scratch.get("pinv")
        if p is None:
            p = self._scratch["pinv"] = self._dm.MemoryUSMShared(256 * 4, queue=self.q)
            np.frombuffer(p, np.int32)[:] = exl3.TC_PERM_INV
        return m, p

    def _exl3_linear(self, base, mrecs, mrp, mrexp, n_exp, R, lin, k, n, xin, round_x, mout):
        """One EXL3 linear of every job's expert: input transform, raw GEMM, output transform (fp16 roundings)."""
        import ctypes as C
        lay, q, kk = self.layout, self.q, self.k
        sec = lay.sections
        i32, i64 = C.c_int32, C.c_int64
        lut, pinv = self._exl3_tables(lay.codebook)
        mxh, _ = self._arr(f"xh{k}", np.float32, R * k)
        q.submit_async(kk["exl3_in"], [base, mrecs, mrexp, i64(sec[f"{lin}_suh"][0]), i32(k), xin, i32(round_x),
                                       i32(1), mxh], [R * (k // 128)])
        q.submit_async(kk["exl3_gemm"], [base, mrecs, mrp, i64(sec[f"{lin}_trellis"][0]), i32(k), i32(n),
                                         i32(lay.bits), lut, pinv, mxh, mout], [n_exp * n])
        return q.submit_async(kk["exl3_out"], [base, mrecs, mrexp, i64(sec[f"{lin}_svh"][0]), i32(n), i32(1), mout],
                              [R * (n // 128)])

    def _exl3_forward(self, base, jobs, x) -> dict:
        import ctypes as C
        lay = self.layout
        H, F = lay.hidden, lay.ffn
        n = len(jobs)
        staged = self._stage(jobs, x)
        if staged is None:
            return {key: np.empty((0, H), np.float32) for key, _, _ in jobs}
        R, mx, mrecs, mrp, rp = staged
        mrexp, rexp = self._arr("rexp", np.int32, R)
        rexp[:] = np.repeat(np.arange(n, dtype=np.int32), np.diff(rp))
        mg, _ = self._arr("g", np.float32, R * F)
        mu, _ = self._arr("u", np.float32, R * F)
        mout, out = self._arr("out", np.float32, R * H)
        self._exl3_linear(base, mrecs, mrp, mrexp, n, R, "gate", H, F, mx, 1, mg)
        self._exl3_linear(base, mrecs, mrp, mrexp, n, R, "up", H, F, mx, 1, mu)
        self.q.submit_async(self.k["exl3_swiglu"], [mg, mu, C.c_float(lay.act_limit), C.c_int32(1)], [R * F])
        self._exl3_linear(base, mrecs, mrp, mrexp, n, R, "down", F, H, mg, 0, mout).wait()
        self._copy_stats["kernel_calls"] += 1
        res = out.reshape(R, H).copy()
        return {key: res[rp[e]:rp[e + 1]] for e, (key, _, _) in enumerate(jobs)}

    def exl3_int_forward(self, lane: str, jobs, x: np.ndarray, shift: int, a_max: int) -> dict:
        """exl3-int (moetier.bytes.exl3.int_expert_forward) of each job's expert on integer rows x: {key: int64
        [rows, H]}, bit-identical on every lane (conformance hook)."""
        if lane == "cpu":
            return self.lane.exl3_int_forward(jobs, x, shift, a_max, self.pool.view)
        import ctypes as C
        lay = self.layout
        H, F = lay.hidden, lay.ffn
        base = self.dev_mem if lane == "gpu" else self.pool.mem
        n = len(jobs)
        rows = [len(r) for _, _, r in jobs]
        R = int(sum(rows))
        mx, ax = self._arr("ix", np.int64, R * H)
        ax.reshape(R, H)[...] = np.concatenate([np.asarray(x, np.int64)[np.asarray(r, np.intp)] for _, _, r in jobs])
        mrecs, recs = self._arr("irecs", np.int64, n)
        recs[:] = [int(s) * self.slot_bytes for _, s, _ in jobs]
        mrp, rp = self._arr("irp", np.int32, n + 1)
        rp[0] = 0
        rp[1:] = np.cumsum(rows)
        mrexp, rexp = self._arr("irexp", np.int32, R)
        rexp[:] = np.repeat(np.arange(n, dtype=np.int32), rows)
        _, pinv = self._exl3_tables(lay.codebook)
        sec, q, kk, i32, i64 = lay.sections, self.q, self.k, C.c_int32, C.c_int64

        def linear(lin, k, nn, xin, out):
            mxh, _ = self._arr(f"ixh{k}", np.int64, R * k)
            q.submit_async(kk["exl3i_in"], [base, mrecs, mrexp, i64(sec[f"{lin}_suh"][0]), i32(k), xin, mxh],
                           [R * (k // 128)])
            q.submit_async(kk["exl3i_gemm"], [base, mrecs, mrp, i64(sec[f"{lin}_trellis"][0]), i32(k), i32(nn),
                                              i32(lay.bits), pinv, mxh, out], [n * nn])
            return q.submit_async(kk["exl3i_out"], [base, mrecs, mrexp, i64(sec[f"{lin}_svh"][0]), i32(nn), out],
                                  [R * (nn // 128)])

        mg, _ = self._arr("ig", np.int64, R * F)
        mu, _ = self._arr("iu", np.int64, R * F)
        mout, out = self._arr("iout", np.int64, R * H)
        linear("gate", H, F, mx, mg)
        linear("up", H, F, mx, mu)
        q.submit_async(kk["exl3i_gate"], [mg, mu, i32(shift), i64(a_max)], [R * F])
        linear("down", F, H, mg, mout).wait()
        res = out.reshape(R, H).copy()
        return {key: res[rp[e]:rp[e + 1]] for e, (key, _, _) in enumerate(jobs)}

    def _lane_buffer(self, lane: str, a: np.ndarray):
        """A copy of a host array in the memory a lane's kernels read (device memory for gpu, host USM for
        zerocopy)."""
        if lane not in ("gpu", "zerocopy"):
            raise BackendUnavailable(f"sycl backend: no {lane!r} device lane")
        a = np.ascontiguousarray(a)
        cls = self._dm.MemoryUSMDevice if lane == "gpu" else self._dm.MemoryUSMHost
        m = cls(max(256, a.nbytes), queue=self.q)
        m.copy_from_host(a.view(np.uint8).reshape(-1))
        return m

    def exl3_decode(self, lane: str, trellis: np.ndarray, codebook) -> np.ndarray:
        """W_inner [k, n] float32 of a trellis as the lane's kernel decodes it (test hook: bit-exact decode)."""
        if lane == "cpu":
            return self.lane.exl3_decode(trellis, codebook)
        import ctypes as C
        from moetier.bytes import exl3
        K = exl3.trellis_bits(trellis)
        k, n = trellis.shape[0] * 16, trellis.shape[1] * 16
        tr = self._lane_buffer(lane, trellis)
        lut, pinv = self._exl3_tables(exl3.CODEBOOKS[exl3.codebook_index(codebook)])
        mout, out = self._arr("decode", np.float32, k * n)
        self.q.submit_async(self.k["exl3_decode"], [tr, C.c_int32(k), C.c_int32(n), C.c_int32(K), lut, pinv, mout],
                            [k * n]).wait()
        return out.reshape(k, n).copy()

    def exl3_raw_gemm(self, lane: str, xh: np.ndarray, trellis: np.ndarray, codebook) -> np.ndarray:
        """xh [T, k] @ W_inner, float32, as the lane's kernel computes it (test hook: the one-hot raw GEMM)."""
        if lane == "cpu":
            return self.lane.exl3_raw_gemm(xh, trellis, codebook)
        import ctypes as C
        from moetier.bytes import exl3
        K = exl3.trellis_bits(trellis)
        k, n = trellis.shape[0] * 16, trellis.shape[1] * 16
        xh = np.ascontiguousarray(xh, dtype=np.float32).reshape(-1, k)
        T = xh.shape[0]
        tr = self._lane_buffer(lane, trellis)
        lut, pinv = self._exl3_tables(exl3.CODEBOOKS[exl3.codebook_index(codebook)])
        mx, ax = self._arr("rg_x", np.float32, T * k)
        ax[:] = xh.reshape(-1)
        mrecs, recs = self._arr("rg_recs", np.int64, 1)
        recs[0] = 0
        mrp, rp = self._arr("rg_rp", np.int32, 2)
        rp[:] = (0, T)
        mout, out = self._arr("rg_out", np.float32, T * n)
        self.q.submit_async(self.k["exl3_gemm"], [tr, mrecs, mrp, C.c_int64(0), C.c_int32(k), C.c_int32(n),
                                                  C.c_int32(K), lut, pinv, mx, mout], [n]).wait()
        return out.reshape(T, n).copy()

    # -- transfers --------------------------------------------------------------------------------------------
    def push(self, key: int, src_slot: int, vram_slot: int):
        return self._copy("push", key, src_slot, vram_slot, self._ram(src_slot), self._dev(vram_slot))

    def drain(self, key: int, vram_slot: int, ram_slot: int):
        return self._copy("drain", key, vram_slot, ram_slot, self._dev(vram_slot), self._ram(ram_slot))

    def _copy(self, kind, key, src_slot, dst_slot, src, dst):
        rb = self.record_bytes
        h = self.events.copy(kind, key, src_slot, dst_slot, lambda: self.cq.memcpy_async(dst, src, rb))
        self._copy_stats[{"push": "pushes", "drain": "drains"}[kind]] += 1
        self._copy_stats[f"{kind}_bytes"] += rb
        return h

    def fence(self) -> None:
        self.reader.fence()
        self.cq.wait()
        self.q.wait()
        self.events.copies_done()
        self.events.completed_seq()

    @property
    def outstanding(self) -> int:
        return self.events.outstanding

    @property
    def stats(self) -> dict:
        return {**self.reader.stats, **self._copy_stats}

    def close(self) -> None:
        if self._closed:
            return
        self.fence()
        self._closed = self.events.closed = True
        lane = self.lane.close if self.lane is not None else None
        close_all((lane, self.reader.close, self._drop_subs, self.pool.close))    # a failed one leaks none after it

    def _drop_subs(self) -> None:
        self._ram_sub = []
        self._dev_sub = []
        self._scratch.clear()
