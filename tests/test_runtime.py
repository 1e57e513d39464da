"""Runtime on the CPU backend: real store, real O_DIRECT reads, real kernels.

Checks: tiering does not change the math (bit-identical to all-in-RAM), per-layer NMSE vs the float64 reference,
plan parity with the simulator, mask is the only lossy mode, transport faults stop the run with one line.
"""
import pytest

import numba  # noqa: E402,F401  (the cpu extra: a missing install fails, it does not skip)

from moetier.measure import calibrate  # noqa: E402
from moetier.run import runtime  # noqa: E402
from moetier.core import sim  # noqa: E402
from moetier.core import records as spec  # noqa: E402
from moetier.bytes import store  # noqa: E402
from moetier.run.registry import get_backend  # noqa: E402
from moetier.errors import UserError  # noqa: E402
from conformance.bounds import Tally  # noqa: E402
from conformance.conftest import reference_hook  # noqa: E402
from moetier.traces.format import load_trace  # noqa: E402
from moetier.bytes.transport import FaultPlan  # noqa: E402
from tests._watchdog import watchdog  # noqa: E402

bounded = watchdog(240)   # every test here waits on real reads: a stuck wait fails its test, never hangs the suite

RECIPE = "tiny-ci-cpu"
STEPS = 12


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    R = spec.resolve(RECIPE)
    d = tmp_path_factory.mktemp("store") / "tiny"
    store.pack(R.model, str(d))
    return str(d)


def _run(packed, *sets, conc=1, faults=None, **kw):
    R = spec.resolve(RECIPE, list(sets))
    st = store.open_store(packed, model=R.model)
    tr = load_trace(spec.REGISTRY.parent / R.trace, layers=R.layers, experts=R.experts, topk=R.topk)
    be = get_backend("cpu", st, ram_slots=min(R.keys, R.ram_slots) + 64, faults=faults)
    try:
        return R, tr, runtime.run(R, st, be, tr, conc, max_steps=STEPS, **kw)
    finally:
        be.close()


def test_tiering_is_bit_identical_to_all_in_ram(packed):
    _, _, tiered = _run(packed, conc=2)
    _, _, allram = _run(packed, "budget.ram_gb=1", conc=2)
    assert tiered["reads_per_token"] > 0 and allram["reads_per_token"] == 0
    assert tiered["digests"] == allram["digests"]
    assert tiered["checksum_failures"] == 0 and tiered["checksum_checked"] > 0
    assert not tiered["lossy"]


def test_layer_outputs_match_float64_reference(packed):
    tally = Tally(spec.resolve(RECIPE).model["store"]["encoding"])
    _run(packed, conc=2, layer_hook=reference_hook(tally, every=5))
    assert tally.n and not tally.failures(), tally.failures()


@pytest.mark.parametrize("sets", [
    [],
    ["policy.ram_evict=lfu:8:10", "policy.ram_partition=global"],      # the window LFU is global only
    ["policy.prefetch.depth=1", "policy.prefetch.predictor=transition"],
    ["policy.prefetch.depth=1", "policy.prefetch.predictor=recall", "policy.prefetch.recall=0.6"],
    ["policy.seed=oracle"],
    # a predictor that runs costs host time, so the gated one goes dormant on the layers where it issues nothing
    ["policy.prefetch.depth=1", "policy.prefetch.predictor=gated", "calibration.host.per_predict_ms=0.2"],
], ids=["lru", "lfu", "transition-prefetch", "recall-prefetch", "oracle-seed", "gated-dormant"])
def test_plan_parity_with_simulator(packed, sets):
    """The runtime (real reads, tickets) makes exactly the simulator's decisions (modeled clock, fast paths)."""
    got, want = [], []

    def rec(out):
        return lambda s, l, p: out.append((s, l, {k: sorted(v) for k, v in p.lanes().items()}))

    R, tr, res = _run(packed, *sets, conc=2, plan_hook=rec(got))
    o = sim.run(R, tr, 2, max_steps=STEPS, plan_hook=rec(want))
    assert got == want
    assert any(p["nvme_cpu"] for _, _, p in got) and any(p["cpu"] for _, _, p in got)
    assert res["ledger"] == o["ledger"]
    assert res["reads_per_token"] == pytest.approx(o["nvme_per_tok"])
    # read coverage: both book the layers whose NVMe picks are all demand reads (with prefetch, which reads are
    # withdrawn in time depends on the real reader's timing), the work before the first wait and that read's landing
    cov = calibrate.read_coverage(res["counters"])
    assert cov["layers"] > 0 and cov["span_ms"] > 0 and cov["latency_ms"] > 0 and cov["gap_sd_ms"] > 0
    # the head start is the span less the lanes in it: host work only, so positive and shorter than the span
    assert 0 < cov["head_ms"] < cov["span_ms"]
    c = res["counters"]
    assert c["read_reads"] >= c["read_layers"]
    # a split call books its longest share: at least its fair part of the batch, less than all of it
    from backends.cpu.lane import cores
    if cores() > 1:
        assert c["cpu_split_calls"] > 0
        assert c["cpu_split_cold"] / cores() <= c["cpu_split_crit_cold"] < c["cpu_split_cold"]
        assert c["cpu_split_wake"] > 0               # its worker idled between split calls (spec.idle_wake)
    # a call right after a wait that blocked on its read is booked as such: only NVMe picks' inline calls. Without
    # prefetch some of them (a layer's reads are issued together, its first one is waited for); with it, every demand
    # read may have landed before its wait on a fast disk (CI saw 0 for recall-prefetch), so only the bound holds
    assert c["cpu_inline_waited"] <= min(c["cpu_inline_calls"], c["nvme_picks"])
    if not any("prefetch" in x for x in sets):
        assert c["cpu_inline_waited"] > 0
    if "policy.prefetch.predictor=gated" in sets:
        # the runtime predicts on exactly the layers the simulator charged; dormant on most of them
        assert c["predict_layers"] == o["prefetch"]["predict_layers"] < STEPS * R.layers
        assert c["read_predict"] <= c["read_layers"]
    else:
        assert c["read_predict"] == (c["read_layers"] if any("prefetch" in x for x in sets) else 0)
    assert calibrate.read_coverage({}) == {"layers": 0, "span_ms": None, "head_ms": None, "latency_ms": None,
                                           "gap_sd_ms": None}
    assert o["read_coverage"]["span_ms"] > 0 and o["read_coverage"]["latency_ms"] > 0
    assert o["read_coverage"]["gap_sd_ms"] > 0
    if not any("prefetch" in x for x in sets):
        assert cov["layers"] == o["read_coverage"]["layers"]


