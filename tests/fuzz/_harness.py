"""The fuzz suite's one property and its example counter.

``outcome(target, work)`` runs ``work()`` at the command line's edge (moetier.cli.main.guarded: the same handler
``main()`` uses) with stdout and stderr captured, and asserts what the project promises for any input: the work
succeeds (exit 0), or it exits 2 with exactly one line on stderr, ``moetier: error: ...``, and no traceback.
Anything else - another exception, a second line, a SystemExit with another status - fails the example.
``assert_finite(value)`` is the extra property of a success: nothing NaN or infinite came through.
"""
import contextlib
import io
import math
from collections import Counter

from moetier.cli.main import guarded

COUNTS: Counter = Counter()


def outcome(target: str, work) -> int:
    COUNTS[target] += 1
    out, err = io.StringIO(), io.StringIO()

    def edge():
        try:
            return work()
        except SystemExit as e:           # argparse's own exits (--help): their status is the outcome
            return e.code if isinstance(e.code, int) else 2
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = guarded(edge)
    text = err.getvalue()
    if rc == 0:
        return 0
    assert rc == 2, f"{target}: exit status {rc} (expected 0 or 2); stderr: {text!r}"
    lines = [ln for ln in text.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("moetier: error: "), f"{target}: stderr {text!r}"
    assert "Traceback" not in text
    return 2


def assert_finite(value, where="$") -> None:
    """AssertionError (not UserError: it must fail the example) at the first NaN or infinite float."""
    stack = [(value, where)]
    while stack:
        v, path = stack.pop()
        if isinstance(v, float):
            assert math.isfinite(v), f"{path}: {v} came through a loader"
        elif isinstance(v, dict):
            stack.extend((x, f"{path}.{k}") for k, x in v.items())
        elif isinstance(v, (list, tuple)):
            stack.extend((x, f"{path}[{i}]") for i, x in enumerate(v))
