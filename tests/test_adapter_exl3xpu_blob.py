"""exl3xpu's expert blob (adapters.exl3xpu.blob): PLANAR4 word order as section 4.3 states it, the packer's exact
round trip from moetier's exl3 records, and the blob as the one layout the adapter's slots and ops hold."""
from __future__ import annotations

import numpy as np
import pytest

from adapters.exl3xpu import blob, surface
from moetier.bytes import exl3


def rand_expert(H, I, K, seed=0):  # noqa: E741
    return exl3.random_expert(np.random.default_rng(seed), H, I, K)


@pytest.mark.parametrize("K", surface.PLANAR4_K)
def test_planar4_is_plane_major_within_groups_of_four_tiles(K):
    rng = np.random.default_rng(K)
    words = rng.integers(0, 2 ** 32, size=(2, 8, 8 * K), dtype=np.uint64).astype(np.uint32)
    got = blob.planar4(words, K)
    for r in range(2):
        for grp in range(2):
            flat = got[r, 4 * grp:4 * grp + 4].reshape(-1)       # the group's 4 * 8K words, as stored
            for i in range(K):
                for t in range(4):
                    for g in range(8):                          # [plane i][tile t][period g] <- tile t's word g*K+i
                        assert flat[i * 32 + t * 8 + g] == words[r, 4 * grp + t, g * K + i]
    assert not np.array_equal(got, words) and np.array_equal(blob.unplanar4(got, K), words)


@pytest.mark.parametrize("K", surface.PLANAR4_K)
def test_pack_unpack_round_trip_and_section_order(K):
    H, I = 256, 128  # noqa: E741
    ex = rand_expert(H, I, K, seed=K)
    b = blob.pack(ex)
    assert b.dtype == np.uint8 and b.size == surface.blob_bytes(H, I, K)
    back = blob.unpack(b, H, I, K)
    for p in ("gate", "up", "down"):
        for part in ("trellis", "suh", "svh"):
            a, c = getattr(getattr(ex, p), part), getattr(getattr(back, p), part)
            assert a.dtype == c.dtype and np.array_equal(a, c), (p, part)
    gu_n = (H // 16) * (2 * I // 16) * 8 * K * 4
    row0 = b[:(2 * I // 16) * 8 * K * 4].view("<u4").reshape(1, 2 * I // 16, 8 * K)   # k-row 0: gate, then up tiles
    tiles = np.concatenate([ex.gate.trellis[:1], ex.up.trellis[:1]], axis=1).astype("<i2").view("<u4")
    assert np.array_equal(blob.unplanar4(row0, K), tiles)
    tail = b[b.size - 2 * (3 * H + 3 * I):].view("<f2")
    want = np.concatenate([ex.gate.suh, ex.up.suh, ex.gate.svh, ex.up.svh, ex.down.suh, ex.down.svh])
    assert np.array_equal(tail.view(np.uint16), want.astype(np.float16).view(np.uint16)) and gu_n < b.size


def test_the_qwen_geometry_gives_the_published_blob():
    b = blob.pack(rand_expert(surface.QWEN["H"], surface.QWEN["I"], surface.QWEN["K"]))
    assert b.size == surface.QWEN["blob"] == 1_862_400


def test_geometries_planar4_does_not_cover_are_refused():
    with pytest.raises(blob.BlobError, match=r"K=4; PLANAR4 is defined for K in \(3, 5, 7\)"):
        blob.pack(rand_expert(128, 128, 4))
    with pytest.raises(blob.BlobError, match=r"H=128, I=192; expected multiples of 128"):
        blob.unpack(np.zeros(10 ** 6, np.uint8), 128, 192, 3)
    with pytest.raises(blob.BlobError, match=r"100 bytes, expected"):
        blob.unpack(np.zeros(100, np.uint8), 128, 128, 3)


@pytest.fixture(scope="module")
def st(tmp_path_factory):
    pytest.importorskip("safetensors", reason="the tiny checkpoint is written with safetensors (the test extra)")
    from adapters.exl3xpu import model
    from tests.adapter_checks import tiny_model
    return tiny_model(tmp_path_factory, "exl3xpu-blob", model.write_tiny, 2, tensors=False)[1]


def test_every_store_record_round_trips_through_its_blob(st):
    from tests.adapter_checks import record
    for k in range(st.layers * st.experts):
        rec = record(st, k)
        assert np.array_equal(blob.record(st.layout, blob.pack_record(st.layout, rec)), rec), k


def test_the_backends_slots_hold_the_blob_and_its_lanes_compute_it(st):
    """A landed fill leaves the blob in its RAM slot, a push moves it to VRAM, a drain brings it back; the cpu lane
    and the ops (gpu, zerocopy) computing from those blobs equal moetier's CPU kernel on the store's record."""
    from adapters.engine_lanes import cpu_rows
    from adapters.exl3xpu.backend import XpuBackend
    from adapters.exl3xpu.ops import ProvidedOps
    from moetier.bytes.expert import exl3_expert
    from tests.adapter_checks import record
    be = XpuBackend(st, ProvidedOps(act_limit=st.layout.act_limit or 0.0), ram_slots=4, vram_slots=2)
    try:
        key, n = 21, surface.blob_bytes(st.layout.hidden, st.layout.ffn, st.layout.bits)
        want_blob = blob.pack_record(st.layout, record(st, key))
        be.wait(be.fill(key, 1))
        assert np.array_equal(be._host[1][:n], want_blob) and not be._host[1][n:].any()
        be.wait(be.push(key, 1, 0))
        assert np.array_equal(be.arena[0][:n], want_blob)
        be.wait(be.drain(key, 0, 3))
        assert np.array_equal(be._host[3][:n], want_blob)
        x = np.random.default_rng(4).standard_normal((3, st.layout.hidden)).astype(np.float32)
        want = cpu_rows(x[[0, 2]], exl3_expert(st.layout, record(st, key)), be.act_limit)
        for lane, slot in (("cpu", 1), ("zerocopy", 3), ("gpu", 0)):
            got = be.compute(lane, [(key, slot, [0, 2])], x)[key]
            assert got.dtype == np.float32 and np.array_equal(got, want), lane
    finally:
        be.close()
