"""Output on a real terminal: every command that draws a bar or a table, under a pseudo-terminal at 80, 120 and 200
columns.

- stderr on the terminal, stdout redirected to a file (``moetier CMD > f``): the file holds exactly what the same
  command prints with no terminal at all, and the terminal keeps no progress frame and none of stdout's text.
- stdout on the terminal too: no progress frame is left anywhere in the scrollback, no line runs past the right
  edge, and every figure of the piped table appears whole (never cropped, never broken over lines).

calibrate takes minutes even at --quick and bench two on a loaded machine, so their bar (a staged status with a
total) and their table shape (long labels beside figures) are driven here through the same components in a child
process on the same terminal; doctor is the real command with the widest text column.
"""
from __future__ import annotations

import json
import os
import re
import sys

import pytest

from tests._terminal import ROOT, Screen, piped, spawn

COLS = (80, 120, 200)
BAR = "━"            # rich's progress bar; tables rule with "─"


@pytest.fixture(scope="module")
def probe_file(tmp_path_factory, tiny_ci_store) -> str:
    """A probe file from a real run (moetier run --probe) of the packed tiny-ci store."""
    p = tmp_path_factory.mktemp("probe") / "p.jsonl"
    r = piped(["run", "tiny-ci-cpu", "--store", tiny_ci_store, "--steps", "4", "--conc", "1", "--no-record",
               "--probe", str(p), "--quiet"])
    assert r.returncode == 0, r.stderr
    return str(p)


def commands(store: str, probe: str) -> dict:
    """name: argv, every one quick on the tiny-ci records; sweep writes sweep.jsonl in its own cwd."""
    trace = str(ROOT / "traces" / "tiny-ci.npz")
    return {
        "show": ["show", "tiny-ci-cpu"],
        "list": ["list", "recipe"],
        "sim": ["sim", "tiny-ci-cpu", "--conc", "1", "2", "--steps", "60"],
        "sim --json": ["sim", "tiny-ci-cpu", "--conc", "1", "--steps", "20", "--json"],
        "table": ["table", "tiny-ci-cpu", "--conc", "1", "2", "--interval"],
        "compare": ["compare", "tiny-ci-cpu", "--conc", "1", "--steps", "20"],
        "trace stats": ["trace", "stats", trace, "--cache-sizes", "4,16"],
        "sweep": ["sweep", "tiny-ci-cpu", "--grid", "budget.ram_gb=0.01,0.015", "--conc", "1", "--steps", "8",
                  "--workers", "1", "--out", "sweep.jsonl"],
        "doctor": ["doctor", "--recipe", "tiny-ci-cpu"],
        "run": ["run", "tiny-ci-cpu", "--store", store, "--steps", "4", "--conc", "1", "--no-record"],
        "probe report": ["probe", "report", probe],
    }


def steady(name: str, text: str) -> str:
    """The output with what differs from run to run masked: a sweep's wall time and rate, a real run's measured
    figures (and whether they fell inside the interval) and its record id's time, doctor's free disk and RAM; a
    replay's wall seconds."""
    text = re.sub(r'("[a-z_]*seconds": )[-+.\de]+', r"\1N", text)
    if name in ("sweep", "run", "doctor"):
        text = re.sub(r"\b(yes|no)\b", "B", re.sub(r"[-+]?\d+", "N", text))
    return text


def table_words(piped_out: str) -> set[str]:
    """Every word with a digit in the piped output's table rows: what a terminal must show whole."""
    return {w for ln in piped_out.splitlines() if ln.startswith("|") and not ln.startswith("|---")
            for cell in ln.strip("|").split(" | ") for w in cell.split() if re.search(r"\d", w)}


@pytest.fixture(scope="module")
def argvs(tiny_ci_store, probe_file):
    return commands(tiny_ci_store, probe_file)


