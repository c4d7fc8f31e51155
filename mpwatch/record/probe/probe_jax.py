"""The probe on Keras' JAX backend: the same passes and the same statistics as on TensorFlow
(:mod:`mpwatch.record.probe.probe`), in one ``jax.jit`` function traced once per probe batch shape.

- **Values.** During ``fit`` Keras keeps the training state outside the model's variables
  (``model._jax_state``; the variables themselves are purged). The probe takes the current values
  from there (else from the variables) and passes them to the jitted function as arguments: it
  never reads a purged variable, never syncs the state, never writes a variable.
- **Passes.** A pass runs the model inside a ``keras.StatelessScope`` that maps every model
  variable to its value: BatchNormalization normalises with the batch's statistics and its
  moving-statistics update stays in the scope, which is dropped (the probe never changes the
  model); regularization and activity losses are collected in the scope, so the loss is the train
  step's (``model._compute_loss``). Functional and Sequential models run their own layer graph
  (Keras' ``_run_through_graph``, as their ``call`` does, with ``training=True``), keeping each
  top-level layer's outputs and adding a zero tensor to each float output (of its dtype): one
  ``jax.value_and_grad`` then gives the gradients w.r.t. the trainable values *and* w.r.t. every
  layer output (the gradient w.r.t. that zero), in the output's dtype, float16 under
  mixed_float16, as TensorFlow's tape gives it. The other policy's pass runs under the
  :class:`~mpwatch.record.probe.twin.PolicyView` while it is traced, exactly as on TensorFlow.
- **Statistics** (definitions: :mod:`mpwatch.record.probe.underflow`) by reductions over the
  flattened tensors laid out as rows of one matrix
  (:class:`~mpwatch.record.tap.jax_blocks.BlockLayout`: each row reduced, then the rows' results per
  tensor), so the traced program grows by one reshape and pad per tensor, not by a dozen reductions
  per tensor, and no element is scattered. JAX computes in float32 (float64 needs
  ``jax_enable_x64``): counts are int32 sums (exact); sums of squares are taken of values divided by
  a power of two at or above their tensor's largest finite reference magnitude, and multiplied back
  in float64 on the host (exact scaling both ways), so tiny gradients do not underflow in the
  squares and large activations do not overflow.
- **Result.** :func:`host_tables` turns the device's vectors into the float64 tables the
  TensorFlow path produces (``grads [n, 7]``, ``acts [k, 6]``, ``act_grads [k, 4]``, the
  histogram, the zero count and the losses), which :meth:`Probe._payload` writes the same way.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from mpwatch.record.probe import probe_stats_each as each
from mpwatch.record.probe import underflow
from mpwatch.record.tap.jax_blocks import BlockLayout


# --- values ---------------------------------------------------------------------------------------
def model_values(model: Any) -> tuple[list[Any], list[Any]]:
    """(trainable, non-trainable) current values: Keras' training state during ``fit``, else the
    variables' own values."""
    state = getattr(model, "_jax_state", None) or {}
    tv = state.get("trainable_variables")
    ntv = state.get("non_trainable_variables")
    if tv is None:
        tv = [v.value for v in model.trainable_variables]
    if ntv is None:
        ntv = [v.value for v in model.non_trainable_variables]
    return list(tv), list(ntv)


def optimizer_value(model: Any, variable: Any) -> Any:
    """The current value of one of the optimizer's variables (``dynamic_scale``): from Keras'
    training state during ``fit``, else the variable's own."""
    state = getattr(model, "_jax_state", None) or {}
    values = state.get("optimizer_variables")
    if values is not None:
        for i, v in enumerate(model.optimizer.variables):
            if v is variable:
                return values[i]
    return variable.value


# --- several processes ----------------------------------------------------------------------------
def global_batch(x: Any, y: Any, sw: Any) -> tuple[Any, Any, Any]:
    """The batch as the jitted passes take it. In one process, as it is. With several JAX
    processes under a ``keras.distribution``, each holds its part of the batch: the parts become
    one global array laid out as Keras lays out its training batches (Keras' own
    ``_distribute_data``), so every process runs the same program on the whole batch."""
    import jax

    if jax.process_count() == 1:
        return x, y, sw
    from keras.src.backend.jax.trainer import _distribute_data

    return _distribute_data((x, y, sw))


