"""Rule ``float32-inside`` (mpwatch/judge/rules/float32_inside.py) on constructed Runs."""

from __future__ import annotations

import pytest
from builders import assert_findings, findings_of, make_run, model_row, probe_layer

from mpwatch.judge import diagnose

RULE = "float32-inside"


def three_layers():
    """layer_norm (LayerNormalization, float32 inside) far over the output error threshold, dense
    over it, conv2d under it (as in test_rule_output_rel_error)."""
    layers = [
        probe_layer("dense", rel=0.02),
        probe_layer("layer_norm", rel=0.9),
        probe_layer("conv2d", rel=0.001),
    ]
    return make_run(probes={10: (model_row(), layers)})


CASES = [
    pytest.param(
        three_layers(),
        [{"severity": "info", "data": {"layers": ["layer_norm"]}}],
        id="layer-norm-listed-once",
    ),
    pytest.param(make_run(policy="float32"), [], id="float32-policy-nothing-inside"),
]


@pytest.mark.parametrize(("run", "expected"), CASES)
def test_float32_inside(run, expected):
    assert_findings(findings_of(diagnose(run), RULE), expected)


def test_never_a_float32_action_for_a_layer_that_computes_in_float32_inside():
    found = diagnose(three_layers())
    assert not [f for f in found if f.layer == "layer_norm" and f.action.get("dtype")]


def _mobilenet_like(n_bn=52, n_ln=1):
    """n_bn BatchNormalization and n_ln LayerNormalization layers under mixed_float16 between
    convolutions (MobileNetV2 has 52 BatchNormalization layers)."""
    rows = []
    for i in range(n_bn):
        rows.append([f"conv_{i}", f"m/conv_{i}", "Conv2D", 1, "mixed_float16", "float16",
                     "float32", "float16", "float16", 100, 100, {"filters": 32}, True, False,
                     None])  # fmt: skip
        rows.append([f"bn_{i}", f"m/bn_{i}", "BatchNormalization", 1, "mixed_float16", "float16",
                     "float32", "float16", "float32", 128, 64, {}, None, False,
                     "normalises in float32 inside"])  # fmt: skip
    for i in range(n_ln):
        rows.append([f"ln_{i}", f"m/ln_{i}", "LayerNormalization", 1, "mixed_float16",
                     "float16", "float32", "float16", "float32", 64, 64, {}, None, False,
                     "normalises in float32 inside"])  # fmt: skip
    return make_run(layers=rows)


def test_many_normalization_layers_are_one_short_line():
    found = findings_of(diagnose(_mobilenet_like()), RULE)
    assert len(found) == 1
    f = found[0]
    assert f.title == (
        "52 BatchNormalization and 1 LayerNormalization layers compute in float32 inside: "
        "nothing to change"
    )
    assert f.data["by_class"] == {"BatchNormalization": 52, "LayerNormalization": 1}
    assert f.data["layers"] == [f"bn_{i}" for i in range(52)] + ["ln_0"]  # every name, in order
    assert "and 49 more" in f.evidence and len(f.evidence) < 250  # three names per class shown


def test_one_class_is_named_in_the_title():
    f = findings_of(diagnose(_mobilenet_like(53, 0)), RULE)[0]
    assert f.title.startswith("53 BatchNormalization layers compute in float32 inside")
