"""EXL3 checkpoints in: the safetensors header reader, `store pack --checkpoint` (GLM and Qwen layouts, MTP layers,
bounded memory), `model import` from EXL3 checkpoints and from other families' config.json, and the refusals."""
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("safetensors", reason="the synthetic checkpoint writer needs the safetensors package (test extra)")

from moetier.bytes import checkpoint, expert, model_import, store, synth_exl3 as S  # noqa: E402
from moetier.cli.main import main  # noqa: E402
from moetier.errors import UserError  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(capsys, *argv):
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def one_line_error(rc, err, *needles):
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert rc == 2 and len(lines) == 1 and lines[0].startswith("moetier: error:"), err
    for n in needles:
        assert n in lines[0], (n, lines[0])


@pytest.fixture(scope="module", params=["glm", "qwen"])
def ckpt(request, tmp_path_factory):
    spec = S.SynthSpec(layout=request.param, experts=4, codebook="mul1" if request.param == "glm" else "mcg")
    d = tmp_path_factory.mktemp(f"ck-{request.param}") / f"tiny-{request.param}"
    S.write_checkpoint(d, spec)
    return spec, d


def test_header_reader_agrees_with_safetensors(ckpt):
    from safetensors import safe_open
    _, d = ckpt
    for f in sorted(d.glob("*.safetensors")):
        mine = checkpoint.read_header(str(f))
        with safe_open(str(f), "numpy") as st, open(f, "rb") as fh:
            assert sorted(st.keys()) == sorted(mine)
            for name in st.keys():
                sl = st.get_slice(name)
                ti = mine[name]
                assert list(ti.shape) == list(sl.get_shape()) and ti.dtype == sl.get_dtype()
                fh.seek(ti.start)
                assert fh.read(ti.nbytes) == st.get_tensor(name).tobytes()


def test_pack_checkpoint_maps_ordinals_and_holds_every_expert(ckpt, tmp_path):
    spec, d = ckpt
    out = tmp_path / "store"
    m = store.pack_checkpoint(d, out)
    L, M, E = spec.moe_layers, spec.mtp_layers, spec.experts
    assert (m["layers"], m["extra_layers"], m["experts"], m["records"]) == (L, M, E, (L + M) * E)
    pre = m["source"]["moe_layers"]
    if spec.layout == "glm":   # a dense first layer, then MoE layers, then the MTP layer at num_hidden_layers
        assert pre == [f"model.language_model.layers.{n}.mlp" for n in (1, 2, 3)]
    else:
        assert pre == ["model.language_model.layers.0.mlp", "model.language_model.layers.1.mlp", "mtp.layers.0.mlp"]
    st = store.open_store(out)
    lay = st.layout
    assert (lay.encoding, lay.bits, lay.codebook) == ("exl3", spec.bits, spec.codebook)
    assert lay.act_limit == (spec.act_limit if spec.layout == "glm" else 0.0)
    assert lay.record_bytes % 4096 == 0
    data = np.fromfile(out / "experts.bin", dtype=np.uint8)
    for key in range(st.nrecords):
        rec = data[st.offset(key):st.offset(key) + st.record_bytes]
        got, want = expert.exl3_expert(lay, rec), S.expert(spec, *divmod(key, E))
        for p in ("gate", "up", "down"):
            for part in ("trellis", "suh", "svh"):
                assert np.array_equal(getattr(getattr(got, p), part), getattr(getattr(want, p), part)), (key, p, part)
        assert not rec[lay.weight_bytes:].any()
    assert store.verify(out)["bad"] == []


def test_cli_import_pack_verify(ckpt, tmp_path, capsys):
    spec, d = ckpt
    rec_path = tmp_path / "model.json"
    rc, out, _ = run(capsys, "model", "import", d, "--out", rec_path, "--id", "synth-model")
    assert rc == 0 and "exl3" in out
    rec = json.loads(rec_path.read_text())
    assert rec["moe"] == {**rec["moe"], "layers": spec.moe_layers, "experts": spec.experts, "topk": spec.topk,
                          "shared": spec.shared}
    g = rec["geometry"]
    assert (g["hidden"], g["intermediate"], g["mtp_layers"]) == (spec.hidden, spec.inter, spec.mtp_layers)
    lay = expert.layout(spec.hidden, spec.inter, "exl3", bits=spec.bits, codebook=spec.codebook,
                        act_limit=spec.act_limit if spec.layout == "glm" else 0.0)
    assert rec["store"]["layout"] == lay.to_json()
    assert rec["moe"]["expert_bytes"] == lay.weight_bytes == 3 * spec.hidden * spec.inter * spec.bits // 8 \
        + 2 * 3 * (spec.hidden + spec.inter)
    rc, out, _ = run(capsys, "store", "pack", "--checkpoint", d, "--out", tmp_path / "st")
    assert rc == 0 and "packed" in out
    rc, out, _ = run(capsys, "store", "verify", tmp_path / "st")
    assert rc == 0 and "0 bad" in out
    # the record just imported checks the store against the model
    assert store.open_store(tmp_path / "st", model=rec).layout.to_json() == rec["store"]["layout"]


