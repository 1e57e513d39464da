"""benchmarks/bench_advise.py: --phases (a rung-0 cell's seconds by phase, adding up to the cell) and --real (the
shipped recipe and each concurrency's advice run for real, paired by round)."""
import sys
from pathlib import Path

import pytest

from moetier.measure import advise as A

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import bench_advise as b  # noqa: E402


def test_phases_add_up_to_the_cell_and_leave_the_core_as_it_was(monkeypatch):
    from moetier.core import records as spec
    from moetier.core import replay, sim
    from moetier.measure import sweep as S
    timers = lambda: (sim.run, sim.Streams, sim._seed, spec.resolve, S._trace, replay.Streams._as_lists,  # noqa: E731
                      replay.Replay.begin_step)
    before = timers()
    per_layer = []
    layers = sim._layers
    monkeypatch.setattr(sim, "_layers", lambda *a: per_layer.append(1) or layers(*a))
    doc = b.phases("tiny-local-cpu", 2, 1)         # the warm cell: RAM FIFO, which the step loop covers
    assert timers() == before     # the timers are taken off
    assert per_layer == []        # timed on the path the search's cells take: the compiled step loop (sim.run)
    assert (doc["measured_steps"], doc["warmup_tokens"]) == A.fidelities(150, 1000)[0]
    assert doc["warm_cells"] == 1
    for cell in (doc["first"], doc["warm_median"]):
        parts = [cell.get(k, 0.0) for k in b.PHASES]
        assert min(parts) >= 0 and cell["warm-up replay"] > 0 and cell["measured steps"] > 0
        # the phases are the cell: nothing large goes untimed, and nothing is counted twice
        assert 0.8 * cell["total"] <= sum(parts) <= cell["total"] * 1.001


def test_real_runs_each_advice_at_its_own_concurrency_paired_by_round(tiny_ci_store, capsys):
    from moetier.core import records as spec
    rec = spec.load_record("recipe", "tiny-ci-cpu")
    for c in b.CONCS:        # an "advice" per concurrency: the start with one change each
        spec.write_record("recipe", {**rec, "id": f"mine-c{c}", "status": "what-if",
                                     "policy": {**rec["policy"], "ram_evict": "lfu"}})
    doc = b.real(tiny_ci_store, "mine", 1, 6, shipped_id="tiny-ci-cpu")
    for c in map(str, b.CONCS):
        s, a = doc["recipes"]["shipped"][c], doc["recipes"]["advised"][c]
        assert (s["recipe"], a["recipe"]) == ("tiny-ci-cpu", f"mine-c{c}")
        assert len(s["measured"]) == len(a["measured"]) == 1 and min(s["measured"] + a["measured"]) > 0
        assert s["inside"] == (s["sim_interval"]["low"] <= s["measured_median"] <= s["sim_interval"]["high"])
        p = doc["paired"][c]
        assert p["ratios"] == [a["measured"][0] / s["measured"][0]]
        assert p["predicted"] == a["sim_tok_s"] / s["sim_tok_s"]
    assert "round 1: mine-c4 done" in capsys.readouterr().err


def test_real_without_the_advice_is_one_line_before_any_run(tiny_ci_store):
    with pytest.raises(SystemExit) as e:
        b.real(tiny_ci_store, "nobody", 1, 6, shipped_id="tiny-ci-cpu")
    assert "nobody-c1" in str(e.value) and "moetier advise tiny-ci-cpu" in str(e.value)


def test_the_real_machine_tables_in_the_docs_are_advise_real_json():
    """docs/advise.md and benchmarks/advise.md quote the --real run: every row is what bench_advise prints from
    benchmarks/advise-real.json, so a rerun that is not copied into both fails here."""
    import json
    root = Path(__file__).resolve().parents[1]
    measured, paired = b.real_rows(json.loads((root / "benchmarks" / "advise-real.json").read_text()))
    assert len(measured) == 6 and len(paired) == 3
    for doc in ("docs/advise.md", "benchmarks/advise.md"):
        lines = (root / doc).read_text(encoding="utf-8").splitlines()
        missing = [r for r in measured + paired if r not in lines]
        assert not missing, f"{doc}: rows not in benchmarks/advise-real.json's run: {missing}"
