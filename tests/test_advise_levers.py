"""The lever study is one call of advise's what-if table: a fixed path of recipe overrides and hardware edits,
each a full replay, stacked on the ones before it but for a reference row; examples/levers.py is that call."""
import sys
from pathlib import Path

import pytest

from moetier.core import records as spec
from moetier.core import sim
from moetier.measure import advise as A
from moetier.measure import advise_report as AR
from moetier.measure import sweep as S

TINY = "tiny-ci-cpu"
STEPS = 20
PATH = [
    {"name": "reference: lru alone", "sets": ['policy.ram_evict="lru"'], "alone": True},
    {"name": "start", "sets": []},
    {"name": "+ no prefetch", "sets": ["policy.prefetch.depth=0"]},
    {"name": "+ two more drives", "hw": {"nvme_scale": 3.0}},
    {"name": "+ one RAM tier for all layers", "sets": ['policy.ram_partition="global"']},
    {"name": "a second gpu", "why": "not expressible"},
]
STACKED = [(['policy.ram_evict="lru"'], {}), ([], {}), (["policy.prefetch.depth=0"], {}),
           (["policy.prefetch.depth=0"], {"nvme_scale": 3.0}),
           (["policy.prefetch.depth=0", 'policy.ram_partition="global"'], {"nvme_scale": 3.0})]


def replay(sets, hw, conc):
    """The what-if replayed directly: resolve, edit the machine, simulate (no advise code but upgrade_recipe)."""
    R = A.upgrade_recipe(spec.resolve(TINY, spec.parse_overrides(["policy.seed=oracle"] + sets)), hw)
    return sim.run(R, S._trace(None, R), conc, max_steps=STEPS)["tok_s"]


@pytest.fixture(scope="module")
def table():
    return AR.upgrade_table(TINY, concs=(1, 2), steps=STEPS, upgrades=PATH, search=False, cumulative=True,
                            base_overrides=["policy.seed=oracle"], workers=1)


def test_each_row_is_its_what_ifs_stacked_on_the_ones_before(table):
    assert [u["name"] for u in table] == [u["name"] for u in PATH]
    for u, (sets, hw) in zip(table, STACKED):
        assert (u["sets"], u["hw"]) == (sets, hw)
        assert u["best"] == {c: replay(sets, hw, c) for c in (1, 2)}
        assert set(u["rows"]) == {1, 2} and "gain" not in u       # no base: nothing to gain over
    assert table[-1] == {"name": "a second gpu", "why": "not expressible"}


def test_the_path_changes_the_figures(table):
    # the stacked levers are not all the same replay: a table that ignored them would fail here
    assert len({tuple(u["best"].values()) for u in table if "best" in u}) >= 3


def test_a_ram_cap_is_a_budget_override_on_a_fixed_path():
    rows = AR.upgrade_table(TINY, concs=(1,), steps=STEPS, search=False, workers=1,
                            upgrades=[{"name": "more ram", "ram_gb": 0.05}], base_overrides=["policy.seed=oracle"])
    assert rows[0]["sets"] == ["budget.ram_gb=0.05"]
    assert rows[0]["best"][1] == replay(["budget.ram_gb=0.05"], {}, 1) != replay([], {}, 1)


def _levers():
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
    import levers
    return levers


def test_levers_example_is_one_call_of_the_table(monkeypatch, tmp_path):
    lv = _levers()
    calls = []
    real = AR.upgrade_table

    def spy(*a, **kw):
        calls.append(kw)
        return real(*a, **{**kw, "steps": STEPS, "workers": 1})
    monkeypatch.setattr(AR, "upgrade_table", spy)
    monkeypatch.setattr(lv, "RECIPE", TINY)
    monkeypatch.setattr(lv, "LEVERS", PATH[:5])
    rows = lv.study("oracle", concs=(1, 2))
    assert len(calls) == 1 and calls[0]["upgrades"] == PATH[:5] and calls[0]["search"] is False
    assert [r["lever"] for r in rows] == [u["name"] for u in PATH[:5]]
    for r, (sets, hw) in zip(rows, STACKED):
        assert r["overrides"] == sets + ["policy.seed=oracle"]
        assert r["tok_s"] == {str(c): replay(sets, hw, c) for c in (1, 2)}
        assert set(r["c1_ms"]) == {"fixed", "gpu", "cpu"} and r["nvme_per_tok"] >= 0
    from moetier.cli.plots import plot_levers      # matplotlib is a dependency: no skip
    assert Path(plot_levers(rows, tmp_path / "levers.png")).stat().st_size > 1000


def test_the_shipped_levers_are_valid_overrides_of_the_default_recipe():
    lv = _levers()
    for u in lv.LEVERS:
        spec.resolve(lv.RECIPE, spec.parse_overrides(u["sets"]))    # a bad path or value raises


def test_searched_upgrades_gain_over_the_advice_each_from_its_own_search():
    from moetier.measure import advise_space as space
    R = spec.resolve(TINY)
    lim, kw = space.limits(R), dict(concs=(1,), n=4, seed=3, steps=16)
    base = A.search(TINY, lim=lim, workers=1, **kw)
    ups = [{"name": "more ram", "ram_gb": lim.ram_gb * 2, "hw": {}}, {"name": "gpu", "why": "no"}]
    rows = AR.upgrade_table(TINY, base, lim=lim, upgrades=ups, workers=1, **kw)
    again = A.search(TINY, lim=space.Limits(lim.ram_gb * 2, lim.vram_reserve_gb, lim.lossy, lim.masked_cap),
                     workers=1, **kw)
    assert rows[0]["best"][1] == again["best"][1]["tok_s"]
    assert rows[0]["gain"][1] == again["best"][1]["tok_s"] - base["best"][1]["tok_s"]
    assert rows[0]["sets"] == [] and "rows" not in rows[0]        # the cap is a limit of the search, not a set
    assert rows[1] == {"name": "gpu", "why": "no"}


def test_cumulative_what_ifs_are_refused_with_a_search():
    with pytest.raises(ValueError, match="cumulative what-ifs are a fixed path"):
        AR.upgrade_table(TINY, concs=(1,), steps=STEPS, upgrades=PATH, search=True, cumulative=True)
