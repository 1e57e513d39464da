"""plan_layer's compiled entry: the planner kernel's inputs gathered off the state of record, in the same call.

Contract
--------
``plan_call(P, X, codes, D, O, kt, last)`` plans one layer call as moetier.core.plan_kernel.plan_arrays does,
reading what plan_layer would otherwise gather in Python:

    X      bytes   float64: the S_* scalars of plan_kernel (S_WAKE, S_FRESH, S_ARRIVALS, S_VRAM_FULL as below), then
                   the E_* scalars, then the channel's reads in flight (E_NOUT of them), then, where S_ARRIVALS, each
                   NVMe pick's arrival in the order of ``picks``, then, where S_FACTORS, the host cache's curve
                   (llc.ReuseModel.curve), then the E_NPICK picks' keys and their rows, in the order of ``picks``
    codes  uint8   the ledger's state codes (Ledger.codes): each pick's tier (an absent key is in RAM where
                   X[E_ALL_RAM]; the ledger's ``all_in_ram``)
    kt     float64 the channel's terms (NvmeChannel.kt); ``last``: the host cache's last uses (ReuseModel.last, its
                   clock at X[E_CLOCK]), empty without one

S_WAKE: how long the cpu lane's worker has idled (ms; 0 where the recipe has no wake term), which the kernel turns
into plan_kernel's wake term (moetier.core.lanes.idle_wake). S_ARRIVALS 0: the kernel issues the layer's NVMe picks
as demand reads (channel.demand_arrivals: behind X[E_BUSY] in the FIFO model, joining the X[E_NOUT] reads in flight
after t0 under a depth table); the caller books them (NvmeChannel.issued). 1: the caller's arrivals (a channel with
prefetch reads, which the kernel does not model), S_FRESH of them demand reads. S_VRAM_FULL: whether a serial copy
doubles, the layer's NVMe picks aside (the kernel adds that there are some). Out: O (6 + 3n) as plan_kernel's, then
from O[6 + n] the NVMe picks' keys in the order of ``picks``, then from O[6 + 2n] the arrivals of the demand reads
the kernel issued, in that order, as float64 bits. Returns plan_kernel's R (R_N floats) and then the demand reads the
kernel issued (-1: NVMe picks and no lane computes them, nothing planned) as one tuple.

Why: the gathering in Python (a lookup per pick, the arrivals, the cache distances, the wake term) cost more than
the planning on the runtime's path, where the expert compute leaves the host's caches cold (benchmarks/cold.md);
there each Python-side array operation costs microseconds, so the call takes one array for its outputs and returns
the times as a tuple.
"""
from __future__ import annotations

import numpy as np

from moetier.core.channel import demand_arrivals
from moetier.core.jit import kernel
from moetier.core.lanes import idle_wake
from moetier.core.plan_kernel import (P_CPU_ON, P_GPU_ON, P_MASK, R_N, S_ARRIVALS, S_FACTORS, S_FRESH, S_N, S_T0,
                                      S_VRAM_FULL, S_WAKE, plan_arrays)
from moetier.core.tickets import RAM, TIER_NVME, TIER_OF

# E: the gathering's scalars, after plan_kernel's S
E_ALL_RAM, E_BUSY, E_CLOCK, E_NOUT, E_NPICK, E_N = range(6)
NO_LAST = np.zeros(0, np.int64)
ON_NVME = np.array([t == TIER_NVME for t in TIER_OF], np.uint8)


@kernel
def tier_states(codes, I, all_ram):
    """I[2] := the state code of each pick I[0] (an absent key is in RAM where ``all_ram``, without bookkeeping);
    returns how many picks are on NVMe. The compiled step loop (moetier.core.step_kernel) calls it too."""
    n_nv = 0
    for i in range(I.shape[1]):
        s = codes[I[0, i]]
        if s == 0 and all_ram:
            s = RAM
        I[2, i] = s
        n_nv += ON_NVME[s]
    return n_nv


@kernel
def host_cache(X, at, I, last, clock, curve):
    """The host cache's part of plan_kernel's X from ``at``: each pick's distance (records streamed since its last
    use at ``last``, under ``clock``; -1: never used), then the curve; returns where they end. The compiled step
    loop (moetier.core.step_kernel) calls it too."""
    n = I.shape[1]
    for i in range(n):
        u = last[I[0, i]]
        X[at + i] = clock - u if u else -1.0
    X[at + n:at + n + curve.shape[0]] = curve
    return at + n + curve.shape[0]


@kernel
def _times(R, reads):
    """plan_call's return value: R's R_N times and the reads, one tuple (boxed without an array)."""
    return (R[0], R[1], R[2], R[3], R[4], R[5], R[6], R[7], R[8], R[9], R[10], R[11], float(reads))


@kernel
def plan_call(P, X, codes, D, O, kt, last):
    Xin = np.frombuffer(X, np.float64)
    n = int(Xin[S_N + E_NPICK])
    tail = Xin.shape[0] - 2 * n
    I = np.empty((3, n), np.int64)
    for i in range(n):
        I[0, i] = int(Xin[tail + i])
        I[1, i] = int(Xin[tail + n + i])
    n_nv = tier_states(codes, I, Xin[S_N + E_ALL_RAM] != 0.0)
    j = 6 + n
    for i in range(n):
        if ON_NVME[I[2, i]]:
            O[j] = I[0, i]
            j += 1
    R = np.zeros(R_N)            # returned as it stands where nothing is planned
    reads = 0
    live = n_nv and not P[P_MASK]
    if live and not P[P_CPU_ON] and not P[P_GPU_ON]:
        return _times(R, -1)
    at = S_N + E_N + int(Xin[S_N + E_NOUT])
    given = Xin[S_ARRIVALS] != 0.0
    n_arr = n_nv if live else 0
    factors = Xin[S_FACTORS] != 0.0
    m = int(Xin[at + (n_arr if given else 0)]) if factors else 0
    X2 = np.empty(S_N + n_arr + (n + 1 + 2 * m if factors else 0))
    X2[:S_N] = Xin[:S_N]
    X2[S_WAKE] = idle_wake(Xin[S_WAKE])
    X2[S_VRAM_FULL] = 1.0 if n_nv and Xin[S_VRAM_FULL] else 0.0
    if given:
        X2[S_N:S_N + n_arr] = Xin[at:at + n_arr]
        at += n_arr
    elif live:
        t0 = Xin[S_T0]
        q0 = 0
        for j in range(S_N + E_N, S_N + E_N + int(Xin[S_N + E_NOUT])):
            if Xin[j] > t0:
                q0 += 1
        demand_arrivals(kt, t0, Xin[S_N + E_BUSY], q0, X2[S_N:S_N + n_arr])
        reads = n_arr
        X2[S_FRESH] = reads
        X2[S_ARRIVALS] = 1.0
        O.view(np.float64)[6 + 2 * n:6 + 2 * n + reads] = X2[S_N:S_N + reads]
    if factors:
        host_cache(X2, S_N + n_arr, I, last, Xin[S_N + E_CLOCK], Xin[at:at + 1 + 2 * m])
    plan_arrays(P, I, X2, D, O, R)
    return _times(R, reads)
