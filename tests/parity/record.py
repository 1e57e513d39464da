"""The core's parity reference: every shipped recipe x its trace x C1/C2/C4 x every replay of `moetier compare`.

    python -m tests.parity.record            # rewrite tests/parity/reference.json from this tree
    python -m tests.parity.record --check    # replay every cell and compare with it (exit 1 on a difference)

A cell is one ``sim.run`` of one row's replay (``moetier compare``'s rows, the oracle's structures each on its
own; rows whose replays are identical, ``compare.replay_key``, are run once, as compare runs them) at one
concurrency, capped so that the suite stays affordable in CI: ``WARMUP`` warm-up tokens per stream
(``policy.warmup_tokens``; the warm-up seeds the tiers and is replayed) and ``STEPS`` measured steps. Per cell it
keeps, as xxh3-64 digests of the whole run (warm-up included):

* ``deal``: every layer plan's lane deal, the keys of each lane in the plan's order (gpu, zerocopy, cpu,
  nvme_cpu, nvme_gpu, masked);
* ``times``: every layer plan's figures (ms, gpu_ms, cpu_ms, nvme_wait_ms, gpu_wait_ms, issue_ms, demand reads,
  the NVMe arrivals), exact floats;
* ``ledger``: after every step, the tier contents: every key's residency state and every VRAM key's slot
  (``tier_contents``, the one place that reads the ledger's inside);

and in clear the report's ``tok_s`` and ``ms_per_step`` (repr: exact floats) and the ledger's counters (evictions,
refusals: they show the cell exercised its replacement policy). The reference is recorded once, from the tree
before a change to the core, and compared exactly (tests/test_core_parity.py); the observer is sim.run's own
``plan_hook`` and ``wire`` (the replay it builds), so nothing in the core records anything.
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import xxhash

from moetier.core import records as spec
from moetier.core import sim
from moetier.core.step_kernel import Steps
from moetier.peers.compare import distinct_replays
from moetier.peers.rows import DEFAULT, wiring
from moetier.traces.format import load_trace

REFERENCE = Path(__file__).with_name("reference.json")
STEPS = 40            # measured steps per cell
WARMUP = 16           # warm-up tokens per stream (policy.warmup_tokens): the warm steps before the measured ones
CONCS = (1, 2, 4)
_LANES = ("gpu", "zerocopy", "cpu", "nvme_cpu", "nvme_gpu", "masked")


def recipes() -> list[str]:
    """The shipped recipes (the user registry's are not part of the reference)."""
    return spec.record_ids("recipe", spec.REGISTRY)


def capped(R):
    """The recipe with the suite's warm-up cap."""
    return replace(R, policy=dict(R.policy, warmup_tokens=min(WARMUP, int(R.policy.get("warmup_tokens", 1000)))))


def rows(R) -> list:
    """(name, peer) of every distinct replay `moetier compare` runs on ``R`` (its rows, the oracle's structures)."""
    return distinct_replays(R)


def tier_contents(ledger) -> bytes:
    """The ledger's tier contents, canonical: every key's state code (0 = absent), then every VRAM key's slot
    (-1 = none), as int64 arrays over all keys. The only reader of the ledger's inside here: a core over array
    state adapts this function, never the reference."""
    state = np.zeros(ledger.keys, np.int64)
    if ledger.state:
        k = np.fromiter(ledger.state.keys(), np.int64, len(ledger.state))
        state[k] = np.fromiter(ledger.state.values(), np.int64, len(ledger.state))
    slot = np.full(ledger.keys, -1, np.int64)
    so = ledger.clock.slot_of
    if so:
        slot[np.fromiter(so.keys(), np.int64, len(so))] = np.fromiter(so.values(), np.int64, len(so))
    return state.tobytes() + slot.tobytes()


def _plan_figures(plan) -> bytes:
    arr = sorted(plan.arrivals.items())
    return repr((plan.ms, plan.gpu_ms, plan.cpu_ms, plan.nvme_wait_ms, plan.gpu_wait_ms, plan.issue_ms,
                 plan.demand_reads, arr)).encode()


class NotCompiled(Exception):
    """run_cell(compiled=True) on a cell the simulator's compiled step loop does not cover."""


def run_cell(R, trace, name: str, peer, conc: int, steps: int = STEPS, compiled: bool = False) -> dict:
    """One cell's record (module docstring), and ``final``: the digest of the tier contents the run ends with.
    ``R`` is already capped. ``compiled``: the run without the plan hook, so that the simulator runs its compiled
    step loop (moetier.core.step_kernel), which covers the cell or raises NotCompiled; its record holds what that
    loop's report and ledger give (the tok/s figures, counters, ``final``), the per-plan digests empty."""
    deal, times, ledger = xxhash.xxh3_64(), xxhash.xxh3_64(), xxhash.xxh3_64()
    held = {}
    peer_wire = None if peer is DEFAULT else wiring(peer, R.layers, R.experts)

    def wire(rp, streams, n):
        held["rp"] = rp
        order = peer_wire(rp, streams, n) if peer_wire is not None else None
        if compiled and not Steps.covers(rp):
            raise NotCompiled(name)
        return order

    last = R.layers - 1

    def hook(step, layer, plan):
        for lane in _LANES:
            deal.update(np.asarray(getattr(plan, lane), np.int64).tobytes() + b"|")
        times.update(_plan_figures(plan))
        if layer == last:                 # the step's last commit is done: the tiers as the next step finds them
            ledger.update(tier_contents(held["rp"].ledger))

    rec = R if peer is DEFAULT else replace(R, policy=_policy(R, peer))
    o = sim.run(rec, trace, conc, max_steps=steps, plan_hook=None if compiled else hook, wire=wire)
    return {"recipe": R.id, "row": name, "conc": conc, "steps": o["steps"], "warm_steps": o["warm_steps"],
            "deal": deal.hexdigest(), "times": times.hexdigest(), "ledger": ledger.hexdigest(),
            "tok_s": repr(o["tok_s"]), "ms_per_step": repr(o["ms_per_step"]),
            "counters": {k: int(v) for k, v in sorted(o["ledger"].items())},
            "final": xxhash.xxh3_64_hexdigest(tier_contents(held["rp"].ledger))}


def _policy(R, peer) -> dict:
    from moetier.peers.compare import _policy as policy
    return policy(R, peer)


def grid(only=None):
    """Every cell's (capped recipe, trace, row name, row, concurrency), recipe by recipe (``only``: recipe ids)."""
    for rid in only or recipes():
        R = capped(spec.resolve(rid))
        trace = load_trace(spec.REGISTRY.parent / R.trace, layers=R.layers, experts=R.experts, topk=R.topk)
        for name, peer in rows(R):
            for c in CONCS:
                yield R, trace, name, peer, c


def cells(only=None):
    """Every cell's record, recipe by recipe (``only``: a list of recipe ids)."""
    for cell in grid(only):
        yield run_cell(*cell)


def document(records: list) -> dict:
    return {"steps": STEPS, "warmup_tokens": WARMUP, "concs": list(CONCS), "cells": [recorded(c) for c in records]}


def recorded(c: dict) -> dict:
    """What the reference keeps of a cell's record (``final`` is compared between the runs of one tree)."""
    return {k: v for k, v in c.items() if k != "final"}


def cell_id(c: dict) -> str:
    return f"{c['recipe']} / {c['row']} / C{c['conc']}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.parity.record", description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="compare with the reference instead of rewriting it")
    ap.add_argument("--recipe", action="append", help="only this recipe (repeatable; with --check)")
    a = ap.parse_args(argv)
    recs = list(cells(a.recipe))
    if not a.check:
        if a.recipe:
            ap.error("--recipe: the reference holds every shipped recipe; record without it")
        REFERENCE.write_text(json.dumps(document(recs), indent=0, sort_keys=True) + "\n")
        print(f"wrote {REFERENCE} ({len(recs)} cells)")
        return 0
    ref = {cell_id(c): c for c in json.loads(REFERENCE.read_text())["cells"]}
    bad = [cell_id(c) for c in recs if ref.get(cell_id(c)) != recorded(c)]
    for b in bad:
        print(f"differs: {b}")
    print(f"{len(recs) - len(bad)} of {len(recs)} cells identical")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
