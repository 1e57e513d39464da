"""Benchmark the O_DIRECT record reader (moetier.bytes.transport.Reader) against fio at its best, on one file.

    .venv/bin/python benchmarks/bench_transport.py [--json] [--out FILE] [--size-mib N] [--record-bytes B]
                                                   [--reps R] [--dir D] [--cold FILE ...]

Writes a test file of --size-mib (default 1024) MiB of whole records of --record-bytes (default: the record size of a
registry model with a local store geometry, else the Qwen3.8 record 1,863,680 B). Every pass reads every record of
the file (or of its half, per job) once in a random order, after dropping the file from the page cache.

Arms (each at queue depth 16 and 32, each with huge-page and 4 KiB-page buffers):
  reader     Reader(queue_depth=QD) over a SlotPool of 2*QD slots (huge: THP-backed; 4k: no MADV_HUGEPAGE)
  fio        libaio and io_uring (io_uring with registered buffers and files: --fixedbufs --registerfiles), one job
             over the file and two jobs over its two disjoint halves; huge: --mem=shmhuge (hugetlb pages, reserved
             here when running as root), 4k: --mem=malloc
All arms run interleaved in each of --reps (default 4) passes; every arm reports min / median / max GB/s, and the
ratio reader / best fio compares medians at the same queue depth and buffer kind.

Warm or cold: the file is written by this run moments before it is read. The guest page cache is dropped before each
pass, but a virtual disk's host may still hold the data (reads then run at host-memory speed, not the device's).
--cold FILE (repeatable) adds a cold arm over existing files that nothing has read since they were written long ago
(their age is printed), each pass on a slice no pass read before; without one, the result says it measured warm data
only.
"""

from __future__ import annotations

import argparse
import itertools
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


def run_reader(raw: RawFile, qd: int, order, *, hugepage: bool) -> dict:
    drop_cache(raw.data_path)
    ahead = 2 * qd
    with SlotPool(ahead, raw.record_bytes, hugepage=hugepage) as pool, \
            Reader(raw, pool, queue_depth=qd, verify_rate=0.0) as rd:
        for slot in range(ahead):      # a runtime's pool is long-lived: its pages are backed before it reads
            pool.view(slot)[:] = 0
        inflight, free, i, n = [], list(range(ahead)), 0, len(order)
        t0 = time.perf_counter()
        while i < n or inflight:
            while i < n and free:
                inflight.append(rd.fill(int(order[i]), free.pop()))
                i += 1
            c = inflight.pop(0)
            rd.wait(c)
            free.append(c.slot)
        secs = time.perf_counter() - t0
        return {"gbps": rd.stats["bytes"] / secs / 1e9, "direct": rd.direct, "huge_bytes": pool.huge_bytes(),
                "pool_bytes": pool.nbytes}


def fio_cmd(path: str, bs: int, size: int, engine: str, qd: int, jobs: int, huge: bool) -> list:
    part = size // jobs // bs * bs
    cmd = ["fio", "--name=x", f"--filename={path}", "--direct=1", "--rw=randread", f"--bs={bs}", f"--iodepth={qd}",
           f"--ioengine={engine}", f"--numjobs={jobs}", f"--size={part}", f"--offset_increment={part}",
           f"--mem={'shmhuge' if huge else 'malloc'}", "--group_reporting", "--output-format=json"]
    if engine == "io_uring":
        cmd += ["--fixedbufs", "--registerfiles"]
    return cmd


def run_fio(cmd: list, path: str) -> dict:
    drop_cache(path)
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"fio failed ({p.returncode}): {p.stderr.strip()[:400]}")
    j = json.loads(p.stdout[p.stdout.index("{"):])
    return {"gbps": j["jobs"][0]["read"]["bw_bytes"] / 1e9}


def reserve_hugetlb(pages: int) -> str:
    """Make sure the hugetlb pool holds `pages` pages for fio's shmhuge buffers; returns a note."""
    path = "/proc/sys/vm/nr_hugepages"
    try:
        have = int(open(path).read())
        if have < pages:
            with open(path, "w") as f:
                f.write(str(pages))
            have = int(open(path).read())
    except OSError as e:
        return f"hugetlb pages not reserved ({e.strerror}): fio huge-page arms may fail"
    return f"hugetlb pages reserved: {have}"


def spread(values) -> dict:
    return {"min": min(values), "median": statistics.median(values), "max": max(values), "all": list(values)}


