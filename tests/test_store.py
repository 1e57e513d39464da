"""Packed record store: pack -> verify round trip, atomic pack, open_store validation."""

import errno
import json
import os

import pytest

from moetier.bytes import expert
from moetier.bytes import store
from moetier.errors import UserError

MODEL = {"id": "tiny", "moe": {"layers": 2, "experts": 4}, "store": {"hidden": 64, "ffn": 64, "encoding": "int8"}}


@pytest.fixture
def packed(tmp_path):
    out = tmp_path / "store"
    man = store.pack(MODEL, out, seed=7)
    return out, man


def test_pack_verify_round_trip(packed):
    out, man = packed
    lay = expert.layout(64, 64, "int8")
    assert man["format"] == "moetier-store/1"
    assert man["records"] == 8 and man["record_bytes"] == lay.record_bytes
    assert man["record_bytes"] % 4096 == 0
    assert len(man["digests"]) == 8 and man["checksum"] == "xxh3-128"
    data = (out / "experts.bin").read_bytes()
    assert len(data) == 8 * lay.record_bytes
    for key in range(8):
        rec = data[key * lay.record_bytes:(key + 1) * lay.record_bytes]
        assert rec == expert.make_expert(lay, key, 7)
    st = store.open_store(out, model=MODEL)
    assert st.nrecords == 8 and st.offset(5) == 5 * st.record_bytes and len(st.digest(5)) == 16
    seen = []
    res = store.verify(out, model=MODEL, progress=lambda d, n: seen.append((d, n)))
    assert res["records"] == 8 and res["bad"] == [] and res["bytes"] == 8 * lay.record_bytes
    assert seen[-1] == (8, 8)
    assert not [p for p in os.listdir(out.parent) if ".tmp-" in p]


def test_verify_names_corrupt_key(packed):
    out, man = packed
    rb = man["record_bytes"]
    with open(out / "experts.bin", "r+b") as f:
        f.seek(5 * rb + 100)
        b = f.read(1)
        f.seek(5 * rb + 100)
        f.write(bytes([b[0] ^ 1]))
    with pytest.raises(UserError, match=r"keys 5\b") as ei:
        store.verify(out)
    assert ei.value.bad == [5]


def test_pack_replaces_existing_store(packed):
    out, _ = packed
    store.pack(MODEL, out, seed=8)
    assert store.open_store(out).manifest["seed"] == 8
    assert sorted(os.listdir(out.parent)) == ["store"]


def test_pack_refuses_non_store_dir(tmp_path):
    d = tmp_path / "notastore"
    d.mkdir()
    (d / "precious.txt").write_text("x")
    with pytest.raises(UserError, match="not a moetier store"):
        store.pack(MODEL, d)
    assert (d / "precious.txt").exists()


def test_pack_enospc_is_atomic(tmp_path, monkeypatch):
    calls = []

    def full(fd, buf, offset):
        calls.append(offset)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(store, "_write_all", full)
    out = tmp_path / "store"
    with pytest.raises(UserError, match="no space left on device writing .*experts.bin"):
        store.pack(MODEL, out)
    assert calls
    assert not out.exists()
    assert os.listdir(tmp_path) == []


def test_pack_enospc_midway_keeps_old_store(packed, monkeypatch):
    out, man = packed
    real = store._write_all
    n = []

    def full_later(fd, buf, offset):
        n.append(1)
        if offset > 0 or len(n) > 1:
            raise OSError(errno.ENOSPC, "No space left on device")
        real(fd, buf, offset)

    monkeypatch.setattr(store, "BATCH_BYTES", man["record_bytes"] * 2)
    monkeypatch.setattr(store, "_write_all", full_later)
    with pytest.raises(UserError, match="no space left"):
        store.pack(MODEL, out, seed=9)
    assert store.open_store(out).manifest["seed"] == 7
    assert sorted(os.listdir(out.parent)) == ["store"]


def test_open_store_missing(tmp_path):
    with pytest.raises(UserError, match="not found"):
        store.open_store(tmp_path / "nope")


@pytest.mark.parametrize("change,match", [
    ({"moe": {"layers": 3, "experts": 4}}, "moe.layers 3"),
    ({"moe": {"layers": 2, "experts": 8}}, "moe.experts 8"),
    ({"store": {"hidden": 64, "ffn": 128, "encoding": "int8"}}, "does not match"),
    ({"store": {"hidden": 64, "ffn": 64, "encoding": "int4g32"}}, "does not match"),
])
def test_open_store_model_mismatch(packed, change, match):
    out, _ = packed
    with pytest.raises(UserError, match=match):
        store.open_store(out, model={**MODEL, **change})


