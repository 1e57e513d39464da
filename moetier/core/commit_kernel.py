"""The simulator's commit of one layer's plan: one compiled call over the ledger's arrays (moetier.core.tier_state).

Contract
--------
``commit(O, C, st, inram, link, owner, ref, slot, meta, pin, V, R, caps, vhl, rhl, can_admit)`` carries out, on
the ledger's own buffers, what moetier.core.replay.Replay's commit does through the ledger for a plan whose lanes
are ``O`` (moetier.core.plan_kernel's output: 6 lane counts, then the lanes' keys):

    1. the VRAM picks' use (CLOCK's reference bit, or a use by the VRAM policy), then the cpu lane's RAM picks' use
       (LRU: to the most recent end; a policy: a use of the key's part);
    2. each nvme_cpu pick lands in RAM (``Ledger.fill_landed``);
    3. where ``can_admit``: the zerocopy picks are pushed to VRAM, then the nvme_gpu picks from staging
       (``Ledger.pushes_landed``), each victim draining into RAM in an exclusive tier.

Returns how many zerocopy picks were admitted, or -1 (a fill of a key not absent) / -2 (a push with no VRAM tier),
the key in ``meta[M_BAD]``: a broken residency rule, which the ledger raises.
The picks (every key in O's lanes) are pinned: nothing evicts them.

Which ledgers it covers (``C``, built by the ledger): VRAM CLOCK or an array-state policy over every key or split
per layer (``V``: the parts' state stacked, moetier.core.tier_ops; a part ``C[C_VW]`` keys wide); RAM the built-in
LRU (exclusive or inclusive), its window LFU (``lfu:W:H``: the victim is the least decayed count among the ``W``
oldest evictable keys; ``rhl`` is then the ledger's ``_lw``: H, the counts, their last steps, the ledger's step) or
an array-state policy, global or split per layer (``R``, ``caps`` each part's slots, a part ``C[C_RW]`` keys wide,
``rhl`` / ``vhl`` each part's halflife: a decayed LFU's follows its part's slots); no RAM bookkeeping (all in RAM,
or no RAM slots). ``observe`` counts a layer's picks for the window LFU. The array-state policies are LFU / decayed
LFU (moetier.core.policies.lfu), LRU / FIFO (moetier.core.policies.recency), Belady's MIN
(moetier.core.policies.belady) and, on the RAM tier only, the published policies' machines and SIEVE
(moetier.core.policies.machine, sieve); their kernels are called here through moetier.core.tier_ops, not copied. The
ticket path's RAM puts and uses go through the same code (``ram_put`` / ``ram_uses``, and ``lru_*`` for the
built-in LRU). ``bind(ledger)`` is the arguments (the ledger's own buffers, the policies' arrays stacked by part),
or None where the kernel does not cover the ledger; the ledger keeps them (the buffers never move).
"""
from __future__ import annotations

import numpy as np
from moetier.core.jit import kernel

from moetier.core import tier_ops
from moetier.core.policies import residency
from moetier.core.tier_ops import evict_for, put, remove, touch
from moetier.core.tickets import ABSENT, RAM, VRAM
from moetier.core.tier_state import M_BAD, M_HAND, M_LFU_EV, M_RAM_EV, M_RAM_N, M_REFUSED, M_VRAM_EV, M_VRAM_N

__all__ = ["commit", "uses", "ram_uses", "lru_uses", "ram_put", "lru_put", "observe", "decayed", "bind", "C_KEYS",
           "C_VN", "C_RSLOTS", "C_EXCL", "C_ALLRAM", "C_NORAM", "C_VPOL", "C_RPOL", "C_RW", "C_VW", "C_WIN", "C_N"]

# C: the ledger's configuration (C_WIN: the window LFU's window, 0 for the plain LRU)
C_KEYS, C_VN, C_RSLOTS, C_EXCL, C_ALLRAM, C_NORAM, C_VPOL, C_RPOL, C_RW, C_VW, C_WIN, C_N = range(12)
# a tier without a policy object: an ordered family's state of one empty part, which the kernel never reads
_NO_POLICY = (np.zeros((1, 3, 1)), np.full((1, 4, 1), -1, np.int64), np.zeros((1, 3), np.int64))
# the ledger's steps the kernel does; a subclass that overrides one (moetier.peers.token_feed) keeps its own
_STEPS = ("vram_hit", "ram_hit", "fill_landed", "pushes_landed", "_ram_put")


