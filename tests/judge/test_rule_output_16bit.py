"""Rule ``output-16bit`` (mpwatch/judge/rules/output_16bit.py) on constructed Runs."""

from __future__ import annotations

import re

import pytest
from builders import assert_findings, findings_of, graph_row, layer_rows, make_run, run_info

from mpwatch import contract
from mpwatch.judge import diagnose

RULE = "output-16bit"


def _bfloat16_without_is_output():
    rows = layer_rows("mixed_bfloat16")
    for r in rows:
        r[13] = False  # no layer marked as the output: the last one is
    return make_run(policy="mixed_bfloat16", layers=rows)


def _nested_model():
    rows = layer_rows("mixed_float16")
    rows.append(
        [
            "inner",
            "inner",
            "Functional",
            0,
            "mixed_float16",
            "float16",
            "float32",
            "float16",
            "float16",
            650,
            650,
            {},
            None,
            True,
            None,
        ]
    )
    return make_run(layers=rows)


CASES = [
    pytest.param(
        make_run(),
        [
            {
                "severity": "error",
                "layer": "predictions",
                "fix_has": 'dtype="float32"',
                "action": {"dtype": "float32", "output": True},
                "title_has": "float16",
            }
        ],
        id="float16-output-is-an-error-with-the-fix",
    ),
    pytest.param(
        _bfloat16_without_is_output(),
        [{"layer": "predictions", "severity": "warning"}],
        id="last-layer-without-is_output-bfloat16-is-a-warning",
    ),
    pytest.param(
        make_run(layers=layer_rows("mixed_float16", output_dtype="float32")),
        [],
        id="float32-output-after-float16-compute-is-fine",
    ),
    pytest.param(_nested_model(), [{"layer": "predictions"}], id="nested-model-names-inner-layer"),
]


@pytest.mark.parametrize(("run", "expected"), CASES)
def test_output_16bit(run, expected):
    assert_findings(findings_of(diagnose(run), RULE), expected)


# --- fixes written as the user's code (issue 17) --------------------------------------------------
def _app_run(model_name, path_prefix, nested_class="Functional", layer="predictions",
             root_class="Functional"):  # fmt: skip
    """A keras.applications-shaped model: its classifier ``layer`` (Dense, float16 softmax) under
    ``path_prefix``; a nested model's row (class ``nested_class``) when the prefix is nested."""
    rows = [["conv1_conv", f"{path_prefix}/conv1_conv", "Conv2D", 1, "mixed_float16", "float16",
             "float32", "float16", "float16", 9472, 9472, {"filters": 64}, True, False, None],
            [layer, f"{path_prefix}/{layer}", "Dense", 1, "mixed_float16", "float16", "float32",
             "float16", "float16", 20490, 20490, {"units": 10}, False, True, None]]  # fmt: skip
    parts = path_prefix.split("/")
    if len(parts) > 1:
        rows.insert(0, [parts[-1], path_prefix, nested_class, 1, "mixed_float16", "float16",
                        "float32", "float16", "float16", 29962, 29962, {}, None,
                        nested_class == "Functional", None])  # fmt: skip
    info = run_info("mixed_float16")
    info["model"] = {"name": parts[0], "class": root_class, "kind": "functional", "params": 1}
    run = make_run(layers=rows, info=info)
    run.records[contract.KIND_LAYERS] = [
        (1, {"layers": {}, "class_modules": {"Dense": "keras.src.layers.core.dense"}})
    ]
    return run


APP_FIX = (
    "keras.applications.{app}(..., classifier_activation=None)",
    'keras.layers.Activation("softmax", dtype="float32")(model.output)',
    "apply_recommendations",
)


