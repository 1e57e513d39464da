"""What `moetier advise` may change and within which limits: the knobs of a recipe and the user's limits.

Contract
--------
- ``Limits(ram_gb, vram_reserve_gb, lossy, masked_cap)``; ``limits(R, ...)`` fills what the user left out from the
  starting recipe (its RAM cap, as VRAM reserve whatever its VRAM slots leave free, and for a start that already
  masks: lossy, capped at the start's own masked share) and checks every value:
  a bad limit is a UserError naming the option and what was expected. ``clamp(R, limits)``: the overrides that
  bring the starting recipe inside tighter limits (the search starts there).
- A ``Knob`` is a name and its choices; each choice is a list of ``"path=value"`` overrides (values canonical JSON),
  and choice 0 is always ``[]``: the starting recipe's own value, so putting a knob back is choosing 0.
- ``knobs(R, limits)`` lists every knob the recipe schema offers for this recipe: VRAM expert slots, RAM budget,
  RAM and VRAM replacement (the names moetier.core.policies.residency registers when this runs, those that need the
  future left out, each kept only if the recipe schema accepts it), RAM partition, VRAM admission, prefetch depth,
  predictor and budget, exactness and per-tier record encodings (with ``lossy`` only), the cpu lane's workers (only
  the counts its record measured: inline, and its own split count where the split terms were measured).
  Values the starting recipe already has are not repeated. Pure but for reading the schema.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass

from moetier.errors import UserError

# parameterised residency policies worth trying beside the bare names; a spec the schema rejects is left out
POLICY_PARAMS = ("dlfu:2000", "dlfu:20000", "lfu:64:0.5")
# the predictor 'recall' is a what-if (a hash at a stated recall), not a predictor a machine can run: not searched
WHAT_IF_PREDICTORS = ("recall",)


@dataclass(frozen=True)
class Limits:
    ram_gb: float
    vram_reserve_gb: float | None      # None: the machine has no GPU
    lossy: bool
    masked_cap: float | None           # None: no more than the starting recipe's own masked share


@dataclass(frozen=True)
class Knob:
    name: str
    choices: tuple       # tuple of tuples of "path=value"; choices[0] == () is the starting value

    def label(self, i: int) -> str:
        return ", ".join(o.split("=", 1)[1] for o in self.choices[i]) if i else "(start)"


def _ov(path: str, value) -> str:
    return f"{path}={json.dumps(value, sort_keys=True)}"


def vram_gb(R) -> float | None:
    g = R.hardware.get("gpu")
    return float(g["vram_gb"]) if g and "gpu" in R.lanes else None


def limits(R, *, ram_gb=None, vram_reserve_gb=None, lossy=False, masked_cap=None) -> Limits:
    """The limits with the starting recipe's defaults, checked (module docstring)."""
    b = R.raw["budget"]
    floor = float(b["runtime_gb"]) + float(b["other_gb"])
    cap = float(b["ram_gb"]) if ram_gb is None else float(ram_gb)
    if not math.isfinite(cap) or cap <= floor:
        raise UserError(f"--ram-gb {cap:g}: expected more than the runtime and reserve the recipe keeps "
                        f"({floor:g} GB: budget.runtime_gb + budget.other_gb)")
    vg = vram_gb(R)
    if vg is None:
        if vram_reserve_gb is not None:
            raise UserError(f"--vram-reserve-gb: recipe {R.id} has no GPU lane (hardware {R.hardware_id}); "
                            "expected no VRAM reserve")
        reserve = None
    else:
        used = R.vram_slots * R.expert_bytes / 1e9
        reserve = max(0.0, vg - used) if vram_reserve_gb is None else float(vram_reserve_gb)
        if not math.isfinite(reserve) or not 0 <= reserve < vg:
            raise UserError(f"--vram-reserve-gb {reserve:g}: expected a number in [0, {vg:g}) "
                            f"(the GPU's {vg:g} GB, hardware {R.hardware_id})")
    if R.policy.get("exact") == "mask" and not lossy:
        # the start already masks: lossy is what its user chose; by default no candidate may mask more than it
        return Limits(cap, reserve, True, None if masked_cap is None else _cap(masked_cap, True))
    return Limits(cap, reserve, bool(lossy), (0.02 if lossy else 0.0) if masked_cap is None
                  else _cap(masked_cap, lossy))


def _cap(v: float, lossy: bool) -> float:
    if not 0.0 <= float(v) <= 1.0:
        raise UserError(f"--masked-cap {v:g}: expected a share in [0, 1]")
    if v > 0 and not lossy:
        raise UserError("--masked-cap: masking drops picks (lossy); expected --lossy with it")
    return float(v)


