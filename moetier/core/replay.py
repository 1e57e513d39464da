"""The replay's executor and its picks: what the simulator and the runtime share on modeled time.

Contract
--------
- ``rank_keys(ids, experts)``: keys hottest first by pick count over a trace's ids (the frequency seed).
- ``Streams``: ``conc`` lockstep streams over trace segments; per step the rows, per layer the union of the rows'
  picks with their row counts (masked picks, negative ids, are left out).
- ``Replay``: plans each layer with ``plan_layer`` on one ledger and carries out the plan's intents (fills,
  landings, pushes, prefetch reads and their expiry) through ledger tickets at their modeled times, so the
  residency rule holds in the simulator exactly as in the runtime, which drives the same object.

Pure: imports only the core (ledger, planner, channel, terms, llc).
"""
from __future__ import annotations

import numpy as np

from moetier.core import commit_kernel as CK
from moetier.core.jit import kernel
from moetier.core.ledger import Ledger
from moetier.core.llc import reuse_model
from moetier.core.channel import NvmeChannel
from moetier.core.plan import LayerPlan, plan_layer
from moetier.core.policies.admission import admits
from moetier.core.terms import ChannelTerms, PlanContext
from moetier.core.tickets import ABSENT


def rank_keys(ids: np.ndarray, experts: int) -> np.ndarray:
    """Keys ordered hottest first by pick count (ties by key) over ids [tokens, layers, topk]."""
    L = ids.shape[1]
    keys = (ids.astype(np.int64) + (np.arange(L, dtype=np.int64) * experts)[None, :, None]).ravel()
    keys = keys[ids.ravel() >= 0]            # masked picks (a missing router record) are not computed
    counts = np.bincount(keys, minlength=L * experts)
    return np.lexsort((np.arange(counts.size), -counts))[: int((counts > 0).sum())]


def warmup_ids(trace, topk: int, wtok: int) -> np.ndarray:
    """The warm-up tokens (policy.seed "warmup"): each segment's first ``wtok`` tokens, ids [tokens, layers, topk];
    what the tiers are seeded from and the predictor first learns from (``Replay.learn``), held out from the
    measured part."""
    return np.concatenate([trace.segment(s)[:wtok, :, :topk] for s in range(trace.nseg)])


class Streams:
    """Lockstep streams over trace segments; yields per step, per layer, the union of picks with row counts."""

    def __init__(self, trace, conc: int, topk: int, experts: int, *, offsets: list[int], window: int = 1,
                 span: int | None = None):
        """``span``: the tokens per stream the caller will step through (steps x window); when it is shorter than
        a segment only those tokens are taken (a short replay's set-up cost was the whole segment's)."""
        self.conc, self.window = conc, window
        nseg = trace.nseg
        L = trace.ids.shape[1]
        self._base = (np.arange(L, dtype=np.int64) * experts)[None, :, None]
        self.offsets = []
        # per distinct token range its ids [tokens, layers, topk]; per stream the index of its range there
        self._ids, self._entry = [], []
        cache = {}
        for i in range(conc):
            si = i % nseg
            seg = trace.segment(si)
            n = len(seg)
            off = offsets[i] % n
            part = span is not None and span < n
            ck = (si, off) if part else si
            if ck not in cache:
                sel = seg[(off + np.arange(span)) % n] if part else seg
                cache[ck] = len(self._ids)
                self._ids.append(np.ascontiguousarray(sel[:, :, :topk]))
            self._entry.append(cache[ck])
            self.offsets.append(0 if part else off)
        self.layers = L
        self._lists = None

    def _as_lists(self) -> tuple:
        """(local ids, keys) per stream as nested lists [token][layer] -> picks, masked picks left out: what the
        per-layer path reads; made on first use (the compiled step loop reads ``flat`` instead)."""
        if self._lists is None:
            made, bases = [], self._base.ravel().tolist()
            for sel in self._ids:
                if (sel < 0).any():          # masked picks (a missing router record) are not computed
                    loc = [[[e for e in row if e >= 0] for row in tok] for tok in sel.tolist()]
                    made.append((loc, [[[e + b for e in row] for row, b in zip(tok, bases)] for tok in loc]))
                else:
                    made.append((sel.tolist(), (sel.astype(np.int64) + self._base).tolist()))
            self._lists = ([made[e][0] for e in self._entry], [made[e][1] for e in self._entry])
        return self._lists

    @property
    def local(self) -> list:
        return self._as_lists()[0]

    @property
    def keys(self) -> list:
        return self._as_lists()[1]

    def rows(self, step: int):
        """Token indices (stream, token) of this step's rows."""
        w, ids, entry = self.window, self._ids, self._entry
        return [(i, (self.offsets[i] + step * w + j) % len(ids[entry[i]])) for i in range(self.conc) for j in range(w)]

    def flat(self) -> tuple:
        """(every stream's keys as one int64 array [tokens, layers, topk], -1 where a pick is masked; per stream the
        index of its first token there): what the compiled step loop reads a row's picks from (``rows`` maps to it
        by ``start[i] + t``)."""
        starts = np.cumsum([0] + [len(a) for a in self._ids])
        ks = np.concatenate([np.where(a >= 0, a.astype(np.int64) + self._base, -1) for a in self._ids])
        return ks, np.array([starts[e] for e in self._entry], np.int64)

    def picks(self, rows, layer: int) -> dict:
        keys = (self._lists or self._as_lists())[1]      # per layer call: not through the property
        if len(rows) == 1:
            i, t = rows[0]
            return dict.fromkeys(keys[i][t][layer], 1)
        out: dict = {}
        get = out.get
        for i, t in rows:
            for k in keys[i][t][layer]:
                out[k] = get(k, 0) + 1
        return out

    def local_rows(self, rows, layer: int) -> list:
        local = (self._lists or self._as_lists())[0]
        return [local[i][t][layer] for i, t in rows]


