"""The orders the tiers evict in: the VRAM slot map (CLOCK, or a replacement policy) and the policy objects a recipe
names for either tier.

Contract
--------
- ``Clock(ts)``: CLOCK (second chance) over the VRAM slots of a moetier.core.tier_state.TierState; ``owner[slot]``
  is the key in a slot (-1: free), ``slot_of[key]`` its slot, ``ref`` the reference bits, ``hand`` CLOCK's hand. ``find_victim_slot(protect, state, key)`` returns a slot to
  reuse, never one holding a protected key or a key whose state (``state``: the state codes by key) is not plain
  VRAM, or -1 when every slot is pinned. The compiled commit (moetier.core.commit_kernel) runs the same search on
  the same buffers; this is the ticket path's.
- ``PolicySlots(ts, pol)``: the same slot map ordered by a moetier.core.policies.residency policy.
- ``make_policy(spec, ...)``: a policy object from its recipe name (or the object itself), per layer when asked;
  errors name the recipe field.
- ``Pins``: the layer's picks as the array a compiled eviction takes.
- ``replace(pol, old, new)``: ``old`` leaves a policy's tier and ``new`` enters, in one call where the policy can.
- ``lfu_terms(spec)``: the window and halflife of the built-in window LFU (``lfu[:window[:halflife]]``).
"""
from __future__ import annotations

from itertools import chain

import numpy as np

from moetier.core.policies import residency
from moetier.core.tickets import VRAM
from moetier.core.tier_state import M_HAND, SlotMap, TierState


class Clock:
    """CLOCK (second chance) over a fixed number of VRAM slots."""

    __slots__ = ("n", "owner", "ref", "slot_of", "_meta")

    def __init__(self, ts: TierState):
        self.n = len(ts.owner)
        self.owner, self.ref, self._meta = ts.owner, ts.ref, ts.meta
        self.slot_of = SlotMap(ts)

    @property
    def hand(self) -> int:
        return self._meta[M_HAND]

    @hand.setter
    def hand(self, h: int) -> None:
        self._meta[M_HAND] = h

    def find_victim_slot(self, protect, state, key=None) -> int:
        """Slot to reuse, or -1 if every slot is pinned: a protected key (this layer's picks) or a key whose state
        is not plain VRAM (a transfer in flight). ``key``: the incoming key (CLOCK does not need it)."""
        n, owner, ref = self.n, self.owner, self.ref
        h = self.hand
        for _ in range(2 * n + 1):
            k = owner[h]
            if k < 0:
                self.hand = (h + 1) % n
                return h
            if k not in protect and state[k] == VRAM:
                if ref[h]:
                    ref[h] = 0
                else:
                    self.hand = (h + 1) % n
                    return h
            h = h + 1 if h + 1 < n else 0
        return -1

    def take(self, key: int, protect, state, pins=None) -> tuple[int, int]:
        """A slot for ``key``, placed: (slot, the key it evicted or -1), or (-1, -1) when every slot is pinned.
        ``pins``: see PolicySlots.take (CLOCK does not use it)."""
        slot = self.find_victim_slot(protect, state, key)
        return (slot, self.place(slot, key)) if slot >= 0 else (-1, -1)

    def place(self, slot: int, key: int) -> int:
        """Put key in slot (reference bit set); return the previous owner or -1."""
        old = self.owner[slot]
        if old >= 0:
            del self.slot_of[old]
        self.owner[slot] = key
        self.slot_of[key] = slot
        self.ref[slot] = 1
        return old

    def remove(self, key: int) -> None:
        s = self.slot_of.pop(key)
        self.owner[s] = -1
        self.ref[s] = 0


