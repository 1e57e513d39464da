"""Trace-replay simulator: the same ledger and plan_layer a runtime uses, with time taken from the records.

Contract
--------
``run(R, trace, conc)`` replays ``conc`` streams in lockstep (stream i replays segment i mod nseg; the union of the
step's rows gives each layer's picks with their row counts m). Per step, non-MoE time ``R.fixed(rows)`` is spread
evenly over the layers; each layer costs plan.ms; the NVMe channel, prefetch and residency carry across layers and
steps. Transfers are executed on modeled time through ledger tickets (a read lands at its modeled arrival), so the
residency rule holds in the simulator exactly as in the runtime.

Seeding (policy.seed):
- "warmup" (default): each stream's first ``policy.warmup_tokens`` tokens warm the tiers and are not measured; the
  frequency seed is taken from those warm-up tokens only (held out from the measured part).
- "oracle": the reference's semantics: frequency over the whole trace (measured part included), 200 warm steps.
- "none": empty tiers, 200 warm steps.

``prefill(R, prompt)`` is the closed-form prefill bound (compute vs PCIe vs NVMe per layer and chunk).
"""
from __future__ import annotations

import math
import time

import numpy as np

from moetier.core.ledger import Ledger
from moetier.core.llc import reuse_model
from moetier.core.channel import NvmeChannel
from moetier.core.plan import LayerPlan, plan_layer
from moetier.core.terms import ChannelTerms, PlanContext
from moetier.core.predict import make_predictor

ORACLE_WARM_STEPS = 200


def rank_keys(ids: np.ndarray, experts: int) -> np.ndarray:
    """Keys ordered hottest first by pick count (ties by key) over ids [tokens, layers, topk]."""
    L = ids.shape[1]
    keys = (ids.astype(np.int64) + (np.arange(L, dtype=np.int64) * experts)[None, :, None]).ravel()
    keys = keys[ids.ravel() >= 0]            # masked picks (a missing router record) are not computed
    counts = np.bincount(keys, minlength=L * experts)
    return np.lexsort((np.arange(counts.size), -counts))[: int((counts > 0).sum())]


class Streams:
    """Lockstep streams over trace segments; yields per step, per layer, the union of picks with row counts."""

    def __init__(self, trace, conc: int, topk: int, experts: int, *, offsets: list[int], window: int = 1,
                 span: int | None = None):
        """``span``: the tokens per stream the caller will step through (steps x window); when it is shorter than
        a segment only those tokens are turned into lists (a short replay's set-up cost was the whole segment's)."""
        self.conc, self.window = conc, window
        nseg = trace.nseg
        L = trace.ids.shape[1]
        base = (np.arange(L, dtype=np.int64) * experts)[None, :, None]
        self.local, self.keys, self.offsets = [], [], []
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
                sel = np.ascontiguousarray(sel[:, :, :topk])
                if (sel < 0).any():          # masked picks (a missing router record) are not computed
                    loc = [[[e for e in row if e >= 0] for row in tok] for tok in sel.tolist()]
                    cache[ck] = (loc, [[[e + l * experts for e in row] for l, row in enumerate(tok)] for tok in loc])
                else:
                    cache[ck] = (sel.tolist(), (sel.astype(np.int64) + base).tolist())
            loc, ks = cache[ck]
            self.local.append(loc)
            self.keys.append(ks)
            self.offsets.append(0 if part else off)
        self.layers = L

    def rows(self, step: int):
        """Token indices (stream, token) of this step's rows."""
        w = self.window
        return [(i, (self.offsets[i] + step * w + j) % len(self.keys[i])) for i in range(self.conc) for j in range(w)]

    def picks(self, rows, layer: int) -> dict:
        keys = self.keys
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
        return [self.local[i][t][layer] for i, t in rows]