def test_pack_streams_with_bounded_memory(tmp_path):
    """Peak RSS growth while packing a checkpoint of ~50 MB stays within a few records plus the write batch."""
    spec = S.SynthSpec(layout="glm", hidden=512, inter=256, experts=48, moe_layers=3, dense_layers=1, mtp_layers=1,
                       bits=6, shards=3)
    d = tmp_path / "ck"
    S.write_checkpoint(d, spec)
    size = sum(f.stat().st_size for f in d.glob("*.safetensors"))
    # RSS sampled every 2 ms on a thread while packing, against the RSS just before
    code = ("import sys, json, threading, time, psutil\n"
            "from moetier.bytes import store, checkpoint\n"
            "checkpoint.open_exl3(sys.argv[1]).close()\n"
            "p = psutil.Process(); before = p.memory_info().rss; peak = [before]; done = []\n"
            "def poll():\n"
            "    while not done:\n"
            "        peak[0] = max(peak[0], p.memory_info().rss); time.sleep(0.002)\n"
            "t = threading.Thread(target=poll); t.start()\n"
            "m = store.pack_checkpoint(sys.argv[1], sys.argv[2])\n"
            "done.append(1); t.join()\n"
            "print(json.dumps({'growth_kib': (peak[0] - before) // 1024, 'record_bytes': m['record_bytes']}))\n")
    env = {**os.environ, "PYTHONPATH": REPO}
    r = json.loads(subprocess.run([sys.executable, "-c", code, str(d), str(tmp_path / "st")], env=env, check=True,
                                  capture_output=True, text=True).stdout)
    growth = r["growth_kib"] * 1024
    bound = store.BATCH_BYTES + 4 * r["record_bytes"] + 4 * 2**20
    assert size > 4 * bound, (size, bound)           # the checkpoint could not have fit in the bound
    print(f"RSS growth {growth / 2**20:.1f} MiB packing {size / 2**20:.0f} MiB")
    assert growth < bound, f"RSS grew {growth / 2**20:.1f} MiB packing {size / 2**20:.0f} MiB (bound {bound / 2**20:.1f})"
    assert growth > 0 and store.verify(tmp_path / "st")["records"] == 4 * 48


# ---- model import from Hugging Face style configs ----------------------------------------------------------------
HF = {
    "mixtral": ({"architectures": ["MixtralForCausalLM"], "hidden_size": 4096, "intermediate_size": 14336,
                 "num_hidden_layers": 32, "num_local_experts": 8, "num_experts_per_tok": 2, "torch_dtype": "bfloat16"},
                dict(layers=32, experts=8, topk=2, shared=0, hidden=4096, inter=14336, dense=[], mtp=0, bits=16)),
    "qwen3moe": ({"architectures": ["Qwen3MoeForCausalLM"], "hidden_size": 2048, "intermediate_size": 6144,
                  "moe_intermediate_size": 768, "num_hidden_layers": 48, "num_experts": 128,
                  "num_experts_per_tok": 8, "decoder_sparse_step": 1, "mlp_only_layers": [0, 47],
                  "torch_dtype": "bfloat16"},
                 dict(layers=46, experts=128, topk=8, shared=0, hidden=2048, inter=768, dense=[0, 47], mtp=0, bits=16)),
    "qwen2moe": ({"architectures": ["Qwen2MoeForCausalLM"], "hidden_size": 2048, "intermediate_size": 5632,
                  "moe_intermediate_size": 1408, "shared_expert_intermediate_size": 5632, "num_hidden_layers": 24,
                  "num_experts": 60, "num_experts_per_tok": 4, "decoder_sparse_step": 1, "mlp_only_layers": [],
                  "quantization_config": {"quant_method": "gptq", "bits": 4}},
                 dict(layers=24, experts=60, topk=4, shared=1, hidden=2048, inter=1408, dense=[], mtp=0, bits=4)),
    "deepseek3": ({"architectures": ["DeepseekV3ForCausalLM"], "hidden_size": 7168, "intermediate_size": 18432,
                   "moe_intermediate_size": 2048, "num_hidden_layers": 61, "n_routed_experts": 256,
                   "n_shared_experts": 1, "num_experts_per_tok": 8, "first_k_dense_replace": 3, "moe_layer_freq": 1,
                   "num_nextn_predict_layers": 1, "routed_scaling_factor": 2.5,
                   "quantization_config": {"quant_method": "fp8", "fmt": "e4m3"}},
                  dict(layers=58, experts=256, topk=8, shared=1, hidden=7168, inter=2048, dense=[0, 1, 2], mtp=1,
                       bits=8)),
    "glm4moe": ({"architectures": ["Glm4MoeForCausalLM"], "hidden_size": 4096, "intermediate_size": 10944,
                 "moe_intermediate_size": 1408, "num_hidden_layers": 46, "n_routed_experts": 128,
                 "n_shared_experts": 1, "num_experts_per_tok": 8, "first_k_dense_replace": 1,
                 "num_nextn_predict_layers": 1, "torch_dtype": "bfloat16"},
                dict(layers=45, experts=128, topk=8, shared=1, hidden=4096, inter=1408, dense=[0], mtp=1, bits=16)),
    "olmoe": ({"architectures": ["OlmoeForCausalLM"], "hidden_size": 2048, "intermediate_size": 1024,
               "num_hidden_layers": 16, "num_experts": 64, "num_experts_per_tok": 8, "torch_dtype": "bfloat16"},
              dict(layers=16, experts=64, topk=8, shared=0, hidden=2048, inter=1024, dense=[], mtp=0, bits=16)),
}


