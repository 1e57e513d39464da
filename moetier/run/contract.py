"""The backend contract: how a device joins moetier, in one place (one small vtable, like ggml's backend interface).

Contract
--------
A backend owns device memory and kernels; the host (runtime + ledger) owns residency. Slots are integers the
backend hands out from its arenas: a RAM slot (host memory the cpu and zerocopy lanes read) or a VRAM slot
(device memory the gpu lane reads). Backends are found by name through the ``moetier.backends`` entry-point group
(moetier.run.registry), whose target is a factory ``(store, *, ram_slots, vram_slots=0, **options) -> backend``;
the registry passes an option only when the factory's signature accepts it (``OPTIONS``).

Required (``REQUIRED``; ``check`` refuses a backend without one, or with a verb that is not callable, naming each)

    capabilities                  -> Capabilities: lanes it can run, encodings, VRAM slot count
    ram_slot_count                -> int, RAM slots in its arena (the runtime's slot allocator hands them out)
    compute(lane, jobs, x)        -> {key: y [len(rows), H] float32}; jobs = [(key, slot, rows)]; lane in
                                     {"cpu", "zerocopy", "gpu"}; pure: same bytes + same rows -> same bits
    fill(key, slot, *, prefetch=False) -> Handle: async NVMe record -> RAM slot; prefetch reads yield to demand reads.
                                     moetier.bytes.transport.Reader does it over any pool that follows the slot pool
                                     protocol (moetier.bytes.pool: ``BufferSlotPool`` over the device's host memory)
    landed(handle)                -> bool, non-blocking; True only when the bytes are readable at the destination
                                     (and verified when sampled). Raises TransportError if the transfer failed.
    wait(handle)                  -> blocks until landed, or raises TransportError
    fence()                       -> returns when nothing is outstanding
    completed_seq()               -> highest sequence number s such that every handle with seq <= s finished
    close()                       -> fence, then free every arena

Required when ``capabilities.vram_slots > 0`` (``VRAM_REQUIRED``)

    push(key, src_ram_slot, vram_slot) -> Handle   async RAM -> VRAM copy (copy queue / stream)
    drain(key, vram_slot, ram_slot)    -> Handle   async VRAM -> RAM copy of an evicted expert, off the critical
                                     path; the runtime calls it for every VRAM victim the ledger picks

Optional (``OPTIONAL``: verb -> what a backend without it does; ``check`` binds these defaults from ``Defaults``)

    push / drain                  -> raise BackendUnavailable: no VRAM tier
    cancel(handle)                -> False: nothing is withdrawn (a prefetch read then lands and is used or dropped)
                                     else True only for a read that never lands (state cancelled, its slot untouched:
                                     the host reuses the slot at once)
    route(layer, x, rows)         -> raise BackendUnavailable: no router of its own (the runtime then routes by a
                                     trace; ``moetier.run.router.StoreRouter`` routes with the store's router
                                     weights: returns picks [len(x)][topk] and weights [len(x)][topk])
    workers, parallel_min         -> 1, 0: the cpu lane runs a call unsplit (the runtime books calls by that split)

Telemetry (optional; what calibration and `moetier run` read, ``TELEMETRY`` gives the shapes)

    stats                         -> {} ; else counters: reads, bytes, read_ms, checksum_checked, checksum_failures,
                                     failures, short_reads, io_errors, cancelled (the Reader's) plus the backend's own
                                     (pushes, drains, push_bytes, drain_bytes, ...): {name: int | float}
    begin_measured()              -> no-op; else the measured steps start: read-timing samples restart
    read_timing()                 -> {"latency_by_qd": {}, "wake_ms": [], "burst_ms": []}; else the samples since
                                     begin_measured: latency_by_qd {demand queue depth: [submit-to-landed ms]},
                                     wake_ms [ms from landing to a blocked wait() resuming], burst_ms
                                     [(burst, queue depth, ms)] (moetier.bytes.transport.Reader.read_timing)

Test-only hooks (``TEST_HOOKS``; the conformance suite uses them when offered and says so in its capability table;
the runtime never calls them): ``ram_view(slot)`` a uint8 view of a RAM slot (the minimum bar's fill and
landed-before-readable checks read through it, so a backend without it cannot pass); ``read_vram(slot)`` a host
copy of a VRAM slot's bytes; ``exl3_decode(lane, trellis, codebook)``, ``exl3_raw_gemm(lane, xh, trellis, codebook)``,
``exl3_int_forward(lane, jobs, x, shift, a_max)`` the EXL3 kernel's parts (conformance/test_exl3.py).

Handles carry a monotonic ``seq`` per backend (moetier.run.events shares that logic between backends), the
``key``, ``state`` (pending | landed | failed | cancelled), ``prefetch`` and the read's ``t_submit`` / ``t_landed``
(perf_counter seconds; 0.0 for copies). The host marks a key resident (``Ledger.land``) only after
``landed(handle)`` returned True for the transfer that ``Ledger.begin_fill`` / ``begin_push`` ticketed - the
runtime pairs each ticket with its handle. Nothing in a backend may change residency.

There is no ``victims()``: every eviction is host-planned (the ledger's clock picks the VRAM victim, the runtime
drains it). A device that evicted on its own would change residency behind the ledger, which this contract
forbids; a device-side cache would join as a new lane, not as evictions the host has to discover.
"""
from __future__ import annotations

