"""The calibration loop end to end on a small matrix (real runs on the CI tiny store), in a scratch registry."""
import json
import math
import shutil

import pytest

import numba  # noqa: E402,F401  (the cpu extra: a missing install fails, it does not skip)

from moetier.measure import bench  # noqa: E402
from moetier.measure import calibrate  # noqa: E402
from moetier.measure import fit  # noqa: E402
from moetier.measure import fit_nvme  # noqa: E402
from moetier.measure import write  # noqa: E402
from moetier.core import records as spec  # noqa: E402
from moetier.bytes import store  # noqa: E402
from moetier.traces.format import load_trace  # noqa: E402
from tests._extras import missing  # noqa: E402
from moetier.core.terms import PlanContext  # noqa: E402


@pytest.fixture()
def scratch(tmp_path, monkeypatch):
    root = tmp_path / "registry"
    data = spec.REGISTRY.parent                            # the shipped traces stay where they are
    shutil.copytree(spec.REGISTRY, root)
    monkeypatch.setattr(spec, "REGISTRY", root)
    monkeypatch.setenv("MOETIER_REGISTRY", str(root))     # calibration writes into the copy it reads
    R = spec.resolve("tiny-ci-cpu")
    d = tmp_path / "store"
    store.pack(R.model, str(d))
    tr = load_trace(data / R.trace, layers=R.layers, experts=R.experts, topk=R.topk)
    return root, store.open_store(str(d), model=R.model), tr


def test_small_matrix_fits_terms_writes_records_and_predicts(scratch):
    root, st, tr = scratch
    ram = spec.resolve("tiny-ci-cpu").raw["budget"]["ram_gb"]
    arms = [
        {"name": "allram-C1", "set": ["budget.ram_gb=1"], "conc": 1, "fit": True},
        {"name": "tail-C1", "set": [], "conc": 1, "fit": True},
        {"name": "tail-C2", "set": [], "conc": 2, "fit": True},
        {"name": "small-C2", "set": [f"budget.ram_gb={ram * 0.8}"], "conc": 2, "fit": False},
    ]
    res = calibrate.calibrate("tiny-ci-cpu", st, tr, arms=arms, steps=12, repeats=1, write=True)
    t = res["terms"]
    # three fit arms give 5 aggregate rows (allram has no inline call): too few for the optional terms, which the fit
    # leaves out, so per_expert_ms is pinned. The bench's figure: reuse_curve's cold cost per added expert of a split
    # call (dealt over `workers` threads) x workers, one thread's cost like per_expert_ms. On this shared machine the
    # two sit within 3x of each other (measured 0.03-0.07 ms against 0.03-0.07 ms)
    bench_ms = bench.reuse_curve(st, rounds=2, calls=8)["cold_per_expert_ms"] * t["cpu"]["workers"]
    assert bench_ms / 3 < t["cpu"]["per_expert_ms"] < 3 * bench_ms, (t["cpu"], bench_ms)
    ms = [v for k, v in t["cpu"].items() if k.endswith("_ms")]
    assert max(ms) < 5 and set(t["fixed_ms"]) == {"1", "2"}, t["cpu"]
    assert all(math.isfinite(r["error_pct"]) and r["measured_tok_s"] > 0 and r["sim_tok_s"] > 0 for r in res["rows"])
    assert [r["fit"] for r in res["rows"]] == [True, True, True, False]
    # cpu-only arms: the runtime and the simulator replay one ledger, so they compute the same experts per token
    for r in res["rows"]:
        lanes = r["lane_experts_per_token"]
        assert lanes["measured"]["cpu"] > 0 and lanes["measured"]["gpu"] == lanes["sim"]["gpu"] == 0
        assert lanes["sim"]["cpu"] == pytest.approx(lanes["measured"]["cpu"], rel=1e-9)
    # the plan pass only steers the runtime: the reported terms are fitted on the checked pass
    assert res["plan_terms"]["cpu"] != t["cpu"]
    json.dumps(res, allow_nan=False)
    run = res["rows"][1]["measured_run"]            # the record keeps what the fits saw
    assert run["counters"]["reads"] > 0 and run["tokens"] / run["wall_s"] == pytest.approx(
        res["rows"][1]["measured_tok_s"])
    # the fitted terms were written (validated) into the scratch registry and the simulator now uses them
    R = spec.resolve("tiny-ci-cpu")
    assert R.host["per_layer_ms"] == pytest.approx(round(t["host"]["per_layer_ms"], 6))
    assert R.fixed_ms[1] == pytest.approx(t["fixed_ms"]["1"])
    # the tail arms fit the host's head start and its lateness, and the engine carries the lateness by rows
    assert t["host"]["head_per_layer_ms"] + t["host"]["head_per_read_ms"] > 0
    assert R.host["head_per_layer_ms"] == pytest.approx(round(t["host"]["head_per_layer_ms"], 6))
    eng = R.engines[-1]["id"]
    # the per-read part is the engine's: written to its record, and the recipe resolves to it
    assert spec.load_record("engine", eng)["head_per_read_ms"] == pytest.approx(
        round(t["head_per_read_ms_by_engine"][eng], 6))
    assert R.host["head_per_read_ms"] == pytest.approx(round(t["head_per_read_ms_by_engine"][eng], 6))
    assert set(t["lane_lateness_sd_ms_by_rows"].get(eng, {})) <= {"1", "2"}
    # every fit arm with enough read layers sets its rows' lateness
    enough = {str(r["conc"]) for r in res["rows"] if r["fit"] and r["read_coverage"]["measured"]["layers"] >= 50
              and r["read_coverage"]["measured"]["gap_sd_ms"] is not None}
    assert enough and enough <= set(t["lane_lateness_sd_ms_by_rows"][eng])
    assert spec.load_record("engine", eng).get("lane_lateness_sd_ms_by_rows") == \
        (t["lane_lateness_sd_ms_by_rows"].get(eng) or None)
    s = calibrate.summary(res["rows"])
    assert s["arms"] == 4 and s["held_out_max_abs_error_pct"] is not None
    assert math.isfinite(res["summary"]["pass_drift_pct"])


