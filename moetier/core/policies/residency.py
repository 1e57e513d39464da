"""Replacement policies for one tier of expert slots (RAM or VRAM), pure and slot-count bound.

Contract
--------
A policy tracks which keys hold the tier's ``capacity`` slots and, when the tier is full, names the key to evict.
The tier (moetier.core.ledger.Ledger, or ``replay`` below) owns residency; the policy only orders:

    insert(k)            k became resident (the tier has a free slot for it)
    hit(k)               resident k was used again
    remove(k)            k left the tier (moved to another tier, or evicted after ``victim`` named it)
    victim(k, ok) -> key the resident key to evict so that incoming ``k`` can be kept, among keys with ``ok(key)``
                         true (the tier's pins: the layer's picks, keys mid-transfer); ``k`` itself when the policy
                         would rather not keep ``k`` (admission refused: Belady's bypass, W-TinyLFU's filter); None
                         when every resident key is pinned. ``victim`` may move keys between the policy's own
                         queues (S3-FIFO, 2Q, W-TinyLFU) and remembers evicted keys in its ghost lists; the caller
                         then calls ``remove`` on the key it returned (unless it returned ``k``).

Policies: ``lru``, ``fifo`` (moetier.core.policies.recency), ``lfu`` (pick counts that outlive eviction, ties to
the least recent), ``dlfu`` (counts decayed by a half-life in uses of the tier: activation-aware, MoE-Infinity /
HybriMoE style; ``dlfu:halflife=H`` or ``dlfu:H``), ``belady`` (the future known: evict the key used farthest ahead,
bypass the incoming key when it is that key; ``BeladyPolicy.now`` is set by the caller; moetier.core.policies.belady),
and each published policy as its authors wrote it, one module each:
``2q`` (moetier.core.policies.twoq), ``slru`` (slru), ``sieve`` (sieve), ``s3fifo`` (s3fifo), ``wtinylfu``
(wtinylfu), and KTransformers' own ``kt-2q``, ``kt-slru``, ``kt-sieve``, ``kt-s3fifo``, ``kt-wtinylfu``
(ktransformers). A spec sets any parameter its module lists: ``2q:a1=0.25,ghost=0.5`` (moetier.core.policies.spec;
an unknown parameter or a bad value is a ValueError naming it). ``victim`` is told the incoming key before anything
is reclaimed: a policy with a ghost list looks the key up there first (moetier.core.policies.machine).

The shared parts live in moetier.core.policies.base. ``make(spec, capacity, future=None)`` builds one from a spec,
``parse(spec)`` checks one without building it; ``partitioned(...)`` splits a tier into per-layer
parts (each layer ``capacity // layers`` slots, the remainder to the first layers or, ``even``, to none) with a policy
each. ``replay(pol, seq)`` runs a stand-alone cache over an access sequence (hits), the known-answer harness of the
tests.
"""
from __future__ import annotations


from moetier.core.policies.base import _Queues
from moetier.core.policies.belady import BeladyPolicy
from moetier.core.policies.lfu import LFU
from moetier.core.policies.recency import FIFO, LRU
from moetier.core.policies import s3fifo, slru, twoq, wtinylfu
from moetier.core.policies.ktransformers import MACHINES as KT_MACHINES
from moetier.core.policies.machine import Machine
from moetier.core.policies.sieve import Sieve
from moetier.core.policies.spec import parse as parse_spec

__all__ = ["make", "parse", "partitioned", "replay", "POLICIES", "BeladyPolicy", "Partitioned"]


def _halflife(v) -> bool:
    return v > 0


# name -> (class, its parameters: name -> (default, check, expected), runs through Machine)
POLICIES = {"lru": (LRU, {}, False), "fifo": (FIFO, {}, False), "lfu": (LFU, {}, False),
            "dlfu": (LFU, {"halflife": (0.0, _halflife, "uses of the tier, above 0")}, False),
            "belady": (BeladyPolicy, {}, False), "sieve": (Sieve, {}, False),
            "2q": (twoq.TwoQ, twoq.PARAMS, True), "slru": (slru.SLRU, slru.PARAMS, True),
            "s3fifo": (s3fifo.S3FIFO, s3fifo.PARAMS, True), "wtinylfu": (wtinylfu.WTinyLFU, wtinylfu.PARAMS, True),
            **{n: (c, c.PARAMS, True) for n, c in KT_MACHINES.items()}}


def parse(spec: str) -> tuple[str, dict]:
    """(name, parameters with defaults filled) of a policy spec; ValueError naming what is wrong."""
    name = str(spec).partition(":")[0]
    if name not in POLICIES:
        raise ValueError(f"residency policy: expected one of {sorted(POLICIES)}, got {spec!r}")
    return parse_spec(spec, POLICIES[name][1], positional="halflife" if name == "dlfu" else None)