def fetch(tree: Any) -> Any:
    """Device arrays to the host: ``jax.device_get``, or, where they span several processes'
    devices, gathered from every process (a collective: every process calls it at once)."""
    import jax

    if jax.process_count() == 1:
        return jax.device_get(tree)
    from jax.experimental import multihost_utils

    return multihost_utils.process_allgather(tree, tiled=True)


# --- one pass -------------------------------------------------------------------------------------
def _graph_model(model: Any) -> Any:
    """The Functional graph a Functional or (built) Sequential model runs, else None."""
    from keras.src.models.functional import Functional

    if isinstance(model, Functional):
        return model
    fm = getattr(model, "_functional", None)
    return fm if isinstance(fm, Functional) else None


def _run_graph(probe: Any, x: Any, eps: list | None) -> tuple[Any, list[list[Any]]]:
    """(model outputs, each tapped layer's flat outputs): the model's layer graph in training
    mode, ``eps[i][j]`` (or None) added to output j of tapped layer i."""
    import keras
    from keras.src.models.functional import operation_fn

    fm = _graph_model(probe.model)
    index = {id(layer): i for i, layer in enumerate(probe.tapped_layers)}
    outs: dict[int, list[Any]] = {}

    def hook(op: Any) -> Any:
        call = operation_fn(op, training=True)
        i = index.get(id(op))
        if i is None:
            return call

        def run(*args: Any, **kwargs: Any) -> Any:
            result = call(*args, **kwargs)
            flat = keras.tree.flatten(result)
            if eps is not None:
                flat = [f if e is None else f + e for f, e in zip(flat, eps[i])]
            outs[i] = flat
            return keras.tree.pack_sequence_as(result, flat)

        return run

    y = fm._run_through_graph(fm._standardize_inputs(x), operation_fn=hook)
    if isinstance(y, (list, tuple)) and len(y) == 1:
        y = y[0]
    return y, [outs.get(i, []) for i in range(len(probe.tapped_layers))]


def _scope(probe: Any, tv: list, ntv: list) -> Any:
    import keras

    m = probe.model
    mapping = list(zip(m.trainable_variables, tv)) + list(zip(m.non_trainable_variables, ntv))
    # the metrics' variables too: the compiled loss of a multi-output model updates a tracker
    # per output, and during fit Keras keeps their values in its state and purges the variables
    # (reading one fails). Their values never enter the loss, so zeros stand in; the updates
    # stay in the scope, which is dropped: the user's trackers never see the probe
    import jax.numpy as jnp

    mapped = {id(v) for v, _ in mapping}
    mapping += [
        (v, jnp.zeros(v.shape, v.dtype)) for v in m.metrics_variables if id(v) not in mapped
    ]
    return keras.StatelessScope(state_mapping=mapping, collect_losses=True)


def forward_backward(probe: Any, tv: list, ntv: list, x: Any, y: Any, sw: Any, scale: Any) -> dict:
    """One training-mode pass of the model as the current policies are (traced inside the
    probe's jitted function): loss, gradients of ``loss * scale`` w.r.t. the trainable values
    and w.r.t. the tapped layers' float outputs (None for the others)."""
    import jax
    import jax.numpy as jnp

    graph = bool(probe.tapped_layers)

    def run(tv_: list, eps: list | None) -> tuple[Any, tuple[Any, list]]:
        with _scope(probe, tv_, ntv):
            if graph:
                y_pred, acts = _run_graph(probe, x, eps)
            else:
                y_pred, acts = probe.model(x, training=True), []
            loss = probe._loss(x, y, y_pred, sw)
        return loss * scale, (loss, acts)

    eps = None
    if graph:
        shapes = jax.eval_shape(lambda t: run(t, None)[1][1], tv)
        eps = [
            [
                jnp.zeros(s.shape, s.dtype) if jnp.issubdtype(s.dtype, jnp.floating) else None
                for s in layer
            ]
            for layer in shapes
        ]
    grad = jax.value_and_grad(run, argnums=(0, 1), has_aux=True)
    (_, (loss, acts)), (g_tv, g_eps) = grad(tv, eps)
    flat_acts = [a for layer in acts for a in layer]
    flat_eps = [e for layer in (eps or []) for e in layer]
    flat_geps = [g for layer in (g_eps or []) for g in layer]
    act_grads = []
    for e, g in zip(flat_eps, flat_geps):
        act_grads.append(None if e is None else g)
    return {"loss": loss, "grads": list(g_tv), "acts": flat_acts, "act_grads": act_grads}


