"""What the reader could not read in a logdir, and why: :class:`ReadProblem`.

The reader never raises on a damaged run (only a logdir that cannot be read at all raises
:class:`~mpwatch.read.ReadError`): what it skipped is a :class:`ReadProblem` in
:attr:`Run.problems <mpwatch.read.run.Run.problems>` (its ``message`` also in
:attr:`Run.warnings <mpwatch.read.run.Run.warnings>`), and the judge's rule ``damaged-logs`` turns
each into a finding. The kinds:

- :data:`CORRUPT_RECORD`: a record's header is damaged (its length's crc does not match), so
  where the records after it start is unknown: the rest of the file is not read.
- :data:`DATA_CRC`: records whose data do not match their crc (a flipped bit): skipped.
- :data:`NOT_EVENT_FILE`: a file named like an event file whose first record's header is no
  TFRecord header: nothing of it is read.
- :data:`UNREADABLE_FILE`: an event file that cannot be opened or read (permission, I/O error).
- :data:`UNREADABLE_FOLDER`: a folder under the logdir that cannot be listed (permission): any run
  in it is not read.
- :data:`TRUNCATED_TAIL`: the last record is incomplete, as while a writer is still writing it
  (or was killed mid-write): the records before it are whole; the only kind that loses nothing
  a finished write holds (:attr:`ReadProblem.loses_data` False).

Example:
    >>> p = ReadProblem(TRUNCATED_TAIL, "run/events.out.tfevents.1", "cut short", offset=80)
    >>> p.loses_data, ReadProblem(DATA_CRC, "f", "bad", records=2).loses_data
    (False, True)
"""

from __future__ import annotations

import struct
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from mpwatch import wire

__all__ = [
    "CORRUPT_RECORD",
    "DATA_CRC",
    "NOT_EVENT_FILE",
    "PROBLEM_KINDS",
    "ReadProblem",
    "TRUNCATED_TAIL",
    "UNREADABLE_FILE",
    "UNREADABLE_FOLDER",
    "bad_header",
    "data_crc",
    "tail",
    "unreadable",
]

CORRUPT_RECORD = "corrupt_record"
DATA_CRC = "data_crc"
NOT_EVENT_FILE = "not_event_file"
UNREADABLE_FILE = "unreadable_file"
UNREADABLE_FOLDER = "unreadable_folder"
TRUNCATED_TAIL = "truncated_tail"

#: every kind, the ones that lose data first
PROBLEM_KINDS = (
    CORRUPT_RECORD,
    DATA_CRC,
    NOT_EVENT_FILE,
    UNREADABLE_FILE,
    UNREADABLE_FOLDER,
    TRUNCATED_TAIL,
)


@dataclass(frozen=True)
class ReadProblem:
    """One thing the reader could not read.

    Attributes:
        kind: one of :data:`PROBLEM_KINDS`.
        path: the file (or folder) it is in, as the reader found it (under the logdir given).
        message: one line for a person: which file, where, what was skipped (also a warning of
            the run).
        offset: the byte of the file where the damage starts (None for a file or folder that
            could not be read).
        record: the damaged record's number in the file, 1 for the first (None when unknown).
        records: how many records were skipped, where they can be counted (None otherwise).
        nbytes: how many bytes of the file were not read (None for a folder).
        reason: the operating system's words (``"Permission denied"``) for an unreadable file or
            folder; ``""`` otherwise.
    """

    kind: str
    path: str
    message: str
    offset: int | None = None
    record: int | None = None
    records: int | None = None
    nbytes: int | None = None
    reason: str = ""

    def __post_init__(self) -> None:
        if self.kind not in PROBLEM_KINDS:
            raise ValueError(f"kind must be one of {PROBLEM_KINDS}, not {self.kind!r}")

    @property
    def loses_data(self) -> bool:
        """Whether data that were written are not read (everything but a tail still being
        written)."""
        return self.kind != TRUNCATED_TAIL

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# --- the problems of the byte layer (:mod:`mpwatch.read.tfrecord`), in words ---------------------
def unreadable(kind: str, path: str, error: OSError) -> ReadProblem:
    """A file (:data:`UNREADABLE_FILE`) or folder (:data:`UNREADABLE_FOLDER`) the system would
    not let the reader read, with its reason."""
    why = error.strerror or str(error)
    what = "any run in it was not read" if kind == UNREADABLE_FOLDER else "skipped"
    return ReadProblem(kind, path, f"{path}: cannot be read ({why}); {what}", reason=why)