@pytest.mark.parametrize("name", list(commands("STORE", "PROBE")))
def test_on_a_terminal(name, argvs, tmp_path):
    argv = argvs[name]
    ref_dir = tmp_path / "piped"
    ref_dir.mkdir()
    ref = piped(argv, cwd=ref_dir)
    assert ref.returncode in (0, 1), ref.stderr           # doctor says 1 where the recipe cannot run here
    assert ref.stdout.strip(), f"{name}: prints nothing when piped"
    words = table_words(ref.stdout)
    for cols in COLS:
        # stdout redirected, stderr on the terminal
        d = tmp_path / f"file-{cols}"
        d.mkdir()
        rc, raw = spawn(argv, cols, stdout=d / "out.txt", cwd=d)
        screen = Screen(cols).feed(raw).text()
        got = (d / "out.txt").read_text()
        assert rc == ref.returncode, raw.decode(errors="replace")
        assert steady(name, got) == steady(name, ref.stdout), f"{name} > f at {cols} columns: not the piped output"
        assert BAR not in screen, f"{name} at {cols} columns: a progress frame left on the terminal:\n{screen}"
        assert b"/?" not in raw, f"{name} at {cols} columns: a bar without its total"
        first = next(ln for ln in ref.stdout.splitlines() if ln.strip())
        assert steady(name, first.strip()) not in steady(name, screen), f"{name} at {cols}: stdout on the terminal"

        # everything on the terminal
        d = tmp_path / f"tty-{cols}"
        d.mkdir()
        rc, raw = spawn(argv, cols, cwd=d)
        s = Screen(cols).feed(raw)
        screen = s.text()
        assert rc == ref.returncode, screen
        assert BAR not in screen, f"{name} at {cols} columns: a stale progress frame:\n{screen}"
        assert s.overflows == 0, f"{name} at {cols} columns: {s.overflows} lines wider than the terminal:\n{screen}"
        assert "…" not in screen, f"{name} at {cols} columns: a cropped cell:\n{screen}"
        shown = {steady(name, w) for w in screen.split()}
        cropped = sorted(w for w in words if steady(name, w) not in shown)
        assert not cropped, f"{name} at {cols} columns: figures not shown whole: {cropped}\n{screen}"


def test_piped_json_on_a_terminal_reaches_the_pipe():
    """`moetier sim ... --json | wc -c` on a terminal: the JSON goes down the pipe, none of it onto the screen,
    and the bar did draw (the terminal was live)."""
    argv = ["sim", "tiny-ci-cpu", "--conc", "1", "--steps", "400", "--json"]
    ref = piped(argv).stdout
    r, w = os.pipe()
    rc, raw = spawn(argv, 120, stdout=w)
    os.close(w)
    with os.fdopen(r) as f:
        got = f.read()
    assert rc == 0 and len(got) > 100
    assert _timeless(json.loads(got)) == _timeless(json.loads(ref))
    assert BAR in raw.decode(errors="replace"), "no bar drew: the terminal was not live"
    assert '"tok_s"' not in Screen(120).feed(raw).text()


def test_the_interval_replays_count_on_one_bar_with_a_total(monkeypatch):
    """Both replays of a prediction interval move one bar to one total (never "N/?"): done only grows, and the
    second replay counts on past the first's half."""
    import contextlib

    from moetier.cli import common, progress
    from moetier.core import records as spec
    from moetier.traces.format import load_trace
    calls = []

    @contextlib.contextmanager
    def task(label, unit="steps", total=None):
        yield lambda done, total=None: calls.append((done, total))
    monkeypatch.setattr(progress, "task", task)
    R = spec.resolve("tiny-ci-cpu")
    tr = load_trace(ROOT / "traces" / "tiny-ci.npz", layers=R.layers, experts=R.experts, topk=R.topk)
    iv = common.replay_interval(R, tr, 1, steps=30)
    assert iv["low"] <= iv["high"] and calls
    totals = {t for _, t in calls}
    done = [d for d, _ in calls]
    assert len(totals) == 1 and None not in totals, totals
    total = totals.pop()
    assert done == sorted(done) and total // 2 < done[-1] <= total, (done, total)


