"""What TensorBoard's data provider serves of mpwatch: the runs that hold its data, and one run's
scalars and records, decoded, as a :class:`RunRecords`; :func:`build_model` makes the
:class:`mpwatch.read.Run` of them.

What TensorBoard serves (and what it does not):

- **Scalars** are a sample: TensorBoard keeps ``--samples_per_plugin scalars=N`` points per tag
  (1,000 by default), the last one always (:func:`scalar_sample_limit`); :attr:`RunRecords.sampled`
  says which tags were served only in part.
- **Records** are kept whole (the loader sets ``mpwatch=0``). A record split into parts at one
  step (a probe over ``contract.MAX_RECORD_BYTES``) reaches the tab whole under TensorBoard's
  Python loader (``--load_fast=false``); TensorBoard's data server (``--load_fast=auto``, the
  default where the ``tensorboard-data-server`` binary runs) keeps one value per tag and step, so
  only the last part arrives. :func:`read_run` notices a split record with missing parts, leaves a
  fragment without its first part out of the Run, and says so in the run's errors.

>>> scalar_sample_limit({"scalars": 500})
500
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from tensorboard.data import provider as tb_provider

from mpwatch import contract
from mpwatch.contract import later_writes_win
from mpwatch.read import ReadProblem, Run, run_from_records

__all__ = ["RunRecords", "build_model", "list_mpwatch_runs", "read_run", "scalar_sample_limit"]

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
        trace: the capture directory of the raw profiler trace the profile was read from
            (:func:`tensorboard_plugin_mpwatch.data.traces.add_trace_profile`), None when the
            profile is a record or there is none.
        problems: what the reader cannot read of the run's event files, which TensorBoard does
            not say (:func:`tensorboard_plugin_mpwatch.data.damage.add_problems`).
    """

    name: str
    scalars: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)
    served: dict[str, int] = field(default_factory=dict)
    sampled: dict[str, bool] = field(default_factory=dict)
    records: dict[str, list[tuple[int, dict[str, Any]]]] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    fingerprint: str = ""
    trace: str | None = None
    problems: list[ReadProblem] = field(default_factory=list)


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


def build_model(records: RunRecords) -> Run:
    """The :class:`mpwatch.read.Run` of decoded records: the Run ``mpwatch.load_run`` builds from
    event files (same tables, part merging and purges), so the advisor sees the same run in the
    tab and in the CLI."""
    run = run_from_records(
        records.name,
        scalars=records.scalars,
        records=records.records,
        warnings=records.errors,
        problems=records.problems,
    )
    run.profile_trace = records.trace
    return run
