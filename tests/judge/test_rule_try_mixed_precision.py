"""Rule ``try-mixed-precision`` (mpwatch/judge/rules/try_mixed_precision.py) on constructed Runs."""

from __future__ import annotations

import pytest
from builders import assert_findings, findings_of, make_run, model_row, probe_layer, run_info

from mpwatch.judge import diagnose

RULE = "try-mixed-precision"


def _preflight_probes():
    """A pre-flight probe (a mixed_float16 twin of the float32 model): 3% of gradient values
    would underflow at 2^15; 'dense' peaks at 30000 (within 3 doublings of 65504)."""
    layers = [probe_layer("dense", mx=30000.0), probe_layer("conv2d", mx=10.0)]
    return {5: (model_row(uf=0.03, mode="preflight", mx=30000.0), layers)}


def _preflight():
    return make_run(policy="float32", probes=_preflight_probes())  # an A100 (8.0)


def _gpu(cc, name="Tesla V100", preflight=False):
    info = run_info("float32")
    info["device"] = {"type": "GPU", "name": name, "compute_capability": cc,
                      "tensor_cores": float(cc) >= 7.0}  # fmt: skip
    return make_run(policy="float32", info=info, probes=_preflight_probes() if preflight else None)


CASES = [
    pytest.param(
        _preflight(),
        [
            {
                "severity": "info",
                "action": {"policy": "mixed_bfloat16"},  # compute capability 8.0
                # float16's predictions are not bfloat16's evidence, only the alternative's
                "data": {"keep_float32": [], "float16_keep_float32": ["dense"]},
                "evidence_has": "bfloat16 has float32's range",
                "fix_has": "mixed_float16 instead (not needed here): pre-flight at step 5: 3.00%",
            }
        ],
        id="a100-bfloat16-without-float16-evidence",
    ),
    pytest.param(
        _gpu("7.0", preflight=True),
        [
            {
                "action": {"policy": "mixed_float16"},
                "evidence_has": "3.00%",
                "data": {"keep_float32": ["dense"]},
                "fix_has": "keep 'dense' float32",
            }
        ],
        id="v100-float16-with-the-preflight-numbers",
    ),
    pytest.param(_gpu("7.0"), [{"action": {"policy": "mixed_float16"}}], id="v100-float16"),
    pytest.param(
        make_run(policy="float32", info=run_info("float32", tc=False)), [], id="cpu-nothing"
    ),
    pytest.param(_gpu("6.1", "Tesla P100", preflight=True), [], id="pascal-gpu-nothing"),
    pytest.param(make_run(), [], id="already-mixed"),
]


@pytest.mark.parametrize(("run", "expected"), CASES)
def test_try_mixed_precision(run, expected):
    assert_findings(findings_of(diagnose(run), RULE), expected)


def test_bfloat16_advice_cites_no_float16_number_as_its_evidence():
    (f,) = findings_of(diagnose(_preflight()), RULE)
    assert "underflow" not in f.evidence and "65504" not in f.evidence
    assert "3.00%" not in f.evidence
