"""The KTransformers rows' tier structure against kt-kernel's own: the ledger a ``ktransformers-*`` row runs
(moetier.peers.rows.split_ledger) against a reference of kt-kernel's TieredWeightProvider written here from its
source (kvcache-ai/ktransformers ``kt-kernel/python/utils/weight_provider.py`` at commit
cba709123b51915f116c144a68bc5db3b137dcd0): ``policy_by_layer`` holds one residency policy per layer, each of capacity
``max_tier0_experts`` expert ids; ``record_activations(layer, topk_ids)`` hands that layer's policy its flattened
top-k ids in order, the layer's GPU experts filtered out; ``_maybe_promote`` promotes in a layer the ids its own
policy holds. The policies themselves are tests/policy_references.py's ``RefKT*`` (tests/test_policy_reference.py
checks them one cache at a time); this file checks the structure around them: per layer, the same whole share in
every layer, VRAM experts kept out, a layer's RAM keys exactly its policy's ids (or keys the policy dropped on a hit
that the tier keeps until it needs the slot, moetier.core.policies.machine); and, through sim.run, that a row whose
RAM uses come token by token (moetier.peers.token_feed) holds after every layer what the provider holds."""
from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pytest

from moetier.cli.common import find_path
from moetier.core import records as spec, sim
from moetier.core.ledger import RAM, VRAM, Ledger
from moetier.peers import rows as P
from moetier.traces.format import load_trace
from tests.policy_references import KTRANSFORMERS

L, E, TOPK = 4, 24, 3
GPU = {l: {(5 * l + j) % E for j in range(3)} for l in range(L)}     # each layer's GPU expert mask (static VRAM)


def _stream(seed: int, steps: int = 60, tokens: int = 2) -> list:
    """(layer, flattened top-k ids, token-major) per layer call: each layer its own Zipf over its experts."""
    rng = np.random.default_rng(seed)
    w = 1.0 / np.arange(1, E + 1) ** 0.8
    perms = [rng.permutation(E) for _ in range(L)]
    out = []
    for _ in range(steps):
        for l in range(L):
            ids = [int(perms[l][i]) for _ in range(tokens) for i in rng.choice(E, TOPK, replace=False, p=w / w.sum())]
            out.append((l, ids))
    return out


class ProviderRef:
    """kt-kernel's provider: one ``policy`` per layer of ``cap`` ids, fed each call's ids minus the GPU experts."""

    def __init__(self, policy, cap: int, shared: bool = False):
        one = policy(cap)
        self.pol = [one if shared else policy(cap) for _ in range(L)]

    def record(self, layer: int, ids) -> None:
        for e in ids:
            if e not in GPU[layer]:
                self.pol[layer].get(e)

    def resident(self, layer: int) -> set:
        return set(self.pol[layer].resident())


def _ledger(name: str, ram_slots: int):
    peer = P.by_name(f"ktransformers-{name}")
    R = SimpleNamespace(layers=L, experts=E, keys=L * E, vram_slots=sum(map(len, GPU.values())), ram_slots=ram_slots,
                        policy=P.recipe_policy(peer, {}))
    led = P.split_ledger(peer, R)
    led.seed([l * E + e for l in range(L) for e in sorted(GPU[l])])      # VRAM only: Tier0 starts empty
    return led


def _serve(led, layer: int, ids) -> None:
    """One layer call in kt-kernel's order: each id a RAM hit, or a read into RAM; VRAM experts computed there."""
    for e in ids:
        k = layer * E + e
        s = led.state.get(k)
        if s == RAM:
            led.ram_hit([k])
        elif s != VRAM:
            led.fill_landed(k)


