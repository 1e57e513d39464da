"""The minimum bar: what a backend must pass, whatever it declares, before ``moetier conformance`` exits 0.

Contract
--------
``shortfall(report) -> str | None`` reads a full run's report (conformance.report.build_report) and names the first
requirement not met, in one line, or None. The requirements (each: at least one check of every listed name passed):

* numerics of one lane: ``test_numerics_vs_reference`` (int8 / int4g32) or ``test_exl3_expert_vs_float64``;
* fill: ``test_fill_lands_manifest_bytes``;
* landed / fence semantics: ``test_landed_never_before_readable`` and ``test_fence_leaves_nothing_pending``;
* the residency rule: ``test_residency_rule_under_adversarial_timing``.

A backend that declares no lanes computes nothing, and is named as such. An unavailable backend (its runtime or
device missing) is not judged here: ``moetier conformance`` reports that on its own (exit 2).
"""
from __future__ import annotations

BAR = (
    ("the numerics of one lane", (("test_numerics_vs_reference", "test_exl3_expert_vs_float64"),)),
    ("fill", (("test_fill_lands_manifest_bytes",),)),
    ("landed/fence semantics", (("test_landed_never_before_readable",), ("test_fence_leaves_nothing_pending",))),
    ("the residency rule", (("test_residency_rule_under_adversarial_timing",),)),
)


def _base(check: str) -> str:
    return check.split("[", 1)[0]


def shortfall(rep: dict) -> str | None:
    name = rep.get("backend")
    cap = rep.get("capabilities") or {}
    if cap and not cap.get("lanes"):
        return (f"backend {name} declares no lanes (capabilities.lanes=[]): it computes nothing, so it cannot meet "
                f"the minimum bar (one lane's numerics, fill, landed/fence, the residency rule)")
    passed = {_base(c["check"]) for c in rep.get("checks", []) if c["outcome"] == "pass"}
    for what, needs in BAR:
        for any_of in needs:
            if not passed & set(any_of):
                why = next((c["reason"] for c in rep.get("checks", []) if _base(c["check"]) in any_of), "not run")
                return (f"backend {name} does not meet the minimum bar: {what} - no {' or '.join(any_of)} passed "
                        f"({why or 'failed'})")
    return None
