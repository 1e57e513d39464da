"""exl3xpu's expert blob: the packer from moetier's EXL3 expert records, and its inverse.

Contract
--------
The blob of one expert (reference adapters.md section 4.3: exl3xpu's ``moe_offload.py`` docstring and the kernel's
``Geom``), for hidden H, intermediate I and bitrate K:

1. the gate|up trellis as uint32 ``[H/16][2I/16][8K]``: per k-row, the I/16 gate tiles then the I/16 up tiles;
2. the down trellis as uint32 ``[I/16][H/16][8K]``;
3. fp16 ``suh_g[H] suh_u[H] svh_g[I] svh_u[I] suh_d[I] svh_d[H]``.

A tile's 8K words are its 16K int16 trellis elements paired little-endian (word i = elem[2i] | elem[2i+1] << 16,
section 2.3). Within each k-row the words are in PLANAR4 order: the row's tiles in groups of 4 along n, a group's
4 * 8K words stored plane-major, ``[plane i][tile t][period g]``, where a tile's natural word ``g * K + i`` is plane
i of period g (8 periods of K words: 32 elements of K bits each). PLANAR4 is defined for odd K (exl3xpu's
``planar4()`` takes K in {3, 5, 7}); H and I are multiples of 128 (EXL3's Hadamard blocks), so every k-row has whole
groups of 4 tiles.

``pack(expert) -> uint8[blob_bytes]`` and ``unpack(blob, H, I, K, codebook) -> Exl3Expert`` are exact inverses;
``pack_record(layout, record)`` / ``record(layout, blob)`` go between a moetier exl3 record (moetier.bytes.expert) and
a blob. ``expert(layout, blob)`` is the record view moetier's cpu lane computes from. The layout agrees with exl3xpu's
public source (``planar4`` / ``pack_expert`` in its ``moe_offload.py``, the ``exl3_moe.sycl`` header and ``Geom``;
docs/adapters.md names the files); no Arc kernel has read a blob packed here.
"""
from __future__ import annotations

import numpy as np

from adapters.exl3xpu.geometry import PLANAR4_K, blob_bytes
from moetier.bytes import exl3
from moetier.bytes.expert import pack_exl3

GROUP = 4            # tiles per PLANAR4 group along n
PERIODS = 8          # periods per tile (32 elements each)


class BlobError(ValueError):
    """A geometry the blob layout does not cover, or bytes of the wrong size."""


def _check(H: int, I: int, K: int) -> None:  # noqa: E741  (the kernel's names)
    if K not in PLANAR4_K:
        raise BlobError(f"exl3xpu blob: K={K}; PLANAR4 is defined for K in {PLANAR4_K}")
    if H % 128 or I % 128:      # EXL3's Hadamard blocks; they also give every k-row whole groups of 4 tiles
        raise BlobError(f"exl3xpu blob: H={H}, I={I}; expected multiples of 128")


def planar4(words: np.ndarray, K: int) -> np.ndarray:
    """uint32 ``[rows][tiles][8K]`` tile-major -> the same words PLANAR4-ordered per row (same shape)."""
    r, t, _ = words.shape
    w = words.reshape(r, t // GROUP, GROUP, PERIODS, K)             # [row][group][tile][period][plane]
    return np.ascontiguousarray(w.transpose(0, 1, 4, 2, 3)).reshape(r, t, PERIODS * K)


def unplanar4(words: np.ndarray, K: int) -> np.ndarray:
    """The inverse of ``planar4``."""
    r, t, _ = words.shape
    w = words.reshape(r, t // GROUP, K, GROUP, PERIODS)             # [row][group][plane][tile][period]
    return np.ascontiguousarray(w.transpose(0, 1, 3, 4, 2)).reshape(r, t, PERIODS * K)


def _words(trellis: np.ndarray) -> np.ndarray:
    """int16 ``[k/16][n/16][16K]`` -> uint32 ``[k/16][n/16][8K]`` (little-endian pairs)."""
    return np.ascontiguousarray(trellis, dtype="<i2").view("<u4")


def pack(ex) -> np.ndarray:
    """The blob of an exl3.Exl3Expert (gate and up H x I, down I x H, one K)."""
    H, I = ex.gate.k, ex.gate.n  # noqa: E741
    K = ex.gate.trellis.shape[-1] // 16
    _check(H, I, K)
    gu = planar4(np.concatenate([_words(ex.gate.trellis), _words(ex.up.trellis)], axis=1), K)
    dn = planar4(_words(ex.down.trellis), K)
    sc = np.concatenate([np.asarray(a, "<f2") for a in (ex.gate.suh, ex.up.suh, ex.gate.svh, ex.up.svh,
                                                         ex.down.suh, ex.down.svh)])
    out = np.concatenate([gu.reshape(-1).view(np.uint8), dn.reshape(-1).view(np.uint8), sc.view(np.uint8)])
    assert out.size == blob_bytes(H, I, K)
    return out


def unpack(blob, H: int, I: int, K: int, codebook: str = "mul1"):  # noqa: E741
    """The exl3.Exl3Expert a blob holds (trellises and scales copied out of the PLANAR4 order)."""
    _check(H, I, K)
    b = np.asarray(blob).reshape(-1).view(np.uint8)
    n = blob_bytes(H, I, K)
    if b.size < n:
        raise BlobError(f"exl3xpu blob: {b.size} bytes, expected {n} for H={H} I={I} K={K}")
    gu_n, dn_n = (H // 16) * (2 * I // 16) * 8 * K * 4, (I // 16) * (H // 16) * 8 * K * 4
    gu = unplanar4(b[:gu_n].view("<u4").reshape(H // 16, 2 * I // 16, 8 * K), K).view("<i2")
    dn = unplanar4(b[gu_n:gu_n + dn_n].view("<u4").reshape(I // 16, H // 16, 8 * K), K).view("<i2")
    sc = b[gu_n + dn_n:n].view("<f2")
    cuts = np.cumsum([H, H, I, I, I])
    suh_g, suh_u, svh_g, svh_u, suh_d, svh_d = (a.astype(np.float16) for a in np.split(sc, cuts))
    half = I // 16
    return exl3.Exl3Expert(exl3.Exl3Linear(gu[:, :half].astype(np.int16), suh_g, svh_g, codebook),
                           exl3.Exl3Linear(gu[:, half:].astype(np.int16), suh_u, svh_u, codebook),
                           exl3.Exl3Linear(dn.astype(np.int16), suh_d, svh_d, codebook))


def expert(layout, blob):
    """The exl3.Exl3Expert of a blob laid out for a moetier exl3 ``layout``'s geometry."""
    return unpack(blob, layout.hidden, layout.ffn, layout.bits, layout.codebook)


def pack_record(layout, rec) -> np.ndarray:
    """A moetier exl3 record (moetier.bytes.expert) -> its blob."""
    from moetier.bytes.expert import exl3_expert
    return pack(exl3_expert(layout, np.asarray(rec).reshape(-1).view(np.uint8)[:layout.record_bytes]))


def record(layout, blob) -> np.ndarray:
    """A blob -> the moetier exl3 record of the same expert (uint8[layout.record_bytes], exact)."""
    return np.frombuffer(pack_exl3(layout, expert(layout, blob)), np.uint8).copy()
