"""Deliberately BROKEN backends (mutants) - test-only: tests/test_conformance_meta.py runs the suite against each to
show a named check catches it. Never use them for anything else.

Each wraps a working backend and breaks exactly one promise of the contract. ``MUTANTS`` lists them: the failure,
the verb it breaks, the check that must catch it and the bases it wraps (the cpu backend, and the sycl backend
where the verb exists there: push and drain exist only on sycl). ``BROKEN`` maps each ``--backend`` name to a
factory: ``broken-<failure>`` wraps cpu, ``broken-sycl-<failure>`` wraps sycl. ``broken-declares-nothing``
declares no lanes and no encodings: the minimum bar (conformance.bar), not a check, rejects it;
``broken-lacks-compute`` lacks a required verb: the contract's check refuses it and every check fails.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from conformance.broken_handles import (BrokenCancelLies, BrokenFailureHidden, BrokenFenceEarly, BrokenFenceNever,
                                        BrokenHandleKey, BrokenLandedEarly, BrokenLandedNever, BrokenOutOfOrder,
                                        BrokenPrefetchLandedEarly, BrokenPushLandedEarly, BrokenSeq, BrokenSeqStuck,
                                        BrokenWaitNever, _Wrap)
from moetier.run.router import StoreRouter, topk_scores

VICTIM = 5            # the key the one-wrong-expert mutant computes from its neighbour's slot
SHORT = 4096          # bytes a short read leaves unwritten at the end of a record: one O_DIRECT page


# -- route ------------------------------------------------------------------------------------------------------------

class _RouteBase(_Wrap):
    def _scores(self, layer, x, k):
        rec = self._inner.store.router_record()
        logits = np.asarray(x, np.float32) @ self._inner.store.router(layer).T
        return rec, logits, int(k or rec["topk"])


class BrokenRouteWrongTopk(_RouteBase):
    """BROKEN: each row's k-th pick is the (k+1)-th best expert."""

    def route(self, layer, x, rows=None):
        rec, logits, k = self._scores(layer, x, None)
        ids, w = topk_scores(logits, k + 1, rec["scoring"], False)
        ids, w = np.delete(ids, k - 1, axis=1), np.delete(w, k - 1, axis=1)
        if rec["renormalize"]:
            w = w / w.sum(axis=1, keepdims=True)
        return ids.tolist(), w.tolist()


class BrokenRouteNotRenormalised(_RouteBase):
    """BROKEN: the top-k weights are the raw scores, not rescaled to sum 1 as the router record says."""

    def route(self, layer, x, rows=None):
        rec, logits, k = self._scores(layer, x, None)
        ids, w = topk_scores(logits, k, rec["scoring"], False)
        return ids.tolist(), w.tolist()


class BrokenRouteDroppedPick(_Wrap):
    """BROKEN: row 3 loses its last pick (and weight)."""

    def route(self, layer, x, rows=None):
        picks, weights = StoreRouter(self._inner.store).route(layer, x, rows)
        if len(picks) > 3:
            picks[3], weights[3] = picks[3][:-1], weights[3][:-1]
        return picks, weights


# -- compute ----------------------------------------------------------------------------------------------------------

class BrokenComputeScale(_Wrap):
    """BROKEN: every output scaled by 1.001 (an NMSE of 1e-6)."""

    def compute(self, lane, jobs, x):
        return {k: y * np.float32(1.001) for k, y in self._inner.compute(lane, jobs, x).items()}


class BrokenComputeOneKeyScale(_Wrap):
    """BROKEN: key VICTIM's output scaled by 1.001 (on exl3, inside the NMSE bound and, over all keys, the scale's)."""

    def compute(self, lane, jobs, x):
        return {k: y * np.float32(1.001) if k == VICTIM else y for k, y in self._inner.compute(lane, jobs, x).items()}


class BrokenComputeWrongExpert(_Wrap):
    """BROKEN: key VICTIM is computed from the bytes of the slot next to its own."""

    def compute(self, lane, jobs, x):
        return self._inner.compute(lane, [(k, s ^ 1 if k == VICTIM else s, r) for k, s, r in jobs], x)


class BrokenComputeRowOffByOne(_Wrap):
    """BROKEN: each job's last output row is computed from the next row of x."""

    def compute(self, lane, jobs, x):
        n = len(x)
        return self._inner.compute(lane, [(k, s, list(r[:-1]) + [(int(r[-1]) + 1) % n]) for k, s, r in jobs], x)


