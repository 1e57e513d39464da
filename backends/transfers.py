"""Transfer handles and their bookkeeping, shared by the backends whose pushes and drains complete by an event.

Contract: a backend that mixes in ``EventTransfers`` keeps ``self.reader`` (moetier.bytes.transport.Reader, the fills),
``self._pending`` (an OrderedDict seq -> handle of every transfer not yet seen finished, in seq order), ``self._seq``
(the last seq handed out) and implements ``_copy_done(handle, block) -> bool`` for its CopyHandles (True once
landed; raises TransportError for a failed copy). The mixin gives the contract's ``landed``, ``wait`` and
``completed_seq`` over both kinds of handle.
"""
from __future__ import annotations

from moetier.bytes.transport import TransportError


class FillHandle:
    """A fill (NVMe record -> RAM slot) with the backend-wide seq; wraps the Reader's Completion."""

    __slots__ = ("seq", "key", "slot", "comp")
    kind = "fill"

    def __init__(self, seq, key, slot, comp):
        self.seq, self.key, self.slot, self.comp = seq, key, slot, comp

    @property
    def state(self):
        return self.comp.state

    # the rest of a contract handle (moetier.run.contract.Handle): the read's kind and times, from the reader
    @property
    def prefetch(self) -> bool:
        return bool(self.comp.prefetch)

    @property
    def t_submit(self) -> float:
        return self.comp.t_submit

    @property
    def t_landed(self) -> float:
        return self.comp.t_landed

    def __repr__(self):
        return f"FillHandle(seq={self.seq}, key={self.key}, slot={self.slot}, state={self.comp.state})"


class CopyHandle:
    """A push (RAM slot -> VRAM slot) or drain (VRAM slot -> RAM slot) on a copy stream, completed by an event."""

    __slots__ = ("seq", "key", "kind", "src", "dst", "event", "state", "error")
    prefetch = False          # a copy is never a prefetch read, and carries no read times
    t_submit = 0.0
    t_landed = 0.0

    def __init__(self, seq, key, kind, src, dst, event):
        self.seq, self.key, self.kind, self.src, self.dst, self.event = seq, key, kind, src, dst, event
        self.state = "pending"
        self.error = None

    def __repr__(self):
        return f"CopyHandle(seq={self.seq}, key={self.key}, {self.kind} {self.src}->{self.dst}, state={self.state})"


class EventTransfers:
    def landed(self, handle) -> bool:
        if isinstance(handle, FillHandle):
            return self.reader.landed(handle.comp)
        return self._copy_done(handle, block=False)

    def wait(self, handle):
        if isinstance(handle, FillHandle):
            self.reader.wait(handle.comp)
        else:
            self._copy_done(handle, block=True)
        return handle

    def completed_seq(self) -> int:
        """Highest s such that every fill/push/drain with seq <= s finished (landed or failed)."""
        pend = self._pending
        while pend:
            seq, h = next(iter(pend.items()))
            if isinstance(h, FillHandle):
                if h.comp.state == "pending":
                    break
            elif h.state == "pending":
                try:
                    if not self._copy_done(h, block=False):
                        break
                except TransportError:
                    pass                      # failed counts as finished
            pend.popitem(last=False)
        return (next(iter(pend)) - 1) if pend else self._seq
