"""Rule ``output-16bit`` (mpwatch/judge/rules/output_16bit.py) on constructed Runs."""

from __future__ import annotations

import pytest
from builders import assert_findings, findings_of, layer_rows, make_run

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
