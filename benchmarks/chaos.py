"""The runtime under injected read faults, 10,000 layer steps or more (moetier.run.chaos).

    python benchmarks/chaos.py --store DIR [--recipe tiny-ci-cpu] [--layer-steps 10000] [--rate 0.05]
                               [--stall-rate 0.0001] [--steps 250] [--seed 0] [--out benchmarks/chaos.json]

Packs nothing: give it the recipe's store (``moetier store pack moetier-tiny-ci-int8 --out DIR``). Runs the recipe
once without faults, then with seeded faults (EIO, short read, flipped byte, slow completion at --rate; a stalled
completion at --stall-rate) until --layer-steps layer outputs were computed, and compares every layer output with
the fault-free run's. Writes the figures to --out (JSON) and prints them as a table; wrong outputs must be 0.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from _recipe import open_recipe, parser  # noqa: E402 - benchmarks/ is on sys.path when this script runs
from moetier.run.chaos import chaos  # noqa: E402


def table(fig: dict) -> str:
    f = fig["faults"]
    rows = [("layer steps (layer outputs computed under faults)", fig["layer_steps"]),
            ("runs: completed / stopped with one line", f"{fig['completed']} / {fig['stops']}"),
            ("faults injected: eio / short / flip / slow / stall",
             f"{f['eio']} / {f['short']} / {f['flip']} / {f['slow']} / {f['stall']}"),
            ("reads / verified on landing", f"{fig['reads']} / {fig['reads_verified']}"),
            ("failed reads read again (retries)", fig["retries"]),
            ("wrong outputs (layer outputs differing from the fault-free run)", fig["wrong_outputs"])]
    rows += [(f"stop {i + 1}", line) for i, line in enumerate(fig["stop_lines"])]
    return "| figure | value |\n|---|---|\n" + "".join(f"| {k} | {v} |\n" for k, v in rows)


def main() -> int:
    ap = parser(250)
    ap.set_defaults(recipe="tiny-ci-cpu")
    ap.add_argument("--layer-steps", type=int, default=10_000)
    ap.add_argument("--rate", type=float, default=0.05)
    ap.add_argument("--stall-rate", type=float, default=0.0001)
    ap.add_argument("--stall-timeout", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "chaos.json"))
    args = ap.parse_args()
    R, st, tr = open_recipe(args)
    t0 = time.perf_counter()

    def progress(fig):
        print(f"chaos: {fig['layer_steps']} layer steps, {fig['runs']} runs, {fig['wrong_outputs']} wrong",
              file=sys.stderr)
    fig = chaos(R, st, tr, layer_steps=args.layer_steps, rate=args.rate, stall_rate=args.stall_rate,
                seed=args.seed, steps_per_run=args.steps, stall_timeout_s=args.stall_timeout, progress=progress)
    fig["seconds"] = round(time.perf_counter() - t0, 1)
    argv = ["DIR" if i and sys.argv[i] == args.store and sys.argv[i - 1] == "--store" else a
            for i, a in enumerate(sys.argv) if i]
    fig["command"] = ("moetier store pack moetier-tiny-ci-int8 --out DIR && python benchmarks/chaos.py "
                      + " ".join(argv))
    Path(args.out).write_text(json.dumps(fig, indent=1, sort_keys=True, allow_nan=False) + "\n")
    print(json.dumps(fig, indent=1, sort_keys=True) if args.json else table(fig), end="")
    if fig["layer_steps"] < args.layer_steps:
        print(f"chaos: only {fig['layer_steps']} of {args.layer_steps} layer steps in {fig['runs']} runs (too many "
              f"runs stopped early; lower --stall-rate)", file=sys.stderr)
        return 1
    return 1 if fig["wrong_outputs"] else 0


if __name__ == "__main__":
    sys.exit(main())
