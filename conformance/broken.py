"""Deliberately BROKEN backends - test-only, used by tests/test_conformance_meta.py to show the suite catches
breakage. Never use them for anything else.

Each wraps a working backend (the cpu backend; see conformance.capabilities.open_backend) and breaks exactly one
promise of the contract:

* ``BrokenLandedEarly``   - landed() is True at once, before the bytes are in the slot (the read only starts
                            when someone wait()s or fence()s)
* ``BrokenNondeterministic`` - compute() adds tiny noise: still within NMSE, never bit-identical twice
* ``BrokenBytes``         - a landed fill has one byte flipped
* ``BrokenSeq``           - handle seq numbers run backwards
"""
from __future__ import annotations

import numpy as np


class _Wrap:
    def __init__(self, inner):
        self._inner = inner
        self.capabilities = inner.capabilities

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def compute(self, lane, jobs, x):
        return self._inner.compute(lane, jobs, x)

    def fill(self, key, slot, *, prefetch=False):
        return self._inner.fill(key, slot, prefetch=prefetch)

    def push(self, key, src_slot, vram_slot):
        return self._inner.push(key, src_slot, vram_slot)

    def drain(self, key, vram_slot, ram_slot):
        return self._inner.drain(key, vram_slot, ram_slot)

    def landed(self, h):
        return self._inner.landed(h)

    def wait(self, h):
        return self._inner.wait(h)

    def fence(self):
        return self._inner.fence()

    def completed_seq(self):
        return self._inner.completed_seq()

    def close(self):
        return self._inner.close()


class _H:
    """A wrapped handle (seq, key) around the inner backend's handle."""

    __slots__ = ("seq", "key", "inner", "slot", "started")
    prefetch = False

    def __init__(self, seq, key, inner=None, slot=-1):
        self.seq, self.key, self.inner, self.slot, self.started = seq, key, inner, slot, inner is not None

    @property
    def state(self):
        return self.inner.state if self.inner is not None else "pending"

    @property
    def t_submit(self):
        return self.inner.t_submit if self.inner is not None else 0.0

    @property
    def t_landed(self):
        return self.inner.t_landed if self.inner is not None else 0.0


class BrokenLandedEarly(_Wrap):
    """BROKEN: landed() says True while the slot still holds zeros; the read starts only on wait()/fence()."""

    def __init__(self, inner):
        super().__init__(inner)
        self._seq = 0
        self._deferred: list[_H] = []

    def fill(self, key, slot, *, prefetch=False):
        self._inner.ram_view(slot)[:] = 0
        self._seq += 1
        h = _H(self._seq, int(key), slot=int(slot))
        self._deferred.append(h)
        return h

    def _start(self, h):
        if not h.started:
            h.inner = self._inner.fill(h.key, h.slot)
            h.started = True
            self._deferred.remove(h)

    def landed(self, h):
        return True                                   # the lie

    def wait(self, h):
        self._start(h)
        self._inner.wait(h.inner)
        return h

    def fence(self):
        for h in list(self._deferred):
            self._start(h)
        self._inner.fence()

    def completed_seq(self):
        return self._seq


class BrokenNondeterministic(_Wrap):
    """BROKEN: every compute() adds fresh noise of relative size 1e-6 (passes NMSE, fails bit-identity)."""

    def __init__(self, inner):
        super().__init__(inner)
        self._rng = np.random.default_rng()

    def compute(self, lane, jobs, x):
        out = self._inner.compute(lane, jobs, x)
        return {k: (y * (1 + 1e-6 * self._rng.standard_normal(y.shape))).astype(np.float32) for k, y in out.items()}


class BrokenBytes(_Wrap):
    """BROKEN: once a fill has landed, one byte of the slot is flipped."""

    def __init__(self, inner):
        super().__init__(inner)
        self._flipped: set = set()

    def _flip(self, h):
        if h.state == "landed" and h.seq not in self._flipped:
            self._flipped.add(h.seq)
            v = self._inner.ram_view(h.slot)
            i = (h.key * 7919) % int(self._inner.store.record_bytes)
            v[i] ^= 0x5A

    def landed(self, h):
        ok = self._inner.landed(h)
        if ok:
            self._flip(h)
        return ok

    def wait(self, h):
        r = self._inner.wait(h)
        self._flip(h)
        return r

    def fence(self):
        self._inner.fence()


class BrokenSeq(_Wrap):
    """BROKEN: handle seq numbers decrease (1_000_000 - the real seq)."""

    def _wrap(self, h):
        return _H(1_000_000 - h.seq, h.key, h, getattr(h, "slot", -1))

    def fill(self, key, slot, *, prefetch=False):
        return self._wrap(self._inner.fill(key, slot, prefetch=prefetch))

    def push(self, key, src_slot, vram_slot):
        return self._wrap(self._inner.push(key, src_slot, vram_slot))

    def drain(self, key, vram_slot, ram_slot):
        return self._wrap(self._inner.drain(key, vram_slot, ram_slot))

    def landed(self, h):
        return self._inner.landed(h.inner)

    def wait(self, h):
        self._inner.wait(h.inner)
        return h


BROKEN = {
    "broken-landed-early": BrokenLandedEarly,
    "broken-nondeterministic": BrokenNondeterministic,
    "broken-bytes": BrokenBytes,
    "broken-seq": BrokenSeq,
}
