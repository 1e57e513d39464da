"""The exl3xpu adapter on a CPU: a tiny synthetic EXL3 MoE (Qwen layout) run as exl3xpu's method runs it, over
moetier's provider of the ``exl3xpu_moe`` ops (adapters.exl3xpu.ops: moetier's EXL3 CPU kernel behind the same op
surface; exl3xpu itself needs an Intel XPU), moetier attached through the method's ``apply``."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from tests.adapter_checks import (SPLITS, assert_deals_replay, assert_mask_is_exact_less_masked, assert_split_lanes,
                                  assert_within, chaos_instruments, lane_counts, recipe, rel_rms, tiny_model)

pytest.importorskip("safetensors", reason="the tiny checkpoint is written with safetensors (the test extra)")

STEPS, ROWS = 4, 2


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from adapters.exl3xpu import model
    ck, st, t = tiny_model(tmp_path_factory, "exl3xpu-tiny", model.write_tiny, 3)
    return dataclasses.replace(model.TINY, seed=3), ck, st, t


@pytest.fixture
def engine(tiny):
    from adapters.exl3xpu import model, ops
    return tempered(model.build_model(tiny[1], ops.ProvidedOps()))


def tempered(m):
    """The synthetic gate (N(0, 1) over 256 inputs) gives logits of std ~16, so softmax puts ~all weight on one pick;
    a trained router's logits are O(1): scaled so that every pick's contribution is measurable."""
    for layer in m.layers:
        layer.gate_w = (layer.gate_w.astype(np.float32) / 16).astype(np.float16)
    return m


def attach(model, R, st, **kw):
    from adapters.exl3xpu.attach import attach as attach_
    return attach_(model, R, st, record=True, **kw)


def inputs(spec, seed=11):
    rng = np.random.default_rng(seed)
    return [[rng.standard_normal((ROWS, spec.hidden)).astype(np.float16).astype(np.float32)
             for _ in range(spec.moe_layers)] for _ in range(STEPS)]


def reference(tiny, o, x, ids, w, skip=()):
    """float64 output of MoE layer ``o`` for rows x under the router's ids and weights, from the synthetic
    checkpoint's generator (synth_exl3.expert: not the files, records or slots) and its gated shared expert: the
    routed sum (less the keys in ``skip``) plus the shared expert."""
    from moetier.bytes import exl3, synth_exl3
    spec, _, _, t = tiny
    mk = synth_exl3.moe_prefixes(spec)[o]
    xn = np.asarray(x, np.float64)
    shared = exl3.Exl3Expert(*(exl3.Exl3Linear(t[f"{mk}.shared_expert.{p}_proj.trellis"],
                                               t[f"{mk}.shared_expert.{p}_proj.suh"],
                                               t[f"{mk}.shared_expert.{p}_proj.svh"]) for p in ("gate", "up", "down")))
    g = 1.0 / (1.0 + np.exp(-(xn @ t[f"{mk}.shared_expert_gate.weight"].astype(np.float64).T)))
    y = g * exl3.expert_forward(xn, shared, None)
    for r in range(xn.shape[0]):
        for j in range(ids.shape[1]):
            e = int(ids[r, j])
            if o * spec.experts + e not in skip:
                y[r] += exl3.expert_forward(xn[r:r + 1], synth_exl3.expert(spec, o, e), None, float(w[r, j]))[0]
    return y


def run(model, att, xs, step_end=False):
    """Every step's every layer forward; (output, the router's ids and weights) per call."""
    out = []
    for step in xs:
        row = []
        for o, layer in enumerate(model.layers):
            y = layer.forward(step[o])
            ids, w = att.routing[o]
            row.append((y, ids, w))
        out.append(row)
        if step_end:
            att.step_end()
    return out


@pytest.mark.parametrize("split", list(SPLITS))
def test_layer_output_matches_float64_under_each_split(tiny, engine, split):
    spec, _, st, _ = tiny
    att = attach(engine, recipe(*SPLITS[split]), st)
    xs = inputs(spec)
    assert_within(run(engine, att, xs), xs, lambda *a: reference(tiny, *a))
    lanes = lane_counts(att)
    assert len(att.deals) == STEPS * spec.moe_layers
    assert_split_lanes(split, lanes)
    engine_picks = lanes["gpu"] + lanes["zerocopy"] + lanes["nvme_gpu"]
    assert (att.ops.calls["pairs"] > 0) == (engine_picks > 0)
    att.detach()


def test_exact_mode_runs_every_pick_on_the_kernel(tiny, engine):
    spec, _, st, _ = tiny
    att = attach(engine, recipe(*SPLITS["ram-only"]), st, exact=True)
    xs = inputs(spec, seed=5)
    got = run(engine, att, xs)
    assert all(not d["cpu"] and not d["nvme_cpu"] for *_, d in att.deals)
    assert lane_counts(att)["zerocopy"] > 0
    assert_within(got, xs, lambda *a: reference(tiny, *a))
    att.detach()


def test_mask_equals_exact_minus_masked_contributions(tiny, engine):
    spec, _, st, _ = tiny
    att = attach(engine, recipe(*SPLITS["nvme-tail"], exact="mask"), st)
    xs = inputs(spec, seed=7)
    assert_mask_is_exact_less_masked(att, run(engine, att, xs), xs, lambda *a, **kw: reference(tiny, *a, **kw))
    att.detach()


@pytest.mark.parametrize("split", ["nvme-tail", "nvme-tail-no-vram", "ram-only"])
def test_lane_deal_equals_the_simulators(tiny, engine, split):
    spec, _, st, _ = tiny
    att = attach(engine, recipe(*SPLITS[split]), st)
    run(engine, att, inputs(spec, seed=13))
    assert_deals_replay(att)
    assert len(att.deals) == STEPS * spec.moe_layers
    att.detach()


def test_kernel_reads_only_rows_at_landed_slots_and_never_moetiers_picks(tiny, engine):
    """As moe_forward runs: every pick it gets with a nonzero weight has its row on the slot holding that key's
    landed bytes; every pick of moetier's lanes reaches it with weight 0."""
    spec, _, st, _ = tiny
    att = attach(engine, recipe(*SPLITS["nvme-tail"]), st)
    seen = {"engine": 0, "masked": 0}
    moe_forward0 = att.ops.moe_forward

    def moe_forward(x, topk_ids, topk_w, ptrs, I, K, n_experts):  # noqa: E741
        _, o, _, dealt = att.deals[-1]
        mine = set(dealt["gpu"] + dealt["zerocopy"] + dealt["nvme_gpu"])
        routed, _ = att.routing[o]
        L, rt, be = att.rt.L, att.rt, att.backend
        for r in range(topk_ids.shape[0]):
            for j in range(topk_ids.shape[1]):
                k = o * spec.experts + int(routed[r, j])
                if topk_w[r, j] == 0:
                    assert k not in mine
                    seen["masked"] += 1
                    continue
                assert k in mine and int(topk_ids[r, j]) == int(routed[r, j])
                row = int(ptrs[int(topk_ids[r, j])])
                if not (L.state_of(k) == "vram" and row == be.vram_address(rt.vram_slot[k])):
                    assert k in rt.ram_slot and row == be.ram_address(rt.ram_slot[k]), (k, L.state_of(k))
                seen["engine"] += 1
        return moe_forward0(x, topk_ids, topk_w, ptrs, I, K, n_experts)

    att.ops.moe_forward = moe_forward
    run(engine, att, inputs(spec, seed=17))
    assert seen["engine"] > 0 and seen["masked"] > 0, seen
    att.detach()


