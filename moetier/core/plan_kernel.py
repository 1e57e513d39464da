"""The planner's arithmetic: one compiled call per layer (moetier.core.plan.plan_layer is its Python face, through
the entry moetier.core.plan_gather, which gathers these arrays in the same call).

Contract
--------
``plan_arrays(P, I, X, D, O, R)`` deals and times one layer call's picks as moetier.core.plan's docstring says; it
reads P, I, X, D only and writes the plan into the caller's O and R (every element of O[:6 + n] and R; it returns
nothing). ``pack(ctx)`` is ``P``, a PlanContext's terms (the caller keeps it while the context is unchanged).
Layout, for n picks:

    P  float64  ctx terms at the ``P_*`` indices below (a missing lane: its ``*_ON`` 0, its costs 0), then from P_N
                its lane deal's rule (moetier.core.deal_rules.terms: 0, the kernel deals; else rule_deal forces one)
    I  int64    (3, n): the picks' keys, their rows, their ledger states (the tier the planner sees: RAM /
                PUSHING: ram, VRAM: vram, any other: nvme), each in the order of ``picks``
    X  float64  the per-call scalars at the ``S_*`` indices (t0, the cpu worker's wake units, the channel's
                terms...); then, where S_ARRIVALS is 1, each NVMe pick's arrival (the caller's clock) in the order
                of ``picks``; then, where S_FACTORS is 1, each pick's host cache distance and the cache's curve
                (llc.ReuseModel's ``distances`` and ``curve``; a RAM pick's factor is llc.reuse_factor, else 1.0)
    D  int64    (0,): the kernel deals; else a forced deal (plan_layer's ``lanes``): D[i] for pick i has bit 1 if
                that plan put it on the cpu lane, bit 2 on the nvme_cpu lane; D[n:] its NVMe picks in the order it
                ran them (pick indices, nvme_cpu's then nvme_gpu's)
    O  int64    (6 + n,), out: 6 lane counts (gpu, zerocopy, cpu, nvme_cpu, nvme_gpu, masked), then each lane's keys in order
    R  float64  (R_N,), out: the plan's times at the ``R_*`` indices (cpu_crit / split_end: NaN where the plan has None)

Floats are computed in the order and association of the interpreted planner they replace (no fastmath: no fused
multiply-add), so plans are bit-identical to it; a squared term goes through libm's pow (moetier.core.arrivals).
"""
from __future__ import annotations

import numpy as np
from moetier.core.jit import kernel

from moetier.core.arrivals import INF, finish, finish_add, finish_extra, finish_shift
from moetier.core.deal_rules import DEAL_N, rule_deal, terms as deal_terms
from moetier.core.lanes import hands_off
from moetier.core.llc import reuse_factor
from moetier.core.tickets import PUSHING, RAM, VRAM

# P: the context's terms
(P_GPU_ON, P_GPU_L, P_GPU_E, P_GPU_X, P_CPU_ON, P_CPU_L, P_CPU_E, P_CPU_X, P_ZC_ON, P_ZC_L, P_ZC_E, P_ZC_X,
 P_PUSH, P_MASK, P_OVERLAP, P_CPU_CALL, P_WORKERS, P_PMIN, P_CPU_WAKE, P_AFTER_WAIT, P_HANDOFF, P_HOST_LAYER,
 P_HOST_PICK, P_HOST_READ, P_HOST_NVME_LAYER, P_READ_CPU, P_HOST_PREDICT, P_COPY_SERIAL, P_HOST_COPY, P_HOST_ZC,
 P_HEAD_LAYER, P_HEAD_READ, P_HEAD_PREDICT, P_GPU_READ, P_ZC_READ, P_GPU_BUSY, P_ZC_BUSY, P_TWO, P_N) = range(39)
# S: per call
(S_T0, S_WAKE, S_NVME_WAKE, S_SPREAD, S_CV_OWN, S_CV_SHARED, S_LANE_SD, S_PF_DONE, S_FRESH, S_PREDICTING,
 S_VRAM_FULL, S_ARRIVALS, S_FACTORS, S_N) = range(14)
# R: the plan's times
(R_GPU, R_CPU, R_MS, R_NVME_WAIT, R_GPU_WAIT, R_ISSUE, R_HEAD, R_CPU_COLD, R_WAIT_FROM, R_CRIT_COLD, R_CRIT_EXTRA,
 R_SPLIT_END, R_N) = range(13)
