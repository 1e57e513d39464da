"""Reading the routed experts of an EXL3 checkpoint directory, one record at a time.

Contract: ``open_exl3(dir)`` reads ``config.json`` (moetier.bytes.hf_config for the geometry), the optional
``quantization_config.json`` and the header of every ``*.safetensors`` file, finds each MoE layer's routed experts
(``<prefix>.mlp.experts.{e}.{gate,up,down}_proj.{trellis,suh,svh[,mul1|mcg]}``), maps the MoE ordinal to the
checkpoint layer (trunk MoE layers in order, skipping dense first layers; then the MTP layers: GLM's
``model.language_model.layers.{num_hidden_layers}``, Qwen's ``mtp.layers.{i}``) and checks every expert tensor's
dtype and shape against the config, one bitrate K and one codebook for all of them. Any problem raises UserError with
one line naming the file and the tensor or field. ``Exl3Checkpoint.fill(key, buf)`` reads record ``key`` (ordinal
* experts + expert) straight into ``buf`` with preadv, so packing holds one record at a time whatever the checkpoint
size.

The safetensors format is an 8-byte little-endian header length, a JSON header (name -> dtype, shape,
data_offsets relative to the end of the header) and the data. The header is parsed here rather than through the
``safetensors`` package because its reader maps whole files, and every page it touches counts toward the process's
resident memory until the file is closed (a 200 MB file read tensor by tensor left 224 MB resident); the tests check
this parser against ``safetensors.safe_open``.
"""
from __future__ import annotations

import glob
import os
import re
from dataclasses import dataclass
from functools import partial

import numpy as np

from moetier import strictjson
from moetier.bytes.teardown import close_all
from moetier.errors import UserError

HEADER_MAX = 100 * 1024 * 1024
ITEMSIZE = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
            "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8}
PROJS = ("gate", "up", "down")
EXPERT_RE = re.compile(r"^(?P<mlp>.+\.mlp)\.experts\.(?P<e>\d+)\.(?P<proj>gate|up|down)_proj\.(?P<part>[A-Za-z0-9_]+)$")
FUSED_RE = re.compile(r"^(?P<mlp>.+\.mlp)\.experts\.(gate_up_proj|down_proj)(\..*)?$")
TRUNK_RE = re.compile(r"^(?:model\.language_model|model|language_model\.model)\.layers\.(\d+)\.mlp$")
MTP_RE = re.compile(r"^(?:model\.)?mtp\.layers\.(\d+)\.mlp$")
CODEBOOK_PARTS = {"mul1": "mul1", "mcg": "mcg"}


@dataclass(frozen=True)
class TensorInfo:
    path: str
    dtype: str
    shape: tuple
    start: int      # absolute byte offset in the file
    nbytes: int


def read_header(path: str) -> dict:
    """{name: TensorInfo} of one safetensors file; UserError naming the file (and tensor) if malformed."""
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise UserError(f"{path}: not a safetensors file (shorter than its 8-byte header length)")
            n = int.from_bytes(head, "little")
            if n <= 0 or n > HEADER_MAX or 8 + n > size:
                raise UserError(f"{path}: not a safetensors file (header length {n} for a {size}-byte file)")
            raw = f.read(n)
    except OSError as e:
        raise UserError(f"{path}: cannot read ({e.strerror})") from None
    hdr = strictjson.loads(raw, f"{path}: safetensors header")
    if not isinstance(hdr, dict):
        raise UserError(f"{path}: safetensors header is not a JSON object")
    base = 8 + n
    out = {}
    for name, d in hdr.items():
        if name == "__metadata__":
            continue
        if not isinstance(d, dict):
            raise UserError(f"{path}: tensor {name!r}: header entry is not an object")
        dt, shape, offs = d.get("dtype"), d.get("shape"), d.get("data_offsets")
        if dt not in ITEMSIZE:
            raise UserError(f"{path}: tensor {name!r}: unknown dtype {dt!r}")
        if not isinstance(shape, list) or not all(isinstance(x, int) and x >= 0 for x in shape):
            raise UserError(f"{path}: tensor {name!r}: shape {shape!r} is not a list of sizes")
        if (not isinstance(offs, list) or len(offs) != 2 or not all(isinstance(x, int) for x in offs)
                or not 0 <= offs[0] <= offs[1] or base + offs[1] > size):
            raise UserError(f"{path}: tensor {name!r}: data_offsets {offs!r} outside the file's {size - base} "
                            "data bytes")
        want = int(np.prod(shape, dtype=np.int64)) * ITEMSIZE[dt]
        if offs[1] - offs[0] != want:
            raise UserError(f"{path}: tensor {name!r}: {offs[1] - offs[0]} data bytes for {dt} {shape} "
                            f"(expected {want})")
        out[name] = TensorInfo(path, dt, tuple(shape), base + offs[0], want)
    return out


