"""A moetier backend on numpy: the template for a new device (copy the package, put your kernels in ``compute``).

Contract (moetier.run.contract): every required verb, on the host. The RAM tier is moetier's ``SlotPool`` (4 KiB
aligned slots in one mapping) and fills are moetier's O_DIRECT ``Reader`` into it, checksum-verified at
``verify_rate``: ``ReaderFills`` turns the Reader into the contract's fill, landed, wait, fence, completed_seq,
cancel and telemetry; a device whose host memory is its own allocation wraps it in ``BufferSlotPool`` instead. One
compute lane, ``cpu``: each expert's record is dequantized and applied in float64, one token row at a time, so a
row's bits never depend on the rows or experts batched with it. No VRAM tier: ``push`` / ``drain`` and
``workers`` / ``parallel_min`` are left out, and moetier binds the contract's defaults for them (no VRAM tier; calls
run unsplit).
"""
from __future__ import annotations

import numpy as np

from moetier.bytes.expert import ENCODINGS, dequant, silu
from moetier.bytes.transport import Reader, SlotPool
from moetier.run.contract import BackendUnavailable, Capabilities
from moetier.run.events import ReaderFills
from moetier.run.router import StoreRouter


class TemplateBackend(ReaderFills):
    """The backend factory the ``moetier.backends`` entry point names: ``(store, *, ram_slots, vram_slots=0,
    **options)``; options it does not name are never passed (moetier.run.registry)."""

    def __init__(self, store, *, ram_slots: int, vram_slots: int = 0, verify_rate: float = 1.0, faults=None):
        # vram_slots is asked for by callers sizing a VRAM tier; there is none here, so capabilities say 0. Any
        # store opens (fills are byte moves); capabilities.encodings says which records compute() handles
        self.store, self.layout = store, store.layout
        self.record_bytes = int(store.record_bytes)
        self.pool = SlotPool(max(1, int(ram_slots)), self.record_bytes)
        # fill / cancel / landed / wait / fence / completed_seq and the telemetry are the Reader's (ReaderFills)
        ReaderFills.__init__(self, reader=Reader(store, self.pool, verify_rate=verify_rate, faults=faults))
        self.router = StoreRouter(store)
        self.capabilities = Capabilities(name="template", device="host CPU (numpy, float64)",
                                         lanes=frozenset({"cpu"}), encodings=frozenset(ENCODINGS), vram_slots=0)

    # -- required: sizes and compute -------------------------------------------------------------------------------
    @property
    def ram_slot_count(self) -> int:
        return self.pool.n

    def compute(self, lane: str, jobs, x: np.ndarray) -> dict:
        """jobs = [(key, ram_slot, rows)] -> {key: float32 [len(rows), H]}: SwiGLU of the slot's expert."""
        if lane != "cpu" or self.layout.encoding not in ENCODINGS:
            raise BackendUnavailable(f"template backend: no {lane!r} lane for {self.layout.encoding!r} records")
        x = np.asarray(x, np.float64)
        out = {}
        for key, slot, rows in jobs:
            w = dequant(self.layout, self.pool.view(slot)[:self.record_bytes])
            y = np.empty((len(rows), self.layout.hidden))
            for i, r in enumerate(rows):
                y[i] = w["down"] @ (silu(w["gate"] @ x[r]) * (w["up"] @ x[r]))
            out[key] = y.astype(np.float32)
        return out

    def close(self) -> None:
        self.reader.close()
        self.pool.close()

    # -- optional: a router of its own (the store's router weights) ---------------------------------------------------
    def route(self, layer: int, x, rows=None):
        return self.router.route(layer, x, rows)

    # -- test-only hook: the conformance suite's byte-exact checks read RAM slots through it --------------------------
    def ram_view(self, slot: int) -> np.ndarray:
        return self.pool.view(slot)
