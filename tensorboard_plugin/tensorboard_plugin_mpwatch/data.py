"""From TensorBoard's data provider to a :class:`mpwatch.read.Run`, and from the Run to the tab's
JSON views.

Nothing here touches the file system: every value comes from ``context.data_provider``. Records are
decoded with :mod:`mpwatch.contract`; :func:`build_model` turns them into the same
:class:`mpwatch.read.Run` that ``mpwatch.load_run`` builds from event files (same tables, joining of
split records, purges), and every view reads its numbers from that Run and its accessors
(``latest_probe``, ``skipped_steps``, ``probe_layers``, ...), so the tab, the CLI and the advisor
see one run. The only numbers not taken from the Run are the scalar series' points themselves: the
Run's scalar table uses NaN for "not recorded at this step", and a recorded NaN (a loss gone NaN)
must reach the chart as a gap at its step.

What TensorBoard serves (and what it does not):

- **Scalars** are a sample: TensorBoard keeps ``--samples_per_plugin scalars=N`` points per tag
  (1,000 by default), the last one always. A series' ``count`` in :func:`scalars_view` is the
  number of steps the tag was recorded at: exact when TensorBoard served the whole series
  (``count_exact``), else counted on the series' cadence between its first and last served steps.
- **Records** are kept whole (the loader sets ``mpwatch=0``). A record split into parts at one
  step (a probe over ``contract.MAX_RECORD_BYTES``) reaches the tab whole under TensorBoard's
  Python loader (``--load_fast=false``); TensorBoard's data server (``--load_fast=auto``, the
  default where the ``tensorboard-data-server`` binary runs) keeps one value per tag and step, so
  only the last part arrives. :func:`read_run` notices a split record with missing parts, leaves a
  fragment without its first part out of the Run, and says so in the run's errors.

>>> json_safe({"a": float("nan"), "b": [1.0, float("inf")]})
{'a': None, 'b': [1.0, None]}
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
from tensorboard.data import provider as tb_provider

from mpwatch import contract
from mpwatch.contract import json_safe, later_writes_win
from mpwatch.read import ProbeResult, Run, run_from_records
from mpwatch.read.run import PROBE_TOP_KEYS
from mpwatch.words import plain

__all__ = [
    "Judged",
    "RunRecords",
    "build_model",
    "findings_by_run",
    "info_view",
    "json_safe",
    "layers_view",
    "list_mpwatch_runs",
    "probes_view",
    "profile_summary",
    "profile_view",
    "read_run",
    "scalar_sample_limit",
    "scalars_view",
]

SCALARS_PLUGIN = "scalars"
# Scalars are read at most this many points per tag from the data provider; TensorBoard's own
# reservoir keeps 1,000 per tag unless --samples_per_plugin says otherwise.
READ_SCALARS = 100_000
TB_SCALAR_SAMPLES = 1000  # TensorBoard's default sample per scalar tag (both loaders)
READ_TENSORS = 1_000_000  # records: keep all (the loader sets mpwatch=0)


@dataclass
class RunRecords:
    """Everything mpwatch wrote into one run, as the data provider serves it.

    Attributes:
        name: the run.
        scalars: tag -> (steps, values) after "later writes win", in step order.
        served: tag -> how many points TensorBoard served (its sample, before "later writes win").
        sampled: tag -> whether TensorBoard (or :data:`READ_SCALARS`) served only a sample.
        records: kind -> [(step, payload)] in step order, parts of a split record in write order.
        errors: records that could not be decoded, split records with missing parts.
        fingerprint: a digest of every point and record served: it changes whenever a scalar or a
            record is added or replaced, even at an existing step and wall time.
    """

    name: str
    scalars: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)
    served: dict[str, int] = field(default_factory=dict)
    sampled: dict[str, bool] = field(default_factory=dict)
    records: dict[str, list[tuple[int, dict[str, Any]]]] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    fingerprint: str = ""


def _floats(arr: np.ndarray) -> list[float | None]:
    """A float array as a JSON list (non-finite -> None), fast for long series."""
    arr = np.asarray(arr, dtype=np.float64)
    out: list[Any] = arr.tolist()
    if not np.isfinite(arr).all():
        for i in np.flatnonzero(~np.isfinite(arr)).tolist():
            out[i] = None
    return out


def scalar_sample_limit(sampling_hints: Any) -> int:
    """How many points per scalar tag the tab can be served: TensorBoard's sample size
    (``--samples_per_plugin scalars=N``; 0 keeps all) capped by :data:`READ_SCALARS`.

    >>> scalar_sample_limit(None), scalar_sample_limit({"scalars": 0}), scalar_sample_limit({})
    (1000, 100000, 1000)
    """
    hint = (sampling_hints or {}).get(SCALARS_PLUGIN)
    if hint is None:
        return TB_SCALAR_SAMPLES
    return READ_SCALARS if int(hint) == 0 else min(int(hint), READ_SCALARS)


# --- reading from the data provider ---------------------------------------------------------------
def list_mpwatch_runs(provider: Any, ctx: Any, experiment_id: str) -> dict[str, dict[str, Any]]:
    """Runs holding mpwatch data -> {max_step, max_wall_time, records, version}.

    ``version`` is a digest of every mpwatch tag's (max step, max wall time): cheap, and it changes
    as a run being written gains steps. It cannot see a record added at a tag's last step and wall
    time; the tab's cache compares :attr:`RunRecords.fingerprint` (the content) instead.
    """
    out: dict[str, dict[str, Any]] = {}
    marks: dict[str, list[str]] = {}

    def note(run: str, tag: str, series: Any) -> None:
        entry = out.setdefault(run, {"max_step": 0, "max_wall_time": 0.0, "records": 0})
        entry["max_step"] = max(entry["max_step"], int(series.max_step))
        entry["max_wall_time"] = max(entry["max_wall_time"], float(series.max_wall_time))
        marks.setdefault(run, []).append(
            f"{tag}\x00{int(series.max_step)}\x00{float(series.max_wall_time)!r}"
        )

    tensors = provider.list_tensors(
        ctx, experiment_id=experiment_id, plugin_name=contract.PLUGIN_NAME
    )
    for run, tags in tensors.items():
        for tag, series in tags.items():
            if contract.kind_of_tag(tag) is not None:
                note(run, tag, series)
                out[run]["records"] += 1
    scalars = provider.list_scalars(ctx, experiment_id=experiment_id, plugin_name=SCALARS_PLUGIN)
    for run, tags in scalars.items():
        for tag, series in tags.items():
            if tag.startswith(contract.PREFIX):
                note(run, tag, series)
    for run, entry in out.items():
        digest = hashlib.blake2b("\x01".join(sorted(marks[run])).encode(), digest_size=8)
        entry["version"] = f"{entry['max_step']}:{digest.hexdigest()}"
    return out


def _blob(datum: Any) -> bytes:
    value = datum.numpy
    value = value.item() if hasattr(value, "item") else value
    if not isinstance(value, bytes):
        raise TypeError(f"expected a string tensor, got {type(value).__name__}")
    return value


def _check_parts(
    tag: str, items: list[tuple[int, dict[str, Any]]], errors: list[str]
) -> list[tuple[int, dict[str, Any]]]:
    """Split records (``"parts": n`` in each part, ``"part": i >= 1`` in all but the first) with
    missing parts: say so, and leave out a step whose first part is missing (a fragment holds no
    model row, no layer table, no histogram: it would stand in for the whole record)."""
    by_step: dict[int, list[dict[str, Any]]] = {}
    for step, payload in items:
        by_step.setdefault(step, []).append(payload)
    dropped: set[int] = set()
    for step, payloads in by_step.items():
        split = [p for p in payloads if isinstance(p.get("parts"), int) and p["parts"] > 1]
        if not split:
            continue
        n = max(p["parts"] for p in split)
        seen = {p.get("part", 0) if isinstance(p.get("part", 0), int) else -1 for p in split}
        if seen >= set(range(n)):
            continue
        got = len(seen & set(range(n)))
        if 0 not in seen:
            dropped.add(step)
            what = "left out (its first part, with the model row and layer table, is missing)"
        else:
            what = "incomplete (its tables hold only the parts that arrived)"
        errors.append(
            f"{tag} at step {step}: {got} of {n} parts of a split record reached the tab, so the "
            f"record is {what}. TensorBoard's data server keeps one value per tag and step; "
            "`mpwatch diagnose` reads every part, and so does TensorBoard with --load_fast=false."
        )
    if not dropped:
        return items
    return [(s, p) for s, p in items if s not in dropped]


def read_run(
    provider: Any,
    ctx: Any,
    experiment_id: str,
    run: str,
    decoded: dict[Any, Any] | None = None,
    scalar_limit: int = TB_SCALAR_SAMPLES,
) -> RunRecords:
    """Read and decode every mpwatch scalar and record of ``run``.

    ``decoded`` maps a record's content digest to its decoded payload (or its error) and is updated
    in place (entries of records no longer served are dropped): pass the previous read's to decode
    only the new records of a run still being written. ``scalar_limit`` is the number of points per
    scalar tag the provider serves at most (:func:`scalar_sample_limit`): a tag served that many
    is a sample.
    """
    decoded = {} if decoded is None else decoded
    result = RunRecords(name=run)
    fp = hashlib.blake2b(digest_size=16)
    listing = provider.list_scalars(
        ctx,
        experiment_id=experiment_id,
        plugin_name=SCALARS_PLUGIN,
        run_tag_filter=tb_provider.RunTagFilter(runs=[run]),
    ).get(run, {})
    tags = sorted(t for t in listing if t.startswith(contract.PREFIX))
    if tags:
        data = provider.read_scalars(
            ctx,
            experiment_id=experiment_id,
            plugin_name=SCALARS_PLUGIN,
            downsample=min(scalar_limit, READ_SCALARS),
            run_tag_filter=tb_provider.RunTagFilter(runs=[run], tags=tags),
        ).get(run, {})
        for tag, points in sorted(data.items()):
            n = len(points)
            steps = np.fromiter((p.step for p in points), dtype=np.int64, count=n)
            values = np.fromiter((p.value for p in points), dtype=np.float64, count=n)
            walls = np.fromiter((p.wall_time for p in points), dtype=np.float64, count=n)
            fp.update(f"s\x00{tag}\x00{n}\x00".encode())
            fp.update(steps.tobytes())
            fp.update(values.tobytes())
            fp.update(walls.tobytes())
            result.served[tag] = n
            result.sampled[tag] = n >= min(scalar_limit, READ_SCALARS)
            # points come in write order (files in name order): a resumed run's later writes win
            keep = later_writes_win(np.arange(n), steps)
            steps, values = steps[keep], values[keep]
            order = np.argsort(steps, kind="stable")
            result.scalars[tag] = (steps[order], values[order])

    tensors = provider.list_tensors(
        ctx,
        experiment_id=experiment_id,
        plugin_name=contract.PLUGIN_NAME,
        run_tag_filter=tb_provider.RunTagFilter(runs=[run]),
    ).get(run, {})
    kinds: dict[str, str] = {}
    for tag, series in tensors.items():
        kind = contract.kind_of_tag(tag)
        if kind is None:
            continue
        try:
            meta = contract.parse_metadata_content(series.plugin_content or b"{}")
        except ValueError as e:
            result.errors.append(f"{tag}: {e}")
            continue
        kinds[tag] = meta.get("kind", kind)
    seen: set[Any] = set()
    if kinds:
        data = provider.read_tensors(
            ctx,
            experiment_id=experiment_id,
            plugin_name=contract.PLUGIN_NAME,
            downsample=READ_TENSORS,
            run_tag_filter=tb_provider.RunTagFilter(runs=[run], tags=sorted(kinds)),
        ).get(run, {})
        for tag, points in sorted(data.items()):
            fp.update(f"r\x00{tag}\x00{len(points)}\x00".encode())
            digests: list[Any] = []
            for p in points:
                try:
                    blob = _blob(p)
                    key: Any = (tag, hashlib.blake2b(blob, digest_size=16).digest())
                except (TypeError, ValueError) as e:
                    blob, key = b"", (tag, "undecodable", int(p.step), float(p.wall_time))
                    decoded.setdefault(key, ValueError(f"{tag} at step {p.step}: {e}"))
                fp.update(f"{int(p.step)}\x00{float(p.wall_time)!r}\x00".encode())
                fp.update(key[1] if isinstance(key[1], bytes) else repr(key).encode())
                digests.append((key, blob))
            steps = np.fromiter((p.step for p in points), dtype=np.int64, count=len(points))
            kept = later_writes_win(np.arange(len(steps)), steps, strict=True).tolist()
            items: list[tuple[int, dict[str, Any]]] = []
            for i in kept:
                p, (key, blob) = points[i], digests[i]
                seen.add(key)
                if key not in decoded:
                    try:
                        decoded[key] = contract.decode_payload(blob)
                    except (ValueError, TypeError) as e:
                        decoded[key] = ValueError(f"{tag} at step {p.step}: {e}")
                value = decoded[key]
                if isinstance(value, ValueError):
                    result.errors.append(str(value))
                else:
                    items.append((int(p.step), value))
            items.sort(key=lambda item: item[0])
            items = _check_parts(tag, items, result.errors)
            result.records.setdefault(kinds[tag], []).extend(items)
    for key in [k for k in decoded if k not in seen]:
        del decoded[key]
    result.fingerprint = fp.hexdigest()
    return result


# --- the run model and the findings (mpwatch.read / mpwatch.judge) ---------------------------
def build_model(records: RunRecords) -> Run:
    """The :class:`mpwatch.read.Run` of decoded records: the Run ``mpwatch.load_run`` builds from
    event files (same tables, part merging and purges), so the advisor sees the same run in the
    tab and in the CLI."""
    return run_from_records(
        records.name, scalars=records.scalars, records=records.records, warnings=records.errors
    )


FINDING_KEYS = ("severity", "layer", "rule", "title", "evidence", "fix", "why")


def _finding_json(f: Any) -> dict[str, Any]:
    d = f.to_dict()
    return {k: d.get(k) for k in FINDING_KEYS}


#: run name -> (its findings as dicts, why there are none when the advisor failed)
Judged = dict[str, tuple[list[dict[str, Any]], str | None]]


def findings_by_run(models: Mapping[str, Run]) -> Judged:
    """Each run's findings (as dicts) and why there are none when the advisor failed, judged as
    ``mpwatch diagnose LOGDIR`` judges them: :func:`mpwatch.judge.diagnose_runs` over every run of
    the experiment (a mixed run compared with a float32 run of the same model, a measured
    comparison replacing its ``no-tensor-cores`` finding), then split by run, in the CLI's order.

    ``models``: run name -> its Run. When the joint diagnosis fails (a run still being written may
    be incomplete), each run is judged alone and its note says that it was not compared.
    """
    from mpwatch.judge import diagnose_run, diagnose_runs

    try:
        found = diagnose_runs(list(models.values()))
    except Exception as e:  # keep the tab: judge each run alone, say why
        why = f"{type(e).__name__}: {e}"
        out: Judged = {}
        for name, model in models.items():
            try:
                alone = [_finding_json(f) for f in diagnose_run(model)]
                out[name] = (alone, f"judged alone (the comparison of runs failed: {why})")
            except Exception as e1:  # noqa: BLE001 - this run's data may be incomplete
                out[name] = ([], f"the advisor failed on this run: {type(e1).__name__}: {e1}")
        return out
    by_run: dict[str, list[dict[str, Any]]] = {name: [] for name in models}
    for f in found:
        by_run.setdefault(str(f.run), []).append(_finding_json(f))
    return {name: (items, None) for name, items in by_run.items()}


# --- views ---------------------------------------------------------------------------------------
def _rows(df: pd.DataFrame) -> list[dict[str, Any]]:
    """A Run table as row dicts, missing values (NaN) as None."""
    if not len(df):
        return []
    return df.astype(object).where(pd.notna(df), None).to_dict("records")


def _split(df: pd.DataFrame, drop: tuple[str, ...] = ("step",)) -> dict[str, Any] | None:
    """A Run table back in the record layout (``{"columns", "data"}``), None when empty."""
    if not len(df.columns):
        return None
    df = df.drop(columns=[c for c in drop if c in df.columns])
    rows = df.astype(object).where(pd.notna(df), None).values.tolist()
    return contract.table([str(c) for c in df.columns], rows)


def downsample(steps: np.ndarray, values: np.ndarray, points: int) -> tuple[np.ndarray, np.ndarray]:
    """At most ``points`` points: per bucket of equal step count keep the first, min and max points
    (so spikes and drops survive) and always the last point."""
    n = len(steps)
    if n <= points:
        return steps, values
    buckets = max(1, points // 3)
    edges = np.linspace(0, n, buckets + 1).astype(np.int64)
    keep = [edges[:-1]]
    finite = np.where(np.isfinite(values), values, np.nan)
    starts = edges[:-1]
    valid = edges[1:] > starts
    starts = starts[valid]
    with np.errstate(all="ignore"):
        filled_hi = np.where(np.isnan(finite), -np.inf, finite)
        filled_lo = np.where(np.isnan(finite), np.inf, finite)
    # argmax/argmin per bucket via reduceat on values, then locate the index
    hi = np.maximum.reduceat(filled_hi, starts)
    lo = np.minimum.reduceat(filled_lo, starts)
    bucket_of = np.repeat(np.arange(len(starts)), np.diff(np.append(starts, n)))
    is_hi = filled_hi == hi[bucket_of]
    is_lo = filled_lo == lo[bucket_of]
    first_hi = np.flatnonzero(is_hi)
    first_lo = np.flatnonzero(is_lo)
    keep.append(first_hi[np.unique(bucket_of[first_hi], return_index=True)[1]])
    keep.append(first_lo[np.unique(bucket_of[first_lo], return_index=True)[1]])
    nonfinite = np.flatnonzero(~np.isfinite(values))[:points]
    keep.append(nonfinite)
    keep.append(np.array([n - 1]))
    idx = np.unique(np.concatenate(keep))
    return steps[idx], values[idx]


def recorded_steps(steps: np.ndarray, sampled: bool) -> tuple[int, bool]:
    """How many steps a scalar tag was recorded at, and whether that count is exact.

    The whole series served: its length, exact. A sample: the steps on the series' cadence (the
    greatest common divisor of the gaps between served steps: 1 for a per-step tag, ``log_every``
    for an interval tag) from the first served step to the last (always served): exact for
    mpwatch's regular tags when TensorBoard kept the first point.

    >>> recorded_steps(np.array([3, 7, 10]), sampled=False)
    (3, True)
    >>> recorded_steps(np.array([10, 40, 50, 90]), sampled=True)  # every 10 steps, 10 to 90
    (9, False)
    """
    n = len(steps)
    if not sampled or n < 2:
        return n, not sampled
    gaps = np.diff(steps)
    gaps = gaps[gaps > 0]
    cadence = int(np.gcd.reduce(gaps)) if len(gaps) else 1
    return int((int(steps[-1]) - int(steps[0])) // max(cadence, 1) + 1), False


SKIPPED_LIMIT = 10_000


def _skipped_spans(model: Run) -> list[list[int]]:
    """Without the per-step flag ``mpwatch/step_skipped`` (a run recorded without it), only the
    cumulative ``mpwatch/skipped_steps_total`` says where skips happened: ``[first, last, count]``
    per rise, the steps between the previous recorded point and this one. Which steps of the span
    were skipped is unknown, so the tab shades the span and marks no single step."""
    if len(model.scalar(contract.STEP_SKIPPED)):
        return []
    total = model.scalar(contract.SKIPPED_STEPS_TOTAL)
    total = total[np.isfinite(total)]
    if not len(total):
        return []
    steps = total.index.to_numpy(dtype=np.int64)
    rise = np.round(np.diff(total.to_numpy(), prepend=0.0)).astype(np.int64)
    recorded = model.scalars.index.to_numpy(dtype=np.int64)
    before = recorded[(recorded >= 1) & (recorded < steps[0])]
    first_step = int(before.min()) if len(before) else 1  # batch steps start at 1
    starts = np.concatenate([[first_step], steps[:-1] + 1])
    return [[int(a), int(b), int(k)] for a, b, k in zip(starts, steps, rise) if k > 0][
        :SKIPPED_LIMIT
    ]


def skipped_view(model: Run, records: RunRecords) -> dict[str, Any]:
    """The skipped-step markers and total, from :meth:`Run.skipped_steps`.

    ``skipped_steps`` are exactly the steps whose update the optimizer dropped, from the per-step
    flag ``mpwatch/step_skipped`` (never a step whose update was applied, never the step of an
    interval counter). A run without the flag has only the cumulative count: its skips are
    ``skipped_spans`` (``[first, last, count]``, see :func:`_skipped_spans`) and no step is
    marked. When TensorBoard served only a sample of ``mpwatch/step_skipped``, some skipped steps
    are not in it: the total then comes from the cumulative ``mpwatch/skipped_steps_total`` (its
    last point is always served), and ``skipped_marked_all`` is false.
    """
    spans = _skipped_spans(model)
    per_step = model.skipped_steps()
    if spans:  # the counter's rises, not steps: nothing to mark at a step
        total = int(per_step.sum())
        return {
            "skipped_steps": [],
            "skipped_spans": spans,
            "skipped_total": total,
            "skipped_marked_all": False,
        }
    steps = per_step.index.to_numpy(dtype=np.int64)
    total = int(per_step.sum())
    flag = contract.STEP_SKIPPED
    complete = not (flag in model.scalars.columns and records.sampled.get(flag, False))
    if not complete:
        cumulative = model.scalar(contract.SKIPPED_STEPS_TOTAL)
        cumulative = cumulative[np.isfinite(cumulative)]
        if len(cumulative):
            total = max(total, int(round(float(cumulative.iloc[-1]))))
        complete = total == int(per_step.sum())
    return {
        "skipped_steps": steps[:SKIPPED_LIMIT].tolist(),
        "skipped_spans": [],
        "skipped_total": total,
        "skipped_marked_all": bool(complete and len(steps) <= SKIPPED_LIMIT),
    }


def _initial_scale(records: RunRecords) -> tuple[int, float] | None:
    """The scale the run's first step used, from its first ``run_info`` record (written at the step
    before the first batch and never sampled away, unlike a scalar point): the optimizer's scale
    then, or its ``initial_scale`` when it was not built yet. None for a resumed or continued run
    (``iterations`` past 0) and without a dynamic loss scale."""
    infos = records.records.get(contract.KIND_RUN_INFO) or []
    if not infos:
        return None
    step, info = min(infos, key=lambda item: item[0])
    ls = info.get("loss_scale") if isinstance(info, dict) else None
    start = info.get("start") if isinstance(info, dict) else None
    if not isinstance(ls, dict) or ls.get("kind") != "dynamic" or not isinstance(start, dict):
        return None
    if start.get("iterations") != 0:
        return None
    scale = start.get("loss_scale")
    scale = ls.get("initial") if scale is None else scale
    if not isinstance(scale, (int, float)) or not np.isfinite(scale):
        return None
    return int(step), float(scale)


def _loss_scale_from_the_first_step(
    records: RunRecords, steps: np.ndarray, values: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """``mpwatch/loss_scale`` is the scale after each step, and the recorder writes the scale before
    the first step at step 0. Where that point is missing (TensorBoard's reservoir sampled it away,
    or a run recorded before it was written), the run's first ``run_info`` gives it."""
    first = _initial_scale(records)
    if first is None or (len(steps) and int(steps[0]) <= first[0]):
        return steps, values
    return (
        np.concatenate([[first[0]], steps]).astype(np.int64),
        np.concatenate([[first[1]], values]).astype(np.float64),
    )


