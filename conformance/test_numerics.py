"""Numerics: every lane's expert output vs moetier.expert.reference (NMSE), bit-determinism, tier invariance."""
from __future__ import annotations

import numpy as np
import pytest

from conformance import capabilities as caps
from conformance.conftest import NK, nmse, xrows
from moetier.run.contract import LANES

NMSE_MAX = 5e-4
ROWS = range(1, 9)


def _lane(kit, lane):
    why = caps.lane_skip(kit.be, lane)
    if why:
        pytest.skip(why)


@pytest.mark.parametrize("enc", caps.ENCODINGS)
@pytest.mark.parametrize("lane", LANES)
def test_numerics_vs_reference(kits, lane, enc):
    """Each key, 1..8 rows, and a ragged batch: shape, dtype, finite, NMSE < 5e-4 vs the float64 reference."""
    kit = kits(enc)
    _lane(kit, lane)
    x = xrows(8)
    for m in ROWS:
        out = kit.be.compute(lane, [(k, kit.slot_for(lane, k), list(range(m))) for k in range(NK)], x)
        assert sorted(out) == list(range(NK)), f"compute returned keys {sorted(out)}"
        for k in range(NK):
            y = out[k]
            assert y.dtype == np.float32 and y.shape == (m, x.shape[1]), (k, m, y.dtype, y.shape)
            assert np.isfinite(y).all(), f"key {k} rows {m}: non-finite output"
            e = nmse(y, kit.ref(k, x)[:m])
            assert e < NMSE_MAX, f"key {k} rows {m}: NMSE {e:.3g} >= {NMSE_MAX}"
    # ragged: key k reads rows (k % 8) + 1 rows picked out of order
    jobs = [(k, kit.slot_for(lane, k), [(k + 3 * i) % 8 for i in range(k % 8 + 1)]) for k in range(NK)]
    out = kit.be.compute(lane, jobs, x)
    for k, _, rows in jobs:
        e = nmse(out[k], kit.ref(k, x)[rows])
        assert e < NMSE_MAX, f"ragged key {k} rows {rows}: NMSE {e:.3g}"


@pytest.mark.parametrize("enc", caps.ENCODINGS)
@pytest.mark.parametrize("lane", LANES)
def test_deterministic_bit_identical(kits, lane, enc):
    """Same bytes + same rows -> same bits: repeated calls, and one expert alone vs inside a batch."""
    kit = kits(enc)
    _lane(kit, lane)
    x = xrows(6, seed=1)
    jobs = [(k, kit.slot_for(lane, k), list(range(k % 6 + 1))) for k in range(NK)]
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
    be, x = kit.be, xrows(4, seed=2)
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
    be, x = kit.be, xrows(4, seed=3)
    base = be.compute(lane, [(k, k, ROWS4) for k in KEYS], x)
    for i, k in enumerate(KEYS):
        if caps.ram_reader(be):
            be.ram_view(NK + 4 + i)[:] = 0
        be.wait(be.drain(k, k, NK + 4 + i))
    if lane == "gpu":
        for i, k in enumerate(KEYS):
            be.wait(be.push(k, NK + 4 + i, NK + 2 + i))
        out = be.compute(lane, [(k, NK + 2 + i, ROWS4) for i, k in enumerate(KEYS)], x)
        _same(base, out, KEYS, lane, "drained then pushed into another VRAM slot")
    else:
        out = be.compute(lane, [(k, NK + 4 + i, ROWS4) for i, k in enumerate(KEYS)], x)
        _same(base, out, KEYS, lane, "drained from VRAM into another RAM slot")
