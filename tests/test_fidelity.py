"""Prediction terms from `moetier bench` with their spread, and the prediction intervals made from them."""
from __future__ import annotations

import dataclasses

import pytest

import numba  # noqa: F401  (the cpu extra: a missing install fails, it does not skip)

from moetier.bytes import store
from moetier.core import interval
from moetier.core import records as spec
from moetier.core import sim
from moetier.measure import bench, bench_terms
from moetier.traces.format import load_trace
from moetier.cli.common import find_path


@pytest.fixture(scope="module")
def ci():
    R = spec.resolve("tiny-ci-cpu")
    return R, load_trace(find_path(R.trace), layers=R.layers, experts=R.experts, topk=R.topk)


def test_spread_of_is_relative_to_the_written_value():
    s = bench_terms.spread_of([0.9, 1.0, 1.1, 1.0, 1.0], 1.0)
    assert s["n"] == 5 and s["rel_p10"] < 1.0 < s["rel_p90"] and s["rel_sd"] == pytest.approx(0.0707, abs=1e-3)
    assert bench_terms.spread_of([2.0, 2.0, 2.0], 4.0)["rel_p10"] == pytest.approx(0.5)
    assert bench_terms.spread_of([1.0, 2.0], 1.0) is None              # fewer than 3 repetitions
    assert bench_terms.spread_of([1.0, 2.0, 3.0], 0.0) is None          # a 0 term has nothing to scale


def test_corners_scale_every_cost_term_and_leave_the_recipe_alone(ci):
    R, _ = ci
    slow, fast = interval.corner(R, "slow"), interval.corner(R, "fast")
    lo, hi = interval.DEFAULT_REL
    assert slow.lanes["cpu"].per_expert_ms == pytest.approx(R.lanes["cpu"].per_expert_ms * hi)
    assert fast.lanes["cpu"].per_expert_ms == pytest.approx(R.lanes["cpu"].per_expert_ms * lo)
    assert slow.fixed_ms[1] == pytest.approx(R.fixed_ms[1] * hi)
    assert slow.host["per_layer_ms"] == pytest.approx(R.host["per_layer_ms"] * hi)
    tab, stab = R.engines[-1]["nvme_latency_by_rows_qd_ms"], slow.engines[-1]["nvme_latency_by_rows_qd_ms"]
    assert stab["1"]["1"] == pytest.approx(tab["1"]["1"] * hi)
    assert R.engines[-1]["nvme_latency_by_rows_qd_ms"] is tab and tab["1"]["1"] != stab["1"]["1"]
    with pytest.raises(ValueError):
        interval.corner(R, "middle")


def test_interval_brackets_the_point_and_uses_the_recorded_spread(ci):
    R, tr = ci
    point = sim.run(R, tr, 2, max_steps=40)["tok_s"]
    iv = interval.interval(R, sim.run, tr, 2, max_steps=40)
    assert iv["basis"] == "default" and iv["low"] < point < iv["high"]
    assert interval.inside(point, iv) and not interval.inside(iv["high"] * 1.01, iv)
    # a record with a measured spread: that spread, and the median one for the terms it lacks
    narrow = {"n": 5, "rel_p10": 0.99, "rel_p90": 1.01}
    eng = {**R.engines[-1], "term_spread": {"cpu.per_expert_ms": narrow, "nvme_latency": narrow}}
    Rn = dataclasses.replace(R, engines=[*R.engines[:-1], eng])
    got, default, basis = interval.spreads(Rn)
    assert basis == "measured" and default == (0.99, 1.01) and got["cpu.per_expert_ms"] == (0.99, 1.01)
    ivn = interval.interval(Rn, sim.run, tr, 2, max_steps=40)
    assert ivn["basis"] == "measured" and iv["low"] < ivn["low"] < point < ivn["high"] < iv["high"]


@pytest.fixture(scope="module")
def ci_store_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("fidelity") / "store"
    store.pack(spec.resolve("tiny-ci-cpu").model, str(d))
    return str(d)


@pytest.fixture(scope="module")
def ci_store(ci_store_dir):
    return store.open_store(ci_store_dir)


