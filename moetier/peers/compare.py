"""``moetier compare``: every peer, moetier's default and the oracle bound on one recipe and trace.

Contract
--------
``compare(R, trace, concs=(1, 2, 4), peers=PEERS, oracle=True, max_steps=0) -> dict`` runs ``sim.run`` once per
(row, concurrency) with the row's policy on the same recipe and trace, and returns

    {"recipe", "trace", "concs", "rows": [{"peer", "system", "by_conc": {"1": cell, ...}}, ...],
     "ratios": {"best_peer": {conc: name}, "default_over_best_peer": {conc: x}, "default_over_oracle": {conc: x},
                "over_oracle": {conc: [names]}}}

where a cell holds ``tok_s``, the tier shares of the experts computed (``vram_hit``, ``ram_hit``, ``nvme_share``:
experts computed from VRAM, from RAM in place or through the GPU, read from NVMe, over all the experts the layers
needed), ``masked_share`` (dropped; lossy rows say so beside tok/s), NVMe ``reads_per_tok`` (demand + prefetch) and
``bytes_per_tok``, and prefetch ``wasted_bytes_per_tok``. The oracle row is composite (peers.ORACLE): per
concurrency the fastest of its structures' replays, its cell naming the one in ``structure``; ``over_oracle`` lists,
per concurrency, the rows faster than it (none where it bounds the table); ``ratios(rows, concs)`` takes them again
from a table's rows. With ``gap=True`` the document adds ``"gap": {row: {conc: {"gap", "replacement", "readahead",
"rest"}}}``, tok/s (moetier.peers.gap). The ``moetier-default`` row (the shipped default policy on this recipe,
peers.SHIPPED) is left out where it would replay exactly the ``moetier`` row (the recipe already runs it); where it
is kept, ``ratios`` adds ``shipped_over_best_peer`` and ``shipped_over_oracle``.
Pure: no I/O (the CLI prints and plots).
"""
from __future__ import annotations

import json
from dataclasses import replace

from moetier.core import sim
from moetier.core.policies.admission import admits
from moetier.peers.gap import base_name, split, variants
from moetier.peers.rows import DEFAULT, ORACLE, PEERS, ROW_TIERS, SHIPPED, Peer, recipe_policy, replays, wiring

__all__ = ["compare", "cell", "run_peer", "replay_key", "distinct_replays", "ratios"]


def cell(o: dict, R) -> dict:
    """The compare table's figures from one sim.run report."""
    t = o["tokens"] or 1.0
    vram = o["gpu_experts_per_tok"]
    ram = o["cpu_experts_per_tok"] + o["zerocopy_per_tok"]
    nvme = o["nvme_per_tok"]
    masked = o["masked_per_tok"]
    total = vram + ram + nvme + masked
    pf = o["prefetch"]
    reads = nvme + pf["issued_per_tok"]
    return {"tok_s": o["tok_s"], "vram_hit": vram / total if total else 0.0, "ram_hit": ram / total if total else 0.0,
            "nvme_share": nvme / total if total else 0.0, "masked_share": o.get("masked_share", 0.0),
            "reads_per_tok": reads, "bytes_per_tok": reads * R.nvme_expert_bytes,
            "wasted_bytes_per_tok": pf["wasted_bytes"] / t, "prefetch_precision": pf["precision"]}


def _policy(R, peer: Peer) -> dict:
    """The recipe policy a row runs: moetier's row (and its gap variants) the recipe's own, with the variant's
    read-ahead; any other row its own (recipe_policy)."""
    if base_name(peer.name) == "moetier":
        return dict(R.policy, **peer.policy)
    return recipe_policy(peer, R.policy)


def run_peer(R, trace, peer: Peer, conc: int, max_steps: int = 0) -> dict:
    """One sim.run of ``peer`` on recipe ``R`` (moetier's row keeps the recipe's policy)."""
    if peer.name == "moetier":
        return sim.run(R, trace, conc, max_steps=max_steps)
    return sim.run(replace(R, policy=_policy(R, peer)), trace, conc, max_steps=max_steps,
                   wire=wiring(peer, R.layers, R.experts))


def distinct_replays(R) -> list:
    """(name, peer) of every distinct replay ``compare`` runs on ``R``: its rows and the oracle's structures, a row
    whose replay another one already runs (``replay_key``) left out."""
    out, seen = [], set()
    for p in list(PEERS) + [ORACLE]:
        if p is SHIPPED and replay_key(R, SHIPPED) == replay_key(R, DEFAULT):
            continue
        for q in replays(p):
            key = replay_key(R, q)
            if key not in seen:
                seen.add(key)
                out.append((q.name, q))
    return out