@pytest.mark.parametrize(
    ("run", "app"),
    [
        pytest.param(_app_run("resnet50", "resnet50"), "ResNet50", id="resnet50"),
        pytest.param(
            _app_run("mobilenetv2", "sequential/mobilenetv2_1.00_96", root_class="Sequential"),
            "MobileNetV2",
            id="nested-mobilenetv2",
        ),
        pytest.param(
            _app_run("convnext", "convnext_tiny", layer="convnext_tiny_head_dense"),
            "ConvNeXtTiny",
            id="convnext-head",
        ),
    ],
)
def test_a_keras_applications_classifier_is_fixed_through_the_builder(run, app):
    (f,) = findings_of(diagnose(run), RULE)
    assert f.severity == "error" and f.data["application"] == app
    for part in APP_FIX:
        assert part.format(app=app) in f.fix, (part, f.fix)
    assert f"it is the classifier of keras.applications.{app}" in f.evidence
    assert "keras.layers.Dense(" not in f.fix
    # its first form sets the classifier in place, through the models its path names: what
    # apply_recommendations does (the whole layer in float32)
    path = run.layers.set_index("name")["path"][f.layer].split("/")
    getter = "model" + "".join(f'.get_layer("{p}")' for p in path[1:])
    assert f.fix.split("\n")[1].startswith(f'{getter}.dtype_policy = "float32"'), f.fix


@pytest.mark.parametrize(
    "run",
    [
        pytest.param(_app_run("my_net", "my_net"), id="the-users-own-model"),
        pytest.param(_app_run("resnet50", "resnet50", layer="head"), id="another-layer-name"),
        pytest.param(_app_run("x", "x/resnet50", nested_class="Dense"), id="parent-is-not-a-model"),
    ],
)
def test_other_models_get_the_layer_fix(run):
    (f,) = findings_of(diagnose(run), RULE)
    assert f.data["application"] is None
    assert 'keras.layers.Dense(10, ..., dtype="float32"' in f.fix  # its units, as recorded
    assert "softmax" not in f.fix  # an older record does not say its activation: none is made up


def test_a_custom_output_class_is_named_as_the_user_names_it():
    rows = layer_rows("mixed_float16")
    rows[3][2] = "ScaledSoftmax"
    run = make_run(layers=rows)
    mods = {"ScaledSoftmax": "my_project.layers", "Dense": "keras.src.layers.core.dense"}
    run.records[contract.KIND_LAYERS] = [(1, {"layers": {}, "class_modules": mods})]
    (f,) = findings_of(diagnose(run), RULE)
    assert f.fix.startswith('ScaledSoftmax(..., dtype="float32", name="predictions")')
    assert "keras.layers.ScaledSoftmax" not in f.fix


def test_application_names_match_keras_applications_builders():
    """Ground truth from Keras itself: each builder's default model name (its ``name`` argument;
    MobileNet and MobileNetV2 compose theirs from alpha and the input size) is recognised as that
    builder, and a real MobileNetV2's classifier (built here, weights=None) is named so."""
    import inspect

    import keras

    from mpwatch.judge.rule import APPLICATIONS, application_of
    from mpwatch.record.callbacks.layer_dtypes import class_modules
    from mpwatch.record.callbacks.layer_dtypes import layer_rows as real_rows

    def recognised(model_name):
        for pattern, builder, _head in APPLICATIONS:
            m = re.fullmatch(pattern, model_name)
            if m:
                return builder(m)
        return None

    checked = 0
    for fn_name in dir(keras.applications):
        mod = getattr(keras.applications, fn_name)
        if not inspect.ismodule(mod):
            continue
        for builder in dir(mod):
            fn = getattr(mod, builder)
            if not (builder[0].isupper() and inspect.isfunction(fn)):
                continue
            params = inspect.signature(fn).parameters
            if "classifier_activation" not in params or "name" not in params:
                continue
            default = params["name"].default
            if isinstance(default, str):
                assert recognised(default) == builder, (builder, default)
                checked += 1
    assert checked >= 30

    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        model = keras.applications.MobileNetV2(
            input_shape=(32, 32, 3), alpha=0.35, weights=None, classes=10
        )
    finally:
        keras.mixed_precision.set_global_policy("float32")
    assert model.name == "mobilenetv2_0.35_32"
    info = run_info("mixed_float16")
    info["model"] = {"name": model.name, "class": "Functional", "kind": "functional", "params": 1}
    run = make_run(layers=real_rows(model), info=info)
    mods = class_modules(model)
    run.records[contract.KIND_LAYERS] = [(1, {"layers": {}, "class_modules": mods})]
    assert application_of(run, "predictions") == "MobileNetV2"
    assert all(m.startswith("keras.") for m in mods.values())
    (f,) = findings_of(diagnose(run), RULE)
    assert f.layer == "predictions" and "keras.applications.MobileNetV2(" in f.fix


