"""The tab's server-side data: from TensorBoard's data provider to a :class:`mpwatch.read.Run`,
and from the Run to the tab's JSON views.

Every value comes from ``context.data_provider``, but for raw profiler traces, which TensorBoard
does not serve: those are read under ``--logdir`` by :mod:`mpwatch.read.traces` (``traces.py``),
and for what the reader cannot read of the event files, which TensorBoard does not say
(``damage.py``).
Records are
decoded with :mod:`mpwatch.contract`; :func:`build_model` turns them into the same
:class:`mpwatch.read.Run` that ``mpwatch.load_run`` builds from event files (same tables, joining of
split records, purges), and every view reads its numbers from that Run and its accessors
(``latest_probe``, ``skipped_steps``, ``probe_layers``, ...), so the tab, the CLI and the advisor
see one run. The only numbers not taken from the Run are the scalar series' points themselves: the
Run's scalar table uses NaN for "not recorded at this step", and a recorded NaN (a loss gone NaN)
must reach the chart as a gap at its step.

- ``provider.py``: what TensorBoard serves: the runs with mpwatch data (:func:`list_mpwatch_runs`),
  one run's scalars and records decoded (:func:`read_run`, a :class:`RunRecords`), and the Run
  built from them (:func:`build_model`).
- ``scalars.py``: the scalars route: every series downsampled and counted, the skipped steps
  (:func:`scalars_view`).
- ``views.py``: the other routes' payloads, read from the Run: :func:`layers_view`,
  :func:`probes_view`, :func:`profile_view`, :func:`info_view`.
- ``traces.py``: the runs whose directory holds a raw profiler trace (:class:`TraceRuns`), their
  profile when no record holds one (:func:`add_trace_profile`), the listing with them
  (:func:`merge_listing`).
- ``damage.py``: what the reader cannot read of the runs' event files, which TensorBoard does not
  say (:class:`DamagedRuns`, checked by the reader's own check), given to the run's Run
  (:func:`add_problems`) and listed (:func:`merge_damage`): the ``damaged-logs`` findings.
- ``findings.py``: every run's findings, judged as ``mpwatch diagnose LOGDIR`` judges them
  (:func:`findings_by_run`).

>>> json_safe({"a": float("nan"), "b": [1.0, float("inf")]})
{'a': None, 'b': [1.0, None]}
"""

from mpwatch.contract import json_safe
from tensorboard_plugin_mpwatch.data.damage import DamagedRuns, add_problems, merge_damage
from tensorboard_plugin_mpwatch.data.findings import Judged, findings_by_run
from tensorboard_plugin_mpwatch.data.provider import (
    RunRecords,
    build_model,
    list_mpwatch_runs,
    read_run,
    scalar_sample_limit,
)
from tensorboard_plugin_mpwatch.data.scalars import downsample, recorded_steps, scalars_view
from tensorboard_plugin_mpwatch.data.traces import TraceRuns, add_trace_profile, merge_listing
from tensorboard_plugin_mpwatch.data.views import (
    info_view,
    layers_view,
    probes_view,
    profile_summary,
    profile_view,
)

__all__ = [
    "DamagedRuns",
    "Judged",
    "RunRecords",
    "TraceRuns",
    "add_problems",
    "add_trace_profile",
    "build_model",
    "downsample",
    "findings_by_run",
    "info_view",
    "json_safe",
    "layers_view",
    "list_mpwatch_runs",
    "merge_damage",
    "merge_listing",
    "probes_view",
    "profile_summary",
    "profile_view",
    "read_run",
    "recorded_steps",
    "scalar_sample_limit",
    "scalars_view",
]
