"""Checks shared by the engine adapters' tests: the tiny models written and packed, the tier splits and recipe, the
lanes each split must use, the mask check, the lane deal replayed on the simulator, and the conformance suite's
residency instruments around an adapter's backend, and the early-landing probe of an adapter's transfers."""
from __future__ import annotations

import dataclasses
from contextlib import contextmanager

import numpy as np

# (VRAM slots, RAM slots) of the tiny models' 32 keys; with VRAM an NVMe pick is read and pushed (nvme_gpu), without
# it read and computed by the cpu lane (nvme_cpu)
SPLITS = {"all-resident": (32, 0), "ram-only": (0, 32), "nvme-tail": (8, 12), "nvme-tail-no-vram": (0, 20)}


def tiny_model(tmp_path_factory, name: str, write_tiny, seed: int, tensors: bool = True):
    """(checkpoint dir, its store, its tensors or None) of a tiny model written by ``write_tiny(path, seed=)`` and
    its routed experts packed into a moetier store (``moetier store pack --checkpoint``)."""
    from moetier.bytes import store
    d = tmp_path_factory.mktemp(name)
    write_tiny(d / "ckpt", seed=seed)
    store.pack_checkpoint(d / "ckpt", d / "store")
    t = None
    if tensors:
        from safetensors.numpy import load_file
        t = {}
        for f in sorted((d / "ckpt").glob("*.safetensors")):
            t.update(load_file(str(f)))
    return d / "ckpt", store.open_store(d / "store"), t


def record(st, key: int) -> np.ndarray:
    """Key ``key``'s record bytes as the store's data file holds them."""
    with open(st.data_path, "rb") as f:
        f.seek(st.offset(key))
        return np.frombuffer(f.read(st.record_bytes), np.uint8)


def early_landings(be, st, keys, pushes: bool = True) -> list:
    """Fill ``keys`` into zeroed RAM slots and (``pushes``) push them over other bytes in VRAM, polling landed();
    every handle whose first landed() == True came before its destination held the record is returned."""
    rb, early = st.record_bytes, []
    for s in range(len(keys)):
        be.ram_view(s)[:] = 0
    hs = [(be.fill(k, s), k, s) for s, k in enumerate(keys)]
    pending = list(hs)
    while pending:
        for item in list(pending):
            h, k, s = item
            if be.landed(h):
                if not np.array_equal(be.ram_view(s)[:rb], record(st, k)):
                    early.append(("fill", k))
                pending.remove(item)
    be.fence()
    for s, k in enumerate(keys if pushes else ()):
        be.wait(be.push(keys[(s + 1) % len(keys)], (s + 1) % len(keys), s))    # another key's bytes first
        h = be.push(k, s, s)
        while not be.landed(h):
            pass
        if not np.array_equal(be.read_vram(s)[:rb], record(st, k)):
            early.append(("push", k))
    return early


def recipe(vram: int, ram: int, **policy):
    """The CI cuda recipe at the tiny models' geometry, its zerocopy lane per expert a little dearer than the cpu
    lane's (as for GLM's 9.4 MB experts over PCIe), so that RAM picks go to both lanes."""
    from moetier.core.records import resolve
    R = resolve("tiny-ci-cuda")
    lanes = dict(R.lanes)
    lanes["cpu"] = dataclasses.replace(lanes["cpu"], per_expert_ms=0.05, per_extra_token_ms=0.01)
    lanes["zerocopy"] = dataclasses.replace(lanes["zerocopy"], per_expert_ms=0.08)
    return dataclasses.replace(R, layers=2, experts=16, topk=2, vram_slots=vram, ram_slots=ram, lanes=lanes,
                               policy={**R.policy, **policy})


def rel_rms(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.sqrt(np.mean((a - b) ** 2) / np.mean(b ** 2)))


