"""attach(model, recipe, store) / moetier_load(model, recipe, store, load): exllamav3's MoE blocks routed through
moetier's planner, ledger and lanes.

Contract
--------
For every ``BlockSparseMLP`` of the model's trunk (MoE ordinal: its key's position in the store manifest, see
adapters.exllamav3.redirect.ordered), ``attach`` wraps two per-instance hooks:

* ``routing_fn(bsz, cfg, z, params)`` (the engine's router, called inside ``BlockSparseMLP.forward``): it calls the
  router, turns its selection into the layer's picks (key = ordinal * experts + expert, in the router's slot order)
  and runs one layer of moetier's runtime (moetier.run.runtime.Runtime.layer, the simulator's ``plan_layer`` on the
  modeled clock, so its lane deal is the simulator's): demand NVMe reads, the cpu lane (moetier's EXL3 CPU lane on
  the RAM slots), the plan's residency intents through ledger tickets - a key becomes resident only after its
  transfer's handle reported landed - and, for the gpu / zerocopy / NVMe -> VRAM picks, the engine's pointer-table
  rows of those keys pointed at their slot (rows change only when the runtime hands a lane a landed slot). It then
  masks, in the router's own buffers, every pick the engine must not compute (moetier's cpu lane, masked picks) as
  expert -1, weight 0, and returns the selection. The engine's kernels compute the rest after it returns.
* ``cpu_split_combine(final, cpu_partial, cpu_pending, shape)`` (called after the engine's expert kernels): the
  engine's own combine, then ``final + moetier's partial`` (moetier's partial summed in the router's slot order: one
  fixed order whatever lane computed a pick), then ``fence`` (transfers done and, on CUDA, the kernels that read
  the slots) and only then the layer's slot frees.

Residency: at attach the experts' bytes are handed over (``hand_over=True``, the default): each routed expert's
engine tensors become views of the VRAM slot moetier seeded it into, or of one shared zeroed bounce record, the
engine's own copies are dropped, and the tables' home rows are those views - only the VRAM tier's experts are in the
engine's tables; every other expert lives in moetier's RAM and NVMe tiers (``engine_expert_bytes()`` is 0 for every
expert). Decode only: with more than ``MAX_BSZN`` (8) rows the engine's grouped path counts raw expert ids and cannot
take the -1 sentinel, so such calls (prefill) bypass the planner: every picked expert's rows point at its landed
bytes (its VRAM or RAM slot, or a staging slot read from NVMe for the call: a stall, outside the tiers), the engine
computes every pick, and the rows go home after its combine. The engine's own warm-up / autosplit passes run on the
home rows (the bounce record for experts outside the VRAM tier: their results are not outputs). ``exact=True`` turns
the cpu lane off (every computed pick runs on the engine's kernels: upstream numerics); the recipe's ``policy.exact =
"mask"`` drops NVMe picks (lossy). Prefetch is not supported yet (a recipe with policy.prefetch.depth > 0 is refused).
``attach`` checks the hook surface first (adapters.exllamav3.surface.require) and the recipe against the model; a
mismatch is one line (UserError). The store holds the model's routed experts as exl3 records (moetier.bytes.store; the
record's section offsets are the rows' offsets from a slot's address). ``Attached.detach()`` restores the hooks and the
tables' home rows; after a hand-over the engine's expert tensors stay views of the closed backend's VRAM arena and the
bounce record, so a model detached from moetier computes its routed experts only after it is loaded again.

``moetier_load`` does the same without the engine ever reading a routed expert: it seeds the tiers from the store
first, then runs the engine's own load (the ``load`` callable) with the loader redirected (adapters.exllamav3.redirect)
so each routed expert's tensors are born as views of its VRAM slot or of the bounce record - a model whose experts
exceed VRAM plus RAM loads in the memory of its other weights plus moetier's slots. Either way each block's MoE ordinal
is its prefix's position in the store manifest's ``source.moe_layers``.
"""
from __future__ import annotations


from adapters.exllamav3 import redirect, surface
from adapters.exllamav3.backend import EngineBackend
from adapters.recipe import fit_recipe
from moetier.errors import UserError
from moetier.run.runtime import Runtime

MAX_BSZN = 8
PROJ = redirect.PROJ


