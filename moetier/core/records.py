"""Records: load, validate, index, override and resolve.

Contract
--------
* Records are JSON files under ``registry/<kind>/<id>.json`` for kind in ``KINDS``; each kind has a JSON Schema
  (draft 2020-12) at ``registry/schema/<kind>.schema.json``. A record's ``id`` equals its file stem. There is no
  hand-kept index: ``index()`` is derived from the files every time.
* Two registries, one overlaid on the other. ``REGISTRY`` holds the shipped records and schemas: package data read
  through importlib.resources (``moetier/shipped/registry`` in an installed wheel; the repository's ``registry/``
  folder in a source checkout), never written. ``user_registry()`` holds what the tools write (bench, calibrate and
  run records): ``--registry DIR`` (``set_user_registry``), else ``$MOETIER_REGISTRY``, else
  ``$XDG_DATA_HOME/moetier/registry`` (``~/.local/share/moetier/registry``). Reads look in the user registry first,
  so a record written there overlays a shipped one of the same id; writes go to the user registry only.
  Every function takes ``root=None``, meaning that overlay; pass one folder with the same layout to use it alone.
  A recipe's ``trace`` path is relative to the folder above the registry that holds the recipe (``traces/`` beside
  ``registry/``), or to the current directory.
* Anything the user can get wrong raises ``moetier.errors.UserError`` with one line naming the file, the JSON path
  (``$.budget.ram_gb``) or the argument, and what was expected. Ids must match ``^[a-z0-9][a-z0-9._-]*$``, so an id
  can never leave ``registry/``.
* ``resolve(recipe_id, overrides)`` deep-copies the recipe, applies dotted overrides (``budget.ram_gb=55``; a dict
  value replaces the sub-dict), re-validates it, checks that its model, hardware and engines exist, and joins them
  into a ``Recipe``: capacities (VRAM/RAM slots), lanes with their costs, link speeds, the policy with every default
  filled in, and calibration. Overrides may only walk known paths (keys in the record or declared by the schema);
  the sub-dicts ``lane_overrides``, ``tiers`` and ``calibration.fixed_ms`` may gain new keys.
* Capacity: ``ram_slots = clamp(floor((ram_gb - runtime_gb - other_gb) * 1e9 / ram_expert_bytes), 0, keys)``,
  computed in decimal arithmetic on the numbers as written (48.2e9 / 9,474,048 floors to 5,087);
  ``vram_slots = budget.vram_expert_slots`` (clamped to ``keys``).
* Lanes: engine lanes in ``engines[]`` order (a later engine overwrites a lane of the same name), then each engine's
  ``model_lanes[<model id>]`` costs for lanes that exist, then the recipe's ``lane_overrides`` (the lane must exist).
* ``write_record`` validates first and writes atomically (temporary file in the same folder, then ``os.replace``);
  it refuses to replace an existing record unless ``force=True`` (the CLI's ``--force``). ``write_records`` writes
  several records all or none; ``check_writable`` is the same check made before a command starts its work.
* Every number read from a record or an override is finite (``moetier.strictjson``): NaN, Infinity and numbers too
  large for a float are refused with the file or the override named; the schemas bound every numeric field.
"""

from __future__ import annotations

import copy
import json
import math
import os
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from decimal import Decimal, ROUND_FLOOR
from pathlib import Path

from moetier.atomic import atomic_write_many, cannot_write
from moetier.errors import UserError
from moetier import strictjson



def _shipped_registry() -> Path:
    """The shipped records: package data in an installed wheel, else the source checkout's registry/ folder."""
    from importlib import resources
    packaged = Path(str(resources.files("moetier"))) / "shipped" / "registry"
    return packaged if packaged.is_dir() else Path(__file__).resolve().parents[2] / "registry"


REGISTRY = _shipped_registry()
_USER_REGISTRY: Path | None = None      # --registry DIR
KINDS = ("model", "hardware", "engine", "recipe", "runs")
ID_RE = re.compile(r"^[a-z0-9][a-z0-9._-]*$")

# Sub-dicts of a recipe that an override may extend with new keys.
EXTENSIBLE = ("lane_overrides", "tiers", "calibration.fixed_ms")