def scalars_view(records: RunRecords, model: Run, points: int) -> dict[str, Any]:
    """Every mpwatch scalar series, downsampled to at most ``points`` points, and the skipped steps.

    Per series: ``steps`` and ``values`` (the points drawn), ``count`` (how many steps the tag was
    recorded at, see :func:`recorded_steps`), ``count_exact`` (false when TensorBoard served only a
    sample and ``count`` is counted on the series' cadence), ``served`` (how many points
    TensorBoard served: its sample). The loss scale starts at the run's first step
    (:func:`_loss_scale_from_the_first_step`).
    """
    series = {}
    for tag, (steps, values) in sorted(records.scalars.items()):
        count, exact = recorded_steps(steps, records.sampled.get(tag, False))
        if tag == contract.LOSS_SCALE:
            steps, values = _loss_scale_from_the_first_step(records, steps, values)
        s, v = downsample(steps, values, points)
        series[tag] = {
            "steps": s.tolist(),
            "values": _floats(v),
            "count": count,
            "count_exact": exact,
            "served": int(records.served.get(tag, len(steps))),
        }
    return {"run": model.name, "series": series, **skipped_view(model, records)}


LAYER_COLUMNS = (
    "name",
    "class",
    "compute_dtype",
    "variable_dtype",
    "output_dtype",
    "effective_dtype",
    "params",
    "underflow_fraction",
    "grad_rel_error",
    "output_rel_error",
    "max_abs_activation",
    "time_share",
    "tensor_core_share",
    "tc_aligned",
    "is_output",
    "note",
)


