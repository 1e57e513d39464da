"""Router logs in: ``moetier trace import`` (JSON lines, CSV, npz) to moetier's trace format.

Contract
--------
``import_log(path, fields=Fields(), missing="error", fmt=None, experts=None, topk=None, name=None) -> Trace``.

A log holds one record per (token, layer) router decision: the token's index, the layer, the picked experts (ranked,
strongest first) and optionally their gate weights and the request (segment) the token belongs to. Field names are
given by ``Fields`` (``--token-field`` etc.):

* ``.jsonl``: one JSON object per line, e.g. ``{"token": 5, "layer": 3, "experts": [7, 2], "weights": [.6, .4]}``;
  a record without the layer field whose experts are a list of lists is a whole token (one list per layer).
* ``.csv``: a header row; the experts column holds the ids separated by spaces, ``;``, ``|`` or ``,`` (quoted), or
  numbered columns ``<experts>0``, ``<experts>1``, ... (also ``<experts>_0``); the same for weights.
* ``.npz``: arrays named by the fields: experts ``[tokens, layers, topk]`` (a dense log), or ``[records, topk]``
  with token and layer arrays ``[records]``; weights the same shape as experts; segment an array per record.

Tokens are ordered by (segment in order of first appearance, token index); a change of segment starts a segment.
A router record is missing when its (token, layer) pair is absent, or it has fewer than ``topk`` ids, or an id is
negative or null. ``missing``: ``error`` (one line naming the first such record), ``drop`` (tokens with any
missing record are left out; a segment keeps the rest), ``mask`` (the token stays; its missing picks are stored as
-1 and every consumer skips them: the simulator does not compute them, statistics leave those tokens out). Ids
at or above ``experts`` (when given) are an error. The trace's ``meta`` records the source file, format, field
names, the missing policy and how many tokens were dropped or picks masked, and experts / layers / topk.
"""
from __future__ import annotations

import csv
import math
import re
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from moetier import strictjson
from moetier.errors import UserError
from moetier.traces.format import MASKED, MAX_EXPERTS, Trace, ids_dtype

__all__ = ["Fields", "import_log", "MISSING"]

MISSING = ("error", "drop", "mask")
# the model schema's bounds (registry/schema/model.schema.json): checked as records are read, before any array
# is allocated, so a log naming layer 10**9 is one line and not a 1.46 TiB allocation
MAX_LAYERS, MAX_TOPK = 4096, 1024
MAX_PICKS = 1 << 31          # tokens x layers x topk of one trace: 16 GiB of int64 ids while importing
_SPLIT = re.compile(r"[\s;|,]+")


@dataclass(frozen=True)
class Fields:
    token: str = "token"
    layer: str = "layer"
    experts: str = "experts"
    weights: str | None = "weights"
    segment: str | None = None


def _ids(v, where: str) -> list:
    """A record's expert ids (None for a null or negative id: missing)."""
    if isinstance(v, str):
        v = [x for x in _SPLIT.split(v.strip()) if x]
    if not isinstance(v, (list, tuple)):
        raise UserError(f"{where}: expected a list of expert ids, found {type(v).__name__}")
    out = []
    for x in v:
        if x is None or x == "" or (isinstance(x, float) and math.isnan(x)):
            out.append(None)
            continue
        try:
            i = int(x)
        except (TypeError, ValueError):
            raise UserError(f"{where}: expert id {x!r} is not an integer") from None
        if isinstance(x, float) and x != i:
            raise UserError(f"{where}: expert id {x!r} is not an integer")
        if i >= MAX_EXPERTS:
            raise UserError(f"{where}: expert id {i} is above the bound {MAX_EXPERTS - 1} (the model schema's "
                            f"experts per layer)")
        out.append(i if i >= 0 else None)
    if len(out) > MAX_TOPK:
        raise UserError(f"{where}: {len(out)} expert ids in one record (expected at most {MAX_TOPK}, the model "
                        f"schema's top-k)")
    return out