DEFAULT_PREFETCH = {"depth": 0, "recall": 0.0, "predictor": "recall", "budget": 8}
DEFAULT_POLICY = {
    "vram": "clock",
    "ram": "exclusive",
    "ram_evict": "lru",
    "seed": "warmup",
    "warmup_tokens": 1000,
    "exact": "stall",
    "overlap": True,
}
LANE_COSTS = ("per_layer_ms", "per_expert_ms", "per_extra_token_ms", "per_call_ms")
LANE_SHAPE = ("workers", "parallel_min")     # integers: how a batch call is executed
BYTE_TERMS = ("per_expert_ms", "per_extra_token_ms")   # terms that stream an expert's weights: scale with its bytes
# lane terms a record may leave out (absent: another record's figure, or 0), and those whose absence means 0
LANE_OPTIONAL = ("per_read_ms", "per_read_busy_ms", "per_wake_ms", "per_after_wait_ms", "per_handoff_ms")
LANE_ZERO_IF_ABSENT = ("per_read_busy_ms", "per_wake_ms", "per_after_wait_ms", "per_handoff_ms")
# record fields of terms the model no longer has (removing each left the calibration figures within the records'
# own drift: docs/calibration.md); an engine or recipe record that still carries one is refused, naming it
REMOVED_FIELDS = ("per_step_row_ms", "copy_ms_by_rows", "copy_record_bytes", "nvme_latency_prefetch_factor_by_rows",
                  "nvme_prefetch_ms_by_rows", "nvme_prefetch_share_ms_by_rows", "nvme_prefetch_sd_ms_by_rows",
                  "nvme_latency_by_rows_burst_pf_ms")
# the recipe's calibration.host time terms outside its head start: the timed host work's (moetier.measure.fit.fit_host's
# columns, in order), then the part of the time outside the runtime's timers per zerocopy call (fit_fixed)
HOST_TIMED_TERMS = ("per_layer_ms", "per_pick_ms", "per_read_ms", "per_nvme_layer_ms", "per_predict_ms",
                    "per_predict_row_ms", "per_copy_ms")
HOST_TERMS = HOST_TIMED_TERMS + ("per_zc_call_ms",)
WAKE_SCALE_MS = 0.1       # idle_wake: the idle that counts as one unit (below it a worker is still warm)


def idle_wake(idle_ms: float) -> float:
    """How cold a split call's worker has gone, in the units the cpu lane's ``per_wake_ms`` is paid in: log2(1 +
    idle / 0.1 ms), idle = the time since the lane's last split call ended. A worker thread that idled longer wakes
    slower and colder (on a VM its vCPU halts after its poll window; its core's caches go to others): a 4-expert
    split call with the worker idle under 0.1 ms took 0.33-0.36 ms, after 1.6-3.2 ms 0.40-0.48 ms, and growing
    roughly by a constant per doubling of the idle (benchmarks/bench_cpu_call_warmth.py measures it)."""
    return math.log2(1.0 + idle_ms / WAKE_SCALE_MS) if idle_ms > 0.0 else 0.0


# --------------------------------------------------------------------------------------------------------------------
# paths, ids, reading


def user_registry() -> Path:
    """Where the tools write records: --registry, else $MOETIER_REGISTRY, else the per-user data directory."""
    if _USER_REGISTRY is not None:
        return _USER_REGISTRY
    env = os.environ.get("MOETIER_REGISTRY")
    if env:
        return Path(env).expanduser()
    data = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(data) / "moetier" / "registry"


def set_user_registry(path):
    """Point the user registry at ``path`` (``--registry DIR``); None restores the default. Returns the previous
    setting, for the caller to restore."""
    global _USER_REGISTRY
    prev, _USER_REGISTRY = _USER_REGISTRY, (Path(path).expanduser() if path is not None else None)
    return prev


def _roots(root) -> list[Path]:
    """The registries to read, overlay first: ``root`` alone when given, else the user registry over the shipped."""
    if root is not None:
        return [Path(root)]
    user = user_registry()
    same = user.is_dir() and user.resolve() == REGISTRY.resolve()
    return [REGISTRY] if same else [user, REGISTRY]


def _root(root) -> Path:
    """The registry a write goes to (and whose schemas apply): ``root`` when given, else the user registry."""
    return Path(root) if root is not None else user_registry()


def record_path(kind: str, rid: str, root=None) -> Path:
    """The file that holds record ``rid`` (the overlay's, else the shipped one); UserError naming the known ids."""
    _check_kind(kind)
    roots = _roots(root)
    for r in roots:
        path = _check_id(kind, rid, r)
        if path.is_file():
            return path
    known = _ids(kind, roots)
    raise UserError(f"unknown {kind} id {rid!r} (known: {', '.join(known) if known else 'none'})")


def is_shipped(kind: str, rid: str) -> bool:
    """Whether ``rid`` names a shipped record of ``kind`` (one a user-registry record of that id would overlay)."""
    _check_kind(kind)
    return isinstance(rid, str) and bool(ID_RE.match(rid)) and (REGISTRY / kind / f"{rid}.json").is_file()


def data_roots(root=None) -> list[Path]:
    """The folders a recipe's relative paths (its trace) resolve against: the parents of the registries read."""
    return [r.parent for r in _roots(root)]


