"""Peers in one harness: each a policy over the same ledger, records and trace (moetier.core.policies)."""
import json
from dataclasses import replace

import numpy as np
import pytest

from moetier.cli.main import find_path, main
from moetier.core import records as spec, sim
from moetier.peers import rows as P
from moetier.core.policies.admission import admits
from moetier.core.plan import plan_layer
from moetier.peers.compare import compare, replay_key, run_peer
from moetier.core.predict import GatedPredictor, make_predictor
from moetier.traces.format import Trace, load_trace


@pytest.fixture(scope="module")
def tiny():
    R = spec.resolve("tiny-ci-cuda", [])
    tr = load_trace(find_path(R.trace), layers=R.layers, experts=R.experts, topk=R.topk)
    return R, tr


def test_compute_in_place_peers_never_fetch_and_never_admit(tiny):
    R, tr = tiny
    o = run_peer(R, tr, P.by_name("llama.cpp-ot"), 1, max_steps=60)
    assert o["zerocopy_per_tok"] == 0 and o["nvme_gpu_per_tok"] == 0
    assert o["cpu_experts_per_tok"] > 0
    assert o["ledger"]["vram_evictions"] == 0          # static: VRAM keeps its seeded placement


def test_fetch_on_miss_sends_every_miss_through_the_gpu(tiny):
    R, tr = tiny
    o = run_peer(R, tr, P.by_name("mixtral-offloading"), 1, max_steps=60)
    assert o["cpu_experts_per_tok"] == 0 and o["nvme_cpu_per_tok"] == 0
    assert o["zerocopy_per_tok"] + o["nvme_gpu_per_tok"] > 0


def test_ncmoe_places_whole_layers_last_first():
    ranked = [5, 0, 9, 14]                  # hottest first, 2 layers x 8 experts
    order = P.rank_keys(P.by_name("llama.cpp-ncmoe"), ranked, 2, 8)
    assert order[:2] == [9, 14] and sorted(order[2:8]) == [8, 10, 11, 12, 13, 15]
    assert order[8:10] == [5, 0] and len(order) == 16


def test_freetoken_fetches_its_q_share_heaviest_first(tiny):
    R, _ = tiny
    rp = sim.Replay(replace(R, policy=P.recipe_policy(P.by_name("freetoken"), R.policy)))
    P.attach(P.by_name("freetoken"), rp, None, 0)
    picks = {k: m for k, m in zip(range(100, 110), (1, 3, 1, 2, 1, 1, 1, 1, 1, 1))}
    plan = plan_layer(rp.ctx, rp.ledger, picks, 0.0, rp.chan)     # all ten on NVMe: the rule deals them
    ctx = rp.ctx
    q = ctx.cpu[1] / (ctx.cpu[1] + ctx.push_ms + ctx.gpu[1])
    assert len(plan.nvme_gpu) == round(q * 10)
    if plan.nvme_gpu:
        assert 101 in plan.nvme_gpu             # the heaviest pick is fetched first
    assert sorted(plan.nvme_cpu + plan.nvme_gpu) == list(range(100, 110))


def test_compare_runs_every_row_on_the_same_recipe_and_trace(tiny):
    R, tr = tiny
    d = compare(R, tr, concs=[1, 2], max_steps=30)
    names = [r["peer"] for r in d["rows"]]
    assert names[0] == "moetier" and names[-1] == "oracle" and len(names) == len(P.PEERS) + 1
    for r in d["rows"]:
        for c in ("1", "2"):
            v = r["by_conc"][c]
            assert v["tok_s"] > 0
            assert abs(v["vram_hit"] + v["ram_hit"] + v["nvme_share"] + v["masked_share"] - 1) < 1e-9
    best = d["ratios"]["best_peer"]["1"]
    top = max(r["by_conc"]["1"]["tok_s"] for r in d["rows"]
              if r["peer"] != "oracle" and not r["peer"].startswith("moetier"))
    assert d["ratios"]["default_over_best_peer"]["1"] == pytest.approx(d["rows"][0]["by_conc"]["1"]["tok_s"] / top)
    assert best in names


def test_moetier_row_is_the_plain_simulator(tiny):
    R, tr = tiny
    assert run_peer(R, tr, P.DEFAULT, 1, 40)["tok_s"] == sim.run(R, tr, 1, max_steps=40)["tok_s"]


def test_compare_cli_prints_json_and_writes_the_png(tmp_path, capsys):
    png = tmp_path / "c.png"
    rc = main(["compare", "tiny-ci-cuda", "--conc", "1", "--steps", "10", "--peers", "moetier,fiddler",
               "--json", "--plot", str(png)])
    assert rc == 0
    d = json.loads(capsys.readouterr().out)
    assert [r["peer"] for r in d["rows"]] == ["moetier", "fiddler", "oracle"]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_compare_cli_refuses_an_unknown_row(capsys):
    assert main(["compare", "tiny-ci-cuda", "--peers", "vllm"]) == 2
    assert "unknown row 'vllm'" in capsys.readouterr().err