def _weights(v, where: str) -> list:
    if isinstance(v, str):
        v = [x for x in _SPLIT.split(v.strip()) if x]
    if not isinstance(v, (list, tuple)):
        raise UserError(f"{where}: expected a list of gate weights, found {type(v).__name__}")
    out = []
    for x in v:
        if x is None or x == "":      # no weight: a missing pick's
            out.append(0.0)
            continue
        try:
            w = float(x)
        except (TypeError, ValueError, OverflowError):
            raise UserError(f"{where}: gate weights must be numbers, found {x!r}") from None
        if isinstance(x, bool) or not math.isfinite(w):
            raise UserError(f"{where}: gate weight {x!r} is not a finite number (expected a finite gate weight)")
        out.append(w)
    return out


def _int(v, what: str, where: str) -> int:
    try:
        i = int(v)
        if isinstance(v, float) and v != i:
            raise ValueError
        return i
    except (TypeError, ValueError):
        raise UserError(f"{where}: field {what!r} must be an integer, found {v!r}") from None


def _records_jsonl(path: Path, f: Fields):
    with open(path, encoding="utf-8") as fh:
        for n, line in enumerate(fh, 1):
            if not line.strip():
                continue
            where = f"{path}: line {n}"
            r = strictjson.loads(line, where)
            if not isinstance(r, dict):
                raise UserError(f"{where}: expected a JSON object per line")
            yield where, r


def _records_csv(path: Path, f: Fields):
    with open(path, encoding="utf-8", newline="") as fh:
        rd = csv.DictReader(fh)
        cols = rd.fieldnames or []

        def numbered(base):
            if base is None or base in cols:
                return None
            m = [(int(c[len(base):].lstrip("_")), c) for c in cols
                 if c.startswith(base) and c[len(base):].lstrip("_").isdigit()]
            return [c for _, c in sorted(m)] or None
        ecols, wcols = numbered(f.experts), numbered(f.weights)
        for n, r in enumerate(rd, 2):
            if ecols:
                r[f.experts] = [r[c] for c in ecols]
            if wcols:
                r[f.weights] = [r[c] for c in wcols]
            yield f"{path}: row {n}", r


def _need(r: dict, key: str, where: str):
    if key not in r:
        raise UserError(f"{where}: no field {key!r} (name it with --{_FLAG.get(key, key)}-field)")
    return r[key]


_FLAG: dict = {}


def _from_records(path: Path, recs, f: Fields):
    """(segment, token) -> {layer: (ids, weights)} from per-record logs."""
    _FLAG.update({f.token: "token", f.layer: "layer", f.experts: "experts"})
    out: dict = {}
    seg_order: dict = {}
    layers_seen = 0
    for where, r in recs:
        tok = _int(_need(r, f.token, where), f.token, where)
        seg = r.get(f.segment) if f.segment else None
        if f.segment and f.segment not in r:
            raise UserError(f"{where}: no field {f.segment!r} (name it with --segment-field)")
        seg_order.setdefault(seg, len(seg_order))
        ex = _need(r, f.experts, where)
        w = r.get(f.weights) if f.weights else None
        slot = out.setdefault((seg_order[seg], tok), {})
        if f.layer in r and r[f.layer] is not None:
            layer = _int(r[f.layer], f.layer, where)
            if not 0 <= layer < MAX_LAYERS:
                raise UserError(f"{where}: field {f.layer!r} is {layer}; expected 0..{MAX_LAYERS - 1} (the model "
                                f"schema's bound on layers)")
            per = [(layer, ex, w)]
        elif isinstance(ex, list) and ex and all(isinstance(x, list) for x in ex):
            if len(ex) > MAX_LAYERS:
                raise UserError(f"{where}: field {f.experts!r} holds {len(ex)} layers; expected at most {MAX_LAYERS} "
                                f"(the model schema's bound on layers)")
            per = [(i, e, (w[i] if isinstance(w, list) and i < len(w) else None)) for i, e in enumerate(ex)]
        else:
            raise UserError(f"{where}: no field {f.layer!r} (name it with --layer-field), and {f.experts!r} is not "
                            f"one list of ids per layer")
        for layer, e, wl in per:
            if layer in slot:
                raise UserError(f"{where}: a second record for token {tok}, layer {layer}")
            slot[layer] = (_ids(e, where), _weights(wl, where) if wl is not None else None)
            layers_seen = max(layers_seen, layer + 1)
    return out, layers_seen


