"""adapters.surface: describing a hook surface and the one-line mismatches (pure Python, no engine needed)."""
from __future__ import annotations

import dataclasses

from adapters.surface import check_surface, describe, found_surface


class _Base:
    pass


class _Block(_Base):
    def combine(self, final, partial, pending, shape):
        return final

    def forward(self, x, params, out_dtype=None, *, trace=False):
        return x


@dataclasses.dataclass
class _Cfg:
    gate: int
    experts: int = 0


def test_describe_kinds():
    assert describe(_Block, "class") == {"kind": "class", "bases": ["_Base"]}
    assert describe(_Block.forward, "callable")["params"] == ["self", "x", "params", "out_dtype=", "*", "trace="]
    assert describe(_Cfg, "fields") == {"kind": "fields", "fields": ["gate", "experts"]}
    assert describe(_Block.forward, "class")["kind"] == "missing"


def test_same_surface_has_no_mismatch():
    exp = {"c": describe(_Block, "class"), "m": describe(_Block.combine, "callable"), "f": describe(_Cfg, "fields")}
    assert check_surface(exp, dict(exp)) == []


def test_each_drift_is_one_line_naming_it():
    exp = {"pkg.mod.Block.combine": {"kind": "callable", "params": ["self", "final", "partial", "pending", "shape"]}}
    cases = {
        ("self", "final", "partial", "pending"): "parameter 'shape' missing",
        ("self", "final", "partial", "pending", "shape", "stream"): "new required parameter 'stream'",
        ("self", "partial", "final", "pending", "shape"): "parameter 'final' moved",
        ("self", "final", "partial", "pending", "shape="): "parameter 'shape' changed kind or default",
    }
    for got, says in cases.items():
        lines = check_surface(exp, {"pkg.mod.Block.combine": {"kind": "callable", "params": list(got)}})
        assert len(lines) == 1 and "\n" not in lines[0], lines
        assert lines[0].startswith("Block.combine: " + says), lines
    # an extra parameter with a default is not drift: the adapter never passes it
    assert check_surface(exp, {"pkg.mod.Block.combine": {
        "kind": "callable", "params": ["self", "final", "partial", "pending", "shape", "stream="]}}) == []


def test_missing_names_and_bases():
    exp = {"json.NoSuchThing": {"kind": "present"}, "collections.OrderedDict": {"kind": "class", "bases": ["list"]}}
    found = found_surface(exp)
    lines = check_surface(exp, found)
    assert found["json.NoSuchThing"]["kind"] == "missing"
    assert lines[0].startswith("NoSuchThing: missing (json has no attribute 'NoSuchThing')")
    assert lines[1] == "OrderedDict: base class 'list' missing (found bases ['dict'])"


def test_cli_adapter_check_unknown_name(capsys):
    from moetier.cli.main import main
    assert main(["adapter", "check", "nosuchengine"]) == 2
    assert capsys.readouterr().err.strip() == ("moetier: error: adapter 'nosuchengine': unknown "
                                               "(expected one of exl3xpu, exllamav3)")
