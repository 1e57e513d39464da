"""Host-owned expert residency: VRAM CLOCK, exclusive RAM LRU (or decayed LFU), NVMe for everything else.

Contract
--------
Every key (= layer * experts + expert) is in exactly one state:

    ABSENT  - only on NVMe (or, in all-in-RAM mode, in RAM without bookkeeping)
    FILLING - an NVMe read is in flight (into a RAM slot, or into a staging slot for a push)
    STAGED  - landed in a staging slot, not part of the RAM tier; the next step is a push
    RAM     - resident in a RAM slot (the RAM tier)
    PUSHING - a RAM -> VRAM copy is in flight (the RAM copy is still readable)
    VRAM    - resident in a VRAM slot
    DRAINING- evicted from VRAM; its bytes are being copied back to RAM (exclusive tier)

The way into RAM, STAGED or VRAM is ``land(ticket)`` with an outstanding ticket of ``begin_fill``, ``begin_push``
or an eviction (a drain); the runtime lands one only after the backend reported its bytes readable: the host-owned
residency rule as an API. Narrower doors: ``adopt`` (a landed STAGED record joins RAM in place) and, for the
simulator only, ``fill_landed`` / ``pushes_landed`` (begin + land at one modeled instant, no tickets). ``begin_push``
reserves the VRAM slot at once; the victim drains (its own ticket) before the push lands.

Eviction never picks a protected key (the picks of the layer being planned) nor a key with a transfer in flight.
If no slot can be freed the admission is refused: the key simply stays where it was (RAM) or lands nowhere (a
staged NVMe record is dropped after use) - never a silent eviction of a key the current layer computes.

Replacement: VRAM runs CLOCK and RAM an LRU (or the window LFU); ``ram_policy`` / ``vram_policy`` may instead name
a policy of moetier.core.policies.residency (2q, slru, sieve, s3fifo, wtinylfu, dlfu, ...) or be such an object (the
oracle's Belady); ``ram_partition="layer"`` gives each layer its share of the RAM slots (``layers``, ``experts``
map keys to layers). A policy refusing the incoming key (Belady's bypass, W-TinyLFU's filter) refuses the admission.

State: flat arrays (moetier.core.tier_state), read as ``state``, ``ram`` and ``clock.slot_of`` (the dicts of before).
Where ``commits`` (moetier.core.commit_kernel says what it covers) the simulator's commit of a layer's plan is one
compiled call, ``commit(O, can_admit)``, and the ticket path's RAM puts and uses one each. Python: the rest of the
ticket path (begin_* / land / abort / adopt, per real transfer) and the ledgers the kernel does not cover (the
machines and SIEVE on the VRAM tier, moetier.peers.token_feed's uses), whose simulator commit is ``fill_landed`` /
``pushes_landed``. Pure, no I/O.
States and tickets: moetier.core.tickets; the VRAM slot map, the policy objects: moetier.core.tier_order.
"""
from __future__ import annotations

import numpy as np

from moetier.core import commit_kernel as CK
from moetier.core.policies import residency
from moetier.core.tickets import (ABSENT, DRAINING, FILLING, PUSHING, RAM, STAGED, STATE_NAMES, TIER_NVME, TIER_OF,
                                  TIER_RAM, TIER_VRAM, VRAM, ResidencyError, Ticket)
from moetier.core.tier_order import Clock, Pins, PolicySlots, lfu_terms, make_policy, replace
from moetier.core.tier_state import COUNTERS, M_BAD, RamTier, States, TierState

__all__ = ["ABSENT", "DRAINING", "FILLING", "PUSHING", "RAM", "STAGED", "STATE_NAMES", "TIER_NVME", "TIER_RAM",
           "TIER_VRAM", "VRAM", "Clock", "Ledger", "PolicySlots", "ResidencyError", "Ticket"]


