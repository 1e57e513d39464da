"""What every engine adapter's backend shares: the cpu lane, the engine lanes as pointer-row writes, and transfers.

Contract
--------
``cpu_rows(x, expert, act_limit)`` is moetier's EXL3 CPU lane on token rows (the Numba kernel, exact mode, fp16 at the
engines' rounding points; the NumPy reference ``moetier.bytes.exl3.expert_forward`` where numba is not installed).

``EngineLanes`` (over moetier.run.events.SequencedBackend: one Sequencer holds the seq watermark of fills, pushes and
drains, as in moetier's own device backends) is the moetier backend side of an adapter whose engine computes the
``gpu`` and ``zerocopy`` picks itself, reading experts through pointer tables. The class using it provides ``reader``
(the fills' moetier.bytes.transport.Reader), ``pool`` (the RAM SlotPool), ``layout``, ``store``, ``record_bytes``,
``vram_address(slot)``, ``ram_address(slot)`` and ``_start_copy(kind, ram_slot, vram_slot)`` (enqueue a push or
drain; its device event, or None when the copy was synchronous), then calls ``_init_lanes(name, poll, block)`` with
the event's non-blocking query and its wait. It gets ``ram_slot_count`` / ``ram_view``, ``push`` / ``drain``,

* ``compute``: ``cpu`` runs ``cpu_rows`` on the RAM slot's landed record; ``gpu`` / ``zerocopy`` point the key's rows
  at the slot handed (``point(key, address)``, set by the adapter's attach) - the runtime hands a lane only slots
  whose bytes it saw land - add the key to ``engine_keys`` and return zero partials (the engine adds its own);
  with no model attached (``point`` None) they go to ``unattached(lane, jobs, x)``: the engine's kernel run on the
  slots alone where the adapter can (exl3xpu's ``moe_forward``), else BackendUnavailable;
* ``fill`` / ``cancel`` / ``landed`` / ``wait`` / ``completed_seq`` (the Sequencer's; evictions are host-planned and
  reach ``drain`` directly);
* ``_landed_copy(handle)``: the Sequencer's on_landed: a push or drain landed, so the key's rows follow its bytes
  (never precede them);
* ``stats``: the Reader's counters plus pushes, drains, their bytes, copy failures and the rows pointed.
"""
from __future__ import annotations

import numpy as np

from moetier.bytes.expert import EXL3, exl3_expert
from moetier.run import registry
from moetier.run.contract import BackendUnavailable
from moetier.run.events import SequencedBackend, Sequencer


def _cpu_backend():
    """The registered cpu backend's class (moetier.run.registry), or None where it does not import."""
    try:
        return registry.factory("cpu")
    except BackendUnavailable:
        return None


_CPU = _cpu_backend()
if getattr(_CPU, "EXL3_KERNEL", False):
    cpu_rows = _CPU.exl3_rows
    CPU_KERNEL = "moetier Numba EXL3 kernel"
else:                     # numba is the cpu extra; the NumPy reference rounds at the same points, slower
    from moetier.bytes import exl3 as _ref_exl3

    def cpu_rows(x, expert, act_limit):
        return _ref_exl3.expert_forward(x, expert, act_limit, fp16=True)

    CPU_KERNEL = "moetier NumPy EXL3 reference"


class EngineLanes(SequencedBackend):
    def _init_lanes(self, name: str, poll=bool, block=lambda event: None) -> None:
        self.name = name
        self.act_limit = float(self.layout.act_limit or 0.0)
        self.point = None                       # (key, address) -> None: set by attach
        self.engine_keys: set = set()           # keys handed to the gpu / zerocopy lanes since the caller cleared it
        SequencedBackend.__init__(self, events=Sequencer(self.reader, poll, block, name, on_landed=self._landed_copy),
                                  reader=self.reader)
        self._stats = dict(pushes=0, drains=0, push_bytes=0, drain_bytes=0, rows_pointed=0)

    # the rest of the backend contract (moetier.run.contract): the cpu lane computes its experts one after another,
    # unsplit; the engine routes, so there is no router here; read timing is the reader's
    workers, parallel_min = 1, 0

    def route(self, layer: int, x, rows=None):
        raise BackendUnavailable(f"{self.name} backend: the engine routes (its router picks and weights the experts; "
                                 f"moetier receives its picks), so this backend has no router of its own")

    @property
    def ram_slot_count(self) -> int:
        return self.pool.n

    def ram_view(self, slot: int) -> np.ndarray:
        return self.pool.view(slot)

    def expert(self, slot: int):
        """The EXL3 expert in RAM slot ``slot`` (views of its landed bytes)."""
        return exl3_expert(self.layout, self.pool.view(slot))

    def compute(self, lane: str, jobs, x: np.ndarray) -> dict:
        if self.layout.encoding != EXL3:
            raise BackendUnavailable(f"{self.name} backend: store {self.store.path} holds "
                                     f"{self.layout.encoding!r} records; its lanes compute {EXL3!r} only")
        if lane == "cpu":
            return {k: np.asarray(cpu_rows(x[rows], self.expert(slot), self.act_limit), np.float32)
                    for k, slot, rows in jobs}
        if lane not in ("gpu", "zerocopy"):
            raise BackendUnavailable(f"{self.name} backend: no {lane!r} lane")
        if self.point is None:
            return self.unattached(lane, jobs, x)
        where = self.vram_address if lane == "gpu" else self.ram_address
        out = {}
        for k, slot, rows in jobs:
            self.point(int(k), where(slot))
            self.engine_keys.add(int(k))
            self._stats["rows_pointed"] += 1
            out[k] = np.zeros((len(rows), x.shape[1]), np.float32)
        return out

    def unattached(self, lane: str, jobs, x: np.ndarray) -> dict:
        """The gpu / zerocopy lane outside an attached model (conformance, or a backend used on its own): an
        adapter whose engine kernel can run alone computes the slots here; this one cannot."""
        raise BackendUnavailable(f"{self.name} backend: the gpu and zerocopy lanes run inside {self.name}; "
                                 f"attach the backend to a model first (adapters.{self.name}.attach)")

    def push(self, key: int, src_slot: int, vram_slot: int):
        return self._copy(key, "push", int(src_slot), int(vram_slot))

    def drain(self, key: int, vram_slot: int, ram_slot: int):
        return self._copy(key, "drain", int(ram_slot), int(vram_slot))

    def _copy(self, key: int, kind: str, ram_slot: int, vram_slot: int):
        src, dst = (ram_slot, vram_slot) if kind == "push" else (vram_slot, ram_slot)
        h = self.events.copy(kind, int(key), src, dst, lambda: self._start_copy(kind, ram_slot, vram_slot))
        self._stats["pushes" if kind == "push" else "drains"] += 1
        self._stats[kind + "_bytes"] += self.record_bytes
        return h

    def _landed_copy(self, h) -> None:
        """A push or drain landed (the Sequencer's on_landed): the key's rows follow its bytes (VRAM slot after a
        push, RAM slot after a drain), so a row is written only once the bytes it points at are there."""
        if self.point is not None:
            self.point(h.key, self.vram_address(h.dst) if h.kind == "push" else self.ram_address(h.dst))
            self._stats["rows_pointed"] += 1

    @property
    def stats(self) -> dict:
        st = dict(self.reader.stats)
        st.update(self._stats, copy_failures=self.events.copy_failures)
        return st
