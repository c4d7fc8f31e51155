"""Rule ``loss-scale`` (mpwatch/judge/rules/loss_scale.py) on constructed Runs."""

from __future__ import annotations

import pytest
from builders import assert_findings, findings_of, make_run, model_row, probe_layer

from mpwatch import contract
from mpwatch.judge import diagnose

RULE = "loss-scale"
STEPS = range(1, 401)


def _at_256(**model):
    probes = {400: (model_row(scale=2.0**8, **model), [probe_layer("dense")])}
    return make_run(scalars={contract.LOSS_SCALE: {s: 2.0**8 for s in STEPS}}, probes=probes)


CASES = [
    pytest.param(
        make_run(scalars={contract.LOSS_SCALE: {s: (1.0 if s > 50 else 1024.0) for s in STEPS}}),
        [{"severity": "error", "data": {"median_scale": 1.0}}],
        id="stuck-low",
    ),
    pytest.param(
        _at_256(uf=0.05, rec=2.0**14),
        [{"severity": "warning", "data": {"log2_ratio": -6}, "evidence_has": "5.00%"}],
        id="far-below-recommended-while-losing-gradients",
    ),
    # far below, but float16 loses nothing at the scale used: the dynamic scale will grow, info
    pytest.param(_at_256(uf=0.0, rec=2.0**14), [{"severity": "info"}], id="far-below-losing-none"),
    # 3 doublings: below the threshold of 4
    pytest.param(_at_256(rec=2.0**11), [], id="3-doublings-is-not-far"),
]


@pytest.mark.parametrize(("run", "expected"), CASES)
def test_loss_scale(run, expected):
    assert_findings(findings_of(diagnose(run), RULE), expected)
