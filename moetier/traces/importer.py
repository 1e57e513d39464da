"""Router logs in: ``moetier trace import`` (JSON lines, CSV, npz) to moetier's trace format.

Contract
--------
``import_log(paths, fields=Fields(), missing="error", fmt=None, experts=None, topk=None, name=None) -> Trace``.

``paths``: one log or several (a path, or a glob pattern standing for its sorted matches), read in order into one
trace: a log split over files by token range, by layer or by request imports in one call.

A log holds one record per (token, layer) router decision: the token's index, the layer, the picked experts (ranked,
strongest first) and optionally their gate weights and the request (segment) the token belongs to. Field names are
given by ``Fields`` (``--token-field`` etc.):

* ``.jsonl``: one JSON object per line, e.g. ``{"token": 5, "layer": 3, "experts": [7, 2], "weights": [.6, .4]}``;
  a record without the layer field whose experts are a list of lists is a whole token (one list per layer).
* ``.csv``: a header row; the experts column holds the ids separated by spaces, ``;``, ``|`` or ``,`` (quoted), or
  numbered columns ``<experts>0``, ``<experts>1``, ... (also ``<experts>_0``); the same for weights.
* ``.npz``: arrays named by the fields: experts ``[tokens, layers, topk]`` (a dense log), or ``[records, topk]``
  with token and layer arrays ``[records]``; weights the same shape as experts; segment an array per record. A
  dense log's ``segments`` array (boundaries, moetier's trace format: its ``ids`` are read when there is no
  experts array) gives its segments.

The segment (request) of a record is the value of the segment field, or of several together (``--segment
dataset,problem_id``: a request id unique only with another field). Without one, a token index that goes back (per
layer, over the files in order) starts a new segment: token indices that restart per request need no request field.
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
import glob
import json
import math
import re
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from moetier import strictjson
from moetier.errors import UserError
from moetier.traces.format import MASKED, MAX_EXPERTS, MISSING, Trace, ids_dtype

__all__ = ["Fields", "import_log", "MISSING"]

# the model schema's bounds (registry/schema/model.schema.json): checked as records are read, before any array
# is allocated, so a log naming layer 10**9 is one line and not a 1.46 TiB allocation
MAX_LAYERS, MAX_TOPK = 4096, 1024
MAX_PICKS = 1 << 31          # tokens x layers x topk of one trace: 16 GiB of int64 ids while importing
_SPLIT = re.compile(r"[\s;|,]+")


@dataclass(frozen=True)
class Fields:
    """Field names of a log; ``segment``: one field, several separated by commas, or a sequence of names."""
    token: str = "token"
    layer: str = "layer"
    experts: str = "experts"
    weights: str | None = "weights"
    segment: str | tuple | None = None

    @property
    def segments(self) -> tuple:
        s = self.segment
        names = s.split(",") if isinstance(s, str) else list(s or ())
        names = [n.strip() for n in names]
        if any(not n for n in names):
            raise UserError(f"trace import --segment {s!r}: expected field names separated by commas")
        return tuple(names)


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
            yield where, r, None


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
            yield f"{path}: row {n}", r, None


def _need(r: dict, key: str, where: str, flag: str):
    if key not in r:
        raise UserError(f"{where}: no field {key!r} (name it with --{flag})")
    return r[key]


def _seg_value(v):
    """A segment field's value as a hashable key part (a list or object by its JSON text)."""
    return json.dumps(v, sort_keys=True) if isinstance(v, (list, dict)) else v


