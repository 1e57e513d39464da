"""moetier advise: the knob space from the registries, limits, the successive-halving search, the advised records,
which knobs mattered, upgrades and the Pareto view."""
import json

import pytest

from moetier.cli.main import main
from moetier.core import records as spec
from moetier.core.policies import residency
from moetier.errors import UserError
from moetier.measure import advise as A
from moetier.measure import advise_report as AR
from moetier.measure import advise_space as space
from moetier.measure import sweep as S

TINY = "tiny-ci-cpu"
SMALL = dict(n=8, seed=3, steps=24)


@pytest.fixture(scope="module")
def pool():
    ex = S.process_pool(2)
    yield ex
    ex.shutdown(wait=True, cancel_futures=True)


@pytest.fixture(scope="module")
def advised(pool):
    R = spec.resolve(TINY)
    return AR.advise(TINY, lim=space.limits(R), concs=(1, 2), executor=pool, **SMALL)


def choice_values(knobs, name):
    k = next(k for k in knobs if k.name == name)
    return [k.label(i) for i in range(1, len(k.choices))]


def test_replacement_choices_come_from_the_policy_registry_at_run_time(monkeypatch):
    R = spec.resolve(TINY)
    lim = space.limits(R)
    got = choice_values(space.knobs(R, lim), "ram replacement")
    assert '"sieve"' in got and '"belady"' not in got           # belady needs the future: never advised
    assert '"lfu"' not in got and '"dlfu"' in got               # the start's own value is choice 0, not repeated
    monkeypatch.delitem(residency.POLICIES, "sieve")
    assert '"sieve"' not in choice_values(space.knobs(R, lim), "ram replacement")


def test_every_choice_is_accepted_by_the_schema_and_choice_zero_is_the_start():
    R = spec.resolve("glm53-rtx3090-55g-nvx4")
    knobs = space.knobs(R, space.limits(R, lossy=True))
    names = {k.name for k in knobs}
    assert {"vram slots", "ram replacement", "vram admission", "prefetch predictor", "exactness",
            "cold record size"} <= names
    for k in knobs:
        assert k.choices[0] == ()
        for ch in k.choices[1:]:
            spec.resolve(R.id, list(ch))                         # raises if the schema or the join rejects it
    # the what-if predictor is never searched; exact configurations only without --lossy
    assert '"recall"' not in choice_values(knobs, "prefetch predictor")
    assert "exactness" not in {k.name for k in space.knobs(R, space.limits(R))}


@pytest.mark.parametrize("rid", ["glm53-rtx3090-55g-nvx4", "tiny-local-cpu"])
def test_cpu_workers_only_at_counts_the_lane_record_measured(rid):
    """A worker count the lane record did not measure would spread its per-expert cost over threads that share one
    memory bandwidth: GLM's cpu lane was measured inline only (no split terms) on 24 cores, so no worker knob;
    tiny-local-cpu's was measured split at 2 workers, so 1 and 2."""
    R = spec.resolve(rid)
    cpu = R.lanes["cpu"]
    k = next((k for k in space.knobs(R, space.limits(R)) if k.name == "cpu workers"), None)
    offered = {cpu.workers} | ({int(k.label(i)) for i in range(1, len(k.choices))} if k else set())
    assert offered <= {1} | ({cpu.workers} if cpu.per_handoff_ms is not None else set())
    assert (k is None) == (cpu.per_handoff_ms is None and cpu.workers == 1)


def test_vram_slots_never_exceed_the_vram_left_by_the_reserve():
    R = spec.resolve("glm53-rtx3090-55g-nvx4")
    lim = space.limits(R, vram_reserve_gb=10.0)
    top = (24 - 10.0) * 1e9 // R.expert_bytes
    for ch in next(k for k in space.knobs(R, lim) if k.name == "vram slots").choices[1:]:
        assert int(ch[0].split("=")[1]) <= top
    # by default the reserve is what the start's slots leave: the start's slots are the most allowed
    assert space.max_vram_slots(R, space.limits(R)) == R.vram_slots


@pytest.mark.parametrize("kw,says", [
    (dict(ram_gb=0.0), "--ram-gb"),
    (dict(vram_reserve_gb=1.0), "no GPU lane"),
    (dict(masked_cap=0.1), "--lossy"),
    (dict(lossy=True, masked_cap=1.5), "[0, 1]"),
])
def test_bad_limits_are_one_user_error(kw, says):
    with pytest.raises(UserError, match=None) as e:
        space.limits(spec.resolve(TINY), **kw)
    assert says in str(e.value) and "\n" not in str(e.value)


