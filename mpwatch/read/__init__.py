"""Read: a logdir's event files -> :class:`Run` (pandas tables). No TensorFlow.

- ``tfrecord.py``: the byte layer (TFRecord framing, crc32c, event decoding).
- ``run.py``: the :class:`Run` and its tables; :func:`load_run`, :func:`load_runs`.

Example:
    >>> import mpwatch.read
    >>> mpwatch.read.Run(name=".", path="").has_data
    False
"""

from mpwatch.read.run import (
    ProbeResult,
    ReadError,
    Run,
    find_runs,
    load_run,
    load_runs,
    run_from_records,
)

__all__ = [
    "ProbeResult",
    "ReadError",
    "Run",
    "find_runs",
    "load_run",
    "load_runs",
    "run_from_records",
]
