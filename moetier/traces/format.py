"""Routing traces: format, load, save, validate, convert.

Contract
--------
A trace is what the router decided during decode: for every token, every MoE layer and every routing slot, the LOCAL
expert id (0..E-1) that was picked. The global key of a pick is ``layer * E + id``.

``Trace`` holds:

* ``ids``       int16 (int32 when the model has more than 32767 experts per layer) array [tokens, layers, topk];
* ``segments``  int64 array [nseg + 1] of boundaries: starts at 0, ends at ``tokens``, strictly increasing. Segment i
  is rows ``[segments[i], segments[i+1])``; segments are independent request streams (no history is carried across);
* ``weights``   optional float32 [tokens, layers, topk] router weights (same shape as ``ids``);
* ``meta``      a JSON-serialisable dict (``model_id``, ``source``, generator params, ...).

Two file formats, chosen by suffix:

* ``.npz`` (ours): keys ``ids``, ``segments``, optional ``weights`` and ``meta`` (a JSON string stored as a 0-d
  unicode array). Written with ``np.savez_compressed`` to a temporary file in the same directory and renamed with
  ``os.replace`` (atomic). Read with ``np.load(allow_pickle=False)`` only: a file that would need pickle is refused.
* ``.npy`` (reference): an integer array [tokens, layers, >= topk]; segments live in the sibling file
  ``<stem>.segments.npy`` (1-D boundaries ``[0, s1, ..., tokens]``), found automatically. No weights, no meta.

A trace imported with ``--missing mask`` (``meta["missing"] == "mask"``) may hold ``MASKED`` (-1) where a router
record was missing: that pick is not computed (the simulator skips it; statistics leave such tokens out).

``load_trace`` keeps only the first ``topk`` columns when ``topk`` is given. Without segments the trace is one
segment. Every problem with a trace file raises ``UserError`` with one line naming the file and what was expected.
"""

from __future__ import annotations

import json
import os
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from moetier.atomic import atomic_write, atomic_write_many
from moetier import strictjson
from moetier.errors import UserError

__all__ = ["Trace", "load_trace", "save_trace", "validate", "convert", "segments_sibling", "ids_dtype", "MASKED",
           "MISSING"]

MASKED = -1     # a pick whose router record was missing (traces imported with --missing mask)
MISSING = ("error", "drop", "mask")     # what a MASKED hole means (--missing on every command that reads a trace)
MAX_EXPERTS = 1 << 20   # the model schema's bound on experts per layer: the bound on an id when no model is named


def ids_dtype(experts: int | None, max_id: int | None = None) -> np.dtype:
    """int16 unless the expert count (or the largest id seen) does not fit, then int32."""
    top = experts if experts is not None else (max_id + 1 if max_id is not None else 0)
    return np.dtype(np.int16) if top <= 32767 else np.dtype(np.int32)


@dataclass
class Trace:
    ids: np.ndarray
    segments: np.ndarray
    weights: np.ndarray | None = None
    meta: dict = field(default_factory=dict)

    @property
    def tokens(self) -> int:
        return int(self.ids.shape[0])

    @property
    def layers(self) -> int:
        return int(self.ids.shape[1])

    @property
    def topk(self) -> int:
        return int(self.ids.shape[2])

    @property
    def nseg(self) -> int:
        return int(len(self.segments) - 1)

    def segment(self, i: int) -> np.ndarray:
        """ids of segment i: ids[seg[i]:seg[i+1]]."""
        if not -self.nseg <= i < self.nseg:
            raise IndexError(f"segment {i} out of range (trace has {self.nseg})")
        i %= self.nseg
        return self.ids[int(self.segments[i]):int(self.segments[i + 1])]

    def segment_of_token(self) -> np.ndarray:
        """int array [tokens]: the segment index of every token."""
        return np.repeat(np.arange(self.nseg), np.diff(self.segments))


def segments_sibling(path: str | os.PathLike) -> Path:
    """``x/name.npy`` -> ``x/name.segments.npy``."""
    p = Path(path)
    stem = p.name[:-4] if p.name.endswith(".npy") else p.stem
    return p.with_name(stem + ".segments.npy")


def _shape(a: np.ndarray) -> str:
    return "[" + ", ".join(str(int(s)) for s in a.shape) + "]"