class PolicySlots(Clock):
    """VRAM slots ordered by a replacement policy (moetier.core.policies.residency) instead of CLOCK: the same
    slot map; ``hit`` tells the policy a VRAM key was computed (CLOCK's reference bit)."""

    __slots__ = ("pol",)

    def __init__(self, ts: TierState, pol):
        super().__init__(ts)
        self.pol = pol

    def find_victim_slot(self, protect, state, key=None) -> int:
        if len(self.slot_of) < self.n:
            return self.owner.index(-1)
        v = self.pol.victim(key, lambda k: k not in protect and state[k] == VRAM)
        if v is None or v == key:
            return -1
        return self.slot_of[v]

    def take(self, key: int, protect, state, pins=None) -> tuple[int, int]:
        """Clock.take; ``pins`` (an int64 array: ``protect`` and the keys mid-push, all that keeps a key) where the
        policy has ``evict_for``: the victim and the placement in one compiled call."""
        slot_of = self.slot_of
        if pins is None or len(slot_of) < self.n:
            return super().take(key, protect, state)
        v = self.pol.evict_for(key, pins)
        if v is None:
            return -1, -1
        slot = slot_of.pop(v)
        self.owner[slot] = key
        slot_of[key] = slot
        self.ref[slot] = 1
        return slot, v

    def place(self, slot: int, key: int) -> int:
        old = super().place(slot, key)
        if old >= 0:
            replace(self.pol, old, key)
        else:
            self.pol.insert(key)
        return old

    def remove(self, key: int) -> None:
        super().remove(key)
        self.pol.remove(key)

    def hit(self, keys) -> None:
        many = getattr(self.pol, "hit_many", None)
        if many is not None:
            many(keys if isinstance(keys, list) else list(keys))
            return
        for k in keys:
            self.pol.hit(k)


class Pins:
    """``of(protect, busy)``: the keys a compiled eviction (``evict_for`` / ``put``) may not take, as an int64
    array: a layer's picks and the keys mid-transfer (``busy``). Built once per layer while ``busy`` is empty: the
    callers pass the same picks object to each call of one commit and never change it in between."""

    __slots__ = ("src", "arr")

    def __init__(self):
        self.src, self.arr = None, None

    def of(self, protect, busy=()) -> np.ndarray:
        if busy:
            return np.fromiter(chain(protect, busy), dtype=np.int64, count=len(protect) + len(busy))
        if protect is not self.src or len(protect) != len(self.arr):
            self.src = protect
            self.arr = np.fromiter(protect, dtype=np.int64, count=len(protect))
        return self.arr


def replace(pol, old, new) -> None:
    """``old`` leaves the policy's tier and ``new`` enters (remove, then insert): in one call where the policy has
    ``replace`` (the compiled ones: each call from Python costs about as much as the work)."""
    rep = getattr(pol, "replace", None)
    if rep is None:
        pol.remove(old)
        pol.insert(new)
    else:
        rep(old, new)


def make_policy(spec, slots: int, layers, experts, partition: str, field: str, width: int = 64):
    """A residency policy object from a name (or the object itself), split per layer when asked; ``field``: the
    recipe field that named it (errors name it); ``width``: the keys a global array-state policy sizes for."""
    if not isinstance(spec, str):
        return spec
    try:
        if partition == "layer":
            if not layers or not experts:
                raise ValueError("a per-layer split needs layers and experts")
            return residency.partitioned(spec, slots, layers, experts)
        return residency.make(spec, slots, width=width)
    except ValueError as e:
        raise ValueError(f"policy.{field}: {e}") from None


def lfu_terms(spec: str) -> tuple[int, float]:
    """(window, halflife) of ``lfu[:window[:halflife]]``: window 32 and no decay where left out."""
    parts = spec.split(":")
    if parts[0] != "lfu" or len(parts) > 3:
        raise ValueError(f"policy.ram_evict: expected 'lru' or 'lfu[:window[:halflife]]', got {spec!r}")
    return (int(parts[1]) if len(parts) > 1 and parts[1] else 32,
            float(parts[2]) if len(parts) > 2 and parts[2] else 0.0)
