"""Runtime chaos on the tiny CI recipe: injected read faults (EIO, short read, flipped byte, slow and stalled
completions) never reach an output - every layer output matches a run without faults bit for bit - and a run either
completes, retrying what failed (the retries counted in its record), or stops with one line. The 10,000-step version
is benchmarks/chaos.py. Also: the peak RSS of `moetier run` stays within its recipe's RAM budget plus the stated
overhead (moetier.run.runtime.rss_bound)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import numba  # noqa: F401  (the cpu extra: a missing install fails, it does not skip)
import pytest

from moetier.bytes import store
from moetier.bytes.transport import FaultPlan
from moetier.cli.main import main
from moetier.core import records as spec
from moetier.run import runtime
from moetier.run.chaos import chaos
from moetier.traces.format import load_trace
from tests._watchdog import watchdog
from tests.stall_fakes import FakeStopsLanding

bounded = watchdog(240)   # every test here waits on faulted reads: a stuck wait fails its test, never hangs the suite

RECIPE = "tiny-ci-cpu"
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    d = tmp_path_factory.mktemp("store") / "tiny"
    store.pack(spec.resolve(RECIPE).model, str(d))
    return str(d)


def _recipe(packed):
    R = spec.resolve(RECIPE)
    tr = load_trace(spec.REGISTRY.parent / R.trace, layers=R.layers, experts=R.experts, topk=R.topk)
    return R, store.open_store(packed, model=R.model), tr


def test_faults_never_reach_an_output_and_every_failed_read_is_retried(packed):
    R, st, tr = _recipe(packed)
    fig = chaos(R, st, tr, layer_steps=1500, rate=0.1, steps_per_run=80, seed=7)
    assert fig["layer_steps"] >= 1500 and fig["completed"] == fig["runs"] and fig["stops"] == 0
    assert fig["wrong_outputs"] == 0
    f = fig["faults"]
    assert min(f["eio"], f["short"], f["flip"], f["slow"]) > 0 and f["stall"] == 0
    assert fig["retries"] == f["eio"] + f["short"] + f["flip"]        # each failed read was read again
    assert fig["reads_verified"] == fig["reads"] - f["eio"] - f["short"]   # every read that landed was checked


def test_a_stalled_transfer_stops_the_run_with_one_line(packed):
    R, st, tr = _recipe(packed)
    # a seed whose stalls fall after seeding (layer outputs were computed before the stop); a 1 s timeout, so that a
    # read slowed by a loaded machine is not taken for a stall
    fig = chaos(R, st, tr, layer_steps=200, rate=0.0, stall_rate=0.002, steps_per_run=40, stall_timeout_s=1.0,
                seed=3)
    assert fig["stops"] >= 1 and fig["layer_steps"] > 0 and fig["wrong_outputs"] == 0
    assert fig["stops"] <= fig["faults"]["stall"]     # every stop is an injected stall (others may be in flight)
    assert all("stalled" in ln and "\n" not in ln for ln in fig["stop_lines"])


def test_a_fence_that_never_returns_stops_the_run_with_one_line(packed):
    """The closing fence is bounded like every wait: a backend whose fence() never returns (conformance's
    fence-never mutant) stops the run with one line within the stall timeout instead of hanging it."""
    import time
    from conformance.broken_handles import BrokenFenceNever
    from moetier.errors import UserError
    R, st, tr = _recipe(packed)
    be = BrokenFenceNever(runtime.make_backend("cpu", st, R, 1))
    t0 = time.perf_counter()
    try:
        with pytest.raises(UserError) as e:
            runtime.run(R, st, be, tr, 1, max_steps=2, wait_timeout_s=0.5)
    finally:
        be._inner.close()    # the mutant's own close fences first, and its fence never returns
    assert "fence did not return within 0.5 s" in str(e.value) and "\n" not in str(e.value)
    assert time.perf_counter() - t0 < 120


def test_chaos_at_a_stall_rate_that_stalls_every_seeding_ends_after_max_runs(packed):
    """At 5% stalls seeding's reads all but always stall, so no run computes a layer output: the loop must
    end by its run bound (it once spun forever waiting for layer steps that never came)."""
    R, st, tr = _recipe(packed)
    fig = chaos(R, st, tr, layer_steps=200, rate=0.0, stall_rate=0.05, steps_per_run=40, stall_timeout_s=0.1,
                max_runs=3)
    assert fig["runs"] == fig["stops"] == 3 and fig["layer_steps"] < fig["target_layer_steps"]
    assert fig["wrong_outputs"] == 0 and all("stalled" in ln for ln in fig["stop_lines"])


def test_a_seeded_fault_plan_faults_the_same_reads_whatever_their_order():
    keys = [k % 40 for k in range(400)]
    a, b = FaultPlan.at_rate(0.3, seed=5), FaultPlan.at_rate(0.3, seed=5)
    got_a = [(k, a(k)) for k in keys]
    got_b = dict(((k, i), b(k)) for i, k in reversed(list(enumerate(keys))))
    nth: dict = {}
    for i, k in enumerate(keys):      # the n-th read of key k gets the same fault in both orders
        nth.setdefault(k, []).append(i)
    assert any(f for _, f in got_a)
    order_b = {}
    for k, idx in nth.items():
        order_b[k] = [got_b[(k, i)] for i in reversed(idx)]
    assert all(order_b[k] == [f for kk, f in got_a if kk == k] for k in nth)


def test_chaos_catches_outputs_from_unverified_bytes(packed, monkeypatch):
    """The check can fail: with the checksum check taken away (the store has no digest to compare), flipped bytes
    are computed and the wrong outputs show."""
    R, st, tr = _recipe(packed)
    monkeypatch.setattr(type(st), "digest", lambda self, key: None)
    fig = chaos(R, st, tr, layer_steps=300, rate=0.2, kinds=("flip",), steps_per_run=40)
    assert fig["faults"]["flip"] > 0 and fig["wrong_outputs"] > 0


def _cli(capsys, *argv):
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def test_run_faults_completes_and_counts_retries_in_the_record(capsys, packed):
    rc, out, err = _cli(capsys, "run", RECIPE, "--store", packed, "--steps", "40", "--conc", "1", "--no-record",
                        "--faults", "0.1", "--fault-seed", "4", "--json")
    assert rc == 0, err
    rec = json.loads(out)
    f = rec["faults"]
    assert f["retries"] == sum(r["read_retries"] for r in rec["measured_runs"]) > 0
    assert f["retries"] == f["injected"]["eio"] + f["injected"]["short"] + f["injected"]["flip"]


def test_run_stall_stops_with_one_line(capsys, packed):
    rc, _, err = _cli(capsys, "run", RECIPE, "--store", packed, "--steps", "40", "--conc", "1", "--no-record",
                      "--stall-rate", "0.2", "--stall-timeout", "0.1")
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert rc == 2 and len(lines) == 1 and "stalled" in lines[0] and "Traceback" not in err


def test_run_faults_with_verify_rate_below_1_is_refused(capsys, packed):
    rc, _, err = _cli(capsys, "run", RECIPE, "--store", packed, "--faults", "0.1", "--verify-rate", "0.5")
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert rc == 2 and len(lines) == 1 and "--faults" in lines[0] and "--verify-rate" in lines[0]


def test_run_peak_rss_within_ram_budget_plus_overhead(packed, tmp_path):
    """A separate process, so the figure is the run's own: its peak RSS, recorded in the run record, is within
    rss_bound (the budget, the in-flight slots, RSS_OVERHEAD_BYTES) - at the recipe's budget and at one that holds
    every expert in RAM."""
    R = spec.resolve(RECIPE)
    for sets in ([], ["--set", "budget.ram_gb=0.03"]):
        out = subprocess.run([sys.executable, "-m", "moetier", "run", RECIPE, "--store", packed, "--steps", "40",
                              "--conc", "1", "2", "--no-record", "--json", *sets], capture_output=True, text=True,
                             env={**os.environ, "PYTHONPATH": str(REPO)}, check=True).stdout
        mem = json.loads(out)["memory"]
        R = spec.resolve(RECIPE, [s for s in sets if s != "--set"])
        assert mem["bound_bytes"] == runtime.rss_bound(R, 2)
        assert 0 < mem["peak_rss_bytes"] <= mem["bound_bytes"], mem


def test_peak_rss_is_the_processs_own_not_its_parents():
    """A process forked from a large parent reports its own peak: ru_maxrss would carry the parent's size over exec."""
    big = bytearray(256 * 2**20)
    big[::4096] = b"x" * len(big[::4096])            # touch every page so the parent really holds them
    code = "from moetier.run.runtime import peak_rss; print(peak_rss())"
    child = int(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                               env={**os.environ, "PYTHONPATH": str(REPO)}).stdout)
    assert 0 < child < 200 * 2**20, child
    del big


