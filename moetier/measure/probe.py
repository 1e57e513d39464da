"""The probe: a host sampler (record) and its report (utilization + chokepoints for a run record).

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

``report(probe_path, hardware, *, run_record)`` reads such a file (tolerating gaps, a truncated last line, bad
lines, missing counters, a hardware record without ceilings and unknown record versions) and returns
``{"utilization": ..., "chokepoints": ...}``; what could not be computed is listed, with the reason, under
``missing``. Every number in the result is finite (``json.dumps(..., allow_nan=False)`` holds). Field reference and
formulas: docs/utilization.md.
"""
from __future__ import annotations

import bisect
import json
import math
import os
import platform
import threading
import time
from pathlib import Path

import numpy as np

from moetier.errors import UserError

VERSION = 1
IDLE_FRAC_OF_CEILING = 0.05      # an interval below 5% of the ceiling counts as idle for that resource
GAP_FACTOR = 2.0                 # an interval longer than 2x nominal is a gap
DECODE_COVER = 0.5               # an interval is decode when runtime steps cover at least half of it
BUCKETS = ("fixed", "gpu_moe", "cpu_moe", "nvme_stall", "copy", "overhead")
CUMULATIVE = ("plan_s", "book_s", "lane_cpu_s", "lane_gpu_s", "lane_zc_s", "nvme_wait_s", "copy_s", "combine_s",
              "reads", "masked", "picks", "layer_calls")
# counters newer runtimes add; absent in older probe files, where they read as 0 without a "missing" note
LATER = ("stage_s",)
# binding.resource_nearest_ceiling ignores these: busy-% readings that spinning workers or clocks inflate
NOT_NEAREST = ("cpu_cores_busy_pct", "gpu_util_pct", "gpu_power_w")


# ---------------------------------------------------------------------------------------------------------------
# record: the sampler

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
        self._closed = False
        # the probe's own cost, for the overhead check: sampler thread CPU time, and time spent in the step hook on
        # the decode thread
        self.sampler_cpu_s = 0.0
        self.hook_s = 0.0

    # -- output ---------------------------------------------------------------------------------------------------
    def _write(self, obj: dict, flush: bool = False) -> None:
        line = json.dumps(obj, separators=(",", ":"), allow_nan=False) + "\n"
        with self._lock:
            if self._f is None:
                return
            self._f.write(line)
            if flush:
                self._f.flush()

    def mark(self, phase: str) -> None:
        self._write({"kind": "mark", "phase": str(phase), "t": time.time()}, flush=True)

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
        self._f = open(self.path, "a", encoding="utf-8")
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
        self._write(hdr, flush=True)
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
                self._f.flush()
                self._f.close()
                self._f = None
        if getattr(self, "_nvml", None) is not None:
            self._nvml.close()

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
        self._write(s, flush=True)

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
                self._write({"kind": "error", "t": time.time(), "error": f"{type(e).__name__}: {e}"}, flush=True)
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


# ---------------------------------------------------------------------------------------------------------------
# report: reading

def _finite(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _num(x, default=None):
    return float(x) if _finite(x) else default


def _reject_constant(name):
    raise ValueError(f"non-finite number {name}")


MAX_VALUE = 1e18        # no counter, byte count or time a probe writes comes near this (1 EB; 3e10 years)
MAX_T = 1e11            # a Unix time in seconds before the year 5138


def _plausible(d: dict) -> bool:
    """Every number in a probe line is finite and within MAX_VALUE, its time within [0, MAX_T]: a line that is
    not (a corrupted or hand-made file, 1e308 values) is a bad line, not arithmetic that overflows."""
    t = d.get("t")
    if t is not None and not (_finite(t) and 0 <= t <= MAX_T):
        return False
    stack = [d]
    while stack:
        v = stack.pop()
        if isinstance(v, dict):
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)
        elif isinstance(v, (int, float)) and not isinstance(v, bool) and not (_finite(v) and abs(v) <= MAX_VALUE):
            return False
    return True


