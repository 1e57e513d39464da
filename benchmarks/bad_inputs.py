"""The bad-input catalogue: several hundred bad inputs tried from outside, through the real command line.

Usage: ``python benchmarks/bad_inputs.py [--quick] [--jobs N] [--only TEXT] [--json FILE] [--list]``

Each case runs ``python -m moetier ARGS`` as a child process in a folder of its own (its working directory, with an
empty user registry there, ``MOETIER_REGISTRY``), under a wall-clock timeout and an address-space limit
(``resource.setrlimit`` in ``preexec_fn``). Every input is bad, so the one good outcome is: exit 2 with exactly
one stderr line, ``moetier: error: ...``, that names the thing at fault (the flag, field or file the case
expects), and nothing new in the folder. The bad outcomes, counted by kind:

* ``traceback``: a Python traceback on stderr, or an exit status other than 0 and 2 (a crash);
* ``silent``: exit 0 on a bad input (cases marked ``either`` may exit 0: a value that is only large, and bounded;
  cases marked ``reported`` may exit 0 when stdout says what is wrong: ``list`` shows a record that does not load);
* ``hang``: still running at the timeout, or killed by the memory limit;
* ``noisy``: exit 2, but not exactly one ``moetier: error:`` line, or a line that does not name the thing;
* ``stray``: a file or folder left in the case's folder that was not there before.

The groups: every writing flag with paths it cannot write (a directory, /dev/full, a FIFO, a missing parent, names
over NAME_MAX, a symlink loop, a path through a file), registry ids of 300 characters, bad records in a user
registry, bad traces (npz with wrong dtypes and shapes, -1 holes, huge ids, empty, pickled), bad router logs, bad
config.json for ``model import``, bad ``--set`` overrides and ``sweep --grid`` axes, bad values for every numeric
flag, huge ``--conc``/``--steps``/``--tokens``, bad probe files and plot inputs, bad stores. ``--quick`` runs a
fixed subset (every group, a few cases each) for CI; tests/test_bad_inputs.py runs it, and the whole catalogue
with ``MOETIER_BAD_INPUTS_ALL=1``. Target: 0 bad of every kind. Prints one line per bad case and the totals.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KINDS = ("good", "traceback", "silent", "hang", "noisy", "stray")
TIMEOUT_S = 120
MEMORY_BYTES = 8 << 30
MIXTRAL = os.path.join(ROOT, "tests", "data", "mixtral-8x7b-fp8")     # a sound config.json
ONE_LINE = re.compile(r"^moetier: error: .+")


@dataclass
class Case:
    group: str
    name: str
    argv: list                  # "{d}" is the case's folder, "{s}" the shared inputs' folder
    names: str                  # what the error line must name (a substring)
    setup: object = None        # setup(d): the case's own inputs, made before the snapshot
    either: bool = False        # exit 0 allowed (a large value a command bounds), with the files it was asked for
    reported: str = ""          # exit 0 allowed when stdout says this (list shows a record that does not load)
    quick: bool = False
    env: dict = field(default_factory=dict)


# ---- shared inputs (read by many cases, never written) --------------------------------------------------------------
def make_shared(s: str) -> None:
    os.makedirs(s, exist_ok=True)
    run_ok(["store", "pack", "moetier-tiny-ci-int8", "--out", f"{s}/store"], s)
    run_ok(["trace", "gen", "--model", "moetier-tiny-ci-int8", "--tokens", "64", "--out", f"{s}/good.npz"], s)
    os.mkfifo(f"{s}/fifo")
    os.symlink(f"{s}/loop-b", f"{s}/loop-a")
    os.symlink(f"{s}/loop-a", f"{s}/loop-b")
    with open(f"{s}/a-file", "w") as f:
        f.write("x")
    os.mkdir(f"{s}/a-dir")


def run_ok(argv, cwd) -> None:
    r = subprocess.run([sys.executable, "-m", "moetier", "--quiet", *argv], cwd=cwd, env=child_env(cwd),
                       capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        raise SystemExit(f"bad_inputs: setting up with moetier {' '.join(argv)} failed: {r.stderr.strip()}")


def child_env(d: str, extra=None) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p),
           "MOETIER_REGISTRY": os.path.join(d, "reg"), "MPLBACKEND": "Agg", "COLUMNS": "120"}
    env.update(extra or {})
    return env


# ---- helpers that write bad inputs ---------------------------------------------------------------------------------
def text(path, body):
    def setup(d):
        p = os.path.join(d, path)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        with open(p, "wb") as f:
            f.write(body.encode() if isinstance(body, str) else body)
    return setup


def npz(path, **arrays):
    def setup(d):
        np.savez(os.path.join(d, path), **arrays)
    return setup


def both(*setups):
    def setup(d):
        for s in setups:
            s(d)
    return setup


DEEP = "[" * 100_000 + "]" * 100_000
JUNK = {
    "not-json": "this is not json",
    "nan": '{"id": NaN}',
    "infinity": '{"id": Infinity}',
    "deep": DEEP,
    "huge-number": '{"n": 1e999}',
    "huge-int": '{"n": ' + "9" * 5000 + "}",
    "empty": "",
    "binary": b"\x00\xff\xfe\x00PK\x03\x04",
    "bom-array": "\ufeff[]",
    "a-list": "[1, 2, 3]",
}


# ---- the catalogue --------------------------------------------------------------------------------------------------
def writing_flags():
    """(command words, argv before the flag, flag, what the error names) for every flag that writes a file."""
    s = "{s}"
    return [
        ("sim", ["sim", "tiny-ci-cpu", "--plot"]),
        ("trace stats", ["trace", "stats", f"{s}/good.npz", "--plot"]),
        ("trace gen", ["trace", "gen", "--model", "moetier-tiny-ci-int8", "--out"]),
        ("trace convert", ["trace", "convert", f"{s}/good.npz"]),
        ("trace import", ["trace", "import", f"{s}/good.npz", "--out"]),
        ("trace fit", ["trace", "fit", f"{s}/good.npz", "--out"]),
        ("model import", ["model", "import", MIXTRAL, "--out"]),
        ("run", ["run", "tiny-ci-cpu", "--store", f"{s}/store", "--probe"]),
        ("calibrate", ["calibrate", "tiny-ci-cpu", "--store", f"{s}/store", "--plot"]),
        ("sweep", ["sweep", "tiny-ci-cpu", "--out"]),
        ("sweep --plot", ["sweep", "tiny-ci-cpu", "--out", "{d}/ok.jsonl", "--plot"]),
        ("conformance", ["conformance", "--backend", "cpu", "--report"]),
        ("conformance --md", ["conformance", "--backend", "cpu", "--md"]),
        ("probe record", ["probe", "record", "--duration", "1", "--out"]),
        ("probe report", ["probe", "report", f"{s}/good.npz", "--plot"]),
        ("compare", ["compare", "tiny-ci-cpu", "--plot"]),
        ("plot levers", ["plot", "levers", f"{s}/good.npz", "--out"]),
        ("plot timeline", ["plot", "timeline", "tiny-ci-cpu", "--out"]),
        ("plot waterfall", ["plot", "waterfall", f"{s}/good.npz", "--out"]),
        ("plot cache", ["plot", "cache", f"{s}/good.npz", "--out"]),
        ("plot calibration", ["plot", "calibration", f"{s}/good.npz", "--out"]),
        ("plot compare", ["plot", "compare", f"{s}/good.npz", "--out"]),
    ]


BAD_PATHS = {
    "directory": ("{s}/a-dir", "a-dir"),
    "dev-full": ("/dev/full", "/dev/full"),
    "fifo": ("{s}/fifo", "fifo"),
    "missing-parent": ("{d}/no-such/out.x", "no-such"),
    "through-a-file": ("{s}/a-file/out.x", "a-file"),
    "name-256": ("{d}/" + "n" * 256 + ".x", "NAME_MAX"),
    "path-5000": ("{d}/" + "/".join(["p" * 200] * 25), "PATH_MAX"),
    "symlink-loop": ("{s}/loop-a", "loop-a"),
    "empty": ("", "empty"),
}


def cases() -> list[Case]:
    out: list[Case] = []
    add = out.append
    s = "{s}"

    # 1. every writing flag x every path it cannot write
    for cmd, argv in writing_flags():
        for pname, (path, names) in BAD_PATHS.items():
            add(Case("out-path", f"{cmd} -> {pname}", argv + [path], names,
                     quick=pname in ("dev-full", "symlink-loop") and cmd in ("sweep", "run", "trace gen")))
    add(Case("out-path", "store pack --out a file", ["store", "pack", "moetier-tiny-ci-int8", "--out",
                                                      f"{s}/a-file"], "a-file", quick=True))
    add(Case("out-path", "store pack --out /dev/full", ["store", "pack", "moetier-tiny-ci-int8", "--out",
                                                         "/dev/full"], "/dev/full"))
    add(Case("out-path", "--registry a file", ["--registry", f"{s}/a-file", "list"], "a-file"))
    add(Case("out-path", "--registry /dev/full", ["--registry", "/dev/full", "show", "tiny-ci-cpu"], "/dev/full"))
    add(Case("out-path", "--registry a loop", ["--registry", f"{s}/loop-a", "list"], "loop-a"))

    # 2. registry ids a command would write under: 300 characters, path-like, shipped
    long_id = "r" * 300
    bench = ["bench", "--store", f"{s}/store", "--recipe", "tiny-ci-cpu", "--rounds", "1"]
    for label, argv in [
        ("run --record", ["run", "tiny-ci-cpu", "--store", f"{s}/store", "--steps", "2", "--conc", "1", "--record"]),
        ("model import --id", ["model", "import", MIXTRAL, "--id"]),
        ("bench --hardware", [*bench, "--hardware"]),
        ("bench --engine", [*bench, "--engine"]),
        ("bench --recipe-out", [*bench, "--recipe-out"]),
        ("calibrate --record", ["calibrate", "tiny-ci-cpu", "--store", f"{s}/store", "--quick", "--record"]),
        ("conformance --write-engine", ["conformance", "--backend", "cpu", "--write-engine"]),
    ]:
        for idname, rid in [("300 chars", long_id), ("a path", "../../escape"), ("spaces", "a b"), ("empty", "")]:
            add(Case("registry-id", f"{label} {idname}", argv + [rid], "id", quick=idname == "300 chars"
                     and label in ("run --record", "model import --id")))
    add(Case("registry-id", "run --record a shipped id", ["run", "tiny-ci-cpu", "--store", f"{s}/store", "--steps",
                                                          "2", "--conc", "1", "--record",
                                                          "tiny-local-cpu-runtime-2026-11-29"], "--force"))
    add(Case("registry-id", "model import a shipped id", ["model", "import", MIXTRAL, "--id",
                                                          "moetier-tiny-ci-int8"], "moetier-tiny-ci-int8"))

    # 3. bad records in a user registry, read by the commands that read that kind
    good = {k: json.load(open(os.path.join(ROOT, "registry", k, f"{i}.json"))) for k, i in
            [("recipe", "tiny-ci-cpu"), ("model", "moetier-tiny-ci-int8"), ("hardware", "local-cpu"),
             ("engine", "numba-cpu")]}

    def record_variants(kind):
        rec = good[kind]
        v = {name: body for name, body in JUNK.items()}
        v["wrong-type-id"] = json.dumps({**rec, "id": 7})
        v["unknown-field"] = json.dumps({**rec, "id": "bad-x", "surprise": 1})
        v["id-300"] = json.dumps({**rec, "id": "i" * 300})
        v["id-mismatch"] = json.dumps({**rec, "id": "another-id"})
        v["missing-fields"] = json.dumps({"id": "bad-x"})
        v["dup-keys"] = '{"id": "bad-x", "id": "bad-y"}'
        first = [k for k in rec if isinstance(rec[k], (dict, int, float)) and k != "id"][0]
        v["wrong-type-field"] = json.dumps({**rec, "id": "bad-x", first: "a string"})
        v["nan-deep"] = json.dumps({**rec, "id": "bad-x"}).replace("}", ', "x": NaN}', 1)
        return v

    for kind in ("recipe", "model", "hardware", "engine"):
        for vname, body in record_variants(kind).items():
            files = text(f"reg/{kind}/bad-x.json", body)
            quick = vname in ("nan", "deep") and kind == "recipe"
            if kind == "recipe":
                add(Case("registry", f"show a {kind} that is {vname}", ["show", "bad-x"], "bad-x", files,
                         quick=quick))
                add(Case("registry", f"sim a {kind} that is {vname}", ["sim", "bad-x", "--conc", "1"], "bad-x",
                         files))
            else:
                ref = {**good["recipe"], "id": "uses-bad", {"model": "model", "hardware": "hardware",
                                                            "engine": "engines"}[kind]:
                       ["bad-x"] if kind == "engine" else "bad-x"}
                add(Case("registry", f"show a recipe on a {kind} that is {vname}", ["show", "uses-bad"], "bad-x",
                         both(files, text("reg/recipe/uses-bad.json", json.dumps(ref))), quick=vname == "nan"
                         and kind == "model"))
            add(Case("registry", f"list {kind} holding one that is {vname}", ["list", kind], "bad-x", files,
                     reported="does not load"))
    for vname, body in JUNK.items():
        add(Case("registry", f"probe report a run record that is {vname}", ["probe", "report", "bad-run"], "bad-run",
                 text("reg/runs/bad-run.json", body)))
    add(Case("registry", "a symlink loop under recipe/", ["list", "recipe"], "loop", reported="does not load",
             setup=
             lambda d: (os.makedirs(f"{d}/reg/recipe"), os.symlink(f"{d}/reg/recipe/loop.json",
                                                                   f"{d}/reg/recipe/loop.json"))))
    add(Case("registry", "show a symlink loop under recipe/", ["show", "loop"], "loop",
             lambda d: (os.makedirs(f"{d}/reg/recipe"), os.symlink(f"{d}/reg/recipe/loop.json",
                                                                   f"{d}/reg/recipe/loop.json"))))
    add(Case("registry", "a FIFO as a record", ["show", "fifo-x"], "fifo-x",
             lambda d: (os.makedirs(f"{d}/reg/recipe"), os.mkfifo(f"{d}/reg/recipe/fifo-x.json"))))
    add(Case("registry", "a record that is a folder", ["show", "dir-x"], "dir-x",
             lambda d: os.makedirs(f"{d}/reg/recipe/dir-x.json")))
    for rid, label in [("r" * 300, "300 chars"), ("../../etc/passwd", "a path"), ("", "empty"), ("-x", "a dash")]:
        add(Case("registry", f"show an id that is {label}", ["show", rid], "", quick=label == "a path"))

    # 4. bad traces, read by every command that reads one
    T, L, K = 16, 8, 4
    ids = np.random.default_rng(0).integers(0, 32, (T, L, K)).astype(np.int16)
    seg = np.array([0, T], dtype=np.int64)
    traces = {
        "float-ids": npz("t.npz", ids=ids.astype(np.float32), segments=seg),
        "3-d-wrong-layers": npz("t.npz", ids=ids[:, :3], segments=seg),
        "1-d-ids": npz("t.npz", ids=ids.ravel(), segments=np.array([0, ids.size])),
        "minus-one-holes": npz("t.npz", ids=np.where(ids % 3 == 0, -1, ids).astype(np.int16), segments=seg),
        "huge-ids": npz("t.npz", ids=np.full((T, L, K), 30000, dtype=np.int16), segments=seg),
        "int64-huge": npz("t.npz", ids=np.full((T, L, K), 2 ** 40, dtype=np.int64), segments=seg),
        "empty-ids": npz("t.npz", ids=np.zeros((0, L, K), dtype=np.int16), segments=np.array([0])),
        "no-ids": npz("t.npz", segments=seg),
        "segments-backwards": npz("t.npz", ids=ids, segments=np.array([0, 10, 5, T])),
        "segments-past-end": npz("t.npz", ids=ids, segments=np.array([0, T * 1000])),
        "weights-nan": npz("t.npz", ids=ids, segments=seg, weights=np.full((T, L, K), np.nan, np.float32)),
        "weights-shape": npz("t.npz", ids=ids, segments=seg, weights=np.ones((2, 2), np.float32)),
        "meta-not-json": npz("t.npz", ids=ids, segments=seg, meta=np.array("{nope")),
        "meta-nan": npz("t.npz", ids=ids, segments=seg, meta=np.array('{"x": NaN}')),
        "object-array": lambda d: np.savez(f"{d}/t.npz", ids=np.array([ids, None], dtype=object), segments=seg),
        "not-a-zip": text("t.npz", b"PK\x03\x04 this is not a zip"),
        "empty-file": text("t.npz", b""),
        "bool-ids": npz("t.npz", ids=ids > 5, segments=seg),
        "string-ids": npz("t.npz", ids=np.array([["a"]]), segments=seg),
    }
    readers = [
        ("trace stats", ["trace", "stats", "{d}/t.npz", "--model", "moetier-tiny-ci-int8"]),
        ("sim --trace", ["sim", "tiny-ci-cpu", "--conc", "1", "--trace", "{d}/t.npz"]),
        ("trace convert", ["trace", "convert", "{d}/t.npz", "{d}/t2.npy"]),
        ("trace fit", ["trace", "fit", "{d}/t.npz", "--model", "moetier-tiny-ci-int8"]),
        ("plot cache", ["plot", "cache", "{d}/t.npz", "--model", "moetier-tiny-ci-int8", "--out", "{d}/c.png"]),
    ]
    for tname, setup in traces.items():
        for rname, argv in readers:
            if rname == "trace convert" and tname in ("3-d-wrong-layers", "huge-ids"):
                continue                # sound on its own: convert names no model to hold it against
            add(Case("trace", f"{rname} of {tname}", argv, "t.npz", setup,
                     quick=rname == "sim --trace" and tname in ("minus-one-holes", "object-array", "huge-ids")))
    for path, label in [("/dev/zero", "/dev/zero"), (f"{s}/fifo", "fifo"), (f"{s}/a-dir", "a-dir"),
                        (f"{s}/loop-a", "loop-a"), ("{d}/none.npz", "none.npz")]:
        add(Case("trace", f"trace stats of {label}", ["trace", "stats", path, "--model", "moetier-tiny-ci-int8"],
                 label, quick=label == "fifo"))

    # 5. bad router logs for trace import
    line = {"token": 0, "layer": 0, "experts": [1, 2], "weights": [0.5, 0.5]}
    logs = {
        "layer-1e9": [{**line, "layer": 10 ** 9}],
        "token-1e12": [{**line, "token": 10 ** 12}],
        "expert-negative": [{**line, "experts": [-5, 1]}],
        "expert-huge": [{**line, "experts": [10 ** 9, 1]}],
        "weight-nan": "NaN",
        "experts-string": [{**line, "experts": "1,2"}],
        "no-lines": [],
        "mixed-topk": [line, {**line, "layer": 1, "experts": [1, 2, 3]}],
        "float-layer": [{**line, "layer": 0.5}],
    }
    for lname, rows in logs.items():
        if rows == "NaN":
            body = json.dumps(line).replace("0.5]", "NaN]") + "\n"
        else:
            body = "".join(json.dumps(r) + "\n" for r in rows)
        add(Case("trace-import", f"a log with {lname}", ["trace", "import", "{d}/log.jsonl", "--out", "{d}/o.npz",
                                                         "--experts", "32", "--topk", "2", "--layers", "8"],
                 "log.jsonl", text("log.jsonl", body), quick=lname == "layer-1e9"))
    for jname, body in JUNK.items():
        add(Case("trace-import", f"a log that is {jname}", ["trace", "import", "{d}/log.jsonl", "--out",
                                                            "{d}/o.npz"], "log.jsonl", text("log.jsonl", body)))
    add(Case("trace-import", "a csv of junk", ["trace", "import", "{d}/log.csv", "--out", "{d}/o.npz"], "log.csv",
             text("log.csv", "token,layer,experts\nx,y,z\n")))

    # 6. bad config.json for model import
    cfg = json.load(open(os.path.join(MIXTRAL, "config.json")))
    configs = {**JUNK,
               "layers-1e6": json.dumps({**cfg, "num_hidden_layers": 1_000_000}),
               "layers-1e18": json.dumps({**cfg, "num_hidden_layers": 10 ** 18}),
               "layers-negative": json.dumps({**cfg, "num_hidden_layers": -3}),
               "layers-zero": json.dumps({**cfg, "num_hidden_layers": 0}),
               "layers-string": json.dumps({**cfg, "num_hidden_layers": "32"}),
               "layers-float": json.dumps({**cfg, "num_hidden_layers": 32.5}),
               "experts-zero": json.dumps({**cfg, "num_local_experts": 0}),
               "experts-1e9": json.dumps({**cfg, "num_local_experts": 10 ** 9}),
               "topk-over-experts": json.dumps({**cfg, "num_experts_per_tok": 99}),
               "hidden-nan": json.dumps(cfg).replace('"hidden_size": 4096', '"hidden_size": NaN'),
               "hidden-1e300": json.dumps({**cfg, "hidden_size": 1e300}),
               "no-moe-fields": json.dumps({"hidden_size": 4096}),
               "bool-layers": json.dumps({**cfg, "num_hidden_layers": True})}
    for cname, body in configs.items():
        add(Case("model-import", f"config.json {cname}", ["model", "import", "{d}/m", "--out", "{d}/m.json"],
                 "config.json", text("m/config.json", body), quick=cname in ("layers-1e6", "deep")))
    add(Case("model-import", "a missing folder", ["model", "import", "{d}/none"], "none"))
    add(Case("model-import", "config.json a FIFO", ["model", "import", "{d}/m"], "config.json",
             lambda d: (os.makedirs(f"{d}/m"), os.mkfifo(f"{d}/m/config.json"))))
    add(Case("model-import", "--bits nan", ["model", "import", MIXTRAL, "--bits", "nan"],
             "--bits"))

    # 7. bad --set overrides and sweep --grid axes
    sets = ["budget.ram_gb", "budget.ram_gb=", "=1", "budget.ram_gb=NaN", "budget.ram_gb=Infinity",
            "budget.ram_gb=-1", "budget.ram_gb=1e999", "budget.ram_gb=\"x\"", "budget.nope=1", "nope.deep.path=1",
            "policy.ram_evict=bogus", "policy.prefetch.recall=2", "policy.prefetch.depth=-1",
            "budget.vram_expert_slots=1e12", "id=other", "model=no-such-model", "policy=3", "budget=[]",
            "calibration.fixed_ms.1=NaN", "budget.ram_gb=" + DEEP[:2000] + DEEP[-2000:], "a" * 300 + "=1",
            "policy.prefetch.predictor=oracle9"]
    for i, item in enumerate(sets):
        key = item.split("=", 1)[0] or "--set"
        names = key if key and len(key) < 60 else "--set"
        for cmd in (["sim", "tiny-ci-cpu", "--conc", "1"], ["show", "tiny-ci-cpu"]):
            add(Case("set", f"{cmd[0]} --set {item[:40]}", cmd + ["--set", item], names if "=" in item else "--set",
                     quick=i in (3, 8) and cmd[0] == "sim"))
    grids = ["budget.ram_gb", "budget.ram_gb=", "=1,2", "budget.ram_gb=NaN,1", "budget.ram_gb=1,1",
             "budget.nope=1,2", "budget.ram_gb=" + ",".join(str(i) for i in range(1, 5000)) + ",NaN",
             "budget.ram_gb=-1", "policy.ram_evict=bogus,lru", "budget.ram_gb=Infinity"]
    for i, g in enumerate(grids):
        add(Case("grid", f"sweep --grid {g[:40]}", ["sweep", "tiny-ci-cpu", "--conc", "1", "--steps", "4", "--out",
                                                    "{d}/s.jsonl", "--grid", g], "--grid" if "=" not in g else
                 (g.split("=")[0] or "--grid"), quick=i in (3, 6)))
    add(Case("grid", "sweep two axes the same", ["sweep", "tiny-ci-cpu", "--out", "{d}/s.jsonl", "--grid",
                                                 "budget.ram_gb=1,2", "budget.ram_gb=3"], "budget.ram_gb"))
    add(Case("grid", "sweep --policy bogus", ["sweep", "tiny-ci-cpu", "--out", "{d}/s.jsonl", "--policy", "bogus"],
             "bogus"))
    add(Case("grid", "sweep --out a file of junk", ["sweep", "tiny-ci-cpu", "--conc", "1", "--steps", "4", "--out",
                                                    "{d}/s.jsonl"], "s.jsonl", text("s.jsonl", "junk\n"),
             quick=True))

    # 8. bad values for every numeric flag
    numeric = {
        "pos-int": ["0", "-1", "nan", "abc", "1.5", "1e3", "", "0x10"],
        "count": ["-1", "nan", "abc", "1.5"],
        "pos-float": ["0", "-1", "nan", "inf", "1e999", "abc"],
        "count-float": ["-1", "nan", "inf", "abc"],
        "unit": ["-0.1", "1.5", "nan", "inf", "abc"],
        "seed": ["-1", str(2 ** 63), "nan", "abc"],
        "sizes": ["0", "-1,2", "1,,2", "a,b", "nan", ""],
    }
    flags = [
        (["sim", "tiny-ci-cpu"], "--conc", "pos-int"), (["sim", "tiny-ci-cpu"], "--steps", "count"),
        (["sim", "tiny-ci-cpu"], "--window", "pos-int"), (["sim", "tiny-ci-cpu"], "--accept", "pos-float"),
        (["sim", "tiny-ci-cpu"], "--draft-ms", "count-float"), (["table", "tiny-ci-cpu"], "--conc", "pos-int"),
        (["trace", "stats", f"{s}/good.npz"], "--cache-sizes", "sizes"),
        (["trace", "stats", f"{s}/good.npz"], "--layer-sizes", "sizes"),
        (["trace", "gen", "--model", "moetier-tiny-ci-int8", "--out", "{d}/g.npz"], "--tokens", "pos-int"),
        (["trace", "gen", "--model", "moetier-tiny-ci-int8", "--out", "{d}/g.npz"], "--segments", "pos-int"),
        (["trace", "gen", "--model", "moetier-tiny-ci-int8", "--out", "{d}/g.npz"], "--seed", "seed"),
        (["trace", "import", f"{s}/good.npz", "--out", "{d}/o.npz"], "--experts", "pos-int"),
        (["trace", "import", f"{s}/good.npz", "--out", "{d}/o.npz"], "--topk", "pos-int"),
        (["trace", "import", f"{s}/good.npz", "--out", "{d}/o.npz"], "--layers", "pos-int"),
        (["trace", "fit", f"{s}/good.npz"], "--experts", "pos-int"),
        (["trace", "fit", f"{s}/good.npz"], "--sample-tokens", "pos-int"),
        (["trace", "fit", f"{s}/good.npz"], "--sample-layers", "pos-int"),
        (["trace", "fit", f"{s}/good.npz"], "--seed", "seed"),
        (["model", "import", MIXTRAL], "--bits", "pos-float"),
        (["compare", "tiny-ci-cpu"], "--conc", "pos-int"), (["compare", "tiny-ci-cpu"], "--steps", "count"),
        (["plot", "timeline", "tiny-ci-cpu", "--out", "{d}/t.png"], "--conc", "pos-int"),
        (["plot", "timeline", "tiny-ci-cpu", "--out", "{d}/t.png"], "--steps", "pos-int"),
        (["plot", "cache", f"{s}/good.npz", "--out", "{d}/c.png"], "--sizes", "pos-int"),
        (["plot", "cache", f"{s}/good.npz", "--out", "{d}/c.png"], "--layer-sizes", "sizes"),
        (["sweep", "tiny-ci-cpu", "--out", "{d}/s.jsonl"], "--conc", "pos-int"),
        (["sweep", "tiny-ci-cpu", "--out", "{d}/s.jsonl"], "--steps", "count"),
        (["sweep", "tiny-ci-cpu", "--out", "{d}/s.jsonl"], "--workers", "pos-int"),
        (["sweep", "tiny-ci-cpu", "--out", "{d}/s.jsonl"], "--batch", "pos-int"),
        (["store", "pack", "moetier-tiny-ci-int8", "--out", "{d}/st"], "--seed", "seed"),
        (["run", "tiny-ci-cpu", "--store", f"{s}/store"], "--conc", "pos-int"),
        (["run", "tiny-ci-cpu", "--store", f"{s}/store"], "--steps", "count"),
        (["run", "tiny-ci-cpu", "--store", f"{s}/store"], "--verify-rate", "unit"),
        (["run", "tiny-ci-cpu", "--store", f"{s}/store"], "--faults", "unit"),
        (["run", "tiny-ci-cpu", "--store", f"{s}/store"], "--stall-rate", "unit"),
        (["run", "tiny-ci-cpu", "--store", f"{s}/store"], "--fault-seed", "seed"),
        (["run", "tiny-ci-cpu", "--store", f"{s}/store"], "--retries", "count"),
        (["run", "tiny-ci-cpu", "--store", f"{s}/store"], "--stall-timeout", "pos-float"),
        (["calibrate", "tiny-ci-cpu", "--store", f"{s}/store"], "--steps", "pos-int"),
        (["calibrate", "tiny-ci-cpu", "--store", f"{s}/store"], "--repeats", "pos-int"),
        (["calibrate", "tiny-ci-cpu", "--store", f"{s}/store"], "--verify-rate", "unit"),
        (["bench", "--store", f"{s}/store", "--recipe", "tiny-ci-cpu"], "--rounds", "pos-int"),
        (["bench", "--store", f"{s}/store", "--recipe", "tiny-ci-cpu"], "--records", "pos-int"),
        (["probe", "record", "--out", "{d}/p.jsonl", "--duration", "1"], "--interval", "pos-float"),
        (["probe", "record", "--out", "{d}/p.jsonl"], "--duration", "count-float"),
    ]
    for argv, flag, kind in flags:
        for j, v in enumerate(numeric[kind]):
            add(Case("numeric", f"{' '.join(argv[:2])} {flag} {v!r}", argv + [flag, v], flag,
                     quick=j == 0 and flag in ("--conc", "--accept", "--interval")))

    # 9. huge values: refused, or bounded and finished inside the timeout
    huge = [
        (["sim", "tiny-ci-cpu", "--conc"], "100000"), (["sim", "tiny-ci-cpu", "--conc", "1", "--steps"], str(10 ** 12)),
        (["sim", "tiny-ci-cpu", "--conc", "1", "--window"], str(10 ** 9)),
        (["sweep", "tiny-ci-cpu", "--out", "{d}/s.jsonl", "--conc"], "100000"),
        (["sweep", "tiny-ci-cpu", "--out", "{d}/s.jsonl", "--conc", "1", "--steps"], str(10 ** 12)),
        (["sweep", "tiny-ci-cpu", "--out", "{d}/s.jsonl", "--conc", "1", "--workers"], str(10 ** 6)),
        (["trace", "gen", "--model", "moetier-tiny-ci-int8", "--out", "{d}/g.npz", "--tokens"], str(10 ** 12)),
        (["trace", "gen", "--model", "moetier-tiny-ci-int8", "--out", "{d}/g.npz", "--segments"], str(10 ** 9)),
        (["run", "tiny-ci-cpu", "--store", f"{s}/store", "--conc"], "100000"),
        (["run", "tiny-ci-cpu", "--store", f"{s}/store", "--conc", "1", "--steps"], str(10 ** 12)),
        (["bench", "--store", f"{s}/store", "--recipe", "tiny-ci-cpu", "--rounds"], str(10 ** 9)),
        (["bench", "--store", f"{s}/store", "--recipe", "tiny-ci-cpu", "--records"], str(10 ** 9)),
        (["calibrate", "tiny-ci-cpu", "--store", f"{s}/store", "--repeats"], str(10 ** 9)),
        (["compare", "tiny-ci-cpu", "--conc"], "100000"),
        (["plot", "timeline", "tiny-ci-cpu", "--out", "{d}/t.png", "--conc"], "100000"),
        (["plot", "cache", f"{s}/good.npz", "--out", "{d}/c.png", "--sizes"], str(10 ** 12)),
        (["trace", "stats", f"{s}/good.npz", "--cache-sizes"], str(10 ** 12)),
        (["trace", "fit", f"{s}/good.npz", "--sample-tokens"], str(10 ** 12)),
        (["probe", "record", "--out", "{d}/p.jsonl", "--duration", "1", "--interval"], "1e-9"),
        (["trace", "gen", "--model", "moetier-tiny-ci-int8", "--out", "{d}/g.npz", "--params"],
         '{"zipf_s": 1e308}'),
    ]
    for argv, v in huge:
        flag = argv[-1]
        add(Case("huge", f"{' '.join(argv[:2])} {flag} {v}", argv + [v], flag, either=True,
                 quick=flag in ("--conc", "--tokens") and argv[0] in ("sim", "trace")))

    # 10. bad probe files and plot inputs
    probes = {**JUNK, "only-junk-lines": "junk\njunk\n", "no-samples": json.dumps(
        {"kind": "header", "version": 1, "interval_s": 0.1}) + "\n",
        "huge-counters": json.dumps({"kind": "counters", "t": 1e308, "step": 1e308}) + "\n",
        "negative-interval": json.dumps({"kind": "header", "version": 1, "interval_s": -1}) + "\n"
        + json.dumps({"kind": "sample", "t": 1.1, "dt": 0.1, "cpu": [1.0]}) + "\n"}
    for pname, body in probes.items():
        add(Case("probe", f"probe report of {pname}", ["probe", "report", "{d}/p.jsonl"], "p.jsonl",
                 text("p.jsonl", body), quick=pname in ("deep", "only-junk-lines"),
                 reported="interval_s" if pname == "negative-interval" else ""))
    for path, label in [("/dev/zero", "/dev/zero"), (f"{s}/fifo", "fifo"), (f"{s}/a-dir", "a-dir")]:
        add(Case("probe", f"probe report of {label}", ["probe", "report", path], label))
        add(Case("probe", f"probe report --probe {label}", ["probe", "report", "tiny-local-cpu-runtime-2026-11-29",
                                                            "--probe", path], label))
    for kind in ("levers", "waterfall", "calibration", "compare"):
        bodies = {**JUNK, "nan-rows": '[{"policy": "a", "conc": 1, "tok_s": NaN}]',
                  "empty-list": "[]", "wrong-shape": '{"rows": 3}'}
        for bname, body in bodies.items():
            add(Case("plot", f"plot {kind} of {bname}", ["plot", kind, "{d}/in.json", "--out", "{d}/o.png"],
                     "in.json", text("in.json", body), quick=bname == "nan-rows" and kind == "compare"))

    # 11. bad stores
    for path, label in [("/dev/zero", "/dev/zero"), (f"{s}/a-file", "a-file"), (f"{s}/a-dir", "a-dir"),
                        (f"{s}/loop-a", "loop-a"), ("{d}/none", "none")]:
        add(Case("store", f"store verify {label}", ["store", "verify", path], label, quick=label == "a-dir"))
        add(Case("store", f"run --store {label}", ["run", "tiny-ci-cpu", "--store", path, "--steps", "2"], label))
    for mname, body in [("junk", "junk"), ("nan", '{"records": NaN}'), ("deep", DEEP), ("empty", "")]:
        def bad_manifest(d, body=body):
            shutil.copytree(os.path.join(d, "..", "shared", "store"), f"{d}/st", symlinks=True)
            with open(f"{d}/st/manifest.json", "w") as f:
                f.write(body)
        add(Case("store", f"store verify a manifest of {mname}", ["store", "verify", "{d}/st"], "manifest",
                 bad_manifest))
    return out


# ---- running one case -----------------------------------------------------------------------------------------------
def _limits():
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_BYTES, MEMORY_BYTES))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def _snapshot(d: str) -> set:
    seen = set()
    for root, dirs, files in os.walk(d):
        for n in dirs + files:
            seen.add(os.path.relpath(os.path.join(root, n), d))
    return seen


def run_case(case: Case, base: str, shared: str) -> dict:
    d = tempfile.mkdtemp(prefix="case-", dir=base)
    os.makedirs(f"{d}/reg", exist_ok=True)
    fill = lambda a: a.replace("{d}", d).replace("{s}", shared)  # noqa: E731
    if case.setup is not None:
        case.setup(d)
    before = _snapshot(d)
    argv = [fill(a) for a in case.argv]
    t0 = time.monotonic()
    p = subprocess.Popen([sys.executable, "-m", "moetier", "--quiet", *argv], cwd=d, env=child_env(d, case.env),
                         stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         preexec_fn=_limits, start_new_session=True)
    try:
        out, err = p.communicate(timeout=TIMEOUT_S)
        rc = p.returncode
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, err = p.communicate()
        rc = None
    wall = time.monotonic() - t0
    err = err.decode("utf-8", "replace")
    new = sorted(_snapshot(d) - before)
    kind = judge(case, rc, err, new, out.decode("utf-8", "replace"))
    shutil.rmtree(d, ignore_errors=True)
    return {"group": case.group, "case": case.name, "kind": kind, "rc": rc, "stderr": err[-600:], "new": new[:5],
            "s": round(wall, 2)}


def judge(case: Case, rc, err: str, new: list, out: str = "") -> str:
    if rc is None or rc in (-signal.SIGKILL, 137) or "MemoryError" in err:
        return "hang"
    if "Traceback" in err or rc not in (0, 2):
        return "traceback"
    if rc == 0 and case.either:
        return "good"                   # a bounded large value: it wrote what it was asked to
    if new:
        return "stray"
    if rc == 0:
        return "good" if case.reported and case.reported in out else "silent"
    lines = [ln for ln in err.splitlines() if ln.strip()]
    if len(lines) != 1 or not ONE_LINE.match(lines[0]) or case.names.lstrip("-").lower() not in lines[0].lower():
        return "noisy"
    return "good"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="the CI subset: every group, a few cases each")
    ap.add_argument("--jobs", type=int, default=2, help="cases run at once (default 2)")
    ap.add_argument("--only", default="", help="run the cases whose group or name holds this text")
    ap.add_argument("--json", metavar="FILE", help="write every outcome as JSON")
    ap.add_argument("--list", action="store_true", help="list the cases and exit")
    args = ap.parse_args(argv)
    todo = [c for c in cases() if (c.quick or not args.quick) and (args.only in c.group or args.only in c.name)]
    if args.list:
        for c in todo:
            print(f"{c.group:13} {c.name}")
        print(f"{len(todo)} cases")
        return 0
    base = tempfile.mkdtemp(prefix="moetier-bad-inputs-")
    try:
        shared = os.path.join(base, "shared")
        make_shared(shared)
        t0 = time.monotonic()
        with ThreadPoolExecutor(max(1, args.jobs)) as ex:
            rows = list(ex.map(lambda c: run_case(c, base, shared), todo))
    finally:
        shutil.rmtree(base, ignore_errors=True)
    totals = {k: sum(r["kind"] == k for r in rows) for k in KINDS}
    for r in rows:
        if r["kind"] != "good":
            tail = r["stderr"].strip().splitlines()[-1:] or [""]
            print(f"{r['kind']:9} [{r['group']}] {r['case']}: rc={r['rc']} {tail[0][:200]}"
                  + (f" new={r['new']}" if r["new"] else ""))
    print(f"{len(rows)} cases in {time.monotonic() - t0:.0f} s: "
          + ", ".join(f"{k} {v}" for k, v in totals.items()))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"totals": totals, "cases": rows}, f, indent=1)
    return 0 if totals["good"] == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
