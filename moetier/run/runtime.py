"""The runtime's step loop: a recipe run on a backend with real bytes and real kernels, step by step.

Contract
--------
``run(R, store, backend, trace, conc)`` replays routing from a trace (moetier.run.router.TraceRouter: the same
lockstep streams as the simulator) or routes live (``router=backend``). It seeds the tiers as the simulator does
(``policy.seed``), then for each of the simulator's warm + measured steps and each layer: routes the rows' hidden
states, runs the layer (moetier.run.layer.Runtime.layer: the simulator's plan, carried out for real) and updates
the hidden state ``h = rmsnorm(h + moe(h))``; the next layer reads this layer's output. A failed read is read again
up to ``retries`` times (the result's ``read_retries``); a transfer that still fails, or one not landed after
``wait_timeout_s``, stops the run with a one-line ``UserError`` (moetier.run.waits) - unverified bytes are never
computed. Per step it records the output digest (bit-exactness checks); the result holds per-lane wall time (lane
busy, NVMe wait, plan, bookkeeping) per token over the measured steps, the counters and the call groups.

``make_backend`` sizes a backend for a recipe (its RAM tier plus ``headroom_slots``); ``closing`` closes it within
the run's ``wait_timeout_s`` (a close fences, and a backend that stopped landing never finishes one); ``rss_bound``
is what such a run may hold resident at its peak and ``peak_rss`` what it did. ``Runtime``, ``SlotAllocator`` and
``RETRIES`` are re-exported from the modules that hold them.
"""
from __future__ import annotations

import hashlib
import time
from contextlib import contextmanager

import numpy as np

from moetier.core.replay import warmup_ids
from moetier.core.sim import Streams, _segment_plan, rank_keys
from moetier.errors import UserError
from moetier.run.layer import Runtime
from moetier.run.router import TraceRouter
from moetier.run.waits import RETRIES, SlotAllocator, within  # noqa: F401  (re-exported)

__all__ = ["RETRIES", "RSS_OVERHEAD_BYTES", "Runtime", "SlotAllocator", "closing", "headroom_slots", "make_backend",
           "peak_rss", "rmsnorm", "rss_bound", "run", "token_state"]

EPS = 1e-6
# what a run holds beyond its recipe's RAM budget and in-flight slots (rss_bound): the interpreter, numpy, Numba and
# its compiled kernels, jsonschema, the trace and the ledger - 205-230 MB measured on tiny-ci-cpu (docs/robustness.md)
RSS_OVERHEAD_BYTES = 320 * 2**20


def rmsnorm(h: np.ndarray) -> np.ndarray:
    return (h / np.sqrt(np.mean(h * h, axis=1, keepdims=True) + EPS)).astype(np.float32)


def token_state(hidden: int, stream: int, token: int, seed: int = 0) -> np.ndarray:
    """Deterministic input hidden state of one token (an embedding stand-in)."""
    rng = np.random.default_rng([seed, stream, token])
    return rmsnorm(rng.standard_normal((1, hidden)).astype(np.float32))[0]


def headroom_slots(R, conc: int) -> int:
    """RAM slots beyond the recipe's RAM tier for the fills a layer can have in flight: demand picks of every row,
    the prefetch budget, a few spare."""
    return 2 * conc * R.topk + 4 * int(R.policy["prefetch"].get("budget", 8)) + 8


def rss_bound(R, conc: int) -> int:
    """What a run of recipe R at ``conc`` streams may hold resident at its peak, in bytes: the recipe's RAM budget
    (budget.ram_gb; its RAM tier fits inside), the in-flight headroom slots, and RSS_OVERHEAD_BYTES."""
    return (round(float(R.raw["budget"]["ram_gb"]) * 1e9) + headroom_slots(R, conc) * R.ram_expert_bytes
            + RSS_OVERHEAD_BYTES)


