"""plan_layer and the NVMe channel: lane split, costs, stall/mask, priorities; the plan never mutates residency."""
import math
from types import SimpleNamespace

import pytest

from moetier.core.ledger import Ledger
from moetier.core.plan import LayerPlan, NvmeChannel, PlanContext, plan_layer
from moetier.core.records import Lane
from moetier.core.terms import ChannelTerms


def ctx(**kw):
    lanes = {"gpu": Lane("gpu", "vram", 0.17, 0.023, 0.0), "zerocopy": Lane("zerocopy", "ram", 0.0, 0.38, 0.0),
             "cpu": Lane("cpu", "ram", 0.145, 0.104, 0.04)}
    lanes.update(kw.pop("lanes", {}))
    R = SimpleNamespace(id="t", experts=100, lanes={k: v for k, v in lanes.items() if v is not None},
                        vram_slots=kw.pop("vram_slots", 4), nvme_expert_bytes=9_474_048, h2d_gbps=23.5,
                        policy={"exact": kw.pop("exact", "stall"), "overlap": kw.pop("overlap", True)})
    return PlanContext.from_recipe(R)


def flat(**terms):
    """A channel of 1 MB records at 1 GB/s (1 ms a read, no access latency) with these measured terms."""
    return NvmeChannel(1_000_000, 1.0, bw_qd1_gbps=1.0, latency_ms=0.0, terms=ChannelTerms(**terms))


def measured(**terms):
    """A channel of 1 MB records with these measured terms (a latency table among them)."""
    return NvmeChannel(1_000_000, 1.0, terms=ChannelTerms(**terms))


def ledger(vram=(), ram=()):
    L = Ledger(1000, 4, 8)
    L.seed(list(vram) + list(ram))
    return L


def test_vram_hits_cost_gpu_per_layer_plus_per_expert():
    L = ledger(vram=[1, 2, 3, 4])
    p = plan_layer(ctx(), L, {1: 1, 2: 3}, 0.0, NvmeChannel(9_474_048, 24.0))
    assert p.gpu == [1, 2] and p.cpu == [] and p.gpu_ms == pytest.approx(0.17 + 2 * 0.023)
    assert p.cpu_ms == 0.0  # cpu per_layer only when the cpu lane works
    assert p.ms == pytest.approx(p.gpu_ms)


def test_device_lanes_pay_for_the_layers_reads_in_flight():
    gpu = Lane("gpu", "vram", 0.17, 0.023, 0.0, per_read_ms=0.05, per_read_busy_ms=0.04)
    L = ledger(vram=[1, 2, 3, 4])
    picks = {1: 1, 2: 1, 500: 1, 501: 1}             # two VRAM hits, two NVMe picks
    ch = NvmeChannel(9_474_048, 24.0)
    # the serial engine's resident lanes end before its NVMe picks (issue_ms): the VRAM hits' call alone, with the
    # layer's two reads in flight (each costs per_read, any at all per_read_busy once)
    p = plan_layer(ctx(lanes={"gpu": gpu}, overlap=False), L, picks, 0.0, ch)
    assert p.gpu == [1, 2] and p.issue_ms == pytest.approx(0.17 + 2 * 0.023 + 2 * 0.05 + 0.04)
    one = plan_layer(ctx(lanes={"gpu": gpu}, overlap=False), L, {1: 1, 2: 1, 500: 1}, 0.0, NvmeChannel(9_474_048, 24.0))
    assert one.issue_ms == pytest.approx(0.17 + 2 * 0.023 + 0.05 + 0.04)
    q = plan_layer(ctx(lanes={"gpu": Lane("gpu", "vram", 0.17, 0.023, 0.0)}), L, picks, 0.0, ch)
    assert plan_layer(ctx(lanes={"gpu": gpu}), L, picks, 0.0, ch).gpu_ms > q.gpu_ms
    R = SimpleNamespace(id="t", experts=100, lanes={"gpu": gpu}, vram_slots=4, nvme_expert_bytes=9_474_048,
                        h2d_gbps=23.5, policy={})
    assert PlanContext.from_recipe(R, 4).gpu[0] == pytest.approx(0.17)     # a call's fixed cost at any rows
    # the zerocopy lane's call too
    zc = {"cpu": None, "zerocopy": Lane("zerocopy", "ram", 0.0, 0.38, 0.0, per_read_busy_ms=0.1)}
    L2 = ledger(vram=[1, 2, 3, 4], ram=[10])
    z = plan_layer(ctx(lanes=zc, overlap=False), L2, {10: 1, 500: 1}, 0.0, NvmeChannel(9_474_048, 24.0))
    assert z.zerocopy == [10] and z.issue_ms == pytest.approx(0.38 + 0.1)
    assert plan_layer(ctx(lanes=zc, overlap=False), L2, {10: 1}, 0.0, ch).issue_ms == pytest.approx(0.38)
    # masked NVMe picks are never read: the VRAM hits' call is not contended
    m = plan_layer(ctx(lanes={"gpu": gpu}, exact="mask"), L, picks, 0.0, ch)
    assert m.masked and m.gpu_ms == pytest.approx(0.17 + 2 * 0.023)


def test_ram_picks_greedy_min_max_heaviest_first():
    L = ledger(vram=[1, 2, 3, 4], ram=[10, 11, 12, 13, 14, 15, 16, 17])
    picks = {1: 1, 10: 1, 11: 1, 12: 1, 13: 4}
    p = plan_layer(ctx(), L, picks, 0.0, NvmeChannel(9_474_048, 24.0))
    # heaviest first: 13 (m=4) goes to cpu: 0.145+0.104+0.12 = 0.369 vs zc 0.193+0.38
    assert p.cpu[0] == 13
    assert sorted(p.cpu + p.zerocopy) == [10, 11, 12, 13]
    c = 0.145 + sum(0.104 + 0.04 * (picks[k] - 1) for k in p.cpu)
    g = 0.17 + 0.023 + 0.38 * len(p.zerocopy)
    assert p.cpu_ms == pytest.approx(c) and p.gpu_ms == pytest.approx(g)
    assert p.ms == pytest.approx(max(c, g))
    # every choice was min-max optimal given the greedy order: moving any cpu pick to zc would not lower the max
    assert max(c, g) <= max(c - 0.104, g + 0.38) + 1e-12


def test_serial_lanes_sum():
    L = ledger(vram=[1], ram=[10])
    p = plan_layer(ctx(overlap=False), L, {1: 1, 10: 1}, 0.0, NvmeChannel(9_474_048, 24.0))
    assert p.ms == pytest.approx(p.gpu_ms + p.cpu_ms)


