"""Fixtures of the conformance suite: the backend under test on small packed stores (int8, int4g32, exl3), and the CI
recipe's store for the runtime checks.

Slot map of a kit (one backend instance per encoding, shared by the whole session):
  RAM slots  0..NK-1   key k filled from NVMe into slot k (never modified by a test)
  RAM slots  NK..      scratch (tests fill/drain into these)
  VRAM slots 0..NK-1   key k pushed from RAM slot k (when the backend has a VRAM tier; never modified)
  VRAM slots NK..      scratch
"""
from __future__ import annotations

import os
import sys
import threading
import time

import numpy as np
import pytest

from conformance import capabilities as caps
from conformance import report
from moetier.run.contract import BackendUnavailable, ContractError

# the OpenCL CPU runtime of the venv, before dpctl's first device enumeration (same rule as backends.sycl)
if not os.environ.get("OCL_ICD_FILENAMES") and os.path.exists(sys.prefix + "/lib/libintelocl.so"):
    os.environ["OCL_ICD_FILENAMES"] = sys.prefix + "/lib/libintelocl.so"

SEED = 7
H, F = 256, 128
LAYERS, EXPERTS = 2, 8
NK = LAYERS * EXPERTS            # keys in a kit's store
RAM_SCRATCH = 16
VRAM_SCRATCH = 6
POISON = 0xA5                    # what a RAM slot holds before a copy into it (Kit.poison)
FENCE_DEADLINE_S = 10.0          # a fence (or close) over the suite's few small transfers takes milliseconds


def pytest_addoption(parser, pluginmanager):
    if not pluginmanager.is_registered(report) and not pluginmanager.has_plugin("conformance.report"):
        pluginmanager.register(report, "conformance.report")


def pytest_collection_modifyitems(config, items):
    """The perf section (figures, never a verdict) runs only with --perf."""
    if report.STATE.get("perf_on"):
        return
    perf = [it for it in items if it.get_closest_marker("perf")]
    if perf:
        config.hook.pytest_deselected(items=perf)
        items[:] = [it for it in items if not it.get_closest_marker("perf")]


EXL3_STORE = {"bits": 3, "codebook": "mul1", "act_limit": 10.0}   # GLM-5.3-Flash's experts, at small shapes


def small_model(enc: str, hidden: int = H, ffn: int = F) -> dict:
    return {"id": f"conformance-{enc}", "moe": {"layers": LAYERS, "experts": EXPERTS, "topk": 2},
            "store": {"hidden": hidden, "ffn": ffn, "encoding": enc, **(EXL3_STORE if enc == "exl3" else {})}}


def kit_geometry(name: str, enc: str) -> tuple[int, int]:
    """(hidden, ffn) of a kit: the backend's CI recipe's model where that model is of this encoding (an engine's
    kernels may take only some geometries: exl3xpu's moe_forward needs H and I multiples of 640), else H x F."""
    from moetier.core import records as spec
    store = spec.resolve(caps.recipe_id(name)).model["store"]
    return (int(store["hidden"]), int(store["ffn"])) if store["encoding"] == enc else (H, F)


def unavailable_skip():
    why = report.STATE.get("unavailable")
    if why:
        pytest.skip(f"UNAVAILABLE: {why}")


class Kit:
    """One backend instance over a small store of one encoding, with the canonical keys loaded."""

    def __init__(self, name: str, enc: str, root):
        from moetier.bytes import store
        self.enc = enc
        self.hidden, ffn = kit_geometry(name, enc)
        model = small_model(enc, self.hidden, ffn)
        out = os.path.join(root, f"store-{enc}")
        store.pack(model, out, seed=SEED)
        self.store = st = store.open_store(out, model=model)
        self.layout = st.layout
        self.rb = int(st.record_bytes)
        self.be = caps.open_backend(name, st, ram_slots=NK + RAM_SCRATCH, vram_slots=NK + VRAM_SCRATCH)
        self.vram = int(self.be.capabilities.vram_slots)
        self._recs: dict = {}
        self._refs: dict = {}

    def load(self):
        be = self.be
        for h in [be.fill(k, k) for k in range(NK)]:
            wait_within(be, h)
        if self.vram >= NK:
            for h in [be.push(k, k, k) for k in range(NK)]:
                wait_within(be, h)

    def rec(self, k: int) -> np.ndarray:
        """The record bytes of key k as the store holds them (read from the data file)."""
        r = self._recs.get(k)
        if r is None:
            with open(self.store.data_path, "rb") as f:
                f.seek(self.store.offset(k))
                r = self._recs[k] = np.frombuffer(f.read(self.rb), np.uint8)
        return r

    def ref(self, k: int, x: np.ndarray) -> np.ndarray:
        """float64 reference output of key k (moetier.bytes.expert.reference) for x."""
        import xxhash
        from moetier.bytes import expert
        x = np.ascontiguousarray(x)
        ck = (k, x.shape, x.dtype.str, xxhash.xxh3_128_hexdigest(x.tobytes()))   # the whole input, not a prefix
        r = self._refs.get(ck)
        if r is None:
            r = self._refs[ck] = expert.reference(self.layout, self.rec(k), x)
        return r

    def xrows(self, rows: int, seed: int = 0) -> np.ndarray:
        return xrows(rows, seed, self.hidden)

    def poison(self, slot: int, key: int) -> None:
        """Make RAM ``slot`` hold bytes other than key ``key``'s before a copy of that key into it: whatever the slot
        held (the key's bytes from an earlier fill or drain) would let a copy that never happened pass. The POISON
        byte through the ram_view hook when offered, else another key's record by a fill, the one write into a RAM
        slot the contract has."""
        view = caps.ram_reader(self.be)
        if view is not None:
            view(slot)[:] = POISON
        else:
            wait_within(self.be, self.be.fill((key + 1) % NK, slot))

    def close(self):
        close_within(self.be)