@pytest.mark.parametrize("mode", ["eager", "graph"])
def test_residency_rule_through_the_adapter_under_adversarial_timing(tiny, engine, mode):
    """The conformance suite's Chaos wrapper (delayed and reordered completions) around the adapter's backend, with
    its two instruments: every slot a lane (the kernel's included) is handed holds bytes the host saw land, and
    Ledger.land only follows a landed handle - in eager mode and while graph mode plans one step behind."""
    spec, _, st, _ = tiny
    with chaos_instruments(seed=5) as (wrap, box):
        if mode == "eager":
            att = attach(engine, recipe(4, 10), st, wrap=wrap)
        else:
            att = attach(engine, recipe(4, 6), st, mode="graph", prior=range(6, 16), wrap=wrap)
        run(engine, att, inputs(spec, seed=19), step_end=mode == "graph")
    chaos = box["chaos"]
    assert chaos.n["computed"] > 0 and chaos.n["landed_checks"] > 0, chaos.n
    att.detach()


def test_gpu_and_zerocopy_lanes_are_bit_identical(tiny, engine):
    """The same kernel reading the same bytes through rows pointing at a VRAM slot or at a RAM slot: identical."""
    spec, _, st, _ = tiny
    xs = inputs(spec, seed=23)
    outs = {}
    for name, (vram, ram) in (("gpu", SPLITS["all-resident"]), ("zerocopy", SPLITS["ram-only"])):
        att = attach(engine, recipe(vram, ram), st, exact=True)
        outs[name] = [[y for y, _, _ in step] for step in run(engine, att, xs)]
        assert {ln for *_, d in att.deals for ln, keys in d.items() if keys} == {name}
        att.detach()
    for a, b in zip(outs["gpu"], outs["zerocopy"]):
        for ya, yb in zip(a, b):
            assert np.array_equal(ya, yb)


def test_attach_refuses_a_recipe_that_does_not_fit_the_model(tiny, engine):
    from moetier.errors import UserError
    _, _, st, _ = tiny
    with pytest.raises(UserError, match=r"^recipe tiny-ci-cuda: moe.experts is 32 but the exl3xpu model has 16$"):
        attach(engine, dataclasses.replace(recipe(8, 12), experts=32), st)
    with pytest.raises(UserError, match=r"policy.prefetch.depth > 0 is not supported"):
        attach(engine, recipe(8, 12, prefetch={"depth": 1, "predictor": "recall", "recall": 0.5, "budget": 4}), st)