def peak_rss() -> int:
    """This process's peak resident set so far, in bytes: VmHWM of /proc/self/status, the high-water mark of this
    process's own memory. getrusage's ru_maxrss survives exec, so a process started by a large parent would report
    the parent's size at the fork; it is the fallback where /proc is missing (Linux reports it in KiB)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    import resource
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def make_backend(name: str, st, R, conc: int, verify_rate: float = 1.0, faults=None):
    """The backend ``name`` sized for recipe R at ``conc`` streams: the RAM tier plus headroom_slots; unavailable ->
    one-line UserError. ``faults``: a FaultPlan for the backend's reader (chaos runs)."""
    from moetier.run.contract import BackendUnavailable
    from moetier.run.registry import get_backend
    ram_slots = min(R.keys, R.ram_slots) + headroom_slots(R, conc)
    try:
        return get_backend(name, st, ram_slots=ram_slots, vram_slots=R.vram_slots, verify_rate=verify_rate,
                           faults=faults)
    except BackendUnavailable as e:
        raise UserError(str(e)) from None


@contextmanager
def closing(be, wait_timeout_s: float | None = None):
    """``with closing(be, wait_timeout_s):`` closes the backend on the way out, within ``wait_timeout_s`` when one
    is set: a close fences first, so a backend whose transfers stopped landing would otherwise hang the process after
    the run already stopped on them. When the block is already leaving with an error, that error is the one raised
    (the close's own failure would only hide the reason the run stopped)."""
    try:
        yield be
    except BaseException:
        try:
            within(be.close, wait_timeout_s, "backend close", "a transfer the device cannot finish")
        except Exception:
            pass
        raise
    within(be.close, wait_timeout_s, "backend close", "a transfer the device cannot finish")


def run(R, store, backend, trace, conc: int = 1, *, max_steps: int = 0, seed: int = 0, keep_outputs: bool = False,
        layer_hook=None, plan_hook=None, step_hook=None, progress=None, router=None, retries: int = RETRIES,
        wait_timeout_s: float | None = None) -> dict:
    """Run ``conc`` streams for the simulator's warm + measured steps (measured capped at max_steps).

    ``router`` (moetier.run.contract.Router) picks each row's experts from its hidden state; the default replays
    the trace (TraceRouter), which keeps every plan identical to the simulator's. Another router - the backend's
    own, ``router=backend`` - routes live; prefetch predicts from the trace, so a live run needs prefetch off.
    A failed read is retried ``retries`` times (the result's "read_retries" counts them, warm-up included); a read
    not landed after ``wait_timeout_s`` stops the run (UserError)."""
    seed_mode = R.policy.get("seed", "warmup")
    warmup_tokens = int(R.policy.get("warmup_tokens", 1000))
    offsets, warm_steps, measured, wtok = _segment_plan(trace, conc, 1, seed_mode, warmup_tokens)
    if max_steps:
        measured = min(measured, max_steps)
    streams = Streams(trace, conc, R.topk, R.experts, offsets=offsets)
    rt = Runtime(R, store, backend, conc, retries=retries, wait_timeout_s=wait_timeout_s)
    if router is None:
        router = TraceRouter(trace, streams, R.topk)
    elif rt.rp.prefetching:
        raise UserError(f"recipe {R.id}: live routing needs policy.prefetch.depth 0 (prefetch predicts from the "
                        f"trace, not from the live router's picks)")
    _seed(rt, R, trace, seed_mode, wtok)
    rt.rp.settle()                    # seeding's pushes are not decode traffic
    loop = _Steps(rt, router, streams, conc, seed, layer_hook, plan_hook)
    digests, outputs = [], []
    st0 = None
    for step in range(warm_steps + measured):
        meas = step >= warm_steps
        if meas and st0 is None:
            st0 = dict(rt.stats)
            rt.call_groups.clear()
            backend.begin_measured()   # read latencies and wake-ups of the measured steps only (not seeding's)
        x, wall = loop.step(step, meas)
        digests.append(hashlib.blake2b(x.tobytes(), digest_size=8).hexdigest())
        if step_hook is not None:
            step_hook({"kind": "counters", "t": time.time(), "step": step, "measured": meas, "conc": conc,
                       "tokens": conc, "step_wall_s": wall, **rt.stats})
        if keep_outputs:
            outputs.append(x.copy())
        if progress is not None:
            progress(step, warm_steps + measured)
    rt.close()
    return _result(rt, st0, conc, measured, warm_steps, loop.wall_meas, digests, outputs if keep_outputs else None)


