"""The only code that writes mpwatch events: :class:`RunWriter` (TensorFlow imported lazily).

Tags, record kinds and the payload encoding come from :mod:`mpwatch.contract`.

Large records: :meth:`RunWriter.record` writes a payload whose compressed size would exceed
``contract.MAX_RECORD_BYTES`` as several records at the same step (:func:`split_payload`), each
under the limit, so no table is ever too large to record (a model with tens of thousands of
variables); ``mpwatch.read`` joins the parts back.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from mpwatch import contract

_PLACEHOLDER = 10**9  # "part"/"parts" while sizing parts: never shorter than the final numbers


def _is_table(value: Any) -> bool:
    return (
        isinstance(value, dict)
        and isinstance(value.get("columns"), list)
        and isinstance(value.get("data"), list)
    )


def split_payload(
    payload: Mapping[str, Any], limit: int | None = None
) -> list[tuple[dict[str, Any], bytes]]:
    """The records a payload is written as, each ``(payload, compressed blob)`` under ``limit``
    bytes (default ``contract.MAX_RECORD_BYTES``).

    A payload that fits is one record. Otherwise its tables (split-layout values: ``{"columns",
    "data"}``) are moved out, largest first, until the rest fits: the head record keeps every key,
    with ``"part": 0``, ``"parts": N`` and the moved tables emptied (their columns kept); then come
    continuation records ``{"part": i, "parts": N, key: {"columns", "data": next rows}}``, each
    holding the next rows of one moved table, rows in order, as many as fit. Joining them
    (``mpwatch.read``: a ``part >= 1`` appends its tables' rows to the record before it) gives the
    payload back.

    Raises:
        ValueError: the payload cannot be split under the limit (no tables, a head too large
            without its tables' rows, or a single row over the limit).

    Example:
        >>> rows = [[i, "x" * 50 + str(i)] for i in range(400)]
        >>> parts = split_payload({"a": 1, "t": contract.table(["i", "s"], rows)}, limit=2000)
        >>> [p.get("part") for p, _ in parts][:3], parts[0][0]["parts"] == len(parts)
        ([0, 1, 2], True)
        >>> [r for p, _ in parts for r in p["t"]["data"]] == rows
        True
    """
    limit = contract.MAX_RECORD_BYTES if limit is None else int(limit)
    plain = contract.json_safe(payload, nonfinite="keep")
    blob = contract.encode_plain(plain)
    if len(blob) <= limit:
        return [(plain, blob)]
    # Parts are sized with placeholder part numbers; compressed sizes are not monotonic in the
    # content, so the real numbers can add a byte or two: then split again with a tighter budget.
    budget = limit
    for _ in range(8):
        out = _split(plain, blob, budget)
        blobs = [contract.encode_plain(p) for p in out]
        over = max(len(b) for b in blobs) - limit
        if over <= 0:
            return list(zip(out, blobs))
        budget -= max(8, over)
    raise ValueError(f"record could not be split under the {limit}-byte limit")


def _split(plain: dict[str, Any], blob: bytes, limit: int) -> list[dict[str, Any]]:
    """The head and continuation payloads of :func:`split_payload`, each sized under ``limit``
    with placeholder part numbers."""
    tables = [k for k, v in plain.items() if _is_table(v)]
    if not tables:
        raise ValueError(
            f"record is {len(blob)} bytes compressed, over the {limit}-byte limit, with no "
            "table to split"
        )
    size = {k: len(contract.encode_plain(plain[k])) for k in tables}
    head = dict(plain, part=0, parts=_PLACEHOLDER)
    moved: list[str] = []
    for k in sorted(tables, key=lambda k: -size[k]):
        if len(contract.encode_plain(head)) <= limit:
            break
        head[k] = {"columns": plain[k]["columns"], "data": []}
        moved.append(k)
    if len(contract.encode_plain(head)) > limit:
        raise ValueError(
            f"record over the {limit}-byte limit even without its tables' rows: cannot be split"
        )
    pieces = []
    for k in sorted(moved, key=tables.index):  # the payload's own order of tables
        columns = plain[k]["columns"]
        for rows in _row_chunks(k, columns, plain[k]["data"], limit):
            pieces.append({k: {"columns": columns, "data": rows}})
    parts = 1 + len(pieces)
    head["parts"] = parts
    return [head] + [{"part": i, "parts": parts, **p} for i, p in enumerate(pieces, start=1)]


def _row_chunks(key: str, columns: list[str], rows: list[Any], limit: int) -> list[list[Any]]:
    """Consecutive runs of ``rows``, each small enough for one continuation record."""

    def fits(chunk: list[Any]) -> bool:
        part = {
            "part": _PLACEHOLDER,
            "parts": _PLACEHOLDER,
            key: {"columns": columns, "data": chunk},
        }
        return len(contract.encode_plain(part)) <= limit

    def fit(chunk: list[Any]) -> list[list[Any]]:
        if fits(chunk):
            return [chunk]
        if len(chunk) <= 1:
            raise ValueError(f"one row of table {key!r} is over the {limit}-byte record limit")
        mid = len(chunk) // 2
        return fit(chunk[:mid]) + fit(chunk[mid:])

    if not rows:
        return []
    # a first guess from the compressed size of the whole table (then halve what does not fit)
    whole = len(contract.encode_plain({key: {"columns": columns, "data": rows}}))
    n = max(1, math.ceil(whole / (0.85 * limit)))
    step = max(1, math.ceil(len(rows) / n))
    return [c for i in range(0, len(rows), step) for c in fit(rows[i : i + step])]


class _TensorBoardEvents:
    """Event files written with TensorBoard's own writer, for processes without TensorFlow (Keras'
    JAX backend). The events are those ``tf.summary.scalar`` and ``tf.summary.write`` write: a
    float32 scalar tensor under the scalar plugin's metadata, and a string tensor under mpwatch's
    (tests/record/test_writer_backends.py compares the two writers' events field by field)."""

    def __init__(self, logdir: str) -> None:
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        self._writer = EventFileWriter(logdir)

    def add(self, tag: str, step: int, tensor: Any, metadata: Any) -> None:
        import time

        from tensorboard.compat.proto import event_pb2, summary_pb2

        value = summary_pb2.Summary.Value(tag=tag, tensor=tensor, metadata=metadata)
        event = event_pb2.Event(
            wall_time=time.time(), step=int(step), summary=summary_pb2.Summary(value=[value])
        )
        self._writer.add_event(event)

    def flush(self) -> None:
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


def _scalar_metadata() -> Any:
    from tensorboard.plugins.scalar import metadata as scalar_metadata

    return scalar_metadata.create_summary_metadata(display_name=None, description=None)


_series_fn: Any = None


def _series_function() -> Any:
    """One compiled function writing a scalar series through the writer passed to it.

    The writer's resource is an argument, so a new writer (each ``fit`` opens one) reuses the
    trace; ``tf.summary.write`` inside a function would capture the writer and retrace per fit.
    """
    global _series_fn
    if _series_fn is None:
        import tensorflow as tf

        meta = tf.constant(_scalar_metadata().SerializeToString())

        @tf.function(reduce_retracing=True)
        def series(writer, tag, steps, values):  # noqa: ANN001, ANN202
            for i in tf.range(tf.size(steps)):
                tf.raw_ops.WriteSummary(
                    writer=writer, step=steps[i], tensor=values[i], tag=tag, summary_metadata=meta
                )

        _series_fn = series
    return _series_fn


class RunWriter:
    """Writes mpwatch scalars and records into one run directory.

    ``enabled=False`` makes every call a no-op (a non-chief worker under ``tf.distribute``).
    Several writers may share a logdir: TensorFlow shares one file writer per directory.
    On Keras' TensorFlow backend the events go through ``tf.summary``; on other backends through
    TensorBoard's own event writer (no TensorFlow needed), in the same on-disk contract.

    Example:
        >>> import tempfile
        >>> from mpwatch import contract
        >>> w = RunWriter(tempfile.mkdtemp())
        >>> w.scalars(3, {contract.LOSS_SCALE: 1024.0, contract.STEP_SKIPPED: 0.0})
        >>> w.flush()
    """

    def __init__(
        self, logdir: str, enabled: bool = True, use_tensorflow: bool | None = None
    ) -> None:
        self.logdir = str(logdir)
        self.enabled = enabled
        if use_tensorflow is None:
            from mpwatch.record import backend

            use_tensorflow = backend.name() == backend.TENSORFLOW
        self.use_tensorflow = bool(use_tensorflow)
        self._writer = None

    def _get(self):  # noqa: ANN202
        if self._writer is None:
            if self.use_tensorflow:
                import tensorflow as tf

                self._writer = tf.summary.create_file_writer(self.logdir)
            else:
                self._writer = _TensorBoardEvents(self.logdir)
        return self._writer

    def _tb_scalars(self, tag_steps_values: list[tuple[str, int, float]]) -> None:
        import numpy as np
        from tensorboard.util import tensor_util

        meta = _scalar_metadata()
        writer = self._get()
        for tag, step, value in tag_steps_values:
            proto = tensor_util.make_tensor_proto(np.float32(value))
            writer.add(tag, step, proto, meta)

    def scalars(self, step: int, values: Mapping[str, float]) -> None:
        """Write several scalars at one step (tags from this module)."""
        if not self.enabled or not values:
            return
        if not self.use_tensorflow:
            self._tb_scalars([(tag, int(step), float(v)) for tag, v in values.items()])
            return
        import tensorflow as tf

        with self._get().as_default():
            for tag, value in values.items():
                tf.summary.scalar(tag, float(value), step=int(step))

    def scalar_series(self, tag: str, steps: list[int], values: list[float]) -> None:
        """Write one scalar at several steps (e.g. per-step values gathered over an interval).

        Long series go through one compiled function (an eager ``tf.summary.scalar`` per value
        costs ~0.1-1 ms each: too much for per-step values on a hot path).
        """
        if not self.enabled or not len(steps):
            return
        if not self.use_tensorflow:
            self._tb_scalars([(tag, int(s), float(v)) for s, v in zip(steps, values)])
            return
        import tensorflow as tf

        with self._get().as_default():
            if len(steps) < 4:
                for step, value in zip(steps, values):
                    tf.summary.scalar(tag, float(value), step=int(step))
                return
            resource = getattr(self._get(), "_resource", None)
            if resource is None:  # a TensorFlow without the writer's resource: one call a value
                for step, value in zip(steps, values):
                    tf.summary.scalar(tag, float(value), step=int(step))
                return
            _series_function()(
                resource,  # an argument, not a capture: one trace serves every writer and fit
                tf.constant(tag, tf.string),  # a tensor: one trace for every tag
                tf.constant([int(s) for s in steps], tf.int64),
                tf.constant([float(v) for v in values], tf.float32),
            )

    def record(self, kind: str, step: int, payload: Mapping[str, Any]) -> int:
        """Write one structured record at ``step``; returns the compressed bytes written.

        A payload over ``contract.MAX_RECORD_BYTES`` compressed is written as several records of
        ``kind`` at ``step`` (:func:`split_payload`); one that cannot be split raises ValueError.
        """
        contract.record_tag(kind)  # an unknown kind fails before anything is written
        try:
            records = split_payload(payload)
        except ValueError as e:
            raise ValueError(f"mpwatch {kind} record: {e}") from None
        if self.enabled:
            for _, blob in records:
                self._write_record(kind, step, blob)
        return sum(len(blob) for _, blob in records)

    def _write_record(self, kind: str, step: int, blob: bytes) -> None:
        from tensorboard.compat.proto import summary_pb2

        metadata = summary_pb2.SummaryMetadata(
            plugin_data=summary_pb2.SummaryMetadata.PluginData(
                plugin_name=contract.PLUGIN_NAME, content=contract.metadata_content(kind)
            ),
            data_class=summary_pb2.DATA_CLASS_TENSOR,
            summary_description=f"mpwatch {kind} record",
        )
        if not self.use_tensorflow:
            import numpy as np
            from tensorboard.util import tensor_util

            proto = tensor_util.make_tensor_proto(np.array(blob, dtype=object))
            self._get().add(contract.record_tag(kind), int(step), proto, metadata)
            return
        import tensorflow as tf

        with self._get().as_default():
            tf.summary.write(
                contract.record_tag(kind),
                tf.constant(blob, dtype=tf.string),
                step=int(step),
                metadata=metadata,
            )

    def flush(self) -> None:
        if self._writer is not None:
            self._writer.flush()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.flush()
            self._writer.close()
            self._writer = None
