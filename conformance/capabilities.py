"""Backend selection and the capability table that decides every conformance skip.

Contract
--------
``known()`` lists every name ``--backend`` accepts: the registered backends (``moetier.run.registry``: cpu, sycl,
cuda and any other distribution's ``moetier.backends`` entry point) and the deliberately broken test-only ones
(``conformance.broken.BROKEN``, names ``broken-*``).
``open_backend(name, store, ram_slots=, vram_slots=)`` constructs one (``BackendUnavailable`` with the backend's own
one-line reason when its runtime or device is missing). ``table(be)`` is the capability table of a constructed
backend: what it declares (``capabilities``: lanes, encodings, VRAM slots) plus the optional test hooks it offers
(``ram_view`` for reading a RAM slot, ``read_vram`` for reading a VRAM slot: moetier.run.contract.TEST_HOOKS).
Tests ask ``lane_skip`` / ``encoding_skip`` / ``vram_skip`` for a reason string and skip with it (NOT_SUPPORTED:
...) - no test names a backend.
"""
from __future__ import annotations

from moetier.errors import UserError
from moetier.run import registry
from moetier.run.contract import LANES, BackendUnavailable
from moetier.run.registry import get_backend

ENCODINGS = ("int8", "int4g32")


def real() -> tuple:
    """The registered backends (moetier.run.registry: the moetier.backends entry points and the built-ins)."""
    return registry.names()


def known() -> tuple:
    from conformance.broken import BROKEN
    return real() + tuple(BROKEN)


def check_name(name: str) -> str:
    """The name, or UserError (one line) when no such backend exists."""
    if name not in known():
        raise UserError(f"--backend {name!r}: unknown backend (known: {', '.join(real())}; test-only: "
                        f"{', '.join(k for k in known() if k not in real())})")
    return name


def recipe_id(name: str) -> str:
    """The CI recipe a backend's runtime checks use: tiny-ci-<name> where the registries hold one (the user
    registry, a backend package's ``moetier.registries`` folder, the shipped records), else tiny-ci-cpu."""
    from moetier.core import records as spec
    rid = f"tiny-ci-{name}"
    return rid if rid in spec.record_ids("recipe") else "tiny-ci-cpu"


def open_backend(name: str, store, *, ram_slots: int, vram_slots: int = 0, **kw):
    """Construct backend ``name``; raises BackendUnavailable with the reason when it cannot run here."""
    from conformance.broken import BROKEN
    if name in BROKEN:
        return BROKEN[name](store, ram_slots=ram_slots, vram_slots=vram_slots, **kw)
    check_name(name)
    return get_backend(name, store, ram_slots=ram_slots, vram_slots=vram_slots, **kw)


def table(be) -> dict:
    """The capability table of one constructed backend (printed in the report, drives the skips)."""
    c = be.capabilities
    return {
        "name": c.name, "device": c.device,
        "lanes": sorted(c.lanes), "encodings": sorted(c.encodings), "vram_slots": int(c.vram_slots),
        "push_drain": int(c.vram_slots) > 0,
        "ram_readback": ram_reader(be) is not None,
        "vram_readback": vram_reader(be) is not None,
        "notes": list(c.notes),
    }


def lane_skip(be, lane: str):
    c = be.capabilities
    if lane not in LANES:
        return f"NOT_SUPPORTED: {lane!r} is not a contract lane"
    if not c.has(lane):
        return f"NOT_SUPPORTED: backend {c.name} capabilities.lanes={sorted(c.lanes)} lacks {lane!r}"
    if lane == "gpu" and not c.vram_slots:
        return f"NOT_SUPPORTED: backend {c.name} has a gpu lane but 0 VRAM slots"
    return None


def encoding_skip(be, enc: str):
    c = be.capabilities
    if enc not in c.encodings:
        return f"NOT_SUPPORTED: backend {c.name} capabilities.encodings={sorted(c.encodings)} lacks {enc!r}"
    return None


def vram_skip(be, need: int = 1):
    c = be.capabilities
    if c.vram_slots < need:
        return (f"NOT_SUPPORTED: backend {c.name} has {c.vram_slots} VRAM slots (no VRAM tier: push/drain "
                f"need >= {need})")
    return None


def ram_reader(be):
    """slot -> uint8 view of a RAM slot (the optional test hook ram_view), or None."""
    f = getattr(be, "ram_view", None)
    return f if callable(f) else None


def vram_reader(be):
    """slot -> host copy of a VRAM slot's bytes (the optional test hook read_vram), or None."""
    f = getattr(be, "read_vram", None)
    return f if callable(f) else None


__all__ = ["real", "ENCODINGS", "known", "check_name", "recipe_id", "open_backend", "table", "lane_skip",
           "encoding_skip", "vram_skip", "ram_reader", "vram_reader", "BackendUnavailable"]
