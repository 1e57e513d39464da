"""The host cache model (moetier.core.llc) and the planner's use of it: known answers."""
import pytest

from moetier.core import records as spec
from moetier.core.ledger import Ledger
from moetier.core.llc import ReuseModel, reuse_model
from moetier.core.plan import plan_layer
from moetier.core.terms import PlanContext


def test_factor_interpolates_over_records_streamed_since_last_use():
    m = ReuseModel({"400": 0.5, "1200": 1.0}, record_bytes=100, keys=256)    # 4 records -> 0.5, 12 records -> 1.0
    assert m.factor(7) == 1.0                                      # never seen: cold
    m.touch([7])
    assert m.factor(7) == 0.5                                      # nothing streamed since: the nearest point
    m.touch(range(100, 108))                                       # 8 records streamed since 7
    assert m.factor(7) == pytest.approx(0.75)
    m.touch(range(200, 210))
    assert m.factor(7) == 1.0                                      # beyond the curve: its last value
    m.touch([7])
    assert m.factor(7) == 0.5                                      # a touch resets the distance
    with pytest.raises(ValueError):
        ReuseModel({}, 100, 64)


def test_planner_charges_a_recently_used_ram_pick_per_expert_times_its_factor():
    R = spec.resolve("tiny-ci-cpu", ["budget.ram_gb=1"])
    ctx = PlanContext.from_recipe(R)
    L = Ledger(R.keys, 0, R.keys, exclusive=True)
    L.seed([])
    picks = {0: 1}
    cold = plan_layer(ctx, L, picks, 0.0, None)
    m = ReuseModel({str(R.ram_expert_bytes): 0.5}, R.ram_expert_bytes, R.keys)
    m.touch([0])
    warm = plan_layer(ctx, L, picks, 0.0, None, m)
    pe = ctx.cpu[1]
    assert cold.cpu_cold == 1.0 and warm.cpu_cold == 0.5
    assert cold.cpu_ms - warm.cpu_ms == pytest.approx(0.5 * pe)


def test_reuse_model_comes_from_the_hardware_record_only_when_it_has_a_curve():
    R = spec.resolve("tiny-ci-cpu")
    R.hardware = {**R.hardware, "cpu": {**R.hardware.get("cpu", {}), "reuse_curve": {"1000000": 0.7}}}
    assert isinstance(reuse_model(R), ReuseModel)
    R.hardware = {**R.hardware, "cpu": {"name": "x"}}
    assert reuse_model(R) is None