def test_rows_that_replay_identically_share_one_replay(tiny):
    # a lossy recipe (NVMe picks dropped) with static VRAM: nothing enters RAM after seeding, so in one global RAM
    # tier (which the seed never overflows) the RAM policy never decides anything: rows that differ only in it come
    # out identical, whether replayed once or each on its own
    R, tr = tiny
    R = spec.resolve("tiny-ci-cuda", ["policy.exact=\"mask\"", "budget.ram_gb=0.002"])
    ot = P.by_name("llama.cpp-ot")
    rows = [replace(ot, name=f"ot-{x}", policy=dict(ot.policy, ram_evict=x)) for x in ("lru", "2q", "sieve")]
    assert len({replay_key(R, p) for p in rows}) == 1
    alone = [run_peer(R, tr, p, 2, 25)["tok_s"] for p in rows]
    assert alone[0] == alone[1] == alone[2]
    calls = []

    def run_cell(p, c):
        calls.append((p.name, c))
        return run_peer(R, tr, p, c, 25)
    d = compare(R, tr, concs=[2], peers=tuple(rows), oracle=False, max_steps=25, run_cell=run_cell)
    assert calls == [("ot-lru", 2)]
    assert [r["by_conc"]["2"]["tok_s"] for r in d["rows"]] == alone
    # split per layer, the seed overflows a layer's share and the layer's policy chooses what stays (W-TinyLFU's
    # filter keeps other keys than 2Q): the KTransformers structure's rows keep their own replays
    kt = [P.by_name(n) for n in ("ktransformers-2q", "textbook-wtinylfu", "textbook-s3fifo")]
    assert len({replay_key(R, p) for p in kt}) == 3
    assert len({run_peer(R, tr, p, 2, 25)["tok_s"] for p in kt}) > 1
    # as does an exact recipe: there the RAM policy decides what stays
    R2, _ = tiny
    assert len({replay_key(R2, p) for p in rows}) == 3


def test_peers_run_their_own_tier_policy_not_the_recipes():
    mine = {"ram_evict": "2q", "ram_partition": "global", "vram_evict": "wtinylfu", "vram_admit": "auto",
            "exact": "mask"}
    kt = P.recipe_policy(P.by_name("ktransformers-sieve"), mine)
    assert (kt["ram_evict"], kt["ram_partition"], kt["vram_admit"]) == ("kt-sieve", "layer", False)
    tb = P.recipe_policy(P.by_name("textbook-sieve"), mine)
    assert (tb["ram_evict"], tb["ram_partition"], tb["vram_admit"]) == ("sieve", "layer", False)
    mine["ram_partition"] = "layer"
    ft = P.recipe_policy(P.by_name("freetoken"), mine)
    assert (ft["ram_evict"], ft["ram_partition"], ft["vram_evict"], ft["vram_admit"]) == ("lru", "global", "lru", True)
    assert kt["exact"] == ft["exact"] == "mask"          # what the recipe says about exactness stays


def test_vram_admit_auto_admits_only_with_three_topk_slots_a_layer():
    assert admits({"vram_admit": "auto"}, 24 * 10, 10, 8) and not admits({"vram_admit": "auto"}, 24 * 10 - 1, 10, 8)
    assert admits({}, 1, 10, 8) and not admits({"vram_admit": False}, 10 ** 6, 10, 8)
    with pytest.raises(ValueError, match="vram_admit"):
        admits({"vram_admit": "sometimes"}, 1, 1, 1)
    # the replay follows it: below the rule VRAM keeps its seed (no admission, no eviction)
    R = spec.resolve("tiny-ci-cuda", ["policy.vram_admit=\"auto\""])      # 48 slots, 8 layers, top-4: 6 < 12
    tr = load_trace(find_path(R.trace), layers=R.layers, experts=R.experts, topk=R.topk)
    assert sim.run(R, tr, 1, max_steps=30)["ledger"]["vram_evictions"] == 0
    R = spec.resolve("tiny-ci-cuda", ["policy.vram_admit=true"])
    assert sim.run(R, tr, 1, max_steps=30)["ledger"]["vram_evictions"] > 0


def test_lossy_runs_show_the_masked_share(capsys):
    over = ["policy.exact=\"mask\"", "budget.ram_gb=0.002"]
    assert main(["sim", "tiny-ci-cuda", "--conc", "1", "--steps", "20", "--set", *over]) == 0
    assert "% masked" in capsys.readouterr().out
    assert main(["sim", "tiny-ci-cuda", "--conc", "1", "--steps", "20", "--json", "--set", *over]) == 0
    assert json.loads(capsys.readouterr().out)["masked_share"] > 0