def _from_npz(path: Path, f: Fields):
    try:
        z = np.load(path, allow_pickle=False)
    except (ValueError, OSError) as e:
        raise UserError(f"{path}: not a readable npz without pickle ({e})") from None
    with z:
        if f.experts not in z.files:
            raise UserError(f"{path}: no array {f.experts!r} (name it with --experts-field); found {z.files}")
        ex = np.asarray(z[f.experts])
        w = np.asarray(z[f.weights]) if f.weights and f.weights in z.files else None
        if ex.dtype.kind not in "iuf":
            raise UserError(f"{path}: array {f.experts!r} must hold numbers, found dtype {ex.dtype}")
        if ex.ndim == 3:
            T, L, _ = ex.shape
            tok = np.repeat(np.arange(T), L)
            lay = np.tile(np.arange(L), T)
            ex = ex.reshape(T * L, -1)
            w = w.reshape(T * L, -1) if w is not None else None
            seg = None
        elif ex.ndim == 2:
            for k in (f.token, f.layer):
                if k not in z.files:
                    raise UserError(f"{path}: array {f.experts!r} is [records, topk]; needs arrays {f.token!r} and "
                                    f"{f.layer!r} per record; found {z.files}")
            tok, lay = np.asarray(z[f.token]), np.asarray(z[f.layer])
            if tok.shape != (len(ex),) or lay.shape != (len(ex),):
                raise UserError(f"{path}: arrays {f.token!r} and {f.layer!r} must have one entry per record "
                                f"({len(ex)})")
            seg = np.asarray(z[f.segment]) if f.segment and f.segment in z.files else None
        else:
            raise UserError(f"{path}: array {f.experts!r} must be [tokens, layers, topk] or [records, topk], found "
                            f"shape {list(ex.shape)}")
        if w is not None and w.shape != ex.shape:
            raise UserError(f"{path}: array {f.weights!r} shape {list(w.shape)} differs from {f.experts!r}'s")
    recs = []
    for i in range(len(ex)):
        r = {f.token: int(tok[i]), f.layer: int(lay[i]),
             f.experts: [None if (isinstance(x, float) and math.isnan(x)) else x for x in ex[i].tolist()]}
        if w is not None:
            r[f.weights] = w[i].tolist()
        if seg is not None:
            r[f.segment] = seg[i].item()
        recs.append((f"{path}: record {i}", r))
    return recs


_READERS = {"jsonl": _records_jsonl, "csv": _records_csv}


def _read_table(p: Path, fields: Fields, fmt: str | None) -> tuple[str, dict, int]:
    """(format, {(segment, token): {layer: (ids, weights)}}, layers seen) of the log at ``p``."""
    fmt = (fmt or p.suffix.lstrip(".")).lower()
    fmt = {"json": "jsonl", "ndjson": "jsonl"}.get(fmt, fmt)
    if fmt == "npz":
        records = _from_npz(p, fields)
    elif fmt in _READERS:
        records = _READERS[fmt](p, fields)
    else:
        raise UserError(f"{p}: unknown log format {fmt!r}; expected jsonl, csv or npz (--format)")
    table, L = _from_records(p, records, fields)
    if not table:
        raise UserError(f"{p}: no router records")
    return fmt, table, L


def _layer_ids(p: Path, key, l: int, e: list, K: int, experts: int | None) -> tuple[list, bool]:
    """One record's ids padded to K (MASKED for a missing id) and whether the record is missing; refuses an id out
    of range or picked twice."""
    e = e[:K]
    missing = len(e) < K or any(x is None for x in e)
    vals = [x if x is not None else MASKED for x in e] + [MASKED] * (K - len(e))
    if experts is not None and max(vals) >= experts:
        raise UserError(f"{p}: token {key[1]}, layer {l}: expert id {max(vals)} out of range 0..{experts - 1}")
    if len(set(v for v in vals if v >= 0)) < sum(v >= 0 for v in vals):
        raise UserError(f"{p}: token {key[1]}, layer {l}: an expert is picked twice ({e})")
    return vals, missing


