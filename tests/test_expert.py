"""moetier.expert: record layout, synthetic experts, dequantization and the float64 reference math."""

import json

import numpy as np
import pytest

from moetier.bytes import expert as E

GEOMS = [(64, 32), (96, 64), (1024, 512)]


@pytest.mark.parametrize("enc", E.ENCODINGS)
@pytest.mark.parametrize("H,F", GEOMS)
def test_layout_alignment(enc, H, F):
    lay = E.layout(H, F, enc)
    assert list(lay.sections) == list(E.SECTION_ORDER)
    end = 0
    for name, (off, nb, dt, shape) in lay.sections.items():
        assert off % 64 == 0, name
        assert off >= end, name  # in order, no overlap
        assert nb == int(np.prod(shape)) * np.dtype(dt).itemsize
        end = off + nb
    assert lay.record_bytes % 4096 == 0 and lay.record_bytes >= end
    assert lay.weight_bytes == sum(nb for _, nb, _, _ in lay.sections.values())
    q = 1 if enc == "int8" else 0.5
    assert lay.sections["gate_q"][1] == F * H * q and lay.sections["down_q"][1] == H * F * q


def test_layout_rejects_bad_geometry():
    with pytest.raises(ValueError, match="hidden"):
        E.layout(100, 64, "int8")
    with pytest.raises(ValueError, match="ffn"):
        E.layout(64, 0, "int8")
    with pytest.raises(ValueError, match="encoding"):
        E.layout(64, 64, "fp8")


@pytest.mark.parametrize("enc", E.ENCODINGS)
def test_json_round_trip(enc):
    lay = E.layout(256, 128, enc)
    d = json.loads(json.dumps(lay.to_json()))
    assert E.ExpertLayout.from_json(d) == lay


@pytest.mark.parametrize("field,value,match", [
    ("hidden", 100, "hidden"), ("ffn", "x", "ffn"), ("encoding", "q4", "encoding"),
    ("record_bytes", 4096, "record_bytes"), ("weight_bytes", 1, "weight_bytes"), ("format", "other/1", "format"),
])
def test_from_json_names_bad_field(field, value, match):
    d = E.layout(256, 128, "int8").to_json()
    d[field] = value
    with pytest.raises(ValueError, match=match):
        E.ExpertLayout.from_json(d)


def test_from_json_bad_section_and_missing():
    d = E.layout(256, 128, "int4g32").to_json()
    d["sections"]["up_s"]["offset"] += 64
    with pytest.raises(ValueError, match=r"sections\.up_s\.offset"):
        E.ExpertLayout.from_json(d)
    d = E.layout(256, 128, "int4g32").to_json()
    del d["ffn"]
    with pytest.raises(ValueError, match="ffn"):
        E.ExpertLayout.from_json(d)


@pytest.mark.parametrize("enc", E.ENCODINGS)
def test_make_expert_deterministic(enc):
    lay = E.layout(128, 64, enc)
    a = E.make_expert(lay, 3, 11)
    assert isinstance(a, bytes) and len(a) == lay.record_bytes
    assert a == E.make_expert(lay, 3, 11)
    assert a != E.make_expert(lay, 4, 11) and a != E.make_expert(lay, 3, 12)
    # padding (between sections and after the last one) is zero
    mask = np.ones(lay.record_bytes, bool)
    for off, nb, _, _ in lay.sections.values():
        mask[off:off + nb] = False
    assert not np.frombuffer(a, np.uint8)[mask].any()


@pytest.mark.parametrize("enc", E.ENCODINGS)
def test_views_zero_copy_any_buffer(enc):
    lay = E.layout(64, 32, enc)
    rec = E.make_expert(lay, 1, 2)
    arr = np.frombuffer(rec, np.uint8).copy()
    v = E.views(lay, arr)
    assert np.shares_memory(v["down_s"], arr)
    for buf in (rec, bytearray(rec), memoryview(rec)):
        w = E.views(lay, buf)
        for k in v:
            assert np.array_equal(v[k], w[k]) and w[k].shape == lay.sections[k][3]
    with pytest.raises(ValueError, match="bytes"):
        E.views(lay, rec[:100])


