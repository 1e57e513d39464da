"""Teardown of several handles: every one is closed, whatever the others raise.

Contract: ``close_all(closers)`` calls each zero-argument closer in order (None: a handle never opened, skipped),
also after one raised, then raises the first error, with a note naming each further one (``add_note``, Python
3.11+). A close that fails therefore never leaks the handles after it (file descriptors, the O_DIRECT reader, slot
mappings, worker threads), and no failure goes unreported. Errors are not wrapped in an ExceptionGroup so that a
caller's ``except OSError`` or ``except TransportError`` still sees the type it expects.
"""
from __future__ import annotations


def close_all(closers) -> None:
    errors: list[BaseException] = []
    for close in closers:
        if close is None:
            continue
        try:
            close()
        except BaseException as e:      # an interrupt too: the handles after it are still closed, then it is raised
            errors.append(e)
    if errors:
        first = errors[0]
        if hasattr(first, "add_note"):
            for e in errors[1:]:
                first.add_note(f"also while closing: {type(e).__name__}: {e}")
        raise first
