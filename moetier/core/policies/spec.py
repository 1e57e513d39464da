"""A residency policy spec as a recipe writes it: ``name`` or ``name:key=value,key=value`` (``2q:a1=0.25,ghost=0.5``).

Contract: ``parse(spec, params) -> (name, values)`` where ``params`` maps each parameter the policy takes to
``(default, check, expected)``: ``check(value) -> bool`` and ``expected`` says in words what a value must be. An
unknown parameter, a repeated one, a value that is not a number or fails its check raises ValueError on one line
naming the policy, the parameter and what was expected (the caller prefixes the recipe field). ``positional``: the
parameter a bare ``name:VALUE`` sets (``dlfu:64``, the older form). Pure.
"""
from __future__ import annotations

__all__ = ["parse", "ratio", "share", "count", "flag"]


def ratio(v) -> bool:
    """A share of the tier strictly between 0 and 1."""
    return 0.0 < v < 1.0


def share(v) -> bool:
    """A share of the tier from 0 up to 4 (a ghost list may remember more keys than the tier holds)."""
    return 0.0 <= v <= 4.0


def count(v) -> bool:
    return v >= 1 and float(v).is_integer()


def flag(v) -> bool:
    return v in (0, 1)


def parse(spec: str, params: dict, positional: str | None = None) -> tuple[str, dict]:
    name, _, rest = str(spec).partition(":")
    values = {k: d for k, (d, _c, _e) in params.items()}
    seen: set = set()
    for item in filter(None, rest.split(",")) if rest else ():
        key, eq, raw = item.partition("=")
        key = key.strip()
        if not eq:
            if positional is None or seen:
                raise ValueError(f"{name}: expected key=value parameters, got {item!r}")
            key, raw = positional, item
        if key not in params:
            known = ", ".join(params) or "none"
            raise ValueError(f"{name}: unknown parameter {key!r} (expected: {known})")
        if key in seen:
            raise ValueError(f"{name}: parameter {key!r} given twice")
        try:
            v = float(raw)
        except ValueError:
            raise ValueError(f"{name}: {key}={raw!r} is not a number") from None
        _d, check, expected = params[key]
        if not check(v):
            raise ValueError(f"{name}: {key}={raw} out of range (expected {expected})")
        values[key] = v
        seen.add(key)
    return name, values