def read_probe(path) -> dict:
    """Parse a probe file: {header, samples, counters, marks, bad_lines, truncated_last_line, errors}."""
    p = Path(path)
    try:
        raw = p.read_bytes()
    except OSError as e:
        raise UserError(f"{path}: cannot read probe file: {e.strerror or e}") from None
    text = raw.decode("utf-8", errors="replace")
    lines = text.split("\n")
    truncated = bool(lines) and lines[-1].strip() != ""     # no final newline: the writer died mid-line
    out = {"header": None, "samples": [], "counters": [], "marks": [], "bad_lines": 0, "truncated_last_line": False,
           "errors": [], "lines": 0}
    for i, ln in enumerate(lines):
        if not ln.strip():
            continue
        out["lines"] += 1
        try:
            d = json.loads(ln, parse_constant=_reject_constant)
        except (ValueError, RecursionError):
            if i == len(lines) - 1 and truncated:
                out["truncated_last_line"] = True
            else:
                out["bad_lines"] += 1
            continue
        if not isinstance(d, dict) or not _plausible(d):
            out["bad_lines"] += 1
            continue
        kind = d.get("kind")
        if kind == "header" and out["header"] is None:
            out["header"] = d
        elif kind == "sample":
            if _finite(d.get("t")):
                out["samples"].append(d)
            else:
                out["bad_lines"] += 1
        elif kind == "counters":
            if _finite(d.get("t")):
                out["counters"].append(d)
            else:
                out["bad_lines"] += 1
        elif kind == "mark":
            if _finite(d.get("t")) and isinstance(d.get("phase"), str):
                out["marks"].append(d)
            else:
                out["bad_lines"] += 1
        elif kind == "error":
            out["errors"].append(str(d.get("error")))
        elif kind == "header":
            pass                                            # a second header: an appended recording
        else:
            out["bad_lines"] += 1
    out["samples"].sort(key=lambda s: s["t"])
    out["counters"].sort(key=lambda c: c["t"])
    out["marks"].sort(key=lambda m: m["t"])
    return out


# ---------------------------------------------------------------------------------------------------------------
# report: statistics

def _quantile(xs: list[float], q: float) -> float:
    """Linear-interpolated quantile of a non-empty sorted list."""
    if len(xs) == 1:
        return xs[0]
    pos = q * (len(xs) - 1)
    lo = int(math.floor(pos))
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def _r(x, nd=4):
    return round(float(x), nd) if _finite(x) else None


def stats(values: list[float], ceiling: float | None) -> dict | None:
    vals = sorted(v for v in values if _finite(v))
    if not vals:
        return None
    mean = sum(vals) / len(vals)
    out = {"n": len(vals), "mean": _r(mean), "p50": _r(_quantile(vals, 0.5)), "p90": _r(_quantile(vals, 0.9)),
           "ceiling": _r(ceiling) if ceiling else None}
    if ceiling and ceiling > 0:
        out["pct_of_ceiling"] = {k: _r(100.0 * out[k] / ceiling, 2) for k in ("mean", "p50", "p90")}
        out["idle_frac"] = _r(sum(1 for v in vals if v < IDLE_FRAC_OF_CEILING * ceiling) / len(vals))
    return out


class _Cum:
    """Cumulative runtime counters as piecewise-linear functions of wall time, one segment per runtime instance
    (the counters restart at every ``runtime.run``): flat between steps, linear within a step."""

    def __init__(self, counters: list[dict]):
        self._cache: dict = {}
        self.segments: list[list[dict]] = []
        prev = None
        for c in counters:
            if prev is None or self._restarted(prev, c):
                self.segments.append([])
            self.segments[-1].append(c)
            prev = c

    @staticmethod
    def _restarted(a: dict, b: dict) -> bool:
        sa, sb = a.get("step"), b.get("step")
        if _finite(sa) and _finite(sb) and sb <= sa:
            return True
        if a.get("conc") != b.get("conc"):
            return True
        return any(_finite(a.get(k)) and _finite(b.get(k)) and b[k] < a[k] for k in CUMULATIVE)

    def value(self, key: str, t: float) -> float:
        tot = 0.0
        for xs, ys in self._curves(key):
            tot += float(np.interp(t, xs, ys))
        return tot

    def _curves(self, key: str):
        """Per segment the breakpoints (step start, previous value), (step end, value), relative to the segment's
        first line (its pre-step value is unknown, so its own step is not counted)."""
        got = self._cache.get(key)
        if got is not None:
            return got
        got = []
        for seg in self.segments:
            base = _num(seg[0].get(key), 0.0)
            xs, ys = [seg[0]["t"]], [0.0]
            prev_v = 0.0
            for c in seg[1:]:
                v = _num(c.get(key), base + prev_v) - base
                start = c["t"] - max(_num(c.get("step_wall_s"), 0.0), 0.0)
                if start > xs[-1]:
                    xs.append(start)
                    ys.append(prev_v)
                if c["t"] > xs[-1]:
                    xs.append(c["t"])
                    ys.append(v)
                else:
                    ys[-1] = v
                prev_v = v
            got.append((np.asarray(xs), np.asarray(ys)))
        self._cache[key] = got
        return got


