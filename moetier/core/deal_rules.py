"""The peer rows' lane deals as rules the planner kernel applies (moetier.core.plan_kernel), not Python hooks.

Contract
--------
``PlanContext.deal`` names the rule: ``planner`` (the kernel deals on costs, min-max; moetier's own rows and the
oracle's) or one of the published systems' deals (moetier.peers.rows):

    cpu       every RAM pick on the cpu lane, every NVMe pick read into RAM and computed there (llama.cpp,
              KTransformers: experts off the GPU run on the CPU)
    gpu       every NVMe pick read and pushed to VRAM; RAM picks to the GPU's lane (mixtral-offloading)
    latency   a RAM pick on the cpu lane where its cpu cost (per_expert + per_extra_token x (m - 1)) is no more
              than the GPU lane's, NVMe picks read into RAM (Fiddler)
    fraction  the heaviest share q = cpu per_expert / (cpu per_expert + fetch) of the misses (RAM and NVMe picks,
              by rows then key, descending) fetched to the GPU, the rest on the cpu lane (FreeToken)

``terms(ctx)`` packs the rule and its costs (``DEAL_N`` floats, appended to the planner's terms); a rule other than
``planner`` applies only where the recipe has a cpu lane and a GPU lane (zerocopy or gpu), else the kernel deals.
``rule_deal(T, I)`` is a forced deal in the planner kernel's ``D`` layout (per pick its cpu / nvme_cpu bits, then
the NVMe picks in the order their lanes take them: nvme_cpu's, then nvme_gpu's, each in pick order), for the picks
``I`` (keys, rows, ledger states). One rule, one place: the layer-by-layer planner and the simulator's step loop
(moetier.core.step_kernel) both deal through it.
"""
from __future__ import annotations

import numpy as np

from moetier.core.jit import kernel
from moetier.core.tickets import PUSHING, RAM, VRAM

__all__ = ["RULES", "DEAL_N", "terms", "rule_deal"]

RULES = ("planner", "cpu", "gpu", "latency", "fraction")
CPU, GPU, LATENCY, FRACTION = range(1, 5)
# T: the rule, the misses' fetched share, the cpu lane's per_expert / per_extra_token, the GPU lane's
T_RULE, T_Q, T_CPE, T_CPX, T_ZE, T_ZX, DEAL_N = range(7)


def terms(ctx) -> tuple:
    """``T`` for a PlanContext: zeros where the kernel deals."""
    rule = RULES.index(ctx.deal)
    zc = ctx.zerocopy or ctx.gpu
    if not rule or ctx.cpu is None or zc is None:
        return (0.0,) * DEAL_N
    cpe, cpx = ctx.cpu[1], ctx.cpu[2]
    fetch = ctx.push_ms + ctx.gpu[1] if ctx.gpu is not None else zc[1]
    q = cpe / (cpe + fetch) if cpe + fetch > 0 else 0.5
    return float(rule), q, cpe, cpx, zc[1], zc[2]


@kernel
def _fetched(I, miss, f):
    """Whether each pick is among the first ``f`` misses in (rows, key) descending order."""
    n = I.shape[1]
    out = np.zeros(n, np.bool_)
    for i in range(n):
        if miss[i]:
            above = 0
            for j in range(n):
                if miss[j] and (I[1, j] > I[1, i] or I[1, j] == I[1, i] and I[0, j] > I[0, i]):
                    above += 1
            out[i] = above < f
    return out


@kernel
def rule_deal(T, I):
    """The forced deal of rule ``T[T_RULE]`` over picks ``I`` (module docstring)."""
    n = I.shape[1]
    rule = T[T_RULE]
    D = np.zeros(2 * n, np.int64)
    miss = np.zeros(n, np.bool_)        # a RAM or NVMe pick
    nvme = np.zeros(n, np.bool_)
    n_miss = 0
    for i in range(n):
        s = I[2, i]
        nvme[i] = s != RAM and s != PUSHING and s != VRAM
        miss[i] = s != VRAM
        n_miss += miss[i]
    fetched = _fetched(I, miss, round(T[T_Q] * n_miss)) if rule == FRACTION else np.zeros(n, np.bool_)
    for i in range(n):
        if nvme[i] or not miss[i] or fetched[i]:
            if nvme[i] and rule != GPU and not fetched[i]:
                D[i] = 2
        elif rule == CPU or rule == FRACTION:
            D[i] = 1
        elif rule == LATENCY:
            m1 = I[1, i] - 1
            D[i] = 1 if T[T_CPE] + T[T_CPX] * m1 <= T[T_ZE] + T[T_ZX] * m1 else 0
    at = n
    for lane in (2, 0):                 # nvme_cpu's, then nvme_gpu's
        for i in range(n):
            if nvme[i] and (D[i] & 2) == lane:
                D[at] = i
                at += 1
    return D[:at]
