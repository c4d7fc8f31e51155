"""Rule ``recording`` (mpwatch/judge/rules/recording.py): notices become findings."""

from __future__ import annotations

import pytest
from builders import assert_findings, findings_of, make_run

from mpwatch.judge import diagnose

RULE = "recording"

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
    pytest.param(make_run(), [], id="no-notice"),
]


@pytest.mark.parametrize(("run", "expected"), CASES)
def test_recording(run, expected):
    assert_findings(findings_of(diagnose(run), RULE), expected)
