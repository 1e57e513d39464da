"""Load-time setup of the exllamav3 adapter: the engine's loader handed moetier's slot views for the routed experts.

Contract
--------
``ordered(modules, store)`` maps each ``BlockSparseMLP`` to its MoE ordinal through the store manifest (its
``source.moe_layers``: the module prefix of each ordinal, as ``moetier store pack --checkpoint`` wrote it; a store
without that list falls back to the modules' order) and returns the trunk's blocks in ordinal order: one line
(UserError) where a trunk ordinal has no block or a block's key is not in the manifest. Blocks of the MTP layers
(ordinals past the trunk) are left to the engine.

``Redirect(modules, layout, home)`` is a context manager around the engine's own load (``Model.load`` or a block's
``load``): while it is open, ``get_tensor`` and ``get_codebook_marker`` of every tensor collection the blocks read from
(``config.stc``, per instance) answer each routed expert's ``trellis`` / ``suh`` / ``svh`` with a view of
``home(ordinal, expert)`` (a uint8 record image on the engine's device: a VRAM slot, or the shared placeholder) at the
store layout's section offsets, and its codebook marker (``mul1`` / ``mcg``) from the layout, so nothing of a routed
expert is read from the checkpoint (only its header is looked at: each view's shape and dtype must be the
checkpoint's, else one line naming the tensor). Every other tensor loads as the engine loads it. On exit the
collections are as they were and ``check()`` confirms that each routed expert's engine tensors are views of its home
(one line naming the first expert the engine loaded some other way, e.g. from a fused or non-EXL3 tensor).
"""
from __future__ import annotations

from moetier.errors import UserError

PROJ = ("gate", "up", "down")
PARTS = ("trellis", "suh", "svh")
MARKERS = ("mcg", "mul1")


def ordered(modules, store) -> list:
    """The trunk's blocks of ``modules`` in MoE ordinal order (see the module docstring)."""
    names = ((store.manifest.get("source") or {}).get("moe_layers")) or None
    L = store.layers
    if names is None:
        return list(modules)
    where = {n: o for o, n in enumerate(names)}
    by = {}
    for m in modules:
        o = where.get(m.key)
        if o is None:
            raise UserError(f"store {store.path}: manifest source.moe_layers has no {m.key!r} (the store was "
                            f"packed from another checkpoint)")
        if o < L:
            by[o] = m
    lost = [o for o in range(L) if o not in by]
    if lost:
        raise UserError(f"store {store.path}: MoE ordinal {lost[0]} ({names[lost[0]]}) has no BlockSparseMLP in the "
                        f"model")
    return [by[o] for o in range(L)]


def _linear_keys(lin) -> list:
    alt = lin.alt_key if isinstance(lin.alt_key, list) else [lin.alt_key]
    return [k for k in [lin.key, *alt] if k]


class Redirect:
    """See the module docstring. ``served``: routed tensors answered from home; ``markers``: markers answered."""

    def __init__(self, modules, layout, home):
        import torch
        self.torch, self.layout, self.home = torch, layout, home
        self.modules = list(modules)
        self.routed: dict = {}          # checkpoint tensor name -> (ordinal, expert, section)
        self.marker_keys: dict = {}     # checkpoint marker name -> marker name (mcg / mul1)
        for o, m in enumerate(self.modules):
            for p, lins in zip(PROJ, (m.gates, m.ups, m.downs)):
                for e, lin in enumerate(lins):
                    for k in _linear_keys(lin):
                        for part in PARTS:
                            self.routed[f"{k}.{part}"] = (o, e, f"{p}_{part}")
                        for mk in MARKERS:
                            self.marker_keys[f"{k}.{mk}"] = mk
        self.stcs = list({id(m.config.stc): m.config.stc for m in self.modules}.values())
        self.served = self.markers = 0
        self._marker = None

    def view(self, o: int, e: int, section: str):
        off, nb, dt, shape = self.layout.sections[section]
        dtype = {"int16": self.torch.int16, "float16": self.torch.half}[dt]
        return self.home(o, e)[off:off + nb].view(dtype).view(shape)

    def _tensor(self, stc, key, device, kw):
        o, e, section = self.routed[key]
        t = self.view(o, e, section)
        meta = (stc.get_tensor_meta(key, optional=True) or {}).get(key)
        if meta is None:
            raise UserError(f"checkpoint {stc.directory}: routed expert tensor {key} is not in its headers")
        if list(meta["shape"]) != list(t.shape) or meta["dtype"] != str(t.dtype):
            raise UserError(f"checkpoint {stc.directory}: {key} is {meta['dtype']} {list(meta['shape'])} but the "
                            f"store's {section} is {t.dtype} {list(t.shape)} (the store was packed from another "
                            f"checkpoint)")
        if kw.get("transpose") or kw.get("pad_to") is not None or kw.get("fidx") is not None:
            raise UserError(f"exllamav3 asked for {key} transposed, padded or sliced; moetier's slot views are the "
                            f"record's sections as stored")
        if device is not None:
            want = self.torch.device(device)
            if want.type != t.device.type or (want.index is not None and want.index != t.device.index):
                raise UserError(f"exllamav3 loads {key} on {want} but moetier's slots are on {t.device} (pass "
                                f"device= to the load)")
        self.served += 1
        return t

    def _marker_for(self, stc, key, value):
        if not stc.has_tensor(key):
            return None                 # the engine's answer for a marker the checkpoint does not carry
        name = self.marker_keys[key]
        if name != self.layout.codebook:
            raise UserError(f"checkpoint {stc.directory}: {key} marks the {name} codebook but the store's records "
                            f"are {self.layout.codebook}")
        if self._marker is None:        # as the engine builds it: one shared int32 scalar per value
            self._marker = self.torch.tensor(value, dtype=self.torch.uint32).view(self.torch.int)
        self.markers += 1
        return self._marker

    def __enter__(self):
        for stc in self.stcs:
            get0, marker0 = stc.get_tensor, stc.get_codebook_marker

            def get_tensor(key, device=None, *a, _stc=stc, _get0=get0, **kw):
                if key in self.routed:
                    if a:
                        raise UserError(f"exllamav3 called get_tensor({key!r}) with positional options; the "
                                        f"redirect expects keywords (adapters.exllamav3.surface pins them)")
                    return self._tensor(_stc, key, device, kw)
                return _get0(key, device, *a, **kw)

            def get_codebook_marker(key, value, _stc=stc, _marker0=marker0):
                if key in self.marker_keys:
                    return self._marker_for(_stc, key, value)
                return _marker0(key, value)

            stc.get_tensor, stc.get_codebook_marker = get_tensor, get_codebook_marker
        return self

    def __exit__(self, *exc):
        for stc in self.stcs:
            stc.__dict__.pop("get_tensor", None)
            stc.__dict__.pop("get_codebook_marker", None)
        return False

    def check(self) -> int:
        """How many routed experts' engine tensors are views of their home; UserError naming the first that is not."""
        n = 0
        for o, m in enumerate(self.modules):
            for e in range(len(m.ups)):
                base = self.home(o, e)
                lo, hi = int(base.data_ptr()), int(base.data_ptr()) + base.numel()
                for p, lins in zip(PROJ, (m.gates, m.ups, m.downs)):
                    inner = lins[e].inner
                    for part in PARTS:
                        t = getattr(inner, part, None) if inner is not None else None
                        a = int(t.data_ptr()) if t is not None else -1
                        if not lo <= a < hi:
                            raise UserError(f"{lins[e].key}.{part}: exllamav3 did not load it through the collection "
                                            f"moetier redirects (it is not a view of the expert's slot)")
                n += 1
        return n
