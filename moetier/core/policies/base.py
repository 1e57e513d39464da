"""The shared parts of the tier replacement policies (moetier.core.policies.residency): membership and size over a
policy's queues; a layer's hits as one batch for the array-state policies. Pure."""
from __future__ import annotations

__all__ = ["_Queues", "_Batched"]


class _Queues:
    """Membership and size over the policy's queues (the attributes named in ``_queues``)."""
    _queues: tuple = ()

    def __contains__(self, k):
        return any(k in getattr(self, q) for q in self._queues)

    def __len__(self):
        return sum(len(getattr(self, q)) for q in self._queues)


class _Batched:
    """``hit_many`` over a policy's ``hit_within`` (one compiled call) and ``_index`` (which grows its arrays)."""

    def hit_many(self, keys):
        """``hit`` of each of ``keys`` in turn, in one compiled call."""
        if keys and not self.hit_within(keys):
            for k in keys:
                self._index(k)           # grows the arrays (a key below the first is an error)
            self.hit_within(keys)
