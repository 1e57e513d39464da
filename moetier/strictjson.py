"""Strict JSON in and out: every number finite, nesting bounded, output standard JSON.

Contract
--------
* ``loads(text, where)`` parses JSON text and raises ``UserError`` with one line naming ``where`` (a file, or an
  argument such as ``--set budget.ram_gb=NaN``) when the text is not JSON, holds ``NaN``/``Infinity``/``-Infinity``
  (Python's json module accepts them; the JSON standard does not), holds a number too large for a float (``1e999``
  would silently become infinity), or nests deeper than ``MAX_DEPTH`` arrays/objects (a record is a few levels deep;
  a deep one would only exhaust the validator's recursion).
* ``dumps(obj, **kw)`` is ``json.dumps`` with ``allow_nan=False``: a non-finite float raises ``ValueError`` instead
  of writing a ``NaN`` token no other JSON reader accepts; numpy scalars are written as their Python values.
* ``check_finite(obj, where)`` walks a parsed value and raises ``UserError`` at the first non-finite float (for
  values that came in some other way than ``loads``).
* ``read_text(path, where, max_bytes)`` reads a regular file of at most ``max_bytes`` as UTF-8 (a device or FIFO,
  which may never end, and a larger file are refused before anything is read into memory); ``load(path, where)`` is
  ``loads(read_text(...))``.
"""
from __future__ import annotations

import json
import math

from moetier.errors import UserError

MAX_DEPTH = 64
MAX_BYTES = 64 << 20        # records, configs and plot inputs are kilobytes; a bigger file is not one of them


class _NonFinite(ValueError):
    def __init__(self, token: str):
        super().__init__(token)
        self.token = token


def _constant(token: str):
    raise _NonFinite(token)


def _float(token: str) -> float:
    v = float(token)
    if not math.isfinite(v):
        raise _NonFinite(token)
    return v


def _line_of(text: str, token: str) -> str:
    i = text.find(token)
    return f" at line {text.count(chr(10), 0, i) + 1}" if i >= 0 and "\n" in text else ""


def loads(text, where: str):
    """Parse strict JSON; UserError "<where>: ..." on anything else (see the module contract)."""
    try:
        value = json.loads(text, parse_constant=_constant, parse_float=_float)
    except _NonFinite as e:
        raise UserError(f"{where}: {e.token} is not a finite number{_line_of(text, e.token)} "
                        f"(expected a finite JSON number)") from None
    except RecursionError:
        raise UserError(f"{where}: nested too deeply (expected at most {MAX_DEPTH} levels of arrays/objects)") \
            from None
    except json.JSONDecodeError as e:
        raise UserError(f"{where}: invalid JSON at line {e.lineno} column {e.colno}: {e.msg}") from None
    except ValueError as e:        # e.g. an integer literal longer than Python's int-from-text limit
        raise UserError(f"{where}: invalid JSON: {e}") from None
    if depth(value) > MAX_DEPTH:
        raise UserError(f"{where}: nested too deeply (expected at most {MAX_DEPTH} levels of arrays/objects)")
    return value


def depth(value) -> int:
    """Levels of arrays/objects in a parsed value (a scalar is 0), without recursion."""
    best, stack = 0, [(value, 0)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, dict):
            stack.extend((x, d + 1) for x in v.values())
            best = max(best, d + 1)
        elif isinstance(v, list):
            stack.extend((x, d + 1) for x in v)
            best = max(best, d + 1)
        if best > MAX_DEPTH:
            break
    return best


def check_finite(value, where: str) -> None:
    """UserError naming the JSON path of the first NaN or infinite float in ``value``."""
    stack = [(value, "$")]
    while stack:
        v, path = stack.pop()
        if isinstance(v, float) and not math.isfinite(v):
            raise UserError(f"{where}: {path}: {v} is not a finite number (expected a finite number)")
        if isinstance(v, dict):
            stack.extend((x, f"{path}.{k}") for k, x in v.items())
        elif isinstance(v, (list, tuple)):
            stack.extend((x, f"{path}[{i}]") for i, x in enumerate(v))


def _plain(x):
    try:
        import numpy as np
        if isinstance(x, np.generic):
            return x.item()
        if isinstance(x, np.ndarray):
            return x.tolist()
    except ImportError:
        pass
    raise TypeError(f"not JSON serialisable: {type(x).__name__}")


def dumps(obj, **kw) -> str:
    """json.dumps with allow_nan=False (standard JSON only) and numpy scalars as Python values."""
    kw.setdefault("default", _plain)
    return json.dumps(obj, allow_nan=False, **kw)


def read_text(path, where: str, max_bytes: int = MAX_BYTES) -> str:
    """The UTF-8 text of a regular file of at most ``max_bytes``; UserError naming ``where`` otherwise."""
    from moetier.bounded import open_regular
    try:
        with open_regular(path, where, max_bytes) as f:
            data = f.read(max_bytes + 1)
    except OSError as e:
        raise UserError(f"{where}: cannot read ({e.strerror or e})") from None
    if len(data) > max_bytes:       # grew while read
        raise UserError(f"{where}: larger than {max_bytes:,} bytes (expected a JSON file of at most that)")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UserError(f"{where}: not UTF-8 text ({e.reason} at byte {e.start})") from None


def load(path, where: str, max_bytes: int = MAX_BYTES):
    """Strict JSON from a bounded regular file (read_text, then loads)."""
    return loads(read_text(path, where, max_bytes), where)
