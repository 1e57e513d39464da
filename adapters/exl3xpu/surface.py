"""The exl3xpu op surface the adapter expects, the blob layout it pins, and the check of an op table against them.

Contract
--------
``EXPECTED`` is the surface (``adapters.surface`` format, keyed ``exl3xpu_moe.OP``) of the ``torch.ops.exl3xpu_moe``
ops the adapter calls - every one it calls, nothing else - with the argument lists of exl3xpu's ``exl3_moe.sycl``
``TORCH_LIBRARY`` block (adapters.md section 4.2): ``moe_forward``, ``host_alloc`` (USM host memory, a CPU uint8
tensor), ``usm_kind`` (0 unknown, 1 host, 2 device, 3 shared: ``USM_*``), ``memcpy_async(dst, src, nbytes)`` (byte
copy between two addresses on the current stream) and ``blob_bytes``. Device memory is not an op: it is torch's XPU
allocator (``device_allocator(table)``: ``torch.empty(n, uint8, device="xpu")``, or the stand-in's). ``address(buf)``
is a buffer's address and ``host_array(buf)`` a host buffer as a numpy array, for torch tensors and numpy arrays
alike; ``copy_event(table)`` / ``stream_sync(table)`` order the host after a ``memcpy_async`` (the stand-in's copies
are synchronous: None). ``blob_bytes(H, I, K)`` / ``record_bytes(H, I, K)`` are the expert blob's size and its store stride
(4096-aligned), ``QWEN`` the published Qwen3.8-Flash-Next geometry they must reproduce (blob 1,862,400 B, record
1,863,680 B).

``op_table(store)`` is the op table the adapter runs on: exl3xpu's own ops where exl3xpu imports (its ``_moe.so``
loaded by ``exl3xpu.moe_offload.ops()``), else moetier's provider (adapters.exl3xpu.ops: ``SyclOps`` on moetier's
SYCL EXL3 kernel where dpctl has a device, ``ProvidedOps`` on its CPU kernel otherwise; the same surface). ``check(table)``
returns a ``Report`` (never raises for a mismatch); ``require(table)`` raises ``SurfaceMismatch`` with the first
mismatch as one line (attach calls it); ``adapter_check()`` is ``moetier adapter check exl3xpu``.
"""
from __future__ import annotations

from dataclasses import dataclass

from adapters import surface
from adapters.surface import SurfaceMismatch, check_surface, describe
# the blob geometry and usm_kind's answers live in a leaf module that blob and ops read too (no import circle)
from adapters.exl3xpu.geometry import (ALIGN, PLANAR4_K, QWEN, USM_DEVICE, USM_HOST, USM_SHARED,  # noqa: F401
                                       USM_UNKNOWN, blob_bytes, record_bytes)

ENGINE = "exl3xpu"
NAMESPACE = "exl3xpu_moe"

OPS = {
    "moe_forward": ["x", "topk_ids", "topk_w", "ptrs", "I", "K", "n_experts"],
    "host_alloc": ["nbytes"],
    "usm_kind": ["ptr"],
    "memcpy_async": ["dst", "src", "nbytes"],
    "blob_bytes": ["H", "I", "K"],
}
EXPECTED: dict = {f"{NAMESPACE}.{op}": {"kind": "callable", "params": list(p)} for op, p in OPS.items()}


def installed_version() -> str | None:
    return surface.installed_version(ENGINE)


class EngineOps:
    """exl3xpu's own ops (``torch.ops.exl3xpu_moe``), once its ``_moe.so`` is loaded; attributes are the ops."""

    provider = "exl3xpu"

    def __init__(self):
        import torch
        from exl3xpu import moe_offload
        moe_offload.ops()                  # loads _moe.so (EXL3_MOE_LIB), which registers the namespace
        self._ns = getattr(torch.ops, NAMESPACE)

    def __getattr__(self, op):
        return getattr(self._ns, op)

    def params(self, op: str) -> dict:
        """The op's description from its registered schema (arguments with a default end in '=')."""
        try:
            schema = getattr(self._ns, op).default._schema
        except (AttributeError, RuntimeError) as e:
            return {"kind": "missing", "why": f"no op {NAMESPACE}.{op} ({e})"}
        return {"kind": "callable", "params": [a.name + ("=" if a.has_default_value() else "")
                                               for a in schema.arguments]}


def s64(p: int) -> int:
    """An address as the signed int64 an int64 tensor holds (exl3xpu's own wrapper, ``s64`` in
    https://github.com/sybil-solutions/qwen38-flash-next-b70-offload/blob/30d1b5b94d15f020ed926350d37341d7269d3692/plugin/exl3xpu/moe_offload.py): an
    address at or above 2^63 - a device address may be - wraps to a negative value instead of overflowing the table."""
    p = int(p)
    return p - (1 << 64) if p >= (1 << 63) else p


def address(buf) -> int:
    """The address of a torch tensor's or numpy array's first byte, as ``s64`` writes it (what ``memcpy_async`` and
    ``ptrs`` take)."""
    return s64(buf.data_ptr() if hasattr(buf, "data_ptr") else buf.ctypes.data)


