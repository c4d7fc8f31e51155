"""The op inside a layer that overflows float16, also where what follows it is finite again.

A user's RMSNorm computes ``x * rsqrt(mean(square(x)) + eps)``: in float16, ``square(x)`` is inf
once ``|x|`` passes 256, the mean is inf, ``rsqrt(inf)`` is 0, and the layer's output is finite:
0 where float32's is not. The probe sees only the layer's output (an error of 100% against the
float32 reference, no overflow); the overflow is one op inside it.

:func:`scan` runs each layer the probe found far off float32 (``output_rel_error`` at least
:data:`SCANNED_ERROR`, at most :data:`MAX_LAYERS` a probe, each layer once a fit) op by op on its
own 16-bit input from the probe's batch, and returns the first op whose output is not finite
while its floating inputs are: its name, the user's source line that made it, the largest
``|value|`` going into it, and whether the layer's output is finite all the same (the overflow
hidden). On TensorFlow the layer's call is traced into a graph and every op's output fetched
(``tf.compat.v1.wrap_function`` and ``prune``); on JAX its jaxpr is evaluated equation by
equation. A Sequential or Functional model's layers only (a layer's input is a tensor of the
model's graph); nothing is written to the model.

Example:
    >>> import numpy as np, keras
    >>> from keras import ops
    >>> class Norm(keras.layers.Layer):
    ...     def call(self, x):
    ...         return x * ops.rsqrt(ops.mean(ops.square(x), axis=-1, keepdims=True))
    >>> first_overflow(Norm(dtype="mixed_float16"), np.full((2, 4), 300.0, "float16"))["op"].lower()
    'square'
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from mpwatch.formats import SCANNED_ERROR

__all__ = ["scan", "first_overflow", "SCANNED_ERROR", "MAX_LAYERS"]

MAX_LAYERS = 4  # layers scanned a probe

_FRAMEWORK = tuple(
    os.sep + p + os.sep for p in ("tensorflow", "keras", "jax", "jaxlib", "mpwatch", "numpy")
)


def _user_line(frames: list[tuple[str, int]]) -> str | None:
    """The last frame outside the frameworks (the user's line that made the op), as file:line."""
    for path, line in reversed(frames):
        if not any(p in path for p in _FRAMEWORK) and "site-packages" not in path:
            return f"{os.path.basename(path)}:{line}"
    return None


def _finite(v: Any) -> bool:
    a = np.asarray(v)
    return not np.issubdtype(a.dtype, np.floating) or bool(np.isfinite(a).all())


def _peak(values: list[Any]) -> float | None:
    peaks = [
        float(np.abs(a[np.isfinite(a)]).max())
        for a in (np.asarray(v) for v in values)
        if np.issubdtype(a.dtype, np.floating) and a.size and np.isfinite(a).any()
    ]
    return max(peaks) if peaks else None


def _found(op: str, line: str | None, ins: list[Any], dtype: Any, out: Any) -> dict[str, Any]:
    return {
        "op": op,
        "source": line,
        "dtype": str(np.dtype(dtype)) if dtype is not None else None,
        "input_max_abs": _peak(ins),
        "layer_output_finite": _finite(out),
    }


def _tensorflow(layer: Any, x: Any) -> dict[str, Any] | None:
    import tensorflow as tf

    x = tf.convert_to_tensor(x)
    wrapped = tf.compat.v1.wrap_function(lambda t: layer(t), [tf.TensorSpec(x.shape, x.dtype)])
    graph = wrapped.graph
    feed = graph.inputs[0]
    ops = [op for op in graph.get_operations() if op.outputs and op.type != "Placeholder"]
    fetch = [t for op in ops for t in op.outputs if t.dtype.is_floating]
    if not fetch:
        return None
    values = dict(zip((t.ref() for t in fetch), wrapped.prune([feed], fetch)(x)))
    values[feed.ref()] = x
    out = wrapped(x)
    for op in ops:
        outs = [values[t.ref()] for t in op.outputs if t.ref() in values]
        ins = [values[t.ref()] for t in op.inputs if t.ref() in values]
        if outs and not all(_finite(o) for o in outs) and all(_finite(i) for i in ins):
            frames = [(f.filename, f.lineno) for f in op.traceback or []]
            return _found(op.type, _user_line(frames), ins, outs[0].dtype.as_numpy_dtype, out)
    return None


def _jax(layer: Any, x: Any) -> dict[str, Any] | None:
    import jax
    from jax._src import core as jcore

    closed = jax.make_jaxpr(lambda t: layer(t))(x)
    jaxpr = closed.jaxpr
    made = [v for e in jaxpr.eqns for v in e.outvars if not isinstance(v, jcore.DropVar)]
    # every equation's outputs, evaluated by JAX's own interpreter (its primitives' bind rules)
    values = jcore.eval_jaxpr(jaxpr.replace(outvars=made), closed.consts, x)
    env: dict[Any, Any] = dict(zip(jaxpr.constvars, closed.consts))
    env[jaxpr.invars[0]] = x
    env.update(zip(made, values))

    def read(v: Any) -> Any:
        return v.val if isinstance(v, jcore.Literal) else env.get(v)

    for eqn in jaxpr.eqns:
        ins = [a for a in (read(v) for v in eqn.invars) if a is not None]
        outs = [a for a in (read(v) for v in eqn.outvars) if a is not None]
        if outs and not all(_finite(o) for o in outs) and all(_finite(i) for i in ins):
            tb = eqn.source_info.traceback
            frames = [(f.file_name, f.line_num) for f in tb.frames] if tb is not None else []
            name = eqn.primitive.name
            if name in ("pjit", "jit", "closed_call") and eqn.params.get("name"):
                name = str(eqn.params["name"])  # the jitted function's own name (jnp's)
            out = read(jaxpr.outvars[0])
            return _found(name, _user_line(frames), ins, np.asarray(outs[0]).dtype, out)
    return None


def first_overflow(layer: Any, x: Any) -> dict[str, Any] | None:
    """The first op of ``layer``'s call on ``x`` whose output is not finite while its floating
    inputs are (``op``, ``source``, ``dtype``, ``input_max_abs``, ``layer_output_finite``),
    or None where every op's output is finite."""
    from mpwatch.record.runtime import backend

    if backend.name() == backend.JAX:
        return _jax(layer, x)
    return _tensorflow(layer, x)


def scan(probe: Any, x: Any, layers_table: dict[str, Any]) -> list[dict[str, Any]]:
    """For the layers of the probe's layer table (``columns``/``data``) whose 16-bit output is
    at least :data:`SCANNED_ERROR` off float32 and not scanned before in this fit: the op that
    overflows inside each (:func:`first_overflow` on the layer's input from the batch ``x``),
    with the layer's name; ``[]`` for a subclassed model (no layer input to take)."""
    import keras
    from keras.src.models.functional import Functional

    model = probe.model
    if not isinstance(model, (keras.Sequential, Functional)):
        return []
    cols = list(layers_table.get("columns") or [])
    if "layer" not in cols or "output_rel_error" not in cols:
        return []
    i, j = cols.index("layer"), cols.index("output_rel_error")
    done = probe.__dict__.setdefault("_op_scanned", set())
    names = [
        str(r[i]) for r in layers_table.get("data") or []
        if isinstance(r[j], (int, float)) and r[j] >= SCANNED_ERROR and str(r[i]) not in done
    ][:MAX_LAYERS]  # fmt: skip
    out = []
    with _current_values(model):
        for name in names:
            done.add(name)
            layer = model.get_layer(name)
            if len(keras.tree.flatten(layer.input)) != 1:
                continue  # one input: the ops of a merge are the model's graph's
            sub = keras.Model(model.inputs, layer.input)
            got = first_overflow(layer, sub(x))
            if got is not None:
                out.append({"layer": name, **got})
    return out


def _current_values(model: Any) -> Any:
    """On JAX during ``fit`` (Keras keeps the variables' values in its training state, the
    variables themselves emptied), a scope reading that state; elsewhere nothing to do."""
    import contextlib

    from mpwatch.record.runtime import backend

    if backend.name() != backend.JAX:
        return contextlib.nullcontext()
    import keras

    from mpwatch.record.probe.probe_jax import model_values

    tv, ntv = model_values(model)
    mapping = list(zip(model.trainable_variables, tv))
    mapping += list(zip(model.non_trainable_variables, ntv))
    return keras.StatelessScope(state_mapping=mapping)
