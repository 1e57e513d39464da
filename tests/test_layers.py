"""The package's layers hold: the pure core imports nothing above it, no modules import each other in a cycle, and
modules and functions stay small.

Imports are read from each module's syntax tree (every ``import`` / ``from ... import`` anywhere in the file, function
bodies included), so a lazy import inside a function counts the same as one at the top. Adapters, the conformance
suite and the template backend reach backends only through the registry. Size: no module in moetier/, backends/,
adapters/, conformance/ or examples/backend-template over 500 lines, no function over cyclomatic complexity 25 (radon, as
``radon cc`` counts it), except the open ones listed below, which may only shrink off the list.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PKG = REPO / "moetier"

# the pure core: records, ledger, planner, channel, predictors, host-cache model, simulator, traces, expert math
CORE = ("moetier.core", "moetier.traces", "moetier.bytes.expert")
# what the core must never import: devices, the runtime, the CLI, calibration and the probe
FORBIDDEN = ("backends", "moetier.run", "moetier.cli", "moetier.measure", "moetier.measure.probe", "adapters",
             "conformance")


TEMPLATE = REPO / "examples" / "backend-template"
# each package checked, with the folder its import names start from (the template is its own distribution)
PACKAGES = {PKG: REPO, REPO / "backends": REPO, REPO / "adapters": REPO, REPO / "conformance": REPO,
            TEMPLATE / "moetier_template": TEMPLATE}


def module_name(path: Path, base: Path = REPO) -> str:
    parts = list(path.relative_to(base).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def all_modules() -> dict[str, Path]:
    """moetier's modules, the backends, adapters and conformance packages shipped beside it, and the template
    backend's package."""
    return {module_name(p, base): p for top, base in PACKAGES.items() for p in sorted(top.rglob("*.py"))}


