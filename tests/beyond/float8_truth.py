"""The float8 truth for tests/beyond/test_float8.py, computed with Keras' own float8 layers.

For a model under a mixed policy and one batch: a float32 copy of the model (built under the
``float32`` policy, the same weights) runs the batch in training mode with every Dense and
EinsumDense leaf's ``call`` wrapped here, so each layer's input and the gradient of the loss
w.r.t. its output before the activation are known (a zero tensor added there, differentiated:
``tf.GradientTape`` / ``jax.grad``). Then, per layer: a fresh layer of the same class and config
(in the run's policy), given the weights, ``quantize("float8")``-ed by Keras, its three scales set
to what Keras' delayed scaling gives for this batch's amax alone
(``keras.quantizers.compute_float8_scale``), runs that input with its activation off; its output
and its gradients for that output gradient (TensorFlow: inside ``tf.function``, as Keras' float8
gradients need; JAX: ``jax.vjp`` over ``stateless_call``) against the float32 layer's give the
relative errors. Nothing here imports mpwatch.
"""

from __future__ import annotations

import keras
import numpy as np

BACKEND = keras.backend.backend()
FMAX = {"inputs": 448.0, "kernel": 448.0, "outputs_grad": 57344.0}


def _leaves(model):
    return [
        layer for layer in model._flatten_layers(include_self=False, recursive=True)
        if type(layer).__name__ in ("Dense", "EinsumDense")
    ]  # fmt: skip


def _np(t):
    return np.asarray(keras.ops.convert_to_numpy(keras.ops.cast(t, "float32")), np.float32)


def capture(model32, x, y):
    """[(input, output gradient before the activation)] of each Dense/EinsumDense leaf."""
    layers = _leaves(model32)
    loss_fn = keras.losses.SparseCategoricalCrossentropy()

    def wrap(eps, seen):
        for i, layer in enumerate(layers):
            orig = layer.call

            def call(inputs, *a, _i=i, _layer=layer, _orig=orig, **k):
                act, _layer.activation = _layer.activation, keras.activations.linear
                try:
                    z = _orig(inputs, *a, **k)
                finally:
                    _layer.activation = act
                z = z + eps[_i] if eps is not None else z
                seen[_i] = (inputs, z)
                return act(z)

            layer.call = call

    def unwrap():
        for layer in layers:
            del layer.call

    seen = {}
    wrap(None, seen)
    try:
        model32(x, training=True)
    finally:
        unwrap()
    shapes = [tuple(seen[i][1].shape) for i in range(len(layers))]
    if BACKEND == "tensorflow":
        import tensorflow as tf

        eps = [tf.zeros(s) for s in shapes]
        seen = {}
        with tf.GradientTape() as tape:
            tape.watch(eps)
            wrap(eps, seen)
            try:
                loss = loss_fn(y, model32(x, training=True))
            finally:
                unwrap()
        grads = tape.gradient(loss, eps)
        return [(_np(seen[i][0]), _np(g)) for i, g in enumerate(grads)]
    import jax
    import jax.numpy as jnp

    tv = [v.value for v in model32.trainable_variables]
    ntv = [v.value for v in model32.non_trainable_variables]

    def run(eps):
        seen = {}
        wrap(eps, seen)
        try:
            y_pred, _ = model32.stateless_call(tv, ntv, x, training=True)
        finally:
            unwrap()
        return loss_fn(y, y_pred), [seen[i][0] for i in range(len(layers))]

    eps = [jnp.zeros(s, jnp.float32) for s in shapes]
    (_, inputs), grads = jax.value_and_grad(run, has_aux=True)(eps)
    return [(_np(a), _np(g)) for a, g in zip(inputs, grads)]


def _scale(t, fmax):
    amax = keras.ops.max(keras.ops.abs(keras.ops.cast(t, "float32")))
    return keras.quantizers.compute_float8_scale(
        amax, keras.ops.convert_to_tensor(np.float32(1.0)), keras.ops.convert_to_tensor(fmax)
    )


