"""Rule ``tensor-core-alignment`` (mpwatch/judge/rules/tensor_core_alignment.py) on constructed
Runs."""

from __future__ import annotations

import pytest
from builders import assert_findings, findings_of, make_run, model_row, probe_layer, run_info

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


@pytest.mark.parametrize(("run", "expected"), CASES)
def test_tensor_core_alignment(run, expected):
    assert_findings(findings_of(diagnose(run), RULE), expected)