def test_class_modules_tell_the_users_class_from_keras():
    import keras

    from mpwatch.record.callbacks.layer_dtypes import class_modules

    class Doubler(keras.layers.Layer):
        def call(self, x):
            return 2 * x

    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3), Doubler()])
    mods = class_modules(model)
    assert mods["Doubler"] == __name__
    assert mods["Dense"].startswith("keras.")


# --- fixes from the layer's real activation and units (issue 24) ---------------------------------
def _out_run(cls, act, width, dims=None, old=False):
    """A hidden Dense, then the float16 output ``out`` (class ``cls``, its activation and width
    as a layers record writes them; ``old``: a record written before the graph columns)."""
    rows = [
        graph_row("hidden", dims={"units": 16}, act="relu", width=16, inputs=["x"]),
        graph_row("out", cls, act=act, width=width, dims=dims, out=True, inputs=["hidden"]),
    ]
    run = make_run(layers=rows)
    if old:
        run.layers = run.layers.drop(columns=contract.LAYERS_GRAPH_COLUMNS)
    mods = {"Dense": "keras.src.layers.core.dense", cls: "keras.src.layers"}
    if cls == "MyHead":
        mods[cls] = "my_project.layers"
    run.records[contract.KIND_LAYERS] = [(1, {"layers": {}, "class_modules": mods})]
    return run


FIX_CASES = [
    pytest.param(
        _out_run("Dense", "sigmoid", 1, {"units": 1}),
        ('keras.layers.Dense(1, ..., activation="sigmoid", dtype="float32", name="out")',
         'x = keras.layers.Dense(1, ..., activation=None, name="out_logits")(x)',
         'outputs = keras.layers.Activation("sigmoid", dtype="float32", name="out")(x)'),
        id="one-unit-sigmoid-gets-sigmoid",
    ),
    pytest.param(
        _out_run("Dense", "linear", 1, {"units": 1}),
        ('keras.layers.Dense(1, ..., dtype="float32", name="out")  # a linear output',),
        id="regression-output-gets-no-activation",
    ),
    pytest.param(
        _out_run("Dense", "softmax", 10, {"units": 10}),
        ('keras.layers.Dense(10, ..., activation="softmax", dtype="float32", name="out")',
         'outputs = keras.layers.Activation("softmax", dtype="float32", name="out")(x)'),
        id="softmax-classifier-gets-softmax",
    ),
    pytest.param(
        _out_run("Conv2D", "sigmoid", 1, {"filters": 1}),
        ('keras.layers.Conv2D(1, ..., activation="sigmoid", dtype="float32", name="out")',
         "apply sigmoid in float32"),
        id="segmentation-conv-gets-its-filters-and-sigmoid",
    ),
    pytest.param(
        _out_run("Activation", "sigmoid", 1),
        ('keras.layers.Activation("sigmoid", dtype="float32", name="out")',),
        id="an-activation-layer-keeps-its-activation",
    ),
    pytest.param(
        _out_run("Softmax", "softmax", 10),
        ('keras.layers.Softmax(..., dtype="float32", name="out")',),
        id="a-softmax-layer",
    ),
    pytest.param(
        _out_run("Dense", "my_swish", 4, {"units": 4}),
        ("activation=my_swish, dtype", "keras.layers.Activation(my_swish, dtype="),
        id="the-users-activation-function-by-its-name",
    ),
    pytest.param(
        _out_run("LSTM", "tanh", 3, {"units": 3}),
        ('keras.layers.LSTM(..., dtype="float32", name="out")',),
        id="a-recurrent-output-is-the-layer-itself",
    ),
    pytest.param(
        _out_run("MyHead", None, 2),
        ('MyHead(..., dtype="float32", name="out")', "its __init__ must pass **kwargs"),
        id="the-users-class",
    ),
    pytest.param(
        _out_run("Dense", None, None, {"units": 1}, old=True),
        ('keras.layers.Dense(1, ..., dtype="float32", name="out")',
         "Activation(<its activation>"),
        id="older-record-without-the-activation",
    ),
]  # fmt: skip


