"""Every flag that writes a file, driven with paths it cannot write (moetier.cli.outpath): one line naming the flag,
exit 2, no traceback, nothing left behind; the user registry must be a folder for every command; writes that fail
mid-way or go through a symlink leave no debris; inputs that never end are refused, not read."""
import json
import os
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from moetier.cli.main import build_parser
from tests._cli import run_cli

# command -> argv with {} where the writing flag's value goes; the other arguments only have to parse
ARGV = {
    ("sim", "--plot"): ["sim", "tiny-ci-cpu", "--plot", "{}"],
    ("advise", "--plot"): ["advise", "tiny-ci-cpu", "--candidates", "2", "--no-write", "--plot", "{}"],
    ("trace stats", "--plot"): ["trace", "stats", "t.npz", "--plot", "{}"],
    ("trace gen", "--out"): ["trace", "gen", "--model", "m", "--out", "{}"],
    ("trace convert", "dst"): ["trace", "convert", "a.npz", "{}"],
    ("trace import", "--out"): ["trace", "import", "log.jsonl", "--out", "{}"],
    ("trace fit", "--out"): ["trace", "fit", "t.npz", "--out", "{}"],
    ("model import", "--out"): ["model", "import", "dir", "--out", "{}"],
    ("store pack", "--out"): ["store", "pack", "m", "--out", "{}"],
    ("run", "--probe"): ["run", "tiny-ci-cpu", "--store", "s", "--probe", "{}"],
    ("calibrate", "--plot"): ["calibrate", "tiny-ci-cpu", "--store", "s", "--plot", "{}"],
    ("sweep", "--out"): ["sweep", "tiny-ci-cpu", "--out", "{}"],
    ("sweep", "--plot"): ["sweep", "tiny-ci-cpu", "--out", "ok.jsonl", "--plot", "{}"],
    ("conformance", "--report"): ["conformance", "--backend", "cpu", "--report", "{}"],
    ("conformance", "--md"): ["conformance", "--backend", "cpu", "--md", "{}"],
    ("probe record", "--out"): ["probe", "record", "--out", "{}"],
    ("probe report", "--plot"): ["probe", "report", "x", "--plot", "{}"],
    **{(f"plot {k}", "--out"): ["plot", k, *(["x"] if k != "timeline" else ["tiny-ci-cpu"]), "--out", "{}"]
       for k in ("levers", "timeline", "waterfall", "cache", "calibration", "compare")},
}


def writing_flags():
    """(command, flag) of every argument whose type is an outpath check, found by walking the parser."""
    found = set()

    def walk(p, name):
        for a in p._actions:
            if getattr(a.type, "writes", ("", "registry"))[1] != "registry":
                found.add((name, a.option_strings[0] if a.option_strings else a.dest))
            if a.__class__.__name__ == "_SubParsersAction":
                for sub, sp in a.choices.items():
                    walk(sp, f"{name} {sub}".strip())
    walk(build_parser(), "")
    return found


FOUND = writing_flags()
COMPARE = sorted(f for f in FOUND if f[0] == "compare")        # its PNG flag, whatever its name
FLAGS = {**ARGV, **{f: ["compare", "tiny-ci-cpu", f[1], "{}"] for f in COMPARE}}


WRITING_NAMES = {"--out", "--plot", "--png", "--report", "--md", "--probe"}
READ_NOT_WRITTEN = {"probe report --probe"}         # the probe file a report reads


def test_every_flag_named_for_writing_takes_the_output_path_helper():
    """A new --out / --plot / ... added without the helper would otherwise be invisible to the walk above."""
    missed = []

    def walk(p, name):
        for a in p._actions:
            flag = f"{name} {a.option_strings[0]}" if a.option_strings else ""
            if (WRITING_NAMES & set(a.option_strings) and a.nargs != 0 and flag not in READ_NOT_WRITTEN
                    and not hasattr(a.type, "writes")):
                missed.append(flag)
            if a.__class__.__name__ == "_SubParsersAction":
                for sub, sp in a.choices.items():
                    walk(sp, f"{name} {sub}".strip())
    walk(build_parser(), "")
    assert not missed, f"writing flags without moetier.cli.outpath: {missed}"


