"""The simulator's layer loop compiled: one call plans, commits and books every layer of a decode step.

Contract
--------
``Steps.of(rp, streams)`` is the loop for replay ``rp`` (moetier.core.replay.Replay) over ``streams``, or None where
it does not cover the replay. ``step(rows, t, meas)`` runs one step's layers from clock ``t`` as sim.run's
per-layer loop does (``Replay.layer``: the layer's picks, ``plan_layer``, the commit; then the clock, the serial
copies' time and, where ``meas``, the books) and returns the clock after the last layer; ``books(acc)`` writes the
measured books into sim.run's accumulators. The replay's channel, split-call clock and admission counters are read
before and written back after each step, so the Python objects stay the state of record between steps.

It covers a replay with no prefetch (the NVMe channel serves demand reads only), the FIFO channel model (no
latency-by-depth table), no host cache model (llc), no cpu-lane wake term, no peer hooks (a peer row's lane deal is a
rule the planner kernel applies, moetier.core.deal_rules, not a hook), and a ledger the compiled commit covers
(``Ledger.commits``) without the window LFU. Everything else takes the per-layer path. Both paths run the same kernels:
``plan_kernel.plan_arrays`` plans, ``commit_kernel.commit`` carries out the intents and ``channel.fifo_reads`` times the
reads, so plans, ledger and books are identical (tests/test_step_kernel.py); this module adds only the gathering and the
booking around them. Why: through Python, a layer call's packing, unpacking and crossings cost more than the compiled
work itself (benchmarks/core.md: the per-call rows against the loop's).
"""
from __future__ import annotations

import numpy as np

from moetier.core import commit_kernel as CK
from moetier.core import plan_kernel as K
from moetier.core.channel import fifo_reads
from moetier.core.jit import kernel
from moetier.core.plan import NO_NVME_LANE
from moetier.core.plan_gather import ON_NVME, tier_states
from moetier.core.plan_kernel import (R_CPU, R_GPU, R_GPU_WAIT, R_MS, R_NVME_WAIT, R_SPLIT_END, R_WAIT_FROM,
                                      S_ARRIVALS, S_CV_OWN, S_CV_SHARED, S_FRESH, S_LANE_SD, S_N, S_NVME_WAKE,
                                      S_SPREAD, S_T0, S_VRAM_FULL)
from moetier.core.tier_state import M_VRAM_EV, M_VRAM_N

# G: the loop's clock and terms (float64)
(G_T, G_SPLIT, G_FLAYER, G_PUSH, G_HCOPY, G_CV2, G_LANE_VAR, G_TWO, G_DFREE, G_LAT, G_DEEP, G_ONE, G_N) = range(13)
# Z: flags and counters (int64)
Z_MASK, Z_NO_LANE, Z_SERIAL, Z_EXCL, Z_ALL_RAM, Z_ADMIT_ON, Z_VSLOTS, Z_READS, Z_ADMITS, Z_COPIES, Z_N = range(11)
# the books: sim.run's accumulators, floats then integers
BOOK_F = ("gpu", "cpu", "wait", "gwait", "copy", "span", "arr", "gap_sq", "gap_var")
BOOK_I = ("picks", "vram_picks", "gpu_exp", "cpu_exp", "zc", "ncpu", "ngpu", "masked", "demand", "rl")
(A_GPU, A_CPU, A_WAIT, A_GWAIT, A_COPY, A_SPAN, A_ARR, A_GAP_SQ, A_GAP_VAR) = range(len(BOOK_F))
(B_PICKS, B_VRAM_PICKS, B_GPU_EXP, B_CPU_EXP, B_ZC, B_NCPU, B_NGPU, B_MASKED, B_DEMAND, B_RL) = range(len(BOOK_I))
# what a step returns besides 0: the layer's commit failed (commit_kernel's -1 / -2), or no lane computes NVMe picks
NO_LANE = -3


@kernel
def _gather(KS, toks, layer, pos, keys, rows):
    """The union of the rows' picks of ``layer`` in first-seen order, with their row counts, into keys / rows (as
    Streams.picks); ``pos[key]`` is its index there (the caller resets it). Returns their number."""
    n = 0
    for r in range(toks.shape[0]):
        row = KS[toks[r], layer]
        for j in range(row.shape[0]):
            k = row[j]
            if k < 0:
                continue
            p = pos[k]
            if p < 0:
                pos[k] = n
                keys[n] = k
                rows[n] = 1
                n += 1
            else:
                rows[p] += 1
    return n