def test_pass_drift_is_the_median_speed_change_of_the_cpu_only_fit_arms():
    arms = [{"name": "a", "fit": True}, {"name": "b", "fit": True}, {"name": "c", "fit": True},
            {"name": "v", "fit": True, "backend": "sycl"}]
    first = {n: {"tokens": 100, "wall_s": 1.0} for n in "abcv"}
    second = {"a": {"tokens": 100, "wall_s": 1.25}, "b": {"tokens": 100, "wall_s": 0.8},
              "c": {"tokens": 100, "wall_s": 1.0}, "v": {"tokens": 100, "wall_s": 0.1}}
    assert calibrate.pass_drift(arms, first, second) == pytest.approx(0.0)     # -20%, +25%, 0%: median 0
    assert calibrate.pass_drift(arms[3:], first, second) is None               # VRAM arms plan on the costs


def test_device_lane_and_copy_terms_recover_known_costs():
    pl, pe, px, copy = 0.12, 0.05, 0.03, 0.09
    calls = [["gpu", e, x, 0, 10, 10 * (pl + pe * e + px * x) / 1e3] for e in (1, 2, 4) for x in (0, 1, 3)]
    calls += [["zc", 1, 0, 0, 7, 7 * 0.2 / 1e3]]           # one shape only: booked per expert, no launch term
    calls += [["cpu_inline", 1, 0, 0, 50, 1.0]]             # not a device lane: ignored here
    run = {"call_groups": calls, "counters": {"copies": 40, "copy_s": 30 * copy / 1e3, "stage_s": 10 * copy / 1e3}}
    t = fit.fit_device_terms([run])
    none = {"per_read_ms": 0.0, "per_read_busy_ms": 0.0}
    assert t["gpu"] == pytest.approx({"per_layer_ms": pl, "per_expert_ms": pe, "per_extra_token_ms": px, **none},
                                     rel=1e-6)
    assert t["zerocopy"] == pytest.approx({"per_layer_ms": 0.0, "per_expert_ms": 0.2, "per_extra_token_ms": 0.0,
                                           **none})
    assert t["copy_ms"] == pytest.approx(copy)
    assert fit.fit_device_terms([{"call_groups": [], "counters": {"copies": 0}}]) == {}


def test_copy_time_is_pooled_for_the_link_the_planner_moves_records_over():
    # C1: 10 copies at 0.1 ms; C4: 30 at 0.2 ms: one figure over every copy
    runs = [{"conc": 1, "call_groups": [], "counters": {"copies": 10, "copy_s": 1e-3, "stage_s": 0.0}},
            {"conc": 4, "call_groups": [], "counters": {"copies": 30, "copy_s": 5e-3, "stage_s": 1e-3}}]
    t = fit.fit_device_terms(runs)
    assert t == {"copy_ms": pytest.approx(7.0 / 40)}
    terms = {"host": {}, "fixed_ms": {"1": 1.0}, **t}
    arm = {"set": [f'engines=["{calibrate.VRAM_ENGINE}"]', "budget.vram_expert_slots=8", "policy.overlap=false"]}
    R = calibrate.arm_recipe("tiny-ci-cpu", arm, terms)
    assert R.h2d_gbps == pytest.approx(write.copy_gbps(R.nvme_expert_bytes, 7.0 / 40))
    assert PlanContext.from_recipe(R, 1).push_ms == PlanContext.from_recipe(R, 4).push_ms == pytest.approx(7.0 / 40)


def test_device_lane_fit_separates_reads_in_flight():
    # calls from a known model at two concurrencies, with reads in flight (a cost per read and one once any is in
    # flight); at C4 some shapes are seen fewer than MIN_CALLS times and enter the fit through their pooled row
    pl, pe, px, pr, pb = 0.2, 0.06, 0.04, 0.05, 0.03

    def ms(e, x, r, conc):
        return pl + pe * e + px * x + pr * r + pb * (r > 0)

    c1 = [["gpu", e, 0, r, 40, 40 * ms(e, 0, r, 1) / 1e3] for e in (1, 2, 3) for r in (0, 1, 2)]
    c4 = [["gpu", e, x, r, n, n * ms(e, x, r, 4) / 1e3] for e, n in ((1, 8), (3, 2), (5, 8)) for x in (0, 2)
          for r in (1, 3)]
    runs = [{"conc": 1, "call_groups": c1, "counters": {}}, {"conc": 4, "call_groups": c4, "counters": {}}]
    t = fit.fit_device_terms(runs)
    assert t["gpu"] == pytest.approx({"per_layer_ms": pl, "per_expert_ms": pe, "per_extra_token_ms": px,
                                      "per_read_ms": pr, "per_read_busy_ms": pb}, rel=1e-6)
    # no read in flight: neither read term is identifiable; both are written as 0, so that they replace what an
    # earlier calibration left in the engine record
    only = fit.fit_device_terms([{"conc": 1, "call_groups": [[*g[:3], 0, *g[4:]] for g in c1],
                                        "counters": {}}])
    assert only["gpu"]["per_read_ms"] == only["gpu"]["per_read_busy_ms"] == 0.0