def test_every_writing_flag_is_checked_and_driven_here():
    assert len(COMPARE) == 1 and len(FOUND) >= 22
    assert FOUND == set(FLAGS), FOUND ^ set(FLAGS)


@pytest.fixture(scope="module")
def bad_paths(tmp_path_factory):
    """name -> a path no command may write to ("a directory" only for file flags, "a regular file" only for
    store pack's folder)."""
    d = tmp_path_factory.mktemp("bad")
    (d / "loop-a").symlink_to(d / "loop-b")
    (d / "loop-b").symlink_to(d / "loop-a")
    os.mkfifo(d / "fifo")
    (d / "a-file").write_text("x")
    (d / "a-dir").mkdir()
    return d, {
        "a directory": str(d / "a-dir"),
        "a regular file": str(d / "a-file"),
        "a missing parent": str(d / "no-such-folder" / "out.x"),
        "a parent that is a file": str(d / "a-file" / "out.x"),
        "a name over NAME_MAX": str(d / ("n" * 256 + ".x")),
        "a path over PATH_MAX": str(d / "/".join(["p" * 200] * 21)),
        "a symlink loop": str(d / "loop-a"),
        "a device": "/dev/full",
        "a FIFO": str(d / "fifo"),
        "a folder nothing can be created in": "/proc/moetier-out.x",
        "an empty path": "",
    }



@settings(max_examples=150)
@given(data=st.data())
def test_a_writing_flag_refuses_a_path_it_cannot_write(data, bad_paths, tmp_path_factory):
    (cmd, flag) = data.draw(st.sampled_from(sorted(FLAGS)), label="flag")
    d, paths = bad_paths
    wrong = "a directory" if cmd == "store pack" else "a regular file"     # each is right for the other kind
    kind = data.draw(st.sampled_from(sorted(k for k in paths if k != wrong)), label="path")
    cwd = tmp_path_factory.mktemp("cwd")
    before = sorted(os.listdir(d)), sorted(os.listdir(d / "a-dir"))
    old = os.getcwd()
    os.chdir(cwd)
    try:
        rc, out, err = run_cli([a.replace("{}", paths[kind]) for a in FLAGS[(cmd, flag)]])
    finally:
        os.chdir(old)
    lines = err.strip().splitlines()
    assert rc == 2 and len(lines) == 1 and lines[0].startswith("moetier: error:"), (cmd, flag, kind, err)
    shown = flag if flag.startswith("-") else flag.upper()
    assert f"argument {shown}" in lines[0] or f"argument {flag}" in lines[0], lines[0]
    assert "cannot write there" in lines[0] and "Traceback" not in err and out == ""
    assert os.listdir(cwd) == [] and (sorted(os.listdir(d)), sorted(os.listdir(d / "a-dir"))) == before


@pytest.mark.parametrize("argv", [["list", "recipe"], ["show", "tiny-ci-cpu"], ["table", "tiny-ci-cpu"],
                                  ["trace", "stats", "x.npz"], ["run", "tiny-ci-cpu", "--store", "s"]])
def test_a_registry_that_is_a_file_is_refused_by_every_command(argv, tmp_path, monkeypatch):
    f = tmp_path / "registry-file"
    f.write_text("not a folder")
    for args in (["--registry", str(f), *argv], [*argv, "--registry", str(f)]):
        rc, out, err = run_cli(args)
        assert rc == 2 and err.count("\n") == 1 and "--registry" in err and "a regular file" in err, err
    monkeypatch.setenv("MOETIER_REGISTRY", str(f))                # the environment's registry too
    rc, out, err = run_cli(argv)
    assert rc == 2 and "user registry" in err and out == "", err


def test_a_write_that_fails_midway_leaves_nothing(tmp_path):
    from moetier.atomic import atomic_write
    from moetier.errors import UserError
    (tmp_path / "out.json").write_text("old")

    def full(f):
        f.write(b"half of it")
        raise OSError(28, "No space left on device")
    with pytest.raises(UserError, match=r"out.json: cannot write \(No space left on device\); nothing was written"):
        atomic_write(tmp_path / "out.json", full)
    assert os.listdir(tmp_path) == ["out.json"] and (tmp_path / "out.json").read_text() == "old"


