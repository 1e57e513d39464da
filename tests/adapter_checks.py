"""Checks shared by the engine adapters' tests: the tier splits and recipe of the tiny models, the lane deal replayed
on the simulator, and the conformance suite's residency instruments around an adapter's backend."""
from __future__ import annotations

import dataclasses
from contextlib import contextmanager

import numpy as np

# (VRAM slots, RAM slots) of the tiny models' 32 keys; with VRAM an NVMe pick is read and pushed (nvme_gpu), without
# it read and computed by the cpu lane (nvme_cpu)
SPLITS = {"all-resident": (32, 0), "ram-only": (0, 32), "nvme-tail": (8, 12), "nvme-tail-no-vram": (0, 20)}


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
