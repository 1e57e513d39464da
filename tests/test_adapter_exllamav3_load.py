"""moetier_load on a CPU: the tiny synthetic EXL3 MoE loaded through exllamav3 1.6.5's own loader
(``BlockSparseMLP.load`` -> ``Linear.load_exl3`` -> ``SafetensorsCollection``) with the routed experts redirected to
moetier's slots, so that none of their bytes is read from the checkpoint; then decoded as the attach tests decode."""
from __future__ import annotations

import dataclasses
import functools
import json
import os
import subprocess
import sys
from contextlib import contextmanager

import numpy as np
import pytest

from tests._exllamav3 import needs_engine
from tests.adapter_checks import SPLITS, assert_split_lanes, assert_within, lane_counts, recipe
from tests.test_adapter_exllamav3_attach import STEPS, inputs, reference, run, tiny  # noqa: F401 (tiny: fixture)

pytestmark = needs_engine

ROUTED = ".mlp.experts."        # the GLM layout's routed expert tensors (synth_exl3)


class CountingFile:
    """A counting fake of the file the engine's loader opens: records every (offset, size) it reads."""

    def __init__(self, f, reads: list):
        self._f, self._reads, self._pos = f, reads, 0

    def seek(self, pos, whence=0):
        self._pos = self._f.seek(pos, whence)
        return self._pos

    def read(self, n=-1):
        b = self._f.read(n)
        self._reads.append((self._f.name, self._pos, len(b)))
        self._pos += len(b)
        return b

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._f.close()

    def __getattr__(self, name):
        return getattr(self._f, name)


@contextmanager
def counting_reads(monkeypatch):
    """Counting fakes around the engine's checkpoint reader: every key ``SafetensorsCollection.get_tensor`` loads
    and every byte range read through the loader module's ``open``."""
    import builtins
    from adapters.exllamav3.surface import import_engine
    import_engine()
    import exllamav3.loader.safetensors as sf
    seen = {"keys": [], "reads": []}
    get0 = sf.SafetensorsCollection.get_tensor

    @functools.wraps(get0)                 # the engine's signature: attach checks the hook surface
    def get_tensor(self, key, *a, **kw):
        seen["keys"].append(key)
        return get0(self, key, *a, **kw)

    def counting_open(path, mode="r", *a, **kw):
        f = builtins.open(path, mode, *a, **kw)
        return CountingFile(f, seen["reads"]) if "b" in mode and str(path).endswith(".safetensors") else f

    monkeypatch.setattr(sf.SafetensorsCollection, "get_tensor", get_tensor)
    monkeypatch.setattr(sf, "open", counting_open, raising=False)
    yield seen


def routed_ranges(stc) -> list:
    """(file, start, end) of every routed expert tensor's data in the checkpoint (from its headers only)."""
    out = []
    for key, fname in stc.tensor_file_map.items():
        if ROUTED in key:
            h = stc.file_headers[fname]
            beg, end = h[key]["data_offsets"]
            out.append((fname, h["_header_offset"] + beg, h["_header_offset"] + end))
    return out


@contextmanager
def loaded(spec, path, st, R, **kw):
    """The tiny model built from exllamav3's classes and loaded by moetier_load, detached after; the engine's load is
    its own ``BlockSparseMLP.load`` plus, on the CPU, the kernels' state built with the fakes (what ``load`` does on
    CUDA)."""
    from adapters.exllamav3 import checkpoint
    from adapters.exllamav3.attach import moetier_load
    from tests.exllamav3_fakes import FakeEngine
    with FakeEngine(spec) as fake:
        model = checkpoint.build_model(path, load=False)

        def engine_load():
            model.load("cpu")
            fake.load(model)

        att = moetier_load(model, R, st, engine_load, record=True, **kw)
        fake.memory.add_tensor(att.backend.arena)
        fake.memory.add(att.backend.pool.base, att.backend.pool.nbytes)
        try:
            yield model, fake, att
        finally:
            att.detach()


@pytest.mark.parametrize("split", list(SPLITS))
def test_load_reads_no_routed_expert_and_matches_float64(tiny, split, monkeypatch):
    spec, path, st, _ = tiny
    with counting_reads(monkeypatch) as seen, loaded(spec, path, st, recipe(*SPLITS[split])) as (model, _, att):
        stc = model.config.stc
        assert seen["keys"] and not [k for k in seen["keys"] if ROUTED in k], "a routed expert went to get_tensor"
        ranges = routed_ranges(stc)
        assert len(ranges) == spec.moe_layers * spec.experts * 3 * 4      # trellis, suh, svh, mul1 marker
        hits = [(f, a, n) for f, a, n in seen["reads"] for g, lo, hi in ranges if f == g and a < hi and lo < a + n]
        assert seen["reads"] and not hits, f"{len(hits)} checkpoint reads touched routed expert bytes"
        assert any(k.endswith("shared_experts.gate_proj.trellis") for k in seen["keys"])   # the fakes count
        L, E = spec.moe_layers, spec.experts
        assert att.redirected == L * E * 9 and att.handed_over == L * E
        assert set(att.engine_expert_bytes().values()) == {0}
        xs = inputs(spec)
        assert_within(run(model, att, xs), xs, lambda *a: reference(tiny, *a))
        assert att.bypassed == 0 and len(att.deals) == STEPS * L
        assert_split_lanes(split, lane_counts(att))


