"""One layer carried out for real: the simulator's plan, executed on a backend with real bytes and real kernels.

Contract
--------
``Runtime(R, store, backend, conc, retries=, wait_timeout_s=)`` checks that the backend can run recipe R (encoding,
VRAM slots, lanes, an exclusive RAM tier) and keeps the simulator's ledger and replay state (``Replay``). Per layer,
``layer(...)`` calls ``plan_layer`` on the *modeled* clock - so its plan decisions are exactly the simulator's (plan
parity) - then carries the plan out:

1. demand NVMe reads are issued (``begin_fill`` ticket + ``backend.fill`` handle) before any compute;
2. the resident lanes compute (cpu in place from RAM slots; gpu from VRAM slots; zerocopy from RAM slots);
3. with prefetch, the reads for the layers ahead are issued (``Replay.after_plan``);
4. the plan's residency intents run in the simulator's order, each ``Ledger.land`` only after ``backend.landed``
   reported the bytes readable (moetier.run.waits: retries, stall timeout, one-line stop); NVMe picks compute from
   where they landed, a pick the RAM tier does not admit streams through its slot;
5. the router-weighted sum over each row's picks (fixed order: trace slot order) is returned.

Slot frees are deferred to the end of the layer (``end_layer``) so a slot is never reused while this layer may
still read it. ``seed_tiers`` places the hottest keys before the first step; ``close`` lets the reads still in
flight finish. The counters and per-call books are moetier.run.booking's; the step loop is moetier.run.runtime.
"""
from __future__ import annotations

import time

import numpy as np

from moetier.bytes.transport import TransportError
from moetier.core.plan import plan_layer
from moetier.core.predict import make_predictor
from moetier.core.sim import Replay
from moetier.errors import UserError
from moetier.run.booking import Booking, inner_s, new_stats
from moetier.run.waits import RETRIES, SlotAllocator, Waits


