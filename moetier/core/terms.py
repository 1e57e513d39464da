"""Typed terms: the recipe's and engines' measured figures, read once into dataclasses the planner and channel use.

Contract
--------
``PlanContext.from_recipe(R, rows)`` flattens what ``plan_layer`` needs from a resolved recipe (lane costs, host
terms, link, policy); ``ChannelTerms.at_rows(nvme, rows, engines, record_bytes, width)`` reads what the NVMe
channel (moetier.core.channel) needs at one rows per step. Each is built once per run from the resolved records:
a field is read by its name once, here, and the rest of the core reads attributes, so a misspelt name is an error,
never a silent 0. Per-rows measurements ({rows: value}, written by `moetier calibrate`) are interpolated between
measured rows in the layer's expected distinct experts (``layer_width``) and take the nearest outside. Each term's
default is what applies where its record field is absent.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields

from moetier.errors import UserError

INF = float("inf")

# ChannelTerms' scalar fields and the engine record fields ({rows: value}) they are read from
SCALAR_FIELDS = {"wake_ms": "nvme_wake_ms_by_rows", "cv_shared": "nvme_latency_cv_shared_by_rows",
                 "cv_own": "nvme_latency_cv_own_by_rows", "lane_sd": "lane_lateness_sd_ms_by_rows"}
_SCALAR_BY_RECORD = {v: k for k, v in SCALAR_FIELDS.items()}
# the per-rows channel terms an engine record carries beside its latency table, in the order calibrate writes them
CHANNEL_FIELDS = ("nvme_wake_ms_by_rows", "nvme_latency_cv_shared_by_rows", "nvme_latency_cv_own_by_rows",
                  "nvme_latency_by_rows_burst_ms", "lane_lateness_sd_ms_by_rows")


@dataclass
class ChannelTerms:
    """The NVMe channel's measured terms at one rows per step (moetier.core.channel.NvmeChannel). Each default is the
    model without the term; a value <= 0 where only a positive one means something is the default too."""

    # {q: ms}: completion time of a read that joins q outstanding ones (latency_table_for_rows); None: FIFO model
    latency_by_qd: dict | None = None
    wake_ms: float = 0.0       # a read landing to the lane blocked on it resuming (paid only by a lane that waited)
    cv_shared: float = 0.0     # a read's lateness / its latency: the part a layer's reads share ...
    cv_own: float = 0.0        # ... and each read's own
    lane_sd: float = 0.0       # the spread (ms) of when the host reaches a layer's first wait
    bursts: dict = field(default_factory=dict)      # {n: {q: ms}}: the q-th read's mean latency in a burst of n

    def __post_init__(self):
        for f in ("wake_ms", "cv_shared", "cv_own"):
            setattr(self, f, float(getattr(self, f)))
        self.lane_sd = float(self.lane_sd) if self.lane_sd and self.lane_sd > 0 else 0.0
        self.bursts = self.bursts or {}

    @classmethod
    def at_rows(cls, nvme: dict, rows: int, engines=(), record_bytes: int | None = None,
                width: tuple | None = None) -> "ChannelTerms":
        """The terms at ``rows`` token rows per step: the engine whose latency table applies, else the hardware's
        ``nvme`` block (its idle-disk table), else none."""
        at = (rows, engines, record_bytes, width)
        return cls(latency_by_qd=latency_table_for_rows(nvme, *at),
                   **{k: channel_term(f, *at) for k, f in SCALAR_FIELDS.items()},
                   bursts=burst_table_for_rows(*at))


@dataclass
class HostTerms:
    """The recipe's ``calibration.host`` terms (ms), 0 where absent (`moetier calibrate` fits them)."""

    per_layer_ms: float = 0.0
    per_pick_ms: float = 0.0
    per_read_ms: float = 0.0
    per_nvme_layer_ms: float = 0.0
    per_predict_ms: float = 0.0
    per_predict_row_ms: float = 0.0
    per_copy_ms: float = 0.0
    per_zc_call_ms: float = 0.0
    head_per_layer_ms: float = 0.0
    head_per_read_ms: float = 0.0
    head_per_predict_ms: float = 0.0
    head_per_predict_row_ms: float = 0.0

    @classmethod
    def of(cls, host: dict, where: str = "recipe") -> "HostTerms":
        known = {f.name for f in fields(cls)}
        bad = [k for k in host if k not in known and k != "source"]
        if bad:
            raise UserError(f"{where}: calibration.host.{bad[0]}: unknown host term "
                            f"(known: {', '.join(sorted(known))})")
        return cls(**{k: float(v) for k, v in host.items() if k in known})