def test_loaded_tables_hold_the_vram_tier_and_the_placeholder(tiny):
    """After moetier_load the engine's tables were built over the redirected tensors: a VRAM-tier expert's rows are
    its slot, every other expert's the shared bounce record (the same rows attach's hand-over leaves)."""
    from tests.test_adapter_exllamav3_attach import _home_rows
    spec, path, st, _ = tiny
    with loaded(spec, path, st, recipe(*SPLITS["nvme-tail"])) as (model, _, att):
        L, rt, be = att.rt.L, att.rt, att.backend
        vram = {k for k in range(att.R.keys) if L.state_of(k) == "vram"}
        assert 0 < len(vram) < att.R.keys
        for o, t in enumerate(att.tables):
            for e, home in enumerate(_home_rows(t)):
                k = o * spec.experts + e
                base = be.vram_address(rt.vram_slot[k]) if k in vram else int(att.bounce.data_ptr())
                assert home == be.addresses(base) == t.row(e), (k, k in vram)
                assert np.array_equal(be.read_vram(rt.vram_slot[k]) if k in vram else att.bounce.numpy(),
                                      _record_or_zeros(st, k, k in vram))


def _record_or_zeros(st, k, resident):
    from tests.adapter_checks import record
    return record(st, k) if resident else np.zeros(st.record_bytes, np.uint8)


def test_a_store_of_another_model_is_one_line(tiny, tmp_path):
    from moetier.bytes import store
    from moetier.errors import UserError
    spec, path, st, _ = tiny
    other = tmp_path / "store"
    store.pack_checkpoint(path, other)
    mpath = other / "manifest.json"
    m = json.loads(mpath.read_text())
    m["source"]["moe_layers"][1] = "model.language_model.layers.7.mlp"
    mpath.write_text(json.dumps(m))
    with pytest.raises(UserError, match=r"^store .*: manifest source.moe_layers has no "
                                        r"'model.language_model.layers.2.mlp' \(the store was packed from another"):
        with loaded(spec, path, store.open_store(other), recipe(8, 12)):
            pass


# -- (c) a model whose routed experts exceed the recipe's VRAM + RAM loads in bounded memory ----------------------
BIG = {"hidden": 1024, "inter": 512, "experts": 128}      # 2 x 128 experts of ~0.6 MB: ~150 MB routed
BIG_SLOTS = (4, 8)                                          # VRAM, RAM slots: 12 of 256 experts


def _status() -> dict:
    with open("/proc/self/status") as f:
        return {k: int(v.split()[0]) << 10 for k, v in (ln.split(":", 1) for ln in f) if k in ("VmHWM", "VmRSS")}


