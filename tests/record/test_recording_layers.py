"""The per-layer dtype table: float32 softmax output, LayerNormalization, a nested sub-model, a
subclassed model (output dtypes noted while the step is traced), written once unless it changes."""

from __future__ import annotations

import numpy as np


def _rows(records):
    (_, payload), *_ = records["layers"]
    cols = payload["layers"]["columns"]
    return {r[cols.index("path")]: dict(zip(cols, r)) for r in payload["layers"]["data"]}


def test_functional_nested_layernorm_float32_softmax(tmp_path, policy, read_events):
    import keras

    import mpwatch

    with policy("mixed_float16"):
        inner = keras.Sequential(
            [
                keras.Input((12,)),
                keras.layers.Dense(16, name="dense"),
                keras.layers.LayerNormalization(name="ln"),
            ],
            name="inner",
        )
        x = keras.Input((12,))
        h = keras.layers.Dense(10, name="logits")(inner(x))
        out = keras.layers.Activation("softmax", dtype="float32", name="probs")(h)
        model = keras.Model(x, out, name="outer")
        model.compile("sgd", "sparse_categorical_crossentropy")
        data = np.random.rand(40, 12).astype("float32"), np.random.randint(0, 10, 40)
        for _ in range(2):
            model.fit(
                *data, batch_size=10, verbose=0, callbacks=[mpwatch.LayerDtypeMonitor(tmp_path)]
            )
    _, records = read_events(tmp_path)
    assert len(records["layers"]) == 1  # unchanged: written once over two fits
    rows = _rows(records)
    assert set(rows) == {
        "outer/inner",
        "outer/inner/dense",
        "outer/inner/ln",
        "outer/logits",
        "outer/probs",
    }
    d = rows["outer/inner/dense"]
    assert (d["compute_dtype"], d["variable_dtype"], d["output_dtype"]) == (
        "float16",
        "float32",
        "float16",
    )
    assert d["tc_dims"] == {"units": 16, "kernel_input_dim": 12} and d["tc_aligned"] is False
    assert d["params"] == 12 * 16 + 16 and d["depth"] == 2
    ln = rows["outer/inner/ln"]
    assert ln["compute_dtype"] == "float16" and ln["output_dtype"] == "float16"
    assert ln["effective_dtype"] == "float32" and "float32 inside" in ln["note"]
    probs = rows["outer/probs"]
    assert probs["is_output"] is True and probs["output_dtype"] == "float32"
    assert probs["policy"] == "float32"
    assert rows["outer/logits"]["is_output"] is False
    assert rows["outer/logits"]["output_dtype"] == "float16"


def test_subclassed_output_dtypes_are_traced(tmp_path, policy, read_events):
    import keras

    import mpwatch

    class Net(keras.Model):
        def __init__(self):
            super().__init__(name="net")
            self.hidden = keras.layers.Dense(32, activation="relu", name="hidden")
            self.norm = keras.layers.BatchNormalization(name="bn")
            self.head = keras.layers.Dense(4, activation="softmax", name="head")

        def call(self, x, training=False):
            return self.head(self.norm(self.hidden(x), training=training))

    with policy("mixed_float16"):
        model = Net()
        model.compile("adam", "sparse_categorical_crossentropy")
        model.fit(
            np.random.rand(32, 8).astype("float32"),
            np.random.randint(0, 4, 32),
            batch_size=8,
            verbose=0,
            callbacks=[mpwatch.LayerDtypeMonitor(tmp_path)],
        )
    _, records = read_events(tmp_path)
    # at train begin the subclassed model is not built yet; the traced step completes the table
    assert len(records["layers"]) == 2
    rows = {r["name"]: r for r in _rows({"layers": [records["layers"][-1]]}).values()}
    assert rows["hidden"]["output_dtype"] == "float16"
    assert rows["hidden"]["params"] == 8 * 32 + 32
    assert rows["hidden"]["tc_aligned"] is True  # 8 in, 32 units
    assert rows["bn"]["effective_dtype"] == "float32"
    assert rows["head"]["output_dtype"] == "float16"  # the float16 softmax mistake
    assert rows["head"]["is_output"] is True


def test_a_float16_normalization_that_lost_features_in_its_cast_is_recorded(
    tmp_path, policy, read_events
):
    """Raw amounts (standard deviation ~17000, variance past float16's 65504) and small counts
    through an adapted Normalization: under mixed_float16 Keras casts its variance to float16
    once, inf for the amounts, and the layer gives 0 for them; the record counts exactly the
    features numpy finds past float16's range, and a float32 Normalization records none."""
    import keras

    import mpwatch

    rng = np.random.default_rng(0)
    x = np.concatenate([rng.uniform(0, 6e4, (256, 3)), rng.integers(0, 20, (256, 5))], 1)
    x = x.astype("float32")
    truth = int(((x.astype(np.float64).var(axis=0) > 65504)
                 | (np.abs(x.astype(np.float64).mean(axis=0)) > 65504)).sum())  # fmt: skip
    assert truth == 3
    for dtype, want in (
        (None, {"dtype": "float16", "features": 8, "lost": truth}),
        ("float32", None),
    ):
        with policy("mixed_float16"):
            norm = keras.layers.Normalization(name="norm", **({"dtype": dtype} if dtype else {}))
            norm.adapt(x)
            inp = keras.Input((8,))
            model = keras.Model(inp, keras.layers.Dense(1, dtype="float32")(norm(inp)))
            model.compile("sgd", "mse")
            out = tmp_path / str(dtype)
            model.fit(x, x[:, :1], batch_size=64, epochs=1, verbose=0,
                      callbacks=[mpwatch.LayerDtypeMonitor(out)])  # fmt: skip
        if dtype is None:  # what the layer gives: 0 for the amounts
            assert np.all(np.asarray(norm(x[:8]), np.float32)[:, :3] == 0)
        _, records = read_events(out)
        (_, payload), *_ = records["layers"]
        assert payload.get("cast_constants", {}).get("norm") == want


def test_a_distillers_teacher_and_student_heads_are_both_outputs(tmp_path, policy, read_events):
    """keras.io's Distiller: a subclassed model holding a teacher and a student, its ``call``
    the student's. The teacher's 10-class head is the task's width too (tensor-core-alignment
    asked to pad it); the teacher's hidden layer is not an output."""
    import keras

    import mpwatch

    def classifier(name):
        inp = keras.Input((8,))
        h = keras.layers.Dense(20, activation="relu", name=f"{name}_hidden")(inp)
        return keras.Model(inp, keras.layers.Dense(10, name=f"{name}_head")(h), name=name)

    class Distiller(keras.Model):
        def __init__(self, student, teacher):
            super().__init__(name="distiller")
            self.teacher, self.student = teacher, student

        def call(self, x):
            return self.student(x)

    with policy("mixed_float16"):
        model = Distiller(classifier("student"), classifier("teacher"))
        model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        x, y = np.random.rand(16, 8).astype("float32"), np.random.randint(0, 10, 16)
        model.fit(x, y, batch_size=8, verbose=0, callbacks=[mpwatch.LayerDtypeMonitor(tmp_path)])
    _, records = read_events(tmp_path)
    rows = {r["name"]: r for r in _rows({"layers": [records["layers"][-1]]}).values()}
    assert rows["teacher_head"]["is_output"] is True and rows["student_head"]["is_output"] is True
    assert rows["teacher_hidden"]["is_output"] is False
    found = [f for f in mpwatch.diagnose(str(tmp_path)) if f.rule == "tensor-core-alignment"]
    assert {f.layer for f in found} == {"student_hidden", "teacher_hidden"}  # 20 units, not 10