# lanes, in O's order
GPU, ZC, CPU, NVME_CPU, NVME_GPU, MASKED = range(6)


def pack(ctx) -> np.ndarray:
    """``P`` for a PlanContext (its per-layer ``predicting`` travels in ``S``)."""
    p = np.zeros(P_N + DEAL_N)
    p[P_N:] = deal_terms(ctx)
    for on, at, lane in ((P_GPU_ON, P_GPU_L, ctx.gpu), (P_CPU_ON, P_CPU_L, ctx.cpu), (P_ZC_ON, P_ZC_L, ctx.zerocopy)):
        if lane:
            p[on], p[at:at + 3] = 1.0, lane
    p[P_PUSH:P_TWO + 1] = (ctx.push_ms, ctx.mask, ctx.overlap, ctx.cpu_call, ctx.cpu_workers, ctx.cpu_pmin,
                           ctx.cpu_wake, ctx.cpu_after_wait, ctx.cpu_handoff, ctx.host_layer, ctx.host_pick,
                           ctx.host_read, ctx.host_nvme_layer, ctx.read_cpu, ctx.host_predict, ctx.copy_serial,
                           ctx.host_copy, ctx.host_zc_call, ctx.head_layer, ctx.head_read, ctx.head_predict,
                           ctx.gpu_read, ctx.zc_read, ctx.gpu_busy, ctx.zc_busy, 2.0)
    return p


@kernel
def _put(L, cnt, lane, key):
    """Append ``key`` to row ``lane`` of L, whose lengths are ``cnt``."""
    L[lane, cnt[lane]] = key
    cnt[lane] += 1


@kernel
def _gpu_ms(P, I, vram, n_vram, reads):
    """The gpu lane's call over the VRAM picks, with ``reads`` NVMe reads of the layer in flight meanwhile (each
    costs it gpu_read, and any at all gpu_busy once)."""
    pl = P[P_GPU_L]
    g = pl + P[P_GPU_READ] * reads + P[P_GPU_BUSY] if reads else pl
    pe, px = P[P_GPU_E], P[P_GPU_X]
    for j in range(n_vram):
        g += pe + px * (I[1, vram[j]] - 1)
    return g


@kernel
def _ram_lanes(P, I, F, D, S, ram, n_ram, g, reads, L, cnt, R):
    """Deal the RAM picks (``ram``: heaviest first) to the cpu or zerocopy lane, each where the layer ends sooner on
    the context's costs - or, with a forced deal, as dealt, only timed. A split call (W > 1 threads, >= parallel_min
    experts) deals its batch out strided (spec.deal: thread i takes experts i, i + W, ...) and ends with its longest
    share, plus the hand-off when a worker's share is as long as the caller's by count (spec.hands_off); the zerocopy
    call pays zc_read per NVMe read in flight and zc_busy once. Sets R's cpu_cold and cpu_crit; returns (g, c)."""
    cpl, cpe, cpx, zpl, zpe, zpx = _ram_costs(P, S, reads)
    W, pmin, cpc, hoff = int(P[P_WORKERS]), int(P[P_PMIN]), P[P_CPU_CALL], P[P_HANDOFF]
    dealt = D.shape[0] > 0
    one = W == 1 and not dealt    # one thread dealing on its own costs: its share is the batch
    c, zc_on = 0.0, False
    n_c, work_c, crit = 0, 0.0, 0.0
    shares, share_cold, share_extra = np.zeros(W), np.zeros(W), np.zeros(W, np.int64)
    for j in range(n_ram):
        i = ram[j]
        m = I[1, i]
        f = F[i]
        w = cpe * f + cpx * (m - 1) if m > 1 else cpe * f
        ge = g if zc_on else g + zpl
        ge = ge + zpe + zpx * (m - 1) if m > 1 else ge + zpe
        work1 = work_c + w
        n1 = n_c + 1
        t = 0 if one else n_c % W
        s_i = work1 if one else shares[t] + w
        if n1 < pmin:
            ce = cpc + work1
        else:
            ce = cpl + (s_i if s_i > crit else crit)
            if hoff and not one and hands_off(n1, W):
                ce += hoff
        if (D[i] & 1) != 0 if dealt else (ce if ce > g else g) <= (c if c > ge else ge):
            c = ce
            n_c, work_c = n1, work1
            shares[t] = s_i
            crit = max(crit, s_i)
            share_cold[t] += f
            share_extra[t] += m - 1
            _put(L, cnt, CPU, I[0, i])
        else:
            g, zc_on = ge, True
            _put(L, cnt, ZC, I[0, i])
    _crit(shares, share_cold, share_extra, crit, n_c > 0 and n_c >= pmin, R)
    return g, c


