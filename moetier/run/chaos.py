"""Chaos: the runtime under injected read faults, checked layer by layer against a run without them.

Contract
--------
``chaos(R, store, trace, layer_steps=..., rate=..., ...)`` first runs the recipe without faults - the reference: a
digest of every layer's output at every step - then runs it again and again with a seeded
``FaultPlan.at_rate`` (EIO, short read, flipped byte, slow completion at ``rate``; a stalled completion at
``stall_rate``), each run with its own seed, until at least ``layer_steps`` layer outputs were computed under
faults, or until ``max_runs`` runs were made (default: four times the runs the target needs when none stops
early, at least four) - a run that stops during seeding computes no layer output, so the target alone need not be
reached (at a stall rate that stalls seeding's reads, every run stops there). Every read is verified (verify_rate 1): a flipped byte is caught by its checksum. Each run either completes
- a failed read is read again, up to ``retries`` times - or stops with one line (a ``UserError``: the retries ran
out, or a transfer did not land within ``stall_timeout_s``). The figures:

  layer_steps     layer outputs computed under faults (stopped runs' included); target_layer_steps, the goal
  runs, completed, stops, stop_lines, max_runs
  faults          injected, by kind (eio, short, flip, slow, stall)
  retries         reads read again after a failure
  wrong_outputs   layer outputs whose bytes differ from the reference's; an output computed from bytes that were
                  not the store's would show here. Must be 0.
  reads, reads_verified

The reference and the chaos runs replay the same steps of the same trace at concurrency 1, so their outputs must be
bit-identical (the runtime's kernels fix every reduction order).
"""
from __future__ import annotations

import hashlib

from moetier.errors import UserError


def _digest(y) -> bytes:
    return hashlib.blake2b(y.tobytes(), digest_size=8).digest()


def _one_run(R, store, trace, *, steps: int, faults, retries: int, stall_timeout_s, backend: str):
    """(digests {(step, layer): digest}, the run's read retries, backend read stats, stop line or None)."""
    from moetier.run import runtime
    out: dict = {}
    seen: dict = {}

    def hook(step, layer, xin, y, rows_keys, rows_w, rt):
        out[(step, layer)] = _digest(y)
        seen["rt"] = rt
    be = runtime.make_backend(backend, store, R, 1, 1.0, faults=faults)
    stop = None
    with runtime.closing(be, stall_timeout_s):
        try:
            runtime.run(R, store, be, trace, 1, max_steps=steps, layer_hook=hook, retries=retries,
                        wait_timeout_s=stall_timeout_s)
        except UserError as e:
            stop = str(e)
        stats = dict(getattr(be, "stats", {}) or {})
    rt = seen.get("rt")
    return out, (rt.stats["read_retries"] if rt is not None else 0), stats, stop


def chaos(R, store, trace, *, layer_steps: int = 10_000, rate: float = 0.05, stall_rate: float = 0.0,
          kinds=("eio", "short", "flip", "slow"), seed: int = 0, steps_per_run: int = 250, retries: int = 3,
          stall_timeout_s: float = 1.0, backend: str = "cpu", max_runs: int | None = None, progress=None) -> dict:
    """Run the chaos check (module docstring) and return its figures."""
    if max_runs is None:
        max_runs = max(4, 4 * -(-layer_steps // max(1, steps_per_run * R.layers)))
    from moetier.bytes.transport import FAULT_KINDS, FaultPlan
    ref, _, _, stop = _one_run(R, store, trace, steps=steps_per_run, faults=None, retries=0,
                               stall_timeout_s=None, backend=backend)
    if stop is not None:
        raise UserError(f"chaos: the reference run without faults stopped: {stop}")
    fig = {"recipe": R.id, "backend": backend, "rate": rate, "stall_rate": stall_rate, "kinds": list(kinds),
           "seed": seed, "steps_per_run": steps_per_run, "retries_allowed": retries,
           "stall_timeout_s": stall_timeout_s, "target_layer_steps": layer_steps, "max_runs": max_runs,
           "layer_steps": 0, "runs": 0, "completed": 0, "stops": 0,
           "stop_lines": [], "faults": dict.fromkeys(FAULT_KINDS, 0), "retries": 0, "wrong_outputs": 0,
           "reads": 0, "reads_verified": 0}
    while fig["layer_steps"] < layer_steps and fig["runs"] < max_runs:
        plan = FaultPlan.at_rate(rate, kinds=kinds, stall_rate=stall_rate, seed=seed + fig["runs"],
                                 stall_s=4 * stall_timeout_s + 1.0)
        got, tries, stats, stop = _one_run(R, store, trace, steps=steps_per_run, faults=plan, retries=retries,
                                           stall_timeout_s=stall_timeout_s, backend=backend)
        fig["runs"] += 1
        fig["layer_steps"] += len(got)
        fig["wrong_outputs"] += sum(1 for k, d in got.items() if ref.get(k) != d)
        fig["retries"] += tries
        fig["reads"] += int(stats.get("reads", 0))
        fig["reads_verified"] += int(stats.get("checksum_checked", 0))
        for kind, n in plan.counts().items():
            fig["faults"][kind] += n
        if stop is None:
            fig["completed"] += 1
        else:
            fig["stops"] += 1
            fig["stop_lines"].append(stop)
        if progress is not None:
            progress(fig)
    return fig