def _held(led, layer: int) -> tuple[set, set]:
    """(ids the layer's policy holds, ids the layer holds in RAM)."""
    part = led._rpol.parts[layer]
    return ({k - layer * E for k in part.resident()},
            {k - layer * E for k in led.ram if k // E == layer})


def _agreement(name: str, ram_slots: int, seq, ref: ProviderRef, led=None) -> tuple[int, int]:
    led = led or _ledger(name, ram_slots)
    same = 0
    for layer, ids in seq:
        _serve(led, layer, ids)
        ref.record(layer, ids)
        same += all(_held(led, l)[0] == ref.resident(l) for l in range(L))
    return same, len(seq)


@pytest.mark.parametrize("name", ["2q", "slru", "sieve", "s3fifo", "wtinylfu"])
@pytest.mark.parametrize("ram_slots", [L * 1, L * 3 + 3, L * 6 + 1, L * 9])
def test_the_row_holds_what_kt_kernels_provider_holds_at_every_call(name, ram_slots):
    cap = ram_slots // L
    for seed in (0, 1, 2):
        led, ref = _ledger(name, ram_slots), ProviderRef(KTRANSFORMERS[f"kt-{name}"], cap)
        for n, (layer, ids) in enumerate(_stream(seed)):
            _serve(led, layer, ids)
            ref.record(layer, ids)
            led.check()
            for l in range(L):
                own, ram = _held(led, l)
                assert own == ref.resident(l), f"kt-{name} ram={ram_slots} seed={seed} call {n}: layer {l}"
                # the tier holds the policy's ids and, until it needs the slot, ids the policy dropped on a hit; no
                # layer more than the even share (the remainder unused), no GPU expert
                assert own <= ram and len(ram) <= cap and not ram & GPU[l], (l, own, ram)
            assert set(led.state) >= set(led.ram)


def test_the_streams_tell_the_structures_apart():
    # the agreement above could not hold by accident: on the same streams, one policy over expert ids shared by
    # every layer, or a split that gives the remainder to the first layers, parts from kt-kernel's provider
    ram_slots = L * 3 + 3
    for name in ("2q", "sieve", "wtinylfu"):
        ref = KTRANSFORMERS[f"kt-{name}"]
        shared, n = _agreement(name, ram_slots, _stream(0), ProviderRef(ref, ram_slots // L, shared=True))
        assert shared < n, f"kt-{name}: a shared-id policy agrees at every call"
        plain = Ledger(L * E, 12, ram_slots, ram_policy=f"kt-{name}", ram_partition="layer", layers=L, experts=E)
        plain.seed([l * E + e for l in range(L) for e in sorted(GPU[l])])
        got, n = _agreement(name, ram_slots, _stream(0), ProviderRef(ref, ram_slots // L), led=plain)
        assert got < n, f"kt-{name}: the remainder to the first layers agrees at every call"


def test_the_rows_ask_for_kt_kernels_structure():
    for p in P.PEERS:
        if p.name.startswith(("ktransformers-", "textbook-")):
            assert (p.policy["ram_partition"], p.policy["ram_share"], p.policy["ram_uses"]) == (
                "layer", "even", "tokens"), p.name
            assert not set(P.ROW_TIERS) & set(P.recipe_policy(p, {}))      # the row's options, not recipe fields


@pytest.mark.parametrize("name", ["2q", "s3fifo", "wtinylfu"])
@pytest.mark.parametrize("conc", [1, 4])
@pytest.mark.parametrize("rid", ["tiny-ci-cpu", "tiny-ci-cuda"])      # no VRAM; a static VRAM (the GPU mask)
def test_a_simulated_row_holds_what_the_provider_holds_after_every_layer(rid, name, conc):
    # the whole replay (moetier.peers.token_feed): the row's seed (coldest first, as the ledger seeds it) and then
    # every layer's token rows, each token's ids in order, go to the reference; after each layer the row's policies
    # hold what it holds, and the ledger's invariants hold
    R = spec.resolve(rid, [])
    trace = load_trace(find_path(R.trace), layers=R.layers, experts=R.experts, topk=R.topk, model_id=R.model_id)
    peer, Lr, Er = P.by_name(f"ktransformers-{name}"), R.layers, R.experts
    refs = [KTRANSFORMERS[f"kt-{name}"](R.ram_slots // Lr) for _ in range(Lr)]
    parted, layers = [], [0]

    def wire(rp, streams, steps):
        rank = P.wiring(peer, Lr, Er)(rp, streams, steps)
        led, layer_ = rp.ledger, rp.layer

        def order(ranked):
            keys = rank(ranked)
            for k in reversed(keys[R.vram_slots:R.vram_slots + R.ram_slots]):
                refs[k // Er].get(k % Er)
            return keys

        def layer(l, picks, t, streams_, rows, lanes=None):
            for i, tok in rows:
                for k in streams_.keys[i][tok][l]:
                    if led.state.get(k) != VRAM:
                        refs[l].get(k - l * Er)
            plan = layer_(l, picks, t, streams_, rows, lanes)
            led.check()
            layers[0] += 1
            if {k - l * Er for k in led._rpol.parts[l].resident()} != refs[l].resident():
                parted.append((layers[0], l))
            return plan
        rp.layer = layer
        return order
    sim.run(replace(R, policy=P.recipe_policy(peer, R.policy)), trace, conc, max_steps=40, wire=wire)
    assert layers[0] >= 40 * Lr and not parted, f"{len(parted)} of {layers[0]} layers parted, first {parted[:3]}"
