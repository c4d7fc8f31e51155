"""Rule ``recording`` (mpwatch/judge/rules/recording.py): notices become findings."""

from __future__ import annotations

import pytest
from builders import assert_findings, findings_of, make_run, run_info

from mpwatch.judge import diagnose

RULE = "recording"
# a whole Keras config, as a notice about a layer that cannot be rebuilt once carried
CONFIG = str({"name": "transformer_block", "trainable": True, "dtype": {"module": "keras",
             "class_name": "DTypePolicy", "config": {"name": "mixed_float16"}}} | {
             f"key_{i}": list(range(20)) for i in range(20)})  # fmt: skip

CASES = [
    pytest.param(
        make_run(notices=[{"step": 3, "part": "probe", "level": "error", "message": "boom"}]),
        [{"severity": "warning", "title_has": "boom", "data": {"part": "probe", "step": 3}}],
        id="error-notice-is-a-warning",
    ),
    pytest.param(
        make_run(notices=[{"step": 3, "part": "memory", "level": "info", "message": "CPU RSS"}]),
        [{"severity": "info", "title_has": "CPU RSS"}],
        id="info-notice-is-info",
    ),
    pytest.param(
        make_run(
            notices=[
                {"step": s, "part": "probe", "level": "error", "message": "no twin: " + CONFIG}
                for s in (10, 20, 30)
            ]
        ),
        [
            {
                "severity": "warning",
                "data": {"count": 3, "steps": [10, 20, 30]},
                "evidence_has": "3 notices, at steps 10, 20, 30",
            }
        ],
        id="the-same-notice-three-times-is-one-finding",
    ),
    pytest.param(make_run(), [], id="no-notice"),
    pytest.param(
        make_run(
            policy="float32",
            info=run_info("float32"),
            notices=[
                {
                    "step": 0,
                    "part": "loss_scale",
                    "level": "info",
                    "message": "no loss scale: policy float32",
                }
            ],
        ),
        [],
        id="no-loss-scale-under-float32-is-a-run-fact",
    ),  # fmt: skip
]


@pytest.mark.parametrize(("run", "expected"), CASES)
def test_recording(run, expected):
    assert_findings(findings_of(diagnose(run), RULE), expected)


def test_a_config_dump_does_not_fill_the_screen():
    run = make_run(notices=[{"step": 3, "part": "probe", "level": "error", "message": CONFIG}])
    (f,) = findings_of(diagnose(run), RULE)
    assert len(CONFIG) > 1000
    assert len(f.title) < 200 and len(f.evidence) < 500
    assert f.title.startswith("Recording part 'probe': {'name': 'transformer_block'")
