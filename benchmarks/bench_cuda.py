"""CUDA backend benchmark: kernel and link efficiency against measured copy bandwidths (JSON + table).

Figures (GB/s = 1e9 bytes/s):

* d2d_copy_gbps: cudaMemcpyAsync device -> device of 1 GiB, bytes copied per second (the DRAM traffic is twice
  that: every byte is read and written). Denominator of the gpu-lane kernel efficiency.
* h2d_pinned_gbps: cudaMemcpyAsync of 256 MiB from pinned (cudaHostRegister'ed) host memory. Denominator of the
  push and zerocopy figures.
* per geometry (tiny-ci int8 256x128; GLM-like int4g32 4096x2048, 12.6 MB of nibbles + 3.1 MB of
  group scales = 15.7 MB read per expert):
  - gpu_kernel_gbps: one layer-lane launch set (quant, gate/up, quant, down) over ``n`` VRAM-resident experts with
    one token row each, timed with CUDA events around the launches only; bytes = n * layout.weight_bytes.
    gpu_fraction_of_d2d = gpu_kernel_gbps / d2d_copy_gbps (target >= 0.6 on the GLM geometry).
  - zerocopy_gbps: the same launches reading RAM slots through their mapped device alias (bytes cross PCIe).
  - push_gbps: ``n`` back-to-back pushes (RAM slot -> VRAM slot on the copy stream), first event to last.
  - lane_ms: wall time of backend.compute (what the runtime pays, including x upload, y download and sync) for
    1 and 8 experts x 1 row and 1 expert x 2 rows, per lane; fitted to the engine-record cost model.

``--write-engine`` rewrites registry/engine/cuda-cupy.json with the tiny geometry's fitted lane costs and push
cost (measured values replace the initial estimates); ``--apply bench_cuda.json`` does the same later, without a GPU,
from a saved result (the device check brings one back). Without a GPU it prints one line saying why and exits 0.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from moetier.bytes import expert  # noqa: E402
from moetier.core import records as spec  # noqa: E402
from moetier.bytes import store  # noqa: E402
from moetier.measure.bench import best_seconds  # noqa: E402

TARGET_GPU_FRACTION = 0.6


def _skip_reason():
    try:
        import cupy
    except Exception as e:
        return f"cupy not installed ({type(e).__name__}: {e}): pip install 'moetier[cuda12]'"
    try:
        if not cupy.cuda.is_available():
            return "no CUDA device: cupy.cuda.is_available() is False"
    except Exception as e:
        return f"CUDA unavailable: {e}"
    return None


def _events(cp):
    return cp.cuda.Event(), cp.cuda.Event()


def _time_ms(cp, stream, fn, reps: int, warm: int = 2) -> float:
    """Best-of-reps ms of fn() enqueued on stream, timed with CUDA events."""
    with stream:
        for _ in range(warm):
            fn()
        stream.synchronize()
        best = float("inf")
        for _ in range(reps):
            a, b = _events(cp)
            a.record(stream)
            fn()
            b.record(stream)
            b.synchronize()
            best = min(best, cp.cuda.get_elapsed_time(a, b))
    return best


def d2d_copy_gbps(cp, nbytes=1 << 30, reps=10) -> float:
    rt = cp.cuda.runtime
    src = cp.ones(nbytes, cp.uint8)
    dst = cp.empty_like(src)
    s = cp.cuda.Stream(non_blocking=True)
    ms = _time_ms(cp, s, lambda: rt.memcpyAsync(dst.data.ptr, src.data.ptr, nbytes, rt.memcpyDeviceToDevice, s.ptr), reps)
    del src, dst
    return nbytes / (ms * 1e-3) / 1e9


def h2d_pinned_gbps(cp, nbytes=256 << 20, reps=10) -> float:
    from moetier.bytes.transport import SlotPool
    rt = cp.cuda.runtime
    pool = SlotPool(1, nbytes)
    rt.hostRegister(pool.base, pool.nbytes, 0x01 | 0x02)
    try:
        v = pool.view(0)
        v[:] = 1                                     # touch the pages
        del v
        dst = cp.empty(nbytes, cp.uint8)
        s = cp.cuda.Stream(non_blocking=True)
        ms = _time_ms(cp, s, lambda: rt.memcpyAsync(dst.data.ptr, pool.base, nbytes, rt.memcpyHostToDevice, s.ptr), reps)
        del dst
    finally:
        rt.hostUnregister(pool.base)
        pool.close()
    return nbytes / (ms * 1e-3) / 1e9


def _model(name, hidden, ffn, encoding, experts):
    m = json.loads(json.dumps(spec.load_record("model", "moetier-tiny-ci-int8")))
    lay = expert.layout(hidden, ffn, encoding)
    m["id"] = name
    m["moe"].update(layers=1, experts=experts, expert_bytes=lay.record_bytes)
    m["store"] = {"format": "record", "record_bytes": lay.record_bytes, "hidden": hidden, "ffn": ffn,
                  "encoding": encoding, "layout": lay.to_json()}
    return m


def bench_geometry(cp, name, hidden, ffn, encoding, *, distinct, nvram, nram, reps, workdir, progress):
    from backends.cuda.backend import CudaBackend
    lay = expert.layout(hidden, ffn, encoding)
    d = os.path.join(workdir, name)
    t0 = time.perf_counter()
    store.pack(_model(name, hidden, ffn, encoding, distinct), d)
    st = store.open_store(d)
    progress(f"{name}: packed {distinct} records of {lay.record_bytes:,} B in {time.perf_counter() - t0:.1f} s")
    be = CudaBackend(st, ram_slots=max(nram, distinct), vram_slots=nvram)
    try:
        # RAM slots: key i % distinct; VRAM slots: pushed from the RAM slot of the same key
        for i in range(nram):
            be.wait(be.fill(i % distinct, i))
        t = time.perf_counter()
        hs = [be.push(i % distinct, i % nram, i) for i in range(nvram)]
        for h in hs:
            be.wait(h)
        host_push_s = time.perf_counter() - t
        rb = lay.record_bytes
        # push bandwidth: back-to-back pushes timed on the copy stream
        rt = cp.cuda.runtime
        cs = be.copy_stream
        npush = min(nvram, nram)

        def pushes():
            for i in range(npush):
                rt.memcpyAsync(be.vram_ptr(i), be.pool.addr(i), rb,
                               rt.memcpyHostToDevice, cs.ptr)
        push_ms = _time_ms(cp, cs, pushes, reps)
        push_gbps = npush * rb / (push_ms * 1e-3) / 1e9

        x1 = np.random.default_rng(0).standard_normal((max(nvram, nram), hidden)).astype(np.float32)

        def kernel_gbps(ptrs):
            n = len(ptrs)
            table = np.zeros((n, 3), np.int64)
            table[:, 0] = np.asarray(ptrs, np.uint64).view(np.int64)
            table[:, 1] = np.arange(n)
            table[:, 2] = 1
            with be.compute_stream:
                d_jobs = cp.asarray(table)
                d_x = cp.asarray(x1[:n])
            ms = _time_ms(cp, be.compute_stream, lambda: be._launch(d_jobs, n, n, d_x), reps)
            return n * lay.weight_bytes / (ms * 1e-3) / 1e9, ms

        gpu_gbps, gpu_ms = kernel_gbps([be.vram_ptr(i) for i in range(nvram)])
        g1_gbps, g1_ms = kernel_gbps([be.vram_ptr(0)])
        zc_gbps, zc_ms = kernel_gbps([be.ram_device_ptr(i) for i in range(nram)])

        # lane wall times through compute() (what the runtime sees)
        def wall_ms(lane, n, rows):
            jobs = [(i, i, list(range(rows))) for i in range(n)]
            be.compute(lane, jobs, x1)                 # warm
            return best_seconds(lambda: be.compute(lane, jobs, x1), reps) * 1e3

        lane_ms = {}
        for lane in sorted(be.capabilities.lanes):
            if lane == "cpu" and lay.weight_bytes > 4 << 20:
                continue                       # the numba lane on the GLM geometry is another benchmark's job
            t1, t8, t12 = wall_ms(lane, 1, 1), wall_ms(lane, min(8, nvram, nram), 1), wall_ms(lane, 1, 2)
            n8 = min(8, nvram, nram)
            pe = max(0.0, (t8 - t1) / (n8 - 1)) if n8 > 1 else t1
            lane_ms[lane] = {"t_1x1": t1, f"t_{n8}x1": t8, "t_1x2": t12,
                             "per_layer_ms": max(0.0, t1 - pe), "per_expert_ms": pe,
                             "per_extra_token_ms": max(0.0, t12 - t1)}
        return {
            "geometry": name, "hidden": hidden, "ffn": ffn, "encoding": encoding,
            "record_bytes": rb, "weight_bytes": lay.weight_bytes,
            "gpu_experts_per_launch": nvram, "gpu_kernel_ms": gpu_ms, "gpu_kernel_gbps": gpu_gbps,
            "gpu_one_expert_ms": g1_ms, "gpu_one_expert_gbps": g1_gbps,
            "zerocopy_experts_per_launch": nram, "zerocopy_kernel_ms": zc_ms, "zerocopy_gbps": zc_gbps,
            "push_records": npush, "push_ms": push_ms, "push_gbps": push_gbps,
            "push_ms_per_record": push_ms / npush, "host_push_wait_s": host_push_s,
            "lane_ms": lane_ms,
        }
    finally:
        be.close()


def write_engine(tiny: dict, path_note: str) -> Path:
    rec = spec.load_record("engine", "cuda-cupy")
    notes = {"gpu": "measured: compute() wall time on VRAM slots (launches + x upload + y download + sync)",
             "zerocopy": "measured: compute() wall time reading pinned mapped RAM slots",
             "cpu": "measured: the Numba cpu lane run by the cuda backend"}
    for lane, m in tiny["lane_ms"].items():
        reads = "vram" if lane == "gpu" else "ram"
        rec["lanes"][lane] = {"reads": reads, "per_layer_ms": round(m["per_layer_ms"], 5),
                              "per_expert_ms": round(m["per_expert_ms"], 5),
                              "per_extra_token_ms": round(m["per_extra_token_ms"], 5),
                              "note": f"{notes[lane]} ({tiny['geometry']})"}
    rec["costs"] = {"push_ms": round(tiny["push_ms_per_record"], 5),
                    "note": f"measured: back-to-back pushes of {tiny['record_bytes']:,} B records on the copy stream"}
    rec["source"] = f"benchmarks/bench_cuda.py --write-engine, {path_note}"
    return spec.write_record("engine", rec)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", action="store_true", help="print one JSON object (the table goes to stderr)")
    ap.add_argument("--out", help="also write the JSON to this file")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--quick", action="store_true", help="fewer experts on the GLM geometry")
    ap.add_argument("--write-engine", action="store_true", help="rewrite registry/engine/cuda-cupy.json lane costs")
    ap.add_argument("--workdir", help="where to pack the bench stores (default: a temporary directory)")
    ap.add_argument("--apply", metavar="BENCH_JSON",
                    help="no GPU needed: rewrite registry/engine/cuda-cupy.json from a saved --json result")
    a = ap.parse_args(argv)
    tab = sys.stderr if a.json else sys.stdout
    if a.apply:
        saved = json.loads(Path(a.apply).read_text())
        if saved.get("skipped") or not saved.get("geometries"):
            print(f"bench_cuda: {a.apply} holds no measurements ({saved.get('skipped', 'no geometries')})")
            return 2
        p = write_engine(saved["geometries"][0], f"{saved['device']}, applied from {Path(a.apply).name}")
        print(f"bench_cuda: wrote {p}")
        return 0

    def progress(msg):
        print(f"bench_cuda: {msg}", file=sys.stderr, flush=True)

    why = _skip_reason()
    if why:
        print(f"bench_cuda: skipped: {why}", file=tab)
        res = {"skipped": why}
        if a.json:
            print(json.dumps(res))
        if a.out:
            Path(a.out).write_text(json.dumps(res, indent=2) + "\n")
        return 0
    import cupy as cp
    props = cp.cuda.runtime.getDeviceProperties(0)
    name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
    res = {"device": name, "cc": f"{props['major']}.{props['minor']}", "cupy": cp.__version__,
           "cuda_runtime": cp.cuda.runtime.runtimeGetVersion(), "cuda_driver": cp.cuda.runtime.driverGetVersion(),
           "host": platform.node(), "target_gpu_fraction_of_d2d": TARGET_GPU_FRACTION}
    progress(f"device {name}")
    res["d2d_copy_gbps"] = d2d_copy_gbps(cp, reps=a.reps)
    progress(f"d2d copy {res['d2d_copy_gbps']:.0f} GB/s (bytes copied; DRAM traffic x2)")
    res["h2d_pinned_gbps"] = h2d_pinned_gbps(cp, reps=a.reps)
    progress(f"pinned h2d {res['h2d_pinned_gbps']:.1f} GB/s")
    work = a.workdir or tempfile.mkdtemp(prefix="bench_cuda_")
    try:
        return _run(a, cp, res, work, tab, progress, name)
    finally:
        if not a.workdir:
            shutil.rmtree(work, ignore_errors=True)


def _run(a, cp, res, work, tab, progress, name) -> int:
    geos = [("tiny-int8", 256, 128, "int8", 8, 64, 32),
            ("glm-int4g32", 4096, 2048, "int4g32", 4, 16 if a.quick else 32, 16),
            ("glm-int8", 4096, 2048, "int8", 2, 8 if a.quick else 16, 8)]
    res["geometries"] = []
    for gname, H, F, enc, distinct, nvram, nram in geos:
        g = bench_geometry(cp, gname, H, F, enc, distinct=distinct, nvram=nvram, nram=nram, reps=a.reps,
                           workdir=work, progress=progress)
        g["gpu_fraction_of_d2d"] = g["gpu_kernel_gbps"] / res["d2d_copy_gbps"]
        g["zerocopy_fraction_of_h2d"] = g["zerocopy_gbps"] / res["h2d_pinned_gbps"]
        g["push_fraction_of_h2d"] = g["push_gbps"] / res["h2d_pinned_gbps"]
        res["geometries"].append(g)
        progress(f"{gname}: gpu {g['gpu_kernel_gbps']:.0f} GB/s ({g['gpu_fraction_of_d2d']:.2f} of d2d), "
                 f"zerocopy {g['zerocopy_gbps']:.1f} GB/s, push {g['push_gbps']:.1f} GB/s")
    glm = next(g for g in res["geometries"] if g["geometry"] == "glm-int4g32")
    res["gpu_target_met"] = glm["gpu_fraction_of_d2d"] >= TARGET_GPU_FRACTION
    if a.write_engine:
        p = write_engine(res["geometries"][0], f"{name}, {time.strftime('%Y-%m-%d')}")
        res["engine_record"] = str(p.relative_to(ROOT))
        progress(f"wrote {p}")

    print(f"\nCUDA backend on {name}: d2d copy {res['d2d_copy_gbps']:.0f} GB/s, pinned H2D "
          f"{res['h2d_pinned_gbps']:.1f} GB/s", file=tab)
    hdr = f"{'geometry':<13} {'rec MB':>7} {'gpu n':>5} {'gpu GB/s':>9} {'/d2d':>5} {'1-exp ms':>8} " \
          f"{'zc GB/s':>8} {'/h2d':>5} {'push GB/s':>9} {'/h2d':>5}"
    print(hdr, file=tab)
    for g in res["geometries"]:
        print(f"{g['geometry']:<13} {g['record_bytes'] / 1e6:7.2f} {g['gpu_experts_per_launch']:5d} "
              f"{g['gpu_kernel_gbps']:9.0f} {g['gpu_fraction_of_d2d']:5.2f} {g['gpu_one_expert_ms']:8.3f} "
              f"{g['zerocopy_gbps']:8.1f} {g['zerocopy_fraction_of_h2d']:5.2f} {g['push_gbps']:9.1f} "
              f"{g['push_fraction_of_h2d']:5.2f}", file=tab)
    for g in res["geometries"]:
        for lane, m in g["lane_ms"].items():
            print(f"  {g['geometry']:<13} {lane:<9} per_layer {m['per_layer_ms']:.4f} ms  per_expert "
                  f"{m['per_expert_ms']:.4f} ms  per_extra_token {m['per_extra_token_ms']:.4f} ms", file=tab)
    print(f"target: gpu lane >= {TARGET_GPU_FRACTION} of d2d copy on glm-int4g32: "
          f"{'MET' if res['gpu_target_met'] else 'NOT MET'}", file=tab)
    if a.json:
        print(json.dumps(res))
    if a.out:
        Path(a.out).write_text(json.dumps(res, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
