"""mpwatch on more models nobody here wrote (issue 24), small enough for a 2-core CPU, each built as
its users build it and trained for a few steps on synthetic data made here with a fixed seed (no
downloads, ``weights=None``):

- ``efficientnet_b0``: ``keras.applications.EfficientNetB0`` at 32x32x3, 10 classes,
  ``mixed_float16``, fed pixel values in [0, 255] as its documentation asks (it rescales them
  itself). Its classifier ``predictions`` is a Dense whose softmax computes in float16;
  its squeeze-excite blocks end in ``Multiply`` layers that only pass their inputs' error on.
  Fixed: ``classifier_activation=None`` and a float32 ``Activation("softmax")`` after the model.
- ``vit``: keras.io's "Image classification with Vision Transformer" at 32x32 (a ``Patches``
  layer over ``keras.ops.image.extract_patches``, a ``PatchEncoder`` of a Dense projection plus a
  position ``Embedding``, 2 transformer blocks of LayerNormalization, MultiHeadAttention and a
  gelu MLP, an MLP head), patch 8, projection 32, ``mixed_float16``, with the classifier users
  write for ``sparse_categorical_crossentropy``: ``Dense(10, activation="softmax")`` (float16).
  No data augmentation (keras.io's random layers are not part of what is judged here). Runs on
  TensorFlow and on JAX. Fixed: the Dense with ``activation=None`` and a float32 softmax
  ``Activation`` after it.
- ``bilstm``: keras.io's "Bidirectional LSTM on IMDB" (``Input(shape=(None,), dtype="int32")``,
  ``Embedding``, two ``Bidirectional(LSTM(64))``, ``Dense(1, activation="sigmoid")``) with a
  vocabulary of :data:`BILSTM_VOCAB` and sequences of :data:`BILSTM_MAXLEN` synthetic int32 ids
  (keras.io: 20000 and 200), ``mixed_float16``. Fixed: the Dense with ``activation=None`` and a
  float32 *sigmoid* ``Activation`` after it.
- ``mobilenet_v2_bf16``: ``keras.applications.MobileNetV2`` at 32x32x3, 10 classes, under
  ``mixed_bfloat16`` (no loss scale), meant for Keras' JAX backend. Fixed: like EfficientNetB0.

For tests (``tests/repo_scripts.load_script("examples/more_models.py")``):

- :func:`build` (``name, fixed=False``) -> ``(model, x, y)``: the compiled model under the
  model's policy (:data:`POLICIES`) and its data; ``fixed=True`` builds it with its output fix.
- :func:`train` (``name, logdir, fixed=False, steps=..., callbacks=()``) -> ``(model,
  history)``: exactly ``steps`` batches (default :data:`STEPS`), unshuffled, with
  ``mpwatch.MixedPrecisionMonitor`` (probe every :data:`PROBE_EVERY` steps), on whichever Keras
  backend this process runs.
- :func:`output_layer` -> the layer that makes the model's output (for its dtype and activation).

Run them and print mpwatch's diagnosis of each (one run directory per model under ``--logdir``;
``KERAS_BACKEND=jax`` for JAX)::

    python examples/more_models.py [NAME ...] [--fixed] [--logdir logs/more_models]
"""

from __future__ import annotations

import argparse
import contextlib
import os
from collections.abc import Iterator, Sequence
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402

NAMES = ("efficientnet_b0", "vit", "bilstm", "mobilenet_v2_bf16")
#: the global dtype policy each model trains under
POLICIES = {
    "efficientnet_b0": "mixed_float16",
    "vit": "mixed_float16",
    "bilstm": "mixed_float16",
    "mobilenet_v2_bf16": "mixed_bfloat16",
}
IMAGE_SHAPE = (32, 32, 3)
NUM_CLASSES = 10
BILSTM_VOCAB = 1000
BILSTM_MAXLEN = 32
VIT_PATCH = 8
VIT_PROJECTION = 32
#: batches each model trains for by default, its batch size, and the probe's interval
STEPS = {"efficientnet_b0": 20, "vit": 30, "bilstm": 20, "mobilenet_v2_bf16": 6}
BATCH_SIZES = {"efficientnet_b0": 16, "vit": 32, "bilstm": 32, "mobilenet_v2_bf16": 16}
PROBE_EVERY = {"efficientnet_b0": 20, "vit": 10, "bilstm": 10, "mobilenet_v2_bf16": 6}


