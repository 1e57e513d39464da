"""Synthetic EXL3 MoE checkpoints in exllamav3's GLM layout, and the tiny model built from the engine's classes.

Contract
--------
``write_checkpoint(path, spec, seed)`` writes a checkpoint directory (config.json, quantization_config.json,
model.safetensors written with the ``safetensors`` package) for a GLM-style MoE: ``spec.dense_first`` dense layers
(no tensors: only the MoE blocks are built), then ``spec.moe_layers`` MoE layers whose routed experts and shared
expert are EXL3 linears with the real tensor names
``model.language_model.layers.{n}.mlp.experts.{e}.{gate_proj,up_proj,down_proj}.{trellis,suh,svh,mul1}``, a router
``mlp.gate.weight`` (fp16, [E, H]) with ``mlp.gate.e_score_correction_bias``. Trellises are random int16 (every bit
pattern is a valid trellis), suh/svh random +-(0.5..2) fp16 (suh divided by sqrt(in_features) so activations stay
near unit scale), mul1 codebook.

``build_tiny_model(path, device)`` constructs one ``BlockSparseMLP`` per MoE layer with the arguments exllamav3
1.6.5's ``glm5_next`` architecture passes (router type ``dots``, SiLU with ``act_limit``, ``routed_scaling_factor``,
a ``GatedMLP`` shared expert) and loads its tensors through the engine's own ``SafetensorsCollection``. On a CUDA
device ``load`` also builds the engine's kernels' state; on the CPU only the tensors load (the engine does the same),
which is what the adapter's CPU tests drive. The engine is imported here, with the stand-in extension where there is
no compiled one.
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from moetier.atomic import atomic_write

PREFIX = "model.language_model.layers"
PROJ = ("gate_proj", "up_proj", "down_proj")
MUL1 = np.array(0x83DCD12D, dtype=np.uint32).view(np.int32)    # the mul1 codebook marker (its presence is read)


@dataclass(frozen=True)
class TinySpec:
    moe_layers: int = 2
    experts: int = 16
    topk: int = 2
    hidden: int = 256
    inter: int = 128
    K: int = 3
    shared: bool = True
    dense_first: int = 1
    act_limit: float = 10.0
    routed_scaling_factor: float = 2.5

    def layer_index(self, ordinal: int) -> int:
        """The checkpoint's layers.{n} index of MoE layer ``ordinal`` (dense layers come first)."""
        return self.dense_first + ordinal

    def module_key(self, ordinal: int) -> str:
        return f"{PREFIX}.{self.layer_index(ordinal)}.mlp"


@dataclass
class TinyModel:
    spec: TinySpec
    path: str
    modules: list = field(default_factory=list)       # BlockSparseMLP per MoE ordinal
    config: object = None


