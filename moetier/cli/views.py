"""What `moetier table` and `moetier sim` print: the decode and prefill tables and the legend under each.

Contract: ``print_standard(t, header)`` prints the standard table (``main.standard_table``'s dict) and
``print_decode(results)`` the simulator's decode rows (``sim.run`` dicts), both through ``render.table`` (rich on a
terminal, markdown when piped), each followed by its legend. Every figure printed is one of the JSON fields
(``--json``) rounded; the legends say which and in what unit.
"""
from __future__ import annotations

from moetier.cli.render import table

DECODE_LEGEND = (
    "conc: streams decoded together in lockstep (C1, C2, C4); one step makes one token for every stream.",
    "decode tok/s: tokens per second over all streams together (a total); per stream = total / conc.",
    "ms/step: modeled time of one decode step (ms_per_step); fixed + the MoE lanes, which overlap per layer.",
    "fixed: non-MoE time per step (attention, dense layers, sampling), from the recipe's calibration.fixed_ms; "
    "the same whatever the expert placement.",
    "gpu / cpu: ms per step each lane is busy, summed over layers (ms_gpu_moe, ms_cpu_moe). The gpu lane computes "
    "experts in VRAM and those it reads from host RAM (zero-copy) or NVMe; the cpu lane computes RAM experts in "
    "place and NVMe reads landed in RAM.",
    "nvme wait: of the lanes' ms, the part spent waiting for NVMe reads to land (ms_nvme_wait): prefetch, "
    "more RAM or a faster disk shrink it.",
)
TABLE_LEGEND = DECODE_LEGEND + (
    "bound: the lane with more work per step (gpu-moe or cpu-moe): make that lane cheaper (faster kernels, more "
    "VRAM slots, fewer RAM/NVMe picks) to raise decode tok/s.",
    "prefill tok/s: prompt tokens per second for one request of that length (closed-form model, sim.prefill).",
    "prefill bound: which of compute, pcie (staging non-VRAM experts over the link) or nvme (reading NVMe-only "
    "experts) sets the per-layer prefill time.",
)
SIM_LEGEND = DECODE_LEGEND + (
    "vram hit: share of picks (token x layer x top-k) computed from VRAM.",
    "per token (/tok): experts per generated token, over all streams: cpu = computed in RAM by the cpu lane, "
    "zc = read by the GPU from host RAM (zero-copy), nvme = read from NVMe, masked = dropped (a lossy run; "
    "policy.exact=mask), computed from nothing.",
    "prefetch P / R: precision (prefetched experts that were used) and recall (NVMe picks a prefetch covered); "
    "'-' when nothing was prefetched.",
)


def _ms(o: dict) -> list[str]:
    return [f"{o['ms_per_step']:.1f}", f"{o['ms_fixed']:.1f}", f"{o['ms_gpu_moe']:.2f}", f"{o['ms_cpu_moe']:.2f}",
            f"{o['ms_nvme_wait']:.2f}"]


def _lossy(o: dict) -> str:
    if not o.get("masked_per_tok"):
        return ""
    share = f"{100 * o['masked_share']:.1f}% masked, " if o.get("masked_share") is not None else ""
    return f" (lossy: {share}{o['masked_per_tok']:.1f} masked/tok)"


INTERVAL_LEGEND = ("tok/s interval: the decode tok/s (total) with every cost term at its slow (p90) and fast (p10) quantile "
                   "over the bench's rounds (engine term_spread; without one, -5% / +5%), docs/fidelity.md",)


def interval_cell(iv: dict | None) -> list[str]:
    """The interval column's cell, none without an interval."""
    if iv is None:
        return []
    return [f"{iv['low']:.2f}-{iv['high']:.2f}" + (" (default)" if iv["basis"] == "default" else "")]


def print_decode(results, title: str | None = None) -> None:
    rows = []
    has_iv = all("interval" in o for o in results)
    for o in results:
        pf = o["prefetch"]
        pr = "-" if pf["precision"] is None else f"{pf['precision']:.2f} / {pf['recall']:.2f}"
        rows.append([f"C{o['conc']}", f"{o['tok_s']:.2f}{_lossy(o)}", f"{o['tok_s'] / o['conc']:.2f}", *_ms(o),
                     f"{o['vram_hit']:.3f}", f"{o['cpu_experts_per_tok']:.1f}", f"{o['zerocopy_per_tok']:.1f}",
                     f"{o['nvme_per_tok']:.1f}", f"{o['masked_per_tok']:.1f}", pr, *interval_cell(o.get("interval"))])
    table(["conc", "decode tok/s (total)", "tok/s per stream", "ms/step", "fixed", "gpu", "cpu", "nvme wait",
           "vram hit", "cpu/tok", "zc/tok", "nvme/tok", "masked/tok", "prefetch P / R",
           *(["tok/s interval"] if has_iv else [])], rows, title=title,
          legend=SIM_LEGEND + (INTERVAL_LEGEND if has_iv else ()))


def print_standard(t: dict, title: str) -> None:
    rows = []
    for o in t["decode"]:
        bound = "cpu-moe" if o["ms_cpu_moe"] > o["ms_gpu_moe"] else "gpu-moe"
        rows.append([f"C{o['conc']}", f"{o['tok_s']:.2f}{_lossy(o)}", f"{o['tok_s'] / o['conc']:.2f}", *_ms(o),
                     bound, *interval_cell(o.get("interval"))])
    has_iv = all("interval" in o for o in t["decode"])
    table(["conc", "decode tok/s (total)", "tok/s per stream", "ms/step", "fixed", "gpu", "cpu", "nvme wait",
           "bound", *(["tok/s interval"] if has_iv else [])], rows, title=title, legend=INTERVAL_LEGEND if has_iv else ())
    pre = [[f"{int(n) // 1024}k", f"{p['tok_s']:.1f}", f"{p['ms'] / 1000:.1f}", p["bound"]]
           for n, p in sorted(t["prefill"].items(), key=lambda kv: int(kv[0]))]
    print()
    table(["prompt", "prefill tok/s", "seconds", "bound"], pre, title="prefill (one request)", legend=TABLE_LEGEND)
