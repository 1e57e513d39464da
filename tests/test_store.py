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
