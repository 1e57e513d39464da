"""The moetier backend of the exllamav3 adapter: RAM and VRAM slots, transfers, and the lanes as the engine runs them.

Contract: moetier.run.contract. The runtime (moetier.run.runtime.Runtime) drives it exactly as it drives the other
backends; what differs is who computes which lane:

* ``cpu``: moetier's EXL3 CPU lane on the RAM slot's record bytes, in place: the Numba kernel
  (``backends.cpu.exl3.expert_forward``, exact mode, fp16 at the engine's rounding points; the NumPy reference
  ``moetier.bytes.exl3.expert_forward`` where numba is not installed); it returns each expert's output rows,
  unweighted, as every backend does.
* ``gpu`` and ``zerocopy``: exllamav3's own kernels compute these picks after its router returns, reading the
  experts through its pointer tables. ``compute`` therefore points the tables' rows of those keys at the slot it is
  handed (a VRAM slot, or a RAM slot's device-visible address) - the runtime hands a lane only slots whose bytes it
  saw land, so a row never points at bytes that have not landed - and returns zero partials (the engine adds its
  own). ``point`` is set by ``attach`` (adapters.exllamav3.attach.Tables.point). A push or drain that lands
  points the key's rows at its new slot too (``_landed_copy``): rows follow bytes, never precede them.

RAM slots are a moetier.bytes.transport.SlotPool filled by its O_DIRECT Reader from a store of exl3 records
(moetier.bytes.store; ``moetier store pack --checkpoint`` writes one); on CUDA the pool is registered with
``cudaHostRegister`` (mapped) so the zerocopy lane's rows are its device addresses. VRAM slots are one uint8 torch
tensor on the engine's device (on a CPU-only machine that device is the CPU). Pushes and drains are torch copies on a
copy stream with an event each (CUDA) or immediate copies (CPU); fills, pushes and drains share one monotonic seq
(moetier.run.events.Sequencer, as in moetier's own device backends).
"""
from __future__ import annotations

import numpy as np

from adapters.engine_lanes import EngineLanes
from moetier.bytes.expert import EXL3
from moetier.bytes.teardown import close_all
from moetier.bytes.transport import Reader, SlotPool
from moetier.run.contract import BackendUnavailable, Capabilities


