"""The CPU backend (Numba): RAM slots in a 2 MiB-aligned pool, fills by the O_DIRECT reader, the cpu lane in place.

Contract: see moetier.run.contract. It has one compute lane (cpu) and no VRAM tier, so push/drain are refused; a
recipe for it sets zero VRAM slots. compute() reads the record bytes where they landed (no copy) and is
bit-deterministic: the kernels fix every reduction order (backends/cpu/kernels.py).
"""
from __future__ import annotations

import numpy as np

from moetier.bytes.expert import RECORD_KINDS
from moetier.run.contract import BackendUnavailable, Capabilities, Defaults
from moetier.run.events import ReaderFills
from moetier.run.router import StoreRouter
from moetier.bytes.teardown import close_all
from moetier.bytes.transport import Reader, SlotPool

try:
    from backends.cpu import exl3, kernels
    from backends.cpu.lane import CpuLane
except ImportError as e:  # numba is the `cpu` extra
    exl3 = kernels = None
    _WHY = f"numba is not installed ({e}); install the cpu extra: pip install 'moetier[cpu]'"


class CpuBackend(ReaderFills, Defaults):
    def __init__(self, store, *, ram_slots: int, vram_slots: int = 0, queue_depth: int = 16, verify_rate: float = 1.0,
                 faults=None, direct: bool = True):
        # vram_slots: accepted like every backend's, but there is no VRAM tier (capabilities.vram_slots = 0, and the
        # runtime refuses a recipe that asks for VRAM slots here)
        if kernels is None:
            raise BackendUnavailable(f"--backend cpu: {_WHY}")
        self.store = store
        self.layout = store.layout
        self.pool = SlotPool(max(1, ram_slots), store.record_bytes)
        ReaderFills.__init__(self, reader=Reader(store, self.pool, queue_depth=queue_depth, verify_rate=verify_rate,
                                                 direct=direct, faults=faults))
        self.capabilities = Capabilities(name="cpu", device="host CPU (Numba)", lanes=frozenset({"cpu"}),
                                         encodings=frozenset(RECORD_KINDS), vram_slots=0)
        self.lane = CpuLane(self.layout)
        self.workers, self.parallel_min = self.lane.workers, self.lane.parallel_min
        self.router = StoreRouter(store)

    @property
    def ram_slot_count(self) -> int:
        return self.pool.n

    EXL3_KERNEL = exl3 is not None      # whether exl3_rows runs here (numba installed)

    @staticmethod
    def exl3_rows(x, expert, act_limit):
        """moetier's Numba EXL3 expert on token rows x, fp16 at the engines' rounding points: the cpu lane the
        engine adapters reach through the registry (``registry.factory("cpu").exl3_rows``)."""
        return exl3.expert_forward(expert, x, act_limit, fp16=True)

    # -- routing and compute ------------------------------------------------------------------------------------------------
    def ram_view(self, slot: int) -> np.ndarray:
        return self.pool.view(slot)

    def route(self, layer: int, x, rows=None):
        """The model's top-k router on hidden states x [rows, H], its weights from the store."""
        return self.router.route(layer, x, rows)

    def compute(self, lane: str, jobs, x: np.ndarray) -> dict:
        """jobs = [(key, ram_slot, row_indices)]; returns {key: float32 [len(rows), H]}."""
        if lane != "cpu":
            raise BackendUnavailable(f"cpu backend: no {lane!r} lane")
        return self.lane.run(jobs, x, self.pool.view)

    def exl3_decode(self, lane: str, trellis: np.ndarray, codebook) -> np.ndarray:
        """W_inner [k, n] float32 of a trellis as the lane's EXL3 kernel decodes it (conformance hook)."""
        if lane != "cpu":
            raise BackendUnavailable(f"cpu backend: no {lane!r} lane")
        return self.lane.exl3_decode(trellis, codebook)

    def exl3_raw_gemm(self, lane: str, xh: np.ndarray, trellis: np.ndarray, codebook) -> np.ndarray:
        """xh [T, k] @ W_inner, float32, as the lane's EXL3 kernel computes it (conformance hook)."""
        if lane != "cpu":
            raise BackendUnavailable(f"cpu backend: no {lane!r} lane")
        return self.lane.exl3_raw_gemm(xh, trellis, codebook)

    def exl3_int_forward(self, lane: str, jobs, x: np.ndarray, shift: int, a_max: int) -> dict:
        """exl3-int of each job's expert, {key: int64 [rows, H]} (conformance hook)."""
        if lane != "cpu":
            raise BackendUnavailable(f"cpu backend: no {lane!r} lane")
        return self.lane.exl3_int_forward(jobs, x, shift, a_max, self.pool.view)

    # transfers: fills and telemetry are the Reader's (ReaderFills); push / drain the contract's defaults (no VRAM)

    def close(self) -> None:
        close_all((self.lane.close, self.reader.close, self.pool.close))   # a failed one leaks none after it
