"""Rule ``profile`` (mpwatch/judge/rules/profile.py) on constructed Runs."""

from __future__ import annotations

import pytest
from builders import (
    assert_findings,
    findings_of,
    layer_rows,
    make_run,
    profile_payload,
    run_info,
)

from mpwatch.judge import diagnose

RULE = "profile"


def _casts_low_16bit_and_a_float32_layer(tc=True):
    prof = profile_payload()  # cast share 20%, 16-bit share 30%
    layers = layer_rows("mixed_float16")
    layers[1][4:6] = ["float32", "float32"]  # dense under a float32 policy
    prof["layers"]["data"][1][3] = 3000.0  # 30% of the time in float32
    return make_run(layers=layers, profile=prof, info=run_info("mixed_float16", tc=tc))


def _clean():
    prof = profile_payload()
    ok = dict(prof, cast_share=0.05, share_16bit=0.9)
    ok["layers"] = {"columns": prof["layers"]["columns"], "data": []}
    return make_run(profile=ok)


CASES = [
    pytest.param(
        _casts_low_16bit_and_a_float32_layer(),
        [
            {"severity": "warning", "title_has": "Cast", "layer": None},
            {"severity": "warning", "title_has": "16 bits", "layer": None},
            # conv2d's float32 time is not flagged: it is mixed already
            {"severity": "info", "layer": "dense"},
        ],
        id="casts-16bit-share-and-a-float32-layer",
    ),
    pytest.param(
        _casts_low_16bit_and_a_float32_layer(tc=False),
        [{"severity": "warning", "title_has": "Cast", "layer": None}],
        id="on-a-cpu-no-advice-to-move-layers-to-16-bits",
    ),
    pytest.param(_clean(), [], id="clean-profile"),
    pytest.param(make_run(), [], id="no-profile"),
]


@pytest.mark.parametrize(("run", "expected"), CASES)
def test_profile(run, expected):
    assert_findings(findings_of(diagnose(run), RULE), expected)