def _timeless(d: dict) -> dict:
    """The replay's JSON less its wall-clock fields (the only ones that differ between two runs)."""
    return {k: v for k, v in d.items() if "seconds" not in k}


# the components calibrate and bench draw with, on the same terminal
STATUS = """
import time
from moetier.cli import progress
with progress.session():
    with progress.status("calibrate") as cb:
        for i in range(6):
            cb(f"check rep {i}", 6)
            time.sleep(0.3)
print("done")
"""

INSIDE = """
import sys, time
from moetier.cli import progress
with progress.session():
    with progress.task("work", total=4) as cb:
        for i in range(4):
            print(f"row {i}")
            sys.stdout.flush()
            cb(i + 1, 4)
            time.sleep(0.2)
"""


@pytest.mark.parametrize("cols", COLS)
def test_stdout_written_while_a_bar_draws_reaches_the_file(cols, tmp_path):
    """Lines printed while a bar is live go to the redirected stdout, not through the bar onto the terminal."""
    rc, raw = spawn([], cols, stdout=tmp_path / "out.txt", code=INSIDE)
    assert rc == 0 and BAR in raw.decode(errors="replace")
    assert (tmp_path / "out.txt").read_text() == "".join(f"row {i}\n" for i in range(4))
    assert "row" not in Screen(cols).feed(raw).text()


BENCH_SHAPE = """
from moetier.cli.render import table
table(["measure", "value", "rounds"], [
    ["CPU time per O_DIRECT read (checksummed)", "0.171 ms", "3"],
    ["O_DIRECT read QD16, 102,400 B records", "1.38 GB/s, latency p50 0.54 ms / p90 1.85 ms", "12"],
    ["cpu lane (int8)", "per_layer 0.1593 ms, per_expert 0.0262 ms, per_extra_token 0.0022 ms", "300"],
    ["cpu lane expert cost after N MB streamed, of a cold one",
     "2 MB 0.22, 3 MB 0.22, 5 MB 0.22, 7 MB 0.22, 10 MB 0.22, 13 MB 0.22, 16 MB 0.22, 20 MB 0.22, 26 MB 1.00", "5"],
], title="bench", legend=("a legend line long enough to wrap at eighty columns on any terminal that draws it here",))
"""


@pytest.mark.parametrize("cols", COLS)
def test_a_staged_bar_shows_its_total_and_time_left(cols):
    rc, raw = spawn([], cols, code=STATUS)
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", raw.decode(errors="replace"))
    assert rc == 0 and BAR in text
    assert re.search(r"(?<![\d/])[1-5]/6(?!\d)", text), "the staged bar shows no total"
    assert "/?" not in text
    assert re.search(r"eta\s+\d+:\d\d:\d\d", text), "no time left shown"
    screen = Screen(cols).feed(raw).text()
    assert BAR not in screen and screen.endswith("done")


@pytest.mark.parametrize("cols", COLS)
def test_bench_shaped_table_fits_and_keeps_figures_whole(cols):
    rc, raw = spawn([], cols, code=BENCH_SHAPE)
    s = Screen(cols).feed(raw)
    screen = s.text()
    assert rc == 0 and s.overflows == 0, screen
    for w in ("0.171", "102,400", "0.0022", "1.00", "1.85"):
        assert w in screen.split() or w + "," in screen.split(), (w, screen)
    # text left, figures right: a label starts where its header does, a count ends where its header does
    lines = screen.splitlines()
    head = next(ln for ln in lines if "measure" in ln and "rounds" in ln)
    row = next(ln for ln in lines if "0.171 ms" in ln)
    assert row.index("CPU time") == head.index("measure") and row.index("0.171") == head.index("value"), screen
    assert len(row.rstrip()) == len(head.rstrip()) and row.rstrip().endswith(" 3"), screen


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
