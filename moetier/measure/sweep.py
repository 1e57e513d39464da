"""Sweeps: the simulator over a grid of cells, on a local process pool or a Ray cluster, resumable.

Contract
--------
- A *cell* is one replay: a recipe, its overrides (``"path=value"`` strings, values canonical JSON), a trace
  (None: the recipe's), a concurrency, a RAM eviction policy (None: the recipe's; it sets ``policy.ram_evict``)
  and a cap on measured steps. ``cells(...)`` builds the cartesian product overrides x traces x concurrency x
  policies in a fixed order; ``cell_key(cell)`` is the SHA-256 (first 16 hex digits) of the cell's canonical JSON,
  so the same cell always has the same key, whatever the order of the grid's axes on the command line.
- ``run_cell(cell)`` resolves the recipe, loads the trace (cached per worker process) and returns one result row:
  the cell's fields, ``key``, the simulator's figures (``RESULT_FIELDS``) and ``seconds`` (the cell's wall time in
  its worker). Everything but ``seconds`` and ``worker`` is a pure function of the cell: the same cell gives the
  same row on any worker, pool or Ray.
- ``sweep(cells, out, ...)`` appends one JSON line per finished cell to ``out`` as cells finish (flushed per
  line), skipping cells whose key is already in ``out`` (a re-run resumes; a torn last line from a killed run is
  cut off before appending). Local: a process pool of ``workers`` processes (default: the CPU count). Ray:
  ``ray="local"`` starts a local Ray instance with ``workers`` CPUs; any other string is a cluster address
  (``ray.init(address=...)``); moetier must be importable on every node.
- Nothing outlives a killed sweep: pool workers die with the process that started them, even on SIGKILL
  (moetier.measure.lifeline), and so does the resource tracker once they are gone; Ray starts a local instance's
  processes fate-shared with their driver on Linux (its own prctl), and ``ray.shutdown`` ends them on a clean exit.
"""
from __future__ import annotations

import hashlib
import itertools
import json
import os
import time
from functools import lru_cache
from pathlib import Path

from moetier.errors import UserError

REPO = Path(__file__).resolve().parents[2]
POLICY_PATH = "policy.ram_evict"
RESULT_FIELDS = ("tok_s", "ms_per_step", "ms_fixed", "ms_gpu_moe", "ms_cpu_moe", "ms_nvme_wait", "vram_hit",
                 "cpu_experts_per_tok", "zerocopy_per_tok", "nvme_per_tok", "masked_per_tok", "steps", "tokens")
TIMING_FIELDS = ("seconds", "worker")


def parse_axis(item: str) -> tuple[str, list[str]]:
    """``path=v1,v2,...`` -> (path, ["v1", ...]) with each value canonical JSON (a bare word is a string).
    Values are read as one JSON list first, so JSON objects with commas survive: ``x={"a":1},{"a":2}``."""
    path, sep, vals = item.partition("=")
    if not sep or not path or not vals:
        raise UserError(f"--grid {item!r}: expected PATH=V1,V2,... (for example budget.ram_gb=30,55,100)")
    from moetier import strictjson
    try:
        parsed = strictjson.loads(f"[{vals}]", f"--grid {path}=")
    except UserError as e:
        if "invalid JSON" not in str(e):        # a non-finite number or deep nesting: not a list of strings
            raise
        parsed = []
        for v in vals.split(","):
            try:
                parsed.append(strictjson.loads(v, f"--grid {path}="))
            except UserError as e:
                if "invalid JSON" not in str(e):
                    raise
                parsed.append(v)
    if not parsed:
        raise UserError(f"--grid {item!r}: no values")
    vals = [json.dumps(v, sort_keys=True) for v in parsed]
    if len(set(vals)) != len(vals):
        dup = next(v for v in vals if vals.count(v) > 1)
        raise UserError(f"--grid {path}: the value {dup} twice (expected each value once)")
    return path, vals


def cells(recipe: str, *, grid=(), sets=(), traces=(None,), concs=(1,), policies=(None,), steps: int = 0) -> list:
    """The cartesian product (module docstring), one dict per cell, in a fixed order."""
    axes = [parse_axis(g) for g in grid]
    paths = [p for p, _ in axes]
    if len(set(paths)) != len(paths):
        raise UserError(f"--grid: a path is given twice: {paths}")
    out = []
    for values in itertools.product(*[v for _, v in axes]):
        ov = list(sets) + [f"{p}={v}" for p, v in zip(paths, values)]
        for tr, c, pol in itertools.product(traces or (None,), concs, policies or (None,)):
            out.append({"recipe": recipe, "overrides": ov, "trace": tr, "conc": int(c), "policy": pol,
                        "steps": int(steps)})
    return out