def device_input(table):
    """``array -> the op's device input``: under exl3xpu's ops an XPU tensor (``moe_forward`` takes XPU tensors only),
    under moetier's stand-in a copy in its device memory (ops.device_array), which its ``moe_forward`` requires."""
    import numpy as np
    if isinstance(table, EngineOps):
        import torch
        return lambda a: torch.from_numpy(np.ascontiguousarray(a)).to("xpu")
    from adapters.exl3xpu import ops
    return lambda a: ops.device_array(table, a)


def host_array(buf):
    """A host buffer (host_alloc's CPU tensor, or the stand-in's array) as a flat uint8 numpy array, no copy."""
    import numpy as np
    a = buf.numpy() if hasattr(buf, "numpy") and not isinstance(buf, np.ndarray) else buf
    return a.reshape(-1).view(np.uint8)


def device_allocator(table):
    """``nbytes -> device buffer`` for ``table``: torch's XPU allocator under exl3xpu's own ops, the stand-in's
    ``device_empty`` under moetier's (the only way the stand-in learns of device memory)."""
    if isinstance(table, EngineOps):
        import torch
        return lambda n: torch.empty(int(n), dtype=torch.uint8, device="xpu")
    from adapters.exl3xpu import ops
    return lambda n: ops.device_empty(table, n)


def copy_event(table):
    """After a ``memcpy_async``: an event that completes with it on the current stream (``torch.xpu.Event``, with
    ``query`` / ``synchronize``) under exl3xpu's ops; None under the stand-in, whose copies are done on return."""
    if isinstance(table, EngineOps):
        import torch
        ev = torch.xpu.Event()
        ev.record()
        return ev
    return None


def stream_sync(table):
    """``() -> None`` waiting for the current stream's copies (exl3xpu's ops); None where copies are synchronous."""
    if isinstance(table, EngineOps):
        import torch
        return lambda: torch.xpu.current_stream().synchronize()
    return None


def op_table(store=None, **provider_kw):
    """exl3xpu's ops where the engine imports with its kernels; else moetier's provider of the same surface: on
    moetier's SYCL EXL3 kernel when a ``store`` (the records' geometry) is given and dpctl finds a device, else on its
    EXL3 CPU kernel."""
    if installed_version() is not None:
        try:
            return EngineOps()
        except (ImportError, OSError, RuntimeError):
            pass                           # no XPU / no _moe.so: the provider runs the same surface
    from adapters.exl3xpu.ops import ProvidedOps, SyclOps
    if store is not None:
        from moetier.run.contract import BackendUnavailable
        try:
            return SyclOps(store, **provider_kw)
        except (ImportError, BackendUnavailable):
            pass                           # no dpctl / no SYCL device: the CPU kernel
    return ProvidedOps(**provider_kw)


def found_surface(table, expected: dict) -> dict:
    """What ``table`` offers under each expected ``exl3xpu_moe.OP`` name."""
    out = {}
    for name in expected:
        op = name.split(".", 1)[1]
        if hasattr(table, "params"):
            out[name] = table.params(op)
        elif callable(getattr(table, op, None)):
            out[name] = describe(getattr(table, op), "callable")
        else:
            out[name] = {"kind": "missing", "why": f"{table.provider} has no op {op!r}"}
    return out


@dataclass
class Report(surface.Report):
    provider: str = ""                 # exl3xpu, or moetier's provider of its ops


def check(table=None, expected: dict | None = None) -> Report:
    """Compare ``table`` (default op_table()) with ``expected`` (default EXPECTED), and its blob_bytes with QWEN."""
    expected = EXPECTED if expected is None else expected
    table = op_table() if table is None else table
    rep = Report(version=installed_version(), provider=table.provider, expected=expected)
    rep.found = found_surface(table, expected)
    rep.mismatches = [f"{table.provider}: {m}" for m in check_surface(expected, rep.found)]
    if not rep.mismatches and f"{NAMESPACE}.blob_bytes" in expected:
        got = int(table.blob_bytes(QWEN["H"], QWEN["I"], QWEN["K"]))
        if got != QWEN["blob"]:
            rep.mismatches.append(f"{table.provider}: blob_bytes(2560, 640, 3) is {got}, the pinned blob layout "
                                  f"has {QWEN['blob']}")
    return rep


def require(table=None, expected: dict | None = None) -> Report:
    rep = check(table, expected)
    if rep.mismatches:
        raise SurfaceMismatch(rep.mismatches[0])
    return rep


def adapter_check(out=print, expected: dict | None = None, table=None) -> Report:
    """``moetier adapter check exl3xpu``: each expected op beside what the op table has; the caller turns
    ``mismatches[0]`` into its one error line and exit status 2."""
    rep = check(table, expected)
    src = ("exl3xpu " + rep.version) if rep.provider == "exl3xpu" else (
        f"exl3xpu {'(' + rep.version + ', no XPU) ' if rep.version else '(not installed) '}"
        f"- ops provided by {rep.provider}")
    out(f"{src}; blob {QWEN['blob']} B / record {QWEN['rec']} B at the Qwen geometry")
    for name, want in rep.expected.items():
        got = rep.found.get(name, {"kind": "missing", "why": "not looked up"})
        mark = "ok" if not check_surface({name: want}, {name: got}) else "MISMATCH"
        shown = "(" + ", ".join(got["params"]) + ")" if got["kind"] == "callable" else " MISSING: " + got.get("why", "")
        out(f"  {mark:8s} {name}{shown}")
    if not rep.mismatches:
        out(f"{len(rep.expected)} ops match")
    return rep
