"""The tiny exl3xpu MoE model: a synthetic EXL3 checkpoint (Qwen layout) around exl3xpu's MoE method.

Contract
--------
``TINY`` is the tiny model's spec (moetier.bytes.synth_exl3.SynthSpec): 2 MoE layers x 16 experts, top-2, hidden 640,
intermediate 640, K 3 (mul1), a gated shared expert, no MTP layer. ``write_tiny(path, seed)`` writes its checkpoint.

``build_model(path, ops)`` loads it the way exl3xpu's SGLang method does: every routed expert packed into the engine's
host store at load time (one ``ops.host_alloc`` buffer, the blob of ``layer * E + e`` at ``key * record`` where record
is the blob's 4 KiB-aligned stride: adapters.exl3xpu.blob, surface.record_bytes), and per layer a ``Method`` whose ``apply(x, topk_ids,
topk_w)`` runs ``ops.moe_forward`` over the layer's pointer table (its home rows: the host store's records). A
``Layer`` is what SGLang runs around the method: the Qwen router (softmax, top-k, renormalised; ids int32, weights
fp32), ``method.apply``, and the shared expert outside the method (``--disable-shared-experts-fusion``), scaled by
sigmoid(shared_expert_gate . x). The shared expert is computed by moetier's EXL3 reference at fp16 rounding points.
"""
from __future__ import annotations

import dataclasses
import glob
import os
from dataclasses import dataclass, field

import numpy as np

from moetier.bytes import synth_exl3

# hidden and intermediate 640: the smallest geometry exl3xpu's moe_forward takes (its GEMV work splits need H/16 and
# I/16 multiples of 40; adapters.exl3xpu.ops.refusal)
TINY = synth_exl3.SynthSpec(layout="qwen", hidden=640, inter=640, experts=16, topk=2, moe_layers=2, mtp_layers=0,
                            shared=1, bits=3, codebook="mul1", act_limit=0.0, shards=1)


def write_tiny(path, seed: int = 0) -> dict:
    return synth_exl3.write_checkpoint(path, dataclasses.replace(TINY, seed=seed))


def route(x: np.ndarray, gate_w: np.ndarray, topk: int):
    """Qwen's router: softmax over the gate's logits, the top-k (ties to the lower id), renormalised."""
    logits = np.asarray(x, np.float32) @ np.asarray(gate_w, np.float32).T
    p = np.exp(logits - logits.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    ids = np.argsort(-p, axis=1, kind="stable")[:, :topk].astype(np.int32)
    w = np.take_along_axis(p, ids, axis=1)
    return ids, (w / w.sum(axis=1, keepdims=True)).astype(np.float32)


class Method:
    """exl3xpu's MoE method for one layer: ``apply`` is its grouped kernel over the layer's pointer table."""

    def __init__(self, ops, ptrs: np.ndarray, inter: int, K: int):
        self.ops, self.ptrs, self.inter, self.K = ops, ptrs, inter, K
        self.home = ptrs.copy()

    def apply(self, x, topk_ids, topk_w):
        """The op on its own terms: fp16 rows, int32 ids, fp32 weights and the table, all on the device."""
        from adapters.exl3xpu import surface
        dev = surface.device_input(self.ops)
        y = self.ops.moe_forward(dev(np.asarray(x, np.float16)), dev(np.asarray(topk_ids, np.int32)),
                                 dev(np.asarray(topk_w, np.float32)), dev(self.ptrs), self.inter, self.K,
                                 len(self.ptrs))
        return y.float().cpu().numpy() if hasattr(y, "cpu") else np.asarray(y, np.float32)


@dataclass
class Layer:
    gate_w: np.ndarray
    method: Method
    topk: int
    shared: object = None             # moetier.bytes.exl3.Exl3Expert
    shared_gate: np.ndarray | None = None

    def forward(self, x: np.ndarray) -> np.ndarray:
        from moetier.bytes import exl3
        x = np.asarray(x, np.float32)
        ids, w = route(x, self.gate_w, self.topk)
        y = np.asarray(self.method.apply(x, ids, w), np.float32)
        if self.shared is not None:
            s = exl3.expert_forward(x.astype(np.float64), self.shared, None, fp16=True)
            g = 1.0 / (1.0 + np.exp(-(x.astype(np.float64) @ self.shared_gate.astype(np.float64).T)))
            y = y + (g * s).astype(np.float32)
        return y


@dataclass
class Model:
    path: str
    layers: list = field(default_factory=list)
    host: np.ndarray | None = None     # the engine's host store of every routed expert
    layout: object = None
    experts: int = 0


def load_tensors(path) -> dict:
    from safetensors.numpy import load_file
    out = {}
    for f in sorted(glob.glob(os.path.join(os.fspath(path), "*.safetensors"))):
        out.update(load_file(f))
    return out


def build_model(path, ops) -> Model:
    """The MoE layers of the Qwen-layout EXL3 checkpoint at ``path`` as exl3xpu runs them on ``ops``."""
    from adapters.exl3xpu import blob, surface
    from moetier.bytes import checkpoint, exl3
    t = load_tensors(path)
    with checkpoint.open_exl3(path) as ck:
        lay, E, L = ck.layout, ck.experts, ck.trunk_layers
        rb = surface.record_bytes(lay.hidden, lay.ffn, lay.bits)       # the blob's 4 KiB-aligned stride
        buf = ops.host_alloc(L * E * rb)
        host = surface.host_array(buf)
        rec = np.zeros(lay.record_bytes, np.uint8)
        for k in range(L * E):
            ck.fill(k, rec)
            b = blob.pack_record(lay, rec)                             # packed as exl3xpu's _maybe_pack does
            host[k * rb:k * rb + b.size] = b
        prefixes, topk = ck.prefixes[:L], int(ck.geometry.topk)
    model = Model(path=str(path), host=buf, layout=lay, experts=E)
    base = surface.address(buf)
    for o, mlp in enumerate(prefixes):
        ptrs = np.array([base + (o * E + e) * rb for e in range(E)], np.int64)
        shared = sg = None
        if f"{mlp}.shared_expert.gate_proj.trellis" in t:
            shared = exl3.Exl3Expert(*(exl3.Exl3Linear(t[f"{mlp}.shared_expert.{p}_proj.trellis"],
                                                       t[f"{mlp}.shared_expert.{p}_proj.suh"],
                                                       t[f"{mlp}.shared_expert.{p}_proj.svh"], lay.codebook)
                                       for p in ("gate", "up", "down")))
            sg = t[f"{mlp}.shared_expert_gate.weight"]
        model.layers.append(Layer(t[f"{mlp}.gate.weight"], Method(ops, ptrs, lay.ffn, lay.bits), topk, shared, sg))
    return model