def _fill(p: Path, table: dict, order: list, L: int, K: int, experts: int | None):
    """(ids [tokens, L, K] with MASKED holes, weights or None, missing [tokens, L]) from the record table."""
    ids = np.full((len(order), L, K), MASKED, dtype=np.int64)
    has_w = any(w is not None for t in table.values() for _, w in t.values())
    wts = np.zeros((len(order), L, K), dtype=np.float32) if has_w else None
    miss = np.zeros((len(order), L), dtype=bool)
    for i, key in enumerate(order):
        rec = table[key]
        for l in range(L):
            got = rec.get(l)
            if got is None:
                miss[i, l] = True
                continue
            ids[i, l], miss[i, l] = _layer_ids(p, key, l, got[0], K, experts)
            if wts is not None and got[1] is not None:
                wts[i, l] = np.asarray((got[1][:K] + [0.0] * K)[:K], dtype=np.float32)
    if extra := sorted({l for t in table.values() for l in t if l >= L}):
        raise UserError(f"{p}: layer {extra[0]} beyond the {L} layers asked for (--layers)")
    return ids, wts, miss


def import_log(path, fields: Fields = Fields(), missing: str = "error", fmt: str | None = None,
               experts: int | None = None, topk: int | None = None, layers: int | None = None,
               name: str | None = None) -> Trace:
    """Read a router log (module docstring) and return it as a Trace."""
    p = Path(path)
    if missing not in MISSING:
        raise UserError(f"trace import --missing: expected one of {', '.join(MISSING)}, got {missing!r}")
    if not p.exists():
        raise UserError(f"{p}: file not found")
    if not p.is_file():
        raise UserError(f"{p}: not a regular file (expected a router log: .jsonl, .csv or .npz)")
    try:
        fmt, table, L = _read_table(p, fields, fmt)
    except UnicodeDecodeError as e:
        raise UserError(f"{p}: not UTF-8 text at byte {e.start} (expected a router log: .jsonl, .csv or .npz)") \
            from None
    L = layers or L
    K = topk or max(len(ids) for t in table.values() for ids, _ in t.values())
    order = sorted(table)
    for flag, v, bound in (("--layers", L, MAX_LAYERS), ("--topk", K, MAX_TOPK)):
        if v > bound:
            raise UserError(f"trace import {flag} {v}: expected at most {bound} (the model schema's bound)")
    if len(order) * L * K > MAX_PICKS:
        raise UserError(f"{p}: {len(order)} tokens x {L} layers x top-{K} is over {MAX_PICKS:,} picks (expected a "
                        f"trace of at most that; import a part of the log)")
    ids, wts, miss = _fill(p, table, order, L, K, experts)
    n_missing = int(miss.any(1).sum())
    meta = {"source": "moetier trace import", "imported_from": p.name, "format": fmt, "fields": asdict(fields),
            "missing": missing, "layers": L, "topk": K, "dropped_tokens": 0, "masked_picks": 0}
    if n_missing and missing == "error":
        i, l = np.argwhere(miss)[0]
        raise UserError(f"{p}: token {order[i][1]}, layer {int(l)}: missing router record ({n_missing} tokens have "
                        f"one; --missing drop or --missing mask to import anyway)")
    seg_of = np.array([k[0] for k in order], dtype=np.int64)
    if n_missing and missing == "drop":
        keep = ~miss.any(1)
        if not keep.any():
            raise UserError(f"{p}: every token has a missing router record; nothing left to import")
        ids, seg_of = ids[keep], seg_of[keep]
        wts = wts[keep] if wts is not None else None
        meta["dropped_tokens"] = n_missing
    elif n_missing:
        ids[miss] = MASKED
        meta["masked_picks"] = int((ids < 0).sum())
    if experts is not None:
        meta["experts"] = int(experts)
    if name:
        meta["name"] = name
    starts = np.flatnonzero(np.concatenate([[True], seg_of[1:] != seg_of[:-1]]))
    segments = np.concatenate([starts, [len(ids)]]).astype(np.int64)
    top = int(ids.max()) if ids.size else 0
    return Trace(ids=ids.astype(ids_dtype(experts, top)), segments=segments, weights=wts, meta=meta)
