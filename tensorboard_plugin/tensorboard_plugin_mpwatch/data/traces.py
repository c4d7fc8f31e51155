"""Runs holding a raw profiler trace: the tab shows their profile as ``mpwatch diagnose`` does.

TensorBoard's data provider serves event files, not the profiler's traces
(``RUN/plugins/profile/<capture>/<host>.xplane.pb``, from Keras' ``TensorBoard(profile_batch=...)``
or ``jax.profiler``). A run whose records hold no ``profile`` and whose directory under
TensorBoard's ``--logdir`` holds a trace gets the profile of its newest capture through
:mod:`mpwatch.read.traces`, the reader ``mpwatch.load_run`` uses: converted once, cached outside
the logdir, nothing written into it. A run that holds only a trace (no event file at all) is a run
of the tab too.

Run names come from the scan of ``--logdir`` (:class:`TraceRuns`); a request's run name only
picks one of them, never builds a path.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from mpwatch import contract
from mpwatch.read import traces
from tensorboard_plugin_mpwatch.data.provider import RunRecords

__all__ = ["SCAN_TTL_S", "TraceRuns", "add_trace_profile", "merge_listing"]

#: the logdir is walked for traces at most this often (TensorBoard reloads every 5 s by default)
SCAN_TTL_S = 5.0


class TraceRuns:
    """The runs under ``logdir`` that hold a raw trace: run name -> run directory, from a walk
    of the logdir repeated at most every :data:`SCAN_TTL_S` seconds. No logdir (TensorBoard
    started with ``--logdir_spec`` or a remote one): none."""

    def __init__(self, logdir: str | None, ttl: float = SCAN_TTL_S) -> None:
        self.logdir = logdir or ""
        self.ttl = ttl
        self._lock = threading.Lock()
        self._at = -float("inf")
        self._runs: dict[str, str] = {}

    def runs(self) -> dict[str, str]:
        with self._lock:
            now = time.monotonic()
            if now - self._at >= self.ttl:
                try:
                    self._runs = traces.trace_runs(self.logdir)
                except OSError:
                    self._runs = {}
                self._at = now
            return self._runs

    def versions(self) -> dict[str, tuple[str, str]]:
        """Run name -> (run directory, the newest capture's version) for the runs whose trace
        can be read now."""
        out = {}
        for name, run_dir in self.runs().items():
            version = traces.trace_version(run_dir)
            if version is not None:
                out[name] = (run_dir, version)
        return out


def _merged(records: RunRecords) -> dict[str, list[tuple[int, Any]]]:
    """The layers and budget records, each step's parts merged (a split ``layers`` table)."""
    from mpwatch.read.assemble import _merge_parts

    out: dict[str, list[tuple[int, Any]]] = {}
    for kind in (contract.KIND_LAYERS, contract.KIND_BUDGET):
        by_step: dict[int, list[dict[str, Any]]] = {}
        for step, payload in records.records.get(kind) or []:
            by_step.setdefault(int(step), []).append(dict(payload))
        out[kind] = [(s, _merge_parts(ps)[0]) for s, ps in sorted(by_step.items())]
    return out


def add_trace_profile(records: RunRecords, run_dir: str, version: str) -> None:
    """Give ``records`` the profile of the run's raw trace when they hold no ``profile`` record
    (a record wins: it was made with the model); a trace that cannot be converted is an error of
    the run, as the CLI's reader warns."""
    if records.records.get(contract.KIND_PROFILE):
        return
    try:
        found = traces.trace_profile(run_dir, *traces.deferred_context(_merged(records)))
    except traces.TraceError as e:
        records.errors.append(f"the profiler trace was not read: {e}")
        return
    if found is None:
        return
    records.records[contract.KIND_PROFILE] = [(found.step, found.payload)]
    records.trace = found.trace_dir
    records.fingerprint = f"{records.fingerprint}:trace:{version}"


def listed(listing: dict[str, dict[str, Any]], name: str) -> dict[str, Any]:
    """The run's entry in the tab's run listing, made (step 0, no records) where TensorBoard
    serves no mpwatch data of it (a run holding only a trace, or only damaged files)."""
    return listing.setdefault(
        name, {"max_step": 0, "max_wall_time": 0.0, "records": 0, "version": "0"}
    )


def merge_listing(
    listing: dict[str, dict[str, Any]], trace_runs: dict[str, tuple[str, str]]
) -> dict[str, dict[str, Any]]:
    """The tab's run listing with the runs holding a trace: each gains ``trace`` (its directory)
    and ``trace_version``, its ``version`` the trace's (so a new capture is a new version); a run
    holding only a trace is listed with step 0."""
    out = {name: dict(entry) for name, entry in listing.items()}
    for name, (run_dir, version) in trace_runs.items():
        entry = listed(out, name)
        entry["trace"] = run_dir
        entry["trace_version"] = version
        entry["version"] = f"{entry['version']}:{version[:16]}"
    return dict(sorted(out.items()))