def test_candidates_are_deterministic_for_a_seed():
    R = spec.resolve("glm53-rtx3090-55g-nvx4")
    knobs = space.knobs(R, space.limits(R))
    a, b, c = (A.candidates(knobs, 60, s) for s in (1, 1, 2))
    assert a == b and a != c and len(set(a)) == 60
    assert a[0] == tuple(0 for _ in knobs)
    singles = [x for x in a if sum(1 for j in x if j) == 1]
    assert len(singles) == sum(len(k.choices) - 1 for k in knobs)


def test_search_confirms_the_start_and_advises_no_worse(advised):
    for c in (1, 2):
        best, start = advised["best"][c], advised["start"][c]
        assert start["overrides"] == [] and start["steps"] == SMALL["steps"] and start["warmup"] is None
        assert best["tok_s"] >= start["tok_s"]
        assert best["rung"] == len(advised["search"]["rungs"]) - 1        # a full replay, not a short one
    rungs = [r["rung"] for r in advised["search"]["rows"]]
    assert rungs.count(0) > rungs.count(2)                                # halving: fewer full replays


def test_the_search_is_deterministic_and_the_pool_gives_in_process_rows(advised, pool):
    R = spec.resolve(TINY)
    again = A.search(TINY, concs=(1, 2), lim=space.limits(R), executor=pool, **SMALL)
    assert {c: (r["overrides"], r["tok_s"]) for c, r in again["best"].items()} == \
        {c: (r["overrides"], r["tok_s"]) for c, r in advised["best"].items()}
    row = advised["best"][2]
    cell = A.cell(TINY, row["overrides"], 2, row["steps"], None, None, {}, row["cand"])
    assert A.run_cell(cell)["tok_s"] == row["tok_s"]


def test_what_mattered_is_the_loss_when_a_knob_is_put_back(advised):
    for c, items in advised["mattered"].items():
        best = advised["best"][c]
        assert len(items) == sum(1 for j in best["cand"] if j)
        for it in items:
            k = next(i for i, kn in enumerate(advised["search"]["knobs"]) if kn.name == it["knob"])
            back = [j if i != k else 0 for i, j in enumerate(best["cand"])]
            ov = A.overrides(advised["search"]["knobs"], back)
            row = A.run_cell(A.cell(TINY, ov, c, best["steps"], None, None))
            assert it["lost_tok_s"] == pytest.approx(best["tok_s"] - row["tok_s"])


def test_knobs_that_pay_nothing_are_put_back(advised, pool):
    """A best that also changes knobs with no effect (the predictor and its budget while prefetch is off) is
    replaced by the same best without them, and only what is left is attributed."""
    R = spec.resolve(TINY)
    assert R.policy["prefetch"]["depth"] == 0
    res = A.search(TINY, concs=(1,), lim=space.limits(R), executor=pool, **SMALL)
    knobs = res["knobs"]
    at = {k.name: i for i, k in enumerate(knobs)}
    real = tuple(res["best"][1]["cand"])
    padded = list(real)
    padded[at["prefetch predictor"]], padded[at["prefetch budget"]] = 1, 1
    assert real[at["prefetch depth"]] == 0 and tuple(padded) != real
    row = A.run_cell(A.cell(TINY, A.overrides(knobs, padded), 1, res["rungs"][-1][0], None, None, None, padded))
    res["best"][1] = {**row, "rung": len(res["rungs"]) - 1}
    mattered = A.attribution(res, executor=pool)
    idle = {it["knob"] for it in mattered[1] if it["lost_tok_s"] == 0}
    assert {"prefetch predictor", "prefetch budget"} <= idle
    final = A.simplify(res, mattered, executor=pool)
    best = res["best"][1]
    assert tuple(best["cand"]) == real and best["tok_s"] == row["tok_s"]
    assert not any("predictor" in o or "budget=" in o for o in best["overrides"])
    assert {it["knob"] for it in final[1]} == {knobs[i].name for i, j in enumerate(real) if j}
    assert all(it["lost_tok_s"] > 0 for it in final[1])


def test_interval_brackets_the_advice(advised):
    for c, iv in advised["interval"].items():
        assert iv["low"] <= advised["best"][c]["tok_s"] <= iv["high"]


def test_an_upgrade_changes_the_machine_not_the_recipe():
    R = spec.resolve("tiny-local-cpu")
    up = A.upgrade_recipe(R, {"nvme_scale": 2.0, "cores": 8})
    assert up.nvme_bw_gbps == 2 * R.nvme_bw_gbps and up.hardware["cpu"]["cores"] == 8
    assert R.hardware["cpu"].get("cores") != 8                   # the resolved original is untouched
    names = [u["name"] for u in A.upgrades(R)]
    assert any(n.startswith("ram ") for n in names) and any(n.startswith("nvme") for n in names)
    assert not any("gpu" in n for n in names)                    # no GPU: no link or second-GPU rows
    g = [u for u in A.upgrades(spec.resolve("glm53-rtx3090-55g-nvx4")) if "second gpu" in u["name"]]
    assert g and "why" in g[0]
    c = A.cell("tiny-local-cpu", [], 1, 24, None, None)
    slow = A.run_cell(c)["tok_s"]
    fast = A.run_cell({**c, "hw": {"nvme_scale": 4.0}})["tok_s"]
    assert fast > slow                                           # the tiny recipe has an NVMe tail


