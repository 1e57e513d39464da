"""moetier.core.records: shipped records, derived index, capacities, lanes, fixed(), overrides, every bad-input
path."""

import json
import shutil

import jsonschema
import pytest

from moetier.core import records as spec
from moetier.errors import UserError

GLM = "glm53-rtx3090-55g-nvx4"


@pytest.fixture
def reg(tmp_path):
    """A private copy of the registry to break."""
    root = tmp_path / "registry"
    shutil.copytree(spec.REGISTRY, root)
    return root


def _edit(root, kind, rid, fn):
    path = root / kind / f"{rid}.json"
    rec = json.loads(path.read_text())
    fn(rec)
    path.write_text(json.dumps(rec))
    return path


def _raises(fn, *needles):
    with pytest.raises(UserError) as ei:
        fn()
    msg = str(ei.value)
    for n in needles:
        assert n in msg, f"{n!r} not in {msg!r}"
    assert "\n" not in msg
    return msg


# ---------------------------------------------------------------------------------------------------------------------
# shipped records


def test_schemas_are_valid_draft_2020_12():
    for kind in spec.KINDS:
        schema = json.loads((spec.REGISTRY / "schema" / f"{kind}.schema.json").read_text())
        jsonschema.Draft202012Validator.check_schema(schema)


def test_every_shipped_record_validates_and_ids_match_files():
    allrec = spec.load_all()
    assert set(allrec) == set(spec.KINDS)
    for kind, recs in allrec.items():
        for rid, rec in recs.items():
            assert rec["id"] == rid
            assert spec.load_record(kind, rid) == rec
    published = {"recipe": {"glm53-rtx3090-55g-nvx4", "glm53-rtx3090-55g-nvx4-cold2b", "glm53-rtx5070-20g-nvme1",
                            "qwen38fn-arcb70-32g-nvx4", "qwen38fn-arcb70-16g-nvx4"},
                 "engine": {"exllamav3-cuda", "avx2-exl3-cpu", "exl3xpu-arc"},
                 "hardware": {"omarchy-rtx3090-nvx4", "omarchy-arcb70-nvx4", "omarchy-rtx5070-ddr5-nvme1"},
                 "model": {"glm-5.3-flash-exl3-3.05bpw", "qwen3.8-flash-next-exl3-3.05bpw"}}
    for kind, ids in published.items():
        assert ids <= set(allrec[kind]), (kind, ids - set(allrec[kind]))


def test_every_shipped_recipe_resolves_with_full_policy():
    for rid in spec.index()["recipe"]:
        R = spec.resolve(rid)
        p = R.raw["policy"]
        for key in ("vram", "ram", "ram_evict", "seed", "warmup_tokens", "exact", "overlap", "prefetch"):
            assert key in p, (rid, key)
        assert set(p["prefetch"]) == {"depth", "recall", "predictor", "budget"}
        assert R.policy["ram"] == "exclusive" and R.policy["seed"] == "warmup" and R.policy["warmup_tokens"] >= 1
        assert (spec.REGISTRY.parent / R.trace).exists(), (rid, R.trace)
        json.dumps(R.summary(), default=str)


def test_index_is_derived_from_files(reg):
    assert not (spec.REGISTRY / "index.json").exists()
    idx = spec.index()
    assert idx["recipe"] == sorted(idx["recipe"])
    assert {r["id"] for r in idx["recipes"]} == set(idx["recipe"])
    assert {"id": GLM, "status": "candidate", "model": "glm-5.3-flash-exl3-3.05bpw",
            "hardware": "omarchy-rtx3090-nvx4"} in idx["recipes"]
    # a new file shows up, a removed one disappears
    _edit(reg, "recipe", GLM, lambda r: None)
    (reg / "recipe" / "aaa-copy.json").write_text(
        (reg / "recipe" / f"{GLM}.json").read_text().replace(f'"{GLM}"', '"aaa-copy"'))
    (reg / "recipe" / "glm53-rtx5070-20g-nvme1.json").unlink()
    idx2 = spec.index(reg)
    assert idx2["recipe"][0] == "aaa-copy" and "glm53-rtx5070-20g-nvme1" not in idx2["recipe"]


# ---------------------------------------------------------------------------------------------------------------------
# capacities and lanes


def test_showcase_capacity():
    R = spec.resolve(GLM)
    assert (R.keys, R.expert_bytes) == (12096, 9474048)
    assert (R.vram_slots, R.ram_slots, R.nvme_only) == (1510, 5087, 5499)
    assert (R.h2d_gbps, R.nvme_bw_gbps, R.nvme_bw_qd1_gbps, R.nvme_latency_ms) == (23.5, 24.0, 12.6, 0.12)
    assert R.prefill == {"chunk": 8192, "compute_ms_per_layer": 176.35, "first_request_ms": 4130.0}


