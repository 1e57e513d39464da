"""The CUDA backend's kernel and link figures, interleaved (benchmarks/device/check.sh, step ``kernels``).

    python benchmarks/device/kernel_figures.py --out FIGURES.json [--rounds 7] [--experts 16]

Three expert geometries of GLM-5.3-Flash's size (hidden 4096, intermediate 2048): int8, int4g32 and EXL3 (K=3, mul1).
Each round runs, in one fixed order, every measurement once: a device-to-device cudaMemcpyAsync of 256 MiB; then per
geometry the gpu lane over ``experts`` VRAM-resident experts with one token row each (the backend's own launches,
CUDA events around them), ``experts`` pushes and ``experts`` drains through the backend (RAM slot <-> VRAM slot on its
copy stream), and one cudaMemcpyAsync host -> device and one device -> host of the same bytes between pinned host
memory and VRAM in a single call (the copy engine at its best). Interleaving puts a clock or power drift into every
figure of a round alike instead of into one figure. Reported over the rounds, as min / median / max:

* ``gpu_over_d2d``: (experts x weight bytes / gpu lane time) / (bytes copied / d2d copy time), same round;
* ``push_over_h2d``: push bytes/s / one-call H2D bytes/s, same round; ``drain_over_d2h`` likewise;
* the bytes/s themselves (1e9 bytes/s = GB/s).

Without a CUDA device (cupy missing or no GPU) it writes ``{"skipped": why}`` and exits 0, as benchmarks/bench_cuda.py
does; the figures need the device.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_cuda import _skip_reason  # noqa: E402
from moetier.bytes import expert, store  # noqa: E402
from moetier.core import records  # noqa: E402

HIDDEN, FFN = 4096, 2048
GEOMETRIES = (("int8", {}), ("int4g32", {}), ("exl3", {"bits": 3, "codebook": "mul1"}))
COPY_BYTES = 256 << 20


def model_record(encoding: str, distinct: int, **exl3) -> dict:
    """The tiny CI model's record reshaped to one layer of ``distinct`` GLM-sized experts of ``encoding``."""
    m = json.loads(json.dumps(records.load_record("model", "moetier-tiny-ci-int8")))
    lay = expert.layout(HIDDEN, FFN, encoding, **exl3)
    m["id"] = f"device-figures-{encoding}"
    m["moe"].update(layers=1, experts=distinct, expert_bytes=lay.record_bytes)
    m["store"] = {"format": "record", "record_bytes": lay.record_bytes, "hidden": HIDDEN, "ffn": FFN,
                  "encoding": encoding, **exl3}
    return m


def spread(values) -> dict:
    return {"min": min(values), "median": statistics.median(values), "max": max(values), "n": len(values)}


class Timer:
    """Milliseconds of work enqueued on a stream, between two CUDA events."""

    def __init__(self, cp):
        self.cp = cp

    def __call__(self, stream, fn) -> float:
        a, b = self.cp.cuda.Event(), self.cp.cuda.Event()
        with stream:
            a.record(stream)
            fn()
            b.record(stream)
        b.synchronize()
        return self.cp.cuda.get_elapsed_time(a, b)


class Geometry:
    """One geometry's backend over a packed store: ``n`` RAM slots filled, ``n`` VRAM slots pushed, a pinned host
    buffer and a VRAM buffer of n records for the one-call copies."""

    def __init__(self, cp, encoding, exl3, n, distinct, work):
        from backends.cuda.backend import CudaBackend
        from moetier.bytes.transport import SlotPool
        self.cp, self.encoding, self.n = cp, encoding, n
        d = Path(work) / encoding
        store.pack(model_record(encoding, distinct, **exl3), str(d))
        self.be = be = CudaBackend(store.open_store(str(d)), ram_slots=n, vram_slots=n)
        self.lay = be.layout
        self.rb = be.record_bytes
        for i in range(n):
            be.wait(be.fill(i % distinct, i))
        for h in [be.push(i % distinct, i, i) for i in range(n)]:
            be.wait(h)
        rt = cp.cuda.runtime
        self.pinned = SlotPool(1, n * self.rb)
        rt.hostRegister(self.pinned.base, self.pinned.nbytes, 0x01 | 0x02)
        v = self.pinned.view(0)
        v[:] = 1                                     # the pages touched before any copy is timed
        del v
        self.vbuf = cp.empty(n * self.rb, cp.uint8)
        x = np.random.default_rng(0).standard_normal((n, HIDDEN)).astype(np.float32)
        table = np.zeros((n, 3), np.int64)
        table[:, 0] = np.asarray([be.vram_ptr(i) for i in range(n)], np.uint64).view(np.int64)
        table[:, 1] = np.arange(n)
        table[:, 2] = 1
        with be.compute_stream:
            self.d_jobs, self.d_x = cp.asarray(table), cp.asarray(x)

    def launch(self):
        be = self.be
        if be.exl3 is not None:
            return be.exl3.forward(self.lay, self.d_jobs, [1] * self.n, self.d_x)
        return be._launch(self.d_jobs, self.n, self.n, self.d_x)

    def transfers(self, kind):
        be = self.be
        hs = [be.push(i, i, i) if kind == "push" else be.drain(i, i, i) for i in range(self.n)]
        return hs

    def one_call(self, direction):
        rt = self.cp.cuda.runtime
        nbytes = self.n * self.rb
        if direction == "h2d":
            rt.memcpyAsync(self.vbuf.data.ptr, self.pinned.base, nbytes, rt.memcpyHostToDevice,
                           self.be.copy_stream.ptr)
        else:
            rt.memcpyAsync(self.pinned.base, self.vbuf.data.ptr, nbytes, rt.memcpyDeviceToHost,
                           self.be.copy_stream.ptr)

    def close(self):
        self.cp.cuda.runtime.hostUnregister(self.pinned.base)
        self.pinned.close()
        self.be.close()


