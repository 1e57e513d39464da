"""`moetier advise`'s search: the knobs of moetier.measure.advise_space, replayed by the simulator, best per
concurrency.

Contract
--------
- A *candidate* is one choice per knob (a tuple of indices; all zeros is the starting recipe). ``candidates(knobs,
  n, seed)`` gives the start, every single-knob change (round-robin over the knobs), then random combinations
  (numpy, seeded), ``n`` distinct ones in all: the same seed, the same list.
- A *cell* is one replay: a candidate's overrides, a concurrency, a fidelity (``steps`` measured steps after
  ``warmup`` warm-up tokens; None: the recipe's) and ``hw``, hardware edits for an upgrade (``upgrade_recipe``).
  ``run_cell(cell)`` is a pure function of the cell but for ``seconds``; a cell the schema or the join rejects is a
  row with ``error``, never a crash. Cells run through moetier.measure.sweep's pool or Ray (``sweep.rows``): the
  same rows either way.
- ``search(...)`` is successive halving: every candidate at the shortest fidelity, the best ``1/eta`` per
  concurrency (rows over ``masked_cap`` or with errors dropped), the Pareto front of tok/s against RAM and against
  VRAM used, and one candidate built from each knob's best single change go up a rung; the last rung replays the
  survivors in full. Ties break on the candidate's index, so the result is deterministic for a seed. ``rows`` keeps every row tried (the Pareto view reads them).
- ``attribution(...)``: for the best candidate per concurrency, the tok/s lost when each changed knob alone is put
  back to the starting value (full replays).
- ``simplify(res, mattered, ...)``: the advice changes only knobs that pay. Where knobs of a best lose nothing when
  put back (a predictor while prefetch is off, a policy no pick reaches), the best with all of them put back is
  replayed in full and replaces it when it is at least as fast; its knobs are attributed again. Returns the
  attribution of the final bests (``res["best"]`` is updated in place).
"""
from __future__ import annotations

import dataclasses
import math
import time

import numpy as np

from moetier.errors import UserError
from moetier.measure import advise_space as space

ETA = 3


def candidates(knobs: list, n: int, seed: int) -> list[tuple]:
    """Start, single-knob changes, then seeded random combinations, ``n`` distinct in all (module docstring)."""
    start = tuple(0 for _ in knobs)
    out, seen = [start], {start}
    # round-robin over the knobs (each knob's first change, then each one's second, ...): a small n still touches
    # every knob
    for j in range(1, max((len(k.choices) for k in knobs), default=1)):
        for i, k in enumerate(knobs):
            if j < len(k.choices):
                out.append(tuple(j if a == i else 0 for a in range(len(knobs))))
                seen.add(out[-1])
    rng = np.random.default_rng(seed)
    total = math.prod(len(k.choices) for k in knobs)
    while len(out) < min(n, total):
        c = tuple(int(rng.integers(len(k.choices))) for k in knobs)
        if c not in seen:
            out.append(c)
            seen.add(c)
    return out[:max(n, 1)]


def overrides(knobs: list, cand: tuple) -> list[str]:
    return [o for k, j in zip(knobs, cand) for o in k.choices[j]]


def upgrade_recipe(R, hw: dict):
    """``R`` on upgraded hardware: ``nvme_scale`` (more drives: bandwidth up, queue latencies down by the same
    factor), ``h2d_scale`` (a faster link: copies and the zerocopy lane's streamed experts), ``cores``; and
    ``corner`` ("slow" / "fast": moetier.core.interval.corner, applied last) for the prediction interval."""
    if not hw:
        return R
    from moetier.core import interval
    if "corner" in hw:
        return interval.corner(upgrade_recipe(R, {k: v for k, v in hw.items() if k != "corner"}), hw["corner"])
    hard, engines = dict(R.hardware), [dict(e) for e in R.engines]
    upd = {}
    f = float(hw.get("nvme_scale", 1.0))
    if f != 1.0:
        nv = dict(hard["nvme"])
        for fld in ("latency_by_qd_ms", "latency_by_rows_qd_ms"):
            if fld in nv:
                nv[fld] = interval._scale(nv[fld], 1.0 / f)
        hard["nvme"] = nv
        for e in engines:
            for fld in interval._CHANNEL_TIMES:
                if fld in e and fld.startswith("nvme_latency"):
                    e[fld] = interval._scale(e[fld], 1.0 / f)
        upd.update(nvme_bw_gbps=R.nvme_bw_gbps * f, nvme_bw_qd1_gbps=R.nvme_bw_qd1_gbps * f,
                   nvme_latency_ms=R.nvme_latency_ms / f)
    g = float(hw.get("h2d_scale", 1.0))
    lanes = dict(R.lanes)
    if g != 1.0:
        upd["h2d_gbps"] = R.h2d_gbps * g
        if "zerocopy" in lanes:
            lanes["zerocopy"] = dataclasses.replace(lanes["zerocopy"],
                                                    per_expert_ms=lanes["zerocopy"].per_expert_ms / g)
    if "cores" in hw:
        hard["cpu"] = {**hard["cpu"], "cores": int(hw["cores"])}
    return dataclasses.replace(R, hardware=hard, engines=engines, lanes=lanes, **upd)