class Exl3Checkpoint:
    """An opened EXL3 checkpoint: geometry, the MoE ordinal -> module prefix map, the expert layout, and fill()."""

    def __init__(self, path, cfg, geo, prefixes, trunk, tensors, layout):
        self.path, self.config, self.geometry = path, cfg, geo
        self.prefixes = prefixes          # module prefix ("...mlp") of each MoE ordinal: trunk, then MTP
        self.trunk_layers = trunk
        self.mtp_layers = len(prefixes) - trunk
        self.tensors = tensors            # name -> TensorInfo
        self.layout = layout
        self.experts = geo.experts
        self._fds: dict[str, int] = {}

    def names(self, ordinal: int, e: int) -> dict:
        """Section name (layout order) -> tensor name of one routed expert."""
        mlp = self.prefixes[ordinal]
        return {f"{p}_{part}": f"{mlp}.experts.{e}.{p}_proj.{part}" for p in PROJS for part in ("trellis", "suh", "svh")}

    def fill(self, key: int, buf: np.ndarray) -> None:
        """Read record ``key`` into ``buf`` (uint8, record_bytes; padding left as is)."""
        ordinal, e = divmod(int(key), self.experts)
        for sec, name in self.names(ordinal, e).items():
            off, nb = self.layout.sections[sec][:2]
            ti = self.tensors[name]
            fd = self._fds.get(ti.path)
            if fd is None:
                fd = self._fds[ti.path] = os.open(ti.path, os.O_RDONLY)
            got = os.preadv(fd, [memoryview(buf[off:off + nb])], ti.start)
            if got != nb:
                raise UserError(f"{ti.path}: tensor {name!r}: read {got} of {nb} bytes (file truncated?)")

    def close(self) -> None:
        """Close every shard file read so far; one that fails to close keeps none of the others open."""
        fds, self._fds = list(self._fds.values()), {}
        close_all(partial(os.close, fd) for fd in fds)

    def __enter__(self):
        return self

    def __exit__(self, *a):
        self.close()


def _ordinals(cfg_path: str, geo, groups: dict) -> tuple[list, int]:
    """(module prefix per MoE ordinal, trunk count) from the expert groups found, checked against the config."""
    trunk, mtp = {}, {}
    for mlp in groups:
        m, q = TRUNK_RE.match(mlp), MTP_RE.match(mlp)
        if m:
            n = int(m.group(1))
            (mtp if n >= geo.layers_total else trunk)[n] = mlp
        elif q:
            mtp[int(q.group(1)) + 10**6] = mlp
        else:
            e = next(iter(groups[mlp]))
            raise UserError(f"tensor {e!r}: routed experts under an unsupported module prefix {mlp!r} "
                            "(expected <model>.layers.{n}.mlp or mtp.layers.{i}.mlp)")
    want = list(geo.moe_layers)
    for n in want:
        if n not in trunk:
            near = next(iter(trunk.values()), "model.language_model.layers.{n}.mlp")
            name = re.sub(r"layers\.\d+\.mlp$", f"layers.{n}.mlp", near) + ".experts.0.gate_proj.trellis"
            raise UserError(f"tensor {name!r}: missing (config.json: layer {n} is a MoE layer, "
                            f"{geo.fields.get('moe_layers')})")
    for n, mlp in trunk.items():
        if n not in want:
            raise UserError(f"tensor {next(iter(groups[mlp]))!r}: routed experts in layer {n}, which {cfg_path} "
                            f"makes a dense layer ({geo.fields.get('moe_layers')})")
    if len(mtp) != geo.mtp_layers:
        what = ", ".join(sorted(mtp.values())) or "none"
        raise UserError(f"{cfg_path}: field 'num_nextn_predict_layers'/'mtp_num_hidden_layers' says "
                        f"{geo.mtp_layers} MTP layers, the checkpoint has routed experts in {len(mtp)} ({what})")
    return [trunk[n] for n in want] + [mtp[k] for k in sorted(mtp)], len(want)


def _exl3_config(d: str):
    """(config.json path, config, geometry) of an EXL3 checkpoint directory; refuses a non-EXL3 config."""
    from moetier.bytes import hf_config

    cfg_path = os.path.join(d, "config.json")
    cfg = hf_config.load_config(d)
    geo = hf_config.geometry(cfg, cfg_path)
    q = cfg.get("quantization_config")
    if not isinstance(q, dict) or q.get("quant_method") != "exl3":
        got = q.get("quant_method") if isinstance(q, dict) else None
        raise UserError(f"{cfg_path}: field 'quantization_config.quant_method' expected 'exl3', got {got!r} "
                        "(only EXL3 checkpoints can be packed; `moetier model import` reads any MoE config)")
    qpath = os.path.join(d, "quantization_config.json")
    if os.path.exists(qpath):
        hf_config.load_json_object(qpath, "quantization_config.json")
    return cfg_path, cfg, geo


def _read_tensors(d: str) -> dict:
    """Tensor name -> TensorInfo over every *.safetensors header in d (a name in two files is refused)."""
    files = sorted(glob.glob(os.path.join(d, "*.safetensors")))
    if not files:
        raise UserError(f"{d}: no *.safetensors files")
    tensors: dict[str, TensorInfo] = {}
    for f in files:
        for name, ti in read_header(f).items():
            if name in tensors:
                raise UserError(f"{f}: tensor {name!r} also in {tensors[name].path}")
            tensors[name] = ti
    return tensors


