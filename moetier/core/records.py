"""Records: the registry overlay, loading and writing, and resolve.

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
  Between the two, the registries other distributions ship (a backend package's CI recipe and engine record):
  each ``moetier.registries`` entry point names a callable returning a folder with the same layout
  (``package_registries``); the user registry overlays them and they overlay the shipped one.
  Every function takes ``root=None``, meaning that overlay; pass one folder with the same layout to use it alone.
  A recipe's ``trace`` path is relative to the folder above the registry that holds the recipe (``traces/`` beside
  ``registry/``), or to the current directory.
* Anything the user can get wrong raises ``moetier.errors.UserError`` with one line naming the file, the JSON path
  (``$.budget.ram_gb``) or the argument, and what was expected. Ids must match ``^[a-z0-9][a-z0-9._-]*$``, so an id
  can never leave ``registry/``.
* ``resolve(recipe_id, overrides)`` deep-copies the recipe, applies dotted overrides (``budget.ram_gb=55``;
  moetier.core.overrides), re-validates it (moetier.core.record_schema), checks that its model, hardware and engines
  exist and that its budget fits them (moetier.core.record_rules), and joins them into a ``Recipe``
  (moetier.core.recipe: capacities, lanes with their costs, link speeds, the policy with every default, calibration).
* ``write_record`` validates first and writes atomically (temporary file in the same folder, then ``os.replace``);
  it refuses to replace an existing record unless ``force=True`` (the CLI's ``--force``). ``write_records`` writes
  several records all or none; ``check_writable`` is the same check made before a command starts its work.
* Every number read from a record or an override is finite (``moetier.strictjson``): NaN, Infinity and numbers too
  large for a float are refused with the file or the override named; the schemas bound every numeric field.
* The names of the modules split out of this one (lanes, recipe, overrides, record_schema, record_rules) are
  importable from here too.
"""

from __future__ import annotations

import functools
import os
import re
from pathlib import Path

from moetier import strictjson
from moetier.atomic import atomic_write_many, cannot_write
from moetier.core import record_schema
from moetier.core.lanes import (BYTE_TERMS, LANE_CEILINGS, LANE_COSTS, LANE_OPTIONAL, LANE_SHAPE,
                                LANE_ZERO_IF_ABSENT, WAKE_SCALE_MS, Lane, deal, hands_off, idle_wake, lane_checks,
                                lane_terms)
from moetier.core.overrides import EXTENSIBLE, fmt_item, parse_overrides
from moetier.core.overrides import apply_overrides as _apply_overrides
from moetier.core.recipe import (DEFAULT_POLICY, DEFAULT_PREFETCH, HOST_TERMS, HOST_TIMED_TERMS,
                                 Recipe, join, ram_slots_for)
from moetier.core.record_rules import check_budget, check_refs
from moetier.core.record_schema import REMOVED_FIELDS, _SCHEMAS
from moetier.errors import UserError

__all__ = [
    # this module's: the overlay, loading, writing, resolve
    "REGISTRY", "KINDS", "ID_RE", "user_registry", "set_user_registry", "package_registries", "record_path",
    "is_shipped", "data_roots",
    "record_ids", "validate", "load_record", "load_all", "index", "check_writable", "write_record", "write_records",
    "apply_overrides", "resolve",
    # re-exported from the modules split out of it
    "Lane", "deal", "hands_off", "idle_wake", "lane_terms", "lane_checks", "LANE_COSTS", "LANE_SHAPE", "BYTE_TERMS",
    "LANE_OPTIONAL", "LANE_ZERO_IF_ABSENT", "LANE_CEILINGS", "WAKE_SCALE_MS", "Recipe", "ram_slots_for",
    "DEFAULT_POLICY", "DEFAULT_PREFETCH", "HOST_TERMS", "HOST_TIMED_TERMS", "EXTENSIBLE", "parse_overrides",
    "REMOVED_FIELDS", "_SCHEMAS",
]


def _shipped_registry() -> Path:
    """The shipped records: package data in an installed wheel, else the source checkout's registry/ folder."""
    from importlib import resources
    packaged = Path(str(resources.files("moetier"))) / "shipped" / "registry"
    return packaged if packaged.is_dir() else Path(__file__).resolve().parents[2] / "registry"


