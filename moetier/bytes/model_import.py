"""``moetier model import``: the model record of a model directory.

Contract: ``import_model(path, bits=None, rid=None)`` returns a model record (not yet written). An EXL3 checkpoint
with its safetensors gives a packable exl3 record (moetier.bytes.checkpoint reads K, codebook and shapes from the
tensor headers); any other MoE config.json (moetier.bytes.hf_config) gives a record of ``bits`` per weight. UserError
naming the file and field or tensor when the directory cannot be read.
"""
from __future__ import annotations

import glob
import os

from moetier.bytes import checkpoint, expert
from moetier.bytes.hf_config import config_bits, geometry, load_config, model_record, slug
from moetier.errors import UserError


def import_model(path, *, bits: float | None = None, rid: str | None = None) -> dict:
    """The model record of a model directory (or a config.json file). An EXL3 checkpoint with its safetensors gives
    a packable exl3 record (K, codebook and shapes from the tensor headers); any other MoE config gives a record of
    ``bits`` per weight (``bits`` argument, else the quantization config or dtype): int8 / int4g32 layouts at 8 / 4
    bits (packable with synthetic experts), simulate-only otherwise."""

    p = os.path.abspath(os.fspath(path))
    cfg = load_config(p)
    cfg_path = p if os.path.isfile(p) else os.path.join(p, "config.json")
    d = os.path.dirname(cfg_path)
    name = os.path.basename(d.rstrip(os.sep)) or "model"
    q = cfg.get("quantization_config")
    is_exl3 = isinstance(q, dict) and q.get("quant_method") == "exl3"
    if is_exl3 and glob.glob(os.path.join(d, "*.safetensors")):
        with checkpoint.open_exl3(d) as ck:
            geo, lay = ck.geometry, ck.layout
        b = float(bits) if bits is not None else float(q.get("bits") or lay.bits)
        return model_record(geo, rid or slug(f"{name}-exl3-{b:g}bpw"), f"{d} (EXL3, {b:g} bpw, experts K={lay.bits} "
                            f"{lay.codebook})", b, lay, source=f"moetier model import {d}")
    geo = geometry(cfg, cfg_path)
    if bits is None:
        bits = config_bits(cfg, cfg_path)
        if bits is None:
            raise UserError(f"{cfg_path}: no expert bit width (no quantization_config.bits / quant_method and no "
                            "torch_dtype); pass --bits")
    if not bits > 0:
        raise UserError(f"--bits {bits!r}: expected a positive number")
    lay = None
    enc = {8: "int8", 4: "int4g32"}.get(bits) if float(bits).is_integer() else None
    if enc is not None:
        try:
            lay = expert.layout(geo.hidden, geo.inter, enc)
        except ValueError:
            lay = None          # a geometry the int kernels cannot hold: simulate only
    return model_record(geo, rid or slug(f"{name}-{bits:g}bit"), f"{d} ({bits:g} bits per expert weight)",
                        float(bits), lay, source=f"moetier model import {cfg_path}")
