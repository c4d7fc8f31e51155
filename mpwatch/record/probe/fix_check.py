"""Fixes checked before they are shown: when a probe's pass goes non-finite (activations, or the
scaled gradients), or its activations come within 2**3
of float16's maximum, the probe re-runs it on the same batch, with the same weights and loss scale,
under each candidate fix, and records what each did (the ``fix_checks`` of the ``probe`` record).

The candidates, in order:

- **keep layers float32**: the first layer whose output is non-finite, then, while the pass is
  still not finite, the next layer it now fails at (once finite, while a 16-bit layer still
  comes near the maximum, the next of the layers the probe blames: those near the maximum), up
  to :data:`MAX_LAYERS` layers: exactly what
  ``dtype="float32"`` on those layers does (:class:`mpwatch.record.probe.twin.PolicyView` on just
  them, each with every layer under it: a container is kept in float32 whole); when only the
  gradients are not finite, the layer the probe blames, then every layer
  whose activations come near float16's maximum;
- **normalize the inputs**: the batch's floating-point features standardised per feature
  (``(x - mean) / std`` over the batch), in the model's own policies; not tried for a model that
  normalizes its inputs itself (:func:`mpwatch.record.model.inputs.normalized_by`:
  keras.applications' ``Rescaling`` first, a ``Normalization`` layer): the range its layers compute
  in does not depend on the inputs' scale there, and standardized inputs would reach its own
  rescaling as a nearly constant image (finite, and no fix);
- **normalize the target**: a regression target (floating, not whole numbers, some
  ``|y| >= 16``: amounts, prices, a series near 1000) standardised per column over the batch, the
  inputs as they are: the loss's gradient at the model's output, ``2 (y_pred - y) / n`` for a
  mean squared error, grows with the target's distance from zero, and every layer's gradient
  below it with it (:func:`target_to_check`; the check keeps the target's mean, spread and
  largest ``|y|``).

Each check is one forward and backward pass at the probe's loss scale, in training mode with random
layers off (the probe's own passes: ``Probe._forward_backward`` on TensorFlow,
``probe_jax.forward_backward`` over Keras' training state on JAX); the first entry
(``fix: none``) is the pass as it is. The model's state (BatchNormalization's statistics, seed
states, loss trackers) is restored afterwards on TensorFlow and never written on JAX: the user's
training sees nothing of it. It runs only on a probe that found the pass non-finite, so it costs
nothing on a healthy model. Under mpwatch's cost budget each pass is asked for first
(:class:`mpwatch.record.probe.fix_gate.FixGate`): a pass that does not fit stops the checks, and the
list ends with ``{"fix": "stopped", "reason": ...}`` (a gradient check not run has ``skipped``):
what was not checked is never read as a fix that does not fix.
"""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np

from mpwatch.formats import FLOAT16, FLOAT32_INSIDE, RAW_TARGET
from mpwatch.record.model import inputs
from mpwatch.record.probe.twin import PolicyView, backend_value, random_layers_off, state_variables

__all__ = [
    "check_fixes", "check_training_mode", "MAX_LAYERS", "normalized", "target_to_check",
]  # fmt: skip

MAX_LAYERS = 4  # layers kept float32 before the candidate is given up
HEADROOM_BITS = 3  # a pass is in range when its 16-bit activations stay 2**3 below the maximum


def normalized(x: Any) -> Any:
    """The batch's floating-point features standardised per feature over the batch (integer
    inputs as they are)."""
    import keras

    def one(t: Any) -> Any:
        a = np.asarray(t)
        if not np.issubdtype(a.dtype, np.floating):
            return t
        a64 = a.astype(np.float64)
        a64 = np.where(np.isfinite(a64), a64, 0.0)
        mean = a64.mean(axis=0, keepdims=True)
        std = a64.std(axis=0, keepdims=True)
        return ((a64 - mean) / np.where(std > 0, std, 1.0)).astype(a.dtype)

    return keras.tree.map_structure(one, x)