def bad_header(path: str, at: int, record: int, end: int, counted: int | None) -> ReadProblem:
    """A record header at byte ``at`` whose length's crc does not match: the rest of the file
    (to byte ``end``) is not read. ``counted``: the records from it to the end, where the
    framing after it holds. The first header of a file failing, with nothing after it that
    frames, is :data:`NOT_EVENT_FILE`."""
    nbytes = end - at
    if at == 0 and counted is None:
        return ReadProblem(
            NOT_EVENT_FILE, path,
            f"{path}: not an event file: its first {min(end, 12)} bytes are not a TFRecord record "
            f"header (the length's crc does not match); nothing of it was read ({nbytes} bytes)",
            offset=0, record=1, nbytes=nbytes,
        )  # fmt: skip
    if counted is not None:
        how_many = f"{counted} records, {nbytes} bytes"
    else:
        how_many = (
            f"{nbytes} bytes; how many records they held is unknown: the damaged length hides "
            "where the next one starts"
        )
    return ReadProblem(
        CORRUPT_RECORD, path,
        f"{path}: record {record} at byte {at} is corrupt (its length's crc does not match); "
        f"skipped the rest of the file ({how_many})",
        offset=at, record=record, records=counted, nbytes=nbytes,
    )  # fmt: skip


def tail(path: str, buf: bytes, pos: int, record: int, base: int = 0) -> ReadProblem:
    """The bytes of ``buf`` after its last whole record (from ``pos``; ``record`` the number the
    next record would have): a record still being written (its header cut, or its header whole
    and its data cut), zeros a stopped machine left (:data:`TRUNCATED_TAIL`), or a whole header
    whose length's crc does not match (:func:`bad_header`: damage, not a cut). ``base``: the
    byte of the file ``buf`` starts at (a check that goes on where an earlier one stopped)."""
    left = len(buf) - pos
    zeros = left >= 12 and buf.count(0, pos) == left
    if left >= 12 and not zeros and not _header_ok(buf, pos):
        return bad_header(path, base + pos, record, base + len(buf), None)
    if zeros:
        what = (
            f"{left} zero bytes where record {record} should start (a write the system did not "
            "finish: the machine may have stopped)"
        )
    elif left >= 12:
        what = f"{left} bytes of a {struct.unpack_from('<Q', buf, pos)[0] + 16}-byte record"
    else:
        what = f"{left} bytes of its 12-byte header"
    return ReadProblem(
        TRUNCATED_TAIL, path,
        f"{path}: last record truncated at byte {base + pos} ({what}); skipped (the run may "
        "still be writing, or was killed)",
        offset=base + pos, record=record, records=1, nbytes=left,
    )  # fmt: skip


def data_crc(path: str, starts: np.ndarray, sizes: np.ndarray, record: int | None) -> ReadProblem:
    """Records (starting at bytes ``starts``, ``sizes`` bytes each with their framing) whose data
    do not match their crc, skipped; ``record``: the first one's number, where known."""
    at = int(starts[0])
    first = f"record {record} at byte {at}" if record else f"the record at byte {at}"
    return ReadProblem(
        DATA_CRC, path,
        f"{path}: {len(starts)} record(s) with a data crc mismatch (the first: {first}); skipped",
        offset=at, record=record, records=len(starts), nbytes=int(np.sum(sizes)),
    )  # fmt: skip


def _header_ok(buf: bytes, pos: int) -> bool:
    """Whether the 12-byte record header at ``pos`` holds its length's crc."""
    return wire.masked_crc32c(buf[pos : pos + 8]) == struct.unpack_from("<I", buf, pos + 8)[0]
