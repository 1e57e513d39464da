"""The exllamav3 adapter's expert records: one routed expert's bytes as the engine's kernels address them.

Contract
--------
A record holds one expert's nine EXL3 tensors, in this order, each at a 256-byte aligned offset, the record
zero-padded to a multiple of 4096 bytes (O_DIRECT):

    gate.trellis, up.trellis, down.trellis, gate.suh, gate.svh, up.suh, up.svh, down.suh, down.svh

Trellises are int16 [k/16, n/16, 16K] in exllamav3's native tile layout, suh/svh fp16. For GLM-5.3-Flash
(H 4096, I 2048, K 3) the three trellises are the 9,437,184-byte VRAM-slot image (gate@0, up@3,145,728,
down@6,291,456) and the record is 9,474,048 bytes. The engine's pointer-table row of a key is the slot's address
plus these section offsets (``RecordLayout.addresses``).

``pack(checkpoint_dir, out_dir)`` writes ``experts.bin`` (record of key ``ordinal * experts + e`` at
``key * record_bytes``) and ``manifest.json`` (geometry, sections, the checkpoint module key of each MoE ordinal,
one xxh3-128 digest per record, the store's checksum) into a temporary directory renamed onto ``out_dir`` when
complete. It reads the checkpoint tensor by tensor (safetensors' lazy reader), so memory stays at one record.
``open_records(out_dir)`` gives what the transport's Reader and the runtime need (``data_path``, ``record_bytes``,
``nrecords``, ``offset``, ``digest``, ``layout``). Malformed input raises UserError naming the tensor or field.
"""
from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from moetier.bytes import exl3
from moetier.bytes.store import digest
from moetier.errors import UserError

FORMAT = "moetier-exllamav3-records/1"
SECTIONS = ("gate.trellis", "up.trellis", "down.trellis", "gate.suh", "gate.svh", "up.suh", "up.svh", "down.suh",
            "down.svh")
PROJ_NAME = {"gate": "gate_proj", "up": "up_proj", "down": "down_proj"}
ALIGN = 256
RECORD_ALIGN = 4096


def _up(n: int, a: int) -> int:
    return (n + a - 1) // a * a


