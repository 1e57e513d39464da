"""Synthetic EXL3 checkpoints: a directory that reads like an exllamav3 conversion of a MoE model, with random bytes.

Contract: ``write_checkpoint(out_dir, spec)`` writes ``config.json``, ``quantization_config.json`` and
``model-0000i-of-0000n.safetensors`` shards (plus ``model.safetensors.index.json`` when there is more than one) with
the real tensor naming of one of two layouts (adapters.md section 2.2):

* ``glm`` (Glm5NextForConditionalGeneration): ``text_config`` with ``first_k_dense_replace`` dense MLP layers first,
  ``n_routed_experts``, ``n_shared_experts``, ``swiglu_limit``, ``routed_scaling_factor`` and
  ``num_nextn_predict_layers``; routed experts at ``model.language_model.layers.{n}.mlp.experts.{e}.{gate,up,down}_proj``,
  the MTP layer at ``model.language_model.layers.{num_hidden_layers}``, shared experts at ``mlp.shared_experts``.
* ``qwen`` (Qwen4ExpForConditionalGeneration): every layer MoE, ``num_experts``, ``shared_expert_intermediate_size``,
  ``mtp_num_hidden_layers``; routed experts at ``model.language_model.layers.{n}.mlp.experts.{e}...``, shared at
  ``mlp.shared_expert`` (+ ``shared_expert_gate``), the MTP layers at ``mtp.layers.{i}.mlp.experts.{e}...``.

Each quantized linear has ``trellis`` int16, ``suh`` / ``svh`` fp16 and the codebook marker (``mul1`` or ``mcg``, an
int32 scalar holding the multiplier; none for 3inst). Routed expert (MoE ordinal o, expert e) is
``expert(spec, o, e)``, a pure function of the spec's seed, so a test can recompute the reference without reading
the files back; ordinals count the trunk's MoE layers first, then the MTP layers. Used by the tests and by the
exllamav3 adapter's checks; needs the ``safetensors`` package (the ``test`` extra).
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass

import numpy as np

from moetier.bytes import exl3

LAYOUTS = ("glm", "qwen")
ARCH = {"glm": "Glm5NextForConditionalGeneration", "qwen": "Qwen4ExpForConditionalGeneration"}
CODEBOOK_TENSOR = {"mul1": ("mul1", exl3.MUL1_MULT), "mcg": ("mcg", exl3.MCG_MULT)}


@dataclass(frozen=True)
class SynthSpec:
    layout: str = "glm"
    hidden: int = 256
    inter: int = 128
    experts: int = 8
    topk: int = 2
    moe_layers: int = 2
    dense_layers: int = 1          # glm only: dense MLP layers before the first MoE layer
    mtp_layers: int = 1
    shared: int = 1
    bits: int = 3
    codebook: str = "mul1"
    act_limit: float = 10.0        # glm's swiglu_limit; qwen has none
    routed_scaling_factor: float = 2.5
    seed: int = 0
    shards: int = 2

    @property
    def total_layers(self) -> int:
        """Trunk layers (the config's num_hidden_layers)."""
        return self.moe_layers + (self.dense_layers if self.layout == "glm" else 0)


def random_expert(rng: np.random.Generator, hidden: int, inter: int, K: int = 3, codebook: str = "mul1"
                  ) -> exl3.Exl3Expert:
    """A random expert whose activations stay of order one: suh of +-(0.5..2) and svh of +-(0.5..2) / (3 sqrt(k)),
    since a random trellis row sums k weights of size ~2 (so fp16 never overflows, as in a real checkpoint where the
    scales carry the magnitude)."""
    def lin(k, n):
        svh = exl3.random_scales(rng, n).astype(np.float64) / (3.0 * np.sqrt(k))
        return exl3.Exl3Linear(exl3.random_trellis(rng, k, n, K), exl3.random_scales(rng, k),
                               svh.astype(np.float16), codebook)
    return exl3.Exl3Expert(lin(hidden, inter), lin(hidden, inter), lin(inter, hidden))


def expert(spec: SynthSpec, ordinal: int, e: int) -> exl3.Exl3Expert:
    """Routed expert e of MoE ordinal ``ordinal`` (trunk MoE layers, then MTP layers) of a synthetic checkpoint."""
    rng = np.random.default_rng([spec.seed, 1, ordinal, e])
    return random_expert(rng, spec.hidden, spec.inter, spec.bits, spec.codebook)


def moe_prefixes(spec: SynthSpec) -> list[str]:
    """The module prefix (``...mlp``) of each MoE ordinal: trunk MoE layers, then MTP layers."""
    base = "model.language_model.layers"
    if spec.layout == "glm":
        trunk = [f"{base}.{spec.dense_layers + i}.mlp" for i in range(spec.moe_layers)]
        mtp = [f"{base}.{spec.total_layers + i}.mlp" for i in range(spec.mtp_layers)]
    else:
        trunk = [f"{base}.{i}.mlp" for i in range(spec.moe_layers)]
        mtp = [f"mtp.layers.{i}.mlp" for i in range(spec.mtp_layers)]
    return trunk + mtp


def config(spec: SynthSpec) -> dict:
    """config.json of the checkpoint (a text_config as the exllamav3 architectures read it)."""
    if spec.layout == "glm":
        text = {"hidden_size": spec.hidden, "num_hidden_layers": spec.total_layers,
                "intermediate_size": 2 * spec.inter, "moe_intermediate_size": spec.inter,
                "n_routed_experts": spec.experts, "num_experts_per_tok": spec.topk,
                "n_shared_experts": spec.shared, "first_k_dense_replace": spec.dense_layers,
                "num_nextn_predict_layers": spec.mtp_layers, "swiglu_limit": spec.act_limit,
                "routed_scaling_factor": spec.routed_scaling_factor, "scoring_func": "sigmoid",
                "hidden_act": "silu", "model_type": "glm5_next_text"}
        mt = "glm5_next"
    else:
        text = {"hidden_size": spec.hidden, "num_hidden_layers": spec.moe_layers,
                "moe_intermediate_size": spec.inter, "shared_expert_intermediate_size": spec.inter * spec.shared,
                "num_experts": spec.experts, "num_experts_per_tok": spec.topk,
                "mtp_num_hidden_layers": spec.mtp_layers, "hidden_act": "silu", "model_type": "qwen4_exp_text"}
        mt = "qwen4_exp"
    return {"architectures": [ARCH[spec.layout]], "model_type": mt, "text_config": text,
            "quantization_config": {"quant_method": "exl3", "version": "1.6.5", "bits": float(spec.bits),
                                    "head_bits": 6}}


def _linear_tensors(prefix: str, lin: exl3.Exl3Linear) -> dict:
    out = {f"{prefix}.trellis": lin.trellis, f"{prefix}.suh": lin.suh, f"{prefix}.svh": lin.svh}
    if lin.codebook in CODEBOOK_TENSOR:
        name, mult = CODEBOOK_TENSOR[lin.codebook]
        out[f"{prefix}.{name}"] = np.array(mult, dtype=np.uint32).view(np.int32)
    return out


def _dense_mlp(rng, prefix: str, spec: SynthSpec, inter: int) -> dict:
    ex = random_expert(rng, spec.hidden, inter, spec.bits, spec.codebook)
    out = {}
    for p in ("gate", "up", "down"):
        out.update(_linear_tensors(f"{prefix}.{p}_proj", getattr(ex, p)))
    return out


def _groups(spec: SynthSpec):
    """(group name, {tensor name: array}) in file order; one group is built at a time, so memory stays small."""
    rng = np.random.default_rng([spec.seed, 2])
    yield "embed", {"model.language_model.embed_tokens.weight":
                    rng.standard_normal((64, spec.hidden)).astype(np.float16)}
    prefixes = moe_prefixes(spec)
    if spec.layout == "glm":
        for n in range(spec.dense_layers):
            yield f"dense{n}", _dense_mlp(rng, f"model.language_model.layers.{n}.mlp", spec, 2 * spec.inter)
    for o, mlp in enumerate(prefixes):
        t = {f"{mlp}.gate.weight": rng.standard_normal((spec.experts, spec.hidden)).astype(np.float16)}
        if spec.layout == "glm":
            t[f"{mlp}.gate.e_score_correction_bias"] = np.zeros(spec.experts, dtype=np.float32)
        if spec.shared:
            name = "shared_experts" if spec.layout == "glm" else "shared_expert"
            t.update(_dense_mlp(rng, f"{mlp}.{name}", spec, spec.inter * spec.shared))
            if spec.layout == "qwen":
                t[f"{mlp}.shared_expert_gate.weight"] = rng.standard_normal((1, spec.hidden)).astype(np.float16)
        for e in range(spec.experts):
            ex = expert(spec, o, e)
            for p in ("gate", "up", "down"):
                t.update(_linear_tensors(f"{mlp}.experts.{e}.{p}_proj", getattr(ex, p)))
        yield f"moe{o}", t


def _module_entry(tensors: dict, module: str) -> dict:
    stored = {k: {"shape": list(v.shape), "n_bytes": int(v.nbytes), "dtype": f"torch.{v.dtype.name}"}
              for k, v in tensors.items() if k.startswith(module + ".")}
    entry = {"stored_tensors": stored}
    tr = stored.get(f"{module}.trellis")
    if tr is not None:
        entry["quant_format"] = "exl3"
        entry["bits_per_weight"] = tr["shape"][-1] // 16
        for name in ("mul1", "mcg"):
            if f"{module}.{name}" in tensors:
                entry[f"{name}_multiplier"] = int(tensors[f"{module}.{name}"].view(np.uint32))
    return entry


def write_checkpoint(out_dir, spec: SynthSpec = SynthSpec()) -> dict:
    """Write the synthetic checkpoint at out_dir (created; must not hold one already); returns {files, tensors,
    spec}. Layers are dealt to ``spec.shards`` files in order, the way a converter fills shards."""
    from safetensors.numpy import save_file

    if spec.layout not in LAYOUTS:
        raise ValueError(f"layout {spec.layout!r}: expected one of {LAYOUTS}")
    os.makedirs(out_dir, exist_ok=True)
    groups = list(_groups_names(spec))
    per = -(-len(groups) // spec.shards)
    nfiles = -(-len(groups) // per)
    weight_map, storage, files = {}, {}, []
    it = _groups(spec)
    for i in range(nfiles):
        fname = f"model-{i + 1:05d}-of-{nfiles:05d}.safetensors"
        tensors = {}
        for _ in range(per):
            try:
                tensors.update(next(it)[1])
            except StopIteration:
                break
        save_file(tensors, os.path.join(out_dir, fname))
        files.append(fname)
        weight_map.update({k: fname for k in tensors})
        for module in sorted({k.rsplit(".", 1)[0] for k in tensors}):
            storage[module] = _module_entry(tensors, module)
        del tensors
    cfg = config(spec)
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    with open(os.path.join(out_dir, "quantization_config.json"), "w") as f:
        json.dump({**cfg["quantization_config"], "tensor_storage": storage}, f, indent=2)
    if nfiles > 1:
        with open(os.path.join(out_dir, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {}, "weight_map": weight_map}, f, indent=2)
    return {"files": files, "tensors": len(weight_map), "spec": asdict(spec)}


def _groups_names(spec: SynthSpec):
    yield "embed"
    if spec.layout == "glm":
        yield from (f"dense{n}" for n in range(spec.dense_layers))
    yield from (f"moe{o}" for o in range(spec.moe_layers + spec.mtp_layers))
