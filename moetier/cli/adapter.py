"""`moetier adapter check NAME`: the hook surface an engine adapter expects against the installed engine.

Contract: ``moetier adapter check exllamav3`` imports the installed engine (with the stand-in extension where no
compiled one exists); ``moetier adapter check exl3xpu`` checks exl3xpu's ops, or moetier's provider of them where
exl3xpu does not run. Each prints each expected hook beside what it found, and exits 0 when they agree; a mismatch, an
engine outside the adapter's pinned version range, or a missing engine exits 2 after one line naming it. An unknown
adapter name is a user error (one line, exit 2).
"""
from __future__ import annotations

import importlib

from moetier.errors import UserError

# adapter name -> the module whose adapter_check(out) prints the check and returns its report (imported when asked for)
ADAPTERS = {"exllamav3": "adapters.exllamav3.surface", "exl3xpu": "adapters.exl3xpu.surface"}


def register(sub, parser_class) -> None:
    p = sub.add_parser("adapter", help="engine adapters: check the engine's hook surface")
    asub = p.add_subparsers(dest="adapter_cmd", parser_class=parser_class, required=True)
    c = asub.add_parser("check", help="compare the installed engine's hook surface with the adapter's")
    c.add_argument("name", help="adapter name: " + ", ".join(sorted(ADAPTERS)))
    c.set_defaults(fn=cmd_adapter_check)


def cmd_adapter_check(args) -> int:
    mod = ADAPTERS.get(args.name)
    if mod is None:
        raise UserError(f"adapter {args.name!r}: unknown (expected one of {', '.join(sorted(ADAPTERS))})")
    rep = importlib.import_module(mod).adapter_check(print)
    if rep.mismatches:
        raise UserError(rep.mismatches[0])
    return 0
