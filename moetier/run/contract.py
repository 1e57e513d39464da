"""The backend contract: how a device joins moetier (one small vtable, like ggml's backend interface).

Contract
--------
A backend owns device memory and kernels; the host (runtime + ledger) owns residency. Slots are integers the
backend hands out from its arenas: a RAM slot (host memory the cpu and zerocopy lanes read) or a VRAM slot
(device memory the gpu lane reads).

    capabilities                  -> Capabilities: lanes it can run, encodings, VRAM slot count
    route(layer, rows)            -> {key: [row, ...]}  the step's picks (the runtime replays routing from a trace;
                                     a real engine asks its router)
    compute(lane, jobs, x)        -> {key: y [len(rows), H] float32}; jobs = [(key, slot, rows)]; lane in
                                     {"cpu", "zerocopy", "gpu"}; pure: same bytes + same rows -> same bits
    fill(key, slot, prefetch=False) -> Handle async NVMe record -> RAM slot (the transport's O_DIRECT reader);
                                     prefetch reads yield to demand reads
    cancel(handle)                -> bool (optional) withdraw a prefetch read that has not started
    push(key, src_ram_slot, vram_slot) -> Handle   async RAM -> VRAM copy (copy queue / stream)
    drain(key, vram_slot, ram_slot)    -> Handle   async VRAM -> RAM copy of an evicted expert, off the critical path
    victims()                     -> [(key, vram_slot)] evictions the device reported (devices with device-side
                                     caches); host-planned evictions are passed to drain() directly
    landed(handle)                -> bool, non-blocking; True only when the bytes are readable at the destination
                                     (and verified when sampled). Raises TransportError if the transfer failed.
    wait(handle)                  -> blocks until landed (stall mode) or raises
    fence()                       -> returns when nothing is outstanding
    completed_seq()               -> highest sequence number s such that every handle with seq <= s finished

Handles carry a monotonic ``seq`` per backend. The host marks a key resident (``Ledger.land``) only after
``landed(handle)`` returned True for the transfer that ``Ledger.begin_fill`` / ``begin_push`` ticketed - the
runtime pairs each ticket with its handle. Nothing in a backend may change residency.
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


class Backend(Protocol):
    capabilities: Capabilities

    def compute(self, lane: str, jobs, x): ...
    def fill(self, key: int, slot: int, *, prefetch: bool = False): ...
    def push(self, key: int, src_slot: int, vram_slot: int): ...
    def drain(self, key: int, vram_slot: int, ram_slot: int): ...
    def victims(self) -> list: ...
    def landed(self, handle) -> bool: ...
    def wait(self, handle): ...
    def fence(self) -> None: ...
    def completed_seq(self) -> int: ...
    def close(self) -> None: ...


def get_backend(name: str, store, *, ram_slots: int, vram_slots: int = 0, **kw):
    """Construct a backend by name ("cpu", "sycl", "cuda"); BackendUnavailable with the reason if it cannot run."""
    if name == "cpu":
        from backends.cpu.backend import CpuBackend
        return CpuBackend(store, ram_slots=ram_slots, **kw)
    if name == "sycl":
        from backends.sycl.backend import SyclBackend
        return SyclBackend(store, ram_slots=ram_slots, vram_slots=vram_slots, **kw)
    if name == "cuda":
        from backends.cuda.backend import CudaBackend
        return CudaBackend(store, ram_slots=ram_slots, vram_slots=vram_slots, **kw)
    raise BackendUnavailable(f"--backend {name!r}: unknown backend (expected cpu, sycl or cuda)")
