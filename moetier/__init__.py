"""moetier: tiered expert residency (VRAM / RAM / NVMe) and one scheduler (plan_layer) for MoE decode.

The names users import most are re-exported here, so that user code need not follow the package layout:
``moetier.plan_layer``, ``moetier.Ledger`` and ``moetier.resolve``. They load on first use; ``import moetier`` stays
cheap.
"""

__version__ = "0.2.0"

_EXPORTS = {"plan_layer": "moetier.core.plan", "Ledger": "moetier.core.ledger", "resolve": "moetier.core.records"}


def __getattr__(name):
    if name in _EXPORTS:
        import importlib
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'moetier' has no attribute {name!r}")
