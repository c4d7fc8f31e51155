"""Rule ``damaged-logs`` (mpwatch/judge/rules/damaged_logs.py): what the reader could not read
becomes a finding, an error where written data were lost, info for a tail still being written;
also for a run without data (``diagnose_runs``)."""

from __future__ import annotations

import pytest
from builders import assert_findings, findings_of, healthy_run

from mpwatch.judge import diagnose, diagnose_runs
from mpwatch.read import ReadProblem, Run
from mpwatch.read import problems as p

RULE = "damaged-logs"
FILE = "logs/run1/events.out.tfevents.1700000000.host.1.0"


def problem(kind: str, **kw) -> ReadProblem:
    return ReadProblem(kind, kw.pop("path", FILE), kw.pop("message", f"{kind} said"), **kw)


CASES = [
    pytest.param(
        problem(p.CORRUPT_RECORD, offset=144, record=3, records=308, nbytes=17430),
        {
            "severity": "error",
            "title_has": ("record 3 of events.out.tfevents.1700000000.host.1.0", "308 records"),
            "evidence_has": "corrupt_record said",
            "fix_has": "copy the run again",
            "data": {"offset": 144, "record": 3, "records": 308, "path": FILE},
        },
        id="corrupt-record-counted",
    ),  # fmt: skip
    pytest.param(
        problem(p.CORRUPT_RECORD, offset=144, record=3, nbytes=17430),
        {"severity": "error", "title_has": "(17430 bytes)"},
        id="corrupt-record-uncounted",
    ),
    pytest.param(
        problem(p.DATA_CRC, offset=200, record=5, records=2, nbytes=60),
        {"severity": "error", "title_has": "2 record(s)"},
        id="data-crc",
    ),
    pytest.param(
        problem(p.NOT_EVENT_FILE, offset=0, record=1, nbytes=4096),
        {"severity": "error", "title_has": "Not an event file", "fix_has": "rename"},
        id="not-an-event-file",
    ),
    pytest.param(
        problem(p.UNREADABLE_FILE, reason="Permission denied"),
        {"severity": "error", "title_has": "permission denied", "fix_has": f"chmod u+r {FILE!r}"},
        id="file-permission-denied",
    ),
    pytest.param(
        problem(p.UNREADABLE_FOLDER, path="logs/locked", reason="Permission denied"),
        {
            "severity": "error",
            "title_has": ("Folder cannot be read: permission denied", "logs/locked"),
        },
        id="folder-permission-denied",
    ),  # fmt: skip
    pytest.param(
        problem(p.TRUNCATED_TAIL, offset=900, record=42, records=1, nbytes=7),
        {"severity": "info", "title_has": "may still be writing"},
        id="truncated-tail-is-info",
    ),
]


@pytest.mark.parametrize("q, expected", CASES)
def test_each_problem_is_one_finding(q, expected):
    run = healthy_run()
    run.problems = [q]
    assert_findings(findings_of(diagnose(run), RULE), [expected])


def test_no_problem_no_finding():
    assert findings_of(diagnose(healthy_run()), RULE) == []


def test_a_run_without_data_still_says_what_could_not_be_read():
    broken = Run(name="junk", path="logs/junk", problems=[problem(p.NOT_EVENT_FILE)])
    found = diagnose_runs({"ok": healthy_run(name="ok"), "junk": broken})
    (f,) = findings_of(found, RULE)
    assert (f.run, f.severity) == ("junk", "error")
    assert [g.run for g in found if g.rule != RULE] == ["ok"] * (len(found) - 1)
    # a run without data and without problems: nothing to say, as before
    assert diagnose_runs([Run(name="empty", path="")]) == []
