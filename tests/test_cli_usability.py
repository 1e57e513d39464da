"""The command line for people: help on every option, --version, list, legends, strict JSON, progress/--quiet."""
import argparse
import json
import subprocess
import sys

import pytest

from moetier.cli import progress
from moetier.cli.main import _subparsers, build_parser, main


def run(capsys, *argv):
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def test_every_option_of_every_subcommand_has_help():
    missing = []
    for p in _subparsers(build_parser()):
        for a in p._actions:
            if isinstance(a, (argparse._HelpAction, argparse._SubParsersAction)):
                continue
            if not a.help or a.help == argparse.SUPPRESS:
                missing.append(f"{p.prog}: {'/'.join(a.option_strings) or a.dest}")
    assert not missing, missing


def test_every_subcommand_takes_quiet():
    for p in _subparsers(build_parser()):
        assert any("--quiet" in a.option_strings for a in p._actions), p.prog


def test_version(capsys):
    from moetier import __version__
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0 and capsys.readouterr().out.strip() == f"moetier {__version__}"


def test_list_kinds_and_descriptions(capsys):
    rc, out, _ = run(capsys, "list", "recipe", "--json")
    d = json.loads(out)
    ids = {r["id"]: r["description"] for r in d["recipe"]}
    assert rc == 0 and "glm53-rtx3090-55g-nvx4" in ids and "tiny-ci-cpu" in ids
    assert "glm-5.3-flash-exl3-3.05bpw on omarchy-rtx3090-nvx4" in ids["glm53-rtx3090-55g-nvx4"]
    rc, out, _ = run(capsys, "list")
    for kind in ("model", "hardware", "engine", "recipe", "runs"):
        assert out.count(f"\n{kind} (") + out.startswith(f"{kind} (") == 1, kind
    assert "| moetier-tiny-ci-int8 | moetier synthetic: 8 layers x 32 experts, top-4" in out


def test_list_bad_kind_is_one_line(capsys):
    rc, _, err = run(capsys, "list", "recipes")
    assert rc == 2 and err.startswith("moetier: error:") and "recipes" in err and len(err.splitlines()) == 1


def test_sim_piped_is_markdown_with_a_legend(capsys):
    rc, out, _ = run(capsys, "sim", "tiny-ci-cpu", "--conc", "1", "2", "--steps", "20")
    lines = out.splitlines()
    head = next(i for i, ln in enumerate(lines) if ln.startswith("| conc |"))
    assert lines[head + 1].startswith("|---|") and lines[head + 2].startswith("| C1 |")
    assert lines[head + 3].startswith("| C2 |")
    # C2's total is its per-stream figure times two: the legend's "totals across streams" holds
    c2 = [c.strip() for c in lines[head + 3].split("|")[1:-1]]
    assert float(c2[1]) == pytest.approx(2 * float(c2[2]), abs=0.011)
    legend = "\n".join(ln for ln in lines if ln.startswith("- "))
    for term in ("conc:", "decode tok/s:", "a total", "fixed:", "gpu / cpu:", "vram hit:", "masked", "prefetch"):
        assert term in legend, term


def test_table_legend_says_what_bound_and_fixed_are(capsys):
    rc, out, _ = run(capsys, "table", "tiny-ci-cpu", "--conc", "1")
    assert rc == 0 and "| C1 |" in out and "cpu-moe" in out
    assert "- bound:" in out and "- fixed:" in out and "- prefill bound:" in out


def test_json_is_strict(capsys):
    from moetier.cli.common import _emit
    _emit({"a": float("nan"), "b": [float("inf"), 1.5]})
    d = json.loads(capsys.readouterr().out)
    assert (d["a"], d["b"]) == (None, [None, 1.5]) and set(d["null_reasons"]) == {"$.a", "$.b[0]"}
    rc, out, _ = run(capsys, "sim", "tiny-ci-cpu", "--conc", "1", "--steps", "10", "--json")
    json.loads(out, parse_constant=lambda c: pytest.fail(f"non-strict JSON constant {c}"))


def test_progress_is_silent_when_piped_and_quiet():
    """Piped (no terminal): nothing on stderr, with or without --quiet; the output is the same."""
    cmd = [sys.executable, "-m", "moetier", "sim", "tiny-ci-cpu", "--conc", "1", "--steps", "20"]
    a = subprocess.run(cmd, capture_output=True, text=True, check=True)
    b = subprocess.run(cmd + ["--quiet"], capture_output=True, text=True, check=True)
    assert a.stderr == "" and b.stderr == "" and a.stdout == b.stdout


def test_progress_draws_on_a_terminal(monkeypatch):
    """On a terminal, a task draws a bar with its count, rate and time left; --quiet draws nothing."""
    import io

    class Tty(io.StringIO):
        def isatty(self):
            return True
    for quiet in (False, True):
        err = Tty()
        monkeypatch.setattr(sys, "stderr", err)
        with progress.session(quiet=quiet):
            assert progress.enabled() is (not quiet)
            with progress.task("work", unit="steps", total=10) as cb:
                for i in range(10):
                    cb(i + 1, 10)
                if not quiet:
                    t = progress._state["progress"].tasks[0]
                    assert (t.completed, t.total, t.description) == (10, 10, "work")
                    assert t.fields["rate"].endswith("/s")
        assert not progress.enabled()
        assert (err.getvalue() == "") is quiet


def test_progress_outside_a_session_is_a_noop():
    with progress.task("x") as cb:
        assert cb(1, 2) is None
    with progress.status("y") as cb:
        assert cb("stage") is None


def test_tables_draw_with_rich_on_a_terminal(capsys, monkeypatch):
    from moetier.cli import render
    monkeypatch.setattr(render, "_rich", lambda: True)
    rc, out, _ = run(capsys, "sim", "tiny-ci-cpu", "--conc", "1", "--steps", "10")
    assert rc == 0 and "|---|" not in out and "decode" in out and "C1" in out
    assert "conc: streams decoded together" in out             # the legend is under the rich table too
