"""benchmarks/python_share.py: functions are booked to the right piece (a kernel by its dispatcher, not its file),
python_share.md is the table of python_share.json, and a row the recipe's compare lacks is one line and exit 2."""
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

import python_share  # noqa: E402

from moetier.core import predict  # noqa: E402


def test_a_kernel_is_booked_to_the_kernels_and_python_to_its_file():
    kernels = python_share._kernel_codes()
    code = predict._gated_rank.py_func.__code__
    key = (code.co_filename, code.co_firstlineno, code.co_name)
    assert python_share.piece(key, kernels) == python_share.KERNELS
    py = predict.GatedPredictor.observe.__code__
    assert python_share.piece((py.co_filename, py.co_firstlineno, py.co_name), kernels) == "predictor"
    assert python_share.piece(("/x/moetier/core/channel.py", 1, "expire"), kernels) == "channel queue"
    assert python_share.piece(("~", 0, "<built-in method len>"), kernels) == python_share.OTHER


def test_python_share_md_is_the_recorded_run():
    bench = Path(python_share.__file__).parent
    res = json.loads((bench / "python_share.json").read_text())
    assert (bench / "python_share.md").read_text() == python_share.table(res) + "\n"
    for r in res["rows"]:
        assert abs(sum(r["shares"].values()) - 1.0) < 1e-9


def test_an_unknown_row_is_one_line_and_exit_2(capsys):
    assert python_share.main(["--rows", "moetier,no-such-row"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("python_share: --rows moetier,no-such-row: expected rows of")


def test_an_unknown_recipe_is_one_line_and_exit_2(capsys):
    assert python_share.main(["--recipe", "no-such-recipe"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("python_share: --recipe no-such-recipe:")


def test_a_zero_concurrency_is_one_line_and_exit_2(capsys):
    assert python_share.main(["--conc", "0"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "python_share: --conc and --steps: expected at least 1, --warmup at least 0"]
