"""The exllamav3 adapter's hook surface against the installed engine (1.6.5, stand-in extension on a CPU)."""
from __future__ import annotations

import copy

from tests._exllamav3 import needs_engine

pytestmark = needs_engine


def test_surface_matches_installed_engine():
    from adapters.exllamav3 import surface
    rep = surface.check()
    assert rep.version == "1.6.5"
    assert rep.mismatches == [], rep.mismatches
    assert set(rep.found) == set(surface.EXPECTED)


def test_altered_surface_fails_with_one_line():
    from adapters.exllamav3 import surface
    # a fake: the expected table altered as if the adapter were written for an engine whose combine hook differs
    fake = copy.deepcopy(surface.EXPECTED)
    combine = "exllamav3.modules.block_sparse_mlp_cpu.BlockSparseMLP_CPU.cpu_split_combine"
    fake[combine]["params"][-1] = "out_shape"
    rep = surface.check(fake)
    assert len(rep.mismatches) == 1
    assert rep.mismatches[0].startswith(
        "exllamav3 1.6.5: BlockSparseMLP_CPU.cpu_split_combine: parameter 'out_shape' missing")
    lines = []
    assert surface.adapter_check(lines.append, fake).mismatches == rep.mismatches
    assert sum("MISMATCH" in ln for ln in lines) == 1 and not lines[-1].endswith("hooks match")


def test_missing_hook_and_version_range():
    from adapters.exllamav3 import surface
    fake = copy.deepcopy(surface.EXPECTED)
    fake["exllamav3.modules.block_sparse_mlp.BlockSparseMLP.cpu_split_gather"] = {"kind": "callable", "params": []}
    import pytest
    with pytest.raises(surface.SurfaceMismatch, match=r"^exllamav3 1.6.5: BlockSparseMLP.cpu_split_gather: missing"):
        surface.require(fake)
    assert surface.version_line("1.6.5") == ""
    assert surface.version_line("1.7.0") == ("exllamav3 1.7.0 is installed; the adapter's hook surface is pinned to "
                                            ">=1.6.5,<1.7.0")
    assert "not installed" in surface.version_line(None)


def test_adapter_check_passes_and_prints_every_hook():
    from adapters.exllamav3 import surface
    lines = []
    assert surface.adapter_check(lines.append).ok
    assert lines[-1] == f"{len(surface.EXPECTED)} hooks match"
    assert "compiled extension: stand-in" in lines[0]


def test_cli_adapter_check(capsys):
    from moetier.cli.main import main
    assert main(["adapter", "check", "exllamav3"]) == 0
    out = capsys.readouterr().out
    assert "BlockSparseMLP_CPU.cpu_split_combine (self, final_hidden_states, cpu_partial, cpu_pending, shape)" in out


def test_altered_load_path_fails_with_one_line():
    """The loader moetier_load redirects is pinned: an engine whose get_tensor lost a keyword is one line."""
    from adapters.exllamav3 import surface
    fake = copy.deepcopy(surface.EXPECTED)       # a fake: the expected table as if written for another loader
    name = "exllamav3.loader.safetensors.SafetensorsCollection.get_tensor"
    fake[name]["params"].insert(3, "stream=")
    rep = surface.check(fake)
    assert rep.mismatches == ["exllamav3 1.6.5: SafetensorsCollection.get_tensor: parameter 'stream' missing "
                              "(expected (" + ", ".join(fake[name]["params"]) + "), found ("
                              + ", ".join(surface.EXPECTED[name]["params"]) + "))"]
