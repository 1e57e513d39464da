"""The house rules that a grep can check: code, docs, tests and benchmarks are references, not a diary.

No docstring, comment, doc, test or benchmark cites a run number, a machine letter, a numbered session or pass of
work, or a commit hash: the history is in git log and CHANGELOG.md, and a measured figure names the command that
reproduces it.
"""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCANNED = ("moetier", "backends", "conformance", "adapters", "docs", "benchmarks", "tests", "tools", "README.md")
SUFFIXES = {".py", ".md", ".sh", ".txt", ".toml", ".cl", ".cu", ".cfg", ".ini"}

# the pattern definitions below are the one place these words may stand
DIARY = re.compile(
    r"\b[Rr]uns? [0-9]{2,}\b"                                   # the word run(s), then a number of two or more digits
    r"|\b[Rr]uns? [0-9]+ ?(?:-|to|and) ?[0-9]+\b"               # the word runs, then a range of numbers
    r"|\b[Rr]un [0-9]+'s\b"                                     # the word run, a number and 's
    r"|\bVMs? [A-H]\b"                                          # VM, then a capital letter
    r"|\b[0-9]{4}-[0-9]{2}-[0-9]{2}[a-z]* VM\b"                 # a date, then VM
    r"|\b(?:[Ff]irst|[Ss]econd|[Tt]hird|[Ff]ourth|[Ff]ifth|[Ss]ixth|[Ss]eventh|[Ee]ighth|[Nn]inth|[Tt]enth"
    r"|[Ee]leventh|[Tt]welfth|[A-Za-z]+teenth|[0-9]+(?:st|nd|rd|th)) session\b"   # an ordinal, then session
    r"|\b[Ss]ession [0-9]+\b"                                   # session, then a number
    r"|\b[Pp]ass(?:es)? of work [0-9]+\b|\b[0-9]+(?:st|nd|rd|th) pass of work\b"
    r"|\bat [0-9a-f]{7,40}\b"                                   # at, then a commit hash
    r"|(?<![0-9A-Za-z_./#-])(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,12}(?![0-9A-Za-z_])"   # a bare commit hash
)


def _files():
    for top in SCANNED:
        p = ROOT / top
        paths = [p] if p.is_file() else sorted(p.rglob("*")) if p.is_dir() else []
        for f in paths:
            if f.is_file() and f.suffix in SUFFIXES and "__pycache__" not in f.parts \
                    and f.resolve() != Path(__file__).resolve():
                yield f


def diary_hits(text: str) -> list[str]:
    return [m.group(0) for m in DIARY.finditer(text)]


def _diary_forms(n: int, letter: str, day: str, ordinal: str, sha: str) -> list[str]:
    """Each form the pattern must catch, filled in at test time (so this file holds templates, not diary words)."""
    return [f"on run {n}'s terms", f"runs {n}-{n + 3}", f"run {n % 9 + 1}'s record", f"VM {letter}",
            f"the {day} VM", f"the {ordinal} session", f"({ordinal} session)", f"session {n}", f"at {sha}",
            f"commit {sha},", f"reverted in {sha})"]


def test_the_pattern_catches_diary_words_and_spares_plain_ones():
    import hashlib
    for i, (n, letter, ordinal) in enumerate(((52, "D", "ninth"), (13, "A", "eleventh"), (46, "H", "3rd"))):
        sha = next(h[k:k + 7] for k in range(33) for h in [hashlib.sha1(bytes([i])).hexdigest()]
                   if any(c.isalpha() for c in h[k:k + 7]) and any(c.isdigit() for c in h[k:k + 7]))
        for line in _diary_forms(n, letter, f"2026-12-{i + 1:02d}", ordinal, sha):
            assert diary_hits(line), line
    for line in ("a batch of 7 runs 4 experts", "run 1 differs from run 2", "0x1f2e3d4c", "sha256 of the file",
                 "tail-prefetch-C2", "deadbeef", "1234567", "layer 12 session", "the first pass"):
        assert not diary_hits(line), line


def test_no_run_numbers_machine_letters_sessions_or_hashes_in_the_project():
    hits = []
    for f in _files():
        for i, line in enumerate(f.read_text(errors="replace").splitlines(), 1):
            for word in diary_hits(line):
                hits.append(f"{f.relative_to(ROOT)}:{i}: {word!r}")
    assert not hits, "diary words (write a reference; the history is git log and CHANGELOG.md):\n" + \
        "\n".join(hits[:40]) + (f"\n... and {len(hits) - 40} more" if len(hits) > 40 else "")
