"""The mpwatch TensorBoard plugin: JSON routes over TensorBoard's data provider, and the static tab.

Routes (under ``/data/plugin/mpwatch/``), all ``application/json``:

- ``runs``: the runs holding mpwatch data (others are not listed), with a version that changes
  while a run is being written; a run whose directory holds a raw profiler trace is one of them
  (its profile read from the trace when no record holds one: ``data/traces.py``), and so is a
  run whose event files the reader cannot read whole (a corrupt record, a file that is no event
  file, permission denied, a cut last record), even one of which nothing could be read: its
  findings say so (``damaged-logs``, as ``mpwatch diagnose`` says it: ``data/damage.py``).
- ``scalars?run=R[&points=N]``: every ``mpwatch/...`` scalar, downsampled on the server to at most N
  points (default 1,500) per tag, min and max kept, with ``count`` (the steps the tag was recorded
  at; see :func:`tensorboard_plugin_mpwatch.data.scalars_view`); the skipped steps.
- ``layers?run=R``: the per-layer table with findings as badges.
- ``probes?run=R[&step=S]``: probe steps, the layer × probe-step underflow heatmap, the probe at S.
- ``findings?run=R``: the run's findings, run facts and notices. Findings are judged as
  ``mpwatch diagnose LOGDIR`` judges them: over every run of the experiment at once
  (:func:`tensorboard_plugin_mpwatch.data.findings_by_run`), so a mixed run is compared with a
  float32 run of the same model, and the tab shows each run's share of the CLI's findings.
- ``profile?run=R``: the latest profile record and the panel's figures (``summary``: on a GPU
  trace mpwatch's Tensor Core share beside xprof's, the precisions, the unknown share), or null.

Every view is built from the run's :class:`mpwatch.read.Run` (``data.build_model``), once per
content of the run: a run's entry (its Run, findings and views) is reused while a fresh read of the
run through the data provider has the same fingerprint (every scalar point and record served), so
a record added late, even at an existing step and wall time, is served at the next request after
:data:`CHECK_TTL_S`. The findings (and the layer table's badges) depend on every run: they are
judged again when any run's fingerprint changes; the other runs are read again when TensorBoard's
listing of them changes.

Parameters are validated; an unknown run is a 404 JSON error. Nothing reads the file system with a
request parameter: static files are loaded once, by name, at start; raw traces are found by a walk
of ``--logdir``, and so are the event files checked for damage; a request's run name only picks
one of the runs found.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from typing import Any

from tensorboard import context as tb_context
from tensorboard import plugin_util
from tensorboard.backend import http_util
from tensorboard.plugins import base_plugin
from werkzeug import wrappers

from mpwatch import contract, words
from tensorboard_plugin_mpwatch import data

PLUGIN_NAME = contract.PLUGIN_NAME
TAB_NAME = "Mixed Precision"
STATIC_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "static")
CONTENT_TYPES = {
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
    ".png": "image/png",
}
DEFAULT_POINTS = 1500
MAX_POINTS = 20_000
MAX_RUN_LENGTH = 4096
# The run listing (two data-provider calls) is reused for this long: the tab's parallel requests
# share one, and TensorBoard itself reloads data every --reload_interval (5 s by default).
LISTING_TTL_S = 1.0
# A run's data is read again (and its fingerprint compared) at most this often: the tab's parallel
# requests after a reload share one read.
CHECK_TTL_S = 1.0
MAX_CACHED_RUNS = 32  # runs whose Run and views stay in memory


def _dumps(value: Any) -> str:
    """Strict JSON (NaN and infinities as null: browsers' JSON.parse refuses them)."""
    return json.dumps(data.json_safe(value), allow_nan=False, separators=(",", ":"))


class BadRequest(Exception):
    def __init__(self, message: str, code: int = 400) -> None:
        super().__init__(message)
        self.code = code


def _load_static() -> dict[str, tuple[bytes, str]]:
    files = {}
    for name in sorted(os.listdir(STATIC_DIR)):
        ext = os.path.splitext(name)[1]
        if ext in CONTENT_TYPES:
            with open(os.path.join(STATIC_DIR, name), "rb") as f:
                files[name] = (f.read(), CONTENT_TYPES[ext])
    return files


class _Entry:
    """One run's records, Run, findings and views, for one content of the run (its fingerprint)."""

    __slots__ = (
        "records",
        "model",
        "judged",
        "views",
        "decoded",
        "checked",
        "listed",
    )

    def __init__(self, records: data.RunRecords, decoded: dict[Any, Any], listed: str) -> None:
        self.records = records
        self.model = data.build_model(records)
        self.judged: str | None = None  # the experiment judgement its findings views were built on
        self.views: dict[Any, Any] = {}
        self.decoded = decoded  # content digest -> payload, kept across contents of the run
        self.checked = time.monotonic()  # when the run was last read and fingerprinted
        self.listed = listed  # the run listing's version then

    @property
    def fingerprint(self) -> str:
        return self.records.fingerprint


class MpwatchPlugin(base_plugin.TBPlugin):
    """TensorBoard's "Mixed Precision" tab."""

    plugin_name = PLUGIN_NAME

    def __init__(self, context: base_plugin.TBContext) -> None:
        self._provider = context.data_provider
        self._traces = data.TraceRuns(getattr(context, "logdir", None))
        self._damage = data.DamagedRuns(getattr(context, "logdir", None))
        self._scalar_limit = data.scalar_sample_limit(getattr(context, "sampling_hints", None))
        self._static = _load_static()
        self._cache: dict[tuple[str, str], _Entry] = {}
        self._listing: dict[str, tuple[float, dict[str, dict[str, Any]]]] = {}
        self._lock = threading.Lock()
        # experiment id -> (the runs' fingerprints digest, run -> (findings, note))
        self._judged: dict[str, tuple[str, data.Judged]] = {}
        self._judge_lock = threading.Lock()

    # --- TBPlugin -------------------------------------------------------------------------------
    def get_plugin_apps(self) -> dict[str, Any]:
        return {
            "/static/*": self._serve_static,
            "/runs": self._json_route(self._runs),
            "/scalars": self._json_route(self._scalars),
            "/layers": self._json_route(self._layers),
            "/probes": self._json_route(self._probes),
            "/findings": self._json_route(self._findings),
            "/profile": self._json_route(self._profile),
        }

    def is_active(self) -> bool:
        # data_plugin_names decides when mpwatch records exist; else a raw profiler trace does,
        # or an event file the reader cannot read (it may hold mpwatch data)
        try:
            return bool(self._traces.runs()) or bool(self._damage.runs())
        except Exception:  # noqa: BLE001 - the listing must not fail on a walk of the logdir
            return False

    def data_plugin_names(self) -> tuple[str, ...]:
        return (PLUGIN_NAME,)

    def frontend_metadata(self) -> base_plugin.FrontendMetadata:
        return base_plugin.FrontendMetadata(es_module_path="/static/index.js", tab_name=TAB_NAME)

    # --- plumbing -------------------------------------------------------------------------------
    @wrappers.Request.application
    def _serve_static(self, request: wrappers.Request) -> wrappers.Response:
        name = request.path.rsplit("/", 1)[-1]
        found = self._static.get(name)
        if found is None:
            return http_util.Respond(request, "not found", "text/plain", code=404)
        body, content_type = found
        return http_util.Respond(request, body, content_type)

    def _json_route(self, handler: Any) -> Any:
        @wrappers.Request.application
        def app(request: wrappers.Request) -> wrappers.Response:
            try:
                body, code = handler(request), 200
            except BadRequest as e:
                body, code = {"error": str(e)}, e.code
            text = body if isinstance(body, str) else _dumps(body)
            return http_util.Respond(request, text, "application/json", code=code)

        return app

    def _context(self, request: wrappers.Request) -> tuple[Any, str]:
        return tb_context.from_environ(request.environ), plugin_util.experiment_id(request.environ)

    def _entry(self, request: wrappers.Request) -> _Entry:
        run = request.args.get("run")
        if not run:
            raise BadRequest("missing parameter: run")
        if len(run) > MAX_RUN_LENGTH or "\x00" in run:
            raise BadRequest("invalid run name")
        ctx, eid = self._context(request)
        runs = self._list_runs(ctx, eid)
        if run not in runs:
            raise BadRequest("unknown run (or no mpwatch data in it)", code=404)
        return self._run_entry(ctx, eid, run, runs, fresh=True)

    def _run_entry(
        self, ctx: Any, eid: str, run: str, runs: dict[str, dict[str, Any]], fresh: bool
    ) -> _Entry:
        """The run's entry: reused while TensorBoard's listing of the run is unchanged and (when
        ``fresh``, the requested run) it was read less than :data:`CHECK_TTL_S` ago, or a fresh
        read has the same fingerprint; else built from a fresh read."""
        listed = runs[run]["version"]
        key = (eid, run)
        with self._lock:
            entry = self._cache.get(key)
            if (
                entry is not None
                and entry.listed == listed
                and (not fresh or time.monotonic() - entry.checked < CHECK_TTL_S)
            ):
                return entry
            decoded = entry.decoded if entry is not None else {}
            records = data.read_run(
                self._provider, ctx, eid, run, decoded, scalar_limit=self._scalar_limit
            )
            if runs[run].get("trace"):
                data.add_trace_profile(records, runs[run]["trace"], runs[run]["trace_version"])
            if runs[run].get("problems"):
                data.add_problems(records, runs[run]["problems"], runs[run]["damage"])
            if entry is not None and entry.fingerprint == records.fingerprint:
                entry.checked, entry.listed = time.monotonic(), listed  # same content: keep it
                return entry
            entry = _Entry(records, decoded, listed)
            self._cache.pop(key, None)
            self._cache[key] = entry
            # every run of an experiment is judged together: keep them all
            while len(self._cache) > max(MAX_CACHED_RUNS, len(runs)):  # drop the least recent
                self._cache.pop(next(iter(self._cache)))
        return entry

    def _entry_findings(
        self, request: wrappers.Request, entry: _Entry
    ) -> tuple[list[dict[str, Any]], str | None]:
        """The run's findings and note, from the judgement of every run of the experiment
        (:func:`data.findings_by_run`, cached until a run's fingerprint changes). A new judgement
        drops the entry's views built on the old one (findings, layers)."""
        ctx, eid = self._context(request)
        runs = self._list_runs(ctx, eid)
        entries = {
            name: self._run_entry(ctx, eid, name, runs, fresh=False)
            for name in runs
            if name != entry.model.name
        }
        entries[entry.model.name] = entry
        digest = hashlib.sha256(
            json.dumps(sorted((n, e.fingerprint) for n, e in entries.items())).encode()
        ).hexdigest()
        with self._judge_lock:
            judged = self._judged.get(eid)
            if judged is None or judged[0] != digest:
                # in name order, as the CLI reads a logdir: a mixed run's partner is the first
                # float32 run of its model
                by_run = data.findings_by_run({n: entries[n].model for n in sorted(entries)})
                judged = self._judged[eid] = (digest, by_run)
        if entry.judged != digest:
            entry.views.pop("findings", None)
            entry.views.pop("layers", None)
            entry.judged = digest
        return judged[1].get(entry.model.name, ([], None))

    @staticmethod
    def _int_arg(
        request: wrappers.Request, name: str, default: int | None, lo: int, hi: int
    ) -> Any:
        raw = request.args.get(name)
        if raw is None or raw == "":
            return default
        try:
            value = int(raw)
        except ValueError:
            raise BadRequest(f"parameter {name} must be an integer") from None
        if not lo <= value <= hi:
            raise BadRequest(f"parameter {name} must be between {lo} and {hi}")
        return value

    def _list_runs(self, ctx: Any, eid: str) -> dict[str, dict[str, Any]]:
        now = time.monotonic()
        cached = self._listing.get(eid)
        if cached is not None and now - cached[0] < LISTING_TTL_S:
            return cached[1]
        runs = data.merge_listing(
            data.list_mpwatch_runs(self._provider, ctx, eid), self._traces.versions()
        )
        runs = data.merge_damage(runs, self._damage.runs())
        self._listing[eid] = (now, runs)
        return runs

    @staticmethod
    def _view(entry: _Entry, key: Any, build: Any) -> str:
        """A view's JSON text, built once per run version."""
        text = entry.views.get(key)
        if text is None:
            text = entry.views[key] = _dumps(build())
        return text

    # --- routes -----------------------------------------------------------------------------------
    def _runs(self, request: wrappers.Request) -> dict[str, Any]:
        ctx, eid = self._context(request)
        runs = self._list_runs(ctx, eid)
        return {
            "runs": [
                {"name": name, "max_step": r["max_step"], "version": r["version"]}
                for name, r in sorted(runs.items())
            ]
        }

    def _scalars(self, request: wrappers.Request) -> str:
        points = self._int_arg(request, "points", DEFAULT_POINTS, 10, MAX_POINTS)
        entry = self._entry(request)
        if points != DEFAULT_POINTS:  # cache the tab's own request only
            return _dumps(data.scalars_view(entry.records, entry.model, points))
        return self._view(
            entry, "scalars", lambda: data.scalars_view(entry.records, entry.model, points)
        )

    def _layers(self, request: wrappers.Request) -> str:
        entry = self._entry(request)
        found, _ = self._entry_findings(request, entry)
        return self._view(entry, "layers", lambda: data.layers_view(entry.model, found))

    def _probes(self, request: wrappers.Request) -> str:
        step = self._int_arg(request, "step", None, 0, 2**62)
        entry = self._entry(request)
        try:  # keys: None and the run's probe steps (a bad step raises before caching)
            return self._view(entry, ("probes", step), lambda: data.probes_view(entry.model, step))
        except KeyError:
            raise BadRequest(f"no probe at step {step}", code=404) from None

    def _findings(self, request: wrappers.Request) -> str:
        entry = self._entry(request)
        found, note = self._entry_findings(request, entry)

        if not found and note is None and entry.model.profile_trace and not entry.model.info:
            note = words.NO_FINDINGS_TRACE_ONLY[:1].upper() + words.NO_FINDINGS_TRACE_ONLY[1:] + "."

        def build() -> dict[str, Any]:
            return {
                "run": entry.model.name,
                "findings": found,
                "note": note,
                **data.info_view(entry.model),
            }

        return self._view(entry, "findings", build)

    def _profile(self, request: wrappers.Request) -> str:
        entry = self._entry(request)
        return self._view(entry, "profile", lambda: data.profile_view(entry.model))
