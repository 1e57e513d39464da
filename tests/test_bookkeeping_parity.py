"""The ledger's compiled commit and its fast paths deal and evict exactly as their plain forms do.

The simulator's commit of a layer's plan is one compiled call over the ledger's arrays (moetier.core.commit_kernel)
where it covers the ledger; each tier order it covers is replayed here against the ledger's Python methods with the
plain victim search (victim(k, ok), not the compiled put / evict_for) on a long random trace, layer by layer: the
same lanes, times, arrivals, tier contents and ledger counters, so a change that alters a single plan fails. (The
planner has one form, its compiled kernel: tests/test_core_parity.py holds it to the recorded plans.)
"""
from __future__ import annotations

import numpy as np
import pytest

from moetier.core import records as spec
from moetier.core import sim
from moetier.core.ledger import Ledger
from moetier.traces.format import Trace

RECIPE = "glm53-rtx3090-55g-nvx4"
# the tier orders the compiled commit covers, as recipe overrides (the recipe's own: per-layer LFU RAM, dLFU VRAM)
ORDERS = {
    "default": (),
    "lru-clock": ("policy.ram_evict=lru", "policy.ram_partition=global", "policy.vram_evict=clock",
                  "policy.vram_admit=true"),
    "inclusive-lru": ("policy.ram=inclusive", "policy.ram_evict=lru", "policy.ram_partition=global",
                      "policy.vram_evict=clock", "policy.vram_admit=true"),
    "inclusive-dlfu": ("policy.ram=inclusive", "policy.vram_admit=true"),
    "global-dlfu": ("policy.ram_evict=dlfu", "policy.ram_partition=global", "policy.vram_admit=true"),
    "lru-layer-lru": ("policy.ram_evict=lru", "policy.ram_partition=layer", "policy.vram_evict=lru",
                      "policy.vram_admit=true"),
    "fifo-fifo": ("policy.ram_evict=fifo", "policy.ram_partition=global", "policy.vram_evict=fifo",
                  "policy.vram_admit=true"),
}


def _random_trace(R, tokens: int, seed: int) -> Trace:
    """Uniform random picks (topk distinct experts per token and layer): the RAM tier churns on every layer."""
    rng = np.random.default_rng(seed)
    ids = np.argsort(rng.random((tokens, R.layers, R.experts)), axis=2)[:, :, :R.topk].astype(np.int16)
    return Trace(ids=ids, segments=np.array([0, tokens]))


def _replay(R, tr, conc: int) -> tuple[list, dict]:
    plans = []
    led = {}

    def hook(step, layer, p):
        plans.append((step, layer, tuple(map(tuple, p.lanes().values())), p.ms, p.gpu_ms, p.cpu_ms, p.nvme_wait_ms,
                      tuple(sorted(p.arrivals.items()))))

    def wire(rp, streams, n):
        led["L"] = rp.ledger
    out = sim.run(R, tr, conc, plan_hook=hook, wire=wire)
    L = led["L"]
    tiers = (bytes(L.codes), list(L.ram), list(L.clock.owner))
    return plans, out["ledger"], tiers


@pytest.mark.parametrize("order", sorted(ORDERS))
@pytest.mark.parametrize("sets", [(), ("policy.prefetch.depth=0",)], ids=["prefetch", "no-prefetch"])
def test_compiled_commit_plans_as_the_plain_forms(monkeypatch, sets, order):
    R = spec.resolve(RECIPE, list(sets) + list(ORDERS[order]) + ["policy.warmup_tokens=50"])
    tr = _random_trace(R, 120, seed=3)
    calls = []
    commit = Ledger.commit
    monkeypatch.setattr(Ledger, "commit", lambda self, *a: calls.append(1) or commit(self, *a))
    fast, fast_counts, fast_tiers = _replay(R, tr, 4)
    assert len(calls) > len(fast) // 2       # the compiled commit ran (a prefetch landing takes the Python path)
    init = Ledger.__init__

    def plain_init(self, *a, **k):
        init(self, *a, **k)
        self.commits = False                  # every step through the ledger's Python methods
        self._rfast = self._vfast = False     # every policy eviction through victim(k, ok), not put / evict_for

    monkeypatch.setattr(Ledger, "__init__", plain_init)
    plain, plain_counts, plain_tiers = _replay(R, tr, 4)
    assert fast_counts["ram_evictions"] > 300 and fast_counts["vram_evictions"] > 30   # the paths were exercised
    assert len(fast) == len(plain) > 3000
    for a, b in zip(fast, plain):
        assert a == b, f"step {a[0]} layer {a[1]}: the compiled commit's plan differs from the plain form's"
    assert fast_counts == plain_counts
    assert fast_tiers == plain_tiers


def test_a_push_in_flight_keeps_its_ram_copy_under_the_compiled_eviction():
    """While a push is in flight its key (PUSHING, its RAM copy still read) may not go: the compiled eviction pins it
    beside the layer's picks until the push lands."""
    led = Ledger(8, 2, 2, ram_policy="dlfu", vram_policy="dlfu", ram_partition="layer", layers=1, experts=8)
    for k in (1, 2):
        led.land(led.begin_fill(k))
    led.observe([2, 2], 0)
    for _ in range(3):
        led.ram_hit([2])                  # key 1 is the RAM tier's least used: the one put would evict
    t = led.begin_push(1)
    assert led.state_of(1) == "pushing" and led._pushing == {1}
    assert led.fill_landed(3) == (2,)     # the pushing key stays; the other RAM key makes room
    led.land(t)
    assert not led._pushing and led.state_of(1) == "vram"
    led.check()


@pytest.mark.parametrize("exclusive", [True, False], ids=["exclusive", "inclusive"])
def test_ticket_path_evicts_as_the_plain_victim_search(exclusive):
    """The runtime's door (begin_fill / begin_push / land / abort, pushes left in flight across layers) under the
    compiled evictions against the same ledger asking victim(k, ok): the same states, slots and counters after
    every operation of a long random run."""
    kw = dict(exclusive=exclusive, ram_policy="lfu", vram_policy="dlfu", ram_partition="layer", layers=4, experts=16)
    fast, plain = Ledger(64, 10, 14, **kw), Ledger(64, 10, 14, **kw)
    plain.commits = False                 # the ledger's Python forms, not the compiled commit's doors
    plain._rfast = plain._vfast = False
    rng = np.random.default_rng(5)
    tickets = {"fast": [], "plain": []}
    for op in range(6000):
        layer = int(rng.integers(4))
        picks = {int(k): 1 for k in layer * 16 + rng.choice(16, size=int(rng.integers(1, 5)), replace=False)}
        kind, key = rng.integers(4), int(rng.choice(list(picks)))
        for name, led in (("fast", fast), ("plain", plain)):
            s, out = led.state_of(key), tickets[name]
            if kind == 0 and s == "absent":
                led.land(led.begin_fill(key), picks)
            elif kind == 1 and s == "ram":
                t = led.begin_push(key, picks)
                if t is not None:
                    out.append(t)
            elif kind == 2 and out:                    # the oldest push in flight lands (or fails)
                t = out.pop(0)
                led.abort(t) if op % 7 == 0 else led.land(t, picks)
            for d in led.take_drains():
                led.land(d, picks)
            led.ram_hit([k for k in picks if led.state_of(k) == "ram"])
        assert fast.state == plain.state, f"operation {op}: the states differ"
        assert fast.clock.slot_of == plain.clock.slot_of and fast.counters == plain.counters, f"operation {op}"
        assert fast._pushing == plain._pushing
    assert fast.counters["ram_evictions"] > 300 and fast.counters["vram_evictions"] > 100
    fast.check()
