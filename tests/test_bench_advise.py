"""benchmarks/bench_advise.py --phases: a rung-0 cell's seconds split by phase, the phases adding up to the cell."""
import importlib.util
from pathlib import Path

from moetier.measure import advise as A


def _bench():
    p = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_advise.py"
    s = importlib.util.spec_from_file_location("bench_advise", p)
    mod = importlib.util.module_from_spec(s)
    s.loader.exec_module(mod)
    return mod


def test_phases_add_up_to_the_cell_and_leave_the_core_as_it_was():
    from moetier.core import records as spec
    from moetier.core import sim
    from moetier.measure import sweep as S
    b = _bench()
    before = (sim.run, sim.Streams, sim._seed, spec.resolve, S._trace)
    doc = b.phases("tiny-local-cpu", 2, 2)
    assert (sim.run, sim.Streams, sim._seed, spec.resolve, S._trace) == before     # the timers are taken off
    assert (doc["measured_steps"], doc["warmup_tokens"]) == A.fidelities(150, 1000)[0]
    assert doc["warm_cells"] == 2
    for cell in (doc["first"], doc["warm_median"]):
        parts = [cell.get(k, 0.0) for k in b.PHASES]
        assert min(parts) >= 0 and cell["warm-up replay"] > 0 and cell["measured steps"] > 0
        # the phases are the cell: nothing large goes untimed, and nothing is counted twice
        assert 0.8 * cell["total"] <= sum(parts) <= cell["total"] * 1.001
