"""Benchmark the CPU lane expert kernels against memory read bandwidth, side by side in one run.

    .venv/bin/python benchmarks/bench_kernels.py [--json] [--mib 256] [--repeats 3] [--geoms 1024x512,2048x1024]

For each geometry and encoding it streams over >= --mib MiB of distinct expert records (so caches do not help),
one token row per expert, and reports weight bytes streamed per second and the ratio to the all-core read
bandwidth (numba prange sum, best of 5). numpy float32 GEMV (OpenBLAS sgemv over dense f32 expert weights) is the
floor/comparison. It also reports ms per expert call at rows 1, 2, 4, 8 and a least-squares fit
ms = per_expert + per_extra_token * (rows - 1).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

from backends.cpu import kernels as K  # noqa: E402
from moetier.measure.bench import best_seconds  # noqa: E402
from moetier.bytes import expert as E  # noqa: E402


def _slab(lay, n):
    rec = np.frombuffer(E.make_expert(lay, 1, 0), np.uint8)
    slab = np.empty(n * lay.record_bytes, np.uint8)
    slab.reshape(n, lay.record_bytes)[...] = rec  # distinct memory, same content
    return slab, [slab[i * lay.record_bytes:(i + 1) * lay.record_bytes] for i in range(n)]


def bench_geometry(H, F, mib, repeats, membw):
    rng = np.random.default_rng(0)
    res = {"hidden": H, "ffn": F, "encodings": {}}
    for enc in E.ENCODINGS:
        lay = E.layout(H, F, enc)
        K.warmup(lay)
        n = max(8, -(-(mib << 20) // lay.record_bytes))
        slab, bufs = _slab(lay, n)
        x1 = rng.standard_normal((1, H)).astype(np.float32)
        xs = np.repeat(x1[None], n, axis=0)
        out = np.empty((1, H), np.float32)

        def per_call():
            for b in bufs:
                K.expert_forward(lay, b, x1, out)

        def batched():
            K.experts_forward(lay, bufs, xs)

        nt = K.get_num_threads()
        pool = ThreadPoolExecutor(nt)
        shares = [bufs[i::nt] for i in range(nt)]

        def serial_share(share, xr, o):
            for b in share:
                K.expert_forward(lay, b, xr, o, parallel=False)

        def threads_serial(xr=x1):
            outs = [np.empty((xr.shape[0], H), np.float32) for _ in range(nt)]
            list(pool.map(serial_share, shares, [xr] * nt, outs))

        t_call = best_seconds(per_call, repeats)
        t_batch = best_seconds(batched, repeats)
        t_thr = best_seconds(threads_serial, repeats)
        gb = n * lay.weight_bytes / 1e9
        ms_rows, ms_rows_thr = {}, {}
        for rows in (1, 2, 4, 8):
            xr = rng.standard_normal((rows, H)).astype(np.float32)
            o = np.empty((rows, H), np.float32)

            def go():
                for b in bufs:
                    K.expert_forward(lay, b, xr, o)

            ms_rows[rows] = best_seconds(go, repeats) / n * 1e3
            ms_rows_thr[rows] = best_seconds(lambda: threads_serial(xr), repeats) / n * 1e3
        pool.shutdown()
        r = np.array(list(ms_rows)) - 1.0
        m = np.array(list(ms_rows.values()))
        slope, icpt = np.polyfit(r, m, 1)
        slope_t, icpt_t = np.polyfit(r, np.array(list(ms_rows_thr.values())), 1)
        res["encodings"][enc] = {
            "record_bytes": lay.record_bytes, "weight_bytes": lay.weight_bytes, "experts": n,
            "stream_mib": round(n * lay.record_bytes / 2**20, 1),
            "gbps_per_call": gb / t_call, "ratio_per_call": gb / t_call / membw,
            "gbps_batched": gb / t_batch, "ratio_batched": gb / t_batch / membw,
            "gbps_threads_serial": gb / t_thr, "ratio_threads_serial": gb / t_thr / membw,
            "ms_per_expert_by_rows": {str(k): round(v, 4) for k, v in ms_rows.items()},
            "fit_ms": {"per_expert": round(float(icpt), 4), "per_extra_token": round(float(slope), 4)},
            "ms_per_expert_by_rows_threads_serial": {str(k): round(v, 4) for k, v in ms_rows_thr.items()},
            "fit_ms_threads_serial": {"per_expert": round(float(icpt_t), 4), "per_extra_token": round(float(slope_t), 4)},
        }
        del slab, bufs
    # numpy float32 GEMV floor: the same expert math over dense f32 weights.
    nf = max(4, -(-(mib << 20) // (3 * H * F * 4)))
    Wg = rng.standard_normal((nf, F, H), dtype=np.float32) / np.float32(np.sqrt(H))
    Wu = rng.standard_normal((nf, F, H), dtype=np.float32) / np.float32(np.sqrt(H))
    Wd = rng.standard_normal((nf, H, F), dtype=np.float32) / np.float32(np.sqrt(F))
    x = rng.standard_normal(H).astype(np.float32)

    def np_expert():
        for i in range(nf):
            g = Wg[i] @ x
            u = Wu[i] @ x
            Wd[i] @ (g / (1 + np.exp(-g)) * u)

    t = best_seconds(np_expert, repeats)
    gb = nf * 3 * H * F * 4 / 1e9
    res["numpy_f32_gemv"] = {"experts": nf, "gbps": gb / t, "ratio": gb / t / membw, "ms_per_expert": t / nf * 1e3}
    return res


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print only the JSON result")
    ap.add_argument("--mib", type=int, default=256, help="MiB of expert records streamed per measurement")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None, help="numba threads (default: all cores)")
    ap.add_argument("--geoms", default="1024x512,2048x1024", help="comma list of HIDDENxFFN")
    a = ap.parse_args(argv)
    if a.threads:
        K.set_num_threads(a.threads)
    membw = K.membw_read_gbps(1 << 30, threads=a.threads)
    out = {"threads": K.get_num_threads(), "membw_read_gbps": membw,
           "membw_read_gbps_1thread": K.membw_read_gbps(1 << 30, threads=1), "geometries": []}
    for g in a.geoms.split(","):
        H, F = (int(v) for v in g.lower().split("x"))
        out["geometries"].append(bench_geometry(H, F, a.mib, a.repeats, membw))
    out["membw_read_gbps_after"] = K.membw_read_gbps(1 << 30, threads=a.threads)
    if a.json:
        print(json.dumps(out, indent=1))
        return 0
    print(f"threads {out['threads']}  membw read (numba prange sum, 1 GiB): {membw:.1f} GB/s "
          f"(again at the end: {out['membw_read_gbps_after']:.1f}; one thread: {out['membw_read_gbps_1thread']:.1f})")
    print("GB/s = weight bytes streamed per second, 1 row per expert; ratio = GB/s / membw.\n"
          "call = expert_forward per expert (parallel region); batch = one experts_forward over all;\n"
          "thr = expert_forward(parallel=False) per expert from one Python thread per core. ms = per expert call.")
    print(f"{'geometry':<11}{'kernel':<16}{'call':>7}{'ratio':>6}{'batch':>7}{'ratio':>6}{'thr':>7}{'ratio':>6}"
          f"  {'mode':<5}{'ms r1':>7}{'r2':>7}{'r4':>7}{'r8':>7}{'+tok':>8}")
    for g in out["geometries"]:
        geo = f"{g['hidden']}x{g['ffn']}"
        for enc, r in g["encodings"].items():
            for i, (mode, ms, fit) in enumerate((("call", r["ms_per_expert_by_rows"], r["fit_ms"]),
                                                  ("thr", r["ms_per_expert_by_rows_threads_serial"],
                                                   r["fit_ms_threads_serial"]))):
                head = (f"{geo:<11}{enc:<16}{r['gbps_per_call']:>7.2f}{r['ratio_per_call']:>6.2f}"
                        f"{r['gbps_batched']:>7.2f}{r['ratio_batched']:>6.2f}"
                        f"{r['gbps_threads_serial']:>7.2f}{r['ratio_threads_serial']:>6.2f}") if i == 0 else " " * 66
                print(f"{head}  {mode:<5}{ms['1']:>7.3f}{ms['2']:>7.3f}{ms['4']:>7.3f}{ms['8']:>7.3f}"
                      f"{fit['per_extra_token']:>8.4f}")
        f = g["numpy_f32_gemv"]
        print(f"{geo:<11}{'numpy f32 gemv':<16}{f['gbps']:>7.2f}{f['ratio']:>6.2f}{'':>26}  {'':<5}"
              f"{f['ms_per_expert']:>7.3f}")
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
