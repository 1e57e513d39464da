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
Every slot holds exl3xpu's blob (adapters.exl3xpu.blob, PLANAR4), the layout its kernel reads: a fill's record is
packed into its slot when the fill is first seen landed (``landed`` / ``wait``), before anything reads it; pushes
and drains are byte moves of blobs, ``ops.memcpy_async`` (synchronous on moetier's provider: landed when issued); the
cpu lane decodes the blob (``expert``). The test hooks ``ram_view`` / ``read_vram`` return the slot's expert as a
store record (unpacked), so the conformance suite compares it with the store's bytes.
"""
from __future__ import annotations

import numpy as np

from adapters.engine_lanes import EngineLanes
from adapters.exl3xpu import blob
from moetier.bytes.expert import EXL3
from moetier.bytes.transport import Reader, SlotPool
from moetier.run.contract import BackendUnavailable, Capabilities


class RecordView(np.ndarray):
    """A slot's expert as a store record whose writes go back into the slot as the blob of the record written."""

    @classmethod
    def of(cls, rec: np.ndarray, layout, slot: np.ndarray) -> "RecordView":
        v = rec.view(cls)
        v._layout, v._slot = layout, slot
        return v

    def __setitem__(self, index, value):
        super().__setitem__(index, value)
        b = blob.pack_record(self._layout, np.asarray(self))
        self._slot[:b.size] = b
        self._slot[b.size:] = 0


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
        self.blobs = store.layout.encoding == EXL3       # slots hold exl3xpu's blobs (a store of other records: raw)
        self._raw: dict = {}                # RAM slot -> seq of the fill whose record is not yet packed into a blob

    # -- the blob in the slots ------------------------------------------------------------------------------------
    def fill(self, key: int, slot: int, *, prefetch: bool = False):
        h = super().fill(key, slot, prefetch=prefetch)
        self._raw[int(slot)] = h.seq
        return h

    def _packed(self, h) -> None:
        """A fill seen landed: the record it read is packed into the slot as exl3xpu's blob before anyone reads it
        (exl3xpu's ``_maybe_pack`` at load; here at the landing, so the store stays moetier's exl3 records)."""
        if h.kind == "fill" and self._raw.get(h.slot) == h.seq:
            del self._raw[h.slot]
            if self.blobs:
                slot = self._host[h.slot]
                b = blob.pack_record(self.layout, slot[:self.record_bytes].copy())
                slot[:b.size] = b
                slot[b.size:] = 0

    def landed(self, handle) -> bool:
        done = self.events.landed(handle)
        if done:
            self._packed(handle)
        return done

    def wait(self, handle):
        self.events.wait(handle)
        self._packed(handle)
        return handle

    def expert(self, slot: int):
        """The EXL3 expert in RAM slot ``slot``, unpacked from its blob (the cpu lane's record view)."""
        return blob.expert(self.layout, self._host[int(slot)])

    def _as_record(self, buf: np.ndarray) -> np.ndarray:
        return blob.record(self.layout, buf) if self.blobs else buf.copy()

    def ram_view(self, slot: int) -> np.ndarray:
        """RAM slot ``slot``'s expert as a store record (a test hook): the blob unpacked, and a write into the view
        packed back into the slot (RecordView). A slot whose fill has not been seen landed holds the raw record."""
        s = int(slot)
        if s in self._raw or not self.blobs:
            return self._host[s]
        return RecordView.of(self._as_record(self._host[s]), self.layout, self._host[s])

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
        """VRAM slot ``slot``'s expert as a store record (its blob unpacked; a copy)."""
        return self._as_record(self.arena[int(slot)])

    # -- transfers ------------------------------------------------------------------------------------------------
    def _start_copy(self, kind: str, ram_slot: int, vram_slot: int):
        host, dev = self._host[int(ram_slot)], self.arena[int(vram_slot)]
        dst, src = (dev, host) if kind == "push" else (host, dev)
        if kind == "drain":
            self._raw.pop(int(ram_slot), None)          # a blob comes back: nothing to pack
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
