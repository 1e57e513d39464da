"""Differential tests: each residency policy against a reference written from its published algorithm
(tests/policy_references.py), resident set by resident set, on seeded Zipf, scan and mixed streams at capacities 1 to
64; plus worked examples (KTransformers' golden traces, and the ghost-hit case the old protocol lost)."""
import pytest

from moetier.core.policies import residency as P
from moetier.core.policies.ktransformers import KT2Q
from moetier.core.policies.machine import Machine
from tests.policy_references import (KTRANSFORMERS, TEXTBOOK, Ref2Q, RefS3FIFO, RefWTinyLFU, agreement, drive,
                                     streams)

CAPS = (1, 2, 3, 4, 5, 7, 8, 10, 16, 17, 32, 33, 64)
KINDS = ("zipf", "scan", "mixed")


def _check(name, ref_cls, kt, spec=None, ref_kw=None, n=400, seeds=(0, 1)):
    for cap in CAPS:
        for kind in KINDS:
            for seed in seeds:
                seq = streams(kind, cap, n, seed)
                same, steps = agreement(lambda: P.make(spec or name, cap), ref_cls(cap, **(ref_kw or {})), cap, seq,
                                        kt)
                assert same == steps, f"{spec or name} cap={cap} {kind} seed={seed}: {same}/{steps} steps agree"


@pytest.mark.parametrize("name", sorted(TEXTBOOK))
def test_textbook_policy_agrees_with_its_reference_at_every_step(name):
    _check(name, TEXTBOOK[name], kt=False)


@pytest.mark.parametrize("name", sorted(KTRANSFORMERS))
def test_ktransformers_policy_agrees_with_kt_kernel_at_every_step(name):
    _check(name, KTRANSFORMERS[name], kt=True)


@pytest.mark.parametrize("spec,ref", [
    ("2q:a1=0.5,ghost=1", lambda c: Ref2Q(c, a1=0.5, ghost=1.0)),
    ("2q:ghost=0", lambda c: Ref2Q(c, ghost=0.0)),
    ("s3fifo:small=0.25,ghost=0.5,move=1", lambda c: RefS3FIFO(c, small=0.25, ghost=0.5, move=1)),
    ("wtinylfu:window=0.2,protected=0.5,sample=2", lambda c: RefWTinyLFU(c, window=0.2, protected=0.5, sample=2)),
    ("wtinylfu:doorkeeper=1,sample=1", lambda c: RefWTinyLFU(c, sample=1, doorkeeper=True)),
])
def test_parameters_set_from_the_spec_reach_the_algorithm(spec, ref):
    _check(spec, lambda c, **_: ref(c), kt=False, spec=spec, seeds=(3,))


def test_2q_keeps_a_ghost_hit_when_the_key_is_the_oldest_ghost():
    # cap 4: Kin 1, Kout 2. 0,1,2,3 fill A1in; 4 evicts 0 to A1out, 5 evicts 1 (A1out [0, 1]); 6 evicts 2, which
    # would push 0 out of A1out (Kout 2) - but 0's request comes first: it is taken from A1out, then 2 is evicted
    pol = P.make("2q", 4)
    for _ in drive(pol, 4, [0, 1, 2, 3, 4, 5, 0]):
        pass
    q = pol.m
    assert 0 in q.am, "the ghost hit was lost: 0 landed in A1in"
    assert list(q.a1out) == [1, 2]


def test_s3fifo_scans_the_small_queue_until_one_key_goes_to_the_ghost():
    pol = P.make("s3fifo:small=0.5,move=1", 4)      # S of 2, M of 2
    seq = [0, 1, 2, 3, 4, 0, 1, 2, 3]
    held = [set(h) for h in drive(pol, 4, seq)]
    ref = RefS3FIFO(4, small=0.5, move=1)
    for k, h in zip(seq, held):
        ref.get(k)
        assert h == ref.resident()


def test_wtinylfu_window_and_main_fill_while_warming_as_caffeine():
    pol = P.make("wtinylfu:window=0.25", 8)          # window 2, main 6
    for _ in drive(pol, 8, [0, 1, 2, 3, 4]):
        pass
    q = pol.m
    assert list(q.win) == [3, 4] and list(q.prob) == [0, 1, 2]


@pytest.mark.parametrize("spec,accesses,expected,queues", [
    # kt-kernel test_residency_policy_golden_traces.py: the resident set after each request
    ("kt-slru:protected=0.6667", [0, 1, 0, 1, 2, 2, 3],
     [[0], [0, 1], [1, 0], [0, 1], [2, 0, 1], [0, 1, 2], [3, 1, 2]], {"prob": [3], "prot": [1, 2]}),
    ("kt-2q:a1=0.5", [0, 1, 0, 2, 3, 2, 4],
     [[0], [0, 1], [1, 0], [1, 2, 0], [2, 3, 0], [3, 0, 2], [3, 4, 0, 2]], {"a1": [3, 4], "am": [0, 2]}),
    ("kt-s3fifo:small=0.3334,ghost=1,move=1", [0, 0, 1, 2, 1],
     [[0], [0], [1, 0], [2, 0], [2, 0, 1]], {"s": [2], "m": [0, 1]}),
    ("kt-wtinylfu:window=0.3334,protected=0.5,decay=100", [0, 1, 0, 2, 1, 3],
     [[0], [1, 0], [1, 0], [2, 1, 0], [2, 0, 1], [3, 0, 1]], {"win": [3], "prob": [0], "prot": [1]}),
])
def test_ktransformers_golden_traces(spec, accesses, expected, queues):
    pol = P.make(spec, 4 if spec.startswith("kt-2q") else 3)
    for k, want in zip(accesses, expected):
        pol.hit(k) if k in pol else pol.insert(k)
        assert pol.resident() == set(want)
    for q, keys in queues.items():
        assert list(getattr(pol.m, q)) == keys


def test_a_key_dropped_on_a_hit_is_the_next_victim():
    # kt-2q moves an A1 hit to Am and trims Am's oldest at once: the tier keeps that key until it needs the slot
    pol = Machine(KT2Q(3, a1=0.34), "kt-2q")
    for k in (0, 1):
        pol.insert(k)
    pol.hit(0)                                     # A1 [1], Am [0]
    pol.insert(2)                                  # A1 [1, 2] > 1: 1 dropped, held by the tier
    assert 1 in pol and 1 not in pol.resident()
    assert pol.victim(5, lambda _k: True) == 1


@pytest.mark.parametrize("name", sorted(TEXTBOOK))
def test_the_ledgers_ram_tier_holds_the_references_keys(name):
    """The real ledger (moetier.core.ledger) running the policy on its RAM tier: after every request (a RAM hit,
    or an NVMe fill landing) it holds exactly the reference's keys."""
    from moetier.core.ledger import Ledger
    for cap in (1, 4, 17):
        seq = streams("mixed", cap, 300, 5)
        led = Ledger(10_000 + 4 * cap * 300, 0, cap, ram_policy=name)
        ref = TEXTBOOK[name](cap)
        for k in seq:
            if k in led.ram:
                led.ram_hit([k])
            else:
                led.fill_landed(k)
            ref.get(k)
            assert set(led.ram) == ref.resident(), (name, cap, k)
