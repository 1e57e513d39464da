"""The moetier backend of the exl3xpu adapter: RAM and VRAM slots in the ops' memory, transfers, and the lanes.

Contract: moetier.run.contract, driven by moetier.run.runtime.Runtime like every backend. Who computes which lane:

* ``cpu``: moetier's EXL3 CPU lane on the RAM slot's record bytes (adapters.engine_lanes.cpu_rows: Numba, NumPy
  where numba is missing), unweighted rows as every backend returns them.
* ``gpu`` and ``zerocopy``: exl3xpu's ``moe_forward`` computes them after the router returns, reading each expert
  through the layer's pointer table. ``compute`` points the key's row at the slot it is handed (a VRAM slot, or a
  RAM slot read over the bus) - the runtime hands a lane only slots whose bytes it saw land - and returns zero
  partials (the kernel adds its own). A push or drain that lands points the key's row at its new slot
  (``_landed_copy``): rows follow bytes, never precede them. ``point`` is set by attach. The lanes, fills and
handles are adapters.engine_lanes.EngineLanes (its seq watermark moetier.run.events'), shared with the exllamav3
adapter.

RAM slots are a moetier.bytes.transport.SlotPool (the host store; on the engine, USM host / memfd pages) filled by its
O_DIRECT Reader from a store of exl3 records; VRAM slots are one device allocation of ``vram_slots`` records. Both are
registered with the ops' memory (kind "host" / "device"), so ``usm_kind`` and the kernel's address checks see them.
Pushes and drains are ``ops.memcpy_async`` (synchronous on moetier's provider: landed when issued).
"""
from __future__ import annotations

import numpy as np

from adapters.engine_lanes import EngineLanes
from moetier.bytes.expert import EXL3
from moetier.bytes.transport import Reader, SlotPool
from moetier.run.contract import BackendUnavailable, Capabilities


class XpuBackend(EngineLanes):
    def __init__(self, store, ops, *, ram_slots: int, vram_slots: int, queue_depth: int = 16,
                 verify_rate: float = 1.0, direct: bool = True, any_store: bool = False):
        if store.layout.encoding != EXL3 and not any_store:
            raise BackendUnavailable(f"exl3xpu backend: store {store.path} holds {store.layout.encoding!r} records, "
                                     f"expected {EXL3!r} (moetier store pack --checkpoint)")
        self.ops, self.store, self.layout = ops, store, store.layout
        self.record_bytes = int(store.record_bytes)
        self.pool = SlotPool(max(1, int(ram_slots)), self.record_bytes)
        self.reader = Reader(store, self.pool, queue_depth=queue_depth, verify_rate=verify_rate, direct=direct)
        self._host = np.frombuffer(self.pool._mm, np.uint8, self.pool.nbytes, self.pool._off
                                   ).reshape(self.pool.n, self.pool.slot_bytes)
        self.vram_slots = int(vram_slots)
        self.arena = np.zeros((max(1, self.vram_slots), self.record_bytes), np.uint8)
        ops.memory.add(self._host, "host")
        ops.memory.add(self.arena, "device")
        self.capabilities = Capabilities(
            name="exl3xpu", device=f"exl3xpu ops: {ops.provider}", lanes=frozenset({"cpu", "zerocopy", "gpu"}),
            encodings=frozenset({"exl3"}), vram_slots=self.vram_slots,
            notes=("gpu and zerocopy picks are computed by exl3xpu's moe_forward through its pointer tables",))
        self._init_lanes("exl3xpu")
        self._owns_ops = False              # open_backend made the op table: close() closes it

    def unattached(self, lane: str, jobs, x: np.ndarray) -> dict:
        """No model attached: exl3xpu's ``moe_forward`` itself computes each key from the slot handed, through a
        one-row pointer table (id 0, weight 1: the expert's unweighted rows, as every lane returns them)."""
        where = self.vram_address if lane == "gpu" else self.ram_address
        lay = self.layout
        out = {}
        for k, slot, rows in jobs:
            xr = np.ascontiguousarray(x[rows], np.float32)
            n = xr.shape[0]
            out[k] = np.asarray(self.ops.moe_forward(xr, np.zeros((n, 1), np.int32), np.ones((n, 1), np.float32),
                                                     np.array([where(slot)], np.int64), lay.ffn, lay.bits, 1),
                                np.float32)
        return out

    def ram_address(self, slot: int) -> int:
        return int(self._host[int(slot)].ctypes.data)

    def vram_address(self, slot: int) -> int:
        return int(self.arena[int(slot)].ctypes.data)

    def read_vram(self, slot: int) -> np.ndarray:
        return self.arena[int(slot)].copy()

    # -- transfers ------------------------------------------------------------------------------------------------
    def _start_copy(self, kind: str, ram_slot: int, vram_slot: int):
        host, dev = self._host[int(ram_slot)], self.arena[int(vram_slot)]
        dst, src = (dev, host) if kind == "push" else (host, dev)
        self.ops.memcpy_async(dst, src, self.record_bytes)
        return None                        # memcpy_async of the provider returns with the bytes there

    def fence(self) -> None:
        """Every transfer finished (the provider's kernels are synchronous: nothing still reads a slot)."""
        self.reader.fence()

    def close(self) -> None:
        self.fence()
        self.reader.close()
        self.ops.memory.remove(self._host)
        self.ops.memory.remove(self.arena)
        if self._owns_ops and hasattr(self.ops, "close"):
            self.ops.close()


def open_backend(store, *, ram_slots: int, vram_slots: int = 0, **kw) -> XpuBackend:
    """The ``moetier.backends`` entry point ``exl3xpu``: the backend on its own (no model attached), over exl3xpu's
    ops where exl3xpu runs here, else moetier's provider of them (adapters.exl3xpu.surface.op_table: moetier's SYCL
    EXL3 kernel on a dpctl device, or its CPU kernel). Its gpu and zerocopy lanes are ``moe_forward`` over the slot
    handed. It opens over a store of any records (its transfers are byte moves) but declares, and computes, exl3
    only. BackendUnavailable (one line) for an op table that does not offer the pinned surface."""
    from adapters.exl3xpu import surface
    lay = store.layout
    exl3 = lay.encoding == EXL3
    ops = surface.op_table(store if exl3 else None, codebook=lay.codebook if exl3 else "mul1",
                           act_limit=float(lay.act_limit or 0.0) if exl3 else 0.0)
    try:
        surface.require(ops)
        be = XpuBackend(store, ops, ram_slots=ram_slots, vram_slots=vram_slots, any_store=True, **kw)
    except BaseException as e:
        if hasattr(ops, "close"):
            ops.close()
        if isinstance(e, surface.SurfaceMismatch):
            raise BackendUnavailable(f"exl3xpu backend: {e}") from None
        raise
    be._owns_ops = True
    return be
