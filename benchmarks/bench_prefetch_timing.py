"""When a prefetch is of use, and when a read starts: the two findings behind the runtime's prefetch order.

    python benchmarks/bench_prefetch_timing.py --store DIR [--recipe tiny-local-cpu] [--steps 250] [--conc 1]
        [--set FIELD=VALUE ...] [--json]

One runtime run of the recipe with the transition predictor at depth 1 (the calibration's tail-prefetch arm;
--set adds overrides), measured steps only. It prints

- the used prefetches by what the layer that needed one found: its read started (``started``), or still queued and
  withdrawn, then read again as a demand read (``reissued``) - and the mean wait for each;
- how long a demand read waits from its submit until a reader worker starts it (``start_delay_ms``). The workers are
  Python threads: they start a read only once the decode thread frees the interpreter, i.e. inside a lane kernel or
  a wait. Host work between the submit and the first lane call delays the reads; host work after it overlaps them
  (the planner's head start, docs/calibration.md).

Run with --set policy.prefetch.depth=0 for the start delay without prediction.
"""
from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _recipe import open_recipe, parser  # noqa: E402
from moetier.run import runtime  # noqa: E402
from moetier.bytes import transport  # noqa: E402

PREFETCH = ["policy.prefetch.depth=1", "policy.prefetch.predictor=transition"]


def main(argv=None):
    ap = parser(steps=250, overrides=True)
    ap.add_argument("--conc", type=int, default=1)
    a = ap.parse_args(argv)
    a.set = PREFETCH + a.set
    R, st, tr = open_recipe(a)
    step = [0]                                     # the step being run: warm-up steps are dropped afterwards
    used: list = []        # (step, what the layer that needed a prefetch found, its wait ms)
    delay: list = []       # (step, ms from a demand read's submit until a worker starts it)
    by_slot: dict = {}
    wait, read, fill = runtime.Runtime._wait, transport.Reader._read, transport.Reader.fill

    # diagnostic wrappers of this script only: each times a real call and makes it
    def timed_wait(self, h, ticket=None, bucket="nvme_wait_s"):
        c = getattr(h, "comp", h)                   # the SYCL and CUDA fill handles wrap the Reader's completion
        t = time.perf_counter()
        wait(self, h, ticket, bucket)
        if bucket == "nvme_wait_s" and ticket is not None and ticket.staging:
            used.append((step[0], "started" if c.prefetch else "reissued", (time.perf_counter() - t) * 1e3))

    def timed_fill(self, key, slot, *, prefetch=False):
        c = fill(self, key, slot, prefetch=prefetch)
        by_slot[slot] = c
        return c

    def timed_read(self, slot, offset, nbytes):
        c = by_slot.get(slot)
        if c is not None and not c.prefetch:
            delay.append((step[0], (time.perf_counter() - c.t_submit) * 1e3))
        return read(self, slot, offset, nbytes)

    def at_step(s, layer, plan):
        step[0] = s

    runtime.Runtime._wait, transport.Reader.fill, transport.Reader._read = timed_wait, timed_fill, timed_read
    be = runtime.make_backend("cpu", st, R, a.conc, 1.0)
    try:
        res = runtime.run(R, st, be, tr, a.conc, max_steps=a.steps, plan_hook=at_step)
    finally:
        be.close()
        runtime.Runtime._wait, transport.Reader.fill, transport.Reader._read = wait, fill, read
    warm = res["warm_steps"]
    kinds = {k: [ms for s, kind, ms in used if s >= warm and kind == k] for k in ("started", "reissued")}
    delay = [ms for s, ms in delay if s >= warm]
    out = {"tok_s": res["tok_s"], "nvme_wait_ms_per_token": res["lanes_ms_per_token"]["nvme_wait"],
           "used_prefetches": {k: {"n": len(v), "mean_wait_ms": statistics.mean(v) if v else 0.0}
                               for k, v in kinds.items()},
           "start_delay_ms": {"n": len(delay), "mean": statistics.mean(delay) if delay else 0.0,
                              "p50": statistics.median(delay) if delay else 0.0}}
    if a.json:
        print(json.dumps(out, indent=1))
        return
    print("| measure | value |\n|---|---|")
    print(f"| tok/s | {out['tok_s']:.1f} |\n| NVMe wait ms/token | {out['nvme_wait_ms_per_token']:.2f} |")
    for k, v in out["used_prefetches"].items():
        print(f"| used prefetches {k} | {v['n']} (mean wait {v['mean_wait_ms']:.3f} ms) |")
    d = out["start_delay_ms"]
    print(f"| demand read start delay | mean {d['mean']:.3f} ms, p50 {d['p50']:.3f} ms over {d['n']} reads |")


if __name__ == "__main__":
    main()