def measure(cp, rounds: int, n: int, distinct: int, work: str, progress) -> dict:
    rt = cp.cuda.runtime
    timer = Timer(cp)
    src = cp.ones(COPY_BYTES, cp.uint8)
    dst = cp.empty_like(src)
    s = cp.cuda.Stream(non_blocking=True)
    geos = []
    try:
        for enc, exl3 in GEOMETRIES:
            t = time.perf_counter()
            geos.append(Geometry(cp, enc, exl3, n, distinct, work))
            progress(f"{enc}: {n} experts of {geos[-1].rb:,} B ready in {time.perf_counter() - t:.1f} s")
        raw = {"d2d_gbps": []}
        for g in geos:
            for k in ("gpu_gbps", "push_gbps", "drain_gbps", "h2d_gbps", "d2h_gbps"):
                raw[f"{g.encoding}.{k}"] = []
        for r in range(rounds + 1):              # round 0 warms every path (compiles, first touches): not kept
            ms = timer(s, lambda: rt.memcpyAsync(dst.data.ptr, src.data.ptr, COPY_BYTES, rt.memcpyDeviceToDevice,
                                                 s.ptr))
            row = {"d2d_gbps": COPY_BYTES / ms / 1e6}
            for g in geos:
                wb, tb = n * g.lay.weight_bytes, n * g.rb
                row[f"{g.encoding}.gpu_gbps"] = wb / timer(g.be.compute_stream, g.launch) / 1e6
                for kind in ("push", "drain"):
                    hs = []
                    ms = timer(g.be.copy_stream, lambda: hs.extend(g.transfers(kind)))
                    for h in hs:
                        g.be.wait(h)
                    row[f"{g.encoding}.{kind}_gbps"] = tb / ms / 1e6
                for d in ("h2d", "d2h"):
                    row[f"{g.encoding}.{d}_gbps"] = tb / timer(g.be.copy_stream, lambda: g.one_call(d)) / 1e6
            if r:
                for k, v in row.items():
                    raw[k].append(v)
            progress(f"round {r}{' (warm-up)' if not r else ''}: d2d {row['d2d_gbps']:.0f} GB/s, " + ", ".join(
                f"{g.encoding} gpu {row[g.encoding + '.gpu_gbps']:.0f}" for g in geos))
        out = {"rounds": rounds, "experts": n, "copy_bytes": COPY_BYTES, "d2d_gbps": spread(raw["d2d_gbps"]),
               "geometries": {}}
        for g in geos:
            e = g.encoding
            ratio = {"gpu_over_d2d": [a / b for a, b in zip(raw[f"{e}.gpu_gbps"], raw["d2d_gbps"])],
                     "push_over_h2d": [a / b for a, b in zip(raw[f"{e}.push_gbps"], raw[f"{e}.h2d_gbps"])],
                     "drain_over_d2h": [a / b for a, b in zip(raw[f"{e}.drain_gbps"], raw[f"{e}.d2h_gbps"])]}
            out["geometries"][e] = {
                "record_bytes": g.rb, "weight_bytes": g.lay.weight_bytes,
                **{k.split(".", 1)[1]: spread(v) for k, v in raw.items() if k.startswith(e + ".")},
                **{k: spread(v) for k, v in ratio.items()}}
        return out
    finally:
        for g in geos:
            g.close()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="where to write the figures (JSON)")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--experts", type=int, default=16, help="experts per gpu launch, push set and drain set")
    ap.add_argument("--distinct", type=int, default=2,
                    help="distinct records packed per geometry (an int8 GLM-sized record takes seconds to make)")
    a = ap.parse_args(argv)
    for name in ("rounds", "experts", "distinct"):
        if getattr(a, name) < 1:
            print(f"kernel_figures: --{name}: expected a positive integer, got {getattr(a, name)}", file=sys.stderr)
            return 2

    def progress(msg):
        print(f"kernel_figures: {msg}", file=sys.stderr, flush=True)

    why = _skip_reason()
    if why:
        Path(a.out).write_text(json.dumps({"skipped": why}, indent=2) + "\n")
        print(f"kernel_figures: skipped: {why}")
        return 0
    import cupy as cp
    props = cp.cuda.runtime.getDeviceProperties(0)
    name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
    with tempfile.TemporaryDirectory(prefix="kernel_figures_") as work:
        res = {"device": name, "cc": f"{props['major']}.{props['minor']}", "cupy": cp.__version__,
               **measure(cp, a.rounds, a.experts, min(a.distinct, a.experts), work, progress)}
    Path(a.out).write_text(json.dumps(res, indent=2) + "\n")
    for e, g in res["geometries"].items():
        print(f"{e:8s} gpu/d2d {g['gpu_over_d2d']['min']:.2f} / {g['gpu_over_d2d']['median']:.2f} / "
              f"{g['gpu_over_d2d']['max']:.2f}  push/h2d {g['push_over_h2d']['median']:.2f}  "
              f"drain/d2h {g['drain_over_d2h']['median']:.2f}  (min / median / max over {res['rounds']} rounds)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