def test_pareto_front():
    pts = [(1, 10), (2, 12), (2, 11), (3, 12), (0.5, 5)]
    assert A.pareto(pts) == [True, True, False, False, True]


def test_cli_writes_records_of_its_own_and_refuses_to_replace_them(tmp_path, capsys, user_registry):
    args = ["advise", TINY, "--conc", "1", "--candidates", "4", "--steps", "16", "--workers", "2"]
    assert main(args + ["--json", "--plot", str(tmp_path / "p.png")]) == 0
    cap = capsys.readouterr()
    d = json.loads(cap.out)
    rec = spec.load_record("recipe", f"{TINY}-advised-c1")
    path = spec.record_path("recipe", rec["id"])
    assert d["written"] == [{"kind": "recipe", "id": rec["id"], "path": str(path)}]
    # the form every command that writes records prints (moetier.measure.write's callers)
    assert f"wrote recipe {rec['id']}: {path}" in cap.err.splitlines()
    assert rec["status"] == "what-if" and not spec.is_shipped("recipe", rec["id"])
    R = spec.resolve(rec["id"])                                   # a valid recipe that resolves
    assert d["advice"]["1"]["best"]["overrides"] == [] or R.raw != spec.load_record("recipe", TINY)
    assert (tmp_path / "p.png").stat().st_size > 1000
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert "exists" in err and "--force" in err and len(err.splitlines()) == 1
    assert main(args + ["--force"]) == 0
    out = capsys.readouterr()
    assert out.err.splitlines()[-1] == f"wrote recipe {rec['id']}: {path}" and "wrote" not in out.out


def test_cli_impossible_and_unreachable_targets(capsys):
    args = ["advise", TINY, "--conc", "1", "--candidates", "3", "--steps", "16", "--no-write"]
    assert main(args + ["--target", "1e9"]) == 2
    err = capsys.readouterr().err.strip()
    assert "caps decode at" in err and len(err.splitlines()) == 1
    R = spec.resolve(TINY)
    reach = 1000.0 / R.fixed(1) * 0.999                          # below the ceiling, above any real placement
    assert main(args + ["--target", str(reach), "--json"]) == 1
    err = capsys.readouterr().err
    assert "best reachable: C1" in err


@pytest.mark.parametrize("extra,says", [(["--ram-gb", "0"], "positive"), (["--masked-cap", "0.1"], "--lossy"),
                                        (["--vram-reserve-gb", "2"], "no GPU lane")])
