"""The scheduler: plan_layer picks the lane that computes each pick of one MoE layer call.

Contract
--------
``plan_layer(ctx, ledger, picks, t0, nvme, llc=None, lanes=None, idle=0.0)`` takes ``picks`` = {key: m} (m =
token rows routed to that expert in this layer call), the layer start time ``t0`` (ms, the caller's clock), the
NVMe channel, the host cache model (moetier.core.llc: a RAM pick recently used costs the cpu lane less; read only here)
and how long the cpu lane's worker has idled (a split call wakes it: spec.idle_wake), and returns a
``LayerPlan``: the lane of every pick, each lane's busy time and the layer cost (max over lanes when lanes overlap,
their sum when they do not). It reads residency but never changes it: the plan's lists are residency *intents*
that the executor carries out through ledger tickets once bytes have landed. The NVMe channel is a model of the
read queue (time reservations), shared by demand reads and prefetch.

Lanes: gpu (VRAM hit), zerocopy (GPU kernel reading the host copy), cpu (RAM in place), nvme_cpu (read -> RAM ->
cpu), nvme_gpu (read -> push -> VRAM -> gpu), masked (NVMe picks dropped in the lossy ``mask`` mode).
Split: greedy min-max, heaviest picks first; a pick goes to the cpu unless that raises the layer's max more than
sending it to the GPU would (ties go to the cpu, which keeps VRAM churn down). A lane's per_layer cost (launch,
handoff) is charged only when that lane gets work.

The arithmetic is one compiled call per layer (moetier.core.plan_kernel), which also gathers its inputs: the picks'
tiers off the ledger, the NVMe picks' demand reads on the channel's terms, the host cache's distances
(moetier.core.plan_gather). This module packs the picks and the call's scalars, takes a prefetching channel's
claimed arrivals first, books the reads the kernel issued on the channel, and turns its outputs into the LayerPlan.
"""
from __future__ import annotations

from itertools import compress
from struct import pack, unpack_from

import numpy as np

from moetier.core import plan_gather as G
from moetier.core import plan_kernel as K
from moetier.core.channel import T_N, NvmeChannel
from moetier.core.terms import PlanContext
from moetier.core.tickets import RAM, TIER_NVME, TIER_OF

__all__ = ["LayerPlan", "NvmeChannel", "PlanContext", "plan_layer"]


class LayerPlan:
    """The lane of every pick (lists of keys), modeled NVMe arrivals, lane busy times and the layer cost (ms)."""

    __slots__ = ("gpu", "zerocopy", "cpu", "nvme_cpu", "nvme_gpu", "masked", "arrivals", "demand_reads", "gpu_ms",
                 "cpu_ms", "nvme_wait_ms", "gpu_wait_ms", "ms", "cpu_cold", "issue_ms",
                 "head_ms", "cpu_crit", "wait_from", "split_end", "t0", "packed")

    def __init__(self):
        self.gpu, self.zerocopy, self.cpu, self.nvme_cpu, self.nvme_gpu, self.masked = [], [], [], [], [], []
        self.arrivals: dict = {}
        self.demand_reads = 0
        self.cpu_cold = 0.0        # the cpu lane's RAM picks in cold-expert equivalents (host cache, moetier.core.llc)
        # a split batch: (cold-expert equivalents, extra rows) of its longest share, what the call's time follows
        self.cpu_crit = None
        self.split_end = None      # a split call: when it ends (the caller's clock), its worker idle from then on
        # wait_from: when the host, past its lanes, the reads' contention and its head, first waits for a read
        self.wait_from = 0.0
        # gpu_wait_ms: the part of nvme_wait_ms spent on the gpu lane (read + push of NVMe -> VRAM picks)
        self.gpu_ms = self.cpu_ms = self.nvme_wait_ms = self.gpu_wait_ms = self.ms = 0.0
        # issue_ms: when the host, past the resident lanes it runs itself, issues the prefetch for the layers ahead
        self.issue_ms = 0.0
        # head_ms: the host work past issue_ms and before the first wait for an NVMe pick (PlanContext.head_layer)
        self.head_ms = 0.0
        self.t0 = 0.0              # the clock the layer was planned at: arrivals and split_end are on it
        # the planner kernel's lanes as it wrote them (moetier.core.plan_kernel's O), what the ledger's compiled
        # commit reads; None on a plan the kernel did not make
        self.packed = None

    def lanes(self) -> dict:
        return {"gpu": self.gpu, "zerocopy": self.zerocopy, "cpu": self.cpu, "nvme_cpu": self.nvme_cpu,
                "nvme_gpu": self.nvme_gpu, "masked": self.masked}


