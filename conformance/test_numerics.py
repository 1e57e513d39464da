"""Numerics: every lane's expert output vs moetier.bytes.expert.reference at its encoding's bound (conformance.bounds),
bit-determinism, gpu == zerocopy, tier invariance."""
from __future__ import annotations

import numpy as np
import pytest

from conformance import bounds
from conformance import capabilities as caps
from conformance import report
from conformance.conftest import NK
from moetier.run.contract import LANES

ROWS = range(1, 9)


def _lane(kit, lane):
    why = caps.lane_skip(kit.be, lane)
    if why:
        pytest.skip(why)


def judge(tally: bounds.Tally, lane: str) -> None:
    """Record the (lane, encoding)'s measured error beside its bounds in the report, then fail on any bound."""
    report.STATE.setdefault("numerics", {})[f"{lane}-{tally.enc}"] = tally.figures()
    bad = tally.failures()
    assert not bad, f"lane {lane} {tally.enc}: " + "; ".join(bad)


@pytest.mark.parametrize("enc", caps.ENCODINGS)
@pytest.mark.parametrize("lane", LANES)
def test_numerics_vs_reference(kits, lane, enc):
    """Each key, 1..8 rows, and a ragged batch: shape, dtype, finite; worst NMSE and best uniform scale vs the
    float64 reference within the encoding's bounds (conformance.bounds)."""
    kit = kits(enc)
    _lane(kit, lane)
    x = kit.xrows(8)
    tally = bounds.Tally(enc)
    for m in ROWS:
        out = kit.be.compute(lane, [(k, k, list(range(m))) for k in range(NK)], x)
        assert sorted(out) == list(range(NK)), f"compute returned keys {sorted(out)}"
        for k in range(NK):
            y = out[k]
            assert y.dtype == np.float32 and y.shape == (m, x.shape[1]), (k, m, y.dtype, y.shape)
            assert np.isfinite(y).all(), f"key {k} rows {m}: non-finite output"
            tally.add(y, kit.ref(k, x)[:m], f"key {k} rows {m}")
    # ragged: key k reads rows (k % 8) + 1 rows picked out of order
    jobs = [(k, k, [(k + 3 * i) % 8 for i in range(k % 8 + 1)]) for k in range(NK)]
    out = kit.be.compute(lane, jobs, x)
    for k, _, rows in jobs:
        assert out[k].shape == (len(rows), x.shape[1]), (k, rows, out[k].shape)
        tally.add(out[k], kit.ref(k, x)[rows], f"ragged key {k} rows {rows}")
    judge(tally, lane)


@pytest.mark.parametrize("enc", caps.ENCODINGS + ("exl3",))
def test_gpu_zerocopy_bit_identical(kits, enc):
    """The gpu and zerocopy lanes run one kernel over VRAM and over RAM: the same bytes give the same bits."""
    kit = kits(enc)
    for lane in ("gpu", "zerocopy"):
        _lane(kit, lane)
    x = kit.xrows(5, seed=7)
    jobs = [(k, k, list(range(k % 5 + 1))) for k in range(NK)]
    g, z = kit.be.compute("gpu", jobs, x), kit.be.compute("zerocopy", jobs, x)
    differ = [k for k in range(NK) if g[k].tobytes() != z[k].tobytes()]
    assert not differ, f"{enc}: keys {differ} differ between the gpu and zerocopy lanes"


@pytest.mark.parametrize("enc", caps.ENCODINGS)
@pytest.mark.parametrize("lane", LANES)
def test_deterministic_bit_identical(kits, lane, enc):
    """Same bytes + same rows -> same bits: repeated calls, and one expert alone vs inside a batch."""
    kit = kits(enc)
    _lane(kit, lane)
    x = kit.xrows(6, seed=1)
    jobs = [(k, k, list(range(k % 6 + 1))) for k in range(NK)]
    a = kit.be.compute(lane, jobs, x)
    for rep in range(2):
        b = kit.be.compute(lane, jobs, x)
        for k in range(NK):
            assert a[k].tobytes() == b[k].tobytes(), f"key {k}: run {rep + 2} differs from run 1"
    for k in (0, NK // 2 + 1, NK - 1):
        solo = kit.be.compute(lane, [jobs[k]], x)
        assert solo[k].tobytes() == a[k].tobytes(), f"key {k}: alone differs from inside the batch"


def _same(base, out, keys, lane, path):
    for k in keys:
        assert out[k].tobytes() == base[k].tobytes(), f"lane {lane} key {k}: {path} differs from the canonical slot"


KEYS = (1, NK - 2)
ROWS4 = [0, 1, 2, 3]


@pytest.mark.parametrize("enc", caps.ENCODINGS)
@pytest.mark.parametrize("lane", LANES)
def test_tier_invariance(kits, lane, enc):
    """Same lane, same bits whichever slot the bytes landed in: a fresh NVMe fill into another RAM slot (RAM
    lanes), a push into another VRAM slot (gpu lane)."""
    kit = kits(enc)
    _lane(kit, lane)
    be, x = kit.be, kit.xrows(4, seed=2)
    base = be.compute(lane, [(k, k, ROWS4) for k in KEYS], x)
    if lane == "gpu":
        for i, k in enumerate(KEYS):
            be.wait(be.push(k, k, NK + i))
        _same(base, be.compute(lane, [(k, NK + i, ROWS4) for i, k in enumerate(KEYS)], x), KEYS, lane,
              "pushed into another VRAM slot")
    else:
        for i, k in enumerate(KEYS):
            be.wait(be.fill(k, NK + i))
        _same(base, be.compute(lane, [(k, NK + i, ROWS4) for i, k in enumerate(KEYS)], x), KEYS, lane,
              "NVMe fill into another RAM slot")


@pytest.mark.parametrize("enc", caps.ENCODINGS)
@pytest.mark.parametrize("lane", LANES)
def test_tier_invariance_through_vram(kits, lane, enc):
    """Bytes that went RAM -> VRAM -> RAM (drain) compute the same bits on a RAM lane; on the gpu lane, a push of
    those drained bytes into another VRAM slot does too."""
    kit = kits(enc)
    _lane(kit, lane)
    why = caps.vram_skip(kit.be, NK + 4)
    if why:
        pytest.skip(why)
    be, x = kit.be, kit.xrows(4, seed=3)
    base = be.compute(lane, [(k, k, ROWS4) for k in KEYS], x)
    for i, k in enumerate(KEYS):
        kit.poison(NK + 4 + i, k)       # a drain that never happened must not find the key's bytes there
        be.wait(be.drain(k, k, NK + 4 + i))
    if lane == "gpu":
        for i, k in enumerate(KEYS):
            be.wait(be.push(k, NK + 4 + i, NK + 2 + i))
        out = be.compute(lane, [(k, NK + 2 + i, ROWS4) for i, k in enumerate(KEYS)], x)
        _same(base, out, KEYS, lane, "drained then pushed into another VRAM slot")
    else:
        out = be.compute(lane, [(k, NK + 4 + i, ROWS4) for i, k in enumerate(KEYS)], x)
        _same(base, out, KEYS, lane, "drained from VRAM into another RAM slot")