@kernel
def _on_nvme(ranked, codes, base, cap):
    """The keys ``base + e`` of the ranked local ids ``e`` whose state code is ABSENT (on NVMe only, no read of
    theirs under way), in rank order, at most ``cap`` of them."""
    out = np.empty(min(cap, len(ranked)), np.int64)
    n = 0
    for e in ranked:
        if n == len(out):
            break
        if codes[base + e] == ABSENT:
            out[n] = base + e
            n += 1
    return out[:n]


class Replay:
    """The simulator's executor: plans each layer and carries out the plan's intents on modeled time."""

    def __init__(self, R, *, predictor=None, rows: int = 1):
        self.R = R
        self.ctx = PlanContext.from_recipe(R, rows)
        if not admits(R.policy, R.vram_slots, R.layers, R.topk):   # static VRAM: GPU-computed misses stay out
            self.ctx.can_admit = False
        self.ledger = Ledger(R.keys, R.vram_slots, R.ram_slots, exclusive=R.policy.get("ram", "exclusive")
                             == "exclusive", ram_policy=R.policy.get("ram_evict", "lru"),
                             vram_policy=R.policy.get("vram_evict"),
                             ram_partition=R.policy.get("ram_partition", "global"), layers=R.layers,
                             experts=R.experts)
        nvme, engines = R.hardware.get("nvme", {}), getattr(R, "engines", ())
        terms = ChannelTerms.at_rows(nvme, rows, engines, R.nvme_expert_bytes, (R.experts, R.topk))
        self.chan = NvmeChannel(R.nvme_expert_bytes, R.nvme_bw_gbps, bw_qd1_gbps=R.nvme_bw_qd1_gbps,
                                latency_ms=R.nvme_latency_ms, terms=terms)
        self.llc = reuse_model(R)
        self.predictor = predictor
        pf = R.policy.get("prefetch") or {}
        self.pf_depth = int(pf.get("depth") or 0)
        self.prefetching = predictor is not None and self.pf_depth > 0
        self.pf_budget = int(pf.get("budget") or 8)
        if self.prefetching and hasattr(predictor, "price"):
            # a used read saves a demand read's latency; a wasted one holds the channel (and the reader's CPU) for
            # its service time; a run of the predictor costs its host time on the layer (docs/peers.md)
            ch = self.chan
            predictor.price(save_ms=ch.pf_svc + ch.pf_lat, waste_ms=ch.pf_svc + self.ctx.read_cpu,
                            run_ms=self.ctx.host_predict)   # the head's part (head_predict) is within it
        self.pf_tickets: dict = {}
        self.pf_target: dict[int, list] = {}
        self.pf_used = 0
        self.admissions = 0       # RAM -> VRAM pushes of resident (zerocopy) picks, counted by the executors
        self.split_end = None     # when the cpu lane's last split call ended (model ms): its worker's idle
        self._copies = 0
        # the oracle's future (moetier.core.policies.belady.Future; moetier.peers.rows.attach), None elsewhere:
        # ahead of each layer's plan its clock moves to the layer (``oracle_clock``)
        self.future = None

    def settle(self) -> tuple[float, float]:
        """(link ms, host ms) of the admissions and drains since the last call when the engine runs them after the
        lanes, one after another (ctx.copy_serial, i.e. policy.overlap false): each costs one record over the link
        (push_ms, hardware gpu.h2d_gbps) plus its host time (recipe calibration.host.per_copy_ms). NVMe -> VRAM pushes
        are in the plan already (they gate the gpu lane). In an exclusive ledger every VRAM eviction is a drain (a
        VRAM key has no RAM copy); counted here rather than on the ledger's hot path."""
        L = self.ledger
        n = self.admissions + (L.counters["vram_evictions"] if L.exclusive and not L.all_in_ram else 0)
        new, self._copies = n - self._copies, n
        ctx = self.ctx
        return (new * ctx.push_ms, new * ctx.host_copy) if ctx.copy_serial else (0.0, 0.0)

    def idle(self, t0: float) -> float:
        """ms the cpu lane's worker has idled at t0, since the last split call ended (0 before the first)."""
        return t0 - self.split_end if self.split_end is not None else 0.0

    def touch(self, plan: LayerPlan) -> None:
        """Recency of the picks computed in place, and what streamed through the host cache: the cpu lane's RAM
        picks, then the layer's NVMe reads (landed and checksummed in host memory), in the order they ran (shared by
        the simulator's and the runtime's commit); when the layer's split call ended (``idle``)."""
        self._touch_host(plan)
        L = self.ledger
        if L.commits and plan.packed is not None:       # the compiled commit's uses, one call
            if plan.gpu or plan.cpu:
                CK.uses(plan.packed, *L._kargs)
            return
        if plan.gpu:
            L.vram_hit(plan.gpu)
        if plan.cpu and not L.all_in_ram:
            L.ram_hit(plan.cpu)

    def _touch_host(self, plan: LayerPlan) -> None:
        """``touch``'s host cache and split-call part: what the ledger's compiled commit leaves to Python."""
        if plan.split_end is not None:
            self.split_end = plan.split_end
        if self.llc is not None:
            self.llc.touch(plan.cpu)
            if plan.nvme_cpu or plan.nvme_gpu:
                self.llc.touch(plan.nvme_cpu + plan.nvme_gpu)

    def learn(self, ids: np.ndarray) -> None:
        """Let the predictor learn from tokens held out from the run (``warmup_ids``) before the first step."""
        if self.prefetching and hasattr(self.predictor, "learn_from"):
            self.predictor.learn_from(ids)

    def begin_step(self, step: int) -> None:
        self.ledger.step = step
        if self.predictor is not None and hasattr(self.predictor, "salt"):
            self.predictor.salt = step
        if self.predictor is not None and hasattr(self.predictor, "begin_step"):
            self.predictor.begin_step(step)

    def arm(self, layer: int) -> bool:
        """Whether the predictor runs on ``layer`` this step (a dormant one does not: predict.GatedPredictor.runs),
        set on the plan context before the layer is planned, so ``plan_layer`` charges the predictor's host time only
        where it ran; the simulator and the runtime call it before each layer's plan."""
        pred = self.predictor
        on = self.prefetching and (not hasattr(pred, "runs") or pred.runs(layer))
        self.ctx.predicting = on
        return on

    def after_plan(self, layer: int, plan: LayerPlan, streams, rows, t0: float, *, on_expire=None,
                   on_issue=None) -> None:
        """Prefetch once a layer is planned (callers check ``prefetching``), shared by the simulator and the
        runtime: expiry of this layer's unused prefetches, prediction + prefetch for layer + depth, predictor
        learning, the last two only where ``arm`` armed the layer. Issued at t0 + plan.issue_ms: past the layer's
        resident lanes and before its waits, so a read has the rest of the layer to land in; issued after the layer,
        a depth-1 read was still queued when the next layer needed it. The runtime's hooks move real bytes:
        ``on_expire(layer)`` before the model expires, ``on_issue(key, ticket)`` per read."""
        pred, depth, t = self.predictor, self.pf_depth, t0 + plan.issue_ms
        if on_expire is not None:
            on_expire(layer)
        self.expire(layer, t)
        if not self.ctx.predicting:
            return
        if layer + depth < self.R.layers:
            fut = None
            if pred.uses_future:
                base = (layer + depth) * self.R.experts
                fut = [k - base for k in streams.picks(rows, layer + depth)]
            issued = self.prefetch(layer, None if pred.uses_future else streams.local_rows(rows, layer), fut, t)
            if on_issue is not None:
                for k in issued:
                    on_issue(k, self.pf_tickets[k])
        if not pred.uses_future and layer >= depth:
            pred.observe(layer - depth, streams.local_rows(rows, layer - depth), streams.local_rows(rows, layer))

    def layer(self, layer: int, picks: dict, t: float, streams, rows, lanes: LayerPlan | None = None) -> LayerPlan:
        """One layer on modeled time (the simulator's executor; the runtime interleaves the same calls with its real
        work): plan at ``t`` (keeping ``lanes``' deal where given: plan_layer), prefetch for the layers ahead,
        commit the plan's intents, the LFU counts."""
        if self.future is not None:      # a deal given (a calibration's) keeps its own RAM uses
            self.oracle_clock(layer, picks if lanes is None else None)
        self.arm(layer)
        plan = plan_layer(self.ctx, self.ledger, picks, t, self.chan, self.llc, lanes, self.idle(t))
        if self.prefetching:
            self.after_plan(layer, plan, streams, rows, t)
        self.commit(plan, picks)
        self.after_layer(picks)
        return plan

    def oracle_clock(self, layer: int, picks: dict | None) -> None:
        """The oracle's step ahead of a layer's plan: its future's ``now`` moves to the layer (step x layers +
        layer), and every RAM pick of ``picks`` (None: no uses) is used now, whichever lane computes it: one computed
        through the GPU (zerocopy) gets no RAM use in the commit, and a Belady order left at its old next use would
        keep it as needed soon (VRAM picks are all computed on the GPU: the commit uses them). The compiled step loop
        does the same (moetier.core.step_kernel)."""
        L = self.ledger
        self.future.now[0] = L.step * self.R.layers + layer
        if picks:
            L.ram_hit(picks)

    def after_layer(self, picks: dict) -> None:
        """After a layer's commit (shared by the simulator and the runtime): the LFU counts."""
        L = self.ledger
        if L._lfu_window:
            L.observe(picks, L.step)

    def commit(self, plan: LayerPlan, picks: dict) -> None:
        """Carry out the plan's intents: the uses (``touch``), the fills, the admissions. One compiled call over the
        ledger's arrays where it covers the ledger (``Ledger.commits``) and no prefetch read is outstanding (its
        landing is a ticket's); else the same steps through the ledger's Python methods."""
        L = self.ledger
        if L.commits and plan.packed is not None and not self.pf_tickets:
            self._touch_host(plan)
            self.admissions += L.commit(plan.packed, self.ctx.can_admit)
            return
        self.touch(plan)
        pft = self.pf_tickets
        if plan.nvme_cpu:
            fill = L.fill_landed
            for k in plan.nvme_cpu:
                tk = pft.pop(k, None) if pft else None
                if tk is None:
                    fill(k, picks)
                else:
                    self.pf_used += 1
                    L.land(tk)
                    L.adopt(k, picks)
        if plan.zerocopy and self.ctx.can_admit:
            self.admissions += L.pushes_landed(plan.zerocopy, picks)
        if plan.nvme_gpu:
            if pft:
                # each prefetched record landed in the ring first; the pushes below take them from there (a key's
                # landing touches no other key's tier, so landing them all before the pushes is the same)
                for k in plan.nvme_gpu:
                    tk = pft.pop(k, None)
                    if tk is not None:
                        self.pf_used += 1
                        L.land(tk)
                        L.drop_staged(k)
            if self.ctx.can_admit:          # static VRAM (policy.vram_admit false): computed from staging, dropped
                L.pushes_landed(plan.nvme_gpu, picks, staged=True)   # refused (all slots pinned): from staging

    # -- prefetch -----------------------------------------------------------------------------------------------
    def prefetch(self, layer: int, rows_local, future, t: float) -> list:
        """Issue prefetch reads of layer + depth's predicted experts that are on NVMe only; returns their keys."""
        L = self.ledger
        if L.all_in_ram:
            return []
        tgt = layer + self.pf_depth
        ranked = self.predictor.predict(layer, rows_local, future)
        base = tgt * self.R.experts
        want = _on_nvme(np.asarray(ranked, np.int64), np.frombuffer(L.codes, np.uint8), base, self.pf_budget).tolist()
        if hasattr(self.predictor, "issued"):
            self.predictor.issued(layer, [k - base for k in want])
        if not want:
            return want
        self.chan.prefetch(t, want)
        for k in want:
            self.pf_tickets[k] = L.begin_fill(k, staging=True)
        self.pf_target.setdefault(tgt, []).extend(want)
        return want

    def expire(self, layer: int, t: float) -> None:
        keys = self.pf_target.pop(layer, None)
        if not keys:
            return
        pft = self.pf_tickets
        left = [k for k in keys if k in pft]
        cancelled, wasted = self.chan.expire(left, t)
        L = self.ledger
        for k in cancelled:
            L.abort(pft.pop(k))
        for k in wasted:       # bytes were read into the landing ring; the slot is reused
            tk = pft.pop(k)
            L.land(tk)
            L.drop_staged(k)
