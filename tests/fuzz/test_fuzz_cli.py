"""Fuzz: the argument parser of every subcommand. Each generated command line is parsed as ``moetier`` parses it
(no command runs); it parses with finite numbers only, or exits 2 with one line (see _harness)."""
import argparse
import math

from hypothesis import given
from hypothesis import strategies as st

from _harness import outcome
from moetier.cli.main import build_parser

PARSER = build_parser()
VALUES = ["nan", "NaN", "inf", "-inf", "Infinity", "-1", "0", "1", "2", "4", "1e9", "1e308", "1e999", "0.5", "abc", "",
          "a,b", "1,2", "0,4", "{}", '{"zipf_s": NaN}', '{"reuse": 2}', "[1]", "tiny-ci-cpu", "../x", "-", "--",
          "budget.ram_gb=NaN", "budget.ram_gb=1", "x=y", "\x00", "9" * 400, "-0", "0x10", "1_000"]


def _commands():
    """{command path: its parser} for every subcommand, nested ones included."""
    out = {}

    def walk(parser, path):
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if path and not subs:
            out[" ".join(path)] = parser
        for a in subs:
            for name, sp in a.choices.items():
                walk(sp, path + [name])
    walk(PARSER, [])
    return out


COMMANDS = _commands()


@st.composite
def command_line(draw, path):
    parser = COMMANDS[path]
    argv = path.split()
    opts = [a for a in parser._actions if a.option_strings and not isinstance(a, argparse._HelpAction)]
    pos = [a for a in parser._actions if not a.option_strings and not isinstance(a, argparse._HelpAction)]
    value = st.one_of(st.sampled_from(VALUES), st.text(max_size=6))
    tokens = []
    for a in pos:
        if draw(st.integers(0, 5)):
            tokens += [draw(value) for _ in range(1 if a.nargs in (None, "?") else draw(st.integers(0, 3)))]
    for _ in range(draw(st.integers(0, 5))):
        if not opts:
            break
        a = draw(st.sampled_from(opts))
        tokens.append(draw(st.sampled_from(a.option_strings)))
        if a.nargs != 0:
            tokens += [draw(value) for _ in range(draw(st.integers(0, 3)))]
    if draw(st.integers(0, 9)) == 0:
        tokens.insert(draw(st.integers(0, len(tokens))), draw(value))
    return argv + draw(st.permutations(tokens)) if draw(st.booleans()) else argv + tokens


def _finite(ns):
    for k, v in vars(ns).items():
        for x in (v if isinstance(v, list) else [v]):
            assert not (isinstance(x, float) and not math.isfinite(x)), f"{k} = {x} parsed"


@given(data=st.data())
def test_fuzz_argument_parser(data):
    """One target over every subcommand (each example picks one): a target per subcommand would multiply the CI
    fuzz time by their number for a cheap parser."""
    path = data.draw(st.sampled_from(sorted(COMMANDS)), label="command")
    argv = data.draw(command_line(path), label="argv")

    def work():
        _finite(PARSER.parse_args(argv))
        return 0
    outcome("argv (every subcommand)", work)
