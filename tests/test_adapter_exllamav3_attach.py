"""The exllamav3 adapter on a CPU: a tiny synthetic EXL3 MoE built from exllamav3 1.6.5's own module classes, its
real BlockSparseMLP.forward run with the stand-in extension, the router and decode kernels as named fakes
(tests/exllamav3_fakes.py), moetier attached through the engine's routing_fn / cpu_split_combine hooks."""
from __future__ import annotations

import dataclasses
import gc
import weakref

import numpy as np
import pytest

from tests._exllamav3 import needs_engine
from tests.adapter_checks import (SPLITS, assert_deals_replay, assert_mask_is_exact_less_masked, assert_split_lanes,
                                  assert_within, chaos_instruments, lane_counts, recipe, rel_rms, tiny_model)

pytestmark = needs_engine

STEPS, ROWS = 4, 2


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """The tiny model's checkpoint, its routed experts packed into a moetier store, and its tensors."""
    from adapters.exllamav3 import checkpoint
    ck, st, t = tiny_model(tmp_path_factory, "exllamav3-tiny", checkpoint.write_tiny, 3)
    return dataclasses.replace(checkpoint.TINY, seed=3), ck, st, t


@pytest.fixture
def engine(tiny):
    """A freshly loaded tiny model (its blocks) with the fake kernels installed."""
    from adapters.exllamav3 import checkpoint
    from tests.exllamav3_fakes import FakeEngine
    spec, path, _, _ = tiny
    with FakeEngine(spec) as fake:
        model = checkpoint.build_model(path)
        fake.load(model)
        yield model, fake


def attach(model, fake, R, st, **kw):
    from adapters.exllamav3.attach import attach as attach_
    att = attach_(model, R, st, record=True, **kw)
    fake.memory.add_tensor(att.backend.arena)
    fake.memory.add(att.backend.pool.base, att.backend.pool.nbytes)
    if att.bounce is not None:
        fake.memory.add_tensor(att.bounce)         # the home of every expert outside the VRAM tier: zeros
    return att


def inputs(spec, seed=11):
    import torch
    g = torch.Generator().manual_seed(seed)
    return [[torch.randn((ROWS, spec.hidden), generator=g).half() for _ in range(spec.moe_layers)]
            for _ in range(STEPS)]


def ckpt_expert(tensors, key: str):
    from moetier.bytes import exl3
    lin = [exl3.Exl3Linear(tensors[f"{key}.{p}.trellis"], tensors[f"{key}.{p}.suh"], tensors[f"{key}.{p}.svh"])
           for p in ("gate_proj", "up_proj", "down_proj")]
    return exl3.Exl3Expert(*lin)


def reference(tiny, o, x, sel, w, skip=()):
    """float64 output of MoE block ``o`` for rows x under the router's selection, from the synthetic checkpoint's
    own generator (synth_exl3.expert: not the files, records or slots) and its shared expert's tensors: the routed
    sum (less the experts in ``skip``) plus the shared expert."""
    from moetier.bytes import exl3, synth_exl3
    spec, _, _, tensors = tiny
    mk = synth_exl3.moe_prefixes(spec)[o]
    xn = x.float().numpy().astype(np.float64)
    y = exl3.expert_forward(xn, ckpt_expert(tensors, f"{mk}.shared_experts"), spec.act_limit)
    for r in range(xn.shape[0]):
        for j in range(sel.shape[1]):
            e = int(sel[r, j])
            if (o * spec.experts + e) in skip:
                continue
            y[r] += exl3.expert_forward(xn[r:r + 1], synth_exl3.expert(spec, o, e), spec.act_limit,
                                        float(w[r, j]))[0]
    return y


def run(model, att, xs):
    """Every step's every block forward; (output, the router's unmasked selection and weights) per call."""
    out = []
    for step in xs:
        row = []
        for o, m in enumerate(model.modules):
            y = m.forward(step[o], {})
            sel, w = att.routing[o]
            row.append((y.detach().clone(), sel, w))
        out.append(row)
    return out


@pytest.mark.parametrize("split", list(SPLITS))
def test_block_output_matches_float64_under_each_split(tiny, engine, split):
    model, fake = engine
    spec, _, st, _ = tiny
    att = attach(model, fake, recipe(*SPLITS[split]), st)
    xs = inputs(spec)
    assert_within(run(model, att, xs), xs, lambda *a: reference(tiny, *a))
    lanes = lane_counts(att)
    assert att.bypassed == 0 and len(att.deals) == STEPS * spec.moe_layers
    assert_split_lanes(split, lanes)
    engine_picks = lanes["gpu"] + lanes["zerocopy"] + lanes["nvme_gpu"]
    assert engine_picks == 0 or sum(bc.picks for bc in fake.bcs) > 0
    att.detach()