def arms_for(raw: RawFile, path: str, size: int, fio: bool) -> list:
    """(name, group, fn) for every arm; group = (qd, buffer kind) for the ratio, reader first within each."""
    arms = []
    for qd, huge in itertools.product((16, 32), (True, False)):
        kind = "huge" if huge else "4k"
        arms.append((f"reader qd{qd} {kind}", (qd, kind), lambda o, qd=qd, h=huge: run_reader(raw, qd, o, hugepage=h)))
        if not fio:
            continue
        for engine, jobs in itertools.product(("libaio", "io_uring"), (1, 2)):
            cmd = fio_cmd(path, raw.record_bytes, size, engine, qd, jobs, huge)
            arms.append((f"fio {engine} qd{qd} {jobs}j {kind}", (qd, kind), lambda o, c=cmd: run_fio(c, path)))
    return arms


def measure(arms, nrec: int, reps: int, log) -> dict:
    rng = np.random.default_rng(0)
    runs = {name: [] for name, _, _ in arms}
    extra = {}
    for rep in range(reps):
        order = rng.permutation(nrec)
        for name, _, fn in arms:
            r = fn(order)
            runs[name].append(r["gbps"])
            extra.setdefault(name, {k: v for k, v in r.items() if k != "gbps"})
            log(f"  pass {rep + 1} {name:<26} {r['gbps']:.3f} GB/s")
    return {name: {**spread(g), **extra[name]} for name, g in runs.items()}


def ratios(arms, res: dict) -> dict:
    out = {}
    for group in sorted({g for _, g, _ in arms}):
        names = [n for n, g, _ in arms if g == group]
        fios = [n for n in names if n.startswith("fio")]
        if not fios:
            continue
        reader = next(n for n in names if n.startswith("reader"))
        best = max(fios, key=lambda n: res[n]["median"])
        out[f"qd{group[0]} {group[1]}"] = {"reader": reader, "best_fio": best,
                                           "ratio": res[reader]["median"] / res[best]["median"]}
    return out


