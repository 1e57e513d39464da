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

Streams beyond the trace's segments start at later tokens of them, so a trace supports at most as many streams as
it has tokens (``check_conc``: one start token each; more would replay the same tokens in lockstep and report
nothing new). The non-MoE time at a row count ``calibration.fixed_ms`` has no entry for is interpolated between the
entries around it, or extrapolated from the last two; the report says which (``fixed_basis``).

``prefill(R, prompt)`` is the closed-form prefill bound (compute vs PCIe vs NVMe per layer and chunk).

The executor the replay drives (``Replay``) and the lockstep picks (``Streams``, ``rank_keys``) live in
moetier.core.replay, shared with the runtime; they are importable from here too. Where moetier.core.step_kernel
covers the replay (and no ``plan_hook`` or ``choose`` asks for each layer's plan), each step's layers run in one
compiled call instead of layer by layer; the report is the same.
"""
from __future__ import annotations

import math
import time

from moetier.core.plan import LayerPlan
from moetier.core.predict import make_predictor
from moetier.core.replay import Replay, Streams, rank_keys, warmup_ids
from moetier.core.step_kernel import Steps
from moetier.errors import UserError

__all__ = ["ORACLE_WARM_STEPS", "Replay", "Streams", "prefill", "rank_keys", "run"]

ORACLE_WARM_STEPS = 200


def check_conc(trace, conc: int, flag: str = "--conc") -> None:
    """UserError unless ``trace`` supports ``conc`` streams (module contract)."""
    if conc > trace.tokens:
        raise UserError(f"{flag} {conc}: the trace holds {trace.tokens} tokens, so it supports at most "
                        f"{trace.tokens} streams, each starting at a token of its own (expected {flag} <= "
                        f"{trace.tokens}, or a longer trace)")


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
        warm = warmup_ids(trace, R.topk, wtok)
        ranked = rank_keys(warm, R.experts)
        rp.learn(warm)
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
        wire=None) -> dict:
    """Replay ``trace`` through recipe ``R`` at ``conc`` streams; returns the report dict (see module docstring).
    ``timeline``: also return, per measured step, the experts each tier served and the tiers' occupancy
    (``out["timeline"]``, _Timeline: a few integers a step, read from counters the replay keeps anyway)
    ``choose``: the recipe a predicted run planned on (moetier.measure.calibrate: the plan pass's terms): a replay of
    it on its own clock deals every pick to its lane, as that run did, and ``R``'s terms time the deal (_Dealer).
    ``wire(replay, streams, steps) -> order or None``: wires a row of ``moetier compare`` into the fresh replay
    before it is seeded (moetier.peers.rows.wiring: its ledger, admission and lane deal; its policy overrides are the
    caller's to apply to ``R``); ``order(ranked keys) -> keys`` reorders the warm-up seed."""
    seed_mode = R.policy.get("seed", "warmup")
    if seed_mode not in ("warmup", "oracle", "none"):
        raise ValueError(f"policy.seed: expected 'warmup', 'oracle' or 'none', got {seed_mode!r}")
    warmup_tokens = int(R.policy.get("warmup_tokens", 1000))
    check_conc(trace, conc)
    offsets, warm_steps, measured, wtok = _segment_plan(trace, conc, window, seed_mode, warmup_tokens)
    if max_steps:
        measured = min(measured, max_steps)
    topk, E, L = R.topk, R.experts, R.layers
    streams = Streams(trace, conc, topk, E, offsets=offsets, window=window, span=(warm_steps + measured) * window)

    predictor = make_predictor(R.policy, L, E)
    nrows = conc * window
    rp = Replay(R, predictor=predictor, rows=nrows)
    order = wire(rp, streams, warm_steps + measured) if wire is not None else None
    _seed(rp, trace, seed_mode, wtok, order)
    dealer = _Dealer(choose, trace, seed_mode, wtok, nrows, draft_ms) if choose is not None else None

    fixed_step = R.fixed(nrows)
    f_layer = fixed_step / L
    acc = dict(ms=0.0, fixed=0.0, gpu=0.0, cpu=0.0, wait=0.0, gwait=0.0, copy=0.0, picks=0, vram_picks=0,
               gpu_exp=0, cpu_exp=0, zc=0, ncpu=0, ngpu=0, masked=0, demand=0, layers=0, rl=0, span=0.0, arr=0.0,
               gap_sq=0.0, gap_var=0.0, predict=0)
    t = 0.0
    total = warm_steps + measured
    t_wall = time.perf_counter()
    tl = _Timeline(rp.ledger) if timeline else None
    chan = rp.chan
    cv2, lane_var = chan.cv_own ** 2 + chan.cv_shared ** 2, chan.lane_sd ** 2
    # every layer of a step in one compiled call where it covers the replay (moetier.core.step_kernel)
    steps = Steps.of(rp, streams) if dealer is None and plan_hook is None else None
    for step in range(total):
        meas = step >= warm_steps
        if meas and step == warm_steps:
            pf0 = _pf_counters(rp)
        rp.begin_step(step)
        if dealer is not None:
            dealer.begin_step(step)
        rows = streams.rows(step)
        t0_step = t
        t += draft_ms
        if steps is not None:
            t = steps.step(rows, t, meas)
            if meas:
                steps.books(acc)
        else:
            t = _layers(rp, dealer, streams, rows, step, t, meas, acc, plan_hook, (f_layer, cv2, lane_var))
        if meas:
            acc["ms"] += t - t0_step
            acc["fixed"] += fixed_step
            if tl is not None:
                tl.step(acc, t - t0_step)
        if progress is not None and step % 64 == 0:
            progress(step, total)
    wall = time.perf_counter() - t_wall
    out = {"recipe": R.id, "conc": conc, "window": window, "accept": accept, "seed": seed_mode,
           "steps": measured, "warm_steps": warm_steps, "tokens": measured * conc * accept,
           "fixed_basis": R.fixed_basis(nrows)}
    out.update(_report(R, rp, acc, pf0, measured, out["tokens"]))
    out["layer_plans"], out["sim_seconds"] = total * L, wall
    if tl is not None:
        out["timeline"] = tl.series
    return out


def _layers(rp: Replay, dealer, streams, rows, step: int, t: float, meas: bool, acc: dict, plan_hook,
            terms: tuple) -> float:
    """run's per-layer path over one step's layers from clock ``t``: each layer planned and committed through the
    replay (and the dealer's deal), timed and booked; returns the clock after the last layer. ``terms``: (f_layer,
    cv2, lane_var)."""
    f_layer, cv2, lane_var = terms
    copy_serial = rp.ctx.copy_serial
    for layer in range(rp.R.layers):
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
            acc["predict"] += rp.ctx.predicting
    return t


def _pf_counters(rp: Replay) -> dict:
    """The replay's prefetch and demand-read counters, read when the measured part starts and when it ends."""
    c = rp.chan
    return {"used": rp.pf_used, "issued": c.pf_reads, "wasted": c.pf_wasted, "cancelled": c.pf_cancelled,
            "reads": c.reads, "beside": c.reads_beside_pf}


def _report(R, rp: Replay, acc: dict, pf0: dict, measured: int, tokens: float) -> dict:
    """run's figures from its accumulators over ``measured`` steps and ``tokens`` tokens, and the prefetch counters
    since ``pf0``."""
    pf = {k: v - pf0[k] for k, v in _pf_counters(rp).items()}
    nvme_picks = acc["ncpu"] + acc["ngpu"]
    return {
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
            "predictor": getattr(rp.predictor, "name", "none"),
            # the measured layers the predictor ran on (a dormant one does not: Replay.arm), as the runtime counts
            # them (counters.predict_layers), and their share of all measured layers
            "predict_layers": acc["predict"],
            "predict_share": acc["predict"] / (measured * R.layers) if measured else 0.0,
            "issued_per_tok": pf["issued"] / tokens,
            **_precision_recall(pf["used"], pf["issued"], nvme_picks),
            "cancelled": pf["cancelled"],
            "wasted_reads": pf["wasted"],
            "wasted_bytes": pf["wasted"] * R.nvme_expert_bytes,
            # of the demand reads, those issued while a prefetch read was in service (they share the device; the
            # runtime's reader marks the same, Completion.pf_busy)
            "demand_reads": pf["reads"],
            "demand_reads_beside": pf["beside"],
        },
        "ledger": dict(rp.ledger.counters),
    }


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
