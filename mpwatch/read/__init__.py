"""Read: a logdir's event files -> :class:`Run` (pandas tables). No TensorFlow.

- ``tfrecord.py``: the byte layer (TFRecord framing, crc32c, event decoding).
- ``assemble.py``: decoded events -> the Run's tables (split records joined, purges);
  :func:`run_from_records`.
- ``run.py``: the :class:`Run` and what it answers (its tables, the latest probe, skipped steps).
- ``logdir.py``: a logdir's runs: :func:`find_runs`, :func:`load_run`, :func:`load_runs`.
- ``problems.py``: what the reader could not read (:class:`ReadProblem`: a corrupt record, no
  event file, permission denied, a cut last record), in :attr:`Run.problems`.
- ``check.py``: the same problems found without decoding (the framing and crcs only), file by
  file with what is unchanged not read again: :func:`check_events`, :func:`check_runs`.

Example:
    >>> import mpwatch.read
    >>> mpwatch.read.Run(name=".", path="").has_data
    False
"""

from mpwatch.read.assemble import run_from_records
from mpwatch.read.check import FileCheck, check_events, check_runs
from mpwatch.read.logdir import ReadError, find_runs, load_run, load_runs
from mpwatch.read.problems import ReadProblem
from mpwatch.read.run import ProbeResult, Run

__all__ = [
    "FileCheck",
    "ProbeResult",
    "ReadError",
    "ReadProblem",
    "Run",
    "check_events",
    "check_runs",
    "find_runs",
    "load_run",
    "load_runs",
    "run_from_records",
]
