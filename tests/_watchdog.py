"""A bound on every test that waits on I/O: ``watchdog(seconds)`` is a fixture factory whose fixture fails the test
when it runs longer than ``seconds`` instead of letting a stuck wait hang the suite.

It raises in the main thread from SIGALRM (POSIX), so a test blocked in a wait - a lock, a condition, a future -
fails with a traceback that shows where it waited, and the next test runs. Where SIGALRM is missing, or the test
does not run in the main thread, faulthandler dumps every thread's stack and ends the process instead: still
bounded, never silent. pytest-timeout would do the same; this keeps the test extra to pytest and hypothesis.
"""
from __future__ import annotations

import faulthandler
import signal
import sys
import threading

import pytest


class WatchdogFired(Exception):
    """The watchdog fired: the test ran past its bound."""


def watchdog(seconds: float):
    @pytest.fixture(autouse=True)
    def _bounded(request):
        if hasattr(signal, "SIGALRM") and threading.current_thread() is threading.main_thread():
            def fire(signum, frame):
                faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
                raise WatchdogFired(f"{request.node.nodeid} ran past its {seconds:g} s bound")
            old = signal.signal(signal.SIGALRM, fire)
            signal.setitimer(signal.ITIMER_REAL, seconds)
            try:
                yield
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
                signal.signal(signal.SIGALRM, old)
        else:
            faulthandler.dump_traceback_later(seconds, exit=True)
            try:
                yield
            finally:
                faulthandler.cancel_dump_traceback_later()
    return _bounded
