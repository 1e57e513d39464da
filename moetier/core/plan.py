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
"""
from __future__ import annotations

from moetier.core.arrivals import INF, Finish
from moetier.core.channel import NvmeChannel
from moetier.core.ledger import ABSENT, PUSHING, RAM, VRAM
from moetier.core.lanes import hands_off, idle_wake
from moetier.core.terms import PlanContext

__all__ = ["LayerPlan", "NvmeChannel", "PlanContext", "plan_layer"]


class LayerPlan:
    """The lane of every pick (lists of keys), modeled NVMe arrivals, lane busy times and the layer cost (ms)."""

    __slots__ = ("gpu", "zerocopy", "cpu", "nvme_cpu", "nvme_gpu", "masked", "arrivals", "demand_reads", "gpu_ms",
                 "cpu_ms", "nvme_wait_ms", "gpu_wait_ms", "ms", "cpu_cold", "issue_ms",
                 "head_ms", "cpu_crit", "wait_from", "split_end", "t0")

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

    def lanes(self) -> dict:
        return {"gpu": self.gpu, "zerocopy": self.zerocopy, "cpu": self.cpu, "nvme_cpu": self.nvme_cpu,
                "nvme_gpu": self.nvme_gpu, "masked": self.masked}


def _gpu_ms(ctx, vram_l, picks, reads: int = 0) -> float:
    """The gpu lane's call over the VRAM picks, with ``reads`` NVMe reads of the layer in flight meanwhile (each
    costs it gpu_read, and any at all gpu_busy once)."""
    pl, pe, px = ctx.gpu
    g = pl + ctx.gpu_read * reads + ctx.gpu_busy if reads else pl
    for k in vram_l:
        g += pe + px * (picks[k] - 1)
    return g


def _ram_lanes(ctx, ram_l, g, llc, cpu_list, zc_list, force=None, reads: int = 0, wake: float = 0.0):
    """Deal the RAM picks (``ram_l``: (rows, key), heaviest first) to the cpu or zerocopy lane, each where the layer
    ends sooner on ``ctx``'s costs - or, with ``force`` (the keys already dealt to the cpu lane), as dealt, only
    timed on them. Appends to the two lists; returns (g, c, the cpu batch's cold-expert equivalents, its longest
    share's (cold, extra rows) if the call is split else None). A split call deals its batch out strided
    (spec.deal: thread i takes experts i, i + W, ...) and ends with its longest share, plus the hand-off when a
    worker's share is as long as the caller's by count (spec.hands_off). ``reads``: the layer's NVMe
    reads in flight during the zerocopy call (ctx.zc_read each, and ctx.zc_busy once if any; the cpu lane's share is
    booked by the caller).
    ``wake``: the idle units of the split call's worker (spec.idle_wake), ctx.cpu_wake each."""
    cpl, cpe, cpx = ctx.cpu if ctx.cpu else (INF, INF, 0.0)
    cpl += ctx.cpu_wake * wake
    zpl, zpe, zpx = ctx.zerocopy if ctx.zerocopy else (INF, INF, 0.0)
    if reads:
        zpl += ctx.zc_read * reads + ctx.zc_busy
    W, pmin, cpc, hoff = ctx.cpu_workers, ctx.cpu_pmin, ctx.cpu_call, ctx.cpu_handoff
    if W == 1 and force is None:
        return _ram_lanes_one(ram_l, g, llc, cpu_list, zc_list, cpl, cpe, cpx, zpl, zpe, zpx, pmin, cpc)
    c, zc_on = 0.0, False
    n_c, work_c = 0, 0.0              # the cpu batch so far: experts and summed one-thread work
    shares, crit = [0.0] * W, 0.0     # per thread of a split call: its work; the longest
    share_cold, share_extra = [0.0] * W, [0] * W
    factor = llc.factor if llc is not None else None
    dealt = force is not None
    to_c, to_z = cpu_list.append, zc_list.append
    f = 1.0
    for m, k in ram_l:
        if factor is not None:
            f = factor(k)
        w = cpe * f + cpx * (m - 1) if m > 1 else cpe * f
        work1 = work_c + w
        n1 = n_c + 1
        i = n_c % W
        s_i = shares[i] + w
        if n1 < pmin:
            ce = cpc + work1
        else:
            ce = cpl + (s_i if s_i > crit else crit)
            if hoff and hands_off(n1, W):
                ce += hoff
        ge = (g if zc_on else g + zpl) + zpe
        if m > 1:
            ge += zpx * (m - 1)
        if (k in force) if dealt else (ce if ce > g else g) <= (c if c > ge else ge):
            c = ce
            n_c, work_c = n1, work1
            shares[i] = s_i
            if s_i > crit:
                crit = s_i
            share_cold[i] += f
            share_extra[i] += m - 1
            to_c(k)
        else:
            g = ge
            zc_on = True
            to_z(k)
    if n_c < pmin or not n_c:
        return g, c, sum(share_cold), None
    i = shares.index(crit)
    return g, c, sum(share_cold), (share_cold[i], share_extra[i])


def _ram_lanes_one(ram_l, g, llc, cpu_list, zc_list, cpl, cpe, cpx, zpl, zpe, zpx, pmin, cpc):
    """_ram_lanes for a cpu lane of one thread dealing on its own costs: the same deal and times, without the
    per-thread shares (one thread's share is the batch's work; a split call never hands off, spec.hands_off). The
    hot case: it runs once per layer call."""
    c, zc_on = 0.0, False
    n_c, work_c, crit, cold, extra = 0, 0.0, 0.0, 0.0, 0
    factor = llc.factor if llc is not None else None
    to_c, to_z = cpu_list.append, zc_list.append
    f = 1.0
    for m, k in ram_l:
        if factor is not None:
            f = factor(k)
        ge = g if zc_on else g + zpl
        if m > 1:
            w = cpe * f + cpx * (m - 1)
            ge = ge + zpe + zpx * (m - 1)
        else:
            w = cpe * f
            ge = ge + zpe
        work1 = work_c + w
        if n_c + 1 < pmin:
            ce = cpc + work1
        else:
            ce = cpl + (work1 if work1 > crit else crit)
        if (ce if ce > g else g) <= (c if c > ge else ge):
            c = ce
            n_c += 1
            work_c = work1
            if work1 > crit:
                crit = work1
            cold += f
            extra += m - 1
            to_c(k)
        else:
            g, zc_on = ge, True
            to_z(k)
    return g, c, cold, (cold, extra) if n_c and n_c >= pmin else None


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
    plan = LayerPlan()
    plan.t0 = t0
    ram_l, nvme_l = _by_tier(ledger, picks, plan.gpu)
    vram_l = plan.gpu
    reads = 0 if ctx.mask else len(nvme_l)     # the layer's reads in flight while its resident lanes compute
    g = _gpu_ms(ctx, vram_l, picks, reads) if vram_l else 0.0
    g_on = bool(vram_l)   # gpu lane has work: its per_layer is paid
    c = 0.0
    c_on = False
    if ram_l:
        if len(ram_l) > 1:
            ram_l.sort(reverse=True)      # heaviest first; ties by key (descending) keep it deterministic
        # the log only where a lane pays for it (most recipes' cpu lane has no wake-up term)
        wake = idle_wake(idle) if ctx.cpu_wake else 0.0
        g, c, plan.cpu_cold, plan.cpu_crit = _ram_lanes(ctx, ram_l, g, llc, plan.cpu, plan.zerocopy,
                                                        set(lanes.cpu) if lanes is not None else None, reads, wake)
        c_on = bool(plan.cpu)
        if plan.cpu_crit is not None:     # the lanes start at t0 and the runtime runs the cpu lane's call first
            plan.split_end = t0 + c

    plan.issue_ms = c if ctx.overlap else g + c
    if nvme_l:
        if ctx.mask:
            plan.masked = nvme_l
        else:
            g, c = _nvme_lanes(ctx, plan, ledger, picks, nvme_l, t0, nvme, g, g_on, c, c_on, lanes)
    c, serial = _serial_host(ctx, plan, len(picks), nvme, c, c_on)
    plan.gpu_ms, plan.cpu_ms = g, c
    if ctx.overlap:
        # the head is host work done before the first wait, while the reads are in flight: the host timeline (the
        # cpu lane's) ends no earlier than it, and it leaves the serial part
        h = plan.head_ms
        plan.ms = (g if g > c + h else c + h) + serial - h
    else:
        plan.ms = g + c + serial         # the serial timeline waited past the head already (_serial_nvme)
    if nvme_l and not ctx.mask:
        plan.ms += ctx.host_read * len(nvme_l) + ctx.host_nvme_layer
    return plan


def _check_deal(ctx, lanes) -> None:
    if ((lanes.cpu or lanes.nvme_cpu) and ctx.cpu is None or lanes.nvme_gpu and ctx.gpu is None
            or lanes.zerocopy and ctx.zerocopy is None):
        raise ValueError("plan_layer: lanes deal picks to a lane this recipe lacks")


def _by_tier(ledger, picks: dict, vram_l: list) -> tuple[list, list]:
    """Sort the picks by tier as the planner sees them (ledger._TIER_OF): VRAM keys onto ``vram_l``; returns the RAM
    picks as (rows, key) and the NVMe keys."""
    sget = ledger.state.get
    absent = RAM if ledger.all_in_ram else ABSENT    # state of a key the ledger does not track
    ram_l, nvme_l = [], []
    to_ram, to_vram, to_nvme = ram_l.append, vram_l.append, nvme_l.append
    for k, m in picks.items():
        s = sget(k, absent)
        if s == RAM:
            to_ram((m, k))
        elif s == VRAM:
            to_vram(k)
        elif s == PUSHING:
            to_ram((m, k))
        else:
            to_nvme(k)
    return ram_l, nvme_l


def _nvme_lanes(ctx, plan, ledger, picks, nvme_l, t0, nvme, g, g_on, c, c_on, lanes) -> tuple[float, float]:
    """Deal and time the NVMe picks (not masked) after the resident lanes; returns the lanes' (g, c)."""
    if c_on and ctx.read_cpu:
        c += ctx.read_cpu * len(nvme_l)      # the reads' CPU work lands while the cpu lane computes
    ahead = 0.0
    if ctx.copy_serial and plan.zerocopy:
        # the serial runtime pushes the zerocopy picks into VRAM (draining a victim first when VRAM is full, in an
        # exclusive ledger) before it waits for the gpu lane's reads
        full = ledger.exclusive and ledger.vram_full()
        ahead = len(plan.zerocopy) * (ctx.push_ms + ctx.host_copy) * (2 if full else 1)
    plan.head_ms = head = ctx.head_layer + ctx.head_read * len(nvme_l) + (ctx.head_predict if ctx.predicting else 0.0)
    _plan_nvme(ctx, plan, picks, nvme_l, t0, nvme, g, g_on, c, c_on, ahead, head,
               (lanes.nvme_cpu, lanes.nvme_gpu) if lanes is not None else None)
    return plan.gpu_ms, plan.cpu_ms


def _serial_host(ctx, plan, n_picks: int, nvme, c: float, c_on: bool) -> tuple[float, float]:
    """The layer's serial host time outside the lanes, and the cpu lane's end with the CPU work of the prefetch
    reads that ran since the last layer where the cpu lane computes (else that work is serial): (c, serial)."""
    # a masked pick is neither computed nor combined: the per-pick host work is the computed picks'
    serial = ctx.host_layer + ctx.host_pick * (n_picks - len(plan.masked))
    if ctx.predicting:
        serial += ctx.host_predict
    if plan.zerocopy:
        serial += ctx.host_zc_call
    if ctx.read_cpu and nvme is not None and nvme.pf_done:
        if c_on:
            c += ctx.read_cpu * nvme.pf_done
        else:
            serial += ctx.read_cpu * nvme.pf_done
        nvme.pf_done = 0
    return c, serial


def _plan_nvme(ctx, plan, picks, keys, t0, nvme, g, g_on, c, c_on, ahead=0.0, head=0.0, dealt=None):
    """``dealt``: (the NVMe picks dealt to the cpu lane, those dealt to the gpu lane), each in the order it runs,
    where another plan chose (plan_layer's ``lanes``); None: each pick goes, in arrival order, to the lane that
    ends it sooner on ctx's costs."""
    gpu, cpu = ctx.gpu, ctx.cpu
    if cpu is None and gpu is None:
        raise ValueError("no lane can compute an NVMe pick: the recipe needs a cpu lane or a VRAM tier")
    push = ctx.push_ms
    arr = plan.arrivals
    fresh = _arrivals(plan, keys, t0, nvme)
    can_gpu = gpu is not None      # a gpu lane exists only with a VRAM tier (from_recipe)
    if dealt is not None:
        order, to_cpu = dealt[0] + dealt[1], set(dealt[0])
    else:
        # arrival order; demand reads come back in issue order, so only promoted prefetches need a sort
        order = sorted(keys, key=arr.__getitem__) if len(keys) > 1 and len(fresh) < len(keys) else keys
        to_cpu = None
    wake = nvme.wake
    if not ctx.overlap:
        _serial_nvme(ctx, plan, picks, order, arr, t0, g, c, c_on, can_gpu, wake, nvme, ahead, head, to_cpu)
        return
    wait = gwait = 0.0
    spread = nvme.spread
    # the cpu lane is the host's: its NVMe picks start past the head (c is its end on the host timeline here, its
    # busy time once the head is taken off again below)
    c += head
    plan.wait_from = c
    # after a blocked wait the cpu lane resumes past the wake-up and then runs its call slower (per_after_wait_ms)
    cpu_resume = wake + ctx.cpu_after_wait
    if spread:
        cf, gf = Finish(c, nvme.cv_own), Finish(g, nvme.cv_own)
    for k in order:
        a = arr[k] - t0
        if a < 0.0:
            a = 0.0
        m = picks[k]
        if cpu:
            # the call is made once the bytes are there: its set-up follows the wait, it does not hide under it
            cs = c
            cw = (ctx.cpu_call if c_on or ctx.cpu_pmin > 1 else cpu[0]) + cpu[1] + cpu[2] * (m - 1)
            ce = cs + cw if cs >= a else a + cpu_resume + cw
        else:
            ce = INF
        if can_gpu:
            gs, ap, gw, ge = _gpu_end(gpu, g, g_on, a, m, wake, push)
        else:
            ge = INF
        if (ce if ce > g else g) <= (c if c > ge else ge) if to_cpu is None else k in to_cpu:
            if a > cs:
                wait += a + wake - cs
            if spread:
                cf.add(cs - c + cw, a + cpu_resume + cw, a)
            c = ce
            c_on = True
            plan.nvme_cpu.append(k)
        else:
            if ap > gs:
                wait += ap - gs
                gwait += ap - gs
            if spread:
                gf.add(gs - g + gw, a + wake + push + gw, a)
            g = ge
            g_on = True
            plan.nvme_gpu.append(k)
    if spread:
        dc, dg = cf.extra(nvme.cv_shared, nvme.lane_sd), gf.extra(nvme.cv_shared, nvme.lane_sd)
        c += dc
        g += dg
        wait += dc + dg
        gwait += dg
    plan.nvme_wait_ms = wait
    plan.gpu_wait_ms = gwait
    plan.gpu_ms, plan.cpu_ms = g, c - head


def _gpu_end(gpu, g, g_on, a, m, wake, push) -> tuple[float, float, float, float]:
    """An NVMe pick of m rows whose bytes are due at a, on the gpu lane busy until g: (when the lane could start it,
    when its bytes are in VRAM, its work, its end). The push follows the read, after the wake-up if the lane had
    to wait for it."""
    gs = g if g_on else g + gpu[0]
    ap = a + push if gs >= a else a + wake + push
    gw = gpu[1] + gpu[2] * (m - 1)
    return gs, ap, gw, (gs if gs > ap else ap) + gw


def _arrivals(plan, keys, t0, nvme) -> list:
    """Each NVMe pick's arrival into ``plan.arrivals``: its prefetch read where the channel has one started, else a
    demand read issued at t0. Returns the keys read on demand."""
    arr = plan.arrivals
    fresh = []
    for k in keys:
        a = nvme.claim(k, t0) if nvme.pf else None
        if a is None:
            fresh.append(k)
        else:
            arr[k] = a
    if fresh:
        for k, a in zip(fresh, nvme.demand(t0, len(fresh))):
            arr[k] = a
        plan.demand_reads = len(fresh)
    return fresh


def _serial_nvme(ctx, plan, picks, order, arr, t0, g, c, c_on, can_gpu, wake, nvme, ahead=0.0, head=0.0,
                 to_cpu=None):
    """NVMe picks when lanes do not overlap (policy.overlap false): one timeline after the resident lanes (c + g).

    Lanes: each pick, in arrival order, goes to the lane that ends it sooner (``to_cpu``: the picks another plan
    dealt to the cpu lane, the rest to the gpu lane, ``order`` theirs). Time, in the order the serial runtime
    runs them (moetier.run.runtime.Runtime.layer): the cpu lane's NVMe picks, each waiting for its bytes (and the
    wake-up and the cpu lane's after-wait cost, if it had to wait); then the admissions of the layer's zerocopy
    picks (``ahead`` ms of copies, booked by the simulator after the layer, not here: the gpu picks' reads land
    meanwhile); then the gpu lane's NVMe picks, whose push to VRAM follows the read and is booked as stall (read +
    stage); each is a lane call of its own, so it pays the gpu lane's per-call cost (``per_layer_ms``) every time.
    The host's ``head`` (its work before the first wait) runs after the resident lanes, before the first NVMe
    pick, in the reads' time. Each pick's work is added to its lane's busy time, so g + c is the timeline's end
    less ``ahead`` and the head. The arrival spread (``Finish``) adds to the lane of the timeline's last pick."""
    push = ctx.push_ms
    due = {k: (arr[k] - t0 if arr[k] > t0 else 0.0) for k in order}    # arrival, from the layer's start
    if to_cpu is not None:
        plan.nvme_cpu += [k for k in order if k in to_cpu]
        plan.nvme_gpu += [k for k in order if k not in to_cpu]
    else:
        _serial_deal(ctx, plan, picks, order, due, g, c, c_on, head, wake, can_gpu)
    now = plan.wait_from = g + c + head
    wait = gwait = 0.0
    spread = nvme.spread
    fin = Finish(now, nvme.cv_own) if spread else None
    for on_gpu, keys in ((False, plan.nvme_cpu), (True, plan.nvme_gpu)):
        if on_gpu and keys and ahead:
            now += ahead
            if spread:
                fin.shift(ahead)
        for k in keys:
            a, m = due[k], picks[k]
            ready = a + wake if a > now else a
            idle = ready - now if ready > now else 0.0
            if on_gpu:
                work, late = _gpu_call(ctx, m), 0.0
                step = idle + work
                wait += idle + push
                gwait += idle + push
                g += step
            else:     # a call right after a blocked wait pays late on top
                work, late = _cpu_call(ctx, c_on, m), ctx.cpu_after_wait
                step = idle + work + (late if idle else 0.0)
                wait += idle
                c += step
                c_on = True
            now += step
            if spread:
                fin.add(work, a + wake + late + work, a)
    d = fin.extra(nvme.cv_shared, nvme.lane_sd) if spread else 0.0
    if d:
        wait += d
        if plan.nvme_gpu:
            g += d
            gwait += d
        else:
            c += d
    plan.nvme_wait_ms = wait
    plan.gpu_wait_ms = gwait
    plan.gpu_ms, plan.cpu_ms = g, c


def _cpu_call(ctx, on: bool, m: int) -> float:
    """An inline cpu-lane call over one pick of m rows (the lane's per_layer if it is the lane's first)."""
    cpu = ctx.cpu
    return (ctx.cpu_call if on or ctx.cpu_pmin > 1 else cpu[0]) + cpu[1] + cpu[2] * (m - 1)


def _gpu_call(ctx, m: int) -> float:
    """The push, then the kernel: a gpu-lane call of its own (the serial runtime's), per_layer each."""
    gpu = ctx.gpu
    return ctx.push_ms + gpu[0] + gpu[1] + gpu[2] * (m - 1)


def _serial_deal(ctx, plan, picks, order, due, g, c, c_on, head, wake, can_gpu) -> None:
    """Deal the NVMe picks of a serial timeline, in arrival order, each to the lane that ends it sooner on the
    lane choice's own timeline (appends to plan.nvme_cpu / plan.nvme_gpu)."""
    has_cpu = ctx.cpu is not None
    lg, lc, lc_on = g, c, c_on
    for k in order:
        a, m = due[k], picks[k]
        now = lg + lc + head
        ready = a + wake if a > now else a
        start = now if now > ready else ready
        ce = start + _cpu_call(ctx, lc_on, m) + (ctx.cpu_after_wait if a > now else 0.0) if has_cpu else INF
        ge = start + _gpu_call(ctx, m) if can_gpu else INF
        if ce <= ge:
            lc, lc_on = ce - lg - head, True
            plan.nvme_cpu.append(k)
        else:
            lg = ge - lc - head
            plan.nvme_gpu.append(k)
