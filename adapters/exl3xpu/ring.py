"""exl3xpu's VRAM victim ring, read from the host: which claims are new, and the drain that publishes them safely.

Contract
--------
The ring is what exl3xpu's kernel writes when its device LRU (``moe_forward_cached``) evicts a VRAM expert and
``moe_set_victim_ring(meta, sel, buf)`` is set (variant a9): ``meta`` int32[4 + 2K] = [next search, claim seq, drops,
K, key[K], seq[K]], ``buf`` uint8[K * record] the evicted experts' bytes, ring slot i at ``i * record``. A claim is a
ring slot with key >= 0; the kernel never reuses a slot until the host frees it (key = -1); ring full = the eviction is
dropped (``drops`` counts it) and the expert is simply not written back.

``Ring(K, record_bytes, alloc)`` holds the three arrays (``alloc(nbytes)``: ``host_alloc`` of the op table).
``victims(meta)`` takes a lagged copy of ``meta`` (graph decode: the host reads one step behind) and returns the claims
not handled yet, as (ring slot, key, seq), in ring-slot order. ``drain(slot, key, seq, page, res, busy)`` runs the
write-back in the only safe order (reference section 4.4, ``NvTierAsyncRing``): ring slot -> staging -> the key's RAM
page, then ``res[key] = 1``, then the ring slot freed - so no RAM page is ever flagged resident before its bytes are
there, and the kernel cannot overwrite a ring slot whose bytes are still being read. A key in ``busy`` (a write-back
already in flight) is skipped and left claimed for the next step.
"""
from __future__ import annotations

import numpy as np

HEAD = 4                       # next search, claim seq, drops, K


class Ring:
    def __init__(self, K: int, record_bytes: int, alloc=None):
        alloc = alloc or (lambda n: np.zeros(int(n), np.uint8))
        self.K, self.record_bytes = int(K), int(record_bytes)
        self.meta = np.zeros(HEAD + 2 * self.K, np.int32)
        self.meta[3] = self.K
        self.meta[HEAD:HEAD + self.K] = -1
        self.buf = alloc(self.K * self.record_bytes)
        self.staging = alloc(self.record_bytes)
        self.handled: dict = {}            # ring slot -> seq of the claim drained last

    def keys(self, meta=None) -> np.ndarray:
        m = self.meta if meta is None else meta
        return m[HEAD:HEAD + self.K]

    def seqs(self, meta=None) -> np.ndarray:
        m = self.meta if meta is None else meta
        return m[HEAD + self.K:HEAD + 2 * self.K]

    def victims(self, meta) -> list:
        """Claims in the lagged ``meta`` not drained yet: (ring slot, key, seq), ring-slot order."""
        if len(meta) != len(self.meta) or int(meta[3]) != self.K:
            raise ValueError(f"victim ring meta: expected int32[{len(self.meta)}] with K={self.K}, got "
                             f"{len(meta)} entries, K={int(meta[3]) if len(meta) > 3 else None}")
        keys, seqs = self.keys(meta), self.seqs(meta)
        return [(i, int(keys[i]), int(seqs[i])) for i in range(self.K)
                if keys[i] >= 0 and self.handled.get(i) != int(seqs[i])]

    def drain(self, slot: int, key: int, seq: int, page: np.ndarray, res: np.ndarray, busy: set,
              after=None) -> bool:
        """Write claim (slot, key, seq) back to ``page`` (the key's RAM page) and publish it; False if skipped.
        ``after()``, if given, runs after each step: on the device the steps run on two streams and a thread, so the
        kernel may look at any point in between (a test's observer checks the state there)."""
        if key in busy:
            return False
        busy.add(key)
        rb = self.record_bytes
        after = after or (lambda: None)
        self.staging[:] = self.buf[slot * rb:(slot + 1) * rb]       # 1. ring slot -> staging (the side stream)
        after()
        page[:rb] = self.staging                                     # 2. staging -> the RAM page (a CPU memmove)
        after()
        res[key] = 1                                                 # 3. only now: resident in RAM
        after()
        self.keys()[slot] = -1                                       # 4. the ring slot back to the kernel
        self.handled[slot] = seq
        busy.discard(key)
        after()
        return True