class EngineBackend(EngineLanes):
    def __init__(self, store, *, ram_slots: int, vram_slots: int, device="cpu", queue_depth: int = 16,
                 verify_rate: float = 1.0, direct: bool = True, any_store: bool = False,
                 lanes=("cpu", "zerocopy", "gpu"), faults=None):
        import torch
        if store.layout.encoding != EXL3 and not any_store:
            raise BackendUnavailable(f"exllamav3 backend: store {store.path} holds {store.layout.encoding!r} "
                                     f"records, expected {EXL3!r} (moetier store pack --checkpoint)")
        self.torch = torch
        self.store, self.layout = store, store.layout
        self.record_bytes = int(store.record_bytes)
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        self.pool = SlotPool(max(1, int(ram_slots)), self.record_bytes)
        self.reader = Reader(store, self.pool, queue_depth=queue_depth, verify_rate=verify_rate, direct=direct,
                             faults=faults)
        self.vram_slots = int(vram_slots)
        self.arena = torch.zeros((max(1, self.vram_slots), self.record_bytes), dtype=torch.uint8, device=self.device)
        self._host = torch.from_numpy(np.frombuffer(self.pool._mm, np.uint8, self.pool.nbytes, self.pool._off)
                                      ).view(self.pool.n, self.pool.slot_bytes)
        self._ram_dev = self.pool.base          # the zerocopy lane's address of RAM slot 0 (device alias on CUDA)
        self._registered = False
        self.copy_stream = None
        if self.cuda:
            self._register_pool()
            self.copy_stream = torch.cuda.Stream(self.device)
        self.capabilities = Capabilities(
            name="exllamav3", device=f"exllamav3 on {self.device}", lanes=frozenset(lanes),
            encodings=frozenset({"exl3"}), vram_slots=self.vram_slots,
            notes=("gpu and zerocopy picks are computed by exllamav3's kernels through its pointer tables"
                   + ("" if "gpu" in lanes else ", inside an attached model only: unattached, the cpu lane and "
                      "the transfers are this backend's"),))
        self._init_lanes("exllamav3", lambda ev: bool(ev.query()), lambda ev: ev.synchronize())

    # -- memory -------------------------------------------------------------------------------------------------
    def _register_pool(self) -> None:
        """Pin and map the RAM pool so that a kernel can read a RAM slot over the bus (the zerocopy lane). With
        unified addressing the device address of mapped host memory is the host address; where the engine offers
        ext.pinned_cuda_view its alias is taken instead (glm53 checks the two agree)."""
        cudart = self.torch.cuda.cudart()
        err = cudart.cudaHostRegister(self.pool.base, self.pool.nbytes, 2 | 1)   # Mapped | Portable
        if int(err) != 0:
            raise BackendUnavailable(f"exllamav3 backend: cudaHostRegister of the RAM pool failed ({err})")
        self._registered = True
        try:
            from exllamav3.ext import exllamav3_ext as ext
            self._ram_dev = int(ext.pinned_cuda_view(self._host, self.device.index or 0).data_ptr())
        except (AttributeError, RuntimeError, TypeError):
            self._ram_dev = self.pool.base

    def ram_address(self, slot: int) -> int:
        """Where the engine's kernels read RAM slot ``slot`` (the zerocopy lane's table rows)."""
        return self._ram_dev + int(slot) * self.pool.slot_bytes

    def addresses(self, base: int) -> dict:
        """section -> address of that tensor in a record image at ``base`` (a key's table rows)."""
        return {name: base + sec[0] for name, sec in self.layout.sections.items()}

    def vram_address(self, slot: int) -> int:
        return int(self.arena[int(slot)].data_ptr())

    def read_vram(self, slot: int) -> np.ndarray:
        return self.arena[int(slot)].cpu().numpy()

    # -- transfers ------------------------------------------------------------------------------------------------
    def _start_copy(self, kind: str, ram_slot: int, vram_slot: int):
        """Enqueue a push or drain; its CUDA event, or None for a synchronous copy (its bytes are there now)."""
        torch = self.torch
        host = self._host[int(ram_slot), :self.record_bytes]
        dev = self.arena[int(vram_slot)]
        src, dst = (host, dev) if kind == "push" else (dev, host)
        if not self.cuda:
            dst.copy_(src)
            return None
        # the copy stream waits for the compute stream's work so far: a drain never overtakes a kernel still
        # reading the slot, a push never overwrites it
        self.copy_stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self.copy_stream):
            dst.copy_(src, non_blocking=True)
            event = torch.cuda.Event()
            event.record(self.copy_stream)
        return event

    def fence(self) -> None:
        """Every transfer finished and, on CUDA, every kernel enqueued so far done (a slot may then be reused)."""
        self.reader.fence()
        if self.cuda:
            self.copy_stream.synchronize()
            self.torch.cuda.current_stream(self.device).synchronize()

    def close(self) -> None:
        self.fence()
        close_all((self.reader.close, self._unregister))    # a failed reader close leaves the pool pinned otherwise

    def _unregister(self) -> None:
        if self._registered:
            self.torch.cuda.cudart().cudaHostUnregister(self.pool.base)
            self._registered = False


def open_backend(store, *, ram_slots: int, vram_slots: int = 0, device=None, **kw) -> EngineBackend:
    """The ``moetier.backends`` entry point ``exllamav3``: the backend on its own, no model attached. exllamav3's
    kernels compute the gpu and zerocopy picks only inside an attached model, so alone it offers the cpu lane and
    the transfers (fills; pushes and drains into its VRAM slots, on the CUDA device where torch has one).
    BackendUnavailable (one line) where torch or exllamav3 is missing, or the installed engine's hook surface is not
    the pinned one (adapters.exllamav3.surface). It opens over a store of any records (its transfers are byte moves)
    but declares, and computes, exl3 only."""
    from adapters.exllamav3 import surface
    try:
        surface.require()
    except surface.SurfaceMismatch as e:
        raise BackendUnavailable(f"exllamav3 backend: {e}") from None
    except ImportError as e:            # torch itself missing
        raise BackendUnavailable(f"exllamav3 backend: {e} (pip install 'moetier[exllamav3]')") from None
    if device is None:
        import torch
        device = "cuda" if torch.cuda.is_available() else "cpu"
    return EngineBackend(store, ram_slots=ram_slots, vram_slots=vram_slots, device=device, lanes=("cpu",),
                         any_store=True, **kw)