@kernel
def _book(A, B, G, Z, O, R, I, pos, arr, fresh, t0):
    """One measured layer into the books (sim._book)."""
    A[A_GPU] += R[R_GPU]
    A[A_CPU] += R[R_CPU]
    A[A_WAIT] += R[R_NVME_WAIT]
    A[A_GWAIT] += R[R_GPU_WAIT]
    n = I.shape[1]
    for i in range(n):
        B[B_PICKS] += I[1, i]
    for j in range(6, 6 + O[0]):
        B[B_VRAM_PICKS] += I[1, pos[O[j]]]
    B[B_GPU_EXP] += O[0]
    B[B_ZC] += O[1]
    B[B_CPU_EXP] += O[2]
    B[B_NCPU] += O[3]
    B[B_NGPU] += O[4]
    B[B_MASKED] += O[5]
    B[B_DEMAND] += fresh
    if (O[3] or O[4]) and fresh == O[3] + O[4]:
        B[B_RL] += 1           # read coverage, as the runtime books it (sim._book)
        span = R[R_WAIT_FROM]
        a = arr[pos[O[6 + O[0] + O[1] + O[2]]]] - t0
        A[A_SPAN] += span
        A[A_ARR] += a
        A[A_GAP_SQ] += (a - span) ** G[G_TWO]
        A[A_GAP_VAR] += G[G_CV2] * a * a + G[G_LANE_VAR]


@kernel
def run_step(KS, toks, P, G, Z, A, B, meas, pos, Ib, arr, X, O, R, D, ka):
    """Every layer of one step (module docstring); 0, or the failing layer's code (commit's -1 / -2, NO_LANE)."""
    st, meta = ka[1], ka[7]
    t = G[G_T]
    for layer in range(KS.shape[1]):
        t += G[G_FLAYER]
        n = _gather(KS, toks, layer, pos, Ib[0], Ib[1])
        I = Ib[:, :n]
        n_nv = tier_states(st, I, Z[Z_ALL_RAM] != 0)
        fresh = 0
        if n_nv and not Z[Z_MASK]:
            if Z[Z_NO_LANE]:
                _reset(pos, I)
                G[G_T] = t
                return NO_LANE
            reads = X[S_N:S_N + n_nv]
            fifo_reads(G[G_DFREE], t, G[G_LAT], G[G_DEEP], G[G_ONE], reads)
            G[G_DFREE] = reads[n_nv - 1]
            Z[Z_READS] += n_nv
            fresh = n_nv
            j = 0
            for i in range(n):
                if ON_NVME[I[2, i]]:
                    arr[i] = reads[j]
                    j += 1
        # the rest of X's head is the channel's terms, set once (Steps), and zeros
        X[S_T0], X[S_FRESH], X[S_ARRIVALS] = t, fresh, 1.0 if fresh else 0.0
        X[S_VRAM_FULL] = 1.0 if n_nv and Z[Z_SERIAL] and Z[Z_EXCL] and meta[M_VRAM_N] >= Z[Z_VSLOTS] else 0.0
        K.plan_arrays(P, I, X[:S_N + fresh], D, O, R)
        if R[R_SPLIT_END] == R[R_SPLIT_END]:
            G[G_SPLIT] = R[R_SPLIT_END]
        out = CK.commit(O, *ka, Z[Z_ADMIT_ON] != 0)
        if out < 0:
            _reset(pos, I)
            G[G_T] = t
            return out
        Z[Z_ADMITS] += out
        t0 = t
        t += R[R_MS]
        if Z[Z_SERIAL]:              # Replay.settle
            c = Z[Z_ADMITS] + (meta[M_VRAM_EV] if Z[Z_EXCL] and not Z[Z_ALL_RAM] else 0)
            new = c - Z[Z_COPIES]
            Z[Z_COPIES] = c
            link, host = new * G[G_PUSH], new * G[G_HCOPY]
            t += link + host
            if meas:
                A[A_COPY] += link
        if meas:
            _book(A, B, G, Z, O, R, I, pos, arr, fresh, t0)
        _reset(pos, I)
    G[G_T] = t
    return 0


@kernel
def _reset(pos, I):
    """The layer's picks out of ``pos`` (-1: not a pick), for the next layer's gathering."""
    for i in range(I.shape[1]):
        pos[I[0, i]] = -1