def test_bench_measures_the_prediction_terms_with_their_spread(ci_store, ci, user_registry):
    _, tr = ci
    idle = {"1": 0.5, "2": 1.0}
    terms = bench_terms.prediction_terms(ci_store, "tiny-ci-cpu", tr, rounds=3, idle_latency=idle)
    lane, ch, host = terms["lane"], terms["channel"], terms["host"]
    assert lane["per_expert_ms"] > 0 and lane["calls"] == 3 * len(bench_terms.LaneGrid.EXPERTS) * 3 * 3
    assert "cpu.per_expert_ms" in lane["spread"] and lane["spread"]["cpu.per_expert_ms"]["n"] == 3
    tab = ch["tables"]["nvme_latency_by_rows_qd_ms"]
    assert set(tab) == {"1", "2", "4"} and all(t["1"] > 0 for t in tab.values())
    assert ch["tables"]["nvme_latency_by_rows_burst_ms"] and ch["spread"]["nvme_latency"]["n"] == 3
    # the depth table is the burst sizes' means in the proportions the recipe's runtime issues them
    R = spec.resolve("tiny-ci-cpu")
    for rows in ("1", "4"):
        bursts = {int(n): {int(q): v for q, v in row.items()}
                  for n, row in ch["tables"]["nvme_latency_by_rows_burst_ms"][rows].items()}
        want = bench_terms.mix_weighted(bursts, bench_terms.burst_mix(R, tr, int(rows)))
        assert want and all(tab[rows][str(q)] == pytest.approx(v, abs=1e-4) for q, v in want.items())
    # non-negative by construction (>= 0 could not fail); all zeros is the fit's answer when nothing fits, and the
    # host's planning and combining of one tiny layer take well under 10 ms
    assert 0 < host["host"]["per_layer_ms"] + host["host"]["per_pick_ms"] < 10 and set(host["fixed_ms"]) == {"1", "4"}
    m = {"nvme_qd1": {"gbps": 1.0, "latency_ms_p50": 0.5, "latency_ms_p90": 0.9}, "nvme_qd16": {"gbps": 2.0},
         "nvme_latency_by_qd_ms": idle, "cpu_lane": lane, "channel": ch, "host": host, "recipe": "tiny-ci-cpu",
         "nvme_cpu_ms_per_read": 0.2, "membw_read_gbps": 10.0, "record_bytes": ci_store.record_bytes, "cores": 2,
         "machine": "m", "llc_bytes": 1 << 20}
    hw, eng = bench.records(m, "bench-test", "bench-test-engine", "now")
    rec = bench.recipe_record(m, "tiny-ci-cpu", "tiny-ci-cpu-bench", "bench-test", "bench-test-engine", "now")
    assert set(eng["term_spread"]) >= {"cpu.per_expert_ms", "nvme_latency"}
    assert rec["calibration"]["host"]["per_pick_ms"] == round(host["host"]["per_pick_ms"], 6)
    # all three written together: the recipe names records written beside it
    spec.write_records([("hardware", hw), ("engine", eng), ("recipe", rec)])
    Rb = spec.resolve("tiny-ci-cpu-bench")
    assert Rb.hardware_id == "bench-test" and Rb.engines[-1]["id"] == "bench-test-engine"
    assert interval.interval(Rb, sim.run, tr, 1, max_steps=20)["basis"] == "measured"


def test_burst_mix_is_the_recipes_reads_per_layer(ci):
    R, tr = ci
    one, four = bench_terms.burst_mix(R, tr, 1), bench_terms.burst_mix(R, tr, 4)
    assert sum(one.values()) == pytest.approx(1.0) and sum(four.values()) == pytest.approx(1.0)
    assert max(one, key=one.get) == 1 and max(one) < max(four)        # more rows, more distinct experts to read
    assert sum(n * w for n, w in one.items()) < sum(n * w for n, w in four.items())
    allram = round(R.keys * R.ram_expert_bytes / 1e9 * 1.05 + 0.01, 3)
    assert bench_terms.burst_mix(spec.resolve("tiny-ci-cpu", [f"budget.ram_gb={allram}"]), tr, 1) == {}


def test_depth_table_and_wake_follow_the_mix_not_the_bench_sizes():
    by_burst = {1: {1: 1.0}, 2: {1: 2.0, 2: 2.2}, 4: {1: 4.0, 2: 4.0, 3: 4.0, 4: 4.0}}
    # size 3 is in the mix but not measured, size 4 measured but not in the mix: neither counts
    got = bench_terms.mix_weighted(by_burst, {1: 0.7, 2: 0.2, 3: 0.1})
    assert got == {1: pytest.approx((0.7 * 1.0 + 0.2 * 2.0) / 0.9), 2: pytest.approx(2.2)}
    assert bench_terms.mix_weighted(by_burst, {4: 1.0}) == {q: 4.0 for q in (1, 2, 3, 4)}
    # wake: the mix's wake ms per burst over its blocked waits per burst
    wakes = {1: [10, 5, 0.5], 2: [10, 20, 4.0]}
    assert bench_terms.mix_wake(wakes, {1: 0.5, 2: 0.5}) == pytest.approx((0.025 + 0.2) / (0.25 + 1.0))
    assert bench_terms.mix_wake(wakes, {3: 1.0}) is None


def test_a_recipe_naming_an_unwritten_record_writes_nothing(user_registry):
    rec = {**spec.load_record("recipe", "tiny-ci-cpu"), "id": "orphan", "hardware": "not-there"}
    with pytest.raises(Exception, match="not-there"):
        spec.write_records([("recipe", rec)])
    assert not (user_registry / "recipe" / "orphan.json").exists()


