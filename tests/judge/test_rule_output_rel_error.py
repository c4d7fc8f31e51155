"""Rule ``output-rel-error`` (mpwatch/judge/rules/output_rel_error.py) on constructed Runs."""

from __future__ import annotations

import pytest
from builders import assert_findings, findings_of, make_run, model_row, probe_layer

from mpwatch.judge import diagnose

RULE = "output-rel-error"


def three_layers():
    """dense over float16's threshold; layer_norm far over it, but it computes in float32 inside;
    conv2d under it."""
    layers = [
        probe_layer("dense", rel=0.02),
        probe_layer("layer_norm", rel=0.9),
        probe_layer("conv2d", rel=0.001),
    ]
    return make_run(probes={10: (model_row(), layers)})


CASES = [
    pytest.param(
        three_layers(),
        [{"layer": "dense", "severity": "warning", "action": {"dtype": "float32"}}],
        id="above-threshold-not-float32-inside",
    ),
    pytest.param(
        make_run(
            policy="mixed_bfloat16",
            probes={10: (model_row(mode="bfloat16"), [probe_layer("dense", rel=0.03)])},
        ),
        [],
        id="bfloat16-threshold-is-looser",
    ),
]


@pytest.mark.parametrize(("run", "expected"), CASES)
def test_output_rel_error(run, expected):
    assert_findings(findings_of(diagnose(run), RULE), expected)