def _chain_rows(rng, E, K):
    a = rng.choice(E, K, replace=False).tolist()
    return [a], [[(x + 1) % E for x in a]]


def test_gated_predictor_issues_on_predictable_routing_and_not_on_noise():
    E, K = 32, 2
    rng = np.random.default_rng(0)
    pred = GatedPredictor(3, E, 1)
    for step in range(400):                   # layer 0 -> 1 is a fixed map: e -> e + 1
        pred.begin_step(step)
        rows, nxt = _chain_rows(rng, E, K)
        got = pred.predict(0, rows)
        pred.issued(0, got)
        pred.observe(0, rows, nxt)
    assert set(nxt[0]) <= set(got) and pred.precision > pred.target
    noise = GatedPredictor(3, E, 1)
    issued = 0
    for step in range(400):                   # layer 0 -> 1 independent
        noise.begin_step(step)
        rows = [rng.choice(E, K, replace=False).tolist()]
        got = noise.predict(0, rows)
        noise.issued(0, got)
        issued += len(got)
        noise.observe(0, rows, [rng.choice(E, K, replace=False).tolist()])
    assert issued < 20


def test_gated_predictor_from_the_recipe_policy():
    pf = {"prefetch": {"depth": 1, "predictor": "gated", "threshold": 0.7, "read_budget": 12}}
    p = make_predictor(pf, 4, 16)
    assert isinstance(p, GatedPredictor) and p.threshold == 0.7 and p.max_budget == 12


# the shipped GLM and Qwen recipes' tier policy (moetier's default), on the tiny recipes' small traces
_DEFAULT_TIERS = [f"policy.{k}={json.dumps(v)}" for k, v in P.DEFAULT_POLICY.items()]
# shipped recipes that keep the ledger's defaults: the GPU CI recipes' runtime tests exercise an always-admitting
# VRAM tier (pushes, drains and their copy time; "auto" keeps their 6 slots a layer static), tiny-local-cpu is the
# fidelity recipe its committed measurements ran, the EXL3 CI recipes are their adapters' conformance recipes
_KEEP_LEDGER_DEFAULTS = {"tiny-ci-cuda", "tiny-ci-sycl", "tiny-local-cpu", "tiny-ci-exl3xpu", "tiny-ci-exllamav3"}


def test_the_shipped_recipes_run_the_shipped_default_policy():
    ids = [r for r in spec.record_ids("recipe") if spec.is_shipped("recipe", r)]
    assert _KEEP_LEDGER_DEFAULTS <= set(ids)
    for rid in ids:
        pol = spec.resolve(rid, []).policy
        mine = {k: pol.get(k) for k in P.DEFAULT_POLICY}
        if rid in _KEEP_LEDGER_DEFAULTS:
            assert mine != P.DEFAULT_POLICY, rid        # else it belongs with the others, and its row repeats
        else:
            assert mine == P.DEFAULT_POLICY, rid


def test_the_shipped_default_row_shows_only_where_the_recipe_runs_another_policy(tiny):
    R, tr = tiny                                     # tiny-ci-cuda: the ledger's defaults
    d = compare(R, tr, concs=[1], peers=(P.DEFAULT, P.by_name("hybrimoe"), P.SHIPPED), oracle=False, max_steps=30)
    row = {r["peer"]: r["by_conc"]["1"]["tok_s"] for r in d["rows"]}
    Rs = spec.resolve("tiny-ci-cuda", _DEFAULT_TIERS)
    assert row["moetier-default"] == sim.run(Rs, tr, 1, max_steps=30)["tok_s"] != row["moetier"]
    assert d["ratios"]["shipped_over_best_peer"]["1"] == pytest.approx(row["moetier-default"] / row["hybrimoe"])
    Rc = spec.resolve("tiny-ci-cpu", [])
    trc = load_trace(find_path(Rc.trace), layers=Rc.layers, experts=Rc.experts, topk=Rc.topk)
    d = compare(Rc, trc, concs=[1], peers=(P.DEFAULT, P.SHIPPED), oracle=False, max_steps=10)
    assert [r["peer"] for r in d["rows"]] == ["moetier"] and "shipped_over_best_peer" not in d["ratios"]


def test_a_ram_policy_object_is_kept_though_it_holds_no_key_yet():
    # an empty policy has length 0; the ledger once took it for "no policy given" and ran LRU in the oracle's RAM
    from moetier.core.ledger import Ledger
    from moetier.core.policies.residency import BeladyPolicy
    pol = BeladyPolicy(4, {})
    assert Ledger(16, 2, 4, ram_policy=pol, layers=2, experts=8)._rpol is pol