class BrokenZerocopyUlp(_Wrap):
    """BROKEN: the zerocopy lane's outputs are one ulp off the gpu lane's (deterministic, inside every bound)."""

    def compute(self, lane, jobs, x):
        out = self._inner.compute(lane, jobs, x)
        if lane != "zerocopy":
            return out
        return {k: np.nextafter(y, np.float32(np.inf)) for k, y in out.items()}


class BrokenNondeterministic(_Wrap):
    """BROKEN: every compute() adds fresh noise of relative size 1e-6 (NMSE 1e-12, inside every bound; never the
    same bits twice)."""

    def __init__(self, inner):
        super().__init__(inner)
        self._rng = np.random.default_rng()

    def compute(self, lane, jobs, x):
        out = self._inner.compute(lane, jobs, x)
        return {k: (y * (1 + 1e-6 * self._rng.standard_normal(y.shape))).astype(np.float32) for k, y in out.items()}


# -- transfers that land wrong bytes ----------------------------------------------------------------------------------

class _AfterLanding(_Wrap):
    """Runs a damage function on a transfer's destination once, right after the inner backend says it landed."""

    def __init__(self, inner):
        super().__init__(inner)
        self._todo: dict = {}

    def _track(self, h, damage):
        self._todo[id(h)] = (h, damage)
        return h

    def _settle(self, h):
        got = self._todo.pop(id(h), None)
        if got is not None:
            got[1]()

    def landed(self, h):
        ok = self._inner.landed(h)
        if ok:
            self._settle(h)
        return ok

    def wait(self, h):
        r = self._inner.wait(h)
        self._settle(h)
        return r

    def fence(self):
        self._inner.fence()
        for h, _ in list(self._todo.values()):
            self._settle(h)


class BrokenFillShortRead(_AfterLanding):
    """BROKEN: a fill reads all but the last SHORT bytes of the record and reports the read whole."""

    def fill(self, key, slot, *, prefetch=False):
        def cut():
            self._inner.ram_view(slot)[self._inner.store.record_bytes - SHORT:self._inner.store.record_bytes] = 0
        return self._track(self._inner.fill(key, slot, prefetch=prefetch), cut)


class BrokenBytes(_AfterLanding):
    """BROKEN: once a fill has landed, one byte of the slot is flipped."""

    def fill(self, key, slot, *, prefetch=False):
        def flip():
            self._inner.ram_view(slot)[(int(key) * 7919) % int(self._inner.store.record_bytes)] ^= 0x5A
        return self._track(self._inner.fill(key, slot, prefetch=prefetch), flip)


class BrokenDrainBytesLost(_AfterLanding):
    """BROKEN: a drain reports landed but the RAM slot never gets the bytes (zeros)."""

    def drain(self, key, vram_slot, ram_slot):
        def lose():
            self._inner.ram_view(ram_slot)[:] = 0
        return self._track(self._inner.drain(key, vram_slot, ram_slot), lose)


class BrokenFillWrongSlot(_Wrap):
    """BROKEN: fill(key, slot) lands in slot ^ 1."""

    def fill(self, key, slot, *, prefetch=False):
        return self._inner.fill(key, slot ^ 1, prefetch=prefetch)


class BrokenPushWrongSlot(_Wrap):
    """BROKEN: push(key, src, vram_slot) lands in VRAM slot vram_slot ^ 1."""

    def push(self, key, src_slot, vram_slot):
        return self._inner.push(key, src_slot, vram_slot ^ 1)


class BrokenDrainWrongKey(_Wrap):
    """BROKEN: drain(key, vram_slot, ram_slot) copies the neighbouring VRAM slot (another key's bytes)."""

    def drain(self, key, vram_slot, ram_slot):
        return self._inner.drain(key, vram_slot ^ 1, ram_slot)


class _NeverCopied:
    """The handle of a copy that was never made, reported landed."""

    state, prefetch, t_submit, t_landed = "landed", False, 0.0, 0.0

    def __init__(self, seq, key):
        self.seq, self.key = seq, int(key)


