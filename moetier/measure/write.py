"""Record writing for `moetier calibrate`: the fitted terms into the engine, hardware and recipe records.

Contract
--------
``write_terms(recipe_id, terms, when, vram_engine)`` writes the cpu lane's terms into the recipe's engine (and the
VRAM engine, which runs the same cpu lane), the gpu / zerocopy lanes into the VRAM engine, the NVMe tables into
the engines that produced the load, gpu.h2d_gbps into the hardware record and the host and non-MoE terms into the
recipe's calibration block; each record validated and written atomically (moetier.core.records.write_record). A
term an earlier calibration left and this one did not fit is removed. With a ``suffix`` (the CLI's ``-cal``) every
record is written under ``<id><suffix>`` instead (an id that already ends with it is kept), the recipe naming the
renamed engines and hardware, so no shipped record is overlaid; ``written_ids`` lists the ids a write may touch,
for the check made before measuring. Returns (kind, id, path) of each record written.
"""
from __future__ import annotations

from moetier.core import records as spec
from moetier.core.terms import CHANNEL_FIELDS
from moetier.errors import UserError


def cal_id(rid: str, suffix: str) -> str:
    """The id calibrate writes the record ``rid`` under."""
    return rid if not suffix or rid.endswith(suffix) else rid + suffix


def written_ids(recipe_id: str, vram_engine: str, suffix: str) -> list[tuple[str, str]]:
    """(kind, id) of every record write_terms may write for this recipe (which engines it writes depends on the
    fit; these are all it can)."""
    rec = spec.load_record("recipe", recipe_id)
    ids = [("recipe", recipe_id), ("hardware", rec["hardware"])] + \
        [("engine", e) for e in dict.fromkeys(rec["engines"] + [vram_engine])]
    return [(kind, cal_id(rid, suffix)) for kind, rid in ids]


def write_terms(recipe_id: str, terms: dict, when: str, vram_engine: str, suffix: str = "") -> list:
    """Write the fitted terms into the engines (cpu lane: the recipe's engine and, with VRAM arms, the VRAM engine,
    which runs the same cpu lane; gpu/zerocopy lanes: the VRAM engine), the hardware record (NVMe latency table,
    gpu.h2d_gbps from the copy time) and the recipe's calibration block (validated; all of them or none)."""
    rec = spec.load_record("recipe", recipe_id)
    writes = []       # calibrate updates these records by design (force); all are staged, then renamed
    R0 = spec.resolve(recipe_id)
    record_bytes = R0.nvme_expert_bytes
    with_cpu = [e for e in rec["engines"] if "cpu" in spec.load_record("engine", e)["lanes"]]
    if not with_cpu:
        raise UserError(f"calibrate {recipe_id}: no engine of the recipe has a cpu lane to calibrate")
    src = f"moetier calibrate {when}: lanes fitted in situ from runtime counters ({recipe_id} fit arms)"
    device = {ln: terms[ln] for ln in ("gpu", "zerocopy") if ln in terms}
    tables = terms["nvme_latency_by_rows_qd_ms"]
    for eng_id in dict.fromkeys([with_cpu[-1]] + ([vram_engine] if device else []) + list(tables)):
        eng = spec.load_record("engine", eng_id)
        for ln, vals in [("cpu", terms["cpu"])] + (list(device.items()) if eng_id == vram_engine else []):
            if ln in eng["lanes"]:
                for c in spec.LANE_OPTIONAL:                    # one fitted by an earlier run must not outlive it
                    eng["lanes"][ln].pop(c, None)
                eng["lanes"][ln].update({k: round(v, 6) for k, v in vals.items()})
                eng["lanes"][ln]["expert_bytes"] = R0.expert_bytes   # the terms hold at this model's expert size
        eng.pop("head_per_read_ms", None)
        if eng_id in terms.get("head_per_read_ms_by_engine", {}):
            eng["head_per_read_ms"] = round(terms["head_per_read_ms_by_engine"][eng_id], 6)
        if eng_id in tables:
            _write_channel(eng, terms, tables[eng_id], record_bytes, when)
        eng["source"] = src
        writes.append(("engine", eng))
    rec["calibration"]["fixed_ms"] = terms["fixed_ms"]
    rec["calibration"]["host"] = {**{k: round(v, 6) for k, v in terms["host"].items()},
                                  "source": f"moetier calibrate {when}"}
    rec["calibration"]["source"] = f"moetier calibrate {when}: fixed_ms = measured step wall outside the layers"
    writes.append(("recipe", rec))
    hw = _hardware(spec.load_record("hardware", rec["hardware"]), terms, bool(tables), record_bytes, when)
    writes += [("hardware", hw)] if hw else []
    if suffix:
        renamed = {r["id"]: cal_id(r["id"], suffix) for _, r in writes}
        rec["engines"] = [renamed.get(e, e) for e in rec["engines"]]
        rec["hardware"] = renamed.get(rec["hardware"], rec["hardware"])
        for _, r in writes:
            r["id"] = renamed[r["id"]]
    # an earlier calibration's records are replaced by design; a shipped id only without a suffix (--overlay)
    paths = spec.write_records(writes, force=True, overlay=not suffix)
    return [(kind, r["id"], path) for (kind, r), path in zip(writes, paths)]


def _hardware(hw: dict, terms: dict, tables: bool, record_bytes: int, when: str) -> dict | None:
    """The hardware record with the fitted copy bandwidth and without the loaded NVMe tables; None if unchanged."""
    changed = False
    if terms.get("copy_ms") and hw.get("gpu"):
        hw["gpu"]["h2d_gbps"] = round(copy_gbps(record_bytes, terms["copy_ms"]), 4)
        hw["gpu"]["note"] = (f"h2d_gbps: moetier calibrate {when}: one record pushed or drained by the runtime "
                             f"(copy + stage time over copies, VRAM fit arms)")
        changed = True
    if tables and hw["nvme"].pop("latency_by_rows_qd_ms", None) is not None:
        # the tables under load now live with the engines that produced the load
        hw["nvme"]["latency_note"] = "latency_by_qd_ms: moetier bench on an idle disk"
        changed = True
    return hw if changed else None


def _write_channel(eng: dict, terms: dict, table: dict, record_bytes: int, when: str) -> None:
    """The engine's NVMe latency table and the channel terms fitted with it; a term an earlier run left goes."""
    eng["nvme_latency_by_rows_qd_ms"] = table
    eng["nvme_latency_record_bytes"] = record_bytes
    for field in CHANNEL_FIELDS:
        eng.pop(field, None)          # a table from an earlier run must not outlive its own
        if terms.get(field, {}).get(eng["id"]):
            eng[field] = terms[field][eng["id"]]
    eng["nvme_latency_note"] = (f"moetier calibrate {when}: mean submit-to-landed of the runtime's demand "
                                f"reads by rows per step and demand queue depth, under this engine's load "
                                f"(fit arms, measured steps); deeper queues: the hardware's idle-disk "
                                f"figures. nvme_wake_ms_by_rows: mean delay from a read landing to the "
                                f"blocked waiter resuming; nvme_latency_cv_shared/own_by_rows: latency sd / "
                                f"mean, the part a layer's reads share and each read's own; "
                                f"lane_lateness_sd_ms_by_rows: sd of the host reaching its first wait "
                                f"beyond the plan's, from landing minus wait start")


def copy_gbps(record_bytes: int, copy_ms: float) -> float:
    """The link speed that moves one record in copy_ms."""
    return record_bytes / (copy_ms * 1e6)
