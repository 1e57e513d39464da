"""moetier.measure.bench_exl3: the cpu lane's EXL3 expert cost that `moetier bench` writes into its engine record."""
import copy

import pytest

pytest.importorskip("numba", reason="the EXL3 cpu kernel needs numba (the `cpu` extra)")

from moetier.core import records as spec  # noqa: E402
from moetier.measure import bench_exl3  # noqa: E402


def test_measure_shape_reports_consistent_one_core_figures():
    r = bench_exl3.measure_shape(256, 128, 3, rounds=1, mib=1)
    assert r["trellis_bytes"] == 3 * 256 * 128 * 3 // 8
    assert r["experts"] >= 2 and r["per_expert_ms"] > 0 and r["per_extra_token_ms"] >= 0
    assert r["gbps_per_core"] == pytest.approx(r["trellis_bytes"] / (r["per_expert_ms"] * 1e6))


def test_model_lanes_is_a_valid_engine_section_that_the_recipe_resolution_applies():
    measured = {mid: {"hidden": 1, "inter": 1, "K": 3, "experts": 2, "rounds": 1, "trellis_bytes": 1,
                      "per_expert_ms": 9.5 + i, "per_extra_token_ms": 0.5, "gbps_per_core": 1.0}
                for i, mid in enumerate(bench_exl3.EXL3_MODELS)}
    lanes = bench_exl3.model_lanes(measured, "2026-01-01T00:00:00+00:00")
    assert set(lanes) == set(bench_exl3.EXL3_MODELS)
    eng = copy.deepcopy(spec.load_record("engine", "numba-cpu"))
    eng["model_lanes"] = lanes
    spec.validate("engine", eng, "bench engine")           # raises on a field the schema refuses
    for i, mid in enumerate(bench_exl3.EXL3_MODELS):
        cpu = lanes[mid]["cpu"]
        assert cpu["per_expert_ms"] == 9.5 + i and cpu["per_extra_token_ms"] == 0.5
        assert "per_layer_ms" not in cpu                   # the lane's own layer cost stays
        assert spec.load_record("model", mid)["geometry"]["hidden"] > 0