@pytest.mark.parametrize("ram_gb,slots", [(16, 971), (20, 1393), (55, 5087), (230, 12096), (5, 0)])
def test_ram_slots_for_budgets(ram_gb, slots):
    assert spec.resolve(GLM, [("budget.ram_gb", ram_gb)]).ram_slots == slots


def test_published_derived_capacities():
    assert spec.resolve("glm53-rtx3090-55g-nvx4-cold2b").ram_slots == 7616
    assert spec.resolve("glm53-rtx5070-20g-nvme1").ram_slots == 1393
    all_ram = spec.resolve(GLM, ["budget.ram_gb=230"])
    assert all_ram.ram_slots == all_ram.keys and all_ram.nvme_only == 0
    # 223.2e9 / 9,474,048 = 23,559.1 (the digest rounds this to "23,558"); either way far above 12,096 keys
    assert spec.ram_slots_for(230, 4.0, 2.8, 9474048, 10**9) == 23559
    for nbytes, slots in ((8425472, 5720), (7077888, 6809), (6328320, 7616)):
        assert spec.resolve(GLM, [("tiers.ram_expert_bytes", nbytes)]).ram_slots == slots


def test_lane_assembly_model_lanes_and_overrides():
    R = spec.resolve(GLM)
    assert list(R.lanes) == ["gpu", "zerocopy", "cpu"]
    assert R.lanes["cpu"] == spec.Lane("cpu", "ram", 0.145, 0.104, 0.040)
    assert R.lanes["gpu"].reads == "vram"
    cold = spec.resolve("glm53-rtx3090-55g-nvx4-cold2b")
    assert cold.lanes["zerocopy"].per_expert_ms == 0.254
    assert (cold.ram_expert_bytes, cold.nvme_expert_bytes, cold.expert_bytes) == (6328320, 6328320, 9474048)
    # exl3xpu-arc model_lanes for GLM apply when the recipe runs GLM on it
    glm_arc = spec.resolve(GLM, ['engines=["exl3xpu-arc"]'])
    assert glm_arc.lanes["gpu"] == spec.Lane("gpu", "vram", 0.010, 0.0215, 0.020)
    assert glm_arc.lanes["zerocopy"] == spec.Lane("zerocopy", "ram", 0.0, 0.41, 0.40)
    qwen = spec.resolve("qwen38fn-arcb70-32g-nvx4")
    assert qwen.lanes["gpu"] == spec.Lane("gpu", "vram", 0.031, 0.0043, 0.0042)


def test_lane_cost():
    lane = spec.Lane("cpu", "ram", 0.145, 0.104, 0.040)
    assert lane.cost([]) == 0.0
    assert lane.cost({}) == 0.0
    assert lane.cost([1]) == pytest.approx(0.145 + 0.104)
    assert lane.cost([1, 3]) == pytest.approx(0.145 + 2 * 0.104 + 2 * 0.040)
    assert lane.cost({7: 1, 9: 3}) == pytest.approx(lane.cost([1, 3]))
    # split over two workers, heaviest first and strided: shares {3, 1, 1} and {2, 1}; the call ends with the first
    split = spec.Lane("cpu", "ram", 0.3, 0.1, 0.05, per_call_ms=0.02, workers=2, parallel_min=4)
    share = lambda ms: sum(0.1 + 0.05 * (m - 1) for m in ms)     # noqa: E731
    assert split.cost([1, 3, 1, 2, 1]) == pytest.approx(0.3 + share([3, 1, 1]))
    assert split.cost([1, 1, 1]) == pytest.approx(0.02 + share([1, 1, 1]))     # below parallel_min: inline


def test_fixed_interpolation_and_extrapolation():
    R = spec.resolve(GLM)
    assert R.fixed_ms == {1: 14.0, 2: 20.0, 4: 30.0}
    assert R.fixed(1) == 14 and R.fixed(2) == 20 and R.fixed(4) == 30
    assert R.fixed(0.5) == 14
    assert R.fixed(1.5) == pytest.approx(17)
    assert R.fixed(3) == pytest.approx(25)
    assert R.fixed(8) == pytest.approx(50)
    one = spec.resolve(GLM, ['calibration.fixed_ms={"2": 9}'])
    assert one.fixed(1) == one.fixed(16) == 9


# ---------------------------------------------------------------------------------------------------------------------
# overrides