def cold_arm(paths: list, rb: int, reps: int, log) -> dict:
    """Reader and fio (io_uring, 4 KiB buffers, QD16) over existing files that have not been read for a while.

    Only the first read of a region is cold, so every file is cut into 2 * reps disjoint slices of whole records and
    each pass of each arm reads a slice of its own: pass k gives slices 2k and 2k+1 to the two arms, the arm that
    goes first alternating, so neither arm always reads the earlier part of the file.
    """
    runs = {"cold reader qd16 4k": [], "cold fio io_uring qd16 1j 4k": []}
    files = []
    for path in paths:
        st = os.stat(path)
        nrec = st.st_size // rb
        per = nrec // (2 * reps)
        age_h = (time.time() - max(st.st_mtime, st.st_atime)) / 3600.0
        files.append({"file": path, "age_hours_since_last_access": round(age_h, 1), "slice_records": per})
        if per < 4:
            raise SystemExit(f"bench_transport: --cold {path}: {nrec} records of {rb} B; need >= {8 * reps}")
        raw = RawFile(path, rb, nrec)
        for rep in range(reps):
            slices = [(2 * rep + j) * per for j in (0, 1)]
            first, second = (slices if rep % 2 == 0 else slices[::-1])
            order = np.random.default_rng(rep).permutation(per) + first
            r = run_reader(raw, 16, order, hugepage=False)["gbps"]
            cmd = fio_cmd(path, rb, per * rb, "io_uring", 16, 1, False) + [f"--offset={second * rb}"]
            f = run_fio(cmd, path)["gbps"]
            runs["cold reader qd16 4k"].append(r)
            runs["cold fio io_uring qd16 1j 4k"].append(f)
            log(f"  cold pass {rep + 1} {os.path.basename(path)}: reader {r:.3f} GB/s, fio {f:.3f} GB/s")
    arms = {name: spread(g) for name, g in runs.items()}
    return {"files": files, "arms": arms,
            "ratio": arms["cold reader qd16 4k"]["median"] / arms["cold fio io_uring qd16 1j 4k"]["median"],
            "note": "each pass reads a disjoint slice that nothing read before it; reader and fio alternate first"}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", action="store_true", help="print only the JSON result")
    ap.add_argument("--out", default=None, help="also write the JSON result to this file")
    ap.add_argument("--size-mib", type=int, default=1024, help="test file size in MiB (default 1024)")
    ap.add_argument("--record-bytes", type=float, default=None,
                    help="record size in bytes; a value < 4096 is read as MiB (1.5 -> 1.5 MiB); rounded to 4096")
    ap.add_argument("--reps", type=int, default=4, help="interleaved passes per arm (default 4, at least 4)")
    ap.add_argument("--dir", default=None, help="folder for the test file (default: system temp dir)")
    ap.add_argument("--cold", action="append", default=None, metavar="FILE",
                    help="an existing file not read since it was written long ago (repeat for more files)")
    ap.add_argument("--cold-only", action="store_true", help="measure only the cold arm (needs --cold)")
    a = ap.parse_args(argv)
    if a.cold_only and not a.cold:
        print("bench_transport: --cold-only needs --cold FILE", file=sys.stderr)
        return 2
    if a.reps < 4:
        print("bench_transport: --reps must be at least 4", file=sys.stderr)
        return 2
    if a.record_bytes is None:
        rb, src = default_record_bytes()
    else:
        rb = a.record_bytes * 1024 * 1024 if a.record_bytes < 4096 else a.record_bytes
        src = "--record-bytes"
    rb = int((int(rb) + 4095) // 4096 * 4096)
    nrec = (a.size_mib * 1024 * 1024) // rb
    if nrec < 64:
        print(f"bench_transport: --size-mib {a.size_mib} holds only {nrec} records of {rb} B; need >= 64",
              file=sys.stderr)
        return 2
    size = nrec * rb
    fio = shutil.which("fio") is not None
    log = (lambda *x: None) if a.json else (lambda *x: print(*x, flush=True))
    out = {"record_bytes": rb, "record_source": src, "records": nrec, "file_bytes": size, "reps": a.reps}
    if not fio:
        log("fio not found: install it with `apt-get install -y fio` (Debian/Ubuntu); reader arms only")
        out["fio"] = "not found: apt-get install -y fio"
    else:
        out["hugetlb"] = reserve_hugetlb(2 * 2 * 32 * (-(-rb // (2 << 20))) + 8)
        out["fio_version"] = subprocess.run(["fio", "--version"], capture_output=True, text=True).stdout.strip()
    out["arms"], out["ratios"] = {}, {}
    if not a.cold_only:
        d = tempfile.mkdtemp(prefix="moetier-bench-", dir=a.dir)
        path = os.path.join(d, "records.bin")
        try:
            log(f"record {rb} B ({src}), {nrec} records, file {size / 2**20:.0f} MiB at {path}")
            make_file(path, size)
            raw = RawFile(path, rb, nrec)
            arms = arms_for(raw, path, size, fio)
            out["arms"] = measure(arms, nrec, a.reps, log)
            out["ratios"] = ratios(arms, out["arms"])
        finally:
            shutil.rmtree(d, ignore_errors=True)
        out["warm"] = ("warm: the file was written moments before it was read; the guest page cache was dropped "
                       "before each pass, a virtual disk's host may still have served it from memory")
    if a.cold:
        out["cold"] = cold_arm(a.cold, rb, a.reps, log) if fio else "needs fio"
    else:
        out["cold"] = "not measured: give --cold FILE (an existing file untouched for hours)"
    text = json.dumps(out, indent=2)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text + "\n")
    if a.json:
        print(text)
        return 0
    print()
    print(f"{'arm':<28} {'min':>7} {'median':>7} {'max':>7}  GB/s")
    for name, r in out["arms"].items():
        print(f"{name:<28} {r['min']:>7.3f} {r['median']:>7.3f} {r['max']:>7.3f}")
    for group, r in out["ratios"].items():
        print(f"{group}: reader / best fio ({r['best_fio']}) = {r['ratio']:.2f} (target >= 0.95)")
    if "warm" in out:
        print(out["warm"])
    c = out["cold"]
    if isinstance(c, dict):
        for name, r in c["arms"].items():
            print(f"{name:<28} {r['min']:>7.3f} {r['median']:>7.3f} {r['max']:>7.3f}")
        print(f"cold qd16 4k: reader / fio = {c['ratio']:.2f} (target >= 0.95); files: "
              + ", ".join(f"{f['file']} (last read {f['age_hours_since_last_access']:.0f} h ago)" for f in c["files"]))
    else:
        print(f"cold: {c}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
