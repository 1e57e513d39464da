"""The runtime: the simulator's ledger and plan_layer, executed with real bytes and real kernels on a backend.

Contract
--------
``run(R, store, backend, trace, conc)`` replays routing from a trace (moetier.run.router.TraceRouter) (the same lockstep streams as the
simulator); its ``Runtime``, per layer, calls ``plan_layer`` on the *modeled* clock - so its plan decisions are exactly the
simulator's (plan parity) - then carries the plan out for real:

1. demand NVMe reads are issued (``begin_fill`` ticket + ``backend.fill`` handle) before any compute;
2. the resident lanes compute (cpu in place from RAM slots; gpu from VRAM slots; zerocopy from RAM slots);
3. the plan's residency intents run in the simulator's order, each ``Ledger.land`` only after
   ``backend.landed`` reported the bytes readable (``wait`` in stall mode); NVMe picks compute from where they
   landed; a failed transfer aborts its ticket and stops the run with a one-line error - unverified bytes are never
   computed;
4. the router-weighted sum over each row's picks (fixed order: trace slot order) updates the hidden state:
   ``h = rmsnorm(h + moe(h))``; the next layer reads this layer's output.

Slot frees are deferred to the end of the layer so a slot is never reused while this layer may still read it.
Per step it records the output digest (bit-exactness checks) and per-lane wall time (lane busy, NVMe wait, plan,
bookkeeping).
"""
from __future__ import annotations

import hashlib
import time

import numpy as np

from moetier.errors import UserError
from moetier.core.plan import plan_layer
from moetier.core.predict import make_predictor
from moetier.core.sim import Replay, Streams, _segment_plan, rank_keys
from moetier.core.records import deal, hands_off, idle_wake
from moetier.bytes.transport import TransportError
from moetier.run.router import TraceRouter

EPS = 1e-6


def rmsnorm(h: np.ndarray) -> np.ndarray:
    return (h / np.sqrt(np.mean(h * h, axis=1, keepdims=True) + EPS)).astype(np.float32)


def token_state(hidden: int, stream: int, token: int, seed: int = 0) -> np.ndarray:
    """Deterministic input hidden state of one token (an embedding stand-in)."""
    rng = np.random.default_rng([seed, stream, token])
    return rmsnorm(rng.standard_normal((1, hidden)).astype(np.float32))[0]


def _inner(st: dict) -> float:
    """Seconds booked to waits, copies and lanes (timed inside the bookkeeping section, so taken out of it)."""
    return (st["nvme_wait_s"] + st["copy_s"] + st["stage_s"] + st["lane_cpu_s"] + st["lane_gpu_s"]
            + st["lane_zc_s"])


class SlotAllocator:
    """Integer slots 0..n-1 of one backend arena; frees are deferred until the layer that used them ends."""

    def __init__(self, n: int, what: str):
        self.free = list(range(n - 1, -1, -1))
        self.later: list[int] = []
        self.what = what

    def alloc(self) -> int:
        if not self.free:
            raise UserError(f"{self.what} arena exhausted: more transfers in flight than the backend's arena holds "
                            f"(ram slots + headroom); lower --conc or policy.prefetch.budget")
        return self.free.pop()

    def release_later(self, slot: int) -> None:
        self.later.append(slot)

    def end_layer(self) -> None:
        self.free.extend(self.later)
        self.later.clear()