def target_to_check(y: Any) -> tuple[Any, dict[str, float]] | None:
    """``(standardised y, its facts)`` for a single regression target worth checking (one
    floating array, not all whole numbers, some ``|y| >= RAW_TARGET``), else None (class
    labels, one-hot rows, a target already near unit scale, several targets). The facts, of
    the column farthest from zero: ``mean``, ``std`` and ``max_abs`` of the target."""
    import keras

    flat = keras.tree.flatten(y) if y is not None else []
    if len(flat) != 1:
        return None
    a = np.asarray(flat[0])
    if not np.issubdtype(a.dtype, np.floating) or a.size == 0:
        return None
    a64 = a.astype(np.float64).reshape(a.shape[0], -1) if a.ndim else a.reshape(1, 1)
    finite = a64[np.isfinite(a64)]
    if not finite.size or np.all(finite == np.round(finite)):
        return None
    if float(np.abs(finite).max()) < RAW_TARGET:
        return None
    clean = np.where(np.isfinite(a64), a64, 0.0)
    mean, std = clean.mean(axis=0), clean.std(axis=0)
    col = int(np.argmax(np.abs(mean)))
    z = ((clean - mean) / np.where(std > 0, std, 1.0)).reshape(a.shape).astype(a.dtype)
    facts = {
        "mean": float(mean[col]),
        "std": float(std[col]),
        "max_abs": float(np.abs(finite).max()),
    }
    return z, facts


def jax_pass(probe: Any, x: Any, y: Any, sw: Any, scale: float, key: tuple = ()) -> dict[str, Any]:
    """The probe's pass (``probe_jax.forward_backward``) over Keras' training state, as one
    ``jax.jit`` program traced under the policies in force (``key`` names them: a check's
    float32 layers), kept on the probe for its later probes: one XLA compile per candidate and
    batch shape, where the same pass run op by op compiles each primitive (about 2.5x the time
    on MobileNetV2 on a CPU)."""
    import jax
    import jax.numpy as jnp

    from mpwatch.record.probe.probe_jax import fetch, forward_backward, global_batch, model_values
    from mpwatch.record.runtime.program_cache import CachedJit

    tv, ntv = model_values(probe.model)  # Keras' training state: no variable is read
    x, y, sw = global_batch(x, y, sw)
    cache = probe.__dict__.setdefault("_fix_jits", {})
    fn = cache.get(key)
    if fn is None:

        def run(tv_: list, ntv_: list, x_: Any, y_: Any, sw_: Any, s: Any) -> dict[str, Any]:
            out = forward_backward(probe, tv_, ntv_, x_, y_, sw_, s)
            return {"loss": out["loss"], "acts": out["acts"], "grads": out["grads"]}

        fn = cache[key] = CachedJit(run, "fix-check")
    out = fn(tv, ntv, x, y, sw, jnp.float32(scale))
    return out if jax.process_count() == 1 else fetch(out)


def _forward(
    probe: Any,
    x: Any,
    y: Any,
    sw: Any,
    float32_layers: list[str],
    scale: float,
    random_on: bool = False,
) -> dict[str, Any]:
    """One training-mode pass, forward and backward at loss scale ``scale``, with
    ``float32_layers`` computing in float32 (``random_on``: Dropout and the other random layers
    active, as the train step runs them; else off, the probe's own passes): whether it is
    finite, the first layer (forward order) whose output is not (``"loss"``, or ``"gradients"``
    when only the scaled gradients are not), and the largest finite |activation| of a 16-bit
    layer output."""
    import contextlib

    from keras import ops

    from mpwatch.record.runtime import backend

    model = probe.model
    view = PolicyView(model, "float32", only=set(float32_layers)) if float32_layers else None
    key = _program(float32_layers) + (("random_on",) if random_on else ())
    off = contextlib.nullcontext() if random_on else random_layers_off(probe.random_off)
    with off:
        if view is not None:
            view.__enter__()
        try:
            if backend.name() == backend.JAX:
                out = jax_pass(probe, x, y, sw, scale, key)
            else:
                out = probe._forward_backward(x, y, sw, scale)
            loss_t, acts, grads = out["loss"], out["acts"], out["grads"]
        finally:
            if view is not None:
                view.__exit__(None, None, None)
    loss = float(ops.convert_to_numpy(loss_t))
    first, peak = None, 0.0
    index = getattr(probe, "_act_layer_index", [])
    for i, a in enumerate(acts):
        arr = np.asarray(ops.convert_to_numpy(a))
        if not np.issubdtype(arr.dtype, np.floating):
            continue
        finite = np.isfinite(arr)
        if first is None and not finite.all():
            first = probe.layer_names[index[i]] if i < len(index) else None
        if arr.dtype != np.float32 and finite.any():
            peak = max(peak, float(np.abs(arr[finite]).max()))
    if first is None and not math.isfinite(loss):
        first = "loss"
    if first is None and not all(
        g is None or bool(np.isfinite(np.asarray(ops.convert_to_numpy(g))).all()) for g in grads
    ):
        first = "gradients"
    return {
        "finite": first is None,
        "in_range": first is None and peak <= FLOAT16.max / 2**HEADROOM_BITS,
        "first_nonfinite_layer": first,
        "max_abs_activation_16bit": peak,
        "loss": loss if math.isfinite(loss) else None,
    }


