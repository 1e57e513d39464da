"""The byte layout of one routed SwiGLU expert record, and a NumPy float64 reference for its math.

An expert of geometry hidden H x ffn F computes, for each token row x (length H)::

    y = W_down @ (silu(W_gate @ x) * (W_up @ x))      W_gate, W_up: [F, H]   W_down: [H, F]

A record holds the quantized weights and their scales as six sections, in this order, each starting at a
64-byte aligned offset; the record is zero-padded up to a multiple of 4096 bytes (see docs/expert-format.md):

    gate_q, up_q, down_q, gate_s, up_s, down_s

Encodings (all multi-byte values little-endian):

* ``int8``: ``*_q`` int8 [rows, cols]; ``*_s`` float32 [rows]; w[r, c] = q[r, c] * s[r].
* ``int4g32``: ``*_q`` uint8 [rows, cols // 2], two signed 4-bit values per byte,
  byte = (q[2j] + 8) | ((q[2j + 1] + 8) << 4) (low nibble = even column); ``*_s`` float32 [rows, cols // 32];
  w[r, c] = q[r, c] * s[r, c // 32], q in [-8, 7].

* ``exl3`` (EXL3 trellis, moetier.bytes.exl3): nine sections, the three trellises first so that their bytes are one
  VRAM slot image in exllamav3's native tile layout, then the sign/scale vectors:
  ``gate_trellis``, ``up_trellis`` int16 [H/16, F/16, 16K], ``down_trellis`` int16 [F/16, H/16, 16K],
  ``gate_suh``, ``up_suh`` fp16 [H], ``gate_svh``, ``up_svh`` fp16 [F], ``down_suh`` fp16 [F], ``down_svh`` fp16 [H].
  The layout carries what decoding needs beside the bytes: ``bits`` (K, one for all three linears), ``codebook``
  ("3inst", "mcg" or "mul1") and ``act_limit`` (the SwiGLU clamp; 0 = none). H and F must be multiples of 128.

Everything here is plain NumPy; it is the ground truth the backends are checked against.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

ENCODINGS = ("int8", "int4g32")     # the dense quantized encodings (make_expert, pack_expert, the int kernels)
EXL3 = "exl3"
RECORD_KINDS = ENCODINGS + (EXL3,)  # every encoding a record (and a store) can hold
SECTION_ORDER = ("gate_q", "up_q", "down_q", "gate_s", "up_s", "down_s")
EXL3_SECTION_ORDER = ("gate_trellis", "up_trellis", "down_trellis", "gate_suh", "gate_svh", "up_suh", "up_svh",
                      "down_suh", "down_svh")
EXL3_ALIGN = 128                    # the Hadamard block: H and F of an EXL3 expert are multiples of it
SECTION_ALIGN = 64
RECORD_ALIGN = 4096
GROUP = 32
FORMAT = "moetier.expert/1"

_QMAX = {"int8": 127, "int4g32": 7}


def _align(n: int, a: int) -> int:
    return (n + a - 1) // a * a


def act_range(n: int) -> int:
    """The kernels' activation quantization range for a dot of n terms: int32 sums of |q_w| <= 128 times n
    activations in [-range, range] cannot overflow. Every lane (cpu, cuda, sycl) uses this one value, which is what
    keeps their results bit-identical."""
    return int(min(32767, (2**31 - 1) // (128 * n)))


def section_offsets(lay) -> list[int]:
    """Byte offsets of the record's sections in its order (SECTION_ORDER, or EXL3_SECTION_ORDER for exl3: the
    kernels' argument order)."""
    return [int(lay.sections[s][0]) for s in lay.order]


