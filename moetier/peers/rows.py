"""The peers' policies, and the oracle bound, as policies over moetier's ledger, records and traces.

Contract
--------
A ``Peer`` is what one system decides, expressed in moetier's terms so that the simulator times every system on
the same recipe (lanes, links, NVMe channel, fixed time) and trace:

* ``policy``: recipe policy overrides (tier replacement ``ram_evict`` / ``vram_evict`` / ``ram_partition``, the
  prefetch predictor) and the row's own tier options, which no recipe sets (``ROW_TIERS``; ``vram_partition:
  layer``: VRAM slots per layer; ``ram_share: even``: with ``ram_partition: layer`` every layer the same whole share
  of the RAM slots, the remainder unused; ``ram_uses: tokens``: the RAM policy sees every token's picks of a layer
  in token order, moetier.peers.token_feed);
* ``placement``: ``dynamic`` (VRAM admits what the GPU computed from RAM or NVMe, as moetier does) or ``static``
  (VRAM holds the warm-up's placement for the whole run: no admission);
* ``rank``: the static placement's order: ``frequency`` (hottest keys of the held-out warm-up first, the seed every
  row shares) or ``layers`` (whole layers, last layer first: llama.cpp ``--n-cpu-moe N`` keeps the first N layers'
  experts on the CPU);
* ``deal``: who computes a pick that is not in VRAM: ``planner`` (moetier's min-max split, plan_layer), ``cpu``
  (compute in place: RAM picks on the cpu lane, NVMe picks read to RAM and computed there), ``gpu`` (fetch on
  miss: RAM picks through the GPU (zerocopy, then admitted), NVMe picks read and pushed), ``latency`` (Fiddler: per
  pick, the lane whose own latency for its rows is lower, cpu against copy-and-compute) or ``fraction`` (FreeToken's
  q*: per step, fetch the heaviest share q of the misses and compute the rest on the CPU, q from the bandwidth
  profile so that both lanes take as long: q = cpu_ms / (cpu_ms + fetch_ms) per expert).

A deal the recipe cannot run (no cpu lane, or no GPU lane) falls back to the lane that exists. ``ORACLE`` is the
bound: the best of Belady's replacement under each tier structure (``ORACLE_STRUCTURES``: the reference's, a global
RAM tier and a VRAM cache; moetier's default's, the recipe's own RAM split, each layer's share under its own Belady,
and VRAM admission; each with no prefetch or a perfect one, every NVMe pick read 1 or 2 layers ahead), with the
run's future known and the planner's split per layer; each structure is a replay of its own and the
oracle row of ``moetier compare`` is, per concurrency, the fastest of them (``structures`` names them).
``attach(peer, replay, streams, steps)`` wires a peer into a ``sim.Replay`` (its ledger and admission; its lane deal
is a rule of the plan context, moetier.core.deal_rules); ``rank_keys(peer, ranked, layers, experts)`` reorders the
warm-up seed; ``wiring(peer, layers, experts)`` is both as the ``wire`` argument of ``sim.run``. ``PEERS`` lists
the rows of ``moetier compare``; docs/peers.md says what each row models and what it leaves out. ``DEFAULT_POLICY``
is the shipped default policy (tier options; the recipe keeps its prefetch), ``SHIPPED`` the row that applies it to
any recipe.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from moetier.core.ledger import Ledger
from moetier.core.policies.belady import BeladyPolicy, Future
from moetier.core.policies.residency import partitioned
from moetier.peers import token_feed

__all__ = ["Peer", "PEERS", "ORACLE", "ORACLE_STRUCTURES", "DEFAULT", "TUNED", "SHIPPED", "DEFAULT_POLICY",
           "REFERENCE_POLICY", "ROW_TIERS",
           "reference_overrides", "attach", "split_ledger", "rank_keys", "wiring", "by_name", "replays"]


@dataclass(frozen=True)
class Peer:
    name: str                         # the row's id in `moetier compare`
    system: str                       # what it models (system and option)
    policy: dict = field(default_factory=dict)
    placement: str = "dynamic"
    rank: str = "frequency"
    deal: str = "planner"
    oracle: bool = False
    belady: bool = False              # the row's own structure, deal and read-ahead under Belady (moetier.peers.gap)
    structures: tuple = ()            # a composite row: the best, per concurrency, of these rows' replays


_NO_PF = {"prefetch": {"depth": 0, "recall": 0.0, "predictor": "none", "budget": 8}}
_TRANSITION = {"prefetch": {"depth": 1, "recall": 0.0, "predictor": "transition", "budget": 8}}

# the KTransformers rows run kt-kernel's own policies (moetier.core.policies.ktransformers) in its tier structure:
# one policy per layer over that layer's expert ids, every layer the same capacity (max_tier0_experts), fed every
# token's ids in order (record_activations); the textbook rows the published ones (moetier.core.policies.twoq, slru,
# sieve, s3fifo, wtinylfu) in the same structure
_KT_TIERS = dict(_NO_PF, ram_partition="layer", ram_share="even", ram_uses="tokens")
_SCAN_RESISTANT = ("2q", "slru", "sieve", "s3fifo", "wtinylfu")
_AUTHORS = {"2q": "Johnson & Shasha", "slru": "Caffeine", "sieve": "Zhang et al.", "s3fifo": "libCacheSim",
            "wtinylfu": "Caffeine"}
DEFAULT = Peer("moetier", "moetier: the recipe's own policy (planner split, its tier policies and prefetch)")
PEERS = (
    DEFAULT,
    Peer("llama.cpp-ncmoe", "llama.cpp --n-cpu-moe: whole layers' experts in VRAM, the rest computed in place "
         "(RAM = page cache, LRU)", dict(_NO_PF, ram_evict="lru"), "static", "layers", "cpu"),
    Peer("llama.cpp-ot", "llama.cpp -ot (hand-placed hot set): the warm-up's hottest experts in VRAM, the rest "
         "computed in place", dict(_NO_PF, ram_evict="lru"), "static", "frequency", "cpu"),
    Peer("mixtral-offloading", "mixtral-offloading: per-layer LRU VRAM cache, every miss fetched to the GPU",
         dict(_NO_PF, vram_evict="lru", vram_partition="layer", ram_evict="lru"), "dynamic", "frequency", "gpu"),
    Peer("fiddler", "Fiddler: popular experts preplaced in VRAM, each miss where its own latency is lower "
         "(CPU in place or copy to GPU)", dict(_NO_PF, ram_evict="lru"), "static", "frequency", "latency"),
    Peer("freetoken", "FreeToken hybrid: global LRU VRAM slots, q* share of misses fetched, the rest on the CPU",
         dict(_NO_PF, vram_evict="lru", ram_evict="lru"), "dynamic", "frequency", "fraction"),
    Peer("moe-infinity", "MoE-Infinity: activation-aware VRAM cache (decayed counts) and prefetch, GPU computes "
         "all", dict(_TRANSITION, vram_evict="dlfu", ram_evict="lru"), "dynamic", "frequency", "gpu"),
    Peer("hybrimoe", "HybriMoE: dynamic CPU/GPU split, impact-driven prefetch, score-based VRAM cache",
         dict(_TRANSITION, vram_evict="dlfu", ram_evict="lru"), "dynamic", "frequency", "planner"),
) + tuple(
    Peer(f"ktransformers-{p}", f"KTransformers: hot experts in VRAM, CPU computes the rest, kt-kernel's {p} "
         "RAM tier per layer", dict(_KT_TIERS, ram_evict=f"kt-{p}"), "static", "frequency", "cpu")
    for p in _SCAN_RESISTANT) + tuple(
    Peer(f"textbook-{p}", f"KTransformers' structure with the textbook {p} ({_AUTHORS[p]}) as its RAM tier per "
         "layer", dict(_KT_TIERS, ram_evict=p), "static", "frequency", "cpu")
    for p in _SCAN_RESISTANT)
# moetier's previous default (a global LRU RAM tier, CLOCK VRAM that always admits): the shipped recipes now run
# DEFAULT_POLICY (docs/peers.md), and this row shows what that change is worth on each recipe
# (also the reference engine's policy, under which its published figures were measured)
REFERENCE_POLICY = {"ram_evict": "lru", "ram_partition": "global", "vram_evict": "clock", "vram_admit": True}
TUNED = Peer("moetier-lru", "moetier's previous default: global LRU RAM tier, CLOCK VRAM that always admits",
             dict(REFERENCE_POLICY))
# the shipped default policy: these tier options, the recipe's own prefetch (off on every shipped recipe). Every
# shipped GLM and Qwen recipe and tiny-ci-cpu set them (tests/test_peers.py); the tiny GPU CI recipes keep the
# ledger's defaults (an always-admitting VRAM tier, whose pushes and drains their runtime tests exercise), and on
# them the moetier-default row shows what this policy does there (docs/peers.md). RAM keeps plain counts, not
# decayed ones: within a request a layer's popularity holds still, and a short half-life evicts its hot experts
# (benchmarks/popularity_drift.py)
DEFAULT_POLICY = {"ram_evict": "lfu", "ram_partition": "layer", "vram_evict": "dlfu", "vram_admit": "auto"}
SHIPPED = Peer("moetier-default", "moetier's shipped default policy applied to the recipe: per-layer LFU RAM, "
               "decayed-LFU VRAM, VRAM a cache with >= 3 x top-k slots a layer", dict(DEFAULT_POLICY))
PEERS = PEERS + (TUNED, SHIPPED)
# the tier structures the oracle replays, each under Belady with the future known: the reference's (a global RAM
# tier, VRAM a cache) and moetier's default's (the recipe's own ram_partition and vram_admit: on the shipped GLM and
# Qwen recipes RAM split per layer, VRAM a cache or its seed as "auto" decides), each without prefetch and with a
# perfect one (every NVMe pick read one or two layers ahead). Belady on one structure is not a bound in time on the
# other: a per-layer split or a static VRAM never drains a victim into RAM, and a read ahead hides NVMe latency that
# no replacement can (HybriMoE's prefetch beat a Belady row without one); so the oracle is the best of them
_RECIPE = "recipe"                    # a structure field taken from the recipe's policy (recipe_policy)
ROW_TIERS = ("vram_partition", "ram_share", "ram_uses")     # a row's own tier options (attach), not recipe fields


def _oracle(name: str, part: str, admit, depth: int) -> Peer:
    pf = {"prefetch": {"depth": depth, "recall": 1.0, "predictor": "recall", "budget": 1 << 20}} if depth else _NO_PF
    tiers = ("RAM global, VRAM a Belady cache" if part == "global" else
             "the recipe's RAM split and VRAM admission (moetier's default's structure)")
    return Peer(f"oracle-{name}" + (f"-pf{depth}" if depth else ""),
                f"Belady with the future known: {tiers}, "
                + (f"every NVMe pick read {depth} layer(s) ahead" if depth else "no prefetch")
                + ", planner split per layer", dict(pf, ram_partition=part, vram_admit=admit), "dynamic",
                "frequency", "planner", oracle=True)


ORACLE_STRUCTURES = tuple(_oracle(name, part, admit, depth) for depth in (0, 1, 2)
                          for name, part, admit in (("reference", "global", True), ("default", _RECIPE, _RECIPE)))
ORACLE = Peer("oracle", "bound: best of Belady under each tier structure (the reference's and moetier's default's, "
              "each with no prefetch or every NVMe pick read 1 or 2 layers ahead), future known, planner split",
              dict(ORACLE_STRUCTURES[0].policy), "dynamic", "frequency", "planner", oracle=True,
              structures=tuple(p.name for p in ORACLE_STRUCTURES))


def reference_overrides() -> list[str]:
    """REFERENCE_POLICY as recipe overrides (``--set`` / ``records.resolve``): the policy the published rows ran."""
    import json
    return [f"policy.{k}={json.dumps(v)}" for k, v in REFERENCE_POLICY.items()]


def by_name(name: str) -> Peer:
    for p in PEERS + (ORACLE,) + ORACLE_STRUCTURES:
        if p.name == name:
            return p
    raise KeyError(name)


def replays(peer: Peer) -> tuple:
    """The rows whose replays make ``peer``'s figures: its structures for a composite row (the oracle), else itself."""
    return tuple(by_name(n) for n in peer.structures) if peer.structures else (peer,)


