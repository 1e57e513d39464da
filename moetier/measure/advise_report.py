"""`moetier advise` end to end, without printing: search, the advice's interval, which knobs mattered, the advised
recipe records, and what to buy next.

Contract
--------
- ``advise(recipe, ...)`` runs moetier.measure.advise.search on one process pool (or Ray) kept for the whole call,
  then per concurrency puts each changed knob back (advise.attribution), drops those that pay nothing
  (advise.simplify) and replays the best at the interval's slow and fast corners (moetier.core.interval). Returns {"search", "best", "start", "interval", "mattered",
  "seconds", "candidates", "cells"}; ``best[c]`` / ``start[c]`` are full-replay rows.
- ``record(R0, row, rid, conc, seed)`` is the advised recipe record: the starting record with the winning overrides,
  its own id and status "what-if", a note saying where it came from. The caller writes it (moetier.core.records).
- ``upgrade_table(recipe, base, ...)``: one row per what-if: by default each upgrade of advise.upgrades, searched
  again on the upgraded machine, rows {name, best: {conc: tok/s}, gain: {conc: tok/s gained over ``base``'s best},
  ...} or {name, why} where the records cannot express it. Given a fixed path of what-ifs (recipe overrides, such
  as software changes, and hardware edits), ``search=False`` replays the recipe with each as it is and
  ``cumulative=True`` stacks each on the ones before it: the lever study (examples/levers.py) is that one call.
- ``target_check(R0, target, concs)``: a target above what no placement can reach (all MoE time gone: the
  non-MoE time alone) is a UserError naming that ceiling.
"""
from __future__ import annotations

import contextlib
import copy
import dataclasses
import json
import os
import time

from moetier.errors import UserError
from moetier.measure import advise as A


@contextlib.contextmanager
def _executor(workers, ray):
    if ray:
        yield None
        return
    from moetier.measure import sweep as S
    ex = S.process_pool(workers or os.cpu_count() or 1)
    try:
        yield ex
    finally:
        ex.shutdown(wait=True, cancel_futures=True)


def advise(recipe: str, *, lim, concs=(1, 2, 4), n: int = 64, seed: int = 0, steps: int = 150, trace=None,
           workers=None, ray=None, progress=None, upgrades: bool = False, executor=None) -> dict:
    from moetier.core import records as spec
    from moetier.measure import advise_space as space
    kw = dict(trace=trace, workers=workers, ray=ray, base_overrides=space.clamp(spec.resolve(recipe), lim))
    with (contextlib.nullcontext(executor) if executor is not None else _executor(workers, ray)) as ex:
        t0 = time.perf_counter()
        res = A.search(recipe, concs=concs, lim=lim, n=n, seed=seed, steps=steps, progress=progress,
                       executor=ex, **kw)
        seconds = time.perf_counter() - t0
        mattered = A.simplify(res, A.attribution(res, executor=ex, **kw), executor=ex, **kw)
        cells = [A.cell(recipe, res["best"][c]["overrides"], c, steps, None, trace, {"corner": side})
                 for c in res["best"] for side in ("slow", "fast")]
        corners = A._run(cells, executor=ex, workers=workers, ray=ray)
        iv = {}
        for i, c in enumerate(res["best"]):
            t = [r["tok_s"] for r in corners[2 * i:2 * i + 2] if "error" not in r]
            iv[c] = {"low": min(t), "high": max(t)} if len(t) == 2 else None
        out = {"search": res, "best": res["best"], "start": res["start"], "interval": iv, "mattered": mattered,
               "seconds": seconds, "candidates": res["candidates"], "cells": res["cells"]}
        if upgrades:
            out["upgrades"] = upgrade_table(recipe, res, lim=lim, concs=concs, n=n, seed=seed, steps=steps,
                                            executor=ex, progress=progress, **kw)
    return out