def train_step_loss(probe: Any, tv: list, ntv: list, x: Any, y: Any, sw: Any) -> Any:
    """The train step's loss on this batch with these values: the model's own call in training
    mode (run where :attr:`Probe.check_loss` says the probe's pass is not that call)."""
    with _scope(probe, tv, ntv):
        return probe._loss(x, y, probe.model(x, training=True), sw)


# --- statistics on the device ---------------------------------------------------------------------
def _pow2_at_least(m: Any) -> Any:
    """A power of two >= m (1 where m is 0 or not finite): dividing by it is exact."""
    import jax.numpy as jnp

    ok = jnp.isfinite(m) & (m > 0)
    _, e = jnp.frexp(jnp.where(ok, m, 1.0))
    return jnp.where(ok, jnp.ldexp(jnp.ones_like(m), e), 1.0)


def _abs_finite(x: Any) -> Any:
    import jax.numpy as jnp

    a = jnp.abs(x)
    return jnp.where(jnp.isfinite(a), a, 0.0)


def grad_stats(mixed_scaled: list, ref: list, scale: Any, zero: Any) -> dict:
    """Per variable: size, ref_nonzero, underflow, normalised squared error and reference, their
    power-of-two norm, nonfinite count of the mixed gradient, max |ref| (inf if it is not
    finite). Columns as :func:`underflow.grad_table`."""
    import jax.numpy as jnp

    rows = BlockLayout.of(ref, zero)
    r, m = rows.matrix(ref), rows.matrix(mixed_scaled)
    ref_nz = r != 0
    max_ref = jnp.where(rows.count(~jnp.isfinite(r)) > 0, jnp.inf, rows.max(_abs_finite(r)))
    norm = _pow2_at_least(max_ref)
    spread = rows.spread(norm)
    diff = (m / scale - r) / spread
    return {
        "size": rows.sizes,
        "ref_nonzero": rows.count(ref_nz),
        "underflow": rows.count(ref_nz & (m == 0)),
        "err_n": rows.sum(diff * diff),
        "ref_n": rows.sum(jnp.square(r / spread)),
        "norm": norm,
        "nonfinite": rows.count(~jnp.isfinite(m)),
        "max_ref": max_ref,
    }


def act_stats(mixed: list, ref: list | None, zero: Any) -> dict:
    """Per layer output: columns as :func:`underflow.activation_table` (sums of squares
    normalised as in :func:`grad_stats`)."""
    import jax.numpy as jnp

    rows = BlockLayout.of(mixed, zero)
    m = rows.matrix(mixed)
    nonfinite = rows.count(~jnp.isfinite(m))
    out = {
        "size": rows.sizes,
        "nonfinite": nonfinite,
        "max_mixed": jnp.where(nonfinite > 0, jnp.inf, rows.max(_abs_finite(m))),
    }
    if ref is not None:
        r = rows.matrix(ref)
        out["max_ref"] = rows.max(_abs_finite(r))
        out["norm"] = _pow2_at_least(out["max_ref"])
        spread = rows.spread(out["norm"])
        d = (m - r) / spread
        out["err_n"] = rows.sum(d * d)
        out["ref_n"] = rows.sum(jnp.square(r / spread))
    return out


def act_grad_stats(mixed_scaled: list, ref: list, zero: Any) -> dict:
    """Per layer output with a gradient: ref_nonzero, underflow, max finite |ref|, nonfinite count
    of the mixed one (columns as :func:`underflow.act_grad_table`)."""
    import jax.numpy as jnp

    rows = BlockLayout.of(ref, zero)
    r, m = rows.matrix(ref), rows.matrix(mixed_scaled)
    nz = r != 0
    return {
        "ref_nonzero": rows.count(nz),
        "underflow": rows.count(nz & (m == 0)),
        "max_ref": rows.max(_abs_finite(r)),
        "nonfinite": rows.count(~jnp.isfinite(m)),
    }


