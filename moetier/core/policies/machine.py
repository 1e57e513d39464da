"""A cache written as its authors wrote it (one ``access`` per request: look up, reclaim, insert) run as a tier's
policy (moetier.core.policies.residency: insert, hit, remove, victim).

Contract
--------
A machine holds keys and has ``access(k) -> list of dropped keys`` (a hit or a miss, in the reference's order: the
ghost looked up, then space reclaimed, then ``k`` placed), ``discard(k)`` (``k`` left the tier by other means: no
ghost), ``order()`` (resident keys, first to go first) and ``in`` / ``len``.

``Machine(machine)`` runs it under the tier's protocol. The tier tells the policy the incoming key before it asks
for room: ``victim(k, ok)`` runs ``access(k)`` at once, so the ghost is consulted before anything is reclaimed
(libCacheSim's find, evict, insert), and names a dropped key. A key the machine dropped while the tier still holds
it (a reference that evicts on a hit, KTransformers' 2Q; or a dropped key that was pinned) is an *orphan*: it keeps
its slot and is the first ``victim`` names once it may go; a hit on it is a miss to the machine. ``victim`` returns
``k`` when the machine keeps ``k`` out (an admission filter), and, when every dropped key is pinned, the first
key of ``order()`` that may go. Without pins the machine's keys are, after every request, exactly the reference's.
Pure.
"""
from __future__ import annotations

from collections import OrderedDict

__all__ = ["Machine"]


class Machine:
    __slots__ = ("m", "orphans", "pending", "capacity", "name")

    def __init__(self, machine, name: str):
        self.m = machine
        self.orphans: OrderedDict = OrderedDict()
        self.pending = None                  # the key ``victim`` already accessed, for the ``insert`` that follows
        self.capacity = machine.capacity
        self.name = name

    def __contains__(self, k):
        return k in self.m or k in self.orphans

    def __len__(self):
        return len(self.m) + len(self.orphans)

    def resident(self) -> set:
        """The machine's own keys (the reference's resident set), orphans left out."""
        return set(self.m.order())

    def _access(self, k):
        self.orphans.pop(k, None)
        for d in self.m.access(k):
            self.orphans[d] = None
        if k not in self.m:                  # the machine did not keep k (a cache of no slots for it)
            self.orphans[k] = None

    def insert(self, k):
        if self.pending == k:
            self.pending = None
            return
        self._access(k)

    hit = _access

    def remove(self, k):
        if self.orphans.pop(k, 0) is None:
            return
        self.m.discard(k)
        if self.pending == k:
            self.pending = None

    def victim(self, k, ok):
        if k is not None and self.pending != k and k not in self.m:
            self.pending = k
            self._access(k)
            if k in self.orphans:            # kept out by the machine (an admission filter)
                del self.orphans[k]
                self.pending = None
                return k
        for o in self.orphans:
            if o != k and ok(o):
                return o
        for o in self.m.order():
            if o != k and ok(o):
                return o
        if self.pending == k and k is not None:     # nothing may go: the tier refuses k
            self.m.discard(k)
            self.pending = None
        return None