def upgrade_table(recipe: str, base: dict | None = None, *, concs, steps, upgrades=None, search: bool = True,
                  cumulative: bool = False, lim=None, n: int = 64, seed: int = 0, executor=None, progress=None,
                  trace=None, workers=None, ray=None, base_overrides=()) -> list[dict]:
    """One row per what-if (module docstring). ``upgrades``: [{name, sets (recipe overrides), hw
    (advise.upgrade_recipe's edits), ram_gb (a RAM cap, None: unchanged), alone (true: on the recipe alone, not
    carried to the next)}] or {name, why}; default advise.upgrades of ``base``'s start. ``search``: search each
    what-if again (``lim``, ``n``, ``seed``; its best as found: ``advise.simplify`` runs on the advice alone, and
    only ever raises a best, so a gain here can read a little low) or replay the recipe with it as it is (a fixed
    path, such as examples/levers.py's). ``cumulative``: each what-if on top of the ones before it (a fixed path only: a search
    sizes RAM per what-if, so earlier RAM caps would not carry)."""
    if cumulative and search:
        raise ValueError("upgrade_table: cumulative what-ifs are a fixed path; expected search=False with them")
    ups = A.upgrades(base["R0"]) if upgrades is None else upgrades
    kw = dict(trace=trace, workers=workers, ray=ray)
    steps_of = _path(ups, search, cumulative)
    if search:
        found = []
        for u, st in zip(ups, steps_of):
            if st is None:
                found.append(None)
                continue
            lim_u = dataclasses.replace(lim, ram_gb=u["ram_gb"]) if u.get("ram_gb") is not None else lim
            res = A.search(recipe, concs=concs, lim=lim_u, n=n, seed=seed, steps=steps, hw=st[1], executor=executor,
                           progress=progress, base_overrides=list(base_overrides) + st[0], **kw)
            found.append(res["best"])
    else:
        # a fixed path: every what-if at every concurrency is one full replay, all of them in one batch
        cells = [A.cell(recipe, list(base_overrides) + st[0], c, steps, None, trace, st[1])
                 for st in steps_of if st is not None for c in concs]
        done = iter(A._run(cells, executor=executor, progress=progress, total=len(cells), workers=workers,
                           ray=ray))
        found = [None if st is None else {c: next(done) for c in concs} for st in steps_of]
    return [{"name": u["name"], "why": u["why"]} if st is None else _upgrade_row(u, st, best, base, concs, search)
            for u, st, best in zip(ups, steps_of, found)]


def _path(ups: list, search: bool, cumulative: bool) -> list:
    """Per what-if its (recipe overrides, hardware edits) as replayed, None where it cannot be expressed; stacked on
    the ones before it where ``cumulative`` (an ``alone`` one is neither stacked nor carried)."""
    steps_of, acc, hw_acc = [], [], {}
    for u in ups:
        if "why" in u:
            steps_of.append(None)
            continue
        ram = [] if u.get("ram_gb") is None or search else [f"budget.ram_gb={json.dumps(u['ram_gb'])}"]
        lead, hw_lead = ([], {}) if u.get("alone") or not cumulative else (acc, hw_acc)
        sets, hw = lead + list(u.get("sets", ())) + ram, {**hw_lead, **u.get("hw", {})}
        if cumulative and not u.get("alone"):
            acc, hw_acc = sets, hw
        steps_of.append((sets, hw))
    return steps_of


def _upgrade_row(u: dict, st: tuple, best: dict, base, concs, search: bool) -> dict:
    ok = {c: r for c, r in best.items() if "error" not in r}
    row = {"name": u["name"], "sets": st[0], "hw": st[1], "best": {c: r["tok_s"] for c, r in ok.items()},
           "overrides": {c: r["overrides"] for c, r in ok.items()}}
    if not search:
        row["rows"] = best              # the replays themselves: a fixed path reads their terms
    if base is not None:
        row["gain"] = {c: ok[c]["tok_s"] - base["best"][c]["tok_s"] for c in concs if c in ok and c in base["best"]}
    return row


def record(R0, row: dict, rid: str, conc: int, seed: int) -> dict:
    from moetier.core import records as spec
    rec = spec.apply_overrides(copy.deepcopy(R0.raw), spec.parse_overrides(row["overrides"]))
    rec["id"] = rid
    rec["status"] = "what-if"
    changed = ", ".join(row["overrides"]) or "no change"
    rec["note"] = (f"advised by `moetier advise {R0.id}` for C{conc} (seed {seed}): {changed}; predicted "
                   f"{row['tok_s']:.2f} tok/s")
    return rec


def target_check(R0, target: float, concs) -> None:
    for c in concs:
        ceiling = 1000.0 * c / R0.fixed(c) if R0.fixed(c) > 0 else float("inf")
        if target > ceiling:
            raise UserError(f"--target {target:g}: no placement reaches it at C{c}: the non-MoE part alone "
                            f"({R0.fixed(c):.2f} ms a step, calibration.fixed_ms) caps decode at {ceiling:.2f} tok/s")