def layers_view(model: Run, found: list[dict[str, Any]]) -> dict[str, Any]:
    """The per-layer table: dtypes from the Run's layer table, numerics from its latest probe
    (:meth:`Run.latest_probe`), time share from its profile, findings per layer.

    The time share is the GPU kernels' device time on a GPU trace (``time_source``
    ``device_kernels``, with each layer's ``tensor_core_share``), else the profiled ops' time
    (``host_ops``/``device_ops``). Layers the profile or the probe saw that the layer table lacks
    (a trace summarized without a model) get rows of their own."""
    layers = _rows(model.layers) if "name" in model.layers.columns else []
    probe = model.latest_probe()
    by_layer_probe: dict[Any, dict[str, Any]] = {}
    if probe is not None and "layer" in probe.layers.columns:
        by_layer_probe = {row.get("layer"): row for row in _rows(probe.layers)}
    profile = model.profile or {}
    source = model.profile_source
    timed = model.profile_kernel_layers if source == "device_kernels" else model.profile_layers
    by_layer_time = {row.get("layer"): row for row in _rows(timed)}
    badges: dict[str, list[dict[str, str]]] = {}
    for f in found:
        if f.get("layer"):
            badges.setdefault(str(f["layer"]), []).append(
                {"severity": f["severity"], "rule": f["rule"], "title": f["title"]}
            )
    rows = []
    names = {row.get("name") for row in layers}
    for name in [*by_layer_probe, *by_layer_time]:  # seen by the probe or the profile only
        if name not in names and name is not None:
            layers.append({"name": name, "class": by_layer_time.get(name, {}).get("class")})
            names.add(name)
    for row in layers:
        name = row.get("name")
        p = by_layer_probe.get(name, {})
        t = by_layer_time.get(name, {})
        rows.append(
            [
                name,
                row.get("class"),
                row.get("compute_dtype"),
                row.get("variable_dtype"),
                row.get("output_dtype"),
                row.get("effective_dtype"),
                row.get("params"),
                p.get("underflow_fraction"),
                p.get("grad_rel_error"),
                p.get("output_rel_error"),
                p.get("max_abs_activation"),
                t.get("share"),
                t.get("tensor_core_share"),
                row.get("tc_aligned"),
                row.get("is_output"),
                row.get("note"),
            ]
        )
    return json_safe(
        {
            "run": model.name,
            "columns": list(LAYER_COLUMNS),
            "rows": rows,
            "badges": badges,
            "probe_step": probe.step if probe is not None else None,
            "profiled": bool(profile),
            "time_source": source,
        }
    )


