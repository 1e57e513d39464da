"""Transfers: fill/push land exactly the manifest bytes, drain returns what was pushed, landed() is never early,
fence() leaves nothing pending, a failed fill never lands, cancel() withdraws only reads that never land, seq is
monotonic."""
from __future__ import annotations

import time

import numpy as np
import pytest

from conformance import capabilities as caps
from conformance.conftest import (NK, RAM_SCRATCH, VRAM_SCRATCH, close_within, fence_within, first_kit,
                                  poll_landed)
from moetier.bytes import store as _store
from moetier.bytes.transport import TransportError
from moetier.run.contract import BackendUnavailable

SEQ_DEADLINE_S = 10.0
ENC = caps.ENCODINGS + ("exl3",)        # byte moves: every encoding a backend declares, the engines' exl3 too


def _need(why):
    if why:
        pytest.skip(why)


def _ram_bytes(kit, slot):
    return np.asarray(caps.ram_reader(kit.be)(slot))[:kit.rb]


def _digest_ok(kit, k, buf) -> bool:
    """The manifest checksum (moetier.store.digest, whatever hash the store format uses) of the landed bytes."""
    return _store.digest(np.ascontiguousarray(buf).tobytes()) == kit.store.digest(k)


def _need_ram_readback(kit):
    if caps.ram_reader(kit.be) is None:
        pytest.skip(f"NOT_SUPPORTED: backend {kit.be.capabilities.name} offers no ram_view(slot) test hook")


def _zeroed_scratch(kit, mul: int, add: int):
    """(kit, its RAM scratch slots zeroed, a key for each: (mul * i + add) mod NK); skips where RAM cannot be read
    back."""
    _need_ram_readback(kit)
    slots = [NK + i for i in range(RAM_SCRATCH)]
    for s in slots:
        kit.be.ram_view(s)[:] = 0
    return kit, slots, [(mul * i + add) % NK for i in range(len(slots))]


@pytest.mark.parametrize("enc", ENC)
def test_fill_lands_manifest_bytes(kits, enc):
    """NVMe -> RAM fills into zeroed slots: exactly the record bytes, matching the manifest checksum."""
    kit, slots, keys = _zeroed_scratch(kits(enc), 3, 1)
    be = kit.be
    hs = [be.fill(k, s) for k, s in zip(keys, slots)]
    for h in hs:
        be.wait(h)
    for k, s in zip(keys, slots):
        got = _ram_bytes(kit, s)
        assert np.array_equal(got, kit.rec(k)), f"fill key {k} -> slot {s}: bytes differ from the store"
        assert _digest_ok(kit, k, got), f"fill key {k} -> slot {s}: checksum differs from the manifest"


@pytest.mark.parametrize("enc", ENC)
def test_push_lands_manifest_bytes(kits, enc):
    """RAM -> VRAM pushes land the record bytes: read back through the VRAM hook when offered, through a drain into
    a zeroed RAM slot when RAM can be read back, and on the gpu lane by computing the key's canonical bits from the
    slot pushed to; a backend that offers none of the three skips, as nothing could be judged."""
    kit = kits(enc)
    _need(caps.vram_skip(kit.be, NK + 1))
    be = kit.be
    rd, ram, gpu = caps.vram_reader(be), caps.ram_reader(be), caps.lane_skip(be, "gpu") is None
    if rd is None and ram is None and not gpu:
        pytest.skip(f"NOT_SUPPORTED: backend {be.capabilities.name} offers no read_vram(slot) or ram_view(slot) "
                    "test hook and no gpu lane: pushed bytes cannot be read back")
    keys = [2, 5, 11, NK - 1][:VRAM_SCRATCH]
    for i, k in enumerate(keys):
        be.wait(be.push(k, k, NK + i))
    x = kit.xrows(2, seed=8)
    for i, k in enumerate(keys):
        if rd is not None:
            got = np.asarray(rd(NK + i))[:kit.rb]
            assert np.array_equal(got, kit.rec(k)), f"push key {k} -> VRAM slot {NK + i}: bytes differ"
        if gpu:
            want, got = (be.compute("gpu", [(k, s, [0, 1])], x)[k] for s in (k, NK + i))
            assert got.tobytes() == want.tobytes(), \
                f"push key {k} -> VRAM slot {NK + i}: the gpu lane computes other bits there than from VRAM slot {k}"
        if ram is not None:
            ram(NK + i)[:] = 0
            be.wait(be.drain(k, NK + i, NK + i))
            got = _ram_bytes(kit, NK + i)
            assert _digest_ok(kit, k, got), f"push key {k} -> VRAM slot {NK + i}: drained bytes fail the checksum"


