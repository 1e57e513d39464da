"""The router record of a store: every layer's router weights in ``router.bin``, described in the manifest.

Contract
--------
``router.bin`` holds float32 ``[layers, experts, hidden]`` (C order): row ``e`` of layer ``l`` is expert ``e``'s
router vector, so a row's logits are ``x @ W[l].T``. The manifest's ``router`` object names the file, ``dtype``,
``shape``, the scoring (``softmax`` | ``sigmoid``, from the model record's ``moe.router.scoring``, default softmax),
``renormalize`` (whether the top-k scores are rescaled to sum 1; default true), ``topk`` (the model record's
``moe.topk``, where it has one) and the file's xxh3-128
``digest`` - checksummed like the expert records: ``load`` refuses a file whose digest differs.

``write(dir, model, layers, experts, hidden, seed)`` writes a seeded router (what ``store pack`` makes for its
seeded experts) and returns the manifest entry; ``check(entry, where)`` validates one; ``load(dir, entry)`` reads
and verifies the weights.
"""
from __future__ import annotations

import os

import numpy as np

from moetier.bytes.layout import DIGEST_BYTES, digest
from moetier.errors import UserError

ROUTER_NAME = "router.bin"
SCORINGS = ("softmax", "sigmoid")
_SALT = 0x524F5554      # keeps the router's random stream apart from the experts'


def scoring_of(model: dict) -> tuple[str, bool]:
    """(scoring, renormalize) from a model record's optional ``moe.router``; UserError naming a bad field."""
    mid = model.get("id", "?")
    r = (model.get("moe") or {}).get("router") or {}
    scoring, renorm = r.get("scoring", "softmax"), r.get("renormalize", True)
    if scoring not in SCORINGS:
        raise UserError(f"model {mid}: field 'moe.router.scoring' expected one of {', '.join(SCORINGS)}, "
                        f"got {scoring!r}")
    if not isinstance(renorm, bool):
        raise UserError(f"model {mid}: field 'moe.router.renormalize' expected true or false, got {renorm!r}")
    return scoring, renorm


def weights(layers: int, experts: int, hidden: int, seed: int) -> np.ndarray:
    """Seeded router weights [layers, experts, hidden] float32, scaled so that logits of a unit-RMS state are O(1)."""
    out = np.empty((layers, experts, hidden), np.float32)
    for layer in range(layers):
        rng = np.random.default_rng([int(seed), _SALT, layer])
        out[layer] = rng.standard_normal((experts, hidden)).astype(np.float32) / np.float32(np.sqrt(hidden))
    return out


def write(directory: str, model: dict, layers: int, experts: int, hidden: int, seed: int) -> dict:
    scoring, renorm = scoring_of(model)
    w = weights(layers, experts, hidden, seed)
    path = os.path.join(directory, ROUTER_NAME)
    with open(path, "wb") as f:
        f.write(w.tobytes())
        f.flush()
        os.fsync(f.fileno())
    entry = {"file": ROUTER_NAME, "dtype": "float32", "shape": [layers, experts, hidden], "scoring": scoring,
             "renormalize": renorm, "digest": digest(w.tobytes()).hex()}
    k = model["moe"].get("topk")
    if isinstance(k, int) and not isinstance(k, bool) and 1 <= k <= experts:
        entry["topk"] = k
    return entry


def check(entry, where: str, layers: int, experts: int, hidden: int) -> dict:
    """The manifest's router entry, validated; UserError naming the field."""
    if not isinstance(entry, dict):
        raise UserError(f"{where}: field 'router' expected an object")
    want = {"file": ROUTER_NAME, "dtype": "float32", "shape": [layers, experts, hidden]}
    for f, v in want.items():
        if entry.get(f) != v:
            raise UserError(f"{where}: field 'router.{f}' expected {v!r}, got {entry.get(f)!r}")
    if entry.get("scoring") not in SCORINGS:
        raise UserError(f"{where}: field 'router.scoring' expected one of {', '.join(SCORINGS)}, "
                        f"got {entry.get('scoring')!r}")
    if not isinstance(entry.get("renormalize"), bool):
        raise UserError(f"{where}: field 'router.renormalize' expected true or false")
    k = entry.get("topk", 1)
    if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= experts:
        raise UserError(f"{where}: field 'router.topk' expected an integer in 1..{experts}, got {k!r}")
    dg = entry.get("digest")
    if not isinstance(dg, str) or len(dg) != 2 * DIGEST_BYTES:
        raise UserError(f"{where}: field 'router.digest' expected {2 * DIGEST_BYTES} hex characters")
    return entry


def load(directory: str, entry: dict) -> np.ndarray:
    path = os.path.join(directory, entry["file"])
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        raise UserError(f"store {directory}: router weights unreadable: {e.strerror or e}") from None
    if digest(raw).hex() != entry["digest"]:
        raise UserError(f"store {path}: router weights fail their checksum (manifest 'router.digest')")
    shape = tuple(entry["shape"])
    if len(raw) != 4 * int(np.prod(shape)):
        raise UserError(f"store {path}: {len(raw)} bytes, expected float32 {list(shape)}")
    return np.frombuffer(raw, dtype=np.float32).reshape(shape)
