"""The packed expert record store: ``experts.bin`` + ``manifest.json`` in one directory.

Record for key ``layer * experts + expert`` lives at byte offset ``key * record_bytes``; ``record_bytes`` is a multiple
of 4096 so every record can be read with O_DIRECT. ``manifest.json`` names the model, the geometry, the expert layout
(``moetier.expert.ExpertLayout.to_json()``), the generator seed and one xxh3-128 digest per key. See docs/store.md.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import time

import numpy as np

from moetier.bytes import router_record
from moetier.bytes.layout import (CHECKSUM, DATA_NAME, DIGEST_BYTES, FORMAT, MANIFEST_NAME,  # noqa: F401
                                  digest, record_offset)
from moetier import strictjson
from moetier.errors import UserError

BATCH_BYTES = 8 * 1024 * 1024  # bytes gathered per write call


def _write_all(fd: int, buf, offset: int) -> None:
    """pwrite all of buf at offset (module-level so tests can simulate ENOSPC)."""
    mv = memoryview(buf)
    done = 0
    while done < len(mv):
        n = os.pwrite(fd, mv[done:], offset + done)
        if n <= 0:
            raise OSError(errno.EIO, "pwrite wrote 0 bytes")
        done += n


def _fsync_dir(path: str) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _geometry(model: dict, encoding=None):
    """(model id, layers, experts, ExpertLayout) from a model record dict; UserError naming the field."""
    from moetier.bytes import expert

    if not isinstance(model, dict):
        raise UserError(f"store: model must be a model record object, got {type(model).__name__}")
    mid = model.get("id", "?")
    moe = model.get("moe")
    st = model.get("store")
    if not isinstance(moe, dict):
        raise UserError(f"model {mid}: field 'moe' missing")
    if not isinstance(st, dict):
        raise UserError(f"model {mid}: field 'store' missing (needs store.hidden, store.ffn, store.encoding)")
    vals = {}
    for sec, name, field in (("moe", moe, "layers"), ("moe", moe, "experts"), ("store", st, "hidden"),
                             ("store", st, "ffn")):
        v = name.get(field)
        if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
            raise UserError(f"model {mid}: field '{sec}.{field}' expected a positive integer, got {v!r}")
        vals[field] = v
    enc = encoding if encoding is not None else st.get("encoding")
    extra = {f: st.get(f) for f in ("bits", "codebook", "act_limit") if f in st} if enc == expert.EXL3 else {}
    try:
        lay = expert.layout(vals["hidden"], vals["ffn"], enc, **extra)
    except ValueError as e:
        raise UserError(f"model {mid}: store geometry: {e}") from None
    rb = st.get("record_bytes")
    if rb is not None and encoding is None and rb != lay.record_bytes:
        raise UserError(f"model {mid}: field 'store.record_bytes' is {rb!r} but the layout gives {lay.record_bytes}")
    return mid, vals["layers"], vals["experts"], lay


def _describe(lay) -> str:
    exl3 = f" K={lay.bits} {lay.codebook}" if lay.encoding == "exl3" else ""
    return f"{lay.hidden}x{lay.ffn} {lay.encoding}{exl3}"


def _match_model(model: dict, what: str, L: int, E: int, lay) -> str:
    """The model's id, if ``what`` (L layers x E experts of layout lay) matches its record; else UserError."""
    mid, mL, mE, mlay = _geometry(model)
    if (L, E) != (mL, mE):
        raise UserError(f"{what}: holds {L} layers x {E} experts but model {mid} has moe.layers {mL} x "
                        f"moe.experts {mE}")
    if mlay.to_json() != lay.to_json():
        raise UserError(f"{what}: layout {_describe(lay)} does not match model {mid} store geometry "
                        f"{_describe(mlay)}")
    return mid


def _is_store_dir(path: str) -> bool:
    try:
        with open(os.path.join(path, MANIFEST_NAME)) as f:
            return json.load(f).get("format") == FORMAT
    except (OSError, ValueError, AttributeError):
        return False


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:      # someone else's live process
        return True
    return True


def remove_stale(out: str) -> list:
    """Remove ``<out>.tmp-<pid>`` / ``<out>.old-<pid>`` folders whose process is no longer alive (a pack killed
    by SIGKILL, or a machine that lost power, cannot clean up after itself); returns the removed paths."""
    parent, name = os.path.split(out)
    removed = []
    try:
        entries = os.listdir(parent)
    except OSError:
        return removed
    for e in sorted(entries):
        for tag in (".tmp-", ".old-"):
            head, sep, pid = e.rpartition(tag)
            if tag == ".old-" and not os.path.isdir(out):
                continue            # killed mid-swap: the old store is the only complete one; keep it
            if sep and head == name and pid.isdigit() and int(pid) != os.getpid() and not _alive(int(pid)):
                path = os.path.join(parent, e)
                if os.path.isdir(path) and not os.path.islink(path):
                    shutil.rmtree(path, ignore_errors=True)
                    removed.append(path)
    return removed