def test_noise_is_two_standard_errors_of_the_pooled_repeats():
    # five repeats: the fastest and slowest are dropped, the middle three (90, 100, 110) pooled
    assert calibrate.noise_pct([50, 90, 100, 110, 200]) == pytest.approx(200 * 10 / 3 ** 0.5 / 100)
    assert calibrate.noise_pct([100]) is None
    rows = [{"arm": a, "fit": True, "error_pct": 1.0, "bucket_error_pct": {}, "ms_per_token": {"measured": {}},
             "noise_pct": calibrate.noise_pct(each)} for a, each in (("calm", [99, 100, 101]),
                                                                     ("noisy", [80, 100, 120, 90]))]
    assert calibrate.summary(rows)["noisy_arms"] == ["noisy +-11%"]     # kept 90, 100: 200 x 5 / 95


def test_vram_arms_fit_device_lanes_copies_and_per_engine_latency(scratch):
    why = calibrate.sycl_available()
    if why is not None:
        missing("sycl", f"the VRAM arms need the SYCL backend: {why}")
    root, st, tr = scratch
    R = spec.resolve("tiny-ci-cpu")
    vram = calibrate.vram_arms(R, slots=24)
    arms = [{"name": "tail-C1", "set": [], "conc": 1, "fit": True}, vram[0], vram[1],
            {**vram[2], "fit": False}]
    res = calibrate.calibrate("tiny-ci-cpu", st, tr, arms=arms, steps=12, repeats=1, write=True)
    t = res["terms"]
    # 12 steps are too few to split a call's cost between its terms reliably (the non-negative fit may put it all
    # in one), but a call must cost something
    assert t["gpu"]["per_layer_ms"] + t["gpu"]["per_expert_ms"] > 0 and t["copy_ms"] > 0
    assert all(w >= 0 for tab in t["nvme_wake_ms_by_rows"].values() for w in tab.values())
    assert set(t["nvme_latency_by_rows_qd_ms"]) <= {"numba-cpu", calibrate.VRAM_ENGINE}
    rows = {r["arm"]: r for r in res["rows"]}
    v = rows[vram[0]["name"]]
    assert v["ms_per_token"]["measured"]["gpu_moe"] > 0 and v["ms_per_token"]["sim"]["gpu_moe"] > 0
    assert all(math.isfinite(r["error_pct"]) for r in res["rows"])
    json.dumps(res, allow_nan=False)
    # written: the VRAM engine's lanes and the link speed the copies measured
    eng = spec.load_record("engine", calibrate.VRAM_ENGINE)
    assert eng["lanes"]["gpu"]["per_expert_ms"] == pytest.approx(round(t["gpu"]["per_expert_ms"], 6))
    assert eng["lanes"]["cpu"]["workers"] == t["cpu"]["workers"]
    R = spec.resolve("tiny-ci-cpu")
    assert R.h2d_gbps == pytest.approx(write.copy_gbps(R.nvme_expert_bytes, t["copy_ms"]), rel=1e-3)


def test_cpu_lane_fit_recovers_both_call_classes_and_takes_out_contention():
    from moetier.measure.bench import fit_cpu_lane
    pc, pl, pe, px, W, rc = 0.03, 0.2, 0.06, 0.02, 2, 0.05
    rows = []
    for e in (1, 2, 3, 4, 6, 8):
        for x in (0, 2):
            for cont in (0, 1):
                cls = "inline" if e < 4 else "split"
                ms = (pc + pe * e + px * x) if cls == "inline" else (pl + (pe * e + px * x) / W)
                n = 5 + 40 * (e == 1)
                rows.append({"cls": cls, "calls": n, "experts": n * e, "extra": n * x,
                             "ms": n * (ms + rc * cont), "contended": n * cont})
    got = fit_cpu_lane(rows, W, rc)
    assert got == pytest.approx({"per_call_ms": pc, "per_layer_ms": pl, "per_expert_ms": pe,
                                 "per_extra_token_ms": px}, rel=1e-6)
    # the per-read cost fitted in situ with the others (read_cpu None)
    assert fit_cpu_lane(rows, W, None) == pytest.approx({"per_call_ms": pc, "per_layer_ms": pl, "per_expert_ms": pe,
                                                        "per_extra_token_ms": px, "per_read_ms": rc}, rel=1e-6)
    # no read during any call: not identifiable, left out
    quiet = [{**r, "ms": r["ms"] - rc * r["contended"], "contended": 0} for r in rows]
    assert "per_read_ms" not in fit_cpu_lane(quiet, W, None)


# one arm matrix's cpu-lane rows as calibrate aggregated them (tail-C1, tail-C2, allram-C1 at 12 steps, on this
# test's matrix above): 5 timed rows for 4 base and 4 optional terms
FIVE_ROWS = [
    {"cls": "split", "calls": 96, "experts": 384, "extra": 0, "ms": 57.7058, "contended": 0, "cold": 296.7551,
     "crit_cold": 154.4312, "crit_extra": 0, "wake": 68.3133, "handoff": 96},
    {"cls": "inline", "calls": 117, "experts": 216, "extra": 0, "ms": 40.8283, "contended": 63, "cold": 176.7158,
     "waited": 21},
    {"cls": "split", "calls": 42, "experts": 168, "extra": 0, "ms": 30.4688, "contended": 0, "cold": 124.4185,
     "crit_cold": 63.0313, "crit_extra": 0, "wake": 133.4824, "handoff": 42},
    {"cls": "inline", "calls": 127, "experts": 127, "extra": 6, "ms": 7.6666, "contended": 0, "cold": 127.0,
     "waited": 22},
    {"cls": "split", "calls": 96, "experts": 576, "extra": 59, "ms": 107.7868, "contended": 127, "cold": 425.7279,
     "crit_cold": 231.0366, "crit_extra": 47, "wake": 250.4306, "handoff": 52}]