@pytest.fixture(scope="session")
def backend_name():
    return report.STATE["backend"]


@pytest.fixture(scope="session")
def kits(tmp_path_factory, backend_name):
    """kits(enc) -> a loaded Kit, or a skip (UNAVAILABLE: the backend's reason / NOT_SUPPORTED: the encoding), or a
    failure (a backend that breaks the contract: moetier.run.contract.ContractError)."""
    made: dict = {}
    root = str(tmp_path_factory.mktemp("kits"))

    def get(enc: str) -> Kit:
        unavailable_skip()
        if enc not in made:
            try:
                kit = Kit(backend_name, enc, root)
            except ContractError as e:    # the backend is there and breaks the contract: every check fails
                made[enc] = RuntimeError(str(e))
            except BackendUnavailable as e:
                report.STATE["unavailable"] = str(e)
                made[enc] = e
            else:
                if report.STATE.get("capabilities") is None:         # the backend's, whatever the encoding
                    report.STATE["capabilities"] = caps.table(kit.be)
                why = caps.encoding_skip(kit.be, enc)
                if why:
                    kit.close()
                    made[enc] = why
                else:
                    try:
                        kit.load()
                    except (Exception, pytest.fail.Exception) as e:  # fails every check that needs it, with why
                        made[enc] = RuntimeError(f"loading the canonical keys failed: {type(e).__name__}: {e}")
                    else:
                        made[enc] = kit
        got = made[enc]
        if isinstance(got, BackendUnavailable):
            pytest.skip(f"UNAVAILABLE: {got}")
        if isinstance(got, str):
            pytest.skip(got)
        if isinstance(got, Exception):
            raise got
        return got

    yield get
    for v in made.values():
        if isinstance(v, Kit):
            v.close()


def first_kit(kits, encs=("int8", "exl3")):
    """The kit of the first of ``encs`` the backend declares: int8 for moetier's backends, exl3 for the engine
    adapters' backends (which compute nothing else); the last one's skip reason when it declares none."""
    for enc in encs[:-1]:
        try:
            return kits(enc)
        except pytest.skip.Exception as e:
            if not str(e).startswith("NOT_SUPPORTED"):
                raise
    return kits(encs[-1])


@pytest.fixture(scope="session")
def recipe_env(tmp_path_factory, backend_name):
    """(recipe id, Recipe, Store, Trace) of the backend's CI recipe (tiny-ci-<backend>, else tiny-ci-cpu)."""
    from moetier.core import records as spec
    from moetier.bytes import store
    from moetier.traces.format import load_trace
    rid = caps.recipe_id(backend_name)
    R = spec.resolve(rid)
    out = tmp_path_factory.mktemp("recipe") / "store"
    store.pack(R.model, str(out))
    st = store.open_store(str(out), model=R.model)
    trace = next((r / R.trace for r in spec.data_roots() if (r / R.trace).exists()), spec.REGISTRY.parent / R.trace)
    tr = load_trace(trace, layers=R.layers, experts=R.experts, topk=R.topk)
    return rid, R, st, tr


def runtime_backend(name: str, R, st, conc: int = 2):
    """A fresh backend sized for a runtime run of recipe R (the headroom rule of `moetier run`), whose wait() has
    returned once within the suite's deadline."""
    unavailable_skip()
    headroom = 2 * conc * R.topk + 2 * int(R.policy["prefetch"].get("budget", 8)) + 8
    try:
        be = caps.open_backend(name, st, ram_slots=min(R.keys, R.ram_slots) + headroom, vram_slots=R.vram_slots)
    except ContractError as e:
        pytest.fail(str(e))
    except BackendUnavailable as e:
        report.STATE["unavailable"] = str(e)
        pytest.skip(f"UNAVAILABLE: {e}")
    if report.STATE.get("capabilities") is None:
        report.STATE["capabilities"] = caps.table(be)
    why = caps.encoding_skip(be, st.layout.encoding)
    if why:
        close_within(be)
        pytest.skip(f"{why} (the encoding of the CI recipe {R.id})")
    # a run's waits are the backend's own (a thread per wait, as wait_within, would change their timing): a wait
    # that never returns fails here, before a run could hang on it
    wait_within(be, be.fill(0, 0))
    return be