class Ledger:
    """Residency of every key across VRAM / RAM / NVMe.

    ram_policy: "lru" or "lfu[:window[:halflife]]" - among the ``window`` least recently used RAM keys evict the one
    with the lowest decayed pick frequency (halflife in decode steps; 0 = no decay).
    """

    def __init__(self, keys: int, vram_slots: int, ram_slots: int, *, exclusive: bool = True,
                 ram_policy="lru", vram_policy=None, ram_partition: str = "global", layers: int | None = None,
                 experts: int | None = None):
        self.keys = keys
        self.vram_slots = max(0, min(int(vram_slots), keys))
        self.ram_slots = max(0, int(ram_slots))
        self.exclusive = exclusive
        self.all_in_ram = self.ram_slots >= keys
        self._no_ram_lru = self.all_in_ram or self.ram_slots == 0   # nothing to track in the RAM tier
        self._ts = ts = TierState(keys, self.vram_slots)
        self.codes, self.view = ts.st, ts.views()[0]        # key -> state code: a bytearray, in place; as numpy
        self.state = States(ts.st)                          # the same, as a dict (ABSENT keys not in it)
        self.ram = RamTier(ts)                              # oldest first
        self._vpol = None
        if vram_policy is not None and vram_policy != "clock" and self.vram_slots:
            self._vpol = make_policy(vram_policy, self.vram_slots, layers, experts, "global", "vram_evict", keys)
            self.clock = PolicySlots(ts, self._vpol)
        else:
            self.clock = Clock(ts)
        self._pending: dict[int, Ticket] = {}
        self._seq = 0
        self.drains: list[Ticket] = []                      # evictions awaiting their drain landing
        self._counters = {"vram_evictions": 0, "ram_evictions": 0, "refused_admissions": 0, "lfu_evictions": 0}
        self._lfu_window, halflife = 0, 0.0
        if ram_partition not in ("global", "layer"):
            raise ValueError(f"policy.ram_partition: expected 'global' or 'layer', got {ram_partition!r}")
        # not ``ram_policy or "lru"``: a policy object with no keys yet is falsy (it has a length)
        self.ram_policy = "lru" if ram_policy is None or ram_policy == "" else ram_policy
        # a policy object (the per-layer split, or a policy other than the built-in LRU / window LFU) orders the RAM
        # tier; the built-in ones order it by the tier's own list
        self._rpol = None
        builtin = isinstance(self.ram_policy, str) and (self.ram_policy == "lru" or self.ram_policy.startswith("lfu"))
        if (not builtin or ram_partition == "layer") and not self._no_ram_lru:
            spec = self.ram_policy
            if isinstance(spec, str) and spec.startswith("lfu:"):
                raise ValueError("policy.ram_evict: the window LFU ('lfu:...') is global only; use 'dlfu' per layer")
            self._rpol = make_policy(spec, self.ram_slots, layers, experts, ram_partition, "ram_evict", keys)
        elif builtin and self.ram_policy != "lru":
            self._lfu_window, halflife = lfu_terms(self.ram_policy)
        # the window LFU's halflife, counts, each one's last step, then the ledger's step (commit_kernel.decayed)
        self._lw = np.zeros(2 * keys + 2 if self._lfu_window else 2)
        self._lw[0] = halflife
        self.step = 0
        self._tier_default = TIER_RAM if self.all_in_ram else TIER_NVME
        # put / evict_for: one compiled eviction, pinning the picks and the keys mid-push (their RAM copy is read)
        self._pushing: set = set()
        self._rfast, self._vfast = bool(getattr(self._rpol, "put", 0)), bool(getattr(self._vpol, "evict_for", 0))
        self._pins = Pins().of
        self._kargs, self._put_door, self._pargs, self._use_door, self._uargs = CK.bind(self, Ledger) or (None,) * 5
        self.commits = self._kargs is not None

    # ---- queries (hot path) ---------------------------------------------------------------------------------
    def tier_of(self, key: int) -> int:
        s = self.codes[key]
        return self._tier_default if s == ABSENT else TIER_OF[s]

    def state_of(self, key: int) -> str:
        return STATE_NAMES[self.codes[key]]

    def resident(self, key: int) -> bool:
        s = self.codes[key]
        return s in (RAM, PUSHING, VRAM) or (s == ABSENT and self.all_in_ram)

    @property
    def counters(self) -> dict:
        """vram_evictions, ram_evictions, refused_admissions, lfu_evictions; the compiled commit's counts folded in."""
        c, meta = self._counters, self._ts.meta
        for m, name in COUNTERS:
            if meta[m]:
                c[name] += meta[m]
                meta[m] = 0
        return c

    # ---- recency / frequency ------------------------------------------------------------------------------
    def vram_full(self) -> bool:
        """Every VRAM slot holds a key: the next push evicts one."""
        return len(self.clock.slot_of) >= self.vram_slots

    @property
    def step(self) -> int:
        return self._step

    @step.setter
    def step(self, s: int) -> None:
        self._step = self._lw[-1] = s         # the compiled window LFU's victim search decays counts to it

    def observe(self, keys, now: int) -> None:
        """Count picks for the LFU policy (decayed by halflife)."""
        if self._lfu_window:
            CK.observe(np.fromiter(keys, np.int64), self._lw, now)

    # ---- the compiled commit ----------------------------------------------------------------------------------
    def commit(self, O: np.ndarray, can_admit: bool) -> int:
        """The simulator's commit of a plan whose lanes are ``O`` (moetier.core.plan_kernel's output) in one compiled
        call, where ``commits`` (moetier.core.commit_kernel); returns how many zerocopy picks were admitted."""
        return out if (out := CK.commit(O, *self._kargs, can_admit)) >= 0 else self.commit_failed(out)

    def commit_failed(self, out: int):
        """Raise the rule a compiled commit broke (its code ``out``, -1 or -2; the key in the meta array)."""
        k = self._ts.meta[M_BAD]
        raise ResidencyError(f"push_landed({k}): no VRAM tier" if out == -2 else
                             f"fill_landed({k}): key is {self.state_of(k)}, expected absent")

    # ---- transfers ------------------------------------------------------------------------------------------
    def _ticket(self, key: int, kind: str, staging: bool = False, slot: int = -1, victim: int = -1) -> Ticket:
        self._seq += 1
        t = Ticket(self._seq, key, kind, staging, slot, victim)
        self._pending[self._seq] = t
        return t

    def begin_fill(self, key: int, *, staging: bool = False) -> Ticket:
        """NVMe -> RAM slot (or -> staging slot when the record is headed for VRAM)."""
        s = self.codes[key]
        if s != ABSENT or self.all_in_ram:
            raise ResidencyError(f"begin_fill({key}): key is {STATE_NAMES[s]}, expected absent")
        self.codes[key] = FILLING
        return self._ticket(key, "fill", staging)

    def begin_push(self, key: int, protect=()):
        """RAM (or staging) -> VRAM copy. Reserves the VRAM slot now (the copy needs its destination), evicting
        the CLOCK victim; returns the Ticket, or None when every slot is pinned (admission refused, counted).

        The victim leaves VRAM at once: exclusive tier -> DRAINING with a drain ticket (its bytes must be copied
        to RAM before the push overwrites the slot - the executor orders drain before push); inclusive with a RAM
        copy -> RAM; otherwise -> NVMe only. ``ticket.slot`` / ``ticket.victim`` tell the executor.
        """
        st = self.codes
        s = st[key] or (RAM if self.all_in_ram else ABSENT)
        if s not in (RAM, STAGED):
            raise ResidencyError(f"begin_push({key}): key is {STATE_NAMES[s]}, expected ram or staged")
        if self.vram_slots == 0:
            raise ResidencyError(f"begin_push({key}): no VRAM tier")
        slot, victim = self.clock.take(key, protect, st, self._pins(protect, self._pushing) if self._vfast else None)
        if slot < 0:
            self._counters["refused_admissions"] += 1
            return None
        st[key] = PUSHING
        self._pushing.add(key)
        if victim >= 0:
            self._counters["vram_evictions"] += 1
            if self.all_in_ram:
                st[victim] = ABSENT
            elif victim in self.ram:           # inclusive copy still in RAM
                st[victim] = RAM
            elif self.exclusive:
                st[victim] = DRAINING
                self.drains.append(self._ticket(victim, "drain", slot=slot))
            else:
                st[victim] = ABSENT
        return self._ticket(key, "push", s == STAGED, slot, victim)

    # ---- modeled executors ---------------------------------------------------------------------------------------
    # In the simulator a transfer's bytes have landed by the time it commits the plan: begin_* + land (+ the drain
    # landing) without tickets, or, where ``commits``, the compiled ``commit`` (tests/test_bookkeeping_parity.py
    # holds the two to the same plans); the runtime's landings are real events, always through tickets.
    def fill_landed(self, key: int, protect=()) -> tuple:
        if self.codes[key] != ABSENT or self.all_in_ram:
            raise ResidencyError(f"fill_landed({key}): key is {self.state_of(key)}, expected absent")
        return self._ram_put(key, protect)

    def pushes_landed(self, keys, protect=(), staged: bool = False) -> int:
        """RAM (or staged) -> VRAM of each of ``keys`` in turn, each victim's drain included (a lane's admissions in
        one call); returns how many were admitted (the rest refused)."""
        clock = self.clock
        if not clock.n:
            if keys:
                raise ResidencyError(f"push_landed({keys[0]}): no VRAM tier")
            return 0
        st, ram, counters = self.codes, self.ram, self._counters
        all_in_ram, exclusive = self.all_in_ram, self.exclusive
        pins = self._pins(protect, self._pushing) if self._vfast else None
        admitted = 0
        for key in keys:
            slot, victim = clock.take(key, protect, st, pins)
            if slot < 0:
                counters["refused_admissions"] += 1
                continue
            if victim >= 0:
                # the victim drains into RAM while the pushed key's RAM copy is still held (the ticket path's order)
                counters["vram_evictions"] += 1
                if all_in_ram:
                    st[victim] = ABSENT
                elif victim in ram:
                    st[victim] = RAM
                elif exclusive:
                    st[victim] = ABSENT
                    self._ram_put(victim, protect)
                else:
                    st[victim] = ABSENT
            st[key] = VRAM
            if not staged and exclusive and key in ram:
                self._ram_del(key)
            admitted += 1
        return admitted

    def abort(self, ticket: Ticket) -> None:
        """A transfer failed (EIO, checksum): the key returns to where its bytes really are."""
        if self._pending.get(ticket.seq) is not ticket:
            raise ResidencyError(f"abort: {ticket!r} is not outstanding")
        del self._pending[ticket.seq]
        if ticket.kind == "fill":
            self.codes[ticket.key] = ABSENT
        elif ticket.kind == "push":
            self._pushing.discard(ticket.key)
            self.clock.remove(ticket.key)
            self._set_ram_or_absent(ticket.key, ticket.staging)
        else:  # drain failed: the bytes are gone with the VRAM slot
            self.codes[ticket.key] = ABSENT

    def _set_ram_or_absent(self, key: int, staged: bool) -> None:
        self.codes[key] = STAGED if staged else ABSENT if self.all_in_ram else RAM

    def land(self, ticket: Ticket, protect=()) -> tuple:
        """Bytes of ``ticket`` have landed: make the key resident. Returns the keys whose host slot (RAM or
        staging) is free again: RAM victims, and a pushed key's RAM copy in an exclusive tier.

        ``protect`` = keys the current layer computes; they are never chosen as victims.
        """
        pending = self._pending
        t = pending.pop(ticket.seq, None)
        if t is not ticket:
            if t is not None:              # a forged ticket must not cancel the real one
                pending[ticket.seq] = t
            raise ResidencyError(f"land: {ticket!r} is not outstanding (landed twice or never issued)")
        key, kind = ticket.key, ticket.kind
        if kind == "fill":
            if ticket.staging:
                self.codes[key] = STAGED
                return ()
            return self._ram_put(key, protect)
        if kind == "push":
            self._pushing.discard(key)
            self.codes[key] = VRAM
            if ticket.staging:
                return (key,)                # the staging slot is free again
            if self.exclusive and key in self.ram:
                self._ram_del(key)
                return (key,)                # exclusive tier: the RAM copy's slot is free again
            return ()
        # drain: the evicted VRAM copy is back in a RAM slot
        return self._ram_put(key, protect)

    def adopt(self, key: int, protect=()) -> tuple:
        """A staged record (its bytes landed) joins the RAM tier in place; returns keys evicted to NVMe."""
        if self.codes[key] != STAGED:
            raise ResidencyError(f"adopt({key}): key is {self.state_of(key)}, expected staged")
        self.codes[key] = ABSENT
        return self._ram_put(key, protect)

    def drop_staged(self, key: int) -> None:
        """A staged record was used once (or wasted) and its staging slot is reused."""
        if self.codes[key] == STAGED:
            self.codes[key] = ABSENT

    # ---- tier mechanics -------------------------------------------------------------------------------------
    def ram_hit(self, keys) -> None:
        """RAM keys computed in place: their recency (or the RAM policy's use count)."""
        if self._no_ram_lru:
            return
        if self.commits:                  # one compiled call (moetier.core.commit_kernel)
            self._use_door(np.fromiter(keys, np.int64, len(keys)), *self._uargs)
            return
        ram = self.ram
        if self._rpol is not None:
            many = getattr(self._rpol, "hit_many", None)
            if many is not None:          # a batch: one compiled call for the layer's hits
                many([k for k in keys if k in ram])
                return
            hit = self._rpol.hit
            for k in keys:
                if k in ram:
                    hit(k)
            return
        mte = ram.move_to_end
        for k in keys:
            mte(k)

    def vram_hit(self, keys) -> None:
        """VRAM keys computed: CLOCK's reference bit (or the VRAM policy's use)."""
        clock = self.clock
        if self._vpol is not None:
            clock.hit(keys)
            return
        ref, slot = clock.ref, self._ts.slot
        for k in keys:
            ref[slot[k]] = 1

    def _ram_del(self, key: int) -> None:
        self.ram.remove(key)
        if self._rpol is not None:
            self._rpol.remove(key)

    def _ram_put(self, key: int, protect=()):
        """Put key at the most-recent end of the RAM tier; returns the keys whose RAM slot is free (a tuple)."""
        ram, st = self.ram, self.codes
        if self._no_ram_lru:
            st[key] = ABSENT
            return ()
        if self.commits:                  # one compiled call (moetier.core.commit_kernel)
            v = self._put_door(key, self._pins(protect, self._pushing), *self._pargs)
            return () if v == -1 else (key,) if v == -2 else (v,)
        if self._rpol is not None:
            return self._ram_put_policy(key, protect)
        if key in ram:
            ram.move_to_end(key)
            st[key] = RAM
            return ()
        if len(ram) >= self.ram_slots:
            victim = self._ram_victim(protect)   # None: everything pinned, the record is not kept
            return self._refuse(key) if victim is None else self._ram_swap(key, victim)
        ram.add(key)                     # a new key enters at the most-recent end
        st[key] = RAM
        return ()

    def _ram_swap(self, key: int, victim: int) -> tuple:
        """``victim`` leaves the RAM tier (an inclusive copy's key stays in VRAM) and ``key`` enters at its most-recent
        end; returns (victim,), the key whose RAM slot is free."""
        ram, st = self.ram, self.codes
        ram.remove(victim)
        if st[victim] == RAM:
            st[victim] = ABSENT
        self._counters["ram_evictions"] += 1
        ram.add(key)
        st[key] = RAM
        return (victim,)

    def _refuse(self, key: int) -> tuple:
        """A RAM admission refused (every slot pinned, or the policy keeps the key out): the record is not kept."""
        self._counters["refused_admissions"] += 1
        self.codes[key] = ABSENT
        return (key,)

    def _ram_put_policy(self, key: int, protect):
        """_ram_put with a policy object ordering the tier (and, per layer, sizing it)."""
        ram, st, pol = self.ram, self.codes, self._rpol
        if key in ram:
            pol.hit(key)
            st[key] = RAM
            return ()
        if self._rfast:
            victim = pol.put(key, self._pins(protect, self._pushing))   # victim, eviction, insert: one compiled call
            if victim == key:
                return self._refuse(key)
            if victim < 0:
                ram.add(key)
                st[key] = RAM
                return ()
            return self._ram_swap(key, victim)
        full = pol.full(key) if isinstance(pol, residency.Partitioned) else len(ram) >= self.ram_slots
        if not full:
            ram.add(key)
            pol.insert(key)
            st[key] = RAM
            return ()
        evictable = (RAM,) if self.exclusive else (RAM, VRAM)
        victim = pol.victim(key, lambda k: k not in protect and k in ram and st[k] in evictable)
        if victim is None or victim == key:
            return self._refuse(key)
        replace(pol, victim, key)
        return self._ram_swap(key, victim)

    def _ram_victim(self, protect):
        """Least recently used RAM key that is neither protected nor mid-transfer (PUSHING)."""
        st = self.codes
        evictable = (RAM,) if self.exclusive else (RAM, VRAM)   # inclusive: a VRAM key's RAM copy may go
        if not self._lfu_window:
            for k in self.ram:
                if k not in protect and st[k] in evictable:
                    return k
            return None
        best, best_f, seen = None, 0.0, 0
        for k in self.ram:
            if k in protect or st[k] not in evictable:
                continue
            fk = CK.decayed(self._lw, self.keys, k)
            if best is None or fk < best_f:
                best, best_f = k, fk
            seen += 1
            if seen >= self._lfu_window:
                break
        if best is not None and best != self.ram.first():
            self._counters["lfu_evictions"] += 1
        return best

    def take_drains(self) -> list[Ticket]:
        d, self.drains = self.drains, []
        return d

    # ---- seeding --------------------------------------------------------------------------------------------
    def seed(self, ranked_keys) -> None:
        """Place keys hottest-first: VRAM first, then RAM (exclusive: the next ones; inclusive: the first ones).

        Hottest RAM keys end at the most-recent (protected) end of the LRU - the reference inserted them at the
        eviction end. Goes through fill/push tickets so the residency rule holds for seeding too.
        """
        ranked = [int(k) for k in ranked_keys]
        v = self.vram_slots
        for k in ranked[:v]:
            if not self.all_in_ram:
                self.land(self.begin_fill(k, staging=True))
            self.land(self.begin_push(k))       # free slots: never refused, no victims
        for t in self.take_drains():       # none expected while filling empty slots
            self.land(t)
        for s in range(self.clock.n):
            self.clock.ref[s] = 0
        if self.all_in_ram or self.ram_slots == 0:
            return
        ram_keys = ranked[v:v + self.ram_slots] if self.exclusive else ranked[:self.ram_slots]
        if not self.exclusive and isinstance(self._rpol, residency.Partitioned):
            # an inclusive copy joins RAM without a put: each layer keeps its hottest keys, up to its share
            ram_keys = self._rpol.within_shares(ram_keys)
        for k in reversed(ram_keys):        # coldest first, so the hottest sits at the most-recent end
            if self.codes[k] == VRAM:
                self.ram.add(k)             # inclusive copy
                if self._rpol is not None:
                    self._rpol.insert(k)
                continue
            self.land(self.begin_fill(k))

    # ---- introspection --------------------------------------------------------------------------------------
    def check(self) -> None:
        """Invariants (for tests): tiers exclusive, capacities respected, clock map consistent."""
        assert len(self.clock.slot_of) <= self.vram_slots
        for k, s in self.clock.slot_of.items():
            assert self.clock.owner[s] == k
            assert self.state.get(k) in (VRAM, PUSHING), (k, self.state.get(k))
        if not self.all_in_ram:
            assert len(self.ram) <= self.ram_slots
        assert len(self.ram) == sum(1 for _ in self.ram)
        for k in self.ram:
            st = self.state.get(k)
            if self.exclusive:
                assert st in (RAM, PUSHING), (k, st)
        for k, st in self.state.items():
            if st == RAM:
                assert k in self.ram
            if st in (VRAM, PUSHING):
                assert k in self.clock.slot_of, (k, st)
