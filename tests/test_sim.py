"""Simulator: replay semantics, counters, prefetch, mask, seeding modes (small generated traces)."""
import pytest

from moetier.core import sim
from moetier.core import records as spec
from moetier.core.terms import PlanContext
from moetier.traces.gen import GenParams, generate

RECIPE = "glm53-rtx3090-55g-nvx4"


@pytest.fixture(scope="module")
def trace():
    p = GenParams(zipf_s=1.1, zipf_jitter=0.1, reuse=0.3, affinity=0.2, affinity_width=8, drift=0.3)
    return generate(p, layers=42, experts=288, topk=8, tokens=1600, segments=4, seed=3)


def R(*sets):
    return spec.resolve(RECIPE, list(sets))


def test_all_in_ram_has_no_nvme_and_time_adds_up(trace):
    o = sim.run(R("budget.ram_gb=230", "policy.seed=oracle"), trace, 1)
    assert o["nvme_per_tok"] == 0 and o["masked_per_tok"] == 0
    assert o["tok_s"] == pytest.approx(1000.0 / o["ms_per_step"])
    # the step is the sum of per-layer maxima: between fixed + max(lanes) and fixed + sum(lanes)
    lo = o["ms_fixed"] + max(o["ms_gpu_moe"], o["ms_cpu_moe"])
    hi = o["ms_fixed"] + o["ms_gpu_moe"] + o["ms_cpu_moe"]
    assert lo - 1e-9 <= o["ms_per_step"] <= hi + 1e-9
    assert 0 < o["vram_hit"] < 1


def test_nvme_tail_costs_time_and_mask_is_lossy_and_counted(trace):
    full = sim.run(R("budget.ram_gb=230"), trace, 1)
    tail = sim.run(R("budget.ram_gb=20"), trace, 1)
    mask = sim.run(R("budget.ram_gb=20", "policy.exact=mask"), trace, 1)
    assert tail["nvme_per_tok"] > 1 and tail["tok_s"] < full["tok_s"]
    assert not tail["lossy"] and mask["lossy"] and mask["masked_per_tok"] > 1 and mask["nvme_per_tok"] == 0
    assert mask["tok_s"] > tail["tok_s"]


def test_recall_prefetch_helps_and_has_no_false_positives(trace):
    base = sim.run(R("budget.ram_gb=20"), trace, 1)
    pf = sim.run(R("budget.ram_gb=20", "policy.prefetch.recall=1.0", "policy.prefetch.budget=64"), trace, 1)
    assert pf["tok_s"] > base["tok_s"]
    assert pf["prefetch"]["precision"] == pytest.approx(1.0)
    assert pf["prefetch"]["recall"] > 0.5 and pf["prefetch"]["wasted_bytes"] == 0


def test_transition_predictor_reports_precision_recall_and_waste(trace):
    o = sim.run(R("budget.ram_gb=20", "policy.prefetch.predictor=transition", "policy.prefetch.budget=8"), trace, 1)
    pf = o["prefetch"]
    assert pf["predictor"] == "transition" and pf["issued_per_tok"] > 0
    assert 0 < pf["precision"] < 1 and 0 < pf["recall"] < 1
    assert pf["wasted_bytes"] == pf["wasted_reads"] * 9_474_048 > 0


def test_concurrency_unions_rows_and_scales_tokens(trace):
    c1 = sim.run(R("budget.ram_gb=230"), trace, 1)
    c4 = sim.run(R("budget.ram_gb=230"), trace, 4)
    assert c4["tokens"] == 4 * c4["steps"]
    assert c4["ms_fixed"] == pytest.approx(30.0) and c1["ms_fixed"] == pytest.approx(14.0)
    assert c4["tok_s"] > c1["tok_s"]


def test_speculative_window_credits_accepted_tokens(trace):
    o = sim.run(R("budget.ram_gb=230"), trace, 1, window=3, accept=2.0, draft_ms=3.0)
    assert o["tokens"] == pytest.approx(2.0 * o["steps"])
    assert o["ms_fixed"] == pytest.approx(25.0 + 0 * o["steps"])  # fixed(3) interpolated 20..30


