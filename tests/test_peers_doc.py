"""docs/peers.md against benchmarks/compare.json: the results table and the list of cells below the best peer quote
the committed compare run, so a regenerated compare.json that moves a figure fails here until the doc follows.

On a failure the message holds the table as it should read (paste it over the doc's)."""
import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "peers.md"
HEAD = "| recipe | trace | C | moetier | best peer | moetier / best peer | oracle (structure) | moetier / oracle | moetier-lru |"


def _tok(row: dict, c: str) -> str:
    v = row["by_conc"][c]
    masked = v.get("masked_share") or 0.0
    return f"{v['tok_s']:.2f}" + (f" ({100 * masked:.1f}% masked)" if masked else "")


def results_table(doc: dict) -> list[str]:
    """The doc's results table, rendered from a compare_all document."""
    out = [HEAD, "|---|---|---|---|---|---|---|---|---|"]
    for x in doc["tables"]:
        by = {r["peer"]: r for r in x["rows"]}
        q = x["ratios"]
        for i, c in enumerate(map(str, x["concs"])):
            best, oracle = by[q["best_peer"][c]], by["oracle"]["by_conc"][c]
            struct = oracle["structure"].removeprefix("oracle-")
            lead = f"| {x['recipe']} | {Path(x['trace']).name} |" if i == 0 else "|  |  |"
            out.append(f"{lead} C{c} | {_tok(by['moetier'], c)} | {best['peer']} {best['by_conc'][c]['tok_s']:.2f} | "
                       f"{q['default_over_best_peer'][c]:.3f} | {oracle['tok_s']:.2f} ({struct}) | "
                       f"{q['default_over_oracle'][c]:.3f} | {by['moetier-lru']['by_conc'][c]['tok_s']:.2f} |")
            if "moetier-default" in by:
                out.append(f"| (shipped default) |  | C{c} | {_tok(by['moetier-default'], c)} | {best['peer']} "
                           f"{best['by_conc'][c]['tok_s']:.2f} | {q['shipped_over_best_peer'][c]:.3f} | "
                           f"{oracle['tok_s']:.2f} | {q['shipped_over_oracle'][c]:.3f} |  |")
    return out


def _compare() -> dict:
    return json.loads((ROOT / "benchmarks" / "compare.json").read_text())


def _doc_table(text: str) -> list[str]:
    lines = text.splitlines()
    i = lines.index(HEAD)
    j = next(k for k in range(i, len(lines)) if not lines[k].startswith("|"))
    return lines[i:j]


def test_results_table_quotes_compare_json():
    want = results_table(_compare())
    assert _doc_table(DOC.read_text()) == want, "docs/peers.md results table should read:\n" + "\n".join(want)


def test_every_glm_and_qwen_cell_below_the_best_peer_is_explained():
    """Each GLM / Qwen cell under 1.0x the best peer has its bullet under "Every cell below 1.0x the best peer",
    naming the recipe, the concurrency, the ratio and the peer; a bullet for a cell no longer below goes too."""
    text = DOC.read_text()
    part = text.split("**Every cell below 1.0x the best peer**", 1)[1].split("\n\n", 2)[1]
    below = {(x["recipe"], c, f"{r:.3f}", x["ratios"]["best_peer"][c])
             for x in _compare()["tables"] if x["recipe"].startswith(("glm", "qwen"))
             for c, r in x["ratios"]["default_over_best_peer"].items() if r < 1.0}
    bullets = [b for b in re.split(r"\n(?=- )", part) if b.startswith("- `glm") or b.startswith("- `qwen")]
    named = {re.match(r"- `([^`]+)`", b).group(1) for b in bullets}
    assert named == {b[0] for b in below}
    for rid, c, ratio, peer in below:
        b = next(b for b in bullets if b.startswith(f"- `{rid}`"))
        assert f"C{c}" in b and ratio in b and f"`{peer}`" in b, (rid, c, ratio, peer)