@kernel
def _ram_costs(P, S, reads):
    """The RAM lanes' (per_layer, per_expert, per_extra_token), cpu then zerocopy (a missing lane never wins): the
    cpu lane's with its worker's wake-up, the zerocopy lane's with the layer's reads in flight."""
    cpl, cpe, cpx = (P[P_CPU_L], P[P_CPU_E], P[P_CPU_X]) if P[P_CPU_ON] else (INF, INF, 0.0)
    cpl += P[P_CPU_WAKE] * S[S_WAKE]
    zpl, zpe, zpx = (P[P_ZC_L], P[P_ZC_E], P[P_ZC_X]) if P[P_ZC_ON] else (INF, INF, 0.0)
    if reads:
        zpl += P[P_ZC_READ] * reads + P[P_ZC_BUSY]
    return cpl, cpe, cpx, zpl, zpe, zpx


@kernel
def _crit(shares, share_cold, share_extra, crit, split, R):
    """R's cpu_cold (the batch's cold-expert equivalents) and, for a split call, cpu_crit: the (cold, extra rows)
    of its first longest share."""
    cold = 0.0
    for t in range(shares.shape[0]):
        cold += share_cold[t]
    R[R_CPU_COLD] = cold
    if split:
        t = 0
        while t < shares.shape[0] - 1 and shares[t] != crit:
            t += 1
        R[R_CRIT_COLD], R[R_CRIT_EXTRA] = share_cold[t], share_extra[t]


@kernel
def _nvme_order(I, F, S, D, nv, n_nv):
    """The NVMe picks (pick indices) in the order their lanes take them: a forced deal's; else arrival order (demand
    reads come back in issue order, so only promoted prefetches need a sort; a stable one, as Python's sorted)."""
    if D.shape[0]:
        return D[I.shape[1]:]
    out = nv[:n_nv].copy()
    if n_nv > 1 and S[S_FRESH] < n_nv:
        for j in range(1, n_nv):          # a stable insertion sort (see _heaviest_first)
            x = out[j]
            i = j - 1
            while i >= 0 and F[out[i]] > F[x]:
                out[i + 1] = out[i]
                i -= 1
            out[i + 1] = x
    return out


@kernel
def _gpu_end(P, g, g_on, a, m, wake, push):
    """An NVMe pick of m rows whose bytes are due at a, on the gpu lane busy until g: (when the lane could start it,
    when its bytes are in VRAM, its work, its end). The push follows the read, after the wake-up if the lane had
    to wait for it."""
    gs = g if g_on else g + P[P_GPU_L]
    ap = a + push if gs >= a else a + wake + push
    gw = P[P_GPU_E] + P[P_GPU_X] * (m - 1)
    return gs, ap, gw, (gs if gs > ap else ap) + gw


@kernel
def _overlap_nvme(P, I, F, S, D, order, g, g_on, c, c_on, head, L, cnt, R):
    """NVMe picks when lanes overlap: each, in arrival order, to the lane that ends it sooner (or as dealt); the cpu
    lane is the host's, so its NVMe picks start past the head. With a spread, each lane's end is a finish
    (moetier.core.arrivals). Sets R's waits and wait_from; returns (g, c) with the head taken off c again."""
    t0, wake, push = S[S_T0], S[S_NVME_WAKE], P[P_PUSH]
    dealt = D.shape[0] > 0
    spread = S[S_SPREAD] != 0.0
    wait = gwait = 0.0
    c += head
    R[R_WAIT_FROM] = c
    # after a blocked wait the cpu lane resumes past the wake-up and then runs its call slower (per_after_wait_ms)
    cpu_resume = wake + P[P_AFTER_WAIT]
    cf, gf = finish(c, S[S_CV_OWN], P[P_TWO]), finish(g, S[S_CV_OWN], P[P_TWO])
    cs = cw = gs = ap = gw = 0.0
    for i in order:
        a = F[i] - t0
        if a < 0.0:
            a = 0.0
        m = I[1, i]
        if P[P_CPU_ON]:
            # the call is made once the bytes are there: its set-up follows the wait, it does not hide under it
            cs = c
            cw = _cpu_call(P, c_on, m)
            ce = cs + cw if cs >= a else a + cpu_resume + cw
        else:
            ce = INF
        if P[P_GPU_ON]:
            gs, ap, gw, ge = _gpu_end(P, g, g_on, a, m, wake, push)
        else:
            ge = INF
        if (D[i] & 2) != 0 if dealt else (ce if ce > g else g) <= (c if c > ge else ge):
            if a > cs:
                wait += a + wake - cs
            if spread:
                finish_add(cf, cs - c + cw, a + cpu_resume + cw, a)
            c = ce
            c_on = True
            _put(L, cnt, NVME_CPU, I[0, i])
        else:
            if ap > gs:
                wait += ap - gs
                gwait += ap - gs
            if spread:
                finish_add(gf, gs - g + gw, a + wake + push + gw, a)
            g = ge
            g_on = True
            _put(L, cnt, NVME_GPU, I[0, i])
    if spread:
        dc, dg = finish_extra(cf, S[S_CV_SHARED], S[S_LANE_SD]), finish_extra(gf, S[S_CV_SHARED], S[S_LANE_SD])
        c += dc
        g += dg
        wait += dc + dg
        gwait += dg
    R[R_NVME_WAIT], R[R_GPU_WAIT] = wait, gwait
    return g, c - head


