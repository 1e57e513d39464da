"""Waiting and landing: how the runtime waits for a transfer, reads a failed one again, and lands its bytes.

Contract
--------
``SlotAllocator(n, what)`` hands out the integer slots of one backend arena; a slot freed during a layer is reused
only after the layer ends (``end_layer``), so nothing the layer may still read is overwritten.

``Waits`` is a mixin of moetier.run.layer.Runtime (it needs ``be``, ``L``, ``stats``, ``ram``, ``ram_slot``,
``vram_slot``, ``wasted``, ``retries`` and ``wait_timeout_s`` on the instance):

- ``_wait(h, ticket, bucket, refill)`` blocks until ``h`` landed and returns the handle that landed. A failed read
  (EIO, short read, checksum mismatch; ``refill`` = its (key, slot)) is read again into the same slot up to
  ``retries`` times, each counted in ``stats["read_retries"]``; its bytes were never used (the reader zeroes a
  failed slot). A transfer that still fails, or one not landed after ``wait_timeout_s`` (a stalled completion),
  aborts its ticket and stops the run with a one-line ``UserError``. Every wait is bounded when ``wait_timeout_s``
  is set: the wait for an unused prefetch read whose slot is needed, and those at the end of a run, too, and the
  backend's closing ``fence`` (``_fence``: a fence that never returns stops the run with one line).
- ``within(call, timeout_s, what, why)`` bounds a blocking backend verb (fence, close) by a daemon thread.
- ``_fill_ram`` / ``_fill_now`` / ``_push_now`` / ``_drains`` carry out the ledger's fills, pushes and drains, each
  ``Ledger.land`` only after the backend reported its bytes landed, and free the host slots the landing frees.
- ``_wait_read`` is ``_wait`` for an NVMe pick, booking the read coverage of a layer's first wait.
"""
from __future__ import annotations

import threading
import time

from moetier.bytes.transport import TransportError
from moetier.errors import UserError
from moetier.run.booking import inner_s

WATCH_POLL_S = 0.0002   # how often a watched wait polls (only with wait_timeout_s)
RETRIES = 3     # a failed read (EIO, short, checksum mismatch) is read again this many times before the run stops


def within(call, timeout_s: float | None, what: str, why: str) -> None:
    """``call()``, within ``timeout_s`` seconds when one is set. A backend verb that blocks (fence, close) has no
    non-blocking form in the contract, so it runs on a daemon thread joined with the deadline; one that has not
    returned by then raises one ``UserError`` line naming ``what`` (the thread is left to the backend). What
    ``call`` raises is raised here."""
    if timeout_s is None:
        call()
        return
    raised: list = []

    def run():
        try:
            call()
        except BaseException as e:      # handed to the caller's thread, raised there
            raised.append(e)
    t = threading.Thread(target=run, name=f"moetier-{what.split()[-1]}", daemon=True)
    t.start()
    t.join(timeout_s)
    if t.is_alive():
        raise UserError(f"{what} did not return within {timeout_s:g} s ({why}); run stopped")
    if raised:
        raise raised[0]


class SlotAllocator:
    """Integer slots 0..n-1 of one backend arena; frees are deferred until the layer that used them ends."""

    def __init__(self, n: int, what: str):
        self.free = list(range(n - 1, -1, -1))
        self.later: list[int] = []
        self.what = what

    def alloc(self) -> int:
        if not self.free:
            raise UserError(f"{self.what} arena exhausted: more transfers in flight than the backend's arena holds "
                            f"(ram slots + headroom); lower --conc or policy.prefetch.budget")
        return self.free.pop()

    def release_later(self, slot: int) -> None:
        self.later.append(slot)

    def end_layer(self) -> None:
        self.free.extend(self.later)
        self.later.clear()


