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
simulator only, ``fill_landed`` / ``push_landed`` (begin + land at one modeled instant, no tickets). ``begin_push``
reserves the VRAM slot at once; the victim drains (its own ticket) before the push lands.

Eviction never picks a protected key (the picks of the layer being planned) nor a key with a transfer in flight.
If no slot can be freed the admission is refused: the key simply stays where it was (RAM) or lands nowhere (a
staged NVMe record is dropped after use) - never a silent eviction of a key the current layer computes.

Replacement: VRAM runs CLOCK and RAM an LRU (or the window LFU); ``ram_policy`` / ``vram_policy`` may instead name
a policy of moetier.core.policies.residency (2q, slru, sieve, s3fifo, wtinylfu, dlfu, ...) or be such an object (the
oracle's Belady); ``ram_partition="layer"`` gives each layer its share of the RAM slots (``layers``, ``experts``
map keys to layers). A policy refusing the incoming key (Belady's bypass, W-TinyLFU's filter) refuses the admission.

Pure, no I/O: on the decode critical path lookups are plain dict reads. States and tickets: moetier.core.tickets;
the VRAM slot map and the policy objects: moetier.core.tier_order; both importable from here.
"""
from __future__ import annotations

from collections import OrderedDict

from moetier.core.policies import residency
from moetier.core.tickets import (ABSENT, DRAINING, FILLING, PUSHING, RAM, STAGED, STATE_NAMES, TIER_NVME, TIER_OF,
                                  TIER_RAM, TIER_VRAM, VRAM, ResidencyError, Ticket)
from moetier.core.tier_order import Clock, Pins, PolicySlots, lfu_terms, make_policy, replace

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
        self._no_ram_lru = self.all_in_ram or self.ram_slots == 0   # nothing to track in the RAM LRU
        self._vpol = None
        if vram_policy is not None and vram_policy != "clock" and self.vram_slots:
            self._vpol = make_policy(vram_policy, self.vram_slots, layers, experts, "global", "vram_evict")
            self.clock = PolicySlots(self.vram_slots, self._vpol)
        else:
            self.clock = Clock(self.vram_slots)
        self.ram: OrderedDict[int, None] = OrderedDict()   # oldest first
        self.state: dict[int, int] = {}                    # key -> state (ABSENT keys are not stored)
        self._pending: dict[int, Ticket] = {}
        self._seq = 0
        self.drains: list[Ticket] = []                      # evictions awaiting their drain landing
        self.step = 0
        self.counters = {"vram_evictions": 0, "ram_evictions": 0, "refused_admissions": 0, "lfu_evictions": 0}
        self._lfu_window, self._lfu_halflife = 0, 0.0
        if ram_partition not in ("global", "layer"):
            raise ValueError(f"policy.ram_partition: expected 'global' or 'layer', got {ram_partition!r}")
        # not ``ram_policy or "lru"``: a policy object with no keys yet is falsy (it has a length)
        self.ram_policy = "lru" if ram_policy is None or ram_policy == "" else ram_policy
        # a policy object (the per-layer split, or a policy other than the built-in LRU / window LFU) orders the RAM
        # tier; the built-in ones keep their inlined paths
        self._rpol = None
        builtin = isinstance(self.ram_policy, str) and (self.ram_policy == "lru" or self.ram_policy.startswith("lfu"))
        if (not builtin or ram_partition == "layer") and not self._no_ram_lru:
            spec = self.ram_policy
            if isinstance(spec, str) and spec.startswith("lfu:"):
                raise ValueError("policy.ram_evict: the window LFU ('lfu:...') is global only; use 'dlfu' per layer")
            self._rpol = make_policy(spec, self.ram_slots, layers, experts, ram_partition, "ram_evict")
        elif builtin and self.ram_policy != "lru":
            self._lfu_window, self._lfu_halflife = lfu_terms(self.ram_policy)
        self._freq: dict[int, float] = {}
        self._freq_t: dict[int, int] = {}
        # the built-in exclusive LRU over a RAM tier that tracks keys: the simulator's hottest path, inlined where
        # it pays (_lru_put); every other RAM order goes through _ram_put
        self._lru_fast = (self.exclusive and not self._no_ram_lru and self._rpol is None and not self._lfu_window)
        # the planner's view, one dict read per pick
        self._tier_default = TIER_RAM if self.all_in_ram else TIER_NVME
        # put / evict_for: one compiled eviction, pinning the picks and the keys mid-push (their RAM copy is read)
        self._pushing: set = set()
        self._rfast, self._vfast = bool(getattr(self._rpol, "put", None)), hasattr(self._vpol, "evict_for")
        self._pins = Pins().of

    # ---- queries (hot path) ---------------------------------------------------------------------------------
    def tier_of(self, key: int) -> int:
        s = self.state.get(key)
        return self._tier_default if s is None else TIER_OF[s]

    def state_of(self, key: int) -> str:
        return STATE_NAMES[self.state.get(key, ABSENT)]

    def resident(self, key: int) -> bool:
        s = self.state.get(key)
        return s in (RAM, PUSHING, VRAM) or (s is None and self.all_in_ram)

    # ---- recency / frequency ------------------------------------------------------------------------------
    def vram_full(self) -> bool:
        """Every VRAM slot holds a key: the next push evicts one."""
        return len(self.clock.slot_of) >= self.vram_slots

    def observe(self, keys, now: int) -> None:
        """Count picks for the LFU policy (decayed by halflife)."""
        if not self._lfu_window:
            return
        f, ft, hl = self._freq, self._freq_t, self._lfu_halflife
        for k in keys:
            v = f.get(k, 0.0)
            if v and hl > 0:
                v *= 0.5 ** ((now - ft[k]) / hl)
            f[k] = v + 1.0
            ft[k] = now

    def _decayed(self, k: int) -> float:
        v = self._freq.get(k, 0.0)
        if v and self._lfu_halflife > 0:
            v *= 0.5 ** ((self.step - self._freq_t[k]) / self._lfu_halflife)
        return v

    # ---- transfers ------------------------------------------------------------------------------------------
    def _ticket(self, key: int, kind: str, staging: bool = False, slot: int = -1, victim: int = -1) -> Ticket:
        self._seq += 1
        t = Ticket(self._seq, key, kind, staging, slot, victim)
        self._pending[self._seq] = t
        return t

    def begin_fill(self, key: int, *, staging: bool = False) -> Ticket:
        """NVMe -> RAM slot (or -> staging slot when the record is headed for VRAM)."""
        s = self.state.get(key, ABSENT)
        if s != ABSENT or self.all_in_ram:
            raise ResidencyError(f"begin_fill({key}): key is {STATE_NAMES[s]}, expected absent")
        self.state[key] = FILLING
        return self._ticket(key, "fill", staging)

    def begin_push(self, key: int, protect=()):
        """RAM (or staging) -> VRAM copy. Reserves the VRAM slot now (the copy needs its destination), evicting
        the CLOCK victim; returns the Ticket, or None when every slot is pinned (admission refused, counted).

        The victim leaves VRAM at once: exclusive tier -> DRAINING with a drain ticket (its bytes must be copied
        to RAM before the push overwrites the slot - the executor orders drain before push); inclusive with a RAM
        copy -> RAM; otherwise -> NVMe only. ``ticket.slot`` / ``ticket.victim`` tell the executor.
        """
        s = self.state.get(key, RAM if self.all_in_ram else ABSENT)
        if s not in (RAM, STAGED):
            raise ResidencyError(f"begin_push({key}): key is {STATE_NAMES[s]}, expected ram or staged")
        if self.vram_slots == 0:
            raise ResidencyError(f"begin_push({key}): no VRAM tier")
        state = self.state
        slot, victim = self.clock.take(key, protect, state, self._pins(protect, self._pushing) if self._vfast else None)
        if slot < 0:
            self.counters["refused_admissions"] += 1
            return None
        state[key] = PUSHING
        self._pushing.add(key)
        if victim >= 0:
            self.counters["vram_evictions"] += 1
            if self.all_in_ram:
                state.pop(victim, None)
            elif victim in self.ram:           # inclusive copy still in RAM
                state[victim] = RAM
            elif self.exclusive:
                state[victim] = DRAINING
                self.drains.append(self._ticket(victim, "drain", slot=slot))
            else:
                state.pop(victim, None)
        return self._ticket(key, "push", s == STAGED, slot, victim)

    # ---- modeled executors ---------------------------------------------------------------------------------------
    # The simulator's clock says a transfer's bytes have landed by the time it commits the plan, so issue and landing
    # coincide. These do exactly begin_* + land (+ the drain landing) without allocating tickets; the runtime, whose
    # landings are real events, always goes through tickets. tests/test_runtime.py checks both paths plan the same.
    def fill_landed(self, key: int, protect=()) -> tuple:
        if key in self.state or self.all_in_ram:
            raise ResidencyError(f"fill_landed({key}): key is {self.state_of(key)}, expected absent")
        return self._ram_put(key, protect)

    def push_landed(self, key: int, protect=(), staged: bool = False) -> bool:
        """RAM (or staged) -> VRAM including the victim's drain; False if admission was refused."""
        return self.pushes_landed((key,), protect, staged) == 1

    def pushes_landed(self, keys, protect=(), staged: bool = False) -> int:
        """``push_landed`` of each of ``keys`` in turn (a lane's admissions in one call: the simulator's commit);
        returns how many were admitted."""
        clock = self.clock
        if not clock.n:
            if keys:
                raise ResidencyError(f"push_landed({keys[0]}): no VRAM tier")
            return 0
        state, ram, counters = self.state, self.ram, self.counters
        find, owner, slot_of, ref = clock.find_victim_slot, clock.owner, clock.slot_of, clock.ref
        all_in_ram, exclusive = self.all_in_ram, self.exclusive
        vpol = self._vpol is not None
        pins = self._pins(protect, self._pushing) if self._vfast else None
        ram_put = self._lru_put if self._lru_fast else self._ram_put
        admitted = 0
        for key in keys:
            if vpol:
                slot, victim = clock.take(key, protect, state, pins)   # a replacement policy orders the slots
            else:
                slot = find(protect, state, key)
                victim = owner[slot] if slot >= 0 else -1
            if slot < 0:
                counters["refused_admissions"] += 1
                continue
            if not vpol:
                # Clock.place, inlined: this runs per admission in the simulator
                if victim >= 0:
                    del slot_of[victim]
                owner[slot] = key
                slot_of[key] = slot
                ref[slot] = 1
            if victim >= 0:
                # the victim drains into RAM while the pushed key's RAM copy is still held (the ticket path's order)
                counters["vram_evictions"] += 1
                if all_in_ram:
                    state.pop(victim, None)
                elif victim in ram:
                    state[victim] = RAM
                elif exclusive:
                    del state[victim]
                    ram_put(victim, protect)
                else:
                    del state[victim]
            state[key] = VRAM
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
            self.state.pop(ticket.key, None)
        elif ticket.kind == "push":
            self._pushing.discard(ticket.key)
            self.clock.remove(ticket.key)
            self._set_ram_or_absent(ticket.key, ticket.staging)
        else:  # drain failed: the bytes are gone with the VRAM slot
            self.state.pop(ticket.key, None)

    def _set_ram_or_absent(self, key: int, staged: bool) -> None:
        if staged:
            self.state[key] = STAGED
        elif self.all_in_ram:
            self.state.pop(key, None)
        else:
            self.state[key] = RAM

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
                self.state[key] = STAGED
                return ()
            return self._ram_put(key, protect)
        if kind == "push":
            self._pushing.discard(key)
            self.state[key] = VRAM
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
        if self.state.get(key) != STAGED:
            raise ResidencyError(f"adopt({key}): key is {self.state_of(key)}, expected staged")
        del self.state[key]
        return self._ram_put(key, protect)

    def drop_staged(self, key: int) -> None:
        """A staged record was used once (or wasted) and its staging slot is reused."""
        if self.state.get(key) == STAGED:
            del self.state[key]

    # ---- tier mechanics -------------------------------------------------------------------------------------
    def ram_hit(self, keys) -> None:
        """RAM keys computed in place: their recency (or the RAM policy's use count)."""
        if self._no_ram_lru:
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
        ref, slot_of = clock.ref, clock.slot_of
        for k in keys:
            ref[slot_of[k]] = 1

    def _ram_del(self, key: int) -> None:
        del self.ram[key]
        if self._rpol is not None:
            self._rpol.remove(key)

    def _ram_put(self, key: int, protect=()):
        """Put key at the most-recent end of the RAM LRU; returns the keys whose RAM slot is free (a tuple)."""
        ram, state = self.ram, self.state
        if self._no_ram_lru:
            state.pop(key, None)
            return ()
        if self._rpol is not None:
            return self._ram_put_policy(key, protect)
        if key in ram:
            ram.move_to_end(key)
            state[key] = RAM
            return ()
        if self._lru_fast:
            return self._lru_put(key, protect)
        if len(ram) >= self.ram_slots:
            victim = self._ram_victim(protect)   # None: everything pinned, the record is not kept
            return self._refuse(key) if victim is None else self._ram_swap(key, victim)
        ram[key] = None                  # a new key enters at the most-recent end
        state[key] = RAM
        return ()

    def _ram_swap(self, key: int, victim: int) -> tuple:
        """``victim`` leaves the RAM tier (an inclusive copy's key stays in VRAM) and ``key`` enters at its most-recent
        end; returns (victim,), the key whose RAM slot is free."""
        ram, state = self.ram, self.state
        del ram[victim]
        if state[victim] == RAM:
            del state[victim]
        self.counters["ram_evictions"] += 1
        ram[key] = None
        state[key] = RAM
        return (victim,)

    def _refuse(self, key: int) -> tuple:
        """A RAM admission refused (every slot pinned, or the policy keeps the key out): the record is not kept."""
        self.counters["refused_admissions"] += 1
        self.state.pop(key, None)
        return (key,)

    def _lru_put(self, key: int, protect) -> tuple:
        """_ram_put of a key the RAM tier does not hold, under the built-in exclusive LRU (``_lru_fast``): the
        oldest RAM key neither protected nor mid-transfer makes room. Returns what _ram_put returns."""
        ram, state = self.ram, self.state
        if len(ram) >= self.ram_slots:
            for k in ram:
                if k not in protect and state[k] == RAM:
                    return self._ram_swap(key, k)
            return self._refuse(key)     # everything pinned: the record is not kept
        ram[key] = None                  # a new key enters at the most-recent end
        state[key] = RAM
        return ()

    def _ram_put_policy(self, key: int, protect):
        """_ram_put with a policy object ordering the tier (and, per layer, sizing it)."""
        ram, state, pol = self.ram, self.state, self._rpol
        if key in ram:
            pol.hit(key)
            state[key] = RAM
            return ()
        if self._rfast:
            victim = pol.put(key, self._pins(protect, self._pushing))   # victim, eviction, insert: one compiled call
            if victim == key:
                return self._refuse(key)
            if victim < 0:
                ram[key] = None
                state[key] = RAM
                return ()
            return self._ram_swap(key, victim)
        full = pol.full(key) if isinstance(pol, residency.Partitioned) else len(ram) >= self.ram_slots
        if not full:
            ram[key] = None
            pol.insert(key)
            state[key] = RAM
            return ()
        evictable = (RAM,) if self.exclusive else (RAM, VRAM)
        victim = pol.victim(key, lambda k: k not in protect and k in ram and state.get(k) in evictable)
        if victim is None or victim == key:
            return self._refuse(key)
        replace(pol, victim, key)
        return self._ram_swap(key, victim)

    def _ram_victim(self, protect):
        """Least recently used RAM key that is neither protected nor mid-transfer (PUSHING)."""
        state = self.state
        evictable = (RAM,) if self.exclusive else (RAM, VRAM)   # inclusive: a VRAM key's RAM copy may go
        if not self._lfu_window:
            for k in self.ram:
                if k not in protect and state[k] in evictable:
                    return k
            return None
        best, best_f, seen = None, 0.0, 0
        for k in self.ram:
            if k in protect or state[k] not in evictable:
                continue
            fk = self._decayed(k)
            if best is None or fk < best_f:
                best, best_f = k, fk
            seen += 1
            if seen >= self._lfu_window:
                break
        if best is not None and best != next(iter(self.ram)):
            self.counters["lfu_evictions"] += 1
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
        for k in reversed(ram_keys):        # coldest first, so the hottest sits at the most-recent end
            if self.state.get(k) == VRAM:
                self.ram[k] = None          # inclusive copy
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
        for k in self.ram:
            st = self.state.get(k)
            if self.exclusive:
                assert st in (RAM, PUSHING), (k, st)
        for k, st in self.state.items():
            if st == RAM:
                assert k in self.ram
            if st in (VRAM, PUSHING):
                assert k in self.clock.slot_of, (k, st)
