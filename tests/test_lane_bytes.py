"""Costs that follow the bytes: engine lane terms measured at one expert size scale to another model's, the
simulator then predicts a speed the hardware can deliver, and `moetier show` flags a lane faster than its hardware."""
import json
import shutil
from pathlib import Path

import pytest

from moetier.cli.main import main
from moetier.core import records as spec
from moetier.core import sim
from moetier.traces.gen import GenParams, generate

DATA = Path(__file__).parent / "data"
GLM = "glm53-rtx3090-55g-nvx4"


@pytest.fixture
def registry(tmp_path, monkeypatch):
    root = tmp_path / "registry"
    shutil.copytree(spec.REGISTRY, root, ignore=shutil.ignore_patterns("runs"))
    (root / "runs").mkdir()
    monkeypatch.setattr(spec, "REGISTRY", root)
    return root


def run(capsys, *argv):
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def test_lane_terms_scale_with_expert_bytes():
    eng = {"reads": "ram", "expert_bytes": 1000, "per_layer_ms": 0.5, "per_expert_ms": 0.2,
           "per_extra_token_ms": 0.04, "per_call_ms": 0.01}
    t = spec.lane_terms(eng, 4000, 4000)
    assert (t["per_expert_ms"], t["per_extra_token_ms"]) == pytest.approx((0.8, 0.16))
    assert (t["per_layer_ms"], t["per_call_ms"]) == (0.5, 0.01)           # dispatch terms do not scale
    assert spec.lane_terms({**eng, "expert_bytes": None}, 4000, 4000)["per_expert_ms"] == 0.2
    ln = spec.Lane(name="cpu", **t)
    assert ln.gbps == pytest.approx(4000 / 0.8e6)
    # the shipped GLM recipe runs the model its engines were measured on: nothing moves
    R = spec.resolve(GLM)
    assert R.lanes["cpu"].per_expert_ms == 0.104 and R.lanes["gpu"].per_expert_ms == 0.023
    assert not any(c["over"] for c in spec.lane_checks(R))


def _mixtral_recipe(capsys, registry, engines=("exllamav3-cuda", "avx2-exl3-cpu")):
    rc, out, _ = run(capsys, "model", "import", DATA / "mixtral-8x7b-fp8", "--bits", "8", "--id", "mixtral-8x7b-fp8")
    assert rc == 0, out
    rec = {"id": "mixtral-fp8-rtx3090", "status": "candidate", "model": "mixtral-8x7b-fp8",
           "hardware": "omarchy-rtx3090-nvx4", "engines": list(engines),
           "budget": {"ram_gb": 55, "runtime_gb": 4.0, "other_gb": 2.8, "vram_expert_slots": 100},
           "policy": {"vram": "clock", "ram": "exclusive", "ram_evict": "lru", "seed": "warmup", "warmup_tokens": 200,
                      "exact": "stall", "overlap": True,
                      "prefetch": {"depth": 0, "recall": 0.0, "predictor": "none", "budget": 8}},
           "calibration": {"fixed_ms": {"1": 14, "2": 20, "4": 30},
                           "prefill": {"chunk": 8192, "compute_ms_per_layer": 100.0, "first_request_ms": 0}}}
    spec.write_record("recipe", rec)
    return spec.resolve("mixtral-fp8-rtx3090")


def _bound_tok_s(R, res) -> float:
    """The fastest decode the hardware record allows for the lanes' traffic: each tier's expert bytes per token
    over its bandwidth (the lanes overlap, so the slowest tier bounds a token)."""
    hw, b = R.hardware, R.expert_bytes / 1e9                         # GB per expert
    picks = R.topk * R.layers
    cpu, zc, nv = res["cpu_experts_per_tok"], res["zerocopy_per_tok"], res["nvme_per_tok"]
    gpu = max(0.0, picks - cpu - zc - res["masked_per_tok"])
    s = max(gpu * b / hw["gpu"]["vram_bw_gbps"], cpu * b / hw["ceilings"]["ddr_practical_gbps"],
            zc * b / hw["ceilings"]["pcie_h2d_gbps"], nv * b / hw["nvme"]["bw_gbps"])
    return 1.0 / s


def test_mixtral_fp8_simulates_at_a_speed_its_hardware_can_deliver(capsys, registry):
    R = _mixtral_recipe(capsys, registry)
    assert R.expert_bytes == 3 * 4096 * 14336 + 4 * (2 * 14336 + 4096)       # int8 layout: FP8-sized experts
    assert not any(c["over"] for c in spec.lane_checks(R))
    tr = generate(GenParams(zipf_s=0.6), layers=R.layers, experts=R.experts, topk=R.topk, tokens=400, seed=1,
                  model_id=R.model_id)
    res = sim.run(R, tr, 1)
    bound = _bound_tok_s(R, res)
    assert 0 < res["tok_s"] <= bound, (res["tok_s"], bound)
    # the same recipe with the engines' terms left at GLM's 9.47 MB experts (the engine records before they said
    # what size they were measured at) predicts a decode the hardware cannot deliver
    for eid in ("exllamav3-cuda", "avx2-exl3-cpu"):
        p = registry / "engine" / f"{eid}.json"
        e = json.loads(p.read_text())
        for ln in e["lanes"].values():
            ln.pop("expert_bytes")
        p.write_text(json.dumps(e))
    R0 = spec.resolve("mixtral-fp8-rtx3090")
    assert any(c["over"] for c in spec.lane_checks(R0))
    res0 = sim.run(R0, tr, 1)
    assert res0["tok_s"] > _bound_tok_s(R0, res0) and res0["tok_s"] > 3 * res["tok_s"]


def test_show_flags_an_impossible_engine_record(capsys, registry):
    e = json.loads((registry / "engine" / "avx2-exl3-cpu.json").read_text())
    e["id"] = "impossible-cpu"
    e["lanes"]["cpu"]["per_expert_ms"] = 0.01           # 9.47 MB in 10 us: 947 GB/s from DDR4 (138 GB/s)
    spec.write_record("engine", e)
    r = json.loads((registry / "recipe" / f"{GLM}.json").read_text())
    r.update(id="glm-impossible", engines=["exllamav3-cuda", "impossible-cpu"])
    spec.write_record("recipe", r)
    rc, out, err = run(capsys, "show", "glm-impossible")
    assert rc == 0
    line = next(ln for ln in out.splitlines() if ln.strip().startswith("cpu ") and "GB/s" in ln)
    assert "947.40 GB/s" in line and "ABOVE" in line and "138" in line
    assert "warning: cpu at 947.40 GB/s is faster than the hardware record allows" in err
    rc, out, _ = run(capsys, "show", "glm-impossible", "--json")
    checks = {c["lane"]: c for c in json.loads(out)["lane_checks"]}
    assert checks["cpu"]["over"] and not checks["gpu"]["over"] and not checks["zerocopy"]["over"]
    # the shipped recipe is not flagged
    rc, out, err = run(capsys, "show", GLM)
    assert "ABOVE" not in out and "warning" not in err