class Waits:
    def _fill_ram(self, keys, *, tickets: bool) -> None:
        """Fill keys into RAM slots at queue depth, coldest first so the hottest ends at the LRU's protected end."""
        L, be = self.L, self.be
        hs = []
        for k in reversed(keys):
            slot = self._alloc_ram()
            hs.append((k, L.begin_fill(k) if tickets else None, be.fill(k, slot), slot))
        for k, tk, h, slot in hs:
            self._wait(h, refill=(k, slot))
            if tk is not None:
                for ev in L.land(tk):
                    self._release_ram(ev)
            self.ram_slot[k] = slot
        self.ram.end_layer()

    def _fill_now(self, k, staging=False):
        tk = self.L.begin_fill(k, staging=staging)
        slot = self._alloc_ram()
        h = self.be.fill(k, slot)
        self._wait(h, tk, refill=(k, slot))
        self.L.land(tk)
        self.ram_slot[k] = slot
        return slot

    def _push_now(self, k, tp, protect=(), bucket="copy_s"):
        """tp = a push ticket: drain its victim first (same copy queue), then push, then land both. bucket: where
        the push's time is booked (stage_s for an NVMe pick's push, which the simulator counts as its stall)."""
        be, L = self.be, self.L
        self._drains(protect)
        h = be.push(k, self.ram_slot[k], tp.slot)
        self._wait(h, tp, bucket)
        self.stats["copies"] += 1
        for freed in L.land(tp):
            self._release_ram(freed)
        self.vram_slot[k] = tp.slot

    def _drains(self, protect=()):
        L, be = self.L, self.be
        for td in L.take_drains():
            slot = self._alloc_ram()
            h = be.drain(td.key, td.slot, slot)
            self._wait(h, td, "copy_s")
            self.stats["copies"] += 1
            self.vram_slot.pop(td.key, None)
            self.ram_slot[td.key] = slot
            for ev in L.land(td, protect):
                self._release_ram(ev)

    def _cancel(self, h) -> bool:
        return bool(self.be.cancel(h)) if h.prefetch else False

    def _alloc_ram(self) -> int:
        """A free RAM slot; if none, reclaim the oldest wasted prefetch read's slot (waiting for it if needed)."""
        if not self.ram.free and self.wasted:
            h, slot = self.wasted.pop(0)
            try:
                self._settled(h)
            except (TransportError, OSError):
                pass
            self.ram.free.append(slot)
        return self.ram.alloc()

    def _release_ram(self, k):
        s = self.ram_slot.pop(k, None)
        if s is not None:
            self.ram.release_later(s)

    def _wait_read(self, h, ticket, issued: tuple | None, refill: tuple) -> bool:
        """Wait for an NVMe pick's read; returns whether it had not landed yet (the host blocked on it). With
        ``issued`` = (end of the issue loop, _inner at it, reads issued, whether the layer predicts, the rows it
        predicts for) - given for a layer's first wait, when all its NVMe picks are demand reads issued then - also
        book its read coverage: from its submit (the reader's timestamp, else the loop's end) to this wait (the
        span; less the lane and copy time in it, the host's head start), and to its landing (and the square of
        landing minus wait, for the spread of that gap)."""
        pending = h.state == "pending"
        if issued is None:
            self._wait(h, ticket, refill=refill)
            return pending
        t_w = time.perf_counter()
        st = self.stats
        t_issued, inner0, reads, predicts, predict_rows = issued
        inner_w = inner_s(st)
        h = self._wait(h, ticket, refill=refill)
        t_sub, t_land = h.t_submit or t_issued, h.t_landed
        st["read_layers"] += 1
        st["read_span_s"] += t_w - t_sub
        st["read_head_s"] += max(0.0, t_w - t_sub - (inner_w - inner0))
        st["read_reads"] += reads
        st["read_predict"] += predicts
        st["read_predict_rows"] += predict_rows
        if t_land:
            st["read_latency_n"] += 1
            st["read_latency_s"] += t_land - t_sub
            st["read_gap_sq"] += (t_land - t_w) ** 2      # the gap's spread: lanes' and read's lateness together
        return pending

    def _wait(self, h, ticket=None, bucket="nvme_wait_s", refill: tuple | None = None):
        """Wait for a transfer to land. A failed read (``refill`` = its (key, slot)) is read again into the same
        slot up to ``retries`` times, each counted in stats["read_retries"]; its bytes were never used (the reader
        zeroes a failed slot). A transfer that still fails, or one that has not landed after ``wait_timeout_s``
        (a stalled completion), aborts its ticket and stops the run with one line. Returns the handle that landed
        (the last re-read's, after a retry)."""
        t0 = time.perf_counter()
        key = h.key
        tries = 0
        try:
            while True:
                try:
                    if self.wait_timeout_s is None:
                        self.be.wait(h)
                    else:
                        self._wait_until(h, time.perf_counter() + self.wait_timeout_s)
                    return h
                except TimeoutError:                    # before OSError: TimeoutError is one
                    if ticket is not None:
                        self.L.abort(ticket)
                    raise self._stalled(key) from None
                except (TransportError, OSError) as e:
                    if refill is None or tries >= self.retries:
                        if ticket is not None:
                            self.L.abort(ticket)
                        more = f" after {tries} retries" if tries else ""
                        raise UserError(f"transfer of key {key} failed{more}: {e}") from None
                    tries += 1
                    self.stats["read_retries"] += 1
                    h = self.be.fill(*refill)
        finally:
            self.stats[bucket] += time.perf_counter() - t0

    def _settled(self, h) -> None:
        """Block until transfer ``h`` finished, within ``wait_timeout_s`` when one is set (then a transfer still
        pending stops the run with one line, like a stalled demand read); raises what the backend's wait raises."""
        if self.wait_timeout_s is None:
            self.be.wait(h)
            return
        try:
            self._wait_until(h, time.perf_counter() + self.wait_timeout_s)
        except TimeoutError:
            raise self._stalled(h.key) from None

    def _stalled(self, key) -> UserError:
        return UserError(f"transfer of key {key} stalled: not landed after {self.wait_timeout_s:g} s (a stalled "
                         f"device fence); run stopped")

    def _wait_until(self, h, deadline: float) -> None:
        """The watchdog's wait: poll ``landed`` (non-blocking on every backend) until the deadline."""
        while not self.be.landed(h):
            if time.perf_counter() > deadline:
                raise TimeoutError
            time.sleep(WATCH_POLL_S)

    def _fence(self) -> None:
        """The backend's fence, within ``wait_timeout_s`` when one is set (``within``): a fence that never returns (a
        transfer the device cannot finish) stops the run with one line instead of hanging the process."""
        within(self.be.fence, self.wait_timeout_s, "backend fence", "a transfer the device cannot finish")

    def _quiet(self, h) -> None:
        """Let an unused read finish (bounded like every wait); its failure does not matter, a stall does."""
        try:
            self._settled(h)
        except (TransportError, OSError):
            pass