def test_plan_does_not_mutate_residency():
    L = ledger(vram=[1, 2], ram=[10, 11])
    before = (dict(L.state), list(L.ram), list(L.clock.owner), bytes(L.clock.ref))
    plan_layer(ctx(), L, {1: 1, 10: 2, 500: 1, 501: 1}, 0.0, NvmeChannel(9_474_048, 24.0))
    assert (dict(L.state), list(L.ram), list(L.clock.owner), bytes(L.clock.ref)) == before


def test_nvme_stall_waits_for_arrival_and_mask_drops():
    ch = NvmeChannel(9_474_048, 24.0, bw_qd1_gbps=12.6, latency_ms=0.12)
    L = ledger()
    p = plan_layer(ctx(), L, {500: 1}, 10.0, ch)
    one = 9_474_048 / 12.6e6
    assert p.arrivals[500] == pytest.approx(10.0 + 0.12 + one)
    # the call is made once the bytes are there: its set-up (the lane's per-call cost) follows the wait
    assert p.nvme_cpu == [500] and p.cpu_ms == pytest.approx(0.12 + one + 0.145 + 0.104)
    assert p.nvme_wait_ms > 0
    pm = plan_layer(ctx(exact="mask"), L, {500: 1, 501: 1}, 0.0, NvmeChannel(9_474_048, 24.0))
    assert sorted(pm.masked) == [500, 501] and pm.ms == 0.0
    # a masked pick is neither computed nor combined: no per-pick host time
    import dataclasses
    hc = dataclasses.replace(ctx(exact="mask"), host_layer=0.05, host_pick=0.01)
    pm = plan_layer(hc, ledger(vram=[1]), {1: 1, 500: 1, 501: 1}, 0.0, NvmeChannel(9_474_048, 24.0))
    assert pm.ms == pytest.approx(pm.gpu_ms + 0.05 + 0.01)


def test_a_split_call_pays_for_its_idle_worker_and_says_when_it_ends():
    import dataclasses
    from moetier.core.plan import LayerPlan
    from moetier.core.sim import Replay
    from moetier.core.records import idle_wake
    assert idle_wake(0.0) == 0.0 and idle_wake(0.1) == pytest.approx(1.0) and idle_wake(0.3) == pytest.approx(2.0)
    c = dataclasses.replace(ctx(vram_slots=0, lanes={"zerocopy": None}), cpu_workers=2, cpu_pmin=4,
                            cpu_wake=0.05)
    L = Ledger(1000, 0, 8)
    L.seed(range(10, 18))
    split = {k: 1 for k in range(10, 14)}                 # 4 experts: split over the two workers
    warm = plan_layer(c, L, split, 5.0, NvmeChannel(1_000_000, 1.0))
    cold = plan_layer(c, L, split, 5.0, NvmeChannel(1_000_000, 1.0), idle=0.3)
    assert cold.cpu_ms == pytest.approx(warm.cpu_ms + 0.05 * 2.0)
    assert warm.split_end == pytest.approx(5.0 + warm.cpu_ms) and cold.split_end == pytest.approx(5.0 + cold.cpu_ms)
    inline = plan_layer(c, L, {10: 1, 11: 1}, 5.0, NvmeChannel(1_000_000, 1.0), idle=0.3)
    assert inline.split_end is None                        # an inline call runs on the calling thread: no wake-up
    assert inline.cpu_ms == pytest.approx(plan_layer(c, L, {10: 1, 11: 1}, 5.0, NvmeChannel(1_000_000, 1.0)).cpu_ms)
    # the executors' shared bookkeeping: the worker idles from the split call's end
    R = SimpleNamespace(id="t", experts=100, layers=10, keys=1000, vram_slots=0, ram_slots=8, topk=4,
                        lanes={"cpu": Lane("cpu", "ram", 0.145, 0.104, 0.04)}, nvme_expert_bytes=1_000_000,
                        h2d_gbps=0.0, nvme_bw_gbps=1.0, nvme_bw_qd1_gbps=1.0, nvme_latency_ms=0.1, hardware={},
                        engines=[], policy={})
    rp = Replay(R)
    assert rp.idle(3.0) == 0.0                              # no split call yet
    ended = LayerPlan()
    ended.split_end = 7.5
    rp.touch(ended)
    rp.touch(LayerPlan())                                   # a layer without a split call: the worker idles on
    assert rp.idle(9.0) == pytest.approx(1.5)


@pytest.mark.parametrize("overlap", [True, False], ids=["overlapped", "serial"])
def test_a_cpu_call_right_after_a_blocked_wait_pays_the_after_wait_cost(overlap):
    import dataclasses
    base = dataclasses.replace(ctx(vram_slots=0, lanes={"zerocopy": None}, overlap=overlap), cpu_pmin=4)
    c = dataclasses.replace(base, cpu_after_wait=0.07)
    L = Ledger(1000, 0, 8)
    L.seed([10])

    def layer(x, lat):             # one resident pick, one NVMe pick whose read takes lat ms
        return plan_layer(x, L, {10: 1, 500: 1}, 0.0, NvmeChannel(1_000_000, 100.0, latency_ms=lat))
    # the read lands long after the resident call: the NVMe pick's call waited, and pays
    assert layer(c, 5.0).cpu_ms == pytest.approx(layer(base, 5.0).cpu_ms + 0.07)
    assert layer(c, 5.0).nvme_cpu == [500]
    # it had landed while the resident call ran: no wait, no after-wait cost
    assert layer(c, 0.0).cpu_ms == pytest.approx(layer(base, 0.0).cpu_ms)


def test_host_time_once_per_layer_whose_zerocopy_lane_computes():
    import dataclasses
    L = ledger(vram=[1, 2, 3, 4], ram=[10, 11, 12, 13, 14, 15, 16, 17])
    picks = {1: 1, 10: 1, 11: 1, 12: 1, 13: 4}

    def ms(x):
        p = plan_layer(x, L, picks, 0.0, NvmeChannel(9_474_048, 24.0))
        return p.ms, bool(p.zerocopy)
    base = ctx()
    (m0, zc0), (m1, zc1) = ms(base), ms(dataclasses.replace(base, host_zc_call=0.09))
    assert zc0 and zc1 and m1 == pytest.approx(m0 + 0.09)
    no_zc = ctx(lanes={"zerocopy": None})        # the same picks, no zerocopy lane: nothing to charge
    assert ms(dataclasses.replace(no_zc, host_zc_call=0.09)) == ms(no_zc)