@contextlib.contextmanager
def policy_scope(policy: str) -> Iterator[None]:
    """Keras' global dtype policy set to ``policy`` inside, restored afterwards (also on error)."""
    import keras

    old = keras.mixed_precision.global_policy().name
    keras.mixed_precision.set_global_policy(policy)
    try:
        yield
    finally:
        keras.mixed_precision.set_global_policy(old)


# --- synthetic data ------------------------------------------------------------------------------
def synthetic_images(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``n`` float32 images in [0, 1] of :data:`IMAGE_SHAPE` whose class (of 10) is a bright band
    of rows, and the int32 labels."""
    rng = np.random.default_rng(seed)
    h, w, c = IMAGE_SHAPE
    y = rng.integers(0, NUM_CLASSES, size=n)
    x = rng.random((n, h, w, c), dtype=np.float32) * 0.3
    band = max(1, h // NUM_CLASSES)
    for k in range(NUM_CLASSES):
        x[y == k, k * band : (k + 1) * band, 2 : w - 2, k % c] += 0.7
    return x.clip(0, 1), y.astype("int32")


def synthetic_ids(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``n`` int32 sequences of :data:`BILSTM_MAXLEN` token ids in [1, BILSTM_VOCAB) and a binary
    float32 label: whether the sequence holds more ids below half the vocabulary than above."""
    rng = np.random.default_rng(seed)
    x = rng.integers(1, BILSTM_VOCAB, size=(n, BILSTM_MAXLEN)).astype("int32")
    y = ((x < BILSTM_VOCAB // 2).mean(axis=1) > 0.5).astype("float32")
    return x, y


# --- the models -----------------------------------------------------------------------------------
def build_efficientnet_b0(fixed: bool = False) -> Any:
    """``keras.applications.EfficientNetB0(weights=None, input_shape=(32, 32, 3), classes=10)``;
    fixed as output-16bit's fix for keras.applications says: ``classifier_activation=None``,
    then ``Activation("softmax", dtype="float32")`` on its output."""
    import keras

    if not fixed:
        return keras.applications.EfficientNetB0(
            weights=None, input_shape=IMAGE_SHAPE, classes=NUM_CLASSES
        )
    model = keras.applications.EfficientNetB0(
        weights=None, input_shape=IMAGE_SHAPE, classes=NUM_CLASSES, classifier_activation=None
    )
    outputs = keras.layers.Activation("softmax", dtype="float32")(model.output)
    return keras.Model(model.input, outputs)


def build_mobilenet_v2_bf16(fixed: bool = False) -> Any:
    """``keras.applications.MobileNetV2(weights=None, input_shape=(32, 32, 3), classes=10)``;
    fixed: its softmax in float32 after ``classifier_activation=None``."""
    import keras

    if not fixed:
        return keras.applications.MobileNetV2(
            weights=None, input_shape=IMAGE_SHAPE, classes=NUM_CLASSES
        )
    model = keras.applications.MobileNetV2(
        weights=None, input_shape=IMAGE_SHAPE, classes=NUM_CLASSES, classifier_activation=None
    )
    outputs = keras.layers.Activation("softmax", dtype="float32")(model.output)
    return keras.Model(model.input, outputs)


def _vit_layers() -> tuple[type, type]:
    """keras.io's ``Patches`` and ``PatchEncoder``, as written there (Keras 3 version)."""
    import keras
    from keras import layers, ops

    class Patches(layers.Layer):
        def __init__(self, patch_size):
            super().__init__()
            self.patch_size = patch_size

        def call(self, images):
            input_shape = ops.shape(images)
            batch_size = input_shape[0]
            height = input_shape[1]
            width = input_shape[2]
            channels = input_shape[3]
            num_patches_h = height // self.patch_size
            num_patches_w = width // self.patch_size
            patches = keras.ops.image.extract_patches(images, size=self.patch_size)
            patches = ops.reshape(
                patches,
                (
                    batch_size,
                    num_patches_h * num_patches_w,
                    self.patch_size * self.patch_size * channels,
                ),
            )
            return patches

        def get_config(self):
            config = super().get_config()
            config.update({"patch_size": self.patch_size})
            return config

    class PatchEncoder(layers.Layer):
        def __init__(self, num_patches, projection_dim):
            super().__init__()
            self.num_patches = num_patches
            self.projection = layers.Dense(units=projection_dim)
            self.position_embedding = layers.Embedding(
                input_dim=num_patches, output_dim=projection_dim
            )

        def call(self, patch):
            positions = ops.expand_dims(ops.arange(start=0, stop=self.num_patches, step=1), axis=0)
            projected_patches = self.projection(patch)
            encoded = projected_patches + self.position_embedding(positions)
            return encoded

        def get_config(self):
            config = super().get_config()
            config.update({"num_patches": self.num_patches})
            return config

    return Patches, PatchEncoder


Patches, PatchEncoder = None, None  # set on first build (imports keras)


def build_vit(fixed: bool = False) -> Any:
    """keras.io's ``create_vit_classifier`` at 32x32 (patch 8: 16 patches; projection 32; 4 heads;
    2 blocks; transformer MLP [64, 32]; head MLP [64, 32]) with a float16 softmax classifier;
    fixed: the classifier's Dense with ``activation=None`` and a float32 softmax after it."""
    global Patches, PatchEncoder
    import keras
    from keras import layers

    if Patches is None:
        Patches, PatchEncoder = _vit_layers()
    num_patches = (IMAGE_SHAPE[0] // VIT_PATCH) ** 2
    projection_dim, num_heads, transformer_layers = VIT_PROJECTION, 4, 2
    transformer_units = [projection_dim * 2, projection_dim]
    mlp_head_units = [64, 32]

    def mlp(x: Any, hidden_units: list[int], dropout_rate: float) -> Any:
        for units in hidden_units:
            x = layers.Dense(units, activation=keras.activations.gelu)(x)
            x = layers.Dropout(dropout_rate)(x)
        return x

    inputs = keras.Input(shape=IMAGE_SHAPE)
    patches = Patches(VIT_PATCH)(inputs)
    encoded_patches = PatchEncoder(num_patches, projection_dim)(patches)
    for _ in range(transformer_layers):
        x1 = layers.LayerNormalization(epsilon=1e-6)(encoded_patches)
        attention_output = layers.MultiHeadAttention(
            num_heads=num_heads, key_dim=projection_dim, dropout=0.1
        )(x1, x1)
        x2 = layers.Add()([attention_output, encoded_patches])
        x3 = layers.LayerNormalization(epsilon=1e-6)(x2)
        x3 = mlp(x3, hidden_units=transformer_units, dropout_rate=0.1)
        encoded_patches = layers.Add()([x3, x2])
    representation = layers.LayerNormalization(epsilon=1e-6)(encoded_patches)
    representation = layers.Flatten()(representation)
    representation = layers.Dropout(0.5)(representation)
    features = mlp(representation, hidden_units=mlp_head_units, dropout_rate=0.5)
    if fixed:
        x = layers.Dense(NUM_CLASSES, activation=None, name="predictions_logits")(features)
        outputs = layers.Activation("softmax", dtype="float32", name="predictions")(x)
    else:
        outputs = layers.Dense(NUM_CLASSES, activation="softmax")(features)
    return keras.Model(inputs=inputs, outputs=outputs, name="vit")


def build_bilstm(fixed: bool = False) -> Any:
    """keras.io's Bidirectional LSTM (int32 ids of any length, Embedding 128, two
    ``Bidirectional(LSTM(64))``, a 1-unit sigmoid); fixed: the Dense with ``activation=None`` and
    ``Activation("sigmoid", dtype="float32")`` after it."""
    import keras
    from keras import layers

    inputs = keras.Input(shape=(None,), dtype="int32")
    x = layers.Embedding(BILSTM_VOCAB, 128)(inputs)
    x = layers.Bidirectional(layers.LSTM(64, return_sequences=True))(x)
    x = layers.Bidirectional(layers.LSTM(64))(x)
    if fixed:
        x = layers.Dense(1, activation=None, name="output_logits")(x)
        outputs = layers.Activation("sigmoid", dtype="float32", name="output")(x)
    else:
        outputs = layers.Dense(1, activation="sigmoid")(x)
    return keras.Model(inputs, outputs, name="bilstm")


def data(name: str, seed: int = 0, n: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``(x, y)`` of model ``name``: as many samples as its default training run uses, in the
    range the model documents: pixel values in [0, 255] for EfficientNet (it rescales them
    itself), [0, 1] for the others."""
    _check_name(name)
    n = n or STEPS[name] * BATCH_SIZES[name]
    if name == "bilstm":
        return synthetic_ids(n, seed)
    x, y = synthetic_images(n, seed)
    return (x * np.float32(255.0), y) if name == "efficientnet_b0" else (x, y)


def build(
    name: str, fixed: bool = False, seed: int = 0, policy: str | None = None
) -> tuple[Any, np.ndarray, np.ndarray]:
    """Model ``name`` (with its fix when ``fixed``) built and compiled under its policy
    (:data:`POLICIES`, or ``policy``: ``"float32"`` gives a float32 twin with the same weight
    layout) after ``keras.utils.set_random_seed(seed)``, and its data."""
    import keras

    _check_name(name)
    keras.utils.set_random_seed(seed)
    with policy_scope(policy or POLICIES[name]):
        model = globals()[f"build_{name}"](fixed)
        if name == "bilstm":
            model.compile(optimizer="adam", loss="binary_crossentropy", metrics=["accuracy"])
        else:
            model.compile(
                optimizer=keras.optimizers.Adam(1e-3),
                loss="sparse_categorical_crossentropy",
                metrics=["accuracy"],
            )
    x, y = data(name, seed)
    return model, x, y


def output_layer(model: Any) -> Any:
    """The layer that makes the model's (single) output: the last layer of ``model.layers``."""
    return model.layers[-1]


def _check_name(name: str) -> None:
    if name not in NAMES:
        raise ValueError(f"unknown model {name!r}; one of {', '.join(NAMES)}")


def train(
    name: str,
    logdir: str | os.PathLike[str],
    fixed: bool = False,
    *,
    steps: int | None = None,
    batch_size: int | None = None,
    seed: int = 0,
    callbacks: Sequence[Any] = (),
    verbose: int = 0,
    model: Any = None,
    **monitor_kwargs: Any,
) -> tuple[Any, Any]:
    """Build model ``name`` (:func:`build`), fit it for exactly ``steps`` batches (one epoch,
    unshuffled) under its policy with ``mpwatch.MixedPrecisionMonitor(logdir, log_every=...,
    probe_every=PROBE_EVERY[name], profile=False, **monitor_kwargs)`` first and ``callbacks``
    after it; return ``(model, history)``. The global policy is restored afterwards.
    ``model``: train this one instead of building it (a model the diagnosis' fix was applied
    to)."""
    import keras

    import mpwatch

    built, x, y = build(name, fixed, seed)
    model = built if model is None else model
    bs = batch_size or BATCH_SIZES[name]
    n = (steps or STEPS[name]) * bs
    idx = np.arange(n) % len(x)
    every = PROBE_EVERY[name]
    kwargs = {"log_every": min(10, every), "probe_every": every, "profile": False}
    monitor = mpwatch.MixedPrecisionMonitor(os.fspath(logdir), **(kwargs | monitor_kwargs))
    keras.utils.set_random_seed(seed)
    with policy_scope(POLICIES[name]):
        history = model.fit(
            x[idx],
            y[idx],
            batch_size=bs,
            epochs=1,
            shuffle=False,
            verbose=verbose,
            callbacks=[monitor, *callbacks],
        )
    return model, history


def main(argv: list[str] | None = None) -> None:
    """Train the named models (default: all) and print their findings."""
    import keras

    import mpwatch

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("names", nargs="*", default=list(NAMES), help=", ".join(NAMES))
    ap.add_argument("--fixed", action="store_true", help="train each with its output fix")
    ap.add_argument("--logdir", default=os.path.join("logs", "more_models"))
    args = ap.parse_args(argv)
    for name in args.names:
        logdir = os.path.join(args.logdir, name + ("_fixed" if args.fixed else ""))
        model, history = train(name, logdir, fixed=args.fixed)
        print(f"== {name}{' (fixed)' if args.fixed else ''} on {keras.backend.backend()}: loss "
              f"{[round(v, 4) for v in history.history['loss']]}")  # fmt: skip
        for f in mpwatch.diagnose(logdir):
            print(f"  {f.severity:7s} {f.rule}: {f.title}")


if __name__ == "__main__":
    main()