class Tables:
    """The engine's expert pointer tables of one BlockSparseMLP and the row writes the adapter makes.

    Per projection the MultiLinear tables ``ptrs_trellis`` / ``ptrs_suh`` / ``ptrs_svh`` [E], and the fused
    kernels' ``gu_*_ptr`` [E, 2] (gate, up) that ``ext.BC_BlockSparseMLP`` receives at load and does not keep as an
    attribute: ``capture`` rebuilds the module's bound class once (``load_local``) and finds them among its
    arguments by matching their columns against the gate/up tables (not by argument position)."""

    def __init__(self, module, addresses):
        self.m, self.addresses = module, addresses
        self.multi = {p: getattr(module, f"multi_{p}") for p in PROJ}
        if any(v is None for v in self.multi.values()):
            raise UserError(f"{module.key}: the engine built no expert pointer tables (multi_gate/up/down); the "
                            f"block is not on exllamav3's quantized paths")
        self.gu = self.capture()
        self.home = {name: t.clone() for name, t in self._all()}

    def capture(self) -> dict:
        import torch
        from exllamav3.ext import exllamav3_ext as ext
        args: list = []
        orig = ext.BC_BlockSparseMLP
        had = "BC_BlockSparseMLP" in vars(ext)

        def spy(*a, **kw):
            args.extend(a)
            return orig(*a, **kw)

        ext.BC_BlockSparseMLP = spy
        try:
            self.m.load_local()
        finally:
            if had:
                ext.BC_BlockSparseMLP = orig
            else:
                delattr(ext, "BC_BlockSparseMLP")
        self.multi = {p: getattr(self.m, f"multi_{p}") for p in PROJ}
        found = {}
        for part in ("trellis", "suh", "svh"):
            g = getattr(self.multi["gate"], f"ptrs_{part}").cpu()
            u = getattr(self.multi["up"], f"ptrs_{part}").cpu()
            for a in args:
                if (isinstance(a, torch.Tensor) and a.dim() == 2 and a.shape[1] == 2 and a.dtype == torch.long
                        and torch.equal(a[:, 0].cpu(), g) and torch.equal(a[:, 1].cpu(), u)):
                    found[part] = a
                    break
            else:
                raise UserError(f"{self.m.key}: ext.BC_BlockSparseMLP received no gate/up {part} table [E, 2] "
                                f"(exllamav3 {surface.installed_version()}: the fused kernels' tables moved)")
        return found

    def _all(self):
        for p in PROJ:
            for part in ("trellis", "suh", "svh"):
                yield f"{p}.{part}", getattr(self.multi[p], f"ptrs_{part}")
        for part, t in self.gu.items():
            yield f"gu.{part}", t

    def point(self, expert: int, base: int) -> None:
        """Rows of ``expert`` -> the record image at address ``base`` (every table, every projection)."""
        addr = self.addresses(base)
        for p in PROJ:
            for part in ("trellis", "suh", "svh"):
                getattr(self.multi[p], f"ptrs_{part}")[expert] = addr[f"{p}_{part}"]
        for part, t in self.gu.items():
            t[expert, 0] = addr[f"gate_{part}"]
            t[expert, 1] = addr[f"up_{part}"]

    def row(self, expert: int) -> dict:
        """The current rows of ``expert`` (section -> address), as the gate/up/down tables hold them."""
        return {f"{p}_{part}": int(getattr(self.multi[p], f"ptrs_{part}")[expert])
                for p in PROJ for part in ("trellis", "suh", "svh")}

    def restore(self) -> None:
        for name, t in self._all():
            t.copy_(self.home[name])


# BlockSparseMLP.forward (exllamav3 1.6.5) routes on z = router_pre_norm(y) and computes the experts on
# latent_in(routed_pre_norm(y)); routing_fn sees only z, so moetier's cpu lane is right only where these are absent
EXPERT_INPUT_STAGES = ("router_pre_norm", "routed_pre_norm", "latent_in")


def refuse_split_inputs(modules) -> None:
    """One line (UserError) for a block whose experts' input differs from its router's: moetier's cpu lane computes
    on the router input, the only one routing_fn is given."""
    for m in modules:
        stages = [a for a in EXPERT_INPUT_STAGES if getattr(m, a, None) is not None]
        if stages:
            raise UserError(f"{m.key}: the experts' input differs from the router's ({', '.join(stages)}); moetier's "
                            f"cpu lane computes on the router's, so attach needs exact=True (no cpu lane) here")