@pytest.mark.parametrize("over", [[], _DEFAULT_TIERS], ids=["ledger-defaults", "default-tiers"])
def test_the_oracle_bounds_every_row_on_the_tiny_cuda_recipe(over):
    R = spec.resolve("tiny-ci-cuda", over)
    tr = load_trace(find_path(R.trace), layers=R.layers, experts=R.experts, topk=R.topk)
    d = compare(R, tr, concs=[1, 2, 4], max_steps=40)
    assert d["rows"][-1]["peer"] == "oracle"
    for c in ("1", "2", "4"):
        bound = d["rows"][-1]["by_conc"][c]
        assert bound["structure"] in {p.name for p in P.ORACLE_STRUCTURES}
        faster = [(r["peer"], r["by_conc"][c]["tok_s"]) for r in d["rows"][:-1]
                  if r["by_conc"][c]["tok_s"] > bound["tok_s"]]
        assert faster == [] and d["ratios"]["over_oracle"][c] == [], (c, bound["tok_s"], faster)
    from moetier.cli.compare import format_summary
    own, *shipped = format_summary([d]).splitlines()[2:]
    assert own.startswith("| tiny-ci-cuda |") and own.endswith("| none |")
    # the shipped default's own line only where the recipe runs another policy
    assert [x.split(" |")[0] for x in shipped] == ([] if over else ["| tiny-ci-cuda (shipped default)"])


@pytest.mark.parametrize("rid", ["tiny-ci-sycl", "tiny-local-cpu", "tiny-ci-cpu"])
@pytest.mark.parametrize("over", [[], _DEFAULT_TIERS], ids=["ledger-defaults", "default-tiers"])
def test_the_default_never_beats_the_oracle_on_the_tiny_recipes(rid, over):
    R = spec.resolve(rid, over)
    tr = load_trace(find_path(R.trace), layers=R.layers, experts=R.experts, topk=R.topk)
    d = compare(R, tr, concs=[1, 2, 4], peers=(P.DEFAULT,), max_steps=40)
    for c, x in d["ratios"]["default_over_oracle"].items():
        assert x <= 1.0, (rid, c, x)


def test_the_oracle_structures_follow_the_recipe():
    # moetier's default's structure is the recipe's own RAM split and VRAM admission; the reference's is fixed
    mine = dict(P.DEFAULT_POLICY)
    d = P.recipe_policy(P.by_name("oracle-default-pf1"), mine)
    assert (d["ram_partition"], d["vram_admit"], d["prefetch"]["recall"]) == ("layer", "auto", 1.0)
    r = P.recipe_policy(P.by_name("oracle-reference"), mine)
    assert (r["ram_partition"], r["vram_admit"], r["prefetch"]["depth"]) == ("global", True, 0)
    assert [q.name for q in P.replays(P.ORACLE)] == list(P.ORACLE.structures)
    assert P.replays(P.DEFAULT) == (P.DEFAULT,)


def test_gap_splits_into_replacement_readahead_and_rest(tiny):
    """The gap decomposition (moetier.peers.gap): the parts add up to oracle - row; two rows that differ only in
    their RAM policy share the 'rest' (perfect replacement and read-ahead leave only the structure and the deal);
    a perfect replacement never slows a row down on this trace."""
    from moetier.peers.gap import split
    assert split(10.0, 14.0, 12.0, 15.0, 20.0) == {"gap": 10.0, "replacement": 3.5, "readahead": 1.5, "rest": 5.0}
    R, tr = tiny
    d = compare(R, tr, concs=[1], peers=(P.by_name("ktransformers-2q"), P.by_name("textbook-2q")), max_steps=30,
                gap=True)
    g = d["gap"]
    for name, per in g.items():
        x = per["1"]
        assert abs(x["replacement"] + x["readahead"] + x["rest"] - x["gap"]) < 1e-9
        row = next(r for r in d["rows"] if r["peer"] == name)["by_conc"]["1"]["tok_s"]
        assert abs(x["gap"] - (d["rows"][-1]["by_conc"]["1"]["tok_s"] - row)) < 1e-9
        assert x["replacement"] > 0, (name, x)
    assert abs(g["ktransformers-2q"]["1"]["rest"] - g["textbook-2q"]["1"]["rest"]) < 1e-9


def test_compare_cli_prints_the_gap_under_the_table(tmp_path, capsys):
    from moetier.cli.main import main
    rc = main(["compare", "tiny-ci-cpu", "--steps", "10", "--conc", "1", "--peers", "moetier,llama.cpp-ot",
               "--png", str(tmp_path / "c.png")])
    out = capsys.readouterr().out
    assert rc == 0
    assert "distance from the oracle" in out and "| llama.cpp-ot | " in out.split("distance from the oracle")[1]