def log2_histogram(tensors: list, zero: Any = 0) -> tuple[Any, Any]:
    """(int32 ``[NUM_BINS]`` counts of ``floor(log2|x|)`` over the finite nonzero elements,
    count of exact zeros); ``frexp`` gives the exponent exactly, also at powers of two."""
    import jax
    import jax.numpy as jnp

    rows = BlockLayout.of(tensors, zero)
    a = jnp.abs(rows.matrix(tensors))
    counted = (a > 0) & jnp.isfinite(a)
    _, e = jnp.frexp(jnp.where(counted, a, 1.0))  # a = f * 2**e, f in [0.5, 1)
    idx = jnp.clip(e - 1 - underflow.HIST_LO, 0, underflow.NUM_BINS - 1)
    idx = jnp.where(counted, idx, underflow.NUM_BINS)  # the rest go to a bin that is dropped
    hist = jax.ops.segment_sum(
        jnp.ones_like(idx, jnp.int32).ravel(), idx.ravel(), num_segments=underflow.NUM_BINS + 1
    )
    zeros = jnp.sum((a == 0).astype(jnp.int32)) - rows.padding
    return hist[: underflow.NUM_BINS], zeros


def cast_through(x: Any, dtype: str, scale: float = 1.0) -> Any:
    """x (float32) times ``scale``, rounded to ``dtype`` and back: what that format keeps."""
    import jax.numpy as jnp

    return (jnp.asarray(x, jnp.float32) * scale).astype(dtype).astype(jnp.float32)


# --- which way each tensor is reduced ------------------------------------------------------------
def _large(tensors: list) -> list[int]:
    """The indices of the tensors reduced one at a time: all of them under a
    ``keras.distribution`` (reduced where their shards live), else those of at least
    :data:`mpwatch.record.tap.stats.DIRECT_MIN` elements (a copy into the block matrix would cost
    the probe their size again; :mod:`mpwatch.record.probe.probe_stats_each`)."""
    from mpwatch.record.tap.stats import DIRECT_MIN

    if each.sharded():
        return list(range(len(tensors)))
    return [i for i, t in enumerate(tensors) if int(np.prod(np.shape(t))) >= DIRECT_MIN]


def routed(lists: list[list | None], blocks: Any, one_by_one: Any) -> dict:
    """Per-tensor statistics of parallel tensor lists (``lists[0]`` decides the sizes; a None
    list stays None): the large tensors' by ``one_by_one(*lists)``, the others' by
    ``blocks(*lists)``, each column back in the tensors' order."""
    import jax.numpy as jnp

    n = len(lists[0])
    big = _large(lists[0])
    if len(big) in (0, n):
        return (blocks if not big or n == 0 else one_by_one)(*lists)
    chosen = set(big)
    small = [i for i in range(n) if i not in chosen]

    def pick(idx: list[int]) -> list:
        return [None if lst is None else [lst[i] for i in idx] for lst in lists]

    parts = (blocks(*pick(small)), one_by_one(*pick(big)))
    order = np.argsort(np.asarray(small + big))  # static: back to the tensors' order
    out = {}
    for key in parts[0]:
        a, b = parts[0][key], parts[1][key]
        if isinstance(a, np.ndarray) and isinstance(b, np.ndarray):
            out[key] = np.concatenate([a, b])[order]
        else:
            out[key] = jnp.take(
                jnp.concatenate([jnp.asarray(a), jnp.asarray(b).astype(jnp.asarray(a).dtype)]),
                jnp.asarray(order, jnp.int32),
            )
    return out


def histogram_routed(tensors: list, zero: Any) -> tuple[Any, Any]:
    """:func:`log2_histogram` of the tensors, the large ones (:func:`_large`) one at a time, a
    chunk at a time on one device."""
    big = set(_large(tensors))
    parts = []
    if len(big) < len(tensors):
        parts.append(log2_histogram([t for i, t in enumerate(tensors) if i not in big], zero))
    if big:
        chunked = not each.sharded()
        parts.append(each.log2_histogram([tensors[i] for i in sorted(big)], chunked=chunked))
    hist, zeros = parts[0]
    for h, z in parts[1:]:
        hist, zeros = hist + h, zeros + z
    return hist, zeros


# --- the jitted probe -----------------------------------------------------------------------------
def _signature(*data: Any) -> tuple:
    """Shapes and dtypes of a batch's arrays, and its structure: what a compiled program
    takes."""
    import keras

    leaves = keras.tree.flatten(list(data))
    return (
        str(keras.tree.map_structure(lambda _: 0, list(data))),
        tuple((tuple(np.shape(v)), str(getattr(v, "dtype", type(v).__name__))) for v in leaves),
    )


