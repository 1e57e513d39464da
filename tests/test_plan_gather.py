"""plan_layer's compiled entry (moetier.core.plan_gather): what it gathers itself is what the Python objects say."""
import random

import pytest

from moetier.core.ledger import Ledger
from moetier.core.llc import ReuseModel
from moetier.core.plan import NvmeChannel, plan_layer
from moetier.core.terms import ChannelTerms
from test_plan import ctx, ledger

CHANNELS = {
    "fifo": lambda: NvmeChannel(1_000_000, 1.0, bw_qd1_gbps=0.5, latency_ms=0.3),
    "table": lambda: NvmeChannel(1_000_000, 1.0, terms=ChannelTerms(latency_by_qd={"1": 1.0, "2": 1.5, "4": 2.2})),
    "bursts": lambda: NvmeChannel(1_000_000, 1.0, terms=ChannelTerms(latency_by_qd={"1": 1.0, "2": 1.5},
                                                                     bursts={"2": {"1": 1.8, "2": 2.0}})),
}


@pytest.mark.parametrize("kind", CHANNELS)
def test_the_demand_reads_it_issues_are_the_channels(kind):
    # a twin channel issues the same reads through NvmeChannel.demand: the same arrivals, and the same channel after
    rng = random.Random(5)
    L = ledger(vram=[1, 2], ram=[10, 11, 12])
    ch, twin = CHANNELS[kind](), CHANNELS[kind]()
    t, landed_at_t = 0.0, 0
    for _ in range(60):
        keys = rng.sample([1, 2, 10, 11, 12, *range(500, 520)], rng.randint(1, 6))
        picks = {k: rng.randint(1, 3) for k in keys}
        nv = [k for k in picks if k >= 500]
        landed_at_t += any(a == t for a in twin.outstanding)
        p = plan_layer(ctx(), L, picks, t, ch)
        want = twin.demand(t, len(nv))
        assert p.arrivals == dict(zip(nv, want)) and p.demand_reads == len(nv)
        assert sorted(p.nvme_cpu + p.nvme_gpu) == sorted(nv)
        assert (ch.dfree, ch.outstanding, ch.reads) == (twin.dfree, twin.outstanding, twin.reads)
        # the next call: while these reads are in flight, on the last one's arrival exactly (it has landed), or later
        t = rng.choice([t + 0.4, max(want, default=t), t + 3.0])
    assert ch.reads > 40
    if kind != "fifo":
        assert landed_at_t >= 3           # the boundary was crossed: a read landing at t is no longer in flight


def test_an_absent_key_of_an_all_in_ram_ledger_is_a_ram_pick():
    L = Ledger(16, 2, 16)
    assert L.all_in_ram
    p = plan_layer(ctx(), L, {3: 1, 4: 2}, 0.0, NvmeChannel(1_000_000, 1.0))
    assert sorted(p.cpu + p.zerocopy) == [3, 4] and not p.arrivals and p.demand_reads == 0


def test_the_host_cache_distances_it_reads_are_the_models():
    # the kernel reads the model's clock array: each RAM pick's cost factor is ReuseModel.factor's, used or not
    L = ledger(vram=[1, 2, 3, 4], ram=[10, 11, 12])
    m = ReuseModel({"2000000": 0.5, "8000000": 1.0}, 1_000_000, 1000)
    m.touch([10, 30, 31, 32, 11])
    c = ctx(lanes={"zerocopy": None})        # a RAM pick goes to the cpu lane
    cold = {k: plan_layer(c, L, {k: 1}, 0.0, None, m).cpu_cold for k in (10, 11, 12)}
    assert cold == {k: m.factor(k) for k in (10, 11, 12)}
    assert m.factor(11) < m.factor(10) < m.factor(12) == 1.0