def cell(recipe: str, ovr: list, conc: int, steps: int, warmup, trace, hw=None, cand=None) -> dict:
    return {"recipe": recipe, "overrides": list(ovr), "conc": int(conc), "steps": int(steps),
            "warmup": None if warmup is None else int(warmup), "trace": trace, "hw": dict(hw or {}),
            "cand": None if cand is None else list(cand)}


def run_cell(c: dict) -> dict:
    """One replay's row (module docstring)."""
    from moetier.core import records as spec
    from moetier.core import sim
    from moetier.measure import sweep as S
    t0 = time.perf_counter()
    ovr = list(c["overrides"]) + ([f"policy.warmup_tokens={c['warmup']}"] if c["warmup"] is not None else [])
    row = {k: c[k] for k in ("recipe", "overrides", "conc", "steps", "warmup", "cand", "_i") if k in c}
    try:
        R = upgrade_recipe(spec.resolve(c["recipe"], spec.parse_overrides(ovr)), c["hw"])
        res = sim.run(R, S._trace(c["trace"], R), c["conc"], max_steps=c["steps"])
    except (UserError, ValueError) as e:
        return {**row, "error": str(e), "seconds": time.perf_counter() - t0}
    row.update({k: res[k] for k in S.RESULT_FIELDS}, masked_share=res["masked_share"],
               ram_gb=space.ram_gb_used(R), vram_gb=space.vram_gb_used(R),
               bound="cpu-moe" if res["ms_cpu_moe"] > res["ms_gpu_moe"] else "gpu-moe",
               seconds=time.perf_counter() - t0)
    return row


def run_cells(batch: list) -> list:
    return [run_cell(c) for c in batch]


def _run(cells: list, *, workers=None, ray=None, executor=None, progress=None, done=0, total=None) -> list:
    """The rows of ``cells``, in the cells' order whatever order they finished in."""
    from moetier.measure import sweep as S
    out = [None] * len(cells)
    for i, c in enumerate(cells):
        c["_i"] = i
    n = 0
    for r in S.rows(cells, workers=workers, ray=ray, fn=run_cell, batch_fn=run_cells, executor=executor):
        out[r.pop("_i")] = r
        n += 1
        if progress is not None:
            progress(done + n, total)
    for c in cells:
        c.pop("_i", None)
    return out


