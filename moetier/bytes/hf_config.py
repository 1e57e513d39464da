"""A Hugging Face style MoE config.json -> the geometry a model record needs, and the model record itself.

Contract: ``geometry(cfg, where)`` reads the text config (``text_config`` when nested, else the top level) under the
field names of the Mixtral, Qwen2/3 MoE, Qwen3.5/Next, DeepSeek V2/V3, GLM-4/5 MoE and OLMoE families and returns a
``MoeGeometry``: hidden and expert intermediate sizes, routed experts, top-k, shared experts, which checkpoint layers
are MoE layers (dense first layers, ``decoder_sparse_step`` / ``mlp_only_layers``, ``moe_layer_freq``,
``mlp_layer_types``), MTP layers, the SwiGLU clamp and the routed scaling factor. ``config_bits`` reads the expert
bit width from the quantization config (exl3, fp8, gptq/awq ``bits``) or the stored dtype. ``model_record`` turns a
geometry into a model record (registry/schema/model.schema.json). Anything missing or malformed raises UserError
naming the file and field.
"""
from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, field

from moetier.errors import UserError

# first present wins: (what, field names)
EXPERTS = ("n_routed_experts", "num_local_experts", "num_experts", "moe_num_experts", "n_experts")
TOPK = ("num_experts_per_tok", "moe_topk", "moe_k", "top_k")
MAX_LAYERS = 4096          # registry/schema/model.schema.json bounds moe.layers the same
DTYPE_BITS = {"bfloat16": 16, "float16": 16, "half": 16, "float32": 32, "float": 32, "float8_e4m3fn": 8}


@dataclass(frozen=True)
class MoeGeometry:
    family: str
    hidden: int
    inter: int
    experts: int
    topk: int
    shared: int
    layers_total: int
    moe_layers: tuple            # checkpoint layer indices of the trunk's MoE layers, in order
    mtp_layers: int = 0
    act_limit: float = 0.0
    routed_scaling_factor: float = 1.0
    fields: dict = field(default_factory=dict, compare=False)   # the config field each figure came from

    @property
    def dense_layers(self) -> list:
        moe = set(self.moe_layers)
        return [i for i in range(self.layers_total) if i not in moe]


def load_json_object(path: str, what: str) -> dict:
    """A JSON object from a file; UserError naming the file if unreadable, not JSON or not an object."""
    from moetier import strictjson
    obj = strictjson.load(path, f"{path} ({what})")
    if not isinstance(obj, dict):
        raise UserError(f"{path}: {what} is not a JSON object")
    return obj


def load_config(d: str) -> dict:
    """config.json of a model directory (or the file itself), as a dict."""
    path = d if os.path.isfile(d) else os.path.join(d, "config.json")
    if not os.path.exists(path):
        raise UserError(f"{d}: no config.json (expected a Hugging Face style model directory)")
    return load_json_object(path, "config.json")


def _text(cfg: dict, where: str) -> tuple[dict, str]:
    if not isinstance(cfg, dict):
        raise UserError(f"{where}: expected a JSON object")
    t = cfg.get("text_config")
    if t is None:
        return cfg, ""
    if not isinstance(t, dict):
        raise UserError(f"{where}: field 'text_config' expected an object, got {type(t).__name__}")
    return {**{k: v for k, v in cfg.items() if k != "text_config"}, **t}, "text_config."


def _int(t: dict, name: str, where: str, pfx: str, minimum: int = 1) -> int:
    v = t.get(name)
    if not isinstance(v, int) or isinstance(v, bool) or v < minimum:
        raise UserError(f"{where}: field '{pfx}{name}' expected an integer >= {minimum}, got {v!r}")
    return v


def _first(t: dict, names, what: str, where: str, pfx: str) -> tuple[str, int]:
    for n in names:
        if n in t and t[n] is not None:
            return n, _int(t, n, where, pfx)
    raise UserError(f"{where}: no {what} field (expected one of {', '.join(pfx + n for n in names)}); "
                    "is this a MoE model?")