class Runtime(Waits, Booking):
    def __init__(self, R, store, backend, conc: int = 1, *, retries: int = RETRIES,
                 wait_timeout_s: float | None = None):
        self.R, self.store, self.be = R, store, backend
        self.retries, self.wait_timeout_s = int(retries), wait_timeout_s
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
        self.stats = new_stats()
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

    # -- one layer ----------------------------------------------------------------------------------------------
    def layer(self, layer: int, rows_keys, rows_w, x: np.ndarray, t_model: float, streams=None, rows=None):
        """rows_keys: per row the global keys of this layer (trace slot order); returns (y, plan, picks). With the
        step's ``streams`` and ``rows``, the prefetch for the layers ahead is issued after this layer's resident
        lanes, before its waits (Replay.after_plan)."""
        rp, st = self.rp, self.stats
        rows_of: dict[int, list] = {}
        for r, ks in enumerate(rows_keys):
            for k in ks:
                rows_of.setdefault(k, []).append(r)
        picks = {k: len(v) for k, v in rows_of.items()}
        c0 = time.perf_counter()
        armed = rp.arm(layer)          # the predictor runs on this layer (the plan charges its host time only then)
        plan = plan_layer(rp.ctx, self.L, picks, t_model, rp.chan, rp.llc, idle=rp.idle(t_model))
        c1 = time.perf_counter()
        st["plan_s"] += c1 - c0
        fresh = self._issue_demand(plan)       # 1. demand reads first, so the disk works while the lanes compute
        c2 = time.perf_counter()
        st["book_s"] += c2 - c1
        # a layer whose NVMe picks are all demand reads issued now: its first wait shows how much of a read the
        # work before it covered (read_coverage)
        prefetching = streams is not None and rp.prefetching
        predicting = prefetching and armed
        n_nvme = len(plan.nvme_cpu) + len(plan.nvme_gpu)     # reads in flight while the resident lanes compute
        issued = (c2, inner_s(st), fresh, int(predicting), len(rows) if predicting else 0) \
            if fresh and fresh == n_nvme else None
        out: dict[int, np.ndarray] = {}
        self._resident_lanes(plan, rows_of, picks, x, out, n_nvme)          # 2.
        if prefetching:                                                     # 3. prefetch for the layers ahead
            t_pred = time.perf_counter()
            rp.after_plan(layer, plan, streams, rows, t_model, on_expire=self.expire_real,
                          on_issue=self.issue_prefetch)
            if predicting:       # prediction + prefetch issue: host time (a dormant layer only expires)
                st["predict_s"] += time.perf_counter() - t_pred
                st["predict_layers"] += 1
                st["predict_rows"] += len(rows)
        # 4. residency intents, in the simulator's order (Replay.commit), each landing after its bytes did
        b0 = time.perf_counter()
        inner0 = inner_s(st)
        rp.touch(plan)
        issued = self._land_nvme_cpu(plan, rows_of, picks, x, out, issued)
        if rp.ctx.can_admit:
            for k in plan.zerocopy:
                tp = self.L.begin_push(k, picks)
                if tp is not None:
                    rp.admissions += 1
                    self._push_now(k, tp, picks)
        self._land_nvme_gpu(plan, rows_of, picks, x, out, issued)
        self._drains(picks)
        st["book_s"] += time.perf_counter() - b0 - (inner_s(st) - inner0)   # waits and lanes inside: booked to them
        self._count_layer(plan, picks, n_nvme)
        return self._combine(plan, rows_keys, rows_w, rows_of, out, x), plan, picks

    def _issue_demand(self, plan) -> int:
        """Issue the reads of the plan's NVMe picks (a queued prefetch of one is re-issued as a demand read; one
        already reading is kept); returns how many were issued now."""
        L, be, rp = self.L, self.be, self.rp
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
                self.stats["reads"] += 1
                fresh += 1
        return fresh

    def _resident_lanes(self, plan, rows_of, picks, x, out, n_nvme: int) -> None:
        """The lanes over resident picks (cpu from RAM, gpu from VRAM, zerocopy from RAM), with the NVMe reads in
        flight. A reader worker needs the interpreter to start a read, and gets it once a lane's kernel releases
        it: host work before the first lane call delays the reads."""
        st = self.stats
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

    def _land_nvme_cpu(self, plan, rows_of, picks, x, out, issued):
        """Each cpu-lane NVMe pick: wait for its read, land it in the RAM tier, compute it where it landed. A pick
        the RAM tier does not admit - smaller than this layer's picks (every slot holds one) or without slots - is
        streamed through the slot it landed in, as the simulator streams it. Returns ``issued`` (None once used)."""
        L = self.L
        for k in plan.nvme_cpu:
            tk, h, slot = self.inflight.pop(k)
            waited = self._wait_read(h, tk, issued, (k, slot))
            issued = None
            self.ram_slot[k] = slot
            if tk.staging:                   # a prefetch landed in the landing ring: adopt it into RAM
                L.land(tk)
                evicted = L.adopt(k, picks)
            else:
                evicted = L.land(tk, picks)
            for ev in evicted:
                if ev != k:
                    self._release_ram(ev)
            self._compute("cpu", [k], rows_of, picks, x, out, waited=waited)
            if not L.resident(k):
                self._release_ram(k)
        return issued

    def _land_nvme_gpu(self, plan, rows_of, picks, x, out, issued) -> None:
        """Each gpu-lane NVMe pick: wait for its read into a staging slot, push it to VRAM and compute it there; with
        no unpinned VRAM slot, compute it from the staging slot and drop it."""
        L, be = self.L, self.be
        for k in plan.nvme_gpu:
            tk, h, slot = self.inflight.pop(k)
            self._wait_read(h, tk, issued, (k, slot))
            issued = None
            L.land(tk)
            self.ram_slot[k] = slot
            tp = L.begin_push(k, picks)
            if tp is None:
                self._compute("zerocopy" if be.capabilities.has("zerocopy") else "cpu", [k], rows_of, picks, x, out)
                L.drop_staged(k)
                self._release_ram(k)
            else:
                self._push_now(k, tp, picks, "stage_s")
                self._compute("gpu", [k], rows_of, picks, x, out)

    def _count_layer(self, plan, picks, n_nvme: int) -> None:
        st = self.stats
        st["cpu_bytes"] += (len(plan.cpu) + len(plan.nvme_cpu)) * self.store.layout.weight_bytes
        st["masked"] += len(plan.masked)
        st["nvme_picks"] += n_nvme
        st["nvme_layers"] += int(n_nvme > 0)
        st["picks"] += len(picks)
        st["layer_calls"] += 1

    def _combine(self, plan, rows_keys, rows_w, rows_of, out, x) -> np.ndarray:
        """5. The router-weighted sum over each row's picks in trace slot order (the same order whatever lane
        computed each pick); masked picks add nothing."""
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
        self.stats["combine_s"] += time.perf_counter() - t
        return y

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
        for _, h, _ in self.inflight.values():     # each wait bounded by wait_timeout_s, and the fence too
            self._quiet(h)
        for h, _ in self.wasted:
            self._quiet(h)
        self._fence()
        for _, slot in self.wasted:
            self.ram.release_later(slot)
        self.wasted.clear()
