"""The prediction terms `moetier bench` measures, each with its spread over repetitions.

Contract
--------
Each stage is a class with ``round()`` (one repetition, a few seconds at most) and ``result()`` (the terms fitted on
every repetition pooled, and each term's spread over the repetitions' own fits: ``spread_of``). `moetier bench`
interleaves the stages' rounds (A B C .. A B C ..), so a term's spread covers the minutes the whole bench ran, not
the seconds of its own stage: the noise a prediction made from these terms carries (moetier.core.interval).

- ``LaneGrid``: the cpu lane's calls as the runtime makes them, over experts x rows at the store's record size
  (inline below the backend's parallel_min, split over its workers above), each split call after a random idle of
  the lane's worker (inline calls right after the previous call, as the runtime's host makes them); fitted by
  ``bench.fit_cpu_lane``: per_call (inline), per_layer (split), per_expert, per_extra_token, per_wake (the idle)
  and per_handoff (split calls that end with a worker's share).
- ``ReadsBesideLane``: a layer as the runtime runs it, at the recipe's rows 1, 2 and 4: a burst of n demand reads
  issued together, the layer's RAM picks computed on the cpu lane while they land, then each read's expert computed
  inline as it lands. The reader's own timing (submit-to-landed by queue depth and burst position, wake-ups) is fitted
  by ``fit_nvme.fit_channel``, as `moetier calibrate` fits the runtime's: the engine's NVMe tables under the lane's load.
  Every burst size is measured alike (each needs its own row of the burst table), but the runtime issues them in the
  proportions of its recipe's plans (``burst_mix``: at one row, four layers in five read one expert), and its depth
  table and wake-up are means over the reads it issued: a read at depth 1 in a burst of 4 takes about three times as
  long as a burst of 1's. So those two are the burst sizes' means weighted by that mix (``mix_weighted``,
  ``mix_wake``); a plain mean over the bench's even mix put depth 1 at 1.5-2.1x the runtime's.
- ``HostWork``: the runtime itself, all experts in RAM and its predictor on, a few dozen steps at rows 1 and 4; its
  host timers (plan, bookkeeping, combine) and the time outside every timer give ``calibration.host`` per_layer /
  per_pick and ``calibration.fixed_ms`` (``fit.fit_host_and_fixed``), the prediction's timer per_predict /
  per_predict_row. Its tok/s is not used.
"""
from __future__ import annotations

import random
import time
from collections import Counter

import numpy as np

from moetier.core import records as spec
from moetier.core.terms import layer_width

ROWS = (1, 2, 4)
STAGE = "the cpu lane, reads beside it, the host's work (interleaved rounds)"


def measure(st, recipe_id: str, trace, *, nrec: int = 256, rounds: int = 5, progress=None) -> dict:
    """`moetier bench`: the machine sheet (moetier.measure.bench.measure), then the prediction terms of recipe
    ``recipe_id`` (whose model the store holds) replaying ``trace``, in ``rounds`` interleaved repetitions, each
    term with its spread. ``progress(stage)`` before each of bench.STAGES and STAGE."""
    from moetier.measure import bench
    m = bench.measure(st, nrec=nrec, progress=progress)
    if progress is not None:
        progress(STAGE)
    t = prediction_terms(st, recipe_id, trace, rounds=rounds, idle_latency=m["nvme_latency_by_qd_ms"])
    return {**m, "cpu_lane": t["lane"], "channel": t.get("channel"), "host": t.get("host"), "rounds": rounds,
            "recipe": recipe_id, "seconds_by_stage": {**m["seconds_by_stage"], **t["seconds"]}}


