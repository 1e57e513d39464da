"""Overrides: dotted ``path=value`` edits of a recipe (``--set budget.ram_gb=55``), walked against its schema.

Contract
--------
``parse_overrides(["a.b=1", "c=x"])`` -> [("a.b", 1), ("c", "x")]: the value is JSON when it parses (strictly:
finite numbers, bounded nesting), else the raw string; a malformed item is a UserError naming it.
``apply_overrides(recipe, overrides, schema)`` returns a deep copy of ``recipe`` with each override applied (a dict
value replaces the sub-dict). An override may only walk known paths: keys in the record or declared by the
recipe ``schema``; the sub-dicts in ``EXTENSIBLE`` may gain new keys. The result is not validated here
(moetier.core.records.resolve validates it).
"""
from __future__ import annotations

import copy
import json

from moetier import strictjson
from moetier.core.record_schema import short
from moetier.errors import UserError

# Sub-dicts of a recipe that an override may extend with new keys.
EXTENSIBLE = ("lane_overrides", "tiers", "calibration.fixed_ms")


def parse_overrides(items) -> list[tuple[str, object]]:
    """["a.b=1", "c=x"] -> [("a.b", 1), ("c", "x")]; the value is JSON when it parses, else the raw string."""
    out = []
    for item in items or ():
        if not isinstance(item, str) or "=" not in item:
            raise UserError(f"--set {item}: expected dotted.path=value")
        key, _, raw = item.partition("=")
        key = key.strip()
        parts = key.split(".")
        if not key or any(not p for p in parts):
            raise UserError(f"--set {item}: empty path (expected dotted.path=value)")
        try:
            json.loads(raw)
            is_json = True
        except RecursionError:
            is_json = True
        except ValueError:
            is_json = False
        # JSON values are parsed strictly (finite numbers, bounded nesting); anything else is the raw string
        value = strictjson.loads(raw, f"--set {item}") if is_json else raw
        out.append((key, value))
    return out


def _sub_schema(node: dict | None, key: str, schema: dict) -> dict | None:
    if not isinstance(node, dict):
        return None
    if "$ref" in node and node["$ref"].startswith("#/$defs/"):
        node = schema.get("$defs", {}).get(node["$ref"].split("/")[-1], {})
    props = node.get("properties", {})
    if key in props:
        return props[key]
    extra = node.get("additionalProperties")
    return extra if isinstance(extra, dict) else None


def _schema_keys(node: dict | None) -> list[str]:
    return list(node.get("properties", {})) if isinstance(node, dict) else []


def fmt_item(path: str, value) -> str:
    """One override as the user wrote it (path=value)."""
    return f"{path}={value if isinstance(value, str) else json.dumps(value)}"


def apply_overrides(recipe: dict, overrides, schema: dict) -> dict:
    """Deep copy of ``recipe`` with dotted overrides applied (see the module docstring)."""
    out = copy.deepcopy(recipe)
    for path, value in overrides:
        item = fmt_item(path, value)
        parts = path.split(".")
        cur, node = out, schema
        for i, key in enumerate(parts):
            here = ".".join(parts[:i])
            if not isinstance(cur, dict):
                raise UserError(f"--set {item}: {here!r} is {short(cur)}, not an object, so it has no key {key!r}")
            known = _schema_keys(node) + [k for k in cur if k not in _schema_keys(node)]
            if key not in known and here not in EXTENSIBLE:
                where = f" at {here!r}" if here else ""
                raise UserError(f"--set {item}: unknown path {'.'.join(parts[:i + 1])!r} "
                                f"(known keys{where}: {', '.join(known) or 'none'})")
            node = _sub_schema(node, key, schema)
            if i == len(parts) - 1:
                cur[key] = copy.deepcopy(value)
            else:
                if key not in cur or cur[key] is None:
                    cur[key] = {}
                cur = cur[key]
    return out
