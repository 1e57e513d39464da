"""The conformance checks themselves, called on test fakes (named as such) in-process: a check must fail, or skip
with its reason, where a backend breaks the promise it judges or offers nothing to judge by; it must never pass
having looked at nothing. (tests/test_conformance_meta.py runs the whole suite against real broken backends.)"""
from __future__ import annotations

import numpy as np
import pytest

from conformance import conftest, test_transfers
from conformance.conftest import NK, VRAM_SCRATCH
from moetier.run.contract import Capabilities


class _FakeVram:
    """A test fake: a VRAM tier of NK + VRAM_SCRATCH slots, key k in slot k; ``push`` records the key in the slot
    it was sent to, or nothing when ``lands`` is False (the broken variant); the gpu lane's output for a slot is
    the key it holds (-1 for none), so computing from a slot tells which key landed there."""

    def __init__(self, lanes=("cpu",), lands=True):
        self.capabilities = Capabilities("fake-vram", "none", frozenset(lanes), frozenset({"int8"}),
                                         NK + VRAM_SCRATCH)
        self.vram = {k: k for k in range(NK)}
        self.lands = lands

    def push(self, key, src_slot, vram_slot):
        if self.lands:
            self.vram[vram_slot] = key
        return vram_slot

    def wait(self, h):
        return h

    def compute(self, lane, jobs, x):
        return {k: np.full((len(rows), x.shape[1]), self.vram.get(s, -1), np.float32) for k, s, rows in jobs}


class _FakeKit:
    """A test fake: the members of conformance.conftest.Kit the push check reads."""

    def __init__(self, be):
        self.be, self.vram = be, be.capabilities.vram_slots

    def xrows(self, rows, seed=0):
        return conftest.xrows(rows, seed)


def _push_check(be):
    test_transfers.test_push_lands_manifest_bytes(lambda enc: _FakeKit(be), "int8")


def test_push_check_skips_when_nothing_can_read_the_pushed_bytes_back():
    with pytest.raises(pytest.skip.Exception, match="NOT_SUPPORTED: .*no read_vram.*no gpu lane"):
        _push_check(_FakeVram(lands=False))


def test_push_check_reads_the_pushed_bytes_back_on_the_gpu_lane():
    with pytest.raises(AssertionError, match="the gpu lane computes other bits there"):
        _push_check(_FakeVram(lanes=("cpu", "gpu"), lands=False))
    _push_check(_FakeVram(lanes=("cpu", "gpu")))


def test_an_interrupted_conformance_run_is_not_a_pass(monkeypatch, capsys):
    """Ctrl-C or SIGTERM (pytest returns INTERRUPTED) after some checks passed: `moetier conformance` exits 130,
    never 0 - a CI job killed at its time limit must not look green."""
    from conformance import report as plugin
    from moetier.cli import main as cli

    def interrupted(args):          # a test fake of pytest.main: one check passed, then the run was interrupted
        plugin.STATE.update(backend="cpu", checks={"test_x": {"check": "test_x", "outcome": "pass", "reason": "",
                                                              "seconds": 0.0}})
        return pytest.ExitCode.INTERRUPTED

    monkeypatch.setattr(pytest, "main", interrupted)
    try:
        assert cli.main(["conformance", "--backend", "cpu", "-k", "x"]) == 130
    finally:
        plugin.STATE.clear()
    assert capsys.readouterr().err.strip() == "moetier: interrupted"
