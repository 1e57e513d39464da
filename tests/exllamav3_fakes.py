"""Test-only fakes of exllamav3's CUDA kernels, so that the real BlockSparseMLP.forward runs on a CPU.

Each fake mirrors the real kernel's interface (the stand-in extension gets them as attributes):

* ``FakeRouter.routing_ds3_nogroup``: ext.routing_ds3_nogroup (the ``dots`` router's kernel) in torch: sigmoid
  scores, the selection bias for the choice only, weights normalised over the chosen set times the scaling factor,
  written into the caller's buffers;
* ``FakeBlockSparseBC``: ext.BC_BlockSparseMLP, built with the real constructor arguments; ``run_bszN`` (the decode
  path) computes every (row, slot) pick whose expert id is >= 0 by reading the expert's bytes *through the pointer
  tables it was built with* (the fused kernels' gu tables for gate/up, the down MultiLinear tables) and running the
  NumPy EXL3 reference with the engine's fp16 rounding points - the engine's gpu lane, stood in. It refuses a row
  that points outside every memory region it was told about, instead of reading stray memory;
* ``exl3_moe_max_concurrency``: 1.
"""
from __future__ import annotations

import ctypes

import numpy as np

from moetier.bytes import exl3

# argument positions of ext.BC_BlockSparseMLP in exllamav3 1.6.5 (blocksparse_mlp.h; adapters.md section 3.2)
A_DOWN = (28, 29, 30)          # down ptrs_trellis, ptrs_suh, ptrs_svh
A_ACT_LIMIT = 39
A_GU = (43, 44, 45)            # gu_trellis_ptr, gu_suh_ptr, gu_svh_ptr [E, 2]
A_OUT_BSZN = 46


class Memory:
    """The address ranges a fake kernel may read (slots, arenas, the modules' own tensors)."""

    def __init__(self):
        self.regions: list = []

    def add(self, start: int, nbytes: int) -> None:
        self.regions.append((int(start), int(start) + int(nbytes)))

    def add_tensor(self, t) -> None:
        self.add(t.data_ptr(), t.numel() * t.element_size())

    def read(self, addr: int, dtype, shape) -> np.ndarray:
        n = int(np.prod(shape)) * np.dtype(dtype).itemsize
        addr = int(addr)
        if not any(a <= addr and addr + n <= b for a, b in self.regions):
            raise AssertionError(f"a table row points at 0x{addr:x} (+{n}), outside every slot and tensor")
        raw = (ctypes.c_uint8 * n).from_address(addr)
        return np.frombuffer(raw, dtype).reshape(shape).copy()


class FakeRouter:
    def __init__(self):
        self.calls = 0

    def routing_ds3_nogroup(self, y, gate, logits, bias_h, sel, w, scale, gate_t, act, gate_i8, gate_sb):
        import torch
        self.calls += 1
        lg = y.float() @ gate.float()
        logits.copy_(lg.half())
        s = torch.sigmoid(lg)
        choice = s + bias_h.float() if bias_h is not None else s
        idx = torch.topk(choice, sel.shape[1], dim=-1).indices
        ws = s.gather(1, idx)
        ws = ws / ws.sum(-1, keepdim=True) * float(scale)
        sel.copy_(idx)
        w.copy_(ws.half())


class FakeBlockSparseBC:
    def __init__(self, memory: Memory, hidden: int, inter: int, K: int, *args, **kwargs):
        self.mem, self.H, self.I, self.K, self.args = memory, hidden, inter, K, args
        self.picks = 0
        self.on_run = None          # a test's check of the tables and selection as the kernel finds them

    def _lin(self, t_addr, s_addr, v_addr, k, n) -> exl3.Exl3Linear:
        rd = self.mem.read
        return exl3.Exl3Linear(rd(t_addr, np.int16, (k // 16, n // 16, 16 * self.K)), rd(s_addr, np.float16, (k,)),
                               rd(v_addr, np.float16, (n,)))

    def expert(self, e: int) -> exl3.Exl3Expert:
        gt, gs, gv = (self.args[i] for i in A_GU)
        dt, ds, dv = (self.args[i] for i in A_DOWN)
        H, I = self.H, self.I
        return exl3.Exl3Expert(self._lin(gt[e, 0], gs[e, 0], gv[e, 0], H, I),
                               self._lin(gt[e, 1], gs[e, 1], gv[e, 1], H, I),
                               self._lin(dt[e], ds[e], dv[e], I, H))

    def run_bszN(self, y, sel, w):
        import torch
        if self.on_run is not None:
            self.on_run(self, sel)
        act_limit = float(self.args[A_ACT_LIMIT] or 0.0)
        out = self.args[A_OUT_BSZN]
        yn = y.float().cpu().numpy()
        for r in range(y.shape[0]):
            acc = np.zeros(self.H, np.float64)
            for j in range(sel.shape[1]):
                e = int(sel[r, j])
                if e < 0:
                    continue
                self.picks += 1
                acc += exl3.expert_forward(yn[r:r + 1], self.expert(e), act_limit, float(w[r, j]), fp16=True)[0]
            out[r] = torch.from_numpy(acc.astype(np.float32))


class FakeEngine:
    """Installs the fakes on the stand-in extension for the duration of a ``with`` block."""

    def __init__(self, spec):
        """``spec``: the model's moetier.bytes.synth_exl3.SynthSpec (hidden, inter, bits)."""
        self.spec, self.memory, self.router = spec, Memory(), FakeRouter()
        self.bcs: list = []

    def __enter__(self):
        from adapters.exllamav3 import standin
        self.ext = standin.install()
        assert self.ext is not None, "these fakes are for the stand-in extension only"
        s = self.spec

        def make_bc(*args, **kwargs):
            bc = FakeBlockSparseBC(self.memory, s.hidden, s.inter, s.bits, *args, **kwargs)
            self.bcs.append(bc)
            return bc

        self.ext.routing_ds3_nogroup = self.router.routing_ds3_nogroup
        self.ext.BC_BlockSparseMLP = make_bc
        self.ext.exl3_moe_max_concurrency = lambda index: 1
        return self

    def __exit__(self, *exc):
        for name in ("routing_ds3_nogroup", "BC_BlockSparseMLP", "exl3_moe_max_concurrency"):
            self.ext.__dict__.pop(name, None)

    def load(self, model):
        """Finish loading the tiny model's blocks as the engine does on CUDA (load_local, load_routing), with the
        shared expert as the NumPy reference (fp16 points) in place of its kernels; remember the tensors' memory."""
        import torch
        for m in model.modules:
            sh = m.shared_experts
            if sh is not None:
                sh.bc = None                       # the shared expert runs beside the routed kernel, not fused in it
                expert = exl3.Exl3Expert(*(lin_of(ls[0]) for ls in (sh.gates, sh.ups, sh.downs)))

                def shared_forward(x, params, out_dtype=None, _e=expert, _lim=float(m.act_limit or 0.0)):
                    y = exl3.expert_forward(x.float().cpu().numpy().reshape(-1, self.spec.hidden), _e, _lim,
                                            fp16=True)
                    return torch.from_numpy(y.astype(np.float32))
                sh.forward = shared_forward
            m.load_local()
            m.load_routing()
            for ls in (m.gates, m.ups, m.downs):
                for lin in ls:
                    for t in (lin.inner.trellis, lin.inner.suh, lin.inner.svh):
                        self.memory.add_tensor(t)


def lin_of(linear) -> exl3.Exl3Linear:
    inner = linear.inner
    return exl3.Exl3Linear(inner.trellis.numpy(), inner.suh.numpy(), inner.svh.numpy())
