"""What the reader cannot read of a logdir, found without decoding it: :func:`check_events` (one
event file), :func:`check_runs` (every run of a logdir).

The check is the reader's own (:func:`mpwatch.read.tfrecord.check_records`): the TFRecord framing
walked, every length's crc and every record's data crc checked (``verify="all"``, what
``mpwatch diagnose`` reads with), nothing decoded. Its :class:`~mpwatch.read.problems.ReadProblem`
are the ones :func:`~mpwatch.read.load_runs` puts in ``Run.problems`` for the same files, word for
word, so the judge's rule ``damaged-logs`` gives the same findings: the TensorBoard tab, which
reads the data through TensorBoard (that stops quietly at damage), checks the files this way.

For a reader that looks again and again, each :class:`FileCheck` is kept by the caller and passed
back: a file whose device, inode, size, modification and change times are the same is not read
again, and a file that only grew after whole records (a run being written; its earlier check
found nothing or a cut last record) is read from where its whole records ended, once the bytes
just before that point are the ones seen then.

Example:
    >>> check_events("/nonexistent/events.out.tfevents.1").problems[0].kind
    'unreadable_file'
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping
from dataclasses import dataclass

from mpwatch import contract
from mpwatch.read.logdir import _scan
from mpwatch.read.problems import (
    TRUNCATED_TAIL,
    UNREADABLE_FILE,
    UNREADABLE_FOLDER,
    ReadProblem,
    unreadable,
)
from mpwatch.read.tfrecord import Events, check_records

__all__ = ["FileCheck", "check_events", "check_runs"]

#: how many bytes before the end of a file's whole records are kept to tell, when it has grown,
#: that the file is the one checked before (appended to, not written anew)
MARK_BYTES = 64


@dataclass(frozen=True)
class FileCheck:
    """One event file's check.

    Attributes:
        path: the file.
        key: its (device, inode, size, modification ns, change ns) when checked; ``()`` when it
            could not even be looked at.
        problems: what the reader cannot read of it (none for a whole file).
        whole: how many bytes from its start are whole records (where a later check may go on).
        records: how many records those are.
        mark: the last bytes (up to :data:`MARK_BYTES`) before ``whole``.
    """

    path: str
    key: tuple[int, ...]
    problems: tuple[ReadProblem, ...] = ()
    whole: int = 0
    records: int = 0
    mark: bytes = b""


def _key(st: os.stat_result) -> tuple[int, ...]:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _goes_on(since: FileCheck, key: tuple[int, ...]) -> bool:
    """Whether a check of the file now may start where ``since`` stopped: the same file (device,
    inode), not shorter, and nothing but a cut last record found then."""
    return (
        since.whole > 0
        and since.key[:2] == key[:2]
        and key[2] >= since.key[2]
        and all(q.kind == TRUNCATED_TAIL for q in since.problems)
    )


def check_events(path: str, since: FileCheck | None = None) -> FileCheck:
    """The check of one event file: what the reader cannot read of it, as
    :func:`~mpwatch.read.tfrecord.read_events` says it. ``since``: this file's previous check,
    returned as it is when the file is unchanged, continued when it only grew."""
    try:
        key = _key(os.stat(path))
    except OSError as e:
        return FileCheck(path, (), (unreadable(UNREADABLE_FILE, path, e),))
    if since is not None and since.key == key:
        return since
    start, first, mark = 0, 0, b""
    try:
        with open(path, "rb") as f:
            key = _key(os.fstat(f.fileno()))
            if since is not None and since.key == key:
                return since
            if since is not None and _goes_on(since, key):
                f.seek(since.whole - len(since.mark))
                if f.read(len(since.mark)) == since.mark:  # appended to: go on after it
                    start, first, mark = since.whole, since.records, since.mark
                f.seek(start)
            buf = f.read(key[2] - start)
    except OSError as e:
        return FileCheck(path, key, (unreadable(UNREADABLE_FILE, path, e),))
    events = Events()
    offs, lens, _ = check_records(buf, path, events, base=start, first=first)
    done = int(offs[-1] + lens[-1] + 4) if len(offs) else 0  # bytes of whole records in buf
    mark = (mark + buf[max(0, done - MARK_BYTES) : done])[-MARK_BYTES:]
    return FileCheck(path, key, tuple(events.problems), start + done, first + len(offs), mark)


def check_runs(
    logdir: str | os.PathLike[str], files: MutableMapping[str, FileCheck] | None = None
) -> dict[str, list[ReadProblem]]:
    """Every run of ``logdir`` (as :func:`~mpwatch.read.load_runs` finds them, a folder that
    cannot be listed one of its own) -> what the reader cannot read of it: the problems
    ``load_runs`` puts in its ``Run.problems``, in the same order, without decoding a record.

    ``files``: each event file's last :class:`FileCheck`, by path; it is used (files unchanged
    are not read again) and updated in place (files gone are dropped).

    Raises:
        ReadError: logdir is missing, not a directory, or cannot be read.
    """
    runs, locked = _scan(logdir)
    seen: dict[str, FileCheck] = {}
    out: dict[str, list[ReadProblem]] = {}
    for name, path in runs.items():
        try:
            names = contract.event_files(path)
        except OSError as e:  # vanished or locked since the walk
            out[name] = [unreadable(UNREADABLE_FOLDER, path, e)]
            continue
        out[name] = []
        for fname in names:
            check = check_events(fname, files.get(fname) if files is not None else None)
            seen[fname] = check
            out[name].extend(check.problems)
    for name, (path, error) in locked.items():
        out[name] = [unreadable(UNREADABLE_FOLDER, path, error)]
    if files is not None:
        files.clear()
        files.update(seen)
    return dict(sorted(out.items()))
