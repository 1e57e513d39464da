"""The shipped GLM trace reproduces the reference's published figures with the reference's semantics.

This is the acceptance check of the generator fit (docs/traces.md): oracle seeding and the reference's tier policy
(global LRU RAM, CLOCK VRAM), all-in-RAM within 5% of
27.5 / 32.9 / 36.3 tok/s and 55 GB within 10% of 23.4 / 30.1 / 33.4 at C1 / C2 / C4.
"""
import pytest

from moetier.core import sim
from moetier.core import records as spec
from moetier.peers.rows import reference_overrides
from moetier.traces.format import load_trace

PUBLISHED = {230: ((27.5, 32.9, 36.3), 0.05), 55: ((23.4, 30.1, 33.4), 0.10)}
# the reference's engine ran a global LRU RAM tier and a CLOCK VRAM cache that always admits: the published rows were
# measured under that policy, so the fit is checked under it (the recipe's own policy is moetier's, docs/peers.md)
REFERENCE_POLICY = reference_overrides()


@pytest.fixture(scope="module")
def glm():
    R = spec.resolve("glm53-rtx3090-55g-nvx4")
    tr = load_trace(spec.REGISTRY.parent / R.trace, layers=R.layers, experts=R.experts, topk=R.topk,
                    model_id=R.model_id)
    return tr


def test_glm_trace_shape_and_provenance(glm):
    assert glm.ids.shape[1:] == (42, 8) and glm.ids.shape[0] >= 4000 and glm.nseg >= 4
    assert glm.meta["source"] == "moetier.tracegen" and "params" in glm.meta and "fit" in glm.meta


@pytest.mark.parametrize("ram_gb", [230, 55])
def test_oracle_sim_matches_published_rows(glm, ram_gb):
    want, tol = PUBLISHED[ram_gb]
    R = spec.resolve("glm53-rtx3090-55g-nvx4", [f"budget.ram_gb={ram_gb}", "policy.seed=oracle"] + REFERENCE_POLICY)
    for conc, w in zip((1, 2, 4), want):
        got = sim.run(R, glm, conc)["tok_s"]
        assert abs(got / w - 1) <= tol, (ram_gb, conc, got, w)


def test_qwen_trace_resolves_and_simulates():
    R = spec.resolve("qwen38fn-arcb70-16g-nvx4")
    tr = load_trace(spec.REGISTRY.parent / R.trace, layers=R.layers, experts=R.experts, topk=R.topk)
    assert tr.ids.shape[1:] == (48, 10)
    o = sim.run(R, tr, 1, max_steps=50)
    assert o["tok_s"] > 0 and o["masked_per_tok"] > 0  # the 16 GB recipe is lossy (mask)