def recipe_policy(peer: Peer, policy: dict) -> dict:
    """The recipe policy the peer runs under: the recipe's (its seeding, exactness, overlap), with the tier policy
    reset to the reference engine's (REFERENCE_POLICY) so that a peer never inherits moetier's own choices (a
    per-layer RAM split, W-TinyLFU VRAM admission), then the peer's overrides (``"recipe"``: the recipe's own value,
    an oracle structure's); moetier keeps the recipe's."""
    out = dict(policy)
    out.update(REFERENCE_POLICY)
    out.update({k: (policy.get(k, REFERENCE_POLICY[k]) if v == _RECIPE else v) for k, v in peer.policy.items()
                if k not in ROW_TIERS})
    if peer.placement == "static":
        out["vram_admit"] = False
    return out


def rank_keys(peer: Peer, ranked, layers: int, experts: int) -> list:
    """The static placement's order from the warm-up's hottest-first keys."""
    ranked = [int(k) for k in ranked]
    if peer.rank != "layers":
        return ranked
    seen = set(ranked)
    rest = [k for k in range(layers * experts) if k not in seen]
    return sorted(ranked + rest, key=lambda k: -(k // experts))      # stable: hottest first within a layer


def _future(streams, steps: int, keys: int) -> Future:
    """Every key's use positions (step * layers + layer: one per layer call it is picked in) over the run: the
    oracle's future."""
    ks, start = streams.flat()
    L = streams.layers
    toks = np.array([[start[i] + t for i, t in streams.rows(s)] for s in range(steps)], np.int64)
    toks = toks.reshape(steps, streams.conc * streams.window)
    picked = ks[toks]                                                     # [step, row, layer, slot]
    pos = np.broadcast_to(np.arange(steps)[:, None, None, None] * L + np.arange(L)[:, None], picked.shape)
    n = max(1, steps * L)
    code = np.unique((picked * n + pos)[picked >= 0])          # by key, then position; once per layer call
    return Future.of_uses(code // n, code % n, keys)


def attach(peer: Peer, rp, streams, steps: int) -> None:
    """Wire ``peer`` into replay ``rp`` (a fresh sim.Replay, before seeding): the oracle's ledger with the future,
    the static placement (no admission), the lane deal."""
    R = rp.R
    part = peer.policy.get("vram_partition")
    if peer.oracle or peer.belady:
        fut = _future(streams, steps, R.keys)       # one future, one ``now``, for every part of both tiers
        L, E = R.layers, R.experts
        vpol = (partitioned("belady", R.vram_slots, L, E, fut) if part == "layer" and R.vram_slots
                else BeladyPolicy(R.vram_slots, fut, width=R.keys))
        if R.policy.get("ram_partition", "global") == "layer":
            rpol = partitioned("belady", R.ram_slots, L, E, fut, even=peer.policy.get("ram_share") == "even")
        else:
            rpol = BeladyPolicy(R.ram_slots, fut, width=R.keys)
        rp.ledger = Ledger(R.keys, R.vram_slots, R.ram_slots, exclusive=rp.ledger.exclusive, ram_policy=rpol,
                           vram_policy=vpol, layers=L, experts=E)
        rp.future = fut                  # its clock, and every RAM pick used ahead of the plan (Replay.oracle_clock)
        rp.ctx.deal = peer.deal          # the planner kernel's deal rule
        return
    elif (part == "layer" and R.vram_slots) or peer.policy.get("ram_share") or peer.policy.get("ram_uses"):
        rp.ledger = split_ledger(peer, R, rp.ledger.exclusive)
        if peer.policy.get("ram_uses") == "tokens":
            token_feed.wire(rp)
    rp.ctx.deal = peer.deal              # a rule the planner kernel applies (moetier.core.deal_rules)


def split_ledger(peer: Peer, R, exclusive: bool = True) -> Ledger:
    """The ledger of recipe ``R`` (its policy as ``recipe_policy`` gives it) with the row's own tier splits:
    ``vram_partition: layer`` (each layer its share of VRAM, a policy each) and ``ram_share: even`` (each layer
    ``ram_slots // layers`` RAM slots and the remainder unused: kt-kernel gives every layer the same Tier0 capacity
    in expert ids, ``int(budget / (layers x expert bytes))``); with ``ram_uses: tokens`` a TokenFedLedger
    (moetier.peers.token_feed)."""
    L, E, pol = R.layers, R.experts, R.policy
    vpol = pol.get("vram_evict")
    if peer.policy.get("vram_partition") == "layer" and R.vram_slots:
        vpol = partitioned(peer.policy.get("vram_evict", "lru"), R.vram_slots, L, E)
    rpol, rpart = pol.get("ram_evict", "lru"), pol.get("ram_partition", "global")
    if peer.policy.get("ram_share") == "even" and rpart == "layer" and 0 < R.ram_slots < R.keys:
        rpol = partitioned(rpol, R.ram_slots, L, E, even=True)
    cls = token_feed.TokenFedLedger if peer.policy.get("ram_uses") == "tokens" else Ledger
    return cls(R.keys, R.vram_slots, R.ram_slots, exclusive=exclusive, ram_policy=rpol, vram_policy=vpol,
               ram_partition=rpart, layers=L, experts=E)


def wiring(peer: Peer, layers: int, experts: int):
    """``sim.run``'s ``wire``: attach ``peer`` to the fresh replay and return its seed order."""
    def wire(rp, streams, steps):
        attach(peer, rp, streams, steps)
        return lambda ranked: rank_keys(peer, ranked, layers, experts)
    return wire
