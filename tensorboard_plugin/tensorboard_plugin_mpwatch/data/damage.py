"""What the reader cannot read of the runs under ``--logdir``: the tab's ``damaged-logs`` findings.

TensorBoard's data provider stops quietly where an event file is damaged (a corrupt record, a file
that is no event file) and serves what came before, so the tab cannot learn from it what was lost.
The run folders' event files are checked here with the reader's own check
(:func:`mpwatch.read.check_runs`: the TFRecord framing and every crc, nothing decoded), whose
problems are those ``mpwatch diagnose`` puts in ``Run.problems`` for the same files; the Run the
tab builds carries them (:func:`add_problems`), and the judge's rule ``damaged-logs`` says them as
it does for the CLI. A run whose files hold nothing TensorBoard could read is listed with them
(:func:`merge_damage`).

Each file is read again only when it changed (its size, modification or change time, or inode),
and a file that only grew is read from where its whole records ended
(:class:`mpwatch.read.FileCheck`); the logdir is walked at most every :data:`SCAN_TTL_S` seconds.
Run names come from the walk, as for raw traces: a request's run name only picks one of them.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Sequence
from typing import Any

from mpwatch.read import FileCheck, ReadProblem, check_runs
from tensorboard_plugin_mpwatch.data.provider import RunRecords
from tensorboard_plugin_mpwatch.data.traces import listed

__all__ = ["SCAN_TTL_S", "DamagedRuns", "add_problems", "merge_damage"]

#: the logdir's event files are looked at most this often (TensorBoard reloads every 5 s)
SCAN_TTL_S = 5.0


class DamagedRuns:
    """The runs under ``logdir`` the reader cannot read whole: run name -> (its problems, their
    digest), from a check repeated at most every :data:`SCAN_TTL_S` seconds. No logdir
    (TensorBoard started with ``--logdir_spec``, or a remote one the reader cannot open): none."""

    def __init__(self, logdir: str | None, ttl: float = SCAN_TTL_S) -> None:
        self.logdir = logdir or ""
        self.ttl = ttl
        self._lock = threading.Lock()
        self._at = -float("inf")
        self._files: dict[str, FileCheck] = {}  # event file -> its last check
        self._runs: dict[str, tuple[tuple[ReadProblem, ...], str]] = {}

    def runs(self) -> dict[str, tuple[tuple[ReadProblem, ...], str]]:
        with self._lock:
            now = time.monotonic()
            if self.logdir and now - self._at >= self.ttl:
                try:
                    found = check_runs(self.logdir, self._files)
                except OSError:  # the logdir is gone or cannot be read (ReadError): nothing
                    found, self._files = {}, {}
                self._runs = {n: (tuple(ps), digest(ps)) for n, ps in found.items() if ps}
                self._at = now
            return self._runs


def digest(problems: Sequence[ReadProblem]) -> str:
    """A short digest of what is damaged: it changes when a problem comes, goes or moves."""
    text = "\x01".join(repr(sorted(q.to_dict().items())) for q in problems)
    return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()


def merge_damage(
    listing: dict[str, dict[str, Any]], damaged: dict[str, tuple[tuple[ReadProblem, ...], str]]
) -> dict[str, dict[str, Any]]:
    """The tab's run listing with what the reader cannot read: each damaged run gains
    ``problems`` and ``damage`` (their digest), its ``version`` too (so new damage is a new
    version); a damaged run TensorBoard serves no mpwatch data of is listed with step 0."""
    out = {name: dict(entry) for name, entry in listing.items()}
    for name, (problems, mark) in damaged.items():
        entry = listed(out, name)
        entry["problems"] = problems
        entry["damage"] = mark
        entry["version"] = f"{entry['version']}:damage:{mark}"
    return dict(sorted(out.items()))


def add_problems(records: RunRecords, problems: Sequence[ReadProblem], mark: str) -> None:
    """Give ``records`` what the reader cannot read of the run's files (the Run built of them
    carries them in ``Run.problems``); their digest joins the fingerprint."""
    records.problems = list(problems)
    records.fingerprint = f"{records.fingerprint}:damage:{mark}"
