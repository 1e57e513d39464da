"""The simulator's compiled step loop (moetier.core.step_kernel) against the per-layer path it replaces.

Each case runs one recipe variant both ways (the loop forced off through ``Steps.of``) and compares the whole report,
the per-step timeline and the tier contents the run ends with, exactly. The variants reach every branch of the loop:
overlapped and serial copies, exclusive and inclusive RAM, CLOCK and decayed-LFU VRAM, LRU and LFU RAM, the lossy
mask, all experts in RAM, several rows a step. The shipped recipes' cells are in tests/test_core_parity.py.
"""
import json
from dataclasses import replace

import pytest

from moetier.core import records as spec
from moetier.core import sim
from moetier.core.plan import NO_NVME_LANE
from moetier.core.replay import Replay, Streams
from moetier.core.step_kernel import Steps
from moetier.core.tickets import FILLING, ResidencyError
from moetier.traces.format import load_trace
from tests.parity.record import tier_contents

RID = "glm53-rtx3090-55g-nvx4"
ZC = "glm53-rtx5070-20g-nvme1"          # a zerocopy lane beside the cpu lane
VARIANTS = {
    "default": {},
    "serial copies": {"policy.overlap": False},
    "zerocopy": {"recipe": ZC},
    "zerocopy, serial copies": {"recipe": ZC, "policy.overlap": False},
    "inclusive lru, clock": {"policy.ram": "inclusive", "policy.ram_evict": "lru", "policy.vram_evict": None,
                             "policy.ram_partition": "global"},
    "global dlfu": {"policy.ram_evict": "dlfu", "policy.ram_partition": "global"},
    "mask": {"policy.exact": "mask"},
    "static vram": {"policy.vram_admit": False},
    "all in ram": {"budget.ram_gb": 10000, "policy.ram_evict": "lru", "policy.ram_partition": "global"},
}


def _recipe(over: dict):
    over = dict(over)
    rid = over.pop("recipe", RID)
    R = spec.resolve(rid, [f"budget.ram_gb={over.pop('budget.ram_gb')}"] if "budget.ram_gb" in over else [])
    policy = dict(R.policy, warmup_tokens=16)
    for k, v in over.items():
        policy[k.split(".")[1]] = v
    return replace(R, policy={k: v for k, v in policy.items() if v is not None})


def _run(R, tr, conc, compiled: bool, monkeypatch):
    held = {}

    def wire(rp, streams, n):
        held["rp"] = rp
        held["covered"] = Steps.covers(rp)

    with monkeypatch.context() as m:
        if not compiled:
            m.setattr(Steps, "of", classmethod(lambda cls, rp, streams: None))
        o = sim.run(R, tr, conc, max_steps=30, timeline=True, wire=wire)
    o.pop("sim_seconds")
    rp = held["rp"]
    # what the loop writes back into the replay after each step
    state = (rp.split_end, rp.admissions, rp._copies, rp.chan.dfree, rp.chan.reads)
    return json.dumps(o, sort_keys=True), tier_contents(rp.ledger), state, held["covered"]


@pytest.fixture(scope="module")
def trace():
    """The shipped traces by their recipe's ``trace`` path."""
    out = {}
    for rid in (RID, ZC):
        R = spec.resolve(rid)
        out[R.trace] = load_trace(spec.REGISTRY.parent / R.trace, layers=R.layers, experts=R.experts, topk=R.topk)
    return out


@pytest.mark.parametrize("name", sorted(VARIANTS))
@pytest.mark.parametrize("conc", [1, 4])
def test_compiled_loop_gives_the_per_layer_report(name, conc, trace, monkeypatch):
    R = _recipe(VARIANTS[name])
    fast = _run(R, trace[R.trace], conc, True, monkeypatch)
    assert fast[3], f"{name}: the compiled loop does not cover this variant"
    slow = _run(R, trace[R.trace], conc, False, monkeypatch)
    assert fast[0] == slow[0]          # the report and its timeline
    assert fast[1] == slow[1]          # the tiers the run ends with
    assert fast[2] == slow[2]


def test_what_the_loop_covers():
    R = spec.resolve(RID)
    assert Steps.covers(Replay(R))          # the README's table runs through it
    pf = replace(R, policy=dict(R.policy, prefetch={"depth": 1, "predictor": "recall", "recall": 0.5}))
    from moetier.core.predict import make_predictor
    rp = Replay(pf, predictor=make_predictor(pf.policy, pf.layers, pf.experts))
    assert rp.prefetching and not Steps.covers(rp)
    rp = Replay(R)
    rp.deal = lambda ledger, picks: None
    assert not Steps.covers(rp)


def _replay_and_streams(traces):
    R = spec.resolve(RID)
    rp = Replay(R)
    streams = Streams(traces[R.trace], 1, R.topk, R.experts, offsets=[0])
    return rp, streams


def test_no_lane_for_nvme_picks_is_the_planners_error(trace):
    rp, streams = _replay_and_streams(trace)
    rp.ctx.cpu = rp.ctx.gpu = None
    with pytest.raises(ValueError, match="no lane can compute an NVMe pick") as e:
        Steps(rp, streams).step(streams.rows(0), 0.0, True)
    assert str(e.value) == NO_NVME_LANE


def test_a_broken_residency_rule_raises_as_the_ledger_does(trace):
    rp, streams = _replay_and_streams(trace)
    k = streams.flat()[0][0, 0, 0]
    rp.ledger.codes[k] = FILLING             # the planner reads it off NVMe; its fill finds it not absent
    with pytest.raises(ResidencyError, match=rf"fill_landed\({k}\): key is filling, expected absent"):
        Steps(rp, streams).step(streams.rows(0), 0.0, True)
