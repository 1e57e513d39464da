"""The README's quick start works when pasted into a fresh shell after the two set-up commands.

Every quick-start line must name the venv's programs (``.venv/bin/...``: set-up does not activate the venv). The
cheap lines run here with this interpreter standing in for ``.venv/bin/python`` (and ``-m moetier`` for
``.venv/bin/moetier``); MOETIER_README_ALL=1 runs every line (minutes: the simulator on the default recipe).
"""
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CHEAP = ("doctor", "list", "show", "trace gen")


def block(title: str) -> list[str]:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    sec = text.split(f"\n## {title}\n", 1)[1]
    body = re.search(r"```sh\n(.*?)```", sec, re.S).group(1)
    return [ln for ln in body.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]


def argv(line: str) -> list[str]:
    words = shlex.split(line, comments=True)
    prog = {".venv/bin/moetier": [sys.executable, "-m", "moetier"], ".venv/bin/python": [sys.executable]}
    return prog[words[0]] + words[1:]


def test_setup_is_two_commands_and_ci_runs_them():
    setup = block("Set-up: two commands")
    assert len(setup) == 2 and setup[0].startswith("python3 -m venv .venv && .venv/bin/pip install -e")
    ci = (REPO / ".ci" / "run").read_text(encoding="utf-8")
    assert setup[1] in ci


def test_quick_start_lines_name_the_venv():
    lines = block("Quick start")
    assert len(lines) >= 8
    for ln in lines:
        assert ln.startswith((".venv/bin/moetier ", ".venv/bin/python ")), ln


QUICK = block("Quick start")


@pytest.mark.parametrize("line", QUICK, ids=[" ".join(shlex.split(q, comments=True)[1:3]) for q in QUICK])
def test_quick_start_line_runs(line):
    words = shlex.split(line, comments=True)
    if not os.environ.get("MOETIER_README_ALL") and not any(" ".join(words[1:]).startswith(c) for c in CHEAP):
        pytest.skip("an expensive line (the simulator on the default recipe): MOETIER_README_ALL=1 runs it")
    env = dict(os.environ, PYTHONPATH=str(REPO), MOETIER_QUIET="1")
    r = subprocess.run(argv(line), cwd=REPO, env=env, capture_output=True, text=True, timeout=1800)
    assert r.returncode == 0, (line, r.stderr[-2000:])
    assert r.stdout.strip(), line