class BrokenDrainRemembered(_Wrap):
    """BROKEN: drain(key, vram_slot, ram_slot) skips the copy, reporting it landed at once, when it drained that key
    into that RAM slot before: it remembers its own drains, not what was written into the slot since. It offers no
    ram_view, so a check cannot clear the slot through the hook before draining into it."""

    ram_view = None

    def __init__(self, inner):
        super().__init__(inner)
        self._drained: set = set()

    def drain(self, key, vram_slot, ram_slot):
        if (int(key), int(ram_slot)) in self._drained:
            return _NeverCopied(self._inner.completed_seq(), key)
        self._drained.add((int(key), int(ram_slot)))
        return self._inner.drain(key, vram_slot, ram_slot)

    def landed(self, h):
        return True if isinstance(h, _NeverCopied) else self._inner.landed(h)

    def wait(self, h):
        return h if isinstance(h, _NeverCopied) else self._inner.wait(h)


class BrokenSlotReuse(_Wrap):
    """BROKEN: every fill reads into one staging slot (the arena's last) and is copied out to its own slot only when
    the queue has drained - the staging slot is reused before the previous read was fenced out of it, so transfers
    in flight together all land the last read's bytes."""

    def __init__(self, inner):
        super().__init__(inner)
        self._stage = int(inner.ram_slot_count) - 1
        self._out: list = []                          # [(inner handle, destination slot)] not yet copied out

    def fill(self, key, slot, *, prefetch=False):
        h = self._inner.fill(key, self._stage, prefetch=prefetch)
        self._out.append((h, int(slot)))
        return h

    def _flush(self):
        for h, _ in self._out:
            self._inner.wait(h)
        stage = self._inner.ram_view(self._stage)
        for _, slot in self._out:
            if slot != self._stage:
                self._inner.ram_view(slot)[:] = stage
        self._out.clear()

    def landed(self, h):
        ok = self._inner.landed(h)
        if ok and any(o is h for o, _ in self._out):
            self._flush()
        return ok

    def wait(self, h):
        r = self._inner.wait(h)
        if any(o is h for o, _ in self._out):
            self._flush()
        return r

    def fence(self):
        self._inner.fence()
        self._flush()


class BrokenLacksCompute(_Wrap):
    """BROKEN: has no compute() - moetier.run.contract.check refuses it (ContractError): a failure, not a skip."""

    def __getattr__(self, name):
        if name == "compute":
            raise AttributeError(name)
        return getattr(self._inner, name)


class BrokenDeclaresNothing(_Wrap):
    """BROKEN: declares no lanes and no encodings - every check is NOT_SUPPORTED; the minimum bar rejects it."""

    def __init__(self, inner):
        super().__init__(inner)
        self.capabilities = replace(inner.capabilities, name="broken-declares-nothing", lanes=frozenset(),
                                    encodings=frozenset())


# -- the list ---------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Mutant:
    failure: str            # the --backend name's tail
    verb: str
    cls: type
    check: str              # the conformance check that must fail on it
    what: str               # what it breaks, in a few words (docs/conformance.md's table)
    bases: tuple = ("cpu", "sycl")
    enc: str = "int8"       # the encoding of the kit its check is run on (tests/test_conformance_meta.py)


_ROUTE, _NUM, _FILL = "test_route_top_k_of_the_store_router", "test_numerics_vs_reference", \
    "test_fill_lands_manifest_bytes"