@pytest.fixture(scope="module")
def seeding_reads(packed):
    """How many transfers land before the first layer computes (seeding's reads), measured on a backend that keeps
    landing, so the boundary cases below follow the recipe instead of a number written here."""
    R, st, tr = _recipe(packed)
    be = FakeStopsLanding(st, ram_slots=min(R.keys, R.ram_slots) + runtime.headroom_slots(R, 1))
    be.after = 10 ** 9
    try:
        runtime.run(R, st, be, tr, 1, max_steps=1, wait_timeout_s=30)
    finally:
        be.release()
    assert be.landed_before_compute and be.landed_before_compute > 1
    return be.landed_before_compute


@pytest.mark.parametrize("after", ["0", "1", "seeding-1", "seeding", "400", "700"])
def test_every_wait_is_bounded_when_a_backend_stops_landing(packed, monkeypatch, seeding_reads, after):
    """Whichever wait of a run meets the first transfer that never lands - one of seeding's reads (its first,
    second or last), a layer's first or a later one, the closing fence - the run stops with the stall line within
    the timeout, never hangs."""
    import time
    from moetier.errors import UserError
    n = _landings(after, seeding_reads)
    R, st, tr = _recipe(packed)
    monkeypatch.setattr(FakeStopsLanding, "after", n)
    monkeypatch.setattr(FakeStopsLanding, "made", [])
    be = FakeStopsLanding(st, ram_slots=min(R.keys, R.ram_slots) + runtime.headroom_slots(R, 1))
    t0 = time.perf_counter()
    try:
        with pytest.raises(UserError) as e:
            runtime.run(R, st, be, tr, 1, max_steps=40, wait_timeout_s=0.3)
    finally:
        be.release()
    assert "stalled" in str(e.value) or "fence did not return" in str(e.value), str(e.value)
    assert "\n" not in str(e.value) and time.perf_counter() - t0 < 60
    if n < seeding_reads:
        assert be.landed_before_compute is None     # it stopped inside seeding: no layer ever computed
    elif n == seeding_reads:
        assert be.landed_before_compute == n        # seeding finished; the first layer's transfers stalled


