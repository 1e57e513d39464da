"""Lanes: where an expert is computed and what a call there costs, from an engine's lane terms.

Contract
--------
``lane_terms(spec, expert_bytes, ram_expert_bytes)`` reads one engine lane (``engine.lanes.<name>``) into the
keyword arguments of a ``Lane``, its byte-streaming terms rescaled to the model's expert size; ``Lane.cost(rows)``
is one call's time as the planner deals it (``deal``: strided over the workers, heaviest first; ``hands_off``:
whether it ends with a worker's share); ``idle_wake`` is how cold a split call's worker has gone; ``lane_checks(R)``
sets each lane's implied GB/s against what the hardware record allows. Pure: no files, no records read here.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from moetier.core.jit import kernel

LANE_COSTS = ("per_layer_ms", "per_expert_ms", "per_extra_token_ms", "per_call_ms")
LANE_SHAPE = ("workers", "parallel_min")     # integers: how a batch call is executed
BYTE_TERMS = ("per_expert_ms", "per_extra_token_ms")   # terms that stream an expert's weights: scale with its bytes
# lane terms a record may leave out (absent: another record's figure, or 0), and those whose absence means 0
LANE_OPTIONAL = ("per_read_ms", "per_read_busy_ms", "per_wake_ms", "per_after_wait_ms", "per_handoff_ms")
LANE_ZERO_IF_ABSENT = ("per_read_busy_ms", "per_wake_ms", "per_after_wait_ms", "per_handoff_ms")
WAKE_SCALE_MS = 0.1       # idle_wake: the idle that counts as one unit (below it a worker is still warm)


@kernel
def idle_wake(idle_ms):
    """How cold a split call's worker has gone, in the units the cpu lane's ``per_wake_ms`` is paid in: log2(1 +
    idle / 0.1 ms), idle = the time since the lane's last split call ended. A worker thread that idled longer wakes
    slower and colder (on a VM its vCPU halts after its poll window; its core's caches go to others), and a split
    call's time grows roughly by a constant per doubling of the idle: hence the log."""
    return math.log2(1.0 + idle_ms / WAKE_SCALE_MS) if idle_ms > 0.0 else 0.0


def deal(items, workers: int) -> list:
    """How a split cpu-lane call deals its batch out (backends/cpu/lane.py runs it, moetier.core.plan and Lane.cost
    model it): thread i takes items i, i + w, i + 2w, ... for w = min(workers, len(items)); share 0 is the calling
    thread's and the longest."""
    w = max(1, min(workers, len(items)))
    return [items[i::w] for i in range(w)]


@kernel
def hands_off(n: int, workers: int) -> bool:
    """Whether a split call of ``n`` experts ends with a worker's share (``deal``): a worker takes as many experts
    as the calling thread unless n leaves the caller the only one with an extra (n % workers == 1). Its share starts
    a hand-off later than the caller's (the submit and its wake-up), so such a call pays the lane's
    ``per_handoff_ms``; one whose caller has an expert more ends with the caller's share (so a 7-expert call over
    two threads runs shorter than an 8-expert one by more than an expert's compute). Compiled: the planner's kernel
    calls it, and Lane.cost through the dispatcher."""
    return workers > 1 and n % workers != 1


def lane_terms(spec: dict, expert_bytes: int, ram_expert_bytes: int) -> dict:
    """An engine lane's terms for a model of ``expert_bytes`` per expert: per_expert_ms and per_extra_token_ms scaled
    by expert_bytes / the lane's measured ``expert_bytes``, when the engine records it (an expert's cost is streaming
    its weights; per-layer and per-call terms are dispatch and stay). A recipe whose RAM tier holds another form of the
    expert (tiers.ram_expert_bytes) gives its ram lanes' costs in lane_overrides; the lane's ``expert_bytes`` is what
    it reads (the tier's), which is what its implied GB/s is of."""
    out = {"reads": spec["reads"], **{c: float(spec.get(c, 0.0)) for c in LANE_COSTS},
           **{c: int(spec[c]) for c in LANE_SHAPE if c in spec},
           **{c: float(spec[c]) for c in LANE_OPTIONAL if c in spec},
           "expert_bytes": int(ram_expert_bytes if spec["reads"] == "ram" else expert_bytes),
           "measured_bytes": spec.get("expert_bytes")}
    if out["measured_bytes"]:
        for c in BYTE_TERMS:
            out[c] *= expert_bytes / out["measured_bytes"]
    return out


def override_lane(terms: dict, costs: dict) -> None:
    """Apply a lane's cost overrides (an engine's ``model_lanes`` entry or a recipe's ``lane_overrides``) to its
    ``lane_terms``, in place."""
    terms.update({c: float(costs[c]) for c in LANE_COSTS + LANE_OPTIONAL if c in costs})
    terms.update({c: int(costs[c]) for c in LANE_SHAPE if c in costs})


# what each lane reads its expert bytes through, as (hardware record fields tried in order, what it is)
LANE_CEILINGS = {
    "cpu": ((("ceilings", "ddr_practical_gbps"), ("ceilings", "ddr_theoretical_gbps")), "memory read bandwidth"),
    "gpu": ((("gpu", "vram_bw_gbps"), ("ceilings", "vram_bw_gbps")), "VRAM bandwidth"),
    "zerocopy": ((("ceilings", "pcie_h2d_gbps"), ("gpu", "h2d_gbps")), "host-to-device link"),
}


def _hw_value(hw: dict, paths) -> tuple[float | None, str]:
    for a, b in paths:
        v = (hw.get(a) or {}).get(b)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0:
            return float(v), f"{a}.{b}"
    return None, ""


def lane_checks(R) -> list[dict]:
    """Each lane's implied GB/s (expert bytes / per_expert_ms) against what the hardware record allows it (the
    cpu lane: memory bandwidth; gpu: VRAM bandwidth; zerocopy: the host-to-device link), and the NVMe figures against
    the device's read ceiling (nvme.bw_gbps against ceilings.nvme_read_gbps). ``over`` marks a figure the hardware
    cannot deliver."""
    out = []
    for name, ln in R.lanes.items():
        paths, what = LANE_CEILINGS.get(name, ((), ""))
        cap, field_ = _hw_value(R.hardware, paths)
        out.append({"lane": name, "gbps": ln.gbps, "ceiling_gbps": cap, "ceiling": field_, "what": what,
                    "over": None not in (cap, ln.gbps) and ln.gbps > cap})
    cap, field_ = _hw_value(R.hardware, (("ceilings", "nvme_read_gbps"),))
    out.append({"lane": "nvme", "gbps": R.nvme_bw_gbps, "ceiling_gbps": cap, "ceiling": field_,
                "what": "NVMe device read ceiling", "over": cap is not None and R.nvme_bw_gbps > cap})
    return out


@dataclass(frozen=True)
class Lane:
    """A place an expert can be computed; costs in ms."""

    name: str
    reads: str  # "vram" or "ram"
    per_layer_ms: float
    per_expert_ms: float
    per_extra_token_ms: float = 0.0
    per_call_ms: float = 0.0      # an inline (one-thread) call: NVMe picks computed one by one as they land
    workers: int = 1              # a batch of >= parallel_min experts is split over this many threads
    parallel_min: int = 0
    # cpu lane: what one NVMe read of the layer costs it (cores and cache shared with the reader), fitted in situ by
    # `moetier calibrate`; None: the hardware's nvme.cpu_ms_per_read / cores (moetier.core.terms._read_cpu)
    per_read_ms: float | None = None
    # gpu / zerocopy lanes: what a call pays once when any NVMe read of its layer is in flight, beside per_read_ms
    # per read (a device on the host's cores loses about one core to the reader's threads, however many reads)
    per_read_busy_ms: float | None = None
    # cpu lane: what a split call pays per unit of its worker's idle (idle_wake), fitted by `moetier calibrate`
    per_wake_ms: float | None = None
    # cpu lane: what an inline call made right after the host blocked on its pick's read pays beyond per_call_ms
    # (the core slept through the read; its caches went to the reader), fitted by `moetier calibrate`
    per_after_wait_ms: float | None = None
    # cpu lane: what a split call pays when it ends with a worker's share (hands_off), fitted by `moetier calibrate`
    per_handoff_ms: float | None = None
    # bytes of one expert as this lane reads it (its tier's: moe.expert_bytes for vram lanes, tiers.ram_expert_bytes
    # for ram lanes), and those of the model the engine's per-expert terms were measured on (engine lane
    # "expert_bytes"; None: not recorded, so not rescaled); see lane_terms
    expert_bytes: int = field(default=0, compare=False)
    measured_bytes: int | None = field(default=None, compare=False)

    @property
    def gbps(self) -> float | None:
        """The expert bytes this lane's per_expert_ms implies per second, GB/s (None for a zero cost)."""
        return self.expert_bytes / (self.per_expert_ms * 1e6) if self.per_expert_ms > 0 else None

    def cost(self, rows) -> float:
        """One call over experts with these token rows (a sequence, or a mapping key -> rows): inline below
        parallel_min, else split heaviest first, strided over the workers, ending with the longest share (as
        moetier.core.plan deals a batch)."""
        if isinstance(rows, Mapping):
            rows = rows.values()
        work = sorted((self.per_expert_ms + self.per_extra_token_ms * (m - 1) for m in rows), reverse=True)
        if not work:
            return 0.0
        if len(work) < self.parallel_min:
            return self.per_call_ms + sum(work)
        return (self.per_layer_ms + max(sum(share) for share in deal(work, self.workers))
                + (self.per_handoff_ms or 0.0) * hands_off(len(work), self.workers))