MUTANTS = (
    Mutant("route-wrong-topk", "route", BrokenRouteWrongTopk, _ROUTE, "k-th pick is the (k+1)-th best"),
    Mutant("route-not-renormalised", "route", BrokenRouteNotRenormalised, _ROUTE, "weights not rescaled to sum 1"),
    Mutant("route-dropped-pick", "route", BrokenRouteDroppedPick, _ROUTE, "one row loses a pick"),
    Mutant("compute-scale", "compute", BrokenComputeScale, _NUM, "every output x1.001"),
    Mutant("compute-one-key-scale", "compute", BrokenComputeOneKeyScale, "test_exl3_expert_vs_float64",
           "one key's output x1.001 (exl3)", enc="exl3"),
    Mutant("compute-wrong-expert", "compute", BrokenComputeWrongExpert, _NUM, "one key computed from another slot"),
    Mutant("compute-row-off-by-one", "compute", BrokenComputeRowOffByOne, _NUM, "a job's last row read one row on"),
    Mutant("nondeterministic", "compute", BrokenNondeterministic, "test_deterministic_bit_identical",
           "1e-6 fresh noise per call"),
    Mutant("zerocopy-ulp", "compute", BrokenZerocopyUlp, "test_gpu_zerocopy_bit_identical",
           "zerocopy one ulp off gpu", ("sycl",)),
    Mutant("fill-wrong-slot", "fill", BrokenFillWrongSlot, _FILL, "lands in slot ^ 1"),
    Mutant("fill-short-read", "fill", BrokenFillShortRead, _FILL, "last 4 KiB unread, reported whole"),
    Mutant("bytes", "fill", BrokenBytes, _FILL, "one byte flipped after landing"),
    Mutant("push-wrong-slot", "push", BrokenPushWrongSlot, "test_push_lands_manifest_bytes", "lands in VRAM slot ^ 1",
           ("sycl",)),
    Mutant("push-landed-early", "push", BrokenPushLandedEarly, "test_landed_never_before_readable",
           "landed() before the copy ends", ("sycl",)),
    Mutant("drain-bytes-lost", "drain", BrokenDrainBytesLost, "test_drain_returns_pushed_bytes",
           "lands zeros", ("sycl",)),
    Mutant("drain-wrong-key", "drain", BrokenDrainWrongKey, "test_drain_returns_pushed_bytes",
           "copies the neighbouring VRAM slot", ("sycl",)),
    Mutant("drain-remembered", "drain", BrokenDrainRemembered, "test_tier_invariance_through_vram",
           "skips a drain it made into that slot before (no ram_view)", ("sycl",)),
    Mutant("landed-early", "landed", BrokenLandedEarly, "test_landed_never_before_readable",
           "True before the read starts"),
    Mutant("prefetch-landed-early", "landed", BrokenPrefetchLandedEarly, "test_landed_never_before_readable",
           "True before a prefetch read starts"),
    Mutant("landed-never", "landed", BrokenLandedNever, "test_fence_leaves_nothing_pending", "never True"),
    Mutant("failure-hidden", "landed", BrokenFailureHidden, "test_failed_fill_never_lands",
           "a failed read reported landed"),
    Mutant("out-of-order", "completed_seq", BrokenOutOfOrder, "test_seq_monotonic",
           "highest landed seq, not the watermark"),
    Mutant("seq-stuck", "completed_seq", BrokenSeqStuck, "test_seq_monotonic", "the watermark never moves"),
    Mutant("fence-early", "fence", BrokenFenceEarly, "test_fence_leaves_nothing_pending",
           "returns with transfers pending"),
    Mutant("fence-never", "fence", BrokenFenceNever, "test_fence_leaves_nothing_pending", "never returns"),
    Mutant("fence-never-in-a-run", "fence", BrokenFenceNever, "test_plan_parity_with_simulator",
           "a run's closing fence never returns"),
    Mutant("cancel-lies", "cancel", BrokenCancelLies, "test_cancel_withdraws_only_what_never_lands",
           "True for a read that still lands"),
    Mutant("wait-never", "wait", BrokenWaitNever, _FILL, "never returns (the kit's loading waits)"),
    Mutant("wait-never-in-a-run", "wait", BrokenWaitNever, "test_plan_parity_with_simulator",
           "a run's wait never returns"),
    Mutant("seq", "handles", BrokenSeq, "test_seq_monotonic", "seq runs backwards"),
    Mutant("handle-key", "handles", BrokenHandleKey, "test_seq_monotonic", "a handle carries another key"),
    Mutant("slot-reuse", "fill", BrokenSlotReuse, _FILL, "staging slot reused before it was copied out"),
)


def name_of(m: Mutant, base: str) -> str:
    return f"broken-{m.failure}" if base == "cpu" else f"broken-{base}-{m.failure}"


def _factory(cls, base):
    def make(store, *, ram_slots, vram_slots=0, **kw):
        from moetier.run.registry import get_backend
        return cls(get_backend(base, store, ram_slots=ram_slots, vram_slots=vram_slots, **kw))
    return make


BROKEN = {name_of(m, b): _factory(m.cls, b) for m in MUTANTS for b in m.bases}
BROKEN["broken-declares-nothing"] = _factory(BrokenDeclaresNothing, "cpu")


def _lacks_compute(store, **kw):
    from moetier.run.contract import check
    return check(_factory(BrokenLacksCompute, "cpu")(store, **kw), "broken-lacks-compute")


BROKEN["broken-lacks-compute"] = _lacks_compute
