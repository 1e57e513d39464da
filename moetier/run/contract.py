"""The backend contract: how a device joins moetier (one small vtable, like ggml's backend interface).

Contract
--------
A backend owns device memory and kernels; the host (runtime + ledger) owns residency. Slots are integers the
backend hands out from its arenas: a RAM slot (host memory the cpu and zerocopy lanes read) or a VRAM slot
(device memory the gpu lane reads). This Protocol is everything the runtime uses; backends are found by name
through the ``moetier.backends`` entry-point group (moetier.run.registry).

    capabilities                  -> Capabilities: lanes it can run, encodings, VRAM slot count
    ram_slot_count                -> int, RAM slots in its arena (the runtime's slot allocator hands them out)
    workers, parallel_min         -> ints: its cpu lane splits a call of >= parallel_min experts over ``workers``
                                     threads (1, 0 without a cpu lane); the runtime books calls by that split
    stats                         -> dict of counters (checksum_checked, checksum_failures, reads, bytes, ...)
    route(layer, x, rows)         -> (picks [len(x)][topk] expert ids of the layer, weights [len(x)][topk]):
                                     the router on the hidden states x [rows, H] float32. A backend routes with
                                     the router weights in its store (moetier.run.router.StoreRouter); the
                                     trace-driven runtime uses a Router that replays a trace instead (same call;
                                     ``rows`` = the step's (stream, token) pairs, which only a replay reads)
    compute(lane, jobs, x)        -> {key: y [len(rows), H] float32}; jobs = [(key, slot, rows)]; lane in
                                     {"cpu", "zerocopy", "gpu"}; pure: same bytes + same rows -> same bits
    fill(key, slot, prefetch=False) -> Handle async NVMe record -> RAM slot (the transport's O_DIRECT reader);
                                     prefetch reads yield to demand reads
    cancel(handle)                -> bool: withdraw a prefetch read that has not started (False otherwise)
    push(key, src_ram_slot, vram_slot) -> Handle   async RAM -> VRAM copy (copy queue / stream)
    drain(key, vram_slot, ram_slot)    -> Handle   async VRAM -> RAM copy of an evicted expert, off the critical
                                     path; the runtime calls it for every VRAM victim the ledger picks
    landed(handle)                -> bool, non-blocking; True only when the bytes are readable at the destination
                                     (and verified when sampled). Raises TransportError if the transfer failed.
    wait(handle)                  -> blocks until landed (stall mode) or raises
    fence()                       -> returns when nothing is outstanding
    completed_seq()               -> highest sequence number s such that every handle with seq <= s finished
    begin_measured()              -> the measured steps start: read-timing samples restart (read_timing())
    read_timing()                 -> the reader's read-timing samples since begin_measured (calibration's input)
    close()                       -> fence, then free every arena

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

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

LANES = ("cpu", "zerocopy", "gpu")


class BackendUnavailable(RuntimeError):
    """The backend's runtime or device is missing (no dpctl, no GPU, no capability); the message says which."""


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
class Backend(Router, Protocol):
    capabilities: Capabilities
    ram_slot_count: int
    workers: int
    parallel_min: int
    stats: dict

    def compute(self, lane: str, jobs, x): ...
    def fill(self, key: int, slot: int, *, prefetch: bool = False): ...
    def cancel(self, handle) -> bool: ...
    def push(self, key: int, src_slot: int, vram_slot: int): ...
    def drain(self, key: int, vram_slot: int, ram_slot: int): ...
    def landed(self, handle) -> bool: ...
    def wait(self, handle): ...
    def fence(self) -> None: ...
    def completed_seq(self) -> int: ...
    def begin_measured(self) -> None: ...
    def read_timing(self) -> dict: ...
    def close(self) -> None: ...