HEATMAP_MAX_STEPS = 200


def _heatmap(probes: pd.DataFrame) -> dict[str, Any]:
    """Layer × probe step underflow from the Run's probe table; at most HEATMAP_MAX_STEPS steps,
    evenly spread, the latest included; layers in the order the probe lists them."""
    empty = {"layers": [], "steps": [], "values": []}
    if not len(probes) or not {"step", "layer", "underflow_fraction"} <= set(probes.columns):
        return empty
    probes = probes[probes["layer"].notna()]
    steps = np.unique(probes["step"].to_numpy(dtype=np.int64))
    if len(steps) > HEATMAP_MAX_STEPS:
        steps = steps[np.unique(np.linspace(0, len(steps) - 1, HEATMAP_MAX_STEPS).astype(int))]
        probes = probes[probes["step"].isin(steps)]
    if not len(probes):
        return empty
    layers = pd.unique(probes["layer"].astype(str))
    rows = pd.Index(layers).get_indexer(probes["layer"].astype(str))
    cols = np.searchsorted(steps, probes["step"].to_numpy(dtype=np.int64))
    grid = np.full((len(layers), len(steps)), np.nan)
    grid[rows, cols] = pd.to_numeric(probes["underflow_fraction"], errors="coerce").to_numpy()
    grid = np.round(grid, 7)
    values = np.where(np.isfinite(grid), grid, None).tolist()
    return {"layers": list(layers), "steps": steps.tolist(), "values": values}