def test_host_time_per_nvme_read_and_once_per_layer_that_reads():
    import dataclasses
    hc = dataclasses.replace(ctx(), host_read=0.02, host_nvme_layer=0.3)

    def host(c, picks):
        p = plan_layer(c, ledger(vram=[1]), picks, 0.0, NvmeChannel(9_474_048, 24.0))
        return p.ms - max(p.gpu_ms, p.cpu_ms)
    assert host(hc, {1: 1}) == 0.0                                       # no NVMe pick: neither part
    assert host(hc, {1: 1, 500: 1}) == pytest.approx(0.02 + 0.3)
    assert host(hc, {1: 1, 500: 1, 501: 1, 502: 1}) == pytest.approx(3 * 0.02 + 0.3)
    masked = dataclasses.replace(hc, mask=True)                           # masked picks are never read
    assert host(masked, {1: 1, 500: 1}) == 0.0


def test_nvme_without_cpu_lane_goes_to_gpu_with_push():
    ch = NvmeChannel(9_474_048, 24.0, bw_qd1_gbps=24.0, latency_ms=0.0)
    p = plan_layer(ctx(lanes={"cpu": None}), ledger(), {500: 1}, 0.0, ch)
    push = 9_474_048 / 23.5e6
    assert p.nvme_gpu == [500] and p.gpu_ms == pytest.approx(ch.one + push + 0.023)


def test_missing_lanes_are_user_errors():
    from moetier.errors import UserError
    with pytest.raises(UserError, match="no lane"):
        ctx(lanes={"cpu": None, "zerocopy": None, "gpu": None}, vram_slots=0)
    with pytest.raises(UserError, match="no engine provides a gpu lane"):
        ctx(lanes={"gpu": None})


def test_channel_demand_preempts_queued_prefetch():
    ch = flat()  # 1 ms per record
    ch.prefetch(0.0, [1, 2, 3])                 # 1: 0-1, 2: 1-2, 3: 2-3
    arr = ch.demand(0.5, 1)                     # read 1 in service until 1.0; demand goes next
    assert arr == [pytest.approx(2.0)]
    assert ch.arrival(2) == pytest.approx(3.0) and ch.arrival(3) == pytest.approx(4.0)
    cancelled, wasted = ch.expire([1, 2, 3], 1.5)
    assert wasted == [1] and sorted(cancelled) == [2, 3]
    assert ch.pf_wasted == 1 and ch.pf_cancelled == 2


def test_claim_of_a_started_prefetch_keeps_its_arrival_an_unstarted_one_becomes_demand():
    ch = flat()
    ch.prefetch(0.0, [1, 2])
    assert ch.claim(1, 0.5) == pytest.approx(1.0)
    assert ch.claim(2, 0.5) is None and ch.pf_cancelled == 1


def test_channel_queueing_model_uses_measured_latency_by_queue_depth():
    ch = flat(latency_by_qd={"1": 1.0, "4": 2.0, "16": 6.0})
    assert ch.latency_at(1) == 1.0 and ch.latency_at(2) == pytest.approx(1 + 1 / 3)
    assert ch.latency_at(32) == pytest.approx(12.0)          # beyond the table: bandwidth-bound, linear in q
    assert ch.demand(0.0, 1) == [1.0]
    # joins one read still in flight: the three new reads are the 2nd, 3rd and 4th in the queue
    assert ch.demand(0.5, 3) == [pytest.approx(0.5 + 1 + 1 / 3), pytest.approx(0.5 + 1 + 2 / 3), pytest.approx(2.5)]
    assert ch.demand(10.0, 1) == [11.0]                          # all earlier reads done: q = 1


def test_table_model_prefetch_runs_one_at_a_time_at_qd1_latency_and_adds_no_demand_depth():
    ch = NvmeChannel(1_000_000, 1.0, bw_qd1_gbps=1.0, latency_ms=0.5,
                     terms=ChannelTerms(latency_by_qd={"1": 0.8, "2": 1.2}))
    assert ch.prefetch(0.0, [1, 2]) == [pytest.approx(0.8), pytest.approx(1.6)]   # no idle latency on top
    assert ch.demand(0.4, 1) == [pytest.approx(1.2)]      # prefetch 1 in service: the demand read still joins at q=1
    assert ch.arrival(2) == pytest.approx(2.0)            # the queued prefetch waits for the demand read


def test_prefetch_reads_that_ran_cost_the_cpu_lane_their_read_cpu_once():
    c = ctx()
    c.read_cpu = 0.1
    L = ledger(vram=[90, 91, 92, 93], ram=[7])
    base = plan_layer(ctx(), L, {7: 1}, 2.0, None).cpu_ms
    ch = flat()
    ch.prefetch(0.0, [500, 501, 502])
    assert ch.claim(500, 0.5) is not None      # ran, used
    ch.expire([501, 502], 1.5)                  # 501 ran (wasted), 502 never started (cancelled): no CPU work
    assert plan_layer(c, L, {7: 1}, 2.0, ch).cpu_ms == pytest.approx(base + 0.2)
    assert plan_layer(c, L, {7: 1}, 3.0, ch).cpu_ms == pytest.approx(base)      # charged once


def test_nvme_pick_served_by_a_started_prefetch_is_planned():
    ch = flat()
    ch.prefetch(0.0, [500])                     # read in service from t=0, lands at 1.0
    p = plan_layer(ctx(), ledger(), {500: 1}, 0.5, ch)
    assert p.nvme_cpu + p.nvme_gpu == [500] and p.demand_reads == 0 and p.arrivals[500] == pytest.approx(1.0)


def test_serial_engine_runs_nvme_picks_after_both_resident_lanes():
    c = ctx(overlap=False)
    L = ledger(vram=[1, 2, 3, 4], ram=[7])
    ch = flat()            # the NVMe pick lands at 1.0
    p = plan_layer(c, L, {1: 1, 7: 1, 500: 1}, 0.0, ch)
    resident = (0.17 + 0.023) + (0.145 + 0.104)           # gpu lane, then the cpu lane, one after the other
    assert p.gpu == [1] and p.cpu == [7] and p.nvme_cpu == [500]
    # the pick waits from the end of both lanes to its arrival, then runs inline on the cpu lane
    assert p.nvme_wait_ms == pytest.approx(1.0 - resident)
    assert p.gpu_ms + p.cpu_ms == pytest.approx(1.0 + c.cpu_call + 0.104) and p.ms == pytest.approx(p.gpu_ms + p.cpu_ms)


