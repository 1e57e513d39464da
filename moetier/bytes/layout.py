"""The store's on-disk format: file names, the format tag and the record checksum.

Contract: both sides of the bytes path import this module - the store (which writes and opens ``experts.bin`` +
``manifest.json``) and the transport (which checks landed records) - and it imports neither, so the two never import
each other. A record for key ``k`` lives at byte offset ``k * record_bytes`` (``record_offset``).
"""
from __future__ import annotations

import xxhash

FORMAT = "moetier-store/1"
CHECKSUM = "xxh3-128"
DIGEST_BYTES = 16
DATA_NAME = "experts.bin"
MANIFEST_NAME = "manifest.json"


def digest(buf) -> bytes:
    """The record checksum: xxh3-128 (~20 GB/s, so landed bytes can be checked on the read path; blake2b would
    cost ~1 ms per 1.5 MB record)."""
    return xxhash.xxh3_128_digest(buf)


def record_offset(key: int, record_bytes: int) -> int:
    """Byte offset of key's record in experts.bin (records are back to back, each a multiple of 4096 bytes)."""
    return int(key) * int(record_bytes)
