"""One flag name per meaning across commands: the canonical name on every command that has the meaning, and an old
name (kept so that scripts keep working) parsing to the same value as the canonical one."""
from __future__ import annotations

import argparse

import pytest

from moetier.cli.main import _subparsers, build_parser

# meaning: (canonical flag, the commands that take it, {command: old name})
MEANINGS = {
    "also draw a PNG": ("--plot", ["sim", "trace stats", "sweep", "compare", "calibrate"], {"compare": "--png"}),
    "write nothing to the registry": ("--no-write", ["run", "calibrate", "bench"],
                                      {"run": "--no-record", "bench": "--dry-run"}),
    "the store's folder": ("--store", ["run", "calibrate", "bench", "doctor"], {"doctor": "--store-dir"}),
    "slots per layer of the per-layer curves": ("--layer-sizes", ["trace stats", "plot cache"],
                                                {"plot cache": "--sizes"}),
}


def _parsers() -> dict:
    return {p.prog.removeprefix("moetier ").strip(): p for p in _subparsers(build_parser())}


def _action(parser: argparse.ArgumentParser, flag: str):
    return next((a for a in parser._actions if flag in a.option_strings), None)


@pytest.mark.parametrize("meaning", list(MEANINGS))
def test_one_name_per_meaning(meaning):
    flag, commands, old = MEANINGS[meaning]
    parsers = _parsers()
    for cmd in commands:
        a = _action(parsers[cmd], flag)
        assert a is not None, f"moetier {cmd} lacks {flag} ({meaning})"
        if cmd in old:
            b = _action(parsers[cmd], old[cmd])
            assert b is not None and b.dest == a.dest, f"moetier {cmd} {old[cmd]}: not an old name of {flag}"
            assert old[cmd] in (a.help or "") or flag in (b.help or ""), f"moetier {cmd}: help hides {old[cmd]}"


def test_old_and_new_names_parse_the_same():
    p = build_parser()
    assert p.parse_args(["plot", "cache", "t.npz", "--sizes", "4", "16", "--out", "x.png"]).layer_sizes == [4, 16]
    assert p.parse_args(["plot", "cache", "t.npz", "--layer-sizes", "4,16", "--out", "x.png"]).layer_sizes == [4, 16]
    assert p.parse_args(["compare", "r", "--png", "a.png"]).plot == p.parse_args(["compare", "r", "--plot",
                                                                                   "a.png"]).plot == "a.png"
    old, new = p.parse_args(["doctor", "--store-dir", "/d"]), p.parse_args(["doctor", "--store", "/d"])
    assert old.store_dir == new.store_dir == "/d"