def recipe_for(R, modules, store, *, exact: bool = False):
    """The recipe checked against the model and the store (one line naming the mismatch), with the cpu lane off
    in exact mode and the expert sizes of the store's records."""
    m0 = modules[0]
    return fit_recipe(R, "exllamav3", len(modules), m0.num_experts, m0.num_experts_per_tok, store, exact=exact)


class Attached:
    """moetier attached to the MoE blocks of one exllamav3 model (see the module docstring)."""

    def __init__(self, modules, R, store, *, exact: bool = False, prior=None, wrap=None, device=None,
                 queue_depth: int = 16, record: bool = False, hand_over: bool = True, load=None):
        surface.require()
        self.modules = redirect.ordered(modules, store)
        if not exact:
            refuse_split_inputs(self.modules)
        self.R = recipe_for(R, self.modules, store, exact=exact)
        self.store = store
        self.E = self.R.experts
        m0 = self.modules[0]
        dev = device if device is not None else (m0.multi_up.ptrs_trellis.device if load is None else _device())
        headroom = 2 * MAX_BSZN * self.R.topk + 8
        self.backend = EngineBackend(store, ram_slots=min(self.R.keys, self.R.ram_slots) + headroom,
                                     vram_slots=self.R.vram_slots, device=dev, queue_depth=queue_depth)
        if abs(float(m0.act_limit or 0.0) - self.backend.act_limit) > 1e-6:
            raise UserError(f"store {store.path}: act_limit {self.backend.act_limit} but the model's blocks clamp at "
                            f"{m0.act_limit}")
        self.be = wrap(self.backend) if wrap is not None else self.backend
        # loaded: the tables exist and seeding points the VRAM tier's rows; loading here: the engine builds its
        # tables from the slot views the redirect hands its loader, so seeding comes first
        self.tables = [Tables(m, self.backend.addresses) for m in self.modules] if load is None else []
        self.backend.point = self._point
        self.rt = Runtime(self.R, store, self.be, conc=1)
        self.rt.seed_tiers(list(prior) if prior is not None else list(range(self.R.keys)))
        self.rt.rp.settle()
        self.bounce = self.staging = None
        self._staged: dict = {}
        self.staged = 0                 # experts read into staging slots for bypassed (prefill) calls
        self.redirected = 0             # routed tensors the engine's loader got as slot views (load=)
        if load is not None:
            import torch
            self.bounce = torch.zeros(self.backend.record_bytes, dtype=torch.uint8, device=self.backend.arena.device)
            with redirect.Redirect(self.modules, store.layout, self._home) as rd:
                load()
            self.redirected = rd.served
            self.handed_over = rd.check()
            self.tables = [Tables(m, self.backend.addresses) for m in self.modules]
        else:
            self.handed_over = self._hand_over() if hand_over else 0
        self.step, self.t_model = -1, 0.0
        self._last = None
        self._partial: dict = {}
        self.record = record
        self.deals: list = []           # with record: (step, ordinal, picks, {lane: keys}) of every planned call
        self.routing: dict = {}         # ordinal -> (selected, weights) the router gave last (before masking)
        self.plans: int = 0             # layer calls planned
        self.bypassed = 0
        self._hooks = []
        for o, m in enumerate(self.modules):
            self._hook(o, m)

    # -- hooks --------------------------------------------------------------------------------------------------
    def _hook(self, o: int, m) -> None:
        route0, combine0 = m.routing_fn, m.cpu_split_combine

        def routing_fn(bsz, cfg, z, params):
            sel, w = route0(bsz, cfg, z, params)
            if bsz > MAX_BSZN or params.get("autosplit_measure") or params.get("tp_warmup"):
                # the engine computes every pick itself, from the experts as it loaded them: rows back home (a
                # row moetier pointed may name a slot that now holds another key); decode re-points its own
                self.tables[o].restore()
                if self.bounce is not None and bsz > MAX_BSZN:
                    self._stage(o, sel)
                self.bypassed += 1
                return sel, w
            return self._layer(o, sel, w, z)

        def cpu_split_combine(final, cpu_partial, cpu_pending, shape):
            final = combine0(final, cpu_partial, cpu_pending, shape)
            if self._staged.pop(o, None):
                self.be.fence()           # the engine's kernels done with the staged rows
                self.tables[o].restore()
            part = self._partial.pop(o, None)
            if part is not None:
                final = final + part.view(shape)
                self.be.fence()           # the engine's kernels and every transfer done: slots may be reused
                self.rt.end_layer()
            return final

        m.routing_fn, m.cpu_split_combine = routing_fn, cpu_split_combine
        self._hooks.append((m, route0))

    def _point(self, key: int, address: int) -> None:
        if not self.tables:         # seeding before the engine's load: its tables are built over the slot views
            return
        o, e = divmod(int(key), self.E)
        self.tables[o].point(e, address)

    def _home(self, o: int, e: int):
        """The record image expert ``e`` of block ``o`` lives at for the engine: its VRAM slot where it was seeded
        into the VRAM tier, else the shared zeroed bounce record."""
        k = o * self.E + e
        slot = self.rt.vram_slot.get(k) if self.rt.L.state_of(k) == "vram" else None
        return self.backend.arena[slot] if slot is not None else self.bounce

    def _layer(self, o: int, sel, w, z):
        import torch
        rp = self.rt.rp
        if self._last is None or o <= self._last:
            self.step += 1
            rp.begin_step(self.step)
        self._last = o
        sel_h, w_h = sel.cpu(), w.float().cpu()
        self.routing[o] = (sel_h.clone(), w_h.clone())
        base = o * self.E
        rows_keys = [[base + int(e) for e in row] for row in sel_h.tolist()]
        rows_w = w_h.tolist()
        x = z.float().cpu().numpy().reshape(len(rows_keys), -1)
        self.t_model += self.R.fixed(1) / self.R.layers
        self.backend.engine_keys.clear()
        y, plan, picks = self.rt.layer(o, rows_keys, rows_w, x, self.t_model)
        rp.after_layer(picks)
        self.plans += 1
        self.t_model += plan.ms + sum(rp.settle())
        if self.record:
            self.deals.append((self.step, o, dict(picks), {k: list(v) for k, v in plan.lanes().items()}))
        mine = self.backend.engine_keys
        engine = torch.tensor([[k in mine for k in row] for row in rows_keys], device=sel.device)
        sel.masked_fill_(~engine, -1)                      # in place: bsz-1 buffers sit at fixed addresses
        w.masked_fill_(~engine, 0.0)
        self._partial[o] = torch.from_numpy(y).to(device=z.device, dtype=torch.float)
        return sel, w

    def _hand_over(self) -> int:
        """The experts' bytes move to moetier's tiers: each routed expert's engine tensors (trellis, suh, svh of its
        gate, up and down ``LinearEXL3``) become views of the VRAM slot moetier seeded it into, or, for every expert
        not in the VRAM tier, of one shared zeroed bounce record; the engine's own copies are dropped (its per-linear
        bound classes rebuilt over the views) and the tables' home rows point at the same places. So the engine
        holds no memory of its own for any routed expert, and only the VRAM tier's experts are in its tables: the
        block's own bound class, which holds the experts' per-linear ones and through them their tensors, is rebuilt
        too (load_local), so no C++ object keeps an old tensor alive. Returns how many experts were handed over."""
        import torch
        import exllamav3.modules.quant.exl3 as q
        from exllamav3.ext import exllamav3_ext as ext
        self.bounce = torch.zeros(self.backend.record_bytes, dtype=torch.uint8, device=self.backend.arena.device)
        views = redirect.Redirect(self.modules, self.store.layout, self._home)
        n = 0
        for o, (m, t) in enumerate(zip(self.modules, self.tables)):
            for e in range(self.E):
                src = self._home(o, e)
                for p, lins in zip(PROJ, (m.gates, m.ups, m.downs)):
                    inner = lins[e].inner
                    for part in redirect.PARTS:
                        setattr(inner, part, views.view(o, e, f"{p}_{part}"))
                    inner.bc = ext.BC_LinearEXL3(inner.trellis, inner.suh, inner.svh, inner.K, inner.bias,
                                                 inner.mcg, inner.mul1, q.g_tensor_cache.get(*inner.bsz1_xh_args))
                n += 1
            # the block's bound class (ext.BC_BlockSparseMLP) holds the experts' old BC_LinearEXL3 objects, and they
            # the old tensors: rebuilt over the views (capture runs load_local), the old ones are released and the
            # MultiLinear tables - the home rows - are built over the views
            t.gu = t.capture()
            t.home = {name: tt.clone() for name, tt in t._all()}
        return n

    def _stage(self, o: int, sel) -> None:
        """A bypassed call (prefill) after hand-over: the engine computes every pick, so each picked expert's rows
        point at its landed bytes - its VRAM slot, its RAM slot (read over the bus), or else a staging slot it is
        read into from NVMe now (a stall; the staging slots are outside the tiers and the ledger). The rows go back
        home in cpu_split_combine, after the kernels."""
        L, rt, be = self.rt.L, self.rt, self.backend
        if self.staging is None:
            self.staging = EngineBackend(self.store, ram_slots=self.E, vram_slots=0, device=be.device, lanes=("cpu",))
        reads = []
        for i, e in enumerate(sorted({int(v) for v in sel.reshape(-1).tolist()})):
            k = o * self.E + e
            if L.state_of(k) == "vram" and k in rt.vram_slot:
                self._point(k, be.vram_address(rt.vram_slot[k]))
            elif L.resident(k) and k in rt.ram_slot:
                self._point(k, be.ram_address(rt.ram_slot[k]))
            else:
                reads.append((k, i, self.staging.fill(k, i)))
        for k, i, h in reads:
            self.staging.wait(h)
            self._point(k, self.staging.ram_address(i))
        self.staged += len(reads)
        self._staged[o] = True

    def engine_expert_bytes(self) -> dict:
        """key -> bytes the engine's own tensors of that routed expert hold outside moetier's slots and the bounce
        record (0 for every expert handed over)."""
        regions = [(int(self.backend.arena.data_ptr()), self.backend.arena.numel())]
        if self.bounce is not None:
            regions.append((int(self.bounce.data_ptr()), self.bounce.numel()))
        out = {}
        for o, m in enumerate(self.modules):
            for e in range(self.E):
                own = 0
                for lins in (m.gates, m.ups, m.downs):
                    for part in ("trellis", "suh", "svh"):
                        ten = getattr(lins[e].inner, part)
                        a, nb = int(ten.data_ptr()), ten.numel() * ten.element_size()
                        if not any(b <= a and a + nb <= b + size for b, size in regions):
                            own += nb
                out[o * self.E + e] = own
        return out

    def detach(self) -> None:
        for m, route0 in self._hooks:
            m.routing_fn = route0
            m.__dict__.pop("cpu_split_combine", None)
        for t in self.tables:
            t.restore()
        self._hooks.clear()
        self.rt.close()
        self.backend.close()
        if self.staging is not None:
            self.staging.close()


