"""Check moetier's EXL3 codec against exllamav3 1.6.5's own torch code, and write the golden vectors the main suite
replays without torch (tests/test_exl3_codec.py).

Runs where torch (CPU is enough) and exllamav3 1.6.5 (installed with --no-deps, no compiled extension) are
installed: adapters.exllamav3.standin stands in for the CUDA extension so exllamav3's Python layer imports, and only
its torch-only functions are called (.ci/torch-extra.sh sets this up):

    python tests/oracle/exl3_golden.py            # write tests/data/exl3_golden.npz from the oracle
    python tests/oracle/exl3_golden.py --check    # compare the codec with the oracle; exit 1 on a mismatch

What is compared, and how exactly:

* mul1 table, all 65,536 states: ``ngram_codec.mul1_codebook`` (documented bit-exact with CUDA decode_3inst<2>),
  bit-exact.
* mcg and 3inst tables, all states: exllamav3 1.6.5 has no torch function for them, so this script transcribes
  ``exllamav3_ext/quant/codebook.cuh`` (decode_3inst<0>, <1>) into torch; bit-exact.
* tensor-core placement: ``quantize.tensor_core_perm`` and ``tensor_core_perm_i``, exact.
* Hadamard: ``util.hadamard.get_hadamard(128)`` (the matrix the preapply helpers use), exact; ``hadamard_rotate`` on
  float64 input, bit-exact (same butterfly order); ``preapply_had_l``/``preapply_had_r`` (fp32 matmul, fp16 out):
  bit-exact on inputs whose columns (rows) have one power-of-two entry, where no summation order can round; on a
  random fp16 matrix within one fp16 ulp plus 2**-20 of the summed magnitudes (fp32 BLAS sums round
  differently from the codec's float64).
* weight reconstruction order and scaling: ``LinearEXL3.get_weight_tensor`` driven with the codec's decoded
  W_inner (the CUDA ``ext.reconstruct`` cannot run here; on a GPU the trellis decode itself is checked against it),
  against ``moetier.bytes.exl3.reconstruct`` within rel RMS 1e-3 (upstream rounds to fp16 four times).
"""

from __future__ import annotations

import argparse
import hashlib
import io
import sys
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from moetier.atomic import atomic_write  # noqa: E402
from moetier.bytes import exl3  # noqa: E402

GOLDEN = ROOT / "tests" / "data" / "exl3_golden.npz"
SEED = 20261203
SAMPLES = 512
RECON_REL_RMS = 1e-3


def digest(a: np.ndarray) -> str:
    """sha256 of an array's bytes (C order), to pin a full table without storing it."""
    return hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()


def fp16_bits(a) -> np.ndarray:
    return np.ascontiguousarray(np.asarray(a, dtype=np.float16)).view(np.uint16)


def _import_oracle():
    from adapters.exllamav3 import standin
    standin.install()
    import torch
    import exllamav3
    from exllamav3.modules.quant.exl3 import LinearEXL3
    from exllamav3.modules.quant.exl3_lib import ngram_codec, quantize
    from exllamav3.util.hadamard import get_hadamard
    version = getattr(exllamav3, "__version__", None)
    if version is None:
        from exllamav3.version import __version__ as version
    return SimpleNamespace(torch=torch, version=version, LinearEXL3=LinearEXL3, ngram_codec=ngram_codec,
                           quantize=quantize, get_hadamard=get_hadamard)


def _torch_lop3_codebook(torch, mult: int, add: int) -> "torch.Tensor":
    """decode_3inst<0>/<1> of codebook.cuh in torch: x = s * mult + add (mod 2**32); x = (x & 0x8FFF8FFF) ^
    0x3B603B60; __hadd of the low and high halves as fp16."""
    s = torch.arange(65536, dtype=torch.int64)
    x = (s * mult + add) & 0xFFFFFFFF
    x = (x & 0x8FFF8FFF) ^ 0x3B603B60

    def half(bits):
        return torch.where(bits >= 32768, bits - 65536, bits).to(torch.int16).view(torch.float16)

    return half(x & 0xFFFF) + half(x >> 16)