@pytest.mark.parametrize("name", sorted(HF))
def test_import_hf_config_families(name, tmp_path):
    cfg, want = HF[name]
    d = tmp_path / name
    d.mkdir()
    (d / "config.json").write_text(json.dumps(cfg))
    rec = model_import.import_model(d)
    m, g = rec["moe"], rec["geometry"]
    assert (m["layers"], m["experts"], m["topk"], m["shared"]) == (want["layers"], want["experts"], want["topk"],
                                                                  want["shared"])
    assert (g["hidden"], g["intermediate"], g["dense_mlp_layers"], g["mtp_layers"], g["bits"]) == (
        want["hidden"], want["inter"], want["dense"], want["mtp"], want["bits"])
    H, I, b = want["hidden"], want["inter"], want["bits"]
    if b in (8, 4):     # a layout the int kernels compute: packable with synthetic experts
        lay = expert.layout(H, I, {8: "int8", 4: "int4g32"}[b])
        assert (m["expert_bytes"], rec["store"]["record_bytes"]) == (lay.weight_bytes, lay.record_bytes)
    else:
        assert m["expert_bytes"] == 3 * H * I * b // 8 and "encoding" not in rec["store"]
    from moetier.core import records as spec
    spec.validate("model", rec, "imported")


def test_import_bits_overrides_the_config(tmp_path):
    cfg, _ = HF["mixtral"]
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    rec = model_import.import_model(tmp_path / "config.json", bits=8, rid="mixtral-fp8")
    lay = expert.layout(4096, 14336, "int8")
    assert rec["id"] == "mixtral-fp8" and rec["moe"]["expert_bytes"] == lay.weight_bytes
    assert rec["store"]["encoding"] == "int8"


# ---- refusals: one line naming the tensor or field, exit 2 --------------------------------------------------------
def _rewrite(d, fname, fn):
    p = d / fname
    p.write_text(json.dumps(fn(json.loads(p.read_text()))))


def _drop_tensor(d, name):
    from safetensors.numpy import load_file, save_file
    for f in sorted(d.glob("*.safetensors")):
        t = load_file(str(f))
        if name in t:
            del t[name]
            save_file(t, str(f))
            return
    raise AssertionError(name)


def _retype_tensor(d, name, dtype):
    from safetensors.numpy import load_file, save_file
    for f in sorted(d.glob("*.safetensors")):
        t = load_file(str(f))
        if name in t:
            t[name] = t[name].astype(dtype)
            save_file(t, str(f))
            return
    raise AssertionError(name)


GLM_E = "model.language_model.layers.2.mlp.experts.1"


