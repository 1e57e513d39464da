"""The probe report as markdown: per phase a utilization table and the decode critical path.

Contract: ``to_markdown(report)`` renders what moetier.measure.probe_analysis.report returned (any part may be
missing: it says what is not available) as markdown text ending in a newline.
"""
from __future__ import annotations

from moetier.measure.probe_analysis import BUCKETS
from moetier.measure.probe_file import _finite


def _fmt(x, nd=2):
    return "-" if not _finite(x) else f"{x:.{nd}f}"


ROWS = (("cpu_cores_busy_pct", "CPU cores busy %"), ("cpu_lane_duty_pct", "CPU-lane duty %"),
        ("cpu_lane_weight_gbps", "CPU-lane weights GB/s"), ("ddr_derived_gbps", "DDR derived GB/s"),
        ("nvme_read_gbps", "NVMe read GB/s"), ("gpu_util_pct", "GPU util %"), ("vram_busy_pct", "VRAM busy %"),
        ("pcie_h2d_gbps", "PCIe H2D GB/s"), ("pcie_d2h_gbps", "PCIe D2H GB/s"), ("gpu_power_w", "GPU power W"),
        ("ram_gib", "RAM GiB"), ("rss_gib", "process RSS GiB"), ("vram_gib", "VRAM used GiB"))


def _utilization_lines(block: dict) -> list[str]:
    out = ["| resource | mean | p50 | p90 | % of ceiling (mean / p90) | idle frac |", "|---|---|---|---|---|---|"]
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
        out += ["", "per-core busy %: " + ", ".join(f"cpu{k} {_fmt(v, 0)}" for k, v in pcb.items())]
    return out + [""]


def _critical_path_lines(cp: dict) -> list[str]:
    att = cp["decode"]
    out = ["| decode critical path | ms / token | share |", "|---|---|---|"]
    for b in BUCKETS:
        out.append(f"| {b} | {_fmt(att['per_token_ms'][b], 3)} | {_fmt(100 * att['share'][b], 1)}% |")
    out.append(f"| **wall** | **{_fmt(att['wall_ms_per_token'], 3)}** | **{_fmt(att['tok_s_from_wall'], 2)} tok/s** |")
    bd = cp.get("binding") or {}
    near = bd.get("resource_nearest_ceiling")
    near_s = f"{near['resource']} at {_fmt(near['pct_mean'], 0)}% of ceiling" if isinstance(near, dict) else str(near)
    return out + ["", f"binding: **{bd.get('critical_path')}** ({_fmt(100 * (bd.get('critical_share') or 0), 0)}% "
                      f"of wall); resource nearest its ceiling: {near_s}", ""]


def _phase_lines(name: str, ph: dict, U: dict, C: dict) -> list[str]:
    block = ph.get("decode") or ph.get("all")
    kind = "decode" if ph.get("decode") else "all intervals"
    ts = ph.get("time_split") or {}
    out = [f"### {name} ({kind}, active {_fmt((block or {}).get('active_s'), 1)} s; split "
           + ", ".join(f"{k} {_fmt(100 * v, 0)}%" for k, v in ts.items() if v) + ")", ""]
    if block:
        out += _utilization_lines(block)
    cp = (C.get("phases") or {}).get(name) if C else None
    if (cp or {}).get("decode"):
        out += _critical_path_lines(cp)
    elif cp is not None or C == {}:
        why = (cp or {}).get("reason") or U.get("chokepoints_reason")
        out += [f"decode critical path: not available ({why})", ""]
    return out


def to_markdown(rep: dict) -> str:
    out = []
    U = rep.get("utilization") or {}
    C = rep.get("chokepoints") or {}
    for name, ph in (U.get("phases") or {}).items():
        out += _phase_lines(name, ph, U, C)
    q = U.get("quality") or {}
    if q:
        out.append(f"quality: {q.get('samples')} samples, {q.get('gaps')} gaps, ~{q.get('lost')} lost, "
                   f"{q.get('bad_lines')} bad lines"
                   + (", truncated last line" if q.get("truncated_last_line") else ""))
    for m in U.get("missing") or []:
        out.append(f"- missing: {m}")
    return "\n".join(out).rstrip() + "\n"
