"""The README is true: its quick start works when pasted into a fresh shell after the two set-up commands, and its
figures are what the commands print.

Every quick-start line must name the venv's programs (``.venv/bin/...``: set-up does not activate the venv). The
cheap lines run here with this interpreter standing in for ``.venv/bin/python`` (and ``-m moetier`` for
``.venv/bin/moetier``); MOETIER_README_ALL=1 runs every line (minutes: the simulator on the default recipe; CI does),
MOETIER_README_WALK=1 the real-bytes walk in a registry of its own (tens of minutes: it packs a 1.6 GB store, benches
and calibrates; not in CI's budget).
The example table is ``moetier table``'s output (tools/readme_figures.py rewrites it), the counts beside it are the
table's, the timings are those benchmarks/fidelity-*.json recorded, and the walk benches before it runs anything.
"""
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tools"))
import readme_figures  # noqa: E402
CHEAP = ("doctor", "list", "show", "trace gen")


def readme() -> str:
    return (REPO / "README.md").read_text(encoding="utf-8")


def block(title: str, holding: str = "") -> list[str]:
    """The command lines of the first ```sh block of section ``title`` that holds ``holding``."""
    sec = readme().split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]
    body = next(b for b in re.findall(r"```sh\n(.*?)```", sec, re.S) if holding in b)
    return [ln for ln in body.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]


def argv(line: str) -> list[str]:
    words = shlex.split(line, comments=True)
    prog = {".venv/bin/moetier": [sys.executable, "-m", "moetier"], ".venv/bin/python": [sys.executable]}
    return prog[words[0]] + words[1:]


def test_setup_is_two_commands_and_ci_runs_them():
    setup = block("Set-up: two commands")
    assert len(setup) == 2 and setup[0].startswith("python3 -m venv .venv && .venv/bin/pip install -e")
    ci = (REPO / ".ci" / "run").read_text(encoding="utf-8")
    assert setup[1] in ci


def test_quick_start_lines_name_the_venv():
    lines = block("Quick start")
    assert len(lines) >= 8
    for ln in lines:
        assert ln.startswith((".venv/bin/moetier ", ".venv/bin/python ")), ln


QUICK = block("Quick start")


@pytest.mark.parametrize("line", QUICK, ids=[" ".join(shlex.split(q, comments=True)[1:3]) for q in QUICK])
def test_quick_start_line_runs(line):
    words = shlex.split(line, comments=True)
    if not os.environ.get("MOETIER_README_ALL") and not any(" ".join(words[1:]).startswith(c) for c in CHEAP):
        pytest.skip("an expensive line (the simulator on the default recipe): MOETIER_README_ALL=1 runs it")
    env = dict(os.environ, PYTHONPATH=str(REPO), MOETIER_QUIET="1")
    r = subprocess.run(argv(line), cwd=REPO, env=env, capture_output=True, text=True, timeout=1800)
    assert r.returncode == 0, (line, r.stderr[-2000:])
    assert r.stdout.strip(), line


def test_the_example_table_is_what_moetier_table_prints():
    shown = readme_figures.blocks(readme())
    assert [args for args, _ in shown] == ["table"]
    assert shown[0][1] == readme_figures.output("table"), \
        "README.md's table differs from `moetier table`: python tools/readme_figures.py rewrites it"


def test_the_counts_beside_the_table_are_the_tables():
    from moetier.core import records as spec
    text = readme()
    head = readme_figures.blocks(text)[0][1].splitlines()[0]
    m = re.match(r"recipe (\S+): vram ([\d,]+) / ram ([\d,]+) / nvme ([\d,]+) experts", head)
    rid, counts = m.group(1), [int(c.replace(",", "")) for c in m.groups()[1:]]
    R = spec.resolve(rid)
    assert sum(counts) == R.layers * R.experts
    prose = text.split("What each number means", 1)[1].split("\n- **conc**", 1)[0]
    assert f"how many of the {sum(counts):,} experts" in prose
    assert f"{counts[0]:,} VRAM slots, {counts[1]:,} fit in the" in prose and f"the other {counts[2]:,} are" in prose
    assert f"({R.layers} layers x {R.experts} experts, top-{R.topk}, {R.expert_bytes * R.keys / 1e9:.0f} GB of " \
        "experts)" in text


def test_the_walks_model_is_the_one_it_packs():
    from moetier.cli.doctor import store_bytes
    from moetier.core import records as spec
    R = spec.resolve("tiny-local-cpu")
    pack = next(ln for ln in WALK if " store pack " in ln)
    assert shlex.split(pack)[3] == R.model_id and f"# {store_bytes(R) / 1e9:.1f} GB store" in pack
    assert f"(the local tiny model: {R.layers} layers x {R.experts} experts, top-{R.topk}, int8)" in readme()


def fidelity_seconds(phases) -> list[float]:
    out = []
    for f in sorted((REPO / "benchmarks").glob("fidelity-*.json")):
        d = json.loads(f.read_text(encoding="utf-8"))
        out += [d[p]["seconds"] for p in phases if p in d]
    return out


def test_the_timings_are_the_recorded_ones():
    text = readme()
    m = re.search(r"`moetier bench` took (\d+)-(\d+) s and\s+`moetier calibrate --quick` (\d+)-(\d+) s", text)
    assert m, "README.md: the sentence with the bench's and the quick calibration's seconds is gone"
    bench, quick = fidelity_seconds(["bench"]), fidelity_seconds(["quick", "quick_again"])
    assert len(bench) >= 2 and len(quick) >= 2
    assert [int(g) for g in m.groups()] == [round(min(bench)), round(max(bench)), round(min(quick)), round(max(quick))]
    assert not re.search(r"~ ?\d+ ?(?:s|min|minutes|seconds)\b", text), "a guessed duration: state a measured one"


WALK = block("Quick start", holding="store pack")


def test_the_walk_benches_first_then_uses_the_bench_recipe():
    words = [shlex.split(ln, comments=True)[1:] for ln in WALK]
    bench = next(i for i, w in enumerate(words) if w[0] == "bench")
    recipe = words[bench][words[bench].index("--recipe") + 1] if "--recipe" in words[bench] else "tiny-local-cpu"
    used = [(i, w[1]) for i, w in enumerate(words) if w[0] in ("sim", "run", "calibrate")]
    assert len(used) >= 4
    for i, rid in used:
        assert i > bench and rid == f"{recipe}-bench", (WALK[i], "runs before the bench or not on its recipe")


def test_the_walk_runs():
    if not os.environ.get("MOETIER_README_WALK"):      # tens of minutes on a small machine: not in CI's budget
        pytest.skip("the real-bytes walk packs a 1.6 GB store, benches and calibrates: MOETIER_README_WALK=1 runs it")
    import tempfile
    with tempfile.TemporaryDirectory() as reg:
        env = dict(os.environ, PYTHONPATH=str(REPO), MOETIER_QUIET="1", MOETIER_REGISTRY=reg)
        for line in WALK:
            r = subprocess.run(argv(line), cwd=REPO, env=env, capture_output=True, text=True, timeout=3600)
            assert r.returncode == 0, (line, r.stderr[-2000:])
