"""The cpu lane's EXL3 expert cost, measured: what `moetier bench` writes into its engine record's ``model_lanes``.

Contract: ``measure(models, rounds, mib)`` times the Numba EXL3 kernel (backends/cpu/exl3.py, exact mode: fp16
weights and the engine's fp16 rounding points) on random mul1 experts of each model's shape (hidden, intermediate
from its model record; K from ``EXL3_MODELS``), one core (a one-thread team, the calling thread's CPU time), at 1
and 2 token rows, streaming through >= ``mib`` MiB of distinct experts so the trellis comes from DRAM. It returns,
per model id, the median over rounds of ms per expert at 1 token, ms per extra token, and GB/s of trellis bytes per
core. ``model_lanes(measured, when)`` turns that into the engine record's ``{model id: {"cpu": costs}}``.
benchmarks/bench_exl3.py is the long form (all cores, int8 and memory bandwidth beside it) and shares
``distinct_copies`` and ``cpu_seconds``.
"""

from __future__ import annotations

import statistics
import time

import numpy as np

# the shipped EXL3 models and their trellis bits per weight (K); hidden and intermediate come from the model record
EXL3_MODELS = {"glm-5.3-flash-exl3-3.05bpw": 3, "qwen3.8-flash-next-exl3-3.05bpw": 3}


def distinct_copies(expert, n: int) -> list:
    """n experts with the same content in distinct memory (the trellis streams from DRAM, not from cache)."""
    from moetier.bytes import exl3 as X

    def lin(ln):
        return X.Exl3Linear(ln.trellis.copy(), ln.suh, ln.svh, ln.codebook)
    return [X.Exl3Expert(lin(expert.gate), lin(expert.up), lin(expert.down)) for _ in range(n)]


def cpu_seconds(fn, one_core: bool) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of one call: the calling thread's CPU time for a one-core run, the process's
    (all numba threads) for an all-core run. On a shared host the CPU-time figure is what the kernel costs when it
    runs; the wall figure includes the time other processes held the cores."""
    clock = time.thread_time if one_core else time.process_time
    c0, t0 = clock(), time.perf_counter()
    fn()
    return time.perf_counter() - t0, clock() - c0


def measure_shape(H: int, I: int, K: int, rounds: int = 3, mib: int = 48, seed: int = 0) -> dict:
    """One-core figures of the exact EXL3 expert at H x I, K bits: ms per expert (1 token), ms per extra token
    (2 tokens minus 1), GB/s of trellis bytes; medians over rounds."""
    from backends.cpu import exl3 as C
    from moetier.bytes import exl3 as X

    rng = np.random.default_rng(seed)
    trellis_bytes = 3 * X.trellis_nbytes(H, I, K)
    n = max(2, -(-(mib << 20) // trellis_bytes))
    experts = distinct_copies(X.random_expert(rng, H, I, K), n)
    xs = {T: rng.standard_normal((T, H)).astype(np.float32) for T in (1, 2)}

    def run(T):
        for ex in experts:
            C.expert_forward(ex, xs[T], act_limit=10.0, parallel=False)
    run(1)                                   # compile or load, and touch every expert once
    ms = {1: [], 2: []}
    for _ in range(rounds):
        for T in (1, 2):
            ms[T].append(cpu_seconds(lambda: run(T), True)[1] * 1e3 / n)
    one, two = statistics.median(ms[1]), statistics.median(ms[2])
    return {"hidden": H, "inter": I, "K": K, "experts": n, "rounds": rounds, "trellis_bytes": trellis_bytes,
            "per_expert_ms": one, "per_extra_token_ms": max(0.0, two - one),
            "gbps_per_core": trellis_bytes / (one * 1e6)}


def measure(models=tuple(EXL3_MODELS), rounds: int = 3, mib: int = 48) -> dict:
    """Model id -> measure_shape at the model record's hidden and intermediate sizes."""
    from moetier.core import records as spec

    out = {}
    for mid in models:
        g = spec.load_record("model", mid)["geometry"]
        out[mid] = measure_shape(int(g["hidden"]), int(g["intermediate"]), EXL3_MODELS[mid], rounds, mib)
    return out


def model_lanes(measured: dict, when: str) -> dict:
    """The engine record's ``model_lanes``: the cpu lane's EXL3 expert costs per model, one core (the lane's layer
    and call costs are the record's own)."""
    return {mid: {"cpu": {
        "per_expert_ms": round(r["per_expert_ms"], 4),
        "per_extra_token_ms": round(r["per_extra_token_ms"], 4),
        "note": (f"moetier bench {when}: Numba EXL3 expert (exact), one core, {r['hidden']} x {r['inter']} K{r['K']}, "
                 f"{r['gbps_per_core']:.2f} GB/s of trellis bytes per core; median of {r['rounds']} rounds over "
                 f"{r['experts']} distinct experts (moetier.measure.bench_exl3)")}}
        for mid, r in measured.items()}
