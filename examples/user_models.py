"""Models as their users write them, each with one class of mixed-precision problem (issue 50), and
the fix that removes it: small enough for a CPU, synthetic data made here with a fixed seed.

- ``accumulation``: keras.io's MNIST convnet trained with ``Adam(gradient_accumulation_steps=4)``
  on images where three batches hold a corrupted record (1e5 where pixels are 0..1): the
  LossScaleOptimizer skips exactly those batches; every other batch is applied or accumulated.
  Fixed: the corrupted records filtered out.
- ``finetune``: a float32 checkpoint (an MLP whose weights grew large in float32 training) fine-
  tuned under mixed_float16: its second and third Dense layers compute past float16's maximum.
  Fixed: both kept in float32 (what ``apply_recommendations`` does with the diagnosis).
- ``siamese``: keras.io's Siamese network with a contrastive loss (two towers sharing weights,
  the Euclidean distance of their embeddings). Nearly equal pairs cancel in float16: their
  distance's square is 0 where float32's is not, and ``sqrt(maximum(d, epsilon))`` passes no
  gradient there: zeros in float16 that are not underflow. Fixed: the distance in float32.
- ``lstm_raw``: a keras.io-style LSTM forecaster on a raw series near 1000 (the target too).
  The loss's gradient at the output, ``2 (y_pred - y) / n``, is about 31 per example at the start,
  times the loss scale: the backward pass overflows, the scale falls below 1. Fixed: the target
  standardised (``(y - mean) / std``, predictions turned back).
- ``distiller``: keras.io's knowledge distillation ``Distiller`` (a teacher and a student convnet;
  ``train_step`` runs both; compiled with ``student_loss_fn`` and ``distillation_loss_fn``, no
  ``loss``). Its logits, divided by the temperature and put through a softmax in float16, move
  the loss by 0.5-10% from float32's. Fixed: both heads' Dense in float32.

- ``rmsnorm``: a user-written RMSNorm (LLaMA-style ``x * rsqrt(mean(square(x)) + eps)``) in a
  residual MLP on features up to a few hundred: ``square(x)`` overflows float16 once the
  residual stream passes 256, ``rsqrt(inf)`` is 0, and every norm's output is 0: finite, and
  the model trains at chance. Fixed: the norms in float32 (as LLaMA's code computes them).

``train(name, logdir, fixed=False)`` trains one with mpwatch's monitor and returns
``(model, history, observer)``: the observer read the optimizer's own state after each batch
(its raw step counter and loss scale), the truth the tests compare the records with.

    python examples/user_models.py [NAME ...] [--fixed] [--logdir logs/user_models]
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Iterator
from typing import Any

import numpy as np

NAMES = ("accumulation", "finetune", "siamese", "lstm_raw", "distiller", "rmsnorm")
ACCUMULATE = 4
BAD_BATCHES = (3, 9, 14)  # accumulation: 0-based batches holding a corrupted record


@contextlib.contextmanager
def policy_scope(name: str) -> Iterator[None]:
    import keras

    old = keras.mixed_precision.global_policy().name
    keras.mixed_precision.set_global_policy(name)
    try:
        yield
    finally:
        keras.mixed_precision.set_global_policy(old)


def _value(v: Any) -> Any:
    import keras

    return keras.ops.convert_to_numpy(v.value if hasattr(v, "value") else v)


def _observer_class() -> Any:
    import keras

    class Observer(keras.callbacks.Callback):
        """After each batch: the optimizer's raw step counter (it advances on every batch the
        optimizer took, applied or accumulated, not on a skip) and its loss scale."""

        def __init__(self, optimizer_attr: str = "optimizer") -> None:
            super().__init__()
            self.attr = optimizer_attr
            self.raw: list[int] = []
            self.scale: list[float | None] = []

        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            if keras.backend.backend() == "jax":
                self.model.jax_state_sync()
            opt = getattr(self.model, self.attr)
            inner = getattr(opt, "inner_optimizer", opt)
            self.raw.append(int(_value(inner._iterations)))
            ds = getattr(opt, "dynamic_scale", None)
            self.scale.append(float(_value(ds)) if ds is not None else None)

    return Observer


# --- keras.io MNIST convnet with gradient accumulation ------------------------------------------
def accumulation_data(fixed: bool = False) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    n = 16 * 32
    y = rng.integers(0, 10, n)
    x = rng.uniform(0, 0.2, (n, 12, 12, 1)).astype("float32")
    for i in range(n):  # a class's pixels brighter in its own band of rows
        x[i, y[i] : y[i] + 3] += 0.8
    bad = [b * 16 + 5 for b in BAD_BATCHES]  # one record in each of those batches
    if fixed:
        keep = np.setdiff1d(np.arange(n), bad)
        return x[keep], y[keep]
    x[bad] = 1e5  # a corrupted record: float16's forward overflows on it
    return x, y


def accumulation_model(fixed: bool = False) -> Any:
    import keras

    model = keras.Sequential([
        keras.Input((12, 12, 1)),
        keras.layers.Conv2D(8, 3, activation="relu"),
        keras.layers.MaxPooling2D(2),
        keras.layers.Flatten(),
        keras.layers.Dense(10, activation="softmax", dtype="float32"),
    ])  # fmt: skip
    model.compile(
        keras.optimizers.Adam(1e-3, gradient_accumulation_steps=ACCUMULATE),
        "sparse_categorical_crossentropy",
        metrics=["accuracy"],
    )
    return model


# --- a float32 checkpoint fine-tuned under mixed_float16 ---------------------------------------
def finetune_data(fixed: bool = False) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(1)
    x = rng.normal(size=(512, 16)).astype("float32")
    y = (x[:, :1] > 0).astype("float32")
    return x, y


def finetune_checkpoint() -> list[np.ndarray]:
    """The float32 checkpoint: weights whose products grow past float16's range by the second
    layer (its first layer's outputs up to 300, its second's up to 8e4, its third's up to 2e6)."""
    rng = np.random.default_rng(2)
    shapes = [(16, 64), (64,), (64, 64), (64,), (64, 64), (64,), (64, 1), (1,)]
    gains = [60.0, 0.0, 400.0, 0.0, 25.0, 0.0, 1e-9, 0.0]
    return [(rng.normal(size=s) * g / np.sqrt(s[0])).astype("float32") for s, g in
            zip(shapes, gains)]  # fmt: skip


def finetune_model(fixed: bool = False) -> Any:
    import keras

    kept = "float32" if fixed else None  # the diagnosis' checked fix
    inp = keras.Input((16,))
    h = keras.layers.Dense(64, activation="relu", name="d1")(inp)
    h = keras.layers.Dense(64, activation="relu", dtype=kept, name="d2")(h)
    h = keras.layers.Dense(64, activation="relu", dtype=kept, name="d3")(h)
    out = keras.layers.Dense(1, activation="sigmoid", dtype="float32", name="head")(h)
    model = keras.Model(inp, out)
    model.set_weights(finetune_checkpoint())
    model.compile(keras.optimizers.SGD(1e-9), "binary_crossentropy")
    return model


# --- keras.io Siamese network with a contrastive loss ------------------------------------------
def siamese_data(fixed: bool = False) -> tuple[tuple[np.ndarray, np.ndarray], np.ndarray]:
    rng = np.random.default_rng(3)
    n = 512
    a = rng.normal(size=(n, 16)).astype("float32")
    same = rng.random(n) < 0.5
    b = np.where(same[:, None], a + 1e-3 * rng.normal(size=a.shape), rng.normal(size=a.shape))
    return (a, b.astype("float32")), same.astype("float32")[:, None]


def contrastive_loss(margin: float = 1.0) -> Any:
    from keras import ops

    def loss(y_true: Any, y_pred: Any) -> Any:  # keras.io's: y_true 1 for a similar pair
        square_pred = ops.square(y_pred)
        margin_square = ops.square(ops.maximum(margin - y_pred, 0))
        return ops.mean((1 - y_true) * square_pred + y_true * margin_square)

    return loss


def siamese_model(fixed: bool = False) -> Any:
    import keras
    from keras import ops

    def euclidean_distance(vects: Any) -> Any:  # keras.io's
        x, y = vects
        sum_square = ops.sum(ops.square(x - y), axis=1, keepdims=True)
        return ops.sqrt(ops.maximum(sum_square, keras.backend.epsilon()))

    tower = keras.Sequential([
        keras.Input((16,)),
        keras.layers.Dense(32, activation="tanh"),
        keras.layers.Dense(16, activation="tanh"),
    ], name="tower")  # fmt: skip
    a, b = keras.Input((16,), name="left"), keras.Input((16,), name="right")
    dtype = "float32" if fixed else None
    dist = keras.layers.Lambda(euclidean_distance, dtype=dtype, name="distance")(
        [tower(a), tower(b)]
    )
    out = keras.layers.Dense(1, activation="sigmoid", dtype="float32", name="head")(dist)
    model = keras.Model([a, b], out)
    model.compile(keras.optimizers.RMSprop(1e-3), contrastive_loss())
    return model


# --- an LSTM forecaster on a raw series --------------------------------------------------------
LSTM_WINDOW = 24


def lstm_raw_data(fixed: bool = False) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(4)
    t = np.arange(3000, dtype="float32")
    series = 1000 + 30 * np.sin(t / 50) + rng.normal(0, 3, t.shape)
    feat = np.stack([series, np.sin(t / 24), np.cos(t / 24)], -1).astype("float32")
    starts = range(0, 2560, 4)
    x = np.stack([feat[i : i + LSTM_WINDOW] for i in starts])
    y = np.array([series[i + LSTM_WINDOW] for i in starts], "float32")[:, None]
    if fixed:
        y = (y - y.mean(axis=0)) / y.std(axis=0)  # the target standardised
    return x, y


def lstm_raw_model(fixed: bool = False) -> Any:
    import keras

    inp = keras.Input((LSTM_WINDOW, 3))
    out = keras.layers.Dense(1, name="forecast")(keras.layers.LSTM(16, name="lstm")(inp))
    model = keras.Model(inp, out)
    model.compile(keras.optimizers.Adam(1e-3), "mse")
    return model


# --- keras.io knowledge distillation ------------------------------------------------------------
def distiller_data(fixed: bool = False) -> tuple[np.ndarray, np.ndarray]:
    return accumulation_data(fixed=True)


def distiller_model(fixed: bool = False) -> Any:
    import keras
    from keras import ops

    class Distiller(keras.Model):  # keras.io's, as written there
        def __init__(self, student: Any, teacher: Any) -> None:
            super().__init__()
            self.teacher = teacher
            self.student = student

        def compile(self, optimizer: Any, metrics: Any, student_loss_fn: Any,
                    distillation_loss_fn: Any, alpha: float = 0.1,
                    temperature: float = 3) -> None:  # fmt: skip
            super().compile(optimizer=optimizer, metrics=metrics)
            self.student_loss_fn = student_loss_fn
            self.distillation_loss_fn = distillation_loss_fn
            self.alpha = alpha
            self.temperature = temperature

        def compute_loss(self, x: Any = None, y: Any = None, y_pred: Any = None,
                         sample_weight: Any = None, allow_empty: bool = False) -> Any:  # fmt: skip
            teacher_pred = self.teacher(x, training=False)
            student_loss = self.student_loss_fn(y, y_pred)
            distillation_loss = self.distillation_loss_fn(
                ops.softmax(teacher_pred / self.temperature, axis=1),
                ops.softmax(y_pred / self.temperature, axis=1),
            ) * (self.temperature**2)
            return self.alpha * student_loss + (1 - self.alpha) * distillation_loss

        def call(self, x: Any) -> Any:
            return self.student(x)

    def convnet(name: str, filters: int) -> Any:
        return keras.Sequential([
            keras.Input((12, 12, 1)),
            keras.layers.Conv2D(filters, 3, strides=2, padding="same"),
            keras.layers.LeakyReLU(negative_slope=0.2),
            keras.layers.Flatten(),
            keras.layers.Dense(10, dtype="float32" if fixed else None),  # fixed: logits float32
        ], name=name)  # fmt: skip

    teacher, student = convnet("teacher", 32), convnet("student", 8)
    distiller = Distiller(student=student, teacher=teacher)
    distiller.compile(
        optimizer=keras.optimizers.Adam(),
        metrics=[keras.metrics.SparseCategoricalAccuracy()],
        student_loss_fn=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        distillation_loss_fn=keras.losses.KLDivergence(),
        alpha=0.1,
        temperature=10,
    )
    return distiller


# --- a user-written RMSNorm in a residual MLP --------------------------------------------------
def rmsnorm_data(fixed: bool = False) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(5)
    x = (rng.normal(size=(1024, 32)) * 400).astype("float32")
    return x, (x[:, :1] > 0).astype("float32")


def rmsnorm_model(fixed: bool = False) -> Any:
    import keras
    from keras import ops

    class RMSNorm(keras.layers.Layer):
        def __init__(self, eps: float = 1e-6, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self.eps = eps

        def build(self, shape: Any) -> None:
            self.gamma = self.add_weight(shape=(shape[-1],), initializer="ones", name="gamma")

        def call(self, x: Any) -> Any:
            ms = ops.mean(ops.square(x), axis=-1, keepdims=True)
            return x * ops.rsqrt(ms + self.eps) * self.gamma

    kept = "float32" if fixed else None
    inp = keras.Input((32,))
    h = keras.layers.Dense(64, name="embed")(inp)
    for i in range(2):
        n = RMSNorm(dtype=kept, name=f"norm{i}")(h)
        h = keras.layers.Add(name=f"res{i}")([h, keras.layers.Dense(64, activation="relu",
                                                                   name=f"ff{i}")(n)])  # fmt: skip
    h = RMSNorm(dtype=kept, name="norm_out")(h)
    out = keras.layers.Dense(1, activation="sigmoid", dtype="float32", name="head")(h)
    model = keras.Model(inp, out)
    model.compile(keras.optimizers.Adam(1e-3), "binary_crossentropy", metrics=["accuracy"])
    return model


# --- training ----------------------------------------------------------------------------------
EPOCHS = {"accumulation": 1, "finetune": 1, "siamese": 1, "lstm_raw": 2, "distiller": 1,
          "rmsnorm": 1}  # fmt: skip
BATCH = {"accumulation": 16, "finetune": 32, "siamese": 32, "lstm_raw": 64, "distiller": 32,
         "rmsnorm": 64}  # fmt: skip
POLICY = "mixed_float16"


def build(name: str, fixed: bool = False, policy: str = POLICY) -> tuple[Any, Any, Any]:
    """(model, x, y) of one model under ``policy``."""
    import keras

    keras.utils.set_random_seed(0)
    with policy_scope(policy):
        model = globals()[f"{name}_model"](fixed=fixed)
    x, y = globals()[f"{name}_data"](fixed=fixed)
    return model, x, y


def train(
    name: str, logdir: str, fixed: bool = False, model: Any = None, **monitor: Any
) -> tuple[Any, Any, Any]:
    """Train one with mpwatch's monitor (``monitor``: its keyword arguments; by default a probe
    every 8 steps, every step logged) into ``logdir``: ``(model, history, observer)``. ``model``:
    train this one instead of building it (a model the diagnosis' fix was applied to)."""
    import mpwatch

    built, x, y = build(name, fixed)
    model = built if model is None else model
    observer = _observer_class()()
    kwargs = {"probe_every": 8, "log_every": 1, **monitor}
    history = model.fit(
        x, y, batch_size=BATCH[name], epochs=EPOCHS[name], shuffle=False, verbose=0,
        callbacks=[mpwatch.MixedPrecisionMonitor(logdir, **kwargs), observer],
    )  # fmt: skip
    return model, history, observer


def main(argv: list[str] | None = None) -> None:
    import os

    import mpwatch

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("names", nargs="*", default=list(NAMES), help=", ".join(NAMES))
    ap.add_argument("--fixed", action="store_true", help="train each with its fix applied")
    ap.add_argument("--logdir", default="logs/user_models")
    args = ap.parse_args(argv)
    for name in args.names:
        logdir = os.path.join(args.logdir, name + ("_fixed" if args.fixed else ""))
        _, history, observer = train(name, logdir, fixed=args.fixed)
        losses = {k: [round(v, 4) for v in vs] for k, vs in history.history.items()}
        print(f"== {name}{' (fixed)' if args.fixed else ''}: {losses}; scales {observer.scale}")
        for f in mpwatch.diagnose(logdir):
            print(f"  {f.severity:7s} {f.title}  [{f.rule}]")


if __name__ == "__main__":
    main()