def oracle_vectors(o) -> dict[str, np.ndarray]:
    """Everything the oracle says, on fixed seeded inputs, as numpy arrays."""
    torch = o.torch
    rng = np.random.default_rng(SEED)
    out: dict[str, np.ndarray] = {"exllamav3_version": np.array(str(o.version))}

    tables = {
        "mul1": o.ngram_codec.mul1_codebook("cpu"),
        "mcg": _torch_lop3_codebook(torch, exl3.MCG_MULT, 0),
        "3inst": _torch_lop3_codebook(torch, exl3.INST3_MULT, exl3.INST3_ADD),
    }
    assert o.quantize.codebook_mul1_mult == exl3.MUL1_MULT and o.quantize.codebook_mcg_mult == exl3.MCG_MULT
    idx = np.unique(np.concatenate([[0, 1, 0x7FFF, 0x8000, 0xFFFF], rng.integers(0, 65536, SAMPLES)]))
    for name, t in tables.items():
        bits = t.view(torch.int16).numpy().view(np.uint16)
        out[f"cb_{name}_sha256"] = np.array(digest(bits))
        out[f"cb_{name}_idx"] = idx.astype(np.int32)
        out[f"cb_{name}_bits"] = bits[idx]

    out["perm"] = o.quantize.tensor_core_perm("cpu").numpy().astype(np.int16)
    out["perm_i"] = o.quantize.tensor_core_perm_i("cpu").numpy().astype(np.int16)

    h = o.get_hadamard(128).float().numpy().astype(np.int8)
    out["had_sha256"] = np.array(digest(h))

    x = rng.standard_normal((4, 256))
    out["rot_x"] = x   # hadamard_rotate transforms the whole last axis: feed it 128-wide blocks
    out["rot_y"] = o.ngram_codec.hadamard_rotate(torch.from_numpy(x.reshape(-1, 128).copy())).numpy().reshape(x.shape)

    a = rng.standard_normal((128, 128)).astype(np.float16)
    out["pre_x"] = a
    out["pre_l"] = o.quantize.preapply_had_l(torch.from_numpy(a.copy()), 128).numpy()
    out["pre_r"] = o.quantize.preapply_had_r(torch.from_numpy(a.copy()), 128).numpy()
    # one power-of-two entry per column (for the left transform) and per row (right): exact in any order
    col_hot = np.zeros((128, 128), np.float16)
    col_hot[rng.integers(0, 128, 128), np.arange(128)] = np.exp2(rng.integers(-4, 4, 128)) * rng.choice([-1, 1], 128)
    out["hot_x"] = col_hot
    out["hot_l"] = o.quantize.preapply_had_l(torch.from_numpy(col_hot.copy()), 128).numpy()
    out["hot_r"] = o.quantize.preapply_had_r(torch.from_numpy(col_hot.T.copy()), 128).numpy()

    lin = exl3.random_linear(rng, 128, 128, K=3, codebook="mul1")
    inner = torch.from_numpy(exl3.decode_inner(lin.trellis, lin.codebook).copy())
    stub = SimpleNamespace(su=None, sv=None, suh=torch.from_numpy(lin.suh.copy()),
                           svh=torch.from_numpy(lin.svh.copy()), get_inner_weight_tensor=lambda: inner)
    out["w_trellis"] = lin.trellis
    out["w_suh"] = lin.suh
    out["w_svh"] = lin.svh
    out["w_full"] = o.LinearEXL3.get_weight_tensor(stub).numpy()
    return out