def _step_spans(counters: list[dict]) -> list[tuple[float, float]]:
    spans = []
    for c in counters:
        w = _num(c.get("step_wall_s"), 0.0)
        if w > 0:
            spans.append((c["t"] - w, c["t"]))
    spans.sort()
    merged: list[list[float]] = []
    for a, b in spans:
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    return [(a, b) for a, b in merged]


def _covered(spans, starts, a: float, b: float) -> float:
    tot = 0.0
    i = max(0, bisect.bisect_right(starts, a) - 1)
    while i < len(spans):
        s, e = spans[i]
        if s >= b:
            break
        if e > a:
            tot += min(b, e) - max(a, s)
        i += 1
    return tot


def _phases(marks: list[dict], t_lo: float, t_hi: float) -> list[tuple[str, float, float]]:
    if not marks:
        return [("all", t_lo, t_hi)]
    out, seen = [], {}
    for i, m in enumerate(marks):
        end = marks[i + 1]["t"] if i + 1 < len(marks) else max(t_hi, m["t"])
        name = m["phase"]
        if name in seen:                  # the same phase marked twice: keep both windows apart
            seen[name] += 1
            name = f"{name}#{seen[name]}"
        else:
            seen[name] = 1
        out.append((name, m["t"], end))
    return out


def _ceilings(hardware) -> tuple[dict, list[str]]:
    missing = []
    if hardware is None:
        return {}, ["hardware: no hardware record given or found: no ceilings, pct_of_ceiling omitted"]
    if not isinstance(hardware, dict):
        return {}, ["hardware: not a JSON object: no ceilings, pct_of_ceiling omitted"]
    c = hardware.get("ceilings")
    if not isinstance(c, dict):
        return {}, [f"hardware {hardware.get('id', '?')}: no ceilings section: pct_of_ceiling omitted"]
    good = {k: float(v) for k, v in c.items() if _finite(v) and v > 0}
    if not good:
        missing.append(f"hardware {hardware.get('id', '?')}: ceilings hold no positive numbers: "
                       "pct_of_ceiling omitted")
    return good, missing


def _resource_ceiling(name: str, ceil: dict) -> tuple[float | None, str | None]:
    """(ceiling, hardware key it came from); % resources have the fixed ceiling 100."""
    if name.endswith("_pct"):
        return 100.0, None
    keys = {"nvme_read_gbps": ("nvme_read_gbps", "nvme_measured_gbps"),
            "cpu_lane_weight_gbps": ("ddr_practical_gbps",), "ddr_derived_gbps": ("ddr_practical_gbps",),
            "pcie_h2d_gbps": ("pcie_nvml_sat_gbps", "pcie_h2d_gbps"),
            "pcie_d2h_gbps": ("pcie_nvml_sat_gbps", "pcie_d2h_gbps"),
            "gpu_power_w": ("gpu_power_w",)}.get(name)
    if keys is None:
        return None, None                 # no ceiling by design (ram_gib, rss_gib, vram_gib)
    for k in keys:
        if k in ceil:
            return ceil[k], k
    return None, keys[0]


# ---------------------------------------------------------------------------------------------------------------
# report: utilization

def _nvme_disks(samples: list[dict]) -> list[str]:
    names = set()
    for s in samples:
        if isinstance(s.get("disk"), dict):
            names.update(s["disk"])
    md = sorted(n for n in names if n.startswith("md"))
    return md or sorted(names)