def test_attach_refuses_an_op_table_without_an_op_it_calls(tiny):
    """A fake op table lacking memcpy_async (the model loads on it: load needs only host_alloc) is refused at attach
    with one line naming the op, before anything is hooked."""
    from adapters.exl3xpu import model
    from moetier.errors import UserError
    from tests.test_adapter_exl3xpu_surface import MissingOp
    _, path, st, _ = tiny
    m = model.build_model(path, MissingOp("memcpy_async"))
    with pytest.raises(UserError) as e:
        attach(m, recipe(*SPLITS["nvme-tail"]), st)
    assert str(e.value) == ("attach: the op table does not offer the pinned exl3xpu surface: fake table without "
                            "memcpy_async: memcpy_async: missing (fake table without memcpy_async has no op "
                            "'memcpy_async') [exl3xpu_moe.memcpy_async]")
    assert all("apply" not in layer.method.__dict__ for layer in m.layers)


def test_detach_restores_apply_and_the_home_rows(tiny, engine):
    spec, _, st, _ = tiny
    home = [m.method.ptrs.copy() for m in engine.layers]
    att = attach(engine, recipe(*SPLITS["nvme-tail"]), st)
    run(engine, att, inputs(spec, seed=29)[:1])
    assert any(not np.array_equal(m.method.ptrs, h) for m, h in zip(engine.layers, home))
    att.detach()
    assert all(np.array_equal(m.method.ptrs, h) for m, h in zip(engine.layers, home))
    assert all("apply" not in m.method.__dict__ for m in engine.layers)


def test_graph_mode_computes_only_published_rows_and_observes_landings_one_step_behind(tiny, engine):
    """Graph decode: within a step the kernel sees one device state (the rows and flags published after the step
    before); a pick whose key was not published is masked (weight 0) and logged as a miss, so the output is the exact
    one less the misses; the host plans the step after its replay and the misses' bytes land then, so they are
    computed from the next step on - never during the step that missed them."""
    spec, _, st, _ = tiny
    att = attach(engine, recipe(4, 6), st, mode="graph", prior=range(6, 16))
    seen = []
    moe_forward0 = att.ops.moe_forward

    def moe_forward(x, topk_ids, topk_w, ptrs, I, K, n_experts):  # noqa: E741
        seen.append((att.dev_ok.copy(), ptrs.copy()))
        return moe_forward0(x, topk_ids, topk_w, ptrs, I, K, n_experts)

    att.ops.moe_forward = moe_forward
    xs = inputs(spec, seed=31)
    got = run(engine, att, xs, step_end=True)
    assert len(att.misses) == STEPS and len(att.published) == STEPS + 1
    assert all(not d["cpu"] and not d["nvme_cpu"] for *_, d in att.deals)
    total = 0
    for s, step in enumerate(got):
        dev = set(att.published[s])
        picked = {o * spec.experts + int(e) for o, (_, ids, _) in enumerate(step) for e in ids.reshape(-1)}
        assert att.misses[s] == sorted(picked - dev)
        assert set(att.misses[s]) <= set(att.published[s + 1])       # landed while planning step s: seen at s + 1
        flags = [seen[s * spec.moe_layers + o][0] for o in range(spec.moe_layers)]
        assert all(np.array_equal(f, flags[0]) for f in flags) and set(np.flatnonzero(flags[0])) == dev
        for o, (y, ids, w) in enumerate(step):
            less = reference(tiny, o, xs[s][o], ids, w, skip=set(att.misses[s]))
            assert rel_rms(y, less) < 2e-3, (s, o)
        total += len(att.misses[s])
    assert total > 0 and len(att.misses[0]) > 0
    att.detach()



@pytest.mark.parametrize("split", ["all-resident", "nvme-tail"])
def test_layer_output_on_the_sycl_provider(tiny, split):
    """The same path with the ops on moetier's SYCL EXL3 kernel (the OpenCL CPU device in CI): within rel RMS 2e-3 of
    float64, and gpu picks bit-identical to the CPU provider's."""
    import os
    import sys
    os.environ.setdefault("OCL_ICD_FILENAMES", sys.prefix + "/lib/libintelocl.so")
    pytest.importorskip("dpctl", reason="the SYCL provider needs dpctl (the sycl extra)")
    from adapters.exl3xpu import model, ops, surface
    spec, path, st, _ = tiny
    table = surface.op_table(st)
    assert isinstance(table, ops.SyclOps), table.provider
    assert surface.check(table).ok
    m = tempered(model.build_model(path, table))
    att = attach(m, recipe(*SPLITS[split]), st)
    xs = inputs(spec, seed=41)
    got = run(m, att, xs)
    worst = max(rel_rms(y, reference(tiny, o, xs[s][o], ids, w))
                for s, step in enumerate(got) for o, (y, ids, w) in enumerate(step))
    assert worst < 2e-3, worst
    assert table.calls["pairs"] > 0 and table.sycl.stats["kernel_calls"] > 0
    att.detach()
    table.close()