def test_latency_table_under_an_engines_load_wins_over_the_hardwares():
    from moetier.core.terms import latency_table_for_rows
    nvme = {"latency_by_qd_ms": {"1": 0.4}, "latency_by_rows_qd_ms": {"1": {"1": 0.8}, "4": {"1": 1.2}}}
    # between measured rows: linear in the layer's expected distinct experts (64 experts, top-4: 4 / 7.75 / 14.56
    # at rows 1 / 2 / 4), or in rows without a width (every pick distinct)
    assert latency_table_for_rows(nvme, 2, width=(64, 4)) == {1: pytest.approx(0.8 + 0.4 * 3.75 / 10.5615234375)}
    assert latency_table_for_rows(nvme, 2) == {1: pytest.approx(0.8 + 0.4 / 3)}
    assert latency_table_for_rows(nvme, 3, width=(4, 4)) == {1: 0.8}            # one row computes every expert
    assert latency_table_for_rows(nvme, 8) == {1: 1.2}                          # outside: the nearest
    eng = [{"id": "a"}, {"id": "b", "nvme_latency_by_rows_qd_ms": {"1": {"1": 0.6}}}]
    assert latency_table_for_rows(nvme, 1, eng) == {1: 0.6}
    eng[1]["nvme_latency_record_bytes"] = 4096                                   # measured with other records
    assert latency_table_for_rows(nvme, 1, eng, 4096) == {1: 0.6}
    assert latency_table_for_rows(nvme, 1, eng, 1 << 20) == {1: 0.8}
    assert latency_table_for_rows({"latency_by_qd_ms": {"1": 0.4}}, 4) == {"1": 0.4}   # idle bench table
    assert latency_table_for_rows({}, 4) is None                                 # FIFO model


def test_wake_up_is_paid_only_by_a_lane_that_waited_for_its_bytes():
    cpu_only = ctx(vram_slots=0, lanes={"zerocopy": None})
    L = Ledger(1000, 0, 8)
    L.seed(range(10, 18))
    waited = plan_layer(cpu_only, L, {500: 1}, 0.0, flat(wake_ms=0.25))
    # the read lands at 1.0; the idle cpu lane waits from 0, resumes 0.25 ms later, makes the call (per_layer), runs it
    assert waited.nvme_wait_ms == pytest.approx(1.0 + 0.25)
    assert waited.cpu_ms == pytest.approx(1.0 + 0.25 + 0.145 + 0.104)
    # a lane still busy when the bytes land (8 resident picks of 3 rows: 0.145 + 8 x 0.184 > 1.0) finds them there
    picks = {k: 3 for k in range(10, 18)} | {500: 1}
    p = plan_layer(cpu_only, L, picks, 0.0, flat(wake_ms=0.25))
    q = plan_layer(cpu_only, L, picks, 0.0, flat())
    assert p.nvme_wait_ms == q.nvme_wait_ms == 0.0 and p.cpu_ms == pytest.approx(q.cpu_ms)


def test_serial_engine_adds_the_wake_up_to_a_pick_that_waited():
    c = ctx(overlap=False)
    L = ledger(vram=[1, 2, 3, 4], ram=[7])
    p = plan_layer(c, L, {1: 1, 7: 1, 500: 1}, 0.0, flat(wake_ms=0.1))
    resident = (0.17 + 0.023) + (0.145 + 0.104)
    assert p.nvme_wait_ms == pytest.approx(1.0 + 0.1 - resident)


def test_wake_up_comes_from_the_engine_whose_latency_table_applies():
    from moetier.core.terms import channel_term
    eng = [{"id": "b", "nvme_latency_by_rows_qd_ms": {"1": {"1": 0.6}}, "nvme_wake_ms_by_rows": {"1": 0.1, "4": 0.4},
            "nvme_latency_cv_shared_by_rows": {"1": 0.3}}]
    wake = "nvme_wake_ms_by_rows"
    assert channel_term(wake, 2, eng) == pytest.approx(0.2) and channel_term(wake, 8, eng) == 0.4
    assert channel_term(wake, 1, [{"id": "a"}]) == 0.0                          # unmeasured: no term
    assert channel_term("nvme_latency_cv_shared_by_rows", 4, eng) == 0.3


def test_late_is_the_expected_wait_of_a_normal_arrival():
    from moetier.core.arrivals import late
    assert late(0.5, 0.0) == 0.5 and late(-0.5, 0.0) == 0.0
    assert late(0.0, 1.0) == pytest.approx(1.0 / math.sqrt(2 * math.pi))
    # far from the lane's free time the spread does not matter
    assert late(10.0, 1.0) == pytest.approx(10.0) and late(-10.0, 1.0) == pytest.approx(0.0, abs=1e-12)


def cpu_only_ledger():
    L = Ledger(1000, 0, 8)
    L.seed(range(10, 18))
    return L


def test_reads_of_a_layer_are_late_together_one_expected_wait_per_lane():
    from moetier.core.arrivals import late
    c = ctx(vram_slots=0, lanes={"zerocopy": None})
    L = cpu_only_ledger()
    picks = {500: 1, 501: 1, 502: 1}                    # demand reads land at 1, 2, 3 ms (1 ms per record)
    det = plan_layer(c, L, picks, 0.0, flat())
    spread = plan_layer(c, L, picks, 0.0, flat(cv_shared=0.4))
    assert det.nvme_cpu == spread.nvme_cpu == [500, 501, 502]
    # the lane waits for each read (each takes 0.104 < 1 ms): its end is set by the last read, 3 + 0.104; its free
    # end (no read late) is per_layer + 3 inline picks; the common shift has sd 0.4 x 3 ms
    free = 0.145 + 0.104 + 2 * (c.cpu_call + 0.104)
    due = 3.0 + 0.104
    assert det.cpu_ms == pytest.approx(due)
    extra = late(due - free, 0.4 * 3.0) - (due - free)
    assert spread.cpu_ms == pytest.approx(det.cpu_ms + extra) and extra > 0
    assert spread.nvme_wait_ms == pytest.approx(det.nvme_wait_ms + extra)
    # one draw per layer: far less than charging each of the three reads its own spread
    independent = sum(late(0.0, 0.4 * a) for a in (1.0, 2.0, 3.0))
    assert extra < 0.5 * independent


def test_a_lane_busy_past_its_reads_expects_to_wait_only_when_they_could_be_late():
    from moetier.core.arrivals import late
    c = ctx(vram_slots=0, lanes={"zerocopy": None})
    L = cpu_only_ledger()
    picks = {k: 3 for k in range(10, 18)} | {500: 1}   # resident work ends past the read's arrival at 1.0
    det = plan_layer(c, L, picks, 0.0, flat())
    spread = plan_layer(c, L, picks, 0.0, flat(cv_shared=0.4))
    assert det.nvme_wait_ms == 0.0
    margin = det.cpu_ms - (1.0 + 0.104)                # how far the lane is free after the read is due
    assert spread.nvme_wait_ms == pytest.approx(late(-margin, 0.4)) and 0 < spread.nvme_wait_ms < 0.4
    assert spread.cpu_ms - det.cpu_ms == pytest.approx(spread.nvme_wait_ms)


