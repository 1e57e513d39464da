"""The compare tables for every shipped recipe on its trace: benchmarks/compare.json and compare.md.

Run: PYTHONPATH=. python benchmarks/compare_all.py [--steps N] [--recipes a,b]   (about 2 x 14 rows x 3
concurrencies x recipes sim runs; --steps caps the measured steps of each run). The tables are what
`moetier compare RECIPE --steps N --json` prints, one per recipe.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from moetier.atomic import atomic_write
from moetier.cli.common import find_path
from moetier.cli.compare import format_compare
from moetier.core import records as spec
from moetier.core.policies.compare import compare
from moetier.traces.format import load_trace

HERE = Path(__file__).resolve().parent
RECIPES = ("glm53-rtx3090-55g-nvx4", "glm53-rtx3090-55g-nvx4-cold2b", "glm53-rtx5070-20g-nvme1",
           "qwen38fn-arcb70-16g-nvx4", "qwen38fn-arcb70-32g-nvx4", "tiny-ci-cuda")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--recipes", default=",".join(RECIPES))
    ap.add_argument("--out", default=str(HERE / "compare"))
    a = ap.parse_args(argv)
    docs = []
    for rid in a.recipes.split(","):
        R = spec.resolve(rid, [])
        tr = load_trace(find_path(R.trace), layers=R.layers, experts=R.experts, topk=R.topk, model_id=R.model_id)
        d = compare(R, tr, concs=[1, 2, 4], max_steps=a.steps, trace_name=R.trace,
                    progress=lambda n, i, k: print(f"{rid}: {n} ({i + 1}/{k})", file=sys.stderr, flush=True))
        d["command"] = f"python -m moetier compare {rid} --steps {a.steps} --json"
        docs.append(d)
        out = Path(a.out)
        atomic_write(out.with_suffix(".json"), lambda f: f.write(json.dumps(
            {"steps": a.steps, "command": f"PYTHONPATH=. python benchmarks/compare_all.py --steps {a.steps}",
             "tables": docs}, indent=1, sort_keys=True).encode()))
        md = [f"# compare: every shipped recipe on its trace ({a.steps} measured steps per run)", "",
              f"Reproduce: `PYTHONPATH=. python benchmarks/compare_all.py --steps {a.steps}` (one recipe: "
              f"`python -m moetier compare RECIPE --steps {a.steps}`).", ""]
        for x in docs:
            md += [f"## {x['recipe']}", "", "```", f"$ {x['command'].replace(' --json', '')}", format_compare(x),
                   "```", ""]
        atomic_write(out.with_suffix(".md"), lambda f: f.write("\n".join(md).encode()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