def max_vram_slots(R, lim: Limits) -> int:
    if lim.vram_reserve_gb is None:
        return 0
    # whole bytes first: the default reserve is the GPU's size less the start's slots, and that difference in floats
    # can fall a hair short of the slots it came from
    return max(0, min(R.keys, int(round((vram_gb(R) - lim.vram_reserve_gb) * 1e9)) // R.expert_bytes))


def clamp(R, lim: Limits) -> list[str]:
    """Overrides that bring the starting recipe inside the limits (a RAM cap or a VRAM reserve tighter than the
    recipe's own); the search starts from the recipe with them."""
    out = []
    if float(R.raw["budget"]["ram_gb"]) > lim.ram_gb:
        out.append(_ov("budget.ram_gb", lim.ram_gb))
    if R.vram_slots > max_vram_slots(R, lim):
        out.append(_ov("budget.vram_expert_slots", max_vram_slots(R, lim)))
    return out


def ram_gb_used(R) -> float:
    b = R.raw["budget"]
    return R.ram_slots * R.ram_expert_bytes / 1e9 + float(b["runtime_gb"]) + float(b["other_gb"])


def vram_gb_used(R) -> float:
    return R.vram_slots * R.expert_bytes / 1e9


def _schema():
    from moetier.core import records as spec
    return spec._schema("recipe")


def _enum(schema: dict, *path) -> list:
    node = schema
    for p in path:
        node = node["properties"][p]
    return list(node["enum"])


def _accepted(R, overrides: list) -> bool:
    """Whether the recipe schema takes these overrides on the starting record (validation only, no join)."""
    from moetier.core import records as spec
    try:
        rec = spec.apply_overrides(R.raw, spec.parse_overrides(overrides))
        spec.validate("recipe", rec, f"recipe {R.id}")
    except (UserError, ValueError):
        return False
    return True


def residency_names() -> list[str]:
    """The residency policies registered now that run on the past alone (an oracle such as belady needs the
    future and is left out)."""
    from moetier.core.policies import residency
    out = []
    for name in residency.POLICIES:
        try:
            residency.make(name, 8)
        except ValueError:
            continue
        out.append(name)
    return out


def _choices(R, path: str, values, start) -> tuple:
    ch = [()]
    for v in values:
        o = (_ov(path, v),)
        if v != start and o not in ch and _accepted(R, list(o)):
            ch.append(o)
    return tuple(ch)


def knobs(R, lim: Limits) -> list[Knob]:
    """Every knob the schema offers for this recipe (module docstring), in a fixed order."""
    s = _schema()
    P, raw = R.policy, R.raw
    out = []
    vmax = max_vram_slots(R, lim)
    if vmax or R.vram_slots:
        vals = sorted({vmax, int(vmax * 0.75), int(vmax * 0.5)} - {R.vram_slots}, reverse=True)
        out.append(Knob("vram slots", _choices(R, "budget.vram_expert_slots", vals, R.vram_slots)))
    floor = float(raw["budget"]["runtime_gb"]) + float(raw["budget"]["other_gb"])
    rams = [round(floor + f * (lim.ram_gb - floor), 1) for f in (1.0, 0.75, 0.5)]
    out.append(Knob("ram budget", _choices(R, "budget.ram_gb", rams, float(raw["budget"]["ram_gb"]))))
    names = residency_names()
    out.append(Knob("ram replacement", _choices(R, "policy.ram_evict", names + list(POLICY_PARAMS),
                                                P.get("ram_evict", "lru"))))
    if vmax or R.vram_slots:
        out.append(Knob("vram replacement", _choices(R, "policy.vram_evict", ["clock"] + names,
                                                     P.get("vram_evict", "clock"))))
        out.append(Knob("vram admission", _choices(R, "policy.vram_admit", _enum(s, "policy", "vram_admit"),
                                                   P.get("vram_admit", True))))
    out.append(Knob("ram partition", _choices(R, "policy.ram_partition", _enum(s, "policy", "ram_partition"),
                                              P.get("ram_partition", "global"))))
    pf = P["prefetch"]
    out.append(Knob("prefetch depth", _choices(R, "policy.prefetch.depth", [0, 1, 2], pf["depth"])))
    preds = [p for p in _enum(s, "policy", "prefetch", "predictor") if p not in WHAT_IF_PREDICTORS]
    out.append(Knob("prefetch predictor", _choices(R, "policy.prefetch.predictor", preds, pf.get("predictor"))))
    out.append(Knob("prefetch budget", _choices(R, "policy.prefetch.budget", [4, 8, 16], pf.get("budget", 8))))
    if lim.lossy:
        out.append(Knob("exactness", _choices(R, "policy.exact", _enum(s, "policy", "exact"), P["exact"])))
        sizes = sorted({int(v) for k, v in (R.model.get("geometry") or {}).items()
                        if k.startswith("record_bytes_") and int(v) < R.expert_bytes})
        ch = [()]
        for b in sizes:
            o = (_ov("tiers.nvme_expert_bytes", b), _ov("tiers.ram_expert_bytes", b))
            if b != R.ram_expert_bytes and _accepted(R, list(o)):
                ch.append(o)
        if len(ch) > 1:
            out.append(Knob("cold record size", tuple(ch)))
    cpu = R.lanes.get("cpu")
    cores = int((R.hardware.get("cpu") or {}).get("cores") or 1)
    if cpu is not None and cores > 1:
        # only worker counts the lane record measured: inline (1), and a split call at the lane's own count where
        # its split terms were measured (per_handoff_ms). Any other count would spread the per-expert cost measured
        # on its threads over more threads with nothing for the memory bandwidth they share: the simulator would
        # advise it for a speed-up no record says exists
        ws = sorted({1} | ({cpu.workers} if cpu.per_handoff_ms is not None else set()))
        out.append(Knob("cpu workers", _choices(R, "lane_overrides.cpu.workers", ws, cpu.workers)))
    return [k for k in out if len(k.choices) > 1]