def test_serial_engine_charges_the_spread_on_its_one_timeline():
    from moetier.core.arrivals import late
    c = ctx(overlap=False)
    L = ledger(vram=[1, 2, 3, 4], ram=[7])
    det = plan_layer(c, L, {1: 1, 7: 1, 500: 1}, 0.0, flat())
    spread = plan_layer(c, L, {1: 1, 7: 1, 500: 1}, 0.0, flat(cv_shared=0.5))
    resident = (0.17 + 0.023) + (0.145 + 0.104)
    extra = late(1.0 - resident, 0.5) - (1.0 - resident)
    assert spread.nvme_wait_ms == pytest.approx(det.nvme_wait_ms + extra)
    assert spread.ms == pytest.approx(det.ms + extra)


def test_max_normal_matches_a_sampled_max():
    import numpy as np
    from moetier.core.arrivals import max_normal as _max_normal
    rng = np.random.default_rng(0)
    x, y = rng.normal(1.0, 0.5, 400_000), rng.normal(1.3, 0.2, 400_000)
    m, v = _max_normal(1.0, 0.25, 1.3, 0.04)
    z = np.maximum(x, y)
    assert m == pytest.approx(z.mean(), abs=3e-3) and v == pytest.approx(z.var(), rel=2e-2)
    assert _max_normal(2.0, 0.0, 1.0, 0.0) == (2.0, 0.0)                      # no spread: the plain max


def test_each_reads_own_lateness_makes_the_lane_end_the_expected_max():
    import numpy as np
    c = ctx(vram_slots=0, lanes={"zerocopy": None})
    L = cpu_only_ledger()
    picks = {500: 1, 501: 1, 502: 1}                    # reads land at 1, 2, 3 ms; each takes 0.104 on the lane
    det = plan_layer(c, L, picks, 0.0, flat())
    own = plan_layer(c, L, picks, 0.0, flat(cv_own=0.3))
    both = plan_layer(c, L, picks, 0.0, flat(cv_shared=0.3, cv_own=0.3))
    # Monte Carlo of the lane: inline picks in arrival order, each waiting for its own late read
    rng = np.random.default_rng(1)
    n = 200_000
    lane = np.full(n, 0.145 - c.cpu_call)             # its first call is the lane's per_layer
    for a in (1.0, 2.0, 3.0):
        t = a * (1 + 0.3 * rng.standard_normal(n))
        lane = np.maximum(lane + c.cpu_call, t) + 0.104
    assert own.cpu_ms == pytest.approx(lane.mean(), rel=0.03)
    assert det.cpu_ms < own.cpu_ms < both.cpu_ms


def test_a_measured_burst_size_sets_each_positions_arrival():
    # size 3 lacks a position
    ch = flat(latency_by_qd={"1": 1.0, "2": 1.5}, bursts={"2": {"1": 1.8, "2": 2.0}, "3": {"1": 2.5, "3": 3.0}})
    assert ch.demand(0.0, 2) == [pytest.approx(1.8), pytest.approx(2.0)]    # both land late: they share the device
    assert ch.demand(10.0, 1) == [pytest.approx(11.0)]                     # size 1 not measured: the depth table
    # size 3's row is incomplete: the three land together, at the depth table's latency for the third
    assert ch.demand(20.0, 3) == [pytest.approx(22.25)] * 3
    ch.demand(30.0, 1)                                                      # one read still in flight ...
    assert ch.demand(30.1, 2) == [pytest.approx(30.1 + 2.25)] * 2          # ... two join it: depth 3
    fifo = flat(latency_by_qd={"1": 1.0, "2": 1.5})
    assert fifo.demand(0.0, 2) == [pytest.approx(1.0), pytest.approx(1.5)]  # no bursts measured: by join depth


def test_burst_table_comes_from_the_engine_and_mixes_between_rows():
    from moetier.core.terms import burst_table_for_rows
    eng = [{"id": "b", "nvme_latency_by_rows_qd_ms": {"1": {"1": 0.6}},
            "nvme_latency_by_rows_burst_ms": {"1": {"2": {"1": 1.0, "2": 2.0}, "3": {"1": 5.0, "2": 5.0, "3": 5.0}},
                                              "4": {"2": {"1": 2.0, "2": 4.0}}}}]
    f = 3.75 / 10.5615234375          # rows 2 between 1 and 4, 64 experts top-4 (plan.layer_width)
    assert burst_table_for_rows(2, eng, width=(64, 4)) == {2: {1: pytest.approx(1 + f), 2: pytest.approx(2 + 2 * f)}}
    assert burst_table_for_rows(1, eng)[3] == {1: 5.0, 2: 5.0, 3: 5.0}
    assert burst_table_for_rows(1, [{"id": "a"}]) == {}


def serial_nvme(c, picks, arr, g, ahead=0.0):
    """The kernel's serial NVMe timeline (plan_kernel._serial_nvme) over ``picks`` ({key: rows}, in arrival order,
    due at ``arr``) after resident lanes that end at ``g`` (gpu) and 0 (cpu), with ``ahead`` ms of admissions;
    returns its lanes and times by the LayerPlan's names."""
    import numpy as np

    from moetier.core import plan_kernel as K
    n = len(picks)
    idx = np.array([list(picks), list(picks.values()), [0] * n], np.int64)
    L, cnt, R = np.empty((6, n), np.int64), np.zeros(6, np.int64), np.zeros(K.R_N)
    g, cpu = K._serial_nvme(K.pack(c), idx, np.array([arr[k] for k in picks]), np.zeros(K.S_N),
                            np.empty(0, np.int64), np.arange(n), g, 0.0, False, ahead, 0.0, L, cnt, R)
    return SimpleNamespace(nvme_cpu=L[K.NVME_CPU, :cnt[K.NVME_CPU]].tolist(),
                           nvme_gpu=L[K.NVME_GPU, :cnt[K.NVME_GPU]].tolist(), gpu_ms=g, cpu_ms=cpu,
                           nvme_wait_ms=R[K.R_NVME_WAIT], gpu_wait_ms=R[K.R_GPU_WAIT])


