"""Handles and the sequence watermark every backend shares: fills (the O_DIRECT reader's completions) and copies
(push / drain on a device copy queue, finished by a device event) under one monotonic ``seq`` per backend.

Contract
--------
``Sequencer(reader, poll, block, name, on_landed=None)``: ``poll(event) -> bool`` asks a device event whether it
finished without blocking, ``block(event)`` waits for it; both raise on a failed copy (the message becomes the
handle's error). ``on_landed(handle)``, when given, is called once per copy as it is first seen landed (an engine
that points its tables at a slot does it there, so a table row never precedes its bytes).

- ``fill(key, slot, prefetch=)`` -> FillHandle; ``copy(kind, key, src, dst, start)`` -> CopyHandle, where
  ``start()`` enqueues the copy and returns its event (None: the copy was synchronous and has landed); a seq is
  taken only when the issue succeeded.
- ``landed(h)`` non-blocking, ``wait(h)`` blocking; both raise TransportError for a failed transfer.
- ``cancel(h)`` withdraws a queued prefetch fill (False for anything else).
- ``completed_seq()`` is the highest ``s`` such that every handle with ``seq <= s`` finished (landed or failed).
- ``copies_done()`` marks every pending copy finished after the caller drained its device queues (fence).

``SequencedBackend`` is the mixin the device backends share: the contract's fill / cancel / landed / wait /
completed_seq delegate to a Sequencer, begin_measured / read_timing to the fills' Reader, route to a router
(moetier.run.router.StoreRouter; None: the backend has none). A subclass hands the three over once they exist:
``SequencedBackend.__init__(self, events=, reader=, router=)``; a verb used before that raises one AttributeError
saying so.

``ReaderFills`` is the same for a backend without device copies (host memory only): fill / cancel / landed / wait /
fence / completed_seq and the telemetry (stats, begin_measured, read_timing) are the fills' Reader's, handed over
as ``ReaderFills.__init__(self, reader=)``; the Reader's completions are the handles.

Handles expose ``seq``, ``key``, ``kind``, ``state`` (pending | landed | failed | cancelled), ``prefetch``,
``t_submit`` and ``t_landed`` (perf_counter seconds, 0.0 when not timed) - what the runtime reads
(moetier.run.contract.Handle).
"""
from __future__ import annotations

import threading

from moetier.bytes.transport import TransportError


class FillHandle:
    """A reader completion (NVMe record -> RAM slot) under the backend's seq."""

    __slots__ = ("seq", "key", "slot", "comp")
    kind = "fill"

    def __init__(self, seq: int, comp):
        self.seq, self.key, self.slot, self.comp = seq, comp.key, comp.slot, comp

    @property
    def state(self) -> str:
        return self.comp.state

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
        return f"FillHandle(seq={self.seq}, key={self.key}, slot={self.slot}, state={self.state})"


class CopyHandle:
    """A push (RAM slot -> VRAM slot) or drain (VRAM slot -> RAM slot), finished by a device event."""

    __slots__ = ("seq", "key", "kind", "src", "dst", "event", "state", "error")
    prefetch = False
    t_submit = 0.0
    t_landed = 0.0

    def __init__(self, seq: int, key: int, kind: str, src: int, dst: int, event):
        self.seq, self.key, self.kind, self.src, self.dst, self.event = seq, key, kind, src, dst, event
        self.state = "pending"
        self.error = None

    def __repr__(self):
        return f"CopyHandle(seq={self.seq}, {self.kind} key={self.key} {self.src}->{self.dst}, state={self.state})"