@pytest.mark.parametrize("field,value,match", [
    ("format", "other/1", "format"),
    ("records", 9, "records"),
    ("record_bytes", 1000, "record_bytes"),
    ("digests", ["00"] * 8, "digests"),
    ("layout", {"hidden": 64}, "layout"),
])
def test_open_store_bad_manifest(packed, field, value, match):
    out, _ = packed
    mp = out / "manifest.json"
    m = json.loads(mp.read_text())
    m[field] = value
    mp.write_text(json.dumps(m))
    with pytest.raises(UserError, match=match):
        store.open_store(out)


def test_open_store_truncated_data(packed):
    out, man = packed
    with open(out / "experts.bin", "r+b") as f:
        f.truncate(man["record_bytes"] * 7)
    with pytest.raises(UserError, match="size"):
        store.open_store(out)


def test_pack_bad_model(tmp_path):
    with pytest.raises(UserError, match="store.hidden"):
        store.pack({"id": "x", "moe": {"layers": 1, "experts": 1}, "store": {"ffn": 64, "encoding": "int8"}},
                   tmp_path / "s")
    with pytest.raises(UserError, match="encoding"):
        store.pack({"id": "x", "moe": {"layers": 1, "experts": 1},
                    "store": {"hidden": 64, "ffn": 64, "encoding": "fp9"}}, tmp_path / "s")
    assert os.listdir(tmp_path) == []


# -- teardown: a close that fails leaks nothing after it --------------------------------------------------------------

NOT_OPEN = 999_999        # an fd number above any open one: closing it fails for real (EBADF)


def _is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
        return True
    except OSError:
        return False


def test_close_all_closes_every_handle_then_raises_the_first_error():
    from moetier.bytes.teardown import close_all
    called = []

    def fails(name, exc):
        def close():
            called.append(name)
            raise exc
        return close
    with pytest.raises(OSError) as e:
        close_all([fails("a", OSError(errno.EIO, "first")), lambda: called.append("b"), None,
                   fails("c", ValueError("second")), lambda: called.append("d")])
    assert called == ["a", "b", "c", "d"] and "first" in str(e.value)
    assert any("ValueError: second" in n for n in e.value.__notes__)   # Python >= 3.11 (pyproject)
    close_all([])


def test_checkpoint_close_closes_every_file_after_one_that_fails(tmp_path):
    from moetier.bytes.checkpoint import Exl3Checkpoint
    paths = [tmp_path / f"shard-{i}.safetensors" for i in range(4)]
    for p in paths:
        p.write_bytes(b"x")
    ck = Exl3Checkpoint.__new__(Exl3Checkpoint)
    ck._fds = {"bad": NOT_OPEN, **{str(p): os.open(p, os.O_RDONLY) for p in paths}}
    fds = [fd for fd in ck._fds.values() if fd != NOT_OPEN]
    with pytest.raises(OSError) as e:
        ck.close()
    assert e.value.errno == errno.EBADF
    assert not any(_is_open(fd) for fd in fds), "a shard's file descriptor leaked past the failed close"
    assert ck._fds == {}
    ck.close()                      # a second close closes nothing twice


class FailingShutdown:
    """A FAKE executor (test-only) whose shutdown raises, standing in for a worker pool that fails to stop."""

    def __init__(self, real):
        self.real = real

    def shutdown(self, wait=True):
        self.real.shutdown(wait=wait)
        raise RuntimeError("fake: the fill workers failed to stop")

    def __getattr__(self, name):
        return getattr(self.real, name)


def test_reader_close_closes_its_file_after_a_worker_pool_that_fails(packed):
    from moetier.bytes.transport import Reader, SlotPool
    out, _ = packed
    st = store.open_store(out, model=MODEL)
    with SlotPool(2, st.record_bytes) as pool:
        rd = Reader(st, pool, queue_depth=2)
        rd.wait(rd.fill(3, 0))
        fd = rd._fd
        rd._pool = FailingShutdown(rd._pool)
        with pytest.raises(RuntimeError, match="fake: the fill workers"):
            rd.close()
        assert not _is_open(fd), "the reader's (O_DIRECT) file descriptor leaked past the failed shutdown"
        assert rd._pf_pool._shutdown, "the prefetch worker was left running"


class FailingLaneClose:
    """A FAKE lane close (test-only): the lane's workers stop, then close raises."""

    def __init__(self, real_close):
        self.real_close = real_close

    def __call__(self):
        self.real_close()
        raise RuntimeError("fake: the lane failed to close")


def test_backend_close_closes_reader_and_pool_after_a_lane_that_fails(packed):
    from backends.cpu.backend import CpuBackend
    out, _ = packed
    be = CpuBackend(store.open_store(out, model=MODEL), ram_slots=2)
    be.wait(be.fill(1, 0))
    fd = be.reader._fd
    be.lane.close = FailingLaneClose(be.lane.close)
    with pytest.raises(RuntimeError, match="fake: the lane failed"):
        be.close()
    assert not _is_open(fd), "the reader's file descriptor leaked past the lane's failed close"
    assert be.pool._closed, "the RAM slot pool was left open"
