"""The hook surface of an engine: what an adapter needs to find in the installed engine, and the comparison.

Contract
--------
A surface is a dict ``{dotted name: description}``. A description is one of

* ``{"kind": "class", "bases": [base class names]}``
* ``{"kind": "callable", "params": [parameter, ...]}`` where a parameter is its name, ``*name`` for var-positional,
  ``**name`` for var-keyword, ``name=`` when it has a default (the default itself is not compared), and a
  keyword-only one is preceded by ``*`` when there is no var-positional parameter
* ``{"kind": "fields", "fields": [name, ...]}`` for a dataclass (the fields the adapter reads must be present)
* ``{"kind": "present"}`` for anything that only has to exist
* ``{"kind": "missing", "why": text}`` (only in a found surface)

``found_surface(names)`` describes what the imported engine has under those names; ``check_surface(expected,
found)`` returns one line per mismatch, in the expected order, each naming the class / method / parameter. No
mismatch: an empty list. The engine is imported by the caller (an adapter knows how to import its engine).
``installed_version(dist)`` is a distribution's version (None when not installed); ``SurfaceMismatch`` is what an
adapter's ``require`` raises (str(): the first mismatch, one line). ``Report`` is what an adapter's check returns: the engine version, the expected and found surfaces, the mismatch
lines, ``ok``.
"""
from __future__ import annotations

import dataclasses
import importlib
import importlib.metadata
import inspect


def _param(p: inspect.Parameter) -> str:
    if p.kind is p.VAR_POSITIONAL:
        return "*" + p.name
    if p.kind is p.VAR_KEYWORD:
        return "**" + p.name
    return p.name + ("=" if p.default is not p.empty else "")


def describe(obj, kind: str) -> dict:
    """The description of ``obj`` as ``kind`` (the kind the expected surface asks for)."""
    if kind == "class":
        if not inspect.isclass(obj):
            return {"kind": "missing", "why": f"not a class ({type(obj).__name__})"}
        return {"kind": "class", "bases": [b.__name__ for b in obj.__bases__]}
    if kind == "fields":
        if not dataclasses.is_dataclass(obj):
            return {"kind": "missing", "why": "not a dataclass"}
        return {"kind": "fields", "fields": [f.name for f in dataclasses.fields(obj)]}
    if kind == "callable":
        try:
            sig = inspect.signature(obj)
        except (TypeError, ValueError) as e:
            return {"kind": "missing", "why": f"no signature ({e})"}
        out, star = [], False
        for p in sig.parameters.values():
            if p.kind is p.VAR_POSITIONAL:
                star = True
            if p.kind is p.KEYWORD_ONLY and not star:
                out.append("*")
                star = True
            out.append(_param(p))
        return {"kind": "callable", "params": out}
    return {"kind": "present"}


def resolve(dotted: str):
    """The object at ``dotted`` (module path, then attributes); LookupError naming the first part not found."""
    parts = dotted.split(".")
    obj, i = None, len(parts)
    while i > 0:
        try:
            obj = importlib.import_module(".".join(parts[:i]))
            break
        except ModuleNotFoundError:
            i -= 1
    if obj is None:
        raise LookupError(f"module {parts[0]!r} not importable")
    for j in range(i, len(parts)):
        if not hasattr(obj, parts[j]):
            raise LookupError(f"{'.'.join(parts[:j])} has no attribute {parts[j]!r}")
        obj = getattr(obj, parts[j])
    return obj


def found_surface(expected: dict) -> dict:
    """Describe, for every name of ``expected``, what the importable engine has there (as the kind expected)."""
    found = {}
    for name, want in expected.items():
        try:
            obj = resolve(name)
        except LookupError as e:
            found[name] = {"kind": "missing", "why": str(e)}
            continue
        found[name] = describe(obj, want["kind"])
    return found


def _short(name: str) -> str:
    """Class.method for a dotted name (module paths make the line long and say nothing new)."""
    parts = name.split(".")
    keep = [p for p in parts if p[:1].isupper() or p.startswith("__")]
    start = parts.index(keep[0]) if keep else len(parts) - 1
    return ".".join(parts[start:])


def _param_diff(name: str, exp: list, got: list) -> str:
    bare = lambda p: p.lstrip("*").rstrip("=")  # noqa: E731
    eb, gb = [bare(p) for p in exp], [bare(p) for p in got]
    sig = f"(expected ({', '.join(exp)}), found ({', '.join(got)}))"
    for p in eb:
        if p and p not in gb:
            return f"{_short(name)}: parameter {p!r} missing {sig}"
    for p in gb:
        if p and p not in eb and not got[gb.index(p)].endswith("=") and not got[gb.index(p)].startswith("*"):
            return f"{_short(name)}: new required parameter {p!r} {sig}"
    common = [p for p in eb if p in gb]
    if common != [p for p in gb if p in eb]:
        moved = next(a for a, b in zip(common, [p for p in gb if p in eb]) if a != b)
        return f"{_short(name)}: parameter {moved!r} moved {sig}"
    for e, g in zip(exp, got):
        if bare(e) == bare(g) and e != g:
            return f"{_short(name)}: parameter {bare(e)!r} changed kind or default ({e} -> {g}) {sig}"
    return ""


def check_surface(expected: dict, found: dict) -> list[str]:
    """One line per mismatch between the expected and the found surface (empty: they agree). Extra parameters with
    defaults and extra fields or bases are not mismatches: adapters call with the parameters they know."""
    lines = []
    for name, want in expected.items():
        got = found.get(name) or {"kind": "missing", "why": "not looked up"}
        if got["kind"] == "missing":
            lines.append(f"{_short(name)}: missing ({got.get('why', '')}) [{name}]")
        elif want["kind"] == "class":
            lost = [b for b in want["bases"] if b not in got["bases"]]
            if lost:
                lines.append(f"{_short(name)}: base class {lost[0]!r} missing (found bases {got['bases']})")
        elif want["kind"] == "fields":
            lost = [f for f in want["fields"] if f not in got["fields"]]
            if lost:
                lines.append(f"{_short(name)}: field {lost[0]!r} missing")
        elif want["kind"] == "callable":
            diff = _param_diff(name, want["params"], got["params"])
            if diff:
                lines.append(diff)
    return lines


class SurfaceMismatch(RuntimeError):
    """The engine (or op table) does not offer the surface the adapter expects; str() is one line naming it."""


def installed_version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


@dataclasses.dataclass
class Report:
    version: str | None
    expected: dict
    found: dict = dataclasses.field(default_factory=dict)
    mismatches: list = dataclasses.field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.mismatches