class Replay:
    """The simulator's executor: plans each layer and carries out the plan's intents on modeled time."""

    def __init__(self, R, *, predictor=None, rows: int = 1):
        self.R = R
        self.ctx = PlanContext.from_recipe(R, rows)
        if R.policy.get("vram_admit") is False:     # static VRAM: what the GPU computes from RAM or NVMe stays out
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
        self.pf_tickets: dict = {}
        self.pf_target: dict[int, list] = {}
        self.pf_used = 0
        self.admissions = 0       # RAM -> VRAM pushes of resident (zerocopy) picks, counted by the executors
        self.split_end = None     # when the cpu lane's last split call ended (model ms): its worker's idle
        self._copies = 0
        # a peer's hooks (moetier.core.policies.peers.attach): ``deal(ledger, picks)`` -> the lanes of a layer's
        # picks (None: the planner's), ``before(layer)`` ahead of each layer's plan (the oracle's clock)
        self.deal = None
        self.before = None

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
        if plan.split_end is not None:
            self.split_end = plan.split_end
        if self.llc is not None:
            self.llc.touch(plan.cpu)
            if plan.nvme_cpu or plan.nvme_gpu:
                self.llc.touch(plan.nvme_cpu + plan.nvme_gpu)
        L = self.ledger
        if plan.gpu:
            L.vram_hit(plan.gpu)
        if plan.cpu and not L.all_in_ram:
            L.ram_hit(plan.cpu)

    def begin_step(self, step: int) -> None:
        self.ledger.step = step
        if self.predictor is not None and hasattr(self.predictor, "salt"):
            self.predictor.salt = step
        if self.predictor is not None and hasattr(self.predictor, "begin_step"):
            self.predictor.begin_step(step)

    def after_plan(self, layer: int, plan: LayerPlan, streams, rows, t0: float, *, on_expire=None,
                   on_issue=None) -> None:
        """Prefetch once a layer is planned (callers check ``prefetching``), shared by the simulator and the
        runtime: expiry of this layer's unused prefetches, prediction + prefetch for layer + depth, predictor
        learning. Issued at t0 + plan.issue_ms: past the layer's resident lanes and before its waits, so a read has
        the rest of the layer to land in; issued after the layer, a depth-1 read was still queued when the next
        layer needed it (benchmarks/bench_prefetch_timing.py counts the prefetches that had started). The runtime's
        hooks move real bytes: ``on_expire(layer)`` before the model expires, ``on_issue(key, ticket)`` per read."""
        pred, depth, t = self.predictor, self.pf_depth, t0 + plan.issue_ms
        if on_expire is not None:
            on_expire(layer)
        self.expire(layer, t)
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
        if self.before is not None:
            self.before(layer)
        if lanes is None and self.deal is not None:
            lanes = self.deal(self.ledger, picks)
        plan = plan_layer(self.ctx, self.ledger, picks, t, self.chan, self.llc, lanes, self.idle(t))
        if self.prefetching:
            self.after_plan(layer, plan, streams, rows, t)
        self.commit(plan, picks)
        self.after_layer(picks)
        return plan

    def after_layer(self, picks: dict) -> None:
        """After a layer's commit (shared by the simulator and the runtime): the LFU counts."""
        L = self.ledger
        if L._lfu_window:
            L.observe(picks, L.step)

    def commit(self, plan: LayerPlan, picks: dict) -> None:
        L = self.ledger
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
        state = L.state
        want = []
        for e in ranked or ():
            k = base + e
            if k not in state:
                want.append(k)
                if len(want) >= self.pf_budget:
                    break
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


