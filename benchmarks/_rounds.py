"""Alternating rounds of a paired benchmark (this tree against another checkout).

``alternate(tool, trees, a, run)`` runs ``run(tree, a)`` once per side in each of ``a.rounds`` rounds, the order
flipping every round so that drift in the host's load lands on both sides, and returns {side: [each round's
result]}. Progress goes to stderr: stdout holds only the table, for a pipe.
"""
from __future__ import annotations

import sys


def alternate(tool: str, trees: dict, a, run) -> dict:
    got = {k: [] for k in trees}
    for i in range(a.rounds):
        for k in (list(trees) if i % 2 == 0 else list(trees)[::-1]):
            print(f"{tool}: round {i + 1}/{a.rounds}, side {k}", file=sys.stderr, flush=True)
            got[k].append(run(trees[k], a))
    return got