def _intervals(P: dict) -> list[dict]:
    """One interval per sample: [t - dt, t] with its resource values."""
    out = []
    cum = _Cum(P["counters"]) if P["counters"] else None
    spans = _step_spans(P["counters"])
    starts = [a for a, _ in spans]
    disks = _nvme_disks(P["samples"])
    for s in P["samples"]:
        dt = _num(s.get("dt"))
        if dt is None or dt <= 0:
            continue
        t1 = s["t"]
        t0 = t1 - dt
        v: dict = {}
        cpu = s.get("cpu")
        per_core = None
        if isinstance(cpu, list) and cpu and all(_finite(x) for x in cpu):
            per_core = [min(1.0, max(0.0, float(x))) for x in cpu]
            v["cpu_cores_busy_pct"] = 100.0 * sum(per_core) / len(per_core)
        disk = s.get("disk")
        if isinstance(disk, dict) and disks:
            rb = 0.0
            ok = False
            for d in disks:
                x = disk.get(d)
                if isinstance(x, list) and x and _finite(x[0]):
                    rb += max(0.0, float(x[0]))
                    ok = True
            if ok:
                v["nvme_read_gbps"] = rb / dt / 1e9
        if _finite(s.get("mem_used")):
            v["ram_gib"] = float(s["mem_used"]) / 2 ** 30
        if _finite(s.get("rss")):
            v["rss_gib"] = float(s["rss"]) / 2 ** 30
        g = s.get("gpu")
        if isinstance(g, dict):
            for src, dst, f in (("util", "gpu_util_pct", 1.0), ("mem_busy", "vram_busy_pct", 1.0),
                                ("pcie_rx_kbs", "pcie_h2d_gbps", 1024 / 1e9),
                                ("pcie_tx_kbs", "pcie_d2h_gbps", 1024 / 1e9),
                                ("power_mw", "gpu_power_w", 1e-3), ("vram_used", "vram_gib", 1 / 2 ** 30)):
                if _finite(g.get(src)):
                    v[dst] = float(g[src]) * f
        kind = "unknown"
        if cum is not None:
            cover = _covered(spans, starts, t0, t1) / dt
            kind = "decode" if cover >= DECODE_COVER else "idle"
            lane = cum.value("lane_cpu_s", t1) - cum.value("lane_cpu_s", t0)
            v["cpu_lane_duty_pct"] = min(100.0, max(0.0, 100.0 * lane / dt))
            wb = None
            if any("cpu_bytes" in c for c in P["counters"]):
                wb = cum.value("cpu_bytes", t1) - cum.value("cpu_bytes", t0)
            if wb is not None:
                v["cpu_lane_weight_gbps"] = max(0.0, wb) / dt / 1e9
                v["ddr_derived_gbps"] = v["cpu_lane_weight_gbps"] + v.get("nvme_read_gbps", 0.0) + \
                    v.get("pcie_h2d_gbps", 0.0) + v.get("pcie_d2h_gbps", 0.0)
        out.append({"t0": t0, "t1": t1, "dt": dt, "kind": kind, "values": v, "per_core": per_core})
    return out


def _utilization_kind(ivs: list[dict], cpus: list, ceil: dict, missing: set) -> dict | None:
    if not ivs:
        return None
    names = sorted({k for iv in ivs for k in iv["values"]})
    res = {}
    for n in names:
        c, key = _resource_ceiling(n, ceil)
        if c is None and key is not None and ceil:
            missing.add(f"{n}: hardware.ceilings.{key} not given: pct_of_ceiling omitted")
        st = stats([iv["values"][n] for iv in ivs if n in iv["values"]], c)
        if st is not None:
            res[n] = st
    cores = [iv["per_core"] for iv in ivs if iv["per_core"] is not None]
    per_core = None
    if cores:
        width = min(len(x) for x in cores)
        labels = [str(c) for c in cpus[:width]] if cpus and len(cpus) >= width else [str(i) for i in range(width)]
        per_core = {labels[i]: _r(100.0 * sum(x[i] for x in cores) / len(cores), 2) for i in range(width)}
    return {"active_s": _r(sum(iv["dt"] for iv in ivs), 3), "intervals": len(ivs), "resources": res,
            "per_core_busy_pct": per_core}