def bind(led, base):
    """For ledger ``led`` (of class ``base``, or a subclass): (``commit``'s arguments past ``O`` and before
    ``can_admit``, the RAM put door and its arguments past ``pins``, the RAM uses door and its arguments past
    ``keys``: ``lru_put`` / ``lru_uses`` under the built-in LRU, else ``ram_put`` / ``ram_uses``), or None where the
    kernel does not cover the ledger (the module docstring says which it covers)."""
    if any(getattr(type(led), m) is not getattr(base, m) for m in _STEPS):
        return None
    vparts, _, vwidth = _parts(led._vpol, led.keys, tier_ops.VRAM_FAMILIES)
    if vparts == ():
        return None
    rparts, caps, width = _parts(led._rpol, led.keys)
    if rparts == ():
        return None
    V = tier_ops.stack(vparts, vwidth) if vparts else _NO_POLICY
    R = tier_ops.stack(rparts, width) if rparts else _NO_POLICY
    if V is None or R is None:
        return None
    C = np.zeros(C_N, np.int64)
    C[[C_KEYS, C_VN, C_RSLOTS, C_EXCL, C_ALLRAM, C_NORAM, C_VPOL, C_RPOL, C_RW, C_VW, C_WIN]] = (
        led.keys, led.vram_slots, led.ram_slots, led.exclusive, led.all_in_ram, led._no_ram_lru, vparts is not None,
        rparts is not None, width, vwidth, led._lfu_window)
    st, inram, link, owner, ref, slot, meta = led._ts.views()
    pin, caps = np.zeros(led.keys, np.uint8), np.array(caps, np.int64)
    # the built-in LRU has no parts: its halflife argument carries the window LFU's state (Ledger._lw)
    vhl, rhl = _halflife(vparts), _halflife(rparts) if rparts is not None else led._lw
    args = (C, st, inram, link, owner, ref, slot, meta, pin, V, R, caps, vhl, rhl)
    if rparts is None:
        return args, lru_put, (C, st, inram, link, meta, pin, rhl), lru_uses, (inram, link, meta)
    return args, ram_put, (C, st, inram, link, meta, pin, R, caps, rhl), ram_uses, (C, inram, link, meta, R, rhl)


def _halflife(parts) -> np.ndarray:
    """Each part's halflife (Belady's: none), one 0 where the tier has no parts."""
    return np.array([float(getattr(p, "halflife", 0.0)) for p in parts] if parts else [0.0])


def _parts(pol, keys: int, families=tier_ops.FAMILIES) -> tuple:
    """(a tier's array-state policy parts, or None where it has no policy object (CLOCK, the built-in LRU), each
    part's slots, a part's width in keys); parts () where the kernel does not cover the policy (one outside
    ``families``). A VRAM tier is full or not as a whole; a policy split per layer names a victim of the incoming
    key's layer."""
    if pol is None:
        return None, [0], 1
    if isinstance(pol, families):
        return [pol], [pol.capacity], keys
    if isinstance(pol, residency.Partitioned) and all(isinstance(p, families) for p in pol.parts):
        return pol.parts, pol.caps, pol.experts
    return (), [0], 1


@kernel
def _ram_add(link, inram, meta, h, k):
    last = link[h]
    link[k] = last
    link[h + 1 + k] = h
    link[h + 1 + last] = k
    link[h] = k
    inram[k] = 1
    meta[M_RAM_N] += 1


@kernel
def _ram_unlink(link, inram, meta, h, k):
    p, n = link[k], link[h + 1 + k]
    link[h + 1 + p] = n
    link[n] = p
    inram[k] = 0
    meta[M_RAM_N] -= 1


@kernel
def _ram_put(k, C, st, inram, link, meta, pin, picks, R, caps, rhl):
    """``k`` enters the RAM tier (Ledger._ram_put): a use where it is there, else a free slot, else in place of
    the tier's victim, else refused (the record is not kept, counted). Returns the victim, -1 where no RAM slot
    came free, -2 where ``k`` was refused."""
    if C[C_NORAM]:
        st[k] = ABSENT
        return -1
    if not C[C_RPOL]:
        return _lru_put(k, C, st, inram, link, meta, pin, rhl)
    w = C[C_RW]
    l = k // w
    i = k - l * w
    if inram[k]:
        touch(R, rhl[l], l, l * w, i)
        st[k] = RAM
        return -1
    v = put(R, rhl[l], picks, l, l * w, i, caps[l])
    if v == -1:
        _ram_add(link, inram, meta, C[C_KEYS], k)
        st[k] = RAM
        return -1
    return _swap_in(k, l * w + v if v >= 0 else -1, st, inram, link, meta, C[C_KEYS])