def test_serial_engine_waits_for_gpu_reads_after_the_admissions_it_runs_first():
    c = ctx(overlap=False, lanes={"cpu": Lane("cpu", "ram", 0.145, 5.0, 0.0)})   # a slow cpu lane: the pick goes gpu
    push = c.push_ms

    def run(ahead):
        return serial_nvme(c, {500: 1}, {500: 1.0}, 0.2, ahead)

    now, later = run(0.0), run(0.5)
    assert now.nvme_gpu == later.nvme_gpu == [500]
    assert now.nvme_wait_ms == pytest.approx(1.0 - 0.2 + push)            # waits from the resident lanes' end
    assert later.nvme_wait_ms == pytest.approx(now.nvme_wait_ms - 0.5)     # the admissions' 0.5 ms come first
    assert later.gpu_ms == pytest.approx(now.gpu_ms - 0.5)                 # copies are not lane time


def test_serial_engine_runs_the_cpu_lanes_nvme_picks_before_the_gpu_lanes():
    c = ctx(overlap=False)
    arr = {500: 1.0, 501: 1.1}
    # pick 500 (first to land) is forced onto the gpu lane by a cpu lane that cannot take it: the runtime still
    # computes 501 on the cpu lane first, then waits for 500's push
    picks = {500: 40, 501: 1}
    plan = serial_nvme(c, picks, arr, 0.0)
    assert plan.nvme_gpu == [500] and plan.nvme_cpu == [501]
    cpu_end = 1.1 + 0.145 + 0.104                                          # 501 waits for its bytes, runs
    assert plan.cpu_ms == pytest.approx(cpu_end)
    assert plan.gpu_wait_ms == pytest.approx(c.push_ms)                    # 500 landed long before: only its push


def test_serial_engine_charges_each_gpu_nvme_pick_a_call_of_its_own():
    """The serial runtime computes each NVMe -> VRAM pick in its own lane call (after its push), so the pick pays
    the gpu lane's per-call cost even when the lane already ran this layer."""
    c = ctx(overlap=False, lanes={"cpu": None})                           # the gpu lane is the only one
    # 0.3 ms of resident gpu work came first: the lane ran this layer, and the NVMe pick still pays per_layer
    plan = serial_nvme(c, {500: 1}, {500: 0.0}, 0.3)
    assert plan.nvme_gpu == [500]
    assert plan.gpu_ms == pytest.approx(0.3 + c.push_ms + 0.17 + 0.023)


def test_prefetch_issue_time_is_after_the_lanes_the_host_runs():
    """Replay.after_plan issues the prefetch at t0 + issue_ms: past the cpu lane when lanes overlap (the host runs
    that one itself), past every lane when they do not."""
    L = ledger(vram=[1, 2, 3, 4], ram=[10])
    ov = plan_layer(ctx(), L, {1: 1, 10: 1}, 0.0, NvmeChannel(9_474_048, 24.0))
    se = plan_layer(ctx(overlap=False), L, {1: 1, 10: 1}, 0.0, NvmeChannel(9_474_048, 24.0))
    assert ov.issue_ms == pytest.approx(ov.cpu_ms) and ov.cpu_ms > 0
    assert se.issue_ms == pytest.approx(se.gpu_ms + se.cpu_ms) and se.gpu_ms > 0


def test_a_prefetch_read_takes_the_depth_one_latency_plus_the_wake_and_a_demand_read_beside_it_does_not_move_it():
    """With a measured table a prefetch read takes the depth-1 latency and its worker's wake-up; a demand read issued
    while it is in service is counted beside it (reads_beside_pf) and takes the plain latency, and the prefetch
    reads queued behind it start after it."""
    ch = measured(latency_by_qd={1: 2.0, 2: 3.0}, wake_ms=0.1)
    assert ch.prefetch(0.0, [7, 8]) == [pytest.approx(2.1), pytest.approx(4.2)]
    assert ch.demand(1.0, 2) == [pytest.approx(3.0), pytest.approx(4.0)]     # beside 7: the plain burst
    assert ch.reads_beside_pf == 2
    assert ch.claim(7, 1.1) == pytest.approx(2.1)
    assert ch.arrival(8) == pytest.approx(4.0 + 2.1)    # 8 waits for the demand reads, then its own
    assert ch.demand(20.0, 1) == [pytest.approx(22.0)] and ch.reads_beside_pf == 2


def test_a_prefetch_read_that_left_the_queue_keeps_the_worker_until_it_lands():
    """A prefetch read that had started when it was expired (wasted) or claimed runs to its end, as the runtime's
    reader cannot drop a started read: the worker starts the next one after it, and a demand read issued meanwhile
    finds it in service (a model that freed the worker ran too many prefetch reads: at tail-prefetch-C1 it withdrew
    68.6% before they started, the runtime 78.0%)."""
    ch = measured(latency_by_qd={1: 2.0})
    ch.prefetch(0.0, [7])                                  # in service 0 .. 2.0
    assert ch.expire([7], 1.0) == ([], [7])                # started: wasted, and still running
    assert ch.prefetch(1.0, [8]) == [pytest.approx(4.0)]   # the worker takes 8 once 7 has landed
    assert ch.demand(1.2, 1) == [pytest.approx(3.2)]       # 7 in service: a read beside it
    assert ch.reads_beside_pf == 1
    assert ch.arrival(8) == pytest.approx(3.2 + 2.0)       # 8 had not started: it waits for the demand read
    assert ch.demand(9.0, 1) == [pytest.approx(11.0)]      # nothing in service any more


def test_a_split_call_pays_the_hand_off_only_when_it_ends_with_a_workers_share():
    """Two threads: 8 experts deal 4 + 4 and the call waits for the worker, which starts a hand-off later; 7 deal
    4 + 3 and the call ends with the caller's 4 (spec.hands_off, Lane.cost the same)."""
    lane = Lane("cpu", "ram", 0.05, 0.2, workers=2, parallel_min=4, per_handoff_ms=0.15)
    c = ctx(lanes={"cpu": lane, "gpu": None, "zerocopy": None}, vram_slots=0)
    for n, want in ((8, 0.05 + 4 * 0.2 + 0.15), (7, 0.05 + 4 * 0.2), (6, 0.05 + 3 * 0.2 + 0.15)):
        keys = list(range(100, 100 + n))
        L = Ledger(1000, 0, 16)
        L.seed(keys)
        p = plan_layer(c, L, {k: 1 for k in keys}, 0.0, None)
        assert p.cpu == sorted(keys, reverse=True) and p.cpu_ms == pytest.approx(want)
        assert lane.cost([1] * n) == pytest.approx(want)
    one = Lane("cpu", "ram", 0.05, 0.2, workers=1, per_handoff_ms=0.15)      # no worker: nothing to hand off
    keys = list(range(100, 108))
    L = Ledger(1000, 0, 16)
    L.seed(keys)
    got = plan_layer(ctx(lanes={"cpu": one, "gpu": None, "zerocopy": None}, vram_slots=0), L, {k: 1 for k in keys},
                     0.0, None)
    assert got.cpu_ms == pytest.approx(0.05 + 8 * 0.2) == one.cost([1] * 8)