def test_parse_overrides():
    got = spec.parse_overrides(["budget.ram_gb=55", "policy.prefetch.recall=0.7", "policy.ram_evict=lfu:2048:500",
                                'calibration.fixed_ms={"1":9,"2":13}', "policy.overlap=false", "a.b=[]", "x=a=b"])
    assert got == [("budget.ram_gb", 55), ("policy.prefetch.recall", 0.7), ("policy.ram_evict", "lfu:2048:500"),
                   ("calibration.fixed_ms", {"1": 9, "2": 13}), ("policy.overlap", False), ("a.b", []), ("x", "a=b")]
    _raises(lambda: spec.parse_overrides(["budget.ram_gb"]), "budget.ram_gb", "path=value")
    _raises(lambda: spec.parse_overrides(["=5"]), "=5", "empty path")
    _raises(lambda: spec.parse_overrides(["a..b=5"]), "a..b=5")


def test_overrides_apply():
    R = spec.resolve(GLM, ["policy.prefetch.recall=0.7", "budget.vram_expert_slots=1910",
                           'calibration.fixed_ms={"1":9,"2":13,"4":20}', "calibration.fixed_ms.8=33",
                           "lane_overrides.cpu.per_layer_ms=0.03", "policy.ram_evict=dlfu:500",
                           "tiers.nvme_expert_bytes=6328320"])
    assert R.policy["prefetch"]["recall"] == 0.7 and R.vram_slots == 1910
    assert R.fixed_ms == {1: 9.0, 2: 13.0, 4: 20.0, 8: 33.0}  # dict replaced, then a key added
    assert R.lanes["cpu"].per_layer_ms == 0.03 and R.lanes["cpu"].per_expert_ms == 0.104
    assert R.nvme_expert_bytes == 6328320 and R.ram_expert_bytes == 9474048
    assert R.policy["ram_evict"] == "dlfu:500"
    # a dict value replaces the sub-dict: missing prefetch keys fall back to defaults
    P = spec.resolve(GLM, ['policy.prefetch={"depth": 1, "recall": 0.5}'])
    assert P.raw["policy"]["prefetch"] == {"depth": 1, "recall": 0.5}
    assert P.policy["prefetch"] == {"depth": 1, "recall": 0.5, "predictor": "recall", "budget": 8}
    # overriding does not touch the file
    assert spec.load_record("recipe", GLM)["policy"]["prefetch"]["recall"] == 0.0
    # lane_overrides replaced wholesale
    C = spec.resolve("glm53-rtx3090-55g-nvx4-cold2b", ['lane_overrides={"cpu": {"per_expert_ms": 0.2}}'])
    assert C.lanes["zerocopy"].per_expert_ms == 0.38 and C.lanes["cpu"].per_expert_ms == 0.2


def test_bad_override_path():
    _raises(lambda: spec.resolve(GLM, ["policy.prefetch.recal=0.7"]),
            "--set policy.prefetch.recal=0.7", "unknown path 'policy.prefetch.recal'",
            "known keys at 'policy.prefetch': depth, recall, predictor, budget")
    _raises(lambda: spec.resolve(GLM, ["budgett.ram_gb=5"]), "unknown path 'budgett'")
    _raises(lambda: spec.resolve(GLM, ["budget.ram_gb.x=5"]), "budget.ram_gb", "not an object")
    _raises(lambda: spec.resolve(GLM, ["lane_overrides.cpu.per_layer=0.1"]), "lane_overrides.cpu.per_layer")
    _raises(lambda: spec.resolve(GLM, ["lane_overrides.foo.per_layer_ms=0.1"]),
            "$.lane_overrides.foo", "unknown lane 'foo'")


def test_bad_override_value():
    _raises(lambda: spec.resolve(GLM, ["budget.ram_gb=abc"]),
            "recipe/glm53-rtx3090-55g-nvx4.json", "budget.ram_gb=abc", "$.budget.ram_gb: expected number, got 'abc'")
    _raises(lambda: spec.resolve(GLM, ["policy.exact=maybe"]), "$.policy.exact", "'stall', 'mask'")
    _raises(lambda: spec.resolve(GLM, ["policy.prefetch.recall=1.5"]), "$.policy.prefetch.recall", "<= 1")
    _raises(lambda: spec.resolve(GLM, ["calibration.fixed_ms.0=1"]), "$.calibration.fixed_ms", "bad key", "'0'")
    _raises(lambda: spec.resolve(GLM, ['engines=["exllamav3-cuda", "foo"]']),
            "recipe/glm53-rtx3090-55g-nvx4.json", "$.engines[1]: unknown engine id 'foo'")


# ---------------------------------------------------------------------------------------------------------------------
# bad records and bad ids


