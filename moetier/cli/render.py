"""Tables and text for people: rich on a terminal, plain markdown when piped, with a legend under each table.

Contract: ``table(headers, rows, title=..., legend=...)`` prints to stdout. When stdout is a terminal (and
MOETIER_PLAIN is unset) it draws a rich table with the title above and the legend below; otherwise it prints the
title line, a GitHub markdown table (``| a | b |`` / ``|---|---|``), a blank line and the legend as a markdown list
(``- ...``). Cells are strings already formatted by the caller. JSON output is not made
here (``moetier.cli.common._emit``).

``say(line)`` prints one line of prose and ``text(block)`` a block of prose and markdown tables: piped, as they are;
on a terminal, a line wider than the terminal wraps at its spaces (the rest indented under it) and each markdown
table draws as ``table`` does, so no figure is ever broken over lines by the terminal.

On a terminal the table fits its width and never breaks a figure: a column whose cells are all figures (they start
with a digit, or are '-') is right-justified and never wrapped; text columns are left-justified and wrap at their
spaces. A table that cannot fit even so is drawn in blocks of columns, each block repeating the first column.
"""
from __future__ import annotations

import os
import re
import sys

_FIGURE = re.compile(r"[-+]?\.?\d")
_TEXT_MIN = 32             # a text column narrower than its longest word folds that word (never a figure's)


def _rich() -> bool:
    return sys.stdout.isatty() and not os.environ.get("MOETIER_PLAIN")


def _is_figures(cells) -> bool:
    return any(c not in ("", "-") for c in cells) and all(c in ("", "-") or _FIGURE.match(c) for c in cells)


def _frame(n: int) -> int:
    """Columns the table's padding and rules take beside the cells (box.SIMPLE_HEAD, padding 1)."""
    return 3 * n + 1


def _columns(headers, rows) -> list[dict]:
    cols = []
    for i, h in enumerate(headers):
        cells = [r[i] for r in rows if i < len(r)]
        fig = _is_figures(cells)
        words = [len(w) for c in cells for w in c.split()] + [len(w) for w in h.split()]
        if fig:
            least = max([len(c) for c in cells] + [len(w) for w in h.split()])
        else:
            least = min(max(words + [1]), _TEXT_MIN)
        cols.append({"i": i, "figures": fig, "min": least, "max": max([len(c) for c in cells] + [len(h), least])})
    return cols


def _blocks(cols, width: int) -> list[list[dict]]:
    """Split the columns into blocks that each fit ``width`` at their narrowest, the first column in every block."""
    if sum(c["min"] for c in cols) + _frame(len(cols)) <= width or len(cols) < 2:
        return [cols]
    out, cur = [], [cols[0]]
    for c in cols[1:]:
        if len(cur) > 1 and sum(x["min"] for x in cur + [c]) + _frame(len(cur) + 1) > width:
            out.append(cur)
            cur = [cols[0]]
        cur.append(c)
    return out + [cur]


def _widths(cols, width: int) -> list[int] | None:
    """Each column's width: its widest cell where all fit (None: rich's own layout), else its narrowest plus a share
    of what is left, by how much it would still take."""
    if sum(c["max"] for c in cols) + _frame(len(cols)) <= width:
        return None
    spare = max(0, width - _frame(len(cols)) - sum(c["min"] for c in cols))
    want = [c["max"] - c["min"] for c in cols]
    total = sum(want) or 1
    return [c["min"] + min(w, spare * w // total) for c, w in zip(cols, want)]


def _draw(con, headers, rows, cols, title) -> None:
    from rich import box
    from rich.table import Table
    from rich.text import Text
    widths = _widths(cols, con.width)
    t = Table(title=None if title is None else Text(title), title_justify="left", box=box.SIMPLE_HEAD,
              padding=(0, 1))
    for k, c in enumerate(cols):
        t.add_column(headers[c["i"]], justify="right" if c["figures"] else "left",
                     overflow="fold", min_width=c["min"], width=None if widths is None else widths[k])
    for r in rows:
        t.add_row(*(Text(r[c["i"]] if c["i"] < len(r) else "") for c in cols))      # cells are text, not markup
    con.print(t)


def table(headers, rows, *, title: str | None = None, legend=()) -> None:
    """Print one table (module docstring)."""
    rows = [[str(c) for c in r] for r in rows]
    if _rich():
        from rich.console import Console
        con = Console()
        cols = _columns(headers, rows)
        blocks = _blocks(cols, con.width)
        if any(sum(c["min"] for c in b) + _frame(len(b)) > con.width for b in blocks):
            # narrower than one column and the first: let the terminal wrap the lines rather than crop a figure
            con = Console(width=max(sum(c["min"] for c in b) + _frame(len(b)) for b in blocks))
        for k, b in enumerate(blocks):
            _draw(con, headers, rows, b, title if k == 0 else None)
        from rich.text import Text
        for ln in legend:
            con.print(Text(ln, style="dim"))
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


def say(line: str = "") -> None:
    """Print one line of prose (module docstring)."""
    if not _rich():
        print(line)
        return
    import textwrap
    from rich.console import Console
    width = Console().width
    indent = " " * (len(line) - len(line.lstrip(" ")) + 2)
    print("\n".join(textwrap.wrap(line, width, subsequent_indent=indent, break_long_words=False,
                                  break_on_hyphens=False, drop_whitespace=True)) if len(line) > width else line)


def text(block: str) -> None:
    """Print a block of prose and markdown tables (module docstring)."""
    if not _rich():
        print(block)
        return
    lines = block.split("\n")
    i = 0
    while i < len(lines):
        if lines[i].startswith("|") and i + 1 < len(lines) and lines[i + 1].startswith("|---"):
            j = i + 2
            while j < len(lines) and lines[j].startswith("|"):
                j += 1
            cells = [[c.strip() for c in ln.strip().strip("|").split(" | ")] for ln in lines[i:j] if
                     not ln.startswith("|---")]
            table(cells[0], cells[1:])
            i = j
            continue
        say(lines[i])
        i += 1
