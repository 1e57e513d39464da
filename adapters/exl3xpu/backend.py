"""The moetier backend of the exl3xpu adapter: RAM and VRAM slots in the ops' memory, transfers, and the lanes.

Contract: moetier.run.contract, driven by moetier.run.runtime.Runtime like every backend. Who computes which lane:

* ``cpu``: moetier's EXL3 CPU lane on the RAM slot's record bytes (adapters.engine_lanes.cpu_rows: Numba, NumPy
  where numba is missing), unweighted rows as every backend returns them.
* ``gpu`` and ``zerocopy``: exl3xpu's ``moe_forward`` computes them after the router returns, reading each expert
  through the layer's pointer table. ``compute`` points the key's row at the slot it is handed (a VRAM slot, or a
  RAM slot read over the bus) - the runtime hands a lane only slots whose bytes it saw land - and returns zero
  partials (the kernel adds its own). A push or drain that lands points the key's row at its new slot
  (``_landed_copy``): rows follow bytes, never precede them. ``point`` is set by attach. The lanes, fills and
handles are adapters.engine_lanes.EngineLanes, shared with the exllamav3 adapter.

RAM slots are a moetier.bytes.transport.SlotPool (the host store; on the engine, USM host / memfd pages) filled by its
O_DIRECT Reader from a store of exl3 records; VRAM slots are one device allocation of ``vram_slots`` records. Both are
registered with the ops' memory (kind "host" / "device"), so ``usm_kind`` and the kernel's address checks see them.
Pushes and drains are ``ops.memcpy_async`` (synchronous on moetier's provider: landed when issued).
"""
from __future__ import annotations

import numpy as np

from adapters.engine_lanes import EngineLanes
from backends.transfers import CopyHandle
from moetier.bytes.expert import EXL3
from moetier.bytes.transport import Reader, SlotPool, TransportError
from moetier.run.contract import BackendUnavailable, Capabilities


class XpuBackend(EngineLanes):
    def __init__(self, store, ops, *, ram_slots: int, vram_slots: int, queue_depth: int = 16,
                 verify_rate: float = 1.0, direct: bool = True):
        if store.layout.encoding != EXL3:
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

    def ram_address(self, slot: int) -> int:
        return int(self._host[int(slot)].ctypes.data)

    def vram_address(self, slot: int) -> int:
        return int(self.arena[int(slot)].ctypes.data)

    def read_vram(self, slot: int) -> np.ndarray:
        return self.arena[int(slot)].copy()

    # -- transfers ------------------------------------------------------------------------------------------------
    def _copy(self, key: int, kind: str, ram_slot: int, vram_slot: int):
        host, dev = self._host[int(ram_slot)], self.arena[int(vram_slot)]
        dst, src = (dev, host) if kind == "push" else (host, dev)
        self.ops.memcpy_async(dst, src, self.record_bytes)
        h = CopyHandle(self._next_seq(), int(key), kind, ram_slot if kind == "push" else vram_slot,
                       vram_slot if kind == "push" else ram_slot, None)
        self._pending[h.seq] = h
        self._landed_copy(h)               # memcpy_async of the provider returns with the bytes there
        self._count_copy(kind, self.record_bytes)
        return h

    def _copy_done(self, h, block: bool) -> bool:
        if h.state == "failed":
            raise TransportError(h.error)
        return h.state == "landed"

    def fence(self) -> None:
        """Every transfer finished (the provider's kernels are synchronous: nothing still reads a slot)."""
        self.reader.fence()

    def close(self) -> None:
        self.fence()
        self.reader.close()
        self.ops.memory.remove(self._host)
        self.ops.memory.remove(self.arena)