def _with_head(c, head, host=0.5):
    import dataclasses
    return dataclasses.replace(c, head_layer=head, host_layer=host)


@pytest.mark.parametrize("overlap", [True, False])
def test_the_hosts_head_start_runs_in_the_reads_time(overlap):
    """Host work before the first wait (PlanContext.head_layer) delays the wait and leaves the serial part: a late
    read hides it, an early one does not."""
    base = ctx(vram_slots=0, lanes={"zerocopy": None}, overlap=overlap)
    picks = {10: 1, 500: 1}
    for rb, late_read in ((1_000_000, True), (10_000, False)):     # lands at 1.0 ms, or at 0.01 ms
        no = plan_layer(_with_head(base, 0.0), cpu_only_ledger(), picks, 0.0,
                        NvmeChannel(rb, 1.0, bw_qd1_gbps=1.0, latency_ms=0.0))
        hd = plan_layer(_with_head(base, 0.3), cpu_only_ledger(), picks, 0.0,
                        NvmeChannel(rb, 1.0, bw_qd1_gbps=1.0, latency_ms=0.0))
        assert hd.nvme_cpu == no.nvme_cpu == [500] and hd.head_ms == 0.3
        if late_read:
            assert no.nvme_wait_ms > 0.3
            assert hd.nvme_wait_ms == pytest.approx(no.nvme_wait_ms - 0.3)
            assert hd.ms == pytest.approx(no.ms - 0.3)
        else:
            assert hd.nvme_wait_ms == no.nvme_wait_ms == 0.0
            assert hd.ms == pytest.approx(no.ms)
        # the lane's own work is the same either way: the head is host time, not cpu_moe
        assert hd.cpu_ms - hd.nvme_wait_ms == pytest.approx(no.cpu_ms - no.nvme_wait_ms)


def test_no_head_start_without_nvme_reads():
    c = _with_head(ctx(vram_slots=0, lanes={"zerocopy": None}), 0.3)
    p = plan_layer(c, cpu_only_ledger(), {10: 1, 11: 2}, 0.0, flat())
    assert p.head_ms == 0.0 and p.ms == pytest.approx(p.cpu_ms + 0.5)


def test_the_hosts_lateness_races_the_reads_like_their_spread():
    from moetier.core.arrivals import late
    c = ctx(vram_slots=0, lanes={"zerocopy": None})
    picks = {10: 1, 500: 1}
    det = plan_layer(c, cpu_only_ledger(), picks, 0.0, flat())
    both = plan_layer(c, cpu_only_ledger(), picks, 0.0, flat(cv_shared=0.3, lane_sd=0.4))
    free = 0.145 + 0.104 + c.cpu_call + 0.104       # the lane's end had the read been there
    due = 1.0 + 0.104
    extra = late(due - free, math.hypot(0.3 * 1.0, 0.4)) - (due - free)
    assert both.cpu_ms == pytest.approx(det.cpu_ms + extra) and extra > 0


def test_a_split_batch_ends_with_its_longest_strided_share():
    cpu = Lane("cpu", "ram", 0.3, 0.1, 0.05, per_call_ms=0.02, workers=2, parallel_min=4)
    c = ctx(vram_slots=0, lanes={"cpu": cpu, "zerocopy": None})
    picks = {10: 1, 11: 3, 12: 1, 13: 2, 14: 1}
    p = plan_layer(c, cpu_only_ledger(), picks, 0.0, None)
    # heaviest first (rows 3, 2, 1, 1, 1), dealt out strided: {3, 1, 1} on the calling thread, {2, 1} on the worker
    assert p.cpu[:2] == [11, 13] and sorted(p.cpu) == sorted(picks)
    assert p.cpu_ms == pytest.approx(cpu.cost(picks)) and p.cpu_ms == pytest.approx(0.3 + (0.2 + 0.1 + 0.1))
    assert p.cpu_crit == (3.0, 2)
    few = plan_layer(c, cpu_only_ledger(), {10: 1, 11: 1, 12: 1}, 0.0, None)
    assert few.cpu_crit is None and few.cpu_ms == pytest.approx(0.02 + 0.3)


def test_lanes_deal_the_ram_picks_and_ctx_times_them():
    """A calibration predicts a run that planned on other terms: that run's plan deals the picks, the fitted terms
    time them."""
    zc = Lane("zerocopy", "ram", 0.0, 1.0, 0.0)
    timing = ctx(vram_slots=0, lanes={"zerocopy": zc})              # cpu 0.104 per expert, zerocopy 1.0
    dear_cpu = ctx(vram_slots=0, lanes={"zerocopy": zc, "cpu": Lane("cpu", "ram", 0.145, 5.0, 0.04)})
    picks = {7: 1, 8: 2}
    L = Ledger(1000, 0, 8)
    L.seed([7, 8])
    own = plan_layer(timing, L, picks, 0.0, None)
    assert own.cpu == [8, 7] and own.zerocopy == []
    dealt = plan_layer(dear_cpu, L, picks, 0.0, None)
    p = plan_layer(timing, L, picks, 0.0, None, lanes=dealt)
    assert p.zerocopy == [8, 7] and p.cpu == []
    assert p.gpu_ms == pytest.approx(2 * 1.0) and p.cpu_ms == 0.0          # timed on the zerocopy lane's costs
    assert plan_layer(timing, L, picks, 0.0, None, lanes=own).lanes() == own.lanes()


@pytest.mark.parametrize("overlap", [True, False])
def test_lanes_also_deal_each_nvme_pick_in_their_order(overlap):
    # the dealer's cpu call costs more than a push and a gpu call; the timing context's gpu call far more
    timing = ctx(overlap=overlap, lanes={"gpu": Lane("gpu", "vram", 50.0, 0.01, 0.0)})
    dealer = ctx(overlap=overlap, lanes={"gpu": Lane("gpu", "vram", 0.01, 0.01, 0.0),
                                         "cpu": Lane("cpu", "ram", 5.0, 5.0, 0.0, per_call_ms=5.0)})
    L = ledger(vram=[1])
    picks = {1: 1, 500: 1, 501: 1}
    own = plan_layer(timing, L, picks, 0.0, NvmeChannel(9_474_048, 24.0))
    dealt = plan_layer(dealer, L, picks, 0.0, NvmeChannel(9_474_048, 24.0))
    assert own.nvme_cpu == [500, 501] and dealt.nvme_gpu == [500, 501]
    dealt.nvme_gpu.reverse()                  # the order the dealing run ran them in is kept too
    p = plan_layer(timing, L, picks, 0.0, NvmeChannel(9_474_048, 24.0), lanes=dealt)
    assert p.nvme_gpu == [501, 500] and p.nvme_cpu == []
    assert p.gpu_ms > 50.0 + (0.0 if overlap else 2 * 50.0)    # timed on ctx's: each pick's own call when serial


