"""The simulator's layer loop compiled: one call plans, commits and books every layer of a decode step.

Contract
--------
``Steps.of(rp, streams)`` is the loop for replay ``rp`` (moetier.core.replay.Replay) over ``streams``, or None where
it does not cover the replay. ``step(rows, t, meas)`` runs one step's layers from clock ``t`` as sim.run's
per-layer loop does (``Replay.layer``: the layer's picks, ``plan_layer``, the commit; then the clock, the serial
copies' time and, where ``meas``, the books) and returns the clock after the last layer; ``books(acc)`` writes the
measured books into sim.run's accumulators. The replay's channel, split-call clock and admission counters are read
before and written back after each step, so the Python objects stay the state of record between steps.

It covers a replay with no prefetch (the NVMe channel serves demand reads only: the FIFO model, or a calibrated
depth table and bursts), with or without a host cache model (llc) and the cpu lane's wake term, any peer row's lane
deal (a rule the planner kernel applies, moetier.core.deal_rules), the oracle's future clock (``Replay.future``: its
``oracle_clock`` ahead of each layer), and a ledger the compiled commit covers (``Ledger.commits``: Belady's, the
window LFU and the machines on a RAM tier among them). Everything else takes the per-layer path, a replay whose
``layer`` or ``after_layer`` a wiring replaced among it. Both paths run the same kernels:
``plan_kernel.plan_arrays`` plans, ``commit_kernel.commit`` carries out the intents, ``channel.demand_arrivals``
times the reads and ``lanes.idle_wake`` the worker's wake, so plans, ledger and books are identical
(tests/test_step_kernel.py); this module adds only the gathering and the booking around them (the channel's reads in
flight, the host cache's clock). Why: through Python, a layer call's packing, unpacking and crossings cost more than
the compiled work itself (benchmarks/core.md: the per-call rows against the loop's).
"""
from __future__ import annotations

import numpy as np

from moetier.core import commit_kernel as CK
from moetier.core import plan_kernel as K
from moetier.core.channel import T_TABLE, demand_arrivals
from moetier.core.jit import kernel
from moetier.core.lanes import idle_wake
from moetier.core.plan import NO_NVME_LANE
from moetier.core.plan_gather import ON_NVME, host_cache, tier_states
from moetier.core.plan_kernel import (R_CPU, R_GPU, R_GPU_WAIT, R_MS, R_NVME_WAIT, R_SPLIT_END, R_WAIT_FROM,
                                      S_ARRIVALS, S_CV_OWN, S_CV_SHARED, S_FACTORS, S_FRESH, S_LANE_SD, S_N,
                                      S_NVME_WAKE, S_SPREAD, S_T0, S_VRAM_FULL, S_WAKE)
from moetier.core.tier_state import M_VRAM_EV, M_VRAM_N

# G: the loop's clock and terms (float64)
(G_T, G_SPLIT, G_FLAYER, G_PUSH, G_HCOPY, G_CV2, G_LANE_VAR, G_TWO, G_DFREE, G_N) = range(10)
# Z: flags and counters (int64); Z_NOUT: the channel's reads in flight (table model) held in OUT, Z_CLOCK: the host
# cache's clock; Z_FUTURE: an oracle's replay (Replay.future), whose clock is Z_NOW0 + the layer
(Z_MASK, Z_NO_LANE, Z_SERIAL, Z_EXCL, Z_ALL_RAM, Z_ADMIT_ON, Z_VSLOTS, Z_READS, Z_ADMITS, Z_COPIES, Z_WAKE, Z_LLC,
 Z_CLOCK, Z_NOUT, Z_FUTURE, Z_NOW0, Z_N) = range(17)
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
def _issue(kt, G, Z, OUT, t, reads):
    """The layer's demand reads issued at t into ``reads`` and booked as NvmeChannel.issued books them: the FIFO
    model behind the demand work; a depth table joining the reads still in flight (OUT), which they join."""
    n = reads.shape[0]
    if not kt[T_TABLE]:
        demand_arrivals(kt, t, G[G_DFREE], 0, reads)
        G[G_DFREE] = reads[n - 1]
    else:
        q = 0
        for j in range(Z[Z_NOUT]):
            if OUT[j] > t:
                OUT[q] = OUT[j]
                q += 1
        demand_arrivals(kt, t, 0.0, q, reads)
        if q + n > OUT.shape[0]:
            raise ValueError("step loop: more reads in flight than its buffer holds")
        OUT[q:q + n] = reads
        Z[Z_NOUT] = q + n
        G[G_DFREE] = max(G[G_DFREE], reads[n - 1])
    Z[Z_READS] += n