@dataclass(frozen=True)
class RecordLayout:
    hidden: int
    ffn: int
    K: int
    codebook: str = "mul1"
    encoding: str = "exl3"

    def _shape(self, section: str):
        proj, part = section.split(".")
        k, n = (self.ffn, self.hidden) if proj == "down" else (self.hidden, self.ffn)
        if part == "trellis":
            return (k // 16, n // 16, 16 * self.K), np.int16
        return ((k,) if part == "suh" else (n,)), np.float16

    @property
    def sections(self) -> dict:
        """section -> (offset, nbytes, dtype, shape)."""
        out, off = {}, 0
        for s in SECTIONS:
            shape, dt = self._shape(s)
            nb = int(np.prod(shape)) * np.dtype(dt).itemsize
            out[s] = (off, nb, dt, shape)
            off = _up(off + nb, ALIGN)
        return out

    @property
    def record_bytes(self) -> int:
        off, nb, _, _ = self.sections[SECTIONS[-1]]
        return _up(off + nb, RECORD_ALIGN)

    @property
    def weight_bytes(self) -> int:
        return sum(nb for _, nb, _, _ in self.sections.values())

    def expert(self, buf) -> exl3.Exl3Expert:
        """The expert whose record is ``buf`` (uint8, at least record_bytes), as views (no copy)."""
        buf = np.asarray(buf).view(np.uint8)
        views = {s: buf[o:o + nb].view(dt).reshape(shape) for s, (o, nb, dt, shape) in self.sections.items()}
        lin = {p: exl3.Exl3Linear(views[p + ".trellis"], views[p + ".suh"], views[p + ".svh"], self.codebook)
               for p in ("gate", "up", "down")}
        return exl3.Exl3Expert(lin["gate"], lin["up"], lin["down"])

    def addresses(self, base: int) -> dict:
        """section -> address of that tensor in a record image at ``base`` (the engine's table rows)."""
        return {s: base + o for s, (o, _, _, _) in self.sections.items()}

    def to_json(self) -> dict:
        return {"hidden": self.hidden, "ffn": self.ffn, "K": self.K, "codebook": self.codebook,
                "encoding": self.encoding, "record_bytes": self.record_bytes,
                "sections": {s: {"offset": o, "nbytes": nb, "dtype": np.dtype(dt).name, "shape": list(shape)}
                             for s, (o, nb, dt, shape) in self.sections.items()}}


class Records:
    """An opened record store (what moetier.bytes.transport.Reader and moetier.run.runtime read)."""

    def __init__(self, path, manifest: dict):
        self.path = str(path)
        self.manifest = manifest
        g = manifest["geometry"]
        self.layout = RecordLayout(g["hidden"], g["ffn"], g["K"], g.get("codebook", "mul1"))
        self.layers, self.experts = int(g["layers"]), int(g["experts"])
        self.nrecords = self.layers * self.experts
        self.record_bytes = self.layout.record_bytes
        self.data_path = os.path.join(self.path, "experts.bin")
        self.module_keys = list(manifest["module_keys"])
        self._digests = [bytes.fromhex(h) for h in manifest["digests"]]

    def offset(self, key: int) -> int:
        return int(key) * self.record_bytes

    def digest(self, key: int) -> bytes:
        return self._digests[int(key)]

    def read(self, key: int) -> np.ndarray:
        """The record bytes as stored (a plain read; the runtime's reads go through the transport)."""
        with open(self.data_path, "rb") as f:
            f.seek(self.offset(key))
            return np.frombuffer(f.read(self.record_bytes), np.uint8)


def _tensor(f, name: str, dtype, shape):
    if name not in f.keys():
        raise UserError(f"checkpoint: tensor {name!r} missing")
    t = f.get_tensor(name)
    if t.dtype != np.dtype(dtype) or tuple(t.shape) != tuple(shape):
        raise UserError(f"checkpoint: tensor {name!r} is {t.dtype} {list(t.shape)}, expected "
                        f"{np.dtype(dtype).name} {list(shape)}")
    return t


def pack(checkpoint_dir, out_dir, module_keys: list, *, experts: int, hidden: int, ffn: int, K: int) -> Records:
    """Pack the routed experts of the MoE blocks ``module_keys`` (checkpoint module key per MoE ordinal)."""
    from safetensors import safe_open
    lay = RecordLayout(hidden, ffn, K)
    files = sorted(Path(checkpoint_dir).glob("*.safetensors"))
    if not files:
        raise UserError(f"checkpoint {checkpoint_dir}: no *.safetensors files")
    out = Path(out_dir).absolute()
    tmp = out.with_name(out.name + f".tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    handles = [safe_open(str(p), framework="numpy") for p in files]
    where = {}
    for h in handles:
        for name in h.keys():
            where[name] = h
    digests = []
    try:
        with open(tmp / "experts.bin", "wb") as data:
            rec = np.zeros(lay.record_bytes, np.uint8)
            for mk in module_keys:
                for e in range(experts):
                    rec[:] = 0
                    for s, (o, nb, dt, shape) in lay.sections.items():
                        proj, part = s.split(".")
                        name = f"{mk}.experts.{e}.{PROJ_NAME[proj]}.{part}"
                        if name not in where:
                            raise UserError(f"checkpoint {checkpoint_dir}: tensor {name!r} missing")
                        t = _tensor(where[name], name, dt, shape)
                        rec[o:o + nb] = np.ascontiguousarray(t).view(np.uint8).reshape(-1)
                    data.write(rec.tobytes())
                    digests.append(digest(rec).hex())
            data.flush()
            os.fsync(data.fileno())
        manifest = {"format": FORMAT, "checksum": "xxh3-128",
                    "geometry": {"layers": len(module_keys), "experts": experts, "hidden": hidden, "ffn": ffn,
                                 "K": K, "codebook": "mul1"},
                    "layout": lay.to_json(), "module_keys": list(module_keys), "digests": digests,
                    "source": os.path.abspath(checkpoint_dir)}
        with open(tmp / "manifest.json", "w") as f:
            json.dump(manifest, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return Records(out, manifest)


def open_records(path) -> Records:
    p = os.path.join(path, "manifest.json")
    try:
        with open(p) as f:
            manifest = json.load(f)
    except (OSError, ValueError) as e:
        raise UserError(f"{p}: not a readable exllamav3 record manifest ({e})") from None
    if manifest.get("format") != FORMAT:
        raise UserError(f"{p}: field 'format' is {manifest.get('format')!r}, expected {FORMAT!r}")
    return Records(path, manifest)