def keras_float8_errors(layer_mixed, kernel, bias, x, g):
    """Keras' float8 copy of ``layer_mixed`` on input x with output gradient g: the relative
    errors of its output (before the activation), dx and dW against the float32 layer."""
    cfg = layer_mixed.get_config()
    cfg["activation"] = "linear"
    q = type(layer_mixed).from_config(cfg)
    q.build(x.shape)
    q.set_weights([kernel] + ([bias] if bias is not None else []))
    q.quantize("float8")
    cd = q.compute_dtype
    x_cd, w_cd, g_cd = (keras.ops.cast(t, cd) for t in (x, kernel, g))
    q.inputs_scale.assign(_scale(x_cd, FMAX["inputs"]))
    q.kernel_scale.assign(_scale(w_cd, FMAX["kernel"]))
    q.outputs_grad_scale.assign(_scale(g_cd, FMAX["outputs_grad"]))
    if BACKEND == "tensorflow":
        import tensorflow as tf

        @tf.function
        def vjp(x_t, g_t):
            with tf.GradientTape() as tape:
                tape.watch(x_t)
                z = q(x_t)
            dx, dw = tape.gradient(z, [x_t, q._kernel], output_gradients=tf.cast(g_t, z.dtype))
            return z, dx, dw

        z, dx, dw = (_np(t) for t in vjp(tf.constant(x), tf.constant(g)))
    else:
        import jax

        tv = [v.value for v in q.trainable_variables]
        ntv = [v.value for v in q.non_trainable_variables]
        k = [id(v) for v in q.trainable_variables].index(id(q._kernel))

        def f(x_, tv_):
            return q.stateless_call(tv_, ntv, x_)[0]

        z, back = jax.vjp(f, x, tv)
        dx, dtv = back(g.astype(z.dtype))
        z, dx, dw = _np(z), _np(dx), _np(dtv[k])
    eq = getattr(layer_mixed, "equation", None)
    if eq is None:  # Dense: rows of the input's last dimension
        eq, x, g = "ai,ij->aj", x.reshape(-1, x.shape[-1]), g.reshape(-1, g.shape[-1])
        dx, z = dx.reshape(x.shape), z.reshape(-1, z.shape[-1])
    lhs, out = eq.split("->")
    a, b = lhs.split(",")
    z32 = np.einsum(eq, x.astype(np.float64), kernel.astype(np.float64))
    if bias is not None:
        z32 = z32 + bias
    dx32 = np.einsum(f"{out},{b}->{a}", g.astype(np.float64), kernel.astype(np.float64))
    dw32 = np.einsum(f"{a},{out}->{b}", x.astype(np.float64), g.astype(np.float64))

    def rel(v, ref):
        return float(np.linalg.norm(v - ref) / np.linalg.norm(ref))

    def rows(v, ref):  # the mean of each row's (last axis) relative error
        v = np.asarray(v, np.float64).reshape(-1, ref.shape[-1])
        ref = ref.reshape(-1, ref.shape[-1])
        n = np.linalg.norm(ref, axis=1)
        return float(np.mean(np.linalg.norm(v - ref, axis=1)[n > 0] / n[n > 0]))

    return {"out_error_8": rows(z, z32), "dx_error_8": rows(dx, dx32), "dw_error_8": rel(dw, dw32)}


def float8_truth(model, build_float32, x, y):
    """{layer name: errors} of every Dense/EinsumDense leaf of ``model`` on batch (x, y)."""
    model32 = build_float32()
    model32.set_weights(model.get_weights())
    captured = capture(model32, x, y)
    out = {}
    for layer_mixed, layer32, (inputs, g) in zip(_leaves(model), _leaves(model32), captured):
        kernel = _np(layer32.kernel)
        bias = _np(layer32.bias) if getattr(layer32, "bias", None) is not None else None
        out[layer_mixed.name] = keras_float8_errors(layer_mixed, kernel, bias, inputs, g)
    return out
