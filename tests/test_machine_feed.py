"""A layer's deferred RAM uses served in one compiled call (moetier.peers.token_feed's flush through
moetier.core.policies.machine's ``feed``) against the same uses served one at a time through the ledger
(the flush's per-use path, which policies other than the machines take): after every layer the two ledgers hold the
same keys in the same states, count the same evictions and refusals, and their machines hold the same queues and
orphans; also with a push in flight (its key pinned) and when a read names a key the ledger holds (an error, raised
as the per-use path raises it)."""
from types import SimpleNamespace

import numpy as np
import pytest

from moetier.core.ledger import RAM, ResidencyError
from moetier.core.policies.sieve import HAND, Sieve
from moetier.peers import rows as P
from moetier.peers.token_feed import TokenFedLedger

L, E, TOPK = 3, 20, 3
MACHINES = ("2q", "slru", "sieve", "s3fifo", "wtinylfu", "kt-2q", "kt-slru", "kt-sieve", "kt-s3fifo", "kt-wtinylfu")


class FakePerUseLedger(TokenFedLedger):
    """A fake for this test only: the flush never takes the compiled call."""

    def _feed(self, seq, hits, reads) -> bool:
        return False


def _pair(name: str, ram_slots: int):
    row = f"textbook-{name}" if not name.startswith("kt-") else f"ktransformers-{name[3:]}"
    peer = P.by_name(row)
    R = SimpleNamespace(layers=L, experts=E, keys=L * E, vram_slots=L, ram_slots=ram_slots,
                        policy=P.recipe_policy(peer, {}))
    out = []
    for cls in (TokenFedLedger, FakePerUseLedger):
        led = P.split_ledger(peer, R)
        led.__class__ = cls
        led.seed([l * E for l in range(L)])          # one VRAM key a layer, RAM starts empty
        out.append(led)
    return out


def _machine_state(led) -> list:
    return [(p.m.iv[:8].tolist(), p.m.st.tolist(), p.m.aux.tolist()) for p in led._rpol.parts]


def _first(part) -> list:
    """The key the part would name first (a Machine's first orphan or key in order; SIEVE's hand or oldest key)."""
    if isinstance(part, Sieve):
        h = int(part.st[HAND])
        return [h] if h >= 0 else part.queue(0)[:1]
    return part._keys(True)[:1]


def _layer(led, layer, ids, order, push=None):
    led.defer()
    for k in ids:
        s = led.state.get(k)
        if s == RAM:
            led.ram_hit([k])
        elif s is None:
            led.fill_landed(k)
    t = led.begin_push(push) if push is not None and led.state.get(push) == RAM else None
    led.flush(order)
    if t is not None:
        led.land(t)
        for d in led.take_drains():
            led.land(d)


@pytest.mark.parametrize("name", MACHINES)
def test_the_compiled_flush_serves_a_layer_as_the_per_use_path(name):
    rng = np.random.default_rng(7)
    blocked = 0
    for cap in (L, 4 * L, 9 * L):
        fast, slow = _pair(name, cap)
        for step in range(120):
            layer = step % L
            ids = [layer * E + int(e) for e in rng.zipf(1.3, TOPK) % E]
            order = [layer * E + int(e) for e in rng.zipf(1.3, 2 * TOPK) % E] + ids
            # every third layer the key the machine would name first is mid-push while the layer's uses are served
            first = _first(slow._rpol.parts[layer]) if step % 3 == 1 else []
            push = first[0] if first else None
            blocked += push is not None
            for led in (fast, slow):
                _layer(led, layer, ids, list(order), push)
            assert fast.state == slow.state and list(fast.ram) == list(slow.ram), (name, cap, step)
            assert fast.counters == slow.counters, (name, cap, step)
            assert _machine_state(fast) == _machine_state(slow), (name, cap, step)
        assert fast.counters["ram_evictions"] > 0
    assert blocked > 20


def test_a_read_of_a_key_the_ledger_holds_raises_as_the_per_use_path_does():
    for led in _pair("2q", 6):
        led.defer()
        led.fill_landed(1)
        led.flush([1])
        led.defer()
        led._uses[1].add(1)                          # a read of a key already in RAM
        with pytest.raises(ResidencyError, match=r"fill_landed\(1\)"):
            led.flush([1])


@pytest.mark.parametrize("name", [n for n in MACHINES if n != "sieve"])
def test_put_with_pins_is_victim_remove_insert(name):
    """A machine's ``put(k, pins, cap)`` (one compiled call, the ledger's fast path) against the protocol's steps:
    ``victim(k, ok)`` with ``ok`` refusing the pins, then ``remove`` and ``insert``."""
    from moetier.core.policies import residency
    rng = np.random.default_rng(3)
    for cap in (1, 3, 8):
        fast, slow = residency.make(name, cap), residency.make(name, cap)
        pinned = 0
        for _ in range(400):
            k = int(rng.zipf(1.2) % 40)
            if k in slow:
                fast.hit(k)
                slow.hit(k)
                continue
            held = sorted(slow._keys(True))
            pins = [x for x in held if rng.random() < 0.4]
            pinned += bool(pins)
            got = fast.put(k, np.array(pins, dtype=np.int64))
            if len(slow) < cap:
                slow.insert(k)
                want = -1
            else:
                v = slow.victim(k, lambda x: x not in pins)
                want = k if v is None or v == k else v
                if want != k:
                    slow.remove(v)
                    slow.insert(k)
            assert got == want, (name, cap, k)
            assert _machine_state_of(fast) == _machine_state_of(slow), (name, cap, k)
        assert pinned > 50


def _machine_state_of(pol) -> tuple:
    m = pol.m
    return m.base, m.iv[:8].tolist(), m.st.tolist(), m.aux.tolist()
