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