class Runtime:
    def __init__(self, R, store, backend, conc: int = 1):
        self.R, self.store, self.be = R, store, backend
        caps = backend.capabilities
        if store.layout.encoding not in caps.encodings:
            raise UserError(f"backend {caps.name}: encoding {store.layout.encoding!r} not supported "
                            f"(has {sorted(caps.encodings)})")
        if R.vram_slots > caps.vram_slots:
            raise UserError(f"recipe {R.id}: budget.vram_expert_slots={R.vram_slots} but backend {caps.name} has "
                            f"{caps.vram_slots} VRAM slots")
        for lane in ("gpu", "zerocopy", "cpu"):
            if lane in R.lanes and not caps.has(lane) and not (lane == "gpu" and R.vram_slots == 0):
                raise UserError(f"recipe {R.id}: engine lane {lane!r} but backend {caps.name} lacks it")
        if R.policy.get("ram", "exclusive") != "exclusive":
            raise UserError(f"recipe {R.id}: policy.ram={R.policy['ram']!r} is simulated only; the runtime keeps an "
                            f"exclusive RAM tier (policy.ram=exclusive)")
        self.predictor = make_predictor(R.policy, R.layers, R.experts)
        self.rp = Replay(R, predictor=self.predictor, rows=conc)
        self.L = self.rp.ledger
        self.ram = SlotAllocator(backend.ram_slot_count, "RAM slot")
        self.ram_slot: dict[int, int] = {}    # key -> RAM (or staging) slot holding its bytes
        self.vram_slot: dict[int, int] = {}
        self.inflight: dict[int, tuple] = {}   # key -> (ticket, handle, slot) for fills in flight
        self.wasted: list[tuple] = []          # (handle, slot) of unused prefetch reads still in flight
        self.stats = dict(plan_s=0.0, book_s=0.0, lane_cpu_s=0.0, lane_gpu_s=0.0, lane_zc_s=0.0, nvme_wait_s=0.0,
                          copy_s=0.0, combine_s=0.0, reads=0, masked=0, picks=0, layer_calls=0,
                          cpu_bytes=0, cpu_layers=0, cpu_calls=0, cpu_experts=0, cpu_extra_rows=0,
                          cpu_contended_reads=0, nvme_picks=0, nvme_layers=0, prefetch_reads=0,
                          cpu_inline_calls=0, cpu_inline_experts=0, cpu_inline_extra=0, cpu_inline_s=0.0,
                          cpu_inline_contended=0, cpu_split_calls=0, cpu_split_experts=0, cpu_split_extra=0,
                          cpu_split_s=0.0, cpu_split_contended=0, cpu_inline_cold=0.0, cpu_split_cold=0.0,
                          cpu_split_crit_cold=0.0, cpu_split_crit_extra=0, cpu_split_wake=0.0, cpu_split_handoff=0,
                          cpu_inline_waited=0,
                          predict_s=0.0, predict_layers=0, predict_rows=0,
                          gpu_calls=0, gpu_experts=0, gpu_extra=0, zc_calls=0, zc_experts=0, zc_extra=0, copies=0,
                          stage_s=0.0, read_layers=0, read_span_s=0.0, read_latency_n=0, read_latency_s=0.0,
                          read_gap_sq=0.0, read_head_s=0.0, read_reads=0, read_predict=0,
                          read_predict_rows=0)
        self._split_end = None    # when the cpu lane's last split call ended (its worker's idle: spec.idle_wake)
        self.cpu_pmin = int(backend.parallel_min)
        self.cpu_workers = max(1, int(backend.workers))
        self.call_groups: dict[tuple, list] = {}      # (lane, experts, extra rows, contended) -> [calls, seconds]

    # -- setup --------------------------------------------------------------------------------------------------
    def seed_tiers(self, ranked) -> None:
        """Place the hottest keys like Ledger.seed, but with real fills (and pushes), landed one by one."""
        L = self.L
        ranked = [int(k) for k in ranked]
        v = L.vram_slots
        if L.all_in_ram:
            # every key gets a RAM slot first; VRAM copies are pushed from there and the RAM copy stays
            self._fill_ram(list(range(L.keys)), tickets=False)
            for k in ranked[:v]:
                self._push_now(k, L.begin_push(k))
        else:
            for k in ranked[:v]:
                self._fill_now(k, staging=True)
                self._push_now(k, L.begin_push(k))
                self.ram.end_layer()           # the push landed and nothing computes yet: its staging slot is free
            self._fill_ram(ranked[v:v + L.ram_slots], tickets=True)
        L.clock.ref[:] = bytes(L.clock.n)

    def _fill_ram(self, keys, *, tickets: bool) -> None:
        """Fill keys into RAM slots at queue depth, coldest first so the hottest ends at the LRU's protected end."""
        L, be = self.L, self.be
        hs = []
        for k in reversed(keys):
            slot = self._alloc_ram()
            hs.append((k, L.begin_fill(k) if tickets else None, be.fill(k, slot), slot))
        for k, tk, h, slot in hs:
            self._wait(h)
            if tk is not None:
                for ev in L.land(tk):
                    self._release_ram(ev)
            self.ram_slot[k] = slot
        self.ram.end_layer()

    def _fill_now(self, k, staging=False):
        tk = self.L.begin_fill(k, staging=staging)
        slot = self._alloc_ram()
        h = self.be.fill(k, slot)
        self._wait(h, tk)
        self.L.land(tk)
        self.ram_slot[k] = slot
        return slot

    def _push_now(self, k, tp, protect=(), bucket="copy_s"):
        """tp = a push ticket: drain its victim first (same copy queue), then push, then land both. bucket: where
        the push's time is booked (stage_s for an NVMe pick's push, which the simulator counts as its stall)."""
        be, L = self.be, self.L
        self._drains(protect)
        h = be.push(k, self.ram_slot[k], tp.slot)
        self._wait(h, tp, bucket)
        self.stats["copies"] += 1
        for freed in L.land(tp):
            self._release_ram(freed)
        self.vram_slot[k] = tp.slot

    def _drains(self, protect=()):
        L, be = self.L, self.be
        for td in L.take_drains():
            slot = self._alloc_ram()
            h = be.drain(td.key, td.slot, slot)
            self._wait(h, td, "copy_s")
            self.stats["copies"] += 1
            self.vram_slot.pop(td.key, None)
            self.ram_slot[td.key] = slot
            for ev in L.land(td, protect):
                self._release_ram(ev)

    def _book_cpu_call(self, keys, picks, t0: float, t1: float, contended: int = 0, cold: float | None = None,
                       crit: tuple | None = None, waited: bool = False) -> None:
        """cpu lane accounting per call (from t0 to t1, perf_counter seconds), split by how the backend ran it
        (inline vs split over workers): the inputs of the lane cost fit in moetier.bench.fit_cpu_lane. A split call
        also books its longest share (``crit``: cold-expert equivalents, extra rows; the plan's, else by count over
        the strided deal), whether it ends with a worker's share (spec.hands_off) and how long its worker idled
        before it (spec.idle_wake); an inline call, whether the host
        blocked on its pick's read right before it (``waited``)."""
        st = self.stats
        seconds = t1 - t0
        cls = "inline" if len(keys) < max(2, self.cpu_pmin) else "split"
        st["lane_cpu_s"] += seconds
        st["cpu_calls"] += 1
        st["cpu_contended_reads"] += contended
        st[f"cpu_{cls}_calls"] += 1
        extra = sum(picks[k] - 1 for k in keys)
        st[f"cpu_{cls}_experts"] += len(keys)
        st[f"cpu_{cls}_extra"] += extra
        st[f"cpu_{cls}_s"] += seconds
        st[f"cpu_{cls}_contended"] += contended
        st[f"cpu_{cls}_cold"] += len(keys) if cold is None else cold
        if cls == "inline":
            st["cpu_inline_waited"] += waited
        else:
            if crit is None:
                share = deal(keys, self.cpu_workers)[0]
                crit = ((len(keys) if cold is None else cold) * len(share) / len(keys),
                        sum(picks[k] - 1 for k in share))
            st["cpu_split_crit_cold"] += crit[0]
            st["cpu_split_crit_extra"] += crit[1]
            st["cpu_split_handoff"] += hands_off(len(keys), self.cpu_workers)
            if self._split_end is not None:
                st["cpu_split_wake"] += idle_wake((t0 - self._split_end) * 1e3)
            self._split_end = t1
        self._group(f"cpu_{cls}", len(keys), extra, contended, seconds)

    def _group(self, lane, experts, extra, contended, seconds) -> None:
        """Calls by shape (lane or cpu class, experts, extra rows, reads in flight): the lane fits' rows."""
        g = self.call_groups.setdefault((lane, experts, extra, contended), [0, 0.0])
        g[0] += 1
        g[1] += seconds

    def _book_device_call(self, lane, keys, picks, seconds: float, contended: int = 0) -> None:
        """gpu / zerocopy lane accounting per call: the inputs of the lane cost fit (moetier.calibrate)."""
        st = self.stats
        p = "gpu" if lane == "gpu" else "zc"
        st[f"lane_{p}_s"] += seconds
        st[f"{p}_calls"] += 1
        st[f"{p}_experts"] += len(keys)
        extra = sum(picks[k] - 1 for k in keys)
        st[f"{p}_extra"] += extra
        self._group(p, len(keys), extra, contended, seconds)

    def _compute(self, lane, keys, rows_of, picks, x, out, contended: int = 0, cold: float | None = None,
                 crit: tuple | None = None, waited: bool = False) -> None:
        """One timed lane call over keys (from VRAM slots for gpu, RAM slots otherwise), booked for the fits."""
        slot_of = self.vram_slot if lane == "gpu" else self.ram_slot
        t = time.perf_counter()
        out.update(self.be.compute(lane, [(k, slot_of[k], rows_of[k]) for k in keys], x))
        if lane == "cpu":
            self._book_cpu_call(keys, picks, t, time.perf_counter(), contended, cold, crit, waited)
        else:
            self._book_device_call(lane, keys, picks, time.perf_counter() - t, contended)

    def _cancel(self, h) -> bool:
        return bool(self.be.cancel(h)) if h.prefetch else False

    def _alloc_ram(self) -> int:
        """A free RAM slot; if none, reclaim the oldest wasted prefetch read's slot (waiting for it if needed)."""
        if not self.ram.free and self.wasted:
            h, slot = self.wasted.pop(0)
            try:
                self.be.wait(h)
            except (TransportError, OSError):
                pass
            self.ram.free.append(slot)
        return self.ram.alloc()

    def _release_ram(self, k):
        s = self.ram_slot.pop(k, None)
        if s is not None:
            self.ram.release_later(s)

    def _wait_read(self, h, ticket, issued: tuple | None) -> bool:
        """Wait for an NVMe pick's read; returns whether it had not landed yet (the host blocked on it). With
        ``issued`` = (end of the issue loop, _inner at it, reads issued, whether the layer predicts, the rows it
        predicts for) - given for a layer's first wait, when all its NVMe picks are demand reads issued then - also
        book its read coverage: from its submit (the reader's timestamp, else the loop's end) to this wait (the
        span; less the lane and copy time in it, the host's head start), and to its landing (and the square of
        landing minus wait, for the spread of that gap)."""
        pending = h.state == "pending"
        if issued is None:
            self._wait(h, ticket)
            return pending
        t_w = time.perf_counter()
        st = self.stats
        t_issued, inner0, reads, predicts, predict_rows = issued
        inner_w = _inner(st)
        self._wait(h, ticket)
        t_sub, t_land = h.t_submit or t_issued, h.t_landed
        st["read_layers"] += 1
        st["read_span_s"] += t_w - t_sub
        st["read_head_s"] += max(0.0, t_w - t_sub - (inner_w - inner0))
        st["read_reads"] += reads
        st["read_predict"] += predicts
        st["read_predict_rows"] += predict_rows
        if t_land:
            st["read_latency_n"] += 1
            st["read_latency_s"] += t_land - t_sub
            st["read_gap_sq"] += (t_land - t_w) ** 2      # the gap's spread: lanes' and read's lateness together
        return pending

    def _wait(self, h, ticket=None, bucket="nvme_wait_s"):
        t0 = time.perf_counter()
        try:
            self.be.wait(h)
        except (TransportError, OSError) as e:
            if ticket is not None:
                self.L.abort(ticket)
            raise UserError(f"transfer of key {h.key} failed: {e}") from None
        finally:
            self.stats[bucket] += time.perf_counter() - t0

    # -- one layer ----------------------------------------------------------------------------------------------
    def layer(self, layer: int, rows_keys, rows_w, x: np.ndarray, t_model: float, streams=None, rows=None):
        """rows_keys: per row the global keys of this layer (trace slot order); returns (y, plan, picks). With the
        step's ``streams`` and ``rows``, the prefetch for the layers ahead is issued after this layer's resident
        lanes, before its waits (Replay.after_plan)."""
        L, be, rp, st = self.L, self.be, self.rp, self.stats
        rows_of: dict[int, list] = {}
        for r, ks in enumerate(rows_keys):
            for k in ks:
                rows_of.setdefault(k, []).append(r)
        picks = {k: len(v) for k, v in rows_of.items()}
        c0 = time.perf_counter()
        plan = plan_layer(rp.ctx, L, picks, t_model, rp.chan, rp.llc, idle=rp.idle(t_model))
        c1 = time.perf_counter()
        st["plan_s"] += c1 - c0
        # 1. demand reads first, so the disk works while the lanes compute
        nv_gpu = set(plan.nvme_gpu)
        fresh = 0
        for k in plan.nvme_cpu + plan.nvme_gpu:
            pf = rp.pf_tickets.pop(k, None)
            if pf is not None:       # a prefetched key is needed: no longer the expiry's to withdraw
                rp.pf_used += 1
            if k in self.inflight and self._cancel(self.inflight[k][1]):
                tk, _, slot = self.inflight[k]            # a queued prefetch is needed now: re-issue as demand
                self.inflight[k] = (tk, be.fill(k, slot), slot)
                fresh += 1
            elif k not in self.inflight:
                tk = pf if pf is not None else L.begin_fill(k, staging=k in nv_gpu)
                slot = self._alloc_ram()
                self.inflight[k] = (tk, be.fill(k, slot), slot)
                st["reads"] += 1
                fresh += 1
        c2 = time.perf_counter()
        st["book_s"] += c2 - c1
        # a layer whose NVMe picks are all demand reads issued now: its first wait shows how much of a read the
        # work before it covered (read_coverage)
        predicting = streams is not None and rp.prefetching
        n_nvme = len(plan.nvme_cpu) + len(plan.nvme_gpu)     # reads in flight while the resident lanes compute
        issued = (c2, _inner(st), fresh, int(predicting), len(rows) if predicting else 0) \
            if fresh and fresh == n_nvme else None
        # 2. resident lanes. A reader worker needs the interpreter to start a read, and gets it once a lane's kernel
        # releases it: host work before the first lane call delays the reads
        out: dict[int, np.ndarray] = {}
        if plan.cpu:   # the reads in flight meanwhile contend for the cores
            self._compute("cpu", plan.cpu, rows_of, picks, x, out, n_nvme, plan.cpu_cold, plan.cpu_crit)
        if plan.cpu or plan.nvme_cpu:
            st["cpu_layers"] += 1
            st["cpu_experts"] += len(plan.cpu) + len(plan.nvme_cpu)
            st["cpu_extra_rows"] += sum(picks[k] - 1 for k in plan.cpu) + sum(picks[k] - 1 for k in plan.nvme_cpu)
        if plan.gpu:
            self._compute("gpu", plan.gpu, rows_of, picks, x, out, n_nvme)
        if plan.zerocopy:
            self._compute("zerocopy", plan.zerocopy, rows_of, picks, x, out, n_nvme)
        if predicting:   # 3. prefetch for the layers ahead
            t_pred = time.perf_counter()
            rp.after_plan(layer, plan, streams, rows, t_model, on_expire=self.expire_real,
                          on_issue=self.issue_prefetch)
            st["predict_s"] += time.perf_counter() - t_pred   # prediction + prefetch issue: host time
            st["predict_layers"] += 1
            st["predict_rows"] += len(rows)
        # 4. residency intents, in the simulator's order (Replay.commit), each landing after its bytes did
        b0 = time.perf_counter()
        inner0 = _inner(st)
        rp.touch(plan)
        for k in plan.nvme_cpu:
            tk, h, slot = self.inflight.pop(k)
            waited = self._wait_read(h, tk, issued)
            issued = None
            self.ram_slot[k] = slot
            if tk.staging:                   # a prefetch landed in the landing ring: adopt it into RAM
                L.land(tk)
                evicted = L.adopt(k, picks)
            else:
                evicted = L.land(tk, picks)
            for ev in evicted:
                self._release_ram(ev)
            self._compute("cpu", [k], rows_of, picks, x, out, waited=waited)
        if rp.ctx.can_admit:
            for k in plan.zerocopy:
                tp = L.begin_push(k, picks)
                if tp is not None:
                    rp.admissions += 1
                    self._push_now(k, tp, picks)
        for k in plan.nvme_gpu:
            tk, h, slot = self.inflight.pop(k)
            self._wait_read(h, tk, issued)
            issued = None
            L.land(tk)
            self.ram_slot[k] = slot
            tp = L.begin_push(k, picks)
            if tp is None:                    # no unpinned VRAM slot: compute from the staging slot, drop it
                self._compute("zerocopy" if be.capabilities.has("zerocopy") else "cpu", [k], rows_of, picks, x, out)
                L.drop_staged(k)
                self._release_ram(k)
            else:
                self._push_now(k, tp, picks, "stage_s")
                self._compute("gpu", [k], rows_of, picks, x, out)
        self._drains(picks)
        st["book_s"] += time.perf_counter() - b0 - (_inner(st) - inner0)   # waits and lane work inside: booked to them
        st["cpu_bytes"] += (len(plan.cpu) + len(plan.nvme_cpu)) * self.store.layout.weight_bytes
        st["masked"] += len(plan.masked)
        st["nvme_picks"] += n_nvme
        st["nvme_layers"] += int(n_nvme > 0)
        st["picks"] += len(picks)
        st["layer_calls"] += 1
        # 5. combine in trace slot order (the same order whatever lane computed each pick)
        t = time.perf_counter()
        masked = set(plan.masked)
        pos = {k: {r: i for i, r in enumerate(v)} for k, v in rows_of.items()}
        y = np.zeros_like(x)
        K = len(rows_keys[0]) if rows_keys else 0
        for j in range(K):
            for r, ks in enumerate(rows_keys):
                k = ks[j]
                if k in masked:
                    continue
                y[r] += rows_w[r][j] * out[k][pos[k][r]]
        st["combine_s"] += time.perf_counter() - t
        return y, plan, picks

    # -- prefetch (real reads into the landing ring) -------------------------------------------------------------
    def issue_prefetch(self, k: int, ticket) -> None:
        slot = self._alloc_ram()
        self.inflight[k] = (ticket, self.be.fill(k, slot, prefetch=True), slot)
        self.stats["prefetch_reads"] += 1

    def expire_real(self, layer: int) -> None:
        """Unused prefetches for this layer: withdrawn if not started, else their slots are reused once the read is
        done (never blocking); the model channel and ledger then account them as the simulator does."""
        rp = self.rp
        for k in rp.pf_target.get(layer, ()):
            if k in rp.pf_tickets and k in self.inflight:
                _, h, slot = self.inflight.pop(k)
                if self._cancel(h):
                    self.ram.release_later(slot)    # never started: no bandwidth spent
                else:
                    self.wasted.append((h, slot))
        still = []
        for h, slot in self.wasted:
            try:
                done = self.be.landed(h)
            except (TransportError, OSError):
                done = True                         # a wasted read that failed: nothing was going to use it
            if done:
                self.ram.release_later(slot)
            else:
                still.append((h, slot))
        self.wasted = still

    def end_layer(self) -> None:
        self.ram.end_layer()

    def close(self) -> None:
        self.be.fence()
        for _, slot in self.wasted:
            self.ram.release_later(slot)
        self.wasted.clear()


