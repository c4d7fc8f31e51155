"""What float8 readiness needs from a model, on both backends: each Dense/EinsumDense layer's
input and the gradient of the loss w.r.t. its output before the activation, in one
training-mode pass of the float32 reference on the probe's batch (:mod:`mpwatch.record.probe.float8`
does the arithmetic, in numpy).

Every eligible layer's ``call`` is wrapped (an instance attribute, removed afterwards): it runs
the layer with its activation off, notes the input, adds a zero tensor ``eps`` to the result and
applies the activation; the gradient of the loss w.r.t. ``eps`` is the output gradient Keras'
float8 layers quantize. TensorFlow: one pass in a ``tf.function`` under a ``GradientTape`` that
watches each such output where it is made (the state it writes restored); JAX:
``jax.value_and_grad`` over the ``eps`` inside a ``StatelessScope`` of the model's values (as the
probe's pass), in a ``jax.jit`` function of the values compiled once.

Example:
    >>> layers = eligible_layers(model)  # doctest: +SKIP
    >>> captured = capture(probe, layers, x, y, sw)  # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import numpy as np

from mpwatch.layers import sublayers, walk

#: the layer classes Keras trains in float8 (``quantize("float8")``); subclasses are skipped by
#: ``model.quantize``, so by this too
FLOAT8_CLASSES = ("Dense", "EinsumDense")


def eligible_layers(model: Any) -> list[tuple[Any, str]]:
    """(layer, path) of every built Dense/EinsumDense leaf of Keras' own (not a subclass), not
    already quantized, in the layer table's order."""
    out = []
    for layer, path, _ in walk(model):
        cls = type(layer)
        if cls.__name__ not in FLOAT8_CLASSES or not cls.__module__.startswith("keras."):
            continue
        if sublayers(layer) or not layer.built or getattr(layer, "quantization_mode", None):
            continue
        out.append((layer, path))
    return out


def equation(layer: Any) -> str:
    """The contraction the layer computes, as an einsum equation."""
    return getattr(layer, "equation", None) or "...i,ij->...j"


def values_of(model: Any) -> dict[int, Any]:
    """id(variable) -> its current value: on JAX during ``fit`` the values live in Keras' state
    (the variables themselves are purged), read as the probe reads them."""
    import keras

    if keras.backend.backend() != "jax":
        return {}
    from mpwatch.record.probe.probe_jax import model_values

    tv, ntv = model_values(model)
    pairs = zip([*model.trainable_variables, *model.non_trainable_variables], [*tv, *ntv])
    return {id(v): value for v, value in pairs}


def weights(layer: Any, values: dict[int, Any]) -> tuple[np.ndarray, np.ndarray | None]:
    """(kernel, bias or None) as float32 numpy arrays (``values``: :func:`values_of`)."""
    kernel, bias = layer.kernel, getattr(layer, "bias", None)

    def arr(v: Any) -> np.ndarray:
        return _np(values.get(id(v), v))

    return arr(kernel), (None if bias is None else arr(bias))


@contextlib.contextmanager
def _wrapped(layers: list[Any], eps: list[Any] | None, seen: dict[int, Any]) -> Iterator[None]:
    import keras

    from mpwatch.record.probe.twin import SWITCHING

    linear = keras.activations.get("linear")
    with SWITCHING:  # the layers' calls switched: no other thread traces them meanwhile
        for i, layer in enumerate(layers):
            orig = layer.call

            def call(inputs: Any, *args: Any, __i: int = i, __layer: Any = layer,
                     __orig: Any = orig, **kwargs: Any) -> Any:  # fmt: skip
                act = __layer.activation
                __layer.activation = linear
                try:
                    z = __orig(inputs, *args, **kwargs)
                finally:
                    __layer.activation = act
                if eps is not None:
                    z = z + eps[__i]
                seen[__i] = (inputs, z)
                return act(z) if act is not None else z

            object.__setattr__(layer, "call", call)
        try:
            yield
        finally:
            for layer in layers:
                if "call" in layer.__dict__:
                    object.__delattr__(layer, "call")


def capture(probe: Any, layers: list[Any], x: Any, y: Any, sw: Any) -> list[tuple[Any, Any]]:
    """(input, output gradient) of each layer, numpy float32, from one training-mode pass of the
    probe's model as the current policies are (call it inside the float32 view), random layers
    off as the probe has them. The gradient is of the unscaled loss."""
    import keras

    if keras.backend.backend() == "jax":
        return _capture_jax(probe, layers, x, y, sw)
    return _capture_tf(probe, layers, x, y, sw)


def _np(t: Any) -> np.ndarray:
    import keras

    return np.asarray(keras.ops.convert_to_numpy(keras.ops.cast(t, "float32")), np.float32)


def _per_layers(probe: Any, layers: list[Any], make: Any) -> Any:
    """The capture's compiled function for this layer set, kept on the probe (built by
    ``make()`` once per probe and layer set; its trace then serves every later probe)."""
    key = tuple(id(layer) for layer in layers)
    cached = getattr(probe, "_float8_fn", None)
    if cached is None or cached[0] != key:
        cached = (key, make())
        probe._float8_fn = cached
    return cached[1]


