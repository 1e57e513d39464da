"""The probe's host sampler: JSON lines of host load while a run (or any command) goes on.

Contract
--------
``Sampler(path, interval=0.1, disks=None, cpus=None, pid=None)`` samples the host on an absolute schedule in a
background thread and writes JSON lines to ``path``:

* first a header ``{"kind": "header", "version", "interval_s", "cpus", "disks", "started", "host", "pid", "gpu"}``
  (``gpu`` is the NVML device info, or ``null`` with ``gpu_note`` saying why);
* every interval ``{"kind": "sample", "t", "dt", "cpu": [busy fraction per sampled cpu], "mem_used", "rss",
  "disk": {dev: [read_bytes, write_bytes]}, "gpu": {...}}`` (deltas over ``dt``; ``gpu`` only with NVML);
* ``counters(d)`` appends the runtime's per-step counter line as given (``kind: "counters"``), thread-safe;
* ``mark(phase)`` appends ``{"kind": "mark", "phase", "t"}``: the phase window runs to the next mark.

Each line is appended whole (moetier.linelog): a killed run or a full disk never leaves a torn last line, and a
failed write makes ``stop()`` raise a one-line UserError after keeping the lines before it.
``record(out, command, interval=, duration=)`` samples while ``command`` runs and returns its exit status.
The format is read back by moetier.measure.probe_file; docs/utilization.md is the field reference.
"""
from __future__ import annotations

import json
import math
import os
import platform
import threading
import time
from pathlib import Path

from moetier.errors import UserError

VERSION = 1


def _default_disks(counters: dict) -> list[str]:
    """Whole block devices worth watching: md arrays if any (their members would double count), else disks
    that are not loop/ram/zram devices nor partitions of another listed device."""
    names = sorted(counters)
    md = [n for n in names if n.startswith("md")]
    if md:
        return md
    keep = [n for n in names if not n.startswith(("loop", "ram", "zram", "sr", "fd", "dm-"))]
    out = []
    for n in keep:
        parent = next((p for p in keep if p != n and n.startswith(p) and
                       (n[len(p):].isdigit() or (n[len(p):].startswith("p") and n[len(p) + 1:].isdigit()))), None)
        if parent is None:
            out.append(n)
    return out


class _Nvml:
    """NVML through pynvml (nvidia-ml-py) when importable; every call guarded."""

    def __init__(self, index: int = 0):
        self.ok, self.note, self.info, self.h, self.nv = False, None, None, None, None
        try:
            import pynvml as nv  # type: ignore
        except Exception:
            self.note = "NVML not available (pynvml / nvidia-ml-py not importable)"
            return
        try:
            nv.nvmlInit()
            self.h = nv.nvmlDeviceGetHandleByIndex(index)
            name = nv.nvmlDeviceGetName(self.h)
            mem = nv.nvmlDeviceGetMemoryInfo(self.h)
            self.nv, self.ok = nv, True
            self.info = {"index": index, "name": name.decode() if isinstance(name, bytes) else str(name),
                         "vram_total": int(mem.total)}
        except Exception as e:  # no driver, no device
            self.note = f"NVML not available ({type(e).__name__}: {e})"

    def sample(self) -> dict:
        nv, h, g = self.nv, self.h, {}
        for key, fn in (("util", lambda: nv.nvmlDeviceGetUtilizationRates(h)),
                        ("vram_used", lambda: nv.nvmlDeviceGetMemoryInfo(h).used),
                        ("power_mw", lambda: nv.nvmlDeviceGetPowerUsage(h)),
                        ("pcie_tx_kbs", lambda: nv.nvmlDeviceGetPcieThroughput(h, nv.NVML_PCIE_UTIL_TX_BYTES)),
                        ("pcie_rx_kbs", lambda: nv.nvmlDeviceGetPcieThroughput(h, nv.NVML_PCIE_UTIL_RX_BYTES))):
            try:
                v = fn()
            except Exception:
                continue
            if key == "util":
                g["util"], g["mem_busy"] = int(v.gpu), int(v.memory)
            else:
                g[key] = int(v)
        return g

    def close(self) -> None:
        if self.ok:
            try:
                self.nv.nvmlShutdown()
            except Exception:
                pass