def test_wrong_type(reg):
    _edit(reg, "recipe", GLM, lambda r: r["budget"].update(ram_gb="abc"))
    _raises(lambda: spec.resolve(GLM, root=reg),
            "registry/recipe/glm53-rtx3090-55g-nvx4.json: $.budget.ram_gb: expected number, got 'abc'")
    _edit(reg, "model", "glm-5.3-flash-exl3-3.05bpw", lambda r: r["moe"].update(layers=4.5))
    _raises(lambda: spec.load_all(reg), "model/glm-5.3-flash-exl3-3.05bpw.json", "$.moe.layers", "integer")


def test_missing_field(reg):
    _edit(reg, "engine", "avx2-exl3-cpu", lambda r: r["lanes"]["cpu"].pop("per_expert_ms"))
    _raises(lambda: spec.load_record("engine", "avx2-exl3-cpu", reg),
            "engine/avx2-exl3-cpu.json", "$.lanes.cpu.per_expert_ms", "required")
    _edit(reg, "recipe", GLM, lambda r: r.pop("calibration"))
    _raises(lambda: spec.resolve(GLM, root=reg), "recipe/glm53-rtx3090-55g-nvx4.json", "$.calibration", "required")


def test_unknown_field_is_named(reg):
    _edit(reg, "recipe", GLM, lambda r: r.update(budegt={}))
    _raises(lambda: spec.load_record("recipe", GLM, reg), "$.budegt", "unknown field")


def test_unknown_engine_and_model_ids(reg):
    _edit(reg, "recipe", GLM, lambda r: r["engines"].append("foo"))
    _raises(lambda: spec.resolve(GLM, root=reg),
            "registry/recipe/glm53-rtx3090-55g-nvx4.json: $.engines[2]: unknown engine id 'foo'")
    _raises(lambda: spec.load_all(reg), "$.engines[2]", "'foo'")
    _edit(reg, "recipe", "glm53-rtx5070-20g-nvme1", lambda r: r.update(model="nope-model"))
    _raises(lambda: spec.resolve("glm53-rtx5070-20g-nvme1", root=reg),
            "recipe/glm53-rtx5070-20g-nvme1.json: $.model: unknown model id 'nope-model'")


def test_id_must_match_file_name(reg):
    _edit(reg, "hardware", "omarchy-rtx3090-nvx4", lambda r: r.update(id="other-box"))
    _raises(lambda: spec.load_all(reg), "hardware/omarchy-rtx3090-nvx4.json", "$.id", "'other-box'")


@pytest.mark.parametrize("bad", ["../etc/passwd", "a/b", "/etc/passwd", "..", "a\\b", "", "Upper", ".hidden"])
def test_ids_cannot_escape_registry(bad):
    _raises(lambda: spec.load_record("recipe", bad), f"recipe id {bad!r}", "not a valid record id")
    _raises(lambda: spec.resolve(bad), f"{bad!r}")
    _raises(lambda: spec.write_record("recipe", {"id": bad}), f"{bad!r}")


def test_unknown_recipe_and_kind():
    msg = _raises(lambda: spec.resolve("no-such-recipe"), "unknown recipe id 'no-such-recipe'", GLM)
    assert "qwen38fn-arcb70-16g-nvx4" in msg
    _raises(lambda: spec.load_record("gadget", "x"), "unknown record kind 'gadget'")


def test_invalid_json(reg):
    (reg / "recipe" / f"{GLM}.json").write_text('{\n  "id": "x",\n  "status": \n}\n')
    _raises(lambda: spec.resolve(GLM, root=reg),
            "registry/recipe/glm53-rtx3090-55g-nvx4.json: invalid JSON at line 4 column 1")
    _raises(lambda: spec.index(reg), "invalid JSON")


def test_validate_message_format():
    _raises(lambda: spec.validate("recipe", {"id": 3}, "registry/recipe/x.json"),
            "registry/recipe/x.json: $.")


def test_write_record_atomic_and_validated(reg):
    rec = spec.load_record("recipe", GLM, reg)
    rec["id"] = "glm53-copy"
    rec["budget"]["ram_gb"] = 64
    path = spec.write_record("recipe", rec, reg)
    assert path == reg / "recipe" / "glm53-copy.json"
    assert spec.resolve("glm53-copy", root=reg).ram_slots == 6037
    assert not [p for p in path.parent.iterdir() if p.name.startswith(".")]
    rec["budget"]["ram_gb"] = "lots"
    _raises(lambda: spec.write_record("recipe", rec, reg), "$.budget.ram_gb")
    assert json.loads(path.read_text())["budget"]["ram_gb"] == 64
    rec["budget"]["ram_gb"] = 64
    rec["engines"] = ["ghost"]
    _raises(lambda: spec.write_record("recipe", rec, reg), "$.engines[0]", "'ghost'")
