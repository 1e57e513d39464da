"""Whether the VRAM tier admits (``policy.vram_admit``): a cache, or the seeded placement kept for the run.

Contract: ``admits(policy, vram_slots, layers, topk) -> bool``. ``true``/``false`` are taken as given; ``"auto"``
admits only when VRAM holds at least ``MIN_SLOTS_PER_TOPK`` x top-k slots per layer. Below that a VRAM cache keeps
almost nothing between a layer's visits (every layer's picks pass through it once a token, so a few slots a layer
are overwritten before the layer comes round again) and each admission drains a VRAM victim back into the
exclusive RAM tier, churning it; the hottest experts placed once (the seed) serve more (docs/peers.md: the GLM 20 GB
recipe, 2.4 slots a layer against top-8). Absent: true (a cache), the ledger's historical default. Pure.
"""
from __future__ import annotations

__all__ = ["admits", "MIN_SLOTS_PER_TOPK"]

MIN_SLOTS_PER_TOPK = 3


def admits(policy: dict, vram_slots: int, layers: int, topk: int) -> bool:
    v = policy.get("vram_admit", True)
    if v == "auto":
        return vram_slots >= MIN_SLOTS_PER_TOPK * topk * max(1, layers)
    if not isinstance(v, bool):
        raise ValueError(f"policy.vram_admit: expected true, false or 'auto', got {v!r}")
    return v