def pack(model: dict, out_dir, *, seed: int = 0, encoding=None, progress=None) -> dict:
    """Generate every expert record of ``model`` with expert.make_expert and write a store at ``out_dir``.

    Writes into ``out_dir + ".tmp-<pid>"`` and renames onto ``out_dir`` only when complete (file and directories
    fsynced). An existing store at ``out_dir`` is replaced; any other existing path is refused. Staging folders of
    ``out_dir`` left by a process that is no longer alive are removed first (listed in the manifest's
    ``removed_stale``). ``progress`` is called as ``progress(done_records, total_records)``. Returns the manifest.
    """
    from moetier.bytes import expert

    mid, L, E, lay = _geometry(model, encoding)

    def fill(key: int, buf) -> None:
        rec = expert.make_expert(lay, key, seed)
        if len(rec) != lay.record_bytes:
            raise RuntimeError(f"make_expert returned {len(rec)} bytes for key {key}, expected {lay.record_bytes}")
        buf[:] = np.frombuffer(rec, dtype=np.uint8)

    return write_store(out_dir, mid, L, E, lay, fill, seed=seed, progress=progress,
                       router=lambda d: router_record.write(d, model, L, E, lay.hidden, seed))


def pack_checkpoint(ckpt_dir, out_dir, *, model: dict | None = None, progress=None) -> dict:
    """Pack the routed experts of an EXL3 checkpoint directory into a store at ``out_dir``: the trunk's MoE layers
    (keys ordinal * experts + expert), then its MTP layers as ``extra_layers``; one record in memory at a time.
    With ``model`` (a model record) the checkpoint must match its layers, experts and layout."""
    from moetier.bytes import checkpoint, hf_config

    with checkpoint.open_exl3(ckpt_dir) as ck:
        geo, lay = ck.geometry, ck.layout
        mid = hf_config.slug(os.path.basename(ck.path.rstrip(os.sep)))
        if model is not None:
            mid = _match_model(model, f"--checkpoint {ck.path}", ck.trunk_layers, ck.experts, lay)
        source = {"checkpoint": ck.path, "architecture": geo.family, "moe_layers": ck.prefixes}
        return write_store(out_dir, mid, ck.trunk_layers, ck.experts, lay, ck.fill, extra_layers=ck.mtp_layers,
                           source=source, progress=progress)


