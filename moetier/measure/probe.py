"""The probe: a host sampler (record) and its report (utilization + chokepoints for a run record).

Contract: one import for the probe's three parts -

* the sampler (moetier.measure.sampler): ``Sampler(path, interval=0.1, ...)`` writes JSON lines of host load and
  the runtime's per-step counters; ``record(out, command, ...)`` samples while a command runs;
* the analysis (moetier.measure.probe_analysis, reading files through moetier.measure.probe_file):
  ``report(probe_path, hardware, *, run_record)`` -> ``{"utilization": ..., "chokepoints": ...}``, every number
  finite, what could not be computed listed with the reason under ``missing``;
* the rendering (moetier.measure.probe_render): ``to_markdown(report)``.

Field reference and formulas: docs/utilization.md.
"""
from __future__ import annotations

from moetier.measure.probe_analysis import BUCKETS, report, stats  # noqa: F401
from moetier.measure.probe_file import read_probe  # noqa: F401
from moetier.measure.probe_render import to_markdown  # noqa: F401
from moetier.measure.sampler import VERSION, Sampler, record  # noqa: F401

__all__ = ["BUCKETS", "VERSION", "Sampler", "read_probe", "record", "report", "stats", "to_markdown"]
