"""The ledger's vocabulary: the residency states, the tier the planner reads off each, and the transfer tickets.

Contract
--------
A key is in exactly one state (moetier.core.ledger's docstring says what each means); ``TIER_OF[state]`` is the tier
the planner sees (``TIER_NVME``: must be read first). A ``Ticket`` is one outstanding transfer; only the ledger
creates them, and ``ResidencyError`` is what it raises when a rule is broken. No imports, no state.
"""
from __future__ import annotations

ABSENT, FILLING, STAGED, RAM, PUSHING, VRAM, DRAINING = 0, 1, 2, 3, 4, 5, 6
STATE_NAMES = ("absent", "filling", "staged", "ram", "pushing", "vram", "draining")

# what the planner sees: tier per state (nvme = must be read first)
TIER_NVME, TIER_RAM, TIER_VRAM = 0, 1, 2
TIER_OF = (TIER_NVME, TIER_NVME, TIER_NVME, TIER_RAM, TIER_RAM, TIER_VRAM, TIER_NVME)


class ResidencyError(RuntimeError):
    """A residency rule was broken (landing an unknown ticket, a transition from the wrong state)."""


class Ticket:
    """One outstanding transfer. Only the ledger creates them; ``land`` accepts each exactly once."""

    __slots__ = ("seq", "key", "kind", "staging", "slot", "victim")

    def __init__(self, seq: int, key: int, kind: str, staging: bool = False, slot: int = -1, victim: int = -1):
        self.seq, self.key, self.kind, self.staging = seq, key, kind, staging
        self.slot, self.victim = slot, victim      # push: reserved VRAM slot and the key it evicted (-1: none)

    def __repr__(self) -> str:
        return f"Ticket(seq={self.seq}, key={self.key}, kind={self.kind})"