@pytest.mark.parametrize("breakit,needles,import_needles", [  # import_needles: model import's own line, if not needles
    (lambda d: _drop_tensor(d, f"{GLM_E}.up_proj.suh"), [f"{GLM_E}.up_proj.suh", "missing"], None),
    (lambda d: _retype_tensor(d, f"{GLM_E}.down_proj.trellis", np.int32), [f"{GLM_E}.down_proj.trellis", "I32"], None),
    (lambda d: _rewrite(d, "config.json", lambda c: {**c, "text_config": {**c["text_config"],
                                                                          "n_routed_experts": 16}}),
     ["experts.4.gate_proj.trellis", "missing"], None),
    (lambda d: _rewrite(d, "config.json", lambda c: {**c, "text_config": {**c["text_config"],
                                                                          "first_k_dense_replace": 2}}),
     ["layers.1.mlp", "dense layer"], None),
    (lambda d: _rewrite(d, "config.json", lambda c: {k: v for k, v in c.items() if k != "quantization_config"}),
     ["quantization_config.quant_method", "exl3"], ["config.json", "pass --bits"]),
    (lambda d: _rewrite(d, "config.json", lambda c: {**c, "text_config": {k: v for k, v in c["text_config"].items()
                                                                          if k != "hidden_size"}}),
     ["text_config.hidden_size"], None),
    (lambda d: (d / "model-00001-of-00002.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json"),
     ["model-00001-of-00002.safetensors", "header"], None),
])
def test_malformed_checkpoint_is_refused(tmp_path, capsys, breakit, needles, import_needles):
    d = tmp_path / "ck"
    S.write_checkpoint(d, S.SynthSpec(layout="glm", experts=4))
    breakit(d)
    rc, _, err = run(capsys, "store", "pack", "--checkpoint", d, "--out", tmp_path / "st")
    one_line_error(rc, err, *needles)
    assert not (tmp_path / "st").exists()
    if "header" not in needles:
        rc, _, err = run(capsys, "model", "import", d, "--out", tmp_path / "m.json")
        one_line_error(rc, err, *(import_needles or needles))
        assert not (tmp_path / "m.json").exists()


def test_mixed_bitrates_are_refused(tmp_path):
    d = tmp_path / "ck"
    S.write_checkpoint(d, S.SynthSpec(layout="qwen", experts=2, shards=1))
    from safetensors.numpy import load_file, save_file
    f = next(d.glob("*.safetensors"))
    t = load_file(str(f))
    name = "mtp.layers.0.mlp.experts.1.up_proj.trellis"
    t[name] = np.zeros((*t[name].shape[:2], 64), dtype=np.int16)
    save_file(t, str(f))
    with pytest.raises(UserError, match=r"mtp\.layers\.0\.mlp\.experts\.1\.up_proj\.trellis: shape|K=4 but"):
        checkpoint.open_exl3(d)


def test_import_refuses_non_moe_config(tmp_path, capsys):
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 4096, "num_hidden_layers": 32,
                                                      "intermediate_size": 11008, "torch_dtype": "bfloat16"}))
    rc, _, err = run(capsys, "model", "import", tmp_path, "--out", tmp_path / "m.json")
    one_line_error(rc, err, "config.json", "n_routed_experts")
    shutil.rmtree(tmp_path)


@pytest.mark.parametrize("H,I,weight,record", [(4096, 2048, 9_474_048, 9_474_048),    # GLM-5.3-Flash's record
                                                (2560, 640, 1_862_400, 1_863_680)])    # Qwen3.8-Flash-Next's blob
def test_exl3_layout_sizes_match_the_engines(H, I, weight, record):
    lay = expert.layout(H, I, "exl3", bits=3, codebook="mul1", act_limit=10.0)
    assert (lay.weight_bytes, lay.record_bytes) == (weight, record)
    # the trellises first: the record's head is one VRAM slot image (gate@0, up, down), then the scales
    t = 3 * H * I * 3 // 8 // 3
    assert [lay.sections[s][0] for s in ("gate_trellis", "up_trellis", "down_trellis", "gate_suh")] == \
        [0, t, 2 * t, 3 * t]
    assert expert.ExpertLayout.from_json(lay.to_json()) == lay
    bad = {**lay.to_json(), "codebook": "mul2"}
    with pytest.raises(ValueError, match="codebook"):
        expert.ExpertLayout.from_json(bad)
    with pytest.raises(ValueError, match="multiple of 128"):
        expert.layout(96, 128, "exl3", bits=3, codebook="mul1")


def test_exl3_make_expert_reference_is_the_codec(tmp_path):
    from moetier.bytes import exl3
    lay = expert.layout(256, 128, "exl3", bits=4, codebook="3inst", act_limit=10.0)
    buf = expert.make_expert(lay, 7, 1)
    assert buf == expert.make_expert(lay, 7, 1) and buf != expert.make_expert(lay, 8, 1)
    x = np.random.default_rng(0).standard_normal((3, 256))
    ex = expert.exl3_expert(lay, buf)
    assert np.array_equal(expert.reference(lay, buf, x), exl3.expert_forward(x, ex, 10.0))
    d = expert.dequant(lay, buf)   # the dense weights give the same output, up to float64 rounding
    g, u = x @ d["gate"].T, x @ d["up"].T
    y = exl3.swiglu(g, u, 10.0) @ d["down"].T
    assert np.allclose(y, expert.reference(lay, buf, x), rtol=1e-9, atol=1e-9)