def test_cpu_lane_fit_leaves_out_the_terms_too_few_rows_cannot_tell_apart():
    """With more terms than rows every subset fits exactly and the search took one with per_expert_ms at 0 and
    per_read / per_wake / per_after_wait / per_handoff carrying the cost; the optional terms are left out instead."""
    from moetier.measure.bench import fit_cpu_lane
    got = fit_cpu_lane(FIVE_ROWS, 2, None)
    assert set(got) == {"per_call_ms", "per_layer_ms", "per_expert_ms", "per_extra_token_ms"}, got
    assert 0.02 < got["per_expert_ms"] < 0.2, got
    # one more arm's rows and the optional terms that differ between rows join again
    more = FIVE_ROWS + [{**r, "calls": 2 * r["calls"], "ms": 2.2 * r["ms"], "contended": 3 * r["contended"] + 5}
                        for r in FIVE_ROWS]
    assert "per_read_ms" in fit_cpu_lane(more, 2, None)


def test_cpu_lane_fit_follows_a_split_calls_longest_share():
    from moetier.measure.bench import fit_cpu_lane
    pc, pl, pe, px, W = 0.03, 0.2, 0.06, 0.02, 2
    rows = []
    for e in (1, 2, 3, 4, 5, 7, 9):
        for x in (0, 1):
            if e < 4:
                rows.append({"cls": "inline", "calls": 10, "experts": 10 * e, "extra": 10 * x,
                             "ms": 10 * (pc + pe * e + px * x)})
            else:                 # odd counts: the calling thread's share is the longer one
                share = -(-e // W)
                rows.append({"cls": "split", "calls": 10, "experts": 10 * e, "extra": 10 * x,
                             "crit_cold": 10 * share, "crit_extra": 10 * x, "ms": 10 * (pl + pe * share + px * x)})
    assert fit_cpu_lane(rows, W, 0.0) == pytest.approx({"per_call_ms": pc, "per_layer_ms": pl, "per_expert_ms": pe,
                                                        "per_extra_token_ms": px}, rel=1e-6)


def test_cpu_lane_fit_separates_the_workers_wake_up_from_the_split_calls_fixed_cost():
    from moetier.measure.bench import fit_cpu_lane
    from moetier.core.records import idle_wake
    pc, pl, pe, pw, W = 0.03, 0.2, 0.06, 0.02, 2
    rows = [{"cls": "inline", "calls": 50, "experts": 100, "extra": 0, "ms": 50 * (pc + 2 * pe)}]
    # arms whose split calls find the worker idle for different times: back to back, after inline calls, after
    # NVMe waits (the calibration's all-in-RAM, mask and tail arms)
    for e, idle in ((4, 0.05), (4, 0.6), (4, 2.5), (8, 0.05), (8, 2.5)):
        n, wake = 20, idle_wake(idle)
        rows.append({"cls": "split", "calls": n, "experts": n * e, "extra": 0, "crit_cold": n * e / W,
                     "crit_extra": 0, "wake": n * wake, "ms": n * (pl + pe * e / W + pw * wake)})
    got = fit_cpu_lane(rows, W, 0.0)
    assert got == pytest.approx({"per_call_ms": pc, "per_layer_ms": pl, "per_expert_ms": pe,
                                 "per_extra_token_ms": 0.0, "per_wake_ms": pw}, rel=1e-6, abs=1e-9)
    assert "per_wake_ms" not in fit_cpu_lane([{**r, "wake": 0.0} for r in rows], W, 0.0)   # no idle booked


def test_cpu_lane_fit_separates_the_hand_off_of_calls_that_end_with_a_workers_share():
    """A split call over two threads whose worker takes as many experts as the caller waits for the worker, which
    starts a hand-off later (spec.hands_off); one whose caller has an expert more ends with the caller's share.
    Arms mix the two in different shares (resident batches of 4, 5, 7 and 8 at C1, C2)."""
    from moetier.measure.bench import fit_cpu_lane
    from moetier.core.records import hands_off
    pc, pl, pe, ph, W = 0.03, 0.05, 0.2, 0.15, 2
    assert [n for n in range(4, 10) if hands_off(n, W)] == [4, 6, 8] and not hands_off(8, 1)
    assert [n for n in range(4, 10) if hands_off(n, 3)] == [5, 6, 8, 9]      # 7 = 3 + 2 + 2: the caller's
    rows = [{"cls": "inline", "calls": 50, "experts": 100, "extra": 0, "ms": 50 * (pc + 2 * pe)}]
    for mix in ({4: 30}, {7: 20, 8: 10}, {5: 25, 6: 5, 8: 10}, {7: 30, 5: 10}):
        calls = sum(mix.values())
        crit = sum(c * -(-n // W) for n, c in mix.items())
        handoff = sum(c for n, c in mix.items() if hands_off(n, W))
        rows.append({"cls": "split", "calls": calls, "experts": sum(n * c for n, c in mix.items()), "extra": 0,
                     "crit_cold": crit, "crit_extra": 0, "handoff": handoff,
                     "ms": calls * pl + crit * pe + handoff * ph})
    got = fit_cpu_lane(rows, W, 0.0)
    assert got == pytest.approx({"per_call_ms": pc, "per_layer_ms": pl, "per_expert_ms": pe,
                                 "per_extra_token_ms": 0.0, "per_handoff_ms": ph}, rel=1e-6, abs=1e-9)
    # every split call hands off (the bench's even grid): not identifiable beside per_layer_ms, left out
    assert "per_handoff_ms" not in fit_cpu_lane(rows[:2], W, 0.0)


def test_cpu_lane_fit_separates_a_call_after_a_blocked_wait_from_the_inline_calls_fixed_cost():
    from moetier.measure.bench import fit_cpu_lane
    pc, pl, pe, pa, W = 0.04, 0.2, 0.06, 0.035, 2
    # arms whose inline calls follow a blocked read in different shares: all-in-RAM and mask (none), a tail
    # (most), a tail with prefetch (few: the reads had landed)
    rows = [{"cls": "split", "calls": 40, "experts": 160, "extra": 0, "crit_cold": 80, "crit_extra": 0,
             "ms": 40 * (pl + 2 * pe)}]
    for n, e, waited in ((30, 60, 0), (60, 70, 45), (50, 65, 8), (40, 40, 30)):
        rows.append({"cls": "inline", "calls": n, "experts": e, "extra": 0, "waited": waited,
                     "ms": n * pc + e * pe + waited * pa})
    got = fit_cpu_lane(rows, W, 0.0)
    assert got == pytest.approx({"per_call_ms": pc, "per_layer_ms": pl, "per_expert_ms": pe,
                                 "per_extra_token_ms": 0.0, "per_after_wait_ms": pa}, rel=1e-6, abs=1e-9)
    assert "per_after_wait_ms" not in fit_cpu_lane([{**r, "waited": 0} for r in rows], W, 0.0)
    # absent from a fit, it plans as 0 whatever the engine record says (spec.LANE_ZERO_IF_ABSENT)
    assert "lane_overrides.cpu.per_after_wait_ms=0.0" in calibrate.term_overrides(
        {"host": {}, "fixed_ms": {"1": 1.0}, "cpu": {"per_layer_ms": 0.2}})


def test_a_lane_term_the_fit_did_not_make_is_zero_not_the_records():
    # the engine record carries a wake-up term; terms fitted without one (an older record, or no idle booked) must
    # not plan on it
    terms = {"host": {}, "fixed_ms": {"1": 1.0}, "cpu": {"per_layer_ms": 0.2, "per_expert_ms": 0.1}}
    over = calibrate.term_overrides(terms)
    assert "lane_overrides.cpu.per_wake_ms=0.0" in over and "lane_overrides.cpu.per_layer_ms=0.2" in over
    R = spec.resolve("tiny-ci-cpu", ['lane_overrides.cpu.per_wake_ms=0.5'] + over)
    assert R.lanes["cpu"].per_wake_ms == 0.0
    fitted = calibrate.term_overrides({**terms, "cpu": {**terms["cpu"], "per_wake_ms": 0.03}})
    assert "lane_overrides.cpu.per_wake_ms=0.03" in fitted and "lane_overrides.cpu.per_wake_ms=0.0" not in fitted


def test_cpu_lane_fit_counts_experts_in_cold_equivalents():
    from moetier.measure.bench import fit_cpu_lane
    pl, pe, W = 0.2, 0.3, 2
    rows = [{"cls": "split", "calls": 10, "experts": 40, "extra": 0, "cold": 40 * f,
             "ms": 10 * (pl + pe * 4 * f / W), "contended": 0} for f in (0.6, 0.8, 1.0)]
    got = fit_cpu_lane(rows, W, None)
    assert got["per_layer_ms"] == pytest.approx(pl, rel=1e-6) and got["per_expert_ms"] == pytest.approx(pe, rel=1e-6)


def test_fixed_time_splits_into_per_concurrency_per_read_and_per_zerocopy_call_parts():
    truth = {1: 0.4, 4: 0.9}
    u, z = 0.02, 0.07
    # cpu arms with and without reads, and a VRAM arm per concurrency whose zerocopy lane computes
    arms = [(c, r, 0.0, truth[c] + u * r) for c in (1, 4) for r in (0.0, 8.0, 20.0)]
    arms += [(1, 5.0, 2.0, truth[1] + u * 5 + z * 2), (4, 30.0, 16.0, truth[4] + u * 30 + z * 16)]
    fixed, per_read, per_zc = fit.fit_fixed(arms)
    assert fixed == {"1": pytest.approx(0.4, abs=1e-4), "4": pytest.approx(0.9, abs=1e-4)}
    assert per_read == pytest.approx(u) and per_zc == pytest.approx(z)
    # no zerocopy calls: that part is 0, the rest as before
    assert fit.fit_fixed(arms[:6])[2] == 0.0 and fit.fit_fixed(arms[:6])[1] == pytest.approx(u)
    # reads never vary at one concurrency: not identifiable, plain means
    assert fit.fit_fixed([(1, 5.0, 0, 0.5), (1, 5.0, 0, 0.7), (2, 0.0, 0, 0.6)]) == ({"1": 0.6, "2": 0.6}, 0.0,
                                                                                           0.0)


def test_channel_terms_are_means_by_engine_and_rows_with_idle_figures_beyond():
    skewed = [1.0] * 9 + [3.0]                      # p50 1.0, mean 1.2: the mean is what stalls add up to
    runs = [{"engine": "e", "conc": 1, "latency_by_qd": {1: skewed, 2: [2.0] * 3}, "wake_ms": [0.1] * 7 + [0.8]},
            {"engine": "e", "conc": 4, "latency_by_qd": {1: [2.0] * 8}, "wake_ms": [0.2] * 4},
            {"engine": "f", "conc": 1, "latency_by_qd": {}, "wake_ms": []}]
    got = fit_nvme.fit_channel(runs, {"1": 0.5, "2": 0.9, "8": 4.0})
    # depth 2 had 3 samples (< 8): the idle-disk figure stays; depth 8 never reached: idle too
    assert got["nvme_latency_by_rows_qd_ms"] == {"e": {"1": {"1": 1.2, "2": 0.9, "8": 4.0},
                                                       "4": {"1": 2.0, "2": 0.9, "8": 4.0}}}
    assert got["nvme_wake_ms_by_rows"] == {"e": {"1": pytest.approx(0.1875)}}   # rows 4: 4 samples, no entry
    assert got["nvme_latency_cv_shared_by_rows"] == {}                          # no bursts recorded


def one_run(samples):
    """(burst, q, ms) reads as the reader records them -> (run, burst, q, ms) of one runtime run."""
    return [(0, *x) for x in samples]


def test_spread_splits_into_what_a_bursts_reads_share_and_each_ones_own():
    # depth 1 mean 2.0, depth 2 mean 4.0; bursts of two reads late together by +-25%, and within each burst the
    # reads differ by +-10% about the burst's lateness
    samples = []
    for b, (shift, d) in enumerate([(0.25, 0.1), (-0.25, 0.1), (0.25, -0.1), (-0.25, -0.1)] * 3):
        samples += one_run([(b, 1, 2.0 * (1 + shift + d)), (b, 2, 4.0 * (1 + shift - d))])
    shared, own = fit_nvme.spread_split(samples, {1: 2.0, 2: 4.0})
    # total variance 0.25^2 + 0.1^2; within a burst (ddof 1): 2 x 0.1^2 / 1
    within = 2 * 0.1 ** 2
    assert own == pytest.approx(within ** 0.5)
    assert shared == pytest.approx((0.25 ** 2 + 0.1 ** 2 - within) ** 0.5)
    assert fit_nvme.spread_split(samples[:6], {1: 2.0, 2: 4.0}) is None            # fewer than 8 samples
    assert fit_nvme.spread_split(one_run((b, 1, 2.0) for b in range(9)), {1: 2.0}) is None   # no burst of two
    # through fit_channel: the runs' bursts stay apart (a burst id repeats across runs)
    runs = [{"engine": "e", "conc": 2, "latency_by_qd": {1: [s[3] for s in samples if s[2] == 1],
                                                          2: [s[3] for s in samples if s[2] == 2]},
             "burst_ms": samples}]
    got = fit_nvme.fit_channel(runs + runs)
    assert got["nvme_latency_cv_own_by_rows"] == {"e": {"2": pytest.approx(round(own, 4))}}
    assert got["nvme_latency_cv_shared_by_rows"] == {"e": {"2": pytest.approx(round(shared, 4))}}


def test_relative_lstsq_refits_the_others_when_a_cost_would_be_negative():
    from moetier.measure.bench import relative_lstsq
    # falling y: the unconstrained fit is 4 - x; clipping the slope at 0 would keep the intercept at 4. The best
    # non-negative fit is a constant: the relative least-squares mean sum(1/y) / sum(1/y^2)
    got = relative_lstsq([[1, 1], [1, 2], [1, 3]], [3.0, 2.0, 1.0])
    assert got == pytest.approx([(1 / 3 + 1 / 2 + 1) / (1 / 9 + 1 / 4 + 1), 0.0])
    assert relative_lstsq([[1, 0], [1, 1], [1, 2]], [1.0, 1.5, 2.0]) == pytest.approx([1.0, 0.5])   # exact: kept


def test_bench_rewrites_what_it_measures_and_keeps_the_vram_tier_it_does_not():
    from moetier.measure.bench import records
    q = {"gbps": 2.0, "latency_ms_p50": 0.9, "latency_ms_p90": 1.1}
    lane = {"per_layer_ms": 0.2, "per_call_ms": 0.03, "per_expert_ms": 0.3, "per_extra_token_ms": 0.1, "workers": 2,
            "parallel_min": 4, "weight_gbps_1row": 7.0, "encoding": "int8"}
    m = {"nvme_qd1": q, "nvme_qd16": {**q, "gbps": 3.0}, "cpu_lane": lane, "record_bytes": 1 << 20, "cores": 2,
         "nvme_latency_by_qd_ms": {"1": 0.9}, "nvme_cpu_ms_per_read": 0.3, "membw_read_gbps": 20.0, "machine": "vm"}
    old = spec.load_record("hardware", "local-cpu")
    hw, _ = records(m, "local-cpu", "numba-cpu", "now", old)
    assert hw["gpu"] == old["gpu"] and hw["nvme"]["cpu_ms_per_read"] == 0.3 and hw["source"] == "moetier bench now"
    spec.validate("hardware", hw, "hardware/local-cpu.json")
    assert "gpu" not in records(m, "x", "y", "now")[0]


def test_burst_means_by_size_and_position_and_the_spread_about_them():
    # bursts of one read take 1.0 ms; bursts of two take 2.0 and 2.2 (they share the device); one burst of two lost
    # a read and tells nothing
    samples = one_run((b, 1, 1.0) for b in range(8))
    samples += one_run((b, q, ms) for b in range(8, 16) for q, ms in ((1, 2.0), (2, 2.2)))
    samples += one_run([(99, 2, 7.0)])
    means = fit_nvme.burst_means(samples)
    assert means == {1: {1: 1.0}, 2: {1: pytest.approx(2.0), 2: pytest.approx(2.2)}}
    assert fit_nvme.burst_means(samples, min_n=9) == {}
    # about the burst means there is no spread left; about the depth means (q1 = 1.5) bursts look late together
    assert fit_nvme.spread_split(samples[:-1], {1: 1.5, 2: 2.2}, means) == (0.0, 0.0)
    # lateness -1/3 (bursts of one), +1/3 and 0 (bursts of two): total variance 2/27, within a burst 1/18
    shared, own = fit_nvme.spread_split(samples[:-1], {1: 1.5, 2: 2.2})
    assert own == pytest.approx((1 / 18) ** 0.5) and shared == pytest.approx((2 / 27 - 1 / 18) ** 0.5)


def test_a_runs_drift_is_not_lateness_within_a_layer():
    # two runs of the same bursts, the second 20% slower throughout: within each run there is no spread at all
    samples = [(run, b, q, ms * (1.0 if run == 0 else 1.2)) for run in (0, 1) for b in range(10)
               for q, ms in ((1, 2.0), (2, 3.0))]
    means = {1: 2.2, 2: 3.3}
    assert fit_nvme.spread_split(samples, means) == pytest.approx((0.0, 0.0), abs=1e-9)
    # the same reads named as bursts of one run: the second run's drift shows as lateness its bursts share
    as_one = [(0, run * 10 + b, q, ms) for run, b, q, ms in samples]
    shared, own = fit_nvme.spread_split(as_one, means)
    assert shared == pytest.approx(0.2 / 2.2, rel=1e-6) and own == pytest.approx(0.0, abs=1e-9)


def test_spread_is_winsorized_so_one_outlier_does_not_set_every_layers_width():
    samples = one_run((b, q, 1.0 + 0.1 * ((b + q) % 3 - 1)) for b in range(400) for q in (1, 2))
    base = fit_nvme.spread_split(samples, {1: 1.0, 2: 1.0})
    outlier = fit_nvme.spread_split(samples[:-1] + one_run([(399, 2, 36.0)]), {1: 1.0, 2: 1.0})
    assert outlier == pytest.approx(base, abs=0.01)


def test_an_arms_repeats_merge_into_their_middle_ones_summed():
    def run(tok_s, wall, reads, lat):
        return {"tok_s": tok_s, "wall_s": wall, "tokens": int(tok_s * wall), "steps": 10, "conc": 1, "engine": "e",
                "counters": {"reads": reads, "plan_s": wall / 10}, "call_groups": [["gpu", 1, 0, 0, reads, 0.1]],
                "latency_by_qd": {1: [lat]}, "wake_ms": [lat / 10], "burst_ms": [(0, 1, lat)]}
    runs = [run(50.0, 2.0, 7, 1.0), run(10.0, 3.0, 100, 9.0), run(40.0, 1.0, 3, 2.0), run(90.0, 1.0, 200, 8.0),
            run(45.0, 2.0, 5, 3.0)]
    m = calibrate._merge(runs)
    # the slowest (10 tok/s) and fastest (90) are dropped; the other three are summed and pooled
    assert m["repeats_kept"] == 3 and m["tok_s_each"] == [r["tok_s"] for r in runs]
    assert m["counters"]["reads"] == 15 and m["counters"]["plan_s"] == pytest.approx(0.5)
    assert m["wall_s"] == pytest.approx(5.0) and m["tokens"] == 100 + 40 + 90 and m["steps"] == 30
    assert m["tokens"] / m["wall_s"] == pytest.approx(46.0)
    assert m["call_groups"] == [["gpu", 1, 0, 0, 15, pytest.approx(0.3)]]
    assert sorted(m["latency_by_qd"][1]) == [1.0, 2.0, 3.0]
    assert sorted(ms for _, _, _, ms in m["burst_ms"]) == [1.0, 2.0, 3.0]
    assert len({run for run, *_ in m["burst_ms"]}) == 3                  # bursts stay apart by repeat
    two = calibrate._merge(runs[:2])                                     # too few to drop any
    assert two["repeats_kept"] == 2 and two["counters"]["reads"] == 107


def test_host_fit_recovers_per_read_and_per_nvme_layer_costs():
    true = {"per_layer_ms": 0.02, "per_pick_ms": 0.004, "per_read_ms": 0.03, "per_nvme_layer_ms": 0.1,
            "per_predict_ms": 0.05, "per_predict_row_ms": 0.04, "per_copy_ms": 0.06}

    def arm(conc, layers, picks, reads, nvme_layers, predict=0, copies=0):
        c = {"layer_calls": layers, "picks": picks, "masked": 0, "reads": reads, "nvme_layers": nvme_layers,
             "predict_layers": predict, "predict_rows": predict * conc, "copies": copies}
        ms = sum(true[k] * v for k, v in zip(spec.HOST_TIMED_TERMS, (layers, picks, reads, nvme_layers, predict,
                                                                     predict * conc, copies)))
        return {**c, "plan_s": ms / 1e3, "book_s": 0.0, "combine_s": 0.0, "predict_s": 0.0}, conc
    # the calibration's fit arms in shape: all-in-RAM, tails (reads per layer that reads grow with rows),
    # prefetch at two concurrencies, a VRAM tier with copies
    runs = [arm(1, 1600, 6400, 0, 0), arm(2, 800, 6150, 0, 0), arm(4, 400, 5630, 0, 0),
            arm(1, 1600, 6400, 850, 700), arm(2, 800, 6150, 990, 600), arm(4, 400, 5630, 1090, 380),
            arm(1, 1600, 6400, 660, 560, 1600), arm(4, 400, 5630, 800, 300, 400),
            arm(1, 1600, 6400, 550, 490, 0, 350), arm(4, 400, 5630, 740, 350, 0, 1215)]
    assert fit.fit_host(runs) == pytest.approx(true, rel=1e-6)
    # no arm reads: neither read term is identifiable beside the others, both 0
    got = fit.fit_host(runs[:3])
    assert got["per_nvme_layer_ms"] == 0.0 and got["per_layer_ms"] == pytest.approx(0.02, rel=1e-6)


def test_head_start_fit_recovers_per_layer_per_read_per_predict_and_per_row_costs():
    # known costs: 0.2 ms per read layer, 0.05 per read, 0.3 per layer that predicts and 0.1 per row it predicts for
    def arm(layers, reads, pred, rows=1):
        return {"read_layers": layers, "read_reads": reads, "read_predict": pred, "read_predict_rows": pred * rows,
                "read_head_s": (0.2 * layers + 0.05 * reads + 0.3 * pred + 0.1 * pred * rows) / 1e3}
    got = fit.fit_head([arm(100, 150, 0), arm(200, 500, 0), arm(300, 1200, 300), arm(50, 60, 0),
                              arm(250, 900, 200, 4)])
    assert got == pytest.approx({"head_per_layer_ms": 0.2, "head_per_read_ms": 0.05, "head_per_predict_ms": 0.3,
                                 "head_per_predict_row_ms": 0.1}, rel=1e-6)
    # predicting at one concurrency only: the per-row part is not identifiable, the per-layer one takes it all
    got = fit.fit_head([arm(100, 150, 0), arm(200, 500, 0), arm(300, 1200, 300), arm(50, 60, 0)])
    assert got["head_per_predict_ms"] == pytest.approx(0.4, rel=1e-6) and got["head_per_predict_row_ms"] == 0.0
    # no arm predicts: that term is 0, not a guess; no read layers at all: nothing to fit
    got = fit.fit_head([arm(100, 150, 0), arm(200, 500, 0)])
    assert got["head_per_predict_ms"] == 0.0 and got["head_per_layer_ms"] == pytest.approx(0.2, rel=1e-6)
    assert fit.fit_head([{"read_layers": 0, "read_head_s": 0.0}]) == {}


def test_head_start_per_read_is_fitted_per_engine():
    # the same host work per layer; a read costs 0.03 ms to submit on one backend and 0.08 on the other
    def arm(layers, reads, per_read):
        return {"read_layers": layers, "read_reads": reads, "read_head_s": (0.02 * layers + per_read * reads) / 1e3}
    engines = ["numba-cpu"] * 3 + ["sycl-opencl-cpu"] * 2
    got = fit.fit_head([arm(100, 150, 0.03), arm(200, 500, 0.03), arm(50, 60, 0.03),
                              arm(100, 120, 0.08), arm(300, 900, 0.08)], engines)
    assert got["head_per_read_ms_by_engine"] == pytest.approx({"numba-cpu": 0.03, "sycl-opencl-cpu": 0.08},
                                                              rel=1e-6)
    assert got["head_per_read_ms"] == pytest.approx(0.03, rel=1e-6)      # the engine most arms ran on
    assert got["head_per_layer_ms"] == pytest.approx(0.02, rel=1e-6)


def test_lane_lateness_is_the_measured_gap_spread_beyond_the_simulators(monkeypatch):
    """A fake simulator reports its own gap spread per arm; the fit pools the measured excess by engine and rows."""
    sim_sd = {1: 0.5, 2: 0.8}

    def fake_sim_run(R, tr, conc, max_steps, choose=None):
        return {"read_coverage": {"gap_sd_ms": sim_sd[conc]}}

    monkeypatch.setattr(calibrate.sim, "run", fake_sim_run)
    monkeypatch.setattr(calibrate, "arm_recipe", lambda rid, a, terms: None)

    def measured(conc, layers, gap_sd, eng="e"):
        n = layers        # landing - wait: mean 0.1 ms, sd gap_sd (the counters Runtime._wait_read books)
        return {"engine": eng, "conc": conc, "counters": {
            "read_layers": n, "read_latency_n": n, "read_span_s": n * 1.0e-3, "read_head_s": 0.0,
            "read_latency_s": n * 1.1e-3, "read_gap_sq": n * ((gap_sd * 1e-3) ** 2 + (0.1e-3) ** 2)}}
    arms = [{"name": "a", "conc": 1}, {"name": "b", "conc": 1}, {"name": "c", "conc": 2}, {"name": "d", "conc": 2}]
    m = {"a": measured(1, 100, 1.3), "b": measured(1, 300, 0.3), "c": measured(2, 200, 1.0),
         "d": measured(2, 10, 5.0)}            # d: too few read layers to set anything
    got = calibrate.fit_lane_lateness("r", None, arms, m, 10, {})
    # rows 1: a's excess 1.3^2 - 0.5^2 over 100 layers, b's is negative (0) over 300
    assert got["e"]["1"] == pytest.approx(math.sqrt(100 * (1.3 ** 2 - 0.25) / 400), abs=1e-4)
    assert got["e"]["2"] == pytest.approx(math.sqrt(1.0 - 0.64), abs=1e-4)