def _moe_layers(t: dict, n: int, where: str, pfx: str) -> tuple[tuple, str]:
    """Which of the n trunk layers carry routed experts, and the field that said so."""
    types = t.get("mlp_layer_types")
    if types is not None:
        if not isinstance(types, list) or len(types) < n or any(x not in ("dense", "sparse") for x in types[:n]):
            raise UserError(f"{where}: field '{pfx}mlp_layer_types' expected {n} entries of 'dense' or 'sparse'")
        return tuple(i for i in range(n) if types[i] == "sparse"), "mlp_layer_types"
    if "first_k_dense_replace" in t or "moe_layer_freq" in t:
        k = _int(t, "first_k_dense_replace", where, pfx, 0) if "first_k_dense_replace" in t else 0
        f = _int(t, "moe_layer_freq", where, pfx) if "moe_layer_freq" in t else 1
        return tuple(i for i in range(n) if i >= k and i % f == 0), "first_k_dense_replace/moe_layer_freq"
    if "decoder_sparse_step" in t or "mlp_only_layers" in t:
        s = _int(t, "decoder_sparse_step", where, pfx) if "decoder_sparse_step" in t else 1
        only = t.get("mlp_only_layers") or []
        if not isinstance(only, list) or not all(isinstance(i, int) for i in only):
            raise UserError(f"{where}: field '{pfx}mlp_only_layers' expected a list of layer indices")
        only = set(only)
        return tuple(i for i in range(n) if i not in only and (i + 1) % s == 0), "decoder_sparse_step/mlp_only_layers"
    return tuple(range(n)), "num_hidden_layers (every layer MoE)"


def geometry(cfg: dict, where: str = "config.json") -> MoeGeometry:
    """The MoE geometry of a config.json dict (see the module docstring); UserError naming the field if unusable."""
    t, pfx = _text(cfg, where)
    fields = {}
    hidden = _int(t, "hidden_size", where, pfx)
    n_e, experts = _first(t, EXPERTS, "routed-experts", where, pfx)
    n_k, topk = _first(t, TOPK, "experts-per-token", where, pfx)
    n_i, inter = _first(t, ("moe_intermediate_size", "intermediate_size"), "expert intermediate size", where, pfx)
    if topk > experts:
        raise UserError(f"{where}: field '{pfx}{n_k}' is {topk}, more than the {experts} experts of '{pfx}{n_e}'")
    if "n_shared_experts" in t and t["n_shared_experts"] is not None:
        shared, n_s = _int(t, "n_shared_experts", where, pfx, 0), "n_shared_experts"
    elif t.get("shared_expert_intermediate_size"):
        shared, n_s = 1, "shared_expert_intermediate_size"
    else:
        shared, n_s = 0, "(none)"
    layers = _int(t, "num_hidden_layers", where, pfx)
    if layers > MAX_LAYERS:
        raise UserError(f"{where}: field '{pfx}num_hidden_layers' is {layers}; expected at most {MAX_LAYERS} (the "
                        f"model schema's bound on layers)")
    moe, n_l = _moe_layers(t, layers, where, pfx)
    if not moe:
        raise UserError(f"{where}: no MoE layer among the {layers} of '{pfx}num_hidden_layers' ({n_l})")
    mtp = 0
    for n in ("num_nextn_predict_layers", "mtp_num_hidden_layers"):
        if t.get(n):
            mtp = _int(t, n, where, pfx, 0)
    lim = t.get("swiglu_limit") or 0.0
    rsf = t.get("routed_scaling_factor") or 1.0
    for name, v in (("swiglu_limit", lim), ("routed_scaling_factor", rsf)):
        if not isinstance(v, (int, float)) or isinstance(v, bool) or v < 0:
            raise UserError(f"{where}: field '{pfx}{name}' expected a number >= 0, got {v!r}")
    arch = cfg.get("architectures")
    family = arch[0] if isinstance(arch, list) and arch and isinstance(arch[0], str) else str(t.get("model_type", "?"))
    fields.update(experts=pfx + n_e, topk=pfx + n_k, inter=pfx + n_i, shared=pfx + n_s, moe_layers=n_l)
    return MoeGeometry(family, hidden, inter, experts, topk, shared, layers, moe, mtp, float(lim), float(rsf), fields)


