"""The exl3xpu adapter's op surface: moetier's stand-in for the ``exl3xpu_moe`` ops offers exactly the pinned surface
and blob layout; an altered op table, or one without an op the adapter calls, fails with one line; ``moetier adapter
check exl3xpu``."""
from __future__ import annotations

import numpy as np
import pytest

from adapters.exl3xpu import surface
from adapters.exl3xpu.ops import OpError, ProvidedOps


class AlteredOps(ProvidedOps):
    """A fake: the provider as if upstream had dropped moe_forward's n_experts argument."""

    provider = "altered copy"

    def moe_forward(self, x, topk_ids, topk_w, ptrs, I, K):  # noqa: E741
        return super().moe_forward(x, topk_ids, topk_w, ptrs, I, K, len(ptrs))


class MissingOp:
    """A fake op table: moetier's stand-in with one op taken away (as if upstream had dropped it)."""

    def __init__(self, missing: str):
        self._inner, self._missing = ProvidedOps(), missing
        self.provider = f"fake table without {missing}"

    def __getattr__(self, op):
        if op == self._missing:
            raise AttributeError(op)
        return getattr(self._inner, op)


def test_blob_layout_reproduces_the_published_qwen_record():
    q = surface.QWEN
    assert surface.blob_bytes(q["H"], q["I"], q["K"]) == q["blob"]
    assert surface.record_bytes(q["H"], q["I"], q["K"]) == q["rec"]
    assert surface.record_bytes(256, 128, 3) % surface.ALIGN == 0


def test_provided_ops_pass_the_pinned_surface_and_offer_nothing_more():
    rep = surface.check(ProvidedOps())
    assert rep.ok, rep.mismatches
    assert set(rep.found) == set(surface.EXPECTED) and rep.provider.startswith("moetier")
    public = {n for n in dir(ProvidedOps()) if not n.startswith("_")}
    assert public == set(surface.OPS) | {"provider", "calls"}, public - set(surface.OPS)


@pytest.mark.parametrize("op", sorted(surface.OPS))
def test_a_table_without_an_op_the_adapter_calls_fails_with_one_line(op):
    rep = surface.check(MissingOp(op))
    assert rep.mismatches == [f"fake table without {op}: {op}: missing (fake table without {op} has no op {op!r}) "
                              f"[exl3xpu_moe.{op}]"]


def test_altered_op_table_fails_with_one_line():
    rep = surface.check(AlteredOps())
    assert rep.mismatches == ["altered copy: moe_forward: parameter 'n_experts' missing (expected (x, topk_ids, "
                              "topk_w, ptrs, I, K, n_experts), found (x, topk_ids, topk_w, ptrs, I, K))"]
    with pytest.raises(surface.SurfaceMismatch, match=r"^altered copy: moe_forward: parameter 'n_experts' missing"):
        surface.require(AlteredOps())
    lines = []
    assert surface.adapter_check(lines.append, table=AlteredOps()).mismatches == rep.mismatches
    assert sum("MISMATCH" in ln for ln in lines) == 1 and not lines[-1].endswith("ops match")


