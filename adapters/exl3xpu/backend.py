"""The moetier backend of the exl3xpu adapter: RAM and VRAM slots in the op table's memory, transfers, the victim
ring, and the lanes.

Contract: moetier.run.contract, driven by moetier.run.runtime.Runtime like every backend. It calls only the ops of
adapters.exl3xpu.surface.OPS (exl3xpu's ``torch.ops.exl3xpu_moe``, or moetier's stand-in for them) and the XPU
allocator. Who computes which lane:

* ``cpu``: moetier's EXL3 CPU lane on the RAM slot's record bytes (adapters.engine_lanes.cpu_rows: Numba, NumPy
  where numba is missing), unweighted rows as every backend returns them.
* ``gpu`` and ``zerocopy``: exl3xpu's ``moe_forward`` computes them after the router returns, reading each expert
  through the layer's pointer table. ``compute`` points the key's row at the slot it is handed (a VRAM slot, or a
  RAM slot read over the bus) - the runtime hands a lane only slots whose bytes it saw land - and returns zero
  partials (the kernel adds its own). A push or drain that lands points the key's row at its new slot
  (``_landed_copy``): rows follow bytes, never precede them. ``point`` is set by attach. The lanes, fills and
handles are adapters.engine_lanes.EngineLanes (its seq watermark moetier.run.events'), shared with the exllamav3
adapter.

Memory. RAM slots are one ``host_alloc`` buffer (USM host, which the kernel reads zero-copy) carved into 4 KiB-aligned
slots (``HostPool``) that the O_DIRECT Reader fills from a store of exl3 records; VRAM slots are one device buffer
from the XPU allocator (surface.device_allocator); the opening checks both with ``usm_kind`` (1 host, 2 device) and
the blob size with ``blob_bytes``. Every slot holds exl3xpu's blob (adapters.exl3xpu.blob, PLANAR4), the layout its
kernel reads: a fill's record is packed into its slot when the fill is first seen landed (``landed`` / ``wait``),
before anything reads it; the cpu lane decodes the blob (``expert``). Pushes are ``memcpy_async`` RAM slot -> VRAM
slot, landed when the event recorded after it completes (surface.copy_event; the stand-in's copy is done on return).

Drains go through exl3xpu's victim ring (adapters.exl3xpu.ring, reference section 4.4): ``drain(key, vram_slot,
ram_slot)`` is the eviction - the VRAM slot's bytes are claimed into the ring (``Ring.claim``: ``memcpy_async`` VRAM
slot -> ring slot, then (key, seq) published in ``meta``), and the handle lands when a host step (every ``landed`` /
``wait`` poll, and ``fence``) has found the claim in a lagged copy of ``meta`` (``victims``) and written it back:
``memcpy_async`` ring slot -> USM staging, the host copy staging -> the RAM slot, only then ``res[key] = 1`` (the
RAM flag the kernel reads). The runtime's ledger lands (ram_put) after that; the ring slot is freed (key = -1) at the
next host step after the landing was reported. Guards: a key with a write-back in flight (vr_busy) is never claimed
again; a write-back whose RAM slot still has a fill writing into it (ppend: the page's other write pending) is
deferred. Ring full: the host first writes back and frees what it holds; a claim that still finds no slot is dropped
(the handle fails with one line - the ledger is never told a dropped victim landed).

The test hooks ``ram_view`` / ``read_vram`` return the slot's expert as a store record (unpacked), so the conformance
suite compares it with the store's bytes; ``read_vram`` reads the device slot back through ``memcpy_async``.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from adapters.engine_lanes import EngineLanes
from adapters.exl3xpu import blob, surface
from adapters.exl3xpu.ring import Ring
from moetier.bytes.expert import EXL3
from moetier.bytes.pool import PAGE, BufferSlotPool
from moetier.bytes.teardown import close_all
from moetier.bytes.transport import Reader, TransportError
from moetier.run.contract import BackendUnavailable, Capabilities

RING_SLOTS = 8                     # victim ring claims in flight (a9's K)


class HostPool(BufferSlotPool):
    """``n`` RAM slots of ``slot_bytes`` (rounded up to 4 KiB) in one ``host_alloc`` buffer, for the O_DIRECT Reader:
    the slot pool protocol (moetier.bytes.pool) over USM host memory instead of an anonymous mapping."""

    def __init__(self, buf, n: int, slot_bytes: int):
        self._buf = buf                              # the allocation (a torch tensor on the engine) stays alive
        super().__init__(surface.host_array(buf), n, slot_bytes, surface.address(buf))


@dataclass
class Claim:
    """A drain's victim in the ring: its ring slot, key, seq and destination RAM slot; ``written`` once its bytes and
    flag are in the RAM slot, ``reported`` once its handle was seen landed."""
    slot: int
    key: int
    seq: int
    ram_slot: int
    written: bool = False
    reported: bool = False


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
                 verify_rate: float = 1.0, direct: bool = True, any_store: bool = False, ring_slots: int = RING_SLOTS,
                 faults=None):
        if store.layout.encoding != EXL3 and not any_store:
            raise BackendUnavailable(f"exl3xpu backend: store {store.path} holds {store.layout.encoding!r} records, "
                                     f"expected {EXL3!r} (moetier store pack --checkpoint)")
        self.ops, self.store, self.layout = ops, store, store.layout
        self.record_bytes = rb = int(store.record_bytes)
        self.blobs = store.layout.encoding == EXL3       # slots hold exl3xpu's blobs (a store of other records: raw)
        if self.blobs:
            lay = store.layout
            nb = int(ops.blob_bytes(lay.hidden, lay.ffn, lay.bits))
            if nb > rb:
                raise BackendUnavailable(f"exl3xpu backend: blob_bytes({lay.hidden}, {lay.ffn}, {lay.bits}) is {nb} B, "
                                         f"more than the store's {rb} B records hold")
        n = max(1, int(ram_slots))
        self.pool = HostPool(ops.host_alloc(n * (-(-rb // PAGE) * PAGE)), n, rb)
        self.reader = Reader(store, self.pool, queue_depth=queue_depth, verify_rate=verify_rate, direct=direct,
                             faults=faults)
        self._host = self.pool._mm.reshape(self.pool.n, self.pool.slot_bytes)
        self.vram_slots = int(vram_slots)
        device_alloc = surface.device_allocator(ops)
        self.arena = device_alloc(max(1, self.vram_slots) * rb)
        self._arena_base = surface.address(self.arena)
        host_alloc = lambda nbytes: surface.host_array(ops.host_alloc(nbytes))  # noqa: E731
        self._peek = host_alloc(rb)                  # read_vram's staging
        self.ring = Ring(ring_slots, rb, host_alloc, device_alloc, ops.memcpy_async, surface.address,
                         surface.stream_sync(ops))
        for what, ptr, want in (("RAM slots", self.pool.base, surface.USM_HOST),
                                ("VRAM slots", self._arena_base, surface.USM_DEVICE)):
            got = int(ops.usm_kind(ptr))
            if got != want:
                raise BackendUnavailable(f"exl3xpu backend: usm_kind of its {what} is {got}, expected {want}")
        self.res = np.zeros(int(store.nrecords), np.uint8)   # RAM flags a write-back published (the kernel's res)
        self.capabilities = Capabilities(
            name="exl3xpu", device=f"exl3xpu ops: {ops.provider}", lanes=frozenset({"cpu", "zerocopy", "gpu"}),
            encodings=frozenset({"exl3"}), vram_slots=self.vram_slots,
            notes=("gpu and zerocopy picks are computed by exl3xpu's moe_forward through its pointer tables",
                   "drains go through exl3xpu's victim ring"))
        self._init_lanes("exl3xpu", self._poll, self._block)
        self._owns_ops = False              # open_backend made the op table: close() closes it
        self._raw: dict = {}                # RAM slot -> seq of the fill whose record is not yet packed into a blob
        self._fills: dict = {}              # RAM slot -> the last fill handle into it (ppend: a write still pending)
        self._claims: dict = {}             # ring slot -> Claim not yet freed
        self._busy: set = set()             # keys with a write-back in flight (vr_busy)

    # -- the blob in the slots ------------------------------------------------------------------------------------
    def fill(self, key: int, slot: int, *, prefetch: bool = False):
        h = super().fill(key, slot, prefetch=prefetch)
        self._raw[int(slot)] = h.seq
        self._fills[int(slot)] = h
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
        from adapters.exl3xpu import surface
        where = self.vram_address if lane == "gpu" else self.ram_address
        lay = self.layout
        dev = surface.device_input(self.ops)
        out = {}
        for k, slot, rows in jobs:
            n = len(rows)
            y = self.ops.moe_forward(dev(np.asarray(x[rows], np.float16)), dev(np.zeros((n, 1), np.int32)),
                                     dev(np.ones((n, 1), np.float32)), dev(np.array([where(slot)], np.int64)),
                                     lay.ffn, lay.bits, 1)
            out[k] = y.float().cpu().numpy() if hasattr(y, "cpu") else np.asarray(y, np.float32)
        return out

    def ram_address(self, slot: int) -> int:
        return self.pool.base + int(slot) * self.pool.slot_bytes

    def vram_address(self, slot: int) -> int:
        return self._arena_base + int(slot) * self.record_bytes

    def read_vram(self, slot: int) -> np.ndarray:
        """VRAM slot ``slot``'s expert as a store record (read back by ``memcpy_async``; its blob unpacked)."""
        self.ops.memcpy_async(surface.address(self._peek), self.vram_address(slot), self.record_bytes)
        (surface.stream_sync(self.ops) or (lambda: None))()
        return self._as_record(self._peek)

    # -- transfers ------------------------------------------------------------------------------------------------
    def _start_copy(self, kind: str, ram_slot: int, vram_slot: int):
        """A push: ``memcpy_async`` RAM slot -> VRAM slot (drains go through the ring: ``drain``)."""
        self.ops.memcpy_async(self.vram_address(vram_slot), self.ram_address(ram_slot), self.record_bytes)
        return surface.copy_event(self.ops)        # None on the stand-in: its memcpy_async returns with the bytes

    def drain(self, key: int, vram_slot: int, ram_slot: int):
        """The eviction of ``key`` from VRAM slot ``vram_slot``: claimed into the victim ring; the handle lands once
        a host step has written the claim back into RAM slot ``ram_slot`` (module docstring)."""
        self._ring_step()
        h = self.events.copy("drain", int(key), int(vram_slot), int(ram_slot),
                             lambda: self._claim(int(key), int(vram_slot), int(ram_slot)))
        self._stats["drains"] += 1
        self._stats["drain_bytes"] += self.record_bytes
        return h

    def _claim(self, key: int, vram_slot: int, ram_slot: int) -> Claim:
        if any(c.key == key and not c.written for c in self._claims.values()) or key in self._busy:
            raise TransportError(f"exl3xpu backend: key {key} already has a write-back in flight (vr_busy): "
                                 f"it cannot be evicted again before that lands")
        if len(self._claims) >= self.ring.K:
            self._make_room()
        slot = self.ring.claim(key, self.vram_address(vram_slot))
        if slot is None:
            raise TransportError(f"exl3xpu backend: victim ring full ({self.ring.K} claims in flight): the eviction "
                                 f"of key {key} was dropped")
        self._raw.pop(ram_slot, None)       # a blob comes back: nothing to pack
        self.res[key] = 0                   # the RAM copy is published again only by this claim's write-back
        c = Claim(slot, key, int(self.ring.seqs()[slot]), ram_slot)
        self._claims[slot] = c
        return c

    def _ppend(self) -> set:
        """Keys whose write-back must wait: their RAM slot still has a fill writing into it."""
        return {c.key for c in self._claims.values()
                if (f := self._fills.get(c.ram_slot)) is not None and f.state == "pending"}

    def victims(self) -> list:
        """The ring's claims in a lagged copy of its ``meta`` not written back yet: [(ring slot, key, seq)] (what a
        host step drains; the runtime itself never asks - its drains are the claims)."""
        return self.ring.victims(self.ring.meta.copy())

    def _host_step(self) -> None:
        """One host step over the ring: the claims ``victims`` finds written back, guards permitting."""
        ppend = self._ppend()
        for slot, key, seq in self.victims():
            c = self._claims.get(slot)
            if c is not None and c.seq == seq and not c.written:
                c.written = self.ring.drain(slot, key, seq, self._host[c.ram_slot], self.res, self._busy, ppend)

    def _poll(self, c) -> bool:
        if not isinstance(c, Claim):
            return bool(c.query())            # a push's device event
        if not c.written:
            self._host_step()
        c.reported = c.written
        return c.written

    def _block(self, c) -> None:
        if not isinstance(c, Claim):
            c.synchronize()
            return
        while not self._poll(c):
            f = self._fills.get(c.ram_slot)      # ppend: the fill writing into its page lands first
            if f is None or f.state != "pending":
                raise TransportError(f"exl3xpu backend: the write-back of key {c.key} cannot proceed")
            self.events.wait(f)

    def _ring_step(self) -> None:
        """Free the ring slots whose write-back was written and reported landed (the ledger has published it)."""
        for slot, c in list(self._claims.items()):
            if c.written and c.reported:
                self.ring.release(slot)
                del self._claims[slot]

    def _make_room(self) -> None:
        """Ring full of host-planned claims: write every claim back now and free the written ones (their bytes are
        in their RAM slots, so nothing reads a freed ring slot)."""
        for c in sorted(self._claims.values(), key=lambda c: c.seq):
            if not c.written:
                self._block(c)
        for slot, c in list(self._claims.items()):
            if c.written:
                self.ring.release(slot)
                del self._claims[slot]

    def fence(self) -> None:
        """Every transfer finished: fills read, every claim written back (the stand-in's kernels are synchronous:
        nothing still reads a slot), reported write-backs' ring slots freed."""
        self.reader.fence()
        for c in sorted(self._claims.values(), key=lambda c: c.seq):
            if not c.written:
                self._block(c)
                c.reported = False         # written here: its handle reports it at its next poll
        self._ring_step()

    def close(self) -> None:
        self.fence()
        ops_close = self.ops.close if self._owns_ops and hasattr(self.ops, "close") else None
        try:
            close_all((self.reader.close, self.pool.close, ops_close))    # a failed one leaks none after it
        finally:
            self._host = self.pool = self.arena = self.ring = self._peek = None    # the allocations are freed


def open_backend(store, *, ram_slots: int, vram_slots: int = 0, **kw) -> XpuBackend:
    """The ``moetier.backends`` entry point ``exl3xpu``: the backend on its own (no model attached), over exl3xpu's
    ops where exl3xpu runs here, else moetier's provider of them (adapters.exl3xpu.surface.op_table: moetier's SYCL
    EXL3 kernel on a dpctl device, or its CPU kernel). Its gpu and zerocopy lanes are ``moe_forward`` over the slot
    handed. It opens over a store of any records (its transfers are byte moves) but declares, and computes, exl3
    only, of the geometries exl3xpu's moe_forward takes (the stand-in ops refuse the others as the real op does:
    the conformance suite's exl3 kit for this backend is the 640 x 640 of its CI recipe's model). BackendUnavailable
    (one line) for an op table that does not offer the pinned surface."""
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
