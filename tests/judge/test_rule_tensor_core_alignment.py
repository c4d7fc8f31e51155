"""Rule ``tensor-core-alignment`` (mpwatch/judge/rules/tensor_core_alignment.py) on constructed
Runs."""

from __future__ import annotations

import pytest
from builders import (
    assert_findings,
    findings_of,
    graph_row,
    make_run,
    model_row,
    probe_layer,
    run_info,
)

from mpwatch import contract
from mpwatch.judge import diagnose

RULE = "tensor-core-alignment"

CASES = [
    # conv2d filters 30, batch 30, output Dense(10) (classes: not flagged)
    pytest.param(
        make_run(),
        [
            {"layer": "conv2d", "severity": "warning", "fix_has": "filters=32"},
            {"layer": None, "severity": "warning", "fix_has": "batch_size=32"},
        ],
        id="filters-and-batch-size-with-tensor-cores",
    ),
    pytest.param(
        make_run(info=run_info("mixed_float16", tc=False)),
        [{"layer": "conv2d", "severity": "info"}, {"layer": None, "severity": "info"}],
        id="no-tensor-cores-is-info",
    ),
    pytest.param(make_run(policy="float32"), [], id="float32-policy-nothing"),
    pytest.param(
        make_run(
            info=run_info("mixed_float16", batch_size=None),
            probes={
                10: (
                    {**model_row(), "batch_source": "training", "batch_size": 30},
                    [probe_layer("dense")],
                )
            },
        ),
        [
            {"layer": "conv2d", "severity": "warning"},
            {"layer": None, "fix_has": "batch_size=32", "data": {"batch_size": 30}},
        ],
        id="keras-3-batch-size-from-the-probes-training-batch",
    ),
    pytest.param(
        make_run(info=run_info("mixed_float16", batch_size=None)),
        [{"layer": "conv2d"}],
        id="batch-size-unknown-no-finding",
    ),
]


# --- never a dimension the task or the data fixes (issue 24) -------------------------------------
def _graph(*rows, old=False, batch=32):
    """A run of these layer rows (:func:`graph_row`), batch size 32 unless told; ``old``: a record
    written before the graph columns."""
    run = make_run(layers=list(rows), info=run_info("mixed_float16", batch_size=batch))
    if old:
        run.layers = run.layers.drop(columns=contract.LAYERS_GRAPH_COLUMNS)
    return run


HIDDEN = graph_row("hidden", dims={"units": 30}, act="relu", width=30, inputs=["x"])
HEAD = graph_row("head", dims={"units": 10}, act="linear", width=10, inputs=["hidden"])
PROBS = graph_row("probs", "Activation", act="softmax", width=10, inputs=["head"], out=True,
                  dtype="float32")  # fmt: skip

CASES += [
    pytest.param(
        _graph(HIDDEN, HEAD, PROBS),
        [{"layer": "hidden", "fix_has": "Dense(units=32, ...)"}],
        id="classes-before-a-float32-activation-are-the-tasks",
    ),
    pytest.param(
        _graph(
            HIDDEN,
            HEAD,
            graph_row("drop", "Dropout", width=10, inputs=["head"]),
            graph_row("probs", "Activation", act="softmax", width=10, inputs=["drop"], out=True),
        ),
        [{"layer": "hidden"}],
        id="through-a-dropout-too",
    ),
    pytest.param(
        # a residual onto the model input 'x' (13 features): 'proj' must have 13 units
        _graph(
            graph_row("hidden", dims={"units": 30}, width=30, inputs=["x"]),
            graph_row("proj", dims={"units": 13}, width=13, inputs=["hidden"]),
            graph_row("add", "Add", width=13, inputs=["x", "proj"]),
            graph_row("out", dims={"units": 8}, width=8, inputs=["add"], out=True),
        ),
        [{"layer": "hidden"}],
        id="a-width-merged-with-the-model-input-is-the-datas",
    ),
    pytest.param(
        # a hidden layer of the same width as the output, not feeding it directly: the user's
        _graph(
            graph_row("h10", dims={"units": 10}, width=10, inputs=["x"]),
            graph_row("h16", dims={"units": 16}, width=16, inputs=["h10"]),
            graph_row("out", dims={"units": 10}, width=10, inputs=["h16"], out=True),
        ),
        [{"layer": "h10", "fix_has": "Dense(units=16, ...)"}],
        id="only-the-layers-that-make-the-outputs-width",
    ),
    pytest.param(
        _graph(HIDDEN, HEAD, PROBS, old=True),
        [{"layer": "hidden"}],
        id="older-record-an-activation-after-the-classes-by-its-class",
    ),
    pytest.param(
        _graph(
            graph_row("emb", "Embedding", dims={"output_dim": 20}, width=20, inputs=["ids"]),
            graph_row("pool", "GlobalAveragePooling1D", width=20, inputs=["emb"]),
            graph_row("out", dims={"units": 1}, act="sigmoid", width=1, inputs=["pool"], out=True),
        ),
        [{"layer": "emb", "fix_has": "output_dim=24", "data": {"dims": {"output_dim": 20}}}],
        id="an-embeddings-width-is-the-users-its-vocabulary-never-asked",
    ),
    pytest.param(
        # keras.io's knowledge distillation: the teacher, built before the policy, computes in
        # float32 (its 10-unit head is not the model's output); the student's hidden layer does not
        _graph(
            graph_row("t_hidden", dims={"units": 30}, width=30, inputs=["x"], dtype="float32"),
            graph_row("t_head", dims={"units": 10}, width=10, inputs=["t_hidden"], dtype="float32"),
            graph_row("s_hidden", dims={"units": 30}, width=30, inputs=["x"]),
            graph_row("s_head", dims={"units": 10}, width=10, inputs=["s_hidden"], out=True),
        ),
        [{"layer": "s_hidden"}],
        id="a-layer-computing-in-float32-runs-no-float16-kernel",
    ),
]


