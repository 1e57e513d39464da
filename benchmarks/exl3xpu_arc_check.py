"""The exl3xpu adapter's checks on an Intel Arc machine (run by benchmarks/exl3xpu_arc_check.sh).

Checks, each reported as one line and written to --out:
1. surface: exl3xpu's own ops load (not moetier's provider) and match the pinned op surface and blob size;
2. memory: ``host_alloc`` gives USM host memory (``usm_kind``) and ``memcpy_async`` round-trips bytes through it;
3. tiny model on moetier's provider (the adapter's whole path, as in CI): eager mode under all-resident, RAM-only and
   NVMe-tail splits within rel RMS 2e-3 of the engine's own output with every expert at home.
Not checked yet (the exit status says so, 3): exl3xpu's ``moe_forward`` on the adapter's slots - the store holds
moetier exl3 records, not exl3xpu's PLANAR4 blobs, and the backend's slots are host numpy, not XPU memory - so gpu vs
zerocopy bit-identity on the real kernel, tok/s with and without moetier and the simulator's prediction beside it
need the blob packer and an XPU backend first.
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


def tiny_checks(work: Path) -> None:
    from adapters.exl3xpu import model, ops
    from adapters.exl3xpu.attach import attach
    from moetier.bytes import store
    from moetier.core.records import resolve
    model.write_tiny(work / "ckpt", seed=3)
    store.pack_checkpoint(work / "ckpt", work / "store")
    st = store.open_store(work / "store")
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
    if real:
        import torch
        buf = table.host_alloc(4096)
        kind = table.usm_kind(int(buf.data_ptr()))
        src = torch.arange(4096, dtype=torch.int32).to(torch.uint8)
        table.memcpy_async(buf, src, 4096)
        torch.xpu.synchronize()
        report("memory", str(kind).endswith("host") and torch.equal(buf, src), f"host_alloc usm_kind {kind}")
    tiny_checks(Path(tempfile.mkdtemp(prefix="exl3xpu-arc-check-")))
    from moetier.atomic import atomic_write
    rec = {"kind": "exl3xpu-arc-check", "engine": {"exl3xpu": surface.installed_version()}, "ops": table.provider,
           "checks": RESULTS, "real_kernel": "not checked yet (PLANAR4 records, XPU backend)"}
    atomic_write(args.out, lambda f: f.write(json.dumps(rec, indent=1).encode()))
    if not all(r["ok"] for r in RESULTS):
        return 1
    return 3


if __name__ == "__main__":
    sys.exit(main())