def test_lanes_that_deal_to_a_lane_the_recipe_lacks_are_refused():
    dealt = LayerPlan()
    dealt.nvme_cpu = [500]
    with pytest.raises(ValueError, match="lane this recipe lacks"):
        plan_layer(ctx(lanes={"cpu": None}), ledger(), {500: 1}, 0.0, NvmeChannel(9_474_048, 24.0), lanes=dealt)


def test_the_predictions_host_time_has_a_part_per_row():
    R = SimpleNamespace(id="t", experts=100, lanes={"cpu": Lane("cpu", "ram", 0.145, 0.104, 0.04)}, vram_slots=0,
                        nvme_expert_bytes=1_000_000, h2d_gbps=0.0,
                        policy={"prefetch": {"depth": 1, "predictor": "transition"}},
                        host={"per_predict_ms": 0.1, "per_predict_row_ms": 0.05})
    assert PlanContext.from_recipe(R).host_predict == pytest.approx(0.15)
    assert PlanContext.from_recipe(R, rows=4).host_predict == pytest.approx(0.3)
    R.policy = {}
    assert PlanContext.from_recipe(R, rows=4).host_predict == 0.0          # no prediction without prefetch


def test_a_term_set_on_the_context_is_planned_with():
    """plan_layer keeps the context's terms packed for its kernel; a term set afterwards (Replay sets can_admit and,
    per layer, predicting) is what the next plan uses, never the packed copy."""
    c = ctx()
    L = ledger(vram=[1, 2, 3, 4])
    picks = {1: 1, 500: 1}
    first = plan_layer(c, L, picks, 0.0, flat())
    assert first.masked == [] and first.nvme_cpu + first.nvme_gpu == [500]
    c.mask = True
    masked = plan_layer(c, L, picks, 0.0, flat())
    assert masked.masked == [500] and masked.nvme_cpu + masked.nvme_gpu == []
    c.mask = False
    c.host_predict = 0.5
    assert plan_layer(c, L, picks, 0.0, flat()).ms == pytest.approx(first.ms)   # not predicting: not charged
    c.predicting = True
    assert plan_layer(c, L, picks, 0.0, flat()).ms == pytest.approx(first.ms + 0.5)
    c.gpu = (0.17 + 1.0, 0.023, 0.0)
    assert plan_layer(c, L, {1: 1}, 0.0, flat()).gpu_ms == pytest.approx(1.17 + 0.023)


def test_nvme_picks_that_land_together_keep_the_order_of_the_picks():
    """The NVMe picks go to their lanes in arrival order; a burst's reads land together, and among equal arrivals
    the picks keep their order in ``picks`` (a stable sort, as Python's sorted)."""
    ch = measured(latency_by_qd={1: 1.0, 2: 1.0, 3: 1.0}, bursts={3: {1: 2.0, 2: 2.0, 3: 2.0}})
    ch.prefetch(0.0, [509])                     # in service from 0: lands at 1.0, before the burst
    p = plan_layer(ctx(), ledger(), {503: 1, 501: 1, 509: 1, 502: 1}, 0.5, ch)
    assert p.arrivals == {509: 1.0, 503: 2.5, 501: 2.5, 502: 2.5} and p.demand_reads == 3
    order = [509, 503, 501, 502]
    lanes = (p.nvme_cpu, p.nvme_gpu)
    assert sorted(p.nvme_cpu + p.nvme_gpu) == sorted(order)
    assert max(len([k for k in lane if k != 509]) for lane in lanes) >= 2      # a lane holds tied picks
    for lane in lanes:
        assert lane == [k for k in order if k in lane]


def test_the_kernel_writes_the_lanes_into_a_fresh_array_of_the_callers_and_returns_the_times(monkeypatch):
    # arrays a compiled call returns are boxed by numba's runtime: cache-cold in the runtime's planning (plan.py)
    import struct

    import numpy as np

    from moetier.core import plan_gather as G
    from moetier.core import plan_kernel as K
    real, calls = G.plan_call, []

    def spy(*a):
        out = real(*a)
        calls.append((a, out))
        return out

    monkeypatch.setattr(G, "plan_call", spy)
    L = ledger(vram=[1], ram=[10, 11])
    picks = {1: 1, 10: 2, 11: 1, 500: 1}
    n = len(picks)
    plans = [plan_layer(ctx(), L, picks, 0.0, NvmeChannel(9_474_048, 24.0)) for _ in range(2)]
    for (a, r), p in zip(calls, plans):
        O = a[4]
        assert (O.dtype, O.shape) == (np.int64, (6 + 3 * n,)) and type(r) is tuple and len(r) == K.R_N + 1
        assert O[6:6 + n].tolist() == p.gpu + p.zerocopy + p.cpu + p.nvme_cpu + p.nvme_gpu + p.masked
        assert r[K.R_MS] == p.ms and r[K.R_GPU] == p.gpu_ms and r[K.R_CPU] == p.cpu_ms
        # the kernel issued the NVMe pick's read: its key and arrival (float64 bits after the keys) follow the plan
        arrival = struct.unpack_from("d", O, 8 * (6 + 2 * n))[0]
        assert r[K.R_N] == 1 and O[6 + n] == 500 and p.arrivals == {500: arrival} and p.demand_reads == 1
        assert p.packed is O
    # a buffer per call: nothing shared between plans made on other threads
    (a1, r1), (a2, _) = calls
    assert not np.shares_memory(a1[4], a2[4])
    # every element the plan reads is written: what the array held before does not leak into the plan
    outs = []
    for junk in (-1, 7):
        O = np.full_like(a1[4], junk)
        r = real(*a1[:4], O, *a1[5:])
        outs.append((O[:6 + n + 1].tolist(), O[6 + 2 * n:6 + 2 * n + 1].tobytes(), np.array(r).tobytes()))
    assert outs[0] == outs[1] and outs[0][2] == np.array(r1).tobytes()       # bytes: NaN (no split call) alike

