"""The exllamav3 hook surface the adapter expects, pinned to a version range, and its check.

Contract
--------
``EXPECTED`` is the surface (``adapters.surface`` format) the adapter relies on in exllamav3 1.6.5: the MoE block
``BlockSparseMLP`` and its base ``BlockSparseMLP_CPU`` (load path, forward, the CPU split hooks the adapter wraps),
the routing functions it wraps (``routing_fn`` is one of them, called as ``(bsz, cfg, z, params)``), the
``RoutingCFG`` fields it reads, the constructors the tiny test model is built with (keyword arguments, so only
their presence is pinned), and the load path ``moetier_load`` redirects (``Linear.load`` / ``load_exl3`` and the
``SafetensorsCollection`` methods it answers or reads headers through). ``VERSIONS`` is the range of engine
versions the adapter accepts.

``check(expected=EXPECTED)`` imports the installed engine (with the stand-in extension where there is no CUDA device)
and returns a ``Report``; ``require()`` raises ``SurfaceMismatch`` with the first mismatch as one line (attach calls
it). ``adapter_check()`` is what ``moetier adapter check exllamav3`` runs: it prints the surface found against the one
expected (moetier.cli.adapter exits 2 with the first mismatch as its one error line).
"""
from __future__ import annotations

from dataclasses import dataclass

from adapters import surface
from adapters.surface import SurfaceMismatch, check_surface, found_surface

ENGINE = "exllamav3"
VERSIONS = ((1, 6, 5), (1, 7, 0))      # [lowest accepted, first refused)

_B = "exllamav3.modules.block_sparse_mlp.BlockSparseMLP"
_C = "exllamav3.modules.block_sparse_mlp_cpu.BlockSparseMLP_CPU"
_R = "exllamav3.modules.block_sparse_mlp_routing"
_L = "exllamav3.modules.linear.Linear"
_S = "exllamav3.loader.safetensors.SafetensorsCollection"
_ROUTER = ["bsz", "cfg", "y", "params"]

EXPECTED: dict = {
    _B: {"kind": "class", "bases": ["BlockSparseMLP_CPU", "Module"]},
    _B + ".__init__": {"kind": "callable", "params": [
        "self", "config", "key", "hidden_size", "intermediate_size", "num_experts", "num_experts_per_tok",
        "key_up=", "key_gate=", "key_down=", "key_routing_gate=", "key_e_score_bias=", "qmap=", "out_dtype=",
        "activation_fn=", "act_limit=", "interm_dtype=", "router_type=", "routed_scaling_factor=", "n_group=",
        "topk_group=", "shared_experts=", "routing_first=", "routing_last="]},
    _B + ".load": {"kind": "callable", "params": ["self", "device", "**kwargs"]},
    _B + ".load_local": {"kind": "callable", "params": ["self", "**kwargs"]},
    _B + ".load_routing": {"kind": "callable", "params": ["self", "**kwargs"]},
    _B + ".forward": {"kind": "callable", "params": ["self", "x", "params", "out_dtype="]},
    _B + ".unload": {"kind": "callable", "params": ["self"]},
    _C: {"kind": "class", "bases": ["object"]},
    _C + ".cpu_maybe_offload_load": {"kind": "callable", "params": ["self", "device", "**kwargs"]},
    _C + ".cpu_maybe_split_load": {"kind": "callable", "params": ["self", "device", "**kwargs"]},
    _C + ".cpu_post_load": {"kind": "callable", "params": ["self"]},
    _C + ".cpu_unload": {"kind": "callable", "params": ["self"]},
    _C + ".cpu_split_submit": {"kind": "callable", "params": ["self", "y", "bsz", "selected_experts",
                                                              "routing_weights"]},
    _C + ".cpu_offload_issue": {"kind": "callable", "params": ["self", "shape", "y", "selected_experts",
                                                               "routing_weights", "params"]},
    _C + ".cpu_offload_forward": {"kind": "callable", "params": ["self", "shape", "y", "selected_experts",
                                                                 "routing_weights", "params"]},
    _C + ".cpu_split_permuted": {"kind": "callable", "params": ["self"]},
    _C + ".cpu_split_combine": {"kind": "callable", "params": ["self", "final_hidden_states", "cpu_partial",
                                                               "cpu_pending", "shape"]},
    _R + ".routing_std": {"kind": "callable", "params": _ROUTER},
    _R + ".routing_std_bias": {"kind": "callable", "params": _ROUTER},
    _R + ".routing_ds3": {"kind": "callable", "params": _ROUTER},
    _R + ".routing_dots": {"kind": "callable", "params": _ROUTER},
    _R + ".routing_sqrtsp": {"kind": "callable", "params": _ROUTER},
    _R + ".routing_sqrtsp_hash": {"kind": "callable", "params": _ROUTER},
    _R + ".RoutingCFG": {"kind": "fields", "fields": [
        "gate_tensor", "num_experts", "num_experts_per_tok", "routing_weights_bsz1", "selected_experts_bsz1",
        "e_score_correction_bias", "routed_scaling_factor"]},
    "exllamav3.modules.multilinear.MultiLinear.__init__": {"kind": "callable", "params": [
        "self", "device", "linears", "allow_bias="]},
    "exllamav3.modules.quant.exl3.LinearEXL3.__init__": {"kind": "callable", "params": [
        "self", "config", "in_features", "out_features", "scale=", "su=", "sv=", "suh=", "svh=", "trellis=", "mcg=",
        "mul1=", "bias=", "out_dtype=", "transformers_fix=", "key="]},
    "exllamav3.modules.mlp.GatedMLP.__init__": {"kind": "callable", "params": [
        "self", "config", "key", "hidden_size", "intermediate_size", "key_up=", "key_gate=", "key_down=", "qmap=",
        "out_dtype=", "activation_fn=", "interm_dtype=", "act_limit=", "select_hq_bits="]},
    "exllamav3.loader.safetensors.SafetensorsCollection.__init__": {"kind": "callable", "params": [
        "self", "directory", "load_method=", "tensor_name_fixes="]},
    # the load path moetier_load redirects: each routed expert's Linear.load -> load_exl3 asks the block's tensor
    # collection for {key}.trellis / .suh / .svh (get_tensor, by keyword options) and its codebook marker
    _L + ".__init__": {"kind": "callable", "params": [
        "self", "config", "key", "in_features", "out_features", "qmap=", "alt_key=", "fkey="]},
    _L + ".load": {"kind": "callable", "params": ["self", "device", "**kwargs"]},
    _L + ".load_exl3": {"kind": "callable", "params": ["self", "key"]},
    _S + ".get_tensor": {"kind": "callable", "params": [
        "self", "key", "device=", "optional=", "allow_bf16=", "float2half=", "no_defer=", "transpose=", "pad_to=",
        "fidx=", "arena="]},
    _S + ".get_codebook_marker": {"kind": "callable", "params": ["self", "key", "value"]},
    _S + ".get_tensor_meta": {"kind": "callable", "params": ["self", "key", "optional="]},
    _S + ".has_tensor": {"kind": "callable", "params": ["self", "key"]},
}


