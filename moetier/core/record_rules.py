"""Cross-field rules: what a schema cannot state about a recipe and the records it names.

Contract
--------
``check_refs(recipe, shown, ids)``: the recipe's model, hardware and engines exist (``ids(kind)`` -> the known ids
of a kind); ``check_budget(recipe, model, hw, shown)``: its VRAM budget fits the hardware's device;
``check_policy(recipe, shown)``: the tier policies it names take the parameters it gives them. Each raises
``moetier.errors.UserError`` on one line naming the recipe (``shown``), the field and what was expected. Pure: the
caller (moetier.core.records) loads the records.
"""
from __future__ import annotations

from moetier.core.policies import residency
from moetier.errors import UserError


def check_refs(recipe: dict, shown: str, ids) -> None:
    """The model, hardware and engine ids the recipe names are known (``ids(kind)``: a set of ids)."""
    for field_, kind in (("model", "model"), ("hardware", "hardware")):
        known = ids(kind)
        if recipe[field_] not in known:
            raise UserError(f"{shown}: $.{field_}: unknown {kind} id {recipe[field_]!r} "
                            f"(known: {', '.join(sorted(known)) or 'none'})")
    engines = ids("engine")
    for i, eid in enumerate(recipe["engines"]):
        if eid not in engines:
            raise UserError(f"{shown}: $.engines[{i}]: unknown engine id {eid!r} "
                            f"(known: {', '.join(sorted(engines)) or 'none'})")


def check_budget(rec: dict, model: dict, hw: dict, shown: str) -> None:
    """The budget fits the hardware. One line names both fields. (Reserves above the RAM cap are allowed: they leave
    no RAM slots, a what-if the capacity tests use.)"""
    b = rec["budget"]
    gpu = hw.get("gpu") or {}
    slots, eb = int(b["vram_expert_slots"]), int(model["moe"]["expert_bytes"])
    if slots and "vram_gb" in gpu and slots * eb > gpu["vram_gb"] * 1e9:
        raise UserError(f"{shown}: $.budget.vram_expert_slots ({slots} x {eb:,} B = {slots * eb / 1e9:.2f} GB) "
                        f"exceeds hardware {hw['id']} $.gpu.vram_gb ({gpu['vram_gb']} GB); expected slots that fit "
                        f"the device")


def check_policy(rec: dict, shown: str) -> None:
    """Each residency policy spec (``policy.ram_evict`` / ``vram_evict``) names a policy and only parameters it takes,
    each in range: one line naming the field otherwise (the built-in ``lru`` / ``lfu:W:H`` and ``clock`` pass)."""
    pol = rec.get("policy") or {}
    for field_ in ("ram_evict", "vram_evict"):
        spec = pol.get(field_)
        if spec is None or spec in ("lru", "clock") or str(spec).startswith("lfu:"):
            continue
        try:
            residency.parse(spec)
        except ValueError as e:
            raise UserError(f"{shown}: $.policy.{field_}: {e}") from None