def _engine_tables(engines, record_bytes) -> dict:
    """The engine record whose NVMe tables apply: the last of ``engines`` with ``nvme_latency_by_rows_qd_ms``
    measured under its load with records of ``record_bytes`` (a table for other record sizes does not apply)."""
    return next((e for e in reversed(list(engines)) if e.get("nvme_latency_by_rows_qd_ms")
                 and e.get("nvme_latency_record_bytes", record_bytes) == record_bytes), {})


def layer_width(rows: int, width: tuple | None = None) -> float:
    """The distinct experts a layer call of ``rows`` token rows computes, in expectation, with routing uniform over
    ``width`` = (experts, top-k): E (1 - (1 - k / E) ** rows). Without a width, ``rows`` (every pick distinct: the
    limit of many experts)."""
    if width is None:
        return float(rows)
    e, k = width
    return e * (1.0 - (1.0 - k / e) ** rows)


def _at_rows(by_rows: dict, rows: int, mix, width: tuple | None = None):
    """A per-rows measurement ({rows: value}) at ``rows``: between measured rows, linear in the layer's expected
    distinct experts (``layer_width``; ``mix(lo, hi, f)``), the nearest outside. What the reads measure under load
    follows the work the lanes do beside them, and that follows the experts a layer computes, not its rows: the
    64-expert top-4 model computes 4 / 7.7 / 14.1 distinct experts per layer call at rows 1 / 2 / 4, so rows 2 sits
    37% of the way from rows 1 to 4 (log(rows) would put it at 50%), about where measured depth-1 latencies put it
    (docs/calibration.md)."""
    keys = sorted(by_rows)
    lo = max([r for r in keys if r <= rows], default=keys[0])
    hi = min([r for r in keys if r >= rows], default=keys[-1])
    if lo == hi:
        return by_rows[lo]
    x0, x1 = layer_width(lo, width), layer_width(hi, width)
    # top-k = every expert: more rows add no experts, and the layer's work is the lower rows'
    return mix(by_rows[lo], by_rows[hi], (layer_width(rows, width) - x0) / (x1 - x0) if x1 > x0 else 0.0)


def latency_table_for_rows(nvme: dict, rows: int, engines=(), record_bytes: int | None = None,
                           width: tuple | None = None) -> dict | None:
    """The channel's latency-vs-queue-depth table for a step of ``rows`` token rows.

    A table by rows ({rows: {q: ms}}, written by `moetier calibrate` from the runtime's own reads) captures that
    reads complete later while the lanes keep the cores busy (more rows, more work per layer), and how much later
    depends on the engine (``_engine_tables``: the engine's table measured under its load wins, else the hardware's
    ``nvme.latency_by_rows_qd_ms``); rows between measured ones interpolate in the layer's expected distinct experts
    (``_at_rows``, ``width`` = (experts, top-k)), outside they take the nearest. Without any: the idle-disk
    ``latency_by_qd_ms`` of `moetier bench`, or None (the reference's FIFO model)."""
    src = (_engine_tables(engines, record_bytes).get("nvme_latency_by_rows_qd_ms")
           or nvme.get("latency_by_rows_qd_ms") or {})
    by_rows = {int(r): {int(q): float(v) for q, v in tab.items()} for r, tab in src.items() if tab}
    if not by_rows:
        return nvme.get("latency_by_qd_ms")
    return _at_rows(by_rows, rows, lambda a, b, f: {q: a[q] * (1 - f) + b[q] * f for q in sorted(set(a) & set(b))},
                    width)


def burst_table_for_rows(rows: int, engines=(), record_bytes: int | None = None,
                         width: tuple | None = None) -> dict:
    """The mean latency by burst size and position ({n: {q: ms}}) at ``rows`` token rows, from the engine whose
    latency table applies (``nvme_latency_by_rows_burst_ms``); between measured rows, the cells both have mix as
    ``_at_rows`` does. {} if unmeasured: the depth table alone then sets arrivals."""
    tabs = _burst_by_rows(_engine_tables(engines, record_bytes).get("nvme_latency_by_rows_burst_ms"))
    return _at_rows(tabs, rows, _mix_bursts, width) if tabs else {}


def _burst_by_rows(src: dict | None) -> dict:
    """A record's {rows: {n: {q: ms}}} with int keys, the rows without a table left out."""
    return {int(r): {int(n): {int(q): float(v) for q, v in row.items()} for n, row in tab.items()}
            for r, tab in (src or {}).items() if tab}


