"""A real pseudo-terminal for the CLI's tests, and the little screen model that reads back what it drew.

``spawn(argv, cols, stdout=None)`` runs ``python -m moetier ARGV`` (``code=``: ``python -c CODE``) with stdin and
stderr on a pty of ``cols`` columns, and stdout too unless ``stdout`` names a file to redirect it to (as ``> f``
does) or is a pipe's write end (as ``| wc -c``); it returns the exit status and every byte the terminal received.
``Screen(cols).feed(data)`` replays those bytes the way a terminal does (carriage return, line feed, cursor up,
erase line; colours ignored) into a scrollback that keeps every line, and counts the lines that ran past the right
edge (``overflows``): a table that fits never makes one.
"""
from __future__ import annotations

import fcntl
import os
import re
import select
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

import moetier

ROOT = Path(moetier.__file__).resolve().parent.parent


def env() -> dict:
    """The child's environment: this tree first on the path, a plain xterm, nothing that fixes rich's width."""
    e = {k: v for k, v in os.environ.items()
         if k not in ("COLUMNS", "LINES", "FORCE_COLOR", "NO_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE",
                      "MOETIER_QUIET", "MOETIER_PLAIN")}
    e.update(TERM="xterm-256color", PYTHONIOENCODING="utf-8",
             PYTHONPATH=os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]))
    return e


def piped(argv, cwd=None) -> subprocess.CompletedProcess:
    """The same command with no terminal at all: what a pipe receives."""
    return subprocess.run([sys.executable, "-m", "moetier", *argv], capture_output=True, text=True, env=env(),
                          cwd=cwd, timeout=300)


def spawn(argv, cols: int, stdout=None, cwd=None, timeout: float = 300, code: str | None = None
          ) -> tuple[int, bytes]:
    """Run ``moetier ARGV`` (or ``python -c CODE``) on a terminal of ``cols`` columns (module docstring)."""
    cmd = [sys.executable, "-c", code] if code is not None else [sys.executable, "-m", "moetier", *argv]
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, cols, 0, 0))
    out = slave if stdout is None else stdout if isinstance(stdout, int) else open(stdout, "wb")
    try:
        proc = subprocess.Popen(cmd, stdin=slave, stdout=out, stderr=slave,
                                env=env(), cwd=cwd, start_new_session=True)
    finally:
        os.close(slave)
        if not isinstance(out, int):
            out.close()
    data = bytearray()
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.1)
            if ready:
                try:
                    chunk = os.read(master, 65536)
                except OSError:          # EIO: every holder of the slave side has closed it
                    break
                if not chunk:
                    break
                data += chunk
            elif proc.poll() is not None:
                break
        else:
            proc.kill()
            raise AssertionError(f"moetier {' '.join(argv)} ran past {timeout} s on a terminal")
        return proc.wait(timeout=30), bytes(data)
    finally:
        os.close(master)


_CSI = re.compile(r"\x1b\[([?0-9;]*)([A-Za-z])")
_OSC = re.compile(r"\x1b\][^\x07\x1b]*(\x07|\x1b\\)")


class Screen:
    """What a terminal of ``cols`` columns shows after ``feed(data)``: ``lines`` (the scrollback, every line kept)."""

    def __init__(self, cols: int):
        self.cols, self.lines, self.row, self.col, self.overflows = cols, [[]], 0, 0, 0

    def _put(self, ch: str) -> None:
        if self.col >= self.cols:        # the character after the last column wraps (a line that did not fit)
            self.overflows += 1
            self._down()
            self.col = 0
        line = self.lines[self.row]
        line.extend(" " * (self.col + 1 - len(line)))
        line[self.col] = ch
        self.col += 1

    def _down(self) -> None:
        self.row += 1
        if self.row == len(self.lines):
            self.lines.append([])

    def feed(self, data: bytes) -> "Screen":
        text = _OSC.sub("", data.decode("utf-8", "replace"))
        i = 0
        while i < len(text):
            m = _CSI.match(text, i)
            if m:
                arg, op = m.groups()
                n = int(arg) if arg.isdigit() else None
                if op == "A":
                    self.row = max(0, self.row - (n or 1))
                elif op == "B":
                    for _ in range(n or 1):
                        self._down()
                elif op == "C":
                    self.col = min(self.cols, self.col + (n or 1))
                elif op == "D":
                    self.col = max(0, self.col - (n or 1))
                elif op == "G":
                    self.col = (n or 1) - 1
                elif op == "K":
                    line = self.lines[self.row]
                    if n == 2:
                        line.clear()
                    elif n == 1:
                        line[:self.col] = [" "] * min(self.col, len(line))
                    else:
                        del line[self.col:]
                i = m.end()
                continue
            ch = text[i]
            i += 1
            if ch == "\r":
                self.col = 0
            elif ch == "\n":
                self._down()
            elif ch == "\b":
                self.col = max(0, self.col - 1)
            elif ch >= " ":
                self._put(ch)
        return self

    def text(self) -> str:
        return "\n".join("".join(ln).rstrip() for ln in self.lines).strip("\n")
