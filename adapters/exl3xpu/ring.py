"""exl3xpu's VRAM victim ring: the evicting side's claim, and the host's side - which claims are new, and the drain that
publishes them safely.

Contract
--------
The ring is what exl3xpu's kernel writes when its device LRU (``moe_forward_cached``) evicts a VRAM expert and
``moe_set_victim_ring(meta, sel, buf)`` is set (variant a9): ``meta`` int32[4 + 2K] = [next search, claim seq, drops,
K, key[K], seq[K]], ``buf`` uint8[K * record] the evicted experts' bytes, ring slot i at ``i * record``. A claim is a
ring slot with key >= 0; the evicting side never reuses a slot until the host frees it (key = -1); ring full = the
eviction is dropped (``drops`` counts it) and the expert is simply not written back.

``Ring(K, record_bytes, host_alloc, device_alloc, memcpy, address, sync)`` holds the arrays: ``meta`` and the drain's
``staging`` record in host memory (``host_alloc``: USM host, which the device reads and writes), ``buf`` in device
memory (``device_alloc``); ``memcpy(dst, src, nbytes)`` copies between addresses (the op table's ``memcpy_async``),
``address(buf)`` is a buffer's address, ``sync()`` waits for the copies issued (None: they are synchronous). The
defaults (numpy arrays, ``ctypes.memmove``) keep the ring on the host.

* ``claim(key, src)`` is the evicting side (the kernel; the host when it plans the eviction itself): the record at
  address ``src`` is copied into the next free ring slot, then (key, seq) are published in ``meta`` - a claim is
  never visible before its bytes. Returns the ring slot, or None when the ring is full (``drops`` + 1).
* ``victims(meta)`` takes a lagged copy of ``meta`` (graph decode: the host reads one step behind) and returns the
  claims not handled yet, as (ring slot, key, seq), in ring-slot order.
* ``drain(slot, key, seq, page, res, busy, ppend)`` runs the write-back in the only safe order (reference section 4.4,
  ``NvTierAsyncRing``): 1. ring slot -> ``staging`` (``memcpy``: the side stream), 2. staging -> the key's RAM page
  (a host memmove), 3. only then ``res[key] = 1``. Guards: a key in ``busy`` (vr_busy: a write-back of it already in
  flight) and a key in ``ppend`` (its RAM page has a punch - another write - still pending) are skipped, left claimed
  for a later step. The claim stays in the ring, marked handled, until ``release(slot)`` frees it (key = -1): the
  caller releases it once the landing was published (the ledger's ram_put), so the evicting side cannot reuse a ring
  slot whose write-back is still being published.
"""
from __future__ import annotations

import ctypes

import numpy as np

HEAD = 4                       # next search, claim seq, drops, K


def _np_alloc(n: int) -> np.ndarray:
    return np.zeros(int(n), np.uint8)


def _np_address(buf) -> int:
    return int(buf.ctypes.data)


class Ring:
    def __init__(self, K: int, record_bytes: int, host_alloc=None, device_alloc=None, memcpy=None, address=None,
                 sync=None):
        host_alloc = host_alloc or _np_alloc
        self.K, self.record_bytes = int(K), int(record_bytes)
        self.memcpy = memcpy or (lambda dst, src, n: ctypes.memmove(dst, src, int(n)))
        self.address = address or _np_address
        self.sync = sync or (lambda: None)
        self.meta = np.asarray(host_alloc(4 * (HEAD + 2 * self.K))).reshape(-1).view(np.int32)
        self.meta[:] = 0
        self.meta[3] = self.K
        self.meta[HEAD:HEAD + self.K] = -1
        self.buf = (device_alloc or host_alloc)(self.K * self.record_bytes)
        self.staging = np.asarray(host_alloc(self.record_bytes)).reshape(-1).view(np.uint8)
        self.handled: dict = {}            # ring slot -> seq of the claim drained last

    def keys(self, meta=None) -> np.ndarray:
        m = self.meta if meta is None else meta
        return m[HEAD:HEAD + self.K]

    def seqs(self, meta=None) -> np.ndarray:
        m = self.meta if meta is None else meta
        return m[HEAD + self.K:HEAD + 2 * self.K]

    @property
    def drops(self) -> int:
        return int(self.meta[2])

    def slot_address(self, slot: int) -> int:
        return self.address(self.buf) + int(slot) * self.record_bytes

    def claim(self, key: int, src: int):
        """The evicting side: copy the record at ``src`` into the next free ring slot, then publish (key, seq)."""
        m, keys = self.meta, self.keys()
        for j in range(self.K):
            i = (int(m[0]) + j) % self.K
            if keys[i] < 0:
                self.memcpy(self.slot_address(i), int(src), self.record_bytes)
                self.sync()
                m[1] += 1
                self.seqs()[i], m[0] = m[1], (i + 1) % self.K
                keys[i] = int(key)                                  # last: the claim after its bytes
                return i
        m[2] += 1
        return None

    def victims(self, meta) -> list:
        """Claims in the lagged ``meta`` not drained yet: (ring slot, key, seq), ring-slot order."""
        if len(meta) != len(self.meta) or int(meta[3]) != self.K:
            raise ValueError(f"victim ring meta: expected int32[{len(self.meta)}] with K={self.K}, got "
                             f"{len(meta)} entries, K={int(meta[3]) if len(meta) > 3 else None}")
        keys, seqs = self.keys(meta), self.seqs(meta)
        return [(i, int(keys[i]), int(seqs[i])) for i in range(self.K)
                if keys[i] >= 0 and self.handled.get(i) != int(seqs[i])]

    def drain(self, slot: int, key: int, seq: int, page: np.ndarray, res: np.ndarray, busy: set,
              ppend=frozenset(), after=None) -> bool:
        """Write claim (slot, key, seq) back to ``page`` (the key's RAM page) and publish it; False if a guard
        skipped it. ``after()``, if given, runs after each step: on the device the steps run on two streams and a
        thread, so the kernel may look at any point in between (a test's observer checks the state there)."""
        if key in busy or key in ppend:
            return False
        busy.add(key)
        rb = self.record_bytes
        after = after or (lambda: None)
        try:
            self.memcpy(self.address(self.staging), self.slot_address(slot), rb)   # 1. ring slot -> staging
            self.sync()                                                           #    (its event waited for)
            after()
            page[:rb] = self.staging                                              # 2. staging -> the RAM page
            after()
            res[key] = 1                                                          # 3. only now: resident in RAM
            self.handled[slot] = seq
            after()
        finally:
            busy.discard(key)
        return True

    def release(self, slot: int) -> None:
        """4. The ring slot back to the evicting side (its write-back published)."""
        self.keys()[int(slot)] = -1          # handled[slot] stays: a stale lagged copy still shows the old claim