@kernel
def _touch(O, last, Z):
    """What streamed through the host (Replay.touch): the cpu lane's RAM picks, then the NVMe reads, in order."""
    a = 6 + O[0] + O[1]
    for j in range(a, a + O[2] + O[3] + O[4]):
        Z[Z_CLOCK] += 1
        last[O[j]] = Z[Z_CLOCK]


@kernel
def run_step(KS, toks, P, G, Z, A, B, meas, pos, Ib, arr, X, O, R, D, ka, kt, OUT, last, CV, now):
    """Every layer of one step (module docstring); 0, or the failing layer's code (commit's -1 / -2, NO_LANE)."""
    C, st, inram, link, owner, ref, slot, meta, pin, VP, RP, caps, vhl, rhl = ka    # commit_kernel.bind's order
    t = G[G_T]
    for layer in range(KS.shape[1]):
        t += G[G_FLAYER]
        n = _gather(KS, toks, layer, pos, Ib[0], Ib[1])
        I = Ib[:, :n]
        if Z[Z_FUTURE]:              # Replay.oracle_clock: the future's clock, every RAM pick used
            now[0] = Z[Z_NOW0] + layer
            CK._ram_uses(Ib[0], 0, n, C, inram, link, meta, RP, rhl)
        n_nv = tier_states(st, I, Z[Z_ALL_RAM] != 0)
        fresh = 0
        if n_nv and not Z[Z_MASK]:
            if Z[Z_NO_LANE]:
                _reset(pos, I)
                G[G_T] = t
                return NO_LANE
            reads = X[S_N:S_N + n_nv]
            _issue(kt, G, Z, OUT, t, reads)
            fresh = n_nv
            j = 0
            for i in range(n):
                if ON_NVME[I[2, i]]:
                    arr[i] = reads[j]
                    j += 1
        # the rest of X's head is the channel's terms, set once (Steps), and zeros
        X[S_T0], X[S_FRESH], X[S_ARRIVALS] = t, fresh, 1.0 if fresh else 0.0
        X[S_VRAM_FULL] = 1.0 if n_nv and Z[Z_SERIAL] and Z[Z_EXCL] and meta[M_VRAM_N] >= Z[Z_VSLOTS] else 0.0
        X[S_WAKE] = idle_wake(t - G[G_SPLIT]) if Z[Z_WAKE] and G[G_SPLIT] == G[G_SPLIT] else 0.0
        end = host_cache(X, S_N + fresh, I, last, Z[Z_CLOCK], CV) if Z[Z_LLC] else S_N + fresh
        K.plan_arrays(P, I, X[:end], D, O, R)
        if R[R_SPLIT_END] == R[R_SPLIT_END]:
            G[G_SPLIT] = R[R_SPLIT_END]
        if Z[Z_LLC]:
            _touch(O, last, Z)
        out = CK.commit(O, *ka, Z[Z_ADMIT_ON] != 0)
        if out < 0:
            _reset(pos, I)
            G[G_T] = t
            return out
        Z[Z_ADMITS] += out
        if C[CK.C_WIN]:              # Replay.after_layer: the window LFU counts the layer's picks
            CK.observe(Ib[0, :n], rhl, rhl[rhl.shape[0] - 1])
        t0 = t
        t += R[R_MS]
        if Z[Z_SERIAL]:              # Replay.settle
            c = Z[Z_ADMITS] + (meta[M_VRAM_EV] if Z[Z_EXCL] and not Z[Z_ALL_RAM] else 0)
            new = c - Z[Z_COPIES]
            Z[Z_COPIES] = c
            over, host = new * G[G_PUSH], new * G[G_HCOPY]
            t += over + host
            if meas:
                A[A_COPY] += over
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
        hooked = "layer" in vars(rp) or "after_layer" in vars(rp)     # a wiring's own steps (token_feed.wire)
        return not (rp.prefetching or rp.pf_tickets or not L.commits or ch.pf or ch.pf_gone or hooked)

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
        self.G[[G_FLAYER, G_PUSH, G_HCOPY, G_CV2, G_LANE_VAR, G_TWO]] = (
            rp.R.fixed(streams.conc * streams.window) / rp.R.layers, ctx.push_ms, ctx.host_copy,
            ch.cv_own ** 2 + ch.cv_shared ** 2, ch.lane_sd ** 2, 2.0)
        self.Z[[Z_MASK, Z_NO_LANE, Z_SERIAL, Z_EXCL, Z_ALL_RAM, Z_ADMIT_ON, Z_VSLOTS, Z_WAKE, Z_LLC]] = (
            ctx.mask, ctx.cpu is None and ctx.gpu is None, ctx.copy_serial, L.exclusive, L.all_in_ram, ctx.can_admit,
            L.vram_slots, bool(ctx.cpu_wake), rp.llc is not None)
        self.Z[Z_FUTURE] = rp.future is not None
        self.now = rp.future.now if rp.future is not None else np.zeros(1, np.int64)
        self.A, self.B = np.zeros(len(BOOK_F)), np.zeros(len(BOOK_I), np.int64)
        cap = streams.conc * streams.window * self.KS.shape[2]
        self.pos = np.full(L.keys, -1, np.int64)
        llc = rp.llc
        self.CV = np.array(llc.curve if llc is not None else (), np.float64)
        self.last = llc.last if llc is not None else np.zeros(0, np.int64)
        self.Ib, self.arr = np.empty((3, cap), np.int64), np.empty(cap)
        self.X = np.zeros(S_N + 2 * cap + self.CV.shape[0])
        # the planner's per-call scalars that do not change in this loop: the channel's terms, whether the host
        # cache's factors follow (the rest stay 0: no prefetch reads done, no prediction)
        self.X[[S_NVME_WAKE, S_SPREAD, S_CV_OWN, S_CV_SHARED, S_LANE_SD, S_FACTORS]] = (
            ch.wake, ch.spread, ch.cv_own, ch.cv_shared, ch.lane_sd, llc is not None)
        self.O, self.R, self.D = np.empty(6 + cap, np.int64), np.empty(K.R_N), np.empty(0, np.int64)
        # the table model's reads in flight: a layer's reads land before the next layer's, so a few layers' worth
        self.OUT = np.empty(L.keys + cap)

    def step(self, rows, t: float, meas: bool) -> float:
        """One step's layers from clock ``t`` over ``rows`` (Streams.rows), booked where ``meas``; the clock after
        them. Raises what the per-layer path raises where a layer's plan or commit breaks a rule."""
        rp, G, Z = self.rp, self.G, self.Z
        ch = rp.chan
        G[G_T], G[G_DFREE] = t, ch.dfree
        G[G_SPLIT] = np.nan if rp.split_end is None else rp.split_end
        Z[Z_READS], Z[Z_ADMITS], Z[Z_COPIES] = ch.reads, rp.admissions, rp._copies
        table = bool(ch.qd_table)
        if table:
            Z[Z_NOUT] = len(ch.outstanding)
            self.OUT[:Z[Z_NOUT]] = ch.outstanding
        if rp.llc is not None:
            Z[Z_CLOCK] = rp.llc.clock
        Z[Z_NOW0] = rp.ledger.step * rp.R.layers
        toks = np.array([self.start[i] + j for i, j in rows], np.int64)
        rc = run_step(self.KS, toks, self.P, G, Z, self.A, self.B, meas, self.pos, self.Ib, self.arr, self.X,
                      self.O, self.R, self.D, rp.ledger._kargs, ch.kt, self.OUT, self.last, self.CV, self.now)
        ch.dfree, ch.reads = float(G[G_DFREE]), int(Z[Z_READS])
        if table:
            ch.outstanding = self.OUT[:Z[Z_NOUT]].tolist()
        if rp.llc is not None:
            rp.llc.clock = int(Z[Z_CLOCK])
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

