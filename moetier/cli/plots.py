"""Figures as PNG files, one function per kind; headless (matplotlib's Agg backend, no display needed).

Contract: each ``plot_*(data, path, title=None)`` takes the data the command that makes it returns (its JSON
form), writes one PNG atomically (moetier.atomic: a figure is whole or absent) and returns the path. Bad data
raises UserError naming what was expected. The kinds:

- ``plot_levers(rows)``: the lever study (examples/levers.py --json): decode tok/s per lever, one bar per
  concurrency.
- ``plot_timeline(results)``: ``sim.run(..., timeline=True)`` results: experts served per step by tier (stacked
  area) and the hit rates over the replay (VRAM; VRAM or RAM), one column per concurrency.
- ``plot_waterfall(report)``: a probe report (``moetier probe report`` JSON, or a run record with ``chokepoints``):
  the per-layer ms of each component (lanes, NVMe wait, copy, overhead) stacked up to the layer's wall time, per phase.
- ``plot_cache(curves)``: hit rate against cache slots per layer, LRU (solid) against Belady (dashed), per layer
  (``layer_curves``) and over the whole model (``trace stats`` JSON's ``cache``).
- ``plot_calibration(record)``: a calibration run record: measured against predicted decode tok/s per arm, with
  the y = x line and the +-5% / +-15% error bands.
- ``plot_compare(rows)``: rows of {policy, conc, tok_s}: decode tok/s per policy, one bar per concurrency.
"""
from __future__ import annotations

import io
import math

from moetier.errors import UserError

TIER_COLOURS = {"vram": "#2ca02c", "ram": "#1f77b4", "nvme": "#ff7f0e", "masked": "#d62728"}


def _plt():
    try:
        import matplotlib
    except ImportError:
        raise UserError("plots need matplotlib: pip install 'matplotlib>=3.7'") from None
    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt
    return plt


def _save(fig, path) -> str:
    from moetier.atomic import atomic_write
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    _plt().close(fig)
    atomic_write(path, lambda f: f.write(buf.getvalue()))
    return str(path)


def _need(cond: bool, what: str) -> None:
    if not cond:
        raise UserError(f"plot: expected {what}")


def _bars(ax, groups: list[str], series: dict[str, list[float]], ylabel: str) -> None:
    """Grouped bars: one group per label, one bar per series key, its value printed on top."""
    n = max(1, len(series))
    width = 0.8 / n
    for i, (name, vals) in enumerate(series.items()):
        xs = [g + (i - (n - 1) / 2) * width for g in range(len(groups))]
        bars = ax.bar(xs, vals, width, label=name)
        ax.bar_label(bars, fmt="%.1f", fontsize=7, padding=1)
    ax.set_xticks(range(len(groups)))
    ax.set_xticklabels(groups, rotation=20, ha="right", fontsize=8)
    ax.set_ylabel(ylabel)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8)


def plot_levers(rows, path, title: str | None = None) -> str:
    """The lever study: rows as examples/levers.py --json prints them ({lever, tok_s: {conc: tok/s}})."""
    _need(isinstance(rows, list) and rows and all(isinstance(r, dict) and "lever" in r and "tok_s" in r
                                                  for r in rows), "a list of lever rows {lever, tok_s}")
    concs = sorted({c for r in rows for c in r["tok_s"]}, key=int)
    plt = _plt()
    fig, ax = plt.subplots(figsize=(10, 4.8))
    _bars(ax, [r["lever"] for r in rows], {f"C{c} (total)": [r["tok_s"].get(c, 0.0) for r in rows] for c in concs},
          "decode tok/s (all streams)")
    ax.set_title(title or "cumulative levers: decode tok/s per lever and concurrency")
    return _save(fig, path)


def plot_compare(rows, path, title: str | None = None) -> str:
    """The policy comparison: rows of {"policy", "conc", "tok_s"} (one per policy and concurrency)."""
    _need(isinstance(rows, list) and rows and all(isinstance(r, dict) and {"policy", "conc", "tok_s"} <= set(r)
                                                  for r in rows), "a list of rows {policy, conc, tok_s}")
    for i, r in enumerate(rows):
        conc, tok_s = r["conc"], r["tok_s"]
        _need(isinstance(conc, int) and not isinstance(conc, bool) and conc >= 1,
              f"row {i}: conc a positive integer, got {conc!r}")
        _need(isinstance(tok_s, (int, float)) and not isinstance(tok_s, bool) and math.isfinite(tok_s)
              and tok_s >= 0, f"row {i}: tok_s a finite number >= 0, got {tok_s!r}")
    policies = list(dict.fromkeys(str(r["policy"]) for r in rows))
    concs = sorted({int(r["conc"]) for r in rows})
    val = {(str(r["policy"]), int(r["conc"])): float(r["tok_s"]) for r in rows}
    plt = _plt()
    fig, ax = plt.subplots(figsize=(max(6.0, 1.2 * len(policies) + 3), 4.5))
    _bars(ax, policies, {f"C{c}": [val.get((p, c), 0.0) for p in policies] for c in concs},
          "decode tok/s (all streams)")
    ax.set_title(title or "policy comparison: decode tok/s per policy and concurrency")
    return _save(fig, path)


