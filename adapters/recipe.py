"""The recipe an adapter runs with: checked against the engine's model and the store, sized to the store's records.

Contract: ``fit_recipe(R, engine, layers, experts, topk, store, exact=False)`` returns R with the store's record bytes
as every expert size and, with ``exact``, no cpu lane; a recipe whose MoE geometry differs from the model's or the
store's, or that asks for prefetch (no adapter drives it yet), is a UserError naming the field.
"""
from __future__ import annotations

import dataclasses

from moetier.errors import UserError


def fit_recipe(R, engine: str, layers: int, experts: int, topk: int, store, *, exact: bool = False):
    for fld, want, got in (("moe.layers", layers, R.layers), ("moe.experts", experts, R.experts),
                           ("moe.topk", topk, R.topk), ("moe.layers (store)", store.layers, R.layers),
                           ("moe.experts (store)", store.experts, R.experts)):
        if want != got:
            raise UserError(f"recipe {R.id}: {fld} is {got} but the {engine} model has {want}")
    if int((R.policy.get("prefetch") or {}).get("depth") or 0) > 0:
        raise UserError(f"recipe {R.id}: policy.prefetch.depth > 0 is not supported by the {engine} adapter yet "
                        f"(set policy.prefetch.depth=0)")
    lanes = {k: v for k, v in R.lanes.items() if not (exact and k == "cpu")}
    rb = store.record_bytes
    return dataclasses.replace(R, lanes=lanes, expert_bytes=rb, ram_expert_bytes=rb, nvme_expert_bytes=rb)