class _Table:
    """(segment, token) -> {layer: (ids, weights)}, filled from one or several logs' records.

    The segment of a record: the values of the segment fields (several fields form one key), or, with none named,
    how many times its layer's token index has gone back so far (a log whose token index restarts per request, in
    one file or across files: a restart starts a segment). Segments are numbered in order of first appearance."""

    def __init__(self, f: Fields):
        self.f, self.rows, self.seg_order, self.layers = f, {}, {}, 0
        self.last_tok: dict = {}
        self.restarts: dict = {}

    def _segment(self, r: dict, tok: int, layers: list, where: str, key):
        if key is None and self.f.segments:
            for name in self.f.segments:
                if name not in r:
                    raise UserError(f"{where}: no field {name!r} (name the segment fields with --segment)")
            key = tuple(_seg_value(r[name]) for name in self.f.segments)
        elif key is None:
            l0 = layers[0]
            if tok <= self.last_tok.get(l0, -1):
                self.restarts[l0] = self.restarts.get(l0, 0) + 1
            for l in layers:
                self.last_tok[l] = tok
            key = ("restart", self.restarts.get(l0, 0))
        return self.seg_order.setdefault(key, len(self.seg_order))

    def add(self, recs) -> int:
        """Add the records; return how many there were."""
        f = self.f
        n = 0
        for where, r, seg_key in recs:
            n += 1
            tok = _int(_need(r, f.token, where, "token-field"), f.token, where)
            ex = _need(r, f.experts, where, "experts-field")
            w = r.get(f.weights) if f.weights else None
            if f.layer in r and r[f.layer] is not None:
                layer = _int(r[f.layer], f.layer, where)
                if not 0 <= layer < MAX_LAYERS:
                    raise UserError(f"{where}: field {f.layer!r} is {layer}; expected 0..{MAX_LAYERS - 1} (the "
                                    f"model schema's bound on layers)")
                per = [(layer, ex, w)]
            elif isinstance(ex, list) and ex and all(isinstance(x, list) for x in ex):
                if len(ex) > MAX_LAYERS:
                    raise UserError(f"{where}: field {f.experts!r} holds {len(ex)} layers; expected at most "
                                    f"{MAX_LAYERS} (the model schema's bound on layers)")
                per = [(i, e, (w[i] if isinstance(w, list) and i < len(w) else None)) for i, e in enumerate(ex)]
            else:
                raise UserError(f"{where}: no field {f.layer!r} (name it with --layer-field), and {f.experts!r} is "
                                f"not one list of ids per layer")
            seg = self._segment(r, tok, [x[0] for x in per], where, seg_key)
            slot = self.rows.setdefault((seg, tok), {})
            for layer, e, wl in per:
                if layer in slot:
                    hint = "" if f.segments else " (a request id field? name it with --segment)"
                    raise UserError(f"{where}: a second record for token {tok}, layer {layer}{hint}")
                slot[layer] = (_ids(e, where), _weights(wl, where) if wl is not None else None)
                self.layers = max(self.layers, layer + 1)
        return n


def _dense_segments(path: Path, b: np.ndarray, T: int) -> np.ndarray:
    """The segment of each of a dense log's T tokens from its ``segments`` boundaries."""
    if not (b.ndim == 1 and b.dtype.kind in "iu" and len(b) >= 2 and b[0] == 0 and b[-1] == T
            and (np.diff(b) > 0).all()):
        raise UserError(f"{path}: array 'segments' must be boundaries [0, ..., {T}] strictly increasing, found "
                        f"{b.tolist()[:8]}")
    return np.searchsorted(b, np.arange(T), side="right") - 1


def _record_arrays(path: Path, z, f: Fields, name: str, n: int) -> tuple:
    """(token, layer, [(segment field, array)]) of a [records, topk] npz log: one entry per record each."""
    for k in (f.token, f.layer):
        if k not in z.files:
            raise UserError(f"{path}: array {name!r} is [records, topk]; needs arrays {f.token!r} and {f.layer!r} "
                            f"per record; found {z.files}")
    tok, lay = np.asarray(z[f.token]), np.asarray(z[f.layer])
    segs = [(k, np.asarray(z[k])) for k in f.segments if k in z.files]
    for k, a in [(f.token, tok), (f.layer, lay), *segs]:
        if a.shape != (n,):
            raise UserError(f"{path}: array {k!r} must have one entry per record ({n})")
    return tok, lay, segs


def _from_npz(path: Path, f: Fields):
    """Records of an npz log; a dense log's ``segments`` boundaries (moetier's trace format) are its segments."""
    try:
        z = np.load(path, allow_pickle=False)
    except (ValueError, OSError) as e:
        raise UserError(f"{path}: not a readable npz without pickle ({e})") from None
    with z:
        name = f.experts if f.experts in z.files or "ids" not in z.files else "ids"    # a moetier trace: ids
        if name not in z.files:
            raise UserError(f"{path}: no array {f.experts!r} (name it with --experts-field); found {z.files}")
        ex = np.asarray(z[name])
        w = np.asarray(z[f.weights]) if f.weights and f.weights in z.files else None
        if ex.dtype.kind not in "iuf":
            raise UserError(f"{path}: array {name!r} must hold numbers, found dtype {ex.dtype}")
        segs: list = []
        seg_key = None
        if ex.ndim == 3:
            T, L, _ = ex.shape
            tok = np.repeat(np.arange(T), L)
            lay = np.tile(np.arange(L), T)
            ex = ex.reshape(T * L, -1)
            w = w.reshape(T * L, -1) if w is not None else None
            if "segments" in z.files:
                seg_key = np.repeat(_dense_segments(path, np.asarray(z["segments"]), T), L)
        elif ex.ndim == 2:
            tok, lay, segs = _record_arrays(path, z, f, name, len(ex))
        else:
            raise UserError(f"{path}: array {name!r} must be [tokens, layers, topk] or [records, topk], found "
                            f"shape {list(ex.shape)}")
        if w is not None and w.shape != ex.shape:
            raise UserError(f"{path}: array {f.weights!r} shape {list(w.shape)} differs from {name!r}'s")
    for i in range(len(ex)):
        r = {f.token: int(tok[i]), f.layer: int(lay[i]),
             f.experts: [None if (isinstance(x, float) and math.isnan(x)) else x for x in ex[i].tolist()]}
        if w is not None:
            r[f.weights] = w[i].tolist()
        for k, a in segs:
            r[k] = a[i].item()
        yield f"{path}: record {i}", r, (None if seg_key is None else ("npz", str(path), int(seg_key[i])))


