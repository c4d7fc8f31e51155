"""Raw profiler traces read as they are: a run's ``profile`` from its trace when it has no record.

A profiler trace lies at ``RUN/plugins/profile/<capture>/<host>.xplane.pb``: Keras' TensorBoard
callback with ``profile_batch=...`` (``RUN`` is its ``train`` directory), ``tf.profiler``,
``jax.profiler.trace(RUN)`` or mpwatch's ``ProfileMonitor`` write it there. A run directory that
holds one is a run (:func:`trace_run_dir` names it, :func:`mpwatch.read.find_runs` lists it, even
without an event file). When its event files hold no ``profile`` record, :func:`trace_profile`
gives it one: the newest capture's trace summarized as
``mpwatch.record.callbacks.profile_capture.record_trace`` would (:func:`mpwatch.profile.summarize`,
no model: layers are known by the op names' JAX scopes, GPU kernels by their names and HLO).

Nothing is written into the logdir: a read never changes what it reads (the logdir may be
read-only, shared, synced, or still being written by the training), and TensorBoard's other tabs
see the same files before and after. The converted record is cached in the user's cache directory
instead, keyed by each trace file's real path, size and modification time and by the converter
(mpwatch's version and the source of ``mpwatch/profile``), so a trace is converted once and again
only when it (or mpwatch's converter) changes:

- ``$MPWATCH_CACHE_DIR`` when set, else ``$XDG_CACHE_HOME/mpwatch``, else ``~/.cache/mpwatch``
  (:func:`cache_dir`); the records lie in its ``profiles/`` folder, one small file a trace;
- ``MPWATCH_CACHE_DIR=off``: no cache, every read converts (in memory);
- a cache directory that cannot be written: the trace is converted in memory, every read;
- at most :data:`MAX_CACHE_ENTRIES` entries: a new one beyond removes the least recently used.

To keep the record with the run (with the model, for the layers' dtypes and dimensions), write it
into the logdir once with ``mpwatch.record_trace(LOGDIR, model=model)``: a run with a record is
read from its record, never from its trace.

Example:
    >>> trace_run_dir("logs/train/plugins/profile/2025_01_01_00_00_00")
    'logs/train'
    >>> trace_run_dir("logs/train/plugins/other/x") is None
    True
"""

from __future__ import annotations

import glob
import hashlib
import logging
import os
from collections import OrderedDict
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from mpwatch import contract
from mpwatch._version import __version__
from mpwatch.user_cache import CACHE_ENV, cache_dir, write_atomically

__all__ = [
    "CACHE_ENV",
    "TraceError",
    "TraceProfile",
    "cache_dir",
    "deferred_context",
    "newest_capture",
    "trace_key",
    "trace_profile",
    "trace_run_dir",
    "trace_runs",
    "trace_version",
]

logger = logging.getLogger(__name__)

TRACE_SUFFIX = ".xplane.pb"
PROFILE_DIRS = ("plugins", "profile")
#: cache entries kept: a new entry beyond them removes the least recently used
MAX_CACHE_ENTRIES = 256
#: converted records kept in memory (a TensorBoard server, a notebook reading a run again)
MEMORY_ENTRIES = 16
_memory: OrderedDict[str, bytes] = OrderedDict()  # key -> the encoded payload


class TraceError(RuntimeError):
    """A raw trace could not be converted; the message says which and why."""


@dataclass
class TraceProfile:
    """A run's profile read from its raw trace.

    Attributes:
        payload: the ``profile`` record's payload.
        step: the step it stands at (the payload's last profiled step; 0 when unknown).
        trace_dir: the capture directory it was read from.
        cached: the cache file it came from or was written to; None when converted in memory
            only.
    """

    payload: dict[str, Any]
    step: int
    trace_dir: str
    cached: str | None


def trace_run_dir(capture_dir: str) -> str | None:
    """The run directory of a capture directory ``RUN/plugins/profile/<capture>``, else None."""
    parent = os.path.dirname(os.path.normpath(capture_dir))
    plugins = os.path.dirname(parent)
    if os.path.basename(parent) != PROFILE_DIRS[1] or os.path.basename(plugins) != PROFILE_DIRS[0]:
        return None
    return os.path.dirname(plugins) or "."


def is_trace_file(name: str) -> bool:
    """Whether a file name is a profiler trace (``<host>.xplane.pb``)."""
    return name.endswith(TRACE_SUFFIX)


