"""Deliberately BROKEN backends whose transfer handles lie - landed() (early, never, over a failure), wait(), fence(),
cancel(), completed_seq() and seq - and ``_Wrap``, the base of every mutant; test-only, listed with the others in
conformance.broken.MUTANTS."""
from __future__ import annotations

import threading

from moetier.bytes.transport import TransportError

HOLD = 5              # landed() polls a held transfer answers False before it reports landed


class _Wrap:
    """Forwards everything to the wrapped backend; subclasses override the verb they break."""

    def __init__(self, inner):
        self._inner = inner
        self.capabilities = inner.capabilities

    def __getattr__(self, name):
        return getattr(self._inner, name)


# -- landed / fence / seq ---------------------------------------------------------------------------------------------

class _H:
    """A wrapped handle (seq, key) around the inner backend's handle, started later."""

    __slots__ = ("seq", "key", "inner", "start")
    prefetch = False

    def __init__(self, seq, key, start):
        self.seq, self.key, self.inner, self.start = seq, key, None, start

    @property
    def state(self):
        return self.inner.state if self.inner is not None else "pending"

    t_submit = t_landed = 0.0


class _Deferred(_Wrap):
    """Transfers of the kinds in ``DEFER`` (fill, prefetch: prefetch fills only, push) start only on wait() or
    fence(); landed() of them is True at once."""

    DEFER: tuple = ()

    def __init__(self, inner):
        super().__init__(inner)
        self._seq = 0
        self._deferred: list = []

    def _defer(self, key, start):
        self._seq += 1
        h = _H(self._seq, int(key), start)
        self._deferred.append(h)
        return h

    def _go(self, h):
        if h.inner is None:
            h.inner = h.start()
            self._deferred.remove(h)

    def fill(self, key, slot, *, prefetch=False):
        if "fill" not in self.DEFER and not (prefetch and "prefetch" in self.DEFER):
            return self._inner.fill(key, slot, prefetch=prefetch)
        self._inner.ram_view(slot)[:] = 0
        return self._defer(key, lambda: self._inner.fill(key, slot))

    def push(self, key, src_slot, vram_slot):
        if "push" not in self.DEFER:
            return self._inner.push(key, src_slot, vram_slot)
        return self._defer(key, lambda: self._inner.push(key, src_slot, vram_slot))

    def landed(self, h):
        return True if isinstance(h, _H) else self._inner.landed(h)      # the lie

    def wait(self, h):
        if isinstance(h, _H):
            self._go(h)
            self._inner.wait(h.inner)
            return h
        return self._inner.wait(h)

    def fence(self):
        for h in list(self._deferred):
            self._go(h)
        self._inner.fence()


class BrokenLandedEarly(_Deferred):
    """BROKEN: landed() of a fill is True while the slot still holds zeros; the read starts only on wait()/fence()."""

    DEFER = ("fill",)

    def completed_seq(self):
        return self._seq


class BrokenPrefetchLandedEarly(BrokenLandedEarly):
    """BROKEN: as BrokenLandedEarly, for prefetch fills only (demand fills are honest)."""

    DEFER = ("prefetch",)


class BrokenPushLandedEarly(_Deferred):
    """BROKEN: landed() of a push is True before the copy ends (it starts only on wait()/fence())."""

    DEFER = ("push",)


class BrokenLandedNever(_Wrap):
    """BROKEN: landed() never says True (wait() and fence() still work)."""

    def landed(self, h):
        return False


class _Issued(_Wrap):
    """Passes the handle of every fill, push and drain through ``_issued(h)`` (what the caller gets back)."""

    def _issued(self, h):
        return h

    def fill(self, key, slot, *, prefetch=False):
        return self._issued(self._inner.fill(key, slot, prefetch=prefetch))

    def push(self, key, src_slot, vram_slot):
        return self._issued(self._inner.push(key, src_slot, vram_slot))

    def drain(self, key, vram_slot, ram_slot):
        return self._issued(self._inner.drain(key, vram_slot, ram_slot))


class _Held(_Issued):
    """Every transfer whose seq is picked by ``_held_seq`` answers landed() False for its first HOLD polls (a slow
    transfer: legal); wait() and a true fence() release it."""

    def __init__(self, inner):
        super().__init__(inner)
        self._polls: dict = {}
        self._all: list = []

    def _held_seq(self, seq: int) -> bool:
        return True

    def _issued(self, h):
        self._all.append(h)
        if self._held_seq(h.seq):
            self._polls[id(h)] = HOLD
        return h

    def _is_held(self, h) -> bool:
        return self._polls.get(id(h), 0) > 0

    def landed(self, h):
        if self._is_held(h):
            self._polls[id(h)] -= 1
            return False
        return self._inner.landed(h)

    def wait(self, h):
        self._polls.pop(id(h), None)
        return self._inner.wait(h)

    def fence(self):
        self._inner.fence()
        self._polls.clear()


class BrokenOutOfOrder(_Held):
    """BROKEN: completed_seq() is the highest seq that landed, not the highest below which everything landed: with
    the even-seq transfers held back, it covers handles that have not landed."""

    def _held_seq(self, seq):
        return seq % 2 == 0

    def completed_seq(self):
        done = [h.seq for h in self._all if not self._is_held(h) and self._inner.landed(h)]
        return max(done, default=0)


class BrokenSeqStuck(_Wrap):
    """BROKEN: completed_seq() stays 0 however many transfers land."""

    def completed_seq(self):
        return 0


class BrokenFenceEarly(_Held):
    """BROKEN: fence() returns at once, with transfers still held (landed() False after it)."""

    def fence(self):
        return None


class BrokenFenceNever(_Wrap):
    """BROKEN: fence() never returns, and so neither does close(), which fences first as the contract's close does
    (both block on an event nothing sets; the process that gave up on them ends without them)."""

    def __init__(self, inner):
        super().__init__(inner)
        self._never = threading.Event()

    def fence(self):
        self._never.wait()

    def close(self):
        self.fence()
        self._inner.close()


class BrokenWaitNever(_Wrap):
    """BROKEN: wait() never returns (landed() and fence() still work)."""

    def __init__(self, inner):
        super().__init__(inner)
        self._never = threading.Event()

    def wait(self, h):
        self._never.wait()


class BrokenFailureHidden(_Wrap):
    """BROKEN: a failed transfer (EIO, short read, checksum mismatch) reports landed; wait() returns as if it had."""

    def landed(self, h):
        try:
            return self._inner.landed(h)
        except TransportError:
            return True

    def wait(self, h):
        try:
            return self._inner.wait(h)
        except TransportError:
            return h


class BrokenCancelLies(_Wrap):
    """BROKEN: cancel() says every read was withdrawn; the read still lands, in a slot the host has reused."""

    def cancel(self, h):
        return True


class BrokenSeq(_Issued):
    """BROKEN: handle seq numbers decrease (1_000_000 - the real seq)."""

    def _issued(self, h):
        w = _H(1_000_000 - h.seq, h.key, None)
        w.inner = h
        return w

    def landed(self, h):
        return self._inner.landed(h.inner)

    def wait(self, h):
        self._inner.wait(h.inner)
        return h


class BrokenHandleKey(BrokenSeq):
    """BROKEN: a handle carries the next key, not the one it was issued for (its seq is right)."""

    def _issued(self, h):
        w = _H(h.seq, h.key + 1, None)
        w.inner = h
        return w