@kernel
def _lru_put(k, C, st, inram, link, meta, pin, rhl):
    """_ram_put under the built-in LRU, or its window LFU."""
    h = C[C_KEYS]
    if inram[k]:
        _ram_unlink(link, inram, meta, h, k)
        _ram_add(link, inram, meta, h, k)
        st[k] = RAM
        return -1
    if meta[M_RAM_N] < C[C_RSLOTS]:
        _ram_add(link, inram, meta, h, k)
        st[k] = RAM
        return -1
    # the least recently used key neither picked nor mid-transfer; inclusive: a VRAM key's RAM copy may go. The
    # window LFU: of the first C_WIN such keys, the first with the least decayed count
    win = C[C_WIN]
    first = link[2 * h + 1]
    x, best, least, seen = first, -1, 0.0, 0
    while x != h:
        s = st[x]
        if not pin[x] and (s == RAM or (s == VRAM and not C[C_EXCL])):
            if not win:
                best = x
                break
            f = decayed(rhl, h, x)
            if best < 0 or f < least:
                best, least = x, f
            seen += 1
            if seen >= win:
                break
        x = link[h + 1 + x]
    if win and best >= 0 and best != first:
        meta[M_LFU_EV] += 1
    return _swap_in(k, best, st, inram, link, meta, h)


@kernel
def _count_at(W, h, k, now):
    """The window LFU's count of key ``k`` decayed to step ``now`` (``W``, of ``h`` keys: the halflife, the counts,
    their last steps, the ledger's step)."""
    v, hl = W[1 + k], W[0]
    if v != 0.0 and hl > 0:
        v *= 0.5 ** ((now - W[1 + h + k]) / hl)
    return v


@kernel
def decayed(W, h, k):
    """Key ``k``'s window LFU count at the ledger's step."""
    return _count_at(W, h, k, W[2 * h + 1])


@kernel
def observe(keys, W, now):
    """The window LFU counts one use of each of ``keys`` at step ``now``, its count decayed to then."""
    h = (W.shape[0] - 2) // 2
    for k in keys:
        W[1 + k] = _count_at(W, h, k, now) + 1.0
        W[1 + h + k] = now


@kernel
def _swap_in(k, victim, st, inram, link, meta, h):
    """``victim`` leaves the RAM tier and ``k`` enters it, or, with no victim (-1), ``k`` is refused."""
    if victim < 0:                       # every slot pinned, or the policy keeps the key out
        meta[M_REFUSED] += 1
        st[k] = ABSENT
        return -2
    _ram_unlink(link, inram, meta, h, victim)
    if st[victim] == RAM:
        st[victim] = ABSENT
    meta[M_RAM_EV] += 1
    _ram_add(link, inram, meta, h, k)
    st[k] = RAM
    return victim


@kernel
def _ram_uses(keys, a, b, C, inram, link, meta, R, rhl):
    """The RAM keys among keys[a:b] computed in place, in turn: to the most recent end (LRU), or a use (a policy)."""
    if C[C_NORAM]:
        return
    if not C[C_RPOL]:
        _lru_uses(keys, a, b, inram, link, meta)
        return
    w = C[C_RW]
    for j in range(a, b):
        k = keys[j]
        if inram[k]:
            l = k // w
            touch(R, rhl[l], l, l * w, k - l * w)


@kernel
def _lru_uses(keys, a, b, inram, link, meta):
    h = len(inram)
    for j in range(a, b):
        k = keys[j]
        if inram[k]:
            _ram_unlink(link, inram, meta, h, k)
            _ram_add(link, inram, meta, h, k)


# the ticket path's doors (Ledger.ram_hit, Ledger._ram_put where the kernel covers the ledger): one call each, its
# arguments ``bind``'s; the built-in LRU's take fewer (a call's cost grows with its array arguments)
@kernel
def ram_uses(keys, C, inram, link, meta, R, rhl):
    """``Ledger.ram_hit`` of ``keys`` (an int64 array)."""
    _ram_uses(keys, 0, len(keys), C, inram, link, meta, R, rhl)


@kernel
def lru_uses(keys, inram, link, meta):
    """``ram_uses`` under the built-in LRU."""
    _lru_uses(keys, 0, len(keys), inram, link, meta)


@kernel
def ram_put(k, pins, C, st, inram, link, meta, pin, R, caps, rhl):
    """``Ledger._ram_put`` of key ``k``, the keys in ``pins`` kept; ``_ram_put``'s return value."""
    for p in pins:
        pin[p] = 1
    out = _ram_put(k, C, st, inram, link, meta, pin, pins, R, caps, rhl)
    for p in pins:
        pin[p] = 0
    return out


@kernel
def lru_put(k, pins, C, st, inram, link, meta, pin, rhl):
    """``ram_put`` under the built-in LRU or its window LFU (or no RAM bookkeeping)."""
    if C[C_NORAM]:
        st[k] = ABSENT
        return -1
    for p in pins:
        pin[p] = 1
    out = _lru_put(k, C, st, inram, link, meta, pin, rhl)
    for p in pins:
        pin[p] = 0
    return out


@kernel
def _vram_use(C, V, vhl, key):
    """A use of VRAM key ``key`` by its part's policy."""
    w = C[C_VW]
    l = key // w
    touch(V, vhl[l], l, l * w, key - l * w)


