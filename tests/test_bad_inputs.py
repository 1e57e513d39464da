"""The bad-input catalogue (benchmarks/bad_inputs.py) from outside, through the real command line: its quick subset
here (every group, a few cases each), the whole catalogue with MOETIER_BAD_INPUTS_ALL=1. Every case must end in
exit 2 with one line naming the thing, nothing left behind, no traceback and no hang. The judge itself is checked
on made-up outcomes, so a catalogue that passes is one whose judge could have failed it."""
import importlib.util
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
spec = importlib.util.spec_from_file_location("bad_inputs", os.path.join(ROOT, "benchmarks", "bad_inputs.py"))
bad_inputs = importlib.util.module_from_spec(spec)
sys.modules["bad_inputs"] = bad_inputs
spec.loader.exec_module(bad_inputs)

CASE = bad_inputs.Case("g", "c", [], "--out")
LINE = "moetier: error: --out /x: cannot write there: a directory\n"


@pytest.mark.parametrize("rc, err, new, kind", [
    (2, LINE, [], "good"),
    (0, "", [], "silent"),
    (None, "", [], "hang"),
    (-9, "", [], "hang"),
    (1, "Traceback (most recent call last):\n  ...\nValueError: x\n", [], "traceback"),
    (2, "Traceback (most recent call last):\n" + LINE, [], "traceback"),
    (2, LINE, ["out.png"], "stray"),
    (2, LINE + "and a second line\n", [], "noisy"),
    (2, "moetier: error: something went wrong\n", [], "noisy"),       # does not name --out
    (2, "usage: moetier ...\n", [], "noisy"),
])
def test_the_judge(rc, err, new, kind):
    assert bad_inputs.judge(CASE, rc, err, new) == kind


def test_a_bounded_huge_value_may_finish_and_a_reported_fault_may_exit_0():
    either = bad_inputs.Case("huge", "c", [], "--conc", either=True)
    assert bad_inputs.judge(either, 0, "", ["s.jsonl"]) == "good"
    assert bad_inputs.judge(either, 1, "Traceback (most recent call last):\n", []) == "traceback"
    listed = bad_inputs.Case("registry", "c", [], "bad-x", reported="does not load")
    assert bad_inputs.judge(listed, 0, "", [], "bad-x  (does not load: ...)") == "good"
    assert bad_inputs.judge(listed, 0, "", [], "bad-x  a recipe") == "silent"


def test_the_catalogue_has_several_hundred_cases_over_every_group():
    cases = bad_inputs.cases()
    groups = {c.group for c in cases}
    assert len(cases) >= 500
    assert {c.group for c in cases if c.quick} == groups
    assert len({(c.group, c.name) for c in cases}) == len(cases)


def test_the_catalogue_finds_no_bad_outcome(tmp_path):
    full = os.environ.get("MOETIER_BAD_INPUTS_ALL") == "1"
    out = tmp_path / "outcomes.json"
    rc = bad_inputs.main(["--json", str(out)] + ([] if full else ["--quick"]))
    import json
    rows = json.loads(out.read_text())["cases"]
    bad = [f"{r['kind']}: [{r['group']}] {r['case']}: {r['stderr'][-300:]!r}" for r in rows if r["kind"] != "good"]
    assert rc == 0 and not bad, "\n".join(bad)
