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
        peek = be.ops.host_alloc(n)                    # VRAM is read back through the ops, as on the device
        be.ops.memcpy_async(int(peek.ctypes.data), be.vram_address(0), n)
        assert np.array_equal(peek, want_blob)
        be.wait(be.drain(key, 0, 3))
        assert np.array_equal(be._host[3][:n], want_blob)
        x = np.random.default_rng(4).standard_normal((3, st.layout.hidden)).astype(np.float32)
        want = cpu_rows(x[[0, 2]], exl3_expert(st.layout, record(st, key)), be.act_limit)
        for lane, slot in (("cpu", 1), ("zerocopy", 3), ("gpu", 0)):
            got = be.compute(lane, [(key, slot, [0, 2])], x)[key]
            assert got.dtype == np.float32 and np.array_equal(got, want), lane
    finally:
        be.close()


@pytest.mark.parametrize("K", surface.PLANAR4_K)
def test_every_trellis_element_sits_where_the_kernel_reads_it(K):
    """The blob byte of every trellis element, computed from exl3xpu's own statement of the layout (its
    ``exl3_moe.sycl`` header and ``Geom``: gate|up rows of 2I/16 tiles then the down rows, W = 8K words per tile;
    PLANAR4 puts word (tile t, period g, plane i) of a group of 4 tiles at [i][t][g] instead of [t][K*g + i]; word w
    of a tile holds its int16 elements 2w (low half) and 2w + 1 (high half)) - offsets computed here, not by blob.py's
    reshapes. ``planar4`` is also checked against the kernel's read of a tile-major tile: plane i of a tile is its
    words i, i + K, ..., the stride-K select the register planarization replaces."""
    H, I = 128, 128  # noqa: E741
    ex = rand_expert(H, I, K, seed=10 + K)
    b = blob.pack(ex)
    W = 8 * K
    gu_bytes = (H // 16) * (2 * I // 16) * W * 4

    def offset(base: int, row: int, tiles_n: int, tile: int, elem: int) -> int:
        w = elem // 2
        g, i = divmod(w, K)
        grp, t = divmod(tile, 4)
        return base + (row * tiles_n * W + grp * 4 * W + i * 32 + t * 8 + g) * 4 + 2 * (elem % 2)

    rng = np.random.default_rng(K)
    for proj, base, tiles_n, shift in (("gate", 0, 2 * I // 16, 0), ("up", 0, 2 * I // 16, I // 16),
                                       ("down", gu_bytes, H // 16, 0)):
        tr = getattr(ex, proj).trellis                        # int16 [k/16][n/16][16K]
        for _ in range(200):
            r, n, e = (int(rng.integers(0, s)) for s in tr.shape)
            o = offset(base, r, tiles_n, n + shift, e)
            assert b[o:o + 2].view("<i2")[0] == tr[r, n, e], (proj, r, n, e)
    words = rng.integers(0, 2 ** 32, size=(1, 4, W), dtype=np.uint64).astype(np.uint32)
    flat = blob.planar4(words, K).reshape(-1)
    for i in range(K):
        assert np.array_equal(flat[32 * i:32 * (i + 1)], np.concatenate([words[0, t, i::K] for t in range(4)]))