def moe_blocks(model) -> list:
    """The BlockSparseMLP blocks of ``model`` in MoE ordinal order: an exllamav3 Model (its module tree walked in
    order), an object with ``.modules`` (a list of blocks or of modules holding them), or a list."""
    from exllamav3.modules.block_sparse_mlp import BlockSparseMLP
    top = getattr(model, "modules", model)
    out = []
    for m in top:
        for sub in (m if hasattr(m, "modules") and not isinstance(m, BlockSparseMLP) else (m,)):
            if isinstance(sub, BlockSparseMLP):
                out.append(sub)
    return out


def _device():
    import torch
    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")


def attach(model, recipe, store, **kw) -> Attached:
    """Attach moetier to every BlockSparseMLP of ``model`` (see moe_blocks); ``store``: the moetier store of the
    model's routed experts (exl3 records, ``moetier store pack --checkpoint``; key = MoE ordinal * experts +
    expert)."""
    modules = moe_blocks(model)
    if not modules:
        raise UserError("attach: the model has no BlockSparseMLP blocks")
    return Attached(modules, recipe, store, **kw)


def moetier_load(model, recipe, store, load, **kw) -> Attached:
    """Load ``model`` (an exllamav3 model or block tree built but not loaded) with moetier attached, reading none of
    its routed experts from the checkpoint: the tiers are seeded from ``store`` first, then ``load()`` - the engine's
    own load, e.g. ``lambda: model.load(device="cuda:0")`` - runs with the loader redirected
    (adapters.exllamav3.redirect): each routed expert's tensors are views of its VRAM slot (the seeded hot set) or
    of the shared placeholder record, and the engine builds its pointer tables over them; then the hooks go on as
    ``attach`` puts them. ``device``: where the engine loads (default: torch's current CUDA device, else the CPU).
    Other keywords as ``Attached``."""
    modules = moe_blocks(model)
    if not modules:
        raise UserError("moetier_load: the model has no BlockSparseMLP blocks")
    return Attached(modules, recipe, store, load=load, **kw)