# ---------------------------------------------------------------------------------------------------------------
# report: chokepoints (decode critical-path attribution from the runtime's cumulative counters)

def _steps(counters: list[dict]) -> tuple[list[dict], list[float]]:
    """Per-step deltas, and the times of the steps left out: the first line of every runtime instance (its
    counters restart) has no predecessor, so its step is the baseline, not a measured delta."""
    cum = _Cum(counters)
    out, excluded = [], []
    for seg in cum.segments:
        excluded.append(seg[0]["t"])
        for a, b in zip(seg, seg[1:]):
            d = {k: max(0.0, _num(b.get(k), 0.0) - _num(a.get(k), 0.0)) for k in CUMULATIVE + LATER}
            d["wall"] = max(0.0, _num(b.get("step_wall_s"), 0.0))
            d["tokens"] = max(0.0, _num(b.get("tokens"), 0.0))
            d["t"], d["measured"], d["conc"] = b["t"], bool(b.get("measured", True)), b.get("conc")
            out.append(d)
    return out, excluded


def _attribution(steps: list[dict], excluded: int, fields_missing: list[str], run_ms: float | None) -> dict:
    n = len(steps)
    tokens = sum(s["tokens"] for s in steps)
    wall = sum(s["wall"] for s in steps)
    tot = {k: sum(s[k] for s in steps) for k in CUMULATIVE + LATER}
    tot["copy_s"] += tot["stage_s"]          # NVMe -> VRAM pushes are copies too
    raw = {"gpu_moe": tot["lane_gpu_s"] + tot["lane_zc_s"], "cpu_moe": tot["lane_cpu_s"],
           "nvme_stall": tot["nvme_wait_s"], "copy": tot["copy_s"],
           "overhead": tot["plan_s"] + tot["book_s"] + tot["combine_s"]}
    attributed = sum(raw.values())
    overlap = max(0.0, attributed - wall)
    if overlap > 0:
        # a timer that encloses another (bookkeeping around the NVMe waits it triggers) counts twice: take the
        # excess out of overhead first, then scale the rest so the six buckets still sum to the wall
        take = min(overlap, raw["overhead"])
        raw["overhead"] -= take
        rest = overlap - take
        if rest > 0:
            s = sum(raw.values())
            f = wall / s if s > 0 else 0.0
            raw = {k: v * f for k, v in raw.items()}
    raw["fixed"] = max(0.0, wall - sum(raw.values()))
    per_tok = (lambda x: 1000.0 * x / tokens) if tokens > 0 else (lambda x: 0.0)
    ms = {k: _r(per_tok(raw[k])) for k in BUCKETS}
    wall_ms = per_tok(wall)
    share = {k: _r(raw[k] / wall) if wall > 0 else 0.0 for k in BUCKETS}
    binding = max(BUCKETS, key=lambda k: raw[k]) if wall > 0 else None
    lc = tot["layer_calls"]
    per_layer = (lambda x: _r(1000.0 * x / lc)) if lc > 0 else (lambda x: None)
    out = {
        "steps": n, "tokens": _r(tokens, 3), "tokens_per_step": _r(tokens / n, 3) if n else None,
        "layer_calls": int(lc), "wall_ms_per_token": _r(wall_ms),
        "tok_s_from_wall": _r(1000.0 / wall_ms, 3) if wall_ms > 0 else None,
        "per_token_ms": ms, "share": share, "binding": binding,
        "moe_stage_ms_per_token": _r(sum(per_tok(raw[k]) for k in ("gpu_moe", "cpu_moe", "nvme_stall", "copy"))),
        "detail_ms_per_token": {"plan": _r(per_tok(tot["plan_s"])), "bookkeeping": _r(per_tok(tot["book_s"])),
                                "combine": _r(per_tok(tot["combine_s"])), "gpu_lane": _r(per_tok(tot["lane_gpu_s"])),
                                "zerocopy_lane": _r(per_tok(tot["lane_zc_s"])),
                                "cpu_lane": _r(per_tok(tot["lane_cpu_s"])),
                                "nvme_wait": _r(per_tok(tot["nvme_wait_s"])), "copy": _r(per_tok(tot["copy_s"])),
                                "overlap_removed": _r(per_tok(overlap))},
        "per_layer_ms": {"wall": per_layer(wall), "gpu_lane": per_layer(tot["lane_gpu_s"] + tot["lane_zc_s"]),
                         "cpu_lane": per_layer(tot["lane_cpu_s"]), "copy": per_layer(tot["copy_s"]),
                         "nvme_wait": per_layer(tot["nvme_wait_s"]),
                         "overhead": per_layer(tot["plan_s"] + tot["book_s"] + tot["combine_s"])},
        "per_step": {k: _r(tot[k] / n, 3) if n else None for k in ("reads", "masked", "picks", "layer_calls")},
        "lane_last": "not measured (the runtime runs its lanes one after another and records no lane end times)",
        "slack_ms_per_layer": "not measured (needs per-lane end timestamps; the runtime's lanes do not overlap)",
        "quality": {"steps_excluded": excluded, "overlap_ms_per_token": _r(per_tok(overlap)),
                    "fields_missing": fields_missing},
    }
    if run_ms is not None:
        out["run_record_ms_per_token"] = _r(run_ms)
    return out


