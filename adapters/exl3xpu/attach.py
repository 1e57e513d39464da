"""attach(model, recipe, store): exl3xpu's MoE method routed through moetier's planner, ledger and lanes.

Contract
--------
For every MoE layer of the model (ordinal = its position) ``attach`` wraps the method's ``apply(x, topk_ids, topk_w)``
(the hook SGLang's ``Exl3XpuMoEMethod.apply`` gives: the router's ids int32 and weights fp32 arrive with the hidden
states). Two modes:

* **eager** (prefill, or decode without XPU graphs): per layer call, the router's picks (key = ordinal * experts +
  expert, in the router's slot order) go through one layer of moetier's runtime (moetier.run.runtime.Runtime.layer:
  the simulator's ``plan_layer`` on the modeled clock, so the deal is the simulator's; demand NVMe reads; moetier's
  cpu lane on the RAM slots; residency changes through ledger tickets, a key resident only after its handle reported
  landed). The gpu / zerocopy / NVMe -> VRAM picks have their pointer-table rows pointed at their landed slot (VRAM
  slot, or a RAM slot read over the bus); every other pick (cpu lane, masked) reaches ``moe_forward`` as one of the
  call's engine picks with weight 0 (the kernel computes it and adds 0 x its output: its bytes are landed, so that is
  exactly 0); a call with no engine pick does not run the kernel. Output = ``moe_forward``'s fixed-order sum + moetier's
  partial summed in the router's slot order; then ``fence`` and only then the layer's slots are freed.
* **graph** (decode as XPU graph replays: no Python per layer, no host sync inside a step): ``apply`` stands for the
  captured kernel and reads only the device copies, ``dev_table`` (the pointer tables) and ``dev_ok`` (per key: its
  row points at that key's landed bytes): a pick whose key is not ok is masked to (safe expert, weight 0) and logged
  to the miss ring, as exl3xpu's ``moe_set_tier`` masking does; the ids are logged to the lagged ring. ``step_end()``
  (the step hook after each replay, where exl3xpu calls ``NvTier.step()``) fences, then plans the step just run layer
  by layer from the lagged ring (fills and pushes land here, with ``stall``: the misses are read), and only then
  publishes: every key whose ledger state and slot say its bytes have landed gets its row and ``dev_ok``; the rest
  go back to the home row, not ok. So a landing is observed by the kernel one step behind: bytes that land while
  step t's misses are planned are computed from step t+1, never during step t. The cpu lane is off in graph mode
  (no host sync point inside a captured graph).

``exact=True`` turns the cpu lane off (every computed pick on exl3xpu's kernel); the recipe's ``policy.exact =
"mask"`` drops NVMe picks (lossy) in eager mode. Prefetch is not supported (policy.prefetch.depth > 0 is refused).
``attach`` checks the op surface first (adapters.exl3xpu.surface.require: every op the adapter calls, with its
arguments) and the recipe against the model; a mismatch is one line (UserError). ``Attached.detach()`` restores ``apply`` and the home rows.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from adapters.exl3xpu import surface
from adapters.exl3xpu.backend import XpuBackend
from adapters.recipe import fit_recipe
from moetier.errors import UserError
from moetier.run.runtime import Runtime

MODES = ("eager", "graph")


def recipe_for(R, model, store, *, exact: bool = False):
    """The recipe checked against the model and the store (one line naming the mismatch), with the cpu lane off in
    exact mode and the expert sizes of the store's records."""
    return fit_recipe(R, "exl3xpu", len(model.layers), model.experts, model.layers[0].topk, store, exact=exact)