def make(spec: str, capacity: int, future: dict | None = None, base: int = 0, width: int = 64):
    """A policy from its spec (``dlfu`` alone: half-life 4 x capacity uses). ``base`` / ``width``: the keys it will
    see (a per-layer part's), what the array-state policies (moetier.core.policies.lfu) size for."""
    name, params = parse(spec)
    cls, _, machine = POLICIES[name]
    if name == "belady":
        if future is None:
            raise ValueError("residency policy 'belady' needs the future (an oracle bound only)")
        return BeladyPolicy(capacity, future, base, width)
    if name == "dlfu":
        return LFU(capacity, params["halflife"] or 4.0 * max(1, capacity), base, width)
    if name == "lfu":
        return LFU(capacity, 0.0, base, width)
    if name in ("lru", "fifo"):
        return cls(capacity, base, width)
    return Machine(cls(capacity, **params), name) if machine else cls(capacity)



class Partitioned(_Queues):
    """One policy per layer: a key of layer l = key // experts competes only with its own layer's keys; each part
    holds ``capacity // layers`` slots (the first ``capacity % layers`` layers one more; with ``even`` none: every
    layer the same share and the remainder unused, as kt-kernel sizes its Tier0 in expert ids per layer)."""
    name = "partitioned"

    def __init__(self, spec: str, capacity: int, layers: int, experts: int, future: dict | None = None,
                 even: bool = False):
        base, extra = divmod(capacity, layers)
        self.experts, self.capacity = experts, capacity
        self.caps = [base + (1 if l < extra and not even else 0) for l in range(layers)]
        self.parts = [make(spec, max(1, c), future, l * experts, experts) for l, c in enumerate(self.caps)]
        self.name = f"{self.parts[0].name}/layer"
        for slot in ("put", "evict_for"):     # the optional slots only where every part has them (the ledger checks)
            if not all(hasattr(p, slot) for p in self.parts):
                setattr(self, slot, None)

    def part(self, k):
        return self.parts[k // self.experts]

    def insert(self, k):
        self.part(k).insert(k)

    def hit(self, k):
        self.part(k).hit(k)

    def replace(self, old, new):
        """``remove(old)``, ``insert(new)``: one call where both are one part's and the part can."""
        p = self.part(new)
        if old // self.experts == new // self.experts and hasattr(p, "replace"):
            p.replace(old, new)
        else:
            self.part(old).remove(old)
            p.insert(new)

    def hit_many(self, keys):
        """``hit`` of each of ``keys``: one call per part where the part takes a batch (one layer call's keys are
        one part's)."""
        if not keys:
            return
        p = self.parts[keys[0] // self.experts]
        if hasattr(p, "hit_within") and p.hit_within(keys, self.experts):   # all within the part's layer
            return
        for k in keys:
            self.part(k).hit(k)

    def remove(self, k):
        self.part(k).remove(k)

    def put(self, k, pins):
        """The incoming key's part's ``put`` on its share of the slots: a victim of its own layer, if any."""
        l = k // self.experts
        return self.parts[l].put(k, pins, self.caps[l])

    def evict_for(self, k, pins):
        """The incoming key's part's ``evict_for``: a victim of its own layer, or None."""
        return self.part(k).evict_for(k, pins)

    def within_shares(self, keys) -> list:
        """``keys`` in order, leaving out each key whose layer has had its share of slots among those before it."""
        left, out = list(self.caps), []
        for k in keys:
            l = k // self.experts
            if left[l] > 0:
                left[l] -= 1
                out.append(k)
        return out

    def full(self, k) -> bool:
        """The incoming key's layer has used its share of slots."""
        return len(self.part(k)) >= self.caps[k // self.experts]

    def victim(self, k, ok):
        return self.part(k).victim(k, ok)

    def __contains__(self, k):
        return k in self.part(k)

    def __len__(self):
        return sum(len(p) for p in self.parts)



def partitioned(spec: str, capacity: int, layers: int, experts: int, future: dict | None = None,
                even: bool = False) -> Partitioned:
    return Partitioned(spec, capacity, layers, experts, future, even)


def replay(pol, seq, capacity: int | None = None) -> int:
    """Hits of a stand-alone cache run by ``pol`` over the access sequence ``seq`` (no pins). A Belady policy's
    ``now`` follows the position."""
    cap = pol.capacity if capacity is None else capacity
    hits = 0
    always = (lambda _k: True)
    part = isinstance(pol, Partitioned)
    for i, k in enumerate(seq):
        if isinstance(pol, BeladyPolicy):
            pol.now = i
        elif part and isinstance(pol.parts[0], BeladyPolicy):
            for p in pol.parts:
                p.now = i
        if k in pol:
            hits += 1
            pol.hit(k)
            continue
        full = pol.full(k) if part else len(pol) >= cap
        if full:
            v = pol.victim(k, always)
            if v is None or v == k:
                continue
            pol.remove(v)
        pol.insert(k)
    return hits
