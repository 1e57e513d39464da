"""The residency policies' steps as the ledger's compiled commit calls them, for each family of array state.

Contract
--------
A tier's policy state ``T`` is a tuple of arrays stacked by part (a per-layer split's layer; one part where the
policy is global), of one of three families:

- the ordered family (moetier.core.policies.lfu: LFU, decayed LFU, and LRU / FIFO from
  moetier.core.policies.recency): ``(fs, iv, st)``, as ``lfu.stack`` lays them out;
- Belady's MIN (moetier.core.policies.belady): ``(F, res, inres, pin, hk, hx, st)``, F the shared future
  ``(offs, pos, cur, now)``, as ``belady.stack`` lays them out;
- the machines (moetier.core.policies.machine: 2Q, SLRU, S3-FIFO, W-TinyLFU, kt-*) and SIEVE, on a RAM tier:
  ``(kind, iv, st, aux)``, ``kind`` their machine's (``machine.KINDS``), laid out by ``stack`` from fresh states.

The steps, compiled into the caller for T's family (a Numba overload: the family is T's type, fixed when the caller
compiles), over part ``l`` whose keys start at ``base``, on key index ``i`` (key = base + i):

    touch(T, hl, l, base, i)                a use (a resident's, or a new resident's entry)
    put(T, hl, pins, l, base, i, cap)       i enters a part of ``cap`` slots: -1 into a free slot, else the index
                                            it replaced, or -2 (refused: every resident pinned, Belady's bypass,
                                            or a machine's admission filter)
    evict_for(T, hl, pins, l, base, i)      i replaces the part's victim: its index, or -1 (nothing replaced); not
                                            the machines'
    remove(T, l, base, i)                   i leaves the part

``hl``: part ``l``'s half-life in the ordered family (the others have none). ``pins``: the keys (not indices) no step
may evict. ``stack(parts, w)``: T for a tier's parts, each ``w`` keys wide, or None where the commit does not cover
them (another policy, parts of two futures or two machines, not laid out ``j x w`` apart, machines holding keys or
with tables of two shapes). A stacked machine's state is sized once (``queues.State.fit`` refuses to grow it).

Why a module of its own: the commit (moetier.core.commit_kernel) is one source for every policy family; which
family's kernels it runs is its argument's type, so a ledger of another family compiles its own commit rather than
paying a branch per step. The steps are inlined into the caller's code: called as functions they cost the default
policy's commit about 1 us a layer call (`python benchmarks/bench_core.py --commit-profile`, this tree against the
one before it).
"""
from __future__ import annotations

import numpy as np
from numba.extending import overload

from moetier.core.jit import kernel
from moetier.core.policies import belady, lfu, machine, queues, sieve

__all__ = ["touch", "put", "evict_for", "remove", "stack", "FAMILIES", "VRAM_FAMILIES"]

# the policy classes whose state ``stack`` lays out; on a VRAM tier not the machines, whose victim the tier asks
# with conditions of its own (tier_order.PolicySlots)
FAMILIES = (lfu.LFU, belady.BeladyPolicy, machine.Machine, sieve.Sieve)
VRAM_FAMILIES = (lfu.LFU, belady.BeladyPolicy)

_ORDERED, _MACHINE = 3, 4     # the families' tuple lengths; Belady's is 7


def touch(T, hl, l, base, i):
    """Compiled callers only (module docstring)."""
    raise NotImplementedError("tier_ops.touch is compiled into its caller")


def put(T, hl, pins, l, base, i, cap):
    """Compiled callers only (module docstring)."""
    raise NotImplementedError("tier_ops.put is compiled into its caller")


def evict_for(T, hl, pins, l, base, i):
    """Compiled callers only (module docstring)."""
    raise NotImplementedError("tier_ops.evict_for is compiled into its caller")


def remove(T, l, base, i):
    """Compiled callers only (module docstring)."""
    raise NotImplementedError("tier_ops.remove is compiled into its caller")


def _ordered(T) -> bool:
    return len(T.types) == _ORDERED


def _machine(T) -> bool:
    return len(T.types) == _MACHINE


@overload(touch, inline="always")
def _touch(T, hl, l, base, i):
    if _ordered(T):
        return lambda T, hl, l, base, i: lfu._touch(T[0][l], T[1][l], T[2][l], hl, i)
    if _machine(T):            # a hit: the machine's request (machine.Machine.hit)
        return lambda T, hl, l, base, i: machine._access(T[0][0], T[1][l], T[2][l], T[3][l], base, base + i)
    return lambda T, hl, l, base, i: belady._touch(T[0], T[1][l], T[2][l], T[4][l], T[5][l], T[6][l], base, base + i)


