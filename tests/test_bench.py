"""moetier bench's host-cache measurements on the CI tiny store (real reads, real cpu kernels)."""
import os

import pytest

import numba  # noqa: F401  (the cpu extra: a missing install fails, it does not skip)

from moetier.measure import bench
from moetier.core import records as spec
from moetier.bytes import store


@pytest.fixture(scope="module")
def ci_store(tiny_ci_store):
    return store.open_store(tiny_ci_store)


def test_reuse_curve_spans_the_working_sets_and_is_relative_to_cold(ci_store):
    r = bench.reuse_curve(ci_store, max_bytes=64 * ci_store.record_bytes, rounds=2, calls=4)
    sizes = [s["records"] for s in r["samples"]]
    assert sizes == sorted(sizes) and sizes[0] == 24 and sizes[-1] == 64
    curve = {int(b): f for b, f in r["curve"].items()}
    assert max(curve) == 64 * ci_store.record_bytes
    assert curve[max(curve)] == pytest.approx(1.0)          # the largest working set is cold
    factors = [curve[b] for b in sorted(curve)]
    assert factors == sorted(factors) and all(0.05 <= f <= 1.0 for f in factors)
    assert r["cold_per_expert_ms"] > 0


def test_monotone_pools_adjacent_violators():
    assert bench.monotone([1, 3, 2, 4]) == [1, 2.5, 2.5, 4]
    assert bench.monotone([5, 1, 1, 1]) == [2, 2, 2, 2]
    assert bench.monotone([]) == []


def test_llc_bytes_reads_sysfs_or_says_zero(tmp_path):
    """The highest level's size from a sysfs-shaped tree (a fake one here: entries unreadable or malformed are
    passed over), 0 without one; on this host, where sysfs reports caches, a size of at least the L1's."""
    fake = tmp_path / "cache"
    for i, (level, size) in enumerate([("1", "48K"), ("2", "1024K"), ("3", "32768K"), ("x", "9M"), ("4", "big")]):
        (fake / f"index{i}").mkdir(parents=True)
        (fake / f"index{i}" / "level").write_text(level + "\n")
        (fake / f"index{i}" / "size").write_text(size + "\n")
    (fake / "index9").mkdir()
    assert bench.llc_bytes(str(fake)) == 32768 << 10
    assert bench.llc_bytes(str(tmp_path / "none")) == 0
    real = "/sys/devices/system/cpu/cpu0/cache"
    if os.path.isdir(real) and any(os.path.isfile(f"{real}/{e}/size") for e in os.listdir(real)):
        assert bench.llc_bytes() >= 16 << 10


def test_records_carry_the_cache_measurements_into_a_valid_hardware_record():
    m = {"nvme_qd1": {"gbps": 1.0, "latency_ms_p50": 0.5, "latency_ms_p90": 0.9},
         "nvme_qd16": {"gbps": 2.0}, "nvme_latency_by_qd_ms": {"1": 0.5},
         "cpu_lane": {"per_layer_ms": 0.1, "per_call_ms": 0.01, "per_expert_ms": 0.2, "per_extra_token_ms": 0.05,
                      "workers": 2, "parallel_min": 4, "weight_gbps_1row": 5.0, "encoding": "int8"},
         "nvme_cpu_ms_per_read": 0.2, "membw_read_gbps": 10.0, "record_bytes": 4096, "cores": 2, "machine": "m",
         "llc_bytes": 1 << 20, "reuse": {"curve": {"40960": 0.6, "4096000": 1.0}}}
    hw, eng = bench.records(m, "bench-test", "bench-test-engine", "now")
    assert hw["cpu"]["llc_bytes"] == 1 << 20 and hw["cpu"]["reuse_curve"] == {"40960": 0.6, "4096000": 1.0}
    spec.validate("hardware", hw, "hardware/bench-test.json")
    spec.validate("engine", eng, "engine/bench-test-engine.json")