def _quality(P: dict, interval: float) -> dict:
    ts = [s["t"] for s in P["samples"]]
    gaps, lost = 0, 0
    hdr_t = _num((P["header"] or {}).get("started"))
    prev = hdr_t
    for s in P["samples"]:
        dt = _num(s.get("dt"), 0.0)
        step = max(dt, s["t"] - prev) if prev is not None else dt
        if step > GAP_FACTOR * interval:
            gaps += 1
            lost += max(0, int(round(step / interval)) - 1)
        prev = s["t"]
    return {"samples": len(ts), "gaps": gaps, "lost": lost, "bad_lines": P["bad_lines"],
            "truncated_last_line": P["truncated_last_line"], "sampler_errors": P["errors"]}


# ---------------------------------------------------------------------------------------------------------------
# report

def report(probe_path, hardware: dict | None = None, *, run_record: dict | None = None) -> dict:
    """{"utilization": ..., "chokepoints": ...} for a probe file (see docs/utilization.md)."""
    P = read_probe(probe_path)
    missing: set[str] = set()
    hdr = P["header"]
    if hdr is None:
        missing.add("probe header: absent (file cut at the start or not written by moetier probe): "
                    "interval taken from the samples")
    elif hdr.get("version") != VERSION:
        missing.add(f"probe header: version {hdr.get('version')!r} is not {VERSION}: fields read as version {VERSION}")
    interval = _num((hdr or {}).get("interval_s"))
    if interval is None or interval <= 0:
        dts = sorted(_num(s.get("dt"), 0.0) for s in P["samples"] if _num(s.get("dt"), 0.0) > 0)
        interval = _quantile(dts, 0.5) if dts else 0.1
    if hdr is not None and hdr.get("gpu") is None:
        missing.add(f"gpu: {hdr.get('gpu_note') or 'no GPU sampled'}")
    ceil, m = _ceilings(hardware)
    missing.update(m)
    run_missing = []
    if run_record is not None:
        if not isinstance(run_record, dict):
            run_missing.append("run record: not a JSON object: ignored")
            run_record = None
        else:
            for f in ("measured_runs", "recipe"):
                if f not in run_record:
                    run_missing.append(f"run record: no {f!r} (older or other schema): not cross-checked")
    missing.update(run_missing)
    if not P["samples"]:
        missing.add("samples: none in the probe file: utilization empty")
    if not P["counters"]:
        missing.add("counters: none in the probe file (sampled without `moetier run --probe`): decode "
                    "classification and chokepoints not available")
    if not any("cpu_bytes" in c for c in P["counters"]):
        missing.add("cpu_lane_weight_gbps, ddr_derived_gbps: the runtime's counters carry no cpu_bytes")
    times = [s["t"] for s in P["samples"]] + [c["t"] for c in P["counters"]] + [m_["t"] for m_ in P["marks"]]
    t_lo, t_hi = (min(times), max(times)) if times else (0.0, 0.0)
    phases = _phases(P["marks"], t_lo - 1e-9, t_hi + 1e-9)
    ivs = _intervals(P)
    cpus = (hdr or {}).get("cpus") if isinstance((hdr or {}).get("cpus"), list) else []

    steps, excluded_t = _steps(P["counters"]) if P["counters"] else ([], [])
    fields_missing = sorted({k for c in P["counters"] for k in CUMULATIVE + ("step_wall_s", "tokens")
                             if not _finite(c.get(k))})
    if fields_missing:
        missing.add(f"counters: fields {', '.join(fields_missing)} absent or not numbers: taken as 0")
    run_ms = {}
    if run_record is not None:
        for r in run_record.get("measured_runs") or []:
            if isinstance(r, dict) and _finite(r.get("ms_per_token")) and r.get("conc") is not None:
                run_ms[r["conc"]] = float(r["ms_per_token"])

    U, C = {}, {}
    for name, a, b in phases:
        mine = [iv for iv in ivs if a <= 0.5 * (iv["t0"] + iv["t1"]) < b]
        tot_dt = sum(iv["dt"] for iv in mine)
        split = {k: _r(sum(iv["dt"] for iv in mine if iv["kind"] == k) / tot_dt) if tot_dt > 0 else 0.0
                 for k in ("decode", "prefill", "mixed", "idle", "unknown")}
        dec = [iv for iv in mine if iv["kind"] == "decode"]
        ph = {"window_s": _r(max(0.0, b - a), 3), "decode": _utilization_kind(dec, cpus, ceil, missing),
              "prefill": None, "time_split": split}
        if not dec:
            ph["all"] = _utilization_kind(mine, cpus, ceil, missing)
        U[name] = ph
        # chokepoints
        st = [s for s in steps if a < s["t"] <= b]
        meas = [s for s in st if s["measured"]]
        note = None
        if st and not meas:
            note = "no measured steps in this phase: warm-up steps attributed"
        use = meas or st
        if not P["counters"]:
            cp = {"decode": None, "reason": "no counters lines in the probe file", "prefill": None, "binding": None}
        elif not use:
            cp = {"decode": None, "reason": "no runtime steps in this phase window", "prefill": None,
                  "binding": None}
        else:
            concs = {s["conc"] for s in use}
            rms = run_ms.get(next(iter(concs))) if len(concs) == 1 else None
            excluded = sum(1 for t in excluded_t if a < t <= b)
            att = _attribution(use, excluded, fields_missing, rms)
            if note:
                att["quality"]["note"] = note
            near = None
            dres = (ph["decode"] or {}).get("resources", {})
            cands = [(v["pct_of_ceiling"]["mean"], k) for k, v in dres.items()
                     if k not in NOT_NEAREST and "pct_of_ceiling" in v and _finite(v["pct_of_ceiling"]["mean"])]
            if cands:
                pct, res = max(cands)
                near = {"resource": res, "pct_mean": pct}
            cp = {"decode": att, "prefill": None, "binding": {
                "critical_path": att["binding"], "critical_share": att["share"].get(att["binding"]) if att["binding"]
                else None, "lane_last": "not measured",
                "resource_nearest_ceiling": near if near is not None else
                "not measured (no decode resource with a ceiling)"}}
        C[name] = cp
    q = _quality(P, interval)
    miss = sorted(missing)
    util = {"method": {"source": "moetier probe: psutil host sampler + the runtime's per-step counters",
                       "interval_s": _r(interval, 4),
                       "classification": f"an interval is decode when runtime steps cover >= {DECODE_COVER:.0%} "
                                         "of it, else idle; unknown without counters; prefill/mixed not produced",
                       "stats": "per interval, unweighted; linear-interpolated p50/p90; idle_frac = share of "
                                f"intervals below {IDLE_FRAC_OF_CEILING:.0%} of the ceiling",
                       "doc": "docs/utilization.md"},
            "phases": U, "quality": q, "missing": miss}
    choke = {"phases": C, "quality": q, "missing": [m_ for m_ in miss if m_.startswith(("counters", "run record"))]}
    if not P["counters"]:
        choke = None
        util["chokepoints_reason"] = "no counters lines in the probe file"
    return {"utilization": util, "chokepoints": choke}