@kernel
def _belady_put(T, pins, l, base, i, cap):
    """belady._put on part l by key index: -1 (a free slot), the replaced index, or -2 (refused)."""
    v = belady._put(T[0], T[1][l], T[2][l], T[3][l], T[4][l], T[5][l], T[6][l], base, pins, base + i, cap)
    return v - base if v >= 0 else v


@kernel
def _machine_put(T, pins, l, base, i, cap):
    """machine._put (machine.Machine.put) on part l by key index: -1 (a free slot), the replaced index, or -2
    (refused: the machine kept the key out, or every key is pinned)."""
    k = base + i
    v = machine._put(T[0][0], T[1][l], T[2][l], T[3][l], base, pins, k, cap)
    return -1 if v == -1 else -2 if v == k else v - base


@overload(put, inline="always")
def _put(T, hl, pins, l, base, i, cap):
    if _ordered(T):
        return lambda T, hl, pins, l, base, i, cap: lfu._put(T[0][l], T[1][l], T[2][l], hl, pins, base, i, cap)
    if _machine(T):
        return lambda T, hl, pins, l, base, i, cap: _machine_put(T, pins, l, base, i, cap)

    def impl(T, hl, pins, l, base, i, cap):
        return _belady_put(T, pins, l, base, i, cap)
    return impl


@overload(evict_for, inline="always")
def _evict_for(T, hl, pins, l, base, i):
    if _ordered(T):
        return lambda T, hl, pins, l, base, i: lfu._evict_for(T[0][l], T[1][l], T[2][l], hl, pins, base, i)
    if _machine(T):
        raise TypeError("tier_ops.evict_for: the machines are a RAM tier's only (VRAM_FAMILIES)")

    def impl(T, hl, pins, l, base, i):
        v = _belady_put(T, pins, l, base, i, 0)      # a part with no free slot: a victim or nothing
        return v if v >= 0 else -1
    return impl


@overload(remove, inline="always")
def _remove(T, l, base, i):
    if _ordered(T):
        return lambda T, l, base, i: lfu._remove(T[0][l], T[1][l], T[2][l], i)
    if _machine(T):
        return lambda T, l, base, i: machine._remove(T[0][0], T[1][l], T[2][l], base, base + i)

    def impl(T, l, base, i):
        inres, st = T[2][l], T[6][l]
        if inres[i]:
            inres[i] = 0
            st[1] -= 1
    return impl


def stack(parts, w: int):
    """T for ``parts`` (module docstring), each part ``w`` keys wide, their own arrays now views into it; None where
    the commit does not cover them."""
    if all(isinstance(p, lfu.LFU) for p in parts):
        if not _laid_out(parts, w, lambda p: p.fs.shape[1]):
            return None
        return lfu.stack(parts)
    if all(isinstance(p, belady.BeladyPolicy) for p in parts):
        if len({id(p.F) for p in parts}) != 1 or not _laid_out(parts, w, lambda p: p.res.shape[0]):
            return None
        return belady.stack(parts)
    if all(isinstance(p, (machine.Machine, sieve.Sieve)) for p in parts):
        return _machines(parts, w)
    return None


def _machines(parts, w: int):
    """The machines' T: each part's arrays become views into it, part j's keys from j x w; None where they are not
    one machine's, already hold keys (a fresh state has none: bind runs as the ledger is made), or their own tables
    differ in shape (W-TinyLFU's sketch follows its part's slots)."""
    ms = [p.m for p in parts]                   # a Sieve is its own state
    if len({m.KIND for m in ms}) != 1 or any(m.iv.shape[1] for m in ms) or len({m.aux.shape for m in ms}) != 1:
        return None
    iv = queues.blank(w, len(ms))
    st, aux = np.stack([m.st for m in ms]), np.stack([m.aux for m in ms])
    for j, m in enumerate(ms):
        m.base, m.iv, m.st, m.aux, m.stacked = j * w, iv[j], st[j], aux[j], True
    return np.array([machine.KINDS[ms[0].KIND]], np.int64), iv, st, aux


def _laid_out(parts, w: int, width) -> bool:
    """Part j's keys start at j x w, and each is (now) sized w keys wide: sized for its keys, it never grows, and so
    never leaves the stack."""
    if any(p.base != j * w for j, p in enumerate(parts)):
        return False
    for p in parts:
        if width(p) < w:
            p._index(p.base + w - 1)
    return all(width(p) == w for p in parts)