def _mix_bursts(a: dict, b: dict, f: float) -> dict:
    """Two burst tables mixed cell by cell (``_at_rows``), the sizes whose positions both have."""
    return {n: {q: a[n][q] * (1 - f) + b[n][q] * f for q in a[n]} for n in sorted(set(a) & set(b))
            if set(a[n]) == set(b[n])}


def channel_term(field: str, rows: int, engines=(), record_bytes: int | None = None,
                 width: tuple | None = None) -> float:
    """A per-rows scalar term of the NVMe channel (one of ``SCALAR_FIELDS``' record fields) at ``rows`` token rows,
    from the engine whose latency table applies; 0 if unmeasured. An unknown field is an error, not a 0."""
    if field not in _SCALAR_BY_RECORD:
        raise ValueError(f"channel_term: unknown channel field {field!r} (known: {', '.join(_SCALAR_BY_RECORD)})")
    return _scalar_at_rows(_engine_tables(engines, record_bytes).get(field), rows, width)


def _scalar_at_rows(src: dict | None, rows: int, width: tuple | None) -> float:
    """A record's {rows: number} at ``rows`` (``_at_rows``); 0 if there is none."""
    by_rows = {int(r): float(v) for r, v in (src or {}).items()}
    return _at_rows(by_rows, rows, lambda a, b, f: a * (1 - f) + b * f, width) if by_rows else 0.0


@dataclass
class PlanContext:
    """Recipe constants the planner needs, flattened once (attribute lookups are the planner's main cost)."""

    experts: int
    gpu: tuple | None          # (per_layer, per_expert, per_extra_token) or None if the lane is missing
    zerocopy: tuple | None
    cpu: tuple | None
    push_ms: float
    mask: bool
    overlap: bool
    can_admit: bool            # a VRAM tier exists (zerocopy/nvme_gpu picks are admitted)
    cpu_call: float = 0.0      # cpu lane: an inline one-thread call (an NVMe pick computed as it lands)
    cpu_workers: int = 1       # cpu lane: threads a batch is split over ...
    cpu_pmin: int = 0          # ... once it has at least this many experts
    cpu_wake: float = 0.0      # ... and then pays this per unit of its worker's idle (spec.idle_wake)
    cpu_after_wait: float = 0.0   # cpu lane: what an inline call pays beyond cpu_call right after a blocked wait
    cpu_handoff: float = 0.0   # cpu lane: what a split call pays when it ends with a worker's share (spec.hands_off)
    host_layer: float = 0.0    # serial host time per layer call outside the lanes (plan, bookkeeping, combine)
    host_pick: float = 0.0     # ... per pick
    host_read: float = 0.0     # ... and per NVMe pick (issue, slot, landing bookkeeping)
    host_nvme_layer: float = 0.0   # ... and per layer with NVMe picks (what its reads share: their plan, the loops)
    read_cpu: float = 0.0      # core time one NVMe read takes from the cpu lane (O_DIRECT + checksum), per lane ms
    host_predict: float = 0.0  # serial host time per layer of a prefetch predictor (when prefetch is on), at its rows
    # whether the predictor runs on the layer being planned (Replay.arm sets it per layer: a dormant predictor's
    # layers pay neither host_predict nor head_predict)
    predicting: bool = False
    copy_serial: bool = False  # admission pushes and drains run after the lanes, one after another (no overlap)
    host_copy: float = 0.0     # serial host time per admission push or drain (submit, wait, landing bookkeeping)
    host_zc_call: float = 0.0  # serial host time per layer whose zerocopy lane computes (outside the runtime's timers)
    # the part of the host time above that runs between a layer's first NVMe submit and its first wait (the rest of
    # the issue loop, the lane calls' set-up, prediction and prefetch issue, recency): per such layer, per read,
    # and per layer that predicts. It delays the first wait and overlaps the reads
    head_layer: float = 0.0
    head_read: float = 0.0
    head_predict: float = 0.0
    # what a gpu / zerocopy lane call pays per NVMe read of its layer in flight: the lane's per_read_ms where
    # `moetier calibrate` fitted one (a device on the host's cores shares them with the reader), else 0 (a
    # discrete GPU does not compete with the reader's CPU work)
    gpu_read: float = 0.0
    zc_read: float = 0.0
    # ... and once per call while any read is in flight (the lane's per_read_busy_ms)
    gpu_busy: float = 0.0
    zc_busy: float = 0.0
    # the lane deal: "planner" (on the costs), or a peer row's rule (moetier.core.deal_rules)
    deal: str = "planner"

    def __setattr__(self, name, value):
        # the planner packs the terms into one array per context (moetier.core.plan_kernel.pack) and keeps it until
        # a term changes; ``predicting`` (set per layer by Replay.arm) is read per call, not packed
        object.__setattr__(self, name, value)
        if name != "predicting":
            self.__dict__.pop("_packed", None)

    @classmethod
    def from_recipe(cls, R, rows: int = 1) -> "PlanContext":
        """``rows``: token rows per step (the prediction's host time has a part per row)."""
        def lane(name):
            ln = R.lanes.get(name)
            return None if ln is None else (ln.per_layer_ms, ln.per_expert_ms, ln.per_extra_token_ms)

        gpu = lane("gpu") if R.vram_slots > 0 else None
        if R.vram_slots > 0 and gpu is None:
            raise UserError(f"recipe {R.id}: budget.vram_expert_slots={R.vram_slots} but no engine provides a "
                            f"gpu lane to compute VRAM-resident experts")
        zc = lane("zerocopy")
        cpu = lane("cpu")
        cl = R.lanes.get("cpu")

        def per_read(name, term="per_read_ms"):
            ln = R.lanes.get(name)
            return float(getattr(ln, term) or 0.0) if ln is not None else 0.0

        overlap = bool(R.policy.get("overlap", True))
        if cpu is None and zc is None and gpu is None:
            raise UserError(f"recipe {R.id}: no lane can compute RAM or NVMe experts (need cpu, zerocopy or gpu)")
        h = HostTerms.of(getattr(R, "host", None) or {}, R.id)
        predicting = _prefetching(R.policy)
        return cls(experts=R.experts, gpu=gpu, zerocopy=zc, cpu=cpu,
                   push_ms=_push_ms(R),
                   mask=R.policy.get("exact", "stall") == "mask",
                   overlap=overlap, can_admit=gpu is not None,
                   cpu_call=cl.per_call_ms if cl else 0.0, cpu_workers=cl.workers if cl else 1,
                   cpu_pmin=cl.parallel_min if cl else 0, cpu_wake=float(cl.per_wake_ms or 0.0) if cl else 0.0,
                   cpu_after_wait=float(cl.per_after_wait_ms or 0.0) if cl else 0.0,
                   cpu_handoff=float(cl.per_handoff_ms or 0.0) if cl else 0.0,
                   host_layer=h.per_layer_ms, host_pick=h.per_pick_ms, host_read=h.per_read_ms,
                   host_nvme_layer=h.per_nvme_layer_ms,
                   read_cpu=_read_cpu(R),
                   host_predict=h.per_predict_ms + rows * h.per_predict_row_ms if predicting else 0.0,
                   copy_serial=gpu is not None and not overlap,
                   host_copy=h.per_copy_ms, host_zc_call=h.per_zc_call_ms,
                   head_layer=h.head_per_layer_ms, head_read=h.head_per_read_ms,
                   head_predict=h.head_per_predict_ms + rows * h.head_per_predict_row_ms if predicting else 0.0,
                   predicting=predicting,
                   gpu_read=per_read("gpu") if gpu is not None else 0.0, zc_read=per_read("zerocopy"),
                   gpu_busy=per_read("gpu", "per_read_busy_ms") if gpu is not None else 0.0,
                   zc_busy=per_read("zerocopy", "per_read_busy_ms"))