@kernel
def _pushes(O, a, b, staged, C, st, inram, link, owner, ref, slot, meta, pin, picks, V, R, caps, vhl, rhl):
    """Ledger.pushes_landed of the keys O[a:b]; returns how many were admitted."""
    n = C[C_VN]
    h = C[C_KEYS]
    admitted = 0
    for j in range(a, b):
        key = O[j]
        victim = -1
        if C[C_VPOL]:
            if meta[M_VRAM_N] < n:
                s = 0
                while owner[s] >= 0:
                    s += 1
                _vram_use(C, V, vhl, key)
            else:
                l = key // C[C_VW]
                base = l * C[C_VW]
                victim = evict_for(V, vhl[l], picks, l, base, key - base)
                if victim < 0:
                    meta[M_REFUSED] += 1
                    continue
                victim += base
                s = slot[victim]
        else:
            # CLOCK: a free slot, or the first unpinned plain-VRAM key whose reference bit is clear (clearing it
            # on the way); two sweeps and none: every slot is pinned
            s = -1
            x = meta[M_HAND]
            for _ in range(2 * n + 1):
                o = owner[x]
                if o < 0:
                    s = x
                    break
                if not pin[o] and st[o] == VRAM:
                    if ref[x]:
                        ref[x] = 0
                    else:
                        s = x
                        break
                x = x + 1 if x + 1 < n else 0
            if s < 0:
                meta[M_REFUSED] += 1
                continue
            meta[M_HAND] = s + 1 if s + 1 < n else 0
            victim = owner[s]
        if victim >= 0:
            slot[victim] = -1
        else:
            meta[M_VRAM_N] += 1
        owner[s] = key
        slot[key] = s
        ref[s] = 1
        if victim >= 0:
            # the victim drains into RAM while the pushed key's RAM copy is still held (the ticket path's order)
            meta[M_VRAM_EV] += 1
            if C[C_ALLRAM]:
                st[victim] = ABSENT
            elif inram[victim]:
                st[victim] = RAM
            elif C[C_EXCL]:
                st[victim] = ABSENT
                _ram_put(victim, C, st, inram, link, meta, pin, picks, R, caps, rhl)
            else:
                st[victim] = ABSENT
        st[key] = VRAM
        if not staged and C[C_EXCL] and inram[key]:
            _ram_unlink(link, inram, meta, h, key)
            if C[C_RPOL]:
                w = C[C_RW]
                l = key // w
                remove(R, l, l * w, key - l * w)
        admitted += 1
    return admitted


@kernel
def uses(O, C, st, inram, link, owner, ref, slot, meta, pin, V, R, caps, vhl, rhl):
    """Step 1 of ``commit`` alone (``commit``'s arguments, ``can_admit`` aside): the uses of the plan's VRAM picks,
    then of the cpu lane's RAM picks (the runtime's ``Replay.touch``, whose landings are tickets)."""
    e_gpu = 6 + O[0]
    if C[C_VPOL]:
        for j in range(6, e_gpu):
            _vram_use(C, V, vhl, O[j])
    else:
        for j in range(6, e_gpu):
            ref[slot[O[j]]] = 1
    e_zc = e_gpu + O[1]
    _ram_uses(O, e_zc, e_zc + O[2], C, inram, link, meta, R, rhl)


@kernel
def commit(O, C, st, inram, link, owner, ref, slot, meta, pin, V, R, caps, vhl, rhl, can_admit):
    e_gpu = 6 + O[0]
    e_zc = e_gpu + O[1]
    e_cpu = e_zc + O[2]
    e_ncpu = e_cpu + O[3]
    e_ngpu = e_ncpu + O[4]
    picks = O[6:e_ngpu + O[5]]
    for k in picks:
        pin[k] = 1
    out = 0
    uses(O, C, st, inram, link, owner, ref, slot, meta, pin, V, R, caps, vhl, rhl)
    # 2. fills
    for j in range(e_cpu, e_ncpu):
        k = O[j]
        if st[k] != ABSENT or C[C_ALLRAM]:
            meta[M_BAD] = k
            out = -1
            break
        _ram_put(k, C, st, inram, link, meta, pin, picks, R, caps, rhl)
    # 3. pushes
    if out == 0 and can_admit:
        if C[C_VN] == 0 and (O[1] or O[4]):
            meta[M_BAD] = O[e_gpu] if O[1] else O[e_ncpu]
            out = -2
        else:
            if O[1]:
                out = _pushes(O, e_gpu, e_zc, False, C, st, inram, link, owner, ref, slot, meta, pin, picks, V, R,
                              caps, vhl, rhl)
            if O[4]:
                _pushes(O, e_ncpu, e_ngpu, True, C, st, inram, link, owner, ref, slot, meta, pin, picks, V, R,
                        caps, vhl, rhl)
    for k in picks:
        pin[k] = 0
    return out
