"""The numerics bounds of the conformance suite, one per encoding, and the tally that holds a lane to them.

Contract
--------
A lane's output is judged against the float64 reference of the same stored record bytes
(``moetier.bytes.expert.reference``), so the weights' own quantization is not in the error: what is left is the
rounding the lane is allowed to do, and the bound follows the narrowest number format the encoding lets a lane
round to (its unit roundoff ``u``):

=========  =====================================  ==========  ============  =============
encoding   narrowest format a lane may round to   u           NMSE bound    |scale - 1|
=========  =====================================  ==========  ============  =============
int8       int16 row-scaled activations           2^-15       128 u^2       2e-5
int4g32    int16 row-scaled activations           2^-15       128 u^2       2e-5
exl3       fp16 (where the engines round)         2^-11       32 u^2        3e-4
=========  =====================================  ==========  ============  =============

128 u^2 = 1.2e-7 and 32 u^2 = 7.6e-6. Two checks per (lane, encoding), over every key and row count:

* the worst NMSE of one call's output for one key stays under the NMSE bound;
* the best uniform scale ``s = <y, ref> / <ref, ref>`` over all of them stays within the scale bound of 1.
  Rounding error has no preferred sign and averages out over ~10^5 outputs; a wrong constant does not. This is
  what catches an output scaled by 1.001 on exl3, where 1e-6 of NMSE hides inside fp16's own error.

``uniform_scale_caught(enc)`` says whether both checks together reject ``ref x 1.001`` (tests/test_conformance_meta
asserts it for every encoding). ``breaks`` and ``Tally`` are also what the backends' own tests judge by. The
measured figures land in the report's ``numerics`` section beside the bounds.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Bound:
    fmt: str               # the narrowest format the encoding lets a lane round to
    unit: float            # its unit roundoff u
    nmse_units: float      # the NMSE bound in u^2
    scale: float           # the bound on |best uniform scale - 1|

    @property
    def nmse(self) -> float:
        return self.nmse_units * self.unit ** 2


_INT16 = Bound("int16 row-scaled activations", 2.0 ** -15, 128, 2e-5)
BOUNDS = {"int8": _INT16, "int4g32": _INT16, "exl3": Bound("fp16", 2.0 ** -11, 32, 3e-4)}


def nmse(y, ref) -> float:
    y = np.asarray(y, np.float64)
    return float(((y - ref) ** 2).sum() / max((ref ** 2).sum(), 1e-30))


class Tally:
    """Worst NMSE and best uniform scale of one (lane, encoding) over many outputs; ``failures()`` names each
    bound broken, ``figures()`` is what the report shows."""

    def __init__(self, enc: str):
        self.enc, self.bound = enc, BOUNDS[enc]
        self.worst, self.where, self.dot, self.ref2, self.n = 0.0, "", 0.0, 0.0, 0

    def add(self, y, ref, where: str) -> None:
        y = np.asarray(y, np.float64)
        e = nmse(y, ref)
        if e >= self.worst:
            self.worst, self.where = e, where
        self.dot += float((y * ref).sum())
        self.ref2 += float((ref * ref).sum())
        self.n += y.size

    @property
    def scale(self) -> float:
        return self.dot / max(self.ref2, 1e-30)

    def failures(self) -> list[str]:
        b, out = self.bound, []
        if self.worst >= b.nmse:
            out.append(f"NMSE {self.worst:.3g} ({self.where}) >= the {self.enc} bound {b.nmse:.3g} "
                       f"({b.nmse_units:g} u^2, u = unit roundoff of {b.fmt})")
        if abs(self.scale - 1) >= b.scale:
            out.append(f"best uniform scale {self.scale:.7f} over {self.n} outputs is off 1 by "
                       f"{abs(self.scale - 1):.3g} >= {b.scale:g} (a systematic scale, not rounding)")
        return out

    def figures(self) -> dict:
        b = self.bound
        return {"nmse": self.worst, "nmse_bound": b.nmse, "scale_minus_1": self.scale - 1, "scale_bound": b.scale,
                "outputs": self.n}


def breaks(enc: str, y, ref, where: str = "one output") -> list[str]:
    """The bounds of ``enc`` one output ``y`` breaks against its float64 reference (empty when it holds): the
    backends' own tests judge by this, so the suite and they share one source for the bounds."""
    t = Tally(enc)
    t.add(y, ref, where)
    return t.failures()


def uniform_scale_caught(enc: str, ref, factor: float = 1.001) -> bool:
    """Whether an output that is ``ref x factor`` fails the bounds of ``enc``."""
    t = Tally(enc)
    t.add(np.asarray(ref, np.float64) * factor, ref, "scaled reference")
    return bool(t.failures())