def newest_capture(run_dir: str) -> tuple[str, list[str]] | None:
    """The newest capture under ``run_dir/plugins/profile/`` that holds a trace (captures are
    named by their time, ``YYYY_MM_DD_HH_MM_SS``: the last in name order) and its trace files, or
    None."""
    base = os.path.join(glob.escape(run_dir), *PROFILE_DIRS, "*")
    for capture in sorted(glob.glob(base), reverse=True):
        files = sorted(glob.glob(os.path.join(glob.escape(capture), "*" + TRACE_SUFFIX)))
        files = [f for f in files if os.path.isfile(f)]
        if files:
            return capture, files
    return None


@lru_cache(maxsize=1)
def _converter_digest() -> str:
    """mpwatch's version and a digest of the converter's source (``mpwatch/profile`` and the
    profile record's contract): a changed converter is a cache miss, also between releases."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    h = hashlib.blake2b(f"{__version__}\x00{contract.SCHEMA_VERSION}".encode(), digest_size=16)
    sources = sorted(glob.glob(os.path.join(root, "profile", "*.py")))
    sources.append(os.path.join(root, "contract", "profile.py"))
    for path in sources:
        try:
            with open(path, "rb") as f:
                h.update(os.path.basename(path).encode() + b"\x00" + f.read())
        except OSError:
            h.update(f"{path}: missing".encode())
    return h.hexdigest()


def trace_key(files: list[str]) -> str:
    """The cache key of a capture's trace files: each file's real path, size and modification
    time (ns), and the converter (:func:`_converter_digest`). Raises OSError when a file is gone."""
    h = hashlib.blake2b(_converter_digest().encode(), digest_size=20)
    for path in sorted(files):
        st = os.stat(path)
        h.update(f"\x00{os.path.realpath(path)}\x00{st.st_size}\x00{st.st_mtime_ns}".encode())
    return h.hexdigest()


def _cache_path(key: str) -> str | None:
    where = cache_dir()
    return None if where is None else os.path.join(where, "profiles", key + ".json.zlib")


def _read_cache(path: str | None) -> bytes | None:
    """The cached encoded payload, or None (none yet, or a damaged entry: converted again and
    rewritten)."""
    if path is None:
        return None
    try:
        with open(path, "rb") as f:
            blob = f.read()
        if isinstance(contract.decode_payload(blob), dict):
            return blob
    except (OSError, ValueError):
        pass
    return None


def _write_cache(path: str | None, blob: bytes) -> str | None:
    """Write the entry atomically (a temporary file renamed); None when it cannot be written."""
    if path is None:
        return None
    try:
        write_atomically(path, blob)
    except OSError as e:
        logger.debug("mpwatch: trace cache %s not written (%s); converted in memory", path, e)
        return None
    _prune(os.path.dirname(path))
    return path


def _prune(folder: str, keep: int | None = None) -> None:
    """Remove the least recently used entries beyond ``keep`` (:data:`MAX_CACHE_ENTRIES`): a
    hit marks its entry used (its mtime)."""
    keep = MAX_CACHE_ENTRIES if keep is None else keep
    try:
        entries = [e for e in os.scandir(folder) if e.name.endswith(".json.zlib")]
        if len(entries) <= keep:
            return
        entries.sort(key=lambda e: e.stat().st_mtime_ns, reverse=True)
        for e in entries[keep:]:
            os.unlink(e.path)
    except OSError as e:  # another process pruned first, or the folder went away
        logger.debug("mpwatch: trace cache %s not pruned (%s)", folder, e)


def _touch(path: str | None) -> None:
    if path is not None:
        try:
            os.utime(path)
        except OSError:
            pass


def _convert(
    capture: str, layers: dict[str, Any] | None = None, steps: list[int] | None = None
) -> dict[str, Any]:
    from mpwatch import profile  # the converter (xprof): imported only for a trace to convert
    from mpwatch.profile.attribution import tree_from_layers_table

    model, dims = tree_from_layers_table(layers) if layers else (None, {})
    try:
        payload = profile.summarize(capture, model, steps=steps, ops="auto", dims=dims or None)
    except profile.ProfileError as e:
        raise TraceError(str(e)) from e
    return payload


def deferred_context(
    records: Any,
) -> tuple[dict[str, Any] | None, list[int] | None]:
    """(the run's latest ``layers`` table, the profiled steps) from its records (kind ->
    [(step, payload)], parts merged): what a trace whose conversion the budget deferred is
    joined with (the steps from the ``budget`` record's deferred decision, if any)."""
    layers = None
    for _, payload in reversed(list(records.get(contract.KIND_LAYERS) or [])):
        table = payload.get("layers") if isinstance(payload, dict) else None
        if isinstance(table, dict) and table.get("data"):
            layers = table
            break
    steps = None
    for _, payload in records.get(contract.KIND_BUDGET) or []:
        for d in (payload or {}).get("decisions") or []:
            got = (d.get("detail") or {}).get("steps") if isinstance(d, dict) else None
            if d.get("part") == "profile_conversion" and isinstance(got, list) and len(got) == 2:
                steps = [int(got[0]), int(got[1])]
    return layers, steps


def _step_of(payload: dict[str, Any]) -> int:
    steps = payload.get("steps")
    if isinstance(steps, list) and steps and isinstance(steps[-1], (int, float)):
        return int(steps[-1])
    return 0


def trace_profile(
    run_dir: str, layers: dict[str, Any] | None = None, steps: list[int] | None = None
) -> TraceProfile | None:
    """The run's profile from the newest capture under ``run_dir/plugins/profile/``: from the
    cache when the trace is unchanged, else converted (and cached when the cache can be
    written); None when the run holds no trace. Nothing is written into ``run_dir``.
    ``layers``: the run's ``layers`` record table (an mpwatch run: the ops are joined to its
    layers, with their dtypes and Tensor Core dimensions, as in the fit); ``steps``: the
    profiled steps (:func:`deferred_context` gives both).

    Raises :class:`TraceError` when the trace cannot be converted (no xprof, a damaged file).
    """
    found = newest_capture(run_dir)
    if found is None:
        return None
    capture, files = found
    try:
        key = trace_key(files)
    except OSError as e:
        raise TraceError(f"profiler trace in {capture} cannot be read: {e}") from e
    if layers or steps:  # the join is part of the result: another key
        extra = contract.encode_payload({"layers": layers, "steps": steps})
        key = hashlib.blake2b(key.encode() + extra, digest_size=20).hexdigest()
    path = _cache_path(key)
    blob = _memory.get(key)
    cached = path if blob is not None and path is not None and os.path.isfile(path) else None
    if blob is None:
        blob = _read_cache(path)
        cached = path if blob is not None else None
        if cached:
            _touch(cached)  # used: the last to be pruned
    if blob is None:
        try:
            blob = contract.encode_payload(_convert(capture, layers, steps))
        except TraceError:
            raise
        except Exception as e:  # noqa: BLE001 - the converter's C++ layer raises anything
            raise TraceError(f"profiler trace in {capture} could not be converted: {e}") from e
        cached = _write_cache(path, blob)
    _memory[key] = blob
    _memory.move_to_end(key)
    while len(_memory) > MEMORY_ENTRIES:
        _memory.popitem(last=False)
    payload = contract.decode_payload(blob)  # a fresh copy: the caller may change it
    return TraceProfile(payload=payload, step=_step_of(payload), trace_dir=capture, cached=cached)


def trace_runs(logdir: str) -> dict[str, str]:
    """Run name (its path relative to ``logdir``, ``"."`` for the logdir itself, as
    :func:`mpwatch.read.find_runs` names runs) -> run directory, for every directory under
    ``logdir`` whose ``plugins/profile/<capture>/`` holds a trace; ``{}`` when ``logdir`` is no
    readable directory."""
    root = os.fspath(logdir)
    out: dict[str, str] = {}
    if not root or not os.path.isdir(root):
        return out
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        if not any(is_trace_file(f) for f in filenames):
            continue
        run_dir = trace_run_dir(dirpath)
        if run_dir is None or os.path.relpath(run_dir, root).startswith(os.pardir):
            continue
        out[os.path.relpath(run_dir, root).replace(os.sep, "/")] = run_dir
    return dict(sorted(out.items()))


def trace_version(run_dir: str) -> str | None:
    """The cache key of the run's newest capture (it changes when a new capture arrives or a
    trace file changes), or None when the run holds no readable trace."""
    found = newest_capture(run_dir)
    if found is None:
        return None
    try:
        return trace_key(found[1])
    except OSError:
        return None
