"""Schema validation of records: one line naming the file, the JSON path and what was expected.

Contract
--------
``compiled(kind, path, shown, load)`` is the Draft 2020-12 validator of the schema file ``path`` (read with ``load``,
checked as a schema, cached by path and modification time); ``check(validator, record, shown)`` raises
``moetier.errors.UserError`` "SHOWN: $.json.path: what was expected" for the most specific error of ``record``, or
returns. A field of a term the model no longer has (``REMOVED_FIELDS``) is named as such, not as an unknown field.
Which schema applies to which record (the registry's, else the shipped one) is moetier.core.records' to decide.
"""
from __future__ import annotations

import json
from pathlib import Path

from moetier.errors import UserError

# record fields of terms the model no longer has (removing each left the calibration figures within the records'
# own drift: docs/calibration.md); an engine or recipe record that still carries one is refused, naming it
REMOVED_FIELDS = ("per_step_row_ms", "copy_ms_by_rows", "copy_record_bytes", "nvme_latency_prefetch_factor_by_rows",
                  "nvme_prefetch_ms_by_rows", "nvme_prefetch_share_ms_by_rows", "nvme_prefetch_sd_ms_by_rows",
                  "nvme_latency_by_rows_burst_pf_ms")

_SCHEMAS: dict[tuple[str, int], object] = {}


def compiled(kind: str, path: Path, shown: str, load):
    """The validator of the ``kind`` schema at ``path`` (``shown`` in messages; ``load(path)`` reads its JSON),
    cached."""
    import jsonschema  # deferred: keeps `import moetier.core.records` cheap

    try:
        key = (str(path.resolve()), path.stat().st_mtime_ns)
    except OSError as e:
        raise UserError(f"{shown}: the {kind} schema cannot be read ({e.strerror}); expected the schema file shipped "
                        f"with moetier (reinstall it)") from None
    v = _SCHEMAS.get(key)
    if v is None:
        schema = load(path)
        try:
            jsonschema.Draft202012Validator.check_schema(schema)
        except jsonschema.exceptions.SchemaError as e:
            raise UserError(f"{shown}: not a valid JSON Schema ({e.message})") from None
        v = jsonschema.Draft202012Validator(schema)
        _SCHEMAS[key] = v
    return v


def check(validator, record, shown: str) -> None:
    """Raise UserError "shown: $.json.path: what was expected" for ``record``'s most specific error, if any."""
    import jsonschema

    errors = list(validator.iter_errors(record))
    if not errors:
        return
    err = jsonschema.exceptions.best_match(errors)
    # descend into combinators to the most specific failure
    while err.context:
        err = jsonschema.exceptions.best_match(err.context)
    jp, what = describe(err)
    if "propertyNames" in err.absolute_schema_path and err.validator != "propertyNames":
        what = f"bad key: {what}"
    raise UserError(f"{shown}: {jp}: {what}")


def short(value, limit: int = 60) -> str:
    """A value as messages show it, cut to ``limit`` characters."""
    s = repr(value) if not isinstance(value, (dict, list)) else json.dumps(value)
    return s if len(s) <= limit else s[: limit - 3] + "..."


def _jp(parts) -> str:
    out = "$"
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else f".{p}"
    return out


_BOUNDS = {"minimum": ">=", "exclusiveMinimum": ">", "maximum": "<=", "exclusiveMaximum": "<"}


def _extra_field(err, where, inst) -> tuple[str, str]:
    known = list(err.schema.get("properties", {}))
    extra = [k for k in inst if k not in known]
    name = extra[0] if extra else "?"
    if name in REMOVED_FIELDS:
        return _jp(where + [name]), "a term the model no longer has (it did not earn its place: docs/calibration.md); " \
                                    "delete the field"
    hint = f" (known: {', '.join(known)})" if known else ""
    return _jp(where + [name]), f"unknown field{hint}"


def describe(err) -> tuple[str, str]:
    """(json path, what was expected) for one jsonschema error."""
    where = list(err.absolute_path)
    v, inst, val = err.validator, err.instance, err.validator_value
    if v == "type":
        types = " or ".join(val) if isinstance(val, list) else val
        return _jp(where), f"expected {types}, got {short(inst)}"
    if v == "required":
        missing = [k for k in val if isinstance(inst, dict) and k not in inst]
        return _jp(where + [missing[0] if missing else "?"]), "required field is missing"
    if v == "additionalProperties" and isinstance(inst, dict):
        return _extra_field(err, where, inst)
    if v == "enum":
        return _jp(where), f"expected one of {', '.join(map(repr, val))}, got {short(inst)}"
    if v == "const":
        return _jp(where), f"expected {val!r}, got {short(inst)}"
    if v in _BOUNDS:
        return _jp(where), f"expected a number {_BOUNDS[v]} {val}, got {short(inst)}"
    if v == "pattern":
        return _jp(where), f"expected a string matching {val}, got {short(inst)}"
    if v == "propertyNames":
        return _jp(where), f"bad key: {err.message}"
    if v == "not" and isinstance(err.schema, dict) and "description" in err.schema:
        # a refusal's own words beat jsonschema's dump of the schema it matched
        return _jp(where), f"{err.schema['description']}, got {short(inst)}"
    if v in ("minItems", "minProperties", "minLength"):
        return _jp(where), f"must not be empty ({v} {val})"
    return _jp(where), err.message