class JaxProbeFunction:
    """The probe's computation on JAX: ``fn(x, y, sw, scale)`` returns the same host tables as
    the TensorFlow function (see the module doc). Traced once per probe batch shape."""

    def __init__(self, probe: Any) -> None:
        from mpwatch.record.runtime.program_cache import CachedJit

        self.probe = probe
        self._jit = CachedJit(self._device, "probe")  # compiled once per machine, not per fit
        self._ahead: Any = None  # (the batch's signature, the future of its compiled program)

    def precompile(self, x: Any, y: Any, sw: Any, cached_only: bool = False) -> bool:
        """Trace the probe for this batch now (on the calling thread, between training steps:
        tracing reads the model's layers and policies) and compile it on a background thread
        (XLA's compile holds no Python state): JAX's ahead-of-time ``lower().compile()``, or the
        executable of an earlier process (:mod:`mpwatch.record.runtime.program_cache`). The compile
        runs beside training (on a GPU machine the host's cores are mostly idle); the first probe
        waits for what is left of it.

        ``cached_only`` (a CPU, whose cores training uses: an XLA compile beside it slows both
        and saves nothing): only an executable already in the cache is loaded on the thread;
        otherwise the traced program is kept and the first probe compiles it, on the training
        thread, without tracing again. True when a load or compile was started."""
        import concurrent.futures
        import os

        import jax.numpy as jnp

        from mpwatch.record.runtime import program_cache

        tv, ntv = model_values(self.probe.model)
        lowered = self._jit.lower(tv, ntv, x, y, sw, jnp.float32(1.0), jnp.int32(0))
        signature = _signature(x, y, sw)
        path = program_cache.entry(lowered, "probe")
        if cached_only and not (path is not None and os.path.isfile(path)):
            self._ahead = (signature, _Later(program_cache.from_entry, lowered, path))
            return False
        pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="mpwatch-probe")
        self._ahead = (signature, pool.submit(program_cache.from_entry, lowered, path))
        pool.shutdown(wait=False)
        return True

    def ahead_pending(self) -> bool:
        """Whether the program compiled ahead is still compiling (the next call would wait)."""
        later = self._ahead[1] if self._ahead is not None else None
        return later is not None and hasattr(later, "done") and not later.done()

    def _program(self, x: Any, y: Any, sw: Any) -> Any:
        """What runs the probe on this (global) batch: the program compiled ahead, else the
        cached jit."""
        if self._ahead is not None and self._ahead[0] == _signature(x, y, sw):
            try:
                return self._ahead[1].result()  # compiled ahead: waits for what is left
            except Exception:  # noqa: BLE001 - compiled again, on this thread
                self._ahead = None
        return self._jit

    def memory_analysis(self, x: Any, y: Any, sw: Any) -> Any:
        """XLA's memory analysis of the probe's executable for this batch (compiled now if it
        was not: the probe then runs it), or None (several devices, or no analysis)."""
        import jax.numpy as jnp

        tv, ntv = model_values(self.probe.model)
        x, y, sw = global_batch(x, y, sw)
        fn = self._program(x, y, sw)
        args = (tv, ntv, x, y, sw, jnp.float32(1.0), jnp.int32(0))
        exe = fn.executable(*args) if isinstance(fn, type(self._jit)) else fn
        try:
            return None if exe is None else exe.memory_analysis()
        except Exception:  # noqa: BLE001 - a backend without the analysis
            return None

    def __call__(self, x: Any, y: Any, sw: Any, scale: float) -> dict[str, np.ndarray]:
        import jax.numpy as jnp

        tv, ntv = model_values(self.probe.model)
        x, y, sw = global_batch(x, y, sw)
        fn = self._program(x, y, sw)
        raw = fn(tv, ntv, x, y, sw, jnp.float32(scale), jnp.int32(0))
        return host_tables(fetch(raw))

    def _device(self, tv: list, ntv: list, x: Any, y: Any, sw: Any, scale: Any, zero: Any) -> dict:
        import jax.numpy as jnp

        probe = self.probe

        def fb(x_: Any, y_: Any, sw_: Any, s: Any) -> dict:
            return forward_backward(probe, tv, ntv, x_, y_, sw_, s)

        low, ref, train_loss = probe._passes(
            x, y, sw, scale, fb=fb, train_loss_fn=lambda: train_step_loss(probe, tv, ntv, x, y, sw)
        )
        has_ref = probe.mode == "preflight" or ref is not None
        if low is None:  # pre-flight without a mixed pass: the reference cast through float16
            low = {
                "loss": ref["loss"],
                "grads": [cast_through(g, "float16", scale) for g in ref["grads"]],
                "acts": [cast_through(a, "float16") for a in ref["acts"]],
                "act_grads": [
                    None if g is None else cast_through(g, "float16", scale)
                    for g in ref["act_grads"]
                ],
            }
        own = ref if probe.mode == "preflight" else low
        out: dict[str, Any] = {
            "loss": low["loss"],
            "ref_loss": ref["loss"] if has_ref else low["loss"],
            "own_loss": own["loss"],
            "train_loss": own["loss"] if train_loss is None else train_loss,
        }
        if has_ref:
            ref_grads = ref["grads"]
        else:  # no reference: the mixed gradients against themselves (unscaled)
            ref_grads = [jnp.asarray(g, jnp.float32) / scale for g in low["grads"]]
        out["grads"] = routed(
            [low["grads"], ref_grads],
            lambda m, r: grad_stats(m, r, scale, zero),
            lambda m, r: each.grad_stats(m, r, scale, _pow2_at_least),
        )
        out["hist"], out["zeros"] = histogram_routed(ref_grads, zero)
        ref_acts = ref["acts"] if has_ref else None
        out["acts"] = routed(
            [low["acts"], ref_acts],
            lambda m, r: act_stats(m, r, zero),
            lambda m, r: each.act_stats(m, r, _pow2_at_least),
        )
        if has_ref:
            pairs = [(gl, gr) for gl, gr in zip(low["act_grads"], ref["act_grads"])]
            present = [i for i, (_, gr) in enumerate(pairs) if gr is not None]
            mixed_ag, ref_ag = [pairs[i][0] for i in present], [pairs[i][1] for i in present]
            out["act_grads"] = routed(
                [mixed_ag, ref_ag],
                lambda m, r: act_grad_stats(m, r, zero),
                each.act_grad_stats,
            )
            out["act_grads_present"] = np.array(present, np.int64)
            out["n_acts"] = len(pairs)
        return out