def prediction_terms(st, recipe_id, trace, *, rounds: int, idle_latency: dict) -> dict:
    """The lane grid, the reads beside the lane and the host's work, their rounds interleaved (A B C .. A B C ..),
    so each term's spread covers the minutes all of them ran. Without a recipe, the lane grid alone; without a
    trace, no host work."""
    from backends.cpu.backend import CpuBackend
    nslots, nread = min(st.nrecords // 2, 128), 8        # 128 records: ~200 MB rotated, past the host cache
    be = CpuBackend(st, ram_slots=nslots + nread, verify_rate=1.0)
    seconds: dict = {}
    try:
        for i in range(nslots):
            be.wait(be.fill(i, i))
        stages = {"lane": LaneGrid(be, st.layout, nslots)}
        if recipe_id is not None:
            R = spec.resolve(recipe_id)
            mix = {rows: burst_mix(R, trace, rows) for rows in ROWS} if trace is not None else None
            stages["channel"] = ReadsBesideLane(be, R, st.layout.hidden, nslots, st.nrecords - nslots, nslots,
                                                list(range(nslots, nslots + nread)), mix=mix)
            if trace is not None:
                stages["host"] = HostWork(recipe_id, st, trace)
        for _ in range(rounds):
            for name, s in stages.items():
                t0 = time.perf_counter()
                s.round()
                seconds[name] = seconds.get(name, 0.0) + time.perf_counter() - t0
        out = {name: (s.result(idle_latency) if name == "channel" else s.result()) for name, s in stages.items()}
    finally:
        be.close()
    return {**out, "seconds": {k: round(v, 1) for k, v in seconds.items()}}


def spread_of(values, point: float) -> dict | None:
    """A term's spread over repetitions as ratios to the value written: p10, p90, sd (None: fewer than 3 or a
    point of 0, nothing to scale)."""
    v = [float(x) for x in values if x is not None]
    if len(v) < 3 or not point:
        return None
    return {"n": len(v), "rel_p10": round(float(np.percentile(v, 10)) / point, 4),
            "rel_p90": round(float(np.percentile(v, 90)) / point, 4), "rel_sd": round(float(np.std(v, ddof=1)) / abs(point), 4)}


def pool_calls(samples) -> list[dict]:
    """Single timed calls summed per cell (class, experts, rows, the idle before them), as `moetier calibrate` sums
    the runtime's calls per class before ``fit_cpu_lane``. The fit is relative least squares, which on single calls
    weighs each by 1 / its own time: a call the scheduler delayed counts for little, so the fit tracks the fastest
    calls, not the mean the runtime's sums give. Summed per cell, every call counts by its time, as in a run."""
    cells: dict = {}
    for s in samples:
        key = (s["cls"], s["experts"], s["rows"], s.get("idle_ms"))
        c = cells.setdefault(key, {"cls": s["cls"], "rows": s["rows"]})
        for k, v in s.items():
            if k not in ("cls", "rows", "idle_ms"):
                c[k] = c.get(k, 0) + v
    return list(cells.values())


def burst_mix(R, trace, rows: int, steps: int = 150) -> dict[int, float]:
    """The share of recipe R's layers with demand reads by how many they issue together, {n: share}, at ``rows``
    token rows over ``steps`` measured steps of ``trace``: the simulator's plans, which the runtime carries out (plan
    parity), so the reader sees these bursts. {} where the recipe reads nothing from NVMe. A fraction of a second."""
    from moetier.core import sim
    seen: list = []
    out = sim.run(R, trace, rows, max_steps=steps, plan_hook=lambda step, _, plan: seen.append((step,
                                                                                                 plan.demand_reads)))
    counts = Counter(n for step, n in seen if step >= out["warm_steps"] and n > 0)
    total = sum(counts.values())
    return {n: c / total for n, c in sorted(counts.items())} if total else {}


def mix_weighted(by_burst: dict, mix: dict) -> dict:
    """Mean latency by queue depth, {q: ms}, of reads issued in bursts of the sizes ``mix`` deals ({n: share}),
    from the mean latency by burst size and position ({n: {q: ms}}): a burst of n puts one read at each depth 1..n,
    so depth q is the mean over the sizes n >= q, each by its share. Sizes the mix lacks or the bench did not
    measure count for nothing; a depth no counted size reaches is left out. Keys are ints."""
    out = {}
    for q in sorted({q for row in by_burst.values() for q in row}):
        w = [(mix[n], row[q]) for n, row in by_burst.items() if mix.get(n) and q in row]
        total = sum(a for a, _ in w)
        if total:
            out[q] = sum(a * v for a, v in w) / total
    return out


def mix_wake(by_size: dict, mix: dict) -> float | None:
    """Mean wake-up over the waits of bursts dealt by ``mix`` ({n: share}), from each burst size's [bursts, waits
    that blocked, their summed ms]: the waits per burst differ by size, so it is the mix's wake ms per burst over its
    waits per burst. None: no wait of a size in the mix blocked."""
    num = den = 0.0
    for n, (bursts, waits, ms) in by_size.items():
        if mix.get(n) and bursts:
            num += mix[n] * ms / bursts
            den += mix[n] * waits / bursts
    return num / den if den else None


def _median_spread(per_key: dict, point: dict) -> dict | None:
    """One spread for a table of values: per repetition, the median of its ratios to the table's points."""
    reps = {}
    for key, vals in per_key.items():
        for rep, v in vals:
            if point.get(key):
                reps.setdefault(rep, []).append(v / point[key])
    return spread_of([float(np.median(r)) for r in reps.values() if r], 1.0)


class LaneGrid:
    """The cpu lane's costs over experts x rows (module docstring)."""

    EXPERTS = (1, 2, 3, 4, 5, 6, 7, 8, 12, 16)
    IDLE_MS = (0.0, 0.5, 2.0, 5.0)

    def __init__(self, be, lay, nslots: int, rows=ROWS, calls: int = 3, seed: int = 0):
        self.be, self.lay, self.nslots, self.rows, self.calls = be, lay, nslots, rows, calls
        self.rng = random.Random(seed)
        self.x = {m: np.random.default_rng(m).standard_normal((m, lay.hidden)).astype(np.float32) for m in rows}
        self.samples: list[list[dict]] = []
        self.rot = 0
        self.t_end = time.perf_counter()

    def round(self) -> None:
        be, pmin = self.be, max(2, self.be.parallel_min)
        cells = [(n, m) for n in self.EXPERTS for m in self.rows]
        self.rng.shuffle(cells)
        out = []
        for n, m in cells:
            split = n >= pmin
            for _ in range(self.calls):
                # the idle is the split worker's (per_wake); the runtime's host runs its inline calls between its
                # own work, and a lone expert after a pause runs slower, a cost no term of the model carries
                idle_ms = self.rng.choice(self.IDLE_MS) if split else 0.0
                time.sleep(idle_ms / 1e3)
                jobs = [(j, (self.rot + j) % self.nslots, list(range(m))) for j in range(n)]  # rotate: from DRAM
                self.rot += n
                t0 = time.perf_counter()
                idle = (t0 - self.t_end) * 1e3          # since the last split call ended, as the runtime books it
                be.compute("cpu", jobs, self.x[m])
                t1 = time.perf_counter()
                if split:
                    self.t_end = t1
                share = len(spec.deal(range(n), be.workers)[0])      # the calling thread's share: the longest
                out.append({"cls": "split" if split else "inline", "calls": 1, "experts": n, "extra": n * (m - 1),
                            "ms": (t1 - t0) * 1e3, "rows": m, "idle_ms": idle_ms, "crit_cold": share,
                            "crit_extra": share * (m - 1),
                            **({"wake": spec.idle_wake(idle), "handoff": int(spec.hands_off(n, be.workers))}
                               if split else {})})
        self.samples.append(out)

    def result(self) -> dict:
        from moetier.measure.bench import fit_cpu_lane
        workers = self.be.workers
        fit = fit_cpu_lane(pool_calls([s for r in self.samples for s in r]), workers)
        each = [fit_cpu_lane(pool_calls(r), workers) for r in self.samples]
        spread = {f"cpu.{k}": s for k, v in fit.items()
                  if (s := spread_of([e.get(k) for e in each], v)) is not None}
        one = [s["ms"] for r in self.samples for s in r if s["rows"] == 1 and s["experts"] == max(self.EXPERTS)]
        gbps = max(self.EXPERTS) * self.lay.weight_bytes / (float(np.median(one)) / 1e3) / 1e9
        return {**fit, "workers": workers, "parallel_min": self.be.parallel_min, "weight_gbps_1row": gbps,
                "encoding": self.lay.encoding, "spread": spread, "calls": sum(len(r) for r in self.samples)}


class ReadsBesideLane:
    """Demand-read bursts beside the cpu lane's work, at rows 1, 2, 4 of the recipe's model (module docstring)."""

    def __init__(self, be, R, hidden: int, first_key: int, nkeys: int, ram_slots: int, read_slots: list[int],
                 trials: int = 6, seed: int = 1, mix: dict | None = None):
        # mix: {rows: burst_mix}, the burst sizes the runtime issues (None: the tables as measured, an even mix)
        self.be, self.R, self.trials, self.mix = be, R, trials, mix
        self.wakes: dict = {}          # (rows, burst size) -> [bursts, waits that blocked, their summed ms]
        self.keys = list(range(first_key, first_key + nkeys))
        self.ram_slots, self.read_slots = ram_slots, read_slots
        self.rng = random.Random(seed)
        self.x = {m: np.random.default_rng(10 + m).standard_normal((m, hidden)).astype(np.float32) for m in ROWS}
        self.runs: list[dict] = []
        self.rep = 0

    def _layer(self, rows: int, n: int) -> None:
        """One layer: n reads issued together, the RAM batch on the cpu lane, then each read computed as it lands."""
        be = self.be
        width = layer_width(rows, (self.R.experts, self.R.topk))
        batch = max(0, int(round(width)) - n)
        hs = [be.fill(k, s) for k, s in zip(self.rng.sample(self.keys, n), self.read_slots)]
        if batch:
            base = self.rng.randrange(self.ram_slots)
            be.compute("cpu", [(j, (base + j) % self.ram_slots, list(range(rows))) for j in range(batch)],
                       self.x[rows])
        woken = len(be.reader.wake_ms)
        for h in hs:
            be.wait(h)
            be.compute("cpu", [(0, h.slot, list(range(rows)))], self.x[rows])
        w = self.wakes.setdefault((rows, n), [0, 0, 0.0])
        got = be.reader.wake_ms[woken:]
        w[0] += 1
        w[1] += len(got)
        w[2] += sum(got)

    def round(self) -> None:
        rd = self.be.reader
        for rows in ROWS:
            width = layer_width(rows, (self.R.experts, self.R.topk))
            sizes = list(range(1, min(len(self.read_slots), int(np.ceil(width))) + 1))
            rd.begin_measured()
            for _ in range(self.trials):
                for n in self.rng.sample(sizes, len(sizes)):
                    self._layer(rows, n)
            self.runs.append({"engine": "bench", "conc": rows, "rep": self.rep,
                              "latency_by_qd": {q: list(v) for q, v in rd.latency_by_qd.items()},
                              "wake_ms": list(rd.wake_ms), "burst_ms": [(0, b, q, ms) for b, q, ms in rd.burst_ms]})
        self.rep += 1

    def result(self, idle_latency: dict | None) -> dict:
        from moetier.measure.fit_nvme import fit_channel
        fit = fit_channel(self.runs, idle_latency)
        out = {f: tab["bench"] for f, tab in fit.items() if tab.get("bench")}
        self._as_runtime_mix(out)
        # spread: per repetition, the median ratio of its mean latencies to the pooled ones
        pooled = {}
        per_key: dict = {}
        for r in self.runs:
            for q, v in r["latency_by_qd"].items():
                pooled.setdefault((r["conc"], q), []).extend(v)
                per_key.setdefault((r["conc"], q), []).append((r["rep"], float(np.mean(v))))
        point = {k: float(np.mean(v)) for k, v in pooled.items()}
        s = _median_spread(per_key, point)
        return {"tables": out, "spread": {"nvme_latency": s} if s else {},
                "reads": sum(len(v) for r in self.runs for v in r["latency_by_qd"].values())}

    def _as_runtime_mix(self, out: dict) -> None:
        """The depth table and the wake-up of ``out`` (fit_channel's tables) at each rows, as means over the burst
        sizes the runtime issues there (module docstring); rows without a mix keep the bench's even one."""
        for rows, mix in (self.mix or {}).items():
            if not mix:
                continue
            bursts = (out.get("nvme_latency_by_rows_burst_ms") or {}).get(str(rows)) or {}
            table = (out.get("nvme_latency_by_rows_qd_ms") or {}).get(str(rows))
            by_depth = mix_weighted({int(n): {int(q): v for q, v in row.items()} for n, row in bursts.items()}, mix)
            if table is not None:
                table.update({str(q): round(v, 4) for q, v in by_depth.items()})
            wake = mix_wake({n: w for (r, n), w in self.wakes.items() if r == rows}, mix)
            if wake is not None and str(rows) in (out.get("nvme_wake_ms_by_rows") or {}):
                out["nvme_wake_ms_by_rows"][str(rows)] = round(wake, 4)


class HostWork:
    """The runtime's host work and its non-MoE time, all experts in RAM (module docstring)."""

    def __init__(self, recipe_id: str, st, tr, steps: int = 24, rows=(1, 4), warmup_tokens: int = 8):
        self.recipe_id, self.st, self.tr, self.steps, self.rows = recipe_id, st, tr, steps, rows
        R = spec.resolve(recipe_id)
        allram = round(R.keys * R.ram_expert_bytes / 1e9 * 1.05 + 0.01, 3)
        # a short warm-up: every expert is in RAM, so nothing it would place matters to the host's timers. The
        # predictor runs (the recipe's, else the transition predictor the calibration matrix's prefetch arms use)
        # and, with every expert resident, issues no read: its own timer gives the host's prediction terms
        pf = R.policy.get("prefetch") or {}
        predictor = pf.get("predictor") if pf.get("predictor") not in (None, "none", "recall") else "transition"
        self.R = spec.resolve(recipe_id, [f"budget.ram_gb={allram}", f"policy.warmup_tokens={warmup_tokens}",
                                          f"policy.prefetch.depth={max(1, int(pf.get('depth') or 0))}",
                                          f"policy.prefetch.predictor={predictor}"])
        self.runs: list[list] = []

    def round(self) -> None:
        from moetier.run import runtime
        out = []
        for c in self.rows:
            be = runtime.make_backend("cpu", self.st, self.R, c, 1.0)
            try:
                out.append((runtime.run(self.R, self.st, be, self.tr, c, max_steps=self.steps), c))
            finally:
                be.close()
        self.runs.append(out)

    def result(self) -> dict:
        pooled = [(_sum_runs([r for rnd in self.runs for r, c2 in rnd if c2 == c]), c) for c in self.rows]
        host, fixed = _fit(pooled)
        each = [_fit(rnd) for rnd in self.runs]
        keep = ("per_layer_ms", "per_pick_ms", "per_predict_ms", "per_predict_row_ms")
        spread = {f"host.{k}": s for k in keep if (s := spread_of([e[0][k] for e in each], host[k])) is not None}
        fx = _median_spread({c: [(i, float(e[1][c])) for i, e in enumerate(each)] for c in fixed},
                            {c: float(v) for c, v in fixed.items()})
        if fx:
            spread["fixed_ms"] = fx
        return {"host": {k: host[k] for k in keep}, "fixed_ms": fixed, "spread": spread,
                "steps": sum(r["steps"] for rnd in self.runs for r, _ in rnd)}


def _fit(runs) -> tuple[dict, dict]:
    """Host terms and non-MoE time of HostWork's runs [(run, rows)]: the prediction's own timer (predict_s) gives
    per_predict + per_predict_row x rows (relative least squares over the rows measured); the rest, without it,
    ``fit.fit_host_and_fixed`` (every layer predicts, so a per-layer and a per-predict term fitted together could
    not be told apart)."""
    from moetier.measure.bench import relative_lstsq
    from moetier.measure.fit import fit_host_and_fixed
    A = [[r["counters"]["predict_layers"], r["counters"]["predict_rows"]] for r, _ in runs]
    y = [r["counters"]["predict_s"] * 1e3 for r, _ in runs]
    per_predict, per_row = relative_lstsq(A, y) if len(runs) > 1 and all(a[0] for a in A) else (0.0, 0.0)
    plain = [({**r, "wall_s": r["wall_s"] - r["counters"]["predict_s"],
               "counters": {**r["counters"], "predict_s": 0.0, "predict_layers": 0, "predict_rows": 0}}, c)
             for r, c in runs]
    host, fixed = fit_host_and_fixed(plain)
    return {**host, "per_predict_ms": per_predict, "per_predict_row_ms": per_row}, fixed


def _sum_runs(runs) -> dict:
    """Runs of one configuration pooled: counters, steps and wall time summed."""
    counters: dict = {}
    for r in runs:
        for k, v in r["counters"].items():
            counters[k] = counters.get(k, 0) + v
    return {"counters": counters, "steps": sum(r["steps"] for r in runs), "wall_s": sum(r["wall_s"] for r in runs)}