class Attached:
    """moetier attached to the MoE layers of one exl3xpu model (see the module docstring)."""

    def __init__(self, model, R, store, *, mode: str = "eager", exact: bool = False, prior=None, wrap=None,
                 queue_depth: int = 16, record: bool = False):
        if mode not in MODES:
            raise UserError(f"attach: mode {mode!r}: expected one of {', '.join(MODES)}")
        self.ops = model.layers[0].method.ops
        try:
            surface.require(self.ops)
        except surface.SurfaceMismatch as e:
            raise UserError(f"attach: the op table does not offer the pinned exl3xpu surface: {e}") from None
        self.model, self.mode = model, mode
        if mode == "graph":
            R = dataclasses.replace(R, policy={**R.policy, "exact": "stall"})
        self.R = recipe_for(R, model, store, exact=exact or mode == "graph")
        self.E, self.store = self.R.experts, store
        if store.layout != model.layout:
            raise UserError(f"store {store.path}: its records' layout differs from the model's experts")
        headroom = 2 * 8 * self.R.topk + 8
        self.backend = XpuBackend(store, self.ops, ram_slots=min(self.R.keys, self.R.ram_slots) + headroom,
                                  vram_slots=self.R.vram_slots, queue_depth=queue_depth)
        self.be = wrap(self.backend) if wrap is not None else self.backend
        self.methods = [layer.method for layer in model.layers]
        self.host_rows = [m.ptrs.copy() for m in self.methods]      # graph mode: the host mirror of the tables
        self.dev_ok = np.zeros(self.R.keys, bool)                    # graph mode: the device copy of the flags
        self.backend.point = self._point
        self.rt = Runtime(self.R, store, self.be, conc=1)
        self.rt.seed_tiers(list(prior) if prior is not None else list(range(self.R.keys)))
        self.rt.rp.settle()
        self.step, self.t_model, self._last = -1, 0.0, None
        self.record = record
        self.deals: list = []           # with record: (step, ordinal, picks, {lane: keys}) of every planned call
        self.routing: dict = {}         # ordinal -> (ids, weights) the router gave last (before masking)
        self.misses: list = []          # graph mode: per step, the keys masked because the device had no row
        self.published: list = []       # graph mode: per step_end, the keys ok on the device from then on
        self._lag: list = []            # graph mode: (ordinal, ids, weights) of the step being replayed
        self._step_misses: list = []
        self._hooks = []
        for o, m in enumerate(self.methods):
            self._hook(o, m)
        if mode == "graph":
            self._publish()

    # -- hooks --------------------------------------------------------------------------------------------------
    def _hook(self, o: int, m) -> None:
        apply0 = m.apply

        def apply(x, topk_ids, topk_w):
            ids, w = np.asarray(topk_ids, np.int32), np.asarray(topk_w, np.float32)
            self.routing[o] = (ids.copy(), w.copy())
            if self.mode == "graph":
                return self._replay(o, apply0, x, ids, w)
            return self._layer(o, apply0, x, ids, w)

        m.apply = apply
        self._hooks.append(m)

    def _point(self, key: int, address: int) -> None:
        o, e = divmod(int(key), self.E)
        (self.host_rows[o] if self.mode == "graph" else self.methods[o].ptrs)[e] = address

    def _plan(self, o: int, ids, w, x):
        """One layer of moetier's runtime on the router's picks; (moetier's partial, the plan)."""
        rp = self.rt.rp
        if self._last is None or o <= self._last:
            self.step += 1
            rp.begin_step(self.step)
        self._last = o
        base = o * self.E
        rows_keys = [[base + int(e) for e in row] for row in ids.tolist()]
        self.t_model += self.R.fixed(1) / self.R.layers
        self.backend.engine_keys.clear()
        y, plan, picks = self.rt.layer(o, rows_keys, w.tolist(), x, self.t_model)
        rp.after_layer(picks)
        self.t_model += plan.ms + sum(rp.settle())
        if self.record:
            self.deals.append((self.step, o, dict(picks), {k: list(v) for k, v in plan.lanes().items()}))
        return y, rows_keys

    def _layer(self, o: int, apply0, x, ids, w):
        x = np.asarray(x, np.float32)
        y, rows_keys = self._plan(o, ids, w, x)
        mine = self.backend.engine_keys
        engine = np.array([[k in mine for k in row] for row in rows_keys], bool).reshape(ids.shape)
        if not engine.any():             # every pick is moetier's: the kernel would add only weight-0 picks
            out = np.zeros_like(y)
        else:
            # the kernel computes weight-0 picks too (0 x their output): each masked pick reads the bytes of one the
            # engine computes in this call, which are landed, never a row that may name a stale slot
            safe = int(ids[engine][0])
            out = np.asarray(apply0(x, np.where(engine, ids, safe).astype(np.int32), np.where(engine, w, 0.0)
                                    .astype(np.float32)), np.float32)
        self.be.fence()                  # the kernel and every transfer done: slots may be reused
        self.rt.end_layer()
        return out + y

    # -- graph mode -----------------------------------------------------------------------------------------------
    def _replay(self, o: int, apply0, x, ids, w):
        keys = o * self.E + ids
        ok = self.dev_ok[keys]
        self._step_misses += [int(k) for k in keys[~ok]]
        self._lag.append((o, ids.copy(), w.copy(), np.asarray(x).shape))
        return apply0(x, np.where(ok, ids, 0).astype(np.int32), np.where(ok, w, 0.0).astype(np.float32))

    def step_end(self) -> None:
        """After a replay: plan the step just run (one step behind), then publish the rows of landed keys."""
        if self.mode != "graph":
            raise UserError("step_end: only in graph mode (eager mode plans every layer as it runs)")
        self.be.fence()
        self.misses.append(sorted(set(self._step_misses)))
        self._step_misses = []
        lag, self._lag = self._lag, []
        for o, ids, w, shape in lag:
            self._plan(o, ids, w, np.zeros(shape, np.float32))
            self.be.fence()
            self.rt.end_layer()
        self._publish()

    def _publish(self) -> None:
        """Device copies from the landed state only: a key is ok when the ledger holds it and its slot is known."""
        L, rt, be = self.rt.L, self.rt, self.backend
        ok = np.zeros(self.R.keys, bool)
        for k in range(self.R.keys):
            o, e = divmod(k, self.E)
            st = L.state_of(k)
            if st == "vram" and k in rt.vram_slot:
                self.host_rows[o][e] = be.vram_address(rt.vram_slot[k])
            elif L.resident(k) and k in rt.ram_slot:
                self.host_rows[o][e] = be.ram_address(rt.ram_slot[k])
            else:
                self.host_rows[o][e] = self.methods[o].home[e]
                continue
            ok[k] = True
        for m, rows in zip(self.methods, self.host_rows):
            m.ptrs[:] = rows                    # the upload between replays
        self.dev_ok[:] = ok
        self.published.append(sorted(np.flatnonzero(ok).tolist()))

    def detach(self) -> None:
        for m in self._hooks:
            m.__dict__.pop("apply", None)
            m.ptrs[:] = m.home
        self._hooks.clear()
        self.rt.close()
        self.backend.close()


def attach(model, recipe, store, **kw) -> Attached:
    """Attach moetier to every MoE layer of ``model`` (adapters.exl3xpu.model.Model); ``store``: the moetier store
    of its routed experts (exl3 records, ``moetier store pack --checkpoint``; key = ordinal * experts + expert)."""
    if not getattr(model, "layers", None):
        raise UserError("attach: the model has no MoE layers")
    return Attached(model, recipe, store, **kw)
