"""mpwatch on real models: the six scenarios of issue 17, small enough for a CPU.

Each scenario is a model nobody on the mpwatch team wrote, built as its users build it, trained for
a few steps on synthetic data made here with a fixed seed (no downloads, ``weights=None``):

- ``mobilenet_v2``: ``keras.applications.MobileNetV2`` at 32x32 (the smallest input it takes), 10
  classes, ``mixed_float16``. 52 BatchNormalization layers: the train step runs them on batch
  statistics, inference on moving statistics.
- ``resnet50``: ``keras.applications.ResNet50`` at 32x32, 10 classes, ``mixed_float16``; its
  ``predictions`` Dense computes the softmax in float16.
- ``transformer``: keras.io's "Text classification with Transformer" as written there: a float32
  ``Input(shape=(maxlen,))`` into custom ``TokenAndPositionEmbedding`` and ``TransformerBlock``
  layers whose ``__init__`` take no ``**kwargs``; ``mixed_float16``. The layer autocasts the float32
  token ids to float16, which rounds every id above 2048 to a multiple of 2, 4, 8 or 16.
- ``bfloat16``: a small CNN under ``mixed_bfloat16`` (no loss scale).
- ``logsumexp``: a custom ``LogSumExpPool`` layer computing ``log(sum(exp(x)))`` without subtracting
  the maximum, fed activations above 11.1 (``exp(11.1) > 65504``): it overflows in float16, never
  in float32; ``mixed_float16``.
- ``sigmoid_mlp``: 22 ``Dense(64, activation="sigmoid")`` layers; each shrinks gradients about 4x,
  so the first layers' gradients underflow float16 at Keras' initial loss scale 2**15;
  ``mixed_float16``, float32 softmax output.

Run them and print mpwatch's diagnosis of each (one run directory per scenario under ``--logdir``)::

    python examples/real_models.py [NAME ...] [--logdir logs/real_models] [--steps 30]
        [--overwrite] [--measure]

``--measure`` also prints, per scenario, what the phenomenon really is, computed here independently
of mpwatch: the train step's own gradients (training mode, at the optimizer's loss scale) against a
float32 reference with the same weights (:func:`train_mode_gradients`,
:func:`float32_reference_gradients`), and the token ids float16 changes.

For tests (``tests/repo_scripts.load_script("examples/real_models.py")``):

- ``SCENARIOS[name]()`` / ``build_<name>(seed=0)`` -> ``(model, x, y)``: the compiled model under
  the *current* global policy, and its data; :func:`build` sets the scenario's policy for the call;
  ``POLICIES[name]`` is that policy.
- :func:`train` (``name, logdir, steps=30, ...``) -> the trained model.
- :func:`train_mode_gradients`, :func:`float32_reference_gradients`, :func:`float32_twin`,
  :func:`underflow_fraction`, :func:`relative_error`, :func:`loss_scale`, :func:`rounded_ids`,
  :func:`measure`.

Dropout: the gradient helpers switch every Dropout layer off (rate 0) during their call, in the
mixed model and in the reference alike (:func:`dropout_off`), so the two passes compute the same
function; BatchNormalization runs on batch statistics (training mode) and its moving statistics,
like every non-trainable variable, are restored afterwards: the helpers never change the model.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402

IMAGE_SHAPE = (32, 32, 3)
VOCAB_SIZE = 20000
MAXLEN = 200
#: float16 rounds ids in [19992, 20000) up to 20000, out of the embedding's range; TensorFlow's
#: gather raises on a CPU for that (and returns zeros on a GPU), so the synthetic ids stay below.
MAX_TOKEN_ID = 19992
SIGMOID_DEPTH = 22


# --- synthetic data ------------------------------------------------------------------------------
def synthetic_images(n: int, seed: int = 0, shape: tuple[int, int, int] = IMAGE_SHAPE) -> tuple:
    """Images in [0, 1] (float32) whose class (of 10) is a bright band: rows by class, channel
    ``class % channels``."""
    rng = np.random.default_rng(seed)
    h, w, c = shape
    y = rng.integers(0, 10, size=n)
    x = rng.random((n, h, w, c), dtype=np.float32) * 0.3
    band = max(1, h // 10)
    for k in range(10):
        rows = slice(k * band, (k + 1) * band)
        x[y == k, rows, 2 : w - 2, k % c] += 0.7
    return x.clip(0, 1), y.astype("int32")


def synthetic_tokens(n: int, seed: int = 0, maxlen: int = MAXLEN) -> tuple:
    """Token ids uniform in [0, MAX_TOKEN_ID) as float32 (what keras.io's float32 Input gets) and a
    binary label: whether the sequence has more ids below half the vocabulary than above."""
    rng = np.random.default_rng(seed)
    x = rng.integers(0, MAX_TOKEN_ID, size=(n, maxlen))
    y = ((x < VOCAB_SIZE // 2).mean(axis=1) > 0.5).astype("int32")
    return x.astype("float32"), y


def synthetic_vectors(n: int, dim: int, seed: int = 0, scale: float = 1.0) -> tuple:
    """Gaussian vectors times ``scale`` (float32); the class (of 10) is the argmax of the first 10
    coordinates."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, dim)).astype("float32")
    y = np.argmax(x[:, :10], axis=1).astype("int32")
    return x * np.float32(scale), y


def scenario_data(name: str, seed: int = 0, n: int | None = None, **kwargs: Any) -> tuple:
    """``(x, y)`` of scenario ``name`` (what its builder returns), without building the model."""
    if name in ("mobilenet_v2", "bfloat16"):
        return synthetic_images(n or 256, seed)
    if name == "resnet50":
        return synthetic_images(n or 128, seed)
    if name == "transformer":
        return synthetic_tokens(n or 256, seed, **kwargs)
    if name == "logsumexp":  # x10: the projection's outputs reach 15-40
        return synthetic_vectors(n or 256, 32, seed, scale=10.0)
    if name == "sigmoid_mlp":
        return synthetic_vectors(n or 256, 32, seed)
    raise ValueError(f"unknown scenario {name!r}")


# --- the scenarios -------------------------------------------------------------------------------
def _seed(seed: int) -> None:
    import keras

    keras.utils.set_random_seed(seed)


def _compile(model: Any, lr: float = 1e-3) -> Any:
    import keras

    model.compile(
        optimizer=keras.optimizers.Adam(lr),
        loss="sparse_categorical_crossentropy",
        metrics=["accuracy"],
    )
    return model


def build_mobilenet_v2(seed: int = 0, n: int | None = None) -> tuple:
    """``keras.applications.MobileNetV2`` at 32x32x3, 10 classes, its own float16 softmax."""
    import keras

    _seed(seed)
    model = keras.applications.MobileNetV2(input_shape=IMAGE_SHAPE, weights=None, classes=10)
    x, y = scenario_data("mobilenet_v2", seed, n)
    return _compile(model), x, y


def build_resnet50(seed: int = 0, n: int | None = None) -> tuple:
    """``keras.applications.ResNet50`` at 32x32x3, 10 classes; ``predictions`` is a Dense with a
    softmax, computing in float16 under ``mixed_float16``."""
    import keras

    _seed(seed)
    model = keras.applications.ResNet50(input_shape=IMAGE_SHAPE, weights=None, classes=10)
    x, y = scenario_data("resnet50", seed, n)
    return _compile(model), x, y


def _transformer_layers() -> tuple[type, type]:
    """keras.io's two custom layers, as written there (no ``**kwargs``, no ``get_config``)."""
    import keras
    from keras import layers, ops

    class TransformerBlock(layers.Layer):
        def __init__(self, embed_dim, num_heads, ff_dim, rate=0.1):
            super().__init__()
            self.att = layers.MultiHeadAttention(num_heads=num_heads, key_dim=embed_dim)
            self.ffn = keras.Sequential(
                [layers.Dense(ff_dim, activation="relu"), layers.Dense(embed_dim)]
            )
            self.layernorm1 = layers.LayerNormalization(epsilon=1e-6)
            self.layernorm2 = layers.LayerNormalization(epsilon=1e-6)
            self.dropout1 = layers.Dropout(rate)
            self.dropout2 = layers.Dropout(rate)

        def call(self, inputs):
            attn_output = self.att(inputs, inputs)
            attn_output = self.dropout1(attn_output)
            out1 = self.layernorm1(inputs + attn_output)
            ffn_output = self.ffn(out1)
            ffn_output = self.dropout2(ffn_output)
            return self.layernorm2(out1 + ffn_output)

    class TokenAndPositionEmbedding(layers.Layer):
        def __init__(self, maxlen, vocab_size, embed_dim):
            super().__init__()
            self.token_emb = layers.Embedding(input_dim=vocab_size, output_dim=embed_dim)
            self.pos_emb = layers.Embedding(input_dim=maxlen, output_dim=embed_dim)

        def call(self, x):
            maxlen = ops.shape(x)[-1]
            positions = ops.arange(start=0, stop=maxlen, step=1)
            positions = self.pos_emb(positions)
            x = self.token_emb(x)
            return x + positions

    return TransformerBlock, TokenAndPositionEmbedding


TransformerBlock, TokenAndPositionEmbedding = None, None  # set on first build (imports keras)


def build_transformer(seed: int = 0, n: int | None = None, maxlen: int = MAXLEN) -> tuple:
    """keras.io "Text classification with Transformer": vocab 20000, embed 32, 2 heads, ff 32; the
    float32 ``Input`` as there (the token ids reach the embedding layer as float16)."""
    global TransformerBlock, TokenAndPositionEmbedding
    import keras
    from keras import layers

    if TransformerBlock is None:
        TransformerBlock, TokenAndPositionEmbedding = _transformer_layers()
    _seed(seed)
    embed_dim, num_heads, ff_dim = 32, 2, 32
    inputs = layers.Input(shape=(maxlen,))
    embedding_layer = TokenAndPositionEmbedding(maxlen, VOCAB_SIZE, embed_dim)
    h = embedding_layer(inputs)
    transformer_block = TransformerBlock(embed_dim, num_heads, ff_dim)
    h = transformer_block(h)
    h = layers.GlobalAveragePooling1D()(h)
    h = layers.Dropout(0.1)(h)
    h = layers.Dense(20, activation="relu")(h)
    h = layers.Dropout(0.1)(h)
    outputs = layers.Dense(2, activation="softmax")(h)
    model = keras.Model(inputs=inputs, outputs=outputs, name="text_transformer")
    x, y = scenario_data("transformer", seed, n, maxlen=maxlen)
    return _compile(model), x, y


def build_bfloat16(seed: int = 0, n: int | None = None) -> tuple:
    """A small CNN (Conv 16, Conv 32, pool, Dense 64, float32 softmax) for ``mixed_bfloat16``."""
    import keras
    from keras import layers

    _seed(seed)
    model = keras.Sequential(
        [
            keras.Input(IMAGE_SHAPE),
            layers.Conv2D(16, 3, activation="relu"),
            layers.MaxPooling2D(),
            layers.Conv2D(32, 3, activation="relu"),
            layers.GlobalAveragePooling2D(),
            layers.Dense(64, activation="relu"),
            layers.Dense(10, activation="softmax", dtype="float32"),
        ],
        name="bf16_cnn",
    )
    x, y = scenario_data("bfloat16", seed, n)
    return _compile(model), x, y


def _logsumexp_layer() -> type:
    import keras
    from keras import ops

    class LogSumExpPool(keras.layers.Layer):
        """``log(sum(exp(x)))`` over the last axis, naively: no maximum subtracted first, so
        ``exp`` overflows float16 (above 65504) once an input exceeds about 11.09."""

        def __init__(self, **kwargs):
            super().__init__(**kwargs)

        def call(self, x):
            return ops.log(ops.sum(ops.exp(x), axis=-1))

        def compute_output_shape(self, input_shape):
            return tuple(input_shape[:-1])

    return LogSumExpPool


LogSumExpPool = None  # set on first build (imports keras)


def build_logsumexp(seed: int = 0, n: int | None = None) -> tuple:
    """Dense(128) -> Reshape(16, 8) -> LogSumExpPool -> Dense(32) -> Dense(16) -> float32 softmax,
    on inputs scaled by 10 so that the Dense's outputs reach 15-40: float16's ``exp`` overflows,
    float32's (up to 88) does not."""
    global LogSumExpPool
    import keras
    from keras import layers

    if LogSumExpPool is None:
        LogSumExpPool = _logsumexp_layer()
    _seed(seed)
    model = keras.Sequential(
        [
            keras.Input((32,)),
            layers.Dense(128, name="proj"),
            layers.Reshape((16, 8)),
            LogSumExpPool(name="logsumexp_pool"),
            layers.Dense(32, activation="relu"),
            layers.Dense(16, activation="relu"),
            layers.Dense(10, activation="softmax", dtype="float32", name="output"),
        ],
        name="logsumexp_net",
    )
    x, y = scenario_data("logsumexp", seed, n)
    return _compile(model), x, y


def build_sigmoid_mlp(seed: int = 0, n: int | None = None, depth: int = SIGMOID_DEPTH) -> tuple:
    """``depth`` Dense(64, sigmoid) layers and a float32 softmax output."""
    import keras
    from keras import layers

    _seed(seed)
    model = keras.Sequential(
        [keras.Input((32,))]
        + [layers.Dense(64, activation="sigmoid") for _ in range(depth)]
        + [layers.Dense(10, activation="softmax", dtype="float32", name="output")],
        name="sigmoid_mlp",
    )
    x, y = scenario_data("sigmoid_mlp", seed, n)
    return _compile(model), x, y


SCENARIOS: dict[str, Callable[..., tuple]] = {
    "mobilenet_v2": build_mobilenet_v2,
    "resnet50": build_resnet50,
    "transformer": build_transformer,
    "bfloat16": build_bfloat16,
    "logsumexp": build_logsumexp,
    "sigmoid_mlp": build_sigmoid_mlp,
}
#: the global dtype policy each scenario trains under
POLICIES = {name: "mixed_float16" for name in SCENARIOS} | {"bfloat16": "mixed_bfloat16"}
#: the batch size each scenario trains with by default (what fits a 2-core CPU in seconds)
BATCH_SIZES = {
    "mobilenet_v2": 32,
    "resnet50": 16,
    "transformer": 32,
    "bfloat16": 32,
    "logsumexp": 32,
    "sigmoid_mlp": 32,
}


@contextlib.contextmanager
def policy_scope(policy: str) -> Iterator[None]:
    """Keras' global dtype policy set to ``policy`` inside, restored afterwards (also on error)."""
    import keras

    old = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy(policy)
    try:
        yield
    finally:
        keras.mixed_precision.set_global_policy(old)


def build(name: str, policy: str | None = None, **kwargs: Any) -> tuple:
    """``SCENARIOS[name](**kwargs)`` under ``policy`` (default: the scenario's, ``POLICIES``)."""
    with policy_scope(policy or POLICIES[name]):
        return SCENARIOS[name](**kwargs)


def _check_name(name: str) -> None:
    if name not in SCENARIOS:
        raise ValueError(f"unknown scenario {name!r}; one of {', '.join(SCENARIOS)}")


def train(
    name: str,
    logdir: str | os.PathLike[str],
    steps: int = 30,
    batch_size: int | None = None,
    *,
    policy: str | None = None,
    seed: int = 0,
    verbose: int = 0,
    model: Any = None,
    **monitor_kwargs: Any,
) -> Any:
    """Build scenario ``name`` under its policy (or ``policy``: ``"float32"`` gives the baseline
    run of the same model), fit it for exactly ``steps`` batches (one epoch over the data repeated
    as needed, unshuffled) with ``mpwatch.MixedPrecisionMonitor(log_dir=logdir, **monitor_kwargs)``
    and return the model. The monitor's defaults here: ``log_every=10`` and ``probe_every=10`` (so
    a 30-step fit records 3 probes and interval scalars); anything in ``monitor_kwargs`` wins.
    The global policy is float32 again afterwards, also when training fails. ``model``: train
    this one instead of building it (a model the diagnosis' fix was applied to)."""
    import keras

    import mpwatch

    _check_name(name)
    bs = batch_size or BATCH_SIZES[name]
    kwargs = {"log_every": 10, "probe_every": 10} | monitor_kwargs
    keras.mixed_precision.set_global_policy(policy or POLICIES[name])
    try:
        built, x, y = SCENARIOS[name](seed=seed)
        model = built if model is None else model
        idx = np.arange(steps * bs) % len(x)
        keras.utils.set_random_seed(seed)
        model.fit(
            x[idx],
            y[idx],
            batch_size=bs,
            epochs=1,
            shuffle=False,
            verbose=verbose,
            callbacks=[mpwatch.MixedPrecisionMonitor(log_dir=os.fspath(logdir), **kwargs)],
        )
    finally:
        keras.mixed_precision.set_global_policy("float32")
    return model


# --- independent measurements (plain TensorFlow, no mpwatch) -------------------------------------
@contextlib.contextmanager
def dropout_off(*models: Any) -> Iterator[None]:
    """Every ``keras.layers.Dropout`` in ``models`` (nested ones too) at rate 0 inside."""
    import keras

    saved = []
    for m in models:
        for layer in m._flatten_layers(include_self=False, recursive=True):
            if isinstance(layer, keras.layers.Dropout):
                saved.append((layer, layer.rate))
                layer.rate = 0.0
    try:
        yield
    finally:
        for layer, rate in saved:
            layer.rate = rate


@contextlib.contextmanager
def state_kept(model: Any) -> Iterator[None]:
    """The model's non-trainable variables (BatchNormalization's moving statistics, random seed
    states) restored on exit."""
    values = [v.numpy() for v in model.non_trainable_variables]
    try:
        yield
    finally:
        for v, val in zip(model.non_trainable_variables, values):
            v.assign(val)


def loss_scale(model: Any) -> float:
    """The LossScaleOptimizer's current ``dynamic_scale`` (its ``initial_scale`` before the first
    step), 1.0 without one."""
    import keras

    opt = getattr(model, "optimizer", None)
    if not isinstance(opt, keras.optimizers.LossScaleOptimizer):
        return 1.0
    if getattr(opt, "built", False) and hasattr(opt, "dynamic_scale"):
        return float(np.asarray(opt.dynamic_scale))
    return float(opt.initial_scale)  # not built yet: the first step's scale


def _compute_loss(model: Any, x: Any, y: Any, y_pred: Any) -> Any:
    try:
        return model.compute_loss(x=x, y=y, y_pred=y_pred, training=True)
    except Exception:  # noqa: BLE001  (not compiled: the loss function alone)
        return model.loss(y, y_pred)


def _train_mode(model: Any, x: Any, y: Any, scale: float) -> tuple[list[np.ndarray], float]:
    import tensorflow as tf

    with dropout_off(model), state_kept(model):
        with tf.GradientTape() as tape:
            y_pred = model(x, training=True)
            loss = tf.cast(_compute_loss(model, x, y, y_pred), tf.float32)
            scaled = loss * tf.constant(scale, tf.float32)
        grads = tape.gradient(scaled, model.trainable_variables)
    out = [
        np.zeros(tuple(v.shape), np.float32)
        if g is None
        else np.asarray(tf.cast(tf.convert_to_tensor(g), tf.float32))  # IndexedSlices too
        for g, v in zip(grads, model.trainable_variables)
    ]
    return out, float(loss)


def train_mode_gradients(
    model: Any, x: Any, y: Any, scale: float | None = None
) -> tuple[list[np.ndarray], float]:
    """The gradients Keras' train step gets, computed here in plain TensorFlow: ``model(x,
    training=True)``, ``model.compute_loss(...)``, ``tape.gradient(loss * scale,
    model.trainable_variables)`` (scale: default the optimizer's current one).

    Returns ``(gradients, loss)``: the *scaled* gradients (as the optimizer receives them before
    unscaling; zeros where float16 underflowed), one float32 array per trainable variable, in
    ``model.trainable_variables`` order, and the unscaled float32 loss. Dropout is off, and the
    model's state (BatchNormalization's moving statistics) is unchanged afterwards."""
    return _train_mode(model, x, y, loss_scale(model) if scale is None else float(scale))


def _is_16bit_policy(policy: Any) -> bool:
    name = getattr(policy, "name", policy)
    if isinstance(policy, dict):
        name = (policy.get("config") or {}).get("name")
    return isinstance(name, str) and ("float16" in name)  # mixed_/b float16 variants


def _clone_float32(model: Any) -> Any:
    import keras

    def clone_layer(layer: Any) -> Any:
        cfg = layer.get_config()
        if _is_16bit_policy(layer.dtype_policy):
            cfg["dtype"] = "float32"
        return layer.__class__.from_config(cfg)

    with policy_scope("float32"):
        return keras.models.clone_model(model, clone_function=clone_layer)


def scenario_of(model: Any) -> str | None:
    """The scenario whose builder makes a model of this name, else None."""
    name = model.name
    if name.startswith("mobilenetv2"):
        return "mobilenet_v2"
    return {
        "resnet50": "resnet50",
        "text_transformer": "transformer",
        "bf16_cnn": "bfloat16",
        "logsumexp_net": "logsumexp",
        "sigmoid_mlp": "sigmoid_mlp",
    }.get(name)


def float32_twin(model: Any, scenario: str | None = None) -> Any:
    """A float32 copy of ``model`` with its weights (compiled with its loss).

    ``keras.models.clone_model`` with every 16-bit layer policy replaced by float32; where that
    fails (keras.io's custom layers take no ``**kwargs``, so Keras cannot rebuild them from their
    config), the scenario's builder is called again under the float32 policy and the weights copied
    with ``set_weights``. ``scenario`` names it (default: :func:`scenario_of` the model)."""
    shapes = [tuple(w.shape) for w in model.weights]
    twin = None
    try:
        twin = _clone_float32(model)
        if [tuple(w.shape) for w in twin.weights] != shapes:
            twin = None
    except Exception:  # noqa: BLE001
        twin = None
    if twin is None:
        name = scenario or scenario_of(model)
        if name is None:
            raise ValueError(
                f"no float32 twin of {model.name!r}: clone_model failed; name the scenario"
            )
        twin = build(name, "float32")[0]
        if [tuple(w.shape) for w in twin.weights] != shapes:
            raise ValueError(f"the float32 {name!r} has other weights than {model.name!r}")
    bad = [
        ly.name
        for ly in twin._flatten_layers(include_self=False, recursive=True)
        if ly.compute_dtype in ("float16", "bfloat16")
    ]
    if bad:
        raise ValueError(f"float32 twin of {model.name!r} still has 16-bit layers: {bad}")
    twin.set_weights(model.get_weights())
    twin.compile(loss=model.loss)
    return twin


def float32_reference_gradients(
    model: Any, x: Any, y: Any, scenario: str | None = None, twin: Any = None
) -> tuple[list[np.ndarray], float]:
    """The float32 reference of :func:`train_mode_gradients`: the same weights in a float32 twin
    (:func:`float32_twin`, or ``twin`` when given: its weights are refreshed from ``model``),
    training mode, Dropout off, unscaled. Returns ``(gradients, loss)`` in
    ``model.trainable_variables`` order."""
    if twin is None:
        twin = float32_twin(model, scenario)
    else:
        twin.set_weights(model.get_weights())
    return _train_mode(twin, x, y, 1.0)


def underflow_fraction(mixed: list[np.ndarray], reference: list[np.ndarray]) -> float:
    """Among elements nonzero in the reference, the share that are exactly zero in the mixed
    gradients (element-weighted over all arrays given); NaN when the reference has none."""
    nonzero = lost = 0
    for gm, gr in zip(mixed, reference):
        ref_nz = gr != 0
        nonzero += int(ref_nz.sum())
        lost += int((ref_nz & (gm == 0)).sum())
    return lost / nonzero if nonzero else math.nan


def relative_error(mixed: np.ndarray, reference: np.ndarray, scale: float = 1.0) -> float:
    """``||mixed / scale - reference|| / ||reference||`` (L2 over the array)."""
    ref = np.asarray(reference, np.float64)
    denom = np.linalg.norm(ref)
    diff = np.linalg.norm(np.asarray(mixed, np.float64) / scale - ref)
    return float(diff / denom) if denom else math.nan


def rounded_ids(x: np.ndarray, dtype: str = "float16") -> dict[str, Any]:
    """What casting float32 token ids to ``dtype`` does: how many ids (distinct values and
    elements) change, the largest id after rounding, and examples."""
    ids = np.asarray(x, np.float32)
    cast = ids.astype(dtype).astype(np.float32)
    changed = cast != ids
    distinct = np.unique(ids[changed])
    return {
        "elements": int(ids.size),
        "changed_elements": int(changed.sum()),
        "distinct_ids": int(np.unique(ids).size),
        "changed_distinct_ids": int(distinct.size),
        "max_after": float(cast.max()) if ids.size else math.nan,
        "examples": {
            int(v): int(np.float32(v).astype(dtype))
            for v in distinct[:: max(1, distinct.size // 4)][:4]
        },
    }


def _layer_of_variable(model: Any) -> list[str]:
    owner: dict[int, str] = {}
    for layer in model.layers:
        for v in layer.trainable_variables:
            owner.setdefault(id(v), layer.name)
    return [owner.get(id(v), v.path) for v in model.trainable_variables]


def measure(name: str, model: Any, x: np.ndarray, y: np.ndarray, batch: int | None = None) -> dict:
    """The scenario's phenomenon, measured independently of mpwatch on the first batch: the train
    step's gradients at the optimizer's current scale and at 2**15 against the float32 reference
    (underflow fraction, non-finite count, loss of both), per-layer underflow (top 5), the first
    layer's gradient relative error, and for the transformer the ids float16 rounds."""
    bs = batch or BATCH_SIZES.get(name, 32)
    xb, yb = x[:bs], y[:bs]
    twin = float32_twin(model, name)
    ref, ref_loss = float32_reference_gradients(model, xb, yb, twin=twin)
    out: dict[str, Any] = {"reference_loss": ref_loss}
    layer_of = _layer_of_variable(model)
    out["reference_nonfinite"] = int(sum((~np.isfinite(a)).sum() for a in ref))
    scales = {"current": loss_scale(model)}
    if POLICIES.get(name, "mixed_float16") == "mixed_float16":
        scales["2**15"] = 2.0**15
    for label, s in scales.items():
        g, loss = train_mode_gradients(model, xb, yb, s)
        nonfinite = int(sum((~np.isfinite(a)).sum() for a in g))
        per_layer: dict[str, list] = {}
        for lname, gm, gr in zip(layer_of, g, ref):
            per_layer.setdefault(lname, [[], []])
            per_layer[lname][0].append(gm)
            per_layer[lname][1].append(gr)
        uf_layers = {k: underflow_fraction(*v) for k, v in per_layer.items()}
        top = sorted(((v, k) for k, v in uf_layers.items() if v == v and v > 0), reverse=True)
        out[label] = {
            "scale": s,
            "loss": loss,
            "nonfinite": nonfinite,
            "underflow": underflow_fraction(g, ref),
            "layers_underflowing": sum(1 for v, _ in top if v > 0.01),
            "top_layers": [(k, round(v, 4)) for v, k in top[:5]],
            "first_kernel_rel_error": relative_error(g[0], ref[0], s),
        }
    if name == "transformer":
        out["ids"] = rounded_ids(x)
    if name == "logsumexp":
        import keras

        def pool_output(m: Any) -> tuple[np.ndarray, np.ndarray]:
            tap = keras.Model(
                m.inputs[0], [m.get_layer("proj").output, m.get_layer("logsumexp_pool").output]
            )
            a, p = tap(xb)
            return np.asarray(a, np.float32), np.asarray(p, np.float32)

        a, p16 = pool_output(model)
        out["proj_max"] = float(np.abs(a).max())
        out["exp_overflows_float16"] = int((a > math.log(65504)).sum())
        out["pool_nonfinite_mixed"] = int((~np.isfinite(p16)).sum())
        out["pool_nonfinite_float32"] = int((~np.isfinite(pool_output(twin)[1])).sum())
        out["pool_elements"] = int(p16.size)
    return out


# --- command line ---------------------------------------------------------------------------------
def _print_measure(m: dict) -> None:
    print(
        f"  measured (independent of mpwatch): float32 reference loss {m['reference_loss']:.4g},"
        f" non-finite reference gradient elements {m['reference_nonfinite']}"
    )
    for label in ("current", "2**15"):
        if label not in m:
            continue
        r = m[label]
        print(
            f"    at scale {r['scale']:g} ({label}): loss {r['loss']:.4g}, non-finite gradient"
            f" elements {r['nonfinite']}, underflow {100 * r['underflow']:.4g}%, layers above 1%:"
            f" {r['layers_underflowing']}, first kernel rel. error"
            f" {r['first_kernel_rel_error']:.3g}"
        )
        if r["top_layers"]:
            print(f"      most underflow: {r['top_layers']}")
    if "ids" in m:
        i = m["ids"]
        print(
            f"    float16 changes {i['changed_elements']} of {i['elements']} token ids"
            f" ({i['changed_distinct_ids']} of {i['distinct_ids']} distinct), e.g. {i['examples']};"
            f" largest after rounding {i['max_after']:g}"
        )
    if "proj_max" in m:
        print(
            f"    LogSumExpPool inputs up to {m['proj_max']:.3g}; {m['exp_overflows_float16']}"
            f" elements with exp() > 65504; non-finite outputs: {m['pool_nonfinite_mixed']} of"
            f" {m['pool_elements']} mixed, {m['pool_nonfinite_float32']} in float32"
        )


def main(argv: list[str] | None = None) -> dict[str, list]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", metavar="NAME", help=f"of: {', '.join(SCENARIOS)}")
    parser.add_argument("--logdir", default=os.path.join("logs", "real_models"))
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--batch-size", type=int, default=None)
    parser.add_argument("--overwrite", action="store_true", help="remove existing run dirs first")
    parser.add_argument("--measure", action="store_true", help="measure the phenomenon too")
    parser.add_argument(
        "--baseline",
        action="store_true",
        help="also train a float32 run of each model (DIR/NAME_float32) and compare",
    )
    parser.add_argument("--verbose", type=int, default=0, help="model.fit's verbose")
    args = parser.parse_args(argv)
    names = args.names or list(SCENARIOS)
    for name in names:
        _check_name(name)

    import mpwatch
    from mpwatch.judge.finding import SEVERITIES

    print(f"mpwatch {mpwatch.__version__} from {os.path.dirname(mpwatch.__file__)}")
    results = {}
    for name in names:
        run_dir = os.path.join(args.logdir, name)
        base_dir = run_dir + "_float32"
        for d in [run_dir] + ([base_dir] if args.baseline else []):
            if os.path.isdir(d) and os.listdir(d):
                if not args.overwrite:
                    sys.exit(f"{d} exists and is not empty (use --overwrite)")
                shutil.rmtree(d)
        t0 = time.perf_counter()
        model = train(name, run_dir, args.steps, args.batch_size, verbose=args.verbose)
        seconds = time.perf_counter() - t0
        runs = [mpwatch.load_run(run_dir, warn=False)]
        note = ""
        if args.baseline:
            t1 = time.perf_counter()
            train(name, base_dir, args.steps, args.batch_size, policy="float32")
            note = f"; float32 baseline {time.perf_counter() - t1:.1f} s"
            runs.append(mpwatch.load_run(base_dir, warn=False))
            runs[0].name, runs[1].name = name, name + "_float32"
        findings = mpwatch.diagnose(runs if args.baseline else runs[0])
        counts = {s: sum(f.severity == s for f in findings) for s in reversed(SEVERITIES)}
        print(
            f"\n== {name} ({POLICIES[name]}, {args.steps} steps, {seconds:.1f} s{note})"
            f" -> {run_dir}"
        )
        for f in findings:
            where = f" [{f.run}]" if args.baseline and f.run != name else ""
            print(f"  {f.severity:<7} {f.rule}{where}: {f.title}")
        print("  count: " + ", ".join(f"{n} {s}" for s, n in counts.items()))
        if args.measure:
            x, y = scenario_data(name)
            _print_measure(measure(name, model, x, y, args.batch_size))
        results[name] = findings
    return results


if __name__ == "__main__":
    main()