class Sampler:
    """Host sampler writing JSON lines (see the module docstring). ``start()``, ``mark()``, ``counters()``,
    ``stop()``; ``stop()`` is idempotent and also runs when used as a context manager."""

    def __init__(self, path, interval: float = 0.1, disks=None, cpus=None, pid: int | None = None, gpu_index: int = 0):
        import psutil
        if not (interval > 0 and math.isfinite(interval)):
            raise UserError(f"probe: interval must be a positive number of seconds, got {interval!r}")
        self._ps = psutil
        self.path = Path(path)
        self.interval = float(interval)
        ncpu = psutil.cpu_count() or 1
        self.cpus = list(range(ncpu)) if cpus is None else [int(c) for c in cpus]
        bad = [c for c in self.cpus if not 0 <= c < ncpu]
        if bad:
            raise UserError(f"probe: cpus {bad} not on this machine (0..{ncpu - 1})")
        dio = psutil.disk_io_counters(perdisk=True) or {}
        self.disks = _default_disks(dio) if disks is None else list(disks)
        self.pid = os.getpid() if pid is None else int(pid)
        self._proc = None
        self._gpu_index = gpu_index
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = None
        self._f = None
        self.failed = None
        self._closed = False
        # the probe's own cost, for the overhead check: sampler thread CPU time, and time spent in the step hook on
        # the decode thread
        self.sampler_cpu_s = 0.0
        self.hook_s = 0.0

    # -- output ---------------------------------------------------------------------------------------------------
    def _write(self, obj: dict) -> None:
        line = json.dumps(obj, separators=(",", ":"), allow_nan=False)
        with self._lock:
            if self._f is None:
                return
            try:
                self._f.append(line)
            except UserError as e:          # a full disk: the lines so far stay whole; stop() says why
                self.failed = str(e)
                self._f.close()
                self._f = None

    def mark(self, phase: str) -> None:
        self._write({"kind": "mark", "phase": str(phase), "t": time.time()})

    def counters(self, d: dict) -> None:
        """The runtime's step hook: one counters line per step (non-finite numbers written as null)."""
        t0 = time.perf_counter()
        rec = {k: (v if not isinstance(v, float) or math.isfinite(v) else None) for k, v in d.items()}
        rec["kind"] = "counters"
        rec.setdefault("t", time.time())
        self._write(rec)
        self.hook_s += time.perf_counter() - t0

    # -- lifecycle ------------------------------------------------------------------------------------------------
    def start(self) -> "Sampler":
        if self._thread is not None:
            return self
        ps = self._ps
        self.path.parent.mkdir(parents=True, exist_ok=True)
        from moetier.linelog import LineLog
        self._f = LineLog(self.path, f"probe file {self.path}")
        try:
            self._proc = ps.Process(self.pid)
        except ps.Error:
            self._proc = None
        self._nvml = _Nvml(self._gpu_index)
        hdr = {"kind": "header", "version": VERSION, "interval_s": self.interval, "cpus": self.cpus,
               "disks": self.disks, "started": time.time(), "host": platform.node(), "pid": self.pid,
               "gpu": self._nvml.info}
        if not self._nvml.ok:
            hdr["gpu_note"] = self._nvml.note
        self._write(hdr)
        self._base = self._read_raw()
        self._t_last = time.time()
        self._thread = threading.Thread(target=self._loop, name="moetier-probe", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=max(2.0, 5 * self.interval))
        with self._lock:
            if self._f is not None:
                self._f.close()
                self._f = None
        if getattr(self, "_nvml", None) is not None:
            self._nvml.close()
        if self.failed:
            raise UserError(self.failed)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    # -- sampling -------------------------------------------------------------------------------------------------
    def _read_raw(self):
        ps = self._ps
        ct = ps.cpu_times(percpu=True)
        cpu = []
        for c in self.cpus:
            x = ct[c] if c < len(ct) else None
            if x is None:
                cpu.append((0.0, 0.0))
                continue
            tot = x.user + x.nice + x.system + x.idle + x.iowait + x.irq + x.softirq + x.steal
            cpu.append((tot, x.idle + x.iowait))
        dio = ps.disk_io_counters(perdisk=True) or {}
        disk = {d: (dio[d].read_bytes, dio[d].write_bytes) for d in self.disks if d in dio}
        return cpu, disk

    def _sample(self) -> None:
        ps = self._ps
        now = time.time()
        cpu1, disk1 = self._read_raw()
        cpu0, disk0 = self._base
        busy = []
        for (t1, i1), (t0, i0) in zip(cpu1, cpu0):
            dt_ = t1 - t0
            busy.append(round(min(1.0, max(0.0, 1.0 - (i1 - i0) / dt_)), 4) if dt_ > 0 else 0.0)
        disk = {d: [v[0] - disk0[d][0], v[1] - disk0[d][1]] for d, v in disk1.items() if d in disk0}
        vm = ps.virtual_memory()
        rss = None
        if self._proc is not None:
            try:
                rss = self._proc.memory_info().rss
            except ps.Error:
                self._proc = None
        s = {"kind": "sample", "t": now, "dt": round(now - self._t_last, 6), "cpu": busy,
             "mem_used": int(vm.total - vm.available), "rss": rss, "disk": disk}
        if self._nvml.ok:
            s["gpu"] = self._nvml.sample()
        self._base, self._t_last = (cpu1, disk1), now
        self._write(s)

    def _loop(self) -> None:
        t0 = time.monotonic()
        k = 1
        while True:
            wait = t0 + k * self.interval - time.monotonic()
            if wait > 0 and self._stop.wait(wait):
                break
            if self._stop.is_set():
                break
            try:
                c0 = time.thread_time()
                self._sample()
                self.sampler_cpu_s += time.thread_time() - c0
            except Exception as e:  # never take the host process down; say why once and stop sampling
                self._write({"kind": "error", "t": time.time(), "error": f"{type(e).__name__}: {e}"})
                break
            # absolute schedule: the next tick after now (late ticks are skipped, the gap shows in dt)
            k = max(k + 1, int((time.monotonic() - t0) / self.interval) + 1)


def record(out, command=None, *, interval: float = 0.1, duration: float = 0.0) -> int:
    """Sample while ``command`` (a list) runs; returns its exit code. Without a command: sample for ``duration``
    seconds (or until interrupted). With both: sampling stops at ``duration``; the command is still waited for."""
    import subprocess
    proc = None
    if command:
        try:
            proc = subprocess.Popen(command)
        except OSError as e:
            raise UserError(f"probe record: cannot run {command[0]!r}: {e.strerror or e}") from None
    elif not duration:
        raise UserError("probe record: give a command after -- or a --duration")
    s = Sampler(out, interval=interval, pid=proc.pid if proc is not None else None)
    s.start()
    s.mark("all")
    t_end = time.monotonic() + duration if duration else None
    try:
        while True:
            if proc is not None and proc.poll() is not None:
                break
            if t_end is not None and time.monotonic() >= t_end:
                break
            time.sleep(min(0.05, interval))
    except KeyboardInterrupt:
        if proc is not None:
            proc.terminate()
    finally:
        s.stop()
    return proc.wait() if proc is not None else 0