@pytest.mark.parametrize(("run", "wanted"), FIX_CASES)
def test_the_fix_is_written_from_the_layers_activation_and_units(run, wanted):
    (f,) = findings_of(diagnose(run), RULE)
    for part in wanted:
        assert part in f.fix, (part, f.fix)
    act = run.layers.set_index("name").get("activation", {}).get("out")
    if act != "softmax":  # never a softmax the model did not have
        assert "softmax" not in f.fix.lower(), f.fix
    if act == "linear" or act is None or act == "tanh":
        assert "keras.layers.Activation(" not in f.fix.replace("keras.layers.Activation(<", "")
    assert "apply_recommendations" in f.fix


def test_a_softmax_over_one_unit_is_named_in_the_evidence():
    (f,) = findings_of(diagnose(_out_run("Dense", "softmax", 1, {"units": 1})), RULE)
    assert "a softmax over one unit is always 1.0" in f.evidence
    assert f.data["activation"] == "softmax"


@pytest.mark.parametrize(
    ("act", "wanted", "absent"),
    [
        ("sigmoid", 'keras.layers.Activation("sigmoid", dtype="float32")(model.output)', "softmax"),
        ("linear",
         '''get_layer("predictions").dtype_policy = "float32"  # its 'predictions' Dense''',
         "Activation("),
        ("softmax", 'keras.layers.Activation("softmax", dtype="float32")(model.output)', "default"),
    ],
)
def test_a_keras_applications_classifier_gets_its_recorded_activation(act, wanted, absent):
    run = _app_run("resnet50", "resnet50")  # conv1_conv, then predictions
    graph = {"activation": ["relu", act], "output_width": [64, 10]}
    run.layers = run.layers.assign(**graph, inputs=[["input_layer"], ["conv1_conv"]])
    (f,) = findings_of(diagnose(run), RULE)
    assert wanted in f.fix and absent not in f.fix, f.fix


def _fix_lines(fix):
    """The fix's code lines, runnable: comments cut, ``...`` (the user's other arguments) left
    out."""
    out = []
    for line in fix.splitlines():
        code = line.split("  #")[0].rstrip()
        if code and not code.startswith("#"):
            out.append(code.replace(", ...", "").replace("(..., ", "("))
    return out


