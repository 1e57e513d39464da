"""The peer rows' lane deals as planner rules (moetier.core.deal_rules) against the Python hook they replaced
(``RefDealer`` below, the former moetier.peers.rows._dealer, written out as it was): on random layers of picks over
every tier state, the same forced deal (cpu / nvme_cpu bits and the NVMe picks' order), so the same plans; the
fraction rule's share rounds half to even, as Python's ``round``; and a rule the recipe's lanes cannot run leaves the
planner to deal."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from moetier.core import records as spec, sim
from moetier.core.deal_rules import RULES, rule_deal, terms
from moetier.core.plan import LayerPlan, _deal
from moetier.core.tickets import ABSENT, FILLING, PUSHING, RAM, VRAM

STATES = (ABSENT, FILLING, PUSHING, RAM, VRAM)


def ref_deal(kind, ctx, states, picks):
    """The former Python dealer's plan for ``picks`` ({key: rows}) over ``states`` ({key: state})."""
    cpe, cpx = ctx.cpu[1], ctx.cpu[2]
    zc = ctx.zerocopy or ctx.gpu
    fetch = ctx.push_ms + ctx.gpu[1] if ctx.gpu is not None else zc[1]
    q = cpe / (cpe + fetch) if cpe + fetch > 0 else 0.5
    ram, nvme = [], []
    for k, m in picks.items():
        s = states[k]
        if s == RAM or s == PUSHING:
            ram.append((m, k))
        elif s != VRAM:
            nvme.append((m, k))
    plan = LayerPlan()
    if kind == "cpu":
        plan.cpu, plan.nvme_cpu = [k for _, k in ram], [k for _, k in nvme]
    elif kind == "gpu":
        plan.nvme_gpu = [k for _, k in nvme]
    elif kind == "latency":
        plan.cpu = [k for m, k in ram if cpe + cpx * (m - 1) <= zc[1] + zc[2] * (m - 1)]
        plan.nvme_cpu = [k for _, k in nvme]
    else:
        miss = sorted(ram + nvme, reverse=True)
        fetched = {k for _, k in miss[:int(round(q * len(miss)))]}
        plan.cpu = [k for _, k in ram if k not in fetched]
        plan.nvme_cpu = [k for _, k in nvme if k not in fetched]
        plan.nvme_gpu = [k for _, k in nvme if k in fetched]
    return plan


@pytest.fixture(scope="module")
def ctx():
    return sim.Replay(spec.resolve("glm53-rtx3090-55g-nvx4", [])).ctx


@pytest.mark.parametrize("kind", RULES[1:])
@pytest.mark.parametrize("lanes", ["zerocopy", "gpu-only"])
def test_rule_deals_as_the_python_dealer(ctx, kind, lanes):
    c = replace(ctx, deal=kind, zerocopy=None) if lanes == "gpu-only" else replace(ctx, deal=kind)
    if kind == "latency":
        # a pick's rows decide its lane: one row is cheaper on the cpu lane, two or more on the GPU's
        ze, zx = (c.zerocopy or c.gpu)[1:]
        c = replace(c, cpu=(c.cpu[0], ze * 0.9, zx + ze * 0.2))
    T = np.array(terms(c))
    rng = np.random.default_rng(RULES.index(kind))
    lanes_seen = set()
    for _ in range(400):
        n = int(rng.integers(0, 24))
        keys = rng.choice(500, size=n, replace=False).tolist()
        picks = {k: int(rng.integers(1, 6)) for k in keys}
        states = {k: STATES[int(rng.integers(len(STATES)))] for k in keys}
        I = np.array([keys, list(picks.values()), [states[k] for k in keys]], np.int64).reshape(3, n)
        ref = ref_deal(kind, c, states, picks)
        want = _deal(picks, ref)
        assert rule_deal(T, I).tolist() == want.tolist(), (kind, picks, states)
        ram = [k for k in keys if states[k] in (RAM, PUSHING)]
        lanes_seen.update("cpu" if k in ref.cpu else "gpu" for k in ram)
    # the lanes the RAM picks went to: "latency" and "fraction" split them, so both sides of each rule ran
    assert lanes_seen == {"cpu": {"cpu"}, "gpu": {"gpu"}, "latency": {"cpu", "gpu"}, "fraction": {"cpu", "gpu"}}[kind]


def test_fraction_rounds_its_share_half_to_even(ctx):
    T = np.array(terms(replace(ctx, deal="fraction")))
    T[1] = 0.5                                   # q: half the misses
    for n, fetched in ((5, 2), (7, 4), (3, 2), (1, 0)):        # round(2.5) = 2, round(3.5) = 4
        I = np.array([list(range(n)), [1] * n, [ABSENT] * n], np.int64)
        D = rule_deal(T, I)
        assert int((D[:n] == 0).sum()) == fetched, n


def test_a_rule_without_both_lanes_leaves_the_planner_to_deal(ctx):
    assert terms(replace(ctx, deal="cpu", cpu=None))[0] == 0.0
    assert terms(replace(ctx, deal="gpu", zerocopy=None, gpu=None))[0] == 0.0
    assert terms(ctx)[0] == 0.0                  # "planner"