def _segment_plan(trace, conc: int, window: int, seed_mode: str, warmup_tokens: int):
    nseg = trace.nseg
    lens = [int(trace.segments[i + 1] - trace.segments[i]) for i in range(nseg)]
    used = sorted({i % nseg for i in range(conc)})
    if seed_mode == "warmup":
        offsets = [((i // nseg) * 997) for i in range(conc)]
        short = min(lens[s] for s in used)
        w = min(warmup_tokens, short // 2)
        warm_steps = max(1, w // window)
        measured = max(1, (short - w) // window)
    else:
        offsets = [i * 997 for i in range(conc)]
        warm_steps = ORACLE_WARM_STEPS
        measured = max(1, min(lens[s] for s in used) // window)
        w = 0
    return offsets, warm_steps, measured, w


def _coverage(acc) -> dict:
    """The read coverage as the runtime books it (calibrate.read_coverage): means over the read layers, and the
    gap's sd from the plan's spread over layers and the model's lateness within one."""
    n = acc["rl"]
    if not n:
        return {"layers": 0, "span_ms": None, "latency_ms": None, "gap_sd_ms": None}
    mean = (acc["arr"] - acc["span"]) / n
    plan_var = max(0.0, acc["gap_sq"] / n - mean * mean)
    return {"layers": n, "span_ms": acc["span"] / n, "latency_ms": acc["arr"] / n,
            "gap_sd_ms": math.sqrt(plan_var + acc["gap_var"] / n)}


def _seed(rp: Replay, trace, seed_mode: str, wtok: int, order=None) -> None:
    """Seed the replay's tiers as policy.seed says (module docstring); seeding's pushes are not decode traffic.
    ``order(ranked)``: a peer's static placement order from the hottest-first keys."""
    R = rp.R
    ranked = None
    if seed_mode == "oracle":
        ranked = rank_keys(trace.ids[:, :, :R.topk], R.experts)
    elif seed_mode == "warmup" and wtok:
        warm = np.concatenate([trace.segment(s)[:wtok, :, :R.topk] for s in range(trace.nseg)])
        ranked = rank_keys(warm, R.experts)
    if ranked is not None or order is not None:
        rp.ledger.seed(order(ranked if ranked is not None else []) if order is not None else ranked)
    rp.settle()                       # seeding's pushes are not decode traffic


class _Dealer:
    """A replay of the recipe a predicted run planned on, on its own clock: it makes every lane decision that run
    made (the runtime plans on the modeled clock: plan parity), which the predicting replay then times on its own
    terms. Dealing on the predicting replay's clock instead parted from the runtime's deal wherever the lanes' ends
    lay close (zerocopy experts a token at vram102-C2 fell to about 60% of the runtime's)."""

    def __init__(self, R, trace, seed_mode: str, wtok: int, rows: int, draft_ms: float):
        self.rp = Replay(R, predictor=make_predictor(R.policy, R.layers, R.experts), rows=rows)
        _seed(self.rp, trace, seed_mode, wtok)
        self.f_layer, self.draft_ms, self.t = R.fixed(rows) / R.layers, draft_ms, 0.0

    def begin_step(self, step: int) -> None:
        self.rp.begin_step(step)
        self.t += self.draft_ms

    def deal(self, layer: int, picks: dict, streams, rows) -> LayerPlan:
        self.t += self.f_layer
        plan = self.rp.layer(layer, picks, self.t, streams, rows)
        self.t += plan.ms + sum(self.rp.settle())     # the runtime's modeled clock (moetier.run.runtime.run)
        return plan


def _same_tiers(a: LayerPlan, b: LayerPlan) -> bool:
    return (len(a.gpu) == len(b.gpu) and len(a.cpu) + len(a.zerocopy) == len(b.cpu) + len(b.zerocopy)
            and len(a.nvme_cpu) + len(a.nvme_gpu) + len(a.masked) == len(b.nvme_cpu) + len(b.nvme_gpu)
            + len(b.masked))


def run(R, trace, conc: int = 1, *, window: int = 1, accept: float = 1.0, draft_ms: float = 0.0,
        max_steps: int = 0, progress=None, plan_hook=None, choose=None, timeline: bool = False,
        peer=None) -> dict:
    """Replay ``trace`` through recipe ``R`` at ``conc`` streams; returns the report dict (see module docstring).
    ``timeline``: also return, per measured step, the experts each tier served and the tiers' occupancy
    (``out["timeline"]``, _Timeline: a few integers a step, read from counters the replay keeps anyway)
    ``choose``: the recipe a predicted run planned on (moetier.measure.calibrate: the plan pass's terms): a replay of
    it on its own clock deals every pick to its lane, as that run did, and ``R``'s terms time the deal (_Dealer).
    ``peer``: a moetier.core.policies.peers.Peer whose placement, replacement and lane deal the replay runs (its
    policy overrides are the caller's to apply to ``R``)."""
    seed_mode = R.policy.get("seed", "warmup")
    if seed_mode not in ("warmup", "oracle", "none"):
        raise ValueError(f"policy.seed: expected 'warmup', 'oracle' or 'none', got {seed_mode!r}")
    warmup_tokens = int(R.policy.get("warmup_tokens", 1000))
    offsets, warm_steps, measured, wtok = _segment_plan(trace, conc, window, seed_mode, warmup_tokens)
    if max_steps:
        measured = min(measured, max_steps)
    topk, E, L = R.topk, R.experts, R.layers
    streams = Streams(trace, conc, topk, E, offsets=offsets, window=window, span=(warm_steps + measured) * window)

    predictor = make_predictor(R.policy, L, E)
    nrows = conc * window
    rp = Replay(R, predictor=predictor, rows=nrows)
    order = None
    if peer is not None:
        from moetier.core.policies import peers as _peers
        _peers.attach(peer, rp, streams, warm_steps + measured)
        order = lambda ranked: _peers.rank_keys(peer, ranked, L, E)      # noqa: E731
    _seed(rp, trace, seed_mode, wtok, order)
    dealer = _Dealer(choose, trace, seed_mode, wtok, nrows, draft_ms) if choose is not None else None

    fixed_step = R.fixed(nrows)
    f_layer = fixed_step / L
    copy_serial = rp.ctx.copy_serial
    acc = dict(ms=0.0, fixed=0.0, gpu=0.0, cpu=0.0, wait=0.0, gwait=0.0, copy=0.0, picks=0, vram_picks=0,
               gpu_exp=0, cpu_exp=0, zc=0, ncpu=0, ngpu=0, masked=0, demand=0, layers=0, rl=0, span=0.0, arr=0.0,
               gap_sq=0.0, gap_var=0.0)
    t = 0.0
    total = warm_steps + measured
    t_wall = time.perf_counter()
    tl = _Timeline(rp.ledger) if timeline else None
    chan = rp.chan
    cv2, lane_var = chan.cv_own ** 2 + chan.cv_shared ** 2, chan.lane_sd ** 2
    for step in range(total):
        meas = step >= warm_steps
        if meas and step == warm_steps:
            pf_used0, chan_pf0, wasted0, cancel0 = rp.pf_used, chan.pf_reads, chan.pf_wasted, chan.pf_cancelled
            reads0, beside0 = chan.reads, chan.reads_beside_pf
        rp.begin_step(step)
        if dealer is not None:
            dealer.begin_step(step)
        rows = streams.rows(step)
        t0_step = t
        t += draft_ms
        for layer in range(L):
            t += f_layer
            picks = streams.picks(rows, layer)
            t0_layer = t
            dealt = dealer.deal(layer, picks, streams, rows) if dealer is not None else None
            plan = rp.layer(layer, picks, t, streams, rows, dealt)
            if dealt is not None and not _same_tiers(plan, dealt):
                raise RuntimeError(f"sim.run: the dealing replay's tiers parted from the timing replay's at step "
                                   f"{step}, layer {layer}")
            if plan_hook is not None:
                plan_hook(step, layer, plan)
            t += plan.ms
            if copy_serial:
                link, host = rp.settle()
                t += link + host
                if meas:
                    acc["copy"] += link
            if meas:
                _book(acc, plan, picks, t0_layer, cv2, lane_var)
        if meas:
            acc["ms"] += t - t0_step
            acc["fixed"] += fixed_step
            if tl is not None:
                tl.step(acc, t - t0_step)
        if progress is not None and step % 64 == 0:
            progress(step, total)
    wall = time.perf_counter() - t_wall

    tokens = measured * conc * accept
    pf_issued = chan.pf_reads - chan_pf0
    pf_used = rp.pf_used - pf_used0
    pf_wasted = chan.pf_wasted - wasted0
    nvme_picks = acc["ncpu"] + acc["ngpu"]
    out = {
        "recipe": R.id, "conc": conc, "window": window, "accept": accept, "seed": seed_mode,
        "steps": measured, "warm_steps": warm_steps, "tokens": tokens,
        "tok_s": 1000.0 * tokens / acc["ms"] if acc["ms"] else 0.0,
        "ms_per_step": acc["ms"] / measured,
        "ms_per_token": acc["ms"] / tokens if tokens else 0.0,
        "vram_hit": acc["vram_picks"] / acc["picks"] if acc["picks"] else 0.0,
        "gpu_experts_per_tok": acc["gpu_exp"] / tokens,
        "cpu_experts_per_tok": acc["cpu_exp"] / tokens,
        "zerocopy_per_tok": acc["zc"] / tokens,
        "nvme_per_tok": nvme_picks / tokens,
        "nvme_cpu_per_tok": acc["ncpu"] / tokens,
        "nvme_gpu_per_tok": acc["ngpu"] / tokens,
        "masked_per_tok": acc["masked"] / tokens,
        "lossy": acc["masked"] > 0,
        # the share of the experts a token's layers needed that were dropped (exact: "mask"), beside tok/s
        "masked_share": acc["masked"] / (acc["gpu_exp"] + acc["cpu_exp"] + acc["zc"] + nvme_picks + acc["masked"])
        if acc["masked"] else 0.0,
        "ms_fixed": acc["fixed"] / measured,
        "ms_gpu_moe": acc["gpu"] / measured,
        "ms_cpu_moe": acc["cpu"] / measured,
        "ms_nvme_wait": acc["wait"] / measured,
        "ms_nvme_wait_gpu": acc["gwait"] / measured,
        "ms_copy": acc["copy"] / measured,
        # layers whose NVMe picks are all demand reads: the work before the first wait (resident lanes and the
        # host's head), and that read's arrival, both from the issue (ms, means), and the spread of arrival minus
        # wait; the runtime books the same (Runtime._wait_read)
        "read_coverage": _coverage(acc),
        "vram_slots": R.vram_slots, "ram_slots": R.ram_slots,
        "prefetch": {
            "predictor": getattr(predictor, "name", "none"),
            "issued_per_tok": pf_issued / tokens,
            **_precision_recall(pf_used, pf_issued, nvme_picks),
            "cancelled": chan.pf_cancelled - cancel0,
            "wasted_reads": pf_wasted,
            "wasted_bytes": pf_wasted * R.nvme_expert_bytes,
            # of the demand reads, those issued while a prefetch read was in service (they share the device; the
            # runtime's reader marks the same, Completion.pf_busy)
            "demand_reads": chan.reads - reads0,
            "demand_reads_beside": chan.reads_beside_pf - beside0,
        },
        "ledger": dict(rp.ledger.counters),
        "layer_plans": total * L, "sim_seconds": wall,
    }
    if tl is not None:
        out["timeline"] = tl.series
    return out


def _precision_recall(used: int, issued: int, nvme_picks: int) -> dict:
    """The prefetch's precision (used over issued) and recall (used over NVMe picks); None where undefined."""
    return {"precision": used / issued if issued else None, "recall": used / nvme_picks if nvme_picks else None}


def _book(acc: dict, plan, picks: dict, t0_layer: float, cv2: float, lane_var: float) -> None:
    """Add one measured layer's plan to run's accumulators."""
    acc["gpu"] += plan.gpu_ms
    acc["cpu"] += plan.cpu_ms
    acc["wait"] += plan.nvme_wait_ms
    acc["gwait"] += plan.gpu_wait_ms
    acc["picks"] += sum(picks.values())
    acc["vram_picks"] += sum(picks[k] for k in plan.gpu)
    acc["gpu_exp"] += len(plan.gpu)
    acc["cpu_exp"] += len(plan.cpu)
    acc["zc"] += len(plan.zerocopy)
    acc["ncpu"] += len(plan.nvme_cpu)
    acc["ngpu"] += len(plan.nvme_gpu)
    acc["masked"] += len(plan.masked)
    acc["demand"] += plan.demand_reads
    nv = plan.nvme_cpu or plan.nvme_gpu
    if nv and plan.demand_reads == len(plan.nvme_cpu) + len(plan.nvme_gpu):
        acc["rl"] += 1                # read coverage, as the runtime books it (Runtime._wait_read)
        span, arr = plan.wait_from, plan.arrivals[nv[0]] - t0_layer
        acc["span"] += span
        acc["arr"] += arr
        # the gap (arrival - wait) spreads over layers by the plan, and within a layer by the first
        # read's own and shared lateness (channel cv_own, cv_shared) and the host's (lane_sd)
        acc["gap_sq"] += (arr - span) ** 2
        acc["gap_var"] += cv2 * arr * arr + lane_var


class _Timeline:
    """Per measured step: experts served by each tier (vram = gpu lane from a VRAM slot, ram = cpu lane in place
    plus zero-copy, nvme = read from NVMe, masked = dropped), picks and VRAM-served picks (for the hit rate), the
    step's modeled ms, and the VRAM slots and RAM slots in use when the step ended."""

    FIELDS = {"vram": ("gpu_exp",), "ram": ("cpu_exp", "zc"), "nvme": ("ncpu", "ngpu"), "masked": ("masked",),
              "picks": ("picks",), "vram_picks": ("vram_picks",)}

    def __init__(self, ledger):
        self.ledger = ledger
        self.prev = dict.fromkeys(self.FIELDS, 0)
        self.series = {k: [] for k in (*self.FIELDS, "ms", "vram_used", "ram_used")}

    def step(self, acc: dict, ms: float) -> None:
        for k, src in self.FIELDS.items():
            v = sum(acc[s] for s in src)
            self.series[k].append(v - self.prev[k])
            self.prev[k] = v
        L = self.ledger
        self.series["ms"].append(ms)
        self.series["vram_used"].append(len(L.clock.slot_of))
        self.series["ram_used"].append(L.keys if L.all_in_ram else len(L.ram))


def prefill(R, prompt: int) -> dict:
    """Closed-form prefill model: per layer and chunk the max of compute, PCIe staging and NVMe reads."""
    pf = R.prefill
    chunk = int(pf.get("chunk", 8192))
    comp = float(pf.get("compute_ms_per_layer", 0.0))
    first = float(pf.get("first_request_ms", 0.0))
    E, Lr = R.experts, R.layers
    nonvram = E - min(E, R.vram_slots // Lr)
    denom = R.keys - R.vram_slots
    ram_share = min(1.0, R.ram_slots / denom) if denom > 0 else 1.0
    link = nonvram * (ram_share * R.ram_expert_bytes + (1 - ram_share) * R.nvme_expert_bytes) / (R.h2d_gbps * 1e6) \
        if R.h2d_gbps else 0.0
    nvme = nonvram * (1 - ram_share) * R.nvme_expert_bytes / (R.nvme_bw_gbps * 1e6) if R.nvme_bw_gbps else 0.0
    compute = comp * min(chunk, prompt) / chunk
    per_layer = max(compute, link, nvme)
    chunks = math.ceil(prompt / chunk)
    total = chunks * Lr * per_layer + first
    bound = max((("compute", comp), ("pcie", link), ("nvme", nvme)), key=lambda x: x[1])[0]
    return {"prompt": prompt, "ms": total, "tok_s": 1000.0 * prompt / total if total else 0.0, "bound": bound,
            "per_layer_ms": {"compute": comp, "pcie": link, "nvme": nvme}}