# the probe_model columns that are not the record's "model" dict
_PROBE_TOP_KEYS = ("step", *PROBE_TOP_KEYS)


def _probe_at(model: Run, step: int) -> ProbeResult | None:
    """The probe at ``step``: :meth:`Run.latest_probe` of the Run seen up to that probe, also when
    it is marked unreliable (the panel says so)."""
    pm = model.probe_model
    at = dataclasses.replace(model, probe_model=pm[pm["step"] == step])
    return at.latest_probe(reliable_only=False)


def _probe_json(probe: ProbeResult) -> dict[str, Any]:
    row = probe.model
    return {
        "step": probe.step,
        "mode": row.get("mode"),
        "loss_scale": row.get("loss_scale"),
        "reference": row.get("reference"),
        "reference_note": row.get("reference_note"),
        "reliable": row.get("reliable"),
        "unreliable_reason": row.get("unreliable_reason"),
        "model": {k: v for k, v in row.items() if k not in _PROBE_TOP_KEYS},
        "histogram": probe.histogram,
        "sweep": _split(probe.sweep),
        "recommended_scale": row.get("recommended_scale"),
    }


def probes_view(model: Run, step: int | None) -> dict[str, Any]:
    """Probe steps and the probe at ``step`` (KeyError when there is none); without ``step``: the
    latest reliable probe (:meth:`Run.latest_probe`) and the layer × probe-step underflow heatmap.
    ``unreliable_steps``: the probes whose loss disagreed with the train step's."""
    pm = model.probe_model
    steps = sorted({int(s) for s in pm["step"]}) if len(pm) else []
    unreliable = model.unreliable_probe_steps()
    if step is None:
        probe = model.latest_probe()
        heatmap = _heatmap(model.probe_layers)
    else:  # a step picks a histogram: no heatmap
        if step not in steps:
            raise KeyError(step)
        probe, heatmap = _probe_at(model, step), None
    return json_safe(
        {
            "run": model.name,
            "steps": steps,
            "unreliable_steps": unreliable,
            "heatmap": heatmap,
            "probe": _probe_json(probe) if probe is not None else None,
        }
    )


