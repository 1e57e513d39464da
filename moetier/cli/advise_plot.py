"""`moetier advise`'s figures: the Pareto view of the configurations tried and the upgrades' gains; one PNG each,
written atomically (moetier.cli.plots' helpers), headless."""
from __future__ import annotations

from moetier.cli.plots import _bars, _need, _plt, _save


def plot_pareto(rows: list, path, title: str) -> str:
    """tok/s against RAM (and VRAM, where any was used) per concurrency: every candidate at the highest rung it
    reached (open: a short replay; filled: a full one), the front over the full replays drawn as a line."""
    top = _highest_rung(rows)
    _need(bool(top), "at least one replayed configuration")
    concs = sorted({c for c, _ in top})
    last = max(r["rung"] for r in top.values())
    axes_ = ["ram_gb"] + (["vram_gb"] if any(r["vram_gb"] for r in top.values()) else [])
    plt = _plt()
    fig, axs = plt.subplots(len(concs), len(axes_), figsize=(5.5 * len(axes_), 3.2 * len(concs)), squeeze=False)
    for i, c in enumerate(concs):
        pts = [r for (cc, _), r in top.items() if cc == c]
        for j, ax_name in enumerate(axes_):
            _pareto_panel(axs[i][j], pts, last, ax_name, c, legend=(i == 0 and j == 0))
    fig.suptitle(title, fontsize=10)
    return _save(fig, path)


def _highest_rung(rows: list) -> dict:
    """(conc, candidate) -> its row at the highest rung it reached; failed replays left out."""
    top: dict = {}
    for r in rows:
        k = (r.get("conc"), tuple(r.get("cand", ())))
        if "error" not in r and (k not in top or r["rung"] > top[k]["rung"]):
            top[k] = r
    return top


def _pareto_panel(ax, pts: list, last: int, ax_name: str, conc: int, legend: bool) -> None:
    from moetier.measure.advise import pareto
    full = [r for r in pts if r["rung"] == last]
    short = [r for r in pts if r["rung"] < last]
    ax.scatter([r[ax_name] for r in short], [r["tok_s"] for r in short], s=12, facecolors="none",
               edgecolors="#999999", label="short replay only")
    ax.scatter([r[ax_name] for r in full], [r["tok_s"] for r in full], s=22, color="#1f77b4", label="full replay")
    front = sorted((r for r, on in zip(full, pareto([(r[ax_name], r["tok_s"]) for r in full])) if on),
                   key=lambda r: r[ax_name])
    ax.plot([r[ax_name] for r in front], [r["tok_s"] for r in front], "-o", color="#d62728", ms=4,
            label="Pareto front")
    ax.set_xlabel(f"{'RAM' if ax_name == 'ram_gb' else 'VRAM'} used (GB)")
    ax.set_ylabel(f"C{conc} decode tok/s")
    ax.grid(alpha=0.3)
    if legend:
        ax.legend(fontsize=7)


def plot_upgrades(table: list, concs: list, path, title: str) -> str:
    """Grouped bars: tok/s gained per upgrade and concurrency (upgrades the records cannot express are left out)."""
    rows = [u for u in table if u.get("gain")]
    _need(bool(rows), "at least one expressible upgrade")
    plt = _plt()
    fig, ax = plt.subplots(figsize=(1.4 * len(rows) + 3, 3.6))
    _bars(ax, [u["name"] for u in rows], {f"C{c}": [u["gain"].get(c) or 0.0 for u in rows] for c in concs},
          "decode tok/s gained")
    ax.set_title(title, fontsize=10)
    return _save(fig, path)