_READERS = {"jsonl": _records_jsonl, "csv": _records_csv, "npz": _from_npz}


def _format(p: Path, fmt: str | None) -> str:
    fmt = (fmt or p.suffix.lstrip(".")).lower()
    fmt = {"json": "jsonl", "ndjson": "jsonl"}.get(fmt, fmt)
    if fmt not in _READERS:
        raise UserError(f"{p}: unknown log format {fmt!r}; expected jsonl, csv or npz (--format)")
    return fmt


def expand_paths(paths) -> list[Path]:
    """The logs named: paths as given, a glob pattern by its sorted matches; each must exist, none twice."""
    if isinstance(paths, (str, Path)):
        paths = [paths]
    out: list[Path] = []
    for x in paths:
        q = Path(x)
        if q.exists():
            out.append(q)
        elif glob.has_magic(str(x)):
            hits = sorted(glob.glob(str(x)))
            if not hits:
                raise UserError(f"{x}: no file matches the pattern")
            out += [Path(h) for h in hits]
        else:
            raise UserError(f"{q}: file not found")
    if not out:
        raise UserError("trace import: expected at least one log file")
    seen = set()
    for q in out:
        if q.resolve() in seen:
            raise UserError(f"{q}: named twice (a path and a pattern that matches it?)")
        if not q.is_file():
            raise UserError(f"{q}: not a regular file (expected a router log: .jsonl, .csv or .npz)")
        seen.add(q.resolve())
    return out


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


def _check_size(p: Path, tokens: int, L: int, K: int) -> None:
    """The trace's shape within the model schema's bounds, before its arrays are allocated."""
    for flag, v, bound in (("--layers", L, MAX_LAYERS), ("--topk", K, MAX_TOPK)):
        if v > bound:
            raise UserError(f"trace import {flag} {v}: expected at most {bound} (the model schema's bound)")
    if tokens * L * K > MAX_PICKS:
        raise UserError(f"{p}: {tokens} tokens x {L} layers x top-{K} is over {MAX_PICKS:,} picks (expected a "
                        f"trace of at most that; import a part of the log)")


def import_log(paths, fields: Fields = Fields(), missing: str = "error", fmt: str | None = None,
               experts: int | None = None, topk: int | None = None, layers: int | None = None,
               name: str | None = None) -> Trace:
    """Read one router log or several (paths, glob patterns; module docstring) and return them as one Trace."""
    if missing not in MISSING:
        raise UserError(f"trace import --missing: expected one of {', '.join(MISSING)}, got {missing!r}")
    files = expand_paths(paths)
    fields.segments                                                     # a malformed --segment fails first
    table = _Table(fields)
    fmts = []
    for p in files:
        fmts.append(_format(p, fmt))
        try:
            n = table.add(_READERS[fmts[-1]](p, fields))
        except UnicodeDecodeError as e:
            raise UserError(f"{p}: not UTF-8 text at byte {e.start} (expected a router log: .jsonl, .csv or .npz)") \
                from None
        if not n:
            raise UserError(f"{p}: no router records")
    p = files[0] if len(files) == 1 else Path(f"{files[0]} (and {len(files) - 1} more)")
    L = layers or table.layers
    rows = table.rows
    K = topk or max(len(ids) for t in rows.values() for ids, _ in t.values())
    order = sorted(rows)
    _check_size(p, len(order), L, K)
    ids, wts, miss = _fill(p, rows, order, L, K, experts)
    n_missing = int(miss.any(1).sum())
    meta = {"source": "moetier trace import",
            "imported_from": files[0].name if len(files) == 1 else [q.name for q in files],
            "format": fmts[0] if len(set(fmts)) == 1 else fmts, "fields": asdict(fields),
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