@pytest.mark.parametrize(("act", "units"), [("sigmoid", 1), ("linear", 1), ("softmax", 5)])
def test_the_fix_applied_to_a_keras_model_does_what_it_says(act, units):
    """A real mixed_float16 model with a float16 output: the recorded rows give the finding; each
    code line of its fix, run as written, gives a float32 output equal to the float32 model's
    (the output's own activation, not a constant 1.0)."""
    import keras
    import numpy as np

    from mpwatch.record.callbacks.layer_dtypes import class_modules
    from mpwatch.record.callbacks.layer_dtypes import layer_rows as real_rows

    def build(policy_name):
        keras.mixed_precision.set_global_policy(policy_name)
        try:
            x = keras.Input((6,), name="x")
            h = keras.layers.Dense(16, activation="relu", name="hidden")(x)
            return keras.Model(x, keras.layers.Dense(units, activation=act, name="out")(h))
        finally:
            keras.mixed_precision.set_global_policy("float32")

    model, twin = build("mixed_float16"), build("float32")
    twin.set_weights([np.random.default_rng(i).normal(0, 0.5, w.shape).astype("float32")
                      for i, w in enumerate(twin.get_weights())])  # fmt: skip
    model.set_weights(twin.get_weights())
    data = np.random.default_rng(9).normal(0, 1, (32, 6)).astype("float32")
    want = np.asarray(twin(data))
    run = make_run(layers=real_rows(model))
    run.records[contract.KIND_LAYERS] = [(1, {"layers": {}, "class_modules": class_modules(model)})]
    (f,) = findings_of(diagnose(run), RULE)
    assert f.data["activation"] == act
    lines = _fix_lines(f.fix)
    hidden = model.get_layer("hidden")
    # the layer itself in float32 (first line)
    layer = eval(lines[0], {"keras": keras})  # noqa: S307  (the fix, as written)
    inp = keras.Input((6,))
    fixed = keras.Model(inp, layer(hidden(inp)))
    layer.set_weights(model.get_layer("out").get_weights())
    models = [fixed]
    if act != "linear":  # its matmul in 16 bits, its own activation in float32 after it
        assert len([ln for ln in lines if ln.startswith(("x = ", "outputs = "))]) == 2
        inp = keras.Input((6,))
        ns = {"keras": keras, "x": hidden(inp)}
        for ln in lines:
            if ln.startswith(("x = ", "outputs = ")):
                exec(ln, ns)  # noqa: S102  (the fix, as written)
        split = keras.Model(inp, ns["outputs"])
        split.get_layer("out_logits").set_weights(model.get_layer("out").get_weights())
        assert split.layers[-1].name == "out"  # the output keeps its name (loss dicts)
        models.append(split)
    else:
        assert not any("Activation(" in ln for ln in lines)
    for m in models:
        got = np.asarray(m(data))
        assert m.outputs[0].dtype == "float32" and got.dtype == np.float32
        np.testing.assert_allclose(got, want, rtol=2e-2, atol=2e-2)
        assert not np.allclose(got, 1.0)  # not a constant 1.0
        assert got.std() > 1e-3
    if act == "sigmoid":  # what the old advice did: a softmax over the one sigmoid unit
        old = keras.layers.Activation("softmax", dtype="float32")(model.output)
        assert np.all(np.asarray(keras.Model(model.input, old)(data)) == 1.0)


# --- an output that passes on the activation before it (keras.io's captcha OCR CTCLayer) --------
def _passing_run(out_dtype="float16", hidden_act="softmax", out_params=0, reshape=False):
    """hidden (Dense, ``hidden_act``, float16) [-> reshape, weightless] -> out (the user's loss
    layer: ``out_params`` weights, no activation, ``out_dtype``), as a layers record writes them."""
    rows = [graph_row("probs", act=hidden_act, width=20, dims={"units": 20}, inputs=["x"])]
    feed = "probs"
    if reshape:
        rows.append(graph_row("flat", "Reshape", width=20, inputs=["probs"], params=0))
        feed = "flat"
    rows.append(graph_row("ctc_loss", "CTCLayer", width=20, out=True, inputs=["label", feed],
                          dtype=out_dtype, params=out_params))  # fmt: skip
    run = make_run(layers=rows)
    mods = {"Dense": "keras.src.layers.core.dense", "Reshape": "keras.src.layers",
            "CTCLayer": "ocr.layers"}  # fmt: skip
    run.records[contract.KIND_LAYERS] = [(1, {"layers": {}, "class_modules": mods})]
    return run


def test_a_weightless_output_names_the_softmax_it_passes_on():
    (f,) = findings_of(diagnose(_passing_run()), RULE)
    assert f.severity == "error" and f.layer == "ctc_loss"
    assert "passes on the softmax of 'probs'" in f.title
    assert "'probs' (Dense, softmax, width 20, output dtype float16)" in f.evidence
    dense = 'keras.layers.Dense(20, ..., activation="softmax", dtype="float32", name="probs")'
    assert dense in f.fix
    assert 'CTCLayer(..., dtype="float32", name="ctc_loss")' in f.fix
    assert f.action == {"dtype": "float32", "output": True, "float32_layers": ["probs"]}
    assert f.data["passed_on"] == ["probs"]