@kernel
def _cpu_call(P, on, m):
    """An inline cpu-lane call over one pick of m rows (the lane's per_layer if it is the lane's first)."""
    return (P[P_CPU_CALL] if on or P[P_PMIN] > 1 else P[P_CPU_L]) + P[P_CPU_E] + P[P_CPU_X] * (m - 1)


@kernel
def _gpu_call(P, m):
    """The push, then the kernel: a gpu-lane call of its own (the serial runtime's), per_layer each."""
    return P[P_PUSH] + P[P_GPU_L] + P[P_GPU_E] + P[P_GPU_X] * (m - 1)


@kernel
def _serial_deal(P, I, S, order, due, g, c, c_on, head, pos, npos):
    """Deal the NVMe picks of a serial timeline, in arrival order, each to the lane that ends it sooner on the
    lane choice's own timeline: their positions in ``order`` onto pos[0] (cpu) and pos[1] (gpu)."""
    wake = S[S_NVME_WAKE]
    lg, lc, lc_on = g, c, c_on
    for j in range(order.shape[0]):
        i = order[j]
        a, m = due[j], I[1, i]
        now = lg + lc + head
        ready = a + wake if a > now else a
        start = now if now > ready else ready
        ce = start + _cpu_call(P, lc_on, m) + (P[P_AFTER_WAIT] if a > now else 0.0) if P[P_CPU_ON] else INF
        ge = start + _gpu_call(P, m) if P[P_GPU_ON] else INF
        if ce <= ge:
            lc, lc_on = ce - lg - head, True
            _put(pos, npos, 0, j)
        else:
            lg = ge - lc - head
            _put(pos, npos, 1, j)