@dataclass(frozen=True)
class ExpertLayout:
    """Where each section of one expert record lives. Build with layout() or ExpertLayout.from_json()."""

    hidden: int
    ffn: int
    encoding: str
    sections: dict  # name -> (offset, nbytes, dtype str, shape tuple)
    record_bytes: int  # multiple of 4096
    weight_bytes: int  # bytes of quantized weights + scales read per expert compute
    bits: int = 0              # exl3: K, bits per weight of all three linears
    codebook: str = ""         # exl3: "3inst", "mcg" or "mul1"
    act_limit: float = 0.0     # exl3: SwiGLU clamp (silu(g) <= limit, |u| <= limit); 0 = none

    def __hash__(self) -> int:  # sections is a dict; the geometry determines everything else
        return hash((self.hidden, self.ffn, self.encoding, self.bits, self.codebook, self.act_limit))

    @property
    def order(self) -> tuple:
        """The section names in record order."""
        return EXL3_SECTION_ORDER if self.encoding == EXL3 else SECTION_ORDER

    def to_json(self) -> dict:
        """JSON-ready dict for the model record's "store" section."""
        exl3 = {"bits": self.bits, "codebook": self.codebook, "act_limit": self.act_limit} \
            if self.encoding == EXL3 else {}
        return {
            "format": FORMAT,
            "hidden": self.hidden,
            "ffn": self.ffn,
            "encoding": self.encoding,
            **exl3,
            "section_align": SECTION_ALIGN,
            "record_bytes": self.record_bytes,
            "weight_bytes": self.weight_bytes,
            "sections": {
                name: {"offset": off, "nbytes": nb, "dtype": dt, "shape": list(shape)}
                for name, (off, nb, dt, shape) in self.sections.items()
            },
        }

    @classmethod
    def from_json(cls, d) -> "ExpertLayout":
        """Validate a to_json() dict; raises ValueError naming the first bad field."""
        if not isinstance(d, dict):
            raise ValueError(f"expert layout: expected an object, got {type(d).__name__}")
        if "format" in d and d["format"] != FORMAT:
            raise ValueError(f"expert layout field 'format': expected {FORMAT!r}, got {d['format']!r}")
        for f in ("hidden", "ffn", "encoding"):
            if f not in d:
                raise ValueError(f"expert layout field {f!r}: missing")
        for f in ("hidden", "ffn"):
            if not isinstance(d[f], int) or isinstance(d[f], bool):
                raise ValueError(f"expert layout field {f!r}: expected an integer, got {d[f]!r}")
        try:
            extra = {f: d.get(f) for f in ("bits", "codebook", "act_limit") if f in d} if d["encoding"] == EXL3 else {}
            lay = layout(d["hidden"], d["ffn"], d["encoding"], **extra)
        except ValueError as e:
            raise ValueError(f"expert layout: {e}") from None
        for f in ("record_bytes", "weight_bytes"):
            if f in d and d[f] != getattr(lay, f):
                raise ValueError(f"expert layout field {f!r}: expected {getattr(lay, f)}, got {d[f]!r}")
        if "section_align" in d and d["section_align"] != SECTION_ALIGN:
            raise ValueError(f"expert layout field 'section_align': expected {SECTION_ALIGN}, got {d['section_align']!r}")
        if "sections" in d:
            _check_sections(lay, d["sections"])
        return lay


def _check_sections(lay: ExpertLayout, secs) -> None:
    """A layout dict's ``sections`` are exactly the ones ``lay`` lays out; ValueError names the first that is not."""
    if not isinstance(secs, dict) or set(secs) != set(lay.order):
        raise ValueError(f"expert layout field 'sections': expected exactly {list(lay.order)}")
    for name, (off, nb, dt, shape) in lay.sections.items():
        s = secs[name]
        want = {"offset": off, "nbytes": nb, "dtype": dt, "shape": list(shape)}
        for k, v in want.items():
            got = s.get(k) if isinstance(s, dict) else None
            if k == "shape" and isinstance(got, (list, tuple)):
                got = list(got)
            if got != v:
                raise ValueError(f"expert layout field 'sections.{name}.{k}': expected {v!r}, got {got!r}")


def _sections(spec: dict, order) -> tuple[dict, int, int]:
    """(sections, record_bytes, weight_bytes) of sections laid out in ``order`` at SECTION_ALIGN."""
    sections = {}
    off = 0
    total = 0
    for name in order:
        dt, shape = spec[name]
        nb = int(np.prod(shape)) * np.dtype(dt).itemsize
        off = _align(off, SECTION_ALIGN)
        sections[name] = (off, nb, dt, tuple(int(x) for x in shape))
        off += nb
        total += nb
    return sections, _align(off, RECORD_ALIGN), total