def _seed(rt, R, trace, seed_mode: str, wtok: int) -> None:
    """Place the hottest keys before the first step, as the simulator's ``policy.seed`` does."""
    K, E = R.topk, R.experts
    if seed_mode == "oracle":
        rt.seed_tiers(rank_keys(trace.ids[:, :, :K], E))
    elif seed_mode == "warmup" and wtok:
        warm = warmup_ids(trace, K, wtok)
        rt.seed_tiers(rank_keys(warm, E))
        rt.rp.learn(warm)
    elif R.ram_slots >= R.keys:
        rt.seed_tiers([])


class _Steps:
    """One step over every layer: route, run the layer, update the hidden state, advance the modeled clock."""

    def __init__(self, rt, router, streams, conc: int, seed: int, layer_hook, plan_hook):
        R = rt.R
        self.rt, self.router, self.streams, self.seed = rt, router, streams, seed
        self.layer_hook, self.plan_hook = layer_hook, plan_hook
        self.fixed_layer = R.fixed(conc) / R.layers
        self.t_model = 0.0
        self.wall_meas = 0.0

    def step(self, step: int, meas: bool):
        """Returns (the step's output hidden states, its wall seconds)."""
        rt, rp, R = self.rt, self.rt.rp, self.rt.R
        E, H = R.experts, rt.store.layout.hidden
        rp.begin_step(step)
        rows = self.streams.rows(step)
        x = np.stack([token_state(H, i, t, self.seed) for i, t in rows])
        w0 = time.perf_counter()
        for layer in range(R.layers):
            self.t_model += self.fixed_layer
            ids, rows_w = self.router.route(layer, x, rows)
            base = layer * E
            rows_keys = [[base + int(e) for e in r] for r in ids]
            xin = x
            y, plan, picks = rt.layer(layer, rows_keys, rows_w, x, self.t_model, self.streams, rows)
            x = rmsnorm(x + y)
            if self.plan_hook is not None:
                self.plan_hook(step, layer, plan)
            if self.layer_hook is not None:
                self.layer_hook(step, layer, xin, y, rows_keys, rows_w, rt)
            rp.after_layer(picks)
            self.t_model += plan.ms + sum(rp.settle())
            rt.end_layer()
        wall = time.perf_counter() - w0
        if meas:
            self.wall_meas += wall
        return x, wall


def _result(rt, st0, conc: int, measured: int, warm_steps: int, wall_meas: float, digests, outputs) -> dict:
    """The run's result: tok/s and ms per token by lane over the measured steps, counters, call groups."""
    st = {k: rt.stats[k] - st0[k] for k in rt.stats}
    tokens = measured * conc
    per_tok = lambda s: 1000.0 * s / tokens  # noqa: E731
    return {
        "conc": conc, "steps": measured, "warm_steps": warm_steps, "tokens": tokens,
        "tok_s": tokens / wall_meas if wall_meas else 0.0,
        "ms_per_token": 1000.0 * wall_meas / tokens,
        "lanes_ms_per_token": {"cpu": per_tok(st["lane_cpu_s"]), "gpu": per_tok(st["lane_gpu_s"]),
                               "zerocopy": per_tok(st["lane_zc_s"]), "nvme_wait": per_tok(st["nvme_wait_s"]),
                               "copy": per_tok(st["copy_s"] + st["stage_s"]),
                               "plan": per_tok(st["plan_s"] + st["predict_s"]),
                               "bookkeeping": per_tok(st["book_s"]),
                               "combine": per_tok(st["combine_s"])},
        "reads_per_token": st["nvme_picks"] / tokens,            # picks served from NVMe (the sim's nvme_per_tok)
        "prefetch_reads_per_token": st["prefetch_reads"] / tokens,
        "masked_per_token": st["masked"] / tokens,
        "lossy": st["masked"] > 0,
        "checksum_failures": int(rt.be.stats.get("checksum_failures", 0)),
        "checksum_checked": int(rt.be.stats.get("checksum_checked", 0)),
        "read_retries": int(rt.stats["read_retries"]),
        "digests": digests,
        "outputs": outputs,
        "ledger": dict(rt.L.counters),
        "counters": st,
        "call_groups": [[*k, n, sec] for k, (n, sec) in sorted(rt.call_groups.items())],
        "wall_s": wall_meas,
    }
