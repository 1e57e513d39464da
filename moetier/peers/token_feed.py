"""A RAM tier used the way kt-kernel's tiered weight provider records it: every token's picks, in token order.

Contract
--------
The simulator serves a layer's picks once each, the RAM hits first and the NVMe reads after (moetier.core.replay's
``commit``). kt-kernel's ``TieredWeightProvider.record_activations(layer, topk_ids)`` hands the layer's residency
policy the flattened top-k ids, token by token, so an expert two tokens pick is two uses, and a read and a hit come in
the order the tokens named them (moetier.core.policies.ktransformers cites the source). ``TokenFedLedger`` is a
Ledger whose RAM uses within a layer (``ram_hit``, ``fill_landed``) wait for ``flush(keys)``, which serves them in
``keys``' order, one use per occurrence: a key read this layer is a hit from its next occurrence on. The flush comes
after the layer computed, so it pins nothing, and a key one of its uses evicted and a later one names again comes
back without a read (its bytes were used this layer; kt-kernel promotes and demotes only what its policy holds
between layers). After every layer the policies then hold what kt-kernel's would (tests/test_kt_tiers.py). Where a
per-layer split of the published policies orders the tier, a layer's flush is one compiled call
(moetier.core.policies.machine's ``feed``) whose log of fills, refusals and evictions the ledger's tier then takes.
``wire(rp)`` makes a fresh ``sim.Replay`` (its ledger a TokenFedLedger) defer each layer's uses and flush them, in
the order of the step's token rows, before the layer ends (``after_layer``). The plan, its lanes and its times are
the simulator's: only the order and count of the RAM policy's uses change, and nothing reads the tier between the
layer's commit and its flush. Pure.
"""
from __future__ import annotations

import numpy as np

from moetier.core.ledger import RAM, Ledger
from moetier.core.policies.machine import Machine, feed
from moetier.core.policies.residency import Partitioned
from moetier.core.policies.sieve import Sieve

__all__ = ["TokenFedLedger", "wire"]


class TokenFedLedger(Ledger):
    """A Ledger whose RAM uses wait, between ``defer()`` and ``flush(keys)``, to be served in ``keys``' order."""

    _uses = None                      # (hit keys, read keys) while deferring

    def defer(self) -> None:
        self._uses = (set(), set())

    def ram_hit(self, keys) -> None:
        if self._uses is None:
            return super().ram_hit(keys)
        self._uses[0].update(keys)

    def fill_landed(self, key: int, protect=()) -> tuple:
        if self._uses is None:
            return super().fill_landed(key, protect)
        self._uses[1].add(key)
        return ()

    def flush(self, keys) -> None:
        """Serve the deferred uses, after the layer computed: each occurrence in ``keys`` of a key hit or read this
        layer, in order (a key the layer computed in VRAM is not the tier's), then any the order left out. Nothing
        is pinned (the layer is done), and a key that an earlier use this layer evicted comes back without a read:
        its bytes were used this layer, and kt-kernel's promotions see only the policy's set between layers."""
        hits, reads = self._uses
        self._uses = None
        named = set(keys)
        seq = list(keys) + [k for k in (*hits, *reads) if k not in named]
        if seq and self._feed(seq, hits, reads):
            return
        used = set(hits)
        for k in seq:
            if k in reads:
                reads.discard(k)
                used.add(k)
                super().fill_landed(k)
            elif k in used:
                s = self.state.get(k)
                if s == RAM:
                    super().ram_hit((k,))
                elif s is None:
                    super().fill_landed(k)

    def _feed(self, seq, hits, reads) -> bool:
        """``flush`` in one compiled call (moetier.core.policies.machine's ``feed``) where one layer's part of a
        per-layer split of machines orders the RAM tier; False, and nothing done, elsewhere."""
        pol = self._rpol
        if not isinstance(pol, Partitioned) or self.all_in_ram or self._no_ram_lru:
            return False
        E = pol.experts
        l = seq[0] // E
        part = pol.parts[l]
        if not isinstance(part, (Machine, Sieve)) or min(seq) < l * E or max(seq) >= (l + 1) * E:
            return False
        get, i64 = self.state.get, np.int64
        log, err = feed(part, pol.caps[l], np.array(seq, dtype=i64), np.array([get(k, -1) for k in seq], dtype=i64),
                        np.fromiter(hits, i64, len(hits)), np.fromiter(reads, i64, len(reads)),
                        np.array([k for k in self._pushing if k // E == l], dtype=i64), RAM)
        ram, codes = self.ram, self.codes
        for ev, k, v in log:
            if ev == 0:
                ram.add(k)
                codes[k] = RAM
            elif ev == 1:
                self._refuse(k)
            else:
                self._ram_swap(k, v)
        if err >= 0:
            super().fill_landed(seq[err])          # raises: the ledger holds the key
        return True


def wire(rp) -> None:
    """Make replay ``rp`` (its ledger a TokenFedLedger) serve each layer's RAM uses in its token rows' order."""
    led, layer_, after_layer = rp.ledger, rp.layer, rp.after_layer
    order: list = []

    def layer(layer, picks, t, streams, rows, lanes=None):
        order[:] = [k for i, tok in rows for k in streams.keys[i][tok][layer]]
        led.defer()
        return layer_(layer, picks, t, streams, rows, lanes)

    def after(picks):
        led.flush(order)
        after_layer(picks)

    rp.layer, rp.after_layer = layer, after