def test_oracle_seed_hits_vram_at_least_as_often_as_warmup(trace):
    warm = sim.run(R("budget.ram_gb=55", "policy.warmup_tokens=200"), trace, 1)
    oracle = sim.run(R("budget.ram_gb=55", "policy.seed=oracle"), trace, 1)
    assert warm["warm_steps"] == 200 and warm["seed"] == "warmup"
    assert oracle["vram_hit"] >= warm["vram_hit"] - 0.02


def test_prefill_model_matches_published_55g_figures():
    r = R()
    assert sim.prefill(r, 8192)["tok_s"] == pytest.approx(710.1, abs=0.1)
    assert sim.prefill(r, 32768)["tok_s"] == pytest.approx(970.7, abs=0.1)
    assert sim.prefill(r, 8192)["bound"] == "compute"


def test_warmup_seed_uses_only_the_held_out_warmup_tokens():
    """Warm-up tokens route to one expert set, the measured part to another. Seeded from the held-out warm-up only,
    RAM holds the warm-up set, so each measured key is read from NVMe exactly once (a whole-trace seed would hold the
    more frequent measured set and read nothing)."""
    import numpy as np
    from moetier.traces.format import Trace
    R0 = spec.resolve("tiny-ci-cpu")
    L, K, T, W = R0.layers, R0.topk, 400, 100
    ids = np.empty((T, L, K), np.int16)
    ids[:W] = np.arange(K)                       # warm-up: experts 0..3 in every layer
    ids[W:] = np.arange(K) + 16                  # measured: experts 16..19
    tr = Trace(ids=ids, segments=np.array([0, T]))
    slots = L * K * R0.ram_expert_bytes / 1e9    # exactly one phase's keys fit in RAM
    warm = sim.run(spec.resolve("tiny-ci-cpu", [f"budget.ram_gb={slots}", f"policy.warmup_tokens={W}"]), tr, 1)
    assert warm["warm_steps"] == W and warm["steps"] == T - W
    assert warm["nvme_per_tok"] == pytest.approx(L * K / (T - W))


def test_serial_engine_pays_admission_and_drain_copies_in_the_step(trace):
    base = ("budget.ram_gb=20", "policy.overlap=false")
    o = sim.run(R(*base), trace, 1)
    assert o["ledger"]["vram_evictions"] > 0 and o["ms_copy"] > 0
    # overlapping engines hide copies on a copy engine: no copy term
    assert sim.run(R("budget.ram_gb=20"), trace, 1)["ms_copy"] == 0
    # each copy also costs the host time it is fed (booked to the step, not to the link)
    more = sim.run(R(*base, 'calibration.host={"per_copy_ms": 1.0}'), trace, 1)
    copies_per_step = o["ms_copy"] / PlanContext.from_recipe(R(*base)).push_ms
    assert more["ms_copy"] == pytest.approx(o["ms_copy"])
    assert more["ms_per_step"] - o["ms_per_step"] == pytest.approx(copies_per_step * 1.0, rel=0.1)


@pytest.mark.parametrize("sets", [(), ("policy.overlap=false",),
                                  ("policy.prefetch.depth=1", "policy.prefetch.predictor=transition")],
                         ids=["overlap", "serial", "prefetch"])
def test_a_prediction_times_the_deal_of_the_recipe_the_run_planned_on(trace, sets):
    """sim.run(R, choose=P) deals every pick as a replay of P on its own clock does (a runtime that planned on P
    makes exactly those decisions: plan parity, tests/test_runtime.py) and times the deal on R's terms."""
    def lanes(out):
        return lambda s, l, p: out.append((s, l, {k: list(v) for k, v in p.lanes().items()}))

    planned, dear = R("budget.ram_gb=20", *sets), R("budget.ram_gb=20", *sets, "lane_overrides.cpu.per_expert_ms=2.0")
    want, own, got = [], [], []
    p = sim.run(planned, trace, 2, max_steps=40, plan_hook=lanes(want))
    o = sim.run(dear, trace, 2, max_steps=40, plan_hook=lanes(own))
    g = sim.run(dear, trace, 2, max_steps=40, plan_hook=lanes(got), choose=planned)
    assert own != want                      # on its own terms the dearer cpu lane deals otherwise ...
    assert got == want                      # ... the prediction keeps the planned deal, in its order
    assert g["cpu_experts_per_tok"] == p["cpu_experts_per_tok"] > 0 and g["ledger"] == p["ledger"]
    assert g["ms_cpu_moe"] > p["ms_cpu_moe"]           # and times it on the dearer terms
