"""Nothing outlives a killed sweep: SIGKILL `moetier sweep` while its pool works, and every process it started (pool
workers, the multiprocessing resource tracker; a local Ray instance's processes where Ray is installed) is gone
within a short grace period."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from tests._terminal import env

GRACE_S = 5.0


def _descendants(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def _alive(procs) -> list[str]:
    out = []
    for p in procs:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                out.append(f"{p.pid} {' '.join(p.cmdline())[:120]}")
        except psutil.NoSuchProcess:
            pass
    return out


def _kill_mid_sweep(tmp_path, extra: list, want: int) -> list[psutil.Process]:
    """Start a sweep long enough to be mid-grid, wait for ``want`` processes under it, SIGKILL it; its processes."""
    argv = [sys.executable, "-m", "moetier", "sweep", "tiny-ci-cpu", "--grid",
            "budget.ram_gb=0.01,0.011,0.012,0.013,0.014,0.015,0.016,0.017", "--conc", "1", "2", "4",
            "--out", str(tmp_path / "sweep.jsonl"), "--quiet", *extra]
    proc = subprocess.Popen(argv, env=env(), cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        kids: list = []
        while time.monotonic() < deadline and proc.poll() is None:
            kids = _descendants(proc.pid)
            if len(kids) >= want and (tmp_path / "sweep.jsonl").exists():
                break
            time.sleep(0.2)
        assert proc.poll() is None, f"the sweep ended before it could be killed: {proc.stderr.read()[-2000:]}"
        assert len(kids) >= want, f"expected {want} processes under the sweep, saw {len(kids)}"
        kids = _descendants(proc.pid)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        return kids
    except BaseException:
        for p in _descendants(proc.pid) + [psutil.Process(proc.pid)] if proc.poll() is None else []:
            p.kill()
        raise


def _gone_within_grace(kids) -> list[str]:
    deadline = time.monotonic() + GRACE_S
    while time.monotonic() < deadline and _alive(kids):
        time.sleep(0.2)
    left = _alive(kids)
    for p in kids:                      # never leave them behind, even when the test fails
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    return left


def test_sigkilled_sweep_leaves_no_pool_worker_or_resource_tracker(tmp_path):
    kids = _kill_mid_sweep(tmp_path, ["--workers", "2"], want=3)      # two workers and the resource tracker
    assert any("resource_tracker" in " ".join(p.cmdline()) for p in kids if p.is_running()), \
        "no resource tracker under the sweep: the test would not see it survive"
    left = _gone_within_grace(kids)
    assert not left, f"still running {GRACE_S} s after the sweep was SIGKILLed: {left}"


def test_sigkilled_ray_sweep_leaves_nothing(tmp_path):
    pytest.importorskip("ray", reason="Ray is optional (pip install 'moetier[ray]'); its fate sharing is not "
                                      "checked without it")
    kids = _kill_mid_sweep(tmp_path, ["--ray", "local", "--workers", "2"], want=2)
    left = _gone_within_grace(kids)
    assert not left, f"still running {GRACE_S} s after the sweep was SIGKILLed: {left}"
