"""The README's generated blocks: each is what a moetier command prints, rewritten here so that it cannot drift.

    python tools/readme_figures.py            # rewrite every block of README.md from the commands' output
    python tools/readme_figures.py --check    # exit 1 naming each block that differs (tests/test_readme.py)

A block is the fenced code block between ``<!-- output: moetier ARGS -->`` and ``<!-- /output -->``; it holds that
command's piped (markdown) output up to its first blank line. The command runs from the repository root with a
fresh, empty user registry (so that records a user's bench or calibrate wrote cannot stand in for the shipped ones)
and without progress bars.
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
BLOCK = re.compile(r"(<!-- output: moetier (?P<args>[^>]*?) -->\n```\n)(?P<body>.*?)(```\n<!-- /output -->)", re.S)


def output(args: str) -> str:
    """What ``moetier ARGS`` prints when piped, up to its first blank line (with the newline that ends it)."""
    with tempfile.TemporaryDirectory() as reg:
        env = dict(os.environ, PYTHONPATH=str(ROOT), MOETIER_REGISTRY=reg, MOETIER_QUIET="1")
        r = subprocess.run([sys.executable, "-m", "moetier", *args.split()], cwd=ROOT, env=env, capture_output=True,
                           text=True, timeout=900)
    if r.returncode != 0:
        raise SystemExit(f"readme_figures: `moetier {args}` exited {r.returncode}: {r.stderr.strip()[-500:]}")
    return r.stdout.split("\n\n", 1)[0].rstrip("\n") + "\n"


def blocks(text: str) -> list[tuple[str, str]]:
    """Each generated block of ``text``: (the command's arguments, the block's body as written)."""
    return [(m.group("args"), m.group("body")) for m in BLOCK.finditer(text)]


def rewrite(text: str) -> str:
    return BLOCK.sub(lambda m: m.group(1) + output(m.group("args")) + m.group(4), text)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="Rewrite (or --check) the README's generated blocks.")
    ap.add_argument("--check", action="store_true", help="exit 1 naming each block that differs; write nothing")
    check = ap.parse_args(argv).check
    text = README.read_text(encoding="utf-8")
    if not blocks(text):
        raise SystemExit("readme_figures: README.md has no <!-- output: moetier ... --> block")
    if check:
        stale = [args for args, body in blocks(text) if body != output(args)]
        for args in stale:
            print(f"README.md: the block of `moetier {args}` differs from its output "
                  "(python tools/readme_figures.py rewrites it)")
        return 1 if stale else 0
    new = rewrite(text)
    if new != text:
        README.write_text(new, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