class Steps:
    """The compiled step loop bound to one replay and its streams (module docstring)."""

    @staticmethod
    def covers(rp) -> bool:
        """Whether the loop covers replay ``rp`` (module docstring)."""
        L, ch = rp.ledger, rp.chan
        return not (rp.prefetching or rp.pf_tickets or rp.llc is not None or rp.deal is not None
                    or rp.before is not None or not L.commits or L._lfu_window or ch.qd_table or ch.pf or ch.pf_gone
                    or rp.ctx.cpu_wake)

    @classmethod
    def of(cls, rp, streams):
        """The loop for ``rp`` over ``streams``, or None where it does not cover them."""
        return cls(rp, streams) if cls.covers(rp) else None

    def __init__(self, rp, streams):
        self.rp, ctx, L, ch = rp, rp.ctx, rp.ledger, rp.chan
        ctx.predicting = False          # as Replay.arm sets it on every layer of a replay that does not prefetch
        self.KS, self.start = streams.flat()
        self.P = K.pack(ctx)
        self.G, self.Z = np.zeros(G_N), np.zeros(Z_N, np.int64)
        self.G[[G_FLAYER, G_PUSH, G_HCOPY, G_CV2, G_LANE_VAR, G_TWO, G_LAT, G_DEEP, G_ONE]] = (
            rp.R.fixed(streams.conc * streams.window) / rp.R.layers, ctx.push_ms, ctx.host_copy,
            ch.cv_own ** 2 + ch.cv_shared ** 2, ch.lane_sd ** 2, 2.0, ch.lat, ch.deep, ch.one)
        self.Z[[Z_MASK, Z_NO_LANE, Z_SERIAL, Z_EXCL, Z_ALL_RAM, Z_ADMIT_ON, Z_VSLOTS]] = (
            ctx.mask, ctx.cpu is None and ctx.gpu is None, ctx.copy_serial, L.exclusive, L.all_in_ram, ctx.can_admit,
            L.vram_slots)
        self.A, self.B = np.zeros(len(BOOK_F)), np.zeros(len(BOOK_I), np.int64)
        cap = streams.conc * streams.window * self.KS.shape[2]
        self.pos = np.full(L.keys, -1, np.int64)
        self.Ib, self.arr, self.X = np.empty((3, cap), np.int64), np.empty(cap), np.zeros(S_N + cap)
        # the planner's per-call scalars that do not change in this loop: the channel's terms (the rest stay 0: no
        # wake term, no prefetch reads done, no prediction, no host cache factors)
        self.X[[S_NVME_WAKE, S_SPREAD, S_CV_OWN, S_CV_SHARED, S_LANE_SD]] = (ch.wake, ch.spread, ch.cv_own,
                                                                            ch.cv_shared, ch.lane_sd)
        self.O, self.R, self.D = np.empty(6 + cap, np.int64), np.empty(K.R_N), np.empty(0, np.int64)

    def step(self, rows, t: float, meas: bool) -> float:
        """One step's layers from clock ``t`` over ``rows`` (Streams.rows), booked where ``meas``; the clock after
        them. Raises what the per-layer path raises where a layer's plan or commit breaks a rule."""
        rp, G, Z = self.rp, self.G, self.Z
        ch = rp.chan
        G[G_T], G[G_DFREE] = t, ch.dfree
        G[G_SPLIT] = np.nan if rp.split_end is None else rp.split_end
        Z[Z_READS], Z[Z_ADMITS], Z[Z_COPIES] = ch.reads, rp.admissions, rp._copies
        toks = np.array([self.start[i] + j for i, j in rows], np.int64)
        rc = run_step(self.KS, toks, self.P, G, Z, self.A, self.B, meas, self.pos, self.Ib, self.arr, self.X,
                      self.O, self.R, self.D, rp.ledger._kargs)
        ch.dfree, ch.reads = float(G[G_DFREE]), int(Z[Z_READS])
        rp.split_end = None if G[G_SPLIT] != G[G_SPLIT] else float(G[G_SPLIT])
        rp.admissions, rp._copies = int(Z[Z_ADMITS]), int(Z[Z_COPIES])
        if rc == NO_LANE:
            raise ValueError(NO_NVME_LANE)
        if rc < 0:
            rp.ledger.commit_failed(rc)
        return float(G[G_T])

    def books(self, acc: dict) -> None:
        """The measured layers' sums so far into sim.run's accumulators (they start at zero, as these do)."""
        acc.update(zip(BOOK_F, self.A.tolist()))
        acc.update(zip(BOOK_I, self.B.tolist()))

