"""A logdir's runs: find them (:func:`find_runs`) and load them (:func:`load_run`,
:func:`load_runs`).

A run is a directory holding event files or a profiler trace (``RUN/plugins/profile/<capture>/
<host>.xplane.pb``); its name is its path relative to the logdir (``"."`` for the logdir itself).
Each run's event files are read in name order (:mod:`mpwatch.read.tfrecord`) and assembled into a
:class:`~mpwatch.read.run.Run` (:mod:`mpwatch.read.assemble`). A run whose event files hold no
``profile`` record and whose directory holds a raw trace gets its profile from the trace, read as
it is (:mod:`mpwatch.read.traces`: converted once and cached outside the logdir; nothing is
written into the logdir). A logdir that cannot be read at all raises :class:`ReadError`; what the
reader skipped is in :attr:`Run.warnings` (and, with ``warn=True``, emitted as ``UserWarning``),
the damage among it in :attr:`Run.problems` (:mod:`mpwatch.read.problems`). A folder under the
logdir that cannot be listed is, for :func:`load_runs`, a run of its own without data whose
problem says why (it may hold runs: they were not read).
No TensorFlow.

Example:
    >>> import mpwatch  # doctest: +SKIP
    >>> runs = mpwatch.read.load_runs("logs")  # doctest: +SKIP
    >>> sorted(runs)  # doctest: +SKIP
    ['float32', 'mixed']
"""

from __future__ import annotations

import os
import warnings as _warnings
from collections.abc import Callable, Iterable

from mpwatch import contract
from mpwatch.read import traces as _traces
from mpwatch.read.assemble import _records, build_run
from mpwatch.read.problems import UNREADABLE_FOLDER, unreadable
from mpwatch.read.run import Run
from mpwatch.read.tfrecord import Events, read_events

__all__ = ["ReadError", "find_runs", "load_run", "load_runs"]

ProgressFn = Callable[[int, int], None]


class ReadError(OSError):
    """The logdir (or run) cannot be read at all: missing, not a directory, no permission."""


def find_runs(logdir: str | os.PathLike[str]) -> dict[str, str]:
    """Run name (relative path, ``"."`` for the root) -> directory, for every directory under
    ``logdir`` that holds event files or a profiler trace (``plugins/profile/<capture>/
    *.xplane.pb`` in it). Raises :class:`ReadError` when logdir cannot be read."""
    return _scan(logdir)[0]


def _scan(
    logdir: str | os.PathLike[str],
) -> tuple[dict[str, str], dict[str, tuple[str, OSError]]]:
    """:func:`find_runs`' runs, and the folders under ``logdir`` that could not be listed
    (name -> (directory, the error)): any run in them is unknown."""
    root = os.fspath(logdir)
    if not os.path.exists(root):
        raise ReadError(f"logdir {root!r} does not exist")
    if not os.path.isdir(root):
        raise ReadError(f"logdir {root!r} is not a directory")
    if not os.access(root, os.R_OK | os.X_OK):
        raise ReadError(f"logdir {root!r} cannot be read (permission denied)")
    runs: dict[str, str] = {}
    errors: list[OSError] = []
    for dirpath, dirnames, filenames in os.walk(root, onerror=errors.append):
        dirnames.sort()
        run_dir = None
        if any(contract.is_event_file(f) for f in filenames):
            run_dir = dirpath
        elif any(_traces.is_trace_file(f) for f in filenames):
            run_dir = _traces.trace_run_dir(dirpath)
            if run_dir is not None and os.path.relpath(run_dir, root).startswith(os.pardir):
                run_dir = None  # the logdir is inside a capture: no run of it
        if run_dir is not None:
            rel = os.path.relpath(run_dir, root)
            runs[rel.replace(os.sep, "/")] = run_dir
    if errors and not runs and errors[0].filename == root:
        raise ReadError(f"logdir {root!r} cannot be read: {errors[0]}")
    unreadable = {}
    for e in errors:
        path = os.fspath(e.filename) if e.filename is not None else root
        rel = os.path.relpath(path, root).replace(os.sep, "/")
        if rel not in runs:
            unreadable[rel] = (path, e)
    return dict(sorted(runs.items())), dict(sorted(unreadable.items()))


def _unreadable_folder(name: str, path: str, error: OSError) -> Run:
    """The Run of a folder that could not be listed: no data, one problem saying why."""
    problem = unreadable(UNREADABLE_FOLDER, path, error)
    return Run(name=name, path=path, warnings=[problem.message], problems=[problem])


def _read_run(
    name: str,
    path: str,
    verify: str,
    progress: ProgressFn | None,
    done_total: list[int],
    traces: bool = True,
) -> Run:
    events = Events()
    try:
        files = contract.event_files(path)
    except OSError as e:
        raise ReadError(f"run directory {path!r} cannot be read: {e}") from e
    for fname in files:
        nbytes = read_events(fname, events, verify=verify)
        if progress is not None:
            done_total[0] += nbytes
            progress(done_total[0], done_total[1])
    trace = _trace_profile(path, events) if traces else None
    run = build_run(name, path, events)
    if trace is not None:
        run.profile_trace = trace.trace_dir
    return run


def _trace_profile(path: str, events: Events) -> _traces.TraceProfile | None:
    """The run's profile from its raw trace, added to ``events`` as a ``profile`` record, when
    its event files hold none; a trace that cannot be converted is a warning."""
    if any(kind == contract.KIND_PROFILE for _, _, kind, _ in events.records):
        return None  # a record wins over its trace: it was made with the model
    try:
        # the run's layers (and a deferred conversion's steps) join the trace; the reader says
        # what it found of the records once, when it builds the run
        context = (None, None)
        if _traces.newest_capture(path) is not None:
            context = _traces.deferred_context(_records(events, warnings=[]))
        found = _traces.trace_profile(path, *context)
    except _traces.TraceError as e:
        events.warnings.append(f"the profiler trace was not read: {e}")
        return None
    if found is not None:
        events.add_record(found.step, contract.KIND_PROFILE, found.payload)
    return found


