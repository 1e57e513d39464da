"""Plan parity: on the backend's CI recipe and a fixed trace, runtime.run's lane decisions equal sim.run's, and a
repeated runtime run gives bit-identical outputs."""
from __future__ import annotations

from conformance.conftest import FenceBound, close_within, runtime_backend
from moetier.run import runtime
from moetier.core import sim

STEPS = 10
CONC = 2


def _lanes(plan):
    return {k: sorted(v) for k, v in plan.lanes().items()}


def test_plan_parity_with_simulator(recipe_env, backend_name):
    rid, R, st, tr = recipe_env
    got, want = [], []
    be = runtime_backend(backend_name, R, st, conc=CONC)
    try:
        run = FenceBound(be)
        r1 = runtime.run(R, st, run, tr, CONC, max_steps=STEPS, plan_hook=lambda s, l, p: got.append((s, l, _lanes(p))))
        r2 = runtime.run(R, st, run, tr, CONC, max_steps=STEPS)
    finally:
        close_within(be)
    sim.run(R, tr, CONC, max_steps=STEPS, plan_hook=lambda s, l, p: want.append((s, l, _lanes(p))))
    assert len(got) == len(want), f"runtime planned {len(got)} layers, the simulator {len(want)}"
    for g, w in zip(got, want):
        assert g == w, f"{rid} step {g[0]} layer {g[1]}: runtime {g[2]} != simulator {w[2]}"
    used = sorted({lane for _, _, p in got for lane, ks in p.items() if ks})
    assert used, "no lane was used"
    assert r1["digests"] == r2["digests"], "two runtime runs of the same recipe gave different outputs"
