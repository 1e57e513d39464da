"""Worker processes that never outlive the process that started them.

Contract: ``die_with_parent(parent_pid)`` runs first in a worker (a ProcessPoolExecutor ``initializer``). On Linux it
asks the kernel to SIGKILL the worker when its parent dies (prctl PR_SET_PDEATHSIG); everywhere it also watches the
parent's pid from a daemon thread and exits the worker once the worker has been re-parented. A worker whose parent
is already gone when it starts exits at once. The multiprocessing resource tracker needs nothing of its own: it
exits when the last process holding its pipe (the parent and these workers) is gone.
"""
from __future__ import annotations

import os
import signal
import sys
import threading
import time

PR_SET_PDEATHSIG = 1
WATCH_S = 0.5


def _pdeathsig() -> None:
    if not sys.platform.startswith("linux"):
        return
    import ctypes
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):       # no prctl: the watch below still ends the worker
        pass


def _watch(parent_pid: int) -> None:
    while True:
        if os.getppid() != parent_pid:
            os._exit(1)
        time.sleep(WATCH_S)


def die_with_parent(parent_pid: int) -> None:
    """Tie this process's life to ``parent_pid``'s (module docstring)."""
    _pdeathsig()
    if os.getppid() != parent_pid:          # the parent died before the kernel was told
        os._exit(1)
    threading.Thread(target=_watch, args=(parent_pid,), name="moetier-lifeline", daemon=True).start()
