"""A FAKE backend for the stall tests (tests/test_chaos.py), in a module of its own so that the test and the
``moetier.backends`` entry point the CLI test installs load one and the same class."""
from __future__ import annotations

import threading


class FakeStopsLanding:
    """A FAKE backend (test-only): the real cpu backend until ``after`` transfers have landed, then nothing lands
    again - landed() answers False, wait() and fence() block for good (close() fences first, so it blocks too). It
    stands for a device whose completions stopped mid-run; ``release()`` lets the blocked calls go at the end."""

    after = 0           # set per test (the CLI constructs the fake through its entry point) ...
    made: list = []     # ... and finds the instances here

    def __init__(self, store, *, ram_slots, vram_slots=0, **options):
        from backends.cpu.backend import CpuBackend
        self._inner = CpuBackend(store, ram_slots=ram_slots, vram_slots=vram_slots, **options)
        self.capabilities, self.ram_slot_count = self._inner.capabilities, self._inner.ram_slot_count
        self.seen: dict = {}          # id -> handle reported landed (held, so that no id is reused)
        self.gate = threading.Event()
        self.blocked: list = []       # the verbs that blocked
        self.closing = False
        self.landed_before_compute = None   # how many transfers had landed when the first layer computed
        self.made.append(self)

    def __getattr__(self, name):        # telemetry, workers, parallel_min: the real backend's
        return getattr(self._inner, name)

    def _stopped(self) -> bool:
        return len(self.seen) >= self.after and not self.gate.is_set()

    def _block(self, verb: str) -> None:
        self.blocked.append(verb)
        self.gate.wait()

    def compute(self, lane, jobs, x):
        if self.landed_before_compute is None:
            self.landed_before_compute = len(self.seen)
        return self._inner.compute(lane, jobs, x)

    def fill(self, key, slot, *, prefetch=False):
        return self._inner.fill(key, slot, prefetch=prefetch)

    def cancel(self, h):
        return self._inner.cancel(h)

    def landed(self, h):
        if self._stopped() and id(h) not in self.seen:
            return False
        done = self._inner.landed(h)
        if done:
            self.seen[id(h)] = h
        return done

    def wait(self, h):
        if self._stopped() and id(h) not in self.seen:
            self._block("wait")
        self._inner.wait(h)
        self.seen[id(h)] = h
        return h

    def fence(self):
        if self._stopped():
            self._block("fence")
        self._inner.fence()

    def completed_seq(self):
        return self._inner.completed_seq()

    def close(self):
        self.closing = True
        self.fence()
        self._inner.close()

    def release(self) -> None:
        """Let the blocked calls go; the real backend is closed by the blocked close() or here."""
        self.gate.set()
        if not self.closing:
            self._inner.close()