def _exl3_layout(H: int, F: int, bits, codebook, act_limit) -> ExpertLayout:
    from moetier.bytes import exl3

    if not isinstance(bits, (int, np.integer)) or isinstance(bits, bool) or bits not in exl3.KS:
        raise ValueError(f"bits: expected an integer K in 1..8 for exl3, got {bits!r}")
    if codebook not in exl3.CODEBOOKS:
        raise ValueError(f"codebook: expected one of {list(exl3.CODEBOOKS)} for exl3, got {codebook!r}")
    if not isinstance(act_limit, (int, float)) or isinstance(act_limit, bool) or not act_limit >= 0:
        raise ValueError(f"act_limit: expected a number >= 0 (0 = no clamp), got {act_limit!r}")
    K, T = int(bits), exl3.TILE
    spec = {"gate_trellis": ("int16", (H // T, F // T, 16 * K)), "up_trellis": ("int16", (H // T, F // T, 16 * K)),
            "down_trellis": ("int16", (F // T, H // T, 16 * K)),
            "gate_suh": ("float16", (H,)), "gate_svh": ("float16", (F,)), "up_suh": ("float16", (H,)),
            "up_svh": ("float16", (F,)), "down_suh": ("float16", (F,)), "down_svh": ("float16", (H,))}
    sections, rb, wb = _sections(spec, EXL3_SECTION_ORDER)
    return ExpertLayout(H, F, EXL3, sections, rb, wb, K, codebook, float(act_limit))


def layout(hidden: int, ffn: int, encoding: str, bits=None, codebook=None, act_limit=0.0) -> ExpertLayout:
    """The record layout for one expert of this geometry; hidden and ffn must be positive multiples of 32 (of 128
    for exl3, which also needs ``bits`` and ``codebook``; ``act_limit`` is its SwiGLU clamp)."""
    if encoding not in RECORD_KINDS:
        raise ValueError(f"encoding: expected one of {list(RECORD_KINDS)}, got {encoding!r}")
    mult = EXL3_ALIGN if encoding == EXL3 else GROUP
    for name, v in (("hidden", hidden), ("ffn", ffn)):
        if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v <= 0 or v % mult:
            raise ValueError(f"{name}: expected a positive multiple of {mult}, got {v!r}")
    H, F = int(hidden), int(ffn)
    if encoding == EXL3:
        return _exl3_layout(H, F, bits, codebook, act_limit)
    if bits is not None or codebook is not None:
        raise ValueError(f"bits/codebook: only an exl3 layout takes them (encoding {encoding!r})")
    if encoding == "int8":
        q = {"gate_q": ("int8", (F, H)), "up_q": ("int8", (F, H)), "down_q": ("int8", (H, F))}
        s = {"gate_s": ("float32", (F,)), "up_s": ("float32", (F,)), "down_s": ("float32", (H,))}
    else:
        q = {"gate_q": ("uint8", (F, H // 2)), "up_q": ("uint8", (F, H // 2)), "down_q": ("uint8", (H, F // 2))}
        s = {"gate_s": ("float32", (F, H // GROUP)), "up_s": ("float32", (F, H // GROUP)),
             "down_s": ("float32", (H, F // GROUP))}
    sections, rb, wb = _sections({**q, **s}, SECTION_ORDER)
    return ExpertLayout(H, F, encoding, sections, rb, wb)


def _as_u8(lay: ExpertLayout, buf) -> np.ndarray:
    if isinstance(buf, np.ndarray):
        a = buf if buf.dtype == np.uint8 else buf.view(np.uint8)
        a = a.reshape(-1)  # a view for contiguous arrays
    else:
        a = np.frombuffer(buf, dtype=np.uint8)
    if a.size < lay.record_bytes:
        raise ValueError(f"expert buffer: expected at least {lay.record_bytes} bytes, got {a.size}")
    return a


def views(lay: ExpertLayout, buf) -> dict:
    """Zero-copy numpy views of each section over buf (bytes, bytearray, memoryview, mmap or a uint8 array)."""
    a = _as_u8(lay, buf)
    out = {}
    for name, (off, nb, dt, shape) in lay.sections.items():
        out[name] = a[off:off + nb].view(np.dtype(dt).newbyteorder("<")).reshape(shape)
    return out


def _unpack_int4(p: np.ndarray) -> np.ndarray:
    """uint8 [rows, cols/2] -> int8 [rows, cols] with values in [-8, 7]."""
    lo = (p & 0x0F).astype(np.int8) - 8
    hi = (p >> 4).astype(np.int8) - 8
    out = np.empty((p.shape[0], p.shape[1] * 2), dtype=np.int8)
    out[:, 0::2] = lo
    out[:, 1::2] = hi
    return out


def _pack_int4(q: np.ndarray) -> np.ndarray:
    u = (q.astype(np.int16) + 8).astype(np.uint8)
    return (u[:, 0::2] | (u[:, 1::2] << 4)).astype(np.uint8)


def quantize_matrix(w: np.ndarray, encoding: str):
    """Round-to-nearest quantization of one [rows, cols] matrix -> (q, scales) in the record's section form."""
    w = np.asarray(w, dtype=np.float64)
    qmax = _QMAX[encoding]
    if encoding == "int8":
        amax = np.abs(w).max(axis=1)
        scale = (amax / qmax).astype(np.float32)
        s = scale.astype(np.float64)[:, None]
    else:
        r, c = w.shape
        amax = np.abs(w.reshape(r, c // GROUP, GROUP)).max(axis=2)
        scale = (amax / qmax).astype(np.float32)
        s = np.repeat(scale.astype(np.float64), GROUP, axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.where(s > 0, np.rint(w / np.where(s > 0, s, 1.0)), 0.0)
    q = np.clip(q, -qmax - (1 if encoding == "int4g32" else 0), qmax).astype(np.int8)
    if encoding == "int4g32":
        return _pack_int4(q), scale
    return q, scale


def pack_expert(lay: ExpertLayout, gate: np.ndarray, up: np.ndarray, down: np.ndarray) -> bytes:
    """Quantize dense float weights (gate, up: [F, H]; down: [H, F]) into one record (len == record_bytes)."""
    H, F = lay.hidden, lay.ffn
    for name, w, shape in (("gate", gate, (F, H)), ("up", up, (F, H)), ("down", down, (H, F))):
        if np.shape(w) != shape:
            raise ValueError(f"{name}: expected shape {shape}, got {np.shape(w)}")
    buf = np.zeros(lay.record_bytes, dtype=np.uint8)
    v = views(lay, buf)
    for name, w in (("gate", gate), ("up", up), ("down", down)):
        q, s = quantize_matrix(w, lay.encoding)
        v[name + "_q"][...] = q.view(v[name + "_q"].dtype)
        v[name + "_s"][...] = s
    return buf.tobytes()


def make_weights(lay: ExpertLayout, key: int, seed: int) -> dict:
    """The unquantized float64 weights behind make_expert(lay, key, seed): N(0, 1/sqrt(fan_in)) each."""
    rng = np.random.default_rng([int(seed) & 0xFFFFFFFF, int(key) & 0xFFFFFFFF, lay.hidden, lay.ffn])
    H, F = lay.hidden, lay.ffn
    return {
        "gate": rng.standard_normal((F, H)) / np.sqrt(H),
        "up": rng.standard_normal((F, H)) / np.sqrt(H),
        "down": rng.standard_normal((H, F)) / np.sqrt(F),
    }


def make_expert(lay: ExpertLayout, key: int, seed: int) -> bytes:
    """A deterministic synthetic expert record (len == record_bytes, padding zero) for tests and benchmarks; for exl3
    a random expert (synth_exl3.random_expert: random trellises, scales that keep activations of order one)."""
    if lay.encoding == EXL3:
        from moetier.bytes import synth_exl3
        rng = np.random.default_rng([int(seed) & 0xFFFFFFFF, int(key) & 0xFFFFFFFF, lay.hidden, lay.ffn, lay.bits])
        return pack_exl3(lay, synth_exl3.random_expert(rng, lay.hidden, lay.ffn, lay.bits, lay.codebook))
    w = make_weights(lay, key, seed)
    return pack_expert(lay, w["gate"], w["up"], w["down"])


def pack_exl3(lay: ExpertLayout, ex) -> bytes:
    """One exl3 record (len == record_bytes) from an exl3.Exl3Expert whose shapes, K and codebook match lay."""
    if lay.encoding != EXL3:
        raise ValueError(f"pack_exl3: layout encoding {lay.encoding!r}, expected {EXL3!r}")
    buf = np.zeros(lay.record_bytes, dtype=np.uint8)
    v = views(lay, buf)
    for p in ("gate", "up", "down"):
        lin = getattr(ex, p)
        if lin.codebook != lay.codebook:
            raise ValueError(f"{p}: codebook {lin.codebook!r}, the layout's is {lay.codebook!r}")
        for part in ("trellis", "suh", "svh"):
            a, dst = getattr(lin, part), v[f"{p}_{part}"]
            if a.shape != dst.shape or a.dtype != dst.dtype:
                raise ValueError(f"{p}.{part}: {a.dtype} {list(a.shape)}, expected {dst.dtype} {list(dst.shape)}")
            dst[...] = a
    return buf.tobytes()


def exl3_expert(lay: ExpertLayout, buf):
    """The exl3.Exl3Expert a record holds (zero-copy views of its trellises and scales)."""
    from moetier.bytes import exl3
    v = views(lay, buf)
    return exl3.Exl3Expert(*(exl3.Exl3Linear(v[f"{p}_trellis"], v[f"{p}_suh"], v[f"{p}_svh"], lay.codebook)
                             for p in ("gate", "up", "down")))


def dequant(lay: ExpertLayout, buf) -> dict:
    """Dense float64 gate, up ([F, H]) and down ([H, F]) matrices of one record."""
    if lay.encoding == EXL3:
        from moetier.bytes import exl3
        ex = exl3_expert(lay, buf)
        return {p: exl3.reconstruct(getattr(ex, p)).T for p in ("gate", "up", "down")}
    v = views(lay, buf)
    out = {}
    for name in ("gate", "up", "down"):
        q, s = v[name + "_q"], v[name + "_s"].astype(np.float64)
        if lay.encoding == "int8":
            out[name] = q.astype(np.float64) * s[:, None]
        else:
            out[name] = _unpack_int4(q).astype(np.float64) * np.repeat(s, GROUP, axis=1)
    return out


def silu(z):
    return z / (1.0 + np.exp(-z))


def reference(lay: ExpertLayout, buf, x) -> np.ndarray:
    """Float64 expert output for token rows x [rows, H] (or [H]) -> [rows, H] (exl3: exl3.expert_forward with the
    layout's act_limit, no fp16 rounding)."""
    x = np.atleast_2d(np.asarray(x, dtype=np.float64))
    if x.shape[1] != lay.hidden:
        raise ValueError(f"x: expected [rows, {lay.hidden}], got {list(x.shape)}")
    if lay.encoding == EXL3:
        from moetier.bytes import exl3
        return exl3.expert_forward(x, exl3_expert(lay, buf), lay.act_limit or None)
    w = dequant(lay, buf)
    g = x @ w["gate"].T
    u = x @ w["up"].T
    return (silu(g) * u) @ w["down"].T


def moe_reference(lays_bufs_by_key: dict, picks, x) -> np.ndarray:
    """Routed MoE output: row i = sum over picks[i] of router_weight * expert_key(x[i]).

    lays_bufs_by_key: key -> (ExpertLayout, buffer); picks: per row an iterable of (key, router_weight).
    """
    x = np.atleast_2d(np.asarray(x, dtype=np.float64))
    if len(picks) != x.shape[0]:
        raise ValueError(f"picks: expected {x.shape[0]} rows, got {len(picks)}")
    out = np.zeros_like(x)
    for i, row in enumerate(picks):
        for key, wt in row:
            if key not in lays_bufs_by_key:
                raise ValueError(f"picks[{i}]: unknown expert key {key!r}")
            lay, buf = lays_bufs_by_key[key]
            out[i] += float(wt) * reference(lay, buf, x[i:i + 1])[0]
    return out