def _linear(t: dict, rng, name: str, k: int, n: int, K: int) -> None:
    t[name + ".trellis"] = rng.integers(-32768, 32768, size=(k // 16, n // 16, 16 * K), dtype=np.int16)
    for part, size, scale in (("suh", k, k ** -0.5), ("svh", n, 1.0)):
        mag = rng.uniform(0.5, 2.0, size) * scale
        t[f"{name}.{part}"] = np.where(rng.random(size) < 0.5, -mag, mag).astype(np.float16)
    t[name + ".mul1"] = MUL1.copy()


def checkpoint_tensors(spec: TinySpec, seed: int = 0) -> dict:
    """name -> numpy array of every tensor of the synthetic checkpoint."""
    rng = np.random.default_rng(seed)
    H, I, K = spec.hidden, spec.inter, spec.K
    t: dict = {}
    for o in range(spec.moe_layers):
        mk = spec.module_key(o)
        for e in range(spec.experts):
            for proj, (k, n) in zip(PROJ, ((H, I), (H, I), (I, H))):
                _linear(t, rng, f"{mk}.experts.{e}.{proj}", k, n, K)
        if spec.shared:
            for proj, (k, n) in zip(PROJ, ((H, I), (H, I), (I, H))):
                _linear(t, rng, f"{mk}.shared_experts.{proj}", k, n, K)
        t[f"{mk}.gate.weight"] = (rng.standard_normal((spec.experts, H)) * 0.1).astype(np.float16)
        t[f"{mk}.gate.e_score_correction_bias"] = (rng.standard_normal(spec.experts) * 0.01).astype(np.float32)
    return t


def write_checkpoint(path, spec: TinySpec = TinySpec(), seed: int = 0) -> Path:
    """Write the synthetic checkpoint into directory ``path`` (created; files written atomically)."""
    from safetensors.numpy import save
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    config = {
        "architectures": ["Glm5NextForConditionalGeneration"],
        "hidden_size": spec.hidden, "moe_intermediate_size": spec.inter,
        "n_routed_experts": spec.experts, "num_experts_per_tok": spec.topk,
        "num_hidden_layers": spec.dense_first + spec.moe_layers, "first_k_dense_replace": spec.dense_first,
        "n_shared_experts": int(spec.shared), "routed_scaling_factor": spec.routed_scaling_factor,
        "swiglu_limit": spec.act_limit, "n_group": 1, "topk_group": 1,
        "moetier_tiny_spec": asdict(spec),
    }
    quant = {"quant_method": "exl3", "version": "1.6.5", "bits": spec.K, "codebook": "mul1"}
    blob = save(checkpoint_tensors(spec, seed))
    atomic_write(path / "model.safetensors", lambda f: f.write(blob))
    atomic_write(path / "config.json", lambda f: f.write(json.dumps(config, indent=1).encode()))
    atomic_write(path / "quantization_config.json", lambda f: f.write(json.dumps(quant, indent=1).encode()))
    return path


def read_spec(path) -> TinySpec:
    with open(os.path.join(path, "config.json")) as f:
        return TinySpec(**json.load(f)["moetier_tiny_spec"])


class _Config:
    """What a module of exllamav3 reads from its model config: inference parameters and the tensor collection."""

    def __init__(self, path: str):
        from exllamav3.loader.safetensors import SafetensorsCollection
        from exllamav3.model.config import InferParams
        self.infer_params = InferParams()
        # the "python" loader reads with seek/read; the default one is the compiled extension's
        self.stc = SafetensorsCollection(str(path), load_method="python")


def build_tiny_model(path, device="cpu") -> TinyModel:
    """The MoE blocks of the checkpoint at ``path`` as exllamav3 BlockSparseMLP modules, loaded on ``device``."""
    from adapters.exllamav3.surface import import_engine
    import_engine()
    import torch
    from exllamav3.modules.block_sparse_mlp import BlockSparseMLP
    from exllamav3.modules.mlp import GatedMLP

    spec = read_spec(path)
    cfg = _Config(path)
    model = TinyModel(spec=spec, path=str(path), config=cfg)
    for o in range(spec.moe_layers):
        key = spec.module_key(o)
        shared = GatedMLP(
            config=cfg, key=f"{key}.shared_experts", hidden_size=spec.hidden, intermediate_size=spec.inter,
            key_up="up_proj", key_gate="gate_proj", key_down="down_proj", activation_fn="silu",
            act_limit=spec.act_limit, qmap="block.mlp", interm_dtype=torch.half, out_dtype=torch.float,
            select_hq_bits=2) if spec.shared else None
        m = BlockSparseMLP(
            config=cfg, key=key, hidden_size=spec.hidden, intermediate_size=spec.inter, num_experts=spec.experts,
            num_experts_per_tok=spec.topk, key_up="experts.{expert_idx}.up_proj",
            key_gate="experts.{expert_idx}.gate_proj", key_down="experts.{expert_idx}.down_proj",
            key_routing_gate="gate", key_e_score_bias="gate.e_score_correction_bias", activation_fn="silu",
            act_limit=spec.act_limit, qmap="block.mlp", interm_dtype=torch.half, out_dtype=torch.float,
            router_type="dots", routed_scaling_factor=spec.routed_scaling_factor, n_group=1, topk_group=1,
            shared_experts=shared)
        m.load(torch.device(device))
        model.modules.append(m)
    return model