def imports_of(path: Path, modules: dict[str, Path] | None = None, name: str | None = None) -> set[str]:
    """Every module name ``path`` imports anywhere in its body. ``from pkg import name`` counts as ``pkg.name`` when
    that is a module (in ``modules``), else as ``pkg``; relative imports are resolved against the module's package."""
    modules = modules if modules is not None else all_modules()
    me = name or module_name(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                src = ".".join(base + ([node.module] if node.module else []))
            else:
                src = node.module or ""
            for a in node.names:
                sub = f"{src}.{a.name}"
                out.add(sub if sub in modules else src)
    return out


def _within(name: str, prefixes) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def test_imports_of_sees_function_local_and_relative_imports(tmp_path):
    """The checker itself: a lazy import inside a function and a relative import are both found."""
    f = tmp_path / "fake_core.py"
    f.write_text("import numpy\n\ndef g():\n    from moetier.run import runtime\n    from ..cli import main\n")
    got = imports_of(f, {"moetier.run.runtime": f, "moetier.cli.main": f}, name="moetier.core.fake_core")
    assert {"numpy", "moetier.run.runtime", "moetier.cli.main"} <= got


def test_core_imports_nothing_above_it():
    modules = all_modules()
    core = [m for m in modules if _within(m, CORE)]
    assert "moetier.core.plan" in core and "moetier.traces.format" in core and "moetier.bytes.expert" in core
    bad = {m: sorted(i for i in imports_of(modules[m], modules) if _within(i, FORBIDDEN)) for m in core}
    bad = {m: v for m, v in bad.items() if v}
    assert not bad, f"core modules import the layers above them: {bad}"


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index, low, onstack, stack, out = {}, {}, set(), [], []
    counter = [0]
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        onstack.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    onstack.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                elif w in onstack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    onstack.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def test_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_above_the_runtime_backends_are_reached_only_through_the_registry():
    """Adapters, the conformance suite and the template import no backend module: they get a backend (or a cpu
    kernel of one) from moetier.run.registry, as an outside package would."""
    modules = all_modules()
    users = [m for m in modules if _within(m, ("adapters", "conformance", "moetier_template"))]
    assert "adapters.engine_lanes" in users and "adapters.exl3xpu.ops" in users and "moetier_template.backend" in users
    bad = {m: sorted(i for i in imports_of(modules[m], modules) if _within(i, ("backends",))) for m in users}
    bad = {m: v for m, v in bad.items() if v}
    assert not bad, f"modules reach into backends/ past the registry: {bad}"


def test_the_template_imports_only_moetier_and_numpy():
    """The template is what an outsider copies: it may use moetier's layers, never the adapters or the suite."""
    modules = all_modules()
    tpl = [m for m in modules if _within(m, ("moetier_template",))]
    bad = {m: sorted(i for i in imports_of(modules[m], modules)
                     if not _within(i, ("moetier", "moetier_template", "numpy", "pathlib", "__future__")))
           for m in tpl}
    assert tpl and not any(bad.values()), f"the template imports outside moetier and numpy: {bad}"


def test_no_import_cycles_between_modules():
    """moetier, backends, adapters, conformance and the template: a backend imports the contract, never the other
    way round; adapters/exl3xpu's blob, ops and surface share their geometry through a leaf module."""
    modules = all_modules()
    graph = {m: {i for i in imports_of(p, modules) if i in modules and i != m} for m, p in modules.items()}
    # a package's __init__ is imported on the way to each of its modules; it imports none of them back here
    graph = {m: {i for i in deps if not (m == i.rpartition(".")[0] and modules[m].name == "__init__.py")}
             for m, deps in graph.items()}
    assert not _cycles(graph), f"import cycles: {_cycles(graph)}"


MAX_LINES, MAX_CC = 500, 25
SIZE_ROOTS = ("moetier", "backends", "adapters", "conformance", "examples/backend-template")
# Open: over the targets today, each at its size (lines) or complexity now. The lists only shrink: the test fails
# when one of them grows, when a module or function not listed goes over, and when a listed one is within the
# target (then delete its line).
OPEN_LINES: dict[str, int] = {}
OPEN_CC = {
}


def sizes(repo: Path = REPO) -> tuple[dict[str, int], dict[str, int]]:
    """({module path: lines}, {"path:Class.function": cyclomatic complexity}) of every module under SIZE_ROOTS."""
    from radon.complexity import cc_visit
    lines, cc = {}, {}
    for top in SIZE_ROOTS:
        for p in sorted((repo / top).rglob("*.py")):
            rel = p.relative_to(repo).as_posix()
            src = p.read_text(encoding="utf-8")
            lines[rel] = len(src.splitlines())
            for block in cc_visit(src):
                if not hasattr(block, "methods"):          # functions and methods (a class is not a function)
                    name = f"{rel}:{block.fullname}"
                    cc[name] = max(cc.get(name, 0), block.complexity)
    return lines, cc


def _over(measured: dict, limit: int, open_: dict, what: str) -> list[str]:
    bad = [f"{k}: {v} {what} (target {limit}; not on the open list)" for k, v in sorted(measured.items())
           if v > limit and k not in open_]
    for k, was in sorted(open_.items()):
        now = measured.get(k)
        if now is None or now <= limit:
            bad.append(f"{k}: {now if now is not None else 'gone'} {what}, within the target: delete it from the "
                       "open list")
        elif now > was:
            bad.append(f"{k}: {now} {what}, grew from {was} on the open list")
    return bad


def test_modules_and_functions_within_size_targets():
    pytest.importorskip("radon", reason="radon (the `test` extra) counts cyclomatic complexity: "
                                        "pip install 'moetier[test]'")
    lines, cc = sizes()
    assert "moetier/core/plan.py" in lines and cc
    bad = _over(lines, MAX_LINES, OPEN_LINES, "lines") + _over(cc, MAX_CC, OPEN_CC, "complexity")
    assert not bad, "size targets:\n" + "\n".join(bad)


def test_size_check_flags_growth_new_entries_and_stale_exceptions():
    """The checker itself, on made-up figures: a new module over, a listed one that grew, one now within."""
    measured = {"a.py": 600, "b.py": 700, "c.py": 400, "d.py": 650}
    bad = _over(measured, 500, {"b.py": 650, "c.py": 520, "d.py": 650}, "lines")
    assert [b.split(":")[0] for b in bad] == ["a.py", "b.py", "c.py"]
    assert "grew from 650" in bad[1] and "delete it" in bad[2]