def lane_counts(att) -> dict:
    """Picks per lane over every planned layer call of ``att`` (attached with record=True)."""
    lanes = {ln: 0 for ln in ("gpu", "zerocopy", "cpu", "nvme_cpu", "nvme_gpu", "masked")}
    for *_, dealt in att.deals:
        for ln, keys in dealt.items():
            lanes[ln] += len(keys)
    return lanes


def assert_split_lanes(split: str, lanes: dict) -> None:
    """The lanes each of SPLITS must use (and must not) on the tiny models."""
    if split == "all-resident":
        assert lanes["gpu"] > 0 and lanes["cpu"] == lanes["zerocopy"] == lanes["nvme_cpu"] == 0, lanes
    elif split == "ram-only":
        assert lanes["gpu"] == 0 and lanes["cpu"] > 0 and lanes["zerocopy"] > 0 and lanes["nvme_cpu"] == 0, lanes
    elif split == "nvme-tail":
        assert lanes["nvme_gpu"] > 0 and lanes["gpu"] > 0, lanes
    else:
        assert lanes["nvme_cpu"] > 0 and lanes["gpu"] == lanes["nvme_gpu"] == 0, lanes


def assert_within(got, xs, reference, tol: float = 2e-3) -> None:
    """Every call's output within rel RMS ``tol`` of ``reference(o, x, ids, w)`` (got: run()'s rows)."""
    for s, step in enumerate(got):
        for o, (y, ids, w) in enumerate(step):
            assert rel_rms(np.asarray(y), reference(o, xs[s][o], ids, w)) < tol, (s, o)


def assert_mask_is_exact_less_masked(att, got, xs, reference) -> None:
    """Under ``mask``: each output equals the reference less the masked picks' contributions, and where picks were
    masked, is far from the full output (they are really gone); ``reference(o, x, ids, w, skip=keys)``."""
    masked_total, layers = 0, len(got[0])
    for s, step in enumerate(got):
        for o, (y, ids, w) in enumerate(step):
            y = np.asarray(y)
            masked = set(att.deals[s * layers + o][3]["masked"])
            masked_total += len(masked)
            less = reference(o, xs[s][o], ids, w, skip=masked)
            assert rel_rms(y, less) < 2e-3
            if masked:
                assert rel_rms(y, reference(o, xs[s][o], ids, w)) > 10 * rel_rms(y, less)
    assert masked_total > 0


def assert_deals_replay(att) -> None:
    """Each planned layer call of ``att`` (attached with record=True) dealt its picks exactly as the simulator's
    Replay does on the same routing, clock and seeded ledger (plan parity)."""
    from moetier.core.sim import Replay
    R = att.R
    rp = Replay(R, rows=1)
    rp.ledger.seed(range(R.keys))
    t, last = 0.0, None
    for step, o, picks, dealt in att.deals:
        if last is None or step != last:
            rp.begin_step(step)
            last = step
        t += R.fixed(1) / R.layers
        plan = rp.layer(o, dict(picks), t, None, None)
        t += plan.ms + sum(rp.settle())
        assert {k: list(v) for k, v in plan.lanes().items()} == dealt, (step, o)


class _Lazy:
    """The Chaos wrapper, once attach has built it (the instruments are installed before)."""

    def __init__(self, get):
        self._get = get

    def __getattr__(self, name):
        return getattr(self._get(), name)

    def __setattr__(self, name, value):
        if name == "_get":
            object.__setattr__(self, name, value)
        else:
            setattr(self._get(), name, value)


@contextmanager
def chaos_instruments(seed: int):
    """Yields ``(wrap, box)``: pass ``wrap`` as attach's ``wrap=``; ``box["chaos"]`` is then the conformance suite's
    Chaos wrapper (delayed, reordered completions) around the adapter's backend. While the block runs, its two
    instruments check every lane's slots (only bytes the host saw land) and every Ledger.land (only after landed)."""
    from conformance.test_residency import Chaos, _Instrumented
    box = {}

    def wrap(be):
        box["chaos"] = Chaos(be, seed=seed)
        return box["chaos"]

    with _Instrumented(_Lazy(lambda: box["chaos"])):
        yield wrap, box