def test_exact_mode_runs_every_pick_on_the_engine(tiny, engine):
    model, fake = engine
    spec, _, st, _ = tiny
    att = attach(model, fake, recipe(*SPLITS["ram-only"]), st, exact=True)
    xs = inputs(spec, seed=5)
    got = run(model, att, xs)
    assert all(not d["cpu"] and not d["nvme_cpu"] for *_, d in att.deals)
    assert lane_counts(att)["zerocopy"] > 0
    assert_within(got, xs, lambda *a: reference(tiny, *a))
    att.detach()


def test_mask_equals_exact_minus_masked_contributions(tiny, engine):
    model, fake = engine
    spec, _, st, _ = tiny
    att = attach(model, fake, recipe(*SPLITS["nvme-tail"], exact="mask"), st)   # NVMe picks dropped
    xs = inputs(spec, seed=7)
    assert_mask_is_exact_less_masked(att, run(model, att, xs), xs, lambda *a, **kw: reference(tiny, *a, **kw))
    att.detach()


@pytest.mark.parametrize("split", ["nvme-tail", "nvme-tail-no-vram", "ram-only"])
def test_lane_deal_equals_the_simulators(tiny, engine, split):
    model, fake = engine
    spec, _, st, _ = tiny
    att = attach(model, fake, recipe(*SPLITS[split]), st)
    run(model, att, inputs(spec, seed=13))
    assert_deals_replay(att)
    assert len(att.deals) == STEPS * spec.moe_layers
    att.detach()


def test_rows_point_only_at_landed_slots_and_cpu_picks_never_reach_the_engine(tiny, engine):
    from tests.exllamav3_fakes import A_GATE
    model, fake = engine
    spec, _, st, _ = tiny
    att = attach(model, fake, recipe(*SPLITS["nvme-tail"]), st)
    seen = {"engine": 0, "masked": 0}

    def check(bc, sel, w):
        """As the engine's kernel runs: every pick it gets has its rows on the slot the ledger has its landed bytes
        in; every pick of moetier's lanes reaches it as -1 with weight 0 (the kernel skips on the weight)."""
        o = next(i for i, t in enumerate(att.tables) if t.multi["gate"].ptrs_trellis is bc.args[A_GATE[0]])
        _, o2, picks, dealt = att.deals[-1]
        assert o2 == o
        mine = set(dealt["gpu"] + dealt["zerocopy"] + dealt["nvme_gpu"])
        base = o * spec.experts
        routed, _ = att.routing[o]
        L, rt, be = att.rt.L, att.rt, att.backend
        for r in range(sel.shape[0]):
            for j in range(sel.shape[1]):
                k = base + int(routed[r, j])
                if int(sel[r, j]) < 0:
                    assert k not in mine and float(w[r, j]) == 0.0
                    seen["masked"] += 1
                    continue
                assert k in mine
                row = att.tables[o].row(k - base)["gate_trellis"]
                if L.state_of(k) == "vram" and row == be.vram_address(rt.vram_slot[k]):
                    pass
                else:      # a RAM (or staging) slot whose fill landed, not yet freed
                    assert k in rt.ram_slot and row == be.ram_address(rt.ram_slot[k]), (k, L.state_of(k))
                seen["engine"] += 1

    for bc in fake.bcs:
        bc.on_run = check
    run(model, att, inputs(spec, seed=17))
    assert seen["engine"] > 0 and seen["masked"] > 0, seen
    att.detach()


def test_keeping_only_the_fused_gu_tables_current_computes_stale_experts(tiny, engine):
    """run_bszN reads the gate/up/down MultiLinear tables; the fused kernels' gu tables [E, 2] are stored and never
    read on that path. The broken variant of the adapter - its decode pointing writes the gu tables and the down
    table only, the gate/up MultiLinear rows left at home (the bounce record after hand-over) - must fail the
    float64 check that the adapter as shipped passes."""
    model, fake = engine
    spec, _, st, _ = tiny
    xs = inputs(spec, seed=5)

    def gu_only(t):
        def point(expert, base):
            addr = t.addresses(base)
            for part, tab in t.gu.items():
                tab[expert, 0], tab[expert, 1] = addr[f"gate_{part}"], addr[f"up_{part}"]
            for part in ("trellis", "suh", "svh"):
                getattr(t.multi["down"], f"ptrs_{part}")[expert] = addr[f"down_{part}"]
        return point

    for broken in (False, True):
        att = attach(model, fake, recipe(*SPLITS["ram-only"]), st, exact=True)
        if broken:
            for t in att.tables:
                t.point = gu_only(t)
        got = run(model, att, xs)
        att.detach()
        if broken:
            with pytest.raises(AssertionError):
                assert_within(got, xs, lambda *a: reference(tiny, *a))
        else:
            assert_within(got, xs, lambda *a: reference(tiny, *a))


