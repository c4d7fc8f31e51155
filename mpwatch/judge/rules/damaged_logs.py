"""Rule `damaged-logs`: part of the logdir could not be read.

## What it finds
What the reader could not read (`Run.problems`), one finding each: a record whose header is
corrupt (its length's crc does not match, so the rest of its file is unread: which file, which
record, at which byte, and how many records or bytes were skipped), records whose data do not
match their crc (skipped), a file named like an event file that is no TFRecord file, an event
file or a folder the system would not let mpwatch read (permission denied), and a last record
cut short. A run whose files could not be read at all has no data, yet its findings are here.

## Why it matters
A diagnosis of part of the data reads as a diagnosis of all of it: a skipped step, an overflow
or a probe in the unread part is missing from every other finding, and a CI gate (`mpwatch
diagnose --fail-on error`) would pass a run whose data it could not read. A last record cut
short is what a run still being written looks like (its writer is between two writes), or one
killed mid-write: the records before it are whole, and only that record is missing.

## Threshold
Error for each problem that loses written data: a corrupt record header, records failing their
data crc, a file that is no event file, an event file or folder that cannot be read. Info for a
truncated last record (or a tail of zero bytes), which loses nothing a finished write holds.

## Example evidence
```text
Event file damaged: record 3 of events.out.tfevents.1795819089.host.1.0 is corrupt; the rest
of the file was not read (308 records)
logs/run1/events.out.tfevents.1795819089.host.1.0: record 3 at byte 144 is corrupt (its
length's crc does not match); skipped the rest of the file (308 records, 17430 bytes)
```

## Fix
No code. A damaged record: the file changed after it was written (a disk, a copy or a sync):
copy the run again from where it was written, or train again; the other findings judge only
what was read. Not an event file: move or rename it (every file named `events.out.tfevents.*`
is read as one). Permission denied: let the user running mpwatch read the folder (`chmod -R
u+rX FOLDER`), or point mpwatch at the runs it can read (a narrower LOGDIR, or `--run`). A
truncated last record: nothing to do while the run is being written.

## References
- TensorFlow, TFRecord and tf.train.Example: the TFRecord framing (length, masked crc of the
  length, data, masked crc of the data) <https://www.tensorflow.org/tutorials/load_data/tfrecord>
- `mpwatch.read.problems`: what the reader could not read, by kind, with where and how much
"""

from __future__ import annotations

import os

from mpwatch.judge.declare import Declared
from mpwatch.judge.finding import Finding
from mpwatch.judge.rule import Rule
from mpwatch.read import problems as p
from mpwatch.read.run import Run

RULE = Rule(
    id="damaged-logs",
    title="Part of the logdir could not be read",
    severities=("info", "error"),
    doc=__doc__,
)

_COPY_AGAIN = (
    "# the file changed after it was written (a disk, a copy or a sync): copy the run again\n"
    "# from where it was written, or train again; the other findings judge what was read"
)
_FIX = {
    p.CORRUPT_RECORD: _COPY_AGAIN,
    p.DATA_CRC: _COPY_AGAIN,
    p.NOT_EVENT_FILE: (
        "# move or rename this file: every file named events.out.tfevents.* is read as an event\n"
        "# file (by mpwatch and by TensorBoard)"
    ),
    p.UNREADABLE_FILE: "# let the user running mpwatch read it: chmod u+r {path!r}",
    p.UNREADABLE_FOLDER: (
        "# let the user running mpwatch read it: chmod -R u+rX {path!r}\n"
        "# or point mpwatch at the runs it can read (a narrower LOGDIR, or --run)"
    ),
    p.TRUNCATED_TAIL: "# nothing to do while the run is being written",
}


def _title(q: p.ReadProblem) -> str:
    name = os.path.basename(q.path) or q.path
    reason = (q.reason[:1].lower() + q.reason[1:]) if q.reason else "unreadable"
    if q.kind == p.CORRUPT_RECORD:
        rest = f"{q.records} records" if q.records is not None else f"{q.nbytes} bytes"
        return (
            f"Event file damaged: record {q.record} of {name} is corrupt; the rest of the file "
            f"was not read ({rest})"
        )
    if q.kind == p.DATA_CRC:
        return f"Event file damaged: {q.records} record(s) of {name} fail their crc; skipped"
    if q.kind == p.NOT_EVENT_FILE:
        return f"Not an event file: {name} (no TFRecord framing); nothing of it was read"
    if q.kind == p.UNREADABLE_FILE:
        return f"Event file cannot be read: {reason}: {name}"
    if q.kind == p.UNREADABLE_FOLDER:
        return f"Folder cannot be read: {reason}: {q.path}; any run in it was not read"
    return f"Last record of {name} is incomplete: the run may still be writing (or was killed)"


#: a run without mpwatch data gets this rule's findings alone
DECLARED = Declared(without_data=True)


def check(run: Run) -> list[Finding]:
    """Findings of this rule on one run: one per problem the reader noted."""
    return [
        RULE.finding(
            "error" if q.loses_data else "info",
            _title(q),
            q.message,
            fix=_FIX[q.kind].format(path=q.path),
            data=q.to_dict(),
        )
        for q in run.problems
    ]
