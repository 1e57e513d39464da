"""exl3xpu's expert blob geometry and its ``usm_kind`` answers: what the blob packer, the op provider and the hook
surface share (a leaf: it imports nothing of the adapter, so none of them import each other for it).

Contract: ``blob_bytes(H, I, K)`` is the size of one expert's blob (moe_offload.py's docstring, the kernel's Geom):
gate|up trellis uint32 [H/16][2I/16][8K], down trellis [I/16][H/16][8K], then fp16 suh_g[H] suh_u[H] svh_g[I]
svh_u[I] suh_d[I] svh_d[H]; ``record_bytes`` its store stride (4 KiB aligned); ``PLANAR4_K`` the K planar4()
supports; ``USM_*`` the kinds ``usm_kind`` answers (exl3_moe.sycl); ``QWEN`` the published Qwen geometry.
"""
from __future__ import annotations

ALIGN = 4096
QWEN = {"L": 48, "E": 512, "K": 3, "H": 2560, "I": 640, "blob": 1_862_400, "rec": 1_863_680}
PLANAR4_K = (3, 5, 7)
USM_UNKNOWN, USM_HOST, USM_DEVICE, USM_SHARED = 0, 1, 2, 3


def blob_bytes(H: int, I: int, K: int) -> int:  # noqa: E741  (the kernel's names)
    gu = (H // 16) * (2 * I // 16) * 8 * K * 4
    dn = (I // 16) * (H // 16) * 8 * K * 4
    return gu + dn + 2 * (3 * H + 3 * I)


def record_bytes(H: int, I: int, K: int) -> int:  # noqa: E741
    """The store stride of one blob (serve/pack_store.py: record r = layer*E + e at r * rec)."""
    return -(-blob_bytes(H, I, K) // ALIGN) * ALIGN
