"""The resolved recipe: a recipe joined with its model, hardware and engine records into one ``Recipe``.

Contract
--------
``join(rec, model, hw, engines, shown)`` takes records already loaded, validated and checked against each other
(moetier.core.records.resolve does that) and computes what the core reads: capacities (VRAM / RAM slots), lanes
with their costs, link speeds, the policy with every default filled in, the non-MoE time and the host terms.
* Capacity: ``ram_slots = clamp(floor((ram_gb - runtime_gb - other_gb) * 1e9 / ram_expert_bytes), 0, keys)``,
  computed in decimal arithmetic on the numbers as written (48.2e9 / 9,474,048 floors to 5,087);
  ``vram_slots = budget.vram_expert_slots`` (clamped to ``keys``).
* Lanes: engine lanes in ``engines[]`` order (a later engine overwrites a lane of the same name), then each engine's
  ``model_lanes[<model id>]`` costs for lanes that exist, then the recipe's ``lane_overrides`` (the lane must
  exist: UserError naming ``shown``). Pure: no files read here.
"""
from __future__ import annotations

import copy
from dataclasses import asdict, dataclass, field
from decimal import Decimal, ROUND_FLOOR

from moetier.core.lanes import Lane, lane_checks, lane_terms, override_lane
from moetier.errors import UserError

DEFAULT_PREFETCH = {"depth": 0, "recall": 0.0, "predictor": "recall", "budget": 8}
DEFAULT_POLICY = {
    "vram": "clock",
    "ram": "exclusive",
    "ram_evict": "lru",
    "seed": "warmup",
    "warmup_tokens": 1000,
    "exact": "stall",
    "overlap": True,
}
# the recipe's calibration.host time terms outside its head start: the timed host work's (moetier.measure.fit.fit_host's
# columns, in order), then the part of the time outside the runtime's timers per zerocopy call (fit_fixed)
HOST_TIMED_TERMS = ("per_layer_ms", "per_pick_ms", "per_read_ms", "per_nvme_layer_ms", "per_predict_ms",
                    "per_predict_row_ms", "per_copy_ms")
HOST_TERMS = HOST_TIMED_TERMS + ("per_zc_call_ms",)
HEAD_TERMS = ("head_per_layer_ms", "head_per_read_ms", "head_per_predict_ms", "head_per_predict_row_ms")


@dataclass
class Recipe:
    id: str
    model_id: str
    hardware_id: str
    layers: int
    experts: int
    topk: int
    expert_bytes: int
    ram_expert_bytes: int
    nvme_expert_bytes: int
    vram_slots: int
    ram_slots: int
    lanes: dict[str, Lane]
    h2d_gbps: float
    nvme_bw_gbps: float
    nvme_bw_qd1_gbps: float
    nvme_latency_ms: float
    policy: dict
    fixed_ms: dict[int, float]
    prefill: dict
    trace: str | None
    raw: dict
    model: dict = field(repr=False)
    hardware: dict = field(repr=False)
    engines: list[dict] = field(repr=False)
    host: dict = field(default_factory=lambda: {"per_layer_ms": 0.0, "per_pick_ms": 0.0})

    @property
    def keys(self) -> int:
        return self.layers * self.experts

    @property
    def nvme_only(self) -> int:
        return max(0, self.keys - self.vram_slots - self.ram_slots)

    def fixed(self, ntok: float) -> float:
        """Non-MoE ms per step at `ntok` rows: piecewise-linear over fixed_ms, flat below, extrapolated above."""
        pts = sorted(self.fixed_ms.items())
        if len(pts) == 1 or ntok <= pts[0][0]:
            return float(pts[0][1])
        for (x0, y0), (x1, y1) in zip(pts, pts[1:]):
            if ntok <= x1:
                return float(y0 + (y1 - y0) * (ntok - x0) / (x1 - x0))
        (x0, y0), (x1, y1) = pts[-2], pts[-1]
        return float(y1 + (y1 - y0) * (ntok - x1) / (x1 - x0))

    def fixed_basis(self, ntok: int) -> str:
        """Where fixed(ntok) comes from: 'measured' when fixed_ms has an entry for ``ntok`` rows, else how it was
        interpolated or extrapolated (the row counts it used)."""
        rows = sorted(self.fixed_ms)
        if ntok in self.fixed_ms:
            return "measured"
        if len(rows) == 1:
            return f"taken from the only entry, {rows[0]} rows"
        if ntok < rows[0]:
            return f"taken from the smallest entry, {rows[0]} rows"
        if ntok > rows[-1]:
            return f"extrapolated from the entries for {rows[-2]} and {rows[-1]} rows"
        lo = max(r for r in rows if r < ntok)
        return f"interpolated between the entries for {lo} and {min(r for r in rows if r > ntok)} rows"

    def summary(self) -> dict:
        return {
            "recipe": self.id,
            "model": self.model_id,
            "hardware": self.hardware_id,
            "engines": [e["id"] for e in self.engines],
            "keys": self.keys,
            "vram_slots": self.vram_slots,
            "ram_slots": self.ram_slots,
            "nvme_only": self.nvme_only,
            "expert_bytes": self.expert_bytes,
            "ram_expert_bytes": self.ram_expert_bytes,
            "nvme_expert_bytes": self.nvme_expert_bytes,
            "lanes": {name: asdict(lane) for name, lane in self.lanes.items()},
            "lane_checks": lane_checks(self),
            "policy": copy.deepcopy(self.policy),
            "fixed_ms": dict(self.fixed_ms),
            "prefill": dict(self.prefill),
            "trace": self.trace,
        }


