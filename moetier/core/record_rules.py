"""Cross-field rules: what a schema cannot state about a recipe and the records it names.

Contract
--------
``check_refs(recipe, shown, ids)``: the recipe's model, hardware and engines exist (``ids(kind)`` -> the known ids
of a kind); ``check_budget(recipe, model, hw, shown)``: its VRAM budget fits the hardware's device. Each raises
``moetier.errors.UserError`` on one line naming the recipe (``shown``), the field and what was expected. Pure: the
caller (moetier.core.records) loads the records.
"""
from __future__ import annotations

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
