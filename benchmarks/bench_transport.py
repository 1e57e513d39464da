"""Benchmark the O_DIRECT record reader (moetier.transport.Reader) against fio on the same file.

    .venv/bin/python benchmarks/bench_transport.py [--json] [--size-mib N] [--record-bytes B] [--reps R] [--dir D]

Creates a test file of --size-mib (default 1024) MiB holding whole records of --record-bytes (default: the record size
of a registry model that has a local store geometry, else the Qwen3.8 record 1,863,680 B), drops it from the page
cache before every pass (posix_fadvise DONTNEED), and reads every record once in a random order per pass:

  ours QD1        Reader(queue_depth=1), one fill+wait at a time (per-record latency p50/p90)
  ours QD16       Reader(queue_depth=16): 16 worker threads doing preadv, 32 fills submitted ahead
  ours QD16 4k    the same with SlotPool(hugepage=False): slots on 4 KiB pages, as fio's buffers are
  fio psync QD1   --ioengine=psync --numjobs=1
  fio psync 16j   --ioengine=psync --numjobs=16 (16 threads each doing blocking pread: like with like for ours QD16)
  fio libaio QD16 --ioengine=libaio --iodepth=16 --numjobs=1 (one thread, 16 async reads in flight)

Arms are interleaved (ours, fio, ours, fio, ...) over --reps passes to cancel drift; medians are reported. The ratio
ours/fio at QD16 is printed against both fio QD16 arms (target >= 0.9).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from moetier.measure.bench import drop_cache  # noqa: E402
from moetier.bytes.transport import Reader, SlotPool  # noqa: E402

FALLBACK_RECORD = 1_863_680  # Qwen3.8-Flash-Next record (registry/model/qwen3.8-flash-next-exl3-3.05bpw.json)


def default_record_bytes() -> tuple:
    """(record_bytes, source): a registry model with a local store geometry (store.hidden/ffn/encoding)."""
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "registry", "model")
    try:
        names = sorted(os.listdir(here))
    except OSError:
        names = []
    for name in names:
        if not name.endswith(".json"):
            continue
        try:
            with open(os.path.join(here, name)) as f:
                m = json.load(f)
            st = m.get("store") or {}
            if {"hidden", "ffn", "encoding"} <= set(st):
                from moetier.bytes.expert import layout

                return layout(st["hidden"], st["ffn"], st["encoding"]).record_bytes, f"registry model {m.get('id')}"
        except Exception:
            continue
    return FALLBACK_RECORD, "Qwen3.8-Flash-Next record (no local-geometry model in registry/model)"


class RawFile:
    """The four things a Reader needs from a store, over a plain file of whole records (no digests)."""

    def __init__(self, path: str, record_bytes: int, nrecords: int):
        self.data_path = path
        self.record_bytes = record_bytes
        self.nrecords = nrecords

    def offset(self, key: int) -> int:
        return key * self.record_bytes

    def digest(self, key: int):
        return None


def make_file(path: str, nbytes: int) -> None:
    rng = np.random.default_rng(1)
    chunk = 8 * 1024 * 1024
    block = rng.integers(0, 256, chunk, dtype=np.uint8).tobytes()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        done = 0
        i = 0
        while done < nbytes:
            n = min(chunk, nbytes - done)
            # vary each chunk a little so nothing below us can dedupe it
            buf = bytearray(block[:n])
            buf[:8] = i.to_bytes(8, "little")
            os.write(fd, buf)
            done += n
            i += 1
        os.fsync(fd)
    finally:
        os.close(fd)


def run_ours(raw: RawFile, qd: int, order, *, verify_rate: float = 0.0, hugepage: bool = True) -> dict:
    drop_cache(raw.data_path)
    ahead = 1 if qd == 1 else 2 * qd
    lat = []
    with SlotPool(ahead, raw.record_bytes, hugepage=hugepage) as pool, \
            Reader(raw, pool, queue_depth=qd, verify_rate=verify_rate) as rd:
        direct = rd.direct
        t0 = time.perf_counter()
        if qd == 1:
            for k in order:
                t = time.perf_counter()
                rd.wait(rd.fill(int(k), 0))
                lat.append((time.perf_counter() - t) * 1000.0)
        else:
            inflight = []
            free = list(range(ahead))
            i = 0
            n = len(order)
            while i < n or inflight:
                while i < n and free:
                    inflight.append(rd.fill(int(order[i]), free.pop()))
                    i += 1
                c = inflight.pop(0)
                rd.wait(c)
                free.append(c.slot)
        secs = time.perf_counter() - t0
        nbytes = rd.stats["bytes"]
    out = {"gbps": nbytes / secs / 1e9, "seconds": secs, "bytes": nbytes, "direct": direct}
    if lat:
        out["p50_ms"] = float(np.percentile(lat, 50))
        out["p90_ms"] = float(np.percentile(lat, 90))
    return out


def run_fio(path: str, bs: int, size: int, engine: str, iodepth: int, numjobs: int) -> dict:
    drop_cache(path)
    per_job = size // numjobs // bs * bs
    cmd = ["fio", "--name=x", f"--filename={path}", "--direct=1", "--rw=randread", f"--bs={bs}",
           f"--iodepth={iodepth}", f"--ioengine={engine}", f"--numjobs={numjobs}", f"--size={size}",
           f"--io_size={per_job}", "--group_reporting", "--output-format=json"]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"fio failed ({p.returncode}): {p.stderr.strip()[:400]}")
    txt = p.stdout
    j = json.loads(txt[txt.index("{"):])
    rd = j["jobs"][0]["read"]
    out = {"gbps": rd["bw_bytes"] / 1e9, "bytes": rd["io_bytes"], "seconds": rd["runtime"] / 1000.0,
           "cmd": " ".join(cmd)}
    pct = (rd.get("clat_ns") or {}).get("percentile") or {}
    if "50.000000" in pct:
        out["p50_ms"] = pct["50.000000"] / 1e6
        out["p90_ms"] = pct["90.000000"] / 1e6
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", action="store_true", help="print only the JSON result")
    ap.add_argument("--size-mib", type=int, default=1024, help="test file size in MiB (default 1024)")
    ap.add_argument("--record-bytes", type=float, default=None,
                    help="record size in bytes; a value < 4096 is read as MiB (1.5 -> 1.5 MiB); rounded to 4096")
    ap.add_argument("--reps", type=int, default=3, help="interleaved passes per arm (default 3)")
    ap.add_argument("--dir", default=None, help="folder for the test file (default: system temp dir)")
    a = ap.parse_args(argv)

    if a.record_bytes is None:
        rb, src = default_record_bytes()
    else:
        rb = a.record_bytes * 1024 * 1024 if a.record_bytes < 4096 else a.record_bytes
        src = "--record-bytes"
    rb = int((int(rb) + 4095) // 4096 * 4096)
    nrec = (a.size_mib * 1024 * 1024) // rb
    if nrec < 32:
        print(f"bench_transport: --size-mib {a.size_mib} holds only {nrec} records of {rb} B; need >= 32",
              file=sys.stderr)
        return 2
    size = nrec * rb
    fio = shutil.which("fio")
    log = (lambda *x: None) if a.json else (lambda *x: print(*x, flush=True))
    if not fio:
        log("fio not found: install it with `apt-get install -y fio`")

    d = tempfile.mkdtemp(prefix="moetier-bench-", dir=a.dir)
    path = os.path.join(d, "records.bin")
    res: dict = {}
    try:
        log(f"record {rb} B ({src}), {nrec} records, file {size / 2**20:.0f} MiB at {path}")
        make_file(path, size)
        raw = RawFile(path, rb, nrec)
        rng = np.random.default_rng(0)
        arms = [("ours_qd1", lambda o: run_ours(raw, 1, o))]
        if fio:
            arms.append(("fio_psync_qd1", lambda o: run_fio(path, rb, size, "psync", 1, 1)))
        arms.append(("ours_qd16", lambda o: run_ours(raw, 16, o)))
        arms.append(("ours_qd16_4k", lambda o: run_ours(raw, 16, o, hugepage=False)))
        if fio:
            arms.append(("fio_psync_16jobs", lambda o: run_fio(path, rb, size, "psync", 1, 16)))
            arms.append(("fio_libaio_qd16", lambda o: run_fio(path, rb, size, "libaio", 16, 1)))
        runs = {name: [] for name, _ in arms}
        for rep in range(a.reps):
            order = rng.permutation(nrec)
            for name, fn in arms:
                r = fn(order)
                runs[name].append(r)
                log(f"  pass {rep + 1} {name:<17} {r['gbps']:.3f} GB/s")
        for name, rs in runs.items():
            g = [r["gbps"] for r in rs]
            res[name] = {"gbps_median": statistics.median(g), "gbps_best": max(g), "gbps_all": g}
            for k in ("p50_ms", "p90_ms"):
                if k in rs[0]:
                    res[name][k] = statistics.median(r[k] for r in rs)
            if "direct" in rs[0]:
                res[name]["direct"] = rs[0]["direct"]
            if "cmd" in rs[0]:
                res[name]["cmd"] = rs[0]["cmd"]
    finally:
        shutil.rmtree(d, ignore_errors=True)

    out = {"record_bytes": rb, "record_source": src, "records": nrec, "file_bytes": size, "reps": a.reps,
           "order": "random record order, every record once per pass", "arms": res}
    if fio:
        ours = res["ours_qd16"]["gbps_median"]
        out["ratio_ours_qd16_vs_fio_psync_16jobs"] = ours / res["fio_psync_16jobs"]["gbps_median"]
        out["ratio_ours_qd16_vs_fio_libaio_qd16"] = ours / res["fio_libaio_qd16"]["gbps_median"]
        out["ratio_ours_qd16_4k_vs_fio_psync_16jobs"] = (res["ours_qd16_4k"]["gbps_median"]
                                                         / res["fio_psync_16jobs"]["gbps_median"])
        out["ratio_ours_qd1_vs_fio_psync_qd1"] = res["ours_qd1"]["gbps_median"] / res["fio_psync_qd1"]["gbps_median"]
        out["target"] = ">= 0.9 at QD16"
    else:
        out["fio"] = "not found: install it with `apt-get install -y fio`"

    if a.json:
        print(json.dumps(out, indent=2))
        return 0
    print()
    print(f"{'arm':<18} {'GB/s med':>9} {'GB/s best':>10} {'p50 ms':>8} {'p90 ms':>8}  how")
    how = {"ours_qd1": "Reader QD1, fill+wait one at a time",
           "ours_qd16": "Reader 16 worker threads (preadv), 32 submitted ahead",
           "ours_qd16_4k": "same, slots on 4 KiB pages (no MADV_HUGEPAGE), like fio's buffers",
           "fio_psync_qd1": "fio psync, 1 job",
           "fio_psync_16jobs": "fio psync, 16 jobs (16 threads in pread: like with like)",
           "fio_libaio_qd16": "fio libaio iodepth 16, 1 job"}
    for name, r in res.items():
        p50 = f"{r['p50_ms']:.2f}" if "p50_ms" in r else "-"
        p90 = f"{r['p90_ms']:.2f}" if "p90_ms" in r else "-"
        print(f"{name:<18} {r['gbps_median']:>9.3f} {r['gbps_best']:>10.3f} {p50:>8} {p90:>8}  {how[name]}")
    if fio:
        print(f"ours/fio at QD16: {out['ratio_ours_qd16_vs_fio_psync_16jobs']:.2f} vs psync 16 jobs, "
              f"{out['ratio_ours_qd16_vs_fio_libaio_qd16']:.2f} vs libaio iodepth 16 (target >= 0.9); "
              f"QD1: {out['ratio_ours_qd1_vs_fio_psync_qd1']:.2f}; 4 KiB-page slots vs psync 16 jobs: "
              f"{out['ratio_ours_qd16_4k_vs_fio_psync_16jobs']:.2f}")
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