@kernel
def _serial_nvme(P, I, F, S, D, order, g, c, c_on, ahead, head, L, cnt, R):
    """NVMe picks when lanes do not overlap (policy.overlap false): one timeline after the resident lanes (c + g).

    Lanes: each pick, in arrival order, goes to the lane that ends it sooner (``_serial_deal``; or as dealt). Time,
    in the order the serial runtime runs them (moetier.run.runtime.Runtime.layer): the cpu lane's NVMe picks, each
    waiting for its bytes (and the wake-up and the cpu lane's after-wait cost, if it had to wait); then the
    admissions of the layer's zerocopy picks (``ahead`` ms of copies, booked by the simulator after the layer, not
    here: the gpu picks' reads land meanwhile); then the gpu lane's NVMe picks, whose push to VRAM follows the read
    and is booked as stall (read + stage); each is a lane call of its own, so it pays the gpu lane's per-call cost
    (``per_layer_ms``) every time. The host's ``head`` (its work before the first wait) runs after the resident
    lanes, before the first NVMe pick, in the reads' time. Each pick's work is added to its lane's busy time, so
    g + c is the timeline's end less ``ahead`` and the head. The arrival spread (a finish) adds to the lane of the
    timeline's last pick. Sets R's waits and wait_from; returns (g, c)."""
    t0, wake, push = S[S_T0], S[S_NVME_WAKE], P[P_PUSH]
    n_o = order.shape[0]
    due = np.empty(n_o)        # arrival, from the layer's start
    for j in range(n_o):
        x = F[order[j]]
        due[j] = x - t0 if x > t0 else 0.0
    # the two lanes as positions in ``order`` (then their keys into L)
    pos = np.zeros((2, n_o), np.int64)
    npos = np.zeros(2, np.int64)
    if D.shape[0]:
        for j in range(n_o):
            _put(pos, npos, 0 if (D[order[j]] & 2) != 0 else 1, j)
    else:
        _serial_deal(P, I, S, order, due, g, c, c_on, head, pos, npos)
    now = g + c + head
    R[R_WAIT_FROM] = now
    wait = gwait = 0.0
    spread = S[S_SPREAD] != 0.0
    fin = finish(now, S[S_CV_OWN], P[P_TWO])
    for lane in range(2):
        on_gpu = lane == 1
        if on_gpu and npos[1] and ahead:
            now += ahead
            if spread:
                finish_shift(fin, ahead)
        for q in range(npos[lane]):
            j = pos[lane, q]
            i = order[j]
            _put(L, cnt, NVME_GPU if on_gpu else NVME_CPU, I[0, i])
            a, m = due[j], I[1, i]
            ready = a + wake if a > now else a
            idle = ready - now if ready > now else 0.0
            if on_gpu:
                work, late = _gpu_call(P, m), 0.0
                step = idle + work
                wait += idle + push
                gwait += idle + push
                g += step
            else:     # a call right after a blocked wait pays late on top
                work, late = _cpu_call(P, c_on, m), P[P_AFTER_WAIT]
                step = idle + work + (late if idle else 0.0)
                wait += idle
                c += step
                c_on = True
            now += step
            if spread:
                finish_add(fin, work, a + wake + late + work, a)
    d = finish_extra(fin, S[S_CV_SHARED], S[S_LANE_SD]) if spread else 0.0
    if d:
        wait += d
        if npos[1]:
            g += d
            gwait += d
        else:
            c += d
    R[R_NVME_WAIT], R[R_GPU_WAIT] = wait, gwait
    return g, c


@kernel
def _per_pick(I, X, n):
    """X's arrivals and host cache factors by pick: an NVMe pick's arrival, a RAM pick's factor (1.0 without)."""
    F = np.ones(n)
    at = S_N
    if X[S_ARRIVALS]:
        for i in range(n):
            s = I[2, i]
            if s != RAM and s != PUSHING and s != VRAM:
                F[i] = X[at]
                at += 1
    if X[S_FACTORS]:
        m = int(X[at + n])
        ds, fs = X[at + n + 1:at + n + 1 + m], X[at + n + 1 + m:at + n + 1 + 2 * m]
        for i in range(n):
            s = I[2, i]
            if s == RAM or s == PUSHING:
                F[i] = reuse_factor(X[at + i], ds, fs)
    return F


@kernel
def _by_tier(I, n):
    """The picks by the tier the planner sees (ledger TIER_OF): VRAM, RAM and NVMe pick indices, picks order."""
    idx = np.empty((3, n), np.int64)
    k = np.zeros(3, np.int64)
    for i in range(n):
        s = I[2, i]
        _put(idx, k, 1 if s == RAM or s == PUSHING else (0 if s == VRAM else 2), i)
    return idx, k


@kernel
def _heaviest_first(I, ram, n_ram):
    """The RAM picks heaviest first, ties by key descending (Python's sort of (rows, key) tuples, reversed). An
    insertion sort: a layer has tens of picks, and numpy's sorts would add seconds to the first compile."""
    out = ram[:n_ram].copy()
    for j in range(1, n_ram):
        x = out[j]
        m, k = I[1, x], I[0, x]
        i = j - 1
        while i >= 0 and (I[1, out[i]] < m or I[1, out[i]] == m and I[0, out[i]] < k):
            out[i + 1] = out[i]
            i -= 1
        out[i + 1] = x
    return out


