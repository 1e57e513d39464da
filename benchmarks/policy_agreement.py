"""The agreement table: each residency policy against its reference (tests/policy_references.py), the share of
requests after which both hold the same keys, per stream kind (Zipf, scan, mixed), over capacities 1 to 64.

    python benchmarks/policy_agreement.py [--steps N] [--seeds S] [--root DIR] [--json]

``--root DIR`` imports moetier from another checkout (e.g. a worktree of an older commit) to measure its policies
against the same references; a policy name it does not know is left out.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CAPS = (1, 2, 3, 4, 5, 7, 8, 10, 16, 17, 32, 33, 64)
KINDS = ("zipf", "scan", "mixed")


def table(steps: int, seeds: int) -> dict:
    from moetier.core.policies import residency as P
    from tests.policy_references import KTRANSFORMERS, TEXTBOOK, agreement, streams
    out = {}
    for name, ref in {**TEXTBOOK, **KTRANSFORMERS}.items():
        try:
            P.make(name, 4)
        except ValueError:
            continue
        kt = name.startswith("kt-")
        row = {}
        for kind in KINDS:
            same = total = 0
            for cap in CAPS:
                for seed in range(seeds):
                    s, n = agreement(lambda: P.make(name, cap), ref(cap), cap, streams(kind, cap, steps, seed),
                                     kt and hasattr(P.make(name, 1), "resident"))
                    same, total = same + s, total + n
            row[kind] = 100.0 * same / total
        out[name] = row
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--root", type=Path, help="import moetier from this checkout instead")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    sys.path.insert(0, str(REPO))
    if a.root is not None:
        sys.path.insert(0, str(a.root.resolve()))
    t = table(a.steps, a.seeds)
    if a.json:
        print(json.dumps(t, indent=1))
        return 0
    print("| policy | " + " | ".join(KINDS) + " |")
    print("|---|" + "---|" * len(KINDS))
    for name, row in t.items():
        print(f"| {name} | " + " | ".join(f"{row[k]:.1f}%" for k in KINDS) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
