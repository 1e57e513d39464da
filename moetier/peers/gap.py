"""How far each row of ``moetier compare`` is from the oracle, and how much of that is replacement and how much
read-ahead.

Contract
--------
``variants(peer) -> {"replacement": Peer, "readahead": Peer, "both": Peer}``: the row with perfect replacement
(Belady with the run's future known, in the row's own tier structure, lane deal and read-ahead), with perfect
read-ahead (every NVMe pick read one layer ahead, ``PERFECT_READAHEAD``, under the row's own replacement) and with
both. ``split(row, replacement, readahead, both, oracle) -> dict`` takes their tok/s and returns

    {"gap": oracle - row, "replacement": ..., "readahead": ..., "rest": oracle - both}   (tok/s)

where the replacement and read-ahead parts are each factor's gain averaged over the two orders it can be added in
(Shapley): replacement = ((replacement - row) + (both - readahead)) / 2, read-ahead = ((readahead - row) + (both -
replacement)) / 2, so that gap = replacement + read-ahead + rest. ``rest`` is what neither closes: the oracle's
choice of tier structure and the planner's lane split against the row's own (negative where the row's structure is
faster than every structure the oracle tries with the same perfect knowledge). docs/peers.md explains the reading.
Pure.
"""
from __future__ import annotations

from dataclasses import replace

__all__ = ["variants", "split", "PERFECT_READAHEAD", "base_name"]

PERFECT_READAHEAD = {"depth": 1, "recall": 1.0, "predictor": "recall", "budget": 1 << 20}
_SEP = " with "


def variants(peer) -> dict:
    pf = dict(peer.policy, prefetch=dict(PERFECT_READAHEAD))
    return {"replacement": replace(peer, name=f"{peer.name}{_SEP}Belady", belady=True),
            "readahead": replace(peer, name=f"{peer.name}{_SEP}read-ahead", policy=pf),
            "both": replace(peer, name=f"{peer.name}{_SEP}Belady and read-ahead", policy=pf, belady=True)}


def base_name(name: str) -> str:
    """The row a variant was made from (its own name for a row)."""
    return name.split(_SEP)[0]


def split(row: float, replacement: float, readahead: float, both: float, oracle: float) -> dict:
    return {"gap": oracle - row,
            "replacement": ((replacement - row) + (both - readahead)) / 2,
            "readahead": ((readahead - row) + (both - replacement)) / 2,
            "rest": oracle - both}
