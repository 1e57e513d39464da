"""The simulator's compiled step loop (moetier.core.step_kernel) against the per-layer path it replaces.

Each case runs one recipe variant both ways (the loop forced off through ``Steps.of``) and compares the whole report,
the per-step timeline and the tier contents the run ends with, exactly. The variants reach every branch of the loop:
overlapped and serial copies, exclusive and inclusive RAM, CLOCK and decayed-LFU VRAM, LRU and LFU RAM, the lossy
mask, all experts in RAM, several rows a step, and a recipe calibrated on a host (its host cache model, latency table
and bursts, and the cpu lane's wake term). The shipped recipes' cells are in tests/test_core_parity.py.
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
from moetier.peers.compare import _policy
from moetier.peers.rows import by_name, wiring
from moetier.traces.format import load_trace
from tests.parity.record import tier_contents

RID = "glm53-rtx3090-55g-nvx4"
ZC = "glm53-rtx5070-20g-nvme1"          # a zerocopy lane beside the cpu lane
# calibrated on a host: a host cache model, a latency-by-depth table with measured bursts, the cpu lane's wake term
HOST = "tiny-local-cpu"
VARIANTS = {
    "default": {},
    "serial copies": {"policy.overlap": False},
    "zerocopy": {"recipe": ZC},
    "zerocopy, serial copies": {"recipe": ZC, "policy.overlap": False},
    "inclusive lru, clock": {"policy.ram": "inclusive", "policy.ram_evict": "lru", "policy.vram_evict": None,
                             "policy.ram_partition": "global"},
    "global dlfu": {"policy.ram_evict": "dlfu", "policy.ram_partition": "global"},
    "window lfu": {"policy.ram_evict": "lfu:8:20", "policy.ram_partition": "global"},
    "dlfu per layer": {"policy.ram_evict": "dlfu"},         # the layers' uneven shares: halflives of their own
    "2q": {"policy.ram_evict": "2q", "policy.ram_partition": "global"},           # the machines, on the RAM tier
    "kt-slru per layer": {"policy.ram_evict": "kt-slru"},
    "sieve per layer": {"policy.ram_evict": "sieve"},
    "mask": {"policy.exact": "mask"},
    "static vram": {"policy.vram_admit": False},
    "all in ram": {"budget.ram_gb": 10000, "policy.ram_evict": "lru", "policy.ram_partition": "global"},
    "calibrated host": {"recipe": HOST},
    "calibrated host, serial copies": {"recipe": HOST, "policy.overlap": False},
    "calibrated host, window lfu": {"recipe": HOST, "policy.ram_evict": "lfu"},
}


def _recipe(over: dict):
    over = dict(over)
    rid = over.pop("recipe", RID)
    R = spec.resolve(rid, [f"budget.ram_gb={over.pop('budget.ram_gb')}"] if "budget.ram_gb" in over else [])
    policy = dict(R.policy, warmup_tokens=16)
    for k, v in over.items():
        policy[k.split(".")[1]] = v
    return replace(R, policy={k: v for k, v in policy.items() if v is not None})


def _run(R, tr, conc, compiled: bool, monkeypatch, peer=None):
    held = {}

    def wire(rp, streams, n):
        seed = wiring(peer, R.layers, R.experts)(rp, streams, n) if peer is not None else None
        held["rp"] = rp
        held["covered"] = Steps.covers(rp)
        return seed

    with monkeypatch.context() as m:
        if not compiled:
            m.setattr(Steps, "of", classmethod(lambda cls, rp, streams: None))
        o = sim.run(R, tr, conc, max_steps=30, timeline=True, wire=wire)
    o.pop("sim_seconds")
    rp = held["rp"]
    # what the loop writes back into the replay after each step
    llc = rp.llc and (rp.llc.clock, rp.llc.last.tolist())
    state = (rp.split_end, rp.admissions, rp._copies, rp.chan.dfree, rp.chan.reads, rp.chan.outstanding, llc)
    return json.dumps(o, sort_keys=True), tier_contents(rp.ledger), state, held["covered"]


@pytest.fixture(scope="module")
def trace():
    """The shipped traces by their recipe's ``trace`` path."""
    out = {}
    for rid in (RID, ZC, HOST):
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
    if "calibrated" in name:                     # the calibrated terms were in play
        split_end, *_, outstanding, llc = fast[2]
        assert split_end is not None and outstanding and llc[0] > 0


def test_what_the_loop_covers():
    R = spec.resolve(RID)
    assert Steps.covers(Replay(R))          # the README's table runs through it
    pf = replace(R, policy=dict(R.policy, prefetch={"depth": 1, "predictor": "recall", "recall": 0.5}))
    from moetier.core.predict import make_predictor
    rp = Replay(pf, predictor=make_predictor(pf.policy, pf.layers, pf.experts))
    assert rp.prefetching and not Steps.covers(rp)
    from moetier.core.ledger import Ledger
    rp = Replay(R)
    rp.ledger = Ledger(R.keys, R.vram_slots, R.ram_slots, vram_policy="2q")      # a machine on the VRAM tier
    assert not rp.ledger.commits and not Steps.covers(rp)
    rp = Replay(R)
    rp.after_layer = lambda picks: None          # a wiring's own step (moetier.peers.token_feed.wire)
    assert rp.ledger.commits and not Steps.covers(rp)


def _replay_and_streams(traces):
    R = spec.resolve(RID)
    rp = Replay(R)
    streams = Streams(traces[R.trace], 1, R.topk, R.experts, offsets=[0])
    return rp, streams


@pytest.mark.parametrize("row", ["oracle-reference", "oracle-default"])
@pytest.mark.parametrize("conc", [1, 4])
def test_the_oracles_rows_run_through_the_loop_as_through_the_layers(row, conc, trace, monkeypatch):
    # Belady on both tiers (global, and split per layer), the future's clock and the RAM picks' uses ahead of
    # each plan (Replay.oracle_clock), the deal rule
    peer = by_name(row)
    R = spec.resolve(RID)
    R = replace(R, policy=dict(_policy(R, peer), warmup_tokens=16))
    fast = _run(R, trace[R.trace], conc, True, monkeypatch, peer)
    assert fast[3], f"{row}: the compiled loop does not cover the oracle's replay"
    slow = _run(R, trace[R.trace], conc, False, monkeypatch, peer)
    assert fast[:3] == slow[:3]


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


@pytest.mark.parametrize("bursts", [None, {"2": {"1": 1.8, "2": 2.0}}])
def test_the_loops_reads_join_those_in_flight_as_the_channels_do(bursts):
    # the loop keeps the table model's reads in flight in an array; a read landing at t exactly has landed
    import numpy as np

    from moetier.core import step_kernel as SK
    from moetier.core.channel import NvmeChannel
    from moetier.core.terms import ChannelTerms
    terms = ChannelTerms(latency_by_qd={"1": 1.0, "2": 1.5, "4": 2.2}, bursts=bursts)
    ch = NvmeChannel(1_000_000, 1.0, terms=terms)
    G, Z, OUT = np.zeros(SK.G_N), np.zeros(SK.Z_N, np.int64), np.empty(16)
    for t, n in ((0.0, 2), (0.5, 1), (1.5, 2), (3.5, 2), (3.7, 3), (20.0, 2)):
        want = ch.demand(t, n)
        reads = np.empty(n)
        SK._issue(ch.kt, G, Z, OUT, t, reads)
        assert reads.tolist() == want
        assert OUT[:Z[SK.Z_NOUT]].tolist() == ch.outstanding and G[SK.G_DFREE] == ch.dfree
    assert Z[SK.Z_READS] == ch.reads == 12