def write_store(out_dir, mid: str, L: int, E: int, lay, fill, *, seed: int = 0, extra_layers: int = 0,
                source: dict | None = None, progress=None, router=None) -> dict:
    """Write a store of (L + extra_layers) * E records at ``out_dir``: ``fill(key, buf)`` writes record ``key`` into
    ``buf`` (a zeroed uint8 array of record_bytes, reused: at most BATCH_BYTES or one record is held at a time, so
    memory stays bounded whatever the store's size). ``extra_layers`` are layers kept past the model's (an MTP layer,
    keys L*E..); ``source`` says where the bytes came from; ``router(dir)``, when given, writes the router record's
file into the store directory and returns its manifest entry (moetier.bytes.router_record). Atomic like ``pack``;
returns the manifest dict."""
    # through a symlink: the new store replaces its target and the link is kept (moving the link aside instead
    # would leave it behind as <out>.old-<pid>, which rmtree cannot remove)
    out = os.path.realpath(os.path.abspath(os.fspath(out_dir)))
    if os.path.lexists(out) and not (os.path.isdir(out) and _is_store_dir(out)):
        raise UserError(f"pack: {out} exists and is not a moetier store; refusing to overwrite it")
    parent = os.path.dirname(out)
    if not os.path.isdir(parent):
        raise UserError(f"pack: parent directory {parent} does not exist")
    stale = remove_stale(out)
    tmp = f"{out}.tmp-{os.getpid()}"
    rb = lay.record_bytes
    n = (L + extra_layers) * E
    batch = max(1, BATCH_BYTES // rb)
    buf = np.zeros(batch * rb, dtype=np.uint8)
    digests = []
    t0 = time.perf_counter()
    data_path = os.path.join(tmp, DATA_NAME)
    try:
        if os.path.lexists(tmp):
            shutil.rmtree(tmp)
        os.mkdir(tmp)
        fd = os.open(data_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            key = 0
            while key < n:
                stop = min(n, key + batch)
                buf[:] = 0
                for k in range(key, stop):
                    rec = buf[(k - key) * rb:(k - key + 1) * rb]
                    fill(k, rec)
                    digests.append(digest(rec).hex())
                _write_all(fd, buf[:(stop - key) * rb], key * rb)
                key = stop
                if progress is not None:
                    progress(key, n)
            os.fsync(fd)
        finally:
            os.close(fd)
        router_entry = router(tmp) if router is not None else None
        manifest = {
            "format": FORMAT,
            "model": mid,
            "layers": L,
            "experts": E,
            **({"extra_layers": int(extra_layers)} if extra_layers else {}),
            "layout": lay.to_json(),
            "seed": int(seed),
            **({"source": source} if source is not None else {}),
            "record_bytes": rb,
            "records": n,
            "checksum": CHECKSUM,
            "digests": digests,
            **({"router": router_entry} if router_entry is not None else {}),
        }
        mpath = os.path.join(tmp, MANIFEST_NAME)
        with open(mpath, "w") as f:
            json.dump(manifest, f, separators=(",", ":"))
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        _fsync_dir(tmp)
        if os.path.lexists(out):  # an existing store: move it aside, swap in the new one, then delete the old one
            old = f"{out}.old-{os.getpid()}"
            os.replace(out, old)
            os.replace(tmp, out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, out)
        _fsync_dir(parent)
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        where = e.filename or data_path
        if e.errno == errno.ENOSPC:
            raise UserError(f"pack: no space left on device writing {where}") from None
        raise UserError(f"pack: {e.strerror or e} writing {where}") from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    manifest["seconds"] = round(time.perf_counter() - t0, 3)
    manifest["removed_stale"] = stale
    return manifest


class Store:
    """An opened store. ``offset(key)`` is the byte offset of a record, ``digest(key)`` its 16-byte xxh3-128."""

    def __init__(self, path: str, manifest: dict, layout):
        self.path = path
        self.manifest = manifest
        self.layout = layout
        self.record_bytes = int(manifest["record_bytes"])
        self.nrecords = int(manifest["records"])
        self.layers = int(manifest["layers"])
        self.experts = int(manifest["experts"])
        self.data_path = os.path.join(path, DATA_NAME)
        self._digests = [bytes.fromhex(h) for h in manifest["digests"]]
        self._router = None

    def router_record(self) -> dict:
        """The manifest's router entry (scoring, renormalize, topk, digest); UserError for a store without one."""
        rec = self.manifest.get("router")
        if rec is None:
            raise UserError(f"store {self.path}: no router record (packed without router weights); route with the "
                            f"trace, or pack a seeded store again with `moetier store pack`")
        return rec

    def router(self, layer: int):
        """Router weights of one layer, float32 [experts, hidden], checksum-verified when first read."""
        if self._router is None:
            self._router = router_record.load(self.path, self.router_record())
        return self._router[layer]

    def key(self, layer: int, expert: int) -> int:
        return layer * self.experts + expert

    def offset(self, key: int) -> int:
        if not 0 <= key < self.nrecords:
            raise ValueError(f"store {self.path}: key {key} out of range 0..{self.nrecords - 1}")
        return record_offset(key, self.record_bytes)

    def digest(self, key: int) -> bytes:
        return self._digests[key]

    def __repr__(self):
        return f"Store({self.path!r}, records={self.nrecords}, record_bytes={self.record_bytes})"


def _manifest(mpath: str) -> dict:
    """The store's manifest, its fields checked (UserError names the field and what it expected)."""
    try:
        with open(mpath, encoding="utf-8") as f:
            text = f.read()
    except (OSError, ValueError) as e:
        raise UserError(f"store {mpath}: unreadable manifest: {e}") from None
    m = strictjson.loads(text, f"store {mpath}")
    if not isinstance(m, dict):
        raise UserError(f"store {mpath}: manifest must be a JSON object")
    if m.get("format") != FORMAT:
        raise UserError(f"store {mpath}: field 'format' expected {FORMAT!r}, got {m.get('format')!r}")
    for f in ("layers", "experts", "record_bytes", "records", "seed"):
        v = m.get(f)
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            raise UserError(f"store {mpath}: field '{f}' expected a non-negative integer, got {v!r}")
    if m.get("checksum") != CHECKSUM:
        raise UserError(f"store {mpath}: field 'checksum' expected {CHECKSUM!r}, got {m.get('checksum')!r}")
    if m["record_bytes"] <= 0 or m["record_bytes"] % 4096:
        raise UserError(f"store {mpath}: field 'record_bytes' must be a positive multiple of 4096, got {m['record_bytes']}")
    xl = m.get("extra_layers", 0)
    if not isinstance(xl, int) or isinstance(xl, bool) or xl < 0:
        raise UserError(f"store {mpath}: field 'extra_layers' expected a non-negative integer, got {xl!r}")
    if m["records"] != (m["layers"] + xl) * m["experts"]:
        raise UserError(f"store {mpath}: field 'records' is {m['records']}, expected (layers+extra_layers)*experts = "
                        f"{(m['layers'] + xl) * m['experts']}")
    return m


def _layout(m: dict, mpath: str):
    """The manifest's expert layout, checked against its record size, and its digests' shape."""
    from moetier.bytes import expert

    try:
        lay = expert.ExpertLayout.from_json(m.get("layout"))
    except ValueError as e:
        raise UserError(f"store {mpath}: field 'layout': {e}") from None
    if lay.record_bytes != m["record_bytes"]:
        raise UserError(f"store {mpath}: field 'record_bytes' is {m['record_bytes']} but the layout gives "
                        f"{lay.record_bytes}")
    dg = m.get("digests")
    if not isinstance(dg, list) or len(dg) != m["records"]:
        raise UserError(f"store {mpath}: field 'digests' expected a list of {m['records']} hex strings")
    for i, h in enumerate(dg):
        if not isinstance(h, str) or len(h) != 2 * DIGEST_BYTES:
            raise UserError(f"store {mpath}: field 'digests[{i}]' expected {2 * DIGEST_BYTES} hex characters")
    return lay


def open_store(path, *, model: dict | None = None) -> Store:
    """Open and validate a store directory; with ``model`` also check it matches (layers, experts, layout)."""
    p = os.path.abspath(os.fspath(path))
    mpath = os.path.join(p, MANIFEST_NAME)
    if not os.path.isdir(p) or not os.path.exists(mpath):
        raise UserError(f"store {p}: not found (no {MANIFEST_NAME})")
    m = _manifest(mpath)
    lay = _layout(m, mpath)
    dpath = os.path.join(p, DATA_NAME)
    try:
        size = os.path.getsize(dpath)
    except OSError:
        raise UserError(f"store {p}: {DATA_NAME} missing") from None
    want = m["records"] * m["record_bytes"]
    if size != want:
        raise UserError(f"store {dpath}: size {size} bytes, expected records*record_bytes = {want}")
    if "router" in m:
        router_record.check(m["router"], f"store {mpath}", m["layers"], m["experts"], lay.hidden)
    try:
        st = Store(p, m, lay)
    except ValueError as e:
        raise UserError(f"store {mpath}: field 'digests': {e}") from None
    if model is not None:
        _match_model(model, f"store {p}", st.layers, st.experts, lay)
    return st


def verify(path, *, model: dict | None = None, progress=None, queue_depth: int = 16, direct: bool = True) -> dict:
    """Re-read every record through the transport (O_DIRECT, verify_rate 1.0) and check its digest.

    Returns {records, bad: [keys], bytes, seconds, direct}; raises UserError naming the first bad keys if any.
    ``progress`` is called as ``progress(done_records, total_records)``.
    """
    from moetier.bytes.transport import Reader, SlotPool, TransportError

    st = open_store(path, model=model)
    n = st.nrecords
    qd = max(1, min(int(queue_depth), n))
    bad = []
    t0 = time.perf_counter()
    with SlotPool(qd, st.record_bytes) as pool:
        with Reader(st, pool, queue_depth=qd, verify_rate=1.0, direct=direct) as rd:
            inflight = []  # FIFO of completions, one slot each
            free = list(range(qd))
            done = 0
            key = 0
            while done < n:
                while key < n and free:
                    inflight.append(rd.fill(key, free.pop()))
                    key += 1
                c = inflight.pop(0)
                try:
                    rd.wait(c)
                except TransportError:
                    bad.append(c.key)
                free.append(c.slot)
                done += 1
                if progress is not None:
                    progress(done, n)
            nbytes = rd.stats["bytes"]
            direct_used = rd.direct
    secs = time.perf_counter() - t0
    if bad:
        head = ", ".join(str(k) for k in bad[:8])
        more = f" (+{len(bad) - 8} more)" if len(bad) > 8 else ""
        err = UserError(f"store {st.path}: {len(bad)} of {n} records failed verification: keys {head}{more}")
        err.bad = bad
        raise err
    return {"records": n, "bad": bad, "bytes": nbytes, "seconds": round(secs, 3), "direct": direct_used}