def fidelities(steps: int, warmup: int) -> list[tuple[int, int | None]]:
    """The rungs' (measured steps, warm-up tokens), shortest first; the last is the full replay."""
    return [(max(8, steps // 9), max(32, warmup // 8)), (max(16, steps // 3), max(64, warmup // 3)), (steps, None)]


def _best_by_conc(rows: list, masked_cap) -> dict:
    """{conc: [rows, best first]} of the rows that ran within the masked cap (None: the start's share in the same
    rows, per concurrency); ties on the candidate's index."""
    start = {r["conc"]: r.get("masked_share", 0.0) for r in rows if r["_idx"] == 0 and "error" not in r}
    by: dict = {}
    for r in rows:
        cap = start.get(r["conc"], 0.0) if masked_cap is None else masked_cap
        if "error" not in r and r["masked_share"] <= cap + 1e-12:
            by.setdefault(r["conc"], []).append(r)
    return {c: sorted(v, key=lambda r: (-r["tok_s"], r["_idx"])) for c, v in by.items()}


def _combined(knobs: list, rows: list, masked_cap) -> list[tuple]:
    """Per concurrency, each knob at the single change that beat the start by most (the start's value if none)."""
    out = []
    for c, ranked in _best_by_conc(rows, masked_cap).items():
        tok = {tuple(r["cand"]): r["tok_s"] for r in ranked}
        base = tok.get(tuple(0 for _ in knobs))
        if base is None:
            continue
        pick = []
        for i, k in enumerate(knobs):
            best, bj = base, 0
            for j in range(1, len(k.choices)):
                t = tok.get(tuple(j if a == i else 0 for a in range(len(knobs))))
                if t is not None and t > best:
                    best, bj = t, j
            pick.append(bj)
        out.append(tuple(pick))
    return out


def search(recipe: str, *, concs=(1, 2, 4), lim, n: int = 64, seed: int = 0, steps: int = 150, trace=None,
           workers=None, ray=None, executor=None, progress=None, hw=None, base_overrides=()) -> dict:
    """Successive halving over the candidates (module docstring); returns knobs, rows, best per concurrency."""
    from moetier.core import records as spec
    R0 = upgrade_recipe(spec.resolve(recipe, spec.parse_overrides(list(base_overrides))), hw or {})
    knobs = space.knobs(R0, lim)
    cands = candidates(knobs, n, seed)
    index = {c: i for i, c in enumerate(cands)}
    warm = int(R0.policy.get("warmup_tokens", 1000))
    rungs = fidelities(steps, warm)
    alive = list(cands)
    all_rows, done = [], 0
    # the work left, for the bar: every rung's cells at its planned survivors
    sizes, a = [], len(alive)
    for _ in rungs:
        sizes.append(a * len(concs))
        a = max(2, math.ceil(a / ETA)) + 1
    total = sum(sizes)
    for r, (st, wu) in enumerate(rungs):
        cells = [cell(recipe, list(base_overrides) + overrides(knobs, c), k, st, wu, trace, hw, c)
                 for c in alive for k in concs]
        rows = _run(cells, workers=workers, ray=ray, executor=executor, progress=progress, done=done, total=total)
        done += len(rows)
        for row in rows:
            row["_idx"] = index[tuple(row["cand"])]
            row["rung"] = r
        all_rows += rows
        if r == len(rungs) - 1:
            break
        nxt = _survivors(rows, max(2, math.ceil(len(alive) / ETA)), lim.masked_cap)
        if r == 0:
            for c in _combined(knobs, rows, lim.masked_cap):
                if c not in index:
                    index[c] = len(index)
                if c not in nxt:
                    nxt.append(c)
        if cands[0] not in nxt:
            nxt.append(cands[0])                   # the start is always confirmed: the baseline beside the advice
        alive = sorted(nxt, key=lambda c: index[c])
        total += (len(alive) * len(concs)) - sizes[r + 1]
    final = [r for r in all_rows if r["rung"] == len(rungs) - 1]
    ranked = _best_by_conc(final, lim.masked_cap)
    start_rows = {r["conc"]: r for r in final if r["_idx"] == 0}
    best = {c: ranked[c][0] for c in concs if ranked.get(c)}
    return {"recipe": recipe, "knobs": knobs, "candidates": len(index), "rows": all_rows, "best": best,
            "start": start_rows, "rungs": rungs, "cells": done, "R0": R0}


def _survivors(rows: list, keep: int, masked_cap) -> list:
    """The candidates a rung sends up: the best ``keep`` per concurrency and the memory/speed fronts (the Pareto
    view needs them replayed in full), each once, in the order found."""
    nxt: list = []
    for ranked in _best_by_conc(rows, masked_cap).values():
        up = ranked[:keep]
        for mem in ("ram_gb", "vram_gb"):
            up += [x for x, on in zip(ranked, pareto([(x[mem], x["tok_s"]) for x in ranked])) if on]
        for row in up:
            if tuple(row["cand"]) not in nxt:
                nxt.append(tuple(row["cand"]))
    return nxt


def attribution(res: dict, *, trace=None, workers=None, ray=None, executor=None, hw=None,
                base_overrides=()) -> dict:
    """{conc: [(knob name, choice label, tok/s lost when put back)]} for each changed knob of each best."""
    knobs, cells, keys = res["knobs"], [], []
    steps = res["rungs"][-1][0]
    for c, row in res["best"].items():
        cand = tuple(row["cand"])
        for i, j in enumerate(cand):
            if j:
                back = tuple(0 if a == i else b for a, b in enumerate(cand))
                cells.append(cell(res["recipe"], list(base_overrides) + overrides(knobs, back), c, steps, None,
                                  trace, hw, back))
                keys.append((c, i, j))
    out: dict = {c: [] for c in res["best"]}
    for (c, i, j), row in zip(keys, _run(cells, workers=workers, ray=ray, executor=executor)):
        lost = res["best"][c]["tok_s"] - row["tok_s"] if "error" not in row else None
        out[c].append({"knob": knobs[i].name, "value": knobs[i].label(j), "lost_tok_s": lost})
    for c in out:
        out[c].sort(key=lambda x: -(x["lost_tok_s"] if x["lost_tok_s"] is not None else -1e300))
    return out


def simplify(res: dict, mattered: dict, *, trace=None, workers=None, ray=None, executor=None, hw=None,
             base_overrides=()) -> dict:
    """Put back every knob that pays nothing (module docstring); returns the final bests' attribution."""
    knobs, steps, last = res["knobs"], res["rungs"][-1][0], len(res["rungs"]) - 1
    index = {k.name: i for i, k in enumerate(knobs)}
    trial = {}
    for c, items in mattered.items():
        idle = {index[it["knob"]] for it in items if it["lost_tok_s"] is not None and it["lost_tok_s"] <= 0}
        if idle:
            trial[c] = tuple(0 if i in idle else j for i, j in enumerate(res["best"][c]["cand"]))
    if not trial:
        return mattered
    cells = [cell(res["recipe"], list(base_overrides) + overrides(knobs, cand), c, steps, None, trace, hw, cand)
             for c, cand in trial.items()]
    changed = {}
    for c, row in zip(trial, _run(cells, workers=workers, ray=ray, executor=executor)):
        if "error" not in row and row["tok_s"] >= res["best"][c]["tok_s"]:
            row["rung"], row["_idx"] = last, res["candidates"]
            res["candidates"] += 1
            changed[c] = row
    if not changed:
        return mattered
    res["best"].update(changed)
    res["rows"] += changed.values()        # the Pareto view's points
    again = attribution({**res, "best": changed}, trace=trace, workers=workers, ray=ray, executor=executor, hw=hw,
                        base_overrides=base_overrides)
    return {**mattered, **again}


def pareto(points: list) -> list[bool]:
    """Which (memory, tok/s) points no other point beats: at most the memory and more tok/s, or less memory and at
    least the tok/s."""
    out = []
    for m, t in points:
        out.append(not any((m2 <= m and t2 > t) or (m2 < m and t2 >= t) for m2, t2 in points))
    return out


RAM_STEPS = (1.25, 1.5, 2.0)      # the RAM cap times these: steps that scale with the machine


def upgrades(R) -> list[dict]:
    """The upgrades the hardware record can express: {name, what, sets (recipe overrides), hw (edits), ram_gb
    (the RAM cap it gives, None: unchanged)}, or with ``why`` where it cannot be expressed."""
    out = []
    cap = float(R.raw["budget"]["ram_gb"])
    for f in RAM_STEPS:
        out.append({"name": f"ram {cap:g} -> {cap * f:g} GB", "ram_gb": cap * f, "hw": {}})
    name = str(R.hardware["nvme"].get("name", ""))
    drives = int(name.split("x", 1)[0]) if name.split("x", 1)[0].isdigit() else 1
    out.append({"name": f"nvme {drives} -> {drives + 1} drives", "hw": {"nvme_scale": (drives + 1) / drives},
                "ram_gb": None})
    if space.vram_gb(R) is not None:
        out.append({"name": "second gpu's vram as a tier", "why": "a recipe has one VRAM tier and one gpu lane; "
                    "a second device is not expressible in the records"})
        out.append({"name": "pcie link x2", "hw": {"h2d_scale": 2.0}, "ram_gb": None})
    cores = int((R.hardware.get("cpu") or {}).get("cores") or 1)
    out.append({"name": f"cpu cores {cores} -> {2 * cores}", "hw": {"cores": 2 * cores}, "ram_gb": None})
    return out
