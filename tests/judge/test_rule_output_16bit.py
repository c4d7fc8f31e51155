"""Rule ``output-16bit`` (mpwatch/judge/rules/output_16bit.py) on constructed Runs."""

from __future__ import annotations

import re

import pytest
from builders import assert_findings, findings_of, layer_rows, make_run, run_info

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
    assert 'keras.layers.Dense(..., dtype="float32"' in f.fix


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
    from mpwatch.record.layer_dtypes import class_modules
    from mpwatch.record.layer_dtypes import layer_rows as real_rows

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

    from mpwatch.record.layer_dtypes import class_modules

    class Doubler(keras.layers.Layer):
        def call(self, x):
            return 2 * x

    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3), Doubler()])
    mods = class_modules(model)
    assert mods["Doubler"] == __name__
    assert mods["Dense"].startswith("keras.")