@pytest.mark.parametrize("stage", ["router_pre_norm", "routed_pre_norm", "latent_in"])
def test_attach_refuses_a_block_whose_experts_input_differs_from_the_routers(tiny, engine, stage):
    from moetier.errors import UserError
    model, fake = engine
    _, _, st, _ = tiny
    m = model.modules[1]
    setattr(m, stage, object())                  # any norm or projection between the router's input and the experts'
    try:
        with pytest.raises(UserError) as e:
            attach(model, fake, recipe(*SPLITS["nvme-tail"]), st)
        assert "\n" not in str(e.value) and m.key in str(e.value) and stage in str(e.value)
        attach(model, fake, recipe(*SPLITS["nvme-tail"]), st, exact=True).detach()    # no cpu lane: nothing to refuse
    finally:
        setattr(m, stage, None)


def test_residency_rule_through_the_adapter_under_adversarial_timing(tiny, engine):
    """The conformance suite's Chaos wrapper (delayed and reordered completions) around the adapter's backend,
    with its two instruments: every slot a lane (the engine's included) is handed holds bytes the host saw land,
    and Ledger.land only follows a landed handle."""
    model, fake = engine
    spec, _, st, _ = tiny
    with chaos_instruments(seed=5) as (wrap, box):
        att = attach(model, fake, recipe(4, 10), st, wrap=wrap)
        run(model, att, inputs(spec, seed=19))
    chaos = box["chaos"]
    assert chaos.n["computed"] > 0 and chaos.n["landed_checks"] > 0 and chaos.n["false_polls"] >= 0, chaos.n
    att.detach()


def test_gpu_and_zerocopy_lanes_are_bit_identical(tiny, engine):
    """The same kernel reading the same bytes through rows that point at a VRAM slot (all resident) or at a RAM slot
    (exact mode, RAM only): identical bits."""
    model, fake = engine
    spec, _, st, _ = tiny
    xs = inputs(spec, seed=23)
    outs = {}
    for name, (vram, ram) in (("gpu", SPLITS["all-resident"]), ("zerocopy", SPLITS["ram-only"])):
        att = attach(model, fake, recipe(vram, ram), st, exact=True)
        outs[name] = [[y.numpy() for y, _, _ in step] for step in run(model, att, xs)]
        lanes = {ln for *_, d in att.deals for ln, keys in d.items() if keys}
        assert lanes == {name}, lanes
        att.detach()
    for a, b in zip(outs["gpu"], outs["zerocopy"]):
        for ya, yb in zip(a, b):
            assert np.array_equal(ya, yb)


def test_attach_refuses_a_recipe_that_does_not_fit_the_model(tiny, engine):
    from moetier.errors import UserError
    model, fake = engine
    _, _, st, _ = tiny
    R = dataclasses.replace(recipe(8, 12), experts=32)
    with pytest.raises(UserError, match=r"^recipe tiny-ci-cuda: moe.experts is 32 but the exllamav3 model has 16$"):
        attach(model, fake, R, st)
    R = recipe(8, 12, prefetch={"depth": 1, "predictor": "recall", "recall": 0.5, "budget": 4})
    with pytest.raises(UserError, match=r"policy.prefetch.depth > 0 is not supported"):
        attach(model, fake, R, st)