def check_fixes(
    probe: Any, x: Any, y: Any, sw: Any, scale: float, hints: list[str] | None = None
) -> list[dict[str, Any]]:
    """The candidate fixes checked on this batch at loss scale ``scale`` (see the module
    docstring), or ``[]`` when the pass is finite as it is (nothing to fix) or cannot be run
    here; ``[{"fix": "stopped", ...}]`` when the budget let not even that pass run. ``hints``:
    the layers the probe blames (its first non-finite layer, then those near float16's
    maximum), tried in float32 when only the gradients are not finite (no forward layer to
    follow)."""
    from mpwatch.record.runtime import backend

    if probe.mode != "float16":
        return []
    model = probe.model
    # TensorFlow's passes update BatchNormalization's statistics, seed states and the loss
    # trackers: read them first, write them back last. JAX's run in a StatelessScope (dropped).
    state = state_variables(model) if backend.name() == backend.TENSORFLOW else []
    saved = [np.array(backend_value(v).numpy()) for v in state]
    passes = _Passes(probe)

    def attempt(
        fix: str, names: list[str], inputs_: Any, target: Any = y, facts: dict | None = None
    ) -> dict[str, Any] | None:
        """One candidate's pass, kept in ``out``; None when the budget stopped the checks."""
        got = passes.run(
            _program(names), lambda _: _forward(probe, inputs_, target, sw, names, scale)
        )
        if got is not None:
            out.append({"fix": fix, "layers": list(names), **got, **(facts or {})})
        return got

    try:
        base = passes.run(_program([]), lambda _: _forward(probe, x, y, sw, [], scale))
        if base is None:  # not even the pass as it is fits: wanted, and not run
            return [{"fix": "stopped", "layers": [], "reason": passes.stopped()}]
        if base["in_range"]:
            return []  # nothing to fix
        out: list[dict[str, Any]] = [{"fix": "none", "layers": [], **base}]
        first = base["first_nonfinite_layer"]
        layers = [str(first)] if first not in (None, "loss", "gradients") else []
        if not layers and hints:
            # no forward layer to follow (only the gradients are not finite, or the activations
            # only come near the maximum): the blamed layer, then every layer near the maximum
            for names in ([hints[0]], list(dict.fromkeys(hints))[:MAX_LAYERS]):
                got = attempt("float32_layers", names, x)
                if got is None or got["in_range"] or len(hints) == 1:
                    break
        for _ in range(MAX_LAYERS if layers else 0):
            got = attempt("float32_layers", layers, x)
            if got is None or got["in_range"]:
                break
            nxt = got["first_nonfinite_layer"]
            if nxt is None and got["finite"]:
                # finite, a layer still near the maximum: the blamed layers not yet kept
                nxt = next((h for h in hints or [] if h not in layers), None)
            if nxt in (None, "loss", "gradients") or nxt in layers:
                break
            layers = layers + [str(nxt)]
        if inputs.normalized_by(model) is None:  # else the model normalizes them itself
            attempt("normalize_inputs", [], normalized(x))
        raw = target_to_check(y)
        if raw is not None:
            attempt("normalize_target", [], x, raw[0], {"target": raw[1]})
        stopped = passes.stopped()
        return out + ([{"fix": "stopped", "layers": [], "reason": stopped}] if stopped else [])
    finally:
        for v, value in zip(state, saved):
            backend_value(v).assign(value)