def _show(path: Path) -> str:
    """Path as shown in messages: relative to the repository when inside it, else as given."""
    p = Path(path)
    try:
        return str(p.resolve().relative_to(REGISTRY.parent))
    except ValueError:
        return str(p)


def _check_kind(kind) -> None:
    if kind not in KINDS:
        raise UserError(f"kind: unknown record kind {kind!r} (known: {', '.join(KINDS)})")


def _check_id(kind: str, rid, root: Path) -> Path:
    if not isinstance(rid, str) or not ID_RE.match(rid):
        raise UserError(
            f"{kind} id {rid!r}: not a valid record id (expected a plain name matching ^[a-z0-9][a-z0-9._-]*$; "
            f"no '/', '\\', '..' or absolute paths)")
    folder = (root / kind).resolve()
    path = (folder / f"{rid}.json").resolve()
    if path.parent != folder:  # belt and braces: the pattern above already forbids this
        raise UserError(f"{kind} id {rid!r}: resolves outside {_show(root / kind)}/")
    return root / kind / f"{rid}.json"


def _ids(kind: str, roots) -> list[str]:
    roots = [roots] if isinstance(roots, Path) else roots
    return sorted({p.stem for r in roots if (r / kind).is_dir() for p in (r / kind).glob("*.json")})


def record_ids(kind: str, root=None) -> list[str]:
    """The ids of the records of one kind (the user registry's and the shipped ones)."""
    _check_kind(kind)
    return _ids(kind, _roots(root))