def cell_key(cell: dict) -> str:
    c = {k: cell[k] for k in ("recipe", "overrides", "trace", "conc", "policy", "steps")}
    c["overrides"] = sorted(c["overrides"])
    return hashlib.sha256(json.dumps(c, sort_keys=True).encode()).hexdigest()[:16]


def _overrides(cell: dict) -> list[str]:
    return list(cell["overrides"]) + ([f"{POLICY_PATH}={cell['policy']}"] if cell.get("policy") else [])


def resolve_cell(cell: dict):
    from moetier.core import records as spec
    return spec.resolve(cell["recipe"], spec.parse_overrides(_overrides(cell)))


def check(cells_: list) -> None:
    """Resolve every distinct recipe + overrides once, before anything runs: a bad path or value, or a concurrency
    the trace cannot support (moetier.core.sim.check_conc), is one line."""
    from moetier.core.sim import check_conc
    seen = {}
    for c in cells_:
        k = (c["recipe"], tuple(_overrides(c)), c["trace"])
        if k not in seen:
            seen[k] = _trace(c["trace"], resolve_cell(c))
        check_conc(seen[k], c["conc"])


@lru_cache(maxsize=8)
def _load_trace(path: str, layers: int, experts: int, topk: int, model_id: str):
    from moetier.traces.format import load_trace
    return load_trace(Path(path), None, layers=layers, experts=experts, topk=topk, model_id=model_id)


def _trace(path, R):
    p = path or R.trace
    if not p:
        raise UserError(f"recipe {R.id}: no trace given (--trace) and the recipe names none")
    q = Path(p)
    if not q.is_absolute() and not q.exists():
        from moetier.core import records as spec      # a recipe's trace is relative to its registry's folder
        q = next((r / q for r in spec.data_roots() if (r / q).exists()), q)
    return _load_trace(str(q), R.layers, R.experts, R.topk, R.model_id)


def run_cell(cell: dict) -> dict:
    """One cell's result row (module docstring)."""
    from moetier.core import sim
    t0 = time.perf_counter()
    R = resolve_cell(cell)
    res = sim.run(R, _trace(cell["trace"], R), cell["conc"], max_steps=cell["steps"])
    row = {**cell, "key": cell_key(cell), **{k: res[k] for k in RESULT_FIELDS},
           "prefetch_precision": res["prefetch"]["precision"], "prefetch_recall": res["prefetch"]["recall"]}
    row["seconds"] = time.perf_counter() - t0
    row["worker"] = os.getpid()
    return row


def run_cells(batch: list) -> list:
    """Several cells in one task (fewer Ray tasks for short cells)."""
    return [run_cell(c) for c in batch]


MAX_LINE = 1 << 20      # a result line is about 1 kB; a longer one is not a sweep's
MAX_FILE = 1 << 30      # a million cells


def _lines(out, torn: str = "keep"):
    """(line number, bytes) of each line of an existing results file, read one bounded line at a time; a file that
    is not a regular one (a device, a FIFO: endless) is refused. ``torn="cut"`` truncates a torn last line (a
    killed run) so later appends stay whole; ``"keep"`` skips it."""
    from moetier.bounded import open_regular
    try:
        f = open_regular(out, f"--out {out}", MAX_FILE, "r+b" if torn == "cut" else "rb")
    except FileNotFoundError:
        return
    with f:
        i, good = 0, 0
        while True:
            line = f.readline(MAX_LINE + 1)
            if not line:
                break
            i += 1
            if not line.endswith(b"\n"):
                if len(line) > MAX_LINE:
                    raise UserError(f"--out {out}:{i}: a line over {MAX_LINE} bytes (expected sweep result lines)")
                if torn == "cut":
                    f.truncate(good)
                break
            good += len(line)
            if line.strip():
                yield i, line


def _row(out, i: int, line: bytes) -> dict:
    from moetier import strictjson
    try:
        row = strictjson.loads(line.decode("utf-8"), f"--out {out}:{i}")
    except (UserError, UnicodeDecodeError):
        row = None
    if not isinstance(row, dict) or not isinstance(row.get("key"), str):
        raise UserError(f"--out {out}:{i}: not a sweep result line (JSON with a 'key'); give another --out")
    return row