def _push_ms(R) -> float:
    """One record copy between RAM and VRAM: the record over the hardware's link (gpu.h2d_gbps, which `moetier
    calibrate` sets from the runtime's copies)."""
    return R.nvme_expert_bytes / (R.h2d_gbps * 1e6) if R.h2d_gbps else INF


def _prefetching(policy: dict) -> bool:
    pf = policy.get("prefetch") or {}
    return int(pf.get("depth") or 0) > 0 and pf.get("predictor", "recall") not in (None, "none") and \
        (pf.get("predictor") != "recall" or float(pf.get("recall") or 0) > 0)


def _read_cpu(R) -> float:
    """Contention between the NVMe reader and the cpu lane on shared cores: the cpu lane's own per_read_ms where
    `moetier calibrate` fitted one, else the measured CPU time of one read (hardware nvme.cpu_ms_per_read, from
    `moetier bench`) spread over the cores the lane runs on."""
    cl = (getattr(R, "lanes", None) or {}).get("cpu")
    if cl is not None and cl.per_read_ms is not None:
        return cl.per_read_ms
    hw = getattr(R, "hardware", None) or {}
    per_read = float((hw.get("nvme") or {}).get("cpu_ms_per_read", 0.0))
    cores = int((hw.get("cpu") or {}).get("cores") or 1)
    return per_read / max(1, cores)