def _expert_groups(d: str, tensors: dict) -> dict:
    """Module prefix ("...mlp") -> {tensor name: EXPERT_RE match} of the routed expert tensors."""
    groups: dict[str, dict] = {}
    for name in tensors:
        if FUSED_RE.match(name):
            raise UserError(f"tensor {name!r}: fused expert weights (an unquantized checkpoint), not EXL3 experts")
        m = EXPERT_RE.match(name)
        if m:
            groups.setdefault(m.group("mlp"), {})[name] = m
    if not groups:
        raise UserError(f"{d}: no routed expert tensors (<prefix>.mlp.experts.{{e}}.gate_proj.trellis ...)")
    return groups


def _check_parts(group: dict, geo) -> None:
    """Every expert tensor of one MoE layer is a supported part of an expert the config has."""
    for name, m in group.items():
        part = m.group("part")
        if part in ("su", "sv"):
            raise UserError(f"tensor {name!r}: packed sign bitfields (old EXL3 checkpoints) are not supported")
        if part not in ("trellis", "suh", "svh", "mul1", "mcg"):
            raise UserError(f"tensor {name!r}: unsupported expert tensor part {part!r}")
        if int(m.group("e")) >= geo.experts:
            raise UserError(f"tensor {name!r}: expert {m.group('e')} beyond the {geo.experts} routed experts of "
                            f"config.json's '{geo.fields['experts']}'")


def _linear_bits(tensors: dict, d: str, base: str, k: int, n: int) -> int:
    """K of the linear ``base`` (a k x n EXL3 linear) after checking its trellis, suh and svh dtypes and shapes."""
    from moetier.bytes import exl3

    K = None
    for part, dt, shape in (("trellis", "I16", None), ("suh", "F16", (k,)), ("svh", "F16", (n,))):
        ti = tensors.get(f"{base}.{part}")
        if ti is None:
            raise UserError(f"tensor {base}.{part}: missing from {d}")
        if ti.dtype != dt:
            raise UserError(f"tensor {base}.{part}: dtype {ti.dtype}, expected {dt} ({ti.path})")
        if part == "trellis":
            s = ti.shape
            if len(s) != 3 or s[:2] != (k // 16, n // 16) or s[2] % 16 or s[2] // 16 not in exl3.KS:
                raise UserError(f"tensor {base}.trellis: shape {list(s)}, expected [{k // 16}, {n // 16}, "
                                f"16*K] with K in 1..8 for a {k} x {n} linear ({ti.path}; "
                                "half-integer rates are not supported)")
            K = s[2] // 16
        elif ti.shape != shape:
            raise UserError(f"tensor {base}.{part}: shape {list(ti.shape)}, expected {list(shape)} ({ti.path})")
    return K


def _store_format(d: str, tensors: dict, geo, groups: dict, prefixes: list) -> tuple[int, str]:
    """(K, codebook) shared by every routed expert linear (one bitrate and one codebook per store)."""
    K = codebook = None
    for mlp in prefixes:
        _check_parts(groups[mlp], geo)
        for e in range(geo.experts):
            for p in PROJS:
                k, n = (geo.hidden, geo.inter) if p != "down" else (geo.inter, geo.hidden)
                base = f"{mlp}.experts.{e}.{p}_proj"
                kb = _linear_bits(tensors, d, base, k, n)
                if K is None:
                    K = kb
                elif kb != K:
                    raise UserError(f"tensor {base}.trellis: K={kb} but other experts have K={K} "
                                    f"(one bitrate per store; mixed bitrates are not supported)")
                cb = "mul1" if f"{base}.mul1" in tensors else "mcg" if f"{base}.mcg" in tensors else "3inst"
                if codebook is None:
                    codebook = cb
                elif cb != codebook:
                    raise UserError(f"tensor {base}: codebook {cb} but other experts use {codebook} "
                                    "(one codebook per store)")
    return K, codebook


def open_exl3(path) -> Exl3Checkpoint:
    """Open and check an EXL3 checkpoint directory (see the module docstring)."""
    from moetier.bytes import expert

    d = os.path.abspath(os.fspath(path))
    if not os.path.isdir(d):
        raise UserError(f"--checkpoint {path}: not a directory")
    cfg_path, cfg, geo = _exl3_config(d)
    tensors = _read_tensors(d)
    groups = _expert_groups(d, tensors)
    prefixes, trunk = _ordinals(cfg_path, geo, groups)
    K, codebook = _store_format(d, tensors, geo, groups, prefixes)
    try:
        lay = expert.layout(geo.hidden, geo.inter, expert.EXL3, bits=K, codebook=codebook, act_limit=geo.act_limit)
    except ValueError as e:
        raise UserError(f"{cfg_path}: expert geometry {geo.hidden} x {geo.inter}: {e}") from None
    return Exl3Checkpoint(d, cfg, geo, prefixes, trunk, tensors, lay)