def check_training_mode(
    probe: Any, x: Any, y: Any, sw: Any, scale: float, candidates: list[str]
) -> dict[str, Any] | None:
    """Where the probe's own pass (random layers off) is finite but the training skipped steps:
    the pass as the train step runs it, Dropout and the other random layers on (one draw), at
    ``scale`` (the largest scale a step skipped at since the last probe), and, where it is not
    finite, the same draw with each of ``candidates`` (the layer the pass fails at, else the
    model's 16-bit outputs) in float32: ``{"scale", "finite", "first_nonfinite_layer",
    "float32_layers", "fixed"}`` (``fixed``: that layer in float32 made the same draw finite;
    None where no candidate was tried), or None where the model has no random layer or the
    budget refused the pass. The model's state (seed states too: each candidate sees the same
    masks) is restored afterwards on TensorFlow, never written on JAX."""
    from mpwatch.record.runtime import backend

    if probe.mode != "float16" or not probe.random_off:
        return None
    model = probe.model
    state = state_variables(model) if backend.name() == backend.TENSORFLOW else []
    saved = [np.array(backend_value(v).numpy()) for v in state]

    def restore() -> None:
        for v, value in zip(state, saved):
            backend_value(v).assign(value)

    passes = _Passes(probe)
    try:
        base = passes.run(
            _program([]) + ("random_on",),
            lambda _: _forward(probe, x, y, sw, [], scale, random_on=True),
        )
        if base is None:
            return None
        out: dict[str, Any] = {
            "scale": float(scale),
            "finite": base["finite"],
            "first_nonfinite_layer": base["first_nonfinite_layer"],
            "float32_layers": [],
            "fixed": None,
        }
        if base["finite"]:
            return out
        first = base["first_nonfinite_layer"]
        tries = [first] if first not in (None, "loss", "gradients") else list(candidates)
        for name in tries[:MAX_LAYERS]:
            restore()  # the same masks
            got = passes.run(
                _program([name]) + ("random_on",),
                lambda _, n=name: _forward(probe, x, y, sw, [n], scale, random_on=True),
            )
            if got is None:
                break
            out["float32_layers"], out["fixed"] = [name], bool(got["finite"])
            if got["finite"]:
                break
        return out
    finally:
        restore()


def _program(float32_layers: list[str]) -> tuple:
    """The key of a check's pass: its program, named by the layers it keeps in float32 (JAX
    compiles one per key and keeps it for later probes; the budget's gate estimates by it)."""
    return ("float32", *sorted(float32_layers))


class _Passes:
    """The checks' passes, each asked of the probe's gate first (``probe.fix_gate``: a
    :class:`mpwatch.record.probe.fix_gate.FixGate` set by the probe's monitor under a cost budget;
    None: every pass runs) and timed for it. ``key`` names a pass's program (the layers it
    keeps in float32)."""

    def __init__(self, probe: Any) -> None:
        self.gate = getattr(probe, "fix_gate", None)

    def run(self, key: tuple, fn: Any) -> Any:
        """``fn(key)``, or None when the gate refuses the pass (and, once it has, every pass
        after it)."""
        if self.gate is not None and not self.gate.allow(key):
            return None
        t0 = time.perf_counter()
        try:
            return fn(key)
        finally:
            if self.gate is not None:
                self.gate.ran(key, time.perf_counter() - t0)

    def stopped(self) -> str | None:
        """Why the checks stopped before their end (None: they did not)."""
        return self.gate.reason() if self.gate is not None else None


#: a layer whose gradient error is above this (per 16-bit dtype) and stands out from the median
#: by GRAD_OUTLIER is checked in float32 (the gradient-error rule's own thresholds)
GRAD_ERROR = {"float16": 0.05, "bfloat16": 0.10}
GRAD_OUTLIER = 4.0
GRAD_CHECKED = 8  # layers checked per probe, largest error first