NO_NVME_LANE = "no lane can compute an NVMe pick: the recipe needs a cpu lane or a VRAM tier"
_ON_NVME = tuple(t == TIER_NVME for t in TIER_OF)     # by ledger state: the pick must be read first
_NO_DEAL = np.empty(0, np.int64)
_NO_CHANNEL = (0.0,) * 6
_NO_TERMS = np.zeros(T_N)             # no channel: no reads (a recipe without an NVMe tier has no NVMe picks)


def plan_layer(ctx: PlanContext, ledger, picks: dict, t0: float, nvme: NvmeChannel | None,
               llc=None, lanes: LayerPlan | None = None, idle: float = 0.0) -> LayerPlan:
    """Plan one layer call. See the module docstring for the contract. ``llc``: the host cache model
    (moetier.core.llc.ReuseModel) or None; a RAM pick costs the cpu lane per_expert x its reuse factor. ``lanes``: a
    plan of the same picks and tiers made elsewhere (on other terms and another clock) whose lane deal this plan
    keeps, only timing it on ``ctx``'s terms: a calibration predicting a run times the decisions that run made
    (sim.run's ``choose``); None: ``ctx`` deals. ``idle``: ms since the cpu lane's last split call ended
    (sim.Replay.idle), what waking its worker costs a split call (spec.idle_wake); the plan's ``split_end`` is
    when this layer's split call ends, if it makes one."""
    if lanes is not None:
        _check_deal(ctx, lanes)
    P = ctx.__dict__.get("_packed")
    if P is None:
        P = K.pack(ctx)
        ctx.__dict__["_packed"] = P        # dropped when a term changes (PlanContext.__setattr__)
    # made without __init__: the kernel's outputs set every slot once (the runtime plans on cold caches)
    plan = LayerPlan.__new__(LayerPlan)
    plan.arrivals, plan.demand_reads = {}, 0
    n = len(picks)
    arrivals = ()
    if nvme is None:
        ch, busy, out, kt = _NO_CHANNEL, 0.0, (), _NO_TERMS
    else:
        if nvme.demand_only:           # the kernel issues the demand reads (plan_gather)
            busy, out = nvme.dfree, nvme.outstanding
        else:                          # claiming a prefetch read counts it in pf_done
            busy, out = 0.0, ()
            arrivals = _claimed(plan, ctx, ledger, picks, t0, nvme)
        ch, kt = (*nvme.terms, nvme.pf_done), nvme.kt
    # the serial copies double where the VRAM tier is full (the kernel adds: and the layer reads from NVMe)
    full = ctx.copy_serial and ledger.exclusive and ledger.vram_full()
    # one buffer of raw bytes: struct converts Python numbers faster than numpy does, and the kernel reads it in place
    X = (t0, idle if ctx.cpu_wake else 0.0, *ch, plan.demand_reads, ctx.predicting, full, bool(arrivals),
         llc is not None, ledger.all_in_ram, busy, 0 if llc is None else llc.clock, len(out), n, *out, *arrivals,
         *(() if llc is None else llc.curve), *picks, *picks.values())
    # the kernel writes into one array made here and returns the times as a tuple: arrays it returned would be boxed
    # by numba's runtime, and each array operation here costs microseconds where the runtime plans, right after the
    # expert compute has evicted the host's caches (benchmarks/cold.md)
    O = np.empty(6 + 3 * n, np.int64)
    r = G.plan_call(P, pack(f"{len(X)}d", *X), ledger.view, _deal(picks, lanes) if lanes is not None else _NO_DEAL, O,
                    kt, G.NO_LAST if llc is None else llc.last)
    if ctx.read_cpu and nvme is not None and nvme.pf_done:
        nvme.pf_done = 0              # the kernel charged the prefetch reads' CPU work (_serial_host)
    o = O.tolist()
    reads = int(r[K.R_N])
    if reads:
        if reads < 0:
            raise ValueError(NO_NVME_LANE)
        arr = unpack_from(f"{reads}d", O, 8 * (6 + 2 * n))
        nvme.issued(t0, arr)
        plan.arrivals = dict(zip(o[6 + n:6 + n + reads], arr))
        plan.demand_reads = reads
    _unpack(plan, o, r)
    plan.t0, plan.packed = t0, O
    return plan