def test_cli_adapter_check(capsys, monkeypatch):
    from moetier.cli.main import main
    assert main(["adapter", "check", "exl3xpu"]) == 0
    out = capsys.readouterr().out
    assert "exl3xpu_moe.moe_forward(x, topk_ids, topk_w, ptrs, I, K, n_experts)" in out
    assert out.strip().endswith(f"{len(surface.EXPECTED)} ops match")
    monkeypatch.setattr(ProvidedOps, "moe_forward", AlteredOps.moe_forward)
    assert main(["adapter", "check", "exl3xpu"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "moe_forward: parameter 'n_experts' missing" in err[0], err
    monkeypatch.undo()
    monkeypatch.delattr(ProvidedOps, "memcpy_async")
    assert main(["adapter", "check", "exl3xpu"]) == 2
    cap = capsys.readouterr()
    err = cap.err.strip().splitlines()
    assert len(err) == 1 and "memcpy_async: missing" in err[0], err
    assert "MISSING" in cap.out


H_OK = I_OK = 640      # a geometry the real moe_forward takes (its work splits need H/16 and I/16 multiples of 40)


def _two_experts(ops, H=H_OK, I=I_OK):  # noqa: E741
    from adapters.exl3xpu import blob
    from moetier.bytes import exl3
    ex = exl3.random_expert(np.random.default_rng(1), H, I, 3)
    rb = surface.record_bytes(H, I, 3)
    host = ops.host_alloc(2 * rb)
    host[:surface.blob_bytes(H, I, 3)] = blob.pack(ex)
    return ex, host, rb


def test_moe_forward_reads_only_known_memory_and_valid_ids():
    """The ops read exl3xpu's blobs (PLANAR4) through ptrs: the output equals the float64 expert within 2e-3."""
    from adapters.exl3xpu.ops import device_array
    from moetier.bytes import exl3
    ops = ProvidedOps()
    ex, host, rb = _two_experts(ops)
    base = surface.address(host)
    dev = lambda a: device_array(ops, a)      # noqa: E731
    x = (np.random.default_rng(2).standard_normal((2, H_OK)) * 1e-2).astype(np.float16)   # fp16 out: no overflow
    ptrs = np.array([base, base + rb], np.int64)
    ids = np.array([[0, 1], [1, 0]], np.int32)
    w = np.array([[0.75, 0.0], [0.0, 0.5]], np.float32)        # expert 1's slot is zeros: weight 0 only
    y = ops.moe_forward(dev(x), dev(ids), dev(w), dev(ptrs), I_OK, 3, 2)
    assert y.dtype == np.float16 and ops.usm_kind(int(y.ctypes.data)) == surface.USM_DEVICE
    want = exl3.expert_forward(x.astype(np.float64), ex, None) * np.array([[0.75], [0.5]])
    assert np.sqrt(np.mean((y - want) ** 2) / np.mean(want ** 2)) < 2e-3
    assert ops.usm_kind(base) == surface.USM_HOST and ops.usm_kind(1) == surface.USM_UNKNOWN
    with pytest.raises(OpError, match="not inside any host or device allocation"):
        ops.moe_forward(dev(x), dev(ids), dev(w), dev(np.array([base, 64], np.int64)), I_OK, 3, 2)  # weight 0: read
    with pytest.raises(OpError, match="topk_ids outside 0..1"):
        ops.moe_forward(dev(x), dev(ids + 1), dev(w), dev(ptrs), I_OK, 3, 2)


def test_a_weight_0_pick_is_computed_as_the_kernel_computes_it():
    """The real kernel has no skip: weight 0 times a pick whose bytes decode to NaN is NaN in the output (moetier's
    masking must point such picks at landed bytes); the old skip would have hidden it."""
    from adapters.exl3xpu.ops import device_array
    ops = ProvidedOps()
    _, host, rb = _two_experts(ops)
    base = surface.address(host)
    nb = surface.blob_bytes(H_OK, I_OK, 3)
    host[rb + nb - 2 * H_OK:rb + nb] = np.full(H_OK, np.nan, np.float16).view(np.uint8)   # expert 1's svh_d: NaN
    dev = lambda a: device_array(ops, a)      # noqa: E731
    x = dev(np.full((1, H_OK), 1e-2, np.float16))
    ptrs = dev(np.array([base, base + rb], np.int64))
    y = ops.moe_forward(x, dev(np.array([[0, 1]], np.int32)), dev(np.array([[1.0, 0.0]], np.float32)), ptrs, I_OK,
                        3, 2)
    assert np.isnan(y).all()
    y = ops.moe_forward(x, dev(np.array([[0, 0]], np.int32)), dev(np.array([[1.0, 0.0]], np.float32)), ptrs, I_OK,
                        3, 2)
    assert np.isfinite(y).all()


@pytest.mark.parametrize("case, match", [
    ("host x", "x is not device memory"), ("fp32 x", "x dtype"), ("int64 ids", "topk_ids must be contiguous int32"),
    ("fp16 w", "topk_w must be contiguous float32"), ("K 4", "K=3 only"), ("I 128", "I/16 split"),
    ("H 256", "moe gateup"), ("E 1025", "E <= 1024"), ("3-D x", "2-D"),
])
def test_moe_forward_refuses_what_the_real_op_refuses(case, match):
    """The real op's checks (moe_forward_impl, launch_down in exl3_moe.sycl): dtype, device, contiguity, K and the
    kernels' work-split geometry - a tiny model of H 256 or I 128 is refused here as it is there."""
    from adapters.exl3xpu.ops import device_array
    ops = ProvidedOps()
    dev = lambda a: device_array(ops, a)      # noqa: E731
    H, I, K, E = H_OK, I_OK, 3, 2             # noqa: E741
    x, ids = np.zeros((1, H), np.float16), np.zeros((1, 1), np.int32)
    w, ptrs = np.ones((1, 1), np.float32), np.zeros(E, np.int64)
    args = {"x": dev(x), "ids": dev(ids), "w": dev(w), "ptrs": dev(ptrs)}
    if case == "host x":
        args["x"] = x
    elif case == "fp32 x":
        args["x"] = dev(x.astype(np.float32))
    elif case == "int64 ids":
        args["ids"] = dev(ids.astype(np.int64))
    elif case == "fp16 w":
        args["w"] = dev(w.astype(np.float16))
    elif case == "K 4":
        K = 4
    elif case == "I 128":
        I = 128                               # noqa: E741
    elif case == "H 256":
        args["x"] = dev(np.zeros((1, 256), np.float16))
    elif case == "E 1025":
        E = 1025
        args["ptrs"] = dev(np.zeros(E, np.int64))
    elif case == "3-D x":
        args["x"] = dev(x.reshape(1, 1, H))
    with pytest.raises(OpError, match=match):
        ops.moe_forward(args["x"], args["ids"], args["w"], args["ptrs"], I, K, E)


def test_addresses_are_written_as_s64():
    assert surface.s64(2 ** 64 - 8) == -8 and surface.s64(2 ** 63 - 1) == 2 ** 63 - 1
    a = np.zeros(8, np.uint8)
    assert surface.address(a) == int(a.ctypes.data)


def test_memcpy_async_copies_between_addresses_inside_its_memory_only():
    from adapters.exl3xpu.ops import device_empty
    ops = ProvidedOps()
    host, dev = ops.host_alloc(8192), device_empty(ops, 4096)
    assert host.ctypes.data % 4096 == 0 and ops.usm_kind(int(dev.ctypes.data)) == surface.USM_DEVICE
    host[:4096] = np.arange(4096) % 251
    ops.memcpy_async(int(dev.ctypes.data), int(host.ctypes.data), 4096)
    ops.memcpy_async(int(host.ctypes.data) + 4096, int(dev.ctypes.data), 4096)
    assert np.array_equal(host[4096:], host[:4096]) and np.array_equal(dev, host[:4096])
    stray = np.zeros(4096, np.uint8)
    with pytest.raises(OpError, match="not inside any host or device allocation"):
        ops.memcpy_async(int(stray.ctypes.data), int(host.ctypes.data), 4096)
    with pytest.raises(OpError, match=r"\+4097 B\) is not inside"):
        ops.memcpy_async(int(dev.ctypes.data), int(host.ctypes.data), 4097)


def test_arc_check_stops_when_exl3xpus_own_ops_do_not_load(monkeypatch, tmp_path, capsys):
    """benchmarks/exl3xpu_arc_check.py on a machine where exl3xpu imports but its _moe.so does not load: one line,
    exit 2, no check run on moetier's stand-in ops in its place."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("arc_check", surface.__file__.replace(
        "adapters/exl3xpu/surface.py", "benchmarks/exl3xpu_arc_check.py"))
    arc = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(arc)

    def no_lib():
        raise OSError("_moe.so: cannot open shared object file")
    monkeypatch.setattr(surface, "installed_version", lambda: "0.1.0")
    monkeypatch.setattr(surface, "EngineOps", no_lib)
    assert arc.main(["--out", str(tmp_path / "arc.json")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "_moe.so" in err and "did not load" in err
    assert arc.RESULTS == [] and not (tmp_path / "arc.json").exists()