def config_bits(cfg: dict, where: str = "config.json") -> float | None:
    """Expert bits per weight the config declares: quantization_config (exl3 ``bits``, fp8, gptq/awq ``bits``),
    else the stored dtype (``torch_dtype`` / ``dtype``); None when it says nothing usable."""
    q = cfg.get("quantization_config")
    if isinstance(q, dict):
        method = str(q.get("quant_method", "")).lower()
        if "fp8" in method or q.get("fmt") == "e4m3":
            return 8.0
        b = q.get("bits")
        if isinstance(b, (int, float)) and not isinstance(b, bool) and b > 0:
            return float(b)
        return None
    t, _ = _text(cfg, where)
    d = t.get("torch_dtype") or t.get("dtype")
    return float(DTYPE_BITS[d]) if isinstance(d, str) and d in DTYPE_BITS else None


def slug(text: str) -> str:
    """A record id from free text: lower case, runs of other characters to '-'."""
    s = re.sub(r"[^a-z0-9._-]+", "-", text.lower()).strip("-._")
    return s or "model"


def _align(n: int, a: int = 4096) -> int:
    return (n + a - 1) // a * a


def model_record(geo: MoeGeometry, rid: str, artifact: str, bits: float, lay=None, source: str = "") -> dict:
    """A model record for the geometry. ``lay`` (an ExpertLayout) makes it packable: the store section then names
    the layout and the expert bytes are the layout's; without it the bytes are 3 H I bits / 8 (simulate-only)."""
    E = geo.experts
    if lay is not None:
        expert_bytes, record_bytes = lay.weight_bytes, lay.record_bytes
    else:
        expert_bytes = int(math.ceil(3 * geo.hidden * geo.inter * bits / 8))
        record_bytes = _align(expert_bytes)
    store = {"format": "record", "record_bytes": record_bytes, "key": f"layer*{E}+expert"}
    if lay is not None:
        store.update({"hidden": lay.hidden, "ffn": lay.ffn, "encoding": lay.encoding})
        if lay.encoding == "exl3":
            store.update({"bits": lay.bits, "codebook": lay.codebook, "act_limit": lay.act_limit})
        store["layout"] = lay.to_json()
        store["note"] = "one expert = one record; `moetier store pack` writes it"
    else:
        store["note"] = (f"no packable encoding at {bits:g} bits: simulate only (`moetier model import --bits 8` or 4 "
                         "gives an int8 / int4g32 layout that `moetier store pack` can fill)")
    geom = {"hidden": geo.hidden, "intermediate": geo.inter, "bits": bits, "layers_total": geo.layers_total,
            "dense_mlp_layers": geo.dense_layers, "moe_layers": list(geo.moe_layers), "mtp_layers": geo.mtp_layers,
            "weights_per_expert": 3 * geo.hidden * geo.inter, "routed_scaling_factor": geo.routed_scaling_factor,
            "act_limit": geo.act_limit, "fields": dict(geo.fields)}
    return {
        "id": rid, "family": geo.family, "artifact": artifact,
        "moe": {"layers": len(geo.moe_layers), "experts": E, "topk": geo.topk, "shared": geo.shared,
                "expert_bytes": expert_bytes,
                "note": f"expert_bytes = one expert's weights and scales (a VRAM slot); store.record_bytes = the same "
                        f"padded to 4 KiB (a RAM slot and an NVMe read). MoE ordinal i = checkpoint layer "
                        f"{list(geo.moe_layers)[:4]}{'...' if len(geo.moe_layers) > 4 else ''}[i]"},
        "store": store, "geometry": geom, "source": source or "moetier model import",
    }