def _layer_errors(probe: Any, mixed: list[Any], ref: list[Any], scale: float) -> dict[str, float]:
    """Each layer's gradient relative error ||mixed/scale - ref|| / ||ref|| over its
    variables."""
    from keras import ops

    num: dict[str, float] = {}
    den: dict[str, float] = {}
    for layer, m, r in zip(probe._var_layer, mixed, ref):
        if m is None or r is None:
            continue
        m64 = np.asarray(ops.convert_to_numpy(m), np.float64) / float(scale)
        r64 = np.asarray(ops.convert_to_numpy(r), np.float64)
        num[layer] = num.get(layer, 0.0) + float(np.sum((m64 - r64) ** 2))
        den[layer] = den.get(layer, 0.0) + float(np.sum(r64**2))
    return {k: math.sqrt(num[k] / den[k]) if den[k] > 0 else 0.0 for k in num}


def _grads(
    probe: Any, x: Any, y: Any, sw: Any, scale: float, view: Any, key: tuple = ()
) -> list[Any]:
    from mpwatch.record.runtime import backend

    with random_layers_off(probe.random_off):
        if view is not None:
            view.__enter__()
        try:
            if backend.name() == backend.JAX:
                return list(jax_pass(probe, x, y, sw, scale, key)["grads"])
            return list(probe._forward_backward(x, y, sw, scale)["grads"])
        finally:
            if view is not None:
                view.__exit__(None, None, None)


def check_gradient_fixes(
    probe: Any, x: Any, y: Any, sw: Any, scale: float, errors: dict[str, float]
) -> list[dict[str, Any]]:
    """For the layers whose gradient error (``errors``, the probe's per-layer
    ``grad_rel_error``) is above :data:`GRAD_ERROR` and :data:`GRAD_OUTLIER` times the median of
    the others (at most :data:`GRAD_CHECKED`, largest first): the pass re-run with that layer in
    float32, and its gradient error then, against the float32 reference of the same batch. A
    layer whose error barely moves carries an error that comes from elsewhere: float32 there
    does not fix it. ``[]`` when no layer stands out (float16 and bfloat16 probes)."""
    from mpwatch.record.runtime import backend

    if probe.mode not in GRAD_ERROR or not errors:
        return []
    threshold = GRAD_ERROR[probe.mode]
    vals = sorted(v for v in errors.values() if v is not None and math.isfinite(v))
    model = probe.model
    # a layer that computes in float32 already (its own dtype, or a normalization layer Keras
    # upcasts inside) is no candidate: float32 is what it has
    float32 = {
        ly.name for ly in model.layers
        if type(ly).__name__ in FLOAT32_INSIDE or getattr(ly, "compute_dtype", "") == "float32"
    }  # fmt: skip
    candidates = []
    for name, err in sorted(errors.items(), key=lambda kv: -(kv[1] or 0.0)):
        if name in float32:
            continue
        others = [v for v in vals if v != err] or [0.0]
        median = float(np.median(others))
        if err is not None and err > threshold and err > GRAD_OUTLIER * median:
            candidates.append(name)
    if not candidates:
        return []
    state = state_variables(model) if backend.name() == backend.TENSORFLOW else []
    saved = [np.array(backend_value(v).numpy()) for v in state]
    passes = _Passes(probe)
    try:
        ref = passes.run(
            ("reference",),
            lambda key: _grads(probe, x, y, sw, 1.0, PolicyView(model, "float32"), key),
        )
        out = []
        for name in candidates[:GRAD_CHECKED]:
            check: dict[str, Any] = {"layer": name, "before": float(errors[name]), "after": None}
            out.append(check)
            view = PolicyView(model, "float32", only={name})
            try:
                # None once the budget refused a pass (the reference too: none runs after it)
                mixed = passes.run(
                    _program([name]),
                    lambda key, v=view: _grads(probe, x, y, sw, scale, v, key),
                )
                if mixed is None:
                    check["skipped"] = passes.stopped()
                    continue
                check["after"] = _layer_errors(probe, mixed, ref, scale).get(name)
            except Exception as e:  # noqa: BLE001  (this candidate could not run: the others can)
                first = (str(e).splitlines() or [""])[0][:200]
                check["error"] = f"{type(e).__name__}: {first}"
        return out
    finally:
        for v, value in zip(state, saved):
            backend_value(v).assign(value)
