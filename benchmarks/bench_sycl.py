"""SYCL backend bandwidths: push (RAM slot -> device slot) vs plain USM memcpy, and gpu-lane weight bytes/s vs DRAM.

    .venv/bin/python benchmarks/bench_sycl.py [--records 256] [--encoding int8] [--hidden 1024 --ffn 512] [--json out]

Prints a table and a JSON object:
  push_gbps          many push() calls of one record each (host USM slot -> device slot, in-order copy queue),
                     bytes / wall time from first submit to the last event complete
  memcpy_gbps        one memcpy of a large host-USM buffer to device USM (the device's plain copy rate), same run
  gpu_weight_gbps    gpu lane, 1 row per expert, all records in one compute() call: weight_bytes * n / time
  zerocopy_weight_gbps  the same kernels reading the RAM (USM host) slots
  cpu_weight_gbps    the Numba host lane on the RAM slots, same jobs
  membw_read_gbps    backends.cpu.kernels.membw_read_gbps (numba prange read of 1 GiB)
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from backends.sycl.backend import SyclBackend, import_dpctl  # noqa: E402
from moetier.measure.bench import best_seconds  # noqa: E402
from moetier.bytes import store  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=256)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--ffn", type=int, default=512)
    ap.add_argument("--encoding", default="int8", choices=["int8", "int4g32"])
    ap.add_argument("--memcpy-mib", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", default=None, help="also write the JSON here")
    a = ap.parse_args(argv)
    dpctl = import_dpctl()
    import dpctl.memory as dm
    from backends.cpu.kernels import membw_read_gbps

    n = a.records
    model = {"id": "bench-sycl", "moe": {"layers": 1, "experts": n},
             "store": {"hidden": a.hidden, "ffn": a.ffn, "encoding": a.encoding}}
    tmp = tempfile.mkdtemp(prefix="bench-sycl-")
    store.pack(model, os.path.join(tmp, "s"), seed=1)
    st = store.open_store(os.path.join(tmp, "s"), model=model)
    be = SyclBackend(st, ram_slots=n, vram_slots=n)
    lay = st.layout
    rb = be.record_bytes
    for h in [be.fill(k, k) for k in range(n)]:
        be.wait(h)

    def pushes():
        hs = [be.push(k, k, k) for k in range(n)]
        for h in hs:
            be.wait(h)

    pushes()
    t_push = best_seconds(pushes, a.repeats)

    nb = a.memcpy_mib << 20
    q = be.cq
    src = dm.MemoryUSMHost(nb, queue=q)
    dst = dm.MemoryUSMDevice(nb, queue=q)
    np.frombuffer(src, np.uint8)[:] = 1
    q.memcpy(dst, src, nb)
    t_cpy = best_seconds(lambda: q.memcpy(dst, src, nb), a.repeats)

    x = np.random.default_rng(0).standard_normal((1, lay.hidden)).astype(np.float32)
    jobs = [(k, k, [0]) for k in range(n)]
    lane_t = {}
    for lane in ("gpu", "zerocopy", "cpu"):
        be.compute(lane, jobs, x)
        lane_t[lane] = best_seconds(lambda: be.compute(lane, jobs, x), a.repeats)
    bw = membw_read_gbps()
    wb = lay.weight_bytes * n
    res = {
        "device": be.capabilities.device, "dpctl": dpctl.__version__, "encoding": lay.encoding,
        "hidden": lay.hidden, "ffn": lay.ffn, "records": n, "record_bytes": rb, "weight_bytes": lay.weight_bytes,
        "push_gbps": rb * n / t_push / 1e9, "push_us_per_record": t_push / n * 1e6,
        "memcpy_gbps": nb / t_cpy / 1e9, "memcpy_mib": a.memcpy_mib,
        "gpu_weight_gbps": wb / lane_t["gpu"] / 1e9, "zerocopy_weight_gbps": wb / lane_t["zerocopy"] / 1e9,
        "cpu_weight_gbps": wb / lane_t["cpu"] / 1e9,
        "gpu_ms": lane_t["gpu"] * 1e3, "zerocopy_ms": lane_t["zerocopy"] * 1e3, "cpu_ms": lane_t["cpu"] * 1e3,
        "membw_read_gbps": bw,
        "odirect_into_usm_host": be.odirect_note is None,
    }
    be.close()
    print(f"SYCL backend on {res['device']} ({lay.encoding} H{lay.hidden} F{lay.ffn}, {n} records of {rb:,} B)")
    print("| measure | GB/s | vs |")
    print("|---|---|---|")
    print(f"| push (slot -> device slot, {n} x {rb // 1024} KiB) | {res['push_gbps']:.2f} | "
          f"{res['push_gbps'] / res['memcpy_gbps']:.0%} of memcpy |")
    print(f"| memcpy host USM -> device USM ({a.memcpy_mib} MiB) | {res['memcpy_gbps']:.2f} | |")
    for lane in ("gpu", "zerocopy", "cpu"):
        g = res[f"{lane}_weight_gbps"]
        print(f"| {lane} lane weight bytes/s (1 row x {n} experts, {lane_t[lane] * 1e3:.2f} ms) | {g:.2f} | "
              f"{g / bw:.0%} of membw |")
    print(f"| membw_read_gbps (numba, 1 GiB) | {bw:.2f} | |")
    print(json.dumps(res, indent=1))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)
    return res


if __name__ == "__main__":
    main()