import types
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

LANES = ("cpu", "zerocopy", "gpu")
REQUIRED = ("capabilities", "ram_slot_count", "compute", "fill", "landed", "wait", "fence", "completed_seq", "close")
VRAM_REQUIRED = ("push", "drain")
VALUES = ("capabilities", "ram_slot_count")          # the required members that are values; the rest are verbs
OPTIONAL = {
    "push": "raises BackendUnavailable (no VRAM tier)",
    "drain": "raises BackendUnavailable (no VRAM tier)",
    "cancel": "returns False (nothing withdrawn)",
    "route": "raises BackendUnavailable (no router of its own: route by a trace)",
    "workers": "1", "parallel_min": "0 (calls run unsplit)",
    "stats": "{}", "begin_measured": "does nothing", "read_timing": "empty samples",
}
TELEMETRY = {
    "stats": "{counter: int | float}",
    "begin_measured": "() -> None",
    "read_timing": '{"latency_by_qd": {qd: [ms]}, "wake_ms": [ms], "burst_ms": [(burst, qd, ms)]}',
}
TEST_HOOKS = ("ram_view", "read_vram", "exl3_decode", "exl3_raw_gemm", "exl3_int_forward")
# the options moetier's callers may pass a factory, with the value that means "not asked for": one the factory does
# not accept is dropped at that value and refused at any other (moetier.run.registry)
OPTIONS = {"verify_rate": 1.0, "faults": None}


class BackendUnavailable(RuntimeError):
    """The backend's runtime or device is missing (no dpctl, no GPU, no capability); the message says which."""


class ContractError(BackendUnavailable):
    """A backend that does not meet this contract (a required verb missing); the message names each."""


@dataclass(frozen=True)
class Capabilities:
    name: str
    device: str                       # human-readable device description
    lanes: frozenset                  # subset of LANES
    encodings: frozenset              # expert encodings its kernels handle
    vram_slots: int = 0               # device arena size in expert slots (0 = no VRAM tier)
    notes: tuple = ()

    def has(self, lane: str) -> bool:
        return lane in self.lanes


@runtime_checkable
class Handle(Protocol):
    seq: int
    key: int
    state: str
    prefetch: bool
    t_submit: float
    t_landed: float


@runtime_checkable
class Router(Protocol):
    def route(self, layer: int, x, rows=None) -> tuple: ...


@runtime_checkable
class Backend(Protocol):
    """The required part (``REQUIRED``); ``Defaults`` holds the optional verbs' defaults."""
    capabilities: Capabilities
    ram_slot_count: int

    def compute(self, lane: str, jobs, x): ...
    def fill(self, key: int, slot: int, *, prefetch: bool = False): ...
    def landed(self, handle) -> bool: ...
    def wait(self, handle): ...
    def fence(self) -> None: ...
    def completed_seq(self) -> int: ...
    def close(self) -> None: ...


class Defaults:
    """The optional verbs' defaults (``OPTIONAL``). A backend may inherit them; ``check`` binds the missing ones."""
    workers, parallel_min = 1, 0

    @property
    def stats(self) -> dict:
        return {}

    def push(self, key: int, src_slot: int, vram_slot: int):
        raise BackendUnavailable(f"{self.capabilities.name} backend: no VRAM tier (push)")

    def drain(self, key: int, vram_slot: int, ram_slot: int):
        raise BackendUnavailable(f"{self.capabilities.name} backend: no VRAM tier (drain)")

    def cancel(self, handle) -> bool:
        return False

    def route(self, layer: int, x, rows=None):
        raise BackendUnavailable(f"{self.capabilities.name} backend: no router of its own; route by a trace")

    def begin_measured(self) -> None:
        pass

    def read_timing(self) -> dict:
        return {"latency_by_qd": {}, "wake_ms": [], "burst_ms": []}


def missing(be) -> list:
    """The required members ``be`` lacks (push and drain too when it declares VRAM slots); a verb that is there but
    not callable (``compute = None``) counts as lacking."""
    need = REQUIRED + (VRAM_REQUIRED if int(getattr(getattr(be, "capabilities", None), "vram_slots", 0) or 0) else ())
    return [v for v in need if not hasattr(be, v) or (v not in VALUES and not callable(getattr(be, v)))]


def check(be, name: str = ""):
    """``be`` with every optional verb it lacks bound to its default; ContractError naming each missing required one."""
    lacks = missing(be)
    if lacks:
        raise ContractError(f"backend {name or type(be).__name__!r} does not meet moetier.run.contract: it lacks "
                            f"{', '.join(lacks)} (required)")
    for verb in OPTIONAL:
        if hasattr(be, verb):
            continue
        default = Defaults.__dict__[verb]
        if isinstance(default, property):
            setattr(be, verb, default.fget(be))
        elif callable(default):
            setattr(be, verb, types.MethodType(default, be))
        else:
            setattr(be, verb, default)
    return be
