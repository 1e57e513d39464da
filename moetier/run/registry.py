"""Backend discovery: backends register under the ``moetier.backends`` entry-point group.

Contract
--------
A distribution adds a backend by declaring, in its own pyproject.toml::

    [project.entry-points."moetier.backends"]
    mydev = "mypkg.backend:MyBackend"

where the target is a callable ``(store, *, ram_slots, vram_slots=0, **options) -> Backend``
(moetier.run.contract) that raises ``BackendUnavailable`` with a one-line reason when its runtime or device is
missing. ``options`` are moetier's ``contract.OPTIONS`` (``verify_rate``, ``faults``): each is passed only when the
callable's signature names it (or takes ``**kwargs``); one it does not take is dropped at its "not asked for" value
and refused (BackendUnavailable naming it) at any other. The constructed backend goes through ``contract.check``:
a required verb missing is one ContractError line, a missing optional verb gets its default. moetier's own cpu, sycl and cuda backends are registered the same way (pyproject.toml); a source
checkout that is not installed has no entry points, so the three built-ins are also known by their targets here.
An installed entry point of the same name wins over a built-in.

``names()`` lists every known name, ``get_backend(name, store, ...)`` constructs one; an unknown name raises
``BackendUnavailable`` naming the known ones.
"""
from __future__ import annotations

import importlib
import inspect
from importlib import metadata

from moetier.run import contract
from moetier.run.contract import BackendUnavailable

GROUP = "moetier.backends"
BUILTIN = {"cpu": "backends.cpu.backend:CpuBackend", "sycl": "backends.sycl.backend:SyclBackend",
           "cuda": "backends.cuda.backend:CudaBackend"}


def _entry_points() -> dict:
    """name -> entry point, of every installed distribution (read each call: a test may install one meanwhile)."""
    return {ep.name: ep for ep in metadata.entry_points(group=GROUP)}


def names() -> tuple:
    return tuple(sorted(set(BUILTIN) | set(_entry_points())))


def _load(target: str):
    mod, _, attr = target.partition(":")
    obj = importlib.import_module(mod)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def factory(name: str):
    """The registered callable for ``name``; BackendUnavailable for an unknown name or one that fails to import."""
    ep = _entry_points().get(name)
    if ep is None and name not in BUILTIN:
        raise BackendUnavailable(f"--backend {name!r}: unknown backend (known: {', '.join(names())})")
    try:
        return ep.load() if ep is not None else _load(BUILTIN[name])
    except ImportError as e:
        raise BackendUnavailable(f"--backend {name!r}: its module does not import ({e})") from None


def accepted(fn, name: str, options: dict) -> dict:
    """The options ``fn`` takes (by its signature); BackendUnavailable for one it does not take set to a value."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):      # a callable without a signature: pass what is asked for
        return dict(options)
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return dict(options)
    out = {}
    for k, v in options.items():
        if k in params:
            out[k] = v
        elif k not in contract.OPTIONS or v != contract.OPTIONS[k]:
            raise BackendUnavailable(f"--backend {name!r}: its factory takes no {k}= option (asked for {k}={v!r})")
    return out


def get_backend(name: str, store, *, ram_slots: int, vram_slots: int = 0, **options):
    """Construct backend ``name`` with the options its factory accepts; BackendUnavailable with the reason if it
    cannot run here, ContractError when it lacks a required verb."""
    fn = factory(name)
    be = fn(store, ram_slots=ram_slots, vram_slots=vram_slots, **accepted(fn, name, options))
    return contract.check(be, name)