@pytest.mark.parametrize("enc", ENC)
def test_drain_returns_pushed_bytes(kits, enc):
    """drain(VRAM slot -> zeroed RAM slot) returns exactly the bytes that were pushed there (that the drained copy
    computes the VRAM copy's bits is test_tier_invariance_through_vram)."""
    kit = kits(enc)
    _need(caps.vram_skip(kit.be, NK + 1))
    _need_ram_readback(kit)
    be = kit.be
    for i, k in enumerate((4, 9)):
        s = NK + 8 + i
        be.ram_view(s)[:] = 0
        h = be.drain(k, k, s)
        be.wait(h)
        assert be.landed(h)
        assert np.array_equal(_ram_bytes(kit, s), kit.rec(k)), f"drain key {k}: bytes differ from what was pushed"


@pytest.mark.parametrize("enc", ENC)
def test_landed_never_before_readable(kits, enc):
    """The first time landed(h) is True the destination already holds the bytes: fills into zeroed RAM slots, every
    other one a prefetch read (checked byte for byte) and, with a VRAM tier, pushes over another key's bytes
    (checked by computing on the gpu lane the moment landed() says so)."""
    kit, slots, keys = _zeroed_scratch(kits(enc), 5, 2)
    be = kit.be
    where = {}

    def check_fill(h):
        k, s = where[id(h)]
        assert np.array_equal(_ram_bytes(kit, s), kit.rec(k)), \
            f"landed() was True for fill key {k} -> slot {s} before its bytes were readable"

    hs = []
    for i, (k, s) in enumerate(zip(keys, slots)):
        h = be.fill(k, s, prefetch=bool(i % 2))
        where[id(h)] = (k, s)
        hs.append(h)
    poll_landed(be, hs, check_fill)
    if kit.vram >= NK + 2 and caps.lane_skip(be, "gpu") is None:
        x = kit.xrows(2, seed=4)
        pairs = [(3, NK), (12, NK + 1)]
        want = be.compute("gpu", [(k, k, [0, 1]) for k, _ in pairs], x)
        for k, vs in pairs:                              # put another key's bytes there first
            be.wait(be.push((k + 1) % NK, (k + 1) % NK, vs))

        def check_push(h):
            k, vs = where[id(h)]
            got = be.compute("gpu", [(k, vs, [0, 1])], x)[k]
            assert got.tobytes() == want[k].tobytes(), \
                f"landed() was True for push key {k} -> VRAM slot {vs} before its bytes were readable"

        hs = []
        for k, vs in pairs:
            h = be.push(k, k, vs)
            where[id(h)] = (k, vs)
            hs.append(h)
        poll_landed(be, hs, check_push)


@pytest.mark.parametrize("enc", ENC)
def test_fence_leaves_nothing_pending(kits, enc):
    """After fence() every handle issued before it reports landed and completed_seq() covers the last seq."""
    kit = kits(enc)
    be = kit.be
    hs = [be.fill((7 * i) % NK, NK + i) for i in range(RAM_SCRATCH)]
    if kit.vram >= NK + VRAM_SCRATCH:
        hs += [be.push(i, i, NK + i) for i in range(VRAM_SCRATCH)]
    fence_within(be)
    late = [h for h in hs if not be.landed(h)]
    assert not late, f"{len(late)} handles not landed after fence(): {late[:3]}"
    top = max(h.seq for h in hs)
    assert be.completed_seq() >= top, f"completed_seq() {be.completed_seq()} < last seq {top} after fence()"
    if hasattr(be, "outstanding"):
        assert be.outstanding == 0, f"outstanding {be.outstanding} after fence()"


FAULTS = {"eio": 1, "short": 6, "flip": 11}     # fault kind -> the key whose read the fault seam damages


