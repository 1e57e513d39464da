"""The ledger's compiled commit (moetier.core.commit_kernel) against the ledger's Python methods, on small tiers.

Random layers of picks on tiers a few slots wide, so every path runs: VRAM refusals (more picks than slots, all
pinned), RAM refusals, drains of VRAM victims into RAM, inclusive copies, no RAM bookkeeping (all in RAM, no RAM
slots). After every layer the two ledgers hold the same states, RAM order, VRAM slots and counters, and admitted
as many picks.
"""
from __future__ import annotations

import numpy as np
import pytest

from moetier.core.ledger import Ledger, ResidencyError
from moetier.core.policies.belady import BeladyPolicy, Future
from moetier.core.policies.residency import partitioned
from moetier.core.tickets import RAM, VRAM

LAYERS, EXPERTS = 4, 16
KEYS = LAYERS * EXPERTS
CALLS = 600


def _calls(seed=11):
    """The layer calls' picks, each call one position of the oracle's future."""
    rng = np.random.default_rng(seed)
    out = []
    for step in range(CALLS):
        n = int(rng.integers(1, 9))
        out.append({int(k): 1 for k in step % LAYERS * EXPERTS + rng.choice(EXPERTS, size=n, replace=False)})
    return out


def _future():
    uses = {}
    for pos, picks in enumerate(_calls()):
        for k in picks:
            uses.setdefault(k, []).append(pos)
    return Future(uses, KEYS)


# (vram slots, ram slots, ledger options; a callable option is made per ledger from the ledger's future)
CASES = {
    "clock-lru": (3, 10, dict()),
    "clock-lru-inclusive": (3, 10, dict(exclusive=False)),
    "dlfu-lfu-layer": (3, 10, dict(ram_policy="lfu", vram_policy="dlfu", ram_partition="layer")),
    "dlfu-dlfu-layer-inclusive": (4, 12, dict(exclusive=False, ram_policy="dlfu:3", vram_policy="dlfu:5",
                                               ram_partition="layer")),
    "lfu-lfu-global": (3, 9, dict(ram_policy="dlfu:7", vram_policy="lfu")),
    "dlfu-two-slots": (2, 10, dict(ram_policy="lfu", vram_policy="dlfu", ram_partition="layer")),
    "clock-lfu-layer-uneven": (2, 7, dict(ram_policy="lfu", ram_partition="layer")),
    # uneven shares: each part's decayed LFU has its own halflife, which follows its slots
    "dlfu-layer-uneven": (3, 10, dict(ram_policy="dlfu", vram_policy="dlfu", ram_partition="layer")),
    "no-ram-slots": (3, 0, dict(vram_policy="dlfu")),
    "all-in-ram": (3, KEYS, dict()),
    "no-vram": (0, 10, dict(ram_policy="lfu", ram_partition="layer")),
    "lru-lru-layer": (3, 10, dict(ram_policy="lru", vram_policy="lru", ram_partition="layer")),
    "fifo-fifo-global": (3, 9, dict(ram_policy="fifo", vram_policy="fifo")),
    # the built-in LRU's window LFU: the least decayed count among the oldest few (Replay.after_layer counts)
    "window-lfu": (3, 10, dict(ram_policy="lfu:4:6", vram_policy="dlfu")),
    "window-lfu-inclusive": (3, 10, dict(exclusive=False, ram_policy="lfu:3")),
    # VRAM split per layer (the mixtral-offloading row's): a victim of the incoming key's layer
    "lru-layer-vram": (6, 10, dict(ram_policy="fifo", ram_partition="layer",
                                   vram_policy=lambda F: partitioned("lru", 6, LAYERS, EXPERTS))),
    # the machines (moetier.core.policies.machine) on a RAM tier, global or split per layer
    "2q-global": (3, 10, dict(ram_policy="2q", vram_policy="dlfu")),
    "slru-layer": (3, 10, dict(ram_policy="slru", ram_partition="layer")),
    "s3fifo-inclusive": (3, 10, dict(exclusive=False, ram_policy="s3fifo")),
    "wtinylfu-global": (3, 12, dict(ram_policy="wtinylfu", vram_policy="lru")),
    "kt-2q-layer": (3, 10, dict(ram_policy="kt-2q", ram_partition="layer")),
    "kt-sieve-global": (3, 10, dict(ram_policy="kt-sieve")),
    "kt-wtinylfu-layer": (4, 12, dict(ram_policy="kt-wtinylfu", ram_partition="layer")),
    "sieve-global": (3, 10, dict(ram_policy="sieve", vram_policy="dlfu")),
    "sieve-layer-inclusive": (3, 10, dict(exclusive=False, ram_policy="sieve", ram_partition="layer")),
    # the oracle's: Belady on both tiers, global, or split per layer (an even share: a part's slots unused)
    "belady-global": (3, 10, dict(ram_policy=lambda F: BeladyPolicy(10, F, width=KEYS),
                                  vram_policy=lambda F: BeladyPolicy(3, F, width=KEYS))),
    "belady-layer": (4, 9, dict(ram_partition="layer",
                                ram_policy=lambda F: partitioned("belady", 9, LAYERS, EXPERTS, F, even=True),
                                vram_policy=lambda F: partitioned("belady", 4, LAYERS, EXPERTS, F))),
    "belady-inclusive": (3, 10, dict(exclusive=False, ram_policy=lambda F: BeladyPolicy(10, F, width=KEYS),
                                     vram_policy=lambda F: BeladyPolicy(3, F, width=KEYS))),
}


