"""Rule ``gradient-underflow`` (mpwatch/judge/rules/gradient_underflow.py) on constructed Runs."""

from __future__ import annotations

import pytest
from builders import assert_findings, findings_of, make_run, model_row, probe_layer

from mpwatch import contract
from mpwatch.judge import diagnose

RULE = "gradient-underflow"


def _model_wide(uf):
    return make_run(
        probes={10: (model_row(uf=uf, scale=8.0, rec=2.0**15), [probe_layer("dense", uf=0.0)])}
    )


def _model_wide_expected(uf, severity):
    return [
        {
            "severity": severity,
            "layer": None,
            "fix_has": "initial_scale=32768",
            "action": {"loss_scale": 32768.0},
            "data": {"underflow_fraction": uf},
        }
    ]


CASES = [
    pytest.param(_model_wide(0.005), [], id="model-0.5%-is-fine"),
    pytest.param(_model_wide(0.02), _model_wide_expected(0.02, "warning"), id="model-2%-warning"),
    pytest.param(_model_wide(0.2), _model_wide_expected(0.2, "error"), id="model-20%-error"),
    pytest.param(
        make_run(
            probes={
                10: (model_row(uf=0.0), [probe_layer("dense", uf=0.06), probe_layer("c", uf=0.04)])
            }
        ),
        [{"layer": "dense", "severity": "warning"}],
        id="per-layer-above-5%",
    ),
    pytest.param(
        make_run(scalars={contract.GRAD_SUBNORMAL_FRACTION: {s: 0.2 for s in range(1, 41)}}),
        [{"severity": "info"}],
        id="subnormal-share-without-probe-is-info",
    ),
]


@pytest.mark.parametrize(("run", "expected"), CASES)
def test_gradient_underflow(run, expected):
    assert_findings(findings_of(diagnose(run), RULE), expected)