def _claimed(plan, ctx, ledger, picks, t0, nvme) -> list:
    """The NVMe picks' arrivals off a channel with prefetch reads (``_arrivals``), in the order of ``picks``."""
    st = list(map(ledger.codes.__getitem__, picks))
    if ledger.all_in_ram:              # an absent key is in RAM, without bookkeeping
        st = [s or RAM for s in st]
    keys = list(compress(picks, map(_ON_NVME.__getitem__, st)))
    if not keys or ctx.mask:
        return ()
    if ctx.cpu is None and ctx.gpu is None:
        raise ValueError(NO_NVME_LANE)
    return _arrivals(plan, keys, t0, nvme)


def _check_deal(ctx, lanes) -> None:
    if ((lanes.cpu or lanes.nvme_cpu) and ctx.cpu is None or lanes.nvme_gpu and ctx.gpu is None
            or lanes.zerocopy and ctx.zerocopy is None):
        raise ValueError("plan_layer: lanes deal picks to a lane this recipe lacks")


def _arrivals(plan, keys, t0, nvme) -> list:
    """Each NVMe pick's arrival into ``plan.arrivals``: its prefetch read where the channel has one started, else a
    demand read issued at t0. Returns them in the order of ``keys``."""
    if not nvme.pf:                    # no prefetch read to claim: every pick is read on demand
        out = nvme.demand(t0, len(keys))
        plan.arrivals = dict(zip(keys, out))
        plan.demand_reads = len(keys)
        return out
    arr = plan.arrivals
    fresh = []
    for k in keys:
        a = nvme.claim(k, t0)
        if a is None:
            fresh.append(k)
        else:
            arr[k] = a
    if fresh:
        for k, a in zip(fresh, nvme.demand(t0, len(fresh))):
            arr[k] = a
        plan.demand_reads = len(fresh)
    return [arr[k] for k in keys]


def _deal(picks: dict, lanes: LayerPlan) -> np.ndarray:
    """The kernel's ``D`` for a forced deal: per pick, bit 1 on that plan's cpu lane, bit 2 on its nvme_cpu lane;
    then its NVMe picks as pick indices, in the order its lanes ran them."""
    cpu, nvme_cpu = set(lanes.cpu), set(lanes.nvme_cpu)
    pos = {k: i for i, k in enumerate(picks)}
    return np.array([(k in cpu) + 2 * (k in nvme_cpu) for k in picks]
                    + [pos[k] for k in lanes.nvme_cpu + lanes.nvme_gpu], np.int64)


def _unpack(plan: LayerPlan, o: list, r: list) -> None:
    """The kernel's lanes and times onto ``plan`` (every slot but t0, packed, arrivals and demand_reads)."""
    a = 6 + o[0]
    b = a + o[1]
    c = b + o[2]
    d = c + o[3]
    e = d + o[4]
    plan.gpu, plan.zerocopy, plan.cpu, plan.nvme_cpu, plan.nvme_gpu, plan.masked = \
        o[6:a], o[a:b], o[b:c], o[c:d], o[d:e], o[e:e + o[5]]
    (plan.gpu_ms, plan.cpu_ms, plan.ms, plan.nvme_wait_ms, plan.gpu_wait_ms, plan.issue_ms, plan.head_ms,
     plan.cpu_cold, plan.wait_from, cold, extra, split_end) = r[:K.R_N]
    plan.cpu_crit = (cold, int(extra)) if cold == cold else None          # NaN: not a split call
    plan.split_end = split_end if split_end == split_end else None