MACHINES = ("2q-global", "slru-layer", "s3fifo-inclusive", "wtinylfu-global", "kt-2q-layer", "kt-sieve-global",
            "kt-wtinylfu-layer", "sieve-global", "sieve-layer-inclusive")


def _ledgers(case):
    """(the compiled ledger, the Python one, their futures' clocks)."""
    v, r, kw = CASES[case]
    nows = []

    def made():                                  # a policy object each: the two ledgers share no state
        F = _future()
        nows.append(F.now)
        return Ledger(KEYS, v, r, **{k: x(F) if callable(x) else x
                                     for k, x in dict(kw, layers=LAYERS, experts=EXPERTS).items()})
    fast, plain = made(), made()
    plain.commits = False
    plain._rfast = plain._vfast = False      # the plain victim search, not the compiled put / evict_for
    assert fast.commits
    return fast, plain, nows


def _deal(led, picks, rng, can_push):
    """Lanes by each pick's state, as a planner could deal them: VRAM -> gpu, RAM -> cpu or zerocopy, else an
    NVMe lane."""
    gpu, zc, cpu, ncpu, ngpu = [], [], [], [], []
    for k in picks:
        s = led.codes[k] or (RAM if led.all_in_ram else 0)
        if s == VRAM:
            gpu.append(k)
        elif s == RAM:
            (zc if can_push and rng.random() < 0.4 else cpu).append(k)
        else:
            (ngpu if can_push and rng.random() < 0.5 else ncpu).append(k)
    return gpu, zc, cpu, ncpu, ngpu


def _python_commit(led, lanes, picks, can_admit):
    """Replay.commit's steps through the ledger's Python methods."""
    gpu, zc, cpu, ncpu, ngpu = lanes
    if gpu:
        led.vram_hit(gpu)
    if cpu and not led.all_in_ram:
        led.ram_hit(cpu)
    for k in ncpu:
        led.fill_landed(k, picks)
    n = led.pushes_landed(zc, picks) if zc and can_admit else 0
    if ngpu and can_admit:
        led.pushes_landed(ngpu, picks, staged=True)
    return n


def _packed(lanes):
    return np.array([len(x) for x in lanes] + [0] + [k for x in lanes for k in x], np.int64)


def _tiers(led):
    return bytes(led.codes), list(led.ram), list(led.clock.owner), bytes(led.clock.ref), dict(led.counters), \
        _machines(led)


def _machines(led):
    """The RAM machines' own state, ghosts, orphans and pending key included (each ledger's laid out alike)."""
    pol = led._rpol
    parts = getattr(pol, "parts", [pol] if pol is not None else [])
    return [(p.m.iv.tolist(), p.m.st.tolist(), p.m.aux.tolist()) for p in parts if hasattr(p, "m")]