def test_a_float32_pass_through_after_a_float16_softmax_is_still_found():
    """The old fix applied (only the output layer float32): the softmax is still float16."""
    (f,) = findings_of(diagnose(_passing_run(out_dtype="float32")), RULE)
    assert f.severity == "error" and "takes the softmax of 'probs'" in f.title
    assert "CTCLayer(" not in f.fix  # already float32: nothing to change there
    assert 'name="probs"' in f.fix


def test_the_layers_between_the_activation_and_the_output_are_kept_float32_too():
    (f,) = findings_of(diagnose(_passing_run(reshape=True)), RULE)
    assert "through 'flat'" in f.evidence
    assert f.action["float32_layers"] == ["probs", "flat"]
    fix = f.fix
    assert fix.index('name="probs"') < fix.index('name="flat"') < fix.index('name="ctc_loss"')


@pytest.mark.parametrize(
    ("kwargs", "title"),
    [
        ({"out_params": 40}, "Model output 'ctc_loss' (CTCLayer) is computed in float16"),
        ({"hidden_act": "relu"}, "Model output 'ctc_loss' (CTCLayer) is computed in float16"),
        ({"hidden_act": "relu", "out_dtype": "float32"}, None),
        ({"out_params": 40, "out_dtype": "float32"}, None),
    ],
    ids=["output-with-weights", "no-saturating-activation", "float32-after-relu",
         "float32-output-with-weights"],
)  # fmt: skip
def test_only_a_weightless_output_after_a_saturating_activation_is_looked_through(kwargs, title):
    found = findings_of(diagnose(_passing_run(**kwargs)), RULE)
    assert [f.title for f in found] == ([title + ": keep it float32"] if title else [])


def test_the_pass_through_fix_applied_to_a_real_model_keeps_the_probabilities_float32(policy):
    """A real mixed_float16 model whose output layer adds a log-likelihood loss and passes its
    input on, and the same model with only that layer float32 (the old fix): the finding from
    each one's recorded rows, applied (apply_recommendations), gives float32 probabilities (numpy's
    softmax of its own hidden layer, the tiny ones float16 flushes to 0 kept); before, they are
    float16 values, off the float32 model's."""
    import keras
    import numpy as np

    import mpwatch
    from mpwatch.record.callbacks.layer_dtypes import class_modules
    from mpwatch.record.callbacks.layer_dtypes import layer_rows as real_rows

    class NllPass(keras.layers.Layer):
        def call(self, p):
            self.add_loss(-keras.ops.mean(keras.ops.log(keras.ops.cast(p, "float32") + 1e-7)))
            return p

    def build(policy_name, out_dtype=None):
        with policy(policy_name):
            x = keras.Input((6,), name="x")
            h = keras.layers.Dense(16, activation="relu", name="hidden")(x)
            p = keras.layers.Dense(5, activation="softmax", name="probs")(h)
            kw = {"dtype": out_dtype} if out_dtype else {}
            return keras.Model(x, NllPass(name="nll", **kw)(p))

    model, twin, old = build("mixed_float16"), build("float32"), build("mixed_float16", "float32")
    twin.set_weights([np.random.default_rng(i).normal(0, 2.0, w.shape).astype("float32")
                      for i, w in enumerate(twin.get_weights())])  # fmt: skip
    model.set_weights(twin.get_weights())
    old.set_weights(twin.get_weights())
    data = np.random.default_rng(9).normal(0, 1, (64, 6)).astype("float32")
    want = np.asarray(twin(data))
    for m, verb in ((model, "passes on"), (old, "takes")):
        run = make_run(layers=real_rows(m))
        run.records[contract.KIND_LAYERS] = [(1, {"layers": {}, "class_modules": class_modules(m)})]
        (f,) = findings_of(diagnose(run), RULE)
        assert f.data["passed_on"] == ["probs"], f
        got_before = np.asarray(m(data))
        # float16 values (the softmax computed in float16), off the float32 model's
        assert np.array_equal(got_before, got_before.astype(np.float16).astype(got_before.dtype))
        assert np.abs(got_before.astype(np.float32) - want).max() > 1e-4
        fixed = mpwatch.apply_recommendations(m, [f]).model
        assert {fixed.get_layer(n).dtype_policy.name for n in ("probs", "nll")} == {"float32"}
        got = np.asarray(fixed(data))
        assert got.dtype == np.float32
        # numpy's softmax, in float64, of the fixed model's own float16 hidden layer
        hid = np.asarray(keras.Model(fixed.input, fixed.get_layer("hidden").output)(data))
        w, b = (np.asarray(v, np.float64) for v in fixed.get_layer("probs").get_weights())
        logits = hid.astype(np.float64) @ w + b
        e = np.exp(logits - logits.max(axis=1, keepdims=True))
        ref = e / e.sum(axis=1, keepdims=True)
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-30)
        tiny = (ref > 1e-30) & (ref < 2.0**-25)  # what float16 flushes to 0 (not one float16)
        assert tiny.any() and np.all(got[tiny] > 0)
        assert f"{verb} the softmax of 'probs', computed in float16" in f.title