class _Later:
    """A call made when its result is first asked for, on the asking thread (a future's
    ``result()``, for a program traced ahead whose compile waits for the first probe)."""

    def __init__(self, fn: Any, *args: Any) -> None:
        self._call: Any = (fn, args)
        self._value: Any = None

    def result(self) -> Any:
        if self._call is not None:
            fn, args = self._call
            self._value, self._call = fn(*args), None
        return self._value


def host_tables(raw: dict) -> dict[str, np.ndarray]:
    """The device's vectors as the TensorFlow path's float64 tables (see the module doc)."""
    f64 = lambda v: np.asarray(v, np.float64)  # noqa: E731
    g = raw["grads"]
    norm_sq = f64(g["norm"]) ** 2
    grads = np.stack(
        [
            f64(g["size"]),
            f64(g["ref_nonzero"]),
            f64(g["underflow"]),
            f64(g["err_n"]) * norm_sq,
            f64(g["ref_n"]) * norm_sq,
            f64(g["nonfinite"]),
            f64(g["max_ref"]),
        ],
        axis=1,
    ).reshape(-1, 7)
    a = raw["acts"]
    k = len(a["size"])
    if "err_n" in a:
        a_sq = f64(a["norm"]) ** 2
        err, ref, max_ref = f64(a["err_n"]) * a_sq, f64(a["ref_n"]) * a_sq, f64(a["max_ref"])
    else:
        err = ref = max_ref = np.zeros(k)
    acts = np.stack(
        [f64(a["size"]), err, ref, f64(a["max_mixed"]), f64(a["nonfinite"]), max_ref], axis=1
    ).reshape(-1, 6)
    out = {
        "loss": np.float64(raw["loss"]),
        "ref_loss": np.float64(raw["ref_loss"]),
        "own_loss": np.float64(raw["own_loss"]),
        "train_loss": np.float64(raw["train_loss"]),
        "grads": grads,
        "hist": np.asarray(raw["hist"], np.int64),
        "zeros": np.float64(raw["zeros"]),
        "acts": acts,
    }
    if "act_grads" in raw:
        ag = np.zeros((int(raw["n_acts"]), 4))
        present = np.asarray(raw["act_grads_present"], np.int64)
        got = raw["act_grads"]
        ag[present] = np.stack(
            [
                f64(got["ref_nonzero"]),
                f64(got["underflow"]),
                f64(got["max_ref"]),
                f64(got["nonfinite"]),
            ],
            axis=1,
        ).reshape(-1, 4)
        out["act_grads"] = ag
    return out