def test_prefill_bypasses_the_planner_with_every_pick_on_its_landed_bytes(tiny, engine):
    """More than 8 rows: the engine's grouped path cannot skip picks, so the router's selection goes back as it
    came and no layer is planned; every picked expert's rows point at bytes of that expert (its VRAM or RAM slot, or
    a staging slot read from NVMe for the call), and after the engine's combine the tables hold their home rows."""
    import torch
    from tests.adapter_checks import record
    model, fake = engine
    spec, _, st, _ = tiny
    att = attach(model, fake, recipe(2, 4), st)          # most keys on NVMe only
    run(model, att, inputs(spec, seed=29)[:1])            # decode: rows now point at slots
    m, t = model.modules[0], att.tables[0]
    assert any(t.row(e) != t_home for e, t_home in enumerate(_home_rows(t)))
    z = torch.randn((9, spec.hidden), generator=torch.Generator().manual_seed(3)).half()
    planned = att.plans
    sel, w = m.routing_fn(9, m.routing_cfg, z, {})
    assert att.bypassed == 1 and att.plans == planned
    assert int(sel.min()) >= 0 and float(w.min()) > 0
    fake.memory.add(att.staging.pool.base, att.staging.pool.nbytes)
    lay, picked = st.layout, {int(e) for e in sel.reshape(-1).tolist()}
    for e in picked:
        rows = t.row(e)
        for sec, (off, nb, _, _) in lay.sections.items():
            got = fake.memory.read(rows[sec], np.uint8, (nb,))
            assert np.array_equal(got, record(st, e)[off:off + nb]), (e, sec)
    assert att.staged > 0
    final = torch.zeros((9, spec.hidden))
    m.cpu_split_combine(final, None, None, final.shape)
    assert [t.row(e) for e in range(spec.experts)] == _home_rows(t)
    att.detach()


def test_only_the_vram_tier_is_in_the_engines_tables_and_no_expert_holds_engine_memory(tiny, engine):
    """attach hands every routed expert's bytes to moetier: the engine's own expert tensors become views of the
    VRAM slot the expert was seeded into, or of one shared bounce record; the home rows of VRAM-tier experts point at
    their slots, every other expert's at the bounce record."""
    model, fake = engine
    spec, _, st, _ = tiny
    before = sum(getattr(lins[e].inner, part).numel() for m in model.modules for lins in (m.gates, m.ups, m.downs)
                 for e in range(spec.experts) for part in ("trellis", "suh", "svh"))
    assert before > 0
    owned = [weakref.ref(getattr(lins[e].inner, part)) for m in model.modules for lins in (m.gates, m.ups, m.downs)
             for e in range(spec.experts) for part in ("trellis", "suh", "svh")]
    att = attach(model, fake, recipe(*SPLITS["nvme-tail"]), st)
    assert att.handed_over == spec.moe_layers * spec.experts
    assert set(att.engine_expert_bytes().values()) == {0}
    gc.collect()
    kept = [r() for r in owned if r() is not None]
    assert not kept, (f"{len(kept)} of the engine's own expert tensors are still referenced, e.g. by "
                      f"{[type(x).__name__ for x in gc.get_referrers(kept[0])]}")
    for m in model.modules:       # the live bound classes (the C++ side on a GPU) hold only views of moetier's memory
        for lbc in (b for lists in m.bc.args[40:43] for b in lists):
            for ten in (lbc.trellis, lbc.suh, lbc.svh):
                a = int(ten.data_ptr())
                assert any(b <= a < b + n for b, n in ((int(att.backend.arena.data_ptr()), att.backend.arena.numel()),
                                                       (int(att.bounce.data_ptr()), att.bounce.numel())))
    L, rt, be = att.rt.L, att.rt, att.backend
    bounce = int(att.bounce.data_ptr())
    vram = [k for k in range(att.R.keys) if L.state_of(k) == "vram"]
    assert 0 < len(vram) < att.R.keys
    for o, t in enumerate(att.tables):
        for e, home in enumerate(_home_rows(t)):
            k = o * spec.experts + e
            base = be.vram_address(rt.vram_slot[k]) if k in vram else bounce
            assert home == att.backend.addresses(base), (k, k in vram)
    att.detach()


def _home_rows(t) -> list:
    return [{f"{p}_{part}": int(t.home[f"{p}.{part}"][e]) for p in ("gate", "up", "down")
             for part in ("trellis", "suh", "svh")} for e in range(len(t.home["gate.trellis"]))]


def test_moe_blocks_are_found_in_a_module_tree(tiny, engine):
    """attach finds the blocks wherever the engine's module tree holds them (an exllamav3 Model's ``modules`` are its
    layers, each iterating over its submodules), in order."""
    from adapters.exllamav3.attach import moe_blocks
    from exllamav3.modules.module import Module
    model, _ = engine

    class Layer(Module):            # a stand-in for a transformer layer holding one MoE block
        def __init__(self, mlp):
            super().__init__(None, f"layer.{mlp.key}", None)
            self.modules = [mlp]

        def forward(self, x, params, out_dtype=None):
            raise NotImplementedError

        def optimizer_targets(self):
            return []

    class Tree:
        modules = [Layer(m) for m in model.modules]

    assert moe_blocks(Tree()) == model.modules == moe_blocks(model) == moe_blocks(model.modules)
