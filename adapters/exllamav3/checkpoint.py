"""The tiny exllamav3 MoE model: a synthetic EXL3 checkpoint (GLM layout) built into the engine's own module classes.

Contract
--------
``TINY`` is the tiny model's spec (moetier.bytes.synth_exl3.SynthSpec): 2 MoE layers x 16 experts, top-2, hidden 256,
intermediate 128, K 3 (mul1), a shared expert, one dense layer first, no MTP layer. ``write_tiny(path, seed)`` writes
its checkpoint with ``synth_exl3.write_checkpoint`` (the real GLM tensor naming, the ``safetensors`` package);
``moetier.bytes.store.pack_checkpoint`` packs its routed experts into the store the adapter reads.

``build_model(path, device, load=True)`` constructs one ``BlockSparseMLP`` per trunk MoE layer of a GLM-layout
checkpoint with the arguments exllamav3 1.6.5's ``glm5_next`` architecture passes (router type ``dots``, SiLU with
``act_limit`` = ``swiglu_limit``, ``routed_scaling_factor``, a ``GatedMLP`` shared expert) and loads its tensors
through the engine's own ``SafetensorsCollection`` (``load=False``: constructed only; ``Model.load`` loads them).
On a CUDA device ``load`` also builds the kernels' state (pointer tables, bound classes, routing buffers); on the CPU
only the tensors load, as the engine itself does, and the adapter's CPU tests finish the load with the kernels
faked. The engine is imported with the stand-in extension where there is no CUDA.
"""
from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field

from moetier.bytes import synth_exl3

TINY = synth_exl3.SynthSpec(layout="glm", hidden=256, inter=128, experts=16, topk=2, moe_layers=2, dense_layers=1,
                            mtp_layers=0, shared=1, bits=3, codebook="mul1", act_limit=10.0,
                            routed_scaling_factor=2.5, shards=1)
PREFIX = "model.language_model.layers"


@dataclass
class Model:
    path: str
    text: dict                                     # the checkpoint's text_config
    modules: list = field(default_factory=list)    # BlockSparseMLP per MoE ordinal
    config: object = None

    def module_key(self, ordinal: int) -> str:
        return self.modules[ordinal].key

    def load(self, device="cpu") -> None:
        """Load every block's tensors on ``device`` through the engine's own ``BlockSparseMLP.load``."""
        import torch
        for m in self.modules:
            m.load(torch.device(device))


def write_tiny(path, seed: int = 0) -> dict:
    """Write the tiny model's checkpoint at ``path``; returns synth_exl3.write_checkpoint's summary."""
    return synth_exl3.write_checkpoint(path, dataclasses.replace(TINY, seed=seed))


class _Config:
    """What a module of exllamav3 reads from its model config: inference parameters and the tensor collection."""

    def __init__(self, path: str):
        from exllamav3.loader.safetensors import SafetensorsCollection
        from exllamav3.model.config import InferParams
        self.infer_params = InferParams()
        # the "python" loader reads with seek/read; the default one is the compiled extension's
        self.stc = SafetensorsCollection(str(path), load_method="python")


def build_model(path, device="cpu", load: bool = True) -> Model:
    """The trunk MoE blocks of the GLM-layout checkpoint at ``path`` as exllamav3 modules, loaded on ``device``
    (constructed only with ``load=False``: ``Model.load`` then loads them)."""
    from adapters.exllamav3.surface import import_engine
    import_engine()
    import torch
    from exllamav3.modules.block_sparse_mlp import BlockSparseMLP
    from exllamav3.modules.mlp import GatedMLP

    with open(os.path.join(path, "config.json")) as f:
        text = json.load(f)["text_config"]
    H, inter, limit = text["hidden_size"], text["moe_intermediate_size"], float(text.get("swiglu_limit") or 0.0)
    cfg = _Config(path)
    model = Model(path=str(path), text=text, config=cfg)
    for n in range(text.get("first_k_dense_replace", 0), text["num_hidden_layers"]):
        key = f"{PREFIX}.{n}.mlp"
        shared = GatedMLP(
            config=cfg, key=f"{key}.shared_experts", hidden_size=H, intermediate_size=inter * text["n_shared_experts"],
            key_up="up_proj", key_gate="gate_proj", key_down="down_proj", activation_fn="silu", act_limit=limit,
            qmap="block.mlp", interm_dtype=torch.half, out_dtype=torch.float,
            select_hq_bits=2) if text.get("n_shared_experts") else None
        m = BlockSparseMLP(
            config=cfg, key=key, hidden_size=H, intermediate_size=inter, num_experts=text["n_routed_experts"],
            num_experts_per_tok=text["num_experts_per_tok"], key_up="experts.{expert_idx}.up_proj",
            key_gate="experts.{expert_idx}.gate_proj", key_down="experts.{expert_idx}.down_proj",
            key_routing_gate="gate", key_e_score_bias="gate.e_score_correction_bias", activation_fn="silu",
            act_limit=limit, qmap="block.mlp", interm_dtype=torch.half, out_dtype=torch.float, router_type="dots",
            routed_scaling_factor=text["routed_scaling_factor"], n_group=1, topk_group=1, shared_experts=shared)
        model.modules.append(m)
    if load:
        model.load(device)
    return model