def test_a_write_through_a_symlink_keeps_the_link(tmp_path):
    from moetier.atomic import atomic_write
    (tmp_path / "real.json").write_text("old")
    (tmp_path / "link.json").symlink_to("real.json")
    atomic_write(tmp_path / "link.json", lambda f: f.write(b"new"))
    assert (tmp_path / "link.json").is_symlink() and (tmp_path / "real.json").read_text() == "new"
    assert sorted(os.listdir(tmp_path)) == ["link.json", "real.json"]


def test_pack_through_a_symlink_leaves_no_old_folder(tmp_path):
    from moetier.bytes import store
    model = {"id": "tiny", "moe": {"layers": 2, "experts": 4}, "store": {"hidden": 64, "ffn": 64,
                                                                          "encoding": "int8"}}
    store.pack(model, str(tmp_path / "real"))
    (tmp_path / "link").symlink_to("real")
    store.pack(model, str(tmp_path / "link"), seed=1)
    assert sorted(os.listdir(tmp_path)) == ["link", "real"], os.listdir(tmp_path)
    manifest = json.loads((tmp_path / "real" / store.MANIFEST_NAME).read_text())
    assert (tmp_path / "link").is_symlink() and manifest["seed"] == 1      # the new store, where the link points


@pytest.mark.parametrize("make", ["fifo", "device"])
def test_sweep_resume_refuses_an_endless_results_file_without_reading_it(make, tmp_path):
    from moetier.errors import UserError
    from moetier.measure import sweep
    path = "/dev/zero" if make == "device" else str(tmp_path / "fifo")
    if make == "fifo":
        os.mkfifo(path)
    t0 = time.monotonic()
    with pytest.raises(UserError, match="not a regular file"):
        sweep.done_keys(path)                   # a FIFO would block in open(), /dev/zero would fill memory
    assert time.monotonic() - t0 < 5


def test_sweep_resume_bounds_a_line(tmp_path, monkeypatch):
    from moetier.errors import UserError
    from moetier.measure import sweep
    monkeypatch.setattr(sweep, "MAX_LINE", 100)
    (tmp_path / "r.jsonl").write_bytes(b"x" * 1000)
    with pytest.raises(UserError, match=r"r.jsonl:1: a line over 100 bytes"):
        sweep.read_rows(tmp_path / "r.jsonl")


@pytest.mark.parametrize("argv", [
    ["run", "tiny-ci-cpu", "--store", "s", "--record", "r" * 300],
    ["model", "import", "dir", "--id", "m" * 300],
    ["bench", "--store", "s", "--hardware", "h" * 300],
    ["show", "x" * 300],
    ["trace", "gen", "--model", "qwen3.8-flash-next-exl3-3.05bpw", "--out", "t" * 300 + ".npz"],
])
def test_an_id_or_name_over_the_name_limit_is_one_line(argv, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    if argv[0] == "model":                      # an importable config, so the id is what fails
        (tmp_path / "dir").mkdir()
        (tmp_path / "dir" / "config.json").write_text(
            '{"hidden_size": 64, "num_local_experts": 8, "num_experts_per_tok": 2, "intermediate_size": 32, '
            '"num_hidden_layers": 2, "torch_dtype": "bfloat16"}')
    rc, out, err = run_cli(argv)
    assert rc == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    assert "255" in err or "250" in err, err
    assert os.listdir(tmp_path) == (["dir"] if argv[0] == "model" else [])


def test_a_symlink_loop_in_the_user_registry_is_one_line(user_registry):
    (user_registry / "recipe").mkdir(parents=True)
    (user_registry / "recipe" / "loop.json").symlink_to("loop.json")
    rc, out, err = run_cli(["list", "recipe"])
    assert rc == 0 and "| loop | (does not load:" in out and "symlink loop" in out and err == "", err
    rc, out, err = run_cli(["show", "loop"])
    assert rc == 2 and err.count("\n") == 1 and "loop.json: a symlink loop" in err, err