def _load_npy(path: Path, what: str) -> np.ndarray:
    if not path.exists():
        raise UserError(f"{what} {path}: file not found")
    try:
        with open(path, "rb") as f:
            magic = f.read(6)
    except OSError as e:
        raise UserError(f"{what} {path}: cannot be read ({e.strerror})") from None
    if magic != b"\x93NUMPY":
        raise UserError(f"{what} {path}: not a valid .npy file (no NumPy header)")
    try:
        return np.load(path, allow_pickle=False)
    except ValueError as e:
        if "pickle" in str(e).lower():
            raise UserError(f"{what} {path}: holds an object array that would require pickle; expected a plain "
                            f"integer .npy") from None
        raise UserError(f"{what} {path}: not a valid .npy file ({e})") from None
    except (OSError, EOFError) as e:
        raise UserError(f"{what} {path}: not a valid .npy file ({e})") from None


def _load_npz(path: Path) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None, dict]:
    if not path.exists():
        raise UserError(f"trace {path}: file not found")
    try:
        z = np.load(path, allow_pickle=False)
    except (OSError, EOFError, ValueError, zipfile.BadZipFile) as e:
        raise UserError(f"trace {path}: not a valid .npz file ({e})") from None
    if not isinstance(z, np.lib.npyio.NpzFile):
        raise UserError(f"trace {path}: expected an .npz archive with key 'ids', found a plain .npy array")
    arrays = {}
    with z:
        for key in z.files:
            try:
                arrays[key] = z[key]
            except ValueError as e:
                if "pickle" in str(e).lower():
                    raise UserError(f"trace {path}: key '{key}' holds an object array that would require pickle; "
                                    f"refused (expected plain numeric arrays and a JSON string meta)") from None
                raise UserError(f"trace {path}: key '{key}' is not readable ({e})") from None
            except (OSError, EOFError, zipfile.BadZipFile) as e:
                raise UserError(f"trace {path}: key '{key}' is not readable ({e})") from None
    if "ids" not in arrays:
        raise UserError(f"trace {path}: no 'ids' array; expected keys ids, segments, [weights], [meta] "
                        f"(found {sorted(arrays)})")
    meta: dict = {}
    if "meta" in arrays:
        m = arrays["meta"]
        if m.dtype.kind != "U" or m.ndim != 0:
            raise UserError(f"trace {path}: 'meta' must be a 0-d unicode array holding a JSON object "
                            f"(found dtype {m.dtype}, shape {_shape(m)})")
        meta = strictjson.loads(str(m[()]), f"trace {path}: 'meta'")
        if not isinstance(meta, dict):
            raise UserError(f"trace {path}: 'meta' must be a JSON object, found {type(meta).__name__}")
    return arrays["ids"], arrays.get("segments"), arrays.get("weights"), meta


def _check_segments(seg: np.ndarray, tokens: int, where: str) -> None:
    if seg.ndim != 1:
        raise UserError(f"{where}: segments must be a 1-D array of boundaries [0, ..., {tokens}], "
                        f"found shape {_shape(seg)}")
    if seg.dtype.kind not in "iu":
        raise UserError(f"{where}: segments must be integers, found dtype {seg.dtype}")
    if len(seg) < 2:
        raise UserError(f"{where}: segments must hold at least [0, {tokens}], found {seg.tolist()}")
    if int(seg[0]) != 0:
        raise UserError(f"{where}: segments must start at 0, found {int(seg[0])}")
    if int(seg[-1]) != tokens:
        raise UserError(f"{where}: segments must end at the token count {tokens}, found {int(seg[-1])}")
    d = np.diff(seg.astype(np.int64))
    if (d <= 0).any():
        i = int(np.argmax(d <= 0))
        raise UserError(f"{where}: segments must be strictly increasing, found {int(seg[i])} then "
                        f"{int(seg[i + 1])} at index {i + 1}")


