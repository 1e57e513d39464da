"""How a store's read latency drifts over minutes: the time scale the bench's rounds cannot span.

    python benchmarks/bench_disk_drift.py --store DIR [--seconds 180] [--window 2] [--json]

One O_DIRECT read of one whole record at a time (queue depth 1), records chosen at random, a 5 ms pause between
reads (a decode step's pace, so the disk is not kept saturated); each window's mean latency. It prints every window
and, over the windows, min / p10 / median / p90 / max and p10 / p90 divided by the median: the same quantity as the
bench's ``term_spread["nvme_latency"]`` (``rel_p10``, ``rel_p90``), which comes from five rounds inside one bench of
well under two minutes. Where the windows' spread here is much wider than the bench's, the disk moves on a time scale
longer than the bench, and an interval built from the bench's spread is too narrow for the NVMe-bound arms
(docs/fidelity.md, "Where it misses").
"""
from __future__ import annotations

import argparse
import json
import mmap
import os
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from moetier.bytes import store  # noqa: E402
from moetier.errors import UserError  # noqa: E402


def drift(path: str, seconds: float, window: float, pause_s: float = 0.005, seed: int = 0, out=None) -> dict:
    """Per-window mean latency (ms) of QD1 O_DIRECT record reads for ``seconds``; the windows and their spread."""
    st = store.open_store(path)
    nbytes, keys = st.record_bytes, st.nrecords
    buf = mmap.mmap(-1, nbytes)                  # page-aligned, as O_DIRECT needs
    fd = os.open(st.data_path, os.O_RDONLY | os.O_DIRECT)
    rng = random.Random(seed)
    windows: list[float] = []
    try:
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            lat, w_end = [], time.perf_counter() + window
            while time.perf_counter() < w_end:
                t0 = time.perf_counter()
                os.preadv(fd, [buf], st.offset(rng.randrange(keys)))
                lat.append((time.perf_counter() - t0) * 1e3)
                time.sleep(pause_s)
            windows.append(statistics.fmean(lat))
            if out:
                print(f"{len(windows) * window:6.0f} s  mean {windows[-1]:.3f} ms  ({len(lat)} reads)", file=out)
    finally:
        os.close(fd)
    q = statistics.quantiles(windows, n=10, method="inclusive") if len(windows) >= 2 else windows * 9
    med = statistics.median(windows)
    return {"store": path, "record_bytes": nbytes, "seconds": seconds, "window_s": window, "windows_ms": windows,
            "min_ms": min(windows), "p10_ms": q[0], "median_ms": med, "p90_ms": q[-1], "max_ms": max(windows),
            "rel_p10": q[0] / med, "rel_p90": q[-1] / med}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--store", required=True, help="a packed store directory (moetier store pack)")
    ap.add_argument("--seconds", type=float, default=180.0, help="how long to read (default 180)")
    ap.add_argument("--window", type=float, default=2.0, help="seconds per window (default 2)")
    ap.add_argument("--json", action="store_true", help="print the result as JSON")
    a = ap.parse_args(argv)
    if a.seconds <= 0 or a.window <= 0 or a.window > a.seconds:
        print("bench_disk_drift: --seconds and --window must be positive, --window at most --seconds", file=sys.stderr)
        return 2
    try:
        r = drift(a.store, a.seconds, a.window, out=None if a.json else sys.stdout)
    except (UserError, OSError) as e:
        print(f"bench_disk_drift: {e}", file=sys.stderr)
        return 2
    if a.json:
        print(json.dumps(r, indent=1))
    else:
        print(f"windows of {a.window:g} s: min {r['min_ms']:.3f}  p10 {r['p10_ms']:.3f}  median {r['median_ms']:.3f}  "
              f"p90 {r['p90_ms']:.3f}  max {r['max_ms']:.3f} ms; p10 / median {r['rel_p10']:.3f}, "
              f"p90 / median {r['rel_p90']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
