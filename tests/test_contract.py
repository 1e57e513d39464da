"""The backend contract is the whole seam: the backends implement all of it, the runtime uses nothing else,
routing goes through it (a real top-k router on the store's router weights, or a trace replay), the shared
sequence watermark holds, and a separately installed distribution adds a backend through the entry-point group."""
from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import numba  # noqa: F401  (the cpu extra: a missing install fails, it does not skip)

from moetier.bytes import store
from moetier.bytes.transport import TransportError
from moetier.core import records as spec
from moetier.errors import UserError
from moetier.run import registry, runtime
from moetier.run.contract import OPTIONAL, Backend, Router
from moetier.run.events import Sequencer
from moetier.run.router import StoreRouter, TraceRouter, topk_scores
from moetier.traces.format import load_trace

ROOT = Path(__file__).resolve().parents[1]
RECIPE = "tiny-ci-cpu"


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    R = spec.resolve(RECIPE)
    d = tmp_path_factory.mktemp("store") / "tiny"
    store.pack(R.model, str(d))
    return R, str(d)


@pytest.fixture
def cpu(packed):
    R, d = packed
    be = registry.get_backend("cpu", store.open_store(d, model=R.model), ram_slots=R.keys + 64)
    yield be
    be.close()


# -- the contract is complete ------------------------------------------------------------------------------------
def test_cpu_backend_implements_every_contract_member(cpu):
    assert isinstance(cpu, Backend) and isinstance(cpu, Router)
    h = cpu.fill(3, 0)
    cpu.wait(h)
    assert (h.key, h.state, h.prefetch) == (3, "landed", False) and h.t_landed >= h.t_submit > 0


def test_runtime_reaches_no_further_than_the_contract():
    """No getattr probing: every backend member the runtime (its step loop, layer, waits and books) touches is
    declared in the contract: required (the Protocol) or optional (with its default)."""
    declared = set(Backend.__annotations__) | {n for n in vars(Backend) if not n.startswith("_")} | set(OPTIONAL)
    used: set = set()
    for name in ("runtime", "layer", "waits", "booking"):
        tree = ast.parse((ROOT / f"moetier/run/{name}.py").read_text(encoding="utf-8"))
        probes = [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", "") in
                  ("getattr", "hasattr")]
        assert not probes, f"moetier/run/{name}.py probes attributes at lines {probes}"
        used |= {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Attribute)
                 and n.value.attr == "be"} | {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)
                                              and isinstance(n.value, ast.Name) and n.value.id in ("be", "backend")}
    assert used and used <= declared, f"the runtime uses backend members the contract lacks: {used - declared}"


# -- routing ------------------------------------------------------------------------------------------------------
def _reference(logits, k, scoring, renorm):
    out_ids, out_w = [], []
    for row in logits.astype(np.float64):
        s = np.exp(row - row.max()) / np.exp(row - row.max()).sum() if scoring == "softmax" else 1 / (1 + np.exp(-row))
        ids = sorted(range(len(row)), key=lambda e: (-s[e], e))[:k]
        w = np.array([s[e] for e in ids])
        out_ids.append(ids)
        out_w.append(w / w.sum() if renorm else w)
    return np.array(out_ids), np.array(out_w)


@pytest.mark.parametrize("scoring", ["softmax", "sigmoid"])
@pytest.mark.parametrize("renorm", [True, False])
def test_topk_scores_match_the_definition(scoring, renorm):
    logits = np.random.default_rng(1).standard_normal((5, 16)).astype(np.float32)
    logits[0, 3] = logits[0, 7]                      # a tie: the lower expert id wins
    ids, w = topk_scores(logits, 4, scoring, renorm)
    rid, rw = _reference(logits, 4, scoring, renorm)
    assert (ids == rid).all()
    np.testing.assert_allclose(w, rw, rtol=1e-6)
    if renorm:
        np.testing.assert_allclose(w.sum(axis=1), 1.0, rtol=1e-6)


def test_backend_routes_with_the_store_router_weights(cpu, packed):
    R, d = packed
    x = np.random.default_rng(2).standard_normal((3, cpu.layout.hidden)).astype(np.float32)
    ids, w = cpu.route(5, x)
    W = store.open_store(d).router(5)
    rid, rw = _reference(x @ W.T, R.topk, "softmax", True)
    assert np.array(ids).tolist() == rid.tolist()
    np.testing.assert_allclose(np.array(w), rw, rtol=1e-5)
    assert len(set(np.array(ids)[:, 0])) > 1, "different states route to different experts"


def test_router_weights_are_checksummed(tmp_path, packed):
    R, _ = packed
    d = tmp_path / "s"
    store.pack(R.model, str(d))
    raw = bytearray((d / "router.bin").read_bytes())
    raw[100] ^= 0x40
    (d / "router.bin").write_bytes(bytes(raw))
    with pytest.raises(UserError, match="router weights fail their checksum"):
        StoreRouter(store.open_store(str(d))).route(0, np.zeros((1, R.model["store"]["hidden"]), np.float32))


def test_sigmoid_scoring_comes_from_the_model_record(tmp_path, packed):
    R, _ = packed
    model = json.loads(json.dumps(R.model))
    model["moe"]["router"] = {"scoring": "sigmoid", "renormalize": False}
    store.pack(model, str(tmp_path / "s"))
    rec = store.open_store(str(tmp_path / "s")).router_record()
    assert (rec["scoring"], rec["renormalize"], rec["topk"]) == ("sigmoid", False, R.topk)
    model["moe"]["router"] = {"scoring": "relu"}
    with pytest.raises(UserError, match="moe.router.scoring"):
        store.pack(model, str(tmp_path / "t"))