def make_backend(name: str, st, R, conc: int, verify_rate: float = 1.0):
    """The backend ``name`` sized for recipe R at ``conc`` streams: the RAM tier plus headroom for the fills a layer
    can have in flight (demand picks of every row, prefetch budget, a few spare); unavailable -> one-line UserError."""
    from moetier.run.contract import BackendUnavailable
    from moetier.run.registry import get_backend
    headroom = 2 * conc * R.topk + 4 * int(R.policy["prefetch"].get("budget", 8)) + 8
    ram_slots = min(R.keys, R.ram_slots) + headroom
    try:
        return get_backend(name, st, ram_slots=ram_slots, vram_slots=R.vram_slots, verify_rate=verify_rate)
    except BackendUnavailable as e:
        raise UserError(str(e)) from None


def run(R, store, backend, trace, conc: int = 1, *, max_steps: int = 0, seed: int = 0, keep_outputs: bool = False,
        layer_hook=None, plan_hook=None, step_hook=None, progress=None, router=None) -> dict:
    """Run ``conc`` streams for the simulator's warm + measured steps (measured capped at max_steps).

    ``router`` (moetier.run.contract.Router) picks each row's experts from its hidden state; the default replays
    the trace (TraceRouter), which keeps every plan identical to the simulator's. Another router - the backend's
    own, ``router=backend`` - routes live; prefetch predicts from the trace, so a live run needs prefetch off."""
    seed_mode = R.policy.get("seed", "warmup")
    warmup_tokens = int(R.policy.get("warmup_tokens", 1000))
    offsets, warm_steps, measured, wtok = _segment_plan(trace, conc, 1, seed_mode, warmup_tokens)
    if max_steps:
        measured = min(measured, max_steps)
    E, Lr, K, H = R.experts, R.layers, R.topk, store.layout.hidden
    streams = Streams(trace, conc, K, E, offsets=offsets)
    rt = Runtime(R, store, backend, conc)
    if router is None:
        router = TraceRouter(trace, streams, K)
    elif rt.rp.prefetching:
        raise UserError(f"recipe {R.id}: live routing needs policy.prefetch.depth 0 (prefetch predicts from the "
                        f"trace, not from the live router's picks)")
    if seed_mode == "oracle":
        rt.seed_tiers(rank_keys(trace.ids[:, :, :K], E))
    elif seed_mode == "warmup" and wtok:
        rt.seed_tiers(rank_keys(np.concatenate([trace.segment(s)[:wtok, :, :K] for s in range(trace.nseg)]), E))
    elif R.ram_slots >= R.keys:
        rt.seed_tiers([])
    rp, L = rt.rp, rt.L
    rp.settle()                       # seeding's pushes are not decode traffic
    fixed_layer = R.fixed(conc) / Lr
    digests, outputs = [], []
    t_model = 0.0
    wall_meas = 0.0
    st0 = None
    for step in range(warm_steps + measured):
        meas = step >= warm_steps
        if meas and st0 is None:
            st0 = dict(rt.stats)
            rt.call_groups.clear()
            backend.begin_measured()   # read latencies and wake-ups of the measured steps only (not seeding's)
        rp.begin_step(step)
        rows = streams.rows(step)
        x = np.stack([token_state(H, i, t, seed) for i, t in rows])
        w0 = time.perf_counter()
        for layer in range(Lr):
            t_model += fixed_layer
            ids, rows_w = router.route(layer, x, rows)
            base = layer * E
            rows_keys = [[base + int(e) for e in r] for r in ids]
            xin = x
            y, plan, picks = rt.layer(layer, rows_keys, rows_w, x, t_model, streams, rows)
            x = rmsnorm(x + y)
            if plan_hook is not None:
                plan_hook(step, layer, plan)
            if layer_hook is not None:
                layer_hook(step, layer, xin, y, rows_keys, rows_w, rt)
            rp.after_layer(picks)
            t_model += plan.ms + sum(rp.settle())
            rt.end_layer()
        if meas:
            wall_meas += time.perf_counter() - w0
        digests.append(hashlib.blake2b(x.tobytes(), digest_size=8).hexdigest())
        if step_hook is not None:
            step_hook({"kind": "counters", "t": time.time(), "step": step, "measured": meas, "conc": conc,
                       "tokens": conc, "step_wall_s": time.perf_counter() - w0, **rt.stats})
        if keep_outputs:
            outputs.append(x.copy())
        if progress is not None:
            progress(step, warm_steps + measured)
    rt.close()
    st = {k: rt.stats[k] - st0[k] for k in rt.stats}
    tokens = measured * conc
    per_tok = lambda s: 1000.0 * s / tokens  # noqa: E731
    return {
        "conc": conc, "steps": measured, "warm_steps": warm_steps, "tokens": tokens,
        "tok_s": tokens / wall_meas if wall_meas else 0.0,
        "ms_per_token": 1000.0 * wall_meas / tokens,
        "lanes_ms_per_token": {"cpu": per_tok(st["lane_cpu_s"]), "gpu": per_tok(st["lane_gpu_s"]),
                               "zerocopy": per_tok(st["lane_zc_s"]), "nvme_wait": per_tok(st["nvme_wait_s"]),
                               "copy": per_tok(st["copy_s"] + st["stage_s"]),
                               "plan": per_tok(st["plan_s"] + st["predict_s"]),
                               "bookkeeping": per_tok(st["book_s"]),
                               "combine": per_tok(st["combine_s"])},
        "reads_per_token": st["nvme_picks"] / tokens,            # picks served from NVMe (the sim's nvme_per_tok)
        "prefetch_reads_per_token": st["prefetch_reads"] / tokens,
        "masked_per_token": st["masked"] / tokens,
        "lossy": st["masked"] > 0,
        "checksum_failures": int(rt.be.stats.get("checksum_failures", 0)),
        "checksum_checked": int(rt.be.stats.get("checksum_checked", 0)),
        "digests": digests,
        "outputs": outputs if keep_outputs else None,
        "ledger": dict(L.counters),
        "counters": st,
        "call_groups": [[*k, n, sec] for k, (n, sec) in sorted(rt.call_groups.items())],
        "wall_s": wall_meas,
    }
