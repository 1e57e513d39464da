"""The host-owned residency rule under adversarial timing.

A ``Chaos`` wrapper around the backend under test delays completions at random (landed() answers False for a random
number of polls) and reorders them (wait(h) may first complete other outstanding handles, and sleeps a little).
Hypothesis drives runtime runs of the backend's CI recipe (seeds, concurrency, RAM/VRAM pressure, and prefetch reads
on or off: the CI recipes issue none, and prefetch reads are the ones the runtime cancels or leaves in flight) through
it, with two instruments:

* compute(): every (key, slot) a lane reads must hold that key's bytes from a transfer the host saw land (via
  landed() or wait()), and the ledger must count the key resident (gpu lane: VRAM; RAM lanes: resident or staged);
* Ledger.land(ticket): the latest transfer of the ticket's kind for that key must have been reported landed.
"""
from __future__ import annotations

import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hst

from conformance.conftest import close_within, fence_within, refuse_hung, runtime_backend
from moetier.core import ledger as ledger_mod
from moetier.run import runtime
from moetier.core import records as spec

STEPS = 5
EXAMPLES = 6


class ResidencyViolation(AssertionError):
    pass


class Chaos:
    def __init__(self, inner, seed: int, p_reorder: float = 0.5):
        self._inner = inner
        self.capabilities = inner.capabilities
        self.rng = np.random.default_rng(seed)
        self.p_reorder = p_reorder
        self.keep = []                       # every handle (ids stay unique while we hold them)
        self.reported: set = set()           # ids of handles the host saw land
        self.polls: dict = {}                # id -> landed() polls that still answer False
        self.pending: list = []
        self.ram_owner: dict = {}            # RAM slot -> (key, handle of the transfer that wrote it)
        self.vram_owner: dict = {}
        self.last: dict = {}                 # (kind, key) -> latest handle
        self.ledger = None
        self.n = dict(computed=0, landed_checks=0, false_polls=0, reordered=0)

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def _track(self, kind, key, h, owner, slot):
        self.keep.append(h)
        owner[int(slot)] = (int(key), h)
        self.last[(kind, int(key))] = h
        self.polls[id(h)] = int(self.rng.integers(0, 5))
        self.pending.append(h)
        return h

    def fill(self, key, slot, *, prefetch=False):
        return self._track("fill", key, self._inner.fill(key, slot, prefetch=prefetch), self.ram_owner, slot)

    def push(self, key, src_slot, vram_slot):
        return self._track("push", key, self._inner.push(key, src_slot, vram_slot), self.vram_owner, vram_slot)

    def drain(self, key, vram_slot, ram_slot):
        return self._track("drain", key, self._inner.drain(key, vram_slot, ram_slot), self.ram_owner, ram_slot)

    def _report(self, h):
        self.reported.add(id(h))
        if h in self.pending:
            self.pending.remove(h)

    def landed(self, h):
        if self.polls.get(id(h), 0) > 0:
            self.polls[id(h)] -= 1
            self.n["false_polls"] += 1
            return False
        ok = self._inner.landed(h)
        if ok:
            self._report(h)
        return ok

    def wait(self, h):
        others = [o for o in self.pending if o is not h]
        if others and self.rng.random() < self.p_reorder:
            for j in self.rng.permutation(len(others))[:2]:
                try:
                    self._inner.wait(others[j])          # completes, but the host has not been told
                except Exception:
                    pass
                self.n["reordered"] += 1
        if self.rng.random() < 0.2:
            time.sleep(float(self.rng.random()) * 2e-4)
        r = self._inner.wait(h)
        self._report(h)
        return r

    def fence(self):
        fence_within(self._inner)          # a run's closing fence that never returns fails the check

    def completed_seq(self):
        return self._inner.completed_seq()

    def compute(self, lane, jobs, x):
        owner = self.vram_owner if lane == "gpu" else self.ram_owner
        L = self.ledger
        for key, slot, _ in jobs:
            got = owner.get(int(slot))
            where = f"{lane} lane read key {key} from {'VRAM' if lane == 'gpu' else 'RAM'} slot {slot}"
            if got is None:
                raise ResidencyViolation(f"{where}: no transfer ever wrote that slot")
            if got[0] != int(key):
                raise ResidencyViolation(f"{where}: the slot holds key {got[0]}")
            if id(got[1]) not in self.reported:
                raise ResidencyViolation(f"{where}: its transfer (seq {got[1].seq}) has not been reported landed")
            if L is not None:
                st = L.state.get(int(key))
                ok = st == ledger_mod.VRAM if lane == "gpu" else (L.resident(int(key)) or st == ledger_mod.STAGED)
                if not ok:
                    raise ResidencyViolation(f"{where}: the ledger has it {L.state_of(int(key))}")
        self.n["computed"] += len(jobs)
        return self._inner.compute(lane, jobs, x)


class _Instrumented:
    """Patch Runtime.__init__ (to hand the chaos wrapper the run's ledger) and Ledger.land (the landing check)."""

    def __init__(self, chaos):
        self.chaos = chaos

    def __enter__(self):
        chaos = self.chaos
        self.init0, self.land0 = runtime.Runtime.__init__, ledger_mod.Ledger.land
        init0, land0 = self.init0, self.land0

        def init(rt, *a, **kw):
            init0(rt, *a, **kw)
            chaos.ledger = rt.L

        def land(L, ticket, protect=()):
            if L is chaos.ledger:
                h = chaos.last.get((ticket.kind, ticket.key))
                if h is None or id(h) not in chaos.reported:
                    raise ResidencyViolation(f"Ledger.land({ticket!r}) before its {ticket.kind} handle reported "
                                             f"landed ({h!r})")
                chaos.n["landed_checks"] += 1
            return land0(L, ticket, protect)

        runtime.Runtime.__init__ = init
        ledger_mod.Ledger.land = land
        return self

    def __exit__(self, *exc):
        runtime.Runtime.__init__ = self.init0
        ledger_mod.Ledger.land = self.land0


@pytest.fixture(scope="module")
def rt_backend(recipe_env, backend_name):
    _, R, st, _ = recipe_env
    be = runtime_backend(backend_name, R, st, conc=2)
    yield be
    close_within(be)


PREFETCH = ["policy.prefetch.depth=1", "policy.prefetch.predictor=recall", "policy.prefetch.recall=0.7"]


def _recipe(rid, R, pressure, prefetch):
    sets = list(PREFETCH) if prefetch else []
    if pressure == "tight":
        sets.append(f"budget.ram_gb={float(R.raw['budget']['ram_gb']) * 0.6:.4f}")
        if R.vram_slots:
            sets.append(f"budget.vram_expert_slots={max(4, R.vram_slots // 3)}")
    return spec.resolve(rid, spec.parse_overrides(sets))


@settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(seed=hst.integers(0, 2**31 - 1), conc=hst.sampled_from([1, 2]), pressure=hst.sampled_from(["recipe", "tight"]),
       prefetch=hst.booleans())
def test_residency_rule_under_adversarial_timing(recipe_env, rt_backend, seed, conc, pressure, prefetch):
    refuse_hung(rt_backend)
    rid, _, st, tr = recipe_env
    R = _recipe(rid, recipe_env[1], pressure, prefetch)
    chaos = Chaos(rt_backend, seed)
    with _Instrumented(chaos):
        res = runtime.run(R, st, chaos, tr, conc, max_steps=STEPS, seed=seed % 7)
    assert chaos.n["computed"] > 0 and chaos.n["landed_checks"] > 0, chaos.n
    assert res["checksum_failures"] == 0