@pytest.mark.parametrize("enc", E.ENCODINGS)
def test_dequant_error_bound(enc):
    lay = E.layout(256, 128, enc)
    w = E.make_weights(lay, 5, 9)
    d = E.dequant(lay, E.make_expert(lay, 5, 9))
    for name in ("gate", "up", "down"):
        err = np.abs(d[name] - w[name])
        if enc == "int8":  # half a quantization step of the row
            bound = np.abs(w[name]).max(axis=1, keepdims=True) / 127 / 2
        else:
            r, c = w[name].shape
            g = np.abs(w[name].reshape(r, c // 32, 32)).max(axis=2) / 7 / 2
            bound = np.repeat(g, 32, axis=1)
        assert np.all(err <= bound * (1 + 1e-5) + 1e-12), name
        nmse = ((d[name] - w[name]) ** 2).sum() / (w[name] ** 2).sum()
        assert nmse < (1e-4 if enc == "int8" else 2e-2)


def test_int4_nibble_order():
    lay = E.layout(32, 32, "int4g32")
    z = np.zeros((32, 32))
    g = z.copy()
    g[0, 0] = 7.0   # even column -> low nibble
    g[0, 1] = -7.0  # odd column -> high nibble
    g[0, 2:] = 0.5
    v = E.views(lay, E.pack_expert(lay, g, z, z))
    assert v["gate_s"][0, 0] == np.float32(1.0)
    assert v["gate_q"][0, 0] == (7 + 8) | ((-7 + 8) << 4)
    assert E.dequant(lay, E.pack_expert(lay, g, z, z))["gate"][0, :2].tolist() == [7.0, -7.0]


def test_reference_hand_checkable():
    # int8 with exact weights: every weight is q * s with q = +-127 or 0, s = 1/127 -> w in {1, -1, 0}.
    H, F = 32, 32
    lay = E.layout(H, F, "int8")
    gate = np.zeros((F, H)); up = np.zeros((F, H)); down = np.zeros((H, F))
    gate[0, 0] = 1.0; up[0, 1] = 1.0; down[2, 0] = -1.0
    buf = E.pack_expert(lay, gate, up, down)
    x = np.zeros((1, H)); x[0, 0] = 2.0; x[0, 1] = 3.0
    y = E.reference(lay, buf, x)
    silu2 = 2.0 / (1.0 + np.exp(-2.0))
    expect = np.zeros((1, H)); expect[0, 2] = -silu2 * 3.0
    np.testing.assert_allclose(y, expect, rtol=1e-6, atol=1e-12)


def test_reference_matches_dense_math():
    lay = E.layout(64, 96, "int4g32")
    buf = E.make_expert(lay, 0, 0)
    d = E.dequant(lay, buf)
    x = np.random.default_rng(0).standard_normal((3, 64))
    y = E.reference(lay, buf, x)
    for i in range(3):
        g = d["gate"] @ x[i]; u = d["up"] @ x[i]
        np.testing.assert_allclose(y[i], d["down"] @ (g / (1 + np.exp(-g)) * u), rtol=1e-10)
    assert 0.1 < np.abs(y).mean() / np.abs(x).mean() < 10  # output magnitude ~ input magnitude


def test_moe_reference_weighting():
    lay = E.layout(64, 32, "int8")
    experts = {k: (lay, E.make_expert(lay, k, 1)) for k in (0, 1, 2)}
    x = np.random.default_rng(1).standard_normal((3, 64))
    picks = [[(0, 0.25), (2, 0.75)], [(1, 1.0)], []]
    y = E.moe_reference(experts, picks, x)
    r = {k: E.reference(lay, b, x) for k, (lay, b) in experts.items()}
    np.testing.assert_allclose(y[0], 0.25 * r[0][0] + 0.75 * r[2][0], rtol=1e-12)
    np.testing.assert_allclose(y[1], r[1][1], rtol=1e-12)
    assert not y[2].any()
    with pytest.raises(ValueError, match="picks"):
        E.moe_reference(experts, picks[:2], x)
    with pytest.raises(ValueError, match="key"):
        E.moe_reference(experts, [[(9, 1.0)], [], []], x)
