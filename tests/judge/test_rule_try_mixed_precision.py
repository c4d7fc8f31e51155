"""Rule ``try-mixed-precision`` (mpwatch/judge/rules/try_mixed_precision.py) on constructed Runs."""

from __future__ import annotations

import pytest
from builders import assert_findings, findings_of, make_run, model_row, probe_layer, run_info

from mpwatch.judge import diagnose

RULE = "try-mixed-precision"


def _preflight():
    layers = [probe_layer("dense", mx=30000.0), probe_layer("conv2d", mx=10.0)]
    probes = {5: (model_row(uf=0.03, mode="preflight", mx=30000.0), layers)}
    return make_run(policy="float32", probes=probes)


def _v100():
    info = run_info("float32")
    info["device"]["compute_capability"] = "7.0"
    return make_run(policy="float32", info=info)


CASES = [
    pytest.param(
        _preflight(),
        [
            {
                "severity": "info",
                "action": {"policy": "mixed_bfloat16"},  # compute capability 8.0
                "evidence_has": "3.00%",
                "data": {"keep_float32": ["dense"]},
            }
        ],
        id="a100-with-preflight-numbers",
    ),
    pytest.param(
        make_run(policy="float32", info=run_info("float32", tc=False)), [], id="cpu-nothing"
    ),
    pytest.param(_v100(), [{"action": {"policy": "mixed_float16"}}], id="v100-float16"),
    pytest.param(make_run(), [], id="already-mixed"),
]


@pytest.mark.parametrize(("run", "expected"), CASES)
def test_try_mixed_precision(run, expected):
    assert_findings(findings_of(diagnose(run), RULE), expected)
