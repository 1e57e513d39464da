"""The exllamav3 adapter on a CUDA GPU with the engine's real kernels: the checks a CPU cannot make.

    python benchmarks/device/exllamav3_checks.py --out RECORD.json [--steps N] [--checkpoint DIR --recipe ID
                                             [--compare-plain]]

Run by benchmarks/device/check.sh (step stage2) after it has installed exllamav3 from the carried wheel; the first
import builds the engine's extension (timed: check ``build``). On the tiny synthetic model
(adapters.exllamav3.checkpoint.TINY: 2 MoE layers x 16 experts, top-2, hidden 256, intermediate 128, K 3, shared expert;
its experts packed with moetier.bytes.store.pack_checkpoint), each check prints PASS or FAIL with its figure, and the
script exits 1 if any failed:

1. surface   - the hook surface against the installed engine (compiled extension, not the stand-in);
2. decode    - ext.reconstruct (the engine's W_inner) bit-identical to moetier.bytes.exl3.decode_inner;
3. cpu lane  - moetier's EXL3 CPU lane (expert_forward, fp16 points) against the expert computed in float64 from
               the engine's reconstructed weights: rel RMS < 2e-3;
4. gpu/zc    - the attached block with every pick on the gpu lane (all resident, exact) and on the zerocopy lane
               (RAM only, exact): outputs bit-identical (same kernel, same bytes, rows at VRAM vs pinned host);
5. split     - the attached block under an NVMe tail against the engine's own (unattached) output: rel RMS < 2e-3;
6. speed     - decode tok/s of the MoE blocks without moetier and with it (nvme-tail), and the simulator's
               prediction for the attached run's deals beside it (reported, not judged);
7. hand-over - attach frees the engine's own routed expert tensors on the device (>= 90 % of their bytes);
8. load      - the tiny model loaded by moetier_load (the engine's own BlockSparseMLP.load on CUDA, its routed experts
               redirected to moetier's slots): no routed expert tensor reaches the checkpoint reader, and in exact
               mode with every expert resident its output is bit-identical to the engine's own load.

With ``--checkpoint`` a real EXL3 checkpoint's routed experts are packed into a moetier store next to ``--out`` and
the model is loaded through exllamav3's own Config/Model by moetier_load under ``--recipe``: none of its routed experts
is read from the checkpoint (counted), so a model larger than VRAM plus RAM loads; the load's peak host RSS growth
and device memory are reported beside the routed experts' size, then decode tok/s with moetier and the simulator's
prediction. With ``--compare-plain`` (only for a checkpoint that fits the GPU) the model is then loaded again by the
engine alone and the attached outputs are compared with it (rel RMS < 2e-3). Untried: no GPU with such a checkpoint
has been available to the project. The record (every figure, the engine version, the device) is written to ``--out``
as JSON.
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

RESULTS: list = []


def report(name: str, ok: bool | None, figure: str, **data) -> None:
    tag = "PASS" if ok else ("INFO" if ok is None else "FAIL")
    print(f"{tag:4s} {name}: {figure}", flush=True)
    RESULTS.append({"check": name, "ok": ok, "figure": figure, **data})


def rel_rms(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.sqrt(np.mean((a - b) ** 2) / np.mean(b ** 2)))


def tiny_recipe(vram: int, ram: int, **policy):
    from moetier.core.records import resolve
    R = resolve("tiny-ci-cuda")
    return dataclasses.replace(R, layers=2, experts=16, topk=2, vram_slots=vram, ram_slots=ram,
                               policy={**R.policy, **policy, "prefetch": {"depth": 0, "predictor": "none"}})


def decode_checks(model, ext, torch) -> None:
    from moetier.bytes import exl3
    worst_bits, worst_rms = 0, 0.0
    for m in model.modules:
        for e in (0, len(m.ups) - 1):
            for lin in (m.gates[e], m.ups[e], m.downs[e]):
                inner = lin.inner
                w = torch.empty((inner.in_features, inner.out_features), dtype=torch.half, device=inner.trellis.device)
                ext.reconstruct(w, inner.trellis, inner.K, inner.mcg, inner.mul1)
                ours = exl3.decode_inner(inner.trellis.cpu().numpy(), "mul1")
                worst_bits += int(np.count_nonzero(w.cpu().numpy().view(np.uint16) != ours.view(np.uint16)))
            x = np.random.default_rng(e).standard_normal((2, m.hidden_size)).astype(np.float16)
            ex = exl3.Exl3Expert(*(exl3.Exl3Linear(ls[e].inner.trellis.cpu().numpy(), ls[e].inner.suh.cpu().numpy(),
                                                   ls[e].inner.svh.cpu().numpy()) for ls in (m.gates, m.ups, m.downs)))
            cpu_lane = exl3.expert_forward(x, ex, float(m.act_limit), fp16=True)
            # float64 from the engine's own reconstructed dense weights (get_weight_tensor: W = suh H W_inner H svh)
            W = [ls[e].inner.get_weight_tensor().double().cpu().numpy() for ls in (m.gates, m.ups, m.downs)]
            xd = x.astype(np.float64)
            a = exl3.swiglu(xd @ W[0], xd @ W[1], float(m.act_limit))
            worst_rms = max(worst_rms, rel_rms(cpu_lane, a @ W[2]))
    report("decode", worst_bits == 0, f"{worst_bits} weights differ between ext.reconstruct and the numpy decode")
    report("cpu lane", worst_rms < 2e-3, f"rel RMS {worst_rms:.2e} against the engine's reconstructed weights")


def forward_all(modules, xs):
    return [[m.forward(x[o], {}).float().cpu().clone() for o, m in enumerate(modules)] for x in xs]


def timed(modules, xs, torch) -> float:
    torch.cuda.synchronize()
    t = time.perf_counter()
    for x in xs:
        for o, m in enumerate(modules):
            m.forward(x[o], {})
    torch.cuda.synchronize()
    return len(xs) / (time.perf_counter() - t)


def simulated_tok_s(att) -> float:
    """The simulator's replay of the attached run's picks on the same recipe: modeled tok/s of the MoE part."""
    from moetier.core.sim import Replay
    R = att.R
    rp = Replay(R, rows=1)
    rp.ledger.seed(range(R.keys))
    t, last, steps = 0.0, None, set()
    for step, o, picks, _ in att.deals:
        if step != last:
            rp.begin_step(step)
            last = step
        steps.add(step)
        plan = rp.layer(o, dict(picks), t, None, None)
        t += plan.ms + sum(rp.settle())
    return len(steps) / (t / 1000.0) if t else 0.0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", help="run record (JSON) to write")
    ap.add_argument("--arch-list", action="store_true",
                    help="print TORCH_CUDA_ARCH_LIST for this machine's GPU (e.g. 9.0) and exit; exit 2 without one")
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--checkpoint", help="a real EXL3 MoE checkpoint directory (optional)")
    ap.add_argument("--recipe", help="the recipe for --checkpoint")
    ap.add_argument("--compare-plain", action="store_true",
                    help="also load --checkpoint by the engine alone and compare (only if it fits the GPU)")
    args = ap.parse_args(argv)
    if args.arch_list:
        return print_arch_list()
    if not args.out:
        ap.error("--out is required (unless --arch-list)")
    import torch
    if not torch.cuda.is_available():
        print("exllamav3_checks: no CUDA device", file=sys.stderr)
        return 2
    t = time.perf_counter()
    import exllamav3.ext  # noqa: F401  (the first import builds the extension: 169 .cu + 25 .cpp sources)
    build_s = time.perf_counter() - t
    report("build", True, f"exllamav3's extension built and imported in {build_s:.0f} s "
           f"(MAX_JOBS={os.environ.get('MAX_JOBS')}, TORCH_CUDA_ARCH_LIST={os.environ.get('TORCH_CUDA_ARCH_LIST')})",
           build_s=build_s)
    from adapters.exllamav3 import checkpoint, standin, surface
    from adapters.exllamav3.attach import attach
    from moetier.bytes import store
    rep = surface.check()
    report("surface", rep.ok and not rep.standin, rep.mismatches[0] if rep.mismatches else
           f"{len(rep.expected)} hooks match exllamav3 {rep.version} (compiled extension)")
    if not rep.ok or standin.installed():
        return finish(args)
    from exllamav3.ext import exllamav3_ext as ext
    work = Path(tempfile.mkdtemp(prefix="exllamav3-gpu-check-"))
    spec = checkpoint.TINY
    checkpoint.write_tiny(work / "ckpt", seed=3)
    store.pack_checkpoint(work / "ckpt", work / "store")
    recs = store.open_store(work / "store")
    model = checkpoint.build_model(work / "ckpt", device="cuda")
    decode_checks(model, ext, torch)
    g = torch.Generator(device="cuda").manual_seed(11)
    xs = [[torch.randn((1, spec.hidden), generator=g, device="cuda").half() for _ in range(spec.moe_layers)]
          for _ in range(args.steps)]
    base = forward_all(model.modules, xs)
    tok_plain = timed(model.modules, xs, torch)
    outs = {}
    for lane, (vram, ram) in (("gpu", (32, 0)), ("zerocopy", (0, 32))):
        att = attach(model, tiny_recipe(vram, ram), recs, exact=True)
        outs[lane] = forward_all(model.modules, xs)
        att.detach()
    same = all(torch.equal(a, b) for sa, sb in zip(outs["gpu"], outs["zerocopy"]) for a, b in zip(sa, sb))
    report("gpu/zc", same, "bit-identical" if same else "outputs differ between the gpu and zerocopy lanes")
    handover_check(work, recs, torch)
    att = attach(model, tiny_recipe(8, 12), recs, record=True)
    got = forward_all(model.modules, xs)
    worst = max(rel_rms(a.numpy(), b.numpy()) for sa, sb in zip(got, base) for a, b in zip(sa, sb))
    report("split", worst < 2e-3, f"nvme-tail vs the engine alone: rel RMS {worst:.2e}")
    att.deals.clear()
    tok_moetier = timed(model.modules, xs, torch)
    tok_sim = simulated_tok_s(att)
    report("speed", None, f"MoE blocks at bsz 1: {tok_plain:.1f} tok/s alone, {tok_moetier:.1f} tok/s with moetier "
           f"(nvme-tail), simulator {tok_sim:.1f} tok/s", tok_s_engine=tok_plain, tok_s_moetier=tok_moetier,
           tok_s_simulated=tok_sim)
    att.detach()
    redirected_load(work, recs, base, xs, torch)
    if args.checkpoint:
        real_checkpoint(args, torch)
    return finish(args)


def handover_check(work, recs, torch) -> None:
    """attach's hand-over frees the engine's own expert tensors on the device (the C++ bound classes rebuilt over
    moetier's views): device memory after attach, less moetier's arena and bounce record, against before, on a
    freshly loaded copy of the tiny model (its experts still the engine's own)."""
    import gc
    from adapters.exllamav3 import checkpoint
    from adapters.exllamav3.attach import attach
    model = checkpoint.build_model(work / "ckpt", device="cuda")
    routed = sum(getattr(lins[e].inner, part).numel() * getattr(lins[e].inner, part).element_size()
                 for m in model.modules for lins in (m.gates, m.ups, m.downs) for e in range(len(m.ups))
                 for part in ("trellis", "suh", "svh"))
    gc.collect()
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    att = attach(model, tiny_recipe(8, 12), recs)
    gc.collect()
    torch.cuda.synchronize()
    mine = att.backend.arena.numel() + att.bounce.numel()
    freed = before + mine - torch.cuda.memory_allocated()
    report("hand-over", freed >= 0.9 * routed, f"{freed:,} B of the engine's {routed:,} B of routed expert tensors "
           f"freed on the device (moetier's arena and bounce record, {mine:,} B, counted out)",
           freed_bytes=freed, routed_bytes=routed)
    att.detach()
    del att, model
    gc.collect()


def print_arch_list() -> int:
    """TORCH_CUDA_ARCH_LIST for the GPU here: its compute capability as torch reports it ("9.0" on an H100/H200)."""
    try:
        import torch
        if not torch.cuda.is_available():
            raise RuntimeError("torch sees no CUDA device")
        major, minor = torch.cuda.get_device_capability(0)
    except Exception as e:
        print(f"exllamav3_checks: no arch list: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    print(f"{major}.{minor}")
    return 0


class RoutedReads:
    """Counts the routed-expert tensors that reach exllamav3's checkpoint reader (SafetensorsCollection.get_tensor,
    the class method: moetier_load's redirect answers them per instance, before they get there) while open."""

    def __init__(self, is_routed):
        self.is_routed, self.keys, self.bytes = is_routed, 0, 0

    def __enter__(self):
        from exllamav3.loader.safetensors import SafetensorsCollection as S
        self.cls, self.get0 = S, S.get_tensor
        counter = self

        @functools.wraps(self.get0)        # the engine's signature: moetier_load checks the hook surface
        def get_tensor(stc, key, *a, **kw):
            t = counter.get0(stc, key, *a, **kw)
            if counter.is_routed(key) and t is not None:
                counter.keys += 1
                counter.bytes += t.numel() * t.element_size()
            return t
        S.get_tensor = get_tensor
        return self

    def __exit__(self, *exc):
        self.cls.get_tensor = self.get0
        return False


def _routed_keys(blocks) -> set:
    return {f"{k}.{part}" for m in blocks for lins in (m.gates, m.ups, m.downs) for lin in lins
            for k in [lin.key] for part in ("trellis", "suh", "svh")}


def redirected_load(work, recs, base, xs, torch) -> None:
    """Check 7: the tiny model loaded by moetier_load on CUDA."""
    from adapters.exllamav3 import checkpoint
    from adapters.exllamav3.attach import moetier_load
    model = checkpoint.build_model(work / "ckpt", load=False)
    routed = _routed_keys(model.modules)
    with RoutedReads(routed.__contains__) as rr:
        att = moetier_load(model, tiny_recipe(32, 0), recs, lambda: model.load("cuda"), exact=True)
    got = forward_all(model.modules, xs)
    same = all(torch.equal(a, b) for sa, sb in zip(got, base) for a, b in zip(sa, sb))
    worst = max(rel_rms(a.numpy(), b.numpy()) for sa, sb in zip(got, base) for a, b in zip(sa, sb))
    report("load", rr.keys == 0 and worst < 2e-3 and att.handed_over == len(routed) // 9,
           f"{rr.keys} routed tensors read from the checkpoint, {att.redirected} redirected; exact all-resident "
           f"output {'bit-identical to' if same else f'rel RMS {worst:.2e} from'} the engine's own load",
           routed_reads=rr.keys, redirected=att.redirected, bit_identical=same)
    att.detach()


def _peak_rss() -> int:
    with open("/proc/self/status") as f:
        return next(int(ln.split()[1]) << 10 for ln in f if ln.startswith("VmHWM:"))


def _reset_peak_rss() -> int:
    """Reset the peak RSS (Linux clear_refs 5); returns the RSS now."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    return _peak_rss()


def real_checkpoint(args, torch) -> None:
    """A real checkpoint loaded by moetier_load (exllamav3's Config/Model; experts packed beside --out), then decode;
    with --compare-plain the engine's own load of the same checkpoint as the reference."""
    from exllamav3 import Config, Model

    from adapters.exllamav3.attach import moe_blocks, moetier_load
    from adapters.exllamav3.redirect import ordered
    from moetier.bytes import store
    from moetier.core.records import resolve
    where = Path(args.out).with_suffix(".store")
    store.pack_checkpoint(args.checkpoint, where)
    recs = store.open_store(where)
    R = resolve(args.recipe)
    R = dataclasses.replace(R, policy={**R.policy, "prefetch": {"depth": 0, "predictor": "none"}})
    config = Config.from_directory(args.checkpoint)
    model = Model.from_config(config)
    blocks = ordered(moe_blocks(model), recs)     # the trunk's blocks: the ones moetier_load redirects
    routed = _routed_keys(blocks)
    routed_bytes = sum(config.stc.get_tensor_meta(k)[k]["n_bytes"] for k in routed if config.stc.has_tensor(k))
    torch.cuda.reset_peak_memory_stats()
    rss0 = _reset_peak_rss()
    t = time.perf_counter()
    with RoutedReads(routed.__contains__) as rr:
        att = moetier_load(model, R, recs, lambda: model.load(device="cuda:0"), record=True, device="cuda:0")
    load_s = time.perf_counter() - t
    rss = _peak_rss() - rss0
    report("checkpoint load", rr.keys == 0,
           f"{args.recipe}: {rr.keys} routed tensors read from the checkpoint ({att.redirected} redirected) in "
           f"{load_s:.1f} s; peak host RSS +{rss / 2**30:.2f} GiB, device peak "
           f"{torch.cuda.max_memory_allocated() / 2**30:.2f} GiB, routed experts {routed_bytes / 2**30:.2f} GiB",
           load_s=load_s, rss_growth=rss, routed_bytes=routed_bytes, routed_reads=rr.keys,
           routed_read_bytes=rr.bytes)
    m0 = att.modules[0]
    g = torch.Generator(device="cuda").manual_seed(5)
    xs = [[torch.randn((1, m0.hidden_size), generator=g, device="cuda").half() for _ in att.modules]
          for _ in range(min(args.steps, 16))]
    got = forward_all(att.modules, xs)
    tok_moetier = timed(att.modules, xs, torch)
    report("checkpoint speed", None, f"MoE blocks at bsz 1: {tok_moetier:.2f} tok/s with moetier, simulator "
           f"{simulated_tok_s(att):.2f}", tok_s_moetier=tok_moetier)
    att.detach()
    if args.compare_plain:
        model.unload()
        plain = Model.from_config(Config.from_directory(args.checkpoint))
        plain.load(device="cuda:0")
        base = forward_all(ordered(moe_blocks(plain), recs), xs)
        worst = max(rel_rms(a.numpy(), b.numpy()) for sa, sb in zip(got, base) for a, b in zip(sa, sb))
        report("checkpoint split", worst < 2e-3, f"{args.recipe}: rel RMS {worst:.2e} against the engine alone")


def finish(args) -> int:
    import torch

    from adapters.exllamav3 import surface
    rec = {"kind": "exllamav3-device-check", "engine": {"exllamav3": surface.installed_version(),
                                                     "torch": torch.__version__},
           "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
           "t": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "checks": RESULTS}
    Path(args.out).write_text(json.dumps(rec, indent=1))
    failed = [r["check"] for r in RESULTS if r["ok"] is False]
    print(f"{len(RESULTS) - len(failed)} passed, {len(failed)} failed", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
