"""EXL3 end to end on the CPU backend: a synthetic GLM-layout and a Qwen-layout checkpoint go through `model import`
-> `store pack --checkpoint` -> `store verify` -> `moetier run`; the runtime computes the experts through the backend
contract, its layer outputs are within rel RMS 2e-3 of the float64 reference, and bit-identical across tier splits."""
import json
import shutil

import numpy as np
import pytest

pytest.importorskip("numba", reason="the cpu backend needs numba (the cpu extra)")
pytest.importorskip("safetensors", reason="the synthetic checkpoint writer needs the safetensors package (test extra)")

from moetier.bytes import exl3, store, synth_exl3 as S  # noqa: E402
from moetier.cli.main import main  # noqa: E402
from moetier.core import records as spec  # noqa: E402
from moetier.run import runtime  # noqa: E402
from moetier.traces.format import load_trace  # noqa: E402

SPECS = {"glm": S.SynthSpec(layout="glm", hidden=256, inter=128, experts=8, topk=2, moe_layers=2, dense_layers=1,
                            mtp_layers=1, bits=3, codebook="mul1", act_limit=10.0, seed=3),
         "qwen": S.SynthSpec(layout="qwen", hidden=256, inter=128, experts=8, topk=2, moe_layers=2, mtp_layers=1,
                             bits=4, codebook="mcg", seed=4)}


def cli(capsys, *argv):
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    assert rc == 0, err
    return out


@pytest.fixture(params=sorted(SPECS))
def packed(request, tmp_path, monkeypatch, capsys):
    """A registry with the imported model and a cpu recipe for it, the packed store and a trace."""
    root = tmp_path / "registry"
    shutil.copytree(spec.REGISTRY, root, ignore=shutil.ignore_patterns("runs"))
    (root / "runs").mkdir()
    monkeypatch.setattr(spec, "REGISTRY", root)
    sp = SPECS[request.param]
    ck = tmp_path / f"synth-{request.param}"
    S.write_checkpoint(ck, sp)
    mid = f"synth-{request.param}-exl3"
    cli(capsys, "model", "import", ck, "--id", mid)
    st = tmp_path / "store"
    cli(capsys, "store", "pack", mid, "--checkpoint", ck, "--out", st)
    assert "0 bad" in cli(capsys, "store", "verify", st, "--model", mid)
    tr = tmp_path / "trace.npz"
    cli(capsys, "trace", "gen", "--model", mid, "--out", tr, "--tokens", "120", "--segments", "2")
    rec = json.loads((root / "recipe" / "tiny-ci-cpu.json").read_text())
    rec.update(id=f"{mid}-cpu", model=mid, trace=str(tr))
    rec["budget"].update(ram_gb=1.0, vram_expert_slots=0, note="every expert in RAM")
    rec["policy"]["warmup_tokens"] = 16
    spec.write_record("recipe", rec)
    return sp, rec["id"], st, tr


def _reference(sp, xin, rows_keys, rows_w):
    """Float64 MoE layer output from the synthetic checkpoint's own experts (not the packed bytes)."""
    out = np.zeros(xin.shape, np.float64)
    for r, (ks, ws) in enumerate(zip(rows_keys, rows_w)):
        for k, w in zip(ks, ws):
            ex = S.expert(sp, *divmod(int(k), sp.experts))
            out[r] += w * exl3.expert_forward(xin[r:r + 1].astype(np.float64), ex, sp.act_limit or None)[0]
    return out


def _run(rid, st_path, tr_path, conc, overrides=()):
    R = spec.resolve(rid, list(overrides))
    st = store.open_store(st_path, model=R.model)
    tr = load_trace(tr_path, layers=R.layers, experts=R.experts, topk=R.topk, model_id=R.model_id)
    layers = []
    be = runtime.make_backend("cpu", st, R, conc)
    try:
        res = runtime.run(R, st, be, tr, conc, max_steps=6, keep_outputs=True,
                          layer_hook=lambda s, l, xin, y, rk, rw, rt: layers.append((xin.copy(), y.copy(), rk, rw)))
    finally:
        be.close()
    return R, res, layers


def test_exl3_checkpoint_runs_on_the_cpu_backend(packed, capsys):
    sp, rid, st, tr = packed
    out = json.loads(cli(capsys, "run", rid, "--store", st, "--steps", "6", "--conc", "1", "2", "--no-record",
                         "--json"))
    for row in out["table"]:
        assert row["measured_tok_s"] > 0 and row["checksum_failures"] == 0
    # layer outputs against float64, over every layer of every measured step, both concurrencies
    errs = []
    for conc in (1, 2):
        _, res, layers = _run(rid, st, tr, conc)
        for xin, y, rk, rw in layers:
            ref = _reference(sp, xin, rk, rw)
            errs.append(np.sqrt(np.mean((y - ref) ** 2) / np.mean(ref ** 2)))
    print(f"{sp.layout}: layer output rel RMS vs float64, max {max(errs):.2e} over {len(errs)} layer calls")
    assert max(errs) < 2e-3, max(errs)
    assert min(errs) > 0        # the kernel rounds to fp16 where the engine does; a float64 copy would be exact


def test_exl3_outputs_are_bit_identical_across_tier_splits(packed):
    sp, rid, st, tr = packed
    R_all, all_ram, _ = _run(rid, st, tr, 2)
    keys = R_all.keys
    digests = {}
    for ram_records in (keys, keys // 2, 5):     # every expert in RAM, half, five (the rest read from NVMe)
        gb = ram_records * R_all.ram_expert_bytes / 1e9
        R, res, _ = _run(rid, st, tr, 2, [f"budget.ram_gb={gb!r}"])
        assert R.ram_slots == ram_records
        if ram_records < keys:
            assert res["reads_per_token"] > 0
        digests[ram_records] = res["digests"]
        assert all(np.array_equal(a, b) for a, b in zip(res["outputs"], all_ram["outputs"]))
    assert len({tuple(d) for d in digests.values()}) == 1