class Sequencer:
    def __init__(self, reader, poll, block, name: str, on_landed=None):
        self.reader, self._poll, self._block, self.name = reader, poll, block, name
        self._on_landed = on_landed
        self._lock = threading.Lock()
        self._seq = 0
        self._done_seq = 0
        self._pending: dict[int, object] = {}      # seq -> handle not yet seen finished (issue order)
        self.closed = False
        self.copy_failures = 0

    def _issue(self, make):
        with self._lock:
            if self.closed:
                raise TransportError(f"{self.name} backend: closed")
            h = make(self._seq + 1)
            self._seq = h.seq
            self._pending[h.seq] = h
            return h

    def fill(self, key: int, slot: int, *, prefetch: bool = False) -> FillHandle:
        return self._issue(lambda seq: FillHandle(seq, self.reader.fill(key, slot, prefetch=prefetch)))

    def copy(self, kind: str, key: int, src: int, dst: int, start) -> CopyHandle:
        def make(seq):
            try:
                ev = start()
            except TransportError:
                self.copy_failures += 1
                raise
            return CopyHandle(seq, int(key), kind, int(src), int(dst), ev)
        h = self._issue(make)
        if h.event is None:
            self._landed_now(h)
        return h

    def _landed_now(self, h: CopyHandle) -> None:
        h.state = "landed"
        if self._on_landed is not None:
            self._on_landed(h)

    def cancel(self, h) -> bool:
        return isinstance(h, FillHandle) and bool(self.reader.cancel(h.comp))

    def _settle(self, h: CopyHandle, block: bool) -> bool:
        """Ask the device whether copy ``h`` finished; a failure is kept on the handle."""
        if h.state == "pending":
            try:
                if block:
                    self._block(h.event)
                    done = True
                else:
                    done = bool(self._poll(h.event))
            except Exception as e:   # the device runtime's own error type: kept as the handle's one-line reason
                h.state, h.error = "failed", f"{self.name} backend: {h.kind} of key {h.key} failed: {e}"
                self.copy_failures += 1
                return True
            if done:
                self._landed_now(h)
        return h.state != "pending"

    def landed(self, h) -> bool:
        if isinstance(h, FillHandle):
            return self.reader.landed(h.comp)
        self._settle(h, block=False)
        if h.state == "failed":
            raise TransportError(h.error)
        return h.state == "landed"

    def wait(self, h):
        if isinstance(h, FillHandle):
            self.reader.wait(h.comp)
            return h
        self._settle(h, block=True)
        if h.state == "failed":
            raise TransportError(h.error)
        return h

    def _finished(self, h) -> bool:
        if isinstance(h, FillHandle):
            return h.comp.state != "pending"
        return self._settle(h, block=False)

    def copies_done(self) -> None:
        with self._lock:
            for h in self._pending.values():
                if isinstance(h, CopyHandle) and h.state == "pending":
                    self._landed_now(h)

    def completed_seq(self) -> int:
        with self._lock:
            for s in list(self._pending):            # dicts keep issue order, and seqs are issued in order
                if not self._finished(self._pending[s]):
                    self._done_seq = s - 1
                    break
                del self._pending[s]
            else:
                self._done_seq = self._seq
            return self._done_seq

    @property
    def outstanding(self) -> int:
        self.completed_seq()
        return len(self._pending)


class SequencedBackend:
    _NEEDS = ("events", "reader", "router")

    def __init__(self, *, events: Sequencer, reader, router=None):
        self.events, self.reader, self.router = events, reader, router

    def __getattr__(self, name):
        # only reached when normal lookup failed: a subclass that never handed its parts over
        if name in SequencedBackend._NEEDS:
            raise AttributeError(f"{type(self).__name__}: SequencedBackend needs self.{name}; call "
                                 "SequencedBackend.__init__(self, events=, reader=, router=) in __init__")
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def fill(self, key: int, slot: int, *, prefetch: bool = False):
        return self.events.fill(int(key), int(slot), prefetch=prefetch)

    def cancel(self, handle) -> bool:
        return self.events.cancel(handle)

    def landed(self, handle) -> bool:
        return self.events.landed(handle)

    def wait(self, handle):
        return self.events.wait(handle)

    def completed_seq(self) -> int:
        """Highest s such that every fill/push/drain with seq <= s finished (landed or failed)."""
        return self.events.completed_seq()

    def begin_measured(self) -> None:
        self.reader.begin_measured()

    def read_timing(self) -> dict:
        return self.reader.read_timing()

    def route(self, layer: int, x, rows=None):
        """The model's top-k router on hidden states x [rows, H] (on the host), its weights from the store."""
        if self.router is None:
            from moetier.run.contract import BackendUnavailable
            raise BackendUnavailable(f"{type(self).__name__}: no router of its own; route by a trace")
        return self.router.route(layer, x, rows)


class ReaderFills:
    def __init__(self, *, reader):
        self.reader = reader

    def fill(self, key: int, slot: int, *, prefetch: bool = False):
        return self.reader.fill(key, slot, prefetch=prefetch)

    def cancel(self, handle) -> bool:
        return self.reader.cancel(handle)

    def landed(self, handle) -> bool:
        return self.reader.landed(handle)

    def wait(self, handle):
        return self.reader.wait(handle)

    def fence(self) -> None:
        self.reader.fence()

    def completed_seq(self) -> int:
        return self.reader.completed_seq()

    @property
    def stats(self) -> dict:
        return dict(self.reader.stats)

    def begin_measured(self) -> None:
        self.reader.begin_measured()

    def read_timing(self) -> dict:
        return self.reader.read_timing()
