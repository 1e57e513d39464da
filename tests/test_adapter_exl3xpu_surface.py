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


def test_moe_forward_reads_only_known_memory_and_valid_ids():
    """The ops read exl3xpu's blobs (PLANAR4) through ptrs: the output equals the float64 expert within 2e-3."""
    from adapters.exl3xpu import blob
    from moetier.bytes import exl3
    ops = ProvidedOps()
    ex = exl3.random_expert(np.random.default_rng(1), 128, 128, 3)
    rb = surface.record_bytes(128, 128, 3)
    host = ops.host_alloc(2 * rb)
    host[:surface.blob_bytes(128, 128, 3)] = blob.pack(ex)
    base = int(host.ctypes.data)
    x = np.random.default_rng(2).standard_normal((2, 128)).astype(np.float32)
    ptrs = np.array([base, base + rb], np.int64)
    ids = np.array([[0, 1], [1, 0]], np.int32)
    w = np.array([[0.75, 0.0], [0.0, 0.5]], np.float32)        # expert 1's slot is zeros: weight 0 only
    y = ops.moe_forward(x, ids, w, ptrs, 128, 3, 2)
    want = exl3.expert_forward(x.astype(np.float64), ex, None) * np.array([[0.75], [0.5]])
    assert np.sqrt(np.mean((y - want) ** 2) / np.mean(want ** 2)) < 2e-3
    assert ops.usm_kind(base) == surface.USM_HOST and ops.usm_kind(1) == surface.USM_UNKNOWN
    with pytest.raises(OpError, match="not inside any host or device allocation"):
        ops.moe_forward(x, ids, w, np.array([base, 64], np.int64), 128, 3, 2)   # a weight-0 row is still read
    with pytest.raises(OpError, match="topk_ids outside 0..1"):
        ops.moe_forward(x, ids + 1, w, ptrs, 128, 3, 2)


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