# ---------------------------------------------------------------------------------------------------------------
# markdown

def _fmt(x, nd=2):
    return "-" if not _finite(x) else f"{x:.{nd}f}"


ROWS = (("cpu_cores_busy_pct", "CPU cores busy %"), ("cpu_lane_duty_pct", "CPU-lane duty %"),
        ("cpu_lane_weight_gbps", "CPU-lane weights GB/s"), ("ddr_derived_gbps", "DDR derived GB/s"),
        ("nvme_read_gbps", "NVMe read GB/s"), ("gpu_util_pct", "GPU util %"), ("vram_busy_pct", "VRAM busy %"),
        ("pcie_h2d_gbps", "PCIe H2D GB/s"), ("pcie_d2h_gbps", "PCIe D2H GB/s"), ("gpu_power_w", "GPU power W"),
        ("ram_gib", "RAM GiB"), ("rss_gib", "process RSS GiB"), ("vram_gib", "VRAM used GiB"))


def to_markdown(rep: dict) -> str:
    out = []
    U = rep.get("utilization") or {}
    C = rep.get("chokepoints") or {}
    for name, ph in (U.get("phases") or {}).items():
        block = ph.get("decode") or ph.get("all")
        kind = "decode" if ph.get("decode") else "all intervals"
        ts = ph.get("time_split") or {}
        out.append(f"### {name} ({kind}, active {_fmt((block or {}).get('active_s'), 1)} s; split "
                   + ", ".join(f"{k} {_fmt(100 * v, 0)}%" for k, v in ts.items() if v) + ")")
        out.append("")
        if block:
            out.append("| resource | mean | p50 | p90 | % of ceiling (mean / p90) | idle frac |")
            out.append("|---|---|---|---|---|---|")
            res = block.get("resources") or {}
            for key, label in ROWS:
                s = res.get(key)
                if not s:
                    continue
                pc = s.get("pct_of_ceiling")
                pcs = "-" if not pc or key.endswith("_pct") else f"{_fmt(pc['mean'], 0)}% / {_fmt(pc['p90'], 0)}%"
                out.append(f"| {label} | {_fmt(s['mean'])} | {_fmt(s['p50'])} | {_fmt(s['p90'])} | {pcs} | "
                           f"{_fmt(s.get('idle_frac'))} |")
            pcb = block.get("per_core_busy_pct")
            if pcb:
                out.append("")
                out.append("per-core busy %: " + ", ".join(f"cpu{k} {_fmt(v, 0)}" for k, v in pcb.items()))
            out.append("")
        cp = (C.get("phases") or {}).get(name) if C else None
        att = (cp or {}).get("decode")
        if att:
            out.append("| decode critical path | ms / token | share |")
            out.append("|---|---|---|")
            for b in BUCKETS:
                out.append(f"| {b} | {_fmt(att['per_token_ms'][b], 3)} | {_fmt(100 * att['share'][b], 1)}% |")
            out.append(f"| **wall** | **{_fmt(att['wall_ms_per_token'], 3)}** | "
                       f"**{_fmt(att['tok_s_from_wall'], 2)} tok/s** |")
            bd = cp.get("binding") or {}
            near = bd.get("resource_nearest_ceiling")
            near_s = f"{near['resource']} at {_fmt(near['pct_mean'], 0)}% of ceiling" if isinstance(near, dict) \
                else str(near)
            out.append("")
            out.append(f"binding: **{bd.get('critical_path')}** ({_fmt(100 * (bd.get('critical_share') or 0), 0)}% "
                       f"of wall); resource nearest its ceiling: {near_s}")
            out.append("")
        elif cp is not None or C == {}:
            why = (cp or {}).get("reason") or U.get("chokepoints_reason")
            out.append(f"decode critical path: not available ({why})")
            out.append("")
    q = U.get("quality") or {}
    if q:
        out.append(f"quality: {q.get('samples')} samples, {q.get('gaps')} gaps, ~{q.get('lost')} lost, "
                   f"{q.get('bad_lines')} bad lines"
                   + (", truncated last line" if q.get("truncated_last_line") else ""))
    for m in U.get("missing") or []:
        out.append(f"- missing: {m}")
    return "\n".join(out).rstrip() + "\n"