def _vstr(v) -> str:
    return ".".join(str(p) for p in v)


def _parse_version(text: str) -> tuple:
    out = []
    for part in text.split(".")[:3]:
        digits = "".join(ch for ch in part if ch.isdigit())
        out.append(int(digits) if digits else 0)
    return tuple(out + [0] * (3 - len(out)))


def version_line(version: str | None) -> str:
    """'' if ``version`` is in VERSIONS, else the one line saying what is installed and what is accepted."""
    lo, hi = VERSIONS
    want = f">={_vstr(lo)},<{_vstr(hi)}"
    if version is None:
        return f"{ENGINE} is not installed (the adapter needs {ENGINE} {want}: pip install 'moetier[exllamav3]')"
    if not lo <= _parse_version(version) < hi:
        return f"{ENGINE} {version} is installed; the adapter's hook surface is pinned to {want}"
    return ""


@dataclass
class Report(surface.Report):
    standin: bool = False              # the engine was imported with the stand-in extension


def import_engine() -> bool:
    """Import exllamav3's MoE modules; returns whether the stand-in extension was used. Where torch sees a CUDA
    device the engine imports as it is (its compiled or JIT-built extension); elsewhere the stand-in goes in first.
    ImportError if the engine cannot be imported."""
    from adapters.exllamav3 import standin
    used = standin.installed()
    if not used:
        import torch
        if not torch.cuda.is_available():
            used = standin.install() is not None
    import exllamav3.modules.block_sparse_mlp  # noqa: F401  (imports ext, routing, the CPU split base)
    return used


def installed_version() -> str | None:
    return surface.installed_version(ENGINE)


def check(expected: dict | None = None) -> Report:
    """Compare the installed engine with ``expected`` (default EXPECTED). Never raises for a mismatch."""
    expected = EXPECTED if expected is None else expected
    version = installed_version()
    rep = Report(version=version, standin=False, expected=expected)
    line = version_line(version)
    if line:
        rep.mismatches.append(line)
        if version is None:
            return rep
    try:
        rep.standin = import_engine()
    except ImportError as e:
        rep.mismatches.append(f"{ENGINE} {version} does not import: {e}")
        return rep
    rep.found = found_surface(expected)
    rep.mismatches += [f"{ENGINE} {version}: {m}" for m in check_surface(expected, rep.found)]
    return rep


def require(expected: dict | None = None) -> Report:
    """check(), raising SurfaceMismatch with the first mismatch (one line) if there is any."""
    rep = check(expected)
    if rep.mismatches:
        raise SurfaceMismatch(rep.mismatches[0])
    return rep


def _fmt(desc: dict) -> str:
    k = desc.get("kind")
    if k == "callable":
        return "(" + ", ".join(desc["params"]) + ")"
    if k == "class":
        return "class(" + ", ".join(desc["bases"]) + ")"
    if k == "fields":
        return "fields " + ", ".join(desc["fields"])
    if k == "missing":
        return "MISSING: " + desc.get("why", "")
    return k or "?"


def adapter_check(out=print, expected: dict | None = None) -> Report:
    """``moetier adapter check exllamav3``: print each expected hook beside what the installed engine has (nothing
    to print where the engine is missing) and return the Report; the caller turns ``mismatches[0]`` into its one
    error line and exit status 2."""
    rep = check(expected)
    lo, hi = VERSIONS
    out(f"{ENGINE} {rep.version or '(not installed)'}; adapter pinned to >={_vstr(lo)},<{_vstr(hi)}"
        + ("; compiled extension: stand-in" if rep.standin else ""))
    for name, want in rep.expected.items():
        got = rep.found.get(name)
        if got is None:
            continue
        mark = "ok" if not check_surface({name: want}, {name: got}) else "MISMATCH"
        out(f"  {mark:8s} {name} {_fmt(got)}")
    if not rep.mismatches:
        out(f"{len(rep.expected)} hooks match")
    return rep
