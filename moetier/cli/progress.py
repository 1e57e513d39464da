"""Progress for the command line: one bar per long-running piece of work, with its count, rate and time left.

Contract
--------
- ``session(quiet)`` wraps one command (``moetier.cli.main`` opens it around every verb; scripts such as
  examples/levers.py open their own). It draws nothing by itself: a command that never opens a task (``show``,
  ``list``) never starts the display.
- Inside it, ``task(label, unit, total)`` is a context manager yielding a callback ``cb(done, total)`` that the
  library's ``progress=`` parameters accept (sim.run, runtime.run, store.pack/verify, traces.stats, sweep).
  ``status(label, total)`` yields ``cb(message, total=None)`` for work that reports stages rather than counts
  (calibrate, bench); each call is one stage done, and a ``total`` given by the caller sets the stage count so
  the bar shows a real total and time left.
- The display starts with the first open task and stops, erasing its last frame, when the last open task closes:
  whatever the command prints after its work (a table, a summary) never lands on or under a stale bar.
- Bars draw on stderr only, only when stderr is a terminal and the session is not quiet (``--quiet``, or
  MOETIER_QUIET=1). stdout and stderr are never captured or redirected: output that goes to a file or a pipe
  stays byte-for-byte what the verb prints without a terminal.
- Outside a session, ``task`` and ``status`` yield no-op callbacks, so library code can always call them.
"""
from __future__ import annotations

import contextlib
import os
import sys
import time

# "on": a drawing session is open; "progress": the live display while at least one task is open
_state = {"on": False, "progress": None, "open": 0, "quiet": False}


def _noop(*_a, **_k) -> None:
    return None


def enabled() -> bool:
    """Whether bars draw: a session is open, it is not quiet, and stderr is a terminal."""
    return _state["on"]


@contextlib.contextmanager
def session(quiet: bool = False):
    """Mark one command's span; bars draw inside it only when not quiet and stderr is a terminal."""
    quiet = quiet or os.environ.get("MOETIER_QUIET", "") not in ("", "0")
    prev = dict(_state)
    _state["quiet"] = quiet
    if not prev["on"]:
        _state["on"] = not quiet and sys.stderr.isatty()
    try:
        yield
    finally:
        if _state["progress"] is not None and prev["progress"] is None:
            _state["progress"].stop()
        _state.update(prev)


def _display():
    """The live display, started on the first open task (stderr only; stdout and stderr left as they are)."""
    if _state["progress"] is None:
        from rich.console import Console
        from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TaskProgressColumn, TextColumn,
                                   TimeElapsedColumn, TimeRemainingColumn)
        from rich.text import Text

        class Count(MofNCompleteColumn):
            """done/total, blank until the total is known (never "N/?")."""

            def render(self, task):
                return Text("") if task.total is None else super().render(task)
        p = Progress(TextColumn("[bold]{task.description}"), BarColumn(), Count(),
                     TextColumn("{task.fields[unit]}"), TaskProgressColumn(),
                     TextColumn("[cyan]{task.fields[rate]}"),
                     TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn(),
                     console=Console(file=sys.stderr), transient=True, refresh_per_second=8,
                     # rich's defaults replace sys.stdout/sys.stderr while live and send both to the terminal:
                     # a redirected stdout would stay empty
                     redirect_stdout=False, redirect_stderr=False)
        p.start()
        _state["progress"] = p
    _state["open"] += 1
    return _state["progress"]


def _release() -> None:
    _state["open"] -= 1
    if _state["open"] == 0 and _state["progress"] is not None:
        _state["progress"].stop()                # transient: the last frame is erased
        _state["progress"] = None


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
        self.p.remove_task(self.id)


@contextlib.contextmanager
def task(label: str, unit: str = "steps", total=None):
    """A bar for counted work; yields ``cb(done, total)`` (a no-op outside a drawing session)."""
    if not _state["on"]:
        yield _noop
        return
    t = _Task(_display(), label, unit, total)
    try:
        yield t
    finally:
        t.finish()
        _release()


@contextlib.contextmanager
def status(label: str, total=None):
    """A bar for staged work; yields ``cb(message, total=None)``: each call completes one stage and shows the
    message; a ``total`` sets the number of stages."""
    if not _state["on"]:
        yield _noop
        return
    p = _display()
    t = _Task(p, label, "stages", total)
    n = [0]

    def cb(message: str = "", total=None) -> None:
        n[0] += 1
        p.update(t.id, description=f"{label}: {message}" if message else label)
        t(n[0] - 1, total)
    try:
        yield cb
    finally:
        t.finish()
        _release()