def xrows(rows: int, seed: int = 0, hidden: int = H) -> np.ndarray:
    return np.random.default_rng([SEED, seed, rows]).standard_normal((rows, hidden)).astype(np.float32)


_HUNG: dict = {}                 # id(backend) -> the thread of a bounded call (_within) that missed its deadline


def _hung(be):
    """The thread of ``be``'s bounded call still blocked past its deadline, or None."""
    t = _HUNG.get(id(be))
    return t if t is not None and t.is_alive() else None


def refuse_hung(be) -> None:
    """Fail at once when an earlier bounded call on ``be`` is still blocked (hypothesis would otherwise run, and
    wait out, each example it tries)."""
    hung = _hung(be)
    if hung is not None:
        pytest.fail(f"an earlier {hung.name}() has not returned (it missed its deadline)")


def _within(be, verb: str, deadline_s: float, *args):
    """be.<verb>(*args) on a daemon thread, failing (never skipping) when it has not returned within ``deadline_s``:
    a verb that never returns would otherwise hang the suite. The call is left behind; while it is still blocked,
    every later bounded call on that backend fails at once (``refuse_hung``). Returns what the verb returned."""
    refuse_hung(be)
    done, raised, got = threading.Event(), [], []

    def call():
        try:
            got.append(getattr(be, verb)(*args))
        except BaseException as e:  # handed back to the test's thread
            raised.append(e)
        finally:
            done.set()

    t = threading.Thread(target=call, name=verb, daemon=True)
    t.start()
    if not done.wait(deadline_s):
        _HUNG[id(be)] = t
        pytest.fail(f"{verb}() did not return within {deadline_s} s")
    if raised:
        raise raised[0]
    return got[0]


def wait_within(be, h, deadline_s: float = FENCE_DEADLINE_S):
    """be.wait(h) within ``deadline_s`` (``_within``): a wait that never returns fails the check that called it."""
    return _within(be, "wait", deadline_s, h)


def fence_within(be, deadline_s: float = FENCE_DEADLINE_S):
    """be.fence() within ``deadline_s`` (``_within``): a fence that never returns fails the check that called it."""
    _within(be, "fence", deadline_s)


def close_within(be, deadline_s: float = FENCE_DEADLINE_S):
    """be.close() (which fences first) within ``deadline_s``; a backend whose bounded call already missed its
    deadline is left as it is (that check failed already, and the process ends without it)."""
    if _hung(be) is None:
        _within(be, "close", deadline_s)


class FenceBound:
    """The backend under test with its fence() held to the suite's deadline (``fence_within``): a runtime run ends
    with the backend's fence, and one that never returns must fail the check, not hang the suite."""

    def __init__(self, be):
        self._be, self.capabilities = be, be.capabilities

    def __getattr__(self, name):
        return getattr(self._be, name)

    def fence(self):
        fence_within(self._be)


def poll_landed(be, hs, check, deadline_s=30.0):
    """Poll landed() over handles in random order; run check(h) the moment each first reports True."""
    rng = np.random.default_rng(1)
    left = list(hs)
    t_end = time.monotonic() + deadline_s
    while left:
        for j in rng.permutation(len(left)):
            h = left[j]
            if be.landed(h):
                check(h)
                left[j] = None
        left = [h for h in left if h is not None]
        assert time.monotonic() < t_end, f"{len(left)} handles never reported landed within {deadline_s} s"


def reference_hook(tally, every: int):
    """A runtime layer_hook that, every ``every`` steps, adds the layer output and the float64 reference MoE of the
    records as stored on disk to ``tally`` (a conformance.bounds.Tally of the store's encoding)."""
    from moetier.bytes.expert import moe_reference

    def hook(step, layer, xin, y, rows_keys, rows_w, rt):
        if step % every:
            return
        bufs = {}
        with open(rt.store.data_path, "rb") as f:
            for ks in rows_keys:
                for k in ks:
                    f.seek(rt.store.offset(k))
                    bufs[k] = (rt.store.layout, np.frombuffer(f.read(rt.store.record_bytes), np.uint8))
        picks = [list(zip(ks, w)) for ks, w in zip(rows_keys, rows_w)]
        tally.add(y, moe_reference(bufs, picks, xin.astype(np.float64)), f"step {step} layer {layer}")

    return hook