def _read_json(path: Path):
    shown = _show(path)
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise UserError(f"{shown}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    except OSError as e:
        raise UserError(f"{shown}: cannot read ({e.strerror})") from None
    return strictjson.loads(text, shown)


# --------------------------------------------------------------------------------------------------------------------
# schema validation

_SCHEMAS: dict[tuple[str, int], object] = {}


def _validator(kind: str, root: Path):
    import jsonschema  # deferred: keeps `import moetier.core.records` cheap

    path = root / "schema" / f"{kind}.schema.json"
    if not path.is_file():  # a custom root without schemas falls back to the shipped ones
        path = REGISTRY / "schema" / f"{kind}.schema.json"
    try:
        key = (str(path.resolve()), path.stat().st_mtime_ns)
    except OSError as e:
        raise UserError(f"{_show(path)}: the {kind} schema cannot be read ({e.strerror}); "
                        f"expected the schema file shipped with moetier (reinstall it)") from None
    v = _SCHEMAS.get(key)
    if v is None:
        schema = _read_json(path)
        try:
            jsonschema.Draft202012Validator.check_schema(schema)
        except jsonschema.exceptions.SchemaError as e:
            raise UserError(f"{_show(path)}: not a valid JSON Schema ({e.message})") from None
        v = jsonschema.Draft202012Validator(schema)
        _SCHEMAS[key] = v
    return v


def _schema(kind: str, root=None) -> dict:
    return _validator(kind, Path(root) if root is not None else REGISTRY).schema


def _short(value, limit: int = 60) -> str:
    s = repr(value) if not isinstance(value, (dict, list)) else json.dumps(value)
    return s if len(s) <= limit else s[: limit - 3] + "..."


def _jp(parts) -> str:
    out = "$"
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else f".{p}"
    return out


def _describe(err) -> tuple[str, str]:
    """(json path, what was expected) for one jsonschema error."""
    where = list(err.absolute_path)
    v, inst, val = err.validator, err.instance, err.validator_value
    if v == "type":
        types = " or ".join(val) if isinstance(val, list) else val
        return _jp(where), f"expected {types}, got {_short(inst)}"
    if v == "required":
        missing = [k for k in val if isinstance(inst, dict) and k not in inst]
        name = missing[0] if missing else "?"
        return _jp(where + [name]), "required field is missing"
    if v == "additionalProperties" and isinstance(inst, dict):
        known = list(err.schema.get("properties", {}))
        extra = [k for k in inst if k not in known]
        name = extra[0] if extra else "?"
        if name in REMOVED_FIELDS:
            return _jp(where + [name]), ("a term the model no longer has (it did not earn its place: "
                                         "docs/calibration.md); delete the field")
        hint = f" (known: {', '.join(known)})" if known else ""
        return _jp(where + [name]), f"unknown field{hint}"
    if v == "enum":
        return _jp(where), f"expected one of {', '.join(map(repr, val))}, got {_short(inst)}"
    if v == "const":
        return _jp(where), f"expected {val!r}, got {_short(inst)}"
    if v in ("minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum"):
        op = {"minimum": ">=", "exclusiveMinimum": ">", "maximum": "<=", "exclusiveMaximum": "<"}[v]
        return _jp(where), f"expected a number {op} {val}, got {_short(inst)}"
    if v == "pattern":
        return _jp(where), f"expected a string matching {val}, got {_short(inst)}"
    if v == "propertyNames":
        return _jp(where), f"bad key: {err.message}"
    if v in ("minItems", "minProperties", "minLength"):
        return _jp(where), f"must not be empty ({v} {val})"
    return _jp(where), err.message


def validate(kind: str, record, path) -> None:
    """Check one record against its kind's schema; raise UserError "path: $.json.path: what was expected"."""
    _check_kind(kind)
    root = REGISTRY
    p = Path(path)
    # a record under <root>/<kind>/ is checked against <root>/schema/
    if p.parent.name == kind and (p.parent.parent / "schema").is_dir():
        root = p.parent.parent
    _validate(kind, record, _show(p) if isinstance(path, Path) else str(path), root)


def _validate(kind: str, record, shown: str, root: Path) -> None:
    import jsonschema

    errors = list(_validator(kind, root).iter_errors(record))
    if not errors:
        return
    err = jsonschema.exceptions.best_match(errors)
    # descend into combinators to the most specific failure
    while err.context:
        err = jsonschema.exceptions.best_match(err.context)
    jp, what = _describe(err)
    if "propertyNames" in err.absolute_schema_path and err.validator != "propertyNames":
        what = f"bad key: {what}"
    raise UserError(f"{shown}: {jp}: {what}")


def _check_record(kind: str, record, path: Path, expect_id: str | None) -> None:
    validate(kind, record, path)
    if expect_id is not None and record["id"] != expect_id:
        raise UserError(f"{_show(path)}: $.id: id {record['id']!r} must equal the file name {expect_id!r}")


# --------------------------------------------------------------------------------------------------------------------
# loading


def load_record(kind: str, rid: str, root=None) -> dict:
    """Load and validate registry/<kind>/<rid>.json."""
    path = record_path(kind, rid, root)
    record = _read_json(path)
    _check_record(kind, record, path, rid)
    return record


def load_all(root=None) -> dict[str, dict[str, dict]]:
    """{kind: {id: record}} for every *.json of every kind, each validated; recipe references are checked."""
    roots = _roots(root)
    out: dict[str, dict[str, dict]] = {}
    where: dict[str, Path] = {}
    for kind in KINDS:
        out[kind] = {}
        for rid in _ids(kind, roots):
            path = next(r / kind / f"{rid}.json" for r in roots if (r / kind / f"{rid}.json").is_file())
            where[rid] = path
            if not ID_RE.match(rid):
                raise UserError(f"{_show(path)}: file name is not a valid record id (expected ^[a-z0-9][a-z0-9._-]*$)")
            record = _read_json(path)
            _check_record(kind, record, path, rid)
            out[kind][rid] = record
    for rid, rec in out["recipe"].items():
        _check_refs(rec, where[rid], roots, known=out)
    return out


def index(root=None) -> dict:
    """Derived index: {kind: sorted ids, "recipes": [{id, status, model, hardware}]}."""
    allrec = load_all(root)
    out: dict = {kind: sorted(allrec[kind]) for kind in KINDS}
    out["recipes"] = [
        {"id": rid, "status": rec["status"], "model": rec["model"], "hardware": rec["hardware"]}
        for rid, rec in sorted(allrec["recipe"].items())
    ]
    return out


def _check_refs(recipe: dict, path: Path, root, known=None) -> None:
    def ids(kind):
        return set(known[kind]) if known is not None else set(_ids(kind, root))

    for field_, kind in (("model", "model"), ("hardware", "hardware")):
        if recipe[field_] not in ids(kind):
            raise UserError(f"{_show(path)}: $.{field_}: unknown {kind} id {recipe[field_]!r} "
                            f"(known: {', '.join(sorted(ids(kind))) or 'none'})")
    engines = ids("engine")
    for i, eid in enumerate(recipe["engines"]):
        if eid not in engines:
            raise UserError(f"{_show(path)}: $.engines[{i}]: unknown engine id {eid!r} "
                            f"(known: {', '.join(sorted(engines)) or 'none'})")


def check_writable(kind: str, rid, root=None, *, force: bool = False) -> Path:
    """Before any work: ``rid`` is a valid id, an existing record of that id is replaced only with ``force``, and
    the folder can be written. Returns the record's path; UserError naming the id and what to do otherwise."""
    _check_kind(kind)
    r = _root(root)
    path = _check_id(kind, rid, r)
    if path.exists() and not force:
        raise UserError(f"{_show(path)}: a {kind} record {rid!r} exists; not replacing it (pass --force to replace "
                        f"it, or give another id)")
    why = cannot_write(path.parent)
    if why:
        raise UserError(f"{_show(path.parent)}: cannot write {kind} records there ({why}); expected a writable "
                        f"registry folder")
    return path


def write_record(kind: str, record: dict, root=None, *, force: bool = False) -> Path:
    """Validate, then atomically write <user registry>/<kind>/<id>.json (or under ``root``); returns the path. An
    existing record is replaced only with ``force`` (no record is replaced silently). The shipped registry is never
    written: a record of a shipped id written to the user registry overlays it."""
    return write_records([(kind, record)], root, force=force)[0]


def write_records(items, root=None, *, force: bool = False) -> list[Path]:
    """Validate every (kind, record), then write them all or none (moetier.atomic.atomic_write_many)."""
    r = _root(root)
    staged = []
    batch: dict = {}          # a recipe may name a record written beside it
    for kind, record in items:
        batch.setdefault(kind, set()).add(record.get("id") if isinstance(record, dict) else None)
    for kind, record in items:
        _check_kind(kind)
        rid = record.get("id") if isinstance(record, dict) else None
        path = _check_id(kind, rid, r)
        validate(kind, record, path)
        if kind == "recipe":
            _check_refs(record, path, _roots(root),
                        {k: set(_ids(k, _roots(root))) | batch.get(k, set()) for k in ("model", "hardware", "engine")})
        if path.exists() and not force:
            raise UserError(f"{_show(path)}: a {kind} record {rid!r} exists; not replacing it (pass --force to "
                            f"replace it, or give another id)")
        text = strictjson.dumps(record, indent=2, ensure_ascii=False) + "\n"
        staged.append((path, lambda f, b=text.encode("utf-8"): f.write(b)))
    try:
        return atomic_write_many(staged)
    except OSError as e:
        where = _show(Path(e.filename)) if e.filename else _show(staged[0][0].parent)
        raise UserError(f"{where}: cannot write the record ({e.strerror or e}); nothing was written") from None


# --------------------------------------------------------------------------------------------------------------------
# overrides


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


def _fmt_item(path: str, value) -> str:
    return f"{path}={value if isinstance(value, str) else json.dumps(value)}"


def apply_overrides(recipe: dict, overrides, schema: dict | None = None) -> dict:
    """Deep copy of `recipe` with dotted overrides applied (see module docstring)."""
    schema = schema if schema is not None else _schema("recipe")
    out = copy.deepcopy(recipe)
    for path, value in overrides:
        item = _fmt_item(path, value)
        parts = path.split(".")
        cur, node = out, schema
        for i, key in enumerate(parts):
            here = ".".join(parts[:i])
            if not isinstance(cur, dict):
                raise UserError(f"--set {item}: {here!r} is {_short(cur)}, not an object, so it has no key {key!r}")
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


# --------------------------------------------------------------------------------------------------------------------
# resolved recipe


def deal(items, workers: int) -> list:
    """How a split cpu-lane call deals its batch out (backends/cpu/lane.py runs it, moetier.core.plan and Lane.cost
    model it): thread i takes items i, i + w, i + 2w, ... for w = min(workers, len(items)); share 0 is the calling
    thread's and the longest."""
    w = max(1, min(workers, len(items)))
    return [items[i::w] for i in range(w)]


def lane_terms(spec: dict, expert_bytes: int, ram_expert_bytes: int) -> dict:
    """An engine lane's terms for a model of ``expert_bytes`` per expert: per_expert_ms and per_extra_token_ms scaled
    by expert_bytes / the lane's measured ``expert_bytes``, when the engine records it (an expert's cost is streaming
    its weights; per-layer and per-call terms are dispatch and stay). A recipe whose RAM tier holds another form of the
    expert (tiers.ram_expert_bytes) gives its ram lanes' costs in lane_overrides; the lane's ``expert_bytes`` is what
    it reads (the tier's), which is what its implied GB/s is of."""
    out = {"reads": spec["reads"], **{c: float(spec.get(c, 0.0)) for c in LANE_COSTS},
           **{c: int(spec[c]) for c in LANE_SHAPE if c in spec},
           **{c: float(spec[c]) for c in LANE_OPTIONAL if c in spec},
           "expert_bytes": int(ram_expert_bytes if spec["reads"] == "ram" else expert_bytes),
           "measured_bytes": spec.get("expert_bytes")}
    if out["measured_bytes"]:
        for c in BYTE_TERMS:
            out[c] *= expert_bytes / out["measured_bytes"]
    return out


# what each lane reads its expert bytes through, as (hardware record fields tried in order, what it is)
LANE_CEILINGS = {
    "cpu": ((("ceilings", "ddr_practical_gbps"), ("ceilings", "ddr_theoretical_gbps")), "memory read bandwidth"),
    "gpu": ((("gpu", "vram_bw_gbps"), ("ceilings", "vram_bw_gbps")), "VRAM bandwidth"),
    "zerocopy": ((("ceilings", "pcie_h2d_gbps"), ("gpu", "h2d_gbps")), "host-to-device link"),
}


def _hw_value(hw: dict, paths) -> tuple[float | None, str]:
    for a, b in paths:
        v = (hw.get(a) or {}).get(b)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0:
            return float(v), f"{a}.{b}"
    return None, ""


def lane_checks(R) -> list[dict]:
    """Each lane's implied GB/s (expert bytes / per_expert_ms) against what the hardware record allows it (the
    cpu lane: memory bandwidth; gpu: VRAM bandwidth; zerocopy: the host-to-device link), and the NVMe figures against
    the device's read ceiling (nvme.bw_gbps against ceilings.nvme_read_gbps). ``over`` marks a figure the hardware cannot deliver."""
    out = []
    for name, ln in R.lanes.items():
        paths, what = LANE_CEILINGS.get(name, ((), ""))
        cap, field_ = _hw_value(R.hardware, paths)
        out.append({"lane": name, "gbps": ln.gbps, "ceiling_gbps": cap, "ceiling": field_, "what": what,
                    "over": None not in (cap, ln.gbps) and ln.gbps > cap})
    cap, field_ = _hw_value(R.hardware, (("ceilings", "nvme_read_gbps"),))
    out.append({"lane": "nvme", "gbps": R.nvme_bw_gbps, "ceiling_gbps": cap, "ceiling": field_,
                "what": "NVMe device read ceiling", "over": cap is not None and R.nvme_bw_gbps > cap})
    return out


def hands_off(n: int, workers: int) -> bool:
    """Whether a split call of ``n`` experts ends with a worker's share (``deal``): a worker takes as many experts
    as the calling thread unless n leaves the caller the only one with an extra (n % workers == 1). Its share starts
    a hand-off later than the caller's (the submit and its wake-up), so such a call pays the lane's
    ``per_handoff_ms``; one whose caller has an expert more ends with the caller's share (a 7-expert call over two
    threads ran 0.15-0.22 ms shorter than an 8-expert one; benchmarks/cpu_lane_residuals.py)."""
    return workers > 1 and n % workers != 1


@dataclass(frozen=True)
class Lane:
    """A place an expert can be computed; costs in ms."""

    name: str
    reads: str  # "vram" or "ram"
    per_layer_ms: float
    per_expert_ms: float
    per_extra_token_ms: float = 0.0
    per_call_ms: float = 0.0      # an inline (one-thread) call: NVMe picks computed one by one as they land
    workers: int = 1              # a batch of >= parallel_min experts is split over this many threads
    parallel_min: int = 0
    # cpu lane: what one NVMe read of the layer costs it (cores and cache shared with the reader), fitted in situ by
    # `moetier calibrate`; None: the hardware's nvme.cpu_ms_per_read / cores (moetier.core.terms._read_cpu)
    per_read_ms: float | None = None
    # gpu / zerocopy lanes: what a call pays once when any NVMe read of its layer is in flight, beside per_read_ms
    # per read (a device on the host's cores loses about one core to the reader's threads, however many reads)
    per_read_busy_ms: float | None = None
    # cpu lane: what a split call pays per unit of its worker's idle (idle_wake), fitted by `moetier calibrate`
    per_wake_ms: float | None = None
    # cpu lane: what an inline call made right after the host blocked on its pick's read pays beyond per_call_ms
    # (the core slept through the read; its caches went to the reader), fitted by `moetier calibrate`
    per_after_wait_ms: float | None = None
    # cpu lane: what a split call pays when it ends with a worker's share (hands_off), fitted by `moetier calibrate`
    per_handoff_ms: float | None = None
    # bytes of one expert as this lane reads it (its tier's: moe.expert_bytes for vram lanes, tiers.ram_expert_bytes
    # for ram lanes), and those of the model the engine's per-expert terms were measured on (engine lane
    # "expert_bytes"; None: not recorded, so not rescaled); see lane_terms
    expert_bytes: int = field(default=0, compare=False)
    measured_bytes: int | None = field(default=None, compare=False)

    @property
    def gbps(self) -> float | None:
        """The expert bytes this lane's per_expert_ms implies per second, GB/s (None for a zero cost)."""
        return self.expert_bytes / (self.per_expert_ms * 1e6) if self.per_expert_ms > 0 else None

    def cost(self, rows) -> float:
        """One call over experts with these token rows (a sequence, or a mapping key -> rows): inline below
        parallel_min, else split heaviest first, strided over the workers, ending with the longest share (as
        moetier.core.plan deals a batch)."""
        if isinstance(rows, Mapping):
            rows = rows.values()
        work = sorted((self.per_expert_ms + self.per_extra_token_ms * (m - 1) for m in rows), reverse=True)
        if not work:
            return 0.0
        if len(work) < self.parallel_min:
            return self.per_call_ms + sum(work)
        return (self.per_layer_ms + max(sum(share) for share in deal(work, self.workers))
                + (self.per_handoff_ms or 0.0) * hands_off(len(work), self.workers))


@dataclass
class Recipe:
    id: str
    model_id: str
    hardware_id: str
    layers: int
    experts: int
    topk: int
    expert_bytes: int
    ram_expert_bytes: int
    nvme_expert_bytes: int
    vram_slots: int
    ram_slots: int
    lanes: dict[str, Lane]
    h2d_gbps: float
    nvme_bw_gbps: float
    nvme_bw_qd1_gbps: float
    nvme_latency_ms: float
    policy: dict
    fixed_ms: dict[int, float]
    prefill: dict
    trace: str | None
    raw: dict
    model: dict = field(repr=False)
    hardware: dict = field(repr=False)
    engines: list[dict] = field(repr=False)
    host: dict = field(default_factory=lambda: {"per_layer_ms": 0.0, "per_pick_ms": 0.0})

    @property
    def keys(self) -> int:
        return self.layers * self.experts

    @property
    def nvme_only(self) -> int:
        return max(0, self.keys - self.vram_slots - self.ram_slots)

    def fixed(self, ntok: float) -> float:
        """Non-MoE ms per step at `ntok` rows: piecewise-linear over fixed_ms, flat below, extrapolated above."""
        pts = sorted(self.fixed_ms.items())
        if len(pts) == 1 or ntok <= pts[0][0]:
            return float(pts[0][1])
        for (x0, y0), (x1, y1) in zip(pts, pts[1:]):
            if ntok <= x1:
                return float(y0 + (y1 - y0) * (ntok - x0) / (x1 - x0))
        (x0, y0), (x1, y1) = pts[-2], pts[-1]
        return float(y1 + (y1 - y0) * (ntok - x1) / (x1 - x0))

    def summary(self) -> dict:
        return {
            "recipe": self.id,
            "model": self.model_id,
            "hardware": self.hardware_id,
            "engines": [e["id"] for e in self.engines],
            "keys": self.keys,
            "vram_slots": self.vram_slots,
            "ram_slots": self.ram_slots,
            "nvme_only": self.nvme_only,
            "expert_bytes": self.expert_bytes,
            "ram_expert_bytes": self.ram_expert_bytes,
            "nvme_expert_bytes": self.nvme_expert_bytes,
            "lanes": {name: asdict(lane) for name, lane in self.lanes.items()},
            "lane_checks": lane_checks(self),
            "policy": copy.deepcopy(self.policy),
            "fixed_ms": dict(self.fixed_ms),
            "prefill": dict(self.prefill),
            "trace": self.trace,
        }


def _dec(x) -> Decimal:
    return Decimal(repr(float(x))) if not isinstance(x, int) else Decimal(x)


def ram_slots_for(ram_gb, runtime_gb, other_gb, expert_bytes: int, keys: int) -> int:
    """floor((ram_gb - runtime_gb - other_gb) * 1e9 / expert_bytes), clamped to [0, keys], in decimal arithmetic."""
    avail = (_dec(ram_gb) - _dec(runtime_gb) - _dec(other_gb)) * Decimal(10) ** 9
    n = int((avail / Decimal(int(expert_bytes))).to_integral_value(rounding=ROUND_FLOOR))
    return max(0, min(n, keys))


def _policy(p: dict) -> dict:
    out = copy.deepcopy(DEFAULT_POLICY)
    out.update(copy.deepcopy(p))
    pf = dict(DEFAULT_PREFETCH)
    pf.update(p.get("prefetch") or {})
    out["prefetch"] = pf
    return out


def _check_budget(rec: dict, model: dict, hw: dict, shown: str) -> None:
    """Cross-field rules a schema cannot state: the budget fits the hardware. One line names both fields. (Reserves
    above the RAM cap are allowed: they leave no RAM slots, a what-if the capacity tests use.)"""
    b = rec["budget"]
    gpu = hw.get("gpu") or {}
    slots, eb = int(b["vram_expert_slots"]), int(model["moe"]["expert_bytes"])
    if slots and "vram_gb" in gpu and slots * eb > gpu["vram_gb"] * 1e9:
        raise UserError(f"{shown}: $.budget.vram_expert_slots ({slots} x {eb:,} B = {slots * eb / 1e9:.2f} GB) "
                        f"exceeds hardware {hw['id']} $.gpu.vram_gb ({gpu['vram_gb']} GB); expected slots that fit "
                        f"the device")


def resolve(recipe_id: str, overrides=(), root=None) -> Recipe:
    """Load recipe `recipe_id`, apply overrides ([(path, value)] or ["path=value"]), join its records."""
    r = Path(root) if root is not None else REGISTRY     # schemas
    base = load_record("recipe", recipe_id, root)
    path = record_path("recipe", recipe_id, root)
    ovr = list(overrides or ())
    if ovr and all(isinstance(o, str) for o in ovr):
        ovr = parse_overrides(ovr)
    rec = apply_overrides(base, ovr, _schema("recipe", r)) if ovr else base
    if ovr:
        items = " ".join(_fmt_item(p, v) for p, v in ovr)
        _validate("recipe", rec, f"{_show(path)} (with --set {items})", r)
        if rec["id"] != recipe_id:
            raise UserError(f"--set id: the recipe id cannot be overridden ({rec['id']!r} != {recipe_id!r})")
    _check_refs(rec, path, _roots(root))
    model = load_record("model", rec["model"], root)
    hw = load_record("hardware", rec["hardware"], root)
    engines = [load_record("engine", e, root) for e in rec["engines"]]
    _check_budget(rec, model, hw, f"{_show(path)}{' (with --set)' if ovr else ''}")

    moe = model["moe"]
    layers, experts = int(moe["layers"]), int(moe["experts"])
    keys = layers * experts
    expert_bytes = int(moe["expert_bytes"])
    tiers = rec.get("tiers") or {}
    ram_b = int(tiers.get("ram_expert_bytes", expert_bytes))
    nvme_b = int(tiers.get("nvme_expert_bytes", expert_bytes))
    b = rec["budget"]
    ram_slots = ram_slots_for(b["ram_gb"], b["runtime_gb"], b["other_gb"], ram_b, keys)
    vram_slots = max(0, min(int(b["vram_expert_slots"]), keys))

    lanes: dict[str, dict] = {}
    for eng in engines:
        for name, spec in eng["lanes"].items():
            lanes[name] = lane_terms(spec, expert_bytes, ram_b)
    for eng in engines:
        for name, costs in (eng.get("model_lanes") or {}).get(model["id"], {}).items():
            if name in lanes:
                lanes[name].update({c: float(costs[c]) for c in LANE_COSTS + LANE_OPTIONAL if c in costs})
                lanes[name].update({c: int(costs[c]) for c in LANE_SHAPE if c in costs})
    for name, costs in (rec.get("lane_overrides") or {}).items():
        if name not in lanes:
            raise UserError(f"{_show(path)}: $.lane_overrides.{name}: unknown lane {name!r} "
                            f"(lanes: {', '.join(lanes) or 'none'})")
        lanes[name].update({c: float(costs[c]) for c in LANE_COSTS + LANE_OPTIONAL if c in costs})
        lanes[name].update({c: int(costs[c]) for c in LANE_SHAPE if c in costs})

    nv = hw["nvme"]
    cal = rec["calibration"]
    return Recipe(
        id=rec["id"],
        model_id=model["id"],
        hardware_id=hw["id"],
        layers=layers,
        experts=experts,
        topk=int(moe["topk"]),
        expert_bytes=expert_bytes,
        ram_expert_bytes=ram_b,
        nvme_expert_bytes=nvme_b,
        vram_slots=vram_slots,
        ram_slots=ram_slots,
        lanes={n: Lane(name=n, **spec) for n, spec in lanes.items()},
        h2d_gbps=float((hw.get("gpu") or {}).get("h2d_gbps", 0.0)),
        nvme_bw_gbps=float(nv["bw_gbps"]),
        nvme_bw_qd1_gbps=float(nv.get("bw_qd1_gbps", nv["bw_gbps"])),
        nvme_latency_ms=float(nv.get("latency_ms", 0.1)),
        policy=_policy(rec["policy"]),
        fixed_ms={int(k): float(v) for k, v in cal["fixed_ms"].items()},
        prefill={"chunk": int(cal["prefill"]["chunk"]),
                 "compute_ms_per_layer": float(cal["prefill"]["compute_ms_per_layer"]),
                 "first_request_ms": float(cal["prefill"]["first_request_ms"])},
        trace=rec.get("trace"),
        host={**{k: float(cal.get("host", {}).get(k, 0.0))
                 for k in HOST_TERMS + ("head_per_layer_ms", "head_per_read_ms", "head_per_predict_ms",
                                        "head_per_predict_row_ms")},
              # submitting a read is the backend's work: the engine's own figure, where calibrated, wins
              **({"head_per_read_ms": float(engines[-1]["head_per_read_ms"])}
                 if "head_per_read_ms" in engines[-1] else {})},
        raw=rec,
        model=model,
        hardware=hw,
        engines=engines,
    )