def _dec(x) -> Decimal:
    return Decimal(repr(float(x))) if not isinstance(x, int) else Decimal(x)


def ram_slots_for(ram_gb, runtime_gb, other_gb, expert_bytes: int, keys: int) -> int:
    """floor((ram_gb - runtime_gb - other_gb) * 1e9 / expert_bytes), clamped to [0, keys], in decimal arithmetic."""
    avail = (_dec(ram_gb) - _dec(runtime_gb) - _dec(other_gb)) * Decimal(10) ** 9
    n = int((avail / Decimal(int(expert_bytes))).to_integral_value(rounding=ROUND_FLOOR))
    return max(0, min(n, keys))


def _policy(p: dict) -> dict:
    out = copy.deepcopy(DEFAULT_POLICY)
    out.update(copy.deepcopy(p))
    pf = dict(DEFAULT_PREFETCH)
    pf.update(p.get("prefetch") or {})
    out["prefetch"] = pf
    return out


def _lanes(rec: dict, model: dict, engines: list, expert_bytes: int, ram_b: int, shown: str) -> dict[str, Lane]:
    """The recipe's lanes: the engines' in order, their model_lanes for this model, then the lane_overrides."""
    lanes: dict[str, dict] = {}
    for eng in engines:
        for name, spec in eng["lanes"].items():
            lanes[name] = lane_terms(spec, expert_bytes, ram_b)
    for eng in engines:
        for name, costs in (eng.get("model_lanes") or {}).get(model["id"], {}).items():
            if name in lanes:
                override_lane(lanes[name], costs)
    for name, costs in (rec.get("lane_overrides") or {}).items():
        if name not in lanes:
            raise UserError(f"{shown}: $.lane_overrides.{name}: unknown lane {name!r} "
                            f"(lanes: {', '.join(lanes) or 'none'})")
        override_lane(lanes[name], costs)
    return {n: Lane(name=n, **spec) for n, spec in lanes.items()}


def _host(cal: dict, engine: dict) -> dict:
    """The host terms (ms), 0 where the recipe's calibration.host lacks one; submitting a read is the backend's work,
    so the last engine's own ``head_per_read_ms``, where calibrated, wins."""
    host = {k: float(cal.get("host", {}).get(k, 0.0)) for k in HOST_TERMS + HEAD_TERMS}
    if "head_per_read_ms" in engine:
        host["head_per_read_ms"] = float(engine["head_per_read_ms"])
    return host


def join(rec: dict, model: dict, hw: dict, engines: list, shown: str) -> Recipe:
    """The ``Recipe`` of recipe record ``rec`` (overrides applied) with its model, hardware and engine records."""
    moe = model["moe"]
    layers, experts = int(moe["layers"]), int(moe["experts"])
    keys = layers * experts
    expert_bytes = int(moe["expert_bytes"])
    tiers = rec.get("tiers") or {}
    ram_b = int(tiers.get("ram_expert_bytes", expert_bytes))
    nvme_b = int(tiers.get("nvme_expert_bytes", expert_bytes))
    b = rec["budget"]
    nv = hw["nvme"]
    cal = rec["calibration"]
    return Recipe(
        id=rec["id"],
        model_id=model["id"],
        hardware_id=hw["id"],
        layers=layers,
        experts=experts,
        topk=int(moe["topk"]),
        expert_bytes=expert_bytes,
        ram_expert_bytes=ram_b,
        nvme_expert_bytes=nvme_b,
        vram_slots=max(0, min(int(b["vram_expert_slots"]), keys)),
        ram_slots=ram_slots_for(b["ram_gb"], b["runtime_gb"], b["other_gb"], ram_b, keys),
        lanes=_lanes(rec, model, engines, expert_bytes, ram_b, shown),
        h2d_gbps=float((hw.get("gpu") or {}).get("h2d_gbps", 0.0)),
        nvme_bw_gbps=float(nv["bw_gbps"]),
        nvme_bw_qd1_gbps=float(nv.get("bw_qd1_gbps", nv["bw_gbps"])),
        nvme_latency_ms=float(nv.get("latency_ms", 0.1)),
        policy=_policy(rec["policy"]),
        fixed_ms={int(k): float(v) for k, v in cal["fixed_ms"].items()},
        prefill={"chunk": int(cal["prefill"]["chunk"]),
                 "compute_ms_per_layer": float(cal["prefill"]["compute_ms_per_layer"]),
                 "first_request_ms": float(cal["prefill"]["first_request_ms"])},
        trace=rec.get("trace"),
        host=_host(cal, engines[-1]),
        raw=rec,
        model=model,
        hardware=hw,
        engines=engines,
    )
