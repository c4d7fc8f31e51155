"""The profile of a model whose train step calls sub-models itself, on a real trace (CPU).

keras.io's knowledge distillation ``Distiller`` calls its teacher inside ``compute_loss`` (and its
student through ``call``): TensorFlow opens the teacher's scope at the top of the step
(``StatefulPartitionedCall/teacher_1/conv2d_1/convolution``), not under the distiller's. Before,
the teacher's time was "outside layers" and its float16 convolutions counted 32-bit (issue 50:
"0% in 16-bit, 100.0% outside layers"). Here the model also multiplies by a weight of its own in
``compute_loss``, a matmul no layer holds: that time cannot be joined, and the profile says so.

Ground truth: the converter's op table, read with pandas, and the op names' own scope components.
"""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")
pytest.importorskip("xprof.convert.raw_to_tool_data")

import mpwatch  # noqa: E402
from mpwatch import contract, profile  # noqa: E402
from mpwatch.show.report import render  # noqa: E402

MATH = re.compile(r"^_?(?:Mkl)?(?:Native)?(?:Fused)?(?:Conv2D|MatMul)\w*$")  # MKL's too


def _distiller():
    from keras import ops

    class Distiller(keras.Model):
        def __init__(self, student, teacher):
            super().__init__(name="distiller")
            self.teacher, self.student = teacher, student
            self.proj = self.add_weight(shape=(144, 512), initializer="glorot_uniform",
                                        name="proj")  # fmt: skip

        def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, **kwargs):
            teacher_pred = self.teacher(x, training=False)
            # a penalty on a projection of the input: a matmul no layer holds
            reg = ops.mean(ops.square(ops.matmul(ops.reshape(x, (-1, 144)), self.proj)))
            student_loss = keras.losses.sparse_categorical_crossentropy(y, y_pred, from_logits=True)
            soft = keras.losses.kl_divergence(
                ops.softmax(ops.cast(teacher_pred, "float32") / 3.0, axis=1),
                ops.softmax(ops.cast(y_pred, "float32") / 3.0, axis=1),
            )
            return ops.mean(0.1 * student_loss + 0.9 * soft) + 1e-4 * reg

        def call(self, x):
            return self.student(x)

    def convnet(name, filters):
        return keras.Sequential([
            keras.Input((12, 12, 1)),
            keras.layers.Conv2D(filters, 3, strides=2, padding="same"),
            keras.layers.Flatten(),
            keras.layers.Dense(10, dtype="float32"),
        ], name=name)  # fmt: skip

    model = Distiller(convnet("student", 8), convnet("teacher", 32))
    model.compile(optimizer=keras.optimizers.Adam())
    return model


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    logdir = str(tmp_path_factory.mktemp("distiller_profile"))
    keras.backend.clear_session()  # (it resets the global policy: set after it)
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        model = _distiller()
        rng = np.random.default_rng(0)
        x = rng.normal(size=(128, 12, 12, 1)).astype("float32")
        y = rng.integers(0, 10, 128)
        model.fit(x, y, batch_size=16, epochs=1, verbose=0, callbacks=[
            mpwatch.MixedPrecisionMonitor(logdir, profile=(3, 5), probe_every=None, budget=None)
        ])  # fmt: skip
    finally:
        keras.mixed_precision.set_global_policy("float32")
    run = mpwatch.load_run(logdir)
    ops = profile.op_table(profile.find_traces(logdir)[0])
    return {"logdir": logdir, "model": model, "run": run, "ops": ops}


def _owner(op_name: str) -> str | None:
    """The sub-model an op name's scopes name (truth from the name alone)."""
    for part in op_name.split("/"):
        m = re.fullmatch(r"(teacher|student)(?:_\d+)?", part)
        if m:
            return m.group(1)
    return None


def test_the_teacher_called_by_the_train_step_gets_its_time(fitted):
    ops, run = fitted["ops"], fitted["run"]
    owner = ops["op_name"].map(_owner)
    # the trace really opens the teacher's scope outside the distiller's: what this test is about
    teacher_names = ops.loc[owner == "teacher", "op_name"]
    assert len(teacher_names) and not teacher_names.str.contains("distiller").any()
    layers = run.profile_layers.set_index("path")
    for sub in ("teacher", "student"):
        truth = float(ops.loc[owner == sub, "self_time_us"].sum())
        rows = layers[layers.index.str.startswith(f"distiller/{sub}")]
        assert rows["time_us"].sum() == pytest.approx(truth, rel=1e-6), sub
        conv = rows[rows["class"] == "Conv2D"].iloc[0]
        assert conv["time_us"] > 0 and conv["time_16bit_us"] > 0.5 * conv["time_us"], sub


def test_math_no_layer_holds_is_said_not_counted_16bit(fitted):
    ops, run = fitted["ops"], fitted["run"]
    owner = ops["op_name"].map(_owner)
    math = ops["op_type"].astype(str).str.match(MATH)
    truth = float(ops.loc[math & owner.isna(), "self_time_us"].sum())
    assert truth > 0  # the projection by the distiller's own weight, forward and backward
    total = float(ops["self_time_us"].sum())
    by = run.profile["unattributed_by_category"]
    assert by[contract.PROFILE_UNJOINED_MATH] == pytest.approx(truth, rel=1e-6)
    doc = json.loads(render([run], [], "json"))
    share = doc["runs"][0]["profile"]["unjoined_math_share"]
    assert share == pytest.approx(truth / total, rel=1e-6)
    assert share >= 0.01  # (the line says a share from 1%)
    text = render([run], [], "text")
    assert "matmul/conv ops joined to no layer" in text, text


def test_the_tab_says_it_too(fitted):
    from tensorboard_plugin_mpwatch.data.views import profile_summary

    run = fitted["run"]
    panel = profile_summary(run)
    doc = json.loads(render([run], [], "json"))
    assert panel["unjoined_math_share"] == doc["runs"][0]["profile"]["unjoined_math_share"]
    assert panel["unjoined_math_share"] >= panel["unjoined_said"]
    assert panel["text"]["unjoined_math_share"].endswith("%")