def test_cli_bad_limits_exit_2_with_one_line(extra, says, capsys):
    assert main(["advise", TINY, "--no-write", *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert says in err and len(err.splitlines()) == 1 and "Traceback" not in err


def test_cli_model_and_hardware_find_a_starting_recipe(capsys):
    assert main(["advise", "--model", "moetier-tiny-ci-int8", "--hardware", "nope", "--no-write"]) == 2
    assert "no recipe joins" in capsys.readouterr().err


def test_halving_keeps_the_start_and_ranks_by_tok_s_with_a_fake_replay(monkeypatch):
    """A fake replay (in threads, so the fake is seen) scores a candidate by its choices, the start worst: the
    search still confirms the start, and the best it returns is the top-scored candidate among those confirmed."""
    from concurrent.futures import ThreadPoolExecutor

    def fake_run_cell(c):
        cand = c["cand"]
        score = sum((i + 1) * j for i, j in enumerate(cand))
        return {"conc": c["conc"], "cand": cand, "overrides": c["overrides"], "steps": c["steps"], "_i": c["_i"],
                "warmup": c["warmup"], "tok_s": float(score), "masked_share": 0.0, "ram_gb": 1.0, "vram_gb": 0.0}
    monkeypatch.setattr(A, "run_cell", fake_run_cell)
    R = spec.resolve("glm53-rtx3090-55g-nvx4")
    with ThreadPoolExecutor(2) as ex:
        res = A.search(R.id, concs=(1,), lim=space.limits(R), n=40, seed=0, steps=30, executor=ex)
    final = [r for r in res["rows"] if r["rung"] == 2]
    assert res["start"][1]["tok_s"] == 0.0
    assert res["best"][1]["tok_s"] == max(r["tok_s"] for r in final) > 0
    assert len(final) < 40                                       # most were discarded on short replays


def test_tighter_limits_clamp_the_start():
    R = spec.resolve("glm53-rtx3090-55g-nvx4")
    got = space.clamp(R, space.limits(R, ram_gb=30, vram_reserve_gb=12))
    slots = int(12e9 // R.expert_bytes)
    assert got == ["budget.ram_gb=30.0", f"budget.vram_expert_slots={slots}"]
    assert space.clamp(R, space.limits(R)) == []
    clamped = spec.resolve(R.id, got)
    assert space.ram_gb_used(clamped) <= 30 and space.vram_gb_used(clamped) <= 24 - 12


def test_a_small_candidate_list_still_touches_every_knob():
    R = spec.resolve("glm53-rtx3090-55g-nvx4")
    knobs = space.knobs(R, space.limits(R))
    few = A.candidates(knobs, len(knobs) + 1, 0)
    assert {i for c in few for i, j in enumerate(c) if j} == set(range(len(knobs)))


def test_ray_gives_the_pools_rows(pool):
    pytest.importorskip("ray", reason="Ray is an optional extra (pip install 'moetier[ray]')")
    cells = [A.cell(TINY, ov, c, 16, 32, None) for ov in ([], ['policy.ram_evict="lru"']) for c in (1, 2)]
    strip = [{k: v for k, v in r.items() if k != "seconds"}
             for r in A._run([dict(c) for c in cells], executor=pool)]
    assert strip == [{k: v for k, v in r.items() if k != "seconds"}
                     for r in A._run([dict(c) for c in cells], ray="local", workers=2)]


def test_a_start_that_masks_caps_candidates_at_its_own_masked_share():
    R = spec.resolve("qwen38fn-arcb70-16g-nvx4")
    lim = space.limits(R)
    assert lim.lossy and lim.masked_cap is None
    assert "exactness" in {k.name for k in space.knobs(R, lim)}          # stall is a choice: it may go exact
    rows = [{"conc": 1, "_idx": 0, "masked_share": 0.05, "tok_s": 10.0},
            {"conc": 1, "_idx": 1, "masked_share": 0.06, "tok_s": 20.0},
            {"conc": 1, "_idx": 2, "masked_share": 0.0, "tok_s": 12.0}]
    assert [r["_idx"] for r in A._best_by_conc(rows, None)[1]] == [2, 0]
    assert [r["_idx"] for r in A._best_by_conc(rows, 0.1)[1]] == [1, 2, 0]


def test_the_worked_example_in_the_docs_is_what_the_simulator_gives():
    """docs/advise.md's example table: each start and advised tok/s is a full replay of that configuration."""
    from pathlib import Path
    text = (Path(__file__).resolve().parents[1] / "docs" / "advise.md").read_text(encoding="utf-8")
    rows = [ln.split(" | ") for ln in text.splitlines() if ln.startswith("| C") and "cpu-moe" in ln]
    assert len(rows) == 3
    for r in rows:
        conc = int(r[0].strip("| C"))
        ov = [o.strip() for o in r[-1].rstrip(" |").split(";")]
        start = A.run_cell(A.cell("tiny-local-cpu", [], conc, 150, None, None))["tok_s"]
        best = A.run_cell(A.cell("tiny-local-cpu", ov, conc, 150, None, None))["tok_s"]
        assert (f"{start:.2f}", f"{best:.2f}") == (r[1], r[2])


def test_model_and_hardware_start_from_the_shipped_candidate(user_registry):
    from moetier.cli.advise import start_recipe
    import argparse
    rec = spec.load_record("recipe", "glm53-rtx3090-55g-nvx4")
    spec.write_record("recipe", {**rec, "id": "a-glm-mine"})          # sorts first by id, but is the user's
    a = argparse.Namespace(recipe=None, model=rec["model"], hardware=rec["hardware"], engines=None)
    assert start_recipe(a) == "glm53-rtx3090-55g-nvx4"


def test_cli_bad_trace_is_one_line_before_the_search(tmp_path, capsys):
    bad = tmp_path / "bad.npz"
    bad.write_bytes(b"not a trace")
    assert main(["advise", TINY, "--trace", str(bad), "--no-write"]) == 2
    err = capsys.readouterr().err.strip()
    assert str(bad) in err and len(err.splitlines()) == 1


@pytest.mark.parametrize("rid", [r for r in spec.record_ids("recipe") if spec.is_shipped("recipe", r)])
def test_default_limits_leave_every_shipped_recipe_as_it_is(rid):
    R = spec.resolve(rid)
    assert space.clamp(R, space.limits(R)) == []