def _landings(name: str, seeding: int) -> int:
    """A case's landing count: a number, or seeding's count less one."""
    return {"seeding": seeding, "seeding-1": seeding - 1}.get(name) or int(name)


@pytest.mark.parametrize("after", [1, 400])
def test_run_on_a_backend_that_stops_landing_exits_2_with_the_stall_line(capsys, packed, install_distribution,
                                                                         monkeypatch, after):
    """`moetier run --stall-timeout` on a backend whose transfers stop landing: exit 2 and the one stall line,
    the backend's close included in the bound (a close fences, and that fence never returns either)."""
    install_distribution("fake-stops-landing", {"moetier.backends": {"fake-stops-landing":
                                                                     "tests.stall_fakes:FakeStopsLanding"}})
    monkeypatch.setattr(FakeStopsLanding, "after", after)
    monkeypatch.setattr(FakeStopsLanding, "made", [])
    made = FakeStopsLanding.made
    try:
        rc, _, err = _cli(capsys, "run", RECIPE, "--store", packed, "--steps", "40", "--conc", "1", "--no-record",
                          "--backend", "fake-stops-landing", "--stall-timeout", "0.3")
    finally:
        for be in made:
            be.release()
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert rc == 2 and len(lines) == 1 and "stalled" in lines[0] and "Traceback" not in err, err
    assert [be.closing for be in made] == [True] and "fence" in made[0].blocked    # its close did block
