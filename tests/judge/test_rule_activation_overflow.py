"""Rule ``activation-overflow`` (mpwatch/judge/rules/activation_overflow.py) on constructed Runs."""

from __future__ import annotations

import pytest
from builders import assert_findings, findings_of, make_run, model_row, probe_layer

from mpwatch.judge import diagnose

RULE = "activation-overflow"
INF = float("inf")


def _probed(mx, nonfinite=False, **model):
    probes = {10: (model_row(mx=mx, **model), [probe_layer("dense", mx=mx, nonfinite=nonfinite)])}
    return make_run(probes=probes)


CASES = [
    pytest.param(
        _probed(65504 * 2),
        [{"severity": "error", "layer": "dense", "data": {"max_abs_activation": 65504 * 2}}],
        id="above-65504-is-an-error",
    ),
    pytest.param(
        _probed(INF, nonfinite=True),
        [{"severity": "error", "layer": "dense"}],
        id="non-finite-is-an-error",
    ),
    pytest.param(
        _probed(65504 / 4),
        [{"severity": "warning", "layer": "dense", "data": {"max_abs_activation": 65504 / 4}}],
        id="within-3-doublings-is-a-warning",
    ),
    pytest.param(_probed(65504 / 16), [], id="4-doublings-of-headroom-is-fine"),
    pytest.param(
        make_run(probes={10: (model_row(first="dense"), [probe_layer("dense", mx=INF)])}),
        [{"severity": "error", "layer": "dense", "title_has": "first"}],
        id="first-nonfinite-layer-named-once",
    ),
    pytest.param(_probed(1e6, mode="bfloat16"), [], id="bfloat16-probe-not-checked-against-65504"),
]


@pytest.mark.parametrize(("run", "expected"), CASES)
def test_activation_overflow(run, expected):
    assert_findings(findings_of(diagnose(run), RULE), expected)
