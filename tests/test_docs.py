"""The docs are references that tests keep true: what they name exists, and nothing in them is one machine's.

Scanned: README.md, docs/*.md and benchmarks/README.md. Every ``moetier.x.y`` they name imports (a module, or an
attribute of one; an entry-point group moetier reads counts; a quoted string such as a trace's source tag
or a format id is data, not a name); every repository path they name (``moetier/...``, ``benchmarks/...``,
``docs/...`` and the other top-level folders) exists; no path of a development machine (/work/, /home/, /root/,
/Users/, /mnt/) appears. benchmarks/README.md lists every script of benchmarks/ and names none that is gone, and
docs/fidelity.md's results table is what benchmarks/fidelity-*.json hold.
"""
import importlib
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = sorted([ROOT / "README.md", ROOT / "benchmarks" / "README.md", *(ROOT / "docs").glob("*.md")])
TOP = ("moetier", "backends", "conformance", "adapters", "benchmarks", "tests", "registry", "traces", "examples",
       "docs", "tools")

MODULE = re.compile(r"""(?<![\w./"'-])moetier(?:\.[a-z_][a-z0-9_]*)+(?![\w"'/-])""")
REPO_PATH = re.compile(r"(?<![\w./~-])(?:\.\./)?((?:" + "|".join(TOP) + r")/[\w./-]*\w)")
PLACEHOLDER = re.compile(r"[A-Z]{3,}")            # NAME, RECIPE-TIME: a path the reader fills in
INSTALLED_ONLY = {"moetier/shipped"}              # the shipped records' place in a wheel (pyproject.toml package-dir)
MACHINE_PATH = re.compile(r"(?<![\w.~-])/(?:work|home|root|Users|mnt)/")


def _text(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def entry_point_groups() -> set[str]:
    """The entry-point groups moetier reads (named like modules, but not modules)."""
    from moetier.core.records import PACKAGE_GROUP
    from moetier.run.registry import GROUP
    return {GROUP, PACKAGE_GROUP}


def resolves(name: str) -> bool:
    """Whether ``name`` is a module, or an attribute reached from the longest module prefix of it."""
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ModuleNotFoundError:
            continue
        for attr in parts[i:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


def module_names(text: str) -> set[str]:
    return set(MODULE.findall(text))


def repo_paths(text: str) -> list[str]:
    """The repository paths ``text`` names, less patterns (followed by *, <, {) and placeholders (NAME.py)."""
    return [m.group(1) for m in REPO_PATH.finditer(text)
            if text[m.end():m.end() + 2].lstrip("-.")[:1] not in ("*", "<", "{") and not PLACEHOLDER.search(m.group(1))
            and m.group(1) not in INSTALLED_ONLY]


def test_the_patterns_find_names_and_spare_data():
    text = ('`moetier.core.sim` replays; see moetier.bytes.store. A trace\'s meta.source = "moetier.tracegen", '
            'format "moetier.expert/1"; `moetier/core/plan.py` and [x](../benchmarks/bench_core.py); '
            "~/.local/share/moetier/registry and /work/shared/x.md and /home/u/y")
    assert module_names(text) == {"moetier.core.sim", "moetier.bytes.store"}
    assert repo_paths(text + " benchmarks/NAME.py tests/test_a_*.py docs/fidelity-<m>.md") == \
        ["moetier/core/plan.py", "benchmarks/bench_core.py"]
    assert len(MACHINE_PATH.findall(text)) == 2
    assert resolves("moetier.core.sim.run") and resolves("moetier.bytes")
    assert not resolves("moetier.spec") and not resolves("moetier.core.sim.no_such_thing")


@pytest.mark.parametrize("doc", DOCS, ids=[str(d.relative_to(ROOT)) for d in DOCS])
def test_every_module_named_imports(doc):
    groups = entry_point_groups()
    stale = sorted(n for n in module_names(_text(doc)) if n not in groups and not resolves(n))
    assert not stale, f"{doc.relative_to(ROOT)} names modules that do not import: {', '.join(stale)}"


@pytest.mark.parametrize("doc", DOCS, ids=[str(d.relative_to(ROOT)) for d in DOCS])
def test_every_repository_path_named_exists(doc):
    gone = sorted({p for p in repo_paths(_text(doc)) if not (ROOT / p.rstrip(".")).exists()})
    assert not gone, f"{doc.relative_to(ROOT)} names paths that do not exist: {', '.join(gone)}"


@pytest.mark.parametrize("doc", DOCS, ids=[str(d.relative_to(ROOT)) for d in DOCS])
def test_no_machine_paths(doc):
    hits = [f"{i}: {ln.strip()[:80]}" for i, ln in enumerate(_text(doc).splitlines(), 1) if MACHINE_PATH.search(ln)]
    assert not hits, f"{doc.relative_to(ROOT)} holds a development machine's path:\n" + "\n".join(hits)


def listed_scripts(text: str) -> set[str]:
    """The scripts benchmarks/README.md lists: the first cell of each table row, a name in backticks."""
    return set(re.findall(r"^\| `([\w.-]+\.(?:py|sh))` \|", text, re.M))


def test_benchmarks_readme_lists_every_script_and_only_those():
    bench = ROOT / "benchmarks"
    have = {p.name for p in bench.iterdir() if p.suffix in (".py", ".sh")}
    listed = listed_scripts(_text(bench / "README.md"))
    assert have - listed == set(), f"benchmarks/README.md does not list: {', '.join(sorted(have - listed))}"
    assert listed - have == set(), f"benchmarks/README.md lists missing scripts: {', '.join(sorted(listed - have))}"


def test_the_listing_pattern_reads_table_rows_only():
    text = "| `a.py` | cmd | x | y |\n| `b.sh` | c |\nnot a row `c.py`\n| script | command |\n"
    assert listed_scripts(text) == {"a.py", "b.sh"}


FIDELITY_PHASE = {"`moetier bench`": "bench", "`moetier calibrate --quick`": "quick",
                  "a second `--quick`, right after": "quick_again"}


def test_the_fidelity_table_is_the_fidelity_records():
    """docs/fidelity.md's results table, row by row, against benchmarks/fidelity-<machine>.json (bench_fidelity.py
    writes both the records and their .md)."""
    rows = re.findall(r"^\| ([\w-]+) \| (.+?) \| (\d+) \| ([\d.]+)% \| ([\d.]+)% \(([\w.-]+)\) \| (\d+) of (\d+) \|$",
                      _text(ROOT / "docs" / "fidelity.md"), re.M)
    assert len(rows) >= 4
    for machine, phase, sec, med, mx, arm, inside, arms in rows:
        rec = json.loads(_text(ROOT / "benchmarks" / f"fidelity-{machine}.json"))[FIDELITY_PHASE[phase]]
        s = rec["summary"]
        assert (int(sec), med, mx, arm, int(inside), int(arms)) == (
            round(rec["seconds"]), f"{s['median_abs_error_pct']:.1f}", f"{s['max_abs_error_pct']:.1f}", s["max_arm"],
            round(s["inside_share"] * s["arms"]), s["arms"]), (machine, phase)
