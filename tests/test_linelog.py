"""Whole-line appends (moetier.linelog) as sweep results and probe files use them: a torn last line is cut on open,
and a write the file system cuts short (a real RLIMIT_FSIZE limit, as a full disk would) is truncated back."""
import json
import os
import subprocess
import sys
import textwrap

import pytest

from moetier.errors import UserError
from moetier.linelog import LineLog

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_a_torn_last_line_is_cut_on_open(tmp_path):
    p = tmp_path / "r.jsonl"
    p.write_bytes(b'{"key": "a"}\n{"key": "b"}\n{"key": "c", "tok')
    with LineLog(p, "--out r") as log:
        log.append('{"key": "d"}')
    assert p.read_bytes() == b'{"key": "a"}\n{"key": "b"}\n{"key": "d"}\n'


def test_a_file_of_one_torn_line_is_emptied(tmp_path):
    p = tmp_path / "r.jsonl"
    p.write_bytes(b"x" * 200_000)                   # longer than one tail block
    LineLog(p, "--out r").close()
    assert p.read_bytes() == b""


@pytest.mark.parametrize("path", ["/dev/full", "/dev/null"])
def test_a_device_is_refused(path):
    with pytest.raises(UserError, match="not a regular file"):
        LineLog(path, f"--out {path}")


FULL = textwrap.dedent("""
    import resource, signal, sys, json
    from moetier.errors import UserError
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)       # the write fails with EFBIG instead of killing us
    resource.setrlimit(resource.RLIMIT_FSIZE, (1000, 1000))
    which, path = sys.argv[1], sys.argv[2]
    try:
        if which == "log":
            from moetier.linelog import LineLog
            with LineLog(path, "--out " + path) as log:
                for i in range(10):
                    log.append(json.dumps({"key": str(i), "pad": "x" * 280}))
        else:
            from moetier.measure.sampler import Sampler
            s = Sampler(path, interval=0.01)
            s.start()
            for i in range(200):
                s.counters({"step": i, "pad": "x" * 100})
            s.stop()
    except UserError as e:
        print(e, file=sys.stderr)
        sys.exit(2)
""")


@pytest.mark.parametrize("which", ["log", "sampler"])
def test_a_write_cut_short_leaves_whole_lines_only(tmp_path, which):
    p = tmp_path / "out.jsonl"
    r = subprocess.run([sys.executable, "-c", FULL, which, str(p)], capture_output=True, text=True, timeout=60,
                       env={**os.environ, "PYTHONPATH": REPO})
    assert r.returncode == 2, r.stderr
    assert "cannot append" in r.stderr and str(p) in r.stderr and "Traceback" not in r.stderr
    raw = p.read_bytes()
    assert 0 < len(raw) <= 1000 and raw.endswith(b"\n")
    for line in raw.decode().splitlines():
        json.loads(line)
