"""The core's parity suite: every shipped recipe x its trace x C1/C2/C4 x every replay of `moetier compare` gives
the plans, lane deals, tier contents after every step and tok/s figures recorded from the tree before the compiled
core (tests/parity/reference.json, written by `python -m tests.parity.record`; what a cell holds and its step cap are
in tests/parity/record.py). Compared exactly: a digest or an exact float that moves is a changed plan.

Where the simulator's compiled step loop (moetier.core.step_kernel) covers a cell, the cell is run a second time
without the plan hook, through that loop, and must give the same figures, counters and final tiers.

One test per recipe, so a failure names the recipe, and the message names every cell that parted and which of its
parts (deal, times, ledger, tok/s) did.
"""
import json

import pytest

from tests.parity import record

REF = json.loads(record.REFERENCE.read_text())
BY_RECIPE: dict = {}
for c in REF["cells"]:
    BY_RECIPE.setdefault(c["recipe"], []).append(c)


def test_reference_covers_the_shipped_recipes_and_caps():
    """The reference is of this suite's cap and holds every shipped recipe at every concurrency and row."""
    assert (REF["steps"], REF["warmup_tokens"], REF["concs"]) == (record.STEPS, record.WARMUP, list(record.CONCS))
    assert sorted(BY_RECIPE) == record.recipes()
    for rid, cells in BY_RECIPE.items():
        from moetier.core import records as spec
        names = [n for n, _ in record.rows(record.capped(spec.resolve(rid)))]
        assert sorted((c["row"], c["conc"]) for c in cells) == sorted((n, k) for n in names for k in record.CONCS)
    # the cap still makes the replacement policies decide: most cells evict from RAM or VRAM, or refuse
    busy = [c for c in REF["cells"] if sum(c["counters"].values())]
    assert len(busy) >= 0.9 * len(REF["cells"])


def _parted(ref: dict, got: dict) -> list:
    return [k for k in ("steps", "warm_steps", "deal", "times", "ledger", "tok_s", "ms_per_step", "counters")
            if ref[k] != got[k]]


_COMPILED = ("steps", "warm_steps", "tok_s", "ms_per_step", "counters", "final")


@pytest.mark.parametrize("rid", sorted(BY_RECIPE))
def test_recipe_replays_as_recorded(rid):
    """Each cell as recorded; and where the simulator's compiled step loop covers the cell, its run without the
    plan hook (the path `moetier table` and sweeps take) gives the same report figures, counters and final tiers."""
    ref = {record.cell_id(c): c for c in BY_RECIPE[rid]}
    bad = []
    for cell in record.grid([rid]):
        got = record.run_cell(*cell)
        parts = _parted(ref[record.cell_id(got)], got)
        try:
            fast = record.run_cell(*cell, compiled=True)
        except record.NotCompiled:
            fast = got
        parts += [f"compiled {k}" for k in _COMPILED if fast[k] != got[k]]
        if parts:
            bad.append(f"{record.cell_id(got)}: {', '.join(parts)}")
    assert not bad, f"{len(bad)} cells parted from tests/parity/reference.json:\n" + "\n".join(bad)
