"""The package's layers hold: the pure core imports nothing above it, and no modules import each other in a cycle.

Imports are read from each module's syntax tree (every ``import`` / ``from ... import`` anywhere in the file, function
bodies included), so a lazy import inside a function counts the same as one at the top.
"""
from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PKG = REPO / "moetier"

# the pure core: records, ledger, planner, channel, predictors, host-cache model, simulator, traces, expert math
CORE = ("moetier.core", "moetier.traces", "moetier.bytes.expert")
# what the core must never import: devices, the runtime, the CLI, calibration and the probe
FORBIDDEN = ("backends", "moetier.run", "moetier.cli", "moetier.measure", "moetier.measure.probe", "adapters",
             "conformance")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def all_modules() -> dict[str, Path]:
    """moetier's modules and the backends and conformance packages shipped beside it (adapters are engine glue,
    outside the layers)."""
    return {module_name(p): p for top in (PKG, REPO / "backends", REPO / "conformance")
            for p in sorted(top.rglob("*.py"))}


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


def test_no_import_cycles_between_modules():
    """moetier, backends and conformance: a backend imports the contract, never the other way round."""
    modules = all_modules()
    graph = {m: {i for i in imports_of(p, modules) if i in modules and i != m} for m, p in modules.items()}
    # a package's __init__ is imported on the way to each of its modules; it imports none of them back here
    graph = {m: {i for i in deps if not (m == i.rpartition(".")[0] and modules[m].name == "__init__.py")}
             for m, deps in graph.items()}
    assert not _cycles(graph), f"import cycles: {_cycles(graph)}"