def test_failed_fill_never_lands(kits, backend_name):
    """A fill the fault seam damages (moetier.bytes.faults.FaultPlan through the ``faults`` option, every read
    verified: EIO, a short read, a flipped byte) is a failed transfer: landed() and wait() raise TransportError,
    never report it landed (the host would compute from bytes that are not the key's). Skips when the backend's
    factory takes no ``faults`` option."""
    from moetier.bytes.faults import FaultPlan
    kit = first_kit(kits)
    plan = FaultPlan(**{kind: (k,) for kind, k in FAULTS.items()})
    try:
        be = caps.open_backend(backend_name, kit.store, ram_slots=len(FAULTS), faults=plan, verify_rate=1.0)
    except BackendUnavailable as e:
        pytest.skip(f"NOT_SUPPORTED: {e}")
    try:
        hs = {kind: be.fill(k, i) for i, (kind, k) in enumerate(FAULTS.items())}
        for kind, h in hs.items():
            with pytest.raises(TransportError):
                be.wait(h)
            with pytest.raises(TransportError):
                landed = be.landed(h)
                pytest.fail(f"landed() answered {landed} for a fill of key {FAULTS[kind]} that failed ({kind})")
    finally:
        close_within(be)


PREFETCH = 4            # queued prefetch reads the cancel check withdraws (a Reader starts one at a time)


def test_cancel_withdraws_only_what_never_lands(kits):
    """cancel(h) of queued prefetch reads into zeroed slots, newest first: a read it says it withdrew (True) is
    cancelled - landed() never True, the slot still zeros after fence() - for the host hands that slot to another
    key at once; one it kept (False) lands its bytes as usual. Skips when it withdrew none (the contract's default
    cancel returns False)."""
    kit, slots, keys = _zeroed_scratch(first_kit(kits), 7, 3)
    be = kit.be
    hs = [be.fill(k, s, prefetch=True) for k, s in zip(keys[:PREFETCH], slots)]
    withdrawn = {id(h) for h in reversed(hs) if be.cancel(h)}
    fence_within(be)
    for h, k, s in zip(hs, keys, slots):
        if id(h) in withdrawn:
            try:
                landed = be.landed(h)
            except TransportError:
                landed = False
            assert not landed and h.state == "cancelled", \
                f"cancel() withdrew the read of key {k} -> slot {s}, yet it is {h.state} (landed() {landed})"
            assert not _ram_bytes(kit, s).any(), f"cancel() withdrew the read of key {k}, yet slot {s} was written"
        else:
            assert be.landed(h) and np.array_equal(_ram_bytes(kit, s), kit.rec(k)), \
                f"the read of key {k} -> slot {s} that cancel() kept did not land its bytes"
    if not withdrawn:
        pytest.skip(f"NOT_SUPPORTED: backend {be.capabilities.name}'s cancel() withdrew none of {PREFETCH} queued "
                    "prefetch reads")


@pytest.mark.parametrize("enc", ENC)
def test_seq_monotonic(kits, enc):
    """Handles carry strictly increasing seq across kinds in issue order, and the key each was issued for;
    completed_seq() never goes back and every handle at or below it has landed."""
    kit = kits(enc)
    be = kit.be
    hs, keys = [], []
    for i in range(8):
        hs.append(be.fill((i * 3) % NK, NK + i))
        keys.append((i * 3) % NK)
        if kit.vram >= NK + VRAM_SCRATCH and i < VRAM_SCRATCH:
            hs.append(be.push(i, i, NK + i))
            keys.append(i)
    if kit.vram >= NK + VRAM_SCRATCH:
        hs.append(be.drain(0, NK, NK + 9))
        keys.append(0)
    seqs = [h.seq for h in hs]
    assert all(b > a for a, b in zip(seqs, seqs[1:])), f"seq not strictly increasing in issue order: {seqs}"
    assert [h.key for h in hs] == keys, f"handle keys {[h.key for h in hs]}, issued for {keys}"
    last = -1
    t_end = time.monotonic() + SEQ_DEADLINE_S
    while True:
        c = be.completed_seq()
        assert c >= last, f"completed_seq() went back: {last} -> {c}"
        last = c
        below = [h for h in hs if h.seq <= c]
        late = [h.seq for h in below if not be.landed(h)]
        assert not late, f"seq {late[:4]} <= completed_seq() {c} but not landed"
        if c >= seqs[-1]:
            break
        # 17 small transfers take milliseconds; not covered by then is a watermark that stopped moving
        assert time.monotonic() < t_end, \
            f"completed_seq() {c} still short of the last seq {seqs[-1]} after {SEQ_DEADLINE_S} s of polling"
        time.sleep(0.001)
    fence_within(be)
    assert be.completed_seq() >= max(last, seqs[-1])