@pytest.mark.parametrize(
    "loss, skips, severity",
    [
        (0.6932, {}, "info"),  # 0.03% from float32's 0.6930: no measurable effect
        (0.7277, {}, "error"),  # 5%: harm measured
        (0.6932, {s: 1.0 if s in (120, 180) else 0.0 for s in range(1, 201)}, "error"),
    ],
    ids=["loss-within-0.1%-info", "loss-5%-off-error", "skips-of-its-own-error"],
)
def test_severity_follows_the_measured_effect(loss, skips, severity):
    """A float16 sigmoid output where float32 changed the probe's loss by 0.03% was an ERROR.
    An error is measured harm: the whole 16-bit model's probe loss off float32's by more than
    0.1%, or steps skipped for the model's own overflow after the scale's descent."""
    from builders import model_row, probe_layer

    from mpwatch.judge.rules.output_16bit import LOSS_EFFECT_INFO

    model = {**model_row(), "loss": loss, "ref_loss": 0.6930}
    scalars = {contract.STEP_SKIPPED: skips} if skips else None
    run = make_run(layers=layer_rows("mixed_float16"), probes={100: (model, [probe_layer("d")])},
                   scalars=scalars)  # fmt: skip
    run.probe_model["reliable"] = True
    (f,) = findings_of(diagnose(run), RULE)
    assert f.severity == severity
    change = abs(loss - 0.6930) / 0.6930
    said = f"within {change:.2%} of float32's" in f.evidence
    assert said == (severity == "info") and (change <= LOSS_EFFECT_INFO or not said)


def test_a_keras_applications_classifier_that_is_an_activation_is_set_whole():
    """MobileNetV3's classifier is an Activation of its own (named predictions, after a Conv2D
    and a Flatten): its fix is that layer in float32, in place, with no matmul to speak of and no
    split form (classifier_activation=None and a float32 Activation would be the same change)."""
    run = _app_run("MobileNetV3Small", "MobileNetV3Small")
    run.layers = run.layers.assign(
        **{"class": ["Conv2D", "Activation"], "activation": ["linear", "softmax"]}
    )
    (f,) = findings_of(diagnose(run), RULE)
    code = f.fix.split("\n")
    assert code[0].startswith("model = keras.applications.MobileNetV3Small(...)")
    want = 'model.get_layer("predictions").dtype_policy = "float32"  # its softmax in float32'
    assert code[1] == want
    assert "matmul" not in f.fix and "classifier_activation" not in f.fix
    assert code[-1] == "model = mpwatch.apply_recommendations(model, findings).model"