def _smooth(xs: list[float], w: int) -> list[float]:
    out, s = [], 0.0
    for i, x in enumerate(xs):
        s += x
        if i >= w:
            s -= xs[i - w]
        out.append(s / min(i + 1, w))
    return out


def plot_timeline(results, path, title: str | None = None) -> str:
    """Tier use over a replay: ``sim.run(..., timeline=True)`` dicts (one per concurrency)."""
    results = results if isinstance(results, list) else [results]
    _need(results and all(isinstance(r, dict) and isinstance(r.get("timeline"), dict) for r in results),
          "simulator results with a 'timeline' (sim.run(..., timeline=True), moetier sim --plot)")
    plt = _plt()
    fig, axes = plt.subplots(2, len(results), figsize=(5.2 * len(results), 6.0), squeeze=False,
                             sharex="col", gridspec_kw={"height_ratios": [2, 1]})
    for j, r in enumerate(results):
        tl = r["timeline"]
        n = len(tl["ms"])
        _need(n > 0, "a timeline with at least one measured step")
        w = max(1, n // 50)
        steps = list(range(n))
        tok = r["conc"] * r.get("accept", 1.0)
        tiers = [t for t in ("vram", "ram", "nvme", "masked") if any(tl[t])]
        ax = axes[0][j]
        ax.stackplot(steps, *[_smooth([v / tok for v in tl[t]], w) for t in tiers], labels=tiers,
                     colors=[TIER_COLOURS[t] for t in tiers], alpha=0.85)
        ax.set_ylabel("experts per token, by tier")
        ax.set_title(f"C{r['conc']}: {r['tok_s']:.1f} tok/s")
        ax.legend(loc="upper right", fontsize=8)
        ax.grid(alpha=0.3)
        hit = [v / p if p else 0.0 for v, p in zip(tl["vram_picks"], tl["picks"])]
        served = [a + b + c + d for a, b, c, d in zip(tl["vram"], tl["ram"], tl["nvme"], tl["masked"])]
        res = [(a + b) / n if n else 0.0 for a, b, n in zip(tl["vram"], tl["ram"], served)]
        ax2 = axes[1][j]
        ax2.plot(steps, _smooth(res, w), color=TIER_COLOURS["ram"], label="resident (VRAM or RAM), experts")
        ax2.plot(steps, _smooth(hit, w), color=TIER_COLOURS["vram"], label="VRAM, picks")
        ax2.set_ylim(0, 1)
        ax2.set_xlabel(f"decode step (mean over {w} steps)")
        ax2.set_ylabel("hit rate")
        ax2.grid(alpha=0.3)
        ax2.legend(loc="lower right", fontsize=8)
    fig.suptitle(title or f"tier use over the replay: {results[0].get('recipe', '')}")
    return _save(fig, path)


WATERFALL_PARTS = ("gpu_lane", "cpu_lane", "nvme_wait", "copy", "overhead")


def _phases(report) -> dict:
    ch = report.get("chokepoints") if isinstance(report, dict) else None
    ph = (ch or {}).get("phases") if isinstance(ch, dict) else None
    _need(isinstance(ph, dict) and ph, "a probe report or run record with chokepoints.phases "
          "(moetier probe report RUN --write)")
    out = {}
    for name, p in ph.items():
        d = (p or {}).get("decode") if isinstance(p, dict) else None
        if isinstance(d, dict) and isinstance(d.get("per_layer_ms"), dict):
            out[name] = d["per_layer_ms"]
    _need(bool(out), "at least one phase with decode.per_layer_ms in the chokepoints")
    return out


def plot_waterfall(report, path, title: str | None = None) -> str:
    """Per-layer chokepoint waterfall: each component's ms per layer call, stacked up to the measured wall."""
    phases = _phases(report)
    plt = _plt()
    fig, axes = plt.subplots(1, len(phases), figsize=(4.6 * len(phases), 4.2), squeeze=False)
    colours = plt.get_cmap("tab10").colors
    for ax, (name, pl) in zip(axes[0], phases.items()):
        base, labels = 0.0, []
        for i, part in enumerate(WATERFALL_PARTS):
            v = float(pl.get(part) or 0.0)
            ax.bar(i, v, bottom=base, color=colours[i], width=0.7)
            if v:
                ax.text(i, base + v, f"{v:.3f}", ha="center", va="bottom", fontsize=7)
            base += v
            labels.append(part.replace("_", " "))
        wall = float(pl.get("wall") or base)
        rest = wall - base              # what the counters do not attribute (the host between calls)
        ax.bar(len(labels), rest, bottom=min(base, wall), color="0.75", width=0.7, hatch="//")
        labels.append("unattributed")
        ax.bar(len(labels), wall, color="0.35", width=0.7)
        ax.text(len(labels), wall, f"{wall:.3f}", ha="center", va="bottom", fontsize=7)
        ax.set_xticks(range(len(labels) + 1))
        ax.set_xticklabels(labels + ["wall"], rotation=30, ha="right", fontsize=8)
        ax.set_ylabel("ms per layer call")
        ax.set_title(name)
        ax.grid(axis="y", alpha=0.3)
    fig.suptitle(title or "chokepoints: where a layer's time goes")
    return _save(fig, path)


def layer_curves(trace, experts: int, layers=None, sizes=None, progress=None) -> dict:
    """Per-layer LRU and Belady hit rates of ``trace`` for ``layers`` (default: first, a third, two thirds,
    last) at ``sizes`` slots per layer (default a ladder up to ``experts``): {"layer N": {slots, lru, belady}}."""
    import numpy as np
    from moetier.traces.stats import belady_hits, drop_masked, lru_hits, next_use
    ids = drop_masked(trace, "plot cache")[0]
    L = ids.shape[1]
    layers = sorted(set(layers)) if layers else sorted({0, L // 3, (2 * L) // 3, L - 1})
    bad = [l for l in layers if not 0 <= l < L]
    if bad:
        raise UserError(f"plot cache: --layers {bad} out of range 0..{L - 1}")
    sizes = sizes or sorted({max(1, round(experts * f)) for f in (1 / 32, 1 / 16, 1 / 8, 1 / 4, 1 / 2, 3 / 4)})
    out = {}
    for i, l in enumerate(layers):
        if progress is not None:
            progress(i, len(layers))
        seq = ids[:, l, :].reshape(-1)
        n, nxt = len(seq), next_use(seq)
        out[f"layer {l}"] = {"slots": list(sizes), "lru": [lru_hits(seq, s) / n for s in sizes],
                             "belady": [belady_hits(seq, s, nxt) / n for s in sizes]}
    return out


def plot_cache(curves, path, title: str | None = None, *, layers: int | None = None) -> str:
    """Hit-rate curves: ``curves`` is {name: {slots, lru, belady}} (layer_curves) and/or a ``trace stats`` dict
    (its ``cache``, over the whole model, drawn per layer when ``layers`` is given)."""
    cur = dict(curves) if isinstance(curves, dict) else {}
    if "cache" in cur and isinstance(cur["cache"], dict):
        c = cur.pop("cache")
        L = layers or cur.pop("layers", None) or 1
        cur = {k: v for k, v in cur.items() if isinstance(v, dict) and "slots" in v}
        cur["whole model"] = {"slots": [s / L for s in c["sizes"]], "lru": c["lru"], "belady": c["belady"]}
    cur = {k: v for k, v in cur.items() if isinstance(v, dict) and {"slots", "lru", "belady"} <= set(v)}
    _need(bool(cur), "hit-rate curves {name: {slots, lru, belady}} or trace stats JSON with 'cache'")
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    colours = plt.get_cmap("tab10").colors
    for i, (name, c) in enumerate(cur.items()):
        col = colours[i % len(colours)]
        ax.plot(c["slots"], c["lru"], "-o", color=col, ms=3, label=f"{name} LRU")
        ax.plot(c["slots"], c["belady"], "--", color=col, label=f"{name} Belady")
    ax.set_xscale("log")
    ax.set_xlabel("cache slots per layer")
    ax.set_ylabel("hit rate (share of picks)")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7, ncol=2)
    ax.set_title(title or "hit rate against cache size: LRU (solid) vs Belady (dashed)")
    return _save(fig, path)


def plot_calibration(record, path, title: str | None = None) -> str:
    """Measured against predicted decode tok/s per arm of a calibration run record (its ``table``)."""
    rows = record.get("table") if isinstance(record, dict) else None
    _need(isinstance(rows, list) and rows and all(isinstance(r, dict) and {"decode", "sim_decode"} <= set(r)
                                                  for r in rows),
          "a calibration run record with table rows {arm, conc, decode, sim_decode, fit}")
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6.2, 5.6))
    xs = [float(r["decode"]) for r in rows] + [float(r["sim_decode"]) for r in rows]
    lo, hi = min(xs) * 0.85, max(xs) * 1.15
    line = [lo, hi]
    ax.fill_between(line, [x * 0.85 for x in line], [x * 1.15 for x in line], color="0.9", label="+-15%")
    ax.fill_between(line, [x * 0.95 for x in line], [x * 1.05 for x in line], color="0.78", label="+-5%")
    ax.plot(line, line, color="0.3", lw=1, label="predicted = measured")
    for fit, marker, col, name in ((True, "o", "#1f77b4", "fit arms"), (False, "^", "#d62728", "held-out arms")):
        sel = [r for r in rows if bool(r.get("fit")) == fit]
        if sel:
            ax.scatter([r["decode"] for r in sel], [r["sim_decode"] for r in sel], marker=marker, color=col,
                       label=name, zorder=3)
    errs = [abs(float(r["sim_decode"]) / float(r["decode"]) - 1) * 100 for r in rows if r["decode"]]
    med = sorted(errs)[len(errs) // 2] if errs else math.nan
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.set_xlabel("measured decode tok/s")
    ax.set_ylabel("simulator's decode tok/s")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")
    ax.set_title(title or f"{record.get('id', 'calibration')}: {len(rows)} arms, median |error| {med:.1f}%",
                 fontsize=9)
    return _save(fig, path)