def compare(ref: dict[str, np.ndarray]) -> list[str]:
    """The codec against oracle vectors (live or golden); one line per failed comparison. Shared with the main
    suite's tests/test_exl3_codec.py, which passes the committed golden vectors."""
    bad = []

    def need(ok, what):
        if not ok:
            bad.append(what)

    for name in exl3.CODEBOOKS:
        lut = fp16_bits(exl3.codebook_lut(name))
        need(digest(lut) == str(ref[f"cb_{name}_sha256"]), f"codebook {name}: full 65,536-entry table differs")
        idx = ref[f"cb_{name}_idx"]
        diff = np.flatnonzero(lut[idx] != ref[f"cb_{name}_bits"])
        need(diff.size == 0, f"codebook {name}: {diff.size} sampled states differ, first state "
                             f"{idx[diff[0]] if diff.size else None}")
    need(np.array_equal(exl3.TC_PERM, ref["perm"]), "tensor_core_perm differs")
    need(np.array_equal(exl3.TC_PERM_INV, ref["perm_i"]), "tensor_core_perm_i differs")
    need(digest(exl3.hadamard_signs(128)) == str(ref["had_sha256"]), "get_hadamard(128) differs")
    need(np.array_equal(exl3.had(ref["rot_x"]), ref["rot_y"]), "hadamard_rotate (float64) not bit-exact")

    hot = ref["hot_x"].astype(np.float64)
    need(np.array_equal(fp16_bits(exl3.had(hot.T).T), fp16_bits(ref["hot_l"])), "preapply_had_l one-hot not exact")
    need(np.array_equal(fp16_bits(exl3.had(hot.T)), fp16_bits(ref["hot_r"])), "preapply_had_r one-hot not exact")
    a = ref["pre_x"].astype(np.float64)
    for what, mine, theirs in (("preapply_had_l", exl3.had(a.T).T, ref["pre_l"]),
                               ("preapply_had_r", exl3.had(a), ref["pre_r"])):
        # fp16 output rounding, plus fp32 summation error relative to the terms summed (cancellation can leave a
        # result far smaller than its terms)
        allowed = exl3.fp16_ulp(mine) + 2.0**-20 * (np.abs(a) * exl3.HAD_SCALE).sum(axis=0 if what.endswith("l") else 1,
                                                                                    keepdims=True)
        err = np.abs(mine - theirs.astype(np.float64)) / allowed
        need(err.max() <= 1.0, f"{what}: {err.max():.2f} x the allowed distance from the exact rotation")

    lin = exl3.Exl3Linear(ref["w_trellis"], ref["w_suh"], ref["w_svh"], "mul1")
    w = exl3.reconstruct(lin)
    rel = float(np.sqrt(np.mean((w - ref["w_full"].astype(np.float64)) ** 2) / np.mean(w ** 2)))
    need(rel <= RECON_REL_RMS, f"reconstruct vs get_weight_tensor: rel RMS {rel:.2e} (allowed {RECON_REL_RMS})")
    return bad


def _npz_bytes(vectors: dict[str, np.ndarray]) -> bytes:
    buf = io.BytesIO()
    np.savez_compressed(buf, **vectors)
    return buf.getvalue()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true",
                    help="compare the codec with the live oracle (and the committed golden file) instead of writing")
    ap.add_argument("--out", type=Path, default=GOLDEN, help="golden file to write (default %(default)s)")
    args = ap.parse_args(argv)
    o = _import_oracle()
    vectors = oracle_vectors(o)
    if not args.check:
        data = _npz_bytes(vectors)
        atomic_write(args.out, lambda f: f.write(data))
        print(f"wrote {args.out} ({len(data)} bytes) from exllamav3 {o.version}")
        return 0
    bad = [f"live oracle: {b}" for b in compare(vectors)]
    if GOLDEN.exists():
        with np.load(GOLDEN) as g:
            golden = {k: g[k] for k in g.files}
        stale = sorted(k for k in vectors if k not in golden or not np.array_equal(golden[k], vectors[k]))
        if stale:
            bad.append(f"{GOLDEN.relative_to(ROOT)} is stale (differs in {', '.join(stale)}): rerun without --check")
    else:
        bad.append(f"{GOLDEN.relative_to(ROOT)} is missing: run without --check to write it")
    for b in bad:
        print("MISMATCH", b)
    if bad:
        return 1
    print(f"exl3 codec matches exllamav3 {o.version}: codebooks (3 x 65,536), tensor_core_perm(_i), get_hadamard(128), "
          "hadamard_rotate, preapply_had_l/r (one-hot exact, random within fp16 + fp32 rounding), get_weight_tensor "
          f"(rel RMS <= {RECON_REL_RMS})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
