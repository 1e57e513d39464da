"""The exl3xpu adapter's checks on an Intel Arc machine (run by benchmarks/exl3xpu_arc_check.sh).

Checks, each reported as one line and written to --out:
1. surface: exl3xpu's own ops load (not moetier's provider) and match the pinned op surface and blob size;
2. memory: ``host_alloc`` gives USM host memory (``usm_kind`` 1), an XPU tensor is device memory (``usm_kind`` 2), and
   ``memcpy_async`` round-trips bytes host -> device -> host by address;
3. backend: the adapter's backend on exl3xpu's own ops (RAM slots in ``host_alloc`` memory, VRAM slots an XPU tensor):
   a fill, a push and a drain through the victim ring land exactly the store's bytes (as blobs);
4. tiny model on moetier's stand-in ops (the adapter's whole path, as in CI): eager mode under all-resident, RAM-only
   and NVMe-tail splits within rel RMS 2e-3 of the engine's own output with every expert at home.
Not checked yet (the exit status says so, 3): exl3xpu's ``moe_forward`` under the attached model - the tiny model's
method and the backend hand it numpy arrays, where the real op takes XPU tensors - so gpu vs zerocopy bit-identity on
the real kernel, tok/s with and without moetier and the simulator's prediction beside it.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

RESULTS: list = []


def report(name: str, ok: bool, detail: str) -> None:
    RESULTS.append({"check": name, "ok": bool(ok), "detail": detail})
    print(f"{'PASS' if ok else 'FAIL'} {name}: {detail}")


def rel_rms(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.sqrt(np.mean((a - b) ** 2) / np.mean(b ** 2)))


def backend_checks(table, st) -> None:
    from adapters.exl3xpu import blob
    from adapters.exl3xpu.backend import XpuBackend
    be = XpuBackend(st, table, ram_slots=4, vram_slots=2)
    try:
        ok = True
        for key in (3, 21):
            be.wait(be.fill(key, 0))
            be.wait(be.push(key, 0, 1))
            be.wait(be.drain(key, 1, 2))
            with open(st.data_path, "rb") as f:
                f.seek(st.offset(key))
                want = np.frombuffer(f.read(st.record_bytes), np.uint8)
            ok &= np.array_equal(be.read_vram(1), want) and np.array_equal(blob.record(st.layout, be._host[2]), want)
        be.fence()
        report(f"backend on {table.provider}", ok, f"fill, push and ring drain of 2 keys; ring claims {int(be.ring.meta[1])}, drops "
                              f"{be.ring.drops}")
    finally:
        be.close()


def tiny_store(work: Path):
    from adapters.exl3xpu import model
    from moetier.bytes import store
    model.write_tiny(work / "ckpt", seed=3)
    store.pack_checkpoint(work / "ckpt", work / "store")
    return store.open_store(work / "store")


def tiny_checks(work: Path, st) -> None:
    from adapters.exl3xpu import model, ops
    from adapters.exl3xpu.attach import attach
    from moetier.core.records import resolve
    R0 = resolve("tiny-ci-cuda")
    rng = np.random.default_rng(11)
    xs = [[rng.standard_normal((1, model.TINY.hidden)).astype(np.float32) for _ in range(2)] for _ in range(8)]
    m = model.build_model(work / "ckpt", ops.ProvidedOps())
    home = [[layer.forward(x) for layer, x in zip(m.layers, step)] for step in xs]
    for split, (vram, ram) in {"all-resident": (32, 0), "ram-only": (0, 32), "nvme-tail": (8, 12)}.items():
        R = dataclasses.replace(R0, layers=2, experts=16, topk=2, vram_slots=vram, ram_slots=ram)
        att = attach(m, R, st)
        worst = max(rel_rms(layer.forward(x), y)
                    for step, hs in zip(xs, home) for layer, x, y in zip(m.layers, step, hs))
        att.detach()
        report(f"tiny eager {split}", worst < 2e-3, f"rel RMS {worst:.2e} against the experts at home")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="run record (JSON) to write")
    args = ap.parse_args(argv)
    from adapters.exl3xpu import surface
    table = surface.op_table()
    rep = surface.check(table)
    real = table.provider == "exl3xpu"
    report("surface", rep.ok and real, rep.mismatches[0] if rep.mismatches else
           f"{len(rep.expected)} ops match ({table.provider})" + ("" if real else "; exl3xpu's own ops did not load"))
    work = Path(tempfile.mkdtemp(prefix="exl3xpu-arc-check-"))
    st = tiny_store(work)
    if real:
        import torch
        buf, back = table.host_alloc(4096), table.host_alloc(4096)
        dev = torch.empty(4096, dtype=torch.uint8, device="xpu")
        kinds = [int(table.usm_kind(int(t.data_ptr()))) for t in (buf, dev)]
        buf.copy_(torch.arange(4096, dtype=torch.int32).to(torch.uint8))
        table.memcpy_async(int(dev.data_ptr()), int(buf.data_ptr()), 4096)
        table.memcpy_async(int(back.data_ptr()), int(dev.data_ptr()), 4096)
        torch.xpu.synchronize()
        report("memory", kinds == [surface.USM_HOST, surface.USM_DEVICE] and torch.equal(buf, back),
               f"usm_kind host_alloc {kinds[0]}, XPU tensor {kinds[1]}")
    from adapters.exl3xpu.ops import ProvidedOps
    backend_checks(table if real else ProvidedOps(), st)
    tiny_checks(work, st)
    from moetier.atomic import atomic_write
    rec = {"kind": "exl3xpu-arc-check", "engine": {"exl3xpu": surface.installed_version()}, "ops": table.provider,
           "checks": RESULTS, "real_kernel": "not checked yet (moe_forward on XPU tensors under the attached model)"}
    atomic_write(args.out, lambda f: f.write(json.dumps(rec, indent=1).encode()))
    if not all(r["ok"] for r in RESULTS):
        return 1
    return 3


if __name__ == "__main__":
    sys.exit(main())