REGISTRY = _shipped_registry()
_USER_REGISTRY: Path | None = None      # --registry DIR
KINDS = ("model", "hardware", "engine", "recipe", "runs")
ID_RE = re.compile(r"^[a-z0-9][a-z0-9._-]*$")
PACKAGE_GROUP = "moetier.registries"

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


@functools.lru_cache(maxsize=1)
def package_registries() -> tuple:
    """The folders installed distributions ship records in: each ``moetier.registries`` entry point's callable
    returns one (read once per process; ``package_registries.cache_clear()`` reads them again). A target that does
    not load or names no folder is one UserError line naming the entry point."""
    from importlib import metadata
    out = []
    for ep in sorted(metadata.entry_points(group=PACKAGE_GROUP), key=lambda e: e.name):
        try:
            folder = Path(ep.load()())
        except Exception as e:  # a third party's code: whatever it raises becomes one line naming it
            raise UserError(f"entry point {PACKAGE_GROUP}:{ep.name} ({ep.value}): {type(e).__name__}: {e}") from None
        if not folder.is_dir():
            raise UserError(f"entry point {PACKAGE_GROUP}:{ep.name} ({ep.value}): {folder} is not a folder; "
                            "expected a registry folder (recipe/, engine/, ...)")
        out.append(folder)
    return tuple(out)


def _roots(root) -> list[Path]:
    """The registries to read, overlay first: ``root`` alone when given, else the user registry over the packages'
    over the shipped."""
    if root is not None:
        return [Path(root)]
    user = user_registry()
    same = user.is_dir() and user.resolve() == REGISTRY.resolve()
    return ([] if same else [user]) + list(package_registries()) + [REGISTRY]


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

def _validator(kind: str, root: Path):
    path = root / "schema" / f"{kind}.schema.json"
    if not path.is_file():  # a custom root without schemas falls back to the shipped ones
        path = REGISTRY / "schema" / f"{kind}.schema.json"
    return record_schema.compiled(kind, path, _show(path), _read_json)


def _schema(kind: str, root=None) -> dict:
    return _validator(kind, Path(root) if root is not None else REGISTRY).schema


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
    record_schema.check(_validator(kind, root), record, shown)


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
    check_refs(recipe, _show(path), lambda kind: set(known[kind]) if known is not None else set(_ids(kind, root)))


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


def apply_overrides(recipe: dict, overrides, schema: dict | None = None) -> dict:
    """Deep copy of ``recipe`` with dotted overrides applied (moetier.core.overrides), walked against the shipped
    recipe schema unless ``schema`` is given."""
    return _apply_overrides(recipe, overrides, schema if schema is not None else _schema("recipe"))


# --------------------------------------------------------------------------------------------------------------------
# resolve


def _with_overrides(base: dict, ovr: list, path: Path, recipe_id: str, schemas: Path) -> dict:
    """The recipe record with ``ovr`` applied, validated again; the record itself without any."""
    if not ovr:
        return base
    rec = _apply_overrides(base, ovr, _schema("recipe", schemas))
    items = " ".join(fmt_item(p, v) for p, v in ovr)
    _validate("recipe", rec, f"{_show(path)} (with --set {items})", schemas)
    if rec["id"] != recipe_id:
        raise UserError(f"--set id: the recipe id cannot be overridden ({rec['id']!r} != {recipe_id!r})")
    return rec


def resolve(recipe_id: str, overrides=(), root=None) -> Recipe:
    """Load recipe `recipe_id`, apply overrides ([(path, value)] or ["path=value"]), join its records."""
    schemas = Path(root) if root is not None else REGISTRY
    base = load_record("recipe", recipe_id, root)
    path = record_path("recipe", recipe_id, root)
    ovr = list(overrides or ())
    if ovr and all(isinstance(o, str) for o in ovr):
        ovr = parse_overrides(ovr)
    rec = _with_overrides(base, ovr, path, recipe_id, schemas)
    _check_refs(rec, path, _roots(root))
    model = load_record("model", rec["model"], root)
    hw = load_record("hardware", rec["hardware"], root)
    engines = [load_record("engine", e, root) for e in rec["engines"]]
    check_budget(rec, model, hw, f"{_show(path)}{' (with --set)' if ovr else ''}")
    return join(rec, model, hw, engines, _show(path))