@kernel
def plan_arrays(P, I, X, D, O, R):
    """One layer call's plan into O and R: see the module docstring for the arrays (called by plan_layer's entry,
    moetier.core.plan_gather, and the compiled step loop, moetier.core.step_kernel)."""
    n = I.shape[1]
    S = X[:S_N]
    D = rule_deal(P[P_N:], I) if not D.shape[0] and P[P_N] else D      # a peer row's rule deals (deal_rules)
    F = _per_pick(I, X, n)
    L = np.empty((6, n), np.int64)
    cnt = np.zeros(6, np.int64)
    R[:] = 0.0
    R[R_CRIT_COLD] = R[R_CRIT_EXTRA] = R[R_SPLIT_END] = np.nan
    idx, k = _by_tier(I, n)
    n_vram, n_ram, n_nv = k[0], k[1], k[2]
    mask, overlap = P[P_MASK] != 0.0, P[P_OVERLAP] != 0.0
    for j in range(n_vram):
        _put(L, cnt, GPU, I[0, idx[0, j]])
    reads = 0 if mask else n_nv      # the layer's reads in flight while its resident lanes compute
    g = _gpu_ms(P, I, idx[0], n_vram, reads) if n_vram else 0.0
    g_on = n_vram > 0     # gpu lane has work: its per_layer is paid
    c = 0.0
    if n_ram:
        ram = _heaviest_first(I, idx[1], n_ram) if n_ram > 1 else idx[1, :1]
        g, c = _ram_lanes(P, I, F, D, S, ram, n_ram, g, reads, L, cnt, R)
        if not np.isnan(R[R_CRIT_COLD]):   # the lanes start at t0 and the runtime runs the cpu lane's call first
            R[R_SPLIT_END] = S[S_T0] + c
    c_on = cnt[CPU] > 0
    R[R_ISSUE] = c if overlap else g + c
    if n_nv and mask:
        for j in range(n_nv):
            _put(L, cnt, MASKED, I[0, idx[2, j]])
    elif n_nv:
        g, c = _nvme_lanes(P, I, F, S, D, idx[2], n_nv, g, g_on, c, c_on, cnt[ZC], L, cnt, R)
    c, serial = _serial_host(P, S, n - cnt[MASKED], cnt[ZC], c, c_on)
    R[R_GPU], R[R_CPU] = g, c
    if overlap:
        # the head is host work done before the first wait, while the reads are in flight: the host timeline (the
        # cpu lane's) ends no earlier than it, and it leaves the serial part
        h = R[R_HEAD]
        R[R_MS] = (g if g > c + h else c + h) + serial - h
    else:
        R[R_MS] = g + c + serial         # the serial timeline waited past the head already (_serial_nvme)
    if n_nv and not mask:
        R[R_MS] += P[P_HOST_READ] * n_nv + P[P_HOST_NVME_LAYER]
    O[:6] = cnt
    at = 6
    for lane in range(6):
        O[at:at + cnt[lane]] = L[lane, :cnt[lane]]
        at += cnt[lane]


@kernel
def _nvme_lanes(P, I, F, S, D, nv, n_nv, g, g_on, c, c_on, n_zc, L, cnt, R):
    """Deal and time the NVMe picks (not masked) after the resident lanes; returns the lanes' (g, c)."""
    if c_on and P[P_READ_CPU]:
        c += P[P_READ_CPU] * n_nv      # the reads' CPU work lands while the cpu lane computes
    ahead = 0.0
    if P[P_COPY_SERIAL] and n_zc:
        # the serial runtime pushes the zerocopy picks into VRAM (draining a victim first when VRAM is full, in an
        # exclusive ledger) before it waits for the gpu lane's reads
        ahead = n_zc * (P[P_PUSH] + P[P_HOST_COPY]) * (2 if S[S_VRAM_FULL] else 1)
    head = P[P_HEAD_LAYER] + P[P_HEAD_READ] * n_nv + (P[P_HEAD_PREDICT] if S[S_PREDICTING] else 0.0)
    R[R_HEAD] = head
    order = _nvme_order(I, F, S, D, nv, n_nv)
    if not P[P_OVERLAP]:
        return _serial_nvme(P, I, F, S, D, order, g, c, c_on, ahead, head, L, cnt, R)
    return _overlap_nvme(P, I, F, S, D, order, g, g_on, c, c_on, head, L, cnt, R)


@kernel
def _serial_host(P, S, n_computed, n_zc, c, c_on):
    """The layer's serial host time outside the lanes, and the cpu lane's end with the CPU work of the prefetch
    reads that ran since the last layer where the cpu lane computes (else that work is serial): (c, serial)."""
    # a masked pick is neither computed nor combined: the per-pick host work is the computed picks'
    serial = P[P_HOST_LAYER] + P[P_HOST_PICK] * n_computed
    if S[S_PREDICTING]:
        serial += P[P_HOST_PREDICT]
    if n_zc:
        serial += P[P_HOST_ZC]
    done = S[S_PF_DONE]
    if P[P_READ_CPU] and done:
        if c_on:
            c += P[P_READ_CPU] * done
        else:
            serial += P[P_READ_CPU] * done
    return c, serial