def validate(trace: Trace, *, layers: int | None, experts: int | None, topk: int | None, path="trace",
             model_id: str | None = None, masked: bool = False) -> None:
    """Raise UserError (naming ``path``) unless ``trace`` fits a model with these dimensions.

    ``layers``/``experts``/``topk``/``model_id`` may be None to skip that check. ``ids`` may have more than
    ``topk`` columns (only the first ``topk`` are used); fewer is an error. ``MASKED`` holes pass when ``masked``
    or the trace was imported with ``--missing mask``.
    """
    where = f"trace {path}"
    ids = trace.ids
    if not isinstance(ids, np.ndarray):
        raise UserError(f"{where}: ids must be a numpy array, found {type(ids).__name__}")
    if ids.dtype.kind not in "iu":
        raise UserError(f"{where}: ids must be integers (local expert ids), found dtype {ids.dtype}")
    model = f" model {model_id}" if model_id else " model"
    if ids.ndim != 3:
        raise UserError(f"{where}: expected a 3-D array [tokens, layers, topk], found shape {_shape(ids)}")
    if ids.shape[0] == 0:
        raise UserError(f"{where}: has no tokens (shape {_shape(ids)})")
    if layers is not None and ids.shape[1] != layers:
        raise UserError(f"{where}: shape {_shape(ids)} does not match{model}: expected {layers} layers")
    if topk is not None and ids.shape[2] < topk:
        raise UserError(f"{where}: shape {_shape(ids)} does not match{model}: expected at least {topk} "
                        f"routing columns (top-k)")
    if ids.shape[2] == 0:
        raise UserError(f"{where}: has no routing columns (shape {_shape(ids)})")
    cols = ids[:, :, :topk] if topk is not None else ids
    masked_ok = masked or (isinstance(trace.meta, dict) and trace.meta.get("missing") == "mask")
    bad = (cols < MASKED) if masked_ok else (cols < 0)
    bad = bad | (cols >= (experts if experts is not None else MAX_EXPERTS))
    nbad = int(bad.sum())
    if nbad:
        first = np.unravel_index(int(np.argmax(bad)), cols.shape)
        rng = f"0..{(experts if experts is not None else MAX_EXPERTS) - 1}"
        hint = "" if masked_ok or int(cols[first]) != MASKED else " (holes: --missing mask or --missing drop)"
        raise UserError(f"{where}: {nbad} expert ids out of range {rng}; first at [token {first[0]}, layer "
                        f"{first[1]}, slot {first[2]}] = {int(cols[first])}{hint}")
    seg = np.asarray(trace.segments)
    _check_segments(seg, int(ids.shape[0]), where)
    if trace.weights is not None:
        _check_weights(trace.weights, ids, where)
    if not isinstance(trace.meta, dict):
        raise UserError(f"{where}: meta must be a dict, found {type(trace.meta).__name__}")
    mid = trace.meta.get("model_id")
    if model_id is not None and mid is not None and str(mid) != str(model_id):
        raise UserError(f"{where}: was recorded for model {mid}, not {model_id}")


def _check_weights(w, ids, where: str) -> None:
    """Routing weights: a finite float array of the ids' shape."""
    if not isinstance(w, np.ndarray) or w.dtype.kind != "f":
        raise UserError(f"{where}: weights must be a float array, found {getattr(w, 'dtype', type(w).__name__)}")
    if w.shape != ids.shape:
        raise UserError(f"{where}: weights shape {_shape(w)} does not match ids shape {_shape(ids)}")
    finite = np.isfinite(w)
    if not finite.all():
        first = np.unravel_index(int(np.argmin(finite)), w.shape)
        raise UserError(f"{where}: weights must be finite; [token {first[0]}, layer {first[1]}, slot {first[2]}] "
                        f"= {w[first]}")


def load_trace(path, segments_path=None, *, layers: int | None = None, experts: int | None = None,
               topk: int | None = None, model_id: str | None = None, missing: str = "error") -> Trace:
    """Read a trace (.npz ours or .npy reference, by suffix), validate it and return it.

    For .npy the sibling ``<stem>.segments.npy`` is used when present; ``segments_path`` overrides it (for .npz it
    overrides the stored segments). Only the first ``topk`` columns are kept when ``topk`` is given. ``missing``
    (``--missing``) says what a ``MASKED`` (-1) hole in a trace not imported with ``--missing mask`` means: ``error``
    refuses it, ``mask`` keeps it (the pick is not computed), ``drop`` leaves its token out (segments keep the rest).
    """
    if missing not in MISSING:
        raise UserError(f"trace {path}: --missing {missing!r}; expected one of {', '.join(MISSING)}")
    p = Path(path)
    suffix = p.suffix.lower()
    weights = None
    meta: dict = {}
    if suffix == ".npz":
        ids, seg, weights, meta = _load_npz(p)
    elif suffix == ".npy":
        ids = _load_npy(p, "trace")
        seg = None
        if segments_path is None and segments_sibling(p).exists():
            segments_path = segments_sibling(p)
        meta = {"source": "reference-npy", "file": p.name}
    else:
        raise UserError(f"trace {p}: unknown trace format '{p.suffix}'; expected .npz (moetier) or .npy "
                        f"(reference [tokens, layers, topk] array)")
    # ids first (with a placeholder segmentation), so shape problems are reported before segment problems
    placeholder = np.array([0, int(ids.shape[0]) if ids.ndim >= 1 else 0], dtype=np.int64)
    holes = missing != "error"
    validate(Trace(ids, placeholder, meta=meta if isinstance(meta, dict) else {}), layers=layers, experts=experts,
             topk=topk, path=p, model_id=model_id, masked=holes)
    if segments_path is not None:
        sp = Path(segments_path)
        seg = _load_npy(sp, "segments")
        _check_segments(seg, int(ids.shape[0]), f"segments {sp}")
    if seg is None:
        seg = placeholder
    tr = Trace(ids=ids, segments=seg, weights=weights, meta=meta)
    validate(tr, layers=layers, experts=experts, topk=topk, path=p, model_id=model_id, masked=holes)
    if topk is not None and ids.shape[2] > topk:
        tr.ids = tr.ids[:, :, :topk]
        if tr.weights is not None:
            tr.weights = tr.weights[:, :, :topk]
    if holes and (tr.ids < 0).any():
        _apply_missing(tr, missing, p)
    mx = max(0, int(tr.ids.max())) if tr.ids.size else 0
    tr.ids = np.ascontiguousarray(tr.ids, dtype=ids_dtype(experts, mx))
    tr.segments = np.asarray(tr.segments, dtype=np.int64)
    if tr.weights is not None:
        tr.weights = np.ascontiguousarray(tr.weights, dtype=np.float32)
    if model_id is not None and "model_id" not in tr.meta:
        tr.meta["model_id"] = model_id
    return tr