@pytest.mark.parametrize("case", sorted(CASES))
def test_compiled_commit_matches_the_python_methods(case):
    fast, plain, nows = _ledgers(case)
    if case == "dlfu-layer-uneven":
        assert len({p.halflife for p in fast._rpol.parts}) > 1
    rng = np.random.default_rng(11)
    seed = rng.permutation(KEYS)[:KEYS // 2]
    fast.seed(seed)
    plain.seed(seed)
    can_push = fast.vram_slots > 0
    admitted = 0
    for step, picks in enumerate(_calls()):
        fast.step = plain.step = step // LAYERS
        for now in nows:
            now[0] = step
        lanes = _deal(fast, picks, rng, can_push)
        a = fast.commit(_packed(lanes), True)
        b = _python_commit(plain, lanes, picks, True)
        assert a == b, f"step {step}: admitted {a} compiled, {b} in Python"
        for led in (fast, plain):
            led.observe(picks, led.step)
        assert _tiers(fast) == _tiers(plain), f"step {step}: the tiers differ"
        admitted += a
    fast.check()
    if can_push:
        assert fast.counters["vram_evictions"] > 20
        assert admitted > 20 or not fast.ram_slots          # zerocopy picks are RAM picks
    if case in ("clock-lru", "dlfu-lfu-layer", "lfu-lfu-global", "belady-global", "belady-layer"):
        assert fast.counters["refused_admissions"] > 0 and fast.counters["ram_evictions"] > 50   # refusals ran
    if case in MACHINES:                        # the machines' evictions and refusals ran
        assert fast.counters["ram_evictions"] > 50 and _machines(fast)
    if case.startswith("window"):             # the window chose other than the oldest key
        assert 20 < fast.counters["lfu_evictions"] < fast.counters["ram_evictions"]


def test_a_fill_of_a_resident_key_is_refused_as_in_python():
    fast, plain, _ = _ledgers("clock-lru")
    for led in (fast, plain):
        led.seed([5])
    with pytest.raises(ResidencyError, match=r"fill_landed\(5\)"):
        fast.commit(_packed(([], [], [], [5], [])), True)
    with pytest.raises(ResidencyError, match=r"fill_landed\(5\)"):
        _python_commit(plain, ([], [], [], [5], []), {5: 1}, True)


def test_a_stacked_machine_never_grows_out_of_the_stack():
    """A machine the commit stacked is sized for its keys once; growing it would give the Python path a copy the
    commit never sees, so it refuses."""
    led = Ledger(KEYS, 3, 10, ram_policy="2q")
    assert led.commits and led._rpol.m.stacked
    led._rpol.m.fit(0, KEYS - 1)                # within: nothing to do
    with pytest.raises(ValueError, match="stacked"):
        led._rpol.m.fit(KEYS, KEYS)


def test_a_ledger_the_kernel_does_not_cover_says_so():
    assert not Ledger(KEYS, 3, 10, vram_policy="2q").commits                  # a machine on the VRAM tier
    # W-TinyLFU split over uneven shares: each part's sketch follows its slots, so they do not stack
    assert not Ledger(KEYS, 3, 10, ram_policy="wtinylfu", ram_partition="layer", layers=LAYERS,
                      experts=EXPERTS).commits
    assert not Ledger(KEYS, 3, 10, vram_policy=partitioned("sieve", 3, LAYERS, EXPERTS)).commits
    assert not Ledger(KEYS, 3, 10, vram_policy="sieve").commits


def test_the_window_lfu_counts_decay_by_halflife():
    """Ledger.observe's compiled counts against the formula: a key's count halves every ``halflife`` steps between
    its uses, then the use adds one; the victim search reads it decayed to the ledger's step."""
    from moetier.core import commit_kernel as CK
    led = Ledger(KEYS, 0, 4, ram_policy="lfu:4:3")
    uses = [(0, [1, 2, 2]), (3, [1]), (5, [2, 7]), (9, [1, 7])]
    want: dict = {}
    for now, keys in uses:
        led.observe(keys, now)
        for k in keys:
            v, t = want.get(k, (0.0, now))
            want[k] = (v * 0.5 ** ((now - t) / 3) + 1.0, now)
    led.step = 12
    for k, (v, t) in want.items():
        assert CK.decayed(led._lw, KEYS, k) == pytest.approx(v * 0.5 ** ((12 - t) / 3), rel=1e-12)
    assert CK.decayed(led._lw, KEYS, 5) == 0.0
