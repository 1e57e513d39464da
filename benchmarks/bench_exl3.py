"""Benchmark the Numba EXL3 expert kernel: GB/s of trellis bytes per core and in total, beside the int8 kernel and
the machine's read bandwidth, interleaved in one run.

    .venv/bin/python benchmarks/bench_exl3.py [--rounds 5] [--mib 48] [--tokens 1,2,4] [--shapes glm,qwen]
                                              [--against REV] [--json FILE] [--md FILE]

Shapes: GLM-5.3-Flash experts (H 4096, I 2048, K 3) and Qwen3.8-Flash-Next experts (H 2560, I 640, K 3), mul1.
Each measurement streams token rows through >= --mib MiB of distinct experts (more than the last-level cache, so
the trellis comes from DRAM), one ``expert_forward`` call per expert, on one core (parallel=False: a one-thread
team) and on all cores (parallel=True). Each round measures, in this order and at every token count: the read
bandwidth (a numba float32 sum over a buffer of the same size) on one core and on all cores, the EXL3 kernel in
its exact mode (fp16 weights and the engine's fp16 rounding points) and its affine mode (mul1's affine identity),
and the int8 kernel (backends/cpu/kernels.py) at the same H x I over as many bytes. Figures are min / median / max
over the rounds. "GB/s" is 1e9 bytes of weights read per second: the trellis (3 H I K / 8 bytes per expert) for
EXL3, the int8 weights for int8; the EXL3 ns per weight is the exact mode's one-core median.

--against REV also times the exact kernel of git revision REV (its backends/cpu/exl3*.py, imported as a package of
their own) on one core in every round, right after this tree's, so that a change to the kernel is judged against the
old one measured interleaved under the same conditions.

Target (issue 24): the exact EXL3 kernel at >= 1 GB/s of trellis bytes per core at 1 token; the issue names no
shape, so it is judged at every shape measured (a GLM and a Qwen expert). Writes the JSON result
(--json, default benchmarks/exl3.json) and a markdown table (--md, default benchmarks/exl3.md).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

from backends.cpu import exl3 as C  # noqa: E402
from backends.cpu import kernels as KI  # noqa: E402
from bench_kernels import _seconds, _slab, summary  # noqa: E402
from moetier.atomic import atomic_write  # noqa: E402
from moetier.bytes import exl3 as X  # noqa: E402
from moetier.bytes import expert as E  # noqa: E402
from moetier.measure.bench_exl3 import cpu_seconds, distinct_copies  # noqa: E402

SHAPES = {"glm": (4096, 2048, 3), "qwen": (2560, 640, 3)}
TARGET_GBPS_PER_CORE = 1.0
HERE = os.path.dirname(os.path.abspath(__file__))


def _psum_gbps(sweep, threads: int) -> float:
    old = KI.get_num_threads()
    KI.set_num_threads(threads)
    try:
        return sweep.nbytes / _seconds(lambda: KI._psum(sweep, threads * 8)) / 1e9
    finally:
        KI.set_num_threads(old)


def kernel_at(rev: str):
    """The EXL3 kernel (backends/cpu/exl3*.py) of git revision rev, imported as a package of its own; ValueError
    naming rev where git cannot give it."""
    root = os.path.dirname(HERE)

    def git(*args) -> str:
        r = subprocess.run(["git", "-C", root, *args], capture_output=True, text=True)
        if r.returncode:
            raise ValueError(f"--against {rev}: git {args[0]} failed: {(r.stderr.strip().splitlines() or ['no message'])[-1]}")
        return r.stdout
    pkg = "exl3_at_" + re.sub(r"\W", "_", rev)
    top = tempfile.mkdtemp(prefix="bench_exl3_")
    os.makedirs(os.path.join(top, pkg))
    open(os.path.join(top, pkg, "__init__.py"), "w").close()
    found = False
    for path in git("ls-tree", "--name-only", rev, "backends/cpu/").split():
        base = os.path.basename(path)
        if re.fullmatch(r"exl3\w*\.py", base):
            with open(os.path.join(top, pkg, base), "w") as f:
                f.write(git("show", f"{rev}:{path}").replace("backends.cpu.exl3", f"{pkg}.exl3"))
            found = found or base == "exl3.py"
    if not found:
        raise ValueError(f"--against {rev}: no backends/cpu/exl3.py at that revision")
    sys.path.insert(0, top)
    return importlib.import_module(f"{pkg}.exl3")


def bench_shape(name, H, I, Kb, tokens, mib, rounds, threads, base=None):
    rng = np.random.default_rng(0)
    trellis_bytes = 3 * X.trellis_nbytes(H, I, Kb)
    n = max(4, -(-(mib << 20) // trellis_bytes))
    experts = distinct_copies(X.random_expert(rng, H, I, Kb), n)
    lay = E.layout(H, I, "int8")
    n8 = max(4, -(-(mib << 20) // lay.weight_bytes))
    slab, bufs = _slab(lay, n8)
    sweep = np.ones(max(n * trellis_bytes, n8 * lay.weight_bytes) // 4, np.float32)
    xs = {T: rng.standard_normal((T, H)).astype(np.float32) for T in tokens}
    out8 = {T: np.empty((T, H), np.float32) for T in tokens}

    def exl3(T, mode, parallel, kernel=C):
        for ex in experts:
            kernel.expert_forward(ex, xs[T], act_limit=10.0, mode=mode, parallel=parallel)

    def int8(T, parallel):
        for b in bufs:
            KI.expert_forward(lay, b, xs[T], out8[T], parallel=parallel)

    runs = {  # name -> (bytes read, callable(T)); one-core runs first, then all cores
        "exl3_exact_1core": (n * trellis_bytes, lambda T: exl3(T, "exact", False)),
        **({"exl3_exact_against_1core": (n * trellis_bytes, lambda T: exl3(T, "exact", False, base))}
           if base is not None else {}),
        "exl3_affine_1core": (n * trellis_bytes, lambda T: exl3(T, "affine", False)),
        "int8_1core": (n8 * lay.weight_bytes, lambda T: int8(T, False)),
        "exl3_exact_all": (n * trellis_bytes, lambda T: exl3(T, "exact", True)),
        "exl3_affine_all": (n * trellis_bytes, lambda T: exl3(T, "affine", True)),
        "int8_all": (n8 * lay.weight_bytes, lambda T: int8(T, True)),
    }
    for T in tokens:                    # compile / warm every path once
        for _, fn in runs.values():
            fn(T)
    _psum_gbps(sweep, 1)
    _psum_gbps(sweep, threads)
    keys = ("membw_1core", "membw_all", *runs, *(k + "_cpu" for k in runs))
    samples = {T: {k: [] for k in keys} for T in tokens}
    for _ in range(rounds):
        for T in tokens:
            s = samples[T]
            s["membw_1core"].append(_psum_gbps(sweep, 1))
            s["membw_all"].append(_psum_gbps(sweep, threads))
            for key, (nbytes, fn) in runs.items():
                wall, cpu = cpu_seconds(lambda: fn(T), key.endswith("_1core"))
                s[key].append(nbytes / wall / 1e9)
                # per CPU-second: for an all-core run, GB/s per busy core
                s[key + "_cpu"].append(nbytes / max(cpu, 1e-9) / 1e9)
    del slab, bufs, sweep, experts
    rows = []
    for T in tokens:
        r = {"shape": name, "hidden": H, "inter": I, "K": Kb, "tokens": T, "exl3_experts": n,
             "trellis_bytes_per_expert": trellis_bytes, "int8_experts": n8,
             "int8_weight_bytes_per_expert": lay.weight_bytes}
        r.update({k: summary(v) for k, v in samples[T].items()})
        gbps = r["exl3_exact_1core_cpu"]["median"]
        r["exl3_exact_ns_per_weight_1core"] = Kb / 8 / gbps      # bytes per weight / (bytes per ns)
        rows.append(r)
    return rows


def markdown(res: dict, command: str) -> str:
    def cell(s):
        return f"{s['median']:.2f} ({s['min']:.2f}-{s['max']:.2f})"

    lines = [
        "# EXL3 CPU expert kernel: trellis GB/s per core and in total",
        "",
        f"Reproduce: `{command}`",
        "",
        f"{res['cpu']}, {res['threads']} threads, {res['rounds']} interleaved rounds, load average "
        f"{res['loadavg_start']:.1f} at the start and {res['loadavg_end']:.1f} at the end. GB/s = 1e9 weight bytes "
        "per second (trellis bytes for EXL3, int8 weight bytes for int8); median (min-max) over rounds. exact = fp16 "
        "weights and the engine's fp16 rounding points; affine = mul1's affine identity.",
        "",
        "Per core: bytes per CPU-second of the calling thread on a one-thread team (what a core does while it runs "
        "the kernel; on a shared host the wall-clock figure also counts time other processes held the core). All "
        "cores: bytes per wall-clock second with every numba thread, and in brackets per CPU-second of all "
        "threads. ns/w = nanoseconds per decoded weight, exact, per core.",
        "",
        "| shape | tokens | read bw 1 core / all (wall) | exl3 exact per core | exl3 exact all [per cpu-s] "
        "| exl3 affine per core | exl3 affine all [per cpu-s] | int8 per core | int8 all [per cpu-s] | ns/w |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in res["results"]:
        def both(key):
            return f"{cell(r[key])} [{r[key + '_cpu']['median']:.2f}]"
        lines.append(
            f"| {r['shape']} {r['hidden']}x{r['inter']} K{r['K']} | {r['tokens']} | "
            f"{r['membw_1core']['median']:.1f} / {r['membw_all']['median']:.1f} | "
            f"{cell(r['exl3_exact_1core_cpu'])} | {both('exl3_exact_all')} | {cell(r['exl3_affine_1core_cpu'])} | "
            f"{both('exl3_affine_all')} | {cell(r['int8_1core_cpu'])} | {both('int8_all')} | "
            f"{r['exl3_exact_ns_per_weight_1core']:.2f} |")
    if res.get("against"):
        lines += ["", f"Against `{res['against']}` (its kernel timed on one core right after this tree's in every "
                  "round), exact per core, median (min-max):", ""]
        lines += [f"- {r['shape']} {r['tokens']} token(s): this tree {cell(r['exl3_exact_1core_cpu'])}, "
                  f"{res['against']} {cell(r['exl3_exact_against_1core_cpu'])}" for r in res["results"]]
    t = res["target"]
    lines += ["", f"Target: exact EXL3 >= {t['gbps_per_core']:.1f} GB/s of trellis bytes per core at 1 token at every "
              f"shape: {'met' if t['met'] else 'NOT met'} (median per core, per shape: "
              + ", ".join(f"{k} {v:.2f} ({'met' if v >= t['gbps_per_core'] else 'not met'})"
                          for k, v in t["per_shape"].items()) + "; one-core wall-clock medians: "
              + ", ".join(f"{k} {v:.2f}" for k, v in t["per_shape_wall"].items()) + ").",
              "", f"Decode cost: {t['gbps_per_core']:.1f} GB/s of trellis bytes at K bits is K/8 ns per weight "
              f"(0.375 ns at K 3) for the whole expert; measured per core at 1 token (exact): "
              + ", ".join(f"{r['shape']} {r['exl3_exact_ns_per_weight_1core']:.2f} ns" for r in res["results"]
                          if r["tokens"] == 1) + ". All-core figures are only meaningful on an otherwise idle host "
              "(see the load average above): a numba parallel region waits for its slowest thread."]
    return "\n".join(lines) + "\n"


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown CPU"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds (default %(default)s)")
    ap.add_argument("--mib", type=int, default=48, help="MiB of weights streamed per measurement (default %(default)s)")
    ap.add_argument("--tokens", default="1,2,4", help="comma list of token rows per expert call")
    ap.add_argument("--shapes", default="glm,qwen", help=f"comma list of {', '.join(SHAPES)}")
    ap.add_argument("--against", default=None, metavar="REV",
                    help="also time the exact kernel of this git revision, interleaved (one core)")
    ap.add_argument("--threads", type=int, default=None, help="numba threads for the all-core runs (default: all)")
    ap.add_argument("--json", default=os.path.join(HERE, "exl3.json"), help="JSON result file")
    ap.add_argument("--md", default=os.path.join(HERE, "exl3.md"), help="markdown table file")
    a = ap.parse_args(argv)
    tokens = [int(t) for t in a.tokens.split(",")]
    shapes = a.shapes.split(",")
    for s in shapes:
        if s not in SHAPES:
            ap.error(f"--shapes: unknown shape {s!r}, expected one of {', '.join(SHAPES)}")
    try:
        base = kernel_at(a.against) if a.against else None
    except ValueError as e:
        ap.error(str(e))
    if a.threads:
        KI.set_num_threads(a.threads)
    threads = KI.get_num_threads()
    res = {"cpu": _cpu_name(), "threads": threads, "rounds": a.rounds, "mib": a.mib,
           "loadavg_start": os.getloadavg()[0], "statistic": "min / median / max over rounds",
           "per_core": "bytes per CPU-second of the calling thread (keys *_1core_cpu); *_1core: per wall second",
           "against": a.against, "results": []}
    for s in shapes:
        res["results"] += bench_shape(s, *SHAPES[s], tokens, a.mib, a.rounds, threads, base)
    res["loadavg_end"] = os.getloadavg()[0]
    one = {r["shape"]: r["exl3_exact_1core_cpu"]["median"] for r in res["results"] if r["tokens"] == 1}
    wall = {r["shape"]: r["exl3_exact_1core"]["median"] for r in res["results"] if r["tokens"] == 1}
    res["target"] = {"gbps_per_core": TARGET_GBPS_PER_CORE, "per_shape": one, "per_shape_wall": wall,
                     "met": bool(one) and min(one.values()) >= TARGET_GBPS_PER_CORE}
    command = "python benchmarks/bench_exl3.py " + " ".join(argv if argv is not None else sys.argv[1:])
    text = json.dumps(res, indent=1) + "\n"
    atomic_write(a.json, lambda f: f.write(text.encode()))
    md = markdown(res, command.strip())
    atomic_write(a.md, lambda f: f.write(md.encode()))
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