def replay_key(R, peer: Peer) -> str:
    """What a row's replay depends on beyond the recipe and trace: rows with the same key replay identically. The
    RAM replacement drops out where nothing can enter the RAM tier after seeding: NVMe picks dropped (``exact:
    mask``), a VRAM that never admits (so never drains a victim into RAM) and no prefetch; the tier then holds its
    seed for the whole run and no replacement decision is ever made - where the tier is one (``ram_partition:
    global``): split per layer, a layer whose share the seed overflows has its policy choose what stays."""
    pol = {"vram_evict": "clock", "vram_admit": True, "ram_partition": "global", "ram_evict": "lru"}
    pol.update(_policy(R, peer))                 # absent: the ledger's default
    pf = pol.get("prefetch") or {}
    if (pol.get("exact") == "mask" and not admits(pol, R.vram_slots, R.layers, R.topk) and not peer.oracle
            and not peer.belady
            and not (pf.get("depth") and pf.get("predictor", "none") != "none") and pol["ram_partition"] == "global"):
        pol.pop("ram_evict", None)
    return json.dumps([pol, peer.placement, peer.rank, peer.deal, peer.oracle]
                      + [peer.policy.get(k) for k in ROW_TIERS] + ([True] if peer.belady else []), sort_keys=True,
                      default=str)


def compare(R, trace, concs=(1, 2, 4), peers=PEERS, oracle: bool = True, max_steps: int = 0,
            trace_name: str | None = None, progress=None, run_cell=None, gap: bool = False) -> dict:
    """The compare document (module docstring). ``run_cell(peer, conc) -> sim.run report`` replaces the local
    replay (benchmarks/compare_all.py runs the cells in a process pool); rows whose ``replay_key`` is equal share
    one replay per concurrency. ``gap`` (with the oracle): each row's distance from it split into replacement,
    read-ahead and the rest (moetier.peers.gap), three more replays a row and concurrency."""
    if run_cell is None:
        def run_cell(p, c):
            return run_peer(R, trace, p, c, max_steps)
    rows, done = [], {}
    todo = list(peers) + ([ORACLE] if oracle else [])
    if SHIPPED in todo and replay_key(R, SHIPPED) == replay_key(R, DEFAULT):
        todo.remove(SHIPPED)                  # the recipe runs the shipped default: its row would repeat moetier's
    for i, p in enumerate(todo):
        if progress is not None:
            progress(p.name, i, len(todo))
        by = {}
        for c in concs:
            cells = []
            for q in replays(p):
                key = (replay_key(R, q), c)
                if key not in done:
                    done[key] = cell(run_cell(q, c), R)
                cells.append(dict(done[key], structure=q.name) if p.structures else dict(done[key]))
            by[str(c)] = max(cells, key=lambda v: v["tok_s"])       # first of equals: the structures' order
        rows.append({"peer": p.name, "system": p.system, "by_conc": by})
    table_ratios = ratios(rows, concs)
    out = {"recipe": R.id, "trace": trace_name or R.trace, "concs": [int(c) for c in concs], "rows": rows,
           "ratios": table_ratios}
    if gap and oracle:
        out["gap"] = _gaps(R, [p for p in todo if not p.oracle], rows, concs, run_cell, done, progress)
    return out


def _gaps(R, todo, rows, concs, run_cell, done, progress) -> dict:
    """{row: {conc: gap.split(...)}} for every row, its variants replayed through ``run_cell`` (shared by key)."""
    bound = next(r for r in rows if r["peer"] == "oracle")["by_conc"]
    tok = {r["peer"]: r["by_conc"] for r in rows}
    out = {}
    for i, p in enumerate(todo):
        if progress is not None:
            progress(f"{p.name}: gap", i, len(todo))
        vs = variants(p)
        per = {}
        for c in map(str, concs):
            ts = {}
            for k, q in vs.items():
                key = (replay_key(R, q), int(c))
                if key not in done:
                    done[key] = cell(run_cell(q, int(c)), R)
                ts[k] = done[key]["tok_s"]
            per[c] = split(tok[p.name][c]["tok_s"], ts["replacement"], ts["readahead"], ts["both"],
                           bound[c]["tok_s"])
        out[p.name] = per
    return out


def ratios(rows: list, concs) -> dict:
    """moetier (and, where its row is there, the shipped default) over the best peer and over the oracle, per
    concurrency; the rows faster than the oracle."""
    out: dict = {"best_peer": {}, "default_over_best_peer": {}, "default_over_oracle": {}, "over_oracle": {}}
    by = {r["peer"]: r for r in rows}
    mine = ["moetier"] + ([SHIPPED.name] if SHIPPED.name in by else [])
    if len(mine) > 1:
        out["shipped_over_best_peer"], out["shipped_over_oracle"] = {}, {}
    names = {"moetier": "default", SHIPPED.name: "shipped"}
    others = [r for r in rows if r["peer"] != "oracle" and not r["peer"].startswith("moetier")]
    for c in map(str, concs):
        if "moetier" in by and others:
            best = max(others, key=lambda r: r["by_conc"][c]["tok_s"])
            out["best_peer"][c] = best["peer"]
            for m in mine:
                out[f"{names[m]}_over_best_peer"][c] = _ratio(by[m], best, c)
        if "moetier" in by and "oracle" in by:
            for m in mine:
                out[f"{names[m]}_over_oracle"][c] = _ratio(by[m], by["oracle"], c)
        if "oracle" in by:
            bound = by["oracle"]["by_conc"][c]["tok_s"]
            out["over_oracle"][c] = [r["peer"] for r in rows if r["peer"] != "oracle"
                                     and r["by_conc"][c]["tok_s"] > bound]
    return out


def _ratio(a: dict, b: dict, c: str):
    d = b["by_conc"][c]["tok_s"]
    return a["by_conc"][c]["tok_s"] / d if d else None
