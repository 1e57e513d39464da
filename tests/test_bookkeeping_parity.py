"""The planner's and the ledger's fast paths deal and evict exactly as their plain forms do.

The hot path has inlined forms (the ledger's exclusive-LRU fills and drains, the planner's tier sort); each is
replayed here against its plain form on a long random trace, layer by layer: the same lanes, times, arrivals and
ledger counters, so a speed-up that changes a single plan fails.
"""
from __future__ import annotations

import numpy as np
import pytest

from moetier.core import plan as planner
from moetier.core import records as spec
from moetier.core import sim
from moetier.core.ledger import ABSENT, PUSHING, RAM, VRAM, Ledger
from moetier.traces.format import Trace

RECIPE = "glm53-rtx3090-55g-nvx4"


def _random_trace(R, tokens: int, seed: int) -> Trace:
    """Uniform random picks (topk distinct experts per token and layer): the RAM tier churns on every layer."""
    rng = np.random.default_rng(seed)
    ids = np.argsort(rng.random((tokens, R.layers, R.experts)), axis=2)[:, :, :R.topk].astype(np.int16)
    return Trace(ids=ids, segments=np.array([0, tokens]))


def _plain_by_tier(ledger, picks: dict, vram_l: list):
    """The tier sort as one dict read per pick (the form _by_tier inlines)."""
    absent = RAM if ledger.all_in_ram else ABSENT
    ram_l, nvme_l = [], []
    for k, m in picks.items():
        s = ledger.state.get(k, absent)
        if s in (RAM, PUSHING):
            ram_l.append((m, k))
        elif s == VRAM:
            vram_l.append(k)
        else:
            nvme_l.append(k)
    return ram_l, nvme_l


def _replay(R, tr, conc: int) -> tuple[list, dict]:
    plans = []

    def hook(step, layer, p):
        plans.append((step, layer, tuple(map(tuple, p.lanes().values())), p.ms, p.gpu_ms, p.cpu_ms, p.nvme_wait_ms,
                      tuple(sorted(p.arrivals.items()))))
    out = sim.run(R, tr, conc, plan_hook=hook)
    return plans, out["ledger"]


@pytest.mark.parametrize("sets", [(), ("policy.prefetch.depth=0",)], ids=["prefetch", "no-prefetch"])
def test_fast_paths_plan_as_the_plain_forms(monkeypatch, sets):
    R = spec.resolve(RECIPE, list(sets) + ["policy.warmup_tokens=50"])
    tr = _random_trace(R, 170, seed=3)
    fast, fast_counts = _replay(R, tr, 4)
    init = Ledger.__init__

    def plain_init(self, *a, **k):
        init(self, *a, **k)
        self._lru_fast = False       # every RAM put through _ram_put's plain LRU victim search
        self._rfast = self._vfast = False   # every policy eviction through victim(k, ok), not put / evict_for

    monkeypatch.setattr(Ledger, "__init__", plain_init)
    monkeypatch.setattr(planner, "_by_tier", _plain_by_tier)
    plain, plain_counts = _replay(R, tr, 4)
    assert fast_counts["ram_evictions"] > 1000 and fast_counts["vram_evictions"] > 100   # the paths were exercised
    assert len(fast) == len(plain) > 5000
    for a, b in zip(fast, plain):
        assert a == b, f"step {a[0]} layer {a[1]}: the fast path's plan differs from the plain form's"
    assert fast_counts == plain_counts


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
