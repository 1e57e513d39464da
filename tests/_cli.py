"""The CLI run in-process for the bad-input tests: its exit status and what it printed, and the one-line check."""
import contextlib
import io

from moetier.cli.main import main


def run_cli(argv) -> tuple:
    """(exit status, stdout, stderr) of ``moetier ARGV`` run in this process."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(list(argv))
    return rc, out.getvalue(), err.getvalue()


def one_line(rc, err, *needles) -> None:
    """Exit 2 with exactly one line ``moetier: error: ...`` holding every needle, and no traceback."""
    assert rc == 2 and err.count("\n") == 1 and err.startswith("moetier: error:") and "Traceback" not in err, err
    for n in needles:
        assert n in err, (n, err)
