"""Progress for the command line: one bar per long-running piece of work, with its rate and time left.

Contract
--------
- ``session(quiet)`` wraps one command (``moetier.cli.main`` opens it around every verb; scripts such as
  examples/levers.py open their own). Inside it, ``task(label, unit)`` is a context manager yielding a callback
  ``cb(done, total)`` that the library's ``progress=`` parameters accept (sim.run, runtime.run, store.pack/verify,
  traces.stats, sweep); leaving the block marks the task complete. ``status(label)`` yields a callback
  ``cb(message)`` for work that reports stages rather than counts (calibrate); each call is one stage done.
- Bars draw on stderr only, only when stderr is a terminal and the session is not quiet (``--quiet``,
  or MOETIER_QUIET=1). Otherwise every callback does nothing, and nothing is written: piped
  output stays byte-for-byte what the verb prints.
- Outside a session, ``task`` and ``status`` yield no-op callbacks, so library code can always call them.
"""
from __future__ import annotations

import contextlib
import os
import sys
import time

_state = {"progress": None, "quiet": False}


def _noop(*_a, **_k) -> None:
    return None


def enabled() -> bool:
    """Whether bars draw: a session is open, it is not quiet, and stderr is a terminal."""
    return _state["progress"] is not None


@contextlib.contextmanager
def session(quiet: bool = False):
    """Open the shared progress display for one command (a no-op when quiet or not on a terminal)."""
    quiet = quiet or os.environ.get("MOETIER_QUIET", "") not in ("", "0")
    prev = dict(_state)
    _state["quiet"] = quiet
    if quiet or not sys.stderr.isatty() or _state["progress"] is not None:
        try:
            yield
        finally:
            _state.update(prev)
        return
    from rich.console import Console
    from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TaskProgressColumn, TextColumn,
                               TimeElapsedColumn, TimeRemainingColumn)
    p = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                 TextColumn("{task.fields[unit]}"), TaskProgressColumn(),
                 TextColumn("[cyan]{task.fields[rate]}"),
                 TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn(),
                 console=Console(file=sys.stderr), transient=True, refresh_per_second=8)
    _state["progress"] = p
    p.start()
    try:
        yield
    finally:
        p.stop()
        _state.update(prev)


class _Task:
    """One bar: ``self(done, total)`` moves it; the rate is done / elapsed since the task began."""

    def __init__(self, p, label: str, unit: str, total):
        self.p, self.t0 = p, time.perf_counter()
        self.id = p.add_task(label, total=total, unit=unit, rate="")

    def __call__(self, done, total=None) -> None:
        dt = time.perf_counter() - self.t0
        rate = f"{done / dt:,.1f}/s" if dt > 0 and done else ""
        if total is not None:
            self.p.update(self.id, completed=done, total=total, rate=rate)
        else:
            self.p.update(self.id, completed=done, rate=rate)

    def finish(self) -> None:
        t = self.p.tasks[[x.id for x in self.p.tasks].index(self.id)]
        if t.total is not None:
            self.p.update(self.id, completed=t.total)
        self.p.remove_task(self.id)


@contextlib.contextmanager
def task(label: str, unit: str = "steps", total=None):
    """A bar for counted work; yields ``cb(done, total)`` (a no-op outside a drawing session)."""
    p = _state["progress"]
    if p is None:
        yield _noop
        return
    t = _Task(p, label, unit, total)
    try:
        yield t
    finally:
        t.finish()


@contextlib.contextmanager
def status(label: str, total=None):
    """A bar for staged work; yields ``cb(message)``: each call completes one stage and shows the message."""
    p = _state["progress"]
    if p is None:
        yield _noop
        return
    t = _Task(p, label, "stages", total)
    n = [0]

    def cb(message: str = "") -> None:
        n[0] += 1
        p.update(t.id, description=f"{label}: {message}" if message else label)
        t(n[0] - 1)
    try:
        yield cb
    finally:
        t.finish()