def _apply_missing(tr: Trace, missing: str, p: Path) -> None:
    """``--missing mask``: the holes stay and the meta says so; ``drop``: the tokens with a hole are left out."""
    if missing == "mask":
        tr.meta["missing"] = "mask"
        return
    keep = (tr.ids >= 0).all(axis=(1, 2))
    if not keep.any():
        raise UserError(f"trace {p}: every token has a -1 hole; --missing drop leaves nothing")
    seg_of = tr.segment_of_token()[keep]
    starts = np.flatnonzero(np.concatenate([[True], seg_of[1:] != seg_of[:-1]]))
    tr.ids = tr.ids[keep]
    tr.weights = tr.weights[keep] if tr.weights is not None else None
    tr.segments = np.concatenate([starts, [len(tr.ids)]]).astype(np.int64)
    tr.meta["dropped_tokens"] = int(tr.meta.get("dropped_tokens") or 0) + int((~keep).sum())
    if tr.meta.get("missing") == "mask":
        tr.meta["missing"] = "drop"


def save_trace(trace: Trace, path) -> None:
    """Write ``trace`` atomically. ``.npz``: our format (ids, segments, [weights], meta JSON).
    ``.npy``: the reference format (ids array + ``<stem>.segments.npy``; weights and meta are dropped)."""
    p = Path(path)
    validate(trace, layers=None, experts=None, topk=None, path=p)
    ids = np.ascontiguousarray(trace.ids, dtype=ids_dtype(None, max(0, int(trace.ids.max()))))
    seg = np.asarray(trace.segments, dtype=np.int64)
    suffix = p.suffix.lower()
    if suffix == ".npz":
        try:
            meta_json = json.dumps(trace.meta, sort_keys=True)
        except (TypeError, ValueError) as e:
            raise UserError(f"trace {p}: meta is not JSON-serialisable ({e})") from None
        arrays = {"ids": ids, "segments": seg, "meta": np.array(meta_json)}
        if trace.weights is not None:
            arrays["weights"] = np.ascontiguousarray(trace.weights, dtype=np.float32)
        atomic_write(p, lambda f: np.savez_compressed(f, **arrays))
    elif suffix == ".npy":
        atomic_write_many([(p, lambda f: np.save(f, ids, allow_pickle=False)),     # both files or neither
                           (segments_sibling(p), lambda f: np.save(f, seg, allow_pickle=False))])
    else:
        raise UserError(f"trace {p}: unknown trace format '{p.suffix}'; expected .npz or .npy")


def convert(src, dst, *, segments_path=None, missing: str = "error") -> Trace:
    """Read ``src`` (either format; ``missing`` as load_trace) and write ``dst`` (format by its suffix); return the
    trace written."""
    s, d = Path(src), Path(dst)
    if s.resolve() == d.resolve():
        raise UserError(f"trace {d}: convert destination is the source file")
    tr = load_trace(s, segments_path, missing=missing)
    save_trace(tr, d)
    return tr
