"""benchmarks/bench_core.py's paired whole runs: interleaved sides, the same statistic, ratios B / A, and the
sweep's per-cell scaling (the runs themselves are faked here: they are minutes of real commands)."""
import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

import bench_core  # noqa: E402


def test_runs_alternate_the_sides_and_give_ratios_of_the_same_statistic(monkeypatch):
    calls = []
    fake_seconds = {"A": [4.0, 6.0, 5.0], "B": [1.0, 3.0, 2.0]}

    def fake_whole_run(tree, measure, a):
        calls.append((measure, tree))
        return fake_seconds[tree].pop(0) if measure == "table" else 100.0

    monkeypatch.setattr(bench_core, "whole_run", fake_whole_run)
    a = argparse.Namespace(sweep_cells=80, compare_steps=40, compare_warmup=100, compare_gap=False)
    out = bench_core.bench_runs({"A": "A", "B": "B"}, ["table", "sweep"], 3, a)
    # round 0 runs A first, round 1 B first, round 2 A first: every measure in turn within a round
    assert [t for m, t in calls if m == "table"] == ["A", "B", "B", "A", "A", "B"]
    t = out["table"]
    assert (t["A"]["min"], t["A"]["median"], t["A"]["max"]) == (4.0, 5.0, 6.0)
    assert t["ratio_b_over_a"] == {"median": 2.0 / 5.0, "min": 1.0 / 4.0}
    assert out["sweep"]["B"]["per_cell_s"] == 100.0 / 80 and out["sweep"]["cells"] == 80


def test_targets_are_the_issue_goals():
    per_call = {"together_us": {"median": 10.0}}
    runs = {"sim": {"B": {"median": 299_999.0}}, "table": {"B": {"median": 2.0}}}
    assert bench_core.targets(per_call, runs, "B") == {"plan_and_bookkeeping_median_us<=10": True,
                                                       "sim_layer_plans_per_s>=300000": False,
                                                       "table_warm_s<=2": True}


def test_sweep_grid_has_the_cells_asked_for():
    args = bench_core._sweep_grid(200)
    ram = next(x for x in args if x.startswith("budget.ram_gb="))
    assert len(ram.split("=")[1].split(",")) * 5 * 2 * 4 == 200


def test_core_md_quotes_the_recorded_run(capsys):
    """benchmarks/core.md's tables are what bench_core.py prints from benchmarks/core.json (the run it records), so a
    rerun that is not copied into both fails here."""
    import json
    bench = Path(bench_core.__file__).parent
    bench_core._print_extra(json.loads((bench / "core.json").read_text()), False)
    printed = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith(("|", "A = ", "paired"))]
    md = (bench / "core.md").read_text().splitlines()
    assert len(printed) > 10
    assert [ln for ln in printed if ln not in md] == []


def test_the_per_call_ab_runs_each_side_in_its_own_process_alternating(monkeypatch):
    """bench_against: rounds flip the sides' order, each figure is the min / median / max of the rounds' medians,
    and the plans' digests must agree across every run (the runs are faked: each is seconds of real planning)."""
    calls = []
    medians = {"A": [30.0, 10.0, 20.0], "B": [5.0, 6.0, 4.0]}

    def fake_side(tree, a):
        side = "A" if tree == "A" else "B"
        calls.append(side)
        m = medians[side].pop(0)
        fig = {"min": 1.0, "median": m, "max": 99.0}
        return {"plan_us": fig, "bookkeeping_us": fig, "together_us": fig, "calls": 8,
                "plans": "x" if side == "B" or len(calls) < 5 else "y"}

    monkeypatch.setattr(bench_core, "REPO", "B")
    a = argparse.Namespace(rounds=3)
    out = bench_core.bench_against("A", a, run=fake_side)
    assert calls == ["A", "B", "B", "A", "A", "B"]
    assert out["A"]["together_us"] == {"min": 10.0, "median": 20.0, "max": 30.0}
    assert out["B"]["together_us"] == {"min": 4.0, "median": 5.0, "max": 6.0}
    assert out["ratio_b_over_a"] == 5.0 / 20.0
    assert out["same_plans"] is False                 # the fifth run (A, round 3) planned otherwise


def test_the_commit_profile_replays_the_same_commits_and_splits_off_the_crossing():
    """--commit-profile: a real short run; the replayed commits must leave the run's tiers (else it exits), the
    plans' commits cost more than a plan with no picks, and the tiers' work per call is counted."""
    R, tr = bench_core.default_recipe()
    res = bench_core.bench_commit(R, tr, calls=300)
    assert res["calls"] >= 300
    assert 0 < res["commit_empty_us"]["median"] < res["commit_alone_us"]["median"]
    assert res["vram_evictions"] > 0 and res["ram_evictions"] > 0
    assert 25 < sum(res["lanes"].values()) < 40            # about 31 picks a layer call at C4