def _sizes(paths: Iterable[str]) -> int:
    total = 0
    for p in paths:
        try:
            for f in contract.event_files(p):
                total += os.path.getsize(f)
        except OSError:
            pass
    return total


def load_runs(
    logdir: str | os.PathLike[str],
    *,
    verify: str = "all",
    progress: ProgressFn | None = None,
    warn: bool = False,
    traces: bool = True,
) -> dict[str, Run]:
    """Every run under ``logdir`` (a run = a directory holding event files or a profiler
    trace), by name (its path relative to logdir, ``"."`` for logdir itself), in name order. A
    folder that cannot be listed (permission denied) is one too, without data, its problem in
    :attr:`Run.problems`.

    Args:
        logdir: the directory given to the callbacks (or to ``tensorboard --logdir``).
        verify: ``"all"`` (default) checks every record's length and data crc; ``"lengths"``
            checks the data crc of structured records only (faster, but a flipped bit in a
            scalar event can come back as a wrong value).
        progress: called as ``progress(bytes_read, bytes_total)`` after each event file.
        warn: also emit each reader warning as a Python ``UserWarning``.
        traces: give a run without a ``profile`` record the profile of its raw profiler trace
            (``plugins/profile/``), read as it is (:mod:`mpwatch.read.traces`: cached outside
            the logdir, nothing written into it); False reads records only.

    Raises:
        ReadError: logdir is missing, not a directory, or cannot be read.
    """
    if verify not in ("lengths", "all"):
        raise ValueError(f"verify must be 'lengths' or 'all', not {verify!r}")
    runs, locked = _scan(logdir)
    totals = [0, _sizes(runs.values()) if progress is not None else 0]
    out = {
        name: _read_run(name, path, verify, progress, totals, traces) for name, path in runs.items()
    }
    if locked:  # a folder that could not be listed is said as a run of its own (no data)
        out |= {name: _unreadable_folder(name, path, e) for name, (path, e) in locked.items()}
        out = dict(sorted(out.items()))
    if warn:
        for run in out.values():
            for w in run.warnings:
                _warnings.warn(f"mpwatch reader: run {run.name!r}: {w}", stacklevel=2)
    return out


def load_run(
    logdir: str | os.PathLike[str],
    run: str | None = None,
    *,
    verify: str = "all",
    progress: ProgressFn | None = None,
    warn: bool = True,
    traces: bool = True,
) -> Run:
    """One run of a logdir as a :class:`Run`.

    ``run`` names the run (its path relative to ``logdir``, as :func:`load_runs` names them).
    Without it: ``logdir`` itself when it holds event files, else its only run, else the only run
    with mpwatch data; several candidates raise ``ValueError`` listing them. A logdir without event
    files gives an empty Run (``has_data`` False) rather than an error (its problems name the
    folders that could not be listed, if any). Warnings about skipped
    records are in ``Run.warnings`` and, with ``warn=True``, emitted as ``UserWarning``.
    A run holding only a profiler trace (Keras' ``TensorBoard(profile_batch=...)``,
    ``jax.profiler.trace``) is read with the profile of its trace (``traces``, as
    :func:`load_runs`; :attr:`Run.profile_trace` names the capture).

    Example:
        >>> run = load_run("logs/run1")  # doctest: +SKIP
        >>> run.has_data, run.info.get("policy")  # doctest: +SKIP
        (True, 'mixed_float16')
    """
    if verify not in ("lengths", "all"):
        raise ValueError(f"verify must be 'lengths' or 'all', not {verify!r}")
    runs, locked = _scan(logdir)
    root = os.fspath(logdir)
    if run is None:
        if not runs:
            empty = Run(name=".", path=root)
            for name, (path, e) in locked.items():  # say why nothing was found
                folder = _unreadable_folder(name, path, e)
                empty.warnings += folder.warnings
                empty.problems += folder.problems
            _emit(empty, warn)
            return empty
        if "." in runs and (len(runs) == 1 or _holds_event_files(root)):
            run = "."
        elif len(runs) == 1:
            run = next(iter(runs))
        else:
            totals = [0, _sizes(runs.values()) if progress is not None else 0]
            loaded = {n: _read_run(n, p, verify, progress, totals, traces) for n, p in runs.items()}
            with_data = [r for r in loaded.values() if r.has_data]
            if len(with_data) == 1:
                chosen = with_data[0]
            else:
                raise ValueError(
                    f"logdir {root!r} holds {len(runs)} runs ({', '.join(runs)}): name one with "
                    "run=..., or use load_runs"
                )
            _emit(chosen, warn)
            return chosen
    name = run.strip("/") or "."
    if name not in runs:
        path = os.path.join(root, name)
        if not os.path.isdir(path):
            raise ReadError(
                f"no run {name!r} in {root!r}; runs: {', '.join(runs) if runs else '(none)'}"
            )
        runs = {name: path}
    totals = [0, _sizes([runs[name]]) if progress is not None else 0]
    result = _read_run(name, runs[name], verify, progress, totals, traces)
    _emit(result, warn)
    return result


def _holds_event_files(path: str) -> bool:
    """Whether ``path`` itself holds event files (not only a profiler trace)."""
    try:
        return bool(contract.event_files(path))
    except OSError:
        return False


def _emit(run: Run, warn: bool) -> None:
    if warn:
        for w in run.warnings:
            _warnings.warn(f"mpwatch reader: run {run.name!r}: {w}", stacklevel=3)
