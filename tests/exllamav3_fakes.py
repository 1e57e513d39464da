"""Test-only fakes of exllamav3's CUDA kernels, so that the real BlockSparseMLP.forward runs on a CPU.

Each fake mirrors the real kernel's interface (the stand-in extension gets them as attributes):

* ``FakeRouter.routing_ds3_nogroup``: ext.routing_ds3_nogroup (the ``dots`` router's kernel) in torch: sigmoid
  scores, the selection bias for the choice only, weights normalised over the chosen set times the scaling factor,
  written into the caller's buffers;
* ``FakeBlockSparseBC``: ext.BC_BlockSparseMLP, built with the real constructor arguments; ``run_bszN`` (the decode
  path) computes every (row, slot) pick whose routing weight is not 0 - the kernel's skip rule, not the expert id -
  by reading the expert's bytes *through the tables run_bszN reads*: the gate, up and down MultiLinear tables
  (``ptrs_trellis`` / ``ptrs_suh`` / ``ptrs_svh``, constructor arguments 16-18, 22-24 and 28-30 in exllamav3 1.6.5,
  modules/block_sparse_mlp.py; blocksparse_mlp.cpp's run_bszN passes those to its kernels), and running the NumPy
  EXL3 reference with the engine's fp16 rounding points - the engine's gpu lane, stood in. The fused kernels'
  ``gu_*_ptr`` [E, 2] tables (arguments 43-45) are stored by the CUDA build and never read on this path, so the
  fake never reads them either: an adapter that kept only those current computes stale experts here as on the GPU.
  It refuses a row that points outside every memory region it was told about, instead of reading stray memory;
* ``FakeLinearBC``: ext.BC_LinearEXL3, holding its trellis, suh and svh as the C++ struct's at::Tensor members hold
  them (a reference that keeps the memory alive), so a test can count what an engine object still keeps after
  moetier's hand-over; ``FakeBlockSparseBC`` likewise keeps its constructor arguments, the experts' BC_LinearEXL3
  lists among them;
* ``exl3_moe_max_concurrency``: 1.
"""
from __future__ import annotations

import ctypes
import weakref

import numpy as np

from moetier.bytes import exl3

# argument positions of ext.BC_BlockSparseMLP in exllamav3 1.6.5 (blocksparse_mlp.h; adapters.md section 3.2)
A_GATE = (16, 17, 18)          # gate MultiLinear ptrs_trellis, ptrs_suh, ptrs_svh [E]
A_UP = (22, 23, 24)            # up
A_DOWN = (28, 29, 30)          # down
A_ACT_LIMIT = 39
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


class FakeLinearBC:
    def __init__(self, trellis, suh, svh, *args):
        self.trellis, self.suh, self.svh, self.args = trellis, suh, svh, args


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
        H, I = self.H, self.I
        return exl3.Exl3Expert(*(self._lin(*(self.args[i][e] for i in a), k, n)
                                 for a, k, n in ((A_GATE, H, I), (A_UP, H, I), (A_DOWN, I, H))))

    def run_bszN(self, y, sel, w):
        import torch
        if self.on_run is not None:
            self.on_run(self, sel, w)
        act_limit = float(self.args[A_ACT_LIMIT] or 0.0)
        out = self.args[A_OUT_BSZN]
        yn = y.float().cpu().numpy()
        for r in range(y.shape[0]):
            acc = np.zeros(self.H, np.float64)
            for j in range(sel.shape[1]):
                if float(w[r, j]) == 0.0:       # the kernel skips a pick on its weight, whatever its id
                    continue
                e = int(sel[r, j])
                self.picks += 1
                acc += exl3.expert_forward(yn[r:r + 1], self.expert(e), act_limit, float(w[r, j]), fp16=True)[0]
            out[r] = torch.from_numpy(acc.astype(np.float32))


class FakeEngine:
    """Installs the fakes on the stand-in extension for the duration of a ``with`` block."""

    def __init__(self, spec):
        """``spec``: the model's moetier.bytes.synth_exl3.SynthSpec (hidden, inter, bits)."""
        self.spec, self.memory, self.router = spec, Memory(), FakeRouter()
        self.bcs = weakref.WeakSet()     # the live ones: a rebuilt block's old bound class is not kept alive here

    def __enter__(self):
        from adapters.exllamav3 import standin
        self.ext = standin.install()
        assert self.ext is not None, "these fakes are for the stand-in extension only"
        s = self.spec

        def make_bc(*args, **kwargs):
            bc = FakeBlockSparseBC(self.memory, s.hidden, s.inter, s.bits, *args, **kwargs)
            self.bcs.add(bc)
            return bc

        self.ext.routing_ds3_nogroup = self.router.routing_ds3_nogroup
        self.ext.BC_BlockSparseMLP = make_bc
        self.ext.BC_LinearEXL3 = FakeLinearBC
        self.ext.exl3_moe_max_concurrency = lambda index: 1
        return self

    def __exit__(self, *exc):
        for name in ("routing_ds3_nogroup", "BC_BlockSparseMLP", "BC_LinearEXL3", "exl3_moe_max_concurrency"):
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