def _capture_tf(probe: Any, layers: list[Any], x: Any, y: Any, sw: Any) -> list[tuple[Any, Any]]:
    """One pass in a ``tf.function`` (traced once per probe and layer set, like the probe's):
    the tape watches each layer's pre-activation output where it is made. The state the pass
    writes (BatchNormalization's moving statistics, seed states) is restored afterwards."""
    import tensorflow as tf

    from mpwatch.record.probe.twin import backend_value, state_variables

    def make() -> Any:
        def run(x: Any, y: Any, sw: Any) -> tuple[list[Any], list[Any]]:
            seen: dict[int, Any] = {}
            with tf.GradientTape() as tape:

                class Watch(list):  # eps[i] is 0: adding it makes z the tensor the tape watches
                    def __getitem__(self, i: int) -> Any:
                        return _Watched(tape)

                with _wrapped(layers, Watch(), seen):
                    loss = probe._loss(x, y, probe.model(x, training=True), sw)
            zs = [seen[i][1] for i in range(len(layers))]
            grads = tape.gradient(loss, zs)
            grads = [tf.zeros_like(z) if g is None else g for z, g in zip(zs, grads)]
            return [seen[i][0] for i in range(len(layers))], grads

        return tf.function(run, reduce_retracing=True, autograph=False)

    fn = _per_layers(probe, layers, make)
    state = state_variables(probe.model)
    saved = [tf.identity(backend_value(v)) for v in state]
    try:
        inputs, grads = fn(x, y, sw)
    finally:
        for v, value in zip(state, saved):
            backend_value(v).assign(value)
    return [(_np(a), _np(g)) for a, g in zip(inputs, grads)]


class _Watched:
    """``z + _Watched(tape)`` is ``z`` itself, watched by ``tape`` (TensorFlow)."""

    def __init__(self, tape: Any) -> None:
        self.tape = tape

    def __radd__(self, z: Any) -> Any:
        import tensorflow as tf

        z = tf.identity(z)
        self.tape.watch(z)
        return z


def _capture_jax(probe: Any, layers: list[Any], x: Any, y: Any, sw: Any) -> list[tuple[Any, Any]]:
    """One pass in a ``jax.jit`` function of the values (traced once per probe, layer set and
    batch shape, like the probe's, and compiled once per machine: :mod:`.program_cache`; run op by
    op it took 11 s for MobileNetV2 on 2 CPU cores)."""
    import jax

    from mpwatch.record.probe.probe_jax import model_values
    from mpwatch.record.runtime.program_cache import CachedJit

    fn = _per_layers(
        probe,
        layers,
        lambda: CachedJit(
            lambda tv, ntv, x, y, sw: _pass_jax(probe, layers, tv, ntv, x, y, sw), "float8"
        ),
    )
    tv, ntv = model_values(probe.model)
    inputs, grads = jax.device_get(fn(tv, ntv, x, y, sw))
    return [(_np(a), _np(g)) for a, g in zip(inputs, grads)]


def _pass_jax(
    probe: Any, layers: list[Any], tv: list, ntv: list, x: Any, y: Any, sw: Any
) -> tuple[list[Any], list[Any]]:
    """(each layer's input, the gradient of the loss w.r.t. its pre-activation output), traced
    inside the capture's ``jax.jit``."""
    import jax
    import jax.numpy as jnp

    from mpwatch.record.probe.probe_jax import _scope

    def run(eps: list[Any] | None) -> tuple[Any, list[Any]]:
        seen: dict[int, Any] = {}
        with _scope(probe, tv, ntv), _wrapped(layers, eps, seen):
            loss = probe._loss(x, y, probe.model(x, training=True), sw)
        return loss, [seen[i][0] for i in range(len(layers))]

    def shapes(eps: None) -> list[Any]:
        seen: dict[int, Any] = {}
        with _scope(probe, tv, ntv), _wrapped(layers, None, seen):
            probe.model(x, training=True)
        return [seen[i][1] for i in range(len(layers))]

    eps = [jnp.zeros(s.shape, s.dtype) for s in jax.eval_shape(shapes, None)]
    (_, inputs), grads = jax.value_and_grad(run, has_aux=True)(eps)
    return inputs, grads


def readiness(probe: Any, x: Any, y: Any, sw: Any, scale: float) -> list[list[Any]]:
    """The probe record's ``float8`` rows (``contract.PROBE_FLOAT8_COLUMNS``): each eligible
    layer's float8 and 16-bit errors on this batch
    (:func:`mpwatch.record.probe.float8.layer_errors`) and its verdict; [] for a model without
    one."""
    from mpwatch.record.probe import float8, float8_blocks
    from mpwatch.record.probe.twin import random_layers_off

    found = eligible_layers(probe.model)
    if not found:
        return []
    layers = [layer for layer, _ in found]
    cd = "bfloat16" if probe.mode == "bfloat16" else "float16"
    view = probe.view if probe.mode != "preflight" else None
    with (
        view if view is not None else contextlib.nullcontext(),
        random_layers_off(probe.random_off),
    ):
        captured = capture(probe, layers, x, y, sw)
    rows = []
    values = values_of(probe.model)
    for (layer, path), (inputs, grad) in zip(found, captured):
        kernel, bias = weights(layer, values)
        # Keras quantizes and multiplies a layer in its own compute dtype: a float32 head
        # (dtype="float32") computes float8 in float32, and has no 16-bit error of its own
        own = "float32" if str(getattr(layer, "compute_dtype", "")) == "float32" else cd
        e = float8_blocks.errors(equation(layer), inputs, kernel, bias, grad, own, scale)
        del kernel, bias  # one layer's kernel copy at a time (the next one is made before the
        # name is rebound: two wide kernels at once were 128 MiB of a wide MLP's probe)
        ready, why = float8.verdict(e, own)
        rows.append(
            [path, type(layer).__name__, getattr(layer, "path", None), e["out_error_16"],
             e["out_error_8"], e["dx_error_16"], e["dx_error_8"], e["dw_error_16"],
             e["dw_error_8"], e["x_flush"], e["w_flush"], e["g_flush"], ready, why or None]
        )  # fmt: skip
    return rows
