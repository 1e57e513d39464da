"""The cpu lane as one runner both host-side backends share (cpu, and sycl's cpu lane), so it has one cost model.

Contract: ``CpuLane(layout).run(jobs, x, view)`` computes jobs = [(key, ram_slot, row_indices)] with ``view(slot)``
giving the record bytes and returns {key: float32 [len(rows), H]}. A batch below ``parallel_min`` experts runs
inline on the calling thread; a larger one is split over ``workers`` persistent threads (one per core), each running
the kernel single-threaded on whole experts. The engine record's cpu lane (per_call_ms, per_layer_ms, workers,
parallel_min) models exactly these two call classes.
"""
from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from backends.cpu import kernels
from moetier.core.records import deal


def cores() -> int:
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)


class CpuLane:
    def __init__(self, layout, workers: int | None = None):
        self.layout = layout
        kernels.warmup(layout)
        # a parallel (OpenMP/TBB) call stalls a full scheduler slice whenever another process holds a core, and an
        # expert's output still comes from exactly one thread, so the bits do not depend on the split
        self.workers = int(workers or cores())
        self._pool = ThreadPoolExecutor(self.workers, thread_name_prefix="moetier-cpu-lane") if self.workers > 1 \
            else None
        # waking a worker costs ~0.2 ms here (measured: 1 expert 0.09 ms inline, 2 experts 0.33 ms split), so a batch
        # is split only once each worker gets at least two experts
        self.parallel_min = 2 * self.workers if self.workers > 1 else 0

    def run(self, jobs, x: np.ndarray, view) -> dict:
        if not jobs:
            return {}
        lay = self.layout

        def part(js):
            outs = kernels.experts_forward(lay, [view(s) for _, s, _ in js],
                                           [np.ascontiguousarray(x[rows]) for _, _, rows in js], parallel=False)
            return [(k, y) for (k, _, _), y in zip(js, outs)]

        if self._pool is None or len(jobs) < max(2, self.parallel_min):
            return dict(part(jobs))
        first, *rest = deal(jobs, self.workers)
        # the calling thread takes one share itself: one wake-up fewer, and it would only wait otherwise
        futs = [self._pool.submit(part, js) for js in rest]
        out = dict(part(first))
        for f in futs:
            out.update(f.result())
        return out

    # the EXL3 kernel's decode and raw GEMM alone (conformance: bit-exact decode, one-hot raw GEMM)
    @staticmethod
    def exl3_decode(trellis: np.ndarray, codebook) -> np.ndarray:
        from backends.cpu import exl3 as kx
        return kx.decode_inner(trellis, codebook)

    @staticmethod
    def exl3_raw_gemm(xh: np.ndarray, trellis: np.ndarray, codebook) -> np.ndarray:
        from backends.cpu import exl3 as kx
        from moetier.bytes import exl3
        k, n = trellis.shape[0] * exl3.TILE, trellis.shape[1] * exl3.TILE
        lin = exl3.Exl3Linear(np.ascontiguousarray(trellis), np.ones(k, np.float16), np.ones(n, np.float16),
                              exl3.CODEBOOKS[exl3.codebook_index(codebook)])
        return kx.raw_gemm(xh, lin, parallel=False)

    def exl3_int_forward(self, jobs, x: np.ndarray, shift: int, a_max: int, view) -> dict:
        """exl3-int of each job's record (the Numba kernel's integer path): {key: int64 [rows, H]}."""
        from backends.cpu import exl3 as kx
        from moetier.bytes.expert import exl3_expert
        x = np.asarray(x, np.int64)
        return {k: kx.int_expert_forward(exl3_expert(self.layout, view(s)), np.ascontiguousarray(x[rows]), shift,
                                         a_max, parallel=False) for k, s, rows in jobs}

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown()