def test_trace_router_replays_the_trace(packed):
    R, _ = packed
    tr = load_trace(ROOT / R.trace, layers=R.layers, experts=R.experts, topk=R.topk)
    from moetier.core.sim import Streams
    streams = Streams(tr, 2, R.topk, R.experts, offsets=[0, 5])
    rows = streams.rows(3)
    ids, w = TraceRouter(tr, streams, R.topk).route(2, None, rows)
    assert ids == [streams.local[i][t][2] for i, t in rows] and len(w) == 2 and len(w[0]) == R.topk


def test_a_live_routed_run_is_deterministic(packed):
    R, d = packed
    tr = load_trace(ROOT / R.trace, layers=R.layers, experts=R.experts, topk=R.topk)
    digests = []
    for _ in range(2):
        be = registry.get_backend("cpu", store.open_store(d, model=R.model), ram_slots=R.keys + 64)
        try:
            res = runtime.run(R, be.store, be, tr, 2, max_steps=4, router=be)
        finally:
            be.close()
        digests.append(res["digests"])
        assert res["checksum_failures"] == 0 and res["reads_per_token"] > 0
    assert digests[0] == digests[1]
    be = registry.get_backend("cpu", store.open_store(d, model=R.model), ram_slots=R.keys + 64)
    try:
        replay = runtime.run(R, be.store, be, tr, 2, max_steps=4)
    finally:
        be.close()
    assert replay["digests"] != digests[0], "the live router's picks are its own, not the trace's"


# -- the shared sequence watermark ----------------------------------------------------------------------------------
class FakeReader:
    """A fake reader: fills complete when the test says so."""

    def __init__(self):
        self.comps = []

    def fill(self, key, slot, prefetch=False):
        c = type("FakeCompletion", (), {})()
        c.key, c.slot, c.state, c.prefetch, c.t_submit, c.t_landed = key, slot, "pending", prefetch, 0.0, 0.0
        self.comps.append(c)
        return c

    def cancel(self, c):
        if c.state == "pending" and c.prefetch:
            c.state = "cancelled"
            return True
        return False

    def landed(self, c):
        return c.state == "landed"

    def wait(self, c):
        return c


class FakeEvent:
    def __init__(self):
        self.done, self.error = False, None


def _poll(ev):
    if ev.error:
        raise RuntimeError(ev.error)
    return ev.done


def test_sequencer_watermark_and_failures():
    rd = FakeReader()
    sq = Sequencer(rd, _poll, lambda ev: _poll(ev), "fake")
    f1 = sq.fill(1, 0)
    ev = FakeEvent()
    c2 = sq.copy("push", 1, 0, 0, lambda: ev)
    f3 = sq.fill(2, 1, prefetch=True)
    assert [f1.seq, c2.seq, f3.seq] == [1, 2, 3] and sq.completed_seq() == 0
    rd.comps[0].state = "landed"
    assert sq.completed_seq() == 1 and not sq.landed(c2)
    assert sq.cancel(f3) and not sq.cancel(f1)
    assert sq.completed_seq() == 1                     # seq 2 still pending holds the watermark
    ev.error = "device lost"
    with pytest.raises(TransportError, match="push of key 1 failed: device lost"):
        sq.landed(c2)
    assert sq.completed_seq() == 3 and sq.copy_failures == 1 and sq.outstanding == 0
    sq.closed = True
    with pytest.raises(TransportError, match="closed"):
        sq.fill(3, 2)


# -- registration through entry points -------------------------------------------------------------------------------
FAKE_MODULE = '''"""A FAKE backend distribution for tests: the cpu backend under another name."""
from dataclasses import replace

from backends.cpu.backend import CpuBackend


class FakeCpuBackend(CpuBackend):
    def __init__(self, store, **kw):
        super().__init__(store, **kw)
        self.capabilities = replace(self.capabilities, name="fake-cpu", device="fake: " + self.capabilities.device)
'''


@pytest.fixture
def fake_dist(install_distribution):
    """A separately installed distribution (a dist-info directory on sys.path) registering backend 'fake-cpu'."""
    return install_distribution("fake-moetier-backend",
                                {"moetier.backends": {"fake-cpu": "fake_moetier_backend:FakeCpuBackend"}},
                                {"fake_moetier_backend.py": FAKE_MODULE})


def test_an_installed_distribution_adds_a_backend(fake_dist, packed):
    R, d = packed
    assert "fake-cpu" in registry.names() and {"cpu", "sycl", "cuda"} <= set(registry.names())
    be = registry.get_backend("fake-cpu", store.open_store(d), ram_slots=8)
    try:
        assert be.capabilities.name == "fake-cpu" and isinstance(be, Backend)
    finally:
        be.close()


def test_conformance_finds_the_registered_backend(fake_dist, tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(fake_dist), str(ROOT), os.environ.get("PYTHONPATH", "")])}
    rep = tmp_path / "rep.json"
    r = subprocess.run([sys.executable, "-m", "moetier", "conformance", "--backend", "fake-cpu", "-k",
                        "seq_monotonic or fill_lands", "--report", str(rep)], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    data = json.loads(rep.read_text())
    assert data["counts"]["pass"] >= 2 and data["counts"]["fail"] == 0
    assert "fake: " in json.dumps(data)


def test_an_unknown_backend_names_the_known_ones():
    with pytest.raises(Exception, match=r"unknown backend \(known: cpu, cuda,( exl3xpu, exllamav3,)? sycl\)"):
        registry.get_backend("no-such-backend", None, ram_slots=1)
