"""Tables for people: rich on a terminal, plain markdown when piped, with a legend under each.

Contract: ``table(headers, rows, title=..., legend=...)`` prints to stdout. When stdout is a terminal (and
MOETIER_PLAIN is unset) it draws a rich table with the title above and the legend below; otherwise it prints the
title line, a GitHub markdown table (``| a | b |`` / ``|---|---|``), a blank line and the legend as a markdown list
(``- ...``). Cells are strings already formatted by the caller. JSON output is not made
here (``moetier.cli.common._emit``).
"""
from __future__ import annotations

import os
import sys


def _rich() -> bool:
    return sys.stdout.isatty() and not os.environ.get("MOETIER_PLAIN")


def table(headers, rows, *, title: str | None = None, legend=()) -> None:
    """Print one table (module docstring)."""
    rows = [[str(c) for c in r] for r in rows]
    if _rich():
        from rich.console import Console
        from rich.table import Table
        from rich import box
        t = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, padding=(0, 1))
        need = 0
        for i, h in enumerate(headers):
            # a number is never broken over lines; a long header wraps at its spaces instead
            width = max([len(r[i]) for r in rows if i < len(r)] + [len(w) for w in h.split()])
            t.add_column(h, justify="left" if i == 0 else "right", min_width=width, overflow="fold")
            need += width + 3
        for r in rows:
            t.add_row(*r)
        con = Console()
        if need > con.width:                           # never crop a number: wider than the terminal, it wraps
            con = Console(width=need)
        con.print(t)
        for ln in legend:
            con.print(f"[dim]{ln}[/dim]", highlight=False)
        return
    if title:
        print(title)
    print("| " + " | ".join(headers) + " |")
    print("|" + "---|" * len(headers))
    for r in rows:
        print("| " + " | ".join(r) + " |")
    if legend:
        print()
        for ln in legend:
            print(f"- {ln}")