# --------------------------------------------------------------------------------------------------------------------
# random interleavings (hypothesis): fills, pushes, drains, polls and computes in any order a host may issue them

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as hst  # noqa: E402

_NR, _NV = 6, 4                                        # scratch slots used: RAM NK..NK+5, VRAM NK..NK+3
_OPS = hst.lists(hst.one_of(
    hst.tuples(hst.just("fill"), hst.integers(0, NK - 1), hst.integers(0, _NR - 1)),
    hst.tuples(hst.just("push"), hst.integers(0, _NR - 1), hst.integers(0, _NV - 1)),
    hst.tuples(hst.just("drain"), hst.integers(0, _NV - 1), hst.integers(0, _NR - 1)),
    hst.tuples(hst.just("poll"), hst.integers(0, 7), hst.just(0)),
    hst.tuples(hst.just("compute"), hst.integers(0, _NR + _NV - 1), hst.just(0)),
), min_size=4, max_size=40)


def _copy_op(be, op: str, a: int, b: int, holds: dict, busy: dict, gpu: bool):
    """The copy an interleaving's fill / push / drain issues where its slots are free and its source holds landed
    bytes: (handle, destination, key, the slots it touches), or None."""
    if op == "fill":
        dst = ("r", NK + b)
        return None if dst in busy else (be.fill(a, NK + b), dst, a, [dst])
    if not gpu:
        return None
    src, dst = (("r", NK + a), ("v", NK + b)) if op == "push" else (("v", NK + a), ("r", NK + b))
    if src not in holds or src in busy or dst in busy:
        return None
    move = be.push if op == "push" else be.drain
    return move(holds[src], NK + a, NK + b), dst, holds[src], [src, dst]


@settings(max_examples=12, deadline=None, database=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(ops=_OPS)
def test_landed_truthful_under_random_interleaving(kits, ops):
    """A host that only trusts landed(): whatever the interleaving, the moment landed(h) says True the destination
    computes the key's canonical bits (and holds its bytes); fence() then lands everything."""
    kit = first_kit(kits)
    be = kit.be
    ram_lane = next((ln for ln in ("cpu", "zerocopy") if caps.lane_skip(be, ln) is None), None)
    gpu = kit.vram >= NK + _NV and caps.lane_skip(be, "gpu") is None
    x = kit.xrows(2, seed=9)
    want = {}

    def expect(lane, k):
        if (lane, k) not in want:
            want[(lane, k)] = be.compute(lane, [(k, k, [0, 1])], x)[k].tobytes()
        return want[(lane, k)]

    holds = {}                                           # ("r"|"v", slot) -> key whose bytes landed there
    busy: dict = {}                                      # ("r"|"v", slot) -> outstanding handle touching it
    out = []                                             # [(handle, dst, key, touched)]

    def verify(dst, k):
        arena, s = dst
        if arena == "r":
            if caps.ram_reader(be) is not None:
                assert np.array_equal(_ram_bytes(kit, s), kit.rec(k)), f"RAM slot {s}: not key {k}'s bytes"
            if ram_lane:
                assert be.compute(ram_lane, [(k, s, [0, 1])], x)[k].tobytes() == expect(ram_lane, k)
        elif gpu:
            assert be.compute("gpu", [(k, s, [0, 1])], x)[k].tobytes() == expect("gpu", k), \
                f"VRAM slot {s}: not key {k}'s bits although landed() said so"

    def issue(h, dst, k, touched):
        out.append((h, dst, k, touched))
        for t in touched:
            busy[t] = h
        holds.pop(dst, None)

    for op, a, b in ops:
        if op in ("fill", "push", "drain"):
            copy = _copy_op(be, op, a, b, holds, busy, gpu)
            if copy is not None:
                issue(*copy)
        elif op == "poll" and out:
            h, dst, k, touched = out[a % len(out)]
            if be.landed(h):
                verify(dst, k)
                holds[dst] = k
                for t in touched:
                    busy.pop(t, None)
                out.remove((h, dst, k, touched))
        elif op == "compute":
            slot = ("r", NK + a) if a < _NR else ("v", NK + a - _NR)
            if slot in holds and slot not in busy:
                verify(slot, holds[slot])
    fence_within(be)
    for h, dst, k, _ in out:
        assert be.landed(h), f"{h!r} not landed after fence()"
        verify(dst, k)