def test_quick_arms_are_the_fit_arms_without_a_vram_tier():
    from moetier.measure import calibrate
    R = spec.resolve("tiny-local-cpu")
    arms = calibrate.quick_arms(R)
    assert [a["name"] for a in arms] == ["allram-C1", "allram-C2", "allram-C4", "tail-C1", "tail-C2", "tail-C4",
                                         "tail-prefetch-C1", "tail-prefetch-C4"]
    assert all(a["fit"] and "backend" not in a for a in arms)
    # every concurrency the tables are read at is fitted, with and without reads, and prediction at two
    assert {a["conc"] for a in arms if a["name"].startswith("tail-C")} == {1, 2, 4}
    assert {a["conc"] for a in arms if "prefetch" in a["name"]} == {1, 4}
    # a shorter warm-up than the recipe's, in every arm's set: the simulator checks the arm with the same one
    assert int(R.policy["warmup_tokens"]) > calibrate.QUICK["warmup_tokens"]
    assert all(f"policy.warmup_tokens={calibrate.QUICK['warmup_tokens']}" in a["set"] for a in arms)
    assert all("policy.warmup_tokens=" not in " ".join(a["set"]) for a in calibrate.quick_arms(R, None))
    assert calibrate.held_out(arms) == []


def test_the_lane_grid_pools_its_calls_per_cell_before_the_fit():
    """Single calls fitted one by one under relative least squares weigh a delayed call by 1 / its time, so the fit
    follows the fastest calls; pooled per cell, the fit gives the mean cost the runtime's summed calls give."""
    from moetier.measure.bench import fit_cpu_lane
    calls = []
    for n in (1, 2, 3):                                      # inline calls: 0.1 + 0.2 ms per expert, one in four x3
        for i in range(8):
            calls.append({"cls": "inline", "calls": 1, "experts": n, "extra": 0, "rows": 1, "idle_ms": 0.0,
                          "ms": (0.1 + 0.2 * n) * (3.0 if i % 4 == 0 else 1.0)})
    pooled = bench_terms.pool_calls(calls)
    assert len(pooled) == 3 and sum(c["calls"] for c in pooled) == 24
    mean = {n: (0.1 + 0.2 * n) * 1.5 for n in (1, 2, 3)}   # (3 + 1 + 1 + 1) / 4
    fit = fit_cpu_lane(pooled, 2)
    assert fit["per_call_ms"] + fit["per_expert_ms"] * 2 == pytest.approx(mean[2], rel=1e-6)
    single = fit_cpu_lane(calls, 2)
    assert single["per_call_ms"] + single["per_expert_ms"] * 2 < 0.8 * mean[2]


def test_calibrate_quick_runs_its_arms_and_prints_without_held_out_arms(ci_store_dir, capsys, user_registry):
    from moetier.cli.main import main
    rc = main(["calibrate", "tiny-ci-cpu", "--store", ci_store_dir, "--quick", "--steps", "2",
               "--repeats", "1", "--no-write"])
    out = capsys.readouterr().out
    assert rc == 0 and "held-out max n/a over 8 arms" in out
    assert "tail-prefetch-C4" in out and "vram" not in out and "tail-mask-C1" not in out


def test_sim_prints_the_interval_and_table_only_when_asked(capsys):
    import json
    from moetier.cli.main import main
    assert main(["sim", "tiny-ci-cpu", "--conc", "1", "--steps", "10", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["interval"]["low"] <= d["tok_s"] <= d["interval"]["high"] and d["interval"]["basis"] == "default"
    assert main(["sim", "tiny-ci-cpu", "--conc", "1", "--steps", "10", "--json", "--no-interval"]) == 0
    assert "interval" not in json.loads(capsys.readouterr().out)
    assert main(["table", "tiny-ci-cpu", "--conc", "1"]) == 0
    plain = capsys.readouterr().out
    assert main(["table", "tiny-ci-cpu", "--conc", "1", "--interval"]) == 0
    with_iv = capsys.readouterr().out
    assert "interval" not in plain and "tok/s interval" in with_iv
    row = next(ln for ln in plain.splitlines() if ln.startswith("| C1 |"))
    assert next(ln for ln in with_iv.splitlines() if ln.startswith("| C1 |")).startswith(row[:-1])


def test_the_lane_grid_idles_the_worker_before_split_calls_only():
    """The idle is the split worker's (per_wake), counted from the last split call as the runtime books it; inline
    calls run right after the previous call, as the runtime's host makes them."""
    import types

    class FakeBackend:
        workers, parallel_min = 2, 4

        def compute(self, lane, jobs, x):
            return {}
    grid = bench_terms.LaneGrid(FakeBackend(), types.SimpleNamespace(hidden=8), 16, rows=(1,), calls=4)
    grid.round()
    calls = grid.samples[0]
    inline = [c for c in calls if c["cls"] == "inline"]
    split = [c for c in calls if c["cls"] == "split"]
    assert inline and split and all(c["idle_ms"] == 0.0 for c in inline)
    assert {c["idle_ms"] for c in split} == set(bench_terms.LaneGrid.IDLE_MS)
    assert all(c["wake"] >= spec.idle_wake(c["idle_ms"]) for c in split)