def done_keys(out) -> set:
    """Keys of the cells already in ``out``; a torn last line (a killed run) is cut off so appends stay whole."""
    return {_row(out, i, line)["key"] for i, line in _lines(out, torn="cut")}


def process_pool(workers: int):
    """A pool of fresh interpreters (spawn: no fork of a process that holds threads) that die with this process,
    even when it is SIGKILLed (moetier.measure.lifeline)."""
    from concurrent.futures import ProcessPoolExecutor
    import multiprocessing as mp
    from moetier.measure.lifeline import die_with_parent
    return ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context("spawn"), initializer=die_with_parent,
                               initargs=(os.getpid(),))


def _pool(pending, workers, executor=None, fn=None):
    from concurrent.futures import as_completed
    own = executor is None
    ex = process_pool(workers) if own else executor
    futs = [ex.submit(fn or run_cell, c) for c in pending]
    try:
        for f in as_completed(futs):
            yield f.result()
    finally:
        for f in futs:
            f.cancel()
        if own:
            ex.shutdown(wait=True, cancel_futures=True)


def _ray(pending, workers, address, batch, batch_fn=None):
    try:
        import ray
    except ImportError:
        raise UserError("--ray needs Ray: pip install 'moetier[ray]'") from None
    started = not ray.is_initialized()
    if started:
        path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
        env = {"env_vars": {"PYTHONPATH": path}}          # the workers import this moetier
        kw = dict(num_cpus=workers) if address == "local" else dict(address=address)
        ray.init(include_dashboard=False, log_to_driver=False, ignore_reinit_error=True, runtime_env=env,
                 logging_level="ERROR", **kw)
    try:
        task = ray.remote(num_cpus=1)(batch_fn or run_cells)
        refs = [task.remote(pending[i:i + batch]) for i in range(0, len(pending), batch)]
        while refs:
            ready, refs = ray.wait(refs, num_returns=1)
            for r in ray.get(ready):
                yield from r
    finally:
        if started:
            ray.shutdown()


def rows(pending: list, *, workers: int | None = None, ray: str | None = None, batch: int = 1, fn=None,
         batch_fn=None, executor=None):
    """Rows of ``pending`` as they finish, on the pool or Ray as ``sweep`` runs them, without a results file:
    ``fn(cell)`` / ``batch_fn(cells)`` (module-level, importable by the workers) replace run_cell / run_cells;
    ``executor``: a process pool to reuse across calls."""
    workers = workers or os.cpu_count() or 1
    if ray:
        return _ray(pending, workers, ray, batch, batch_fn)
    return _pool(pending, workers, executor, fn)


def sweep(cells_: list, out, *, workers: int | None = None, ray: str | None = None, batch: int = 1,
          progress=None, executor=None) -> dict:
    """Run the cells not yet in ``out``, appending each row as it finishes; returns a summary dict. ``executor``:
    a process pool to reuse (benchmarks/bench_sweep.py keeps one warm); with ``ray``, a Ray instance already
    initialised is used as it is and left running."""
    workers = workers or os.cpu_count() or 1
    keys = [cell_key(c) for c in cells_]
    if len(set(keys)) != len(keys):
        raise UserError("sweep: the grid repeats a cell (the same overrides twice?)")
    have = done_keys(out)
    pending = [c for c, k in zip(cells_, keys) if k not in have]
    check(pending)
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    n = 0
    if pending:
        rows = _ray(pending, workers, ray, batch) if ray else _pool(pending, workers, executor)
        from moetier.linelog import LineLog
        with LineLog(out, f"--out {out}") as log:
            for row in rows:
                log.append(json.dumps(row, sort_keys=True))
                n += 1
                if progress is not None:
                    progress(n, len(pending))
    wall = time.perf_counter() - t0
    return {"cells": len(cells_), "skipped": len(cells_) - len(pending), "ran": n, "seconds": wall,
            "cells_per_s": n / wall if n and wall > 0 else None, "backend": f"ray {ray}" if ray else "pool",
            "workers": workers, "out": str(out)}


def read_rows(out) -> list[dict]:
    """Every result line of ``out`` (bounded reads, as done_keys)."""
    return [_row(out, i, line) for i, line in _lines(out)]
