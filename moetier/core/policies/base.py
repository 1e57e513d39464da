"""The shared parts of the tier replacement policies (moetier.core.policies.residency): queue membership,
a lazily invalidated heap, the first key a tier may evict. Pure."""
from __future__ import annotations

import heapq

__all__ = ["_Queues", "_Heaped"]


class _Queues:
    """Membership and size over the policy's queues (the attributes named in ``_queues``)."""
    _queues: tuple = ()

    def __contains__(self, k):
        return any(k in getattr(self, q) for q in self._queues)

    def __len__(self):
        return sum(len(getattr(self, q)) for q in self._queues)


class _Heaped(_Queues):
    """Resident keys (``res``: key -> its order) popped from a lazily invalidated heap of (order..., key)."""
    _queues = ("res",)

    def remove(self, k):
        self.res.pop(k, None)

    def _top(self, ok):
        """The first resident key in heap order with ok(key), left in the heap; stale entries are dropped."""
        heap, skipped, out = self.heap, [], None
        while heap:
            e = heapq.heappop(heap)
            if self._stale(e):            # (Belady's refresh pushes the key's new entry)
                continue
            skipped.append(e)
            if ok(e[-1]):
                out = e[-1]
                break
        for e in skipped:
            heapq.heappush(self.heap, e)
        if len(self.heap) > 4 * len(self.res) + 64:
            self.heap = [self._entry(x) for x in self.res]
            heapq.heapify(self.heap)
        return out