#: what a profile's figures are, by ``source`` (the tab's caption)
PROFILE_SOURCE_LABELS = {
    "device_kernels": "GPU kernels: precision and Tensor Core use from each kernel's name",
    "host_ops": "host ops: each op counted in its layer's dtype (no GPU kernels in the trace)",
    "device_ops": "device ops: each op counted in its layer's dtype (no kernel table)",
}


def profile_summary(model: Run) -> dict[str, Any] | None:
    """The tab's profile panel: the figures to show side by side, None without a profile.

    ``source`` and its ``label``; the time (``total_us``), ``share_16bit`` and
    ``unattributed_share``; on a GPU trace also ``tensor_core_share`` (mpwatch, by the kernel
    names) beside ``xprof_tensor_core_share`` (xprof's "Kernel uses TensorCore"),
    ``tensor_core_missed_by_xprof_share`` (why they differ), ``unknown_share`` and
    ``by_precision_share``; elsewhere ``cast_share``."""
    prof = model.profile
    if not prof:
        return None
    source = model.profile_source
    kern = model.profile_kernels if source == "device_kernels" else None
    base = kern if kern is not None else prof
    total = contract.finite_float(base.get("total_us"))
    out: dict[str, Any] = {
        "source": source,
        "label": PROFILE_SOURCE_LABELS.get(str(source), str(source)),
        "steps": prof.get("steps"),
        "device": prof.get("device"),
        "total_us": total,
        "share_16bit": contract.finite_float(base.get("share_16bit")),
        "unattributed_share": (
            (contract.finite_float(base.get("unattributed_us")) or 0.0) / total if total else None
        ),
    }
    if kern is None:
        out["cast_share"] = contract.finite_float(prof.get("cast_share"))
        return out
    by = kern.get("by_precision_share") if isinstance(kern.get("by_precision_share"), dict) else {}
    out.update(
        tensor_core_share=contract.finite_float(kern.get("tensor_core_share")),
        xprof_tensor_core_share=contract.finite_float(kern.get("xprof_tensor_core_share")),
        tensor_core_missed_by_xprof_share=contract.finite_float(
            kern.get("tensor_core_missed_by_xprof_share")
        ),
        unknown_share=contract.finite_float(kern.get("unknown_share")),
        by_precision_share={
            str(k): contract.finite_float(v) for k, v in by.items() if contract.finite_float(v)
        },
        kernels=kern.get("kernels"),
    )
    return out


def profile_view(model: Run) -> dict[str, Any]:
    """The latest profile record (``profile``), its step, and the panel's figures
    (``summary``: :func:`profile_summary`)."""
    items = model.records.get(contract.KIND_PROFILE) or []
    return json_safe(
        {
            "run": model.name,
            "step": items[-1][0] if items else None,
            "profile": model.profile,
            "summary": profile_summary(model),
        }
    )


def info_view(model: Run) -> dict[str, Any]:
    """The run's facts, its notices (messages as plain text: Keras wraps exception messages in
    terminal escapes) and the errors met reading it."""
    return {
        "info": model.info or None,
        "notices": [{**n, "message": plain(n.get("message") or "")} for n in model.notices],
        "errors": list(model.warnings),
    }