def _peak_growth(fn) -> int:
    """Bytes the process's peak RSS rose above its RSS before ``fn()`` (the peak reset first)."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    before = _status()["VmRSS"]
    fn()
    return _status()["VmHWM"] - before


def rss_probe(work: str) -> None:
    """Run in a child process: the big model loaded with moetier_load, then (as a control) by the engine's plain
    load; prints {"moetier": peak growth, "plain": peak growth, "slots": slot bytes} as JSON."""
    import torch  # noqa: F401  (imported before measuring, as everything the load itself does not need)
    from adapters.exllamav3 import checkpoint
    from adapters.exllamav3.attach import moetier_load
    from moetier.bytes import store
    import moetier.run.runtime  # noqa: F401
    from moetier.core.replay import Replay
    from tests.exllamav3_fakes import FakeEngine
    # the ledger's compiled code loaded before measuring too: a fixed cost of the process, not of the model's size
    warm = Replay(_big_recipe()).ledger
    warm.seed(range(warm.keys))
    spec = dataclasses.replace(checkpoint.TINY, **BIG, seed=1)
    st = store.open_store(f"{work}/store")
    out = {}
    with FakeEngine(spec) as fake:
        model = checkpoint.build_model(f"{work}/ckpt", load=False)
        box = {}

        def go():
            box["att"] = moetier_load(model, _big_recipe(), st, lambda: (model.load("cpu"), fake.load(model)))
        out["moetier"] = _peak_growth(go)
        att = box["att"]
        # the VRAM arena, the bounce record and the RAM slots seeding fills (its staging slots among them)
        out["slots"] = att.backend.arena.numel() + att.bounce.numel() + st.record_bytes * sum(BIG_SLOTS)
        att.detach()
        plain = checkpoint.build_model(f"{work}/ckpt", load=False)
        out["plain"] = _peak_growth(lambda: plain.load("cpu"))
    print(json.dumps(out))


def _big_recipe():
    R = recipe(*BIG_SLOTS)
    return dataclasses.replace(R, experts=BIG["experts"])


def test_a_model_larger_than_its_tiers_loads_in_bounded_memory(tmp_path):
    """The big model's routed experts (~150 MB) are 20x the recipe's VRAM + RAM slots: moetier_load's peak RSS
    growth stays within the slots plus the non-expert weights (plus a fixed margin), while the engine's plain load
    of the same checkpoint grows by at least its routed experts (the measurement can see a full load)."""
    from adapters.exllamav3 import checkpoint
    from adapters.exllamav3.surface import import_engine
    from moetier.bytes import store, synth_exl3
    import_engine()
    from exllamav3.loader.safetensors import SafetensorsCollection
    if not os.path.exists("/proc/self/clear_refs"):
        pytest.skip("needs Linux /proc/self/clear_refs to reset the peak RSS")
    spec = dataclasses.replace(checkpoint.TINY, **BIG, seed=1)
    synth_exl3.write_checkpoint(tmp_path / "ckpt", spec)
    store.pack_checkpoint(tmp_path / "ckpt", tmp_path / "store")
    stc = SafetensorsCollection(str(tmp_path / "ckpt"), load_method="python")
    routed = sum(hi - lo for _, lo, hi in routed_ranges(stc))
    total = sum(os.path.getsize(f) for f in stc.tensor_files)
    rb = store.open_store(tmp_path / "store").record_bytes
    assert routed > 20 * rb * sum(BIG_SLOTS)
    env = dict(os.environ, PYTHONPATH=os.getcwd())
    res = subprocess.run([sys.executable, "-c", "from tests.test_adapter_exllamav3_load import rss_probe; "
                          f"rss_probe({str(tmp_path)!r})"], capture_output=True, text=True, env=env, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    got = json.loads(res.stdout.strip().splitlines()[-1])
    bound = got["slots"] + (total - routed) + (24 << 20)
    assert got["moetier"] < bound, (got, bound, routed)
    assert got["plain"] > 0.9 * routed, (got, routed)


def _redirected_load(tiny, layout):
    """The tiny model's blocks loaded by the engine inside a Redirect whose every home is one zeroed record."""
    import torch
    from adapters.exllamav3 import checkpoint, redirect
    spec, path, st, _ = tiny
    model = checkpoint.build_model(path, load=False)
    home = torch.zeros(st.record_bytes, dtype=torch.uint8)
    with redirect.Redirect(model.modules, layout, lambda o, e: home) as rd:
        model.load("cpu")
    return rd


def test_a_store_whose_records_do_not_fit_the_checkpoint_is_one_line(tiny):
    from moetier.errors import UserError
    _, _, st, _ = tiny
    lay = st.layout
    off, nb, dt, shape = lay.sections["up_trellis"]
    bent = dict(lay.sections, up_trellis=(off, nb, dt, (shape[1], shape[0], shape[2])))
    with pytest.raises(UserError, match=r"^checkpoint .*: model\.language_model\.layers\.1\.mlp\.experts\.0\.up_proj"
                                        r"\.trellis is torch\.int16 \[16, 8, 48\] but the store's up_trellis is "
                                        r"torch\.int16 \[8, 16, 48\] \(the store was packed from another"):
        _redirected_load(tiny, dataclasses.replace(lay, sections=bent))
    with pytest.raises(UserError, match=r"\.mul1 marks the mul1 codebook but the store's records are mcg$"):
        _redirected_load(tiny, dataclasses.replace(lay, codebook="mcg"))
    rd = _redirected_load(tiny, lay)
    assert rd.served == 2 * 16 * 9 and rd.markers == 2 * 16 * 3 and rd.check() == 2 * 16
    assert not any("get_tensor" in vars(stc) for stc in rd.stcs)        # the collections are as they were


def test_blocks_take_their_ordinal_from_the_store_manifest(tiny):
    """A model's blocks in another order, and an MTP block past the trunk, map through source.moe_layers."""
    from types import SimpleNamespace

    from adapters.exllamav3.redirect import ordered
    from moetier.errors import UserError
    _, _, st, _ = tiny
    names = st.manifest["source"]["moe_layers"]
    blocks = [SimpleNamespace(key=k) for k in names]
    mtp = SimpleNamespace(key="model.language_model.layers.3.mlp")
    fake_store = SimpleNamespace(path="S", layers=2, manifest={"source": {"moe_layers": names + [mtp.key]}})
    assert ordered([mtp, blocks[1], blocks[0]], fake_store) == blocks
    with pytest.raises(UserError, match=r"^store S: MoE ordinal 1 \(model\.language_model\.layers\.2\.mlp\) has no "
                                        r"BlockSparseMLP in the model$"):
        ordered([blocks[0]], fake_store)
    assert ordered(blocks[::-1], SimpleNamespace(path="S", layers=2, manifest={})) == blocks[::-1]