@pytest.mark.parametrize(("run", "expected"), CASES)
def test_tensor_core_alignment(run, expected):
    assert_findings(findings_of(diagnose(run), RULE), expected)


def test_on_a_keras_model_the_class_count_is_never_asked():
    """A real model's recorded rows: 997-word vocabulary, a 20-wide embedding, a hidden Dense(30),
    5 classes through a float32 softmax: the embedding width and the hidden units are the user's;
    the vocabulary and the class count are not, and no fix mentions them."""
    import keras

    from mpwatch.record.callbacks.layer_dtypes import layer_rows

    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        ids = keras.Input((12,), dtype="int32", name="ids")
        h = keras.layers.Embedding(997, 20, name="emb")(ids)
        h = keras.layers.GlobalAveragePooling1D(name="pool")(h)
        h = keras.layers.Dense(30, activation="relu", name="hidden")(h)
        h = keras.layers.Dense(5, name="head")(h)
        out = keras.layers.Activation("softmax", dtype="float32", name="probs")(h)
        model = keras.Model(ids, out)
    finally:
        keras.mixed_precision.set_global_policy("float32")
    found = findings_of(diagnose(make_run(layers=layer_rows(model), info=run_info())), RULE)
    assert sorted(f.layer for f in found if f.layer) == ["emb", "hidden"]
    text = " ".join(f"{f.title} {f.evidence} {f.fix}" for f in found)
    assert "997" not in text and "units=5" not in text and "units=8" not in text


def test_a_gans_critic_score_and_generated_channels_are_never_asked():
    """A GAN (keras.io's shape: no call() of its own, its train_step runs a critic and a
    generator): the critic's 1-unit score and the generator's 1-channel image are the outputs of
    its sub-models, the task's widths; the hidden Conv2D(12) is the user's. Rows recorded from the
    real model (``layer_rows``)."""
    import keras

    from mpwatch.record.callbacks.layer_dtypes import layer_rows

    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        critic = keras.Sequential([
            keras.Input((8, 8, 1)),
            keras.layers.Conv2D(12, 3, strides=2, padding="same", name="c_conv"),
            keras.layers.GlobalMaxPooling2D(name="c_pool"),
            keras.layers.Dense(1, name="score"),
        ], name="critic")  # fmt: skip
        generator = keras.Sequential([
            keras.Input((16,)),
            keras.layers.Dense(4 * 4 * 16, name="g_dense"),
            keras.layers.Reshape((4, 4, 16), name="g_reshape"),
            keras.layers.Conv2DTranspose(16, 4, strides=2, padding="same", name="g_up"),
            keras.layers.Conv2D(1, 3, padding="same", activation="tanh", name="image"),
        ], name="generator")  # fmt: skip

        class GAN(keras.Model):
            def __init__(self, critic, generator):
                super().__init__()
                self.critic, self.generator = critic, generator

        gan = GAN(critic, generator)
    finally:
        keras.mixed_precision.set_global_policy("float32")
    rows = layer_rows(gan)
    is_output = {r[0]: r[contract.LAYERS_COLUMNS.index("is_output")] for r in rows}
    assert is_output["score"] and is_output["image"]  # each sub-model's output layer
    assert not is_output["c_conv"] and not is_output["g_up"]
    found = findings_of(diagnose(make_run(layers=rows, info=run_info())), RULE)
    assert [f.layer for f in found if f.layer] == ["c_conv"]  # filters=12 -> 16: the user's
    text = " ".join(f"{f.title} {f.evidence} {f.fix}" for f in found)
    assert "units=8" not in text and "filters=8" not in text