@pytest.mark.parametrize("ram_gb", ["0.0003", "0"], ids=["2-ram-slots", "no-ram-slots"])
def test_budget_ram_gb_below_one_layers_picks_streams_them(packed, ram_gb):
    """`--set budget.ram_gb=0.0003` (2 RAM slots, 4 picks a layer) and `=0` once raised KeyError: a pick the
    full RAM tier does not admit was released before it was computed. Like the simulator, the runtime streams it
    through the slot it landed in: same plans and ledger as the simulator, same outputs as all-in-RAM."""
    got, want = [], []

    def rec(out):
        return lambda s, l, p: out.append((s, l, {k: sorted(v) for k, v in p.lanes().items()}))

    R, tr, res = _run(packed, f"budget.ram_gb={ram_gb}", conc=2, plan_hook=rec(got))
    assert R.ram_slots < R.topk
    o = sim.run(R, tr, 2, max_steps=STEPS, plan_hook=rec(want))
    assert got == want and res["ledger"] == o["ledger"]
    assert res["reads_per_token"] == pytest.approx(o["nvme_per_tok"]) and res["reads_per_token"] > 0
    if R.ram_slots:
        assert res["ledger"]["refused_admissions"] > 0
    _, _, allram = _run(packed, "budget.ram_gb=1", conc=2)
    assert res["digests"] == allram["digests"]


def test_prefetch_is_issued_between_the_resident_lanes_and_the_waits(packed):
    """A read starts once a lane kernel frees the interpreter, so the host predicts and issues the prefetch after the
    resident lane calls (overlapping the reads in flight) and before it waits: a depth-1 prefetch then has the
    rest of the layer to land in (issued after the layer, it was still queued when the next layer needed it)."""
    R = spec.resolve(RECIPE, ["policy.prefetch.depth=1", "policy.prefetch.predictor=transition"])
    st = store.open_store(packed, model=R.model)
    tr = load_trace(spec.REGISTRY.parent / R.trace, layers=R.layers, experts=R.experts, topk=R.topk)
    be = get_backend("cpu", st, ram_slots=min(R.keys, R.ram_slots) + 64)
    events, layers = [], []

    def spy(name, call):       # records the order of the real backend's calls, and makes them
        def f(*a, **kw):
            events.append((name, kw.get("prefetch", False)))
            return call(*a, **kw)
        return f
    for name in ("fill", "compute", "wait"):
        setattr(be, name, spy(name, getattr(be, name)))
    try:
        res = runtime.run(R, st, be, tr, 1, max_steps=STEPS,
                          layer_hook=lambda *_: (layers.append(list(events)), events.clear()))
    finally:
        be.close()
    checked = 0
    for ev in layers[1:]:                               # the first one carries the seeding's fills
        at = {e: [i for i, x in enumerate(ev) if x == e] for e in set(ev)}
        demand, pf = at.get(("fill", False), []), at.get(("fill", True), [])
        comp, wait = at.get(("compute", False), []), at.get(("wait", False), [])
        if demand and pf and comp and wait and comp[0] < wait[0]:
            checked += 1
            assert max(demand) < comp[0] < min(pf) and max(pf) < wait[0]
    assert checked > 0 and res["prefetch_reads_per_token"] > 0


def test_mask_is_lossy_and_counted(packed):
    _, _, exact = _run(packed)
    _, _, masked = _run(packed, "policy.exact=mask")
    assert masked["lossy"] and masked["masked_per_token"] > 0 and masked["reads_per_token"] == 0
    assert not exact["lossy"] and masked["digests"] != exact["digests"]


@pytest.mark.parametrize("fault", ["flip", "eio", "short"])
def test_transport_fault_stops_the_run_with_one_line(packed, fault):
    R = spec.resolve(RECIPE)
    # a key that is read from NVMe during the run: every key of layer 0 not seeded into RAM
    keys = set(range(R.keys))
    with pytest.raises(UserError, match=r"transfer of key \d+ failed") as e:
        _run(packed, faults=FaultPlan(**{fault: keys}))
    assert "\n" not in str(e.value)
